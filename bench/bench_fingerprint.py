"""Fingerprints on real logits: how far the probe set's positions are from ties, and how much its logprobs
move between healthy readings of one server (the noise the tolerance must cover).

For each model (the tiny random Llama and, when its conversion is there, SmolLM2-135M-Instruct) and each
dtype asked, two servers are started one after the other: the prefix cache on (vLLM's default), then off.
On each, the probe set (`deploykit.smoke.fingerprint.PROBE_PROMPTS`, greedy, top-k logprobs by id) is read:

- `alone`: every probe sent by itself (the smoke's first reading; the reference of the rows below),
- `alone again`: the same, later (repeat noise),
- `together`: the four probes at once (the smoke's second reading, and the canary's one),
- `8 streams`: the four at once while 8 streaming requests (long prompts, long answers) share the batch, read
  several times, so the probes meet the streams at different points of their prefill and decode; compared
  with `alone` and with an idle `together` reading (a canary-born baseline's shape).

Per row: the largest logprob difference to `alone` over positions whose ids agree (the noise), positions
whose greedy ids parted, and the verdict `deploykit.smoke.fingerprint.compare` gives at the tolerance the
smoke would set (the dtype's floor, or 4 × the alone/together noise). The gap table gives the top-1/top-2
logprob gaps of `alone` over all probe positions, and how many fall under fixed margins and under the
dtype's tie margins (float32 7.6e-6, bfloat16 0.5 nats).

Then, unless `--no-drift`: the test-only finite-drift fault (tests/e2e/drift_worker.py) on a third server, and
per probe the first position where it parts ids with the baseline's gap there.

`--soak-s S` (default 180; 0: none) also runs the false-alarm soak on the cache-on server of each model: a
baseline as the smoke takes it (two readings), then for S seconds 8 streams with the canary's rotation
(the model's profile's) and one probe reading after each run (as `deploykit canary` takes it), each judged
against the baseline as the canary judges it (`results.judge.judge_against`). Prints the readings, the
mismatches (false alarms) and the largest noise.

Not part of CI (minutes per model).

    .venv/bin/python bench/bench_fingerprint.py [--models tiny,smollm2] [--dtypes float32,bfloat16]
        [--soak-s 180] [--no-cache-off] [--no-drift]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.subjects import Subject, subjects  # noqa: E402
from deploykit.smoke.fingerprint import (  # noqa: E402
    DEFAULT_TOP_K,
    PROBE_PROMPTS,
    Fingerprint,
    ProbeAnswer,
    compare,
    count_near_ties,
    dtype_floor,
    logprob_tolerance,
    parse_answer,
    probe_body,
    reading_noise,
    tie_margin,
    top_gap,
)
from tests.vllm_harness import RunningServer, running_vllm  # noqa: E402

STREAMS = 8
STREAM_MAX_TOKENS = 256
STREAM_PROMPT_TOKENS = 200
READINGS_UNDER_LOAD = 6
FIXED_MARGINS = (0.01, 0.1, 0.5, 1.0)
READ_TIMEOUT_S = 600.0


# --- reading the probe set ----------------------------------------------------------------------------


def read_probe(client: Any, served_name: str, name: str, top_k: int) -> ProbeAnswer:
    body = probe_body(served_name, PROBE_PROMPTS[name], top_k)
    response = client.post("/v1/completions", json=body, timeout=READ_TIMEOUT_S)
    response.raise_for_status()
    answer = parse_answer(name, response.json())
    if answer is None:
        raise RuntimeError(f"probe {name}: no usable answer: {response.text[:300]}")
    return answer


def read_alone(server: RunningServer, top_k: int) -> list[ProbeAnswer]:
    with server.client(READ_TIMEOUT_S) as client:
        return [read_probe(client, server.served_name, name, top_k) for name in PROBE_PROMPTS]


def read_together(server: RunningServer, top_k: int) -> list[ProbeAnswer]:
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str) -> ProbeAnswer:
        with server.client(READ_TIMEOUT_S) as client:
            return read_probe(client, server.served_name, name, top_k)

    with ThreadPoolExecutor(max_workers=len(PROBE_PROMPTS)) as pool:
        return list(pool.map(one, PROBE_PROMPTS))


def parted(reference: list[ProbeAnswer], other: list[ProbeAnswer]) -> int:
    """Probes whose greedy ids part from the reference somewhere."""
    theirs = {answer.prompt: answer.ids for answer in other}
    return sum(1 for answer in reference if theirs.get(answer.prompt) != answer.ids)


# --- load: 8 streams ------------------------------------------------------------------------------------


@contextlib.contextmanager
def streams(server: RunningServer, count: int = STREAMS) -> Iterator[list[int]]:
    """`count` clients streaming long answers to long prompts, each a different prompt (no shared prefix
    between streams), over and over, for the duration of the block. Yields the finished-request counter."""
    import httpx

    from deploykit.smoke.cases import long_prompt_ids

    stop = threading.Event()
    done = [0]

    def client(number: int) -> None:
        body = {
            "model": server.served_name,
            "prompt": long_prompt_ids(STREAM_PROMPT_TOKENS, salt=1000 + number),
            "max_tokens": STREAM_MAX_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.Client(base_url=server.base_url, timeout=READ_TIMEOUT_S) as http:
            while not stop.is_set():
                with http.stream("POST", "/v1/completions", json=body) as response:
                    for _ in response.iter_lines():
                        if stop.is_set():
                            break
                done[0] += 1

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(count)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(3.0)  # every stream admitted before the first reading
        yield done
    finally:
        stop.set()
        for thread in threads:
            thread.join(READ_TIMEOUT_S)


def prefix_cache_hits(server: RunningServer) -> tuple[float, float]:
    """vLLM's prefix-cache hits and queries so far (tokens), summed over engines."""
    import httpx

    hits = queries = 0.0
    for line in httpx.get(server.base_url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("vllm:prefix_cache_hits_total"):
            hits += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prefix_cache_queries_total"):
            queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


# --- one server: the noise table ---------------------------------------------------------------------


@dataclass
class Row:
    condition: str
    readings: int
    noise: float
    parted: int
    verdicts: list[str] = field(default_factory=list)


@dataclass
class ServerResult:
    prefix_cache: bool
    reference: list[ProbeAnswer]
    tolerance: float
    rows: list[Row]
    probe_hits: float
    load: float


def verdict(reference: list[ProbeAnswer], reading: list[ProbeAnswer], tolerance: float) -> str:
    mismatch, ties = compare(reference, reading, tolerance)
    if mismatch is None:
        return f"match ({ties} tie(s) skipped)" if ties else "match"
    return "MISMATCH: " + mismatch.describe(tolerance)


def measure_server(server: RunningServer, dtype: str, top_k: int, prefix_cache: bool) -> ServerResult:
    read_together(server, top_k)  # warm-up: the first logprobs request compiles
    hits_before, _ = prefix_cache_hits(server)
    reference = read_alone(server, top_k)
    again = read_alone(server, top_k)
    together = [read_together(server, top_k) for _ in range(3)]
    probe_hits = prefix_cache_hits(server)[0] - hits_before  # the probe set alone was asked so far
    smoke_noise = reading_noise(reference, together[0])
    tolerance = logprob_tolerance(dtype, smoke_noise)
    rows = [
        Row("alone again", 1, reading_noise(reference, again), parted(reference, again)),
        Row(
            "together (4 at once)",
            len(together),
            max(reading_noise(reference, r) for r in together),
            max(parted(reference, r) for r in together),
        ),
    ]
    loaded: list[list[ProbeAnswer]] = []
    load = []
    with streams(server):
        for _ in range(READINGS_UNDER_LOAD):
            loaded.append(read_together(server, top_k))
            load.append(os.getloadavg()[0])
    rows.append(
        Row(
            f"together, beside {STREAMS} streams",
            len(loaded),
            max(reading_noise(reference, r) for r in loaded),
            max(parted(reference, r) for r in loaded),
        )
    )
    # The canary's baseline may be one `together` reading (its first healthy run, on a key with none yet):
    # the same readings against that.
    rows.append(
        Row(
            f"together, beside {STREAMS} streams, vs together (idle)",
            len(loaded),
            max(reading_noise(together[0], r) for r in loaded),
            max(parted(together[0], r) for r in loaded),
        )
    )
    references = [reference, reference, reference, together[0]]
    for row, base, readings in zip(rows, references, [[again], together, loaded, loaded], strict=True):
        row.verdicts = [verdict(base, r, tolerance) for r in readings]
    return ServerResult(prefix_cache, reference, tolerance, rows, probe_hits, statistics.mean(load))


# --- the false-alarm soak ------------------------------------------------------------------------------


@dataclass
class Soak:
    seconds: float
    runs: int = 0
    readings: int = 0
    alarms: list[str] = field(default_factory=list)
    noise: float = 0.0
    parted: int = 0
    tolerance: float = 0.0
    streams_done: int = 0
    load: list[float] = field(default_factory=list)
    rotation_failures: list[str] = field(default_factory=list)


def soak(server: RunningServer, subject: Subject, dtype: str, top_k: int, seconds: float) -> Soak:
    """The canary beside 8 streams for `seconds`: its rotation and one probe reading per run, judged against
    a baseline taken as the smoke takes it."""
    from deploykit.canary.rotation import rotation_for
    from deploykit.canary.runner import Canary, CanaryConfig
    from deploykit.canary.settings import CanarySettings
    from deploykit.endpoint import Endpoint
    from deploykit.profile.load import load_profile
    from deploykit.results.baseline import Baseline
    from deploykit.results.judge import judge_against
    from deploykit.smoke.fingerprint_probe import take_fingerprint

    host = socket.gethostname()
    endpoint = Endpoint(server.base_url, request_deadline_s=300)
    baseline_fp = take_fingerprint(endpoint, server.served_name, dtype=dtype, top_k=top_k)
    baseline = Baseline(
        id=1,
        key="bench",
        key_parts={},
        result_id=1,
        hostname=host,
        created_at=datetime.now(UTC),
        status="active",
        fingerprint=baseline_fp,
    )
    result = Soak(seconds, tolerance=baseline_fp.tolerance)
    canary = Canary(
        CanaryConfig(
            endpoint=Endpoint(server.base_url),
            served_name=server.served_name,
            cases=rotation_for(load_profile(subject.profile).profile),
            settings=CanarySettings(every_s=1.0, timeout_s=300, metrics_every_s=0),
            max_model_len=subject.max_model_len,
            store=False,
        )
    )
    with streams(server) as done:
        stop_at = time.monotonic() + seconds
        while time.monotonic() < stop_at:
            summary = canary.run_once()
            result.runs += 1
            if summary.outcome != "pass":
                result.rotation_failures.append(f"{summary.case}: {summary.report.diagnosis[:200]}")
            reading: Fingerprint = take_fingerprint(
                endpoint, server.served_name, dtype=dtype, top_k=top_k, readings=1
            )
            result.readings += 1
            comparison = judge_against(reading, baseline, None, host)
            if comparison.verdict != "match":
                result.alarms.append(comparison.diagnosis)
            result.noise = max(result.noise, reading_noise(baseline_fp.answers, reading.answers))
            result.parted = max(result.parted, parted(baseline_fp.answers, reading.answers))
            result.load.append(os.getloadavg()[0])
        result.streams_done = done[0]
    return result


# --- the finite drift -----------------------------------------------------------------------------------


def drift_margins(subject: Subject, dtype: str, top_k: int) -> list[str]:
    """Serve with the test-only drift worker (tests/e2e/drift_worker.py), read the probe set, start the drift,
    read it again: where ids part, and the baseline's top-1/top-2 gap at each first parting (how clear a
    margin the fingerprint catches the drift at)."""
    import httpx

    from tests.e2e.drift_worker import FAULT_KEY, MARKER, WORKER_CLS
    from tests.vllm_harness import REPO

    args = [*subject.serve_args(dtype), "--worker-cls", WORKER_CLS]
    with running_vllm(args, served_name=subject.served_name, env={"PYTHONPATH": str(REPO)}) as server:
        read_together(server, top_k)
        before = read_alone(server, top_k)
        trigger = {"model": subject.served_name, "prompt": "hi", "max_tokens": 2}
        httpx.post(
            server.base_url + "/v1/completions",
            json={**trigger, "vllm_xargs": {FAULT_KEY: MARKER}},
            timeout=READ_TIMEOUT_S,
        ).raise_for_status()
        after = read_alone(server, top_k)
    tolerance = logprob_tolerance(dtype)
    lines = [
        f"Finite drift ({subject.title}, {dtype}): per probe, the first generated position whose id changed:"
    ]
    lines += [
        "",
        "| probe | position | baseline id → drifted id | baseline top-1/top-2 gap (nats) |",
        "|---|---|---|---|",
    ]
    theirs = {answer.prompt: answer for answer in after}
    for answer in before:
        other = theirs[answer.prompt]
        pairs = enumerate(zip(answer.ids, other.ids, strict=True))
        parted_at = next((n for n, (a, b) in pairs if a != b), None)
        if parted_at is None:
            lines.append(f"| {answer.prompt} | ids unchanged | | |")
            continue
        gap = top_gap(answer.top[parted_at])
        ids = f"{answer.ids[parted_at]} → {other.ids[parted_at]}"
        lines.append(f"| {answer.prompt} | {parted_at} | {ids} | {'?' if gap is None else f'{gap:.3g}'} |")
    mismatch, _ = compare(before, after, tolerance)
    lines += [
        "",
        f"compare() at the dtype's floor ({tolerance:.2g}): "
        + ("MISMATCH: " + mismatch.describe(tolerance) if mismatch else "match"),
    ]
    return lines


# --- printing ------------------------------------------------------------------------------------------


def gap_table(reference: list[ProbeAnswer], dtype: str, tolerance: float) -> list[str]:
    gaps = sorted(g for answer in reference for top in answer.top if (g := top_gap(top)) is not None)
    quartiles = statistics.quantiles(gaps, n=4)
    lines = [
        f"top-1/top-2 logprob gaps over the {len(gaps)} probe positions (nats): min {gaps[0]:.4g}, "
        f"25 % {quartiles[0]:.4g}, median {quartiles[1]:.4g}, 75 % {quartiles[2]:.4g}, max {gaps[-1]:.4g}",
        "",
        "| margin (nats) | positions with a smaller gap |",
        "|---|---|",
    ]
    for margin in FIXED_MARGINS:
        lines.append(f"| {margin:g} | {sum(g < margin for g in gaps)} of {len(gaps)} |")
    for name in ("float32", "bfloat16"):
        margin = tie_margin(dtype_floor(name))
        lines.append(f"| {margin:.2g} ({name} tie margin) | {sum(g < margin for g in gaps)} of {len(gaps)} |")
    lines.append(
        f"| {tie_margin(tolerance):.2g} (this server's tie margin, tolerance {tolerance:.2g}) | "
        f"{count_near_ties(reference, tolerance)} of {len(gaps)} |"
    )
    return lines


def noise_table(results: list[ServerResult]) -> list[str]:
    lines = [
        "| prefix cache | reading (vs `alone`) | readings | largest logprob difference (nats) | "
        "probes whose ids parted | verdict at the smoke's tolerance |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        cache = "on" if result.prefix_cache else "off"
        for row in result.rows:
            verdicts = sorted(set(row.verdicts))
            shown = "; ".join(v[:160] for v in verdicts)
            lines.append(
                f"| {cache} | {row.condition} | {row.readings} | {row.noise:.3g} | {row.parted} | {shown} |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2")
    parser.add_argument("--dtypes", default="float32", help="comma-separated: float32, bfloat16")
    parser.add_argument("--top-k", type=int, default=DEFAULT_TOP_K)
    parser.add_argument("--soak-s", type=float, default=180.0, help="false-alarm soak per model (0: none)")
    parser.add_argument("--no-cache-off", action="store_true", help="skip the prefix-cache-off server")
    parser.add_argument(
        "--no-drift", action="store_true", help="skip: where the finite-drift fault parts ids"
    )
    args = parser.parse_args()
    print(f"# bench_fingerprint  {datetime.now(UTC):%Y-%m-%d %H:%M UTC}  load at start: {os.getloadavg()}")
    for key, subject in subjects(args.models):
        if subject is None:
            print(f"\n## {key}: not in this checkout (no conversion), skipped")
            continue
        for dtype in args.dtypes.split(","):
            results: list[ServerResult] = []
            soaked: Soak | None = None
            for prefix_cache in (True, False) if not args.no_cache_off else (True,):
                flag = "--enable-prefix-caching" if prefix_cache else "--no-enable-prefix-caching"
                with running_vllm(
                    [*subject.serve_args(dtype), flag], served_name=subject.served_name
                ) as server:
                    results.append(measure_server(server, dtype, args.top_k, prefix_cache))
                    if prefix_cache and args.soak_s > 0:
                        soaked = soak(server, subject, dtype, args.top_k, args.soak_s)
            print(f"\n## {subject.title}, {dtype}, CPU build, top-{args.top_k}\n")
            first = results[0]
            print("\n".join(gap_table(first.reference, dtype, first.tolerance)))
            print()
            print("\n".join(noise_table(results)))
            print()
            for result in results:
                print(
                    f"- prefix cache {'on' if result.prefix_cache else 'off'}: tolerance the smoke sets "
                    f"{result.tolerance:.3g} nats; prefix-cache hits on the probe set "
                    f"{result.probe_hits:g} tokens; load average under the streams {result.load:.1f}"
                )
            if soaked is not None:
                print(
                    f"- soak: {soaked.seconds:g} s of {STREAMS} streams ({soaked.streams_done} finished), "
                    f"{soaked.runs} canary runs, {soaked.readings} probe readings judged against the "
                    f"baseline (tolerance {soaked.tolerance:.3g}): **{len(soaked.alarms)} false alarm(s)**; "
                    f"largest logprob difference {soaked.noise:.3g} nats, probes whose ids parted "
                    f"{soaked.parted}; rotation failures {len(soaked.rotation_failures)}; load average "
                    f"{min(soaked.load):.1f}-{max(soaked.load):.1f}"
                )
                for alarm in soaked.alarms[:3] + soaked.rotation_failures[:3]:
                    print(f"  - {alarm[:300]}")
            if not args.no_drift:
                print()
                print("\n".join(drift_margins(subject, dtype, args.top_k)))


if __name__ == "__main__":
    main()
