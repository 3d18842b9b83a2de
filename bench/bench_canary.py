"""The canary's cost on the real vLLM (CPU build, tiny model): its traffic as a share of the server's
capacity at the default interval, and the TPOT of 8 concurrent streams without and with a canary.

Capacity share, two ways: (a) busy time: each rotation case alone on an idle server, mean latency per run
divided by the interval (an upper bound: alone, the server is not batching anything else); (b) tokens:
the rotation's prompt + generated tokens per minute over what 8 saturating streams process per minute.
Not part of CI (a few minutes).

    .venv/bin/python bench/bench_canary.py [--seconds 60] [--write-docs]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.benchmarks_doc import DOCS, write_section  # noqa: E402
from deploykit.profile.load import load_profile  # noqa: E402
from deploykit.serve.canary import DEFAULT_EVERY_S, Canary, CanaryConfig, rotation_for  # noqa: E402
from deploykit.tinymodel import build_tiny_model  # noqa: E402
from tests.vllm_harness import RunningServer, running_vllm, tiny_serve_args  # noqa: E402

SECTION = "bench_canary"
STREAMS = 8
MAX_TOKENS = 64
NOISE_NOTE = (
    "TPOT is measured on a machine other test runs share: compare the rows against each other's spread, "
    "and read the canary's cost from the shares above."
)


def stream_tpots(server: RunningServer, seconds: float) -> tuple[list[float], int]:
    """8 streaming clients for `seconds`: each request's TPOT, and the tokens (prompt + output) processed."""
    import httpx

    body = {
        "model": "tiny",
        "prompt": "Once upon a time there was",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    tpots: list[float] = []
    tokens = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client() -> None:
        with httpx.Client(base_url=server.base_url, timeout=300) as http:
            while time.monotonic() < stop_at:
                stamps: list[float] = []
                used = 0
                with http.stream("POST", "/v1/completions", json=body) as response:
                    for line in response.iter_lines():
                        if line.startswith("data: {"):
                            stamps.append(time.monotonic())
                            if '"usage":{' in line and '"total_tokens"' in line:
                                used = int(line.split('"total_tokens":')[1].split(",")[0].split("}")[0])
                with lock:
                    if len(stamps) > 2:
                        tpots.append((stamps[-2] - stamps[0]) / (len(stamps) - 2))
                    tokens[0] += used

    threads = [threading.Thread(target=client) for _ in range(STREAMS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return tpots, tokens[0]


def canary_for(server: RunningServer, every_s: float) -> Canary:
    profile = load_profile("demo-cpu").profile
    config = CanaryConfig(
        url=server.base_url,
        served_name="tiny",
        cases=rotation_for(profile),
        every_s=every_s,
        max_model_len=profile.serve.max_model_len,
        store=False,
    )
    return Canary(config)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0, help="load duration per TPOT measurement")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    model = build_tiny_model()
    with running_vllm(tiny_serve_args(model)) as server:
        # Warm up (the first logprobs request compiles) and measure each rotation case alone.
        idle = canary_for(server, DEFAULT_EVERY_S)
        for _ in range(len(idle.config.cases)):
            idle.run_once()
        per_case: dict[str, list[float]] = {}
        tokens_per_rotation = 0
        for _ in range(3):
            for _ in range(len(idle.config.cases)):
                summary = idle.run_once()
                per_case.setdefault(summary.case, []).append(summary.report.elapsed_s)
                tokens_per_rotation += sum(
                    (c.prompt_tokens or 0) + c.completion_tokens for c in summary.report.cases
                )
        tokens_per_rotation //= 3
        mean_run_s = statistics.mean(statistics.median(v) for v in per_case.values())
        busy_share = mean_run_s / DEFAULT_EVERY_S
        tokens_per_run = tokens_per_rotation / len(per_case)

        base_tpots, base_tokens = stream_tpots(server, args.seconds)
        capacity_per_s = base_tokens / args.seconds
        token_share = (tokens_per_run / DEFAULT_EVERY_S) / capacity_per_s

        results: dict[str, Any] = {"none": base_tpots}
        for every in (DEFAULT_EVERY_S, 5.0):
            canary = canary_for(server, every)
            stop = threading.Event()
            thread = threading.Thread(target=canary.run_forever, args=(stop,))
            thread.start()
            tpots, _ = stream_tpots(server, args.seconds)
            stop.set()
            thread.join()
            results[f"every {every:g} s"] = (tpots, canary.runs, canary.state.status)

    every = DEFAULT_EVERY_S
    lines = [
        f"Tiny random Llama on vLLM's CPU build (2 cores, float32, `--enforce-eager`), demo-cpu rotation "
        f"({', '.join(per_case)}; at most 8 generated tokens per request, 4-request batch case).",
        "",
        "| canary case (alone, idle server) | median latency |",
        "|---|---|",
        *[f"| {name} | {statistics.median(v) * 1000:.0f} ms |" for name, v in per_case.items()],
        "",
        f"- Busy-time share at the default interval ({every:g} s): mean run {mean_run_s * 1000:.0f} ms "
        f"/ {every:g} s = **{busy_share * 100:.2f} %** (upper bound: alone, nothing else is batched).",
        f"- Token share: {tokens_per_run:.0f} tokens per run (prompt + generated) every {every:g} s "
        f"vs a capacity of {capacity_per_s:.0f} tokens/s under {STREAMS} streams = "
        f"**{token_share * 100:.3f} %** (goal ≤ 1 %).",
        "",
        f"TPOT of {STREAMS} concurrent streams ({MAX_TOKENS} tokens each, {args.seconds:g} s of load "
        "each row):",
        "",
        "| canary | requests | TPOT median | TPOT p90 | canary runs during the load | canary state |",
        "|---|---|---|---|---|---|",
        f"| none | {len(base_tpots)} | {statistics.median(base_tpots) * 1000:.1f} ms | "
        f"{percentile(base_tpots, 0.9) * 1000:.1f} ms | - | - |",
    ]
    for name, (tpots, runs, status) in ((k, v) for k, v in results.items() if k != "none"):
        lines.append(
            f"| {name} | {len(tpots)} | {statistics.median(tpots) * 1000:.1f} ms | "
            f"{percentile(tpots, 0.9) * 1000:.1f} ms | {runs} | {status} |"
        )
    lines += ["", NOISE_NOTE]
    body = "\n".join(lines)
    print(body)
    if args.write_docs:
        write_section(DOCS, SECTION, "Canary cost (bench/bench_canary.py)", body)


if __name__ == "__main__":
    main()
