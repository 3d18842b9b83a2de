"""A fix is one module and one line in the registry (deploykit/fixes/__init__.py): the profile's `fixes:`
modes, the plan's decisions and owned flags, `deploykit fixes`, the advisory catalog's entry, the docs
index and the fix targets of `make vllm-release`'s report all derive from it. Shown with a throw-away fix in
a temporary module, registered by one line in a temporary copy of the package (tools/ copied unchanged),
with no other edit anywhere; and the shipped docs index is checked."""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from deploykit.fixes import FIX_MODULES, FIX_NAMES
from deploykit.profile.load import parse_profile
from tools import fixes_index

REPO = Path(__file__).resolve().parents[2]
PROFILE = "name: x\nplatform: cpu\nmodel: {source: /m}\n"
# Copied unchanged into the copy: a new fix edits none of them.
TOOLS_READING_THE_REGISTRY = ("fixes_index.py", "generated_section.py", "vllm_release.py", "vllm_tables.py")
TOOLS_READING_THE_REGISTRY += ("vllm_tier.py",)

THROWAWAY_FIX = textwrap.dedent(
    '''
    """A throw-away fix: what a new fix's module provides, and nothing else."""

    from __future__ import annotations

    from deploykit.fixes.base import (
        Decision,
        DecisionInputs,
        FixAdvisory,
        FixDecision,
        FixMode,
        TargetCheck,
        TargetStatus,
        decision_maker,
    )

    NAME = "throwaway"
    SUMMARY = "a throw-away fix made by a test"
    PATCHES = "nothing in vLLM"
    LAUNCH_FLAGS: tuple[str, ...] = ("--throwaway-flag",)
    TARGET_SOURCES: tuple[str, ...] = ("vllm/throwaway_target.py::Target",)
    ADVISORY: FixAdvisory = {
        "title": "a throw-away known-bad combination",
        "symptom": "none: a test registered it",
        "kind": "corruption",
        "references": [{"number": 1, "note": "made up by tests/fixes/test_registry.py"}],
        "vllm": {"evidence": "none"},
    }


    def decide(inputs: DecisionInputs, mode: FixMode) -> FixDecision:
        result = decision_maker(NAME, mode)
        if mode is FixMode.OFF:
            return result(Decision.NOT_NEEDED, "turned off")
        return result(Decision.ENABLED, "every deployment calls for it")


    def launch_args(inputs: DecisionInputs) -> list[str]:
        return ["--throwaway-flag"]


    def plan_warnings(inputs, decision):
        return []


    def trace_suggestion(culprit, header, lines):
        return None


    def check_target() -> TargetCheck:
        return TargetCheck(status=TargetStatus.APPLICABLE, target=PATCHES, detail="nothing to check")


    def apply() -> str:
        return PATCHES
    '''
)

# Run in the copy: everything that should see the new fix, read as each part of deploykit reads it.
PROBE = textwrap.dedent(
    """
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    import deploykit.fixes.status
    from deploykit.advisories import advisory_ids
    from deploykit.cli.app import app
    from deploykit.plan import FIX_NAMES, make_plan
    from deploykit.probe.facts import ProbeFacts
    from deploykit.profile.load import parse_profile
    from deploykit.profile.schema import LoadedProfile, Profile, ProfileError
    from tools import vllm_release
    from tools.fixes_index import index_table

    PROFILE = {profile!r}
    out = {{"names": list(FIX_NAMES)}}
    out["schema"] = list(Profile.model_json_schema()["$defs"]["FixModes"]["properties"])
    on = parse_profile(PROFILE + "fixes: {{throwaway: 'on'}}\\n")
    out["mode"] = on.fixes.mode("throwaway")
    try:
        parse_profile(PROFILE + "fixes: {{throwaway: sometimes}}\\n", "x.yaml")
    except ProfileError as exc:
        out["bad_mode"] = str(exc)
    out["unchanged_id"] = parse_profile(PROFILE).profile_id()
    facts = ProbeFacts(vllm_version="0.32.0+cpu")
    plan = make_plan(LoadedProfile(on, Path("x.yaml")), facts)
    out["decision"] = [f.decision.value for f in plan.fixes if f.name == "throwaway"]
    out["argv"] = plan.argv
    out["fixes_env"] = plan.env.get("DEPLOYKIT_FIXES")
    out["advisories"] = [a.id + ":" + a.outcome for a in plan.advisories]
    owned = parse_profile(PROFILE + "serve: {{extra_args: ['--throwaway_flag']}}\\n")
    out["owned_errors"] = make_plan(LoadedProfile(owned, Path("x.yaml")), facts).errors
    deploykit.fixes.status.installed_vllm_version = lambda: None  # no vLLM import for the real fixes
    listed = CliRunner().invoke(app, ["fixes", "--format", "json"])
    out["fixes_command"] = [row["name"] for row in json.loads(listed.stdout)]
    out["catalog"] = advisory_ids()
    out["index"] = index_table()
    out["report_sources"] = vllm_release.fix_sources()["throwaway"]
    old, new = Path("old"), Path("new")  # two made-up releases: the throw-away's target class is edited
    for tree, value in ((old, 1), (new, 2)):
        (tree / "vllm").mkdir(parents=True)
        (tree / "vllm" / "throwaway_target.py").write_text(f"class Target:\\n    x = {{value}}\\n")
    rows = vllm_release.fix_target_rows(old, new)
    out["report_row"] = [row for row in rows if row.startswith("- `throwaway`")]
    print(json.dumps(out))
    """
)


def registered_copy(tmp_path: Path) -> Path:
    """A copy of the package (and the tools that read the registry: the docs index, the release report)
    with the throw-away fix registered: one module outside the package, one line added to the registry,
    nothing else touched."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "deploykit", root / "deploykit", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "tools").mkdir()
    for tool in TOOLS_READING_THE_REGISTRY:
        shutil.copy(REPO / "tools" / tool, root / "tools" / tool)
    (tmp_path / "extra").mkdir()
    (tmp_path / "extra" / "throwaway_fix.py").write_text(THROWAWAY_FIX)
    registry = root / "deploykit" / "fixes" / "__init__.py"
    before = registry.read_text()
    last = f'    "{FIX_NAMES[-1]}": "{FIX_MODULES[FIX_NAMES[-1]]}",\n'
    after = before.replace(last, last + '    "throwaway": "throwaway_fix",\n')
    registry.write_text(after)
    added = [d for d in difflib.ndiff(before.splitlines(), after.splitlines()) if d[:2] in ("+ ", "- ")]
    assert added == ['+     "throwaway": "throwaway_fix",']
    return root


def test_a_new_fix_is_one_module_and_one_registry_line(tmp_path: Path) -> None:
    root = registered_copy(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(tmp_path / "extra")])}
    script = PROBE.format(profile=PROFILE)
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout.splitlines()[-1])

    assert seen["names"] == [*FIX_NAMES, "throwaway"]
    assert seen["schema"] == [*FIX_NAMES, "throwaway"]  # the profile's `fixes:` modes and JSON schema
    assert seen["mode"] == "on"
    assert seen["bad_mode"].startswith("x.yaml:4:")  # a located error, as for every field
    assert "fixes.throwaway" in seen["bad_mode"]
    assert seen["unchanged_id"] == parse_profile(PROFILE).profile_id()  # stored ids stay
    assert seen["decision"] == ["enabled"]  # the plan's decision
    assert seen["argv"][-1] == "--throwaway-flag" and seen["fixes_env"] == "throwaway"
    assert "throwaway:fixed" in seen["advisories"]  # the catalog entry, judged by the plan
    assert seen["owned_errors"] == [  # its launch flag is owned, in any spelling
        "serve.extra_args sets --throwaway-flag (written --throwaway_flag); "
        "use the profile field `fixes.throwaway` instead"
    ]
    assert seen["fixes_command"] == [*FIX_NAMES, "throwaway"]  # `deploykit fixes`
    assert seen["catalog"][: len(FIX_NAMES) + 1] == [
        *(name.replace("_", "-") for name in FIX_NAMES),
        "throwaway",
    ]
    assert (
        "| `throwaway` | a throw-away known-bad combination | a throw-away fix made by a test |"
        in (seen["index"])
    )
    assert seen["report_sources"] == ["vllm/throwaway_target.py::Target"]  # `make vllm-release`'s report
    [row] = seen["report_row"]
    assert row.startswith("- `throwaway`: **changed**") and "-    x = 1\n+    x = 2" in row, row


def test_the_docs_index_is_the_registrys() -> None:
    """docs/fixes.md's index is generated from the registry (python tools/fixes_index.py rewrites it)."""
    text = fixes_index.DOC.read_text(encoding="utf-8")

    assert fixes_index.with_index(text) == text, "run python tools/fixes_index.py"
    for name in FIX_NAMES:
        assert (fixes_index.DOC.parent / fixes_index.page(name)).is_file()


def test_the_docs_index_check_can_fail() -> None:
    text = fixes_index.DOC.read_text(encoding="utf-8")
    stale = text.replace(f"| `{FIX_NAMES[0]}` |", "| `renamed` |")

    assert fixes_index.with_index(stale) != stale
