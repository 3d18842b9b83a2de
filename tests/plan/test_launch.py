"""The environment a plan writes is private by default (issue 43, item 7): every plan carries vLLM's
usage-stats opt-out unless the profile opts in (`serve.usage_stats: true`), and a plan whose model and
adapters are all local paths runs with the hub switched off; serve, the systemd unit and the chart all take
it from the plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deploykit.plan import Plan, make_plan
from deploykit.probe.facts import ProbeFacts
from deploykit.profile.load import load_profile
from tests.cli_process import run_deploykit
from tests.profile_variants import profile_variant
from tests.vllm_harness import REPO

FACTS_DIR = REPO / "tests" / "fixtures" / "facts"
# What vLLM 0.32 reads (vllm/usage/usage_lib.py, is_usage_stats_enabled; vllm/envs.py): any of these = "1"
# turns its usage report off. DO_NOT_TRACK also turns off the Hugging Face hub's telemetry.
OPT_OUT = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
USAGE_VARIABLES = ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "VLLM_DO_NOT_TRACK")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def facts(gpu: str) -> ProbeFacts:
    return ProbeFacts.model_validate_json((FACTS_DIR / f"{gpu}.json").read_text())


def plan_of(tmp_path: Path, base: str, gpu: str, changes: dict[str, Any] | None = None) -> Plan:
    return make_plan(load_profile(str(profile_variant(tmp_path, base, changes or {}))), facts(gpu))


def picked(env: dict[str, str], names: tuple[str, ...] | dict[str, str]) -> dict[str, str]:
    return {name: env[name] for name in names if name in env}


@pytest.mark.parametrize(("profile", "gpu"), [("qwen-lora-hopper", "h100"), ("gemma4-turing", "t4")])
def test_production_profiles_opt_out_of_usage_stats(profile: str, gpu: str) -> None:
    plan = make_plan(load_profile(profile), facts(gpu))
    assert plan.errors == [], plan.errors
    assert picked(plan.env, OPT_OUT) == OPT_OUT
    # The runnable command carries it too (what a person pastes on the host).
    done = run_deploykit(
        ["plan", "-p", profile, "--facts", str(FACTS_DIR / f"{gpu}.json"), "--no-validate", "-f", "shell"]
    )
    assert done.returncode == 0, done.stderr
    assert "VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1" in done.stdout.splitlines()[-1]


def test_a_profile_that_opts_in_gets_no_opt_out(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, "gemma4-turing", "t4", {"serve.usage_stats": True})
    assert plan.errors == [], plan.errors
    assert picked(plan.env, USAGE_VARIABLES) == {}


def test_a_profile_that_sets_the_opt_out_itself_keeps_its_value(tmp_path: Path) -> None:
    """demo-cpu writes VLLM_NO_USAGE_STATS itself: kept, once, and DO_NOT_TRACK added beside it."""
    plan = make_plan(load_profile("demo-cpu"), facts("no-gpu"))
    assert plan.errors == [] and picked(plan.env, OPT_OUT) == OPT_OUT
    assert list(plan.env).count("VLLM_NO_USAGE_STATS") == 1


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        # The default is private: a value in env that turns the report back on contradicts it.
        ({"env.VLLM_NO_USAGE_STATS": "0"}, "env VLLM_NO_USAGE_STATS='0' would let vLLM report usage"),
        ({"env.DO_NOT_TRACK": "true"}, "env DO_NOT_TRACK='true' would let vLLM report usage"),
        # Opted in, yet env turns it off: one of the two is a mistake.
        (
            {"serve.usage_stats": True, "env.VLLM_DO_NOT_TRACK": "1"},
            "serve.usage_stats is true, but env VLLM_DO_NOT_TRACK='1' turns vLLM's usage report off",
        ),
    ],
)
def test_a_conflict_between_the_field_and_env_is_one_error(
    tmp_path: Path, changes: dict[str, Any], words: str
) -> None:
    plan = plan_of(tmp_path, "gemma4-turing", "t4", changes)
    [error] = [e for e in plan.errors if "usage" in e]
    assert error.startswith(words), error
    assert "serve.usage_stats" in error


def test_a_local_model_runs_offline_and_a_hub_model_does_not(tmp_path: Path) -> None:
    local = plan_of(tmp_path, "gemma4-turing", "t4", {"model.source": "/srv/models/gemma"})
    assert picked(local.env, OFFLINE) == OFFLINE
    hub = make_plan(load_profile("gemma4-turing"), facts("t4"))
    assert picked(hub.env, OFFLINE) == {}
    # A hub adapter beside a local model still needs the hub (qwen's adapter is local, its model is not).
    adapter = plan_of(
        tmp_path,
        "qwen-lora-hopper",
        "h100",
        {"model.source": "/srv/models/qwen", "serve.lora.adapters": {"a": "org/adapter"}},
    )
    assert picked(adapter.env, OFFLINE) == {}
    both_local = plan_of(tmp_path, "qwen-lora-hopper", "h100", {"model.source": "/srv/models/qwen"})
    assert picked(both_local.env, OFFLINE) == OFFLINE
    # The profile's own value wins.
    kept = plan_of(
        tmp_path, "gemma4-turing", "t4", {"model.source": "/srv/models/gemma", "env.HF_HUB_OFFLINE": "0"}
    )
    assert kept.env["HF_HUB_OFFLINE"] == "0" and kept.env["TRANSFORMERS_OFFLINE"] == "1"


def test_the_json_plan_carries_the_private_environment(tmp_path: Path) -> None:
    profile = profile_variant(tmp_path, "gemma4-turing", {"model.source": "/srv/models/gemma"})
    done = run_deploykit(
        ["plan", "-p", str(profile), "--facts", str(FACTS_DIR / "t4.json"), "--no-validate", "-f", "json"]
    )
    assert done.returncode == 0, done.stderr
    env = json.loads(done.stdout)["env"]
    assert picked(env, {**OPT_OUT, **OFFLINE}) == {**OPT_OUT, **OFFLINE}
