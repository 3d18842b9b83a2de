"""`deploykit trace` wall time against the same smoke without trace, on the tiny demo model.

Same machine, same profile (demo-cpu), same vLLM argv (eager, --max-num-seqs 1), same requests:
  untraced — start `vllm serve` with the trace argv but without DEPLOYKIT_TRACE, wait for /health, send the
             profile's smoke cases one at a time, stop the process group;
  traced   — `run_trace` (the `deploykit trace` command without the CLI): the same, with every module hooked,
             then reading and analysing the trace.
Reported: whole wall time (start-up included) and the requests alone (where the hooks cost), as ratios;
goal ≤ 2×. Also: with DEPLOYKIT_TRACE unset the plugin's register() imports nothing of the trace and
hooks nothing (checked in a fresh interpreter, with its time).
Run: .venv/bin/python bench/bench_trace.py [--rounds N] [--max-tokens N] [--no-doc]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("DEPLOYKIT_MODEL_CACHE", str(REPO / ".deploykit-cache" / "models"))
os.environ.update({"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"})
os.environ.pop("DEPLOYKIT_TRACE", None)

from bench.benchmarks_doc import DOCS, write_section  # noqa: E402

PROFILE = "demo-cpu"
TITLE = "`deploykit trace` against the same smoke untraced (bench/bench_trace.py)"


def untraced(max_tokens: int, log_dir: Path) -> dict[str, float]:
    from deploykit.endpoint import Endpoint
    from deploykit.net import free_port
    from deploykit.plan import make_plan
    from deploykit.probe.load import probe
    from deploykit.profile.load import load_profile
    from deploykit.serve.helpers import resolve_executable
    from deploykit.serve.launch import start_server
    from deploykit.serve.stages import launch_environment
    from deploykit.smoke import smoke_requests
    from deploykit.trace.run import send_cases, trace_argv, trace_cases

    started = time.perf_counter()
    loaded = load_profile(PROFILE)
    plan = make_plan(loaded, probe(), {})
    port = free_port()
    argv = resolve_executable(trace_argv(plan.argv, port))
    env = launch_environment(plan, os.environ)
    server = start_server(argv, env, log_path=log_dir / f"untraced-{port}.log", host="127.0.0.1", port=port)
    try:
        server.wait_healthy(loaded.profile.deploy.startup_timeout_s, poll_s=0.2)
        cases = trace_cases(loaded.profile, None, None, max_tokens)
        requests = smoke_requests(cases, loaded.profile.served_name)
        requests_started = time.perf_counter()
        endpoint = Endpoint(server.base_url, request_deadline_s=120)
        results, _ = send_cases(endpoint, requests, special_ids=frozenset())
        requests_s = time.perf_counter() - requests_started
        assert results and all(r.passed for r in results), [r.diagnosis for r in results]
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert "deploykit trace: hooked" not in log, "an untraced server hooked the model"
    return {"total_s": time.perf_counter() - started, "requests_s": requests_s}


def traced(max_tokens: int, log_dir: Path) -> dict[str, float]:
    from deploykit.trace.run import TraceOptions, run_trace

    started = time.perf_counter()
    code, report = run_trace(
        TraceOptions(
            profile=PROFILE,
            store_url=f"sqlite:///{log_dir / 'results.sqlite'}",
            log_dir=log_dir,
            max_tokens=max_tokens,
        )
    )
    total = time.perf_counter() - started
    assert code == 0 and report is not None and report.first is None, report
    from deploykit.results.sql.store import open_store

    store = open_store(f"sqlite:///{log_dir / 'results.sqlite'}")
    try:
        row = store.recent(limit=1)[0]
    finally:
        store.close()
    return {
        "total_s": total,
        "requests_s": float(row.timings["requests_s"] or 0.0),
        "modules": float(report.modules_hooked),
    }


def plugin_cost(runs: int = 5) -> dict[str, float | bool]:
    """A fresh interpreter: import the plugin and call register() with DEPLOYKIT_TRACE and DEPLOYKIT_FIXES
    unset; is any trace module (or torch) imported, and how long does register() take?"""
    code = (
        "import sys, time\n"
        "from deploykit.vllm_plugin import entry\n"
        "t = time.perf_counter(); entry.register(); dt = time.perf_counter() - t\n"
        "prefixes = ('deploykit.trace', 'deploykit.vllm_plugin.trace')\n"
        "traced = any(m.startswith(prefixes) for m in sys.modules)\n"
        "print(dt, traced, 'torch' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("DEPLOYKIT_TRACE", "DEPLOYKIT_FIXES")}
    env["PYTHONPATH"] = str(REPO)
    times, imported = [], False
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
        )
        seconds, trace_imported, torch_imported = out.stdout.split()
        times.append(float(seconds))
        imported = imported or trace_imported == "True" or torch_imported == "True"
    return {"register_us": statistics.median(times) * 1e6, "imported": imported}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        log_dir = Path(folder)
        for round_index in range(args.rounds):
            # alternate the order: on a shared machine, load drifts between the two runs of a round
            if round_index % 2:
                trace = traced(args.max_tokens, log_dir)
                base = untraced(args.max_tokens, log_dir)
            else:
                base = untraced(args.max_tokens, log_dir)
                trace = traced(args.max_tokens, log_dir)
            rows.append((base, trace))
            print(
                f"round {round_index + 1}: untraced {base['total_s']:.1f} s "
                f"(requests {base['requests_s']:.2f} s), traced {trace['total_s']:.1f} s "
                f"(requests {trace['requests_s']:.2f} s)",
                flush=True,
            )
    base_total = statistics.median(b["total_s"] for b, _ in rows)
    trace_total = statistics.median(t["total_s"] for _, t in rows)
    base_req = statistics.median(b["requests_s"] for b, _ in rows)
    trace_req = statistics.median(t["requests_s"] for _, t in rows)
    modules = int(rows[0][1]["modules"])
    cost = plugin_cost()
    ratio = trace_total / base_total
    print(
        f"trace / untraced wall time: {ratio:.2f}x (goal <= 2x); requests alone: {trace_req / base_req:.2f}x"
    )
    print(f"register() without DEPLOYKIT_TRACE: {cost['register_us']:.0f} us, imported: {cost['imported']}")
    if args.no_doc:
        return
    body = "\n".join(
        [
            f"Profile `{PROFILE}` (tiny Llama, {modules} modules hooked), the profile's smoke cases "
            f"(completion + chat, {args.max_tokens} tokens each), vLLM CPU build eager with "
            f"`--max-num-seqs 1` in both runs; median of {args.rounds} round(s) on a 2-core machine "
            "shared with other work (load average 6–10 during the runs; the order alternates per round).",
            "",
            "| | untraced | `deploykit trace` | ratio |",
            "|---|---|---|---|",
            f"| wall time, start to stop | {base_total:.1f} s | {trace_total:.1f} s | {ratio:.2f}x |",
            f"| the requests alone | {base_req:.2f} s | {trace_req:.2f} s | {trace_req / base_req:.2f}x |",
            "",
            f"Goal ≤ 2x: {'met' if ratio <= 2 else 'NOT met'}. Start-up dominates the wall time; the hooks "
            "cost shows in the requests (a finiteness check on every module's inputs and output).",
            "",
            "Serving without `trace`: in a fresh interpreter with `DEPLOYKIT_TRACE` unset, the plugin's "
            f"`register()` took {cost['register_us']:.0f} µs and imported "
            f"{'SOMETHING' if cost['imported'] else 'nothing'} of deploykit.trace (nor torch); the untraced "
            "server's log has no `deploykit trace: hooked` line.",
        ]
    )
    write_section(DOCS, "trace", TITLE, body)


if __name__ == "__main__":
    main()
