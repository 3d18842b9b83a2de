"""A `download` model volume names a commit (issue 48): a branch, a tag or no revision is a warning located
at the profile's line and field (deploykit.profile.revisions.revision_warnings); a commit is not. The
shipped profiles that download a model pin a commit."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploykit.profile.load import load_profile
from deploykit.profile.revisions import is_commit, revision_warnings
from tests.profile_variants import PROFILES

COMMIT = "6a9e13bd6fc8f0983b9b99948120bc37f49c13e9"  # a commit of Qwen/Qwen3.6-27B
HEAD = "name: p\nmodel:\n  source: /models/qwen\n  volumes:\n"


def warnings_of(tmp_path: Path, volumes: str) -> list[str]:
    path = tmp_path / "p.yaml"
    path.write_text(HEAD + volumes)
    return revision_warnings(load_profile(str(path)))


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/3", COMMIT.upper(), COMMIT[:12]])
def test_a_moving_revision_is_a_warning_at_its_line(tmp_path: Path, revision: str) -> None:
    volumes = (
        "    - kind: pvc\n      claim: adapters\n      mount_path: /srv/adapters\n"
        f"    - kind: download\n      repo: Qwen/Qwen3.6-27B\n      revision: {revision}\n"
        "      mount_path: /models/qwen\n"
    )
    (warning,) = warnings_of(tmp_path, volumes)
    assert warning.startswith(
        f"{tmp_path / 'p.yaml'}:10:7: model.volumes[1].revision: {revision} is a branch or tag"
    )
    assert "pin the commit" in warning


def test_no_revision_is_a_warning_at_the_volume(tmp_path: Path) -> None:
    (warning,) = warnings_of(
        tmp_path, "    - {kind: download, repo: Qwen/Qwen3.6-27B, mount_path: /models/qwen}\n"
    )
    assert warning.startswith(f"{tmp_path / 'p.yaml'}:5:7: model.volumes[0]: no revision: Qwen/Qwen3.6-27B")


def test_a_commit_is_no_warning(tmp_path: Path) -> None:
    volume = (
        f"    - {{kind: download, repo: Qwen/Qwen3.6-27B, revision: {COMMIT}, mount_path: /models/qwen}}\n"
    )
    assert warnings_of(tmp_path, volume) == []


def test_shipped_profiles_pin_their_downloads() -> None:
    for path in sorted(PROFILES.glob("*.yaml")):
        loaded = load_profile(str(path))
        for volume in loaded.profile.model.volumes:
            if volume.kind == "download":
                assert volume.revision and is_commit(volume.revision), f"{path.name}: {volume.repo}"
        assert revision_warnings(loaded) == [], path.name


def test_the_profiles_rule_and_the_init_containers_agree() -> None:
    """The init container's program spells the commit rule itself (it imports nothing of deploykit)."""
    from deploykit.render import model_download

    for revision in (COMMIT, COMMIT.upper(), COMMIT[:12], COMMIT + "0", "main", "v1.0", "refs/pr/3", ""):
        assert is_commit(revision) is model_download.is_commit(revision), revision


def test_plan_says_it_too(tmp_path: Path) -> None:
    from deploykit.plan import make_plan
    from deploykit.probe.load import load_facts
    from tests.advisories.conftest import facts_path

    path = tmp_path / "p.yaml"
    volume = "    - kind: download\n      repo: Qwen/Qwen3.6-27B\n      mount_path: /models/qwen\n"
    path.write_text(HEAD + volume)
    plan = make_plan(load_profile(str(path)), load_facts(str(facts_path("h100"))))
    said = "model.volumes[0]: no revision: Qwen/Qwen3.6-27B is fetched at main"
    assert any(said in warning for warning in plan.warnings)
