"""`deploykit gate`'s contradictions are refused before any work, in one line and exit 2; a hostile server is
judged and held, never promoted."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from deploykit import exit_codes
from deploykit.cli.app import app
from tests.cli_runner import CliRunner
from tests.http_server import serving

URL = "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "give the candidate: --url URL"),
        (["--url", URL, "--launch"], "give the candidate"),
        (["--url", URL, "--candidate-python", "/usr/bin/python3"], "a candidate to --launch"),
        (["--url", URL, "--baseline-url", URL, "--baseline-row", "3"], "at most one baseline"),
        (["--url", URL, "--baseline-python", "/usr/bin/python3"], "--baseline-python describes a baseline"),
        (["--url", URL, "--no-store"], "without a store the baseline must be a server"),
        (["--url", URL, "--baseline-url", URL, "--no-store", "--adopt"], "--adopt makes the candidate"),
        (["--url", URL, "--baseline-url", URL, "--accept-drift"], "give it with --adopt"),
        (["--url", "ftp://host/x", "--baseline-url", URL], "--url 'ftp://host/x': expected http://HOST:PORT"),
        (["--url", "http://u:S3cret@h:0", "--baseline-url", URL], "port 0"),
        (["--launch", "--launch-baseline"], "would be the launched baseline itself"),
        (["--url", URL, "--baseline-row", "0"], "--baseline-row"),
    ],
)
def test_contradictions_are_one_line_and_exit_2(args: list[str], says: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["gate", "--profile", "demo-cpu", "--store", f"sqlite:///{tmp_path}/s", *args]
    )
    assert result.exit_code == exit_codes.USAGE, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and says in lines[0], result.output
    assert "S3cret" not in result.output


class Hostile(BaseHTTPRequestHandler):
    """Answers every request 200 with a body that is not an answer."""

    def do_GET(self) -> None:
        self._send(b"<html>not vllm</html>")

    def do_POST(self) -> None:
        self._send(b'{"choices": "nope"}')

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def test_a_candidate_that_answers_nonsense_is_held_broken_and_its_row_stored(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/s.sqlite"
    with serving(Hostile) as bad:
        result = CliRunner().invoke(
            app,
            [
                "gate",
                "--profile",
                "demo-cpu",
                "--url",
                bad,
                "--baseline-url",
                bad,
                "--store",
                store,
                "-f",
                "json",
            ],
        )
    assert result.exit_code == exit_codes.FAILED, result.output
    report = json.loads(result.stdout[result.stdout.index("{") :])
    assert report["verdict"] == "hold" and report["reason"] == "broken"
    assert report["summary"].startswith("the baseline fails on its own")
    from deploykit.results.sql.store import open_store

    opened = open_store(store)
    try:
        (row,) = opened.recent()
    finally:
        opened.close()
    assert row.command == "gate" and row.verdict == "fail" and row.gate is not None
    assert row.diagnosis.startswith("hold: broken")


class Echoes(BaseHTTPRequestHandler):
    """Answers every request 400, quoting the Authorization header it was sent."""

    def do_GET(self) -> None:
        self._send()

    def do_POST(self) -> None:
        self._send()

    def _send(self) -> None:
        body = json.dumps({"error": {"message": f"bad key {self.headers.get('Authorization')}"}}).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def test_a_server_that_echoes_the_key_never_gets_it_into_the_report_the_screen_or_the_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "gatekey-4f9c2a7e1b3d5f60718293a4b5c6d7e8"
    monkeypatch.setenv("SERVING_PASSPHRASE_VAR", key)  # a name that does not look secret: named by the flag
    store = f"sqlite:///{tmp_path}/s.sqlite"
    with serving(Echoes) as echo:
        args = ["gate", "--profile", "demo-cpu", "--url", echo, "--baseline-url", echo, "--store", store]
        result = CliRunner().invoke(app, [*args, "--api-key-env", "SERVING_PASSPHRASE_VAR", "-f", "json"])
    assert result.exit_code == exit_codes.FAILED, result.output
    assert "bad key" in result.output  # the server's words are reported...
    assert key not in result.output  # ...without the key
    from tests.serve_helpers import dump_store

    assert key not in dump_store(store) and "bad key" in dump_store(store)
