"""The canary's `hung` verdict names the hang advisories the deployment's plan matched (issue 47): from
serve's plan, from `--known-hang` (what the rendered units and chart pass), and never an id the catalog does
not hold as a hang. Plans are made for saved facts of real GPUs (tests/fixtures), the canary judges explicit
readings on explicit times."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploykit.advisories import advisories
from deploykit.canary.config import CanaryOptions, build_config
from deploykit.canary.known_hangs import hang_ids, named_hangs
from deploykit.canary.progress import ProgressReading
from deploykit.canary.runner import Canary, CanaryConfig
from deploykit.endpoint import Endpoint
from deploykit.errors import CanaryError
from deploykit.profile.schema import SmokeCase
from tests.advisories.conftest import PlanFor, plan_for  # noqa: F401  (the fixture)

# Qwen3.5 MoE on a B200 with vLLM 0.25.1 and its FlashInfer 0.6.13: FlashInfer's GDN prefill kernel deadlocks
# there (flashinfer#3565, vLLM #46811), and its top-k sampler could stall (#52247; applied: the sampler off).
GDN_MODEL = {"model": {"source": "org/m", "architecture": "Qwen3_5MoeForConditionalGeneration"}}
GDN_PROFILE = {**GDN_MODEL, "vllm_version": "0.25.1"}


def _hung_canary(tmp_path: Path, known: tuple[str, ...]) -> Canary:
    config = CanaryConfig(
        endpoint=Endpoint("http://127.0.0.1:9"),
        served_name="m",
        cases=[SmokeCase(kind="completion")],
        verdict_file=str(tmp_path / "verdict.json"),
        store=False,
        known_hangs=known,
    )
    canary = Canary(config)
    canary.observe_progress(ProgressReading(tokens=9, queued=2), now=0.0)
    assert canary.observe_progress(ProgressReading(tokens=9, queued=2), now=61.0) == "hung"
    return canary


def test_the_catalog_has_hangs_and_every_one_names_a_thread() -> None:
    hangs = [a for a in advisories() if a.kind == "hang"]
    assert len(hangs) >= 3
    assert all(a.references for a in hangs)


def test_a_plan_matching_a_hang_makes_the_hung_verdict_name_it(plan_for: PlanFor, tmp_path: Path) -> None:  # noqa: F811
    plan = plan_for("b200-flashinfer-0.6.13", GDN_PROFILE)
    outcomes = {a.id: a.outcome for a in plan.advisories}
    assert outcomes["flashinfer-gdn-prefill-hang-sm100"] == "warned"
    assert outcomes["flashinfer-topk-sampler-hang"] == "applied"  # the sampler is off: that way out is taken
    assert hang_ids(plan.advisories) == ["flashinfer-gdn-prefill-hang-sm100"]

    canary = _hung_canary(tmp_path, named_hangs(hang_ids(plan.advisories)))
    diagnosis = canary.state.diagnosis
    assert diagnosis.startswith("the engine is hung")
    assert "known hang flashinfer-gdn-prefill-hang-sm100 (flashinfer-ai/flashinfer#3565" in diagnosis
    assert "flashinfer-topk-sampler-hang" not in diagnosis
    assert "flashinfer-gdn-prefill-hang-sm100" in (tmp_path / "verdict.json").read_text()


def test_one_condition_away_the_verdict_names_nothing(plan_for: PlanFor, tmp_path: Path) -> None:  # noqa: F811
    """FlashInfer 0.6.17 holds the kernel fix: the same hang is then no known one, and the diagnosis is the
    bare one (which is what every hung verdict said before issue 47)."""
    plan = plan_for("b200-flashinfer-0.6.17", GDN_PROFILE)
    assert hang_ids(plan.advisories) == []
    canary = _hung_canary(tmp_path, named_hangs(hang_ids(plan.advisories)))
    assert "known hang" not in canary.state.diagnosis


def test_a_hang_the_profile_ignores_is_still_named(plan_for: PlanFor) -> None:  # noqa: F811
    profile = {**GDN_PROFILE, "advisories": {"flashinfer-gdn-prefill-hang-sm100": "ignore"}}
    plan = plan_for("b200-flashinfer-0.6.13", profile)
    assert hang_ids(plan.advisories) == ["flashinfer-gdn-prefill-hang-sm100"]


def test_known_hang_refuses_what_the_catalog_does_not_hold_as_a_hang() -> None:
    not_a_hang = next(a.id for a in advisories() if a.kind != "hang")
    for wrong in ("no-such-advisory", not_a_hang):
        with pytest.raises(CanaryError, match=f"--known-hang {wrong}: not a hang advisory"):
            build_config(CanaryOptions(url="http://127.0.0.1:9", model="m", known_hangs=(wrong,)))


def test_the_rendered_units_and_chart_pass_the_plans_open_hangs(plan_for: PlanFor) -> None:  # noqa: F811
    from deploykit.render.helm import canary_values

    plan = plan_for("b200-flashinfer-0.6.13", GDN_PROFILE)
    assert canary_values(hang_ids(plan.advisories))["knownHangs"] == ["flashinfer-gdn-prefill-hang-sm100"]
    assert canary_values()["knownHangs"] == []


@pytest.mark.external_tool
def test_render_passes_the_open_hangs_to_the_units_and_the_charts_canary(tmp_path: Path) -> None:
    """`render systemd` puts `--known-hang` on the canary unit's command; `render helm` into values, which the
    canary container's args carry (real helm), and the chart's schema refuses an id that is no catalog id."""
    import yaml

    from tests.advisories.conftest import facts_path
    from tests.cli_process import run_deploykit
    from tests.render.test_helm import run_helm
    from tests.unit_prefix import ABSENT_PREFIX

    profile = tmp_path / "gdn.yaml"
    served = {"host": "0.0.0.0", "allow_unauthenticated": True}
    profile.write_text(yaml.safe_dump({"name": "gdn", **GDN_PROFILE, "serve": served}))
    facts = str(facts_path("b200-flashinfer-0.6.13"))
    units, chart = tmp_path / "units", tmp_path / "chart"
    for target, out in (("systemd", units), ("helm", chart)):
        extra = ["--prefix", ABSENT_PREFIX] if target == "systemd" else []
        done = run_deploykit(("render", target, "-p", str(profile), "--facts", facts, "-o", str(out), *extra))
        assert done.returncode == 0, done.stderr
    canary_unit = (units / "deploykit-gdn-canary.service").read_text()
    assert "--known-hang flashinfer-gdn-prefill-hang-sm100" in canary_unit
    assert "flashinfer-topk-sampler-hang" not in canary_unit  # applied: the sampler is off
    rendered = run_helm("template", "x", str(chart / "gdn"))
    assert rendered.returncode == 0, rendered.stderr
    assert '- --known-hang\n            - "flashinfer-gdn-prefill-hang-sm100"' in rendered.stdout
    refused = run_helm("template", "x", str(chart / "gdn"), "--set", "canary.knownHangs[0]=a b")
    assert refused.returncode != 0 and "knownHangs/0" in refused.stderr


def test_serves_canary_names_the_hangs_of_its_own_plan(plan_for: PlanFor, tmp_path: Path) -> None:  # noqa: F811
    from deploykit.canary.settings import CanarySettings
    from deploykit.profile.load import load_profile
    from deploykit.serve.console import ConsoleUI
    from deploykit.serve.options import ServeOptions
    from deploykit.serve.stages import Attempt
    from deploykit.serve.watch import start_watch

    plan = plan_for("b200-flashinfer-0.6.13", GDN_PROFILE)
    attempt = Attempt(
        options=ServeOptions(profile="demo-cpu", canary=CanarySettings(every_s=1)),
        loaded=load_profile("demo-cpu"),
        base_url="http://127.0.0.1:1",
    )
    attempt.plan = plan
    watch = start_watch(attempt, ConsoleUI(quiet=True))
    assert watch is not None
    try:
        assert watch.canary.config.known_hangs == named_hangs(["flashinfer-gdn-prefill-hang-sm100"])
    finally:
        watch.close()


def test_a_start_up_that_times_out_names_the_plans_open_hangs(plan_for: PlanFor) -> None:  # noqa: F811
    """Some known hangs wedge before vLLM listens (a cross-node all-reduce set-up, a stale autotune cache):
    serve's start-up timeout names them; a vLLM that exited, or a plan with none, is told as before."""
    from deploykit.errors import LaunchError
    from deploykit.serve.attempt import _with_known_hangs
    from deploykit.serve.options import ServeOptions
    from deploykit.serve.stages import Attempt

    across = {
        "model": {"source": "org/m", "architecture": "DeepseekV4ForCausalLM"},
        "vllm_version": "0.28.0",
        "serve": {"tensor_parallel_size": 16},
        "deploy": {"nodes": 2},
    }
    attempt = Attempt(options=ServeOptions(profile="x"))
    attempt.plan = plan_for("h100x8", across)
    timed_out = LaunchError("vLLM did not answer http://h:1/health within 600 s", log_tail="tail")
    told = _with_known_hangs(timed_out, attempt)
    assert str(told).startswith("vLLM did not answer http://h:1/health within 600 s; this deployment matches")
    assert "cross-node-custom-ar-init-hang (#52907, #53894)" in str(told) and told.log_tail == "tail"
    exited = LaunchError("vLLM exited during start-up with code 1", server_exit_code=1)
    assert _with_known_hangs(exited, attempt) is exited
    attempt.plan = plan_for("h100x8", {**across, "vllm_version": "0.29.0"})
    assert _with_known_hangs(timed_out, attempt) is timed_out
