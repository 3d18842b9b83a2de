"""Add a vLLM release to deploykit in one command: `make vllm-release VERSION=0.35.0`.

    .venv/bin/python tools/vllm_release.py 0.35.0            # fetch, pin, unpack, table, tier, report
    .venv/bin/python tools/vllm_release.py 0.34.0 --no-tier  # the same without the tier (seconds)

1. fetches the CUDA wheel from PyPI (`pip download --no-deps vllm==X`, into the sources cache of
   tools/fetch-vllm-sources.sh) and pins its sha256 in tools/vllm-wheels.txt;
2. unpacks its Python sources (tools/fetch-vllm-sources.sh, which checks the pin);
3. writes deploykit/vllm_tables/vllm-X.json from its own parser (tools/vllm_tables.py: the parser alone,
   no engine config is built, so 0.34's "no active Triton driver" refusal on an x86 CPU never applies);
4. writes the report docs/vllm-releases/vllm-X.md against the newest release before it: each fix's target
   (present, changed with the diff of its source, or gone), the variables deploykit writes that X no longer
   defines, the metrics the canary reads that X no longer exports, the FlashInfer its wheel pins, options
   added and removed, advisories whose fixed-in version X reaches; and prints it;
5. runs the tier (tests/vllm_releases, as tools/vllm_tier.py describes it) over X's sources and prints its
   one-line outcome.

What the report judges is read from its owners: each fix's TARGET_SOURCES from its module (through the
registry, deploykit.fixes), the variables deploykit writes from the plan and the plugin contract. Adding a
fix edits nothing here; nothing here imports tests/ (tests/tools/test_tools_imports.py).

The one hand edit left is the decision to widen TESTED_VLLM (deploykit/vllm_compat.py) and the extras that
tests/test_vllm_compat.py holds to it; `--widen` makes that edit too. The report and table are reproducible:
running the command again over the cached sources writes the same bytes (tests/vllm_releases checks).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script, sys.path[0] is tools/
    sys.path.insert(0, str(REPO))

from tools import vllm_tables, vllm_tier  # noqa: E402

PINS = REPO / "tools" / "vllm-wheels.txt"
FETCH = REPO / "tools" / "fetch-vllm-sources.sh"
REPORTS = REPO / "docs" / "vllm-releases"

DIFF_LINES = 60  # per file in the report; the whole diff is `diff -r` of the two cached trees away
# A release number: ASCII digits only (a Unicode `\d`, like `str.isdigit()`, takes ٣ and ３ too), since it
# goes into a pip requirement, the pins file and file names.
RELEASE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+", re.ASCII)


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


def fix_sources() -> dict[str, tuple[str, ...]]:
    """The source files each registered fix's target lives in (what "changed" is judged on), as its module
    declares them (TARGET_SOURCES). `file::Class` narrows a file to the one class the fix patches."""
    from deploykit.fixes import FIX_NAMES, load_fix

    return {name: tuple(load_fix(name).TARGET_SOURCES) for name in FIX_NAMES}


def written_env() -> tuple[str, ...]:
    """vLLM's variables deploykit's plan writes (deploykit.plan.launch.build_env) or relies on (the plugin
    contract: vLLM loads deploykit's plugin unless VLLM_PLUGINS leaves it out), each read from its owner."""
    from deploykit.plan.launch import NAN_COUNTER_ENV, USAGE_STATS_OPT_OUT
    from deploykit.plugin_contract import PLUGINS_ENV
    from deploykit.vllm_compat import RUNNER_ENV
    from deploykit.vllm_plugin.status_route import API_KEY_ENV

    # Of the usage-stats opt-out, vLLM's own variable (DO_NOT_TRACK is read by vLLM, defined by none).
    opt_out = tuple(name for name in USAGE_STATS_OPT_OUT if name.startswith("VLLM_"))
    return (RUNNER_ENV, NAN_COUNTER_ENV, API_KEY_ENV, PLUGINS_ENV, *opt_out)


# --- 1. the wheel and its pin --------------------------------------------------------------------------


def pinned() -> dict[str, tuple[str, str]]:
    lines = [
        line.split() for line in PINS.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]
    return {version: (wheel, sha) for version, wheel, sha in lines}


def cache_dir() -> Path:
    done = subprocess.run(["bash", str(FETCH)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"vllm-release: tools/fetch-vllm-sources.sh failed: {done.stderr.strip()[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def fetch_and_pin(version: str, cache: Path) -> str:
    """The wheel in the cache (downloaded once) and its line in tools/vllm-wheels.txt; its sha256."""
    pins = pinned()
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             "--index-url", "https://pypi.org/simple", f"vllm=={version}", "-d", str(wheels)],
            check=True,
        )  # fmt: skip
        found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if len(found) != 1:
        raise SystemExit(f"vllm-release: expected one wheel of vLLM {version} in {wheels}, found {found}")
    wheel = found[0]
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if version in pins and pins[version] != (wheel.name, sha):
        raise SystemExit(f"vllm-release: {wheel.name} sha256 {sha} differs from the pin {pins[version]}")
    if version not in pins:
        with PINS.open("a", encoding="utf-8") as out:
            out.write(f"{version} {wheel.name} {sha}\n")
    return sha


# --- 3. the table --------------------------------------------------------------------------------------


def write_table(version: str, cache: Path, tables: Path = vllm_tables.TABLES) -> Path:
    """deploykit/vllm_tables/vllm-X.json (or the same file in `tables`), from X's own code."""
    from deploykit.vllm_tables import file_name

    text = vllm_tables.rendered(vllm_tables.read_release(version, cache))
    path = tables / file_name(version)
    path.write_text(text, encoding="utf-8")
    return path


# --- 4. the report -------------------------------------------------------------------------------------


def release_tree(release: str, cache: Path) -> Path | None:
    """The folder holding `vllm/` of a release: its unpacked wheel, or the installed CPU build."""
    tree = cache / f"vllm-{release}"
    if (tree / "vllm" / "__init__.py").is_file():
        return tree
    return vllm_tables.vllm_root() if vllm_tables.installed_release() == release else None


def target_source(tree: Path, target: str) -> str | None:
    """The text a fix's target is judged on: a whole file, or one class of it (`file::Class`); None when
    the file or the class is gone."""
    import ast

    relative, _, class_name = target.partition("::")
    path = tree / relative
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    if not class_name:
        return text
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return ast.get_source_segment(text, node)
    return None


def fix_target_rows(previous: Path | None, new: Path) -> list[str]:
    rows = []
    for name, targets in fix_sources().items():
        now = {t: target_source(new, t) for t in targets}
        gone = [t for t, text in now.items() if text is None]
        if len(gone) == len(targets):
            rows.append(f"- `{name}`: **gone** ({', '.join(gone)})")
            continue
        changed = []
        for target, text in now.items():
            old = None if previous is None or text is None else target_source(previous, target)
            if old is None or old == text:
                continue
            assert text is not None
            diff = list(
                difflib.unified_diff(old.splitlines(), text.splitlines(), target, target, lineterm="")
            )
            shown = diff[:DIFF_LINES]
            if len(diff) > DIFF_LINES:
                shown.append(f"... {len(diff) - DIFF_LINES} more lines")
            changed.append(f"  - {target}:\n\n```diff\n" + "\n".join(shown) + "\n```")
        partly = f"; missing: {', '.join(gone)}" if gone else ""
        if changed:
            rows.append(f"- `{name}`: **changed**{partly}\n" + "\n".join(changed))
        else:
            rows.append(f"- `{name}`: present, its sources byte-identical{partly}")
    return rows


def env_rows(data: dict[str, Any], new: Path) -> list[str]:
    names = set(data["env_vars"])
    rows = []
    for name in written_env():
        if name in names:
            continue
        still = sorted(
            str(p.relative_to(new))
            for p in (new / "vllm").rglob("*.py")
            if name in p.read_text(errors="replace")
        )
        rows.append(
            f"- `{name}`: not defined by its vllm/envs.py; still named in: {', '.join(still) or 'nothing'}"
        )
    return rows or ["- none: every variable deploykit writes is still defined"]


def metric_rows(new: Path) -> list[str]:
    from deploykit.canary.defaults import NAN_COUNTER

    short = NAN_COUNTER.split(":", 1)[1]
    where = sorted(
        str(p.relative_to(new))
        for p in (new / "vllm").rglob("*.py")
        if short in p.read_text(errors="replace")
    )
    if where:
        return [f"- none: `{NAN_COUNTER}` is still exported ({', '.join(where)})"]
    return [f"- `{NAN_COUNTER}`: no longer named anywhere in its sources"]


def flashinfer_rows(previous: dict[str, Any] | None, data: dict[str, Any]) -> list[str]:
    """The FlashInfer the wheel pins (its METADATA), against the release before it."""
    pin, before = data["flashinfer_pin"], None if previous is None else previous["flashinfer_pin"]
    said = "none pinned" if pin is None else f"`flashinfer-python=={pin}`"
    if previous is None:
        return [f"- {said}"]
    if pin == before:
        return [f"- {said}, as before"]
    return [f"- {said} (was {'none pinned' if before is None else before})"]


def option_rows(previous: dict[str, Any] | None, data: dict[str, Any]) -> list[str]:
    if previous is None:
        return ["- no earlier release to compare with"]

    def by_dest(table: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {str(a["dest"]): a for a in table["option_table"]["actions"]}

    old, new = by_dest(previous), by_dest(data)
    rows = [f"- added: `{' '.join(new[d]['options'])}`" for d in sorted(set(new) - set(old))]
    rows += [f"- removed: `{' '.join(old[d]['options'])}`" for d in sorted(set(old) - set(new))]
    for dest in sorted(set(old) & set(new)):
        what = [key for key in sorted(new[dest]) if new[dest].get(key) != old[dest].get(key)]
        if what:
            rows.append(f"- changed: `{' '.join(new[dest]['options'])}` ({', '.join(what)})")
    return rows or ["- none"]


def advisory_rows(previous_release: str | None, release: str) -> list[str]:
    from deploykit.advisories.catalog import advisories as catalog_advisories

    rows = []
    for advisory in catalog_advisories():
        fixed = advisory.vllm.fixed_in
        if fixed is None or _key(fixed) > _key(release):
            continue
        if previous_release is not None and _key(fixed) <= _key(previous_release):
            continue
        rows.append(f"- `{advisory.id}`: fixed in {fixed} ({advisory.vllm.evidence.strip()})")
    return rows or ["- none"]


def report(release: str, cache: Path) -> str:
    from deploykit.vllm_tables import _read

    data = json.loads((vllm_tables.TABLES / f"vllm-{release}.json").read_text())
    earlier = [r for r in vllm_tables_releases() if _key(r) < _key(release)]
    previous_release = earlier[-1] if earlier else None
    previous = _read(previous_release) if previous_release else None
    new_tree = release_tree(release, cache)
    assert new_tree is not None
    old_tree = release_tree(previous_release, cache) if previous_release else None
    sections = [
        (f"Fix targets (against {previous_release})", fix_target_rows(old_tree, new_tree)),
        ("Environment variables deploykit writes that it no longer defines", env_rows(data, new_tree)),
        ("Metrics the canary reads that it no longer exports", metric_rows(new_tree)),
        (f"FlashInfer its wheel pins (against {previous_release})", flashinfer_rows(previous, data)),
        (f"`vllm serve` options (against {previous_release})", option_rows(previous, data)),
        ("Advisories whose fixed-in version it reaches", advisory_rows(previous_release, release)),
    ]
    out = [f"# vLLM {release}: what `make vllm-release VERSION={release}` found", ""]
    out.append(
        "Written by tools/vllm_release.py from the wheel pinned in tools/vllm-wheels.txt; do not edit."
    )
    for title, rows in sections:
        out += ["", f"## {title}", "", *rows]
    return "\n".join(out) + "\n"


def vllm_tables_releases() -> list[str]:
    found = (
        re.fullmatch(rf"vllm-({RELEASE.pattern})\.json", p.name, re.ASCII)
        for p in vllm_tables.TABLES.iterdir()
    )
    return sorted((m.group(1) for m in found if m), key=_key)


# --- 5. the tier, and the one hand edit ----------------------------------------------------------------


def run_tier(release: str, cache: Path) -> str:
    done = subprocess.run(
        vllm_tier.child_argv(), cwd=REPO, env=vllm_tier.child_env(release, cache),
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = done.stdout.strip().splitlines()
    failures = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    return "\n".join([f"tier over vLLM {release}: {lines[-1] if lines else done.stderr[-500:]}", *failures])


RANGE_FILES = (REPO / "deploykit" / "vllm_compat.py", REPO / "pyproject.toml")


def widen(release: str, files: tuple[Path, ...] = RANGE_FILES) -> None:
    """Make `release` the top of TESTED_VLLM and the extras (the decision a person takes)."""
    major, minor, _ = _key(release)
    bound = f"<{major}.{minor + 1}"
    for path in files:
        text = path.read_text()
        path.write_text(re.sub(r'(>=0\.\d+,)<\d+\.\d+(")', rf"\g<1>{bound}\g<2>", text))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", help="a vLLM release on PyPI, e.g. 0.35.0")
    parser.add_argument("--no-tier", action="store_true", help="skip the tier (the report only)")
    parser.add_argument("--widen", action="store_true", help="also widen TESTED_VLLM and the extras to it")
    args = parser.parse_args(argv)
    if not RELEASE.fullmatch(args.version):
        raise SystemExit(f"vllm-release: {args.version!r} is not a release like 0.35.0")
    cache = cache_dir()
    sha = fetch_and_pin(args.version, cache)
    cache = cache_dir()  # unpacks the newly pinned wheel, checking its sha256
    table = write_table(args.version, cache)
    text = report(args.version, cache)
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / f"vllm-{args.version}.md").write_text(text, encoding="utf-8")
    print(f"vLLM {args.version}: sha256 {sha} pinned; wrote {table.relative_to(REPO)}, "
          f"docs/vllm-releases/vllm-{args.version}.md\n")  # fmt: skip
    print(text)
    if args.widen:
        widen(args.version)
    if not args.no_tier:
        print(run_tier(args.version, cache))
    from deploykit.vllm_compat import version_in_range

    if not version_in_range(args.version):
        print(f"\nvLLM {args.version} is outside TESTED_VLLM: widen it (--widen) once the tier passes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
