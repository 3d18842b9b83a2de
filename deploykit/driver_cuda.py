"""Does the node's NVIDIA driver run the CUDA the target vLLM wheel was built with? From the probe facts
(`cuda_driver_version`: the newest CUDA the driver supports, NVML's nvmlSystemGetCudaDriverVersion) and the
plan's target vLLM version. Facts of a 460 or 470 driver (CUDA 11.2 / 11.4) planned for a CUDA 12 wheel
describe a node where vLLM cannot start: `plan` warns, and the chart asks for nodes whose driver is new
enough (GPU Feature Discovery's `nvidia.com/cuda.driver-version.major`... labels; issue 34).

The wheel's CUDA per vLLM minor release is deploykit's declared table (`WHEEL_CUDA`), not read from any
wheel: the standard PyPI wheel of each release this deploykit targets. NVIDIA's rules (the CUDA
compatibility guide): a driver runs CUDA X.Y when it supports X.Y or newer; one that supports an older
minor of the same major runs it with minor-version compatibility (no PTX JIT), if it is at least the
major's minimum driver (`MINOR_COMPAT_DRIVER`); an older major never.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deploykit.probe.facts import ProbeFacts

WHEEL_CUDA: dict[tuple[int, int], tuple[int, int]] = {
    (0, 32): (12, 9),
    (0, 33): (12, 9),
    (0, 34): (12, 9),
}
"""vLLM minor release → the CUDA (major, minor) its standard PyPI wheel is built with."""

MINOR_COMPAT_DRIVER: dict[int, int] = {12: 525, 13: 580}
"""CUDA major → the oldest Linux driver branch that runs any of its minors (minor-version compatibility:
NVIDIA's >= 525.60.13 for CUDA 12.x, >= 580 for 13.x)."""

LABEL_CUDA_DRIVER_MAJOR = "nvidia.com/cuda.driver-version.major"
"""GPU Feature Discovery's label of the node driver's branch (e.g. `535`)."""


@dataclass(frozen=True)
class DriverCheck:
    status: str  # "ok", "minor-compat", "too-old", "unknown"
    message: str
    wheel_cuda: tuple[int, int] | None = None


def _numbers(text: str | None, count: int) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = text.split("+", 1)[0].split(".")[:count]
    try:
        numbers = tuple(int(part) for part in parts)
    except ValueError:
        return None
    return numbers if len(numbers) == count else None


def wheel_cuda(vllm_version: str | None) -> tuple[int, int] | None:
    """The CUDA the target vLLM's wheel needs; None when deploykit's table does not say (or a CPU build)."""
    if vllm_version is None or "cpu" in vllm_version:
        return None
    release = _numbers(vllm_version, 2)
    return WHEEL_CUDA.get((release[0], release[1])) if release else None


def check_driver(
    driver_version: str | None, cuda_driver_version: str | None, vllm_version: str | None
) -> DriverCheck:
    """The node's driver against the target vLLM wheel's CUDA, in one line."""
    needed = wheel_cuda(vllm_version)
    if needed is None:
        return DriverCheck(
            "unknown", f"no CUDA known for vLLM {vllm_version}'s wheel: the driver is not checked"
        )
    supports = _numbers(cuda_driver_version, 2)
    branch = _numbers(driver_version, 1)
    if supports is None:
        return DriverCheck("unknown", "the facts do not say the driver's CUDA: not checked", needed)
    want = f"{needed[0]}.{needed[1]}"
    driver = f"driver {driver_version or '?'} (CUDA up to {supports[0]}.{supports[1]})"
    if supports >= needed:
        return DriverCheck("ok", f"{driver} runs vLLM {vllm_version}'s CUDA {want}", needed)
    minimum = MINOR_COMPAT_DRIVER.get(needed[0])
    if supports[0] == needed[0] and branch is not None and minimum is not None and branch[0] >= minimum:
        return DriverCheck(
            "minor-compat",
            f"{driver} runs vLLM {vllm_version}'s CUDA {want} only with minor-version compatibility (no PTX "
            "JIT): a kernel vLLM compiles at run time may fail; update the driver",
            needed,
        )
    newer = f"a driver of branch {minimum} or newer" if minimum else f"a driver that supports CUDA {want}"
    return DriverCheck(
        "too-old",
        f"{driver} cannot run vLLM {vllm_version}'s wheel, built with CUDA {want}: vLLM will fail to start "
        f"on this node; it needs {newer}",
        needed,
    )


def driver_node_expression(needed: tuple[int, int]) -> dict[str, Any] | None:
    """A node-selector expression (GFD label) for nodes whose driver branch runs CUDA `needed`, or None
    when the minimum branch is not known."""
    minimum = MINOR_COMPAT_DRIVER.get(needed[0])
    if minimum is None:
        return None
    return {"key": LABEL_CUDA_DRIVER_MAJOR, "operator": "Gt", "values": [str(minimum - 1)]}


def driver_warning(facts: ProbeFacts, vllm_version: str | None, platform: str) -> str | None:
    """`plan`'s warning when the facts' driver cannot run the target vLLM's CUDA (a GPU profile with GPU
    facts only)."""
    if not facts.gpus or platform == "cpu" or facts.platform not in (None, "cuda"):
        return None
    found = check_driver(facts.driver_version, facts.cuda_driver_version, vllm_version)
    # Minor-version compatibility is how most clusters run (a 535 driver under a CUDA 12.9 wheel): no warning.
    return f"driver: {found.message}" if found.status == "too-old" else None


def with_driver_expression(terms: list[dict[str, Any]], vllm_version: str | None) -> list[dict[str, Any]]:
    """The chart's GPU node-selector terms, each also asking for a driver branch that runs the target
    vLLM wheel's CUDA (`driver_node_expression`): a pod never lands on a node where vLLM cannot start.
    Unchanged when the wheel's CUDA is not known (or there are no terms: no GPU facts)."""
    needed = wheel_cuda(vllm_version)
    expression = driver_node_expression(needed) if needed is not None else None
    if expression is None:
        return terms
    return [{**term, "matchExpressions": [*term.get("matchExpressions", []), expression]} for term in terms]
