"""Shared fixtures. Tiny models are built once per machine (cached); each real vLLM server is shared
by the tests of a session, because a start costs 20–60 s on a 2-core machine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.vllm_harness import REPO, RunningServer, running_vllm, tiny_serve_args

os.environ.setdefault("DEPLOYKIT_MODEL_CACHE", str(REPO / ".deploykit-cache" / "models"))
# vLLM option tables (deploykit.vllm_options): built once per vLLM version, kept out of the user cache.
os.environ.setdefault("DEPLOYKIT_CACHE_DIR", str(REPO / ".deploykit-cache"))


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from deploykit.tinymodel import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def tiny_vllm(tiny_model_dir: Path) -> Iterator[RunningServer]:
    """One plain vLLM serving the tiny model, without any deploykit fix."""
    with running_vllm(tiny_serve_args(tiny_model_dir)) as server:
        yield server
