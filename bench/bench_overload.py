"""How often the canary cries wolf when one vLLM replica is only busy: 1×, 2×, 4× its capacity (issue 45).

A canary next to an overloaded server must not fail the pod's probes: the server is healthy, only late, and
restarting or un-routing it makes the overload worse. Measured, not argued, on the real vLLM (CPU build,
tiny model, the test fault worker), watched at once by two real `deploykit canary` processes with verdict
files (one at `--every`, default 60 s; one at the fastest the settings allow, 0.1 s):
1. capacity: closed loop at 1, 2, 4, ... requests in flight until two doublings add under 5 % tokens/s;
2. one phase of `--phase-s` per multiple (default 1, 2, 4 × capacity) of open-loop arrivals (a fixed rate,
   whatever completes): above 1× vLLM's queue grows for the whole phase (up to `--max-outstanding`). Every
   2 s each verdict file is judged by the pod probes' own `pod_probe.decide()`. Counted per phase and
   canary: transitions into `hung`, `corrupt`, `unreachable` (false alarms), seconds not ready, seconds per
   status (`saturated` and any other by name), the rows it stored, its runs and their latency;
3. a hung forward pass after the last phase (the fault worker's marked request; `/health` stays 200),
   under a few closed-loop streams: seconds until each verdict file says `hung`.
The load generator shares the machine's cores with vLLM: its own CPU, the canaries' and vLLM's are reported.
Not part of CI: about 3 × `--phase-s` plus ~8 min (40 min at the defaults).

    .venv/bin/python bench/bench_overload.py [--phase-s 600] [--every 60] [--write-docs] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import os
import re
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.benchmarks_doc import DOCS, write_section  # noqa: E402
from deploykit.canary.defaults import HUNG_AFTER_S, PROGRESS_EVERY_S  # noqa: E402
from deploykit.canary.settings import DEFAULTS, MIN_EVERY_S  # noqa: E402
from deploykit.render import pod_probe  # noqa: E402
from deploykit.tinymodel import build_tiny_model  # noqa: E402
from tests.e2e.fault_worker import FAULT_KEY, TOKENS_ENV, WORKER_CLS  # noqa: E402
from tests.vllm_harness import running_vllm, tiny_serve_args  # noqa: E402

PROMPT = "Count the ships in the harbour, one by one, and name each:"
SAMPLE_EVERY_S = 2.0
"""How often the verdict files are judged (the chart's probes run every 10 or 20 s: this sees more)."""
IDLE_RUNNING = 8
"""vLLM is drained when nothing waits and at most this many run: the canaries' own (a batch case is 4)."""
ALARMS = ("hung", "corrupt", "unreachable")
"""Verdicts that fail a probe: against a server that is only busy, each is a false alarm."""
GROWTH = 0.05
"""Capacity is reached when two doublings of the requests in flight in a row add less than this to the best
tokens/s (two: on a shared machine one level can come out low)."""
WARMUP_S = 5.0
JSON_HEADERS = {"Content-Type": "application/json"}
TIGHT = ["--timeout", "20", "--miss-limit", "3"]
"""The third canary's options: at the defaults (120 s a request, 5 misses) a 600 s phase may end before a
miss streak does; with these the streak comes within minutes, so `saturated` vs `unreachable` is judged
under each load too."""
RUN_LINE = re.compile(r"^run \d+ (\S+): (\S+)\s+([\d.]+) s")
STATE_LINE = re.compile(r"^state: (\w+):")


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values (a phase in which no run ended)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system, with reaped children) of the live processes of group `pgid`, from /proc:
    vLLM's API server, engine core and workers, or one canary (each is started in a session of its own)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:
            continue
        fields = raw[raw.rindex(b")") + 2 :].split()  # fields[0] is field 3 (state) of proc(5)
        if int(fields[2]) == pgid:
            total += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
    return total / os.sysconf("SC_CLK_TCK")


def vllm_gauges(url: str, timeout_s: float = 30.0) -> dict[str, float] | None:
    """vLLM's queue gauges and token counter from its /metrics (summed over engines); None: no answer."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {
        "vllm:num_requests_waiting": "waiting",
        "vllm:num_requests_running": "running",
        "vllm:generation_tokens_total": "generated",
    }
    try:
        text = httpx.get(url + "/metrics", timeout=timeout_s).text
        values = dict.fromkeys(wanted.values(), 0.0)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted:
                    values[wanted[sample.name]] += sample.value
    except (httpx.HTTPError, ValueError):
        return None
    return values


class GaugeWatch(threading.Thread):
    """vLLM's gauges every `every_s` on a thread of their own: an overloaded server's /metrics can take
    seconds, and must neither delay the verdict samples nor be given up on for their sake."""

    def __init__(self, url: str, every_s: float) -> None:
        super().__init__(name="gauges", daemon=True)
        self.url, self.every_s = url, every_s
        self.readings: list[tuple[float, dict[str, float] | None]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            asked = time.monotonic()
            self.readings.append((asked, vllm_gauges(self.url)))
            self.done.wait(max(0.0, asked + self.every_s - time.monotonic()))

    def since(self, start: float, end: float = math.inf) -> list[tuple[float, dict[str, float]]]:
        return [(at, gauges) for at, gauges in list(self.readings) if gauges and start <= at < end]

    def stop(self) -> None:
        self.done.set()
        self.join(60)


def raise_open_files() -> int:
    """The soft RLIMIT_NOFILE up to the hard one: every outstanding request holds a socket."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# --- the load -----------------------------------------------------------------------------------------


def payload(max_tokens: int) -> bytes:
    """One fixed request shape: a short prompt, `max_tokens` generated whatever the model (ignore_eos)."""
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return json.dumps(body).encode()


async def post(session: Any, url: str, body: bytes) -> int:
    """One completion; its generated tokens. Raises on anything but HTTP 200."""
    async with session.post(url + "/v1/completions", data=body, headers=JSON_HEADERS) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")
        answer = await response.json()
    return int(answer["usage"]["completion_tokens"])


def error_name(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}" if isinstance(exc, RuntimeError) else type(exc).__name__


def session() -> Any:
    """An aiohttp session without timeouts or a connection limit: the generator must add no misses of its
    own, and every outstanding request needs its own connection. A new connection for each request: uvicorn
    closes one idle for 5 s, and a request sent on it as it closes fails (ServerDisconnectedError, seen)."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=None, sock_read=None)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    return aiohttp.ClientSession(connector=connector, timeout=timeout)


@dataclass
class LoadResult:
    sent: int = 0
    completed: int = 0
    tokens: int = 0
    capped: int = 0
    """Arrivals not sent: `--max-outstanding` requests were already waiting for their answers."""
    max_outstanding: int = 0
    outstanding_at_end: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    """CPU seconds of the generator's own thread (its event loop, aiohttp, JSON)."""


async def closed_loop(url: str, body: bytes, concurrency: int, seconds: float) -> LoadResult:
    """`concurrency` requests always in flight for `seconds`; the ones in flight then are cancelled."""
    loop = asyncio.get_running_loop()
    result = LoadResult()
    end = loop.time() + seconds
    async with session() as client:

        async def worker() -> None:
            while loop.time() < end:
                result.sent += 1
                try:
                    result.tokens += await post(client, url, body)
                    result.completed += 1
                except Exception as exc:
                    result.errors[error_name(exc)] += 1
                    await asyncio.sleep(0.1)

        tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
        await asyncio.sleep(max(0.0, end - loop.time()))
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return result


async def open_loop(url: str, body: bytes, rate: float, seconds: float, cap: int) -> LoadResult:
    """Arrivals every 1/`rate` s for `seconds`, whether or not earlier ones were answered; then the
    outstanding ones are cancelled (their connections closed: vLLM aborts them)."""
    loop = asyncio.get_running_loop()
    result = LoadResult()
    tasks: set[asyncio.Task[None]] = set()
    async with session() as client:

        async def one() -> None:
            sent = loop.time()
            try:
                tokens = await post(client, url, body)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                result.errors[error_name(exc)] += 1
                return
            result.completed += 1
            result.tokens += tokens
            result.latencies.append(loop.time() - sent)

        start = loop.time()
        arrival = 0
        while (due := start + arrival / rate) < start + seconds:
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            arrival += 1
            if len(tasks) >= cap:
                result.capped += 1
                continue
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            result.sent += 1
            result.max_outstanding = max(result.max_outstanding, len(tasks))
        await asyncio.sleep(max(0.0, start + seconds - loop.time()))
        result.outstanding_at_end = len(tasks)
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return result


class LoadThread(threading.Thread):
    """The generator on a thread of its own with its own event loop, so its CPU is its thread's alone."""

    def __init__(self, make: Callable[[], Coroutine[Any, Any, LoadResult]]) -> None:
        super().__init__(name="load", daemon=True)
        self.make = make
        self.result = LoadResult()

    def run(self) -> None:
        before = resource.getrusage(resource.RUSAGE_THREAD)
        self.result = asyncio.run(self.make())
        after = resource.getrusage(resource.RUSAGE_THREAD)
        self.result.cpu_s = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def drained(gauges: dict[str, float] | None) -> bool:
    return gauges is not None and gauges["waiting"] == 0 and gauges["running"] <= IDLE_RUNNING


def wait_drained(url: str, timeout_s: float = 600.0) -> float:
    """Seconds until vLLM's queue is empty but for the canaries' own requests (two reads in a row)."""
    started = time.monotonic()
    calm = 0
    while time.monotonic() - started < timeout_s:
        calm = calm + 1 if drained(vllm_gauges(url)) else 0
        if calm >= 2:
            return time.monotonic() - started
        time.sleep(1.0)
    raise RuntimeError(f"vLLM's queue did not drain within {timeout_s:g} s")


# --- the canaries -------------------------------------------------------------------------------------


class CanaryProcess:
    """A real `deploykit canary` in a session of its own, as the chart runs it (`--keep-running`, a verdict
    file), with its store in `tmp`; its output lines are kept with the time each arrived."""

    def __init__(self, name: str, url: str, every_s: float, tmp: Path, model: Path, extra: list[str]) -> None:
        self.name, self.every_s = name, every_s
        self.verdict_path = tmp / f"{name}.verdict.json"
        self.store_path = tmp / f"{name}.sqlite"
        args = ["canary", "--url", url, "--profile", "demo-cpu", "--every", f"{every_s:g}", "--keep-running"]
        args += ["--listen", "127.0.0.1:0", "--store", f"sqlite:///{self.store_path}"]
        args += ["--verdict-file", str(self.verdict_path), *extra]
        env = {**os.environ, "PYTHONPATH": str(REPO), "DEPLOYKIT_MODEL_CACHE": str(model.parent)}
        self.lines: list[tuple[float, str]] = []
        self.process = subprocess.Popen(
            [str(Path(sys.executable).parent / "deploykit"), *args],
            env=env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, pattern: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(re.search(pattern, line) for _, line in list(self.lines)):
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(line for _, line in self.lines[-30:])
                raise RuntimeError(f"canary {self.name}: no line matching {pattern!r}:\n{tail}")
            time.sleep(0.2)

    def between(self, start: float, end: float) -> list[str]:
        return [line for at, line in list(self.lines) if start <= at < end]

    def rows(self) -> list[str]:
        """The stages of the rows it stored so far (sqlite3 directly: the store is a plain SQLite file)."""
        if not self.store_path.exists():
            return []
        try:
            with contextlib.closing(
                sqlite3.connect(f"file:{self.store_path}?mode=ro", uri=True, timeout=10)
            ) as db:
                return [
                    row[0]
                    for row in db.execute("SELECT stage FROM results WHERE command = 'canary' ORDER BY id")
                ]
        except sqlite3.Error:
            return []

    def cpu_s(self) -> float:
        return group_cpu_s(self.process.pid)

    def stop(self) -> None:
        """SIGTERM and its own shutdown; SIGKILL to its group when it does not end (a run stuck on a hang)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


@contextlib.contextmanager
def canaries_watching(
    url: str, model: Path, every_s: float, extra: list[str], tight: bool = True
) -> Iterator[list[CanaryProcess]]:
    """The canaries (default interval, fastest, and with `tight` a fastest one with `TIGHT` deadlines),
    each past its first run; stopped at the end, whatever happened."""
    with tempfile.TemporaryDirectory(prefix="bench-overload-") as tmp:
        started: list[CanaryProcess] = []
        try:
            watching = [
                (f"every-{every_s:g}s", every_s, extra),
                (f"every-{MIN_EVERY_S:g}s", MIN_EVERY_S, extra),
            ]
            if tight:  # misses within minutes: the saturated-or-unreachable judgement under the same load
                watching.append((f"every-{MIN_EVERY_S:g}s-tight", MIN_EVERY_S, [*extra, *TIGHT]))
            for name, every, options in watching:
                started.append(CanaryProcess(name, url, every, Path(tmp), model, options))
            for canary in started:
                canary.wait_for(r"^run 1 ", 300)
            yield started
        finally:
            for canary in started:
                canary.stop()


# --- a phase --------------------------------------------------------------------------------------------


@dataclass
class Sample:
    at: float
    health_ok: bool
    health_s: float
    """How long vLLM's /health took to answer (or the probe's timeout)."""
    status: dict[str, str]
    """Each canary's verdict file's status (`-` when unreadable)."""
    ready: dict[str, pod_probe.Decision]
    live: dict[str, pod_probe.Decision]


def sample(url: str, canaries: list[CanaryProcess], process_start: float | None) -> Sample:
    """What the pod's probes would say now: vLLM's /health as they ask it, and each canary's verdict file
    judged by their own `decide()` (the table is theirs, not this file's)."""
    at = time.monotonic()
    health_ok, detail = pod_probe.check_health(url + "/health", pod_probe.DEFAULT_TIMEOUT_S)
    health_s = time.monotonic() - at
    status: dict[str, str] = {}
    ready: dict[str, pod_probe.Decision] = {}
    live: dict[str, pod_probe.Decision] = {}
    modes: tuple[tuple[pod_probe.Mode, dict[str, pod_probe.Decision]], ...] = (
        ("ready", ready),
        ("live", live),
    )
    for canary in canaries:
        verdict, mtime = pod_probe.read_verdict(str(canary.verdict_path))
        status[canary.name] = str((verdict or {}).get("status", "-"))
        for mode, into in modes:
            into[canary.name] = pod_probe.decide(
                mode,
                health_ok=health_ok,
                verdict=verdict,
                verdict_mtime=mtime,
                process_start=process_start,
                now=time.time(),
                health_detail=detail,
            )
    return Sample(at, health_ok, health_s, status, ready, live)


def held(samples: list[Sample], end: float, value: Callable[[Sample], Any]) -> dict[Any, float]:
    """Seconds per value, each sample's value held until the next sample (the last one until `end`)."""
    seconds: dict[Any, float] = {}
    for this, following in zip(samples, [*samples[1:], None], strict=True):
        key = value(this)
        seconds[key] = seconds.get(key, 0.0) + (following.at if following else end) - this.at
    return seconds


def longest_failing(samples: list[Sample], end: float) -> float:
    """The longest stretch in which every sample found vLLM's /health failing."""
    longest = streak = 0.0
    for this, following in zip(samples, [*samples[1:], None], strict=True):
        streak = 0.0 if this.health_ok else streak + (following.at if following else end) - this.at
        longest = max(longest, streak)
    return longest


@dataclass
class CanaryPhase:
    runs: int
    outcomes: dict[str, int]
    run_p50_s: float | None
    run_p99_s: float | None
    transitions: dict[str, int]
    """Verdict changes into each status (its `state:` lines)."""
    false_alarms: int
    seconds_by_status: dict[str, float]
    not_ready_s: float
    """Seconds the readiness probe failed on this canary's verdict (not on vLLM's /health)."""
    not_live_s: float
    rows: list[str]
    cpu_pct: float


def canary_phase(canary: CanaryProcess, samples: list[Sample], start: float, end: float) -> CanaryPhase:
    """One canary's share of a phase: its output lines, and its verdict as the probes judged it."""
    lines = canary.between(start, end)
    runs = [match for line in lines if (match := RUN_LINE.match(line))]
    took = [float(match[3]) for match in runs]
    transitions = Counter(match[1] for line in lines if (match := STATE_LINE.match(line)))
    name = canary.name
    by_status = held(samples, end, lambda s: s.status[name])
    return CanaryPhase(
        runs=len(runs),
        outcomes=dict(Counter(match[2] for match in runs)),
        run_p50_s=percentile(took, 50),
        run_p99_s=percentile(took, 99),
        transitions=dict(transitions),
        false_alarms=sum(transitions[status] for status in ALARMS),
        seconds_by_status={status: round(value, 1) for status, value in by_status.items()},
        not_ready_s=held(samples, end, lambda s: s.ready[name].verdict_failed).get(True, 0.0),
        not_live_s=held(samples, end, lambda s: s.live[name].verdict_failed).get(True, 0.0),
        rows=[],
        cpu_pct=0.0,
    )


@dataclass
class Phase:
    multiple: float
    seconds: float
    offered_rps: float
    sent_rps: float
    completed_rps: float
    tokens_per_s: float
    """All generated tokens (vLLM's counter: the canaries' too) while the load ran."""
    capped: int
    max_outstanding: int
    outstanding_at_end: int
    errors: dict[str, int]
    max_waiting: float
    max_running: float
    metrics_failed: int
    """Reads of vLLM's /metrics that got no answer within 30 s (the queue is unknown then)."""
    user_p50_s: float | None
    user_p99_s: float | None
    health_fail_s: float
    """Seconds vLLM's own /health did not answer 200 within the probe's 5 s (fails both probes)."""
    health_longest_s: float
    health_max_s: float
    drain_s: float
    generator_cpu_pct: float
    bench_cpu_pct: float
    vllm_cpu_pct: float
    canaries: dict[str, CanaryPhase]
    series: list[list[Any]]
    """Every sample: [s since the start, /health s, /health ok, each canary's status]."""
    queue: list[list[float]]
    """Every read of vLLM's gauges: [s since the start, waiting, running]."""


def run_phase(
    multiple: float,
    capacity: float,
    args: argparse.Namespace,
    url: str,
    pgid: int,
    canaries: list[CanaryProcess],
    process_start: float | None,
) -> Phase:
    """One phase of open-loop load and its drain, judged every `SAMPLE_EVERY_S` throughout: runs that
    waited in the overload end, or miss, in the drain."""
    rate = multiple * capacity
    rows_before = {canary.name: len(canary.rows()) for canary in canaries}
    cpu_before = {canary.name: canary.cpu_s() for canary in canaries}
    vllm_before, bench_before = group_cpu_s(pgid), resource.getrusage(resource.RUSAGE_SELF)
    watch = GaugeWatch(url, SAMPLE_EVERY_S)
    watch.start()
    start = time.monotonic()
    body = payload(args.max_tokens)
    thread = LoadThread(functools.partial(open_loop, url, body, rate, args.phase_s, args.max_outstanding))
    thread.start()
    samples: list[Sample] = []
    while thread.is_alive():
        samples.append(sample(url, canaries, process_start))
        thread.join(max(0.0, samples[-1].at + SAMPLE_EVERY_S - time.monotonic()))
    loaded_end = time.monotonic()
    window = loaded_end - start
    vllm_cpu = group_cpu_s(pgid) - vllm_before
    bench_after = resource.getrusage(resource.RUSAGE_SELF)
    bench_cpu = bench_after.ru_utime + bench_after.ru_stime - bench_before.ru_utime - bench_before.ru_stime
    canary_cpu = {canary.name: canary.cpu_s() - cpu_before[canary.name] for canary in canaries}
    while not any(drained(gauges) for _, gauges in watch.since(loaded_end)):
        if time.monotonic() - loaded_end > 600:
            raise RuntimeError("vLLM's queue did not drain within 600 s of the phase's end")
        samples.append(sample(url, canaries, process_start))
        time.sleep(max(0.0, samples[-1].at + SAMPLE_EVERY_S - time.monotonic()))
    end = time.monotonic()
    watch.stop()
    load = thread.result
    loaded = watch.since(start, loaded_end)
    generated = loaded[-1][1]["generated"] - loaded[0][1]["generated"] if len(loaded) > 1 else 0.0
    counted = loaded[-1][0] - loaded[0][0] if len(loaded) > 1 else math.inf
    readings = watch.since(start, end)
    per_canary = {}
    for canary in canaries:
        judged = canary_phase(canary, samples, start, end)
        judged.rows = canary.rows()[rows_before[canary.name] :]
        judged.cpu_pct = 100 * canary_cpu[canary.name] / window
        per_canary[canary.name] = judged
    return Phase(
        multiple=multiple,
        seconds=args.phase_s,
        offered_rps=rate,
        sent_rps=load.sent / args.phase_s,
        completed_rps=load.completed / args.phase_s,
        tokens_per_s=generated / counted,
        capped=load.capped,
        max_outstanding=load.max_outstanding,
        outstanding_at_end=load.outstanding_at_end,
        errors=dict(load.errors),
        max_waiting=max((gauges["waiting"] for _, gauges in readings), default=math.nan),
        max_running=max((gauges["running"] for _, gauges in readings), default=math.nan),
        metrics_failed=sum(1 for at, gauges in list(watch.readings) if gauges is None and start <= at < end),
        user_p50_s=percentile(load.latencies, 50),
        user_p99_s=percentile(load.latencies, 99),
        health_fail_s=held(samples, end, lambda s: s.health_ok).get(False, 0.0),
        health_longest_s=longest_failing(samples, end),
        health_max_s=max(s.health_s for s in samples),
        drain_s=end - loaded_end,
        generator_cpu_pct=100 * load.cpu_s / window,
        bench_cpu_pct=100 * bench_cpu / window,
        vllm_cpu_pct=100 * vllm_cpu / window,
        canaries=per_canary,
        series=[
            [round(s.at - start, 1), round(s.health_s, 2), s.health_ok, *s.status.values()] for s in samples
        ],
        queue=[[round(at - start, 1), g["waiting"], g["running"]] for at, g in readings],
    )


# --- capacity and the hang ------------------------------------------------------------------------------


@dataclass
class Capacity:
    rps: float
    tokens_per_s: float
    concurrency: int
    levels: list[dict[str, float]]


def measure_capacity(url: str, args: argparse.Namespace) -> Capacity:
    """Closed loop at 1, 2, 4, ... in flight until tokens/s stop growing (`GROWTH`). Tokens from vLLM's
    own counter over the window, not completions: a long request ending just outside it would count as
    nothing. Requests/s is that over `--max-tokens` (every request generates exactly that many)."""
    body = payload(args.max_tokens)
    levels: list[dict[str, float]] = []
    grown: dict[str, float] | None = None
    concurrency = 1
    while concurrency <= args.max_concurrency:
        loop = functools.partial(closed_loop, url, body, concurrency, WARMUP_S + args.capacity_s + 1)
        thread = LoadThread(loop)
        thread.start()
        time.sleep(WARMUP_S)
        first, first_at = vllm_gauges(url), time.monotonic()
        time.sleep(args.capacity_s)
        last, last_at = vllm_gauges(url), time.monotonic()
        thread.join()
        if thread.result.errors or first is None or last is None:
            raise RuntimeError(
                f"concurrency {concurrency}: errors {dict(thread.result.errors)} or no /metrics"
            )
        tokens_per_s = (last["generated"] - first["generated"]) / (last_at - first_at)
        level = {
            "concurrency": concurrency,
            "tokens_per_s": tokens_per_s,
            "rps": tokens_per_s / args.max_tokens,
        }
        print(
            f"  {concurrency} in flight: {tokens_per_s:.0f} tokens/s ({level['rps']:.2f} requests/s)",
            flush=True,
        )
        wait_drained(url)
        levels.append(level)
        if grown is None or tokens_per_s >= (1 + GROWTH) * grown["tokens_per_s"]:
            grown = level  # the last level that grew
        elif concurrency >= 4 * grown["concurrency"]:
            break
        concurrency *= 2
    best = max(levels, key=lambda item: item["tokens_per_s"])
    return Capacity(best["rps"], best["tokens_per_s"], int(best["concurrency"]), levels)


@dataclass
class Hang:
    streams: int
    stalled_s: float | None
    """Seconds from the trigger to vLLM's token counter's last change (read every 0.5 s)."""
    detected_s: dict[str, float | None]
    """Seconds from the trigger to each verdict file's `hung` (None: not within the wait)."""
    live_fails: dict[str, bool]
    """Whether the liveness probe's own judgement of that verdict fails (it must: only a restart helps)."""
    diagnoses: dict[str, str]
    bound_s: float
    """From the moment tokens stopped: `HUNG_AFTER_S` counts from the first read that saw their last change
    (up to one read later), and is seen at the next read; reads `PROGRESS_EVERY_S` apart plus their own
    time (on a busy machine, a second or so)."""


def measure_hang(url: str, canaries: list[CanaryProcess], process_start: float | None, streams: int) -> Hang:
    """The fault worker's marked request under `streams` closed-loop streams (so vLLM's gauges say requests
    wait whatever the canaries' intervals): seconds until each verdict file says `hung`."""
    import httpx

    stop = threading.Event()

    def stream(number: int) -> None:
        # Staggered: streams in step would all end on one engine step, whose gauges then say nothing waits.
        plain = json.loads(payload(64))
        time.sleep(0.37 * number)
        while not stop.is_set():
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(url + "/v1/completions", json=plain, timeout=None)

    def trigger() -> None:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 2, "vllm_xargs": {FAULT_KEY: "hang"}}
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(url + "/v1/completions", json=body, timeout=None)

    for number in range(streams):
        threading.Thread(target=stream, args=(number,), daemon=True).start()
    watch = GaugeWatch(url, 0.5)
    watch.start()
    time.sleep(5)
    sent = time.monotonic()
    threading.Thread(target=trigger, daemon=True).start()
    detected: dict[str, float | None] = dict.fromkeys((c.name for c in canaries), None)
    live_fails = dict.fromkeys(detected, False)
    diagnoses = dict.fromkeys(detected, "")
    deadline = sent + HUNG_AFTER_S + max(c.every_s for c in canaries) + 180
    while None in detected.values() and time.monotonic() < deadline:
        for canary in canaries:
            verdict, mtime = pod_probe.read_verdict(str(canary.verdict_path))
            if detected[canary.name] is None and verdict and verdict.get("status") == "hung":
                detected[canary.name] = time.monotonic() - sent
                health_ok, _ = pod_probe.check_health(url + "/health", pod_probe.DEFAULT_TIMEOUT_S)
                decision = pod_probe.decide(
                    "live",
                    health_ok=health_ok,
                    verdict=verdict,
                    verdict_mtime=mtime,
                    process_start=process_start,
                    now=time.time(),
                )
                live_fails[canary.name] = decision.verdict_failed
                diagnoses[canary.name] = str(verdict.get("diagnosis", ""))
        time.sleep(0.2)
    stop.set()
    watch.stop()
    readings = watch.since(0.0)
    final = readings[-1][1]["generated"] if readings else None
    stalled = next((at - sent for at, gauges in readings if gauges["generated"] == final), None)
    return Hang(streams, stalled, detected, live_fails, diagnoses, HUNG_AFTER_S + 2 * PROGRESS_EVERY_S)


# --- the report ---------------------------------------------------------------------------------------


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def report_lines(
    capacity: Capacity, phases: list[Phase], hang: Hang | None, args: argparse.Namespace, took_s: float
) -> list[str]:
    cores = os.cpu_count() or 1
    extra = f" {' '.join(args.canary_args)}" if args.canary_args else ""
    lines = [
        f"One vLLM replica (CPU build, tiny model) on {cores} cores shared with "
        f"the load generator and the canaries. Requests: a {len(PROMPT.split())}-word prompt, "
        f"{args.max_tokens} tokens each (ignore_eos). Capacity (closed loop, until doubling the requests in "
        f"flight twice adds under {GROWTH:.0%}): {capacity.tokens_per_s:.0f} tokens/s = {capacity.rps:.2f} "
        f"requests/s, at {capacity.concurrency} in flight. Phases: {args.phase_s:g} s of open-loop arrivals, "
        f"at most {args.max_outstanding} outstanding (≈ {args.max_outstanding / capacity.rps:.0f} s of queue "
        f"at capacity). Canaries: `deploykit canary --profile demo-cpu --keep-running --verdict-file ..."
        f"{extra}` (unless those options say otherwise: request timeout 120 s, demo-cpu's smoke timeout; "
        f"miss limit {DEFAULTS.miss_limit}; the `-tight` one adds `{' '.join(TIGHT)}`); verdicts judged "
        f"every {SAMPLE_EVERY_S:g} s by `pod_probe.decide()`; false alarms: transitions into "
        f"{', '.join(ALARMS)}. "
        f"The whole run: {took_s / 60:.0f} min.",
        "",
        "| load | offered/s | sent/s | done/s | max waiting | canary | runs (misses) | run p50 / p99 s "
        "| false alarms | not ready / not live s | saturated s | statuses (s) | rows stored |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for phase in phases:
        for name, canary in phase.canaries.items():
            statuses = ", ".join(f"{k} {v:.0f}" for k, v in sorted(canary.seconds_by_status.items()))
            alarms = ", ".join(f"{k} {canary.transitions.get(k, 0)}" for k in ALARMS)
            rows = f"{len(canary.rows)}" + (f" ({', '.join(canary.rows)})" if canary.rows else "")
            cells = [
                f"{phase.multiple:g}×",
                f"{phase.offered_rps:.1f}",
                f"{phase.sent_rps:.1f}",
                f"{phase.completed_rps:.1f}",
                f"{phase.max_waiting:.0f}",
                name,
                f"{canary.runs} ({canary.outcomes.get('miss', 0)})",
                f"{seconds(canary.run_p50_s)} / {seconds(canary.run_p99_s)}",
                f"{canary.false_alarms} ({alarms})",
                f"{canary.not_ready_s:.0f} / {canary.not_live_s:.0f}",
                f"{canary.seconds_by_status.get('saturated', 0):.0f}",
                statuses,
                rows,
            ]
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for phase in phases:
        canary_cpu = ", ".join(f"{name} {c.cpu_pct:.0f}" for name, c in phase.canaries.items())
        lines.append(
            f"- {phase.multiple:g}×: {phase.tokens_per_s:.0f} tokens/s; users' p50 / p99 "
            f"{seconds(phase.user_p50_s)} / {seconds(phase.user_p99_s)} s (answered ones); max running "
            f"{phase.max_running:.0f}; outstanding at the end {phase.outstanding_at_end} (max "
            f"{phase.max_outstanding}, {phase.capped} arrivals not sent at the cap); errors "
            f"{phase.errors or 0}; /metrics unanswered {phase.metrics_failed}×; vLLM's /health failing "
            f"{phase.health_fail_s:.0f} s (longest stretch {phase.health_longest_s:.0f} s, slowest answer "
            f"{phase.health_max_s:.1f} s); drained in {phase.drain_s:.0f} s. CPU, % of one core: generator "
            f"{phase.generator_cpu_pct:.0f} (the whole bench process {phase.bench_cpu_pct:.0f}), vLLM "
            f"{phase.vllm_cpu_pct:.0f}, canaries {canary_cpu}"
        )
    if hang is not None:
        stalled = hang.stalled_s or 0.0
        found = ", ".join(
            f"{name} {seconds(at)} s after the trigger, {seconds(None if at is None else at - stalled)} s "
            f"after the tokens stopped (liveness {'fails' if hang.live_fails[name] else 'PASSES'})"
            for name, at in hang.detected_s.items()
        )
        lines.append(
            f"- A hung forward pass after the last phase ({hang.streams} streams on; `/health` stays 200): "
            f"vLLM's tokens stopped {seconds(hang.stalled_s)} s after the trigger; `hung`: {found}. Bound: "
            f"{HUNG_AFTER_S:g} s (HUNG_AFTER_S) after the first read that saw the tokens' last change, seen "
            f"at the next read: {hang.bound_s:g} s after they stopped with reads {PROGRESS_EVERY_S:g} s "
            "apart (the canary waits that long after each read ends: a slow read adds its own time)"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--phase-s", type=float, default=600.0, help="seconds of load per multiple")
    parser.add_argument("--multiples", default="1,2,4", help="of the capacity, one phase each")
    parser.add_argument("--every", type=float, default=DEFAULTS.every_s, help="the slower canary's interval")
    parser.add_argument("--max-tokens", type=int, default=512, help="tokens per load request")
    parser.add_argument("--capacity", type=float, help="requests/s: skip the measurement")
    parser.add_argument("--capacity-s", type=float, default=20.0, help="seconds per concurrency level")
    parser.add_argument("--max-concurrency", type=int, default=1024)
    parser.add_argument("--max-outstanding", type=int, default=4000, help="open-loop requests in flight")
    parser.add_argument("--hang-streams", type=int, default=4, help="0: no hang after the phases")
    parser.add_argument(
        "--canary-arg",
        dest="canary_args",
        action="append",
        default=[],
        help="passed to every canary, e.g. --canary-arg=--timeout=10 for a quick look at a miss streak",
    )
    parser.add_argument("--json", type=Path, help="write the raw numbers there")
    parser.add_argument("--no-tight", action="store_true", help="no third canary with TIGHT deadlines")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    multiples = [float(item) for item in args.multiples.split(",")]
    nofile = raise_open_files()
    if args.max_outstanding + 200 > nofile:
        parser.error(
            f"--max-outstanding {args.max_outstanding} needs more open files than the limit {nofile}"
        )
    print(f"load average before: {load_average()}", flush=True)
    model = build_tiny_model()
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": path, TOKENS_ENV: "off"}
    began = time.monotonic()
    with running_vllm([*tiny_serve_args(model), "--worker-cls", WORKER_CLS], env=env) as server:
        url, pgid = server.base_url, server.process.pid
        process_start = pod_probe.process_start_time(pgid)
        with canaries_watching(url, model, args.every, args.canary_args, not args.no_tight) as canaries:
            if args.capacity:
                capacity = Capacity(args.capacity, args.capacity * args.max_tokens, 0, [])
            else:
                print("capacity:", flush=True)
                capacity = measure_capacity(url, args)
            phases = []
            for multiple in multiples:
                rate = multiple * capacity.rps
                print(f"phase {multiple:g}× ({rate:.2f} requests/s) for {args.phase_s:g} s", flush=True)
                phases.append(run_phase(multiple, capacity.rps, args, url, pgid, canaries, process_start))
            hang = (
                measure_hang(url, canaries, process_start, args.hang_streams) if args.hang_streams else None
            )
    took = time.monotonic() - began
    lines = report_lines(capacity, phases, hang, args, took)
    print("\n".join(lines))
    print(f"load average after: {load_average()}")
    if args.json:
        raw = {
            "args": {**vars(args), "json": str(args.json)},
            "capacity": asdict(capacity),
            "phases": [asdict(phase) for phase in phases],
            "hang": asdict(hang) if hang else None,
            "took_s": took,
        }
        args.json.write_text(json.dumps(raw, indent=2, default=str) + "\n")
    if args.write_docs:
        title = "Overload: false alarms at 1×, 2×, 4× capacity (issue 45; `bench/bench_overload.py`)"
        write_section(DOCS, "overload", title, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
