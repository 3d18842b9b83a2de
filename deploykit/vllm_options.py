"""Check a `vllm serve` argv as vLLM's parser would, without importing vLLM.

`deploykit plan` validates every argv by default. Importing vLLM for that costs ~6 s (torch, triton), so
vLLM's parser is read once per installed vLLM version in a child process (`python -m
deploykit.vllm_args table`) into an option table: every flag, its action, nargs, choices and type. The
table is cached as JSON in the user cache directory (DEPLOYKIT_CACHE_DIR overrides it), keyed by the
vLLM version and TABLE_SCHEMA, so a new vLLM gets a new table.

The check rebuilds a stdlib `argparse` parser from the table and runs it after the same pre-processing
vLLM's FlexibleArgumentParser does (underscores to dashes, `-O3`, dotted `--x.y` JSON arguments), so
abbreviations, `--flag=value`, `--no-flag`, nargs and missing values behave exactly as in vLLM. The types
vLLM uses most (int, float, JSON, human-readable ints, optional wrappers) are mirrored here. An argv that
gives a value to an option whose type or action is vLLM code not mirrored here, or sets an option that
vLLM's post-parse checks read, or uses `--config`, is handed to vLLM's live parser in a child process:
slower, never wrong. tests/test_vllm_options.py holds both to the same verdicts on a corpus of argvs.
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
    how: str  # "cached option table" or "vLLM's live parser (<why>)"

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


def check_serve_argv(argv: Sequence[str], cache_dir: Path | None = None) -> Verdict:
    """Check `argv` (`vllm serve ...`) against the installed vLLM; raise ArgvRejected with vLLM's message.

    Raises OptionTableUnavailable when vLLM is missing or its parser cannot be read.
    """
    table = load_table(cache_dir)
    version = table["vllm_version"]
    try:
        check_with_table(table, argv)
    except _NeedsLiveParser as why:
        return Verdict(check_live(argv), version, f"vLLM's live parser: {why}")
    return Verdict(str(table["parser_module"]), version, "cached option table")
