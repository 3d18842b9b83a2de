"""Check a `vllm serve` argv as the parser of the vLLM a plan targets would, without importing vLLM.

`deploykit plan` validates every argv by default, against the vLLM the plan targets (the profile's or the
facts' vLLM version), which need not be the one installed where the plan is made. Each supported release's
option table (every flag, its action, nargs, choices and type, read from that release's own parser) ships
with deploykit (deploykit/vllm_tables, SUPPORTED_VLLM_RELEASES). For a target without a shipped table that
is the installed vLLM, the table is read from its parser in a child process (`python -m
deploykit.vllm_args table`; importing vLLM costs ~6 s) and cached as JSON in the user cache directory
(DEPLOYKIT_CACHE_DIR overrides it), keyed by the vLLM version and TABLE_SCHEMA. Any other target cannot be
checked here, and the check says so.

The check (table_parser.py) rebuilds a stdlib `argparse` parser from the table and runs it after the
same pre-processing vLLM's FlexibleArgumentParser does (underscores to dashes, `-O3`, dotted `--x.y` JSON
arguments), so abbreviations, `--flag=value`, `--no-flag`, nargs and missing values behave exactly as in
vLLM. The types vLLM uses most (int, float, JSON, human-readable ints, optional wrappers) are mirrored
there. An argv that gives a value to an option whose type or action is vLLM code not mirrored, or sets an
option that vLLM's post-parse checks read, or uses `--config`, is handed to vLLM's live parser in a child
process when the target is the installed vLLM (this module, with the per-version cache): slower, never
wrong. For another target that part is reported as not checked (the verdict says which).
tests/test_vllm_options.py holds the table to the live parser on a corpus of argvs, for every supported
release (tests/vllm_releases runs it against each).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deploykit.installed import installed_vllm_version
from deploykit.vllm_args import RESULT_PREFIX, TABLE_SCHEMA, ArgvRejected
from deploykit.vllm_options.table_parser import NeedsLiveParser as NeedsLiveParser
from deploykit.vllm_options.table_parser import OptionTableUnavailable as OptionTableUnavailable
from deploykit.vllm_options.table_parser import check_with_table as check_with_table
from deploykit.vllm_tables import (
    NEWEST_KNOWN_RELEASE,
    newer_than_known,
    shipped_env_vars,
    shipped_option_table,
)
from deploykit.vllm_tables import SUPPORTED_VLLM_RELEASES as SUPPORTED_VLLM_RELEASES

NEWEST_TABLE_HOW = "the newest shipped option table"
"""How a verdict says it stood in the newest known release's table for a target newer than any."""

BUILD_TIMEOUT_S = 600.0  # importing vLLM takes ~6 s on an idle machine, a minute on a loaded one


@dataclass(frozen=True)
class Verdict:
    """An accepted argv: which parser module's options accepted it, and how it was checked."""

    parser_module: str
    vllm_version: str | None
    how: str  # "shipped option table", "cached option table" or "vLLM's live parser: <why>"

    def describe(self) -> str:
        return f"accepted by {self.parser_module} (vLLM {self.vllm_version}, {self.how})"


# --- the cache --------------------------------------------------------------------------------------


def table_path(vllm_version: str, cache_dir: Path | None = None) -> Path:
    from deploykit.paths import vllm_options_cache_dir

    safe = re.sub(r"[^A-Za-z0-9.+-]", "_", vllm_version)
    return (cache_dir or vllm_options_cache_dir()) / f"vllm-serve-{safe}.schema{TABLE_SCHEMA}.json"


def _read_result(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            data = json.loads(line[len(RESULT_PREFIX) :])
            return data if isinstance(data, dict) else None
    return None


def _last_error_line(stderr: str) -> str:
    from deploykit.logtail import meaningful_lines

    lines = meaningful_lines(stderr)
    return lines[-1] if lines else "no output"


def _run_live(args: list[str], timeout: float) -> dict[str, Any]:
    """`python -m deploykit.vllm_args ARGS` in this interpreter; its one result line, parsed."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "deploykit.vllm_args", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONWARNINGS": "ignore"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OptionTableUnavailable(f"vLLM's parser could not be run: {exc}") from None
    result = _read_result(done.stdout)
    if result is None:
        raise OptionTableUnavailable(
            f"vLLM's parser could not be loaded (exit {done.returncode}): {_last_error_line(done.stderr)}"
        )
    return result


def build_table() -> dict[str, Any]:
    """Read the installed vLLM's `vllm serve` parser in a child process (imports vLLM there, not here)."""
    table = _run_live(["table"], BUILD_TIMEOUT_S)["table"]
    assert isinstance(table, dict)
    return table


def load_table(cache_dir: Path | None = None) -> dict[str, Any]:
    """The option table of the installed vLLM: from the cache, else built once and cached."""
    version = installed_vllm_version()
    if version is None:
        raise OptionTableUnavailable("vLLM is not installed here")
    path = table_path(version, cache_dir)
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
        if (
            isinstance(cached, dict)
            and cached.get("schema") == TABLE_SCHEMA
            and cached.get("vllm_version") == version
        ):
            return cached
    except (OSError, ValueError):
        pass  # missing or damaged: rebuild
    table = build_table()
    if table.get("schema") != TABLE_SCHEMA or table.get("vllm_version") != version:
        raise OptionTableUnavailable(
            f"vLLM's parser reported schema {table.get('schema')} of vLLM {table.get('vllm_version')}, "
            f"expected schema {TABLE_SCHEMA} of vLLM {version}"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        partial.write_text(json.dumps(table), encoding="utf-8")
        os.replace(partial, path)  # atomic: a concurrent reader sees the old file or the whole new one
    except OSError:
        pass  # an unwritable cache costs the next run another build, nothing else
    return table


def check_live(argv: Sequence[str]) -> str:
    """vLLM's own parser, in a child process; returns its module name or raises ArgvRejected."""
    result = _run_live(["check", *argv], BUILD_TIMEOUT_S)
    if not result.get("ok"):
        raise ArgvRejected(str(result.get("detail")))
    return str(result.get("detail"))


def target_table(vllm_version: str | None, cache_dir: Path | None = None) -> tuple[dict[str, Any], str, bool]:
    """The option table of the vLLM `vllm_version` names (None: the installed one), how it was found, and
    whether that vLLM is the installed one (whose live parser may then decide what the table cannot).

    Raises OptionTableUnavailable when no table of that vLLM is shipped and it is not installed here.
    """
    installed = installed_vllm_version()
    target = vllm_version or installed
    if target is None:
        raise OptionTableUnavailable(
            "vLLM is not installed here and the plan names no vLLM version: set the profile's vllm_version "
            "or pass --facts from the target host"
        )
    from deploykit.vllm_compat import same_release

    is_installed = installed is not None and same_release(target, installed)
    shipped = shipped_option_table(target)
    if shipped is not None:
        return shipped, "shipped option table", is_installed
    if is_installed:
        return load_table(cache_dir), "cached option table", True
    if newer_than_known(target):
        return (
            dict(shipped_option_table(NEWEST_KNOWN_RELEASE) or {}),
            f"{NEWEST_TABLE_HOW} (vLLM {NEWEST_KNOWN_RELEASE}; none is shipped for {target})",
            False,
        )
    raise OptionTableUnavailable(
        f"deploykit ships no `vllm serve` option table for vLLM {target} (it has "
        f"{', '.join(SUPPORTED_VLLM_RELEASES)}) and the installed vLLM is {installed or 'none'}: plan on a "
        "host that runs it, or target a supported release"
    )


def check_serve_argv(
    argv: Sequence[str], cache_dir: Path | None = None, *, vllm_version: str | None = None
) -> Verdict:
    """Check `argv` (`vllm serve ...`) as the parser of vLLM `vllm_version` (None: the installed vLLM)
    would; raise ArgvRejected with that parser's message. Never imports vLLM in this process.

    The shipped table of that release decides; the installed vLLM's own parser (a child process) is used
    only when the target is installed and either no table is shipped for it or the table cannot decide an
    argument. For a target that is not installed, such an argument is named in the verdict as unchecked.
    Raises OptionTableUnavailable when there is no table of the target vLLM (or its parser cannot be read).
    """
    table, how, is_installed = target_table(vllm_version, cache_dir)
    version = str(table["vllm_version"])  # a shipped table's is its release (0.32.0), a cached one's exact
    try:
        check_with_table(table, argv)
    except NeedsLiveParser as why:
        if is_installed:
            return Verdict(check_live(argv), version, f"vLLM's live parser: {why}")
        return Verdict(
            str(table["parser_module"]),
            version,
            f"{how}; not checked: {why}, which only vLLM {version}'s own parser decides",
        )
    return Verdict(str(table["parser_module"]), version, how)


# --- what each supported release accepts (for checks that name flags or variables of a release) -------


def _shipped_or_fail(vllm_version: str) -> dict[str, Any]:
    table = shipped_option_table(vllm_version)
    if table is None:
        raise OptionTableUnavailable(
            f"deploykit ships no table for vLLM {vllm_version} (it has {', '.join(SUPPORTED_VLLM_RELEASES)})"
        )
    return table


def known_serve_flags(vllm_version: str) -> frozenset[str]:
    """Every option spelling `vllm serve` of that release accepts in full (abbreviations aside), the
    negative forms included (`--no-x`; for 0.33's enable/disable flags `--disable-x` and `--no-enable-x`
    too). From the shipped table; OptionTableUnavailable for a release without one."""
    flags: set[str] = set()
    for entry in _shipped_or_fail(vllm_version)["actions"]:
        options = [str(o) for o in entry["options"]]
        flags.update(options)
        if entry["kind"] == "boolean_optional":
            flags.update("--no-" + o[2:] for o in options if o.startswith("--"))
    return frozenset(flags)


def known_env_vars(vllm_version: str) -> frozenset[str]:
    """The environment variables that release's `vllm/envs.py` defines (read with `ast` when the table was
    generated, never imported). OptionTableUnavailable for a release without a shipped table."""
    names = shipped_env_vars(vllm_version)
    if names is None:
        _shipped_or_fail(vllm_version)
        raise OptionTableUnavailable(f"the shipped table of vLLM {vllm_version} lists no variables")
    return names
