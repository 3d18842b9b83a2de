"""The chart refuses, when it is installed, an `extraEnv` (or `env`) variable its vLLM no longer reads (issue
47): real `helm template`, one line naming the variable, the release that removed it and what replaces it.
The list is the chart's files/vllm-removed-env.json, written by `deploykit render helm` for its release."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.render.test_helm import FACTS_DIR, LISTEN_OPEN, RELEASE, STAGED_TINY, Chart, render_chart, run_helm

pytestmark = pytest.mark.external_tool  # every test here runs helm


@pytest.fixture(scope="module")
def charts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Chart]:
    """The demo profile's chart for vLLM 0.33.0 and for 0.34.0 (which removed VLLM_USE_V2_MODEL_RUNNER)."""
    from tests.profile_variants import profile_variant

    rendered = {}
    for target in ("0.33.0", "0.34.0"):
        directory = tmp_path_factory.mktemp(f"removed-{target}")
        changes: dict[str, Any] = {**LISTEN_OPEN, **STAGED_TINY, "vllm_version": target}
        profile = profile_variant(directory, "demo-cpu", changes)
        rendered[target] = render_chart(profile, FACTS_DIR / "no-gpu.json", directory / "out")
    return rendered


def installed(chart: Chart, *options: str) -> tuple[int, str]:
    done = run_helm("template", RELEASE, str(chart.root), *options)
    return done.returncode, done.stderr.strip()


def extra_env(name: str, value: str = "x") -> tuple[str, ...]:
    return ("--set", f"extraEnv[0].name={name}", "--set-string", f"extraEnv[0].value={value}")


REFUSED: list[tuple[str, str, str]] = [
    ("VLLM_ATTENTION_BACKEND", "vLLM 0.15.0 removed it (vllm-project/vllm#32812)", "`--attention-backend`"),
    ("VLLM_USE_V1", "vLLM 0.11.1 removed it (vllm-project/vllm#28204)", "nothing replaces it"),
    ("VLLM_ALL2ALL_BACKEND", "vLLM 0.16.0 removed it (vllm-project/vllm#33535)", "`--all2all-backend`"),
    (
        "VLLM_TORCH_PROFILER_WITH_STACK",
        "vLLM 0.16.0 removed it (vllm-project/vllm#33536)",
        "`--profiler-config`",
    ),
]


@pytest.mark.parametrize(("name", "removal", "instead"), REFUSED, ids=[r[0] for r in REFUSED])
def test_extra_env_naming_a_removed_variable_is_refused_in_one_line(
    charts: dict[str, Chart], name: str, removal: str, instead: str
) -> None:
    code, stderr = installed(charts["0.33.0"], *extra_env(name))
    assert code != 0
    [line] = [line for line in stderr.splitlines() if line.startswith("Error:")]
    assert f"extraEnv {name}: this chart runs vLLM 0.33.0, which no longer reads it: {removal}" in line
    assert instead in line


def test_env_values_are_refused_the_same_way(charts: dict[str, Chart]) -> None:
    code, stderr = installed(charts["0.33.0"], "--set-string", "env.VLLM_ATTENTION_BACKEND=FLASH_ATTN")
    assert code != 0 and "env VLLM_ATTENTION_BACKEND: this chart runs vLLM 0.33.0" in stderr


def test_a_removal_the_tables_show_is_refused_from_its_release_only(charts: dict[str, Chart]) -> None:
    """VLLM_USE_V2_MODEL_RUNNER: the 0.33 chart takes it (its vLLM reads it), the 0.34 chart refuses it."""
    assert installed(charts["0.33.0"], *extra_env("VLLM_USE_V2_MODEL_RUNNER", "1"))[0] == 0
    code, stderr = installed(charts["0.34.0"], *extra_env("VLLM_USE_V2_MODEL_RUNNER", "1"))
    assert code != 0
    assert "extraEnv VLLM_USE_V2_MODEL_RUNNER: this chart runs vLLM 0.34.0, which no longer reads it: vLLM " \
        "0.34.0 removed it" in stderr  # fmt: skip
    assert "the V2 model runner is the only one" in stderr


def test_near_misses_and_the_charts_own_values_install(charts: dict[str, Chart]) -> None:
    """A name beside a removed one, the prefix without its underscore, and the values as rendered."""
    for chart in charts.values():
        assert installed(chart)[0] == 0
        for name in ("VLLM_ATTENTION_BACKENDS", "VLLM_TORCH_PROFILER", "MY_VLLM_USE_V1", "HF_HOME"):
            code, stderr = installed(chart, *extra_env(name))
            assert code == 0, stderr
    assert run_helm("lint", "--strict", str(charts["0.34.0"].root)).returncode == 0


def test_the_list_is_rendered_for_the_charts_release(charts: dict[str, Chart]) -> None:
    for target, chart in charts.items():
        data = json.loads((chart.root / "files" / "vllm-removed-env.json").read_text())
        assert data["vllmVersion"] == target
        names = {entry["name"] for entry in data["removed"]}
        assert {"VLLM_ATTENTION_BACKEND", "VLLM_USE_V1", "VLLM_TORCH_PROFILER_"} <= names
        assert ("VLLM_USE_V2_MODEL_RUNNER" in names) == (target == "0.34.0")
