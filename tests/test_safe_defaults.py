"""Safe by default (issue 11 §5): a plan never changes its target silently, a plan with errors prints no
command, facts of an unknown schema are refused, a server beyond loopback needs a key (or says it does
not), secrets never sit in a profile, results and logs are the owner's, the store opens before vLLM, and
tables are not cut when the output is not a terminal."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from deploykit.errors import FactsError, ProfileError, RenderError, StoreError
from deploykit.plan import make_plan, unauthenticated_exposure
from deploykit.probe.facts import ProbeFacts
from deploykit.probe.load import load_facts
from deploykit.profile.load import list_profile_paths, load_profile, parse_profile
from deploykit.profile.schema import FixMode, LoadedProfile
from deploykit.render.common import RenderedFile, RenderResult, plan_for_render, write_files
from tests.cli_process import run_deploykit
from tests.vllm_harness import REPO

FACTS = REPO / "tests" / "fixtures" / "facts"


def facts(name: str, vllm_version: str | None = None) -> ProbeFacts:
    loaded = load_facts(str(FACTS / f"{name}.json"))
    return loaded if vllm_version is None else loaded.model_copy(update={"vllm_version": vllm_version})


def loaded(text: str, tmp_path: Path, name: str = "p.yaml") -> LoadedProfile:
    return LoadedProfile(profile=parse_profile(text), path=tmp_path / name)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- a plan never changes its target silently -------------------------------------------------------


def test_cuda_profile_without_gpu_facts_stops_and_asks_for_facts() -> None:
    plan = make_plan(load_profile("gemma4-turing"), ProbeFacts(error="NVML could not start"))
    assert plan.errors and "--facts" in plan.errors[0] and "no GPU" in plan.errors[0]


def test_cuda_profile_for_a_cpu_build_of_vllm_stops() -> None:
    plan = make_plan(load_profile("gemma4-turing"), facts("t4", "0.32.0+cpu"))
    assert any("CPU build" in e and "--facts" in e for e in plan.errors)


def test_cpu_profile_plans_without_gpu_facts() -> None:
    assert make_plan(load_profile("demo-cpu"), ProbeFacts(vllm_version="0.32.0+cpu")).errors == []


def test_gpu_facts_plan_the_cuda_profile() -> None:
    plan = make_plan(load_profile("gemma4-turing"), facts("t4"))
    assert plan.errors == [] and plan.enabled_fixes == ["fp32_projection"]


def test_turning_off_a_fix_the_facts_call_for_warns() -> None:
    plan = make_plan(load_profile("gemma4-turing"), facts("t4"), {"fp32_projection": FixMode.OFF})
    [warning] = [w for w in plan.warnings if "fp32_projection" in w]
    assert "--fix fp32_projection=off" in warning and "may be wrong" in warning
    quiet = make_plan(load_profile("gemma4-turing"), facts("a100"), {"fp32_projection": FixMode.OFF})
    assert not any("fp32_projection" in w for w in quiet.warnings)  # not called for on native BF16


# --- a plan with errors prints no runnable command; unknown facts are refused ------------------------


def deploykit(*args: str) -> subprocess.CompletedProcess[str]:
    return run_deploykit(args, cwd=REPO)


@pytest.mark.parametrize("form", ["text", "shell"])
def test_a_plan_with_errors_prints_no_command(form: str) -> None:
    no_gpu = str(FACTS / "no-gpu.json")
    result = deploykit("plan", "-p", "gemma4-turing", "--facts", no_gpu, "--no-validate", "-f", form)
    assert result.returncode == 2
    assert "vllm serve" not in result.stdout
    assert "deploykit plan: error: profile gemma4-turing is for CUDA" in result.stderr


def test_facts_with_an_unknown_schema_version_are_refused(tmp_path: Path) -> None:
    future = tmp_path / "future.json"
    future.write_text((FACTS / "t4.json").read_text().replace('"schema_version": 1', '"schema_version": 2'))
    with pytest.raises(FactsError, match="schema_version 2"):
        load_facts(str(future))


# --- beyond loopback needs an API key, or says it does without -----------------------------------------

OPEN = "name: open\nmodel: {source: /m}\nserve: {host: 0.0.0.0%s}\n"


def test_listening_beyond_loopback_without_a_key_warns_in_plan_and_is_refused_by_render(
    tmp_path: Path,
) -> None:
    profile = loaded(OPEN % "", tmp_path)
    plan = make_plan(profile, facts("a100"))
    assert plan.errors == [] and any("allow_unauthenticated" in w for w in plan.warnings)
    with pytest.raises(RenderError, match="allow_unauthenticated"):
        plan_for_render(profile, facts("a100"))


@pytest.mark.parametrize("extra", [", api_key_env: MY_KEY", ", allow_unauthenticated: true"])
def test_a_key_or_a_stated_exception_lets_it_render(tmp_path: Path, extra: str) -> None:
    profile = loaded(OPEN % extra, tmp_path)
    assert unauthenticated_exposure(profile.profile) is None
    assert plan_for_render(profile, facts("a100")).errors == []


def test_loopback_needs_no_key(tmp_path: Path) -> None:
    assert unauthenticated_exposure(loaded("name: l\nmodel: {source: /m}\n", tmp_path).profile) is None


def test_no_shipped_profile_is_open_without_a_key() -> None:
    for path in list_profile_paths():
        assert unauthenticated_exposure(load_profile(str(path)).profile) is None, path.name


def test_profiles_list_shows_the_warning(tmp_path: Path) -> None:
    (tmp_path / "open.yaml").write_text(OPEN % "")
    result = deploykit(
        "profiles", "list", "--dir", str(tmp_path), "--facts", str(FACTS / "a100.json"), "-f", "json"
    )
    assert result.returncode == 0, result.stderr
    assert "allow_unauthenticated" in result.stdout


# --- secrets are referenced, never written -------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HF_TOKEN", "abc"),
        ("DB_PASSWORD", "hunter2"),
        ("SERVICE_PASS", "x"),
        ("OPENAI_KEY", "x"),
        ("MY_SECRET", "x"),
        ("SOMETHING", "hf_abcdefghijklmnopqrstuvwxyz"),
        ("ENDPOINT_AUTH", "sk-abcdefghijklmnopqrstuv"),
    ],
)
def test_a_literal_secret_is_refused_with_how_to_reference_it(name: str, value: str) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_profile(f"name: s\nmodel: {{source: /m}}\nenv: {{{name}: {value}}}\n")
    assert f"{name}: {{secret: {name}}}" in caught.value.message


def test_plain_values_and_references_pass() -> None:
    text = "name: s\nmodel: {source: /m}\nenv: {HF_HUB_OFFLINE: '1', HF_TOKEN: {secret: HF_TOKEN}}\n"
    assert parse_profile(text).env["HF_HUB_OFFLINE"] == "1"


# --- owner-only files ----------------------------------------------------------------------------------


def test_the_store_is_created_owner_only(tmp_path: Path) -> None:
    from deploykit.results.sql.store import open_store

    path = tmp_path / "new" / "dir" / "results.sqlite"
    open_store(f"sqlite:///{path}").close()
    assert mode(path) == 0o600
    assert mode(path.parent) == 0o700 and mode(path.parent.parent) == 0o700


def test_the_vllm_log_is_created_owner_only(tmp_path: Path) -> None:
    from deploykit.serve.launch import start_server

    log = tmp_path / "logs" / "server.log"
    server = start_server(["true"], dict(os.environ), log_path=log, host="127.0.0.1", port=9)
    server.process.wait(timeout=10)
    assert mode(log) == 0o600 and mode(log.parent) == 0o700


def test_rendered_secret_files_are_owner_only_from_the_start(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "x.env").write_text("old")
    (out / "x.env").chmod(0o644)
    result = RenderResult(files=[RenderedFile(path="x.env", content="A=1\n", mode=0o600)])
    old = os.umask(0)
    try:
        write_files(result, out, force=True)  # x.env is not deploykit's: replacing it takes --force
        write_files(
            result.model_copy(update={"files": [result.files[0].model_copy(update={"path": "y.env"})]}), out
        )
    finally:
        os.umask(old)
    assert mode(out / "x.env") == 0o600 and mode(out / "y.env") == 0o600


# --- the store opens before vLLM starts ------------------------------------------------------------------


def test_serve_fails_on_the_store_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    import deploykit.serve.attempt as attempt
    from deploykit.serve.attempt import ServeOptions, run_serve

    def never(*_args: object, **_kwargs: object) -> int:
        raise AssertionError("the attempt ran although the store cannot be written")

    monkeypatch.setattr(attempt, "_run_attempt", never)
    with pytest.raises(StoreError, match="/proc/deploykit-nowhere"):
        run_serve(ServeOptions(profile="demo-cpu", store_url="sqlite:////proc/deploykit-nowhere/r.sqlite"))


# --- tables are not cut when the output is not a terminal ------------------------------------------------


def test_tables_are_whole_when_not_a_terminal(tmp_path: Path) -> None:
    from deploykit.results.record import ResultRecord
    from deploykit.results.sql.store import open_store

    diagnosis = "a long diagnosis that a person piping the output to a file wants whole, " * 3
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    store = open_store(url)
    store.add(ResultRecord(verdict="fail", stage="smoke", diagnosis=diagnosis, profile_name="p" * 60))
    store.close()
    env = {**os.environ, "COLUMNS": "60"}
    result = run_deploykit(["results", "list", "--store", url], env=env)
    assert result.returncode == 0, result.stderr
    assert " ".join(diagnosis.split()) in result.stdout and "p" * 60 in result.stdout
    assert str(tmp_path / "r.sqlite") in result.stdout
    plan = deploykit("plan", "-p", "demo-cpu", "--facts", str(FACTS / "no-gpu.json"), "--no-validate")
    assert load_profile("demo-cpu").id in plan.stdout  # the whole id, not 12 characters of it
