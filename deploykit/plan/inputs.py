"""What a plan decides from: the model's path and checkpoint facts, the vLLM it targets and the dtype the
engine computes in, gathered into the fixes' DecisionInputs."""

from __future__ import annotations

import json
from pathlib import Path

from deploykit.advisories import (
    ComputeDtype,
    quantization_method,
    resolve_compute_dtype,
)
from deploykit.fixes.base import DecisionInputs
from deploykit.plan.layout import ParallelLayout
from deploykit.probe.facts import ProbeFacts
from deploykit.profile.schema import BUILTIN_PREFIX, Profile
from deploykit.vllm_compat import (
    is_cpu_build,
)


def resolve_model_path(profile: Profile) -> str:
    """The path vLLM is given: builtin models resolve to their cache directory (built on first serve)."""
    source = profile.model.source
    if source.startswith(BUILTIN_PREFIX):
        from deploykit.builtin_models import model_dir

        return str(model_dir(source[len(BUILTIN_PREFIX) :]))
    return source


def read_local_config(model_path: str) -> dict[str, object]:
    config_path = Path(model_path) / "config.json"
    try:
        data = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def checkpoint_facts(profile: Profile, model_path: str) -> tuple[str | None, list[str]]:
    """Checkpoint dtype and architectures: the profile's statement wins, else config.json when local."""
    config = read_local_config(model_path)
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    assert isinstance(text_config, dict)
    dtype: str | None = profile.model.checkpoint_dtype
    if dtype is None:
        raw = config.get("torch_dtype") or config.get("dtype") or text_config.get("torch_dtype")
        dtype = str(raw) if raw else None
    if profile.model.source.startswith(BUILTIN_PREFIX) and dtype is None:
        dtype = "float32"
    architectures: list[str]
    if profile.model.architecture:
        architectures = [profile.model.architecture]
    else:
        listed = config.get("architectures")
        architectures = [str(a) for a in listed] if isinstance(listed, list) else []
    return dtype, architectures


def target_vllm_version(profile: Profile, facts: ProbeFacts) -> str | None:
    """The vLLM version a plan targets (`Plan.vllm_version`), the one fact every version-dependent
    decision reads. First the profile's `vllm_version` (the vLLM the deployment runs, stated), else the
    facts' `vllm_version`: what the probe found installed on the machine it ran on, which is the target
    for `--facts FILE` (a `deploykit probe --save FILE` made there) and this machine for a live probe.
    None when neither names one. The installed vLLM is never read here directly: only through a live
    probe. (`validate_plan` is the exception: it checks the argv with the installed vLLM's parser.)"""
    return profile.vllm_version or facts.vllm_version


def compute_dtype(
    profile: Profile,
    facts: ProbeFacts,
    model_path: str,
    checkpoint_dtype: str | None,
    platform: str,
    layout: ParallelLayout,
) -> ComputeDtype:
    """The dtype the planned engine computes in (deploykit.advisories.compute_dtype): `serve.dtype`, else
    vLLM's `auto` on the GPUs the layout uses, checked against the quantization method (extra_args, else
    config.json)."""
    config = read_local_config(model_path)
    if profile.model.checkpoint_dtype:
        source = "model.checkpoint_dtype"
    elif config:
        source = "config.json"
    else:
        source = "no model.checkpoint_dtype and no local config.json"
    model_type = config.get("model_type")
    used = facts.gpus[: layout.gpu_request]
    return resolve_compute_dtype(
        requested=profile.serve.dtype,
        checkpoint_dtype=checkpoint_dtype,
        checkpoint_source=source,
        gpus=used,
        platform=platform,
        model_type=model_type if isinstance(model_type, str) else None,
        quantization=quantization_method(profile.serve.extra_args, config),
    )


def decision_inputs(
    profile: Profile, facts: ProbeFacts, model_path: str, layout: ParallelLayout
) -> DecisionInputs:
    dtype, architectures = checkpoint_facts(profile, model_path)
    version = target_vllm_version(profile, facts)
    platform = "cpu" if profile.platform == "cpu" or is_cpu_build(version) else "cuda"
    compute = compute_dtype(profile, facts, model_path, dtype, platform, layout)
    return DecisionInputs(
        gpus=facts.gpus,
        vllm_version=version,
        checkpoint_dtype=dtype,
        model_architectures=architectures,
        lora_enabled=profile.serve.lora.enabled,
        lora_fully_sharded="--fully-sharded-loras" in profile.serve.extra_args,
        penalties_expected=profile.workload.penalties,
        model_runner=profile.serve.model_runner,
        platform=platform,
        compute_dtype=compute.dtype,
        compute_dtype_source=compute.source,
        compute_dtype_refused=compute.refused,
    )
