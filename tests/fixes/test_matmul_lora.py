"""Matmul LoRA fix: the function against a float64 reference, its compiled form, and the vLLM patch.

Two stand-ins for the broken paths show that each check can fail: the field report's own replacement
(first adapter slot applied to every token, then `break`) and a model of the Triton defect (a shrink
buffer taken from uninitialised memory that a zero-skipping path never fills).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import random
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from deploykit.fixes import matmul_lora
from deploykit.fixes.base import FixError, TargetStatus
from deploykit.fixes.matmul_lora import add_lora_linear, triton_buffer_is_zeroed
from deploykit.installed import vllm_version_label

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# One rounding of the result to the output dtype, plus FP32 accumulation noise.
RELATIVE_TOLERANCE = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@dataclass
class LoraCase:
    x: torch.Tensor
    lora_a: tuple[torch.Tensor, ...]
    lora_b: tuple[torch.Tensor, ...]
    output_slices: tuple[int, ...]
    indices: torch.Tensor
    scale: float

    @property
    def out_features(self) -> int:
        return sum(self.output_slices)


def make_case(
    seed: int,
    dtype: torch.dtype,
    *,
    rank: int,
    num_slices: int,
    num_slots: int,
    num_tokens: int = 24,
    in_features: int = 64,
) -> LoraCase:
    """Random adapters in vLLM's stacked layout; tokens use every slot and -1 (no adapter)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    slices = tuple(rng.choice((16, 24, 40)) for _ in range(num_slices))
    lora_a = tuple(
        (torch.randn(num_slots, 1, rank, in_features, generator=gen) / in_features**0.5).to(dtype)
        for _ in slices
    )
    lora_b = tuple(
        (torch.randn(num_slots, 1, out, rank, generator=gen) / rank**0.5).to(dtype) for out in slices
    )
    ids = [*range(num_slots), -1]  # every slot and "no adapter" at least once
    ids += [rng.randrange(-1, num_slots) for _ in range(num_tokens - len(ids))]
    rng.shuffle(ids)
    return LoraCase(
        x=torch.randn(num_tokens, in_features, generator=gen).to(dtype),
        lora_a=lora_a,
        lora_b=lora_b,
        output_slices=slices,
        indices=torch.tensor(ids, dtype=torch.long),
        scale=rng.choice((1.0, 0.5, 2.0)),
    )


def reference(
    case: LoraCase, y: torch.Tensor, *, offset_start: int = 0, add_inputs: bool = True
) -> torch.Tensor:
    """Token by token in float64, straight from the formula: the independent reference."""
    out = y.to(torch.float64).clone()
    for t, slot in enumerate(case.indices.tolist()):
        offset = offset_start
        for a, b, width in zip(case.lora_a, case.lora_b, case.output_slices, strict=True):
            cols = slice(offset, offset + width)
            if slot >= 0:
                delta = case.scale * (case.x[t].double() @ a[slot, 0].double().T) @ b[slot, 0].double().T
                out[t, cols] = out[t, cols] + delta if add_inputs else delta
            elif not add_inputs:
                out[t, cols] = 0.0
            offset += width
    return out


def assert_matches(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    assert not torch.isnan(got).any(), "NaN in the output"
    magnitude = want.abs().max().item() or 1.0
    err = (got.double() - want).abs().max().item()
    assert err <= RELATIVE_TOLERANCE[dtype] * magnitude, f"max error {err:.3g} vs magnitude {magnitude:.3g}"


# ---- stand-ins for the broken paths, to show the checks catch them ---------------------------------


def report_replacement(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: Sequence[torch.Tensor],
    lora_b: Sequence[torch.Tensor],
    scale: float,
    output_slices: Sequence[int],
    indices: torch.Tensor,
    **_: Any,
) -> torch.Tensor:
    """The field report's fix: loops over slots, applies the first to every token, then breaks."""
    offset = 0
    for a_stacked, b_stacked, width in zip(lora_a, lora_b, output_slices, strict=True):
        la, lb = a_stacked.squeeze(1), b_stacked.squeeze(1)
        for li in range(la.shape[0]):
            buf = torch.matmul(x.float(), la[li].T.float()) * scale
            y[:, offset : offset + width] += torch.matmul(buf, lb[li].T.float()).to(y.dtype)
            break
        offset += width
    return y


def skipping_shrink(
    y: torch.Tensor,
    x: torch.Tensor,
    lora_a: Sequence[torch.Tensor],
    lora_b: Sequence[torch.Tensor],
    scale: float,
    output_slices: Sequence[int],
    indices: torch.Tensor,
    **_: Any,
) -> torch.Tensor:
    """A model of the Triton defect: an uninitialised (here: NaN) buffer the shrink skips for zeros."""
    offset = 0
    for a_stacked, b_stacked, width in zip(lora_a, lora_b, output_slices, strict=True):
        buffer = torch.full((x.shape[0], a_stacked.shape[2]), float("nan"))  # torch.empty's garbage
        for t, slot in enumerate(indices.tolist()):
            if slot >= 0 and a_stacked[slot].abs().sum() > 0:  # "zero input needs no work"
                buffer[t] = scale * (x[t].float() @ a_stacked[slot, 0].float().T)
        for t, slot in enumerate(indices.tolist()):
            if slot >= 0:
                y[t, offset : offset + width] += (buffer[t] @ b_stacked[slot, 0].float().T).to(y.dtype)
        offset += width
    return y


# ---- the function against the reference ------------------------------------------------------------

RANDOM_CASES = [
    # (seed, rank, slices, slots): ranks 8..256, 1-3 slices, 1-4 adapter slots
    (1, 8, 1, 1),
    (2, 8, 3, 4),
    (3, 16, 2, 2),
    (4, 32, 3, 3),
    (5, 64, 1, 4),
    (6, 128, 2, 4),
    (7, 256, 3, 2),
    (8, 256, 1, 3),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("seed", "rank", "num_slices", "num_slots"), RANDOM_CASES)
def test_matches_float64_reference_for_mixed_batches(
    seed: int, rank: int, num_slices: int, num_slots: int, dtype: torch.dtype
) -> None:
    case = make_case(seed, dtype, rank=rank, num_slices=num_slices, num_slots=num_slots)
    base = torch.randn(case.x.shape[0], case.out_features, generator=torch.Generator().manual_seed(seed)).to(
        dtype
    )
    want = reference(case, base)
    y = base.clone()
    returned = add_lora_linear(
        y, case.x, case.lora_a, case.lora_b, case.scale, case.output_slices, case.indices
    )
    assert returned is y  # updated in place
    assert_matches(y, want, dtype)
    # Rows without an adapter keep the base output bit for bit.
    no_adapter = case.indices == -1
    assert torch.equal(y[no_adapter], base[no_adapter])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_overwrites_uninitialised_output_when_not_adding(dtype: torch.dtype) -> None:
    """add_inputs=False on NaN-filled memory (what torch.empty may hold): every row is written."""
    case = make_case(11, dtype, rank=16, num_slices=3, num_slots=4)
    y = torch.full((case.x.shape[0], case.out_features), float("nan"), dtype=dtype)
    add_lora_linear(
        y, case.x, case.lora_a, case.lora_b, case.scale, case.output_slices, case.indices, add_inputs=False
    )
    assert_matches(y, reference(case, torch.zeros_like(y), add_inputs=False), dtype)
    assert torch.equal(y[case.indices == -1], torch.zeros_like(y[case.indices == -1]))


def test_offset_start_leaves_other_columns_alone() -> None:
    case = make_case(12, torch.float32, rank=8, num_slices=2, num_slots=2)
    width = case.out_features + 10
    y = torch.full((case.x.shape[0], width), float("nan"))
    y[:, 6 : 6 + case.out_features] = 1.0
    add_lora_linear(
        y, case.x, case.lora_a, case.lora_b, case.scale, case.output_slices, case.indices, offset_start=6
    )
    want = reference(case, torch.ones(case.x.shape[0], case.out_features))
    assert_matches(y[:, 6 : 6 + case.out_features], want, torch.float32)
    assert torch.isnan(y[:, :6]).all() and torch.isnan(y[:, 6 + case.out_features :]).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("zero_input", [False, True], ids=["random-x", "zero-x"])
def test_zero_weight_adapters_give_exactly_the_base_output(dtype: torch.dtype, zero_input: bool) -> None:
    """The report's experiment: all-zero A and B (and zero input) must leave y unchanged, bit for bit."""
    case = make_case(13, dtype, rank=64, num_slices=2, num_slots=3)
    zero_a = tuple(torch.zeros_like(a) for a in case.lora_a)
    zero_b = tuple(torch.zeros_like(b) for b in case.lora_b)
    x = torch.zeros_like(case.x) if zero_input else case.x
    base = torch.randn(x.shape[0], case.out_features).to(dtype)

    y = base.clone()
    add_lora_linear(y, x, zero_a, zero_b, case.scale, case.output_slices, case.indices)
    assert torch.equal(y, base)

    broken = skipping_shrink(base.clone(), x, zero_a, zero_b, case.scale, case.output_slices, case.indices)
    assert torch.isnan(broken[case.indices >= 0]).all(), "the defect model should reproduce the NaN"


def test_check_catches_the_report_replacement_on_multi_adapter_batches() -> None:
    case = make_case(14, torch.float32, rank=16, num_slices=2, num_slots=3)
    base = torch.randn(case.x.shape[0], case.out_features)
    want = reference(case, base)
    broken = report_replacement(
        base.clone(), case.x, case.lora_a, case.lora_b, case.scale, case.output_slices, case.indices
    )
    with pytest.raises(AssertionError, match="max error"):
        assert_matches(broken, want, torch.float32)
    ours = add_lora_linear(
        base.clone(), case.x, case.lora_a, case.lora_b, case.scale, case.output_slices, case.indices
    )
    assert_matches(ours, want, torch.float32)


def test_non_finite_weights_in_one_slot_stay_in_that_slot() -> None:
    """Masking with where(), not a multiply: inf in slot 0's weights never reaches slot 1 or -1 rows."""
    case = make_case(15, torch.float32, rank=8, num_slices=1, num_slots=2)
    case.lora_a[0][0].fill_(float("inf"))
    base = torch.randn(case.x.shape[0], case.out_features)
    y = base.clone()
    add_lora_linear(y, case.x, case.lora_a, case.lora_b, case.scale, case.output_slices, case.indices)
    others = case.indices != 0
    assert torch.isfinite(y[others]).all()
    assert_matches(y[others], reference(case, base)[others], torch.float32)


def test_torch_compile_fullgraph_gives_the_same_result_without_recompiling() -> None:
    import torch._dynamo

    torch._dynamo.reset()
    compiled = torch.compile(add_lora_linear, fullgraph=True, dynamic=False)
    case = make_case(16, torch.bfloat16, rank=16, num_slices=3, num_slots=4)
    base = torch.randn(case.x.shape[0], case.out_features).to(torch.bfloat16)
    args = (case.x, case.lora_a, case.lora_b, case.scale, case.output_slices)

    eager = add_lora_linear(base.clone(), *args, case.indices)
    torch.testing.assert_close(compiled(base.clone(), *args, case.indices), eager)
    # A different adapter mix is only data: the same graph must serve it (no data-dependent guards).
    case.indices = case.indices.flip(0)
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = compiled(base.clone(), *args, case.indices)
    assert_matches(again, reference(case, base), torch.bfloat16)


# ---- the patch on vLLM's real punica wrapper (CPU platform), in this process ------------------------


@pytest.fixture
def cpu_wrapper_class(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Any]]:
    """vLLM's CPU punica wrapper; whatever the test patches is restored afterwards."""
    pytest.importorskip("vllm")
    from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

    for attribute in ("add_lora_linear", "__init__"):
        monkeypatch.setattr(PunicaWrapperCPU, attribute, PunicaWrapperCPU.__dict__[attribute])
    monkeypatch.setattr(PunicaWrapperCPU, matmul_lora.PATCH_MARKER, False, raising=False)
    yield PunicaWrapperCPU


def installed_cpu_ops_mask_no_adapter() -> bool:
    """What the importable vLLM's torch LoRA ops do with slot -1, read from its source (0.32: no)."""
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    facts = matmul_lora.read_source_facts(Path(next(iter(spec.submodule_search_locations))).parent)
    return facts[matmul_lora.CPU_OPS_MASK_NO_ADAPTER] is True


def wrapper_with_mapping(cls: type[Any], slot_ids: list[int], max_loras: int) -> Any:
    from vllm.lora.layers import LoRAMapping

    wrapper = cls(max_num_batched_tokens=64, max_batches=64, device="cpu")
    lora_ids = [100 + slot if slot >= 0 else 0 for slot in slot_ids]  # vLLM: id 0 = no adapter
    mapping = LoRAMapping(index_mapping=tuple(lora_ids), prompt_mapping=tuple(lora_ids), is_prefill=True)
    wrapper.update_metadata(mapping, [100 + s for s in range(max_loras)], max_loras, 2048)
    return wrapper


def test_patched_cpu_wrapper_matches_vllm_and_the_reference(cpu_wrapper_class: type[Any]) -> None:
    case = make_case(21, torch.float32, rank=16, num_slices=3, num_slots=4)
    slot_ids = case.indices.tolist()
    base = torch.randn(case.x.shape[0], case.out_features)
    args = (case.x, case.lora_a, case.lora_b, case.scale, case.output_slices)

    original = cpu_wrapper_class.add_lora_linear
    untouched = {name: cpu_wrapper_class.__dict__[name] for name in ("add_lora_logits", "add_lora_embedding")}
    vllm_y = base.clone()
    wrapper_with_mapping(cpu_wrapper_class, slot_ids, 4).add_lora_linear(vllm_y, *args)

    target = matmul_lora.apply()
    assert target == "vllm.lora.punica_wrapper.punica_cpu.PunicaWrapperCPU.add_lora_linear"
    assert cpu_wrapper_class.add_lora_linear is not original
    matmul_lora.apply()  # idempotent: the second call wraps nothing twice
    patched = wrapper_with_mapping(cpu_wrapper_class, slot_ids, 4)
    assert torch.equal(patched._token_lora_indices[len(slot_ids) :], torch.full((64 - len(slot_ids),), -1))
    ours_y = base.clone()
    patched.add_lora_linear(ours_y, *args)

    want = reference(case, base)
    assert_matches(ours_y, want, torch.float32)
    with_adapter = case.indices >= 0
    assert_matches(vllm_y[with_adapter], want[with_adapter], torch.float32)
    if installed_cpu_ops_mask_no_adapter():
        # vLLM 0.33's CPU path clamps the slot index and zeroes rows without an adapter: stock is right,
        # which is why matmul_lora's rule no longer enables the fix there (test_matmul_lora_rules.py).
        assert_matches(vllm_y, want, torch.float32)
    else:
        # vLLM 0.32's CPU path: rows with an adapter are right, but the "no adapter" id -1 indexes the
        # weight stack from the end, so those rows get the last slot's adapter.
        assert not torch.allclose(vllm_y[~with_adapter].double(), want[~with_adapter], rtol=1e-3, atol=1e-3)
        last_slot_for_all = dataclasses.replace(case, indices=torch.where(with_adapter, case.indices, 3))
        assert_matches(vllm_y, reference(last_slot_for_all, base), torch.float32)
    for name, function in untouched.items():
        assert cpu_wrapper_class.__dict__[name] is function, f"{name} must stay vLLM's"

    lora_only = torch.full_like(base, float("nan"))
    patched.add_lora_linear(lora_only, *args, add_inputs=False)  # the dual-stream call
    assert_matches(lora_only, reference(case, torch.zeros_like(base), add_inputs=False), torch.float32)
    with pytest.raises(FixError, match=r"matmul_lora: vLLM .* passed \['lora_bias'\]"):
        patched.add_lora_linear(base.clone(), *args, lora_bias=None)


class WrongShapeWrapper:
    def add_lora_linear(self, y: Any, x: Any, lora_a_stacked: Any, lora_b_stacked: Any, scale: float) -> None:
        return None


def test_target_with_another_shape_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("vllm")
    monkeypatch.setattr(matmul_lora, "_wrapper_qualname", lambda: f"{__name__}.WrongShapeWrapper")
    check = matmul_lora.check_target()
    assert check.status is TargetStatus.TARGET_MISSING
    assert "not a PunicaWrapperBase" in check.detail and "expected" in check.detail
    version = vllm_version_label()
    with pytest.raises(FixError, match=rf"matmul_lora: cannot apply to vLLM {re.escape(version)}"):
        matmul_lora.apply()

    monkeypatch.setattr(matmul_lora, "_wrapper_qualname", lambda: "vllm.lora.punica_wrapper.nowhere.Gone")
    assert matmul_lora.check_target().status is TargetStatus.TARGET_MISSING


def test_missing_vllm_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real_find_spec(name, *a)
    )
    assert matmul_lora.check_target().status is TargetStatus.VLLM_MISSING


def test_installed_triton_wrapper_is_affected_and_an_upstream_fix_is_left_alone(
    cpu_wrapper_class: type[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = matmul_lora._gpu_wrapper_source()
    assert source is not None
    assert triton_buffer_is_zeroed(source) is False  # vLLM 0.32: torch.empty shrink buffer

    fixed = source.replace("buffer = torch.empty(", "buffer = torch.zeros(")
    assert triton_buffer_is_zeroed(fixed) is True
    monkeypatch.setattr(matmul_lora, "_gpu_wrapper_source", lambda: fixed)
    assert matmul_lora.check_target().status is TargetStatus.FIXED_UPSTREAM
    original = cpu_wrapper_class.add_lora_linear
    assert matmul_lora.apply().startswith("nothing patched: vLLM")
    assert cpu_wrapper_class.add_lora_linear is original


def test_importing_the_fix_imports_neither_torch_nor_vllm() -> None:
    code = (
        "import sys, deploykit.fixes.matmul_lora\n"
        "heavy = [m for m in ('torch', 'vllm') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
