"""How far a busy vLLM stays from the `hung` verdict, and how fast a hung one reaches it (issue 31).

On the real vLLM (CPU build, tiny model, the test fault worker):
1. Busy is not hung: 8 saturating completion streams for `--seconds`, the canary's progress reader every
   2 s as in production. Reported: readings, the longest time requests waited with no token produced
   (the margin to `HUNG_AFTER_S`), and false `hung` verdicts (must be 0).
2. Hung: one request marked to block the forward pass for good (`/health` stays 200), a canary running
   every 2 s; reported: seconds from the trigger to the `hung` verdict (the bound plus at most one canary
   interval and one read).
Not part of CI (a few minutes).

    .venv/bin/python bench/bench_hung.py [--seconds 120] [--write-docs]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.benchmarks_doc import DOCS, write_section  # noqa: E402
from deploykit.canary.defaults import HUNG_AFTER_S  # noqa: E402
from deploykit.canary.rotation import rotation_for  # noqa: E402
from deploykit.canary.runner import Canary, CanaryConfig  # noqa: E402
from deploykit.canary.runtime import CanaryRuntime  # noqa: E402
from deploykit.canary.server_page import ServerPage  # noqa: E402
from deploykit.canary.settings import CanarySettings  # noqa: E402
from deploykit.endpoint import Endpoint  # noqa: E402
from deploykit.tinymodel import build_tiny_model  # noqa: E402
from tests.e2e.fault_worker import FAULT_KEY, TOKENS_ENV, WORKER_CLS  # noqa: E402
from tests.serve_helpers import completion_streams  # noqa: E402
from tests.vllm_harness import running_vllm, tiny_serve_args  # noqa: E402


def canary_for(url: str, every_s: float) -> Canary:
    return Canary(
        CanaryConfig(
            endpoint=Endpoint(url),
            served_name="tiny",
            cases=rotation_for(None),
            settings=CanarySettings(every_s=every_s, timeout_s=30.0, metrics_every_s=0),
            store=False,
        )
    )


def busy(url: str, seconds: float) -> tuple[int, float, int]:
    """(readings, the longest wait without work seen, hung verdicts) under 8 streams."""
    canary = canary_for(url, 60.0)
    longest = 0.0
    readings = 0
    take_page = canary.take_page

    def measured(page: ServerPage, now: float | None = None) -> None:
        nonlocal longest, readings
        take_page(page, now)
        if page.progress is not None:
            readings += 1
            with canary._lock:
                waiting = canary._waiting_since if canary._run_since is not None else None
                stalled = canary.progress.stalled_for(time.monotonic(), waiting)
            longest = max(longest, stalled or 0.0)

    canary.take_page = measured  # type: ignore[method-assign]
    runtime = CanaryRuntime(canary)
    with completion_streams(url, 8) as errors:
        runtime.start()
        time.sleep(seconds)
        runtime.close()
    assert not errors, errors[:3]
    hung = int(canary.metrics.hung._value.get()) + (1 if canary.state.hung else 0)
    return readings, longest, hung


def hang(url: str) -> float:
    """Seconds from the hang's trigger to the `hung` verdict, a canary running every 2 s."""
    import httpx

    canary = canary_for(url, 2.0)
    hung_at: list[float] = []
    canary.on_hung = lambda diagnosis: hung_at.append(time.monotonic())
    runtime = CanaryRuntime(canary)
    runtime.start()
    time.sleep(5)  # a few healthy runs first
    trigger = {"model": "tiny", "prompt": "hello", "max_tokens": 2, "vllm_xargs": {FAULT_KEY: "hang"}}

    def send() -> None:
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(url + "/v1/completions", json=trigger, timeout=600)

    sent = time.monotonic()
    threading.Thread(target=send, daemon=True).start()
    deadline = sent + HUNG_AFTER_S + 300
    while not hung_at and time.monotonic() < deadline:
        time.sleep(0.2)
    runtime.stop()
    assert hung_at, "no hung verdict"
    return hung_at[0] - sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=120.0, help="the 8-stream load")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    model = build_tiny_model()
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": path, TOKENS_ENV: "off"}
    with running_vllm([*tiny_serve_args(model), "--worker-cls", WORKER_CLS], env=env) as server:
        readings, longest, false_hung = busy(server.base_url, args.seconds)
        detected = hang(server.base_url)
    lines = [
        f"8 streams for {args.seconds:.0f} s: {readings} progress readings, longest wait without a token "
        f"{longest:.1f} s (bound {HUNG_AFTER_S:g} s), false `hung` verdicts: {false_hung}",
        f"a hung forward pass (canary every 2 s): `hung` {detected:.1f} s after the trigger",
    ]
    print("\n".join(lines))
    if args.write_docs:
        body = "\n".join(f"- {line}" for line in lines) + "\n"
        write_section(DOCS, "hung", "A hung engine: detection and false alarms (`bench/bench_hung.py`)", body)


if __name__ == "__main__":
    main()
