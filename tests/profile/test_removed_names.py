"""A profile naming a variable or option vLLM removed is refused for a target at or past the removal (issue
47): the plan's error names the file, the line and the field, the release that removed it and what replaces
it; the same profile for a target before the removal plans as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploykit.plan import make_plan
from deploykit.probe.facts import ProbeFacts
from deploykit.profile.load import load_profile
from deploykit.vllm_compat import RUNNER_ENV
from tests.cli_process import run_deploykit

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts" / "no-gpu.json"


def profile(
    tmp_path: Path, target: str | None, *, env: str = "", extra_args: str = "[]", runner: str = "auto"
) -> Path:
    """A CPU profile: `env` is the body of its env mapping (lines of `  NAME: value`), line 12 on."""
    version = f"vllm_version: {target}" if target else "# no vllm_version"
    text = f"""name: removed-names
platform: cpu
{version}
model:
  source: builtin:tiny-llama
serve:
  dtype: float32
  model_runner: {runner}
  extra_args: {extra_args}
env:
  HF_HUB_OFFLINE: "1"
{env}
"""
    path = tmp_path / "removed-names.yaml"
    path.write_text(text)
    return path


def plan_of(path: Path, installed: str | None = "0.32.0+cpu") -> tuple[list[str], list[str], dict[str, str]]:
    facts = ProbeFacts.model_validate_json(FACTS.read_text()).model_copy(update={"vllm_version": installed})
    plan = make_plan(load_profile(str(path)), facts)
    return plan.errors, plan.warnings, plan.env


def removed(errors: list[str]) -> list[str]:
    return [e for e in errors if "removed it" in e]


@pytest.mark.parametrize(
    ("name", "release", "instead", "before"),
    [
        ("VLLM_ATTENTION_BACKEND", "0.15.0", "use `--attention-backend` instead", "0.14.1"),
        ("VLLM_USE_V1", "0.11.1", "nothing replaces it, the V1 engine is the only one", "0.11.0"),
        ("VLLM_ALL2ALL_BACKEND", "0.16.0", "use `--all2all-backend` instead", "0.15.1"),
        ("VLLM_TORCH_PROFILER_DIR", "0.16.0", "use `--profiler-config`", "0.15.1"),
    ],
)
def test_a_removed_variable_in_env_is_refused_with_file_line_field_and_release(
    tmp_path: Path, name: str, release: str, instead: str, before: str
) -> None:
    path = profile(tmp_path, "0.33.0", env=f"  {name}: x")
    errors, _, _ = plan_of(path)
    [error] = removed(errors)
    assert error.startswith(
        f"{path}:12:3: env.{name}: vLLM 0.33.0 no longer reads {name}: vLLM {release} removed it ("
    )
    assert instead in error and f"or target a vLLM before {release}" in error
    # The same name for a target before its removal: planned as before.
    older, _, env = plan_of(profile(tmp_path, before, env=f"  {name}: x"))
    assert removed(older) == [] and env[name] == "x"


def test_the_target_from_the_facts_counts_as_a_pinned_one(tmp_path: Path) -> None:
    """No vllm_version: the plan targets the facts' vLLM, and refuses for it; no version anywhere, nothing
    is refused on a guess (the plan warns that the target is unknown)."""
    path = profile(tmp_path, None, env="  VLLM_ATTENTION_BACKEND: FLASH_ATTN")
    errors, _, _ = plan_of(path, installed="0.32.0+cpu")
    [error] = removed(errors)
    assert error.startswith(f"{path}:12:3: env.VLLM_ATTENTION_BACKEND: vLLM 0.32.0+cpu no longer reads")
    unknown, warnings, _ = plan_of(path, installed=None)
    assert removed(unknown) == [] and any("target vLLM version is unknown" in w for w in warnings)


def test_a_removed_option_in_extra_args_is_refused_at_its_item(tmp_path: Path) -> None:
    """`--task` went in 0.13.0 (vllm-project/vllm#30397); vLLM 0.33 would refuse to start."""
    path = profile(tmp_path, "0.33.0", extra_args='["--max-num-seqs", "4", "--task=embed"]')
    errors, _, _ = plan_of(path)
    [error] = removed(errors)
    assert error.startswith(
        f"{path}:9:39: serve.extra_args[2]: --task=embed: vLLM 0.33.0 has no --task option: vLLM 0.13.0 "
        "removed it (vllm-project/vllm#30397): use `--runner` and/or `--convert`"
    )
    older, _, _ = plan_of(profile(tmp_path, "0.12.0", extra_args='["--task", "embed"]'))
    assert removed(older) == []


def test_the_v1_runner_switch_is_refused_from_0_34_and_deploykits_own_is_never_written_there(
    tmp_path: Path,
) -> None:
    """VLLM_USE_V2_MODEL_RUNNER, which the tables show gone in 0.34: the profile's own is refused there; the
    one deploykit writes for `serve.model_runner` is written for 0.33 and never for 0.34 (vllm_compat)."""
    path = profile(tmp_path, "0.34.0", env=f"  {RUNNER_ENV}: '1'")
    errors, _, _ = plan_of(path)
    [error] = removed(errors)
    assert (
        f"{path}:12:3: env.{RUNNER_ENV}: vLLM 0.34.0 no longer reads {RUNNER_ENV}: vLLM 0.34.0 removed"
        in error
    )
    assert "the V2 model runner is the only one" in error
    for target, written in (("0.33.0", "0"), ("0.34.0", None)):
        errors, warnings, env = plan_of(profile(tmp_path, target, runner="v1" if written else "auto"))
        assert removed(errors) == [] and not [w for w in warnings if RUNNER_ENV in w]
        assert env.get(RUNNER_ENV) == written


def test_a_variable_deploykit_writes_itself_is_a_warning_not_the_profiles_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were vLLM to take a variable deploykit writes (here DO_NOT_TRACK, as if a release had), the profile is
    not at fault: said as a warning, nothing refused."""
    from deploykit import vllm_removed

    gone = vllm_removed.Removal("env", "DO_NOT_TRACK", "0.33.0", None, "", "x/y#1")
    monkeypatch.setattr(vllm_removed, "history", lambda: (gone,))
    errors, warnings, env = plan_of(profile(tmp_path, "0.33.0"))
    assert removed(errors) == [] and env["DO_NOT_TRACK"] == "1"
    assert [w for w in warnings if "DO_NOT_TRACK" in w] == [
        "env DO_NOT_TRACK: deploykit writes it, but vLLM 0.33.0 no longer reads it (vLLM 0.33.0 removed it, "
        "x/y#1): a deploykit bug, please report it"
    ]


def test_deploykit_plan_stops_with_the_located_line(tmp_path: Path) -> None:
    path = profile(tmp_path, "0.33.0", env="  VLLM_ATTENTION_BACKEND: FLASH_ATTN")
    done = run_deploykit(["plan", "--profile", str(path), "--facts", str(FACTS), "--no-validate"])
    assert done.returncode == 2, done.stderr
    assert (
        f"deploykit plan: error: {path}:12:3: env.VLLM_ATTENTION_BACKEND: vLLM 0.33.0 no longer reads "
        "VLLM_ATTENTION_BACKEND: vLLM 0.15.0 removed it (vllm-project/vllm#32812): use `--attention-backend` "
        "instead, or target a vLLM before 0.15.0 (the profile's vllm_version)"
    ) in done.stderr
