"""Issue 30, points 3 and 4, as a person runs the commands: an API key with a line break or a non-ASCII
character, and a URL with a password, each end in one line that names the variable or shows the URL
redacted, never the secret: not on the terminal, not in the stored row. A real loopback server answers."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import ClassVar

import pytest

from tests.cli_process import run_deploykit
from tests.http_server import serving

KEY = "sk-live-0123456789abcdefXYZ"
PASSWORD = "Pa55w0rd-never-shown"


class Recorder(BaseHTTPRequestHandler):
    """Answers every request 404 and remembers the Authorization headers it saw."""

    seen: ClassVar[list[str]] = []

    def _answer(self) -> None:
        Recorder.seen.append(self.headers.get("Authorization", ""))
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serving(Recorder) as url:
        yield url


def deploykit(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_deploykit(args, env={**os.environ, **env})


def stored_bytes(store: Path) -> bytes:
    return b"".join(path.read_bytes() for path in store.parent.glob(f"{store.name}*"))


@pytest.mark.parametrize(
    ("value", "word"), [(f"{KEY}\n", "U+000A"), (f"{KEY}\r\n", "U+000D"), (f"{KEY}é", "ASCII")]
)
def test_smoke_refuses_a_key_it_cannot_send_in_one_line(
    server: str, tmp_path: Path, value: str, word: str
) -> None:
    store = tmp_path / "results.sqlite"
    before = len(Recorder.seen)
    args = [
        "smoke",
        "--url",
        server,
        "--model",
        "m",
        "--api-key-env",
        "DK_KEY",
        "--store",
        f"sqlite:///{store}",
    ]
    done = deploykit(args, {"DK_KEY": value})
    shown = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in shown
    assert KEY not in shown and "DK_KEY" in shown and word in shown, shown
    assert len(Recorder.seen) == before  # nothing was sent with it
    assert KEY.encode() not in stored_bytes(store)
    listed = deploykit(["results", "list", "--store", f"sqlite:///{store}"], {})
    assert KEY not in listed.stdout + listed.stderr


@pytest.mark.parametrize("value", [f"{KEY}\n", f"{KEY}é"])
def test_the_canary_refuses_a_key_it_cannot_send_in_one_line(server: str, value: str) -> None:
    args = ["canary", "--url", server, "--model", "m", "--api-key-env", "DK_KEY", "--no-store"]
    done = deploykit(args, {"DK_KEY": value})
    shown = done.stdout + done.stderr
    assert done.returncode != 0 and "Traceback" not in shown
    assert KEY not in shown and "DK_KEY" in shown, shown
    assert len([line for line in shown.splitlines() if "DK_KEY" in line]) == 1


def test_smoke_url_password_is_never_printed_or_stored(server: str, tmp_path: Path) -> None:
    store = tmp_path / "results.sqlite"
    url = server.replace("http://", f"http://user:{PASSWORD}@")
    done = deploykit(["smoke", "--url", url, "--model", "m", "--store", f"sqlite:///{store}"], {})
    shown = done.stdout + done.stderr
    assert "request(s) against http://user:***@127.0.0.1:" in shown, shown
    assert PASSWORD not in shown
    assert PASSWORD.encode() not in stored_bytes(store)
