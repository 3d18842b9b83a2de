"""A `vllm serve` parser rebuilt from an option table, without vLLM: the stdlib argparse parser with each
option's action, nargs, choices and type (the types vLLM uses most mirrored here, any other opaque), after
the pre-processing vLLM's FlexibleArgumentParser does (underscores to dashes, `-O3`, dotted `--x.y` JSON
arguments). `check_with_table` raises ArgvRejected as vLLM would, or NeedsLiveParser where only vLLM's own
parser can decide (deploykit.vllm_options hands those to it)."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from deploykit.vllm_args import ArgvRejected


class OptionTableUnavailable(RuntimeError):
    """vLLM's parser could not be read (vLLM missing or broken); the message says why."""


class NeedsLiveParser(Exception):
    """The table cannot decide this argv; vLLM's live parser must."""


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
        raise NeedsLiveParser(f"{name} checks this value")

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
        raise NeedsLiveParser(f"{'/'.join(self.option_strings)} has its own action")


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
            raise NeedsLiveParser("--lora-modules got a single value")
        for item in values or []:
            if item in (None, ""):
                continue
            if not ("=" in item and "," not in item):
                raise NeedsLiveParser("--lora-modules has a JSON item")
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
        raise NeedsLiveParser("--config reads a file")
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
    """Raise ArgvRejected as vLLM's parser would, or NeedsLiveParser when the table cannot decide."""
    if len(argv) < 2 or argv[1] != "serve":
        raise ArgvRejected("the argv must start with `vllm serve`")
    parser = rebuild_parser(table)
    namespace = parser.parse_args(_flexible_args(list(argv[2:])))
    post_parse: set[str] = set(table["post_parse_dests"])
    touched = ("*" in post_parse and vars(namespace)) or sorted(post_parse & set(vars(namespace)))
    if touched:
        raise NeedsLiveParser(f"vLLM checks {', '.join(map(str, touched))} after parsing")
