"""The report analysis on hand-written trace records (no vLLM, no torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deploykit.trace.report import (
    TraceReadError,
    analyse,
    parse_lines,
    read_trace_dir,
    render_text,
    report_dict,
)


def header(**kw: Any) -> dict[str, Any]:
    return {"kind": "header", "rank": 0, "model_class": "LlamaForCausalLM", "modules_hooked": 5, **kw}


def step(n: int, request: str = "cmpl-a", rank: int = 0) -> dict[str, Any]:
    return {"kind": "step", "step": n, "requests": [request], "num_tokens": 3, "rank": rank}


def mod(
    n: int, order: int, name: str, *, ok: bool = True, inputs_ok: bool = True, rank: int = 0, **kw: Any
) -> dict[str, Any]:
    record = {
        "kind": "module",
        "rank": rank,
        "step": n,
        "order": order,
        "module": name,
        "class": kw.pop("cls", "Linear"),
        "dtype": kw.pop("dtype", "float32"),
        "shape": [3, 8],
        "inputs_finite": inputs_ok,
        "input_absmax": 1.5,
        "output_finite": ok,
        "nonfinite": 0 if ok else 4,
        "nan": 0 if ok else 4,
        "inf": 0,
        "numel": 24,
        "first_bad": None if ok else [1, 6],
        "output_absmax": 2.0,
    }
    record.update(kw)
    return record


def logits(n: int, **kw: Any) -> dict[str, Any]:
    base = {
        "kind": "logits",
        "rank": 0,
        "step": n,
        "rows": 1,
        "vocab": 16,
        "nonfinite": 0,
        "min": -1.0,
        "max": 1.0,
        "mean": 0.0,
        "std": 0.5,
        "constant_rows": 0,
        "argmax": [3],
    }
    return {**base, **kw}


def lines_of(*records: dict[str, Any]) -> list[Any]:
    return parse_lines(json.dumps(r) for r in records)


def test_first_is_the_earliest_module_with_finite_inputs_and_non_finite_output() -> None:
    report = analyse(
        lines_of(
            header(),
            step(0),
            mod(0, 0, "model.embed_tokens"),
            mod(0, 1, "model.layers.0.mlp.down_proj", ok=False),
            mod(0, 2, "model.layers.0.mlp", ok=False),
            mod(0, 3, "model.layers.0", ok=False, inputs_ok=True),
            mod(0, 4, "model.norm", ok=False, inputs_ok=False),
            step(1),
            mod(1, 0, "model.layers.0.mlp.down_proj", ok=False),
        ),
        {"cmpl-a": "completion"},
    )
    assert report.first is not None
    assert report.first.module == "model.layers.0.mlp.down_proj"
    assert report.first.first_bad is not None
    assert (report.first.first_bad.token, report.first.first_bad.channel) == (1, 6)
    assert report.first.request == "cmpl-a"
    assert [s.module for s in report.spread] == ["model.layers.0.mlp", "model.layers.0", "model.norm"]
    assert report.requests[0].case == "completion" and report.requests[0].steps == 2
    data = report_dict(report)
    assert data["first"]["class"] == "Linear" and set(data) >= {
        "first",
        "spread",
        "suggested_fix",
        "requests",
        "modules_hooked",
    }
    assert "model.layers.0.mlp.down_proj" in render_text(report)


def test_a_module_fed_non_finite_inputs_is_never_first() -> None:
    report = analyse(lines_of(header(), step(0), mod(0, 0, "model.layers.0", ok=False, inputs_ok=False)))
    assert report.first is None
    assert [s.module for s in report.spread] == ["model.layers.0"]
    assert any("entered the model from outside" in f for f in report.findings)


def test_spread_is_a_few_not_all() -> None:
    records = [header(), step(0), mod(0, 0, "a", ok=False)]
    records += [mod(0, i, f"m{i}", ok=False, inputs_ok=False) for i in range(1, 20)]
    report = analyse(lines_of(*records))
    assert report.first is not None and report.first.module == "a"
    assert len(report.spread) == 5


def test_fp16_patch_dense_of_gemma4_unified_suggests_fp32_projection() -> None:
    name = "vision_embedder.patch_dense"
    report = analyse(
        lines_of(
            header(model_class="Gemma4UnifiedForConditionalGeneration", dtype="float16"),
            step(0),
            mod(0, 0, "vision_embedder.patch_ln1", dtype="float16"),
            mod(
                0,
                1,
                name,
                ok=False,
                dtype="float16",
                cls="ColumnParallelLinear",
                inf=256,
                nan=0,
                nonfinite=256,
                first_bad=[0, 1215],
                output_absmax=49248.0,
            ),
            mod(0, 2, "vision_embedder.patch_ln2", ok=False, inputs_ok=False, dtype="float16"),
        )
    )
    assert report.first is not None and report.first.module == name
    assert report.first.fraction_of_dtype_max == pytest.approx(49248.0 / 65504.0)
    fix = report.suggested_fix
    assert fix is not None and fix.name == "fp32_projection" and not fix.already_enabled
    assert "channel 1215" in fix.evidence and "65504" in fix.evidence


def test_fp32_projection_already_enabled_is_said() -> None:
    report = analyse(
        lines_of(
            header(model_class="Gemma4UnifiedForConditionalGeneration", fixes=["fp32_projection"]),
            step(0),
            mod(0, 0, "vision_embedder.patch_dense", ok=False, dtype="float16"),
        )
    )
    assert report.suggested_fix is not None and report.suggested_fix.already_enabled
    assert any("already enabled" in f for f in report.findings)


def test_bf16_patch_dense_does_not_suggest_fp32_projection() -> None:
    report = analyse(
        lines_of(
            header(model_class="Gemma4UnifiedForConditionalGeneration", dtype="bfloat16"),
            step(0),
            mod(0, 0, "vision_embedder.patch_dense", ok=False, dtype="bfloat16"),
        )
    )
    assert report.first is not None and report.suggested_fix is None


def test_lora_wrapped_layer_suggests_matmul_lora_with_base_layer_evidence() -> None:
    report = analyse(
        lines_of(
            header(model_class="Qwen3NextForCausalLM"),
            step(0),
            mod(0, 0, "model.layers.0.linear_attn.in_proj_z.base_layer", cls="ColumnParallelLinear"),
            mod(0, 1, "model.layers.0.linear_attn.in_proj_z", ok=False, cls="ColumnParallelLinearWithLoRA"),
        )
    )
    fix = report.suggested_fix
    assert fix is not None and fix.name == "matmul_lora"
    assert "base layer model.layers.0.linear_attn.in_proj_z.base_layer" in fix.evidence


def test_nothing_non_finite_reports_logits_and_the_constant_logits_finding() -> None:
    report = analyse(
        lines_of(
            header(),
            step(0),
            mod(0, 0, "lm_head"),
            logits(0, min=0.0, max=0.0, mean=0.0, std=0.0, constant_rows=1, argmax=[0]),
            step(1),
            logits(1, min=0.0, max=0.0, mean=0.0, std=0.0, constant_rows=1, argmax=[0]),
        )
    )
    assert report.first is None and report.suggested_fix is None
    assert report.logits is not None and report.logits.constant_rows == report.logits.rows == 2
    assert any("no module produced a non-finite value" in f for f in report.findings)
    assert any("finite but constant" in f and "token 0" in f for f in report.findings)


def test_healthy_logits_are_summarised() -> None:
    report = analyse(lines_of(header(), step(0), mod(0, 0, "x"), logits(0)))
    assert report.first is None
    assert any("the logits are finite" in f for f in report.findings)


def test_ranks_and_the_first_rank_to_fail() -> None:
    report = analyse(
        lines_of(
            header(rank=0, tp_size=2),
            header(rank=1, tp_size=2),
            step(0, rank=0),
            step(0, rank=1),
            mod(0, 0, "model.layers.0.self_attn.o_proj", rank=0),
            mod(0, 0, "model.layers.0.self_attn.o_proj", rank=1, ok=False),
        )
    )
    assert report.ranks == [0, 1]
    assert report.first is not None and report.first.rank == 1


def test_read_trace_dir_drops_a_torn_last_line_and_rejects_garbage(tmp_path: Path) -> None:
    (tmp_path / "trace-rank0-1.jsonl").write_text(
        json.dumps(header()) + "\n" + json.dumps(step(0)) + "\n" + '{"kind": "mod'
    )
    assert len(read_trace_dir(tmp_path)) == 2
    (tmp_path / "trace-rank1-2.jsonl").write_text('{"kind": "other"}\n')
    with pytest.raises(TraceReadError):
        read_trace_dir(tmp_path)
