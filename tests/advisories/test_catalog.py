"""The shipped catalog: valid, complete, and true to the vLLM it targets.

A flag or environment variable an advisory names must exist in the option table of every vLLM release the
advisory covers that deploykit ships a table for (deploykit.vllm_options.known_serve_flags/known_env_vars);
an advisory wholly older than those tables is held to the oldest one (a flag renamed since would fail)."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml
from pydantic import ValidationError

from deploykit.advisories import advisories
from deploykit.advisories.catalog import fix_entry
from deploykit.advisories.schema import Advisory, Catalog
from deploykit.fixes import FIX_NAMES
from deploykit.vllm_compat import parse_version
from deploykit.vllm_options import SUPPORTED_VLLM_RELEASES, known_env_vars, known_serve_flags

CATALOG = advisories()


def test_the_catalog_is_the_fixes_entries_then_the_package_data_and_validates() -> None:
    text = resources.files("deploykit.advisories").joinpath("catalog.yaml").read_text()
    fixes = [Advisory.model_validate(fix_entry(name)) for name in FIX_NAMES]

    assert [*fixes, *Catalog.model_validate(yaml.safe_load(text)).advisories] == CATALOG
    assert [a.id for a in fixes] == ["fp32-projection", "matmul-lora", "device-penalties"]


def test_at_least_ten_real_advisories_and_the_three_fixes() -> None:
    fixes = {a.action.fix for a in CATALOG if a.action.kind == "fix"}
    others = [a for a in CATALOG if a.action.kind != "fix"]

    assert fixes == set(FIX_NAMES)
    assert len(others) >= 10
    assert len(CATALOG) >= 22  # issue 35: ten more from the tracker's newest threads


@pytest.mark.parametrize("advisory", CATALOG, ids=lambda a: a.id)
def test_each_advisory_names_its_evidence(advisory: Advisory) -> None:
    assert advisory.references
    assert advisory.vllm.evidence.strip()
    assert advisory.action.why.strip()
    low, high = parse_version(advisory.vllm.affected_from), parse_version(advisory.vllm.fixed_in)
    if low and high:
        assert low < high


def _releases_covered(advisory: Advisory) -> list[str]:
    low, high = parse_version(advisory.vllm.affected_from), parse_version(advisory.vllm.fixed_in)
    covered = []
    for release in SUPPORTED_VLLM_RELEASES:
        version = parse_version(release)
        assert version is not None
        if (low is None or version >= low) and (high is None or version < high):
            covered.append(release)
    return covered or [min(SUPPORTED_VLLM_RELEASES, key=lambda r: parse_version(r) or (0, 0, 0))]


@pytest.mark.parametrize(
    "advisory", [a for a in CATALOG if a.action.kind == "workaround"], ids=lambda a: a.id
)
def test_workaround_flags_and_env_exist_in_the_vllm_it_targets(advisory: Advisory) -> None:
    for release in _releases_covered(advisory):
        flags, env = known_serve_flags(release), known_env_vars(release)
        assert set(advisory.action.flags) <= flags, (release, advisory.action.flags)
        assert set(advisory.action.env) <= env, (release, advisory.action.env)


@pytest.mark.parametrize("advisory", [a for a in CATALOG if a.when.env], ids=lambda a: a.id)
def test_condition_env_vars_exist_in_the_vllm_it_targets(advisory: Advisory) -> None:
    """A condition on a variable vLLM does not read would never describe a real launch."""
    assert advisory.when.env
    for release in _releases_covered(advisory):
        assert set(advisory.when.env) <= known_env_vars(release), (release, advisory.when.env)


def test_the_flag_check_can_fail() -> None:
    """A made-up flag or variable is caught by the same check."""
    release = SUPPORTED_VLLM_RELEASES[-1]

    assert "--attention-backend" in known_serve_flags(release)
    assert "--attention-backendd" not in known_serve_flags(release)
    assert "VLLM_USE_FLASHINFER_SAMPLERR" not in known_env_vars(release)


def _entry(**changes: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "id": "x",
        "title": "t",
        "symptom": "s",
        "kind": "corruption",
        "references": [{"number": 1, "note": "n"}],
        "vllm": {"evidence": "e"},
        "action": {"kind": "workaround", "args": ["--enforce-eager"], "why": "w"},
    }
    entry.update(changes)
    return entry


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"action": {"kind": "workaround", "why": "w"}}, "carries args and/or env"),
        ({"action": {"kind": "fix", "fix": "matmul_lora", "why": "w"}, "when": {"lora": True}}, "decide()"),
        ({"action": {"kind": "warning", "default": "apply", "why": "w"}}, "nothing to apply"),
        ({"action": {"kind": "workaround", "args": ["TRITON_ATTN"], "why": "w"}}, "must start with a flag"),
        ({"references": []}, "at least 1"),
        ({"when": {"gpu_archh": ["hopper"]}}, "Extra inputs"),
        ({"kind": "slow"}, "'hang', 'corruption' or 'performance'"),
    ],
)
def test_the_schema_refuses_a_bad_entry(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Advisory.model_validate(_entry(**changes))


def test_ids_are_unique() -> None:
    with pytest.raises(ValidationError, match="appears twice"):
        Catalog.model_validate({"advisories": [_entry(), _entry()]})
