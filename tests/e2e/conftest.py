"""Fixtures for the e2e tests that play pods in real podman (tests/e2e/pod_runtime.py) and that install the
rendered systemd units under a real systemd in systemd-nspawn (tests/e2e/nspawn_runtime.py); the real model
and its one server per session (tests/e2e/real_model.py)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import unit_prefix
from tests.e2e import nspawn_runtime
from tests.e2e.nspawn_runtime import NspawnMachine
from tests.e2e.pod_runtime import PodRuntime, host_venv_bin, unavailable_reason
from tests.e2e.real_model import real_model_dir, real_model_server  # noqa: F401  (fixtures, by name)
from tests.vllm_harness import REPO


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that drifts the session's real-model server (`drifts_real_model`: the drift is permanent for
    that vLLM) runs after every other test, whatever the order of the files."""
    items.sort(key=lambda item: item.get_closest_marker("drifts_real_model") is not None)


@pytest.fixture(scope="session")
def pod_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodRuntime]:
    """Rootful podman with its storage in this session's temp directory; skips, with the reason that
    tools/pod-runtime.sh recorded, on a machine that cannot run containers. Tears everything down."""
    parent = tmp_path_factory.getbasetemp()
    reason = unavailable_reason(parent)
    if reason:
        pytest.skip(reason)
    # Podman refuses a runroot path over 50 characters, and a pytest-xdist worker's temp directory is longer:
    # a short directory of its own (close() removes it).
    runtime = PodRuntime(Path(tempfile.mkdtemp(prefix="dk-pod-")))
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.fixture(scope="session")
def pod_base_image(pod_runtime: PodRuntime) -> str:
    """The cached Debian root as `localhost/deploykit-pod-base:bookworm`, PATH with this run's venv first."""
    return pod_runtime.import_image("deploykit-pod-base:bookworm", path_prefix=[host_venv_bin()])


@pytest.fixture(scope="session")
def nspawn_machine(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[NspawnMachine]:
    """The cached Debian root booted with systemd as its PID 1 (systemd-nspawn, --volatile=overlay, its own
    /tmp, a private network), with this run's venv, its interpreter's prefix and the checkout bound read-only
    at fixed places under /opt (nspawn_runtime.CI_ROOT: wherever the checkout lies, the units' sandbox sees
    them), and a readable copy of the tiny model (`model_cache`: DEPLOYKIT_MODEL_CACHE for rendering) at the
    same path; skips, with the reason tools/nspawn-root.sh recorded, where nspawn cannot run. Powered off at
    the end: nothing of it is left running, mounted or written."""
    workdir = tmp_path_factory.mktemp("nspawn", numbered=True)
    reason = nspawn_runtime.unavailable_reason(workdir)
    if reason:
        pytest.skip(reason)
    # A system service's user must read the model: the cached tiny model's weights are root's, mode 0600, so
    # the container gets a world-readable copy, beside the render tests' prefixes (never under /root, /home or
    # /tmp, which the units' sandbox hides, wherever the checkout lies), removed at the end.
    unit_prefix.ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    share = unit_prefix.ROOT / f"nspawn-share-{os.getpid()}"
    shutil.rmtree(share, ignore_errors=True)
    shutil.copytree(tiny_model_dir, share / "models" / tiny_model_dir.name)
    for path in [share, *share.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    placed = {
        REPO: nspawn_runtime.CHECKOUT_AT,
        Path(sys.prefix): nspawn_runtime.VENV_AT,
        Path(sys.base_prefix): nspawn_runtime.PYTHON_AT,
    }
    machine = NspawnMachine(workdir, binds_ro=[share], placed_ro=placed, model_cache=share / "models")
    try:
        machine.boot()
        yield machine
    finally:
        try:
            machine.close()
        finally:
            shutil.rmtree(share, ignore_errors=True)
