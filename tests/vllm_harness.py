"""Start a real `vllm serve` (the CPU build) on a free loopback port for tests; stop it with nothing left."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from deploykit.net import free_port
from deploykit.serve.launch import LaunchError, ServerProcess, start_server

REPO = Path(__file__).resolve().parents[1]
# A bound, not an expectation: the tiny model is healthy in 20-60 s here, but a start took 221 s+ once while
# two CPU hogs and a second test session shared the 2 cores. Only a server that never comes up should fail.
STARTUP_TIMEOUT_S = float(os.environ.get("DEPLOYKIT_TEST_STARTUP_TIMEOUT", "600"))


def vllm_executable() -> str:
    candidate = Path(sys.executable).parent / "vllm"
    found = str(candidate) if candidate.exists() else shutil.which("vllm")
    if not found:
        raise RuntimeError("the `vllm` command is not installed; run `make test` to build .venv")
    return found


def base_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("DEPLOYKIT_FIXES", None)
    env.update(extra or {})
    return env


def tiny_serve_args(model: Path, served_name: str = "tiny", max_model_len: int = 1024) -> list[str]:
    return [
        str(model),
        "--served-model-name",
        served_name,
        "--dtype",
        "float32",
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        "64M",
        "--generation-config",
        "vllm",
    ]


@dataclass
class RunningServer:
    process: ServerProcess
    served_name: str
    startup_s: float

    @property
    def base_url(self) -> str:
        return self.process.base_url

    def client(self, timeout: float = 120.0) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=timeout)

    def completion_ids(self, prompt: str | list[int], max_tokens: int = 8, **body: object) -> list[int]:
        payload = {
            "model": self.served_name,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "return_token_ids": True,
            **body,
        }
        with self.client() as client:
            response = client.post("/v1/completions", json=payload)
        response.raise_for_status()
        return list(response.json()["choices"][0]["token_ids"])


@contextmanager
def running_vllm(
    serve_args: Sequence[str],
    *,
    served_name: str = "tiny",
    env: Mapping[str, str] | None = None,
    log_dir: Path | None = None,
    vllm_command: Sequence[str] | None = None,
    drop_env: Sequence[str] = (),
) -> Iterator[RunningServer]:
    """A real vLLM server for the duration of the block. The log is kept for post-mortems.

    `vllm_command` replaces `[.venv/bin/vllm]` (e.g. another Python's `-m vllm.entrypoints.cli.main`);
    `drop_env` names variables the server must not inherit from the test process (PYTHONPATH, say)."""
    port = free_port()
    log_dir = log_dir or REPO / ".deploykit-cache" / "test-logs"
    log_path = log_dir / f"vllm-{port}-{int(time.time())}.log"
    command = list(vllm_command) if vllm_command is not None else [vllm_executable()]
    argv = [*command, "serve", *serve_args, "--host", "127.0.0.1", "--port", str(port)]
    server_env = base_env(env)
    for name in drop_env:
        if name not in (env or {}):
            server_env.pop(name, None)
    process = start_server(argv, server_env, log_path=log_path, host="127.0.0.1", port=port)
    try:
        try:
            startup = process.wait_healthy(STARTUP_TIMEOUT_S)
        except LaunchError as exc:
            raise RuntimeError(f"{exc}\n--- vLLM log tail ({log_path}) ---\n{exc.log_tail}") from exc
        yield RunningServer(process=process, served_name=served_name, startup_s=startup)
    finally:
        process.stop()
