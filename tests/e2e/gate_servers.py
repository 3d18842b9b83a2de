"""Several real vLLM servers started at once for tests/e2e/test_gate_e2e.py: on 2 cores three tiny servers
are healthy together well before three started one after another (much of a start is one process waiting
or importing on one core), and an idle server costs almost nothing (~2 % of a core)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from deploykit.net import free_port
from deploykit.serve.launch import LaunchError, ServerProcess, start_server
from tests.vllm_harness import REPO, STARTUP_TIMEOUT_S, RunningServer, base_env, vllm_executable


@dataclass
class ServerSpec:
    name: str
    serve_args: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)


@contextmanager
def running_vllms(
    specs: Sequence[ServerSpec], served_name: str = "tiny"
) -> Iterator[dict[str, RunningServer]]:
    """Every spec's `vllm serve` started at once on its own free loopback port, each waited for until
    /health answers; all stopped at the end (or as soon as one fails to start), nothing left running."""
    log_dir = REPO / ".deploykit-cache" / "test-logs"
    started: dict[str, tuple[ServerProcess, Path]] = {}
    try:
        for spec in specs:
            port = free_port()
            log_path = log_dir / f"vllm-{port}-{int(time.time())}.log"
            argv = [vllm_executable(), "serve", *spec.serve_args, "--host", "127.0.0.1", "--port", str(port)]
            process = start_server(argv, base_env(spec.env), log_path=log_path, host="127.0.0.1", port=port)
            started[spec.name] = (process, log_path)
        running = {}
        for name, (process, log) in started.items():
            try:
                startup = process.wait_healthy(STARTUP_TIMEOUT_S)
            except LaunchError as exc:
                raise RuntimeError(f"{name}: {exc}\n--- vLLM log tail ({log}) ---\n{exc.log_tail}") from exc
            running[name] = RunningServer(process=process, served_name=served_name, startup_s=startup)
        yield running
    finally:
        for process, _ in started.values():
            process.stop()
