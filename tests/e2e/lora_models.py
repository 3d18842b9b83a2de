"""Local LoRA adapters for the tiny Llama, and the same adapters merged into full checkpoints.

Both are built here with peft (nothing downloaded) and cached next to the tiny model, keyed by the
base model directory and the adapter recipe, so a second test session reuses them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

# Every linear layer vLLM wraps for a Llama: q/k/v become one QKV layer with three slices, gate/up
# one merged layer with two slices, o/down row-parallel layers with one slice.
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


class AdapterRecipe(BaseModel):
    """A random but non-zero LoRA adapter: both A and B drawn from N(0, std), so B·A ≠ 0."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int
    rank: int = 8
    alpha: int = 16
    std: float = 0.15
    target_modules: tuple[str, ...] = ALL_LINEAR

    def key(self, base_dir: Path) -> str:
        text = f"{base_dir.resolve()}|{self.model_dump_json()}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _build_atomically(target: Path, build: Callable[[Path], None]) -> Path:
    if (target / ".complete").exists():
        return target
    staging = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    build(staging)
    (staging / ".complete").write_text("ok\n")
    try:
        staging.rename(target)
    except OSError:  # another process finished first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _peft_model(base_dir: Path, recipe: AdapterRecipe) -> object:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(
        r=recipe.rank,
        lora_alpha=recipe.alpha,
        target_modules=list(recipe.target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(recipe.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * recipe.std)
    return model


def build_adapter(base_dir: Path, recipe: AdapterRecipe) -> Path:
    """A PEFT adapter directory (adapter_config.json + safetensors) vLLM can load with --lora-modules."""
    target = base_dir.parent / f"lora-{recipe.key(base_dir)}"

    def build(out: Path) -> None:
        _peft_model(base_dir, recipe).save_pretrained(out)  # type: ignore[attr-defined]

    return _build_atomically(target, build)


def build_merged_model(base_dir: Path, recipe: AdapterRecipe) -> Path:
    """The base checkpoint with the adapter merged into its weights: the reference served without LoRA."""
    target = base_dir.parent / f"merged-{recipe.key(base_dir)}"

    def build(out: Path) -> None:
        merged = _peft_model(base_dir, recipe).merge_and_unload()  # type: ignore[attr-defined]
        merged.save_pretrained(out, safe_serialization=True)
        for name in (*TOKENIZER_FILES, "generation_config.json"):
            if (base_dir / name).exists():
                shutil.copy2(base_dir / name, out / name)

    return _build_atomically(target, build)
