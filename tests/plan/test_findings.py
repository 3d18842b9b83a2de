"""One vLLM per plan on a host (issue 43, item 8): a profile that pins a vLLM release the facts' host does
not have installed is planned with a warning naming both; the same release in another build (`+cpu`) is no
mismatch; a profile that pins nothing targets the installed vLLM and is never told."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploykit.plan import make_plan
from deploykit.probe.facts import ProbeFacts
from deploykit.profile.load import load_profile
from tests.cli_process import run_deploykit
from tests.profile_variants import profile_variant
from tests.vllm_harness import REPO

FACTS_DIR = REPO / "tests" / "fixtures" / "facts"


def facts(gpu: str, installed: str) -> ProbeFacts:
    loaded = ProbeFacts.model_validate_json((FACTS_DIR / f"{gpu}.json").read_text())
    return loaded.model_copy(update={"vllm_version": installed})


def mismatch_warnings(warnings: list[str]) -> list[str]:
    return [w for w in warnings if "vllm_version" in w and "installed" in w]


@pytest.mark.parametrize("installed", ["0.32.0", "0.34.0"])
def test_a_pinned_release_the_host_lacks_is_one_warning(tmp_path: Path, installed: str) -> None:
    profile = profile_variant(tmp_path, "gemma4-turing", {"vllm_version": "0.33.0"})
    plan = make_plan(load_profile(str(profile)), facts("t4", installed))
    assert plan.vllm_version == "0.33.0"  # planned for the profile's release, as before
    [warning] = mismatch_warnings(plan.warnings)
    assert warning.startswith("the profile's vllm_version is 0.33.0, but this machine's probe"), warning
    assert f"shows vLLM {installed} installed" in warning
    assert "\n" not in warning and plan.errors == []


@pytest.mark.parametrize(
    ("pinned", "installed"),
    [("0.33.0", "0.33.0"), ("0.32.0", "0.32.0+cpu"), ("0.32", "0.32.0"), (None, "0.32.0")],
)
def test_the_same_release_or_no_pin_is_no_warning(tmp_path: Path, pinned: str | None, installed: str) -> None:
    profile = profile_variant(tmp_path, "demo-cpu", {"vllm_version": pinned})
    plan = make_plan(load_profile(str(profile)), facts("no-gpu", installed))
    assert mismatch_warnings(plan.warnings) == []


def test_an_unknown_installed_vllm_is_no_mismatch(tmp_path: Path) -> None:
    """Facts without a vLLM (a GPU host probed before vLLM was installed) name nothing to compare."""
    profile = profile_variant(tmp_path, "gemma4-turing", {"vllm_version": "0.33.0"})
    plan = make_plan(
        load_profile(str(profile)), facts("t4", "0.33.0").model_copy(update={"vllm_version": None})
    )
    assert mismatch_warnings(plan.warnings) == []


def test_the_plan_command_prints_the_warning_in_one_line(tmp_path: Path) -> None:
    profile = profile_variant(tmp_path, "gemma4-turing", {"vllm_version": "0.33.0"})
    saved = tmp_path / "t4-032.json"
    saved.write_text(facts("t4", "0.32.0").model_dump_json())
    done = run_deploykit(["plan", "-p", str(profile), "--facts", str(saved), "--no-validate"])
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "vllm_version is 0.33.0" in line]
    assert len(lines) == 1 and "warning:" in lines[0] and "0.32.0" in lines[0], done.stdout
    assert str(saved) in lines[0]
