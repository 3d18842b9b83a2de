"""The compute dtype a plan resolves (deploykit.advisories.compute_dtype), case by case against vLLM's rule
(vllm/config/model.py _get_and_verify_dtype / _resolve_auto_dtype, config/vllm.py's quantization check)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploykit.advisories.compute_dtype import quantization_method, resolve_compute_dtype
from deploykit.probe.facts import GpuFacts, ProbeFacts

FACTS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


def gpus(name: str) -> list[GpuFacts]:
    return ProbeFacts.model_validate_json((FACTS_DIR / f"{name}.json").read_text()).gpus


@pytest.mark.parametrize(
    ("requested", "checkpoint", "gpu", "platform", "model_type", "expected"),
    [
        ("float16", "bfloat16", "h100", "cuda", None, "float16"),  # stated: used as given
        ("half", None, "a100", "cuda", None, "float16"),
        ("auto", "bfloat16", "a100", "cuda", None, "bfloat16"),
        ("auto", "bfloat16", "t4", "cuda", None, "float16"),  # no native BF16: the fallback
        ("auto", "float32", "t4", "cuda", None, "float16"),  # float32 downcast to the first choice
        ("auto", "float32", "h100", "cuda", None, "bfloat16"),
        ("auto", "float16", "h100", "cuda", None, "float16"),  # an FP16 checkpoint stays FP16
        ("auto", "bfloat16", "t4", "cuda", "gemma3", "float32"),  # gemma3 never gets float16
        ("auto", "float32", None, "cpu", None, "bfloat16"),
        ("auto", None, "h100", "cuda", None, None),  # unknown checkpoint
        ("auto", "bfloat16", None, "cuda", None, None),  # no GPU facts
    ],
)
def test_resolution(
    requested: str,
    checkpoint: str | None,
    gpu: str | None,
    platform: str,
    model_type: str | None,
    expected: str | None,
) -> None:
    result = resolve_compute_dtype(
        requested=requested,
        checkpoint_dtype=checkpoint,
        checkpoint_source="config.json",
        gpus=gpus(gpu) if gpu else [],
        platform=platform,
        model_type=model_type,
    )
    assert result.dtype == expected, result.source
    assert result.refused is None
    assert result.source


def test_a_bf16_only_quantization_refuses_float16() -> None:
    result = resolve_compute_dtype(
        requested="auto",
        checkpoint_dtype="float16",
        checkpoint_source="config.json",
        gpus=gpus("h100"),
        platform="cuda",
        quantization="mxfp4",
    )
    assert result.dtype == "float16"
    assert result.refused is not None and "bfloat16 only" in result.refused


def test_quantization_read_from_argv_before_config() -> None:
    config = {"quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"}}
    assert quantization_method([], config) == "nvfp4"
    assert quantization_method(["--quantization", "fp8"], config) == "fp8"
    assert quantization_method([], {"torch_dtype": "bfloat16"}) == "none"
    assert quantization_method([], {}) is None
