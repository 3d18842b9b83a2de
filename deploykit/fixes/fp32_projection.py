"""FP32 projection fix: Gemma4 Unified's vision `patch_dense` + `patch_ln2` in FP32 when the engine computes
in FP16.

The overflow is FP16 arithmetic, whatever GPU runs it: a checkpoint served in FP16 (`--dtype float16`, an
FP16 checkpoint such as an AWQ export under `--dtype auto`, or vLLM's fallback for BF16 on CC < 8.0)
overflows 65504 in one output channel of the vision embedder's `patch_dense`; `patch_ln2` turns every
such row into NaN and the model emits token 0 forever.
The cure keeps only those two layers in FP32: the input is promoted before `patch_dense` and the result
demoted to the model dtype after `patch_ln2`. See docs/fixes/fp32-projection.md.

The decision rule here is pure; the patch imports torch and vLLM only inside the functions that need them.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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
    from deploykit.trace_records import HeaderLine, ModuleLine

NAME = "fp32_projection"
SUMMARY = "Gemma4 Unified vision projection + LayerNorm in FP32 when the engine computes in FP16"
PATCHES = "vllm.model_executor.models.gemma4_unified: vision embedder patch_dense / patch_ln2"
# The known-bad combination it fixes, as the advisory catalog lists it (`deploykit advisories`).
ADVISORY: FixAdvisory = {
    "title": "Gemma4 Unified image requests emit token 0 forever in FP16",
    "symptom": "the vision projection overflows FP16 and turns to NaN; every image request answers token 0",
    "kind": "corruption",
    "references": [
        {"number": 48231, "note": "Gemma4 Unified FP16 overflow on a GPU without native BF16"},
        {"number": 48233, "kind": "pr", "note": "FP32 projection; open, in no release"},
        {"number": 40290, "note": "Gemma 4 vision under fp16 gives only <pad>"},
    ],
    "vllm": {"evidence": "open upstream: #48233 is in no release (checked 2026-12-02)"},
}
ARCHITECTURES = ("Gemma4UnifiedForConditionalGeneration",)

TARGET_MODULE = "vllm.model_executor.models.gemma4_unified"
TARGET_CLASS = "Gemma4UnifiedVisionEmbedder"
TARGET = f"{TARGET_MODULE}.{TARGET_CLASS}"
# The shape this patch was written for (vLLM 0.32–0.33): constructor and forward signatures, the two
# layers it rebuilds, and the ColumnParallelLinear arguments it passes on.
EXPECTED_INIT_PARAMS = ("self", "config", "quant_config", "prefix")
EXPECTED_FORWARD_PARAMS = ("self", "pixel_values", "pixel_position_ids")
EXPECTED_INIT_LINES = ("self.patch_dense = ColumnParallelLinear(", "self.patch_ln2 = nn.LayerNorm(")
EXPECTED_LINEAR_PARAMS = (
    "input_size",
    "output_size",
    "bias",
    "gather_output",
    "params_dtype",
    "quant_config",
)
# An upstream fix picks the projection dtype from the platform (`current_platform.supported_dtypes`)
# or names float32 in the constructor; the sources of 0.32 and 0.33 do neither.
UPSTREAM_FIX_MARKERS = ("supported_dtypes", "float32")
PATCH_MARKER = "__deploykit_fp32_projection__"


def decide(inputs: DecisionInputs, mode: FixMode) -> FixDecision:
    result = decision_maker(NAME, mode)
    if mode is FixMode.OFF:
        return result(Decision.NOT_NEEDED, TURNED_OFF)
    is_gemma4_unified = any(arch in ARCHITECTURES for arch in inputs.model_architectures)
    if mode is FixMode.ON:
        if not is_gemma4_unified:
            return result(
                Decision.IMPOSSIBLE,
                "forced on, but the model "
                f"({', '.join(inputs.model_architectures) or 'unknown architecture'})"
                " is not a Gemma4 Unified model, so the patched embedder is never built",
            )
        return result(Decision.ENABLED, "forced on by the profile")
    if not is_gemma4_unified:
        return result(Decision.NOT_NEEDED, "the model is not a Gemma4 Unified (encoder-free vision embedder)")
    dtype, source = inputs.compute_dtype, inputs.compute_dtype_source
    if dtype is None:
        return result(
            Decision.NOT_NEEDED,
            f"compute dtype unknown ({source}): state model.checkpoint_dtype or serve.dtype to decide",
        )
    if inputs.compute_dtype_refused:
        return result(
            Decision.NOT_NEEDED,
            f"{dtype} compute ({source}), which vLLM refuses: {inputs.compute_dtype_refused}",
        )
    if dtype != "float16":
        return result(Decision.NOT_NEEDED, f"{dtype} compute ({source}): no FP16 arithmetic to overflow")
    return result(
        Decision.ENABLED,
        f"float16 compute ({source}): patch_dense passes 65504 in FP16 on any GPU, patch_ln2 makes it NaN",
    )


LAUNCH_FLAGS: tuple[str, ...] = ()
# The vLLM source files the target lives in, relative to the folder holding `vllm/`: what
# `make vllm-release` (tools/vllm_release.py) judges "changed" or "gone" on; `file::Class` narrows a file to
# the one class the fix patches.
TARGET_SOURCES: tuple[str, ...] = (
    "vllm/model_executor/models/gemma4_unified.py::Gemma4UnifiedVisionEmbedder",
)
# The two layers the fix computes in FP32, as `named_modules()` names their leaves.
PATCHED_LEAVES = ("patch_dense", "patch_ln2")


def launch_args(inputs: DecisionInputs) -> list[str]:
    return []


def plan_warnings(inputs: DecisionInputs, decision: FixDecision) -> list[str]:
    return []


def trace_suggestion(
    culprit: ModuleLine, header: HeaderLine | None, lines: Sequence[ModuleLine]
) -> str | None:
    """The culprit is patch_dense or patch_ln2 of a Gemma4 Unified vision embedder computing in float16."""
    leaf = culprit.module.rsplit(".", 1)[-1]
    model = (header.model_class if header else "") + " " + " ".join(header.architectures if header else [])
    in_vision_embedder = "vision_embedder" in culprit.module or "embed_vision" in culprit.module
    half = culprit.dtype == "float16" or (header is not None and header.dtype == "float16")
    if leaf not in PATCHED_LEAVES or not (in_vision_embedder or "Gemma4Unified" in model) or not half:
        return None
    where = ""
    if culprit.first_bad is not None:
        where = f" (first at token {culprit.bad_token}, channel {culprit.bad_channel})"
    peak = ""
    if culprit.output_absmax is not None:
        peak = f"; the finite part reaches {culprit.output_absmax:g}"
        if culprit.fraction_of_dtype_max is not None:
            peak += f" ({culprit.fraction_of_dtype_max:.0%} of float16's 65504)"
    inputs_peak = "-" if culprit.input_absmax is None else f"{culprit.input_absmax:g}"
    return (
        f"{culprit.module} of a Gemma4 Unified vision embedder computes in float16 and overflowed: "
        f"{culprit.inf} Inf / {culprit.nan} NaN of {culprit.numel} values{where} from finite inputs "
        f"(absmax {inputs_peak}){peak}. {NAME} computes patch_dense and patch_ln2 in FP32 (vLLM #48231)."
    )


def _check(status: TargetStatus, detail: str) -> TargetCheck:
    if status is TargetStatus.TARGET_MISSING:
        return target_missing(TARGET, detail)
    return TargetCheck(status=status, target=TARGET, detail=detail)


def _parameter_names(function: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


def _shape_problems(embedder_class: Any, linear_class: Any) -> list[str]:
    """What differs from the shape this patch expects; empty when the target matches."""
    import torch

    problems = []
    if not (isinstance(embedder_class, type) and issubclass(embedder_class, torch.nn.Module)):
        return [f"{TARGET_CLASS} is not a torch.nn.Module class"]
    init = inspect.unwrap(embedder_class.__init__)
    if _parameter_names(init) != EXPECTED_INIT_PARAMS:
        problems.append(f"__init__{inspect.signature(init)} is not __init__{EXPECTED_INIT_PARAMS}")
    forward_params = _parameter_names(embedder_class.forward)
    if forward_params != EXPECTED_FORWARD_PARAMS:
        problems.append(f"forward{forward_params} is not forward{EXPECTED_FORWARD_PARAMS}")
    init_source = inspect.getsource(init)
    problems += [
        f"__init__ no longer has `{line}`" for line in EXPECTED_INIT_LINES if line not in init_source
    ]
    forward_source = inspect.getsource(embedder_class.forward)
    dense_at = forward_source.find("self.patch_dense(")
    ln2_at = forward_source.find("self.patch_ln2(")
    if dense_at < 0 or ln2_at < dense_at:
        problems.append("forward no longer calls self.patch_dense(...) followed by self.patch_ln2(...)")
    linear_params = set(_parameter_names(linear_class.__init__))
    missing = [name for name in EXPECTED_LINEAR_PARAMS if name not in linear_params]
    if missing:
        problems.append(f"ColumnParallelLinear.__init__ lacks {', '.join(missing)}")
    return problems


def _import_target() -> tuple[Any, Any, Any] | TargetCheck:
    """(embedder class, ColumnParallelLinear, UnquantizedLinearMethod), or the check saying why not."""
    import importlib

    try:
        importlib.import_module("vllm")
    except ImportError as exc:
        return _check(TargetStatus.VLLM_MISSING, f"vLLM cannot be imported: {exc}")
    try:
        module = importlib.import_module(TARGET_MODULE)
        from vllm.model_executor.layers.linear import ColumnParallelLinear, UnquantizedLinearMethod
    except ImportError as exc:
        # vLLM 0.32's module imports transformers' Gemma4 Unified processor, which needs torchvision.
        return _check(TargetStatus.TARGET_MISSING, f"{TARGET_MODULE} cannot be imported: {exc}")
    embedder_class = getattr(module, TARGET_CLASS, None)
    if embedder_class is None:
        return _check(TargetStatus.TARGET_MISSING, f"{TARGET_MODULE} has no class {TARGET_CLASS}")
    return embedder_class, ColumnParallelLinear, UnquantizedLinearMethod


def check_target() -> TargetCheck:
    """Does the installed vLLM have the embedder this fix patches, in the shape it expects?"""
    imported = _import_target()
    if isinstance(imported, TargetCheck):
        return imported
    embedder_class, linear_class, _ = imported
    if getattr(embedder_class.__init__, PATCH_MARKER, False):
        return _check(TargetStatus.APPLICABLE, "already patched in this process")
    problems = _shape_problems(embedder_class, linear_class)
    if problems:
        return _check(TargetStatus.TARGET_MISSING, "; ".join(problems))
    init_source = inspect.getsource(inspect.unwrap(embedder_class.__init__))
    markers = [marker for marker in UPSTREAM_FIX_MARKERS if marker in init_source]
    if markers:
        return _check(
            TargetStatus.FIXED_UPSTREAM,
            f"{TARGET_CLASS}.__init__ already chooses the projection dtype ({', '.join(markers)})",
        )
    return _check(
        TargetStatus.APPLICABLE,
        "patch_dense (ColumnParallelLinear) and patch_ln2 (LayerNorm) are built in the model dtype",
    )


def _rebuild_in_fp32(embedder: Any, linear_class: Any, unquantized_class: Any) -> None:
    """Replace patch_dense and patch_ln2 by FP32 twins built with the same arguments, on the same device."""
    import torch

    dense, ln2 = embedder.patch_dense, embedder.patch_ln2
    if not isinstance(dense, linear_class) or not isinstance(ln2, torch.nn.LayerNorm):
        raise FixError(
            f"fix {NAME} (vLLM {vllm_version_label()}): {TARGET_CLASS} built patch_dense as "
            f"{type(dense).__name__} and patch_ln2 as {type(ln2).__name__}; "
            "expected ColumnParallelLinear and LayerNorm"
        )
    if not isinstance(dense.quant_method, unquantized_class):
        raise FixError(
            f"fix {NAME} (vLLM {vllm_version_label()}): {dense.prefix} is quantized "
            f"({type(dense.quant_method).__name__}); FP32 parameters cannot hold quantized weights and "
            "its output would still overflow FP16. Exclude patch_dense from the quantization config "
            "(its ignore list) or turn the fix off."
        )
    device = dense.weight.device
    embedder.patch_dense = linear_class(
        dense.input_size,
        dense.output_size,
        bias=dense.bias is not None,
        gather_output=dense.gather_output,
        skip_bias_add=dense.skip_bias_add,
        params_dtype=torch.float32,
        quant_config=dense.quant_config,
        prefix=dense.prefix,
        return_bias=dense.return_bias,
        disable_tp=dense.disable_tp,
    ).to(device)
    embedder.patch_ln2 = torch.nn.LayerNorm(
        ln2.normalized_shape,
        eps=ln2.eps,
        elementwise_affine=ln2.elementwise_affine,
        bias=ln2.bias is not None,
        device=device,
        dtype=torch.float32,
    )


def _add_dtype_hooks(embedder: Any) -> None:
    """Promote the input of patch_dense to FP32; demote patch_ln2's output to the model dtype.

    Hooks leave vLLM's forward untouched: everything outside the two layers keeps its dtype.
    """
    import torch

    owner = weakref.ref(embedder)

    def promote(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)

    def demote(_module: Any, _args: tuple[Any, ...], output: Any) -> Any:
        embedder_now = owner()
        # The original forward casts pixels to pos_embedding's dtype: that is the model dtype.
        return output if embedder_now is None else output.to(embedder_now.pos_embedding.dtype)

    embedder.patch_dense.register_forward_pre_hook(promote)
    embedder.patch_ln2.register_forward_hook(demote)


def apply() -> str:
    """Wrap the embedder's __init__ so every new embedder carries FP32 patch_dense / patch_ln2."""
    note = upstream_guard(NAME, check_target())
    if note is not None:
        return note
    imported = _import_target()
    assert not isinstance(imported, TargetCheck)
    embedder_class, linear_class, unquantized_class = imported
    original_init = embedder_class.__init__
    if getattr(original_init, PATCH_MARKER, False):
        return TARGET

    @functools.wraps(original_init)
    def init_with_fp32_projection(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        _rebuild_in_fp32(self, linear_class, unquantized_class)
        _add_dtype_hooks(self)

    setattr(init_with_fp32_projection, PATCH_MARKER, True)
    embedder_class.__init__ = init_with_fp32_projection
    return TARGET


if TYPE_CHECKING:  # mypy holds this module to the Fix protocol
    from deploykit.fixes import fp32_projection as _this_fix

    _CHECKED: Fix = _this_fix
