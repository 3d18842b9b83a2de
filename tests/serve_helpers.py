"""Store back-ends for tests: a fresh SQLite file, or a fresh schema in the real PostgreSQL that
tools/ci-services.sh starts on 127.0.0.1. Used by the store tests and the serve end-to-end tests."""

from __future__ import annotations

import os
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
import sqlalchemy as sa

from deploykit.results.record import ResultRecord
from deploykit.results.sql.store import open_store

PG_URL = os.environ.get(
    "DEPLOYKIT_TEST_PG_URL", "postgresql+psycopg://deploykit:deploykit@127.0.0.1:5432/deploykit_test"
)
BACKENDS = ("sqlite", "postgresql")


def _pg_unavailable(reason: str) -> None:
    message = f"PostgreSQL for the store tests is not reachable ({reason}); run `bash tools/ci-services.sh`"
    if os.environ.get("CI"):
        pytest.fail(message)  # CI must prove the PostgreSQL path, never skip it
    pytest.skip(message)


@contextmanager
def fresh_pg_url() -> Iterator[str]:
    """A store URL whose search_path is a new, empty schema; dropped afterwards."""
    admin = sa.create_engine(PG_URL)
    schema = f"t_{uuid.uuid4().hex[:12]}"
    try:
        with admin.begin() as conn:
            conn.execute(sa.schema.CreateSchema(schema))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        _pg_unavailable(str(exc.orig).strip().splitlines()[0])
    try:
        yield f"{PG_URL}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(sa.schema.DropSchema(schema, cascade=True))
        admin.dispose()


@contextmanager
def fresh_store_url(backend: str, tmp_path: Path) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'results.sqlite'}"
    else:
        with fresh_pg_url() as url:
            yield url


def dump_store(url: str) -> str:
    """Every stored row as text, to search for things that must not be there."""
    from deploykit.results.sql.store import open_store

    store = open_store(url)
    try:
        return "\n".join(r.model_dump_json() for r in store.recent(limit=10_000))
    finally:
        store.close()


# --- running the real `deploykit` command -----------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]


def deploykit_executable() -> str:
    import sys

    return str(Path(sys.executable).parent / "deploykit")


class CommandRun:
    """`deploykit ...` as a real subprocess in its own session; its output is read line by line."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        import queue
        import subprocess
        import threading

        self.args = args
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.process = subprocess.Popen(
            [deploykit_executable(), *args],
            env=env,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def _drain(self, timeout: float) -> bool:
        """Move waiting lines into `lines`; False once the output has ended."""
        import queue

        try:
            line = self._queue.get(timeout=timeout)
        except queue.Empty:
            return True
        if line is None:
            self._queue.put(None)
            return False
        self.lines.append(line)
        return True

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        """The first output line matching `pattern` (a regex); fails with the output when it never comes."""
        import time

        deadline = time.monotonic() + timeout
        checked = 0
        while True:
            for line in self.lines[checked:]:
                match = re.search(pattern, line)
                if match:
                    return match
            checked = len(self.lines)
            if time.monotonic() > deadline:
                raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n{self.tail()}")
            if not self._drain(0.5) and checked == len(self.lines):
                raise AssertionError(f"`deploykit` ended before printing {pattern!r}:\n{self.tail()}")

    def finish(self, timeout: float) -> int:
        code = self.process.wait(timeout=timeout)
        while self._drain(2):
            pass
        return code

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.lines[-lines:])

    def vllm_pid(self) -> int | None:
        for line in self.lines:
            match = re.search(r"vLLM started: pid (\d+)", line)
            if match:
                return int(match.group(1))
        return None

    def kill_everything(self) -> None:
        """Test teardown only: whatever is left of this run, its session and vLLM's group, is killed."""
        import signal

        for group in {self.process.pid, self.vllm_pid()}:
            if group is not None:
                with suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self, timeout: float) -> None:
        """Test teardown: SIGTERM if still running and wait for deploykit to finish; kill what is left."""
        import signal

        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.finish(timeout)
        except Exception:
            self.kill_everything()


def group_members(pgid: int) -> list[int]:
    """Live processes whose process group is `pgid` (zombies excluded)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, group = fields[0], int(fields[2])
        if group == pgid and state != "Z":
            members.append(int(entry.name))
    return members


def read_proc(pid: int, name: str) -> bytes:
    try:
        return (Path("/proc") / str(pid) / name).read_bytes()
    except OSError:
        return b""


@contextmanager
def completion_streams(base_url: str, count: int, model: str = "tiny") -> Iterator[list[str]]:
    """`count` greedy completion streams, one after another on each of `count` threads, for the `with`
    body's duration: the load the no-false-alarm checks run under. Yields the list of errors seen."""
    import httpx

    body = {
        "model": model,
        "prompt": "Once upon a time there was",
        "max_tokens": 48,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    stop, errors = threading.Event(), []

    def stream() -> None:
        # A new connection for each stream: uvicorn closes a connection idle for 5 s, and a thread that
        # a loaded machine kept waiting that long could send on a connection closing under it (seen once:
        # "Server disconnected without sending a response", an error of the load, not of the server).
        fresh = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(base_url=base_url, timeout=300, limits=fresh) as client:
            while not stop.is_set():
                try:
                    with client.stream("POST", "/v1/completions", json=body) as response:
                        for _ in response.iter_lines():
                            pass
                        if response.status_code != 200:
                            errors.append(f"HTTP {response.status_code}")
                except httpx.HTTPError as exc:
                    errors.append(repr(exc))

    threads = [threading.Thread(target=stream, name=f"load-stream-{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    try:
        yield errors
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=300)


def only_row(url: str) -> ResultRecord:
    """The attempt's one row; the in-process canary's own rows (serving mode) are not the attempt's."""
    store = open_store(url)
    try:
        rows = [r for r in store.recent(limit=100) if r.command != "canary"]
    finally:
        store.close()
    assert len(rows) == 1, [r.diagnosis for r in rows]
    return rows[0]
