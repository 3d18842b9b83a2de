"""docs/advisories.md has a section per advisory, generated from the catalog (tools/advisories_doc.py) and
checked against it here: an advisory added or changed without running the tool fails these tests. The
check is shown failing on modified copies of the catalog; the shipped catalog is never edited."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from deploykit import exit_codes
from deploykit.advisories import advisories
from deploykit.advisories.schema import ADVISORY_KINDS, Advisory
from tools import advisories_doc

REPO = Path(__file__).resolve().parents[2]


def test_the_doc_is_the_catalogs() -> None:
    """python tools/advisories_doc.py --check, in process: the generated part is what the catalog gives."""
    text = advisories_doc.DOC.read_text(encoding="utf-8")

    assert advisories_doc.with_pages(text) == text, "run python tools/advisories_doc.py"
    assert advisories_doc.main(["--check"]) == exit_codes.OK
    generated = text.split(advisories_doc.BEGIN)[1].split(advisories_doc.END)[0]
    for advisory in advisories():
        assert (
            f"#### `{advisory.id}`" in generated or f'<a id="{advisory.id}"></a>`{advisory.id}`' in generated
        )
        assert f"](#{advisory.id})" in generated  # the index links to its section
        for reference in advisory.references:
            assert reference.url in generated


def test_the_sections_are_grouped_by_kind_hangs_first() -> None:
    generated = advisories_doc.generated(advisories())
    headings = [line for line in generated.splitlines() if line.startswith("### ")]

    assert [line.split()[1] for line in headings] == [
        advisories_doc.KIND_HEADINGS[kind] for kind in ADVISORY_KINDS
    ]
    for kind, heading in zip(ADVISORY_KINDS, headings, strict=True):
        group = generated.split(heading)[1].split("\n### ")[0]
        ids = {line.split("`")[1] for line in group.splitlines() if line.startswith("#### ")}
        assert ids == {advisory.id for advisory in advisories() if advisory.kind == kind}


def _changed(advisory_id: str, **update: object) -> list[Advisory]:
    return [
        Advisory.model_validate({**a.model_dump(), **update}) if a.id == advisory_id else a
        for a in advisories()
    ]


def test_a_changed_catalog_fails_the_check() -> None:
    """Modified copies of the catalog (in memory): each differs from the doc, so the check would fail."""
    text = advisories_doc.DOC.read_text(encoding="utf-8")
    entry = advisories()[-1]
    other_kind = next(kind for kind in ADVISORY_KINDS if kind != entry.kind)
    added = Advisory.model_validate({**entry.model_dump(), "id": "a-new-advisory"})
    note = entry.references[0].model_dump() | {"note": "another note"}

    for catalog in (
        _changed(entry.id, title=entry.title + " (changed)"),
        _changed(entry.id, kind=other_kind),
        _changed(entry.id, symptom="another symptom"),
        _changed(entry.id, references=[note, *entry.model_dump()["references"][1:]]),
        [*advisories(), added],
        advisories()[:-1],
    ):
        assert advisories_doc.with_pages(text, catalog) != text


def test_the_check_fails_on_a_modified_copy_of_the_catalog_until_the_tool_runs(tmp_path: Path) -> None:
    """The tool as a person runs it, on a copy of the package, the tool and the page whose catalog.yaml has
    one entry changed: --check exits 1; the tool rewrites the page; --check passes, the change in it."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "deploykit", root / "deploykit", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "tools").mkdir()
    for tool in ("advisories_doc.py", "generated_section.py"):
        shutil.copy(REPO / "tools" / tool, root / "tools" / tool)
    (root / "docs").mkdir()
    shutil.copy(advisories_doc.DOC, root / "docs" / "advisories.md")
    shutil.copytree(REPO / "docs" / "fixes", root / "docs" / "fixes")
    catalog_file = root / "deploykit" / "advisories" / "catalog.yaml"
    data = yaml.safe_load(catalog_file.read_text(encoding="utf-8"))
    data["advisories"][0]["title"] = "A title changed in the copy"
    catalog_file.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")

    env = {**os.environ, "PYTHONPATH": str(root)}
    tool = [sys.executable, str(root / "tools" / "advisories_doc.py")]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        # cwd outside the checkout: the copy is all there is (the tool imports nothing from tests/)
        return subprocess.run(
            [*tool, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    stale = run("--check")
    assert stale.returncode == exit_codes.FAILED, stale.stderr
    assert "run python tools/advisories_doc.py" in stale.stdout

    rewritten = run()
    assert rewritten.returncode == exit_codes.OK, rewritten.stderr
    assert run("--check").returncode == exit_codes.OK
    assert "**A title changed in the copy**" in (root / "docs" / "advisories.md").read_text(encoding="utf-8")
