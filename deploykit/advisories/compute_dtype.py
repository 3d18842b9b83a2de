"""The dtype a planned vLLM engine computes in, and where it comes from: read once per plan, used by the
fixes (fp32_projection) and by the advisories' `dtype` condition, so the two never disagree.

vLLM's own rule, as in vllm/config/model.py `_get_and_verify_dtype` / `_resolve_auto_dtype` and
vllm/config/vllm.py `_get_quantization_config` (identical in 0.32, 0.33 and 0.34):
- `--dtype` other than `auto` is used as given (`half` is float16, `float` float32);
- `auto` keeps the checkpoint's dtype when the platform supports it; a float32 checkpoint is downcast to
  the platform's first choice; anything else falls back to that first choice. CUDA's choices
  (platforms/cuda.py `supported_dtypes`): CC >= 8.0 bfloat16, float16, float32; CC 6.x-7.x float16,
  float32 (no BF16); the x86/aarch64 CPU build: bfloat16, float16, float32;
- model types vLLM refuses in float16 (`_FLOAT16_NOT_SUPPORTED_MODELS`) drop float16 from the choices;
- a quantization method checks the result against its activation dtypes (`get_supported_act_dtypes`)
  and refuses to start otherwise; it never changes the dtype. In 0.32-0.34 every method accepts float16
  except mxfp4 / gpt_oss_mxfp4 (and fp_quant, gone in 0.34), which accept bfloat16 only. No method of
  these releases forces float16 (0.11's `awq` did: #28857); AWQ/GPTQ checkpoints reach FP16 on any GPU
  through their config.json `torch_dtype: float16`, which `auto` keeps.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from deploykit import argv as argv_reader
from deploykit.probe.facts import GpuFacts

DTYPE_NAMES = {
    "half": "float16",
    "float16": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float": "float32",
    "float32": "float32",
    "fp32": "float32",
}
# vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS (0.32, 0.33, 0.34).
FP16_REFUSED_MODEL_TYPES = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4"})
# Quantization methods whose get_supported_act_dtypes() is [bfloat16] (0.32, 0.33; fp_quant removed in 0.34).
BF16_ONLY_QUANTIZATION = frozenset({"mxfp4", "gpt_oss_mxfp4", "fp_quant"})


class ComputeDtype(BaseModel):
    """What the engine computes in (None: unknown), one line on where that came from, and, when vLLM
    would refuse the combination at start-up, why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dtype: str | None
    source: str
    refused: str | None = None


def dtype_name(value: str | None) -> str | None:
    if value is None:
        return None
    return DTYPE_NAMES.get(value.lower(), value.lower())


def quantization_method(argv: list[str], config: dict[str, Any]) -> str | None:
    """`--quantization` (or `-q`) when set, else the checkpoint's config.json `quantization_config`
    (local models only; None when there is no config.json to read, `none` when it has no quantization).
    NVFP4 is named `nvfp4` however the checkpoint spells it (modelopt_fp4, compressed-tensors' format)."""
    named = argv_reader.flag_value(argv, "--quantization")
    if named:
        return "nvfp4" if named.lower() == "modelopt_fp4" else named.lower()
    quant = config.get("quantization_config")
    if not isinstance(quant, dict):
        return "none" if config else None
    method = str(quant.get("quant_method", "")).lower()
    algo = str(quant.get("quant_algo", "")).lower()
    if method == "modelopt_fp4" or algo == "nvfp4" or "nvfp4" in str(quant.get("format", "")).lower():
        return "nvfp4"
    return method or None


def _platform_choices(platform: str, gpus: list[GpuFacts]) -> tuple[list[str], str]:
    """The platform's supported dtypes in vLLM's order of preference, and the fact that decided them."""
    if platform == "cpu":
        return ["bfloat16", "float16", "float32"], "the CPU build computes bfloat16 natively"
    lacking = [gpu for gpu in gpus if not gpu.bf16_native]
    if lacking:
        gpu = lacking[0]
        return ["float16", "float32"], f"{gpu.name} (CC {gpu.compute_capability}) has no native BF16"
    gpu = gpus[0]
    return ["bfloat16", "float16", "float32"], f"{gpu.name} (CC {gpu.compute_capability}) has native BF16"


def resolve_compute_dtype(
    *,
    requested: str | None,
    checkpoint_dtype: str | None,
    checkpoint_source: str,
    gpus: list[GpuFacts],
    platform: str,
    model_type: str | None = None,
    quantization: str | None = None,
) -> ComputeDtype:
    """The engine's compute dtype for this launch (see the module docstring for vLLM's rule)."""
    wanted = dtype_name(requested)
    if wanted and wanted != "auto":
        result = ComputeDtype(dtype=wanted, source=f"serve.dtype {requested} (--dtype {requested})")
    else:
        result = _auto(dtype_name(checkpoint_dtype), checkpoint_source, gpus, platform, model_type)
    if result.dtype is not None and quantization in BF16_ONLY_QUANTIZATION and result.dtype != "bfloat16":
        refused = (
            f"vLLM refuses {result.dtype} for quantization {quantization} (its activations are bfloat16 only)"
        )
        return result.model_copy(update={"refused": refused})
    if result.dtype == "float16" and model_type in FP16_REFUSED_MODEL_TYPES:
        refused = f"vLLM refuses float16 for model type {model_type} (_FLOAT16_NOT_SUPPORTED_MODELS)"
        return result.model_copy(update={"refused": refused})
    return result


def _auto(
    checkpoint: str | None,
    checkpoint_source: str,
    gpus: list[GpuFacts],
    platform: str,
    model_type: str | None,
) -> ComputeDtype:
    if checkpoint is None:
        return ComputeDtype(
            dtype=None,
            source=f"serve.dtype auto and the checkpoint dtype is unknown ({checkpoint_source})",
        )
    if platform != "cpu" and not gpus:
        return ComputeDtype(dtype=None, source="serve.dtype auto and no GPU facts to resolve it on")
    choices, why = _platform_choices(platform, gpus)
    if model_type in FP16_REFUSED_MODEL_TYPES and "float16" in choices:
        choices.remove("float16")
        why += f"; vLLM never picks float16 for {model_type}"
    preferred = choices[0]
    held = f"{checkpoint} checkpoint ({checkpoint_source})"
    if checkpoint == "float32":
        return ComputeDtype(
            dtype=preferred, source=f"serve.dtype auto downcasts the {held} to {preferred}: {why}"
        )
    if checkpoint in choices:
        return ComputeDtype(dtype=checkpoint, source=f"serve.dtype auto keeps the {held}: {why}")
    return ComputeDtype(
        dtype=preferred, source=f"vLLM's fallback: {why}, so serve.dtype auto runs the {held} in {preferred}"
    )
