"""No lost rows: a store that goes away while a command runs keeps its row in the spool, and the next command
that reaches the store writes it, once. A real PostgreSQL behind a TCP proxy (tests/tcp_proxy.py) that is cut
while a smoke's cases run, and a canary started against a closed port; real `deploykit` processes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from deploykit.canary.runner import Canary, CanaryConfig
from deploykit.profile.schema import SmokeCase
from deploykit.results.record import ResultRecord
from deploykit.results.spool import pending
from deploykit.results.sql.store import open_store
from tests.canary.test_canary import GOOD, WRONG, Clock, Script
from tests.cli_process import run_deploykit, start_python
from tests.http_server import serving
from tests.serve_helpers import fresh_pg_url
from tests.tcp_proxy import TcpProxy, free_loopback_port
from tests.vllm_harness import RunningServer


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_pg_url() as url:
        yield url


def through(url: str, port: int) -> str:
    """`url` with its host and port those of a proxy on this machine."""
    return sa.engine.make_url(url).set(host="127.0.0.1", port=port).render_as_string(hide_password=False)


def target_of(url: str) -> tuple[str, int]:
    parsed = sa.engine.make_url(url)
    return parsed.host or "127.0.0.1", parsed.port or 5432


def rows_in(url: str) -> list[ResultRecord]:
    store = open_store(url, migrate=False)
    try:
        return store.recent(limit=1000)
    finally:
        store.close()


def deploykit(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_deploykit(argv, timeout=300)  # forked from a warm interpreter: tests/cli_process.py


def test_a_store_cut_mid_smoke_gets_the_row_once_it_is_back(pg_url: str, tmp_path: Path) -> None:
    proxy = TcpProxy(target_of(pg_url)).start()
    store_url = through(pg_url, proxy.port)
    open_store(store_url).close()  # migrated through the proxy, as a fleet's first host does

    class CutsTheStore(BaseHTTPRequestHandler):
        """The server being smoked: its first request cuts the store (the cases run while it is away)."""

        def do_POST(self) -> None:
            proxy.stop()
            self.send_response(500)
            self.end_headers()

        do_GET = do_POST

        def log_message(self, *_: object) -> None:
            pass

    try:
        with serving(CutsTheStore) as server:
            smoked = deploykit("smoke", "--url", server, "--model", "m", "--store", store_url)
        assert smoked.returncode == 1, smoked.stderr  # the verdict's code: FAIL (the server answered 500)
        assert "verdict: FAIL" in smoked.stdout and "Traceback" not in smoked.stderr
        said = [line for line in smoked.stderr.splitlines() if line.strip()]
        assert len(said) == 1 and "spooled in" in said[0] and "lost" not in said[0], said
        assert "deploykit:" not in smoked.stdout
        assert rows_in(pg_url) == []
        (spooled,) = pending(store_url)
        kept = tmp_path / "kept-copy.json"
        shutil.copy(spooled, kept)

        proxy.start()  # the store is back: the next command that reaches it writes the row first
        listed = deploykit("results", "list", "--store", store_url, "-f", "json")
        assert listed.returncode == 0, listed.stderr
        assert "1 spooled row(s) written" in listed.stderr
        (row,) = json.loads(listed.stdout)
        assert (row["command"], row["verdict"], row["base_url"]) == ("smoke", "fail", server)
        assert row["row_uuid"] == spooled.name.removesuffix(".row.json")
        assert pending(store_url) == []

        # Replayed again (a process that read the file before the first replay removed it): still one row.
        shutil.copy(kept, spooled)
        again = open_store(store_url)
        again.close()
        assert again.replayed == 1 and pending(store_url) == []
        assert [r.row_uuid for r in rows_in(pg_url)] == [row["row_uuid"]]
    finally:
        proxy.close()


def test_a_canary_started_against_a_closed_port_keeps_every_row(
    pg_url: str,
) -> None:
    port = free_loopback_port()  # nothing listens there yet
    store_url = through(pg_url, port)
    warnings: list[str] = []
    clock = Clock()
    config = CanaryConfig(
        url="http://127.0.0.1:1",
        served_name="tiny",
        cases=[SmokeCase(kind="completion")],
        store_url=store_url,
    )
    canary = Canary(config, clock=clock, runner=Script(GOOD, GOOD, WRONG, WRONG, GOOD, GOOD))
    canary.on_warning = warnings.append
    for _ in range(6):
        canary.run_once()
        clock.now += 3700  # past the hourly heartbeat: every run keeps a row
    kept = [r.row_uuid for r in canary.rows]
    assert len(kept) == 6 and len(pending(store_url)) == 6
    assert warnings and all("spooled in" in w and "lost" not in w for w in warnings), warnings

    proxy = TcpProxy(target_of(pg_url), port=port).start()
    try:
        store = open_store(store_url)
        store.close()
        assert store.replayed == 6 and pending(store_url) == []
        rows = list(reversed(rows_in(pg_url)))
        assert [r.row_uuid for r in rows] == kept  # every row, in the order made, once
        assert [r.stage for r in rows] == [r.stage for r in canary.rows]
        again = open_store(store_url)
        again.close()
        assert again.replayed == 0 and len(rows_in(pg_url)) == 6
    finally:
        proxy.close()


def test_a_passing_smoke_of_a_real_vllm_whose_store_is_cut_exits_0_and_its_row_arrives(
    pg_url: str, tiny_vllm: RunningServer
) -> None:
    """The issue's case: a PASS whose PostgreSQL went away while the cases ran used to warn, exit 0 and drop
    the row. The smoke reaches the real vLLM through a second proxy whose first connection cuts the store."""
    store_proxy = TcpProxy(target_of(pg_url)).start()
    store_url = through(pg_url, store_proxy.port)
    open_store(store_url).close()
    server = httpx.URL(tiny_vllm.base_url)
    vllm_proxy = TcpProxy((server.host, server.port or 80), on_connect=store_proxy.stop).start()
    try:
        smoked = deploykit(
            "smoke", "--url", f"http://127.0.0.1:{vllm_proxy.port}", "--model", tiny_vllm.served_name,
            "--store", store_url,
        )  # fmt: skip
        assert smoked.returncode == 0, smoked.stdout + smoked.stderr
        assert "verdict: PASS" in smoked.stdout
        said = [line for line in smoked.stderr.splitlines() if line.strip()]
        assert len(said) == 1 and "spooled in" in said[0] and "lost" not in said[0], said
        assert rows_in(pg_url) == [] and len(pending(store_url)) == 1

        store_proxy.start()
        store = open_store(store_url)
        store.close()
        assert store.replayed == 1 and pending(store_url) == []
        (row,) = rows_in(pg_url)
        assert (row.command, row.verdict, row.stage) == ("smoke", "pass", "done")
    finally:
        vllm_proxy.close()
        store_proxy.close()


_REPLAYER = (
    "import sys; from deploykit.results.sql.store import open_store; s = open_store(sys.argv[1]); s.close()"
)


def test_two_processes_replaying_one_spool_at_once_write_each_row_once(pg_url: str) -> None:
    from deploykit.results.spool import keep

    records = [ResultRecord(command="canary", verdict="pass", stage="heartbeat") for _ in range(20)]
    for record in records:
        keep(record, pg_url)
    command = ["-c", _REPLAYER, pg_url]
    replayers = [start_python(command, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for process in replayers:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
    stored = [r.row_uuid for r in rows_in(pg_url)]
    assert sorted(stored) == sorted(r.row_uuid for r in records) and pending(pg_url) == []
