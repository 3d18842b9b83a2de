"""Validate a `vllm serve` argv with vLLM's own argument parser. The one place `plan` imports vLLM."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from collections.abc import Sequence
from typing import Any, NoReturn

from deploykit import errors

# make_arg_parser / validate_parsed_serve_args moved between releases.
_PARSER_MODULES = (
    "vllm.entrypoints.launchers.cli_args",  # 0.32
    "vllm.entrypoints.common.cli_args",  # 0.33
    "vllm.entrypoints.openai.cli_args",  # older releases
)


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


def validate_serve_argv(argv: Sequence[str]) -> str:
    """Parse `argv` (which starts with `vllm serve`) exactly as `vllm serve` would; raise ArgvRejected."""
    if len(argv) < 2 or argv[1] != "serve":
        raise ArgvRejected("the argv must start with `vllm serve`")
    module = _parser_module()
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    class _RaisingParser(FlexibleArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise ArgvRejected(message)

        def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
            raise ArgvRejected(message or f"vLLM's parser exited with status {status}")

    parser = module.make_arg_parser(_RaisingParser(prog="vllm serve"))  # type: ignore[no-untyped-call]
    try:
        namespace: argparse.Namespace = parser.parse_args(list(argv[2:]))
    except SystemExit as exc:  # argparse paths that exit directly
        raise ArgvRejected(f"vLLM's parser rejected the arguments (exit {exc.code})") from None
    validate = getattr(module, "validate_parsed_serve_args", None)
    if validate is not None:
        try:
            validate(namespace)
        except (TypeError, ValueError) as exc:
            raise ArgvRejected(str(exc)) from None
    return str(module.__name__)
