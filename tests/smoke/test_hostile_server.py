"""The smoke against a hostile or broken server (issue 31), over real loopback HTTP (tests/smoke/
hostile_server.py): each case ends within its deadline, within a stated memory cap, with the right verdict
(`wrong` for an answer that cannot be right, `miss` for one that does not come), one result per request,
and `deploykit smoke` stores one row and prints no traceback.

Bounds, with room for a loaded CI machine: a request with a deadline of DEADLINE_S is over within
`DEADLINE_S + DEADLINE_SLACK_S`; a 2 GB answer grows the smoke's child by at most `FLOOD_RSS_CAP_MIB` (the
answer cap is 16 MiB: `deploykit.http_bounded.ANSWER_CAP_BYTES`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from deploykit.endpoint import Endpoint
from deploykit.results.sql.store import open_store
from deploykit.smoke import SmokeRequest, run_smoke
from tests.cli_process import run_deploykit
from tests.smoke.hostile_server import HOSTILE_TEXT, JSON_MODES, MODEL, SHOWN_ESCAPED, Hostile, acted_on

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 1.0  # four trickled bytes (TRICKLE_EVERY_S): a per-read timeout never ends it
DEADLINE_SLACK_S = 8.0
FLOOD_RSS_CAP_MIB = 64

COMPLETION = SmokeRequest(
    "completion",
    "completion",
    "/v1/completions",
    {"model": MODEL, "prompt": "p", "max_tokens": 4, "logprobs": 1, "return_token_ids": True},
)
CHAT = SmokeRequest(
    "chat",
    "chat",
    "/v1/chat/completions",
    {"model": MODEL, "messages": [], "logprobs": True, "top_logprobs": 1, "return_token_ids": True},
)

# What each odd answer must be called (a piece of the one-line diagnosis), for the completion and the chat
# endpoint alike.
ODD = {
    "text-as-number": "not a well-formed",
    "completion-tokens-as-string": "usage.completion_tokens",
    "prompt-tokens-as-string": "usage.prompt_tokens",
    "content-as-list": "not a well-formed",
    "id-infinity": "token_ids.1",
    "id-negative": "impossible",
    "id-10e30": "impossible",
    "id-float": "token_ids.0",
    "id-true": "token_ids.0",
    "id-string": "token_ids.0",
    "no-logprobs": "no logprobs though the request asked for them",
    "nan-as-string": "NaN or infinite",
}


def test_a_good_answer_passes_on_the_same_server() -> None:
    """The control: the hostile server's good answer passes, so each failure below is the answer's."""
    with Hostile("good").serving() as url:
        report = run_smoke(Endpoint(url, request_deadline_s=10), [COMPLETION, CHAT])
    assert report.passed, report.diagnosis


@pytest.mark.parametrize("mode", sorted(ODD))
def test_an_odd_or_impossible_answer_is_wrong_in_one_line(mode: str) -> None:
    assert mode in JSON_MODES
    with Hostile(mode).serving() as url:
        report = run_smoke(Endpoint(url, request_deadline_s=10), [COMPLETION, CHAT])
    assert len(report.cases) == 2 and not report.passed
    for case in report.cases:
        assert not case.passed and not case.miss, case
        assert ODD[mode] in case.diagnosis and "\n" not in case.diagnosis, case.diagnosis
        assert type(case).model_validate_json(case.model_dump_json()) == case  # a row reads back


@pytest.mark.parametrize("mode", ["trickle", "trickle-headers", "hang-after-headers", "hang-before-headers"])
def test_a_slow_or_silent_server_ends_at_the_whole_request_deadline(mode: str) -> None:
    """httpx's timeout was per read: one byte a second kept `smoke --timeout 5` going past 90 s."""
    hostile = Hostile(mode)
    with hostile.serving() as url:
        started = time.monotonic()
        report = run_smoke(Endpoint(url, request_deadline_s=DEADLINE_S), [COMPLETION])
        took = time.monotonic() - started
    assert took < DEADLINE_S + DEADLINE_SLACK_S, f"{mode}: the verdict took {took:.1f} s"
    (case,) = report.cases
    assert not case.passed and case.miss, case
    assert case.diagnosis == f"timeout: no answer within {DEADLINE_S:g} s"


CHILD = """
import json, resource, sys, time
from deploykit.endpoint import Endpoint
from deploykit.smoke import SmokeRequest, run_smoke
request = SmokeRequest(**json.loads(sys.argv[2]))
started = time.monotonic()
report = run_smoke(Endpoint(sys.argv[1], request_deadline_s=60), [request])
case = report.cases[0]
print(json.dumps({
    "passed": case.passed, "miss": case.miss, "diagnosis": case.diagnosis,
    "took": time.monotonic() - started,
    "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def smoke_child(url: str) -> dict[str, Any]:
    """One smoke request in a child process: its verdict and its peak RSS."""
    request = {k: v for k, v in COMPLETION.__dict__.items()}
    result = subprocess.run(
        [sys.executable, "-c", CHILD, url, json.dumps(request)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return dict(json.loads(result.stdout))


@pytest.mark.parametrize("mode", ["flood", "flood-declared"])
def test_a_2_gb_answer_is_stopped_at_the_cap_and_costs_little_memory(mode: str) -> None:
    """A 2 GB answer grew smoke to 11.2 GB RSS. Now the read stops at the 16 MiB answer cap (a declared
    length over it is refused unread): `wrong`, not a miss, and the child's peak RSS stays within
    FLOOD_RSS_CAP_MIB of the same child's on a good answer."""
    with Hostile("good").serving() as url:
        baseline = smoke_child(url)
    with Hostile(mode).serving() as url:
        flooded = smoke_child(url)
    assert baseline["passed"], baseline
    assert not flooded["passed"] and not flooded["miss"], flooded
    assert "16 MiB cap" in flooded["diagnosis"], flooded
    grown = flooded["maxrss_mib"] - baseline["maxrss_mib"]
    print(f"{mode}: peak RSS {flooded['maxrss_mib']:.0f} MiB (good answer: {baseline['maxrss_mib']:.0f} MiB)")
    assert grown < FLOOD_RSS_CAP_MIB, (flooded, baseline)


@pytest.mark.parametrize("mode", ["id-infinity", "text-as-number", "content-as-list", "trickle"])
def test_deploykit_smoke_stores_one_row_and_prints_no_traceback(mode: str, tmp_path: Path) -> None:
    """`text` as a number or an id `Infinity` printed a traceback and stored no row; `content` as a list
    printed PASS and stored a row that read back `unreadable`."""
    store = f"sqlite:///{tmp_path / 'results.sqlite'}"
    with Hostile(mode).serving() as url:
        result = run_deploykit(  # forked from a warm interpreter: tests/cli_process.py
            ["smoke", "--url", url, "--model", MODEL, "--timeout", "1"],
            cwd=REPO,
            env={**os.environ, "DEPLOYKIT_STORE": store, "COLUMNS": "200"},
        )
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    assert result.returncode != 0 and "PASS" not in result.stdout, result.stdout
    opened = open_store(store)
    try:
        rows = opened.recent(limit=10)
    finally:
        opened.close()
    assert len(rows) == 1, rows
    (row,) = rows
    assert not row.passed and not row.unreadable and row.verdict != "pass", row
    assert row.cases and not any(case.passed for case in row.cases if case.name != "fixes"), row.cases


def test_a_servers_escape_sequences_and_markup_are_shown_escaped_and_stored_as_they_came(
    tmp_path: Path,
) -> None:
    """An HTTP 500 whose message clears the screen and prints a green `verdict: PASS` reached the terminal
    raw (issue 43): it is shown escaped, read as no markup, and the stored row keeps the server's words."""
    store = f"sqlite:///{tmp_path / 'results.sqlite'}"
    with Hostile("http-500-escapes").serving() as url:
        result = run_deploykit(
            ["smoke", "--url", url, "--model", MODEL, "--timeout", "5"],
            cwd=REPO,
            env={**os.environ, "DEPLOYKIT_STORE": store, "COLUMNS": "200"},
        )
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output, output
    assert acted_on(output) == [], output
    assert all(shown in result.stdout for shown in SHOWN_ESCAPED), result.stdout
    opened = open_store(store)
    try:
        (row,) = opened.recent(limit=10)
    finally:
        opened.close()
    assert HOSTILE_TEXT in row.diagnosis and all(HOSTILE_TEXT in c.diagnosis for c in row.cases), row
