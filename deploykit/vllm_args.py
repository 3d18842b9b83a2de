"""vLLM's own `vllm serve` parser, live: imports vLLM, so it runs in a child process of the CLI.

Two jobs, both reached as `python -m deploykit.vllm_args` from deploykit.vllm_options:

- `table`: describe every option of the parser (flags, nargs, choices, types, actions) as JSON, once per
  installed vLLM version; deploykit.vllm_options caches it and checks argvs against it in-process.
- `check ARGV...`: parse one argv exactly as `vllm serve` would, for the rare argv the table cannot
  decide (an option whose type is vLLM code deploykit does not mirror), and for tests.
- `check-many`: the same for a JSON list of argvs on stdin, one vLLM import for all of them (the tests
  that hold a shipped table to a release's live parser).

The shipped tables (deploykit/vllm_tables/, one per supported release) are `table` outputs of each
release, written by tools/vllm_tables.py.

The answer is one line on stdout that starts with RESULT_PREFIX; vLLM's own chatter is ignored.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from deploykit import errors, exit_codes

# make_arg_parser / validate_parsed_serve_args moved between releases.
_PARSER_MODULES = (
    "vllm.entrypoints.launchers.cli_args",  # 0.32
    "vllm.entrypoints.common.cli_args",  # 0.33
    "vllm.entrypoints.openai.cli_args",  # older releases
)

RESULT_PREFIX = "DEPLOYKIT-RESULT "
# Bump when the table's shape or meaning changes: cached tables of other schemas are rebuilt, and the shipped
# tables must be regenerated (tools/vllm_tables.py). 2: vLLM 0.33's EnableDisableAction ("enable_disable").
TABLE_SCHEMA = 2


class ArgvRejected(errors.PlanError, ValueError):
    """vLLM's parser refused the argv; the message is vLLM's, naming the flag."""


def vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _parser_module() -> Any:
    errors = []
    for name in _PARSER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
            continue
        if hasattr(module, "make_arg_parser"):
            return module
    raise ImportError("no vLLM module provides make_arg_parser: " + "; ".join(errors))


def _make_parser(module: Any) -> argparse.ArgumentParser:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class _RaisingParser(FlexibleArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise ArgvRejected(message)

        def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
            raise ArgvRejected(message or f"vLLM's parser exited with status {status}")

        def print_help(self, file: Any = None) -> None:
            pass  # `--help` in a planned argv is a rejection, not a page of text

    parser: argparse.ArgumentParser = module.make_arg_parser(
        _RaisingParser(prog="vllm serve")  # type: ignore[no-untyped-call]
    )
    return parser


def validate_serve_argv(argv: Sequence[str]) -> str:
    """Parse `argv` (which starts with `vllm serve`) exactly as `vllm serve` would; raise ArgvRejected."""
    if len(argv) < 2 or argv[1] != "serve":
        raise ArgvRejected("the argv must start with `vllm serve`")
    module = _parser_module()
    parser = _make_parser(module)
    try:
        namespace: argparse.Namespace = parser.parse_args(list(argv[2:]))
    except SystemExit as exc:  # argparse paths that exit directly
        raise ArgvRejected(f"vLLM's parser rejected the arguments (exit {exc.code})") from None
    except (TypeError, ValueError, IndexError) as exc:  # FlexibleArgumentParser's own pre-processing
        raise ArgvRejected(str(exc) or type(exc).__name__) from None
    validate = getattr(module, "validate_parsed_serve_args", None)
    if validate is not None:
        try:
            validate(namespace)
        except (TypeError, ValueError) as exc:
            raise ArgvRejected(str(exc)) from None
    return str(module.__name__)


# --- the option table -------------------------------------------------------------------------------

# Types whose behaviour deploykit.vllm_options mirrors, by (module, qualified name). A type not listed
# is "opaque": an argv that gives that option a value is checked by the live parser instead.
_NAMED_TYPES = {
    ("builtins", "str"): "str",
    ("builtins", "int"): "int",
    ("builtins", "float"): "float",
    ("json", "loads"): "json",
    ("vllm.utils.argparse_utils", "human_readable_int"): "human_int",
    ("vllm.utils.argparse_utils", "human_readable_int_or_auto"): "human_int_or_auto",
    ("vllm.engine.arg_utils", "union_dict_and_str"): "dict_or_str",
}
# Closures that wrap another type: optional_type(T) ("" and "None" → None, else T), parse_type(T) (T).
_WRAPPERS = {
    ("vllm.engine.arg_utils", "optional_type.<locals>._optional_type"): "optional",
    ("vllm.engine.arg_utils", "parse_type.<locals>._parse_type"): "parse",
}
_ACTION_KINDS = {
    argparse._StoreAction: "store",
    argparse._StoreTrueAction: "store_true",
    argparse._StoreFalseAction: "store_false",
    argparse._StoreConstAction: "store_const",
    argparse._AppendAction: "append",
    argparse._AppendConstAction: "append_const",
    argparse._ExtendAction: "extend",
    argparse._CountAction: "count",
    argparse._HelpAction: "help",
    argparse._VersionAction: "version",
    argparse.BooleanOptionalAction: "boolean_optional",
}
_JSON_SCALARS = (str, int, float, bool, type(None))


def _type_spec(kind: Callable[..., Any] | None) -> dict[str, Any]:
    if kind is None:
        return {"kind": "none"}
    key = (getattr(kind, "__module__", ""), getattr(kind, "__qualname__", ""))
    if key in _NAMED_TYPES:
        return {"kind": _NAMED_TYPES[key]}
    if key in _WRAPPERS:
        inner = [
            c.cell_contents for c in (getattr(kind, "__closure__", None) or ()) if callable(c.cell_contents)
        ]
        if len(inner) == 1:
            return {"kind": _WRAPPERS[key], "inner": _type_spec(inner[0])}
    return {"kind": "opaque", "name": f"{key[0]}.{key[1]}"}


def _positive_options(action: argparse.Action) -> list[str]:
    """BooleanOptionalAction adds `--no-X` after each `--X`; the table keeps the options it was given."""
    options: list[str] = []
    for option in action.option_strings:
        if options and options[-1].startswith("--") and option == "--no-" + options[-1][2:]:
            continue
        options.append(option)
    return options


def _is_enable_disable(action: argparse.Action) -> bool:
    """vLLM 0.33's EnableDisableAction: a BooleanOptionalAction whose `--enable-x` also answers to
    `--disable-x` (and `--no-enable-x`, `--no-disable-x`, registered but hidden from its option strings)."""
    return isinstance(action, argparse.BooleanOptionalAction) and hasattr(action, "negative_option_strings")


def _registered_options(parser: argparse.ArgumentParser, action: argparse.Action) -> list[str]:
    """Every option string the parser answers to for `action`, the hidden ones included, in order."""
    return [option for option, owner in parser._option_string_actions.items() if owner is action]


def _action_entry(action: argparse.Action, parser: argparse.ArgumentParser) -> dict[str, Any]:
    if _is_enable_disable(action):
        negative = set(getattr(action, "negative_option_strings", ()))
        return {
            "options": _registered_options(parser, action),
            "negative_options": sorted(negative),
            "dest": action.dest,
            "kind": "enable_disable",
            "nargs": 0,
            "type": {"kind": "none"},
            "choices": None,
            "choices_opaque": False,
            "required": bool(action.required),
        }
    kind = _ACTION_KINDS.get(type(action), f"custom:{type(action).__name__}")
    choices: list[Any] | None = None
    choices_opaque = False
    if action.choices is not None:
        listed = list(action.choices)
        if all(isinstance(c, _JSON_SCALARS) for c in listed):
            choices = listed
        else:
            choices_opaque = True
    options = _positive_options(action) if kind == "boolean_optional" else list(action.option_strings)
    return {
        "options": options,
        "dest": action.dest,
        "kind": kind,
        "nargs": action.nargs,
        "type": _type_spec(action.type)
        if action.type is None or callable(action.type)
        else {"kind": "opaque"},
        "choices": choices,
        "choices_opaque": choices_opaque,
        "required": bool(action.required),
    }


class _ReadRecorder(argparse.Namespace):
    """A namespace that remembers which attributes were read (getattr and hasattr included)."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("__"):
            object.__getattribute__(self, "_deploykit_reads").add(name)
        return object.__getattribute__(self, name)


def _post_parse_dests(module: Any, parser: argparse.ArgumentParser) -> list[str]:
    """The attributes validate_parsed_serve_args reads when every option has its default value.

    The function decides from the attributes it reads; an argv that leaves each of these at its default
    takes the same path and passes as the defaults do. An argv that sets one is checked by the live
    parser. "*" (every argv goes to the live parser) when the defaults themselves fail.
    """
    validate = getattr(module, "validate_parsed_serve_args", None)
    if validate is None:
        return []
    namespace = _ReadRecorder(**vars(parser.parse_args([])))
    object.__setattr__(namespace, "_deploykit_reads", set())
    try:
        validate(namespace)
    except Exception:
        return ["*"]
    reads: set[str] = object.__getattribute__(namespace, "_deploykit_reads")
    return sorted(reads - {"_deploykit_reads"})


def option_table(vllm_version: str | None) -> dict[str, Any]:
    """Everything deploykit.vllm_options needs to parse an argv as vLLM's `vllm serve` parser would."""
    module = _parser_module()
    parser = _make_parser(module)
    actions = list(parser._actions)
    index = {id(action): i for i, action in enumerate(actions)}
    return {
        "schema": TABLE_SCHEMA,
        "vllm_version": vllm_version,
        "parser_module": module.__name__,
        "python": list(sys.version_info[:2]),
        "prog": parser.prog,
        "prefix_chars": parser.prefix_chars,
        "allow_abbrev": parser.allow_abbrev,
        "fromfile_prefix_chars": parser.fromfile_prefix_chars,
        "actions": [_action_entry(action, parser) for action in actions],
        "mutually_exclusive": [
            {"required": group.required, "actions": [index[id(a)] for a in group._group_actions]}
            for group in parser._mutually_exclusive_groups
        ],
        "post_parse_dests": _post_parse_dests(module, parser),
    }


def _check_one(argv: list[str]) -> dict[str, Any]:
    try:
        return {"ok": True, "detail": validate_serve_argv(argv)}
    except ArgvRejected as exc:
        return {"ok": False, "detail": str(exc)}


def main(args: list[str]) -> int:
    """`table` or `check ARGV...`; one RESULT_PREFIX line on stdout (vLLM may print its own lines too)."""
    from deploykit.installed import installed_vllm_version

    if args[:1] == ["table"]:
        result: dict[str, Any] = {"ok": True, "table": option_table(installed_vllm_version())}
    elif args[:1] == ["check"]:
        result = _check_one(args[1:])
    elif args[:1] == ["check-many"]:
        argvs = json.loads(sys.stdin.read())
        result = {"ok": True, "results": [_check_one([str(a) for a in argv]) for argv in argvs]}
    else:
        print(
            "usage: python -m deploykit.vllm_args table | check vllm serve ARGS... | check-many < argvs.json",
            file=sys.stderr,
        )
        return exit_codes.USAGE
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + "\n")
    sys.stdout.flush()
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
