"""Matmul LoRA fix: replace punica's Triton `add_lora_linear` with plain torch matmuls on Hopper.

See docs/fixes/matmul-lora.md. Decision rule here is pure; torch and vLLM are imported in functions only.
The rule is per vLLM release: facts read from each release's source (SOURCE_FACTS, _matmul_lora_source.py)
are shipped with deploykit (deploykit/vllm_tables) and read from the installed vLLM's files for a release
not shipped.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploykit.fixes._matmul_lora_source import CPU_OPS_FILE as CPU_OPS_FILE
from deploykit.fixes._matmul_lora_source import CPU_OPS_MASK_NO_ADAPTER as CPU_OPS_MASK_NO_ADAPTER
from deploykit.fixes._matmul_lora_source import EXPAND_OP_FILE as EXPAND_OP_FILE
from deploykit.fixes._matmul_lora_source import EXPAND_SM90_SINGLE_STAGE as EXPAND_SM90_SINGLE_STAGE
from deploykit.fixes._matmul_lora_source import SOURCE_FACTS as SOURCE_FACTS
from deploykit.fixes._matmul_lora_source import cpu_ops_mask_no_adapter as cpu_ops_mask_no_adapter
from deploykit.fixes._matmul_lora_source import expand_sm90_single_stage as expand_sm90_single_stage
from deploykit.fixes._matmul_lora_source import read_source_facts as read_source_facts
from deploykit.fixes._matmul_lora_source import release_source_facts
from deploykit.fixes.base import (
    TURNED_OFF,
    Decision,
    DecisionInputs,
    Fix,
    FixAdvisory,
    FixDecision,
    FixError,
    FixMode,
    TargetCheck,
    TargetStatus,
    decision_maker,
    target_missing,
    upstream_guard,
)
from deploykit.installed import vllm_version_label

if TYPE_CHECKING:
    import torch

    from deploykit.trace_records import HeaderLine, ModuleLine

NAME = "matmul_lora"
SUMMARY = "LoRA linear layers through torch.matmul instead of punica's Triton kernels (NaN on Hopper)"
PATCHES = "vllm.lora.punica_wrapper: PunicaWrapper*.add_lora_linear"
# The known-bad combination it fixes, as the advisory catalog lists it (`deploykit advisories`).
ADVISORY: FixAdvisory = {
    "title": 'LoRA output becomes "!!!!" on Hopper',
    "symptom": (
        'punica\'s Triton LoRA kernel returns NaN on sm90 for long prompts; the text turns into "!!!!"'
    ),
    "kind": "corruption",
    "references": [
        {
            "number": 48590,
            "note": "lora_expand with block_n=128 outputs NaN on H20 (sm90); also a MoE hybrid-GDN model "
            "(Qwen3.6-35B-A3B) on 0.26.0, cured by block_n=32",
        },
        {"number": 47869, "note": "the fp32 shrink buffer sends lora_expand down a NaN path"},
        {"number": 52568, "note": "Qwen3.5 + dynamic LoRA on H20: all '!' past ~400 tokens, still on 0.28.0"},
        {"number": 48638, "kind": "pr", "note": "block_n=32 on Hopper; open"},
    ],
    "vllm": {"evidence": "no merged fix (#48638 and the #47869 proposal are open)"},
}


# The Triton wrapper whose uninitialised shrink buffer the field report traced the NaN to.
GPU_WRAPPER_MODULE = "vllm.lora.punica_wrapper.punica_gpu"
GPU_WRAPPER_CLASS = "PunicaWrapperGPU"
# What the wrappers of vLLM 0.32–0.33 accept (punica_base.PunicaWrapperABC.add_lora_linear).
EXPECTED_POSITIONAL = ("self", "y", "x", "lora_a_stacked", "lora_b_stacked", "scale", "output_slices")
EXPECTED_KEYWORD_ONLY = ("buffer",)
# Keyword arguments vLLM's layers pass through **kwargs that our path honours; any other is refused.
HONOURED_KWARGS = frozenset({"add_inputs", "offset_start"})
PATCH_MARKER = "_deploykit_matmul_lora"


def decide(inputs: DecisionInputs, mode: FixMode) -> FixDecision:
    result = decision_maker(NAME, mode)
    if mode is FixMode.OFF:
        return result(Decision.NOT_NEEDED, TURNED_OFF)
    if not inputs.lora_enabled:
        if mode is FixMode.ON:
            return result(Decision.IMPOSSIBLE, "forced on, but the profile does not enable LoRA")
        return result(Decision.NOT_NEEDED, "LoRA is not enabled")
    if inputs.lora_fully_sharded:
        return result(
            Decision.IMPOSSIBLE,
            "--fully-sharded-loras makes vLLM's sharded LoRA layers call punica's shrink/expand kernels "
            "directly, which this fix does not replace",
        )
    if mode is FixMode.ON:
        return result(Decision.ENABLED, "forced on by the profile")
    facts = release_source_facts(inputs.vllm_version)
    if inputs.platform == "cpu":
        if facts.get(CPU_OPS_MASK_NO_ADAPTER) is True:
            return result(
                Decision.NOT_NEEDED,
                f"LoRA on vLLM {inputs.vllm_version}'s CPU build: its torch LoRA ops clamp the slot index "
                f"and zero rows without an adapter ({CPU_OPS_FILE}), so slot -1 is no adapter there",
            )
        unknown = (
            "" if CPU_OPS_MASK_NO_ADAPTER in facts else f" (vLLM {inputs.vllm_version}'s source unknown)"
        )
        return result(
            Decision.ENABLED,
            "LoRA on vLLM's CPU build: its torch path reads slot -1 (no adapter) as the last adapter, "
            f"so base requests batched with adapter requests get that adapter{unknown}",
        )
    hopper = [g for g in inputs.gpus if g.is_hopper]
    if hopper:
        gpu = hopper[0]
        guard = ""
        if facts.get(EXPAND_SM90_SINGLE_STAGE) is True:
            guard = (
                f"; vLLM {inputs.vllm_version}'s sm90 guard (lora_expand with NUM_STAGES = 1 for a ptxas "
                "miscompile, triton-lang/triton#9433) may cure #52568, but no GPU run has shown it yet"
            )
        return result(
            Decision.ENABLED,
            f"LoRA on {gpu.name} (CC {gpu.compute_capability}, Hopper): punica's Triton add_lora_linear "
            f"can return NaN there{guard}",
        )
    if not inputs.gpus:
        return result(Decision.NOT_NEEDED, "LoRA enabled, but no GPU facts say Hopper")
    gpu = inputs.gpus[0]
    return result(
        Decision.NOT_NEEDED,
        f"LoRA on {gpu.name} (CC {gpu.compute_capability}, {gpu.arch}): not Hopper",
    )


LAUNCH_FLAGS: tuple[str, ...] = ()
# The vLLM source files the target lives in, relative to the folder holding `vllm/`: what
# `make vllm-release` (tools/vllm_release.py) judges "changed" or "gone" on; `file::Class` narrows a file to
# the one class the fix patches.
TARGET_SOURCES: tuple[str, ...] = (
    "vllm/lora/punica_wrapper/punica_base.py",
    "vllm/lora/punica_wrapper/punica_gpu.py",
    "vllm/lora/punica_wrapper/punica_cpu.py",
    "vllm/lora/ops/torch_ops/lora_ops.py",
    "vllm/lora/ops/triton_ops/lora_expand_op.py",
    "vllm/lora/ops/triton_ops/lora_shrink_op.py",
)


def launch_args(inputs: DecisionInputs) -> list[str]:
    return []


def plan_warnings(inputs: DecisionInputs, decision: FixDecision) -> list[str]:
    return []


def trace_suggestion(
    culprit: ModuleLine, header: HeaderLine | None, lines: Sequence[ModuleLine]
) -> str | None:
    """The culprit is a LoRA-wrapped layer: the delta punica adds is where the NaN comes from, the more
    so when its base layer's own output (same step, same rank) was finite."""
    if "LoRA" not in culprit.class_name:
        return None
    base = next(
        (
            ln
            for ln in lines
            if ln.module == f"{culprit.module}.base_layer"
            and ln.step == culprit.step
            and ln.rank == culprit.rank
        ),
        None,
    )
    base_note = ""
    if base is not None and base.output_finite:
        base_note = f" while its base layer {base.module} ({base.class_name}) returned finite values"
    return (
        f"{culprit.module} is a LoRA-wrapped layer ({culprit.class_name}); its output went non-finite from "
        f"finite inputs{base_note}: the LoRA delta (punica's add_lora_linear) made the NaN. {NAME} "
        "computes the delta with torch.matmul (vLLM #48590, #47869)."
    )


# --------------------------------------------------------------------------------------------------
# The function: pure torch, static shapes, no host syncs, so torch.compile and CUDA graphs accept it.
# --------------------------------------------------------------------------------------------------


def add_lora_linear(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a_stacked: Sequence[torch.Tensor],
    lora_b_stacked: Sequence[torch.Tensor],
    scale: float,
    output_slices: Sequence[int],
    token_lora_indices: torch.Tensor,
    *,
    offset_start: int = 0,
    add_inputs: bool = True,
) -> torch.Tensor:
    """y[t, slice s] (+)= scale * (x[t] @ A_s[slot_t]^T) @ B_s[slot_t]^T; nothing for slot -1.

    Layouts are vLLM's: A_s is [max_loras, 1, rank, in], B_s is [max_loras, 1, out_s, rank],
    `token_lora_indices` holds one slot id (or -1) per row of x. Every slot is computed for every
    token and masked, so shapes never depend on which adapters a batch uses; all arithmetic is FP32
    and every value written to `y` is computed, never read from uninitialised memory.
    """
    import torch

    if not len(lora_a_stacked) == len(lora_b_stacked) == len(output_slices):
        raise ValueError(
            f"add_lora_linear: {len(lora_a_stacked)} A slices, {len(lora_b_stacked)} B slices, "
            f"{len(output_slices)} output slices; they must match"
        )
    x_rows = x.reshape(-1, x.shape[-1]).to(torch.float32)
    y_rows = y.view(-1, y.shape[-1])
    offset = offset_start
    for a_stacked, b_stacked, width in zip(lora_a_stacked, lora_b_stacked, output_slices, strict=True):
        delta = _slice_delta(x_rows, a_stacked, b_stacked, scale, token_lora_indices)
        target = y_rows[:, offset : offset + width]
        if add_inputs:
            target.copy_(target.to(torch.float32) + delta)
        else:
            target.copy_(delta)
        offset += width
    return y


def _slice_delta(
    x_rows: torch.Tensor,
    a_stacked: torch.Tensor,
    b_stacked: torch.Tensor,
    scale: float,
    token_lora_indices: torch.Tensor,
) -> torch.Tensor:
    """One output slice's LoRA delta in FP32: one shrink GEMM over all slots, one expand GEMM per slot."""
    import torch

    num_slots, _, rank, in_features = a_stacked.shape
    num_tokens = x_rows.shape[0]
    # [max_loras * rank, in]: a view of vLLM's contiguous stack, so the shrink of all slots is one GEMM.
    a_all = a_stacked.reshape(num_slots * rank, in_features).to(torch.float32)
    shrunk = torch.matmul(x_rows, a_all.t()).view(num_tokens, num_slots, rank)
    slot_ids = torch.arange(num_slots, device=x_rows.device)
    token_uses_slot = token_lora_indices.view(-1, 1, 1) == slot_ids.view(1, -1, 1)
    # where(), not a multiply by the mask: a non-finite value in another slot's product stays out.
    shrunk = torch.where(token_uses_slot, shrunk * scale, 0.0)
    delta = torch.zeros((num_tokens, b_stacked.shape[2]), dtype=torch.float32, device=x_rows.device)
    for slot in range(num_slots):
        # B[slot] is [out, rank]; its transpose is a view, so no weight is copied for FP32 adapters.
        delta = torch.addmm(delta, shrunk[:, slot, :], b_stacked[slot, 0].to(torch.float32).t())
    return delta


# --------------------------------------------------------------------------------------------------
# The patch: the punica wrapper class the platform uses routes linear-layer LoRA through the function.
# --------------------------------------------------------------------------------------------------


def _wrapper_qualname() -> str:
    from vllm.platforms import current_platform

    return str(current_platform.get_punica_wrapper())


def _resolve(qualname: str) -> type[Any]:
    module_name, _, class_name = qualname.rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not isinstance(cls, type):
        raise TypeError(f"{qualname} is not a class")
    return cls


def _shape_problems(cls: type[Any]) -> list[str]:
    """What about the wrapper class differs from the shape this patch was written for (vLLM 0.32–0.33)."""
    from vllm.lora.punica_wrapper.punica_base import PunicaWrapperBase

    problems: list[str] = []
    if not issubclass(cls, PunicaWrapperBase):
        problems.append(f"{cls.__qualname__} is not a PunicaWrapperBase")
    method = getattr(cls, "add_lora_linear", None)
    if not callable(method):
        return [*problems, f"{cls.__qualname__} has no add_lora_linear"]
    params = list(inspect.signature(method).parameters.values())
    positional = tuple(p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD)
    keyword_only = tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY)
    has_var_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    if positional != EXPECTED_POSITIONAL:
        problems.append(f"add_lora_linear takes {positional}, expected {EXPECTED_POSITIONAL}")
    if keyword_only != EXPECTED_KEYWORD_ONLY or not has_var_kwargs:
        problems.append(
            f"add_lora_linear keyword-only {keyword_only} (**kwargs: {has_var_kwargs}), "
            f"expected {EXPECTED_KEYWORD_ONLY} and **kwargs"
        )
    if not isinstance(inspect.getattr_static(cls, "token_lora_indices", None), property):
        problems.append(f"{cls.__qualname__}.token_lora_indices is not a property")
    try:
        init_source = inspect.getsource(PunicaWrapperBase.__init__)
    except (OSError, TypeError):
        init_source = ""
    if "self._token_lora_indices" not in init_source:
        problems.append("PunicaWrapperBase.__init__ no longer allocates self._token_lora_indices")
    return problems


def triton_buffer_is_zeroed(source: str, class_name: str = GPU_WRAPPER_CLASS) -> bool | None:
    """Does the Triton wrapper's add_lora_linear allocate its shrink buffer with torch.zeros only?

    That is the upstream cure for the defect in the field report (a `torch.empty` buffer that a
    skipping path never fills). None when the class or method is not in `source`.
    """
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "add_lora_linear":
                    allocators = {
                        call.func.attr
                        for call in ast.walk(item)
                        if isinstance(call, ast.Call)
                        and isinstance(call.func, ast.Attribute)
                        and isinstance(call.func.value, ast.Name)
                        and call.func.value.id == "torch"
                    }
                    return "zeros" in allocators and "empty" not in allocators
    return None


def _gpu_wrapper_source() -> str | None:
    """The Triton wrapper's source, read without importing it (importing pulls in all LoRA layers)."""
    spec = importlib.util.find_spec(GPU_WRAPPER_MODULE)
    if spec is None or spec.origin is None:
        return None
    try:
        return Path(spec.origin).read_text()
    except OSError:
        return None


def check_target() -> TargetCheck:
    if importlib.util.find_spec("vllm") is None:
        return TargetCheck(status=TargetStatus.VLLM_MISSING, target=PATCHES, detail="vLLM is not installed")
    try:
        qualname = _wrapper_qualname()
        cls = _resolve(qualname)
    except Exception as exc:  # any import or lookup failure means the target is not what we know
        return target_missing(
            PATCHES, f"cannot resolve the platform's punica wrapper: {type(exc).__name__}: {exc}"
        )
    target = f"{qualname}.add_lora_linear"
    problems = _shape_problems(cls)
    if problems:
        return target_missing(target, "; ".join(problems))
    source = _gpu_wrapper_source()
    if source is not None and triton_buffer_is_zeroed(source):
        return TargetCheck(
            status=TargetStatus.FIXED_UPSTREAM,
            target=target,
            detail=f"{GPU_WRAPPER_MODULE}.{GPU_WRAPPER_CLASS}.add_lora_linear zero-initialises its "
            "shrink buffer, so no skipped path can leave garbage in it",
        )
    return TargetCheck(
        status=TargetStatus.APPLICABLE,
        target=target,
        detail=f"{qualname} has the expected add_lora_linear signature",
    )


def _routed_add_lora_linear(original: Callable[..., Any]) -> Callable[..., Any]:
    """A method with the wrapper's signature that hands the work to `add_lora_linear` above."""

    def add_lora_linear_via_matmul(
        self: Any,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: tuple[torch.Tensor, ...],
        lora_b_stacked: tuple[torch.Tensor, ...],
        scale: float,
        output_slices: tuple[int, ...],
        *,
        buffer: Any = None,  # a scratch buffer for the Triton kernels; this path needs none
        **kwargs: Any,
    ) -> torch.Tensor:
        unknown = set(kwargs) - HONOURED_KWARGS
        if unknown:
            raise FixError(
                f"{NAME}: vLLM {vllm_version_label()} passed {sorted(unknown)} to add_lora_linear; "
                "the matmul path does not know them. Disable the fix or update deploykit."
            )
        num_tokens = x.reshape(-1, x.shape[-1]).shape[0]
        # Sliced by the row count, not by the live mapping length: under CUDA graphs x is padded, and
        # padded rows then read the -1 this patch writes at construction (or a stale slot id).
        indices = self._token_lora_indices[:num_tokens]
        return add_lora_linear(
            y,
            x,
            lora_a_stacked,
            lora_b_stacked,
            scale,
            output_slices,
            indices,
            offset_start=int(kwargs.get("offset_start", 0)),
            add_inputs=bool(kwargs.get("add_inputs", True)),
        )

    add_lora_linear_via_matmul.__doc__ = f"deploykit {NAME}: replaces {original.__qualname__}"
    return add_lora_linear_via_matmul


def _no_adapter_init(original_init: Callable[..., None]) -> Callable[..., None]:
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        # vLLM allocates the per-token slot ids with torch.empty; -1 ("no adapter") for rows never mapped.
        self._token_lora_indices.fill_(-1)

    return init


def patch_wrapper_class(cls: type[Any]) -> None:
    """Route `cls.add_lora_linear` through the matmul path; idempotent."""
    if getattr(cls, PATCH_MARKER, False):
        return
    cls.add_lora_linear = _routed_add_lora_linear(cls.add_lora_linear)
    cls.__init__ = _no_adapter_init(cls.__init__)
    setattr(cls, PATCH_MARKER, True)


def apply() -> str:
    check = check_target()
    note = upstream_guard(NAME, check)
    if note is not None:
        return note
    cls = _resolve(check.target.rpartition(".")[0])
    patch_wrapper_class(cls)
    return check.target


if TYPE_CHECKING:  # mypy holds this module to the Fix protocol
    from deploykit.fixes import matmul_lora as _this_fix

    _CHECKED: Fix = _this_fix
