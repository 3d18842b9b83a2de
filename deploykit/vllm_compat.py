"""What deploykit knows about vLLM versions, without importing vLLM.

Every fact here names where it came from in vLLM's source or history.
"""

from __future__ import annotations

import re


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """'0.32.0+cpu' → (0, 32, 0); None or unparsable → None."""
    if not text:
        return None
    match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def is_cpu_build(version_text: str | None) -> bool:
    """vLLM picks its CPU platform from a "cpu" in its version (vllm/platforms/__init__.py)."""
    return bool(version_text) and "cpu" in str(version_text)


# vLLM PR #44443 ("[ModelRunner V2] Enable by default for all dense models", merged 2026-07-02) made
# VllmConfig.use_v2_model_runner default to True when Triton works and no unsupported feature is set
# (vllm/config/vllm.py). Its first release is v0.25.0 (release notes: "Model Runner V2 is now the
# default for all dense models (#44443)"). Earlier, narrower steps: v0.22.0 Qwen3 dense only (#39337),
# v0.23.0 also Llama/Mistral dense (#43458); later #53183 extended the default to MoE/hybrid models.
# The installed 0.32 source has no per-architecture list left: only Triton and unsupported features.
V2_RUNNER_DEFAULT_SINCE: tuple[int, int, int] = (0, 25, 0)


def default_model_runner(vllm_version: str | None, platform: str) -> str:
    """ "v1" or "v2": the model runner the target vLLM picks when VLLM_USE_V2_MODEL_RUNNER is unset.

    The V2 runner needs Triton on a GPU (config/vllm.py: "Model Runner V2 requires Triton; using the
    V1 model runner instead"), so the CPU build runs V1 whatever its version.
    """
    if platform == "cpu" or is_cpu_build(vllm_version):
        return "v1"
    parsed = parse_version(vllm_version)
    if parsed is None:
        return "v2"  # unknown target: assume the newest behaviour
    return "v2" if parsed >= V2_RUNNER_DEFAULT_SINCE else "v1"
