"""Which vLLM release removed an environment variable or a `vllm serve` option, for a target release.

Two sources, read the same way:
- the shipped release tables (deploykit.vllm_tables): a name one table defines and the next shipped table
  does not went in that next release (`VLLM_USE_V2_MODEL_RUNNER`: 0.34.0). Options are compared as every
  spelling the release's parser accepts (deploykit.vllm_options.known_serve_flags), so a `--no-x` that 0.33
  hid from its option strings while still accepting it is no removal. Of the variables, only vLLM's own
  (`VLLM_...`) count: a name such as `CUDA_VISIBLE_DEVICES` or `LD_LIBRARY_PATH` leaving vllm/envs.py still
  means something to the process;
- the history beside the tables (vllm_tables/removed-before-0.32.0.json): what went before the oldest table,
  each entry with its release, its pull request, what replaces it and the evidence. A name ending in `*` is a
  prefix (`VLLM_TORCH_PROFILER_*`).

A removal applies to a target at or past its release, unless the target's own table (the newest shipped one
at or below it) defines the name again. An unreadable or unknown target has no removals: nothing is refused on
a guess. `make vllm-release VERSION=X` adds X's table, and with it every removal X made.
"""

from __future__ import annotations

import functools
import itertools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from deploykit import argv as argv_reader
from deploykit.vllm_compat import RUNNER_ENV, parse_version
from deploykit.vllm_tables import SUPPORTED_VLLM_RELEASES, shipped_env_vars

HISTORY_FILE = "removed-before-0.32.0.json"
HISTORY_SCHEMA = 1
VLLM_PREFIX = "VLLM_"  # the variables vLLM owns: nothing else reads them
Kind = Literal["env", "option"]

# What replaces a name the tables show removed, where deploykit knows (a table only says that it went).
_AFTER_TABLES: dict[str, tuple[str | None, str]] = {
    RUNNER_ENV: (
        None,
        "the V2 model runner is the only one: 0.34 refuses =0 at start-up and ignores =1",
    ),
}


@dataclass(frozen=True)
class Removal:
    """One name a vLLM release removed: `release` is the first release without it."""

    kind: Kind
    name: str  # `VLLM_X`, `--flag`, or a prefix ending in `*`
    release: str
    instead: str | None = None  # what replaces it, as words (None: nothing does)
    note: str = ""
    source: str = ""  # where the release comes from: a pull request, or the two tables compared

    @property
    def is_prefix(self) -> bool:
        return self.name.endswith("*")

    def matches(self, name: str) -> bool:
        return name.startswith(self.name[:-1]) if self.is_prefix else name == self.name

    def explained(self) -> str:
        """`vLLM 0.15.0 removed it (vllm-project/vllm#32812): use `--attention-backend` instead`, or for a
        name nothing replaces, why (`nothing replaces it, the V1 engine is the only one ...; remove it`)."""
        text = f"vLLM {self.release} removed it ({self.source})"
        if self.instead:
            return f"{text}: use {self.instead} instead"
        return f"{text}: nothing replaces it, {self.note}; remove it" if self.note else f"{text}: remove it"


def _key(release: str) -> tuple[int, int, int]:
    parsed = parse_version(release)
    if parsed is None:
        raise ValueError(f"not a vLLM release: {release!r}")
    return parsed


@functools.cache
def history() -> tuple[Removal, ...]:
    """The removals before the oldest shipped table, as the history file records them."""
    text = resources.files("deploykit.vllm_tables").joinpath(HISTORY_FILE).read_text(encoding="utf-8")
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("schema") != HISTORY_SCHEMA:
        raise ValueError(f"deploykit/vllm_tables/{HISTORY_FILE} is not a schema {HISTORY_SCHEMA} file")
    found: list[Removal] = []
    sections: tuple[tuple[Kind, str], ...] = (("env", "env_vars"), ("option", "options"))
    for kind, section in sections:
        entries: dict[str, dict[str, Any]] = data[section]
        for name, entry in entries.items():
            _key(entry["release"])  # a release, or the file is refused
            found.append(
                Removal(
                    kind=kind,
                    name=name,
                    release=entry["release"],
                    instead=entry.get("instead"),
                    note=entry.get("note", ""),
                    source=entry["pr"],
                )
            )
    return tuple(found)


def _serve_flags(release: str) -> frozenset[str] | None:
    """Every option spelling `vllm serve` of a shipped release accepts; None where the option tables are not
    carried (the chart's plugin wheel leaves them out: a pod checks no argv)."""
    from deploykit.vllm_options import OptionTableUnavailable, known_serve_flags

    try:
        return known_serve_flags(release)
    except OptionTableUnavailable:
        return None


@functools.cache
def table_removals() -> tuple[Removal, ...]:
    """The removals the shipped tables show, release after release (0.32 → 0.33 → 0.34 → ...)."""
    found: list[Removal] = []
    releases = SUPPORTED_VLLM_RELEASES
    for before, release in itertools.pairwise(releases):
        old, new = shipped_env_vars(before) or frozenset(), shipped_env_vars(release) or frozenset()
        for name in sorted(old - new):
            if name.startswith(VLLM_PREFIX):
                instead, note = _AFTER_TABLES.get(name, (None, ""))
                source = f"gone from its vllm/envs.py; shipped tables {before} → {release}"
                found.append(Removal("env", name, release, instead, note, source))
        old_flags, new_flags = _serve_flags(before), _serve_flags(release)
        if old_flags is not None and new_flags is not None:
            for flag in sorted(old_flags - new_flags):
                instead, note = _AFTER_TABLES.get(flag, (None, ""))
                source = f"gone from its `vllm serve` parser; shipped tables {before} → {release}"
                found.append(Removal("option", flag, release, instead, note, source))
    return tuple(found)


def removals() -> tuple[Removal, ...]:
    """Every removal known: the history's, then the tables'."""
    return history() + table_removals()


def _known_release(parsed: tuple[int, int, int]) -> str | None:
    """The newest shipped release at or below the target: whose table says what the target still has."""
    below = [release for release in SUPPORTED_VLLM_RELEASES if _key(release) <= parsed]
    return below[-1] if below else None


def _latest(found: list[Removal]) -> Removal | None:
    """Of several removals of one name (removed, brought back, removed again), the one in force."""
    return max(found, key=lambda removal: _key(removal.release), default=None)


def env_removal(name: str, version: str | None) -> Removal | None:
    """The removal of environment variable `name` in force for a target vLLM `version`, or None: the target
    (or the newest table at or below it) defines it, nothing removed it by then, or the version is unknown."""
    parsed = parse_version(version)
    if parsed is None:
        return None
    known = _known_release(parsed)
    if known is not None and name in (shipped_env_vars(known) or frozenset()):
        return None
    return _latest(
        [r for r in removals() if r.kind == "env" and r.matches(name) and _key(r.release) <= parsed]
    )


def option_removal(word: str, version: str | None) -> Removal | None:
    """The removal of the `vllm serve` option an argv word sets (`--task`, `--task=embed`, `--no-x` of a
    removed `--x`, underscores for dashes) in force for a target vLLM `version`, or None: a value, an option
    the target's parser (the newest table at or below it) accepts, or one nothing removed by then."""
    parsed = parse_version(version)
    flag = argv_reader.flag_name(word)
    if parsed is None or flag is None:
        return None
    known = _known_release(parsed)
    accepted = _serve_flags(known) if known is not None else None
    if accepted is not None and flag in accepted:
        return None
    spellings = {flag, "--" + flag.removeprefix("--no-")} if flag.startswith("--no-") else {flag}
    return _latest(
        [
            r
            for r in removals()
            if r.kind == "option" and any(r.matches(s) for s in spellings) and _key(r.release) <= parsed
        ]
    )


def env_removals_for(version: str | None) -> list[Removal]:
    """Every variable removal in force for a target (what a chart refuses in `extraEnv` and `env`): a removal
    at or before the target, less the names its table defines again. A prefix keeps its entry; the names the
    target defines under it are `defined_under(prefix)`'s."""
    parsed = parse_version(version)
    if parsed is None:
        return []
    known = _known_release(parsed)
    defined = (shipped_env_vars(known) or frozenset()) if known is not None else frozenset()
    latest: dict[str, Removal] = {}
    for removal in removals():
        if removal.kind != "env" or _key(removal.release) > parsed:
            continue
        if not removal.is_prefix and removal.name in defined:
            continue
        held = latest.get(removal.name)
        if held is None or _key(held.release) < _key(removal.release):
            latest[removal.name] = removal
    return [latest[name] for name in sorted(latest)]


def defined_under(prefix: Removal, version: str | None) -> list[str]:
    """The names a prefix removal matches that the target's table defines again: never refused."""
    parsed = parse_version(version)
    known = _known_release(parsed) if parsed is not None else None
    if known is None or not prefix.is_prefix:
        return []
    return sorted(name for name in shipped_env_vars(known) or frozenset() if prefix.matches(name))


# The chart's copy of `env_removals_for` (deploykit.render.helm writes it under files/; the chart's
# templates/_removed_env.tpl refuses those names in `extraEnv` and `env` when the release is installed).
CHART_FILE = "vllm-removed-env.json"


def chart_json(version: str | None) -> str:
    """The variable removals in force for the chart's vLLM, as the chart reads them: each name (a prefix
    without its `*`, `prefix` true), the names under a prefix the release defines again (`except`), and the
    one line a refusal gives (`why`)."""
    entries = [
        {
            "name": removal.name.removesuffix("*"),
            "prefix": removal.is_prefix,
            "release": removal.release,
            "except": defined_under(removal, version),
            "why": removal.explained(),
        }
        for removal in env_removals_for(version)
    ]
    document = {"vllmVersion": version or "unknown", "removed": entries}
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
