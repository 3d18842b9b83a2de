"""Fixtures for the e2e tests that play pods in real podman (tests/e2e/pod_runtime.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.pod_runtime import PodRuntime, host_venv_bin, unavailable_reason


@pytest.fixture(scope="session")
def pod_runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PodRuntime]:
    """Rootful podman with its storage in this session's temp directory; skips, with the reason that
    tools/pod-runtime.sh recorded, on a machine that cannot run containers. Tears everything down."""
    parent = tmp_path_factory.getbasetemp()
    reason = unavailable_reason(parent)
    if reason:
        pytest.skip(reason)
    runtime = PodRuntime(tmp_path_factory.mktemp("podman", numbered=True))
    try:
        yield runtime
    finally:
        runtime.close()


@pytest.fixture(scope="session")
def pod_base_image(pod_runtime: PodRuntime) -> str:
    """The cached Debian root as `localhost/deploykit-pod-base:bookworm`, PATH with this run's venv first."""
    return pod_runtime.import_image("deploykit-pod-base:bookworm", path_prefix=[host_venv_bin()])
