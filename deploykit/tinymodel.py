"""Tiny random-weight models built locally: nothing is ever downloaded from a model hub.

Used by the CPU demo profile and by the end-to-end tests. Building needs torch, transformers and
tokenizers (the `cpu` extra); the result is cached under a directory keyed by the recipe.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from deploykit.paths import default_cache_dir

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

# A small, varied text corpus so the byte-level BPE learns real merges.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "vLLM serves large language models with paged attention and continuous batching.",
    "A deployment that answers HTTP 200 with no words is not healthy.",
    "Compute capability 7.5 has no native bfloat16; float16 overflows above 65504.",
    "LoRA adds a low-rank update to a linear layer: y = W x + B A x.",
    "Penalties change only the logits of tokens already seen in the prompt or the output.",
    "Once upon a time there was a small model that lived on a CPU and answered every question.",
    "0123456789 + - * / = ( ) [ ] { } < > ! ? , . ; : ' \" # $ % & @ ^ _ ` | ~",
]


class TinyModelRecipe(BaseModel):
    """The knobs of a tiny Llama-family model. Changing any of them changes the cache key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    seed: int = 0
    dtype: str = "float32"
    # "random": ordinary random weights. "nan": every logit is NaN. "token0": always prefers token 0.
    behaviour: str = "random"

    def key(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


def train_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE tokenizer trained here, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [line for _ in range(50) for line in _CORPUS]
    tokenizer.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


RECIPE_FILE = "deploykit-recipe.json"  # written last: a directory holding it is a finished build


def tiny_model_dir(recipe: TinyModelRecipe | None = None, cache_dir: Path | None = None) -> Path:
    """Where the recipe's model is (or will be) built: its cache directory, keyed by the recipe."""
    recipe = recipe or TinyModelRecipe()
    return (cache_dir or default_cache_dir()) / f"tiny-llama-{recipe.behaviour}-{recipe.key()}"


def is_built(model_dir: Path | str) -> bool:
    return (Path(model_dir) / RECIPE_FILE).exists()


def build_tiny_model(recipe: TinyModelRecipe | None = None, cache_dir: Path | None = None) -> Path:
    """Build (or reuse) a tiny Llama checkpoint; returns its directory. Safe to call concurrently."""
    recipe = recipe or TinyModelRecipe()
    target = tiny_model_dir(recipe, cache_dir)
    if is_built(target):
        return target
    root = target.parent
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".{target.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    _write_model(recipe, staging)
    (staging / RECIPE_FILE).write_text(recipe.model_dump_json(indent=2))
    try:
        staging.rename(target)
    except OSError:  # another process finished first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_model(recipe: TinyModelRecipe, out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(recipe.seed)
    tokenizer = train_tokenizer(recipe.vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype=recipe.dtype,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.5 if param.dim() > 1 else 0.02)
        _apply_behaviour(model, recipe.behaviour)
    model = model.to(getattr(torch, recipe.dtype))
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    # Greedy decoding unless a request says otherwise: no sampling defaults from the checkpoint.
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id})
    )


def _apply_behaviour(model: Any, behaviour: str) -> None:
    if behaviour == "random":
        return
    if behaviour == "nan":
        # A NaN in the final norm's weight reaches every hidden state and so every logit.
        model.model.norm.weight.fill_(float("nan"))
        return
    if behaviour == "token0":
        # A zero final norm makes every logit exactly 0.0: finite, and greedy argmax picks id 0 forever.
        model.model.norm.weight.zero_()
        return
    raise ValueError(f"unknown tiny-model behaviour {behaviour!r}; use random, nan or token0")
