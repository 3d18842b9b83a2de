"""Broken variants of the tiny Llama for the trace tests, made by editing one tensor of its checkpoint,
and profiles that serve them on the CPU build."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.vllm_harness import REPO

VARIANTS: dict[str, tuple[str, str]] = {
    # name: (tensor, what to do)
    "norm-inf": ("model.norm.weight", "inf"),
    "layer-inf": ("model.layers.1.mlp.down_proj.weight", "inf"),
    "lm-head-zero": ("lm_head.weight", "zero"),
    # NaN in the embedding row of token 0 (<pad>): only an all-zero input_ids (vLLM's dummy run) reads it.
    "zero-input-fault": ("model.embed_tokens.weight", "row0-nan"),
}


def _edit(tensor: Any, how: str) -> Any:
    if how == "inf":
        return tensor.fill_(float("inf"))
    if how == "zero":
        return tensor.zero_()
    if how == "row0-nan":
        tensor[0].fill_(float("nan"))
        return tensor
    raise ValueError(how)


def tiny_variant(base: Path, variant: str) -> Path:
    """A copy of the tiny model with one tensor edited; cached beside the tiny model."""
    from safetensors.torch import load_file, save_file

    target = base.parent / f"{base.name}-{variant}"
    if (target / "deploykit-recipe.json").exists():
        return target
    staging = base.parent / f".{target.name}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(base, staging)
    name, how = VARIANTS[variant]
    weights = staging / "model.safetensors"
    tensors = load_file(str(weights))
    _edit(tensors[name], how)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    try:
        staging.rename(target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def write_profile(
    folder: Path,
    name: str,
    model: Path,
    *,
    served_name: str = "tiny",
    dtype: str = "float32",
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
    edit: Callable[[dict[str, Any]], None] | None = None,
) -> Path:
    """A CPU profile serving `model` like demo-cpu does; returns its path."""
    data: dict[str, Any] = {
        "name": name,
        "platform": "cpu",
        "model": {"source": str(model), "served_name": served_name, "checkpoint_dtype": dtype},
        "serve": {
            "dtype": dtype,
            "max_model_len": 256,
            "enforce_eager": True,
            "kv_cache_memory_bytes": "64M",
            "generation_config": "vllm",
            "extra_args": list(extra_args or []),
        },
        "env": {
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            # the worktree's deploykit (and tests/ for the test-only worker) in every vLLM process
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            **(env or {}),
        },
        "smoke": {"timeout_s": 120, "cases": [{"kind": "completion", "max_tokens": 4}]},
        "deploy": {"startup_timeout_s": 300},
    }
    if edit is not None:
        edit(data)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
