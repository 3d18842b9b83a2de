"""The tier "every supported release" (tests/vllm_releases) as a command: which test modules a release's
child pytest runs, and the environment and argv it runs them in.

The tier is tests (tests/vllm_releases/test_every_release.py runs it in the suite); `make vllm-release`
(tools/vllm_release.py) runs the same child over a new release. What both need lives here, so that the
tool names the test modules as paths and a plugin by name, and imports nothing from tests/.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tools import vllm_tables

CHILD_ENV = "DEPLOYKIT_RELEASE_TIER_CHILD"  # set in a child run: it must not start children of its own
EXPECT_ENV = "DEPLOYKIT_EXPECT_VLLM_RELEASE"  # the release the child must import (test_release_checks)
CHILD_PLUGIN = "tests.vllm_releases.child_plugin"  # 0.34's x86-without-Triton refusal (its docstring)
# What a child runs, for its release: fix targets, decision rules, status route and shipped facts; the
# shipped option table against the release's live parser; the module-level fix tests (no server).
MODULES = (
    "tests/vllm_releases/test_release_checks.py",
    "tests/test_vllm_options.py",
    "tests/fixes/test_matmul_lora.py",
    "tests/fixes/test_fp32_projection.py",
    "tests/fixes/test_penalties.py",
    "tests/fixes/test_upstream_guard.py",
)


def child_env(release: str, cache: Path | None = None) -> dict[str, str]:
    """The environment of a child run over `release` (RuntimeError when its sources are not cached)."""
    env = vllm_tables.release_env(release, cache)
    env.update({CHILD_ENV: "1", EXPECT_ENV: release, "PYTHONWARNINGS": "ignore"})
    return env


def child_argv(*options: str) -> list[str]:
    """`python -m pytest` over MODULES in a child (run from the checkout's root); `options` go before the
    modules (`-x`)."""
    return [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", CHILD_PLUGIN,
        "-m", "not e2e", *options, *MODULES,
    ]  # fmt: skip
