"""`deploykit canary` against bad input, as a person runs it (the CLI in a child process, real HTTP servers).

Every refusal is one `deploykit: ...` line on stderr, exit 2, within seconds, with no traceback and nothing
on stdout: numbers that are not numbers (`--every nan` used to send ~10 requests a second forever, `--every
inf` was a traceback), what `deploykit smoke` refuses (`ftp://`, `--timeout 0`), and a URL that is not a
vLLM server (a web server's HTML page used to scroll through the terminal and the rows for ~5 minutes
before the canary said "unreachable"). A server that does not answer yet (vLLM still loading, as in the
chart, where the canary starts beside it) is not refused: its runs are misses, as before.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from deploykit.net import free_port
from deploykit.results.sql.store import open_store
from tests.cli_process import run_deploykit, start_python
from tests.http_server import serving

REPO = Path(__file__).resolve().parents[2]
# A refusal must come in seconds; the bound leaves room for a loaded CI machine's interpreter start-up.
REFUSED_WITHIN_S = 15.0
NGINX_502 = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad Gateway</h1>"
    "</center>\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n"
)
HTML_PAGE = (
    "<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head>\n"
    "<body><h1>It works</h1></body></html>\n"
)


def run_canary(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> tuple[Any, float]:
    started = time.monotonic()
    result = run_deploykit(
        ["canary", *args], timeout=timeout, cwd=REPO, env={**os.environ, "COLUMNS": "200", **(env or {})}
    )
    return result, time.monotonic() - started


def assert_refused(result: Any, took: float, *needles: str) -> str:
    """Exit 2, one `deploykit:` line on stderr naming `needles`, nothing else anywhere; returns the line."""
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("deploykit: "), result.stderr
    assert result.stdout == "", result.stdout  # no run was started, nothing printed as progress
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert took < REFUSED_WITHIN_S, f"refused only after {took:.1f} s"
    return lines[0]


NOT_NUMBERS = [
    (["--every", "nan"], ["--every", "nan"]),
    (["--every", "inf"], ["--every", "inf"]),
    (["--every", "-inf"], ["--every"]),
    (["--every", "0.01"], ["--every", "0.01"]),
    (["--every", "1e20"], ["--every"]),
    (["--timeout", "0"], ["--timeout", "0"]),
    (["--timeout", "nan"], ["--timeout", "nan"]),
    (["--timeout", "-1"], ["--timeout"]),
    (["--miss-limit", "0"], ["--miss-limit"]),
    (["--miss-limit", "1e3"], ["--miss-limit"]),
    (["--metrics-every", "nan"], ["--metrics-every", "nan"]),
    (["--metrics-every", "-1"], ["--metrics-every"]),
    (["--metrics-every", "0.05"], ["--metrics-every", "0.05"]),
]


@pytest.mark.parametrize(
    ("args", "needles"), [pytest.param(*case, id=" ".join(case[0])) for case in NOT_NUMBERS]
)
def test_numbers_that_are_not_numbers_are_refused(args: list[str], needles: list[str]) -> None:
    result, took = run_canary("--url", "http://127.0.0.1:9", "--model", "m", "--no-store", *args)
    assert_refused(result, took, *needles)


@pytest.mark.parametrize(
    "args",
    [
        ["--canary-every", "nan"],
        ["--canary-every", "inf"],
        ["--canary-every", "0.01"],  # issue 31: refused by `canary --every`, accepted by serve
        ["--canary-every", "0.09"],
        ["--restart-backoff", "nan"],
        ["--restart-backoff", "inf"],
        ["--max-restarts-per-hour", "1e3"],
    ],
    ids=" ".join,
)
def test_serve_refuses_canary_numbers_that_are_not_numbers(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before anything starts (these went through `x >= 0` and served with a NaN interval). In
    process, with the attempt replaced: a test that fails must not leave a vLLM behind."""
    from typer.testing import CliRunner

    from deploykit.cli import app

    started: list[Any] = []
    monkeypatch.setattr("deploykit.serve.attempt.run_serve", lambda options: started.append(options) or 0)
    result = CliRunner().invoke(app, ["serve", "-p", "demo-cpu", *args])
    assert result.exit_code == 2 and started == [], (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("deploykit: ") and args[0] in lines[0], result.stderr


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("ftp://127.0.0.1:8000", "expected http://HOST:PORT"),
        ("localhost-8000", "expected http://HOST:PORT"),
        ("http://127.0.0.1:70000", "ports are 1-65535"),
        ("http://127.0.0.1:0", "port 0"),
    ],
)
def test_what_smoke_refuses_the_canary_refuses(url: str, needle: str) -> None:
    result, took = run_canary("--url", url, "--model", "m", "--no-store", "--listen", "127.0.0.1:0")
    assert_refused(result, took, "--url", needle)


def test_a_refused_url_does_not_print_its_password() -> None:
    result, took = run_canary("--url", "ftp://user:S3cret@127.0.0.1:21", "--model", "m", "--no-store")
    line = assert_refused(result, took, "--url", "expected http://HOST:PORT")
    assert "S3cret" not in result.stderr + result.stdout, line


def test_a_malformed_or_busy_listen_address_is_one_line() -> None:
    result, took = run_canary("--url", "http://127.0.0.1:9", "--model", "m", "--listen", "9400")
    assert_refused(result, took, "--listen '9400'", "HOST:PORT")
    with busy_port() as port:
        result, took = run_canary(
            "--url", "http://127.0.0.1:9", "-p", "demo-cpu", "--no-store", "--listen", f"127.0.0.1:{port}"
        )
    assert_refused(result, took, f"--listen 127.0.0.1:{port}", "cannot listen")


def test_an_api_key_variable_that_is_not_set_is_one_line() -> None:
    env = {key: value for key, value in os.environ.items() if key != "DK_TEST_UNSET_KEY"}
    result, took = run_canary(
        "--url", "http://127.0.0.1:9", "-p", "demo-cpu", "--api-key-env", "DK_TEST_UNSET_KEY", env=env
    )
    assert_refused(result, took, "DK_TEST_UNSET_KEY", "not set")


def test_a_bad_profile_is_the_profile_loaders_error_on_stderr() -> None:
    result, _ = run_canary("--url", "http://127.0.0.1:9", "-p", "no-such-profile-anywhere", "--no-store")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == "" and result.stderr.strip().splitlines()[-1].startswith("deploykit: ")
    assert "no-such-profile-anywhere" in result.stderr


# --- a URL that is not vLLM ---------------------------------------------------------------------------


class _PageEverywhere(BaseHTTPRequestHandler):
    """A web app that answers every path with its page, HTTP 200 (a portal, a single-page app)."""

    def do_GET(self) -> None:
        body = HTML_PAGE.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture(params=["static files", "a page everywhere"])
def web_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A web server that is not vLLM, and the words the refusal must name: Python's own static file
    server (an index page; `/v1/models` is its HTML 404 page, POST its HTML 501), or an app that answers
    its page on every path with HTTP 200."""
    if request.param == "a page everywhere":
        with serving(_PageEverywhere) as url:
            yield url, "HTTP 200 with an HTML page titled 'Welcome to nginx!'"
        return
    root = tmp_path / "www"
    root.mkdir()
    (root / "index.html").write_text(HTML_PAGE)

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return

    with serving(functools.partial(Quiet, directory=str(root))) as url:
        yield url, "HTTP 404 with an HTML page titled 'Error response'"


class _JsonHandler(BaseHTTPRequestHandler):
    """Answers every request with `reply` (status, JSON body), as a service that is not vLLM (or a vLLM
    that serves other models, or wants a key) would."""

    reply: tuple[int, Any] = (404, {"detail": "Not Found"})

    def do_GET(self) -> None:
        self._send(*self.reply)

    def do_POST(self) -> None:
        self._send(*self.reply)

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return


def json_server(code: int, body: Any) -> contextlib.AbstractContextManager[str]:
    return serving(type("Reply", (_JsonHandler,), {"reply": (code, body)}))


@pytest.mark.parametrize("how", ["--profile", "--model", "no model"])
def test_a_web_server_is_not_vllm_said_at_once_without_its_html(
    web_server: tuple[str, str], how: str, tmp_path: Path
) -> None:
    """Refused at the first look (with a profile, whose cases need no server to be built, too), in one
    line naming the page's title; no HTML on the terminal or in the store, no row at all."""
    store = f"sqlite:///{tmp_path / 'results.sqlite'}"
    which = {"--profile": ["-p", "demo-cpu"], "--model": ["--model", "tiny"], "no model": []}[how]
    url, answered = web_server
    result, took = run_canary("--url", url, *which, "--store", store, "--listen", "127.0.0.1:0")
    line = assert_refused(result, took, f"{url}/v1/models answered {answered}", "not a vLLM server", "--url")
    assert "<" not in line and "It works" not in line
    assert not (tmp_path / "results.sqlite").exists() or rows(store) == []


def test_a_json_service_that_is_not_vllm_is_refused() -> None:
    with json_server(404, {"detail": "Not Found"}) as url:
        result, took = run_canary("--url", url, "-p", "demo-cpu", "--no-store", "--listen", "127.0.0.1:0")
    assert_refused(result, took, "HTTP 404", "JSON that is not a model list", "not a vLLM server")


def test_a_vllm_serving_another_model_is_refused_not_called_corrupt() -> None:
    models = {"object": "list", "data": [{"id": "other-model", "object": "model"}]}
    with json_server(200, models) as url:
        result, took = run_canary("--url", url, "-p", "demo-cpu", "--no-store", "--listen", "127.0.0.1:0")
    assert_refused(result, took, "does not serve 'tiny'", "other-model")


def test_a_server_that_wants_another_api_key_is_refused_not_called_corrupt() -> None:
    with json_server(401, {"error": "Unauthorized"}) as url:
        result, took = run_canary("--url", url, "-p", "demo-cpu", "--no-store", "--listen", "127.0.0.1:0")
    assert_refused(result, took, "HTTP 401", "--api-key-env")


def test_a_server_that_does_not_answer_yet_is_not_refused(tmp_path: Path) -> None:
    """vLLM still loading (nothing listens on its port): the canary runs, misses, says `unreachable` after
    --miss-limit runs, and stops cleanly on SIGTERM, as before."""
    port = free_port()
    verdict = tmp_path / "verdict.json"
    argv = ["-m", "deploykit", "canary", "--url", f"http://127.0.0.1:{port}", "-p", "demo-cpu"]
    argv += ["--no-store", "--listen", "127.0.0.1:0", "--every", "0.2", "--miss-limit", "2"]
    argv += ["--no-watch-restarts", "--verdict-file", str(verdict)]
    process = start_python(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (verdict.exists() and json.loads(verdict.read_text())["status"] == "unreachable"):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "no unreachable verdict within 60 s"
            time.sleep(0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr and "run 2 completion" not in stderr
    assert "state: unreachable: 2 runs in a row got no answer" in stdout
    assert stdout.rstrip().endswith("canary stopped")


class _VllmBehindABrokenProxy(BaseHTTPRequestHandler):
    """vLLM's model list answers, but every request gets the proxy's HTML 502 page (vLLM went away
    behind it): misses, whose diagnoses must not carry the page."""

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "tiny"}]}), "application/json")
        else:
            self._send(502, NGINX_502, "text/html")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(502, NGINX_502, "text/html")

    def _send(self, code: int, text: str, content_type: str) -> None:
        body = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_a_proxys_error_pages_during_runs_are_named_not_printed(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'results.sqlite'}"
    with serving(_VllmBehindABrokenProxy) as url:
        argv = ["-m", "deploykit", "canary", "--url", url, "-p", "demo-cpu", "--store", store]
        argv += ["--listen", "127.0.0.1:0", "--every", "0.2", "--miss-limit", "2", "--no-watch-restarts"]
        process = start_python(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 180  # a loaded 2-core machine starts Python slowly
            while not any(row.stage == "state:unreachable" for row in rows_if_any(store)):
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "no unreachable row within 180 s"
                time.sleep(0.2)
        finally:
            process.send_signal(signal.SIGTERM)
            stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0 and "Traceback" not in stderr, stderr
    assert "miss" in stdout and "HTTP 502: an HTML page titled '502 Bad Gateway'" in stdout, stdout
    assert "<" not in stdout + stderr, stdout
    stored = rows(store)
    assert [row.stage for row in stored][-1] == "state:unreachable"
    texts = [row.diagnosis for row in stored] + [case.diagnosis or "" for row in stored for case in row.cases]
    assert texts and not any("<" in text for text in texts), texts


# --- helpers ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def busy_port() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def rows_if_any(store_url: str) -> list[Any]:
    """The rows so far; none while the canary has not created the store yet."""
    path = Path(store_url.removeprefix("sqlite:///"))
    return rows(store_url) if path.exists() else []


def rows(store_url: str) -> list[Any]:
    store = open_store(store_url)
    try:
        return list(store.recent(limit=100))
    finally:
        store.close()
