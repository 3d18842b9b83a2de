"""Gemma4 Unified on the CPU build, built and run locally: torchvision for the processor, a tiny checkpoint.

Why torchvision needs care here: vLLM 0.32's gemma4_unified module imports transformers' Gemma4 Unified
processor, whose image processor imports torchvision. The CPU torch (2.13.0+cpu) has no matching
torchvision on PyPI: torchvision 0.28.0 (the release for torch 2.13) is a CUDA build whose C++ ops
library cannot load beside the CPU torch. Its Python code (resize, rescale, normalize: plain torch ops)
works; only its import fails, on two unguarded fake-kernel registrations for `torchvision::nms` and
`torchvision::qnms`. Declaring those two operator schemas first (no kernels: calling them still fails
loudly) lets the real torchvision Python package import. Detection ops are never used by Gemma4.

The wheel goes to a cache folder beside the tests, never into .venv.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.vllm_harness import REPO

TORCHVISION_REQUIREMENT = "torchvision==0.28.0"  # the release built for torch 2.13
TORCHVISION_DIR = REPO / ".deploykit-cache" / "torchvision-0.28.0"
SHIM_DIR = REPO / ".deploykit-cache" / "torchvision-ops-shim"

# The schemas torchvision 0.28's _meta_registrations.py registers fake kernels for without checking that
# its C++ library loaded. Declared here without any kernel.
_UNGUARDED_OPS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)

# Loaded by every Python process started with SHIM_DIR on PYTHONPATH (vLLM's API server, engine core
# and worker): declares the schemas just before torchvision is first imported, and only if needed.
_SITECUSTOMIZE = '''"""Test-only: torchvision 0.28 beside torch 2.13.0+cpu (tests/gemma4_models.py)."""
import importlib.abc
import sys

_OPS = {ops!r}


class _DeclareTorchvisionOps(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision":
            sys.meta_path.remove(self)
            _declare()
        return None


def _declare():
    import torch

    if not hasattr(torch.ops.torchvision, "nms"):
        library = torch.library.Library("torchvision", "FRAGMENT")
        for schema in _OPS:
            library.define(schema)
        sys.modules[__name__].library = library


sys.meta_path.insert(0, _DeclareTorchvisionOps())
'''


def _torchvision_loads_natively() -> bool:
    if importlib.util.find_spec("torchvision") is None:
        return False
    probe = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, timeout=120)
    return probe.returncode == 0


def ensure_torchvision_dir() -> Path:
    """Install the torchvision wheel (no dependencies) into the cache folder once; returns the folder."""
    if (TORCHVISION_DIR / "torchvision" / "__init__.py").exists():
        return TORCHVISION_DIR
    staging = TORCHVISION_DIR.with_name(f".{TORCHVISION_DIR.name}.{os.getpid()}")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(staging),
            TORCHVISION_REQUIREMENT,
        ],
        check=True,
        timeout=600,
    )
    try:
        staging.rename(TORCHVISION_DIR)
    except OSError:  # another process finished first
        subprocess.run(["rm", "-rf", str(staging)], check=False)
    return TORCHVISION_DIR


def declare_torchvision_ops() -> None:
    """In this process: declare the two schemas so the real torchvision Python package imports."""
    import torch

    if hasattr(torch.ops.torchvision, "nms"):
        return
    library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in _UNGUARDED_OPS:
        library.define(schema)
    # The declarations live as long as the Library object: keep it for the life of the process.
    globals()["_torchvision_library"] = library


def make_gemma4_unified_importable() -> None:
    """Let this process import vLLM's gemma4_unified module (it needs torchvision; see above)."""
    if importlib.util.find_spec("torchvision") is not None and _torchvision_loads_natively():
        return
    folder = str(ensure_torchvision_dir())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    declare_torchvision_ops()


@contextmanager
def gemma4_unified_in_one_process() -> Iterator[Any]:
    """vLLM's gemma4_unified module with its distributed state set up for one process (gloo), as
    ColumnParallelLinear needs outside a server; torn down afterwards if it was set up here."""
    make_gemma4_unified_importable()
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state
    from vllm.model_executor.models import gemma4_unified

    from deploykit.net import free_port

    started_here = not parallel_state.model_parallel_is_initialized()
    if started_here:
        with set_current_vllm_config(VllmConfig()):
            parallel_state.init_distributed_environment(
                world_size=1,
                rank=0,
                distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
                local_rank=0,
                backend="gloo",
            )
            parallel_state.initialize_model_parallel(1, 1)
    try:
        yield gemma4_unified
    finally:
        if started_here:
            parallel_state.destroy_model_parallel()
            parallel_state.destroy_distributed_environment()


def torchvision_server_env() -> dict[str, str]:
    """Env for a `vllm serve` of Gemma4 Unified: torchvision on PYTHONPATH plus the schema shim."""
    if _torchvision_loads_natively():
        return {}
    SHIM_DIR.mkdir(parents=True, exist_ok=True)
    (SHIM_DIR / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(ops=_UNGUARDED_OPS))
    paths = [str(SHIM_DIR), str(ensure_torchvision_dir())]
    existing = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join(paths + ([existing] if existing else []))}


# ---------------------------------------------------------------------------------------------------------
# A tiny Gemma4 Unified checkpoint (random weights, BF16 like the field report's), built here
# ---------------------------------------------------------------------------------------------------------

TINY_GEMMA4_VERSION = "2"  # bump when the recipe below changes: it names the cache folder
IMAGE_TOKEN = "<image_soft_token>"  # what vLLM's Gemma4 chat path puts where an image goes
# Gemma4's multimodal markers; ids 0/1/2 are pad/eos/bos as in Gemma's own vocabulary.
GEMMA4_SPECIAL_TOKENS = {
    "pad_token": "<pad>",
    "eos_token": "<eos>",
    "bos_token": "<bos>",
    "unk_token": "<unk>",
}
GEMMA4_EXTRA_TOKENS = {
    "image_token": IMAGE_TOKEN,
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "audio_token": "<audio_soft_token>",
    "boa_token": "<start_of_audio>",
    "eoa_token": "<end_of_audio>",
}
GEMMA4_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}" + IMAGE_TOKEN + "{% endif %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
HOT_CHANNEL = 5  # the patch_dense output channel scaled to overflow FP16, as channel 1215 did
PATCH_SIZE, POOLING = 4, 2  # model patches of 8 x 8 pixels: patch_dim 192 instead of 6912
SOFT_TOKENS = 70  # the smallest image budget Gemma4 supports


def tiny_gemma4_unified_dir() -> Path:
    """Build (or reuse) the tiny checkpoint; needs vLLM's gemma4_unified importable (see above)."""
    target = (
        REPO / ".deploykit-cache" / "models" / f"tiny-gemma4-unified-fp16-overflow-v{TINY_GEMMA4_VERSION}"
    )
    if (target / "deploykit-recipe.json").exists():
        return target
    staging = target.with_name(f".{target.name}.{os.getpid()}")
    subprocess.run(["rm", "-rf", str(staging)], check=False)
    # In a fresh process: transformers caches "is torchvision available?" at its first check, so a test
    # process that imported transformers before torchvision was on its path cannot build the processor.
    env = {**os.environ, **torchvision_server_env()}
    code = "import sys; from tests.gemma4_models import build_into; build_into(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, str(staging)], cwd=REPO, env=env, check=True, timeout=600)
    (staging / "deploykit-recipe.json").write_text('{"recipe": "tests/gemma4_models.py"}\n')
    try:
        staging.rename(target)
    except OSError:  # another process finished first
        subprocess.run(["rm", "-rf", str(staging)], check=False)
    return target


def build_into(folder: str) -> None:
    """Entry point of the build subprocess (see tiny_gemma4_unified_dir)."""
    make_gemma4_unified_importable()
    _write_tiny_gemma4_unified(Path(folder))


def _tiny_tokenizer() -> object:
    from transformers import PreTrainedTokenizerFast

    from deploykit.tinymodel import train_tokenizer

    base = train_tokenizer(512)
    tokens = [
        *GEMMA4_SPECIAL_TOKENS.values(),
        *GEMMA4_EXTRA_TOKENS.values(),
        "<start_of_turn>",
        "<end_of_turn>",
    ]
    # Rebuild with Gemma's special tokens at ids 0..3 and the multimodal markers as special tokens.
    from tokenizers import Tokenizer

    raw = Tokenizer.from_str(base.backend_tokenizer.to_str())
    vocab = raw.get_vocab()
    del vocab  # ids of the trained pieces stay as they are; new specials are appended
    raw.add_special_tokens(tokens)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, extra_special_tokens=GEMMA4_EXTRA_TOKENS, **GEMMA4_SPECIAL_TOKENS
    )
    tokenizer.chat_template = GEMMA4_CHAT_TEMPLATE
    return tokenizer


def _write_tiny_gemma4_unified(out: Path) -> None:
    import torch
    from transformers import (
        Gemma4UnifiedConfig,
        Gemma4UnifiedForConditionalGeneration,
        Gemma4UnifiedProcessor,
    )
    from transformers.models.gemma4_unified.feature_extraction_gemma4_unified import (
        Gemma4UnifiedAudioFeatureExtractor,
    )
    from transformers.models.gemma4_unified.image_processing_gemma4_unified import Gemma4UnifiedImageProcessor
    from transformers.models.gemma4_unified.video_processing_gemma4_unified import Gemma4UnifiedVideoProcessor

    torch.manual_seed(0)
    tokenizer: Any = _tiny_tokenizer()
    hidden = 64
    config = Gemma4UnifiedConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
            "global_head_dim": 32,
            "layer_types": ["sliding_attention", "full_attention"],
            "sliding_window": 64,
            "max_position_embeddings": 1024,
            "pad_token_id": tokenizer.pad_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "bos_token_id": tokenizer.bos_token_id,
        },
        vision_config={
            "patch_size": PATCH_SIZE,
            "pooling_kernel_size": POOLING,
            "mm_embed_dim": hidden,
            "mm_posemb_size": 64,
            "output_proj_dims": hidden,
            "num_soft_tokens": SOFT_TOKENS,
        },
        audio_config=None,
        boi_token_id=tokenizer.convert_tokens_to_ids(GEMMA4_EXTRA_TOKENS["boi_token"]),
        eoi_token_id=tokenizer.convert_tokens_to_ids(GEMMA4_EXTRA_TOKENS["eoi_token"]),
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        boa_token_id=tokenizer.convert_tokens_to_ids(GEMMA4_EXTRA_TOKENS["boa_token"]),
        eoa_token_index=tokenizer.convert_tokens_to_ids(GEMMA4_EXTRA_TOKENS["eoa_token"]),
        audio_token_id=tokenizer.convert_tokens_to_ids(GEMMA4_EXTRA_TOKENS["audio_token"]),
        video_token_id=len(tokenizer),  # the processor appends <|video|> next
    )
    model = Gemma4UnifiedForConditionalGeneration(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() > 1:
                # A typical initialisation scale: larger weights saturate the tiny model's softmax onto one
                # token (logprob 0.0), and then even sampling cannot show varied output.
                param.normal_(0.0, 0.02 if "embed_vision" not in name else 0.05)
        _make_one_channel_overflow_fp16(model)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    image_processor = Gemma4UnifiedImageProcessor(
        patch_size=PATCH_SIZE, pooling_kernel_size=POOLING, max_soft_tokens=SOFT_TOKENS
    )
    video_processor = Gemma4UnifiedVideoProcessor(
        patch_size=PATCH_SIZE, pooling_kernel_size=POOLING, max_soft_tokens=SOFT_TOKENS
    )
    processor = Gemma4UnifiedProcessor(
        feature_extractor=Gemma4UnifiedAudioFeatureExtractor(),
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=GEMMA4_CHAT_TEMPLATE,
        image_seq_length=SOFT_TOKENS,
    )
    processor.save_pretrained(out)
    (out / "generation_config.json").write_text(
        json.dumps(
            {
                "bos_token_id": tokenizer.bos_token_id,
                "eos_token_id": tokenizer.eos_token_id,
                "pad_token_id": tokenizer.pad_token_id,
            }
        )
    )


def _make_one_channel_overflow_fp16(model: Any) -> None:
    """Channel HOT_CHANNEL of patch_dense lines up with patch_ln1's bias, so it sums to about 77,000
    for every patch (FP16 tops out at 65504). With 192 inputs instead of 6912 the weights must be
    larger than the report's (400 instead of 147) to reach the same overflow."""
    import torch

    embedder = model.model.embed_vision  # transformers' name; vLLM calls it vision_embedder
    patch_dim = embedder.patch_ln1.weight.numel()
    signs = torch.where(torch.arange(patch_dim) % 3 == 0, -1.0, 1.0)
    embedder.patch_ln1.weight.fill_(0.1)
    embedder.patch_ln1.bias.copy_(signs)
    embedder.patch_dense.weight[HOT_CHANNEL] = 400.0 * signs
    embedder.patch_dense.bias[HOT_CHANNEL] = 126.0
