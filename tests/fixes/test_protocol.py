"""Everything particular to a fix lives in its module (the `Fix` protocol in deploykit/fixes/base.py): its
decision, the flags it adds, the warnings a plan carries for it and the trace evidence that points at it.
So `plan` and the trace report name no fix, and a new fix is one module plus its line in the registry."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import deploykit.plan
import deploykit.trace.report
from deploykit.fixes import FIX_NAMES, load_fix
from deploykit.fixes import penalties as penalties_fix
from deploykit.fixes.base import Decision, DecisionInputs, FixDecision, FixMode
from deploykit.plan import make_plan
from deploykit.probe.facts import ProbeFacts
from deploykit.profile.load import parse_profile
from deploykit.profile.schema import LoadedProfile

PROTOCOL = (
    "NAME",
    "SUMMARY",
    "PATCHES",
    "LAUNCH_FLAGS",
    "ADVISORY",
    "decide",
    "launch_args",
    "plan_warnings",
    "trace_suggestion",
    "check_target",
    "apply",
)
INPUTS = DecisionInputs(gpus=[], vllm_version="0.32.0", checkpoint_dtype=None)


PLAN_FILES = sorted(Path(str(deploykit.plan.__file__)).parent.glob("*.py"))


@pytest.mark.parametrize(
    "path",
    [*PLAN_FILES, Path(str(deploykit.trace.report.__file__))],
    ids=[*(f"plan/{p.name}" for p in PLAN_FILES), "trace.report"],
)
def test_plan_and_the_trace_report_name_no_particular_fix(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    fix_modules = {m for m in imported if m.startswith("deploykit.fixes.") and m != "deploykit.fixes.base"}
    assert fix_modules == set()  # the registry (deploykit.fixes) and the vocabulary (base) only
    texts = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    assert [text for text in texts if any(name in text for name in FIX_NAMES)] == []


@pytest.mark.parametrize("name", FIX_NAMES)
def test_every_fix_provides_the_whole_protocol(name: str) -> None:
    fix = load_fix(name)
    assert [part for part in PROTOCOL if not hasattr(fix, part)] == []
    assert name == fix.NAME
    added = {arg for arg in fix.launch_args(INPUTS) if arg.startswith("--")}
    assert added <= set(fix.LAUNCH_FLAGS)  # a flag the fix adds is one it declares
    off = fix.decide(INPUTS, FixMode.OFF)
    assert fix.plan_warnings(INPUTS, off) == []  # a fix turned off says nothing of its own


def test_a_flag_a_fix_adds_is_refused_in_extra_args(tmp_path: Path) -> None:
    text = "name: x\nmodel: {source: /m}\nserve:\n  extra_args: ['--logits-processors', 'mine:Processor']\n"
    plan = make_plan(
        LoadedProfile(parse_profile(text), tmp_path / "x.yaml"), ProbeFacts(vllm_version="0.32.0")
    )
    assert (
        "serve.extra_args sets --logits-processors; use the profile field `fixes.device_penalties` instead"
        in plan.errors
    )


@pytest.mark.parametrize(
    ("runner", "decision", "warned"),
    [("v1", Decision.ENABLED, True), ("auto", Decision.ENABLED, False), ("v1", Decision.NOT_NEEDED, False)],
)
def test_device_penalties_warns_of_the_runner_it_pins(runner: str, decision: Decision, warned: bool) -> None:
    inputs = INPUTS.model_copy(update={"model_runner": runner})
    made = FixDecision(name=penalties_fix.NAME, mode=FixMode.AUTO, decision=decision, reason="r")
    warnings = penalties_fix.plan_warnings(inputs, made)
    assert bool(warnings) is warned
    assert all("V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0)" in w for w in warnings)
