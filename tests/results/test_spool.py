"""No lost rows: a store that goes away while a command runs keeps its row in the spool, and the next command
that reaches the store writes it, once. A real PostgreSQL behind a TCP proxy (tests/tcp_proxy.py) that is cut
while a smoke's cases run, and a canary started against a closed port; real `deploykit` processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import tracemalloc
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from deploykit.canary.runner import Canary, CanaryConfig
from deploykit.canary.runtime import run_loop
from deploykit.canary.settings import CanarySettings
from deploykit.endpoint import Endpoint
from deploykit.profile.schema import SmokeCase
from deploykit.results.record import ResultRecord
from deploykit.results.spool import keep, pending, replay, spool_dirs
from deploykit.results.sql.store import open_store
from tests.canary.test_canary import GOOD, WRONG, Clock, Script
from tests.cli_process import run_deploykit, start_python
from tests.http_server import Answers500, serving
from tests.serve_helpers import BACKENDS, fresh_pg_url, fresh_store_url
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
        endpoint=Endpoint("http://127.0.0.1:1"),
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
    "import sys; from deploykit.results.sql.store import open_store; s = open_store(sys.argv[1]); s.close(); "
    "print(s.replayed)"
)


def test_two_processes_replaying_one_spool_at_once_write_each_row_once(pg_url: str) -> None:
    from deploykit.results.spool import keep

    records = [ResultRecord(command="canary", verdict="pass", stage="heartbeat") for _ in range(20)]
    for record in records:
        keep(record, pg_url)
    command = ["-c", _REPLAYER, pg_url]
    replayers = [
        start_python(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    counts: list[int] = []
    for process in replayers:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err
        counts.append(int(out))
    stored = [r.row_uuid for r in rows_in(pg_url)]
    assert sorted(stored) == sorted(r.row_uuid for r in records) and pending(pg_url) == []
    assert sum(counts) == len(records), counts  # what each says it wrote adds up to what was spooled


# --- a spool that trusts only itself (issue 43) ------------------------------------------------------------
# Tests run as root; a hostile local user is another uid (65534, nobody) owning what it planted, and links
# planted in the store's directory.

HOSTILE_UID = 65534


def sqlite_store(tmp_path: Path) -> tuple[str, Path]:
    """A SQLite store's URL in `tmp_path` and the spool directory beside it (not made yet)."""
    return f"sqlite:///{tmp_path / 'r.db'}", tmp_path / ".r.db.spool"


def row_file(directory: Path, record: ResultRecord, *, mtime: float | None = None) -> Path:
    """`record` as a spool file in `directory`, as `keep` writes one (or a hostile user would)."""
    path = directory / f"{record.row_uuid}.row.json"
    path.write_text(json.dumps({"format": 1, "record": record.model_dump(mode="json")}))
    os.chmod(path, 0o600)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def said_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_a_link_planted_where_the_spool_goes_is_never_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, beside = sqlite_store(tmp_path)
    target = tmp_path / "theirs"
    target.mkdir()
    os.chmod(target, 0o755)
    os.chown(target, HOSTILE_UID, HOSTILE_UID)
    beside.symlink_to(target)
    planted = row_file(target, ResultRecord(command="smoke", verdict="pass", stage="done", hostname="forged"))
    os.chown(planted, HOSTILE_UID, HOSTILE_UID)

    record = ResultRecord(command="smoke", verdict="fail", stage="done")
    spooled = keep(record, url)
    assert target.stat().st_mode & 0o777 == 0o755 and target.stat().st_uid == HOSTILE_UID  # not chmod-ed
    assert [p.name for p in target.iterdir()] == [planted.name]  # nothing written through the link
    assert beside.is_symlink() and spooled.path.parent != beside
    assert spooled.path.parent.parent == Path(os.environ["DEPLOYKIT_SPOOL_DIR"])
    (refused,) = spooled.refused
    assert "symbolic link" in refused and str(beside) in refused

    capsys.readouterr()
    store = open_store(url)
    store.close()
    assert store.replayed == 1
    assert [(r.row_uuid, r.hostname) for r in rows_in(url)] == [(record.row_uuid, record.hostname)]
    said = said_lines(capsys.readouterr().err)
    assert len(said) == 1 and "symbolic link" in said[0] and str(beside) in said[0], said
    assert planted.exists()  # theirs: not ours to move either


@pytest.mark.parametrize(
    ("owner", "mode"),
    [(HOSTILE_UID, 0o777), (HOSTILE_UID, 0o700), (0, 0o777), (0, 0o750), (0, 0o701)],
    ids=["theirs-0777", "theirs-0700", "ours-0777", "ours-0750", "ours-0701"],
)
def test_a_spool_directory_another_user_can_reach_is_refused_not_chmodded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], owner: int, mode: int
) -> None:
    url, beside = sqlite_store(tmp_path)
    beside.mkdir()
    os.chmod(beside, mode)
    os.chown(beside, owner, owner)
    forged = row_file(beside, ResultRecord(command="smoke", verdict="pass", stage="done", hostname="forged"))
    os.chown(forged, owner, owner)

    record = ResultRecord(command="smoke", verdict="fail", stage="done")
    spooled = keep(record, url)
    assert not (beside / f"{record.row_uuid}.row.json").exists()  # nothing written where they can reach
    assert (beside.stat().st_mode & 0o777, beside.stat().st_uid) == (mode, owner)  # left as found
    assert spooled.path.parent.parent == Path(os.environ["DEPLOYKIT_SPOOL_DIR"])
    (refused,) = spooled.refused
    assert str(beside) in refused and ("uid 65534" in refused if owner else f"{mode:04o}" in refused)

    capsys.readouterr()
    store = open_store(url)
    store.close()
    assert [r.hostname for r in rows_in(url)] == [record.hostname]  # the forged row is never read
    said = said_lines(capsys.readouterr().err)
    assert len(said) == 1 and str(beside) in said[0] and "not used" in said[0], said
    assert forged.exists()


def test_what_is_not_a_plain_file_of_ours_in_the_spool_is_set_aside_never_followed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, beside = sqlite_store(tmp_path)
    first = ResultRecord(command="smoke", verdict="fail", stage="done")
    keep(first, url)
    outside = row_file(tmp_path, ResultRecord(command="smoke", verdict="pass", stage="done", hostname="out"))
    linked = beside / f"{uuid.uuid4().hex}.row.json"
    linked.symlink_to(outside)
    fifo = beside / f"{uuid.uuid4().hex}.row.json"
    os.mkfifo(fifo, 0o600)  # opened without O_NONBLOCK, a FIFO would block the command for good
    theirs = row_file(beside, ResultRecord(command="smoke", verdict="pass", stage="done", hostname="theirs"))
    os.chown(theirs, HOSTILE_UID, HOSTILE_UID)
    good = ResultRecord(command="smoke", verdict="pass", stage="done")
    keep(good, url)

    capsys.readouterr()
    store = open_store(url)
    store.close()
    assert store.replayed == 2
    assert sorted(r.row_uuid or "" for r in rows_in(url)) == sorted(
        [first.row_uuid or "", good.row_uuid or ""]
    )
    said = said_lines(capsys.readouterr().err)
    assert len(said) == 3 and all("set aside" in line for line in said), said
    dead = tmp_path / ".r.db.spool.dead-letter"
    assert sorted(p.name for p in dead.iterdir()) == sorted([linked.name, fifo.name, theirs.name])
    assert (dead / linked.name).is_symlink() and outside.exists()  # the link itself moved, never its target
    assert dead.stat().st_mode & 0o777 == 0o700 and dead.stat().st_uid == os.geteuid()
    assert sorted(beside.iterdir()) == []


def test_a_huge_spool_file_is_never_read_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, beside = sqlite_store(tmp_path)
    keep(ResultRecord(command="smoke", verdict="fail", stage="done"), url)
    huge = beside / f"{uuid.uuid4().hex}.row.json"
    with huge.open("wb") as handle:
        handle.truncate(600 * 1024 * 1024)  # sparse: 600 MiB that take no disk
    os.utime(huge, (1, 1))  # the oldest: replayed first
    good = ResultRecord(command="smoke", verdict="pass", stage="done")
    keep(good, url)

    capsys.readouterr()
    tracemalloc.start()
    try:
        store = open_store(url)
        store.close()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 * 1024 * 1024, peak  # today: 600 MiB read, then 2.5 GB decoding it
    assert store.replayed == 2 and good.row_uuid in {r.row_uuid for r in rows_in(url)}
    (line,) = said_lines(capsys.readouterr().err)
    assert "629145600 bytes" in line and "set aside" in line, line
    assert (tmp_path / ".r.db.spool.dead-letter" / huge.name).exists()


def deeply_nested(record: ResultRecord) -> bytes:
    """A spool file whose `facts` nest deeper than Python's parser recurses (RecursionError today)."""
    data = json.dumps({"format": 1, "record": record.model_dump(mode="json")}, separators=(",", ":"))
    depth = 200_000
    nested = data.replace('"facts":null', '"facts":{"x":' + "[" * depth + "]" * depth + "}")
    assert nested != data
    return nested.encode()


def with_bad_key(record: ResultRecord) -> bytes:
    """A row whose fingerprint key is not hex (a ValueError in PostgreSQL's lock today)."""
    data = {"format": 1, "record": record.model_dump(mode="json")}
    data["record"]["fingerprint"] = {
        "dtype": "float32",
        "key": "not-hex-at-all-zz",
        "answers": [{"prompt": "p", "ids": [5], "top": [{"5": -0.5}]}],
    }
    return json.dumps(data).encode()


NUL_TEXT = "the server said \x00 mid-text"


def with_nul(record: ResultRecord) -> bytes:
    """A row with a NUL in text fields PostgreSQL refuses it in (today: the spool is blocked for good)."""
    record = record.model_copy(
        update={
            "diagnosis": NUL_TEXT,
            "log_tail": NUL_TEXT,
            "profile_name": "nul\x00profile",
            "hostname": "host\x00a",
            "log_path": "/var/log/\x00x",
        }
    )
    return json.dumps({"format": 1, "record": record.model_dump(mode="json")}).encode()


BAD_FILES = {"deeply nested": deeply_nested, "fingerprint key not hex": with_bad_key}


def plant_bad_files(beside: Path, url: str) -> tuple[dict[str, Path], ResultRecord, ResultRecord]:
    """Every bad file, oldest first, then a row with NUL characters and a good row spooled after them all."""
    first = ResultRecord(command="smoke", verdict="fail", stage="done")
    keep(first, url)  # the spool directory, made by deploykit
    planted: dict[str, Path] = {}
    for age, (name, make) in enumerate(BAD_FILES.items()):
        path = beside / f"{uuid.uuid4().hex}.row.json"
        path.write_bytes(make(ResultRecord(command="smoke", verdict="pass", stage="done")))
        os.utime(path, (1000 + age, 1000 + age))
        planted[name] = path
    nul = ResultRecord(command="smoke", verdict="fail", stage="done", hostname="nul-host")
    (beside / f"{nul.row_uuid}.row.json").write_bytes(with_nul(nul))
    os.utime(beside / f"{nul.row_uuid}.row.json", (2000, 2000))
    good = ResultRecord(command="smoke", verdict="pass", stage="done", hostname="good-host")
    keep(good, url)
    return planted, nul, good


def check_set_aside(beside: Path, planted: dict[str, Path], said: list[str]) -> None:
    dead = beside.with_name(beside.name + ".dead-letter")
    assert sorted(p.name for p in dead.iterdir()) == sorted(p.name for p in planted.values())
    assert list(beside.iterdir()) == []
    for name, path in planted.items():
        (line,) = [line for line in said if path.name in line]
        assert "set aside" in line and "Traceback" not in line, (name, line)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("command", ["results list", "smoke"])
def test_one_bad_spool_file_never_stops_another_row_or_the_command(
    backend: str, command: str, tmp_path: Path
) -> None:
    with fresh_store_url(backend, tmp_path) as url:
        open_store(url).close()
        beside = spool_dirs(url)[0] if backend == "sqlite" else spool_dirs(url)[-1]
        planted, nul, good = plant_bad_files(beside, url)
        if command == "smoke":
            with serving(Answers500) as server:
                done = deploykit("smoke", "--url", server, "--model", "m", "--store", url)
            assert done.returncode == 1 and "verdict: FAIL" in done.stdout, done.stdout + done.stderr
        else:
            done = deploykit("results", "list", "--store", url, "-f", "json")
            assert done.returncode == 0, done.stderr
        said = said_lines(done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        replayed = [line for line in said if "3 spooled row(s) written" in line or "3 row(s) spooled" in line]
        assert len(replayed) == 1 and len(said) == len(planted) + 1, said
        check_set_aside(beside, planted, said)
        rows = {r.row_uuid: r for r in rows_in(url)}
        assert good.row_uuid in rows and nul.row_uuid in rows  # the row PostgreSQL cannot take as sent: kept
        kept = rows[nul.row_uuid]
        assert (kept.diagnosis, kept.hostname, kept.profile_name) == (
            "the server said \u2400 mid-text",
            "host\u2400a",
            "nul\u2400profile",
        )


def test_the_canary_with_keep_running_survives_a_bad_spool_file_at_its_state_change(tmp_path: Path) -> None:
    """The issue's case: the canary died at its next state change (RecursionError from the spool), and the
    corruption that followed was never reported."""
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    open_store(url).close()
    beside = tmp_path / ".results.sqlite.spool"
    keep(ResultRecord(command="canary", verdict="pass", stage="heartbeat"), url)
    bad = beside / f"{uuid.uuid4().hex}.row.json"
    bad.write_bytes(deeply_nested(ResultRecord(command="canary", verdict="pass", stage="heartbeat")))
    stop = threading.Event()

    config = CanaryConfig(
        endpoint=Endpoint("http://127.0.0.1:1"),
        served_name="tiny",
        cases=[SmokeCase(kind="completion")],
        settings=CanarySettings(every_s=0.1, metrics_every_s=0),
        store_url=url,
        hung_after_s=0,
        verdict_file=str(tmp_path / "verdict.json"),
        keep_running=True,
    )
    canary = Canary(config, runner=Script(GOOD, WRONG))
    warnings: list[str] = []
    canary.on_warning = warnings.append
    canary.on_run = lambda summary: stop.set() if summary.number >= 1 else None  # (0-based)
    guard = threading.Timer(60, stop.set)  # a canary that never reaches its second run fails, never hangs
    guard.start()
    try:
        run_loop(canary, stop, keep_running=True)
    finally:
        guard.cancel()
    assert canary.state.status == "corrupt" and not canary.state.misconfigured, canary.state
    assert json.loads((tmp_path / "verdict.json").read_text())["status"] == "corrupt"
    stages = [r.stage for r in reversed(rows_in(url)) if r.command == "canary"]
    assert stages[-2:] == ["state:healthy", "state:corrupt"], stages
    (line,) = [w for w in warnings if bad.name in w]
    assert "set aside" in line and not any("misconfigured" in w.lower() for w in warnings), warnings


def test_two_replays_at_once_each_write_a_row_once_and_their_counts_add_up(tmp_path: Path) -> None:
    """Deterministic: the second replayer runs while the first is writing its first row."""
    url, _ = sqlite_store(tmp_path)
    first, second = open_store(url), open_store(url)
    records = [ResultRecord(command="canary", verdict="pass", stage="heartbeat") for _ in range(5)]
    for record in records:
        keep(record, url)
    for age, path in enumerate(sorted(pending(url))):
        os.utime(path, (1000 + age, 1000 + age))
    counts: list[int] = []
    real_add = first.add

    def add_while_another_replays(record: ResultRecord) -> int:
        if not counts:
            counts.append(replay(second))
        return real_add(record)

    first.add = add_while_another_replays  # type: ignore[method-assign]
    try:
        counts.append(replay(first))
    finally:
        first.close()
        second.close()
    assert sum(counts) == len(records), counts  # today 6: the row both wrote is counted by both
    assert sorted(r.row_uuid or "" for r in rows_in(url)) == sorted(r.row_uuid or "" for r in records)
    assert pending(url) == []
