"""The canary's cost on the real vLLM (CPU build), and the cost of vLLM's NaN counter, for each model in one
run: the tiny random Llama and SmolLM2-135M-Instruct (bench/subjects.py), each under its own profile's
rotation, so the two are compared under the same load.

1. Per canary run: the rotation's case and the fingerprint probe set (`deploykit.smoke.fingerprint`, one
   reading per run; when that module is absent, the rotation alone), in tokens and as a share of capacity
   at the default interval, two ways: (a) busy time: each alone on an idle server, latency per run over the
   interval (an upper bound: alone, the server batches nothing else); (b) tokens: prompt + generated tokens
   per run per second over what 8 saturating streams process per second.
2. TPOT of 8 streams with `VLLM_COMPUTE_NANS_IN_LOGITS` off and on, side by side in one run: two servers
   up at once, measured in alternating windows (off, on, off, on, ...) so that load from elsewhere on the
   machine falls on both alike. TPOT per request = (last token's time − first token's) / (tokens − 1),
   tokens counted by their ids (`bench/tpot.py`), never from gaps between stream chunks.
3. TPOT under the same 8 streams with a canary (rotation + probe set) every 60 s and every 5 s.
4. The cost in units that carry to a GPU: prompt, prefill (prompt tokens the prefix cache did not serve, from
   vLLM's own counters) and generated tokens per run and per hour per replica at the default interval.
   A GPU replica's capacity is larger, so its share is smaller; the tokens are the same.
Not part of CI (several minutes per model).

    .venv/bin/python bench/bench_canary.py [--models tiny,smollm2] [--seconds 30] [--rounds 3] [--write-docs]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.benchmarks_doc import DOCS, write_section  # noqa: E402
from bench.subjects import Subject, subjects  # noqa: E402
from bench.tpot import read_stream  # noqa: E402
from deploykit.canary.defaults import NAN_COUNTER_ENV  # noqa: E402
from deploykit.canary.rotation import rotation_for  # noqa: E402
from deploykit.canary.runner import Canary, CanaryConfig  # noqa: E402
from deploykit.canary.settings import DEFAULTS, CanarySettings  # noqa: E402
from deploykit.endpoint import Endpoint  # noqa: E402
from deploykit.profile.load import load_profile  # noqa: E402
from tests.vllm_harness import RunningServer, running_vllm  # noqa: E402

SECTION = "bench_canary"
AT_ONCE_S = 0.001
"""A request whose first and last token arrived within this: the server sent its chunks together."""
STREAMS = 8
MAX_TOKENS = 64
NOISE_NOTE = (
    "Measured on a 2-core machine other work shares (see the load average): the capacity, and so the token "
    "share, moves with that load (a loaded machine processes fewer tokens per second, so the same canary is "
    "a larger share of it); compare TPOT rows against the spread of their windows."
)


class ProbeSet:
    """The fingerprint probe set as the canary sends it each run (one reading)."""

    def __init__(self, served_name: str) -> None:
        from deploykit.smoke import fingerprint

        self.served_name = served_name
        self.prompts: dict[str, list[int]] = dict(fingerprint.PROBE_PROMPTS)
        self.max_tokens = fingerprint.PROBE_MAX_TOKENS
        self.top_k = fingerprint.DEFAULT_TOP_K

    def tokens(self) -> int:
        """Prompt + generated tokens of one reading (exact: token-id prompts, fixed length, ignore_eos)."""
        return self.prompt_tokens() + len(self.prompts) * self.max_tokens

    def prompt_tokens(self) -> int:
        return sum(len(ids) for ids in self.prompts.values())

    def read(self, base_url: str) -> float:
        """One reading, as the canary takes it; returns its wall time."""
        from deploykit.smoke.fingerprint_probe import take_fingerprint

        started = time.monotonic()
        endpoint = Endpoint(base_url, request_deadline_s=300)
        take_fingerprint(endpoint, self.served_name, dtype="float32", top_k=self.top_k, readings=1)
        return time.monotonic() - started


def stream_load(server: RunningServer, seconds: float) -> tuple[list[float], int]:
    """8 streaming clients for `seconds`: each request's TPOT, and the tokens (prompt + output) processed."""
    import httpx

    body = {
        "model": server.served_name,
        "prompt": "Once upon a time there was",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream_options": {"include_usage": True},
    }
    tpots: list[float] = []
    tokens = [0]
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client() -> None:
        with httpx.Client(base_url=server.base_url, timeout=300) as http:
            while time.monotonic() < stop_at:
                with http.stream("POST", "/v1/completions", json=body) as response:
                    timing = read_stream(response.iter_lines())
                value = timing.tpot()
                with lock:
                    if value is not None:
                        tpots.append(value)
                    tokens[0] += timing.total_tokens

    threads = [threading.Thread(target=client) for _ in range(STREAMS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return tpots, tokens[0]


SERVER_TPOT = "vllm:request_time_per_output_token_seconds"
COUNTERS = {
    "tpot_sum": SERVER_TPOT + "_sum",
    "tpot_count": SERVER_TPOT + "_count",
    "prompt": "vllm:prompt_tokens_total",
    "generated": "vllm:generation_tokens_total",
    "cache_hits": "vllm:prefix_cache_hits_total",
}


def counters(base_url: str) -> dict[str, float]:
    """vLLM's own counters (COUNTERS), each summed over its label sets."""
    import httpx

    totals = dict.fromkeys(COUNTERS, 0.0)
    for line in httpx.get(base_url + "/metrics", timeout=30).text.splitlines():
        for key, name in COUNTERS.items():
            if line.startswith((name + "{", name + " ")):
                totals[key] += float(line.rsplit(" ", 1)[1])
    return totals


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in before}


def server_tpot(change: dict[str, float]) -> float:
    """vLLM's mean TPOT over a window (decode time / (generated tokens − 1), engine timestamps)."""
    return change["tpot_sum"] / max(1.0, change["tpot_count"])


def canary_for(server: RunningServer, subject: Subject, every_s: float) -> Canary:
    profile = load_profile(subject.profile).profile
    config = CanaryConfig(
        endpoint=Endpoint(server.base_url),
        served_name=subject.served_name,
        cases=rotation_for(profile),
        settings=CanarySettings(every_s=every_s, timeout_s=300, metrics_every_s=0),
        max_model_len=profile.serve.max_model_len,
        store=False,
    )
    return Canary(config)


def canary_loop(canary: Canary, probes: ProbeSet, stop: threading.Event) -> None:
    """The canary's runs with the probe set read after each, every `every_s` seconds (start to start)."""
    next_at = time.monotonic()
    while not stop.is_set():
        canary.run_once()
        probes.read(canary.config.endpoint.url)
        next_at = max(next_at + canary.config.settings.every_s, time.monotonic())
        stop.wait(max(0.0, next_at - time.monotonic()))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(value: float) -> str:
    return f"{value * 1000:.1f} ms"


@dataclass
class Cost:
    """One model's figures, for the summary across models."""

    title: str
    run_tokens: float
    prompt_tokens: float
    prefill_tokens: float
    generated_tokens: float
    run_s: float
    capacity_per_s: float
    token_share: float
    tpot_ratio: float
    load: str


IDLE_ROTATIONS = 3


def measure(subject: Subject, args: argparse.Namespace) -> tuple[list[str], Cost]:
    """Everything for one model: two servers (NaN counter off and on), the canary alone, TPOT under 8 streams
    with and without it."""
    probes = ProbeSet(subject.served_name)
    with contextlib.ExitStack() as stack:
        # Two servers up at once: the NaN counter off and on (the plan's default).
        serve_args = subject.serve_args()
        name = subject.served_name
        off = stack.enter_context(running_vllm(serve_args, served_name=name, env={NAN_COUNTER_ENV: "0"}))
        on = stack.enter_context(running_vllm(serve_args, served_name=name, env={NAN_COUNTER_ENV: "1"}))

        # 1. Per run, alone on an idle server (the plan's: counter on). Warm up first (logprobs compile).
        idle = canary_for(on, subject, DEFAULTS.every_s)
        for _ in range(len(idle.config.cases)):
            idle.run_once()
        probes.read(on.base_url)
        per_case: dict[str, list[float]] = {}
        failed: list[str] = []
        probe_s: list[float] = []
        before = counters(on.base_url)
        for _ in range(IDLE_ROTATIONS):
            for _ in range(len(idle.config.cases)):
                summary = idle.run_once()
                per_case.setdefault(summary.case, []).append(summary.report.elapsed_s)
                if summary.outcome != "pass":
                    failed.append(f"{summary.case}: {summary.report.diagnosis[:160]}")
            probe_s.append(probes.read(on.base_url))
        runs = IDLE_ROTATIONS * len(idle.config.cases)
        spent = delta(before, counters(on.base_url))
        # One probe reading per rotation here, one per run in the canary: add the missing ones exactly.
        extra_readings = runs - IDLE_ROTATIONS
        prompt_per_run = (spent["prompt"] + extra_readings * probes.prompt_tokens()) / runs
        prefill_per_run = prompt_per_run - spent["cache_hits"] / runs  # the probes never hit the cache
        generated_per_run = (
            spent["generated"] + extra_readings * len(probes.prompts) * probes.max_tokens
        ) / runs
        rotation_run_s = statistics.mean(statistics.median(v) for v in per_case.values())
        probe_run_s = statistics.median(probe_s)

        # 2. TPOT, the NaN counter off and on, alternating windows; the capacity from the same streams.
        tpots: dict[str, list[float]] = {"off": [], "on": []}
        window_medians: dict[str, list[float]] = {"off": [], "on": []}
        server_means: dict[str, list[float]] = {"off": [], "on": []}
        processed: dict[str, int] = {"off": 0, "on": 0}
        load_avg: list[float] = []
        for _ in range(args.rounds):
            for label, server in (("off", off), ("on", on)):
                before = counters(server.base_url)
                values, tokens = stream_load(server, args.seconds)
                server_means[label].append(server_tpot(delta(before, counters(server.base_url))))
                tpots[label] += values
                window_medians[label].append(statistics.median(values))
                processed[label] += tokens
                load_avg.append(os.getloadavg()[0])
        capacity_per_s = processed["on"] / (args.rounds * args.seconds)

        # 3. TPOT with a canary (rotation + probe set) on the plan's server.
        with_canary: dict[str, tuple[list[float], float, int, str]] = {}
        for every in (DEFAULTS.every_s, 5.0):
            canary = canary_for(on, subject, every)
            stop = threading.Event()
            thread = threading.Thread(target=canary_loop, args=(canary, probes, stop))
            thread.start()
            before = counters(on.base_url)
            values, _ = stream_load(on, args.seconds * 2)
            server_mean = server_tpot(delta(before, counters(on.base_url)))
            stop.set()
            thread.join()
            with_canary[f"every {every:g} s"] = (values, server_mean, canary.runs, canary.state.status)
            load_avg.append(os.getloadavg()[0])

    every = DEFAULTS.every_s
    per_hour = 3600.0 / every
    run_tokens = prompt_per_run + generated_per_run
    run_s = rotation_run_s + probe_run_s
    token_share = (run_tokens / every) / capacity_per_s
    probe_share = (probes.tokens() / every) / capacity_per_s
    server_ratio = statistics.mean(server_means["on"]) / statistics.mean(server_means["off"])
    load = f"{min(load_avg):.1f}–{max(load_avg):.1f}"
    lines = [
        f"### {subject.title}",
        "",
        f"{subject.title} on vLLM's CPU build (2 cores, float32, `--enforce-eager`), profile "
        f"`{subject.profile}`: its rotation ({', '.join(per_case)}; at most 8 generated tokens per request, "
        f"4-request batch case); fingerprint probe set: {len(probes.prompts)} prompts × {probes.max_tokens} "
        f"generated tokens, top-{probes.top_k} logprobs, one reading per run.",
        "",
        "| per canary run (alone, idle server) | median latency |",
        "|---|---|",
        *[f"| rotation case {case} | {statistics.median(v) * 1000:.0f} ms |" for case, v in per_case.items()],
        f"| rotation, mean case | {rotation_run_s * 1000:.0f} ms |",
        f"| fingerprint probe set (one reading) | {probe_run_s * 1000:.0f} ms |",
        f"| **a whole run** | **{run_s * 1000:.0f} ms** |",
        "",
        f"Tokens per run (mean over {IDLE_ROTATIONS} rotations, from vLLM's own counters) and per hour per "
        f"replica at the default interval ({every:g} s, {per_hour:.0f} runs an hour):",
        "",
        "| | per run | per hour per replica |",
        "|---|---|---|",
        f"| prompt tokens | {prompt_per_run:.0f} | {prompt_per_run * per_hour:,.0f} |",
        f"| prefill tokens (prompt tokens the prefix cache did not serve) | {prefill_per_run:.0f} | "
        f"{prefill_per_run * per_hour:,.0f} |",
        f"| generated tokens | {generated_per_run:.0f} | {generated_per_run * per_hour:,.0f} |",
        f"| **all** | **{run_tokens:.0f}** | **{run_tokens * per_hour:,.0f}** |",
        "",
        f"- Token share at the default interval: {run_tokens:.0f} tokens per run vs a capacity of "
        f"{capacity_per_s:.0f} tokens/s under {STREAMS} streams = **{token_share * 100:.3f} %** (probe set "
        f"{probes.tokens()} tokens, {probe_share * 100:.3f} %; goal ≤ 1 %).",
        f"- Busy-time share: {run_s * 1000:.0f} ms / {every:g} s = **{run_s / every * 100:.2f} %** (upper "
        "bound: alone, nothing else is batched).",
    ]
    if failed:
        lines.append(f"- Rotation runs that did not pass on the idle server: {'; '.join(failed[:3])}")
    lines += [
        "",
        f"TPOT of {STREAMS} concurrent streams ({MAX_TOKENS} tokens each), `{NAN_COUNTER_ENV}` off and on: "
        f"two servers up at once, {args.rounds} alternating windows of {args.seconds:g} s each (load average "
        f"{load} during this model's windows). TPOT per request = (last token − first) / (tokens − 1), "
        "tokens counted by id:",
        "",
        "| `" + NAN_COUNTER_ENV + "` | requests | client TPOT median | p10 | p90 | window medians | "
        "all tokens at once | vLLM's TPOT, mean per window |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label in ("off", "on"):
        values = tpots[label]
        at_once = sum(1 for v in values if v * (MAX_TOKENS - 1) < AT_ONCE_S) / len(values)
        lines.append(
            f"| {label} | {len(values)} | {ms(statistics.median(values))} | {ms(percentile(values, 0.1))} | "
            f"{ms(percentile(values, 0.9))} | {', '.join(ms(v) for v in window_medians[label])} | "
            f"{at_once * 100:.0f} % | {', '.join(ms(v) for v in server_means[label])} |"
        )
    lines += [
        "",
        f"vLLM's own TPOT (`{SERVER_TPOT}`), mean over the windows, on / off: **{server_ratio:.3f}**.",
        "",
        f"TPOT under the same {STREAMS} streams ({args.seconds * 2:g} s each) with a canary (rotation + "
        "probe set) on the plan's server (counter on):",
        "",
        "| canary | requests | vLLM's TPOT, mean | client TPOT p90 | canary runs during the load "
        "| canary state |",
        "|---|---|---|---|---|---|",
        f"| none (the `on` windows above) | {len(tpots['on'])} | {ms(statistics.mean(server_means['on']))} | "
        f"{ms(percentile(tpots['on'], 0.9))} | - | - |",
    ]
    for label, (values, server_mean, runs_done, status) in with_canary.items():
        lines.append(
            f"| {label} | {len(values)} | {ms(server_mean)} | {ms(percentile(values, 0.9))} | {runs_done} "
            f"| {status} |"
        )
    cost = Cost(
        subject.title,
        run_tokens,
        prompt_per_run,
        prefill_per_run,
        generated_per_run,
        run_s,
        capacity_per_s,
        token_share,
        server_ratio,
        load,
    )
    return lines, cost


def summary(costs: list[Cost]) -> list[str]:
    per_hour = 3600.0 / DEFAULTS.every_s
    lines = [
        "One run, the models one after the other, the canary at its default interval "
        f"({DEFAULTS.every_s:g} s):",
        "",
        "| model | tokens per run | prefill tokens per hour per replica | all tokens per hour per replica | "
        "run (alone) | capacity, 8 streams | token share | vLLM TPOT, NaN counter on / off | load average |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cost in costs:
        lines.append(
            f"| {cost.title} | {cost.run_tokens:.0f} | {cost.prefill_tokens * per_hour:,.0f} | "
            f"{cost.run_tokens * per_hour:,.0f} | {cost.run_s * 1000:.0f} ms | {cost.capacity_per_s:.0f} "
            f"tokens/s | {cost.token_share * 100:.3f} % | {cost.tpot_ratio:.3f} | {cost.load} |"
        )
    if len(costs) == 2:
        a, b = costs
        lines += [
            "",
            f"{b.title} over {a.title}: tokens per run ×{b.run_tokens / a.run_tokens:.2f} (the text prompts "
            "tokenize differently, the profiles' rotations differ), capacity "
            f"×{b.capacity_per_s / a.capacity_per_s:.3f}, "
            f"token share ×{b.token_share / a.token_share:.2f}.",
        ]
    lines += [
        "",
        "The tokens per hour carry to a GPU replica unchanged (the same requests, whatever runs them); the "
        "share does not: a GPU replica's capacity is orders of magnitude above this 2-core machine's, so the "
        "same tokens are a far smaller share there.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2")
    parser.add_argument("--seconds", type=float, default=30.0, help="load per TPOT window")
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating off/on windows for the NaN counter"
    )
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    sections: list[str] = []
    costs: list[Cost] = []
    for key, subject in subjects(args.models):
        if subject is None:
            sections += [f"### {key}: not in this checkout (no conversion), skipped", ""]
            continue
        lines, cost = measure(subject, args)
        print("\n".join(lines), flush=True)
        sections += [*lines, ""]
        costs.append(cost)
    body = "\n".join([*summary(costs), "", *sections, NOISE_NOTE])
    print()
    print("\n".join(summary(costs)))
    if args.write_docs:
        write_section(DOCS, SECTION, "Canary cost (bench/bench_canary.py)", body)


if __name__ == "__main__":
    main()
