"""A side deploykit starts itself: a profile's plan launched as `serve` launches it (same environment,
secrets and model preparation), on a free loopback port, optionally with another vLLM environment's `vllm`
(`--candidate-python`), and stopped when the gate has measured it. A throwaway server: no restarts, no canary.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from deploykit import net
from deploykit.endpoint import Endpoint
from deploykit.errors import UsageError

if TYPE_CHECKING:
    from deploykit.plan import Plan
    from deploykit.probe.facts import ProbeFacts
    from deploykit.profile.schema import LoadedProfile
    from deploykit.serve.launch import ServerProcess

_VERSION_ASK_S = 60.0


def environment_vllm(python: Path) -> str:
    """The vLLM release installed beside another environment's Python (what its `vllm` will serve)."""
    if not python.is_file() or not os.access(python, os.X_OK):
        raise UsageError(f"--candidate-python {python}: not an executable file")
    if not (python.parent / "vllm").is_file():
        raise UsageError(f"--candidate-python {python}: no `vllm` command beside it ({python.parent}/vllm)")
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
            capture_output=True,
            text=True,
            timeout=_VERSION_ASK_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--candidate-python {python}: could not ask it for its vLLM: {exc}") from None
    version = done.stdout.strip()
    if done.returncode != 0 or not version or len(version) > 64 or not version.isprintable():
        raise UsageError(f"--candidate-python {python}: it has no vLLM installed (`vllm` distribution)")
    return version


@dataclass
class Launched:
    server: ServerProcess
    endpoint: Endpoint
    plan: Plan
    startup_s: float

    def stop(self) -> None:
        self.server.stop()


def launch(
    loaded: LoadedProfile,
    facts: ProbeFacts,
    *,
    python: Path | None,
    log_dir: Path,
    say: Callable[[str], None],
) -> Launched:
    """Plan, prepare and start the profile's vLLM (with `python`'s environment when given) and wait until it
    answers /health; a plan that refuses, or a vLLM that dies or stays silent past the profile's start-up
    timeout, ends here with the reason (its last log lines)."""
    from deploykit.argv import value_or, with_port
    from deploykit.plan import make_plan
    from deploykit.serve.stages import (
        check_launchable,
        check_plan,
        ensure_model,
        launch_environment,
        profile_endpoint,
        start_vllm,
        wait_healthy,
    )

    profile = loaded.profile
    if python is not None:
        facts = facts.model_copy(update={"vllm_version": environment_vllm(python)})
    plan = make_plan(loaded, facts)
    check_plan(plan)
    check_launchable(plan)
    host = value_or(plan.argv, "--host", "127.0.0.1")
    if net.listens_beyond_loopback(host):
        raise UsageError(
            f"{loaded.path}: the gate starts its servers on loopback only; this profile binds {host}: give "
            "the gate a running server instead (--url, --baseline-url)"
        )
    port = net.free_port(host)
    argv = with_port(plan.argv, port)
    if python is not None:
        argv[0] = str(python.parent / "vllm")
    env = launch_environment(plan, os.environ)
    ensure_model(plan, profile.model.source, say)
    log_path = log_dir / f"gate-{profile.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{port}.log"
    server = start_vllm(argv, env, log_path=log_path, host=host, port=port)
    say(f"{profile.name}: vLLM {plan.facts.vllm_version} started, pid {server.pid}, log {log_path}")
    try:
        startup = wait_healthy(server, profile.deploy.startup_timeout_s)
    except BaseException:
        server.stop()
        raise
    say(f"{profile.name}: healthy after {startup:.1f} s at {server.base_url}")
    return Launched(
        server=server, endpoint=profile_endpoint(profile, server.base_url), plan=plan, startup_s=startup
    )
