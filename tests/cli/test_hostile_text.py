"""Text from a store or a facts file is data on a terminal (issue 43): a stored row whose fields hold escape
sequences and Rich markup (a forged row, a server's own words) is listed and shown with each character a
terminal would act on written as its escape, never read as markup (`[/x]` crashed `results list` and
`results show` for as long as the row was listed), and `--format json` keeps the row's exact words; a
facts file's markup is shown as written, and facts that are no facts (a negative size, a version with a
line break, a GPU name with an escape) are one line naming the file and the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploykit.cli import app
from deploykit.results.record import ResultRecord
from deploykit.results.sql.store import open_store
from deploykit.smoke import CaseResult
from tests.cli_runner import CliRunner
from tests.serve_helpers import BACKENDS, fresh_store_url
from tests.smoke.hostile_server import HOSTILE_TEXT, SHOWN_ESCAPED, acted_on

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts" / "h100.json"


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_store_url(request.param, tmp_path) as url:
        yield url


def hostile_record() -> ResultRecord:
    """A row whose every free-text field holds HOSTILE_TEXT, as a forged row or a server's words would."""
    case = CaseResult(
        name="completion",
        kind="completion",
        endpoint="/v1/completions",
        model=HOSTILE_TEXT,
        passed=False,
        diagnosis=f"HTTP 500: {HOSTILE_TEXT}",
        http_status=500,
        latency_s=0.01,
        text=HOSTILE_TEXT,
        finish_reason=HOSTILE_TEXT,
    )
    return ResultRecord(
        command="smoke",
        hostname=HOSTILE_TEXT,
        profile_name=HOSTILE_TEXT,
        verdict="fail",
        stage="done\x1b[2J[/x]",  # a column of 32 characters
        diagnosis=f"completion: HTTP 500: {HOSTILE_TEXT}",
        plan={"argv": ["vllm", "serve", HOSTILE_TEXT], "env": {"X": HOSTILE_TEXT}},
        versions={"vllm": HOSTILE_TEXT},
        cases=[case],
        fixes_active={HOSTILE_TEXT: HOSTILE_TEXT},
        log_path=f"/tmp/{HOSTILE_TEXT}.log",
        log_tail=f"INFO started\n{HOSTILE_TEXT}\nINFO done",
    )


def test_a_stored_rows_escapes_and_markup_are_shown_escaped_and_json_keeps_them(store_url: str) -> None:
    opened = open_store(store_url)
    try:
        row_id = opened.add(hostile_record())
    finally:
        opened.close()
    runner = CliRunner()
    listed = runner.invoke(app, ["results", "list", "--store", store_url])
    assert listed.exit_code == 0, (listed.output, listed.exception)
    assert acted_on(listed.output) == [] and "[/x] [bold]" in listed.output, listed.output
    shown = runner.invoke(app, ["results", "show", str(row_id), "--store", store_url])
    assert shown.exit_code == 0, (shown.output, shown.exception)
    assert acted_on(shown.output) == [], shown.output
    assert all(part in shown.output for part in SHOWN_ESCAPED), shown.output
    assert "INFO started\n" in shown.output  # the log tail's own lines stay lines
    as_json = runner.invoke(app, ["results", "show", str(row_id), "--store", store_url, "-f", "json"])
    kept = json.loads(as_json.output)
    assert kept["hostname"] == HOSTILE_TEXT and kept["cases"][0]["text"] == HOSTILE_TEXT, kept
    assert acted_on(as_json.output) == [], as_json.output  # JSON escapes them itself
    (listed_json,) = json.loads(
        runner.invoke(app, ["results", "list", "--store", store_url, "-f", "json"]).output
    )
    assert listed_json["diagnosis"] == f"completion: HTTP 500: {HOSTILE_TEXT}"


def facts_file(tmp_path: Path, *changes: tuple[str, object]) -> Path:
    """The H100 facts with each (dotted path, value) change made."""
    facts = json.loads(FACTS.read_text())
    for path, value in changes:
        *parents, last = path.split(".")
        target = facts
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value
    written = tmp_path / "facts.json"
    written.write_text(json.dumps(facts))
    return written


@pytest.mark.parametrize(
    "command",
    [
        ["plan", "--profile", "demo-cpu"],
        ["advisories"],
    ],
)
def test_markup_in_a_gpu_name_is_shown_as_written(tmp_path: Path, command: list[str]) -> None:
    """`[/x]` in a facts file's GPU name crashed `plan` (MarkupError)."""
    name = "H100[/x][bold]80GB"
    facts = facts_file(tmp_path, ("gpus.0.name", name))
    result = CliRunner().invoke(app, [*command, "--facts", str(facts)])
    assert result.exit_code == 0, (result.output, result.exception)
    assert name in result.output, result.output


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        (
            "gpus.0.memory_total_mib",
            -5,
            "gpus.0.memory_total_mib: Input should be greater than or equal to 0",
        ),
        ("gpus.0.memory_free_mib", -1, "gpus.0.memory_free_mib: Input should be greater than or equal to 0"),
        ("gpus.0.index", -1, "gpus.0.index: Input should be greater than or equal to 0"),
        ("vllm_version", "0.33.0\nverdict: PASS", "vllm_version: not a version"),
        ("driver_version", "535.129.03\x1b[2J", "driver_version: not a version"),
        ("cuda_driver_version", "twelve", "cuda_driver_version: not a version"),
        ("gpus.0.name", f"NVIDIA H100 {HOSTILE_TEXT}", "gpus.0.name: holds U+001B"),
        ("gpus.0.name", "NVIDIA \u202eH100", "gpus.0.name: holds U+202E"),
    ],
)
@pytest.mark.parametrize("command", [["plan", "--profile", "demo-cpu"], ["advisories"]])
def test_facts_that_are_no_facts_are_one_line_naming_the_file_and_the_field(
    tmp_path: Path, command: list[str], path: str, value: object, said: str
) -> None:
    facts = facts_file(tmp_path, (path, value))
    result = CliRunner().invoke(app, [*command, "--facts", str(facts)])
    lines = result.output.splitlines()
    assert result.exit_code == 2 and len(lines) == 1, (result.output, result.exception)
    assert lines[0].startswith(f"deploykit: {facts}: ") and said in lines[0], lines
    assert acted_on(result.output) == [], result.output
