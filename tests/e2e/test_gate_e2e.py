"""`deploykit gate` as a real command against real tiny vLLM servers (the CPU build), no mocks.

Servers, started together once for the module (tests/e2e/gate_servers.py): the three were healthy in 63–79 s
here, against ~50 s each one after another, while other work shared the 2 cores:
  A: the demo flags (float32), with the test-only drift worker (tests/e2e/drift_worker.py), inert until
     triggered: the baseline of every run, and the candidate that drifts in the last test;
  B: the same with `--max-num-seqs 1`: answers as A does, but serves one stream at a time;
  C: the same with `--dtype bfloat16`.

In order (a module runs on one worker, `--dist loadfile`; later tests read what earlier ones stored):
  1. A against itself: promote, its row stored and adopted as its key's (pinned) baseline;
  2. B against A: hold: slower (throughput at 8 streams);
  3. C against A: what a dtype change shows (verdict, known answer, drift);
  4. a candidate the gate launches itself against the stored (adopted) baseline: promote;
  5. A drifted for good against the stored baseline: hold: drift (the fingerprint and the known answer);
     `--adopt` adopts it only with `--accept-drift`, and only where no known answer is missed. Last: the
     drift cannot be undone.
The candidate's own profile (`--candidate-profile`) keys a running candidate (C is keyed bfloat16), and an
accepted drift's row is stored as the gate judged it (`pass`), the store's own comparison on its fingerprint.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from deploykit import exit_codes
from deploykit.gate.model import GateReport, SpeedFinding
from deploykit.profile.schema import KNOWN_ANSWER_PREFIX
from deploykit.results.record import ResultRecord
from deploykit.results.sql.store import open_store
from deploykit.smoke.fingerprint import PROBE_PROMPTS
from tests.e2e.drift_worker import WORKER_CLS
from tests.e2e.gate_servers import ServerSpec, running_vllms
from tests.e2e.test_fingerprint_e2e import deploykit, drift_now, env_for, said
from tests.e2e.test_serve_e2e import START_TIMEOUT_S, demo_variant
from tests.vllm_harness import REPO, RunningServer, tiny_serve_args

# One at a time (`make test`'s last part): the slower verdict rests on the servers' own spread, and a
# neighbour's vLLM on the other core widened A's spread until one-stream-at-a-time B fell inside it (seen
# once in seven runs beside another e2e module).
pytestmark = [pytest.mark.e2e, pytest.mark.runs_alone]

STREAMS = [1, 8]
BUSY = STREAMS[-1]
"""Where B's one sequence at a time shows: 8 streams widen the gap over A's batching (× 0.25-0.44 at 4)."""
# Not the default 0.25: this machine is noisy. A server compared with itself was measured up to 1.37× apart
# at 1 stream while other work shared the 2 cores (and 0.58–1.57× at 4 streams with a load average of 15);
# 0.5 still holds a candidate that serves one stream at a time.
SLOWER_THRESHOLD = 0.5
# Not the defaults (2 requests a stream, 128 tokens each): B's one-sequence steps are faster than A's (~2 ms
# against ~3 ms a token here), so at 128 tokens B reached 0.37-0.68 of A's throughput at 4 streams (promoted
# once); with 64 its serialised per-request work (prefill, first token) weighs more: 0.19-0.46. And the gate
# holds only outside the baseline's own spread (its worst sample): 2 requests of 64 tokens are a 0.3-1 s
# sample, which one stall on a loaded machine halves (A's worst at 4 streams went down to 0.3 of its best, and
# B was promoted); 4 requests a stream kept A's worst above B's best in every run measured here (load 12-21).
OUTPUT_TOKENS = 64
REQUESTS_PER_STREAM = 4
GATE_SPEC = {
    "streams": STREAMS,
    "slower_threshold": SLOWER_THRESHOLD,
    "output_tokens": OUTPUT_TOKENS,
    "requests_per_stream": REQUESTS_PER_STREAM,
}
KNOWN_NAME = "tiny-greedy"
KNOWN_PROMPT = "The capital of France is"
KNOWN_IDS = 8

EXIT_FOR = {"promote": exit_codes.OK, "drift": exit_codes.HOLD, "slower": exit_codes.HOLD}
EXIT_FOR["broken"] = exit_codes.FAILED


@dataclass
class GateModule:
    """What the module's tests share: server A, the profile variants, one store, the commands' environment.

    `profile` carries the known answer (A's own greedy ids); `answers_only` is the same profile without it
    (the same key: known answers are no part of it): a drifted A misses the known answer, and a missed known
    answer is drift no person can accept, so only `answers_only` lets `--accept-drift` adopt it."""

    a: RunningServer
    tmp: Path
    profile: Path
    answers_only: Path
    bfloat16: Path
    """The profile C runs (`serve.dtype: bfloat16`, the same known answer): `--candidate-profile` keys it."""
    store_url: str
    env: dict[str, str]
    known_ids: list[int]
    reports: dict[str, GateReport] = field(default_factory=dict)


@dataclass
class GateRun:
    result: subprocess.CompletedProcess[str]
    report: GateReport
    wall_s: float


@pytest.fixture(scope="module")
def servers(tiny_model_dir: Path) -> Iterator[dict[str, RunningServer]]:
    flags = tiny_serve_args(tiny_model_dir)
    specs = [
        ServerSpec("A", [*flags, "--worker-cls", WORKER_CLS], {"PYTHONPATH": str(REPO)}),
        ServerSpec("B", [*flags, "--max-num-seqs", "1"]),
        # The harness's flags say float32 first; vLLM's parser keeps the last --dtype.
        ServerSpec("C", [*flags, "--dtype", "bfloat16"]),
    ]
    started = time.monotonic()
    with running_vllms(specs) as running:
        shown = ", ".join(f"{name} {server.startup_s:.1f} s" for name, server in running.items())
        print(f"\nservers healthy ({shown}); all three after {time.monotonic() - started:.1f} s")
        yield running


@pytest.fixture(scope="module")
def server_b(servers: dict[str, RunningServer]) -> RunningServer:
    return servers["B"]


@pytest.fixture(scope="module")
def server_c(servers: dict[str, RunningServer]) -> RunningServer:
    return servers["C"]


@pytest.fixture(scope="module")
def gate_module(
    servers: dict[str, RunningServer], tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> GateModule:
    tmp = tmp_path_factory.mktemp("gate")
    a = servers["A"]
    # Before anything else asks A: its greedy answer is the known answer every side must give.
    known_ids = a.completion_ids(KNOWN_PROMPT, max_tokens=KNOWN_IDS)
    assert known_ids, "A gave no ids for the known answer's prompt"
    known = {"name": KNOWN_NAME, "kind": "completion", "prompt": KNOWN_PROMPT, "expect_ids": known_ids}
    # The demo allows 300 s to start; a start took longer here while other sessions shared the cores.
    common = {"gate": GATE_SPEC, "deploy__startup_timeout_s": int(START_TIMEOUT_S)}
    return GateModule(
        a=a,
        tmp=tmp,
        profile=demo_variant(tmp, "tiny-gate", smoke__known_answers=[known], **common),
        answers_only=demo_variant(tmp, "tiny-gate-answers-only", **common),
        bfloat16=demo_variant(
            tmp, "tiny-gate-bf16", serve__dtype="bfloat16", smoke__known_answers=[known], **common
        ),
        store_url=f"sqlite:///{tmp / 'results.sqlite'}",
        env=env_for(tmp, tiny_model_dir),
        known_ids=known_ids,
    )


def gate(module: GateModule, *args: str, profile: Path | None = None) -> GateRun:
    """`deploykit gate --profile P --store S --format json ARGS` as a subprocess, its JSON report read."""
    command = ["gate", "--profile", str(profile or module.profile), "--store", module.store_url]
    command += ["--format", "json"]
    command += ["--log-dir", str(module.tmp / "logs"), *args]
    started = time.monotonic()
    result = deploykit(command, module.env)
    wall = time.monotonic() - started
    assert result.stdout.lstrip().startswith("{"), (
        f"no JSON report (exit {result.returncode}):\n{said(result)}"
    )
    report = GateReport.model_validate_json(result.stdout)
    assert result.returncode == EXIT_FOR[report.reason or "promote"], said(result)
    shown = " ".join(args)
    print(f"\ngate {shown}: {report.label} (exit {result.returncode}, {wall:.1f} s): {report.summary}")
    return GateRun(result, report, wall)


def throughput(report: GateReport, streams: int) -> SpeedFinding | None:
    return next((f for f in report.speed if f.metric == "tokens_per_s" and f.streams == streams), None)


def show_figures(report: GateReport) -> None:
    for streams in STREAMS:
        found = throughput(report, streams)
        if found is not None:
            worst = getattr(found, "baseline_worst", None)  # the baseline's worst sample, where reported
            print(
                f"  tokens/s at {streams} stream(s): baseline {found.baseline:g} (worst {worst}), candidate "
                f"{found.candidate:g}, ratio {found.ratio:.3f}, slower={found.slower}"
            )
    for finding in report.speed:
        if finding.metric != "tokens_per_s":
            at = "" if finding.streams is None else f" at {finding.streams}"
            print(
                f"  {finding.metric}{at}: {finding.baseline:g} → {finding.candidate:g} "
                f"(× {finding.ratio:.3f}, slower={finding.slower})"
            )


def stored(module: GateModule, row_id: int | None) -> ResultRecord:
    assert row_id is not None
    store = open_store(module.store_url)
    try:
        row = store.get(row_id)
    finally:
        store.close()
    assert row is not None and not row.unreadable
    return row


# --- 1. A against itself: promote, adopted --------------------------------------------------------------


def test_a_server_judged_against_itself_is_promoted_and_adopted(gate_module: GateModule) -> None:
    a = gate_module.a.base_url
    run = gate(gate_module, "--url", a, "--baseline-url", a, "--adopt")
    report = run.report
    show_figures(report)
    assert report.verdict == "promote" and report.reason is None, report.summary
    assert report.drift is None and report.speed_judged, report.summary
    at_4 = throughput(report, BUSY)
    assert at_4 is not None and at_4.judged and not at_4.slower, report.speed
    assert [c.name for c in report.candidate.cases if not c.passed] == []
    assert KNOWN_ANSWER_PREFIX + KNOWN_NAME in [c.name for c in report.candidate.cases]

    row = stored(gate_module, report.row_id)
    assert row.command == "gate" and row.verdict == "pass" and row.gate is not None
    assert report.adopted_baseline is not None, said(run.result)

    shown = deploykit(
        ["results", "baseline", "show", "--store", gate_module.store_url, "--format", "json"], gate_module.env
    )
    assert shown.returncode == 0, said(shown)
    baselines = json.loads(shown.stdout)
    adopted = [b for b in baselines if b["id"] == report.adopted_baseline]
    assert adopted, baselines
    assert adopted[0]["pinned"] and adopted[0]["status"] == "active", adopted
    assert adopted[0]["result_id"] == report.row_id, adopted
    assert "adopted by deploykit gate" in adopted[0]["note"]
    gate_module.reports["adopted"] = report


# --- 2. one stream at a time: hold: slower --------------------------------------------------------------


def test_max_num_seqs_1_holds_slower(gate_module: GateModule, server_b: RunningServer) -> None:
    run = gate(gate_module, "--url", server_b.base_url, "--baseline-url", gate_module.a.base_url)
    report = run.report
    show_figures(report)
    assert report.verdict == "hold" and report.reason == "slower", report.summary
    assert report.drift is None, report.drift
    slower = [f for f in report.speed if f.judged and f.slower]
    at_4 = [f for f in slower if f.metric == "tokens_per_s" and f.streams == BUSY]
    assert at_4 and at_4[0].ratio < SLOWER_THRESHOLD, slower
    assert f"tokens_per_s at {BUSY} stream(s)" in report.summary, report.summary
    assert run.result.returncode == exit_codes.HOLD


# --- 3. a bfloat16 candidate: what changes ---------------------------------------------------------------


def test_bfloat16_candidate_reports_what_changes(gate_module: GateModule, server_c: RunningServer) -> None:
    run = gate(
        gate_module,
        "--url",
        server_c.base_url,
        "--candidate-profile",
        str(gate_module.bfloat16),
        "--baseline-url",
        gate_module.a.base_url,
    )
    report = run.report
    gate_module.reports["bfloat16"] = report
    show_figures(report)
    print(f"  bf16 verdict: {report.label}: {report.summary}")
    print(f"  changed: {report.changed}")
    names = {c.name: c for c in report.candidate.cases}
    known = names.get(KNOWN_ANSWER_PREFIX + KNOWN_NAME)
    assert known is not None, sorted(names)
    print(f"  known answer {known.name}: {'PASS' if known.passed else 'FAIL: ' + known.diagnosis}")
    assert run.result.returncode == EXIT_FOR[report.reason or "promote"]
    if report.reason == "drift" and report.drift is None:  # no position of the baseline's leads clearly
        assert "cannot be compared" in report.summary, report.summary
    elif report.reason == "drift":
        drift = report.drift
        assert drift is not None
        assert drift.case in PROBE_PROMPTS and drift.position >= 0, drift
        assert isinstance(drift.expected_id, int) and isinstance(drift.near_tie, bool), drift
        assert f"at generated position {drift.position}" in report.summary, report.summary
        print(f"  drift: {drift.text} (near_tie={drift.near_tie})")


def test_bfloat16_candidate_changes_the_dtype(gate_module: GateModule) -> None:
    report = gate_module.reports.get("bfloat16")
    if report is None:
        pytest.skip("needs the bfloat16 candidate's report")
    assert report.changed.get("dtype") == ["float32", "bfloat16"], report.changed
    assert report.candidate.key_parts.get("dtype") == "bfloat16", report.candidate.key_parts


# --- 4. a candidate the gate launches, against the stored baseline ---------------------------------------


def test_a_launched_candidate_against_the_stored_baseline(gate_module: GateModule) -> None:
    adopted = gate_module.reports.get("adopted")
    if adopted is None:
        pytest.skip("needs the baseline adopted by the first test")
    run = gate(gate_module, "--launch", "--no-load")
    report = run.report
    print(f"  launched candidate against the stored baseline: {run.wall_s:.1f} s wall")
    assert report.baseline.source.startswith(f"stored baseline #{adopted.adopted_baseline} "), (
        report.baseline.source
    )
    assert f"row #{adopted.row_id}" in report.baseline.source, report.baseline.source
    assert report.candidate.source == "launched", report.candidate.source
    assert report.verdict == "promote" and report.reason is None, report.summary
    assert report.drift is None and not report.speed_judged
    assert report.candidate.figures is not None and report.candidate.figures.startup_s
    print(f"  launched candidate healthy after {report.candidate.figures.startup_s:.1f} s")
    pids = [
        int(line.split("pid ", 1)[1].split(",", 1)[0])
        for line in run.result.stderr.splitlines()
        if " started, pid " in line
    ]
    assert len(pids) == 1, run.result.stderr
    assert not Path(f"/proc/{pids[0]}").exists() or _zombie(pids[0]), "the launched vLLM was left running"


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# --- 5. last: A drifts for good ---------------------------------------------------------------------------


def test_drift_holds_against_the_adopted_baseline(gate_module: GateModule) -> None:
    adopted = gate_module.reports.get("adopted")
    if adopted is None:
        pytest.skip("needs the baseline adopted by the first test")
    a = gate_module.a.base_url
    drift_now(a)

    held = gate(gate_module, "--url", a)
    report = held.report
    show_figures(report)
    assert report.baseline.source.startswith(f"stored baseline #{adopted.adopted_baseline} "), (
        report.baseline.source
    )
    assert report.verdict == "hold" and report.reason == "drift", report.summary
    assert held.result.returncode == exit_codes.HOLD
    assert report.speed_judged, report.speed  # the stored baseline's figures against the live candidate's
    drift = report.drift
    assert drift is not None and drift.case in PROBE_PROMPTS, drift
    assert drift.got_id != drift.expected_id, drift
    assert f"at generated position {drift.position}" in report.summary, report.summary
    # The known answer is A's own greedy answer from before the drift: the drifted A misses it too.
    missed = [c.name for c in report.candidate.cases if not c.passed]
    assert missed == [KNOWN_ANSWER_PREFIX + KNOWN_NAME], missed
    assert report.adopted_baseline is None
    print(f"  drift: {drift.text} (near_tie={drift.near_tie})")

    # Answers only from here: adoption is the point, and the drifted server's speed was judged above.
    answers = ("--url", a, "--adopt", "--no-load")
    refused = gate(gate_module, *answers)
    assert refused.report.reason == "drift" and refused.report.adopted_baseline is None, refused.report
    assert refused.result.returncode == exit_codes.HOLD
    assert "not adopted: the verdict is hold: drift" in refused.result.stderr, said(refused.result)

    # A missed known answer is not the fingerprint's drift alone: no person's word adopts it.
    known_held = gate(gate_module, *answers, "--accept-drift")
    assert known_held.report.reason == "drift" and not known_held.report.accepted_drift, known_held.report
    assert known_held.report.adopted_baseline is None and known_held.result.returncode == exit_codes.HOLD

    # Without the known answer, the fingerprint's drift alone is a person's to accept.
    accepted = gate(gate_module, *answers, "--accept-drift", profile=gate_module.answers_only)
    assert accepted.report.verdict == "promote" and accepted.report.accepted_drift, accepted.report.summary
    assert accepted.report.drift is not None  # still reported: a person accepted it
    assert accepted.report.adopted_baseline is not None, said(accepted.result)
    assert accepted.report.adopted_baseline != adopted.adopted_baseline
    assert accepted.result.returncode == exit_codes.OK
    gate_module.reports["accepted"] = accepted.report


def test_an_accepted_drift_is_stored_as_the_gate_judged_it(gate_module: GateModule) -> None:
    """Reads the store only: what the last test's `--adopt --accept-drift` left there."""
    report = gate_module.reports.get("accepted")
    if report is None:
        pytest.skip("needs the accepted drift's report")
    row = stored(gate_module, report.row_id)
    assert row.gate is not None and row.gate["verdict"] == "promote"
    assert row.verdict == "pass", f"{row.verdict}: {row.diagnosis}"
