"""trace/run.py's launch: the planned argv made traceable through the one argv writer (deploykit.argv)."""

from __future__ import annotations

from deploykit.argv import flag_switch, flag_value
from deploykit.trace.run import trace_argv


def test_the_traced_argv_is_eager_one_sequence_on_its_port_whatever_the_plan_spelled() -> None:
    planned = ["vllm", "serve", "m", "--port=8000", "--max_num_seqs", "4", "--no-enforce-eager"]

    traced = trace_argv(planned, 9123)

    assert flag_value(traced, "--port") == "9123"
    assert flag_value(traced, "--max-num-seqs") == "1"
    assert flag_switch(traced, "--enforce-eager") is True
    assert [w for w in traced if w in ("--port=8000", "--max_num_seqs", "4", "--no-enforce-eager")] == []
