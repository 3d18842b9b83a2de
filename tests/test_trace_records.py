"""The trace-file schema both sides share: what the hooks write is exactly what the report reads."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from deploykit.trace_records import HeaderLine, LogitsLine, ModuleLine, StepLine, TraceRecord, parse_record

RECORDS: list[TraceRecord] = [
    HeaderLine(pid=7, vllm="0.32.0", model_class="Llama", modules_hooked=4, fixes=["matmul_lora"], rank=1),
    StepLine(step=0, requests=["req-1"], num_tokens=3),
    ModuleLine(step=0, order=2, module="norm", class_name="RMSNorm", dtype="float16", output_finite=False,
               nonfinite=2, nan=2, numel=8, first_bad=[1, 3], output_absmax=32752.0, output_index=0),
    LogitsLine(step=0, rows=1, vocab=16, min=-1.0, max=1.0, argmax=[3]),
]  # fmt: skip


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.kind)
def test_a_written_line_reads_back_as_the_same_record(record: TraceRecord) -> None:
    line = record.to_json_line()
    assert "\n" not in line and json.loads(line)["kind"] == record.kind
    assert parse_record(line) == record


def test_the_module_record_names_its_first_bad_value_and_its_headroom() -> None:
    module = RECORDS[2]
    assert isinstance(module, ModuleLine)
    assert (module.bad_token, module.bad_channel) == (1, 3)
    assert module.dtype_max == 65504.0 and module.fraction_of_dtype_max == pytest.approx(0.5, abs=1e-3)
    assert "class" in json.loads(module.to_json_line())  # the key as the hooks always wrote it


def test_a_non_finite_statistic_is_refused_when_written() -> None:
    with pytest.raises(ValidationError):
        LogitsLine(step=0, rows=1, vocab=16, mean=float("nan"))


def test_a_newer_writers_extra_keys_are_ignored_and_garbage_is_not_a_record() -> None:
    assert isinstance(parse_record('{"kind": "step", "step": 1, "requests": [], "future": 1}'), StepLine)
    with pytest.raises(ValueError):
        parse_record('{"kind": "mystery"}')
