"""A wheel of deploykit carries its profiles and templates as package data, found in every install mode.

The wheel is built from a copy of the sources (the build writes build/ and *.egg-info next to them), then
installed with `pip install --target DIR`: no `<prefix>/share`, no repository next to the package. The
installed deploykit must list the shipped profiles and render a systemd unit from its own templates.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from deploykit.paths import SHIPPED_DATA, packaged_data_dir, shipped_data_dir, template_dir
from tests.unit_prefix import ABSENT_PREFIX
from tests.vllm_harness import REPO

SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "deploykit", *SHIPPED_DATA)
FACTS = REPO / "tests" / "fixtures" / "facts"
SHIPPED_PROFILES = sorted(p.stem for p in (REPO / "profiles").glob("*.yaml"))


def _pip(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _source_copy(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        origin = REPO / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__", "_data"))
        else:
            shutil.copy2(origin, source / name)
    return source


@pytest.fixture(scope="module")
def target_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel` then `pip install --no-deps --target DIR`; returns DIR."""
    tmp_path = tmp_path_factory.mktemp("packaging")
    source = _source_copy(tmp_path)
    _pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(tmp_path / "dist"), ".", cwd=source)
    (wheel,) = (tmp_path / "dist").glob("vllm_deploykit-*.whl")
    target = tmp_path / "target"
    _pip("install", "--no-deps", "--target", str(target), str(wheel), cwd=tmp_path)
    return target


def _installed_deploykit(target: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(target)  # the installed copy only: not the repository, not the editable install
    env["DEPLOYKIT_PROFILE_DIR"] = str(cwd / "no-user-profiles")
    return subprocess.run(
        [sys.executable, "-m", "deploykit", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_wheel_holds_the_shipped_data_inside_the_package(target_install: Path) -> None:
    for name in SHIPPED_DATA:
        packaged = target_install / "deploykit" / "_data" / name
        shipped = sorted(p.relative_to(REPO / name) for p in (REPO / name).rglob("*") if p.is_file())
        assert sorted(p.relative_to(packaged) for p in packaged.rglob("*") if p.is_file()) == shipped
    assert not (target_install / "share").exists()
    assert not (target_install / "profiles").exists() and not (target_install / "templates").exists()


def test_a_target_install_lists_the_shipped_profiles(target_install: Path, tmp_path: Path) -> None:
    args = ["profiles", "list", "--facts", str(FACTS / "t4.json"), "--format", "json"]
    result = _installed_deploykit(target_install, *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert sorted(row["name"] for row in rows) == SHIPPED_PROFILES
    packaged = str(target_install / "deploykit" / "_data" / "profiles")
    assert all(row["path"].startswith(packaged) for row in rows)


def test_a_target_install_renders_a_systemd_unit(target_install: Path, tmp_path: Path) -> None:
    args = ["render", "systemd", "--profile", "demo-cpu", "--facts", str(FACTS / "no-gpu.json")]
    args += ["--prefix", ABSENT_PREFIX]
    result = _installed_deploykit(target_install, *args, "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    unit = (tmp_path / "out" / "deploykit-demo-cpu.service").read_text()
    assert "ExecStart=" in unit


@pytest.mark.wheel_build
def test_the_sdist_carries_the_shipped_data(tmp_path: Path) -> None:
    source = _source_copy(tmp_path)
    result = subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "--dist-dir", str(tmp_path / "dist")],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (sdist,) = (tmp_path / "dist").glob("vllm_deploykit-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {f"profiles/{name}.yaml" for name in SHIPPED_PROFILES} <= names
    assert "templates/systemd/server.service.j2" in names and "setup.py" in names


def test_a_source_checkout_reads_the_top_level_folders() -> None:
    """No _data/ in the repository: the editable install and a checkout read profiles/ and templates/."""
    assert not packaged_data_dir("profiles").exists()
    assert shipped_data_dir("profiles") == REPO / "profiles"
    assert template_dir() == REPO / "templates"


def test_the_packaged_copy_wins_over_a_folder_beside_the_package(tmp_path: Path) -> None:
    package = tmp_path / "site-packages" / "deploykit"
    (package / "_data" / "templates").mkdir(parents=True)
    (tmp_path / "site-packages" / "templates").mkdir()
    assert shipped_data_dir("templates", package) == package / "_data" / "templates"
    assert shipped_data_dir("profiles", package) is None
    with pytest.raises(ValueError, match="no shipped data folder"):
        shipped_data_dir("nope", package)
