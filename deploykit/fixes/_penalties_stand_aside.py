"""The patch that makes vLLM's host penalty path stand aside while deploykit's device penalties processor
serves a batch, and the check that vLLM still has the pieces it patches (the layout of the vLLM this fix was
written for, 0.32-0.33).

Imported on demand, by `deploykit.fixes.penalties` for the target check and by the processor when it
engages; vLLM is imported inside the functions only, so that a vLLM without the V1 pieces (0.34 removed
them) gets a "target missing" row, never a ModuleNotFoundError.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from deploykit.fixes.base import TargetCheck, TargetStatus, target_missing, upstream_guard

FIX_NAME = "device_penalties"
TARGET = "vllm.v1.worker.gpu_input_batch.InputBatch.no_penalties"
STANDS_IN_MARKER = "deploykit_stands_in_for_host_penalties"
"""Class attribute of a logits processor that applies the penalties itself: an engaged one makes the host
path stand aside (an attribute, not an isinstance check: this module never imports the processor)."""


V1_MODULES = (
    "vllm.v1.sample.sampler",
    "vllm.v1.sample.logits_processor",
    "vllm.v1.sample.metadata",
    "vllm.v1.sample.ops.penalties",
    "vllm.v1.worker.gpu_input_batch",
)
"""The V1 modules the patch and the processor need, each located (not imported) by the target check."""


def _module_exists(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package is gone
        return False


@dataclass
class _StandAside:
    installed: bool = False
    original: Any = None


_STAND_ASIDE = _StandAside()


def check_target() -> TargetCheck:
    """Does the installed vLLM have the V1 pieces we patch, in the shape we expect?"""
    target = TARGET
    gone = [name for name in V1_MODULES if not _module_exists(name)]
    if gone:  # 0.34 deleted the V1 runner, its sampler and the logits-processor package
        return target_missing(target, f"the V1 model runner's penalty path: {', '.join(gone)} gone")
    try:
        from vllm.v1.sample import sampler as sampler_module
        from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality
        from vllm.v1.sample.metadata import SamplingMetadata
        from vllm.v1.sample.ops import penalties as penalties_ops
        from vllm.v1.worker import gpu_input_batch
    except ImportError as exc:
        return target_missing(target, f"the V1 model runner's penalty path: import failed: {exc}")

    problems: list[str] = []
    input_batch = getattr(gpu_input_batch, "InputBatch", None)
    if input_batch is None:
        problems.append("InputBatch class is gone")
    else:
        prop = input_batch.__dict__.get("no_penalties")
        if not isinstance(prop, property) and not _STAND_ASIDE.installed:
            problems.append("InputBatch.no_penalties is not a property")
        init_params = inspect.signature(input_batch.__init__).parameters
        for name in ("logitsprocs", "logitsprocs_need_output_token_ids"):
            if name not in init_params:
                problems.append(f"InputBatch.__init__ has no {name!r} parameter")
    if "no_penalties" not in getattr(SamplingMetadata, "__dataclass_fields__", {}):
        problems.append("SamplingMetadata has no no_penalties field")
    sampler_cls = getattr(sampler_module, "Sampler", None)
    apply_penalties = getattr(sampler_cls, "apply_penalties", None)
    if apply_penalties is None or "no_penalties" not in inspect.getsource(apply_penalties):
        problems.append("Sampler.apply_penalties no longer consults sampling_metadata.no_penalties")
    processor_init = inspect.signature(LogitsProcessor.__init__).parameters
    if list(processor_init)[:4] != ["self", "vllm_config", "device", "is_pin_memory"]:
        problems.append(f"LogitsProcessor.__init__ takes {list(processor_init)}")
    for method in ("apply", "update_state", "is_argmax_invariant"):
        if method not in getattr(LogitsProcessor, "__abstractmethods__", ()):
            problems.append(f"LogitsProcessor.{method} is not part of the interface")
    batch_fields = set(getattr(BatchUpdate, "__dataclass_fields__", {}))
    if not {"batch_size", "removed", "added", "moved"} <= batch_fields:
        problems.append(f"BatchUpdate fields are {sorted(batch_fields)}")
    if not {"SWAP", "UNIDIRECTIONAL"} <= set(MoveDirectionality.__members__):
        problems.append("MoveDirectionality lost SWAP/UNIDIRECTIONAL")
    host_path = getattr(penalties_ops, "apply_all_penalties", None)
    if host_path is None:
        problems.append("vllm.v1.sample.ops.penalties.apply_all_penalties is gone")
    if problems:
        return target_missing(target, "; ".join(problems))

    assert host_path is not None
    output_param = inspect.signature(host_path).parameters.get("output_token_ids")
    if output_param is None or "list" not in str(output_param.annotation):
        return TargetCheck(
            status=TargetStatus.FIXED_UPSTREAM,
            target=target,
            detail="apply_all_penalties no longer takes per-request Python lists of output ids "
            f"(output_token_ids: {None if output_param is None else output_param.annotation})",
        )
    return TargetCheck(
        status=TargetStatus.APPLICABLE,
        target=target,
        detail="V1 sampler pads Python output-id lists into a new tensor every step (apply_all_penalties)",
    )


def _batch_uses_device_penalties(batch: Any) -> bool:
    procs = getattr(batch, "logitsprocs", None)
    return any(
        getattr(proc, STANDS_IN_MARKER, False) and getattr(proc, "engaged", False)
        for proc in getattr(procs, "non_argmax_invariant", ())
    )


def install_stand_aside() -> str:
    """Make InputBatch report "no penalties" to vLLM's sampler when our processor serves the batch.

    vLLM then skips apply_all_penalties, the per-step list padding and the prompt tensor it builds
    for it. A batch without our processor (the fix on, but no --logits-processors) keeps the host path,
    so penalties are applied exactly once either way.
    """
    from vllm.v1.worker.gpu_input_batch import InputBatch

    if _STAND_ASIDE.installed:
        return "vllm.v1.worker.gpu_input_batch.InputBatch.no_penalties"
    original = InputBatch.__dict__["no_penalties"]

    def no_penalties(self: Any) -> bool:
        if _batch_uses_device_penalties(self):
            return True
        return bool(original.fget(self))

    patched = property(no_penalties, doc="deploykit device_penalties: the host penalty path stands aside")
    setattr(InputBatch, "no_penalties", patched)  # noqa: B010 (mypy: a property replaced on the class)
    _STAND_ASIDE.installed = True
    _STAND_ASIDE.original = original
    return "vllm.v1.worker.gpu_input_batch.InputBatch.no_penalties"


def remove_stand_aside() -> None:
    """Undo install_stand_aside (tests use it to compare with and without the patch in one process)."""
    from vllm.v1.worker.gpu_input_batch import InputBatch

    if _STAND_ASIDE.installed:
        setattr(InputBatch, "no_penalties", _STAND_ASIDE.original)  # noqa: B010
        _STAND_ASIDE.installed = False
        _STAND_ASIDE.original = None


def engage_or_pass_through() -> bool:
    """Called by each processor: True when it must apply penalties (host path made to stand aside)."""
    if upstream_guard(FIX_NAME, check_target()) is not None:
        return False  # fixed upstream: the processor passes logits through
    install_stand_aside()
    return True
