"""Check a `vllm serve` argv as the parser of the vLLM a plan targets would, without importing vLLM.

`deploykit plan` validates every argv by default, against the vLLM the plan targets (the profile's or the
facts' vLLM version), which need not be the one installed where the plan is made. Each supported release's
option table (every flag, its action, nargs, choices and type, read from that release's own parser) ships
with deploykit (deploykit/vllm_tables, SUPPORTED_VLLM_RELEASES). For a target without a shipped table that
is the installed vLLM, the table is read from its parser in a child process (`python -m
deploykit.vllm_args table`; importing vLLM costs ~6 s) and cached as JSON in the user cache directory
(DEPLOYKIT_CACHE_DIR overrides it), keyed by the vLLM version and TABLE_SCHEMA. Any other target cannot be
checked here, and the check says so.

The check rebuilds a stdlib `argparse` parser from the table and runs it after the same pre-processing
vLLM's FlexibleArgumentParser does (underscores to dashes, `-O3`, dotted `--x.y` JSON arguments), so
abbreviations, `--flag=value`, `--no-flag`, nargs and missing values behave exactly as in vLLM. The types
vLLM uses most (int, float, JSON, human-readable ints, optional wrappers) are mirrored here. An argv that
gives a value to an option whose type or action is vLLM code not mirrored here, or sets an option that
vLLM's post-parse checks read, or uses `--config`, is handed to vLLM's live parser in a child process
when the target is the installed vLLM: slower, never wrong. For another target that part is reported as
not checked (the verdict says which). tests/test_vllm_options.py holds the table to the live parser on a
corpus of argvs, for every supported release (tests/vllm_releases runs it against each).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from deploykit.installed import installed_vllm_version
from deploykit.vllm_args import RESULT_PREFIX, TABLE_SCHEMA, ArgvRejected
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


class OptionTableUnavailable(RuntimeError):
    """vLLM's parser could not be read (vLLM missing or broken); the message says why."""


class _NeedsLiveParser(Exception):
    """The table cannot decide this argv; vLLM's live parser must."""


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


# --- types vLLM uses, mirrored ----------------------------------------------------------------------


def human_readable_int(value: str) -> int:
    """vllm.utils.argparse_utils.human_readable_int: '1k' → 1000, '1K' → 1024, '25.6k' → 25600."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
        binary = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
        if suffix in decimal:
            return int(float(number) * decimal[suffix])
        try:
            return int(number) * binary[suffix]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}"
            ) from exc
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    value = value.strip()
    if value == "-1" or value.lower() == "auto":
        return -1
    return human_readable_int(value)


def _opaque(name: str) -> Callable[[str], Any]:
    def check(value: str) -> Any:
        raise _NeedsLiveParser(f"{name} checks this value")

    return check


def _type_function(spec: dict[str, Any]) -> Callable[[str], Any] | None:
    kind = spec["kind"]
    if kind == "none":
        return None
    simple: dict[str, Callable[[str], Any]] = {
        "str": str,
        "int": int,
        "float": float,
        "json": json.loads,
        "human_int": human_readable_int,
        "human_int_or_auto": human_readable_int_or_auto,
    }
    if kind in simple:
        return simple[kind]
    if kind == "dict_or_str":
        optional_json = _wrapped("optional", json.loads)

        def dict_or_str(value: str) -> Any:
            if not re.match(r"(?s)^\s*{.*}\s*$", value):
                return str(value)
            return optional_json(value)

        return dict_or_str
    if kind in ("optional", "parse"):
        inner = _type_function(spec["inner"])
        if inner is None:
            return _opaque("a wrapped type")
        return _wrapped(kind, inner)
    return _opaque(str(spec.get("name", "an unknown type")))


def _wrapped(kind: str, inner: Callable[[str], Any]) -> Callable[[str], Any]:
    """vllm.engine.arg_utils.parse_type / optional_type: ValueError becomes ArgumentTypeError."""

    def parse(value: str) -> Any:
        if kind == "optional" and value in ("", "None"):
            return None
        try:
            return inner(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"Value {value} cannot be converted to {inner}.") from exc

    return parse


# --- the parser, rebuilt ----------------------------------------------------------------------------


class _TableParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ArgvRejected(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise ArgvRejected(message or f"vLLM's parser exited with status {status}")


class _HelpAction(argparse.Action):
    """`--help` makes `vllm serve` print help and exit: not a launch."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        parser.exit()


class _OpaqueAction(argparse.Action):
    """An action class of vLLM's that this module does not mirror."""

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        raise _NeedsLiveParser(f"{'/'.join(self.option_strings)} has its own action")


class _EnableDisableAction(argparse.Action):
    """vLLM 0.33's EnableDisableAction: every spelling sets the flag, a negative one (`--disable-x`,
    `--no-x`, `--no-enable-x`) to False, any other to True; never takes a value."""

    def __init__(self, option_strings: list[str], dest: str, negative_options: Sequence[str], **kwargs: Any):
        super().__init__(option_strings, dest, nargs=0, **kwargs)
        self.negative_options = frozenset(negative_options)

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: str | None = None
    ) -> None:
        setattr(namespace, self.dest, option_string not in self.negative_options)


class _LoRAModulesAction(argparse.Action):
    """vLLM's LoRAParserAction: `name=path` items here; JSON items go to the live parser."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, *args: Any) -> None:
        if isinstance(values, str):
            raise _NeedsLiveParser("--lora-modules got a single value")
        for item in values or []:
            if item in (None, ""):
                continue
            if not ("=" in item and "," not in item):
                raise _NeedsLiveParser("--lora-modules has a JSON item")
        setattr(namespace, self.dest, values)


_STORE_LIKE = {"store", "append", "extend"}
_FLAG_KINDS = {"store_true", "store_false", "count"}
# vLLM's own action classes: mirrored, treated as the stdlib action they behave like, or opaque.
_CUSTOM_ACTIONS: dict[str, type[argparse.Action] | str] = {
    "custom:LoRAParserAction": _LoRAModulesAction,
    "custom:DeprecatedLogConfigFileAction": "store",  # stores its value and warns
    "store_const": "store_true",  # takes no value; which constant it stores does not matter here
    "append_const": "store_true",
}


def _add_action(container: Any, entry: dict[str, Any]) -> None:
    custom = _CUSTOM_ACTIONS.get(entry["kind"])
    kind: str = custom if isinstance(custom, str) else entry["kind"]
    options: list[str] = entry["options"]
    names: list[str] = options or [entry["dest"]]
    kwargs: dict[str, Any] = {"default": argparse.SUPPRESS}
    if options:
        kwargs["dest"] = entry["dest"]
        kwargs["required"] = entry["required"]
    if kind == "help":
        container.add_argument(*names, action=_HelpAction, nargs=0, default=argparse.SUPPRESS)
    elif kind in _FLAG_KINDS:
        container.add_argument(*names, action=kind, **kwargs)
    elif kind == "boolean_optional":
        container.add_argument(*names, action=argparse.BooleanOptionalAction, **kwargs)
    elif kind == "enable_disable":
        container.add_argument(
            *names, action=_EnableDisableAction, negative_options=entry["negative_options"], **kwargs
        )
    elif kind in _STORE_LIKE or isinstance(custom, type) or kind.startswith("custom:") or kind == "version":
        action: str | type[argparse.Action] = kind if kind in _STORE_LIKE else _OpaqueAction
        if isinstance(custom, type):
            action = custom
        type_function = _type_function(entry["type"])
        choices = entry["choices"]
        if entry["choices_opaque"]:
            type_function, choices = _opaque("an option with choices of its own type"), None
        nargs = 0 if kind == "version" else entry["nargs"]
        kwargs.update(nargs=nargs, type=type_function, choices=choices)
        if not options and entry["nargs"] not in ("?", "*"):
            kwargs.pop("default")  # a required positional takes no default
        container.add_argument(*names, action=action, **kwargs)
    else:
        raise OptionTableUnavailable(f"the option table has an action kind deploykit does not know: {kind}")


def rebuild_parser(table: dict[str, Any]) -> argparse.ArgumentParser:
    parser = _TableParser(
        prog=str(table["prog"]),
        prefix_chars=str(table["prefix_chars"]),
        allow_abbrev=bool(table["allow_abbrev"]),
        fromfile_prefix_chars=table["fromfile_prefix_chars"],
        add_help=False,
        conflict_handler="resolve",
    )
    group_of: dict[int, Any] = {}
    for group in table["mutually_exclusive"]:
        container = parser.add_mutually_exclusive_group(required=bool(group["required"]))
        for index in group["actions"]:
            group_of[index] = container
    for index, entry in enumerate(table["actions"]):
        _add_action(group_of.get(index, parser), entry)
    return parser


# --- FlexibleArgumentParser's pre-processing, mirrored (vllm/utils/argparse_utils.py, parse_args) ----


def _flexible_args(args: list[str]) -> list[str]:
    if "--config" in args or any(re.match(r"^--config(=.+|$)", a) for a in args):
        raise _NeedsLiveParser("--config reads a file")
    dashes = re.compile(r"(?<=--)[^\.]*")
    processed: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--help="):
            processed.append("--help")
        elif arg.startswith("--"):
            if "=" in arg:
                key, text = arg.split("=", 1)
                processed.append(f"{dashes.sub(lambda m: m.group(0).replace('_', '-'), key, count=1)}={text}")
            else:
                processed.append(dashes.sub(lambda m: m.group(0).replace("_", "-"), arg, count=1))
        elif arg.startswith("-O") and arg != "-O":
            processed += ["--optimization-level", arg[3:] if arg[2] == "=" else arg[2:]]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            processed.append("--optimization-level")
        else:
            processed.append(arg)

    delete: set[int] = set()
    dict_args: dict[str, dict[str, Any]] = {}
    for i, arg in enumerate(processed):
        if i in delete:
            continue
        if arg.startswith("--") and "." not in arg:
            continue
        if arg.startswith("-") and "." in arg:
            if "=" in arg:
                arg, value_str = arg.split("=", 1)
                if "." not in arg:
                    continue
            else:
                if i + 1 >= len(processed):
                    raise ArgvRejected(f"{arg} needs a value")  # vLLM: IndexError
                value_str = processed[i + 1]
                delete.add(i + 1)
            if arg.endswith("+"):
                arg = arg[:-1]
                value_str = json.dumps(list(value_str.split(",")))
            key, *keys = arg.split(".")
            value: Any
            try:
                value = json.loads(value_str)
            except json.JSONDecodeError:
                try:
                    value = human_readable_int(value_str)
                except (ValueError, argparse.ArgumentTypeError):
                    value = value_str
            for name in reversed(keys):
                value = {name: value}
            _merge(dict_args.setdefault(key, {}), value)
            delete.add(i)
    processed = [a for i, a in enumerate(processed) if i not in delete]
    for key, merged in dict_args.items():
        processed += [key, json.dumps(merged)]
    return processed


def _merge(original: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(original.get(key), dict):
            _merge(original[key], value)
        elif isinstance(value, list) and isinstance(original.get(key), list):
            original[key] += value
        else:
            original[key] = value


# --- the check --------------------------------------------------------------------------------------


def check_with_table(table: dict[str, Any], argv: Sequence[str]) -> None:
    """Raise ArgvRejected as vLLM's parser would, or _NeedsLiveParser when the table cannot decide."""
    if len(argv) < 2 or argv[1] != "serve":
        raise ArgvRejected("the argv must start with `vllm serve`")
    parser = rebuild_parser(table)
    namespace = parser.parse_args(_flexible_args(list(argv[2:])))
    post_parse: set[str] = set(table["post_parse_dests"])
    touched = ("*" in post_parse and vars(namespace)) or sorted(post_parse & set(vars(namespace)))
    if touched:
        raise _NeedsLiveParser(f"vLLM checks {', '.join(map(str, touched))} after parsing")


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
    except _NeedsLiveParser as why:
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
