"""The vLLM container's exec probes (`python3 -m deploykit.render.pod_probe live|ready`): the failure table
through the pure `decide()`, then the real command in a subprocess, standard library only (`python -S` with
deploykit as a zip on PYTHONPATH, as in the vLLM image), against a real local HTTP server standing in for
vLLM's /health (200, 503, hanging, nothing listening), with a fake /proc for the vLLM process's start.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from deploykit.render.pod_probe import (
    DEFAULT_MAX_VERDICT_AGE_S,
    Decision,
    Mode,
    decide,
    process_start_time,
    read_verdict,
)
from tests.http_server import serving

REPO = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0
STARTED = NOW - 3600.0  # the vLLM container's process started an hour ago
MODES: list[Mode] = ["live", "ready"]


def verdict(status: str = "healthy", diagnosis: str = "completion: ok") -> dict[str, Any]:
    return {"status": status, "diagnosis": diagnosis, "written_at": NOW, "pid": 7}


def judge(
    mode: Mode,
    found: dict[str, Any] | None,
    age_s: float = 10.0,
    health_ok: bool = True,
    started: float = STARTED,
) -> Decision:
    return decide(
        mode,
        health_ok=health_ok,
        verdict=found,
        verdict_mtime=None if found is None else NOW - age_s,
        process_start=started,
        now=NOW,
        health_detail="http://127.0.0.1:8000/health answered HTTP 503",
    )


# --- the failure table, through decide() ----------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_canary_down_no_verdict_file_passes(mode: Mode) -> None:
    decision = judge(mode, None)
    assert decision.passed and "no readable canary verdict" in decision.reason


@pytest.mark.parametrize("mode", MODES)
def test_canary_crash_looping_verdict_older_than_max_age_is_ignored(mode: Mode) -> None:
    decision = judge(mode, verdict("corrupt"), age_s=DEFAULT_MAX_VERDICT_AGE_S + 1)
    assert decision.passed and "hung or gone" in decision.reason


@pytest.mark.parametrize("mode", MODES)
def test_canary_slow_verdict_a_little_old_but_within_max_age_passes(mode: Mode) -> None:
    decision = judge(mode, verdict("healthy"), age_s=DEFAULT_MAX_VERDICT_AGE_S - 1)
    assert decision.passed and "canary says healthy (599 s ago)" in decision.reason
    # that old, it still counts: a corrupt verdict as late fails
    assert not judge(mode, verdict("corrupt"), age_s=DEFAULT_MAX_VERDICT_AGE_S - 1).passed


@pytest.mark.parametrize("mode", MODES)
def test_fresh_corrupt_verdict_fails_both(mode: Mode) -> None:
    decision = judge(mode, verdict("corrupt", "repeat: every generated id\nis 0"))
    assert not decision.passed
    assert decision.reason == "canary says corrupt (10 s ago): repeat: every generated id is 0"  # one line


@pytest.mark.parametrize("mode", MODES)
def test_a_verdict_dated_in_the_future_is_not_fresh_for_ever(mode: Mode) -> None:
    """A future mtime (a clock stepped back, or a write that set it) never ages: a hung canary's last
    `corrupt` would fail the probes for as long. Past a few seconds of skew it is not trusted: ignored."""
    decision = judge(mode, verdict("corrupt"), age_s=-3600)
    assert decision.passed and "in the future" in decision.reason, decision.reason
    assert not judge(mode, verdict("corrupt"), age_s=-2).passed  # a clock a little ahead: still fresh


@pytest.mark.parametrize(("mode", "passes"), [("live", True), ("ready", False)])
def test_fresh_unreachable_verdict_fails_ready_only(mode: Mode, passes: bool) -> None:
    decision = judge(mode, verdict("unreachable", "5 runs in a row got no answer"))
    assert decision.passed is passes
    if not passes:
        assert decision.reason.startswith("canary says unreachable")


@pytest.mark.parametrize("mode", MODES)
def test_fresh_hung_verdict_fails_both(mode: Mode) -> None:
    """A hung engine keeps /health at 200: only the verdict can make liveness restart it."""
    decision = judge(mode, verdict("hung", "the engine is hung: requests have waited 61 s"))
    assert not decision.passed
    assert decision.reason.startswith("canary says hung (10 s ago): the engine is hung")


@pytest.mark.parametrize(("mode", "passes"), [("live", True), ("ready", False)])
def test_fresh_unknown_verdict_of_a_stopped_or_crashed_canary_fails_ready_only(
    mode: Mode, passes: bool
) -> None:
    decision = judge(mode, verdict("unknown", "the canary crashed: TypeError: boom"))
    assert decision.passed is passes


@pytest.mark.parametrize("kind", ["fifo", "symlink", "directory"])
def test_read_verdict_reads_only_a_regular_file(tmp_path: Path, kind: str) -> None:
    """A FIFO at the path never blocks the probe (it has seconds), a link is not followed."""
    path = tmp_path / "verdict.json"
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps(verdict("corrupt")))
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        path.symlink_to(real)
    else:
        path.mkdir()
    assert read_verdict(str(path)) == (None, None)
    assert read_verdict(str(real))[0] == verdict("corrupt")


@pytest.mark.parametrize("mode", MODES)
def test_corrupt_verdict_from_before_the_vllm_process_started_is_ignored(mode: Mode) -> None:
    started = NOW - 60  # vLLM restarted a minute ago; the verdict is 65 s old, well within the max age
    decision = judge(mode, verdict("corrupt"), age_s=65, started=started)
    assert decision.passed and "predates this vLLM process" in decision.reason
    # btime is whole seconds: within the slack after the computed start, still the previous process's
    assert judge(mode, verdict("corrupt"), age_s=59.5, started=started).passed
    assert not judge(mode, verdict("corrupt"), age_s=58, started=started).passed


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("found", [None, verdict("healthy"), verdict("corrupt"), {"status": "bogus"}])
def test_vllm_down_fails_regardless_of_the_verdict(mode: Mode, found: dict[str, Any] | None) -> None:
    decision = judge(mode, found, health_ok=False)
    assert not decision.passed
    assert decision.reason == "vLLM down: http://127.0.0.1:8000/health answered HTTP 503"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("found", [{"status": "broken"}, {"status": 3}, {"diagnosis": "x"}, {}])
def test_unknown_status_passes(mode: Mode, found: dict[str, Any]) -> None:
    decision = judge(mode, found)
    assert decision.passed and "unknown: ignored" in decision.reason


@pytest.mark.parametrize("mode", MODES)
def test_unknown_process_start_ignores_the_verdict(mode: Mode) -> None:
    decision = decide(
        mode, health_ok=True, verdict=verdict("corrupt"), verdict_mtime=NOW, process_start=None, now=NOW
    )
    assert decision.passed and "start time is unknown" in decision.reason


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("status", ["starting", "healthy"])
def test_fresh_good_verdict_passes(mode: Mode, status: str) -> None:
    assert judge(mode, verdict(status)).passed


# --- the file and /proc ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", b'["corrupt"]', b'"corrupt"', b"\xff\xfe{}", b"[" * 100_000, b" " * 70_000 + b"{}"],
    ids=["empty", "truncated", "list", "string", "binary", "deep", "oversized"],
)
def test_a_malformed_verdict_file_reads_as_none(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "verdict.json"
    path.write_bytes(content)
    found, mtime = read_verdict(str(path))
    assert found is None and mtime == path.stat().st_mtime
    assert decide("live", health_ok=True, verdict=found, verdict_mtime=mtime, process_start=0, now=NOW).passed


def test_a_missing_or_unreadable_verdict_file_reads_as_none(tmp_path: Path) -> None:
    assert read_verdict(str(tmp_path / "missing.json")) == (None, None)
    assert read_verdict(str(tmp_path)) == (None, None)  # a directory


def test_a_verdict_file_reads_with_its_mtime(tmp_path: Path) -> None:
    path = tmp_path / "verdict.json"
    path.write_text(json.dumps(verdict("corrupt")))
    os.utime(path, (NOW - 30, NOW - 30))
    assert read_verdict(str(path)) == (verdict("corrupt"), NOW - 30)


def fake_proc(root: Path, start: float, pid: int = 1, comm: str = "python3 -m vllm (x) y") -> Path:
    """A /proc whose process `pid` started at Unix time `start`."""
    ticks = os.sysconf("SC_CLK_TCK")
    btime = int(start) - 5000
    start_ticks = round((start - btime) * ticks)
    fields = ["S", *["0"] * 18, str(start_ticks), "123456", "789"]  # fields 3..24; 22 is the start time
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (root / "stat").write_text(f"cpu  1 2 3 4\nintr 5\nctxt 6\nbtime {btime}\nprocesses 7\n")
    return root


def test_process_start_time_from_proc(tmp_path: Path) -> None:
    root = fake_proc(tmp_path / "proc", 1_700_000_123.25, pid=42)
    start = process_start_time(42, str(root))
    assert start == pytest.approx(1_700_000_123.25, abs=0.01)
    assert process_start_time(1, str(root)) is None  # no such process
    assert process_start_time(42, str(tmp_path / "nowhere")) is None
    (root / "stat").write_text("cpu 1 2 3\n")  # no btime
    assert process_start_time(42, str(root)) is None


def test_process_start_time_of_real_processes() -> None:
    if not Path("/proc/1/stat").exists():
        pytest.skip("no /proc here")
    start = process_start_time()  # PID 1
    assert start is not None and 0 < start <= time.time()
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    after = time.time()
    try:
        started = process_start_time(child.pid)
    finally:
        child.communicate(b"")
    # btime is whole seconds (up to 1 s early); start times are clock ticks (1/100 s)
    assert started is not None and before - 1.1 <= started <= after + 0.1


# --- the real command -----------------------------------------------------------------------------


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        server: Any = self.server
        server.paths.append(self.path)
        if server.behaviour == "hang":
            server.release.wait(30)  # longer than any --timeout here; released at teardown
            return
        code = 200 if server.behaviour == "ok" else 503
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def vllm() -> Iterator[Any]:
    """vLLM's /health (tests/http_server.py): `behaviour` is "ok" (200), "503" or "hang"; `paths` the
    paths asked for."""
    release = threading.Event()
    with serving(_Health, behaviour="ok", release=release, paths=[]) as url:
        yield url.server
        release.set()


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A port bound but not listening: connecting is refused, and no other process can take it meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/health"


@pytest.fixture(scope="module")
def wheel_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The deploykit package as a zip, as the vLLM image carries it on PYTHONPATH."""
    path = tmp_path_factory.mktemp("wheel") / "deploykit.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for source in sorted((REPO / "deploykit").rglob("*.py")):
            archive.write(source, source.relative_to(REPO).as_posix())
    return path


@pytest.fixture
def pod(tmp_path: Path, wheel_zip: Path) -> Pod:
    return Pod(tmp_path, wheel_zip)


class Pod:
    """A verdict file, a /proc whose PID 1 (vLLM) started 100 s ago, and the probe command."""

    def __init__(self, root: Path, wheel_zip: Path) -> None:
        self.root, self.wheel_zip = root, wheel_zip
        self.verdict = root / "shared" / "verdict.json"
        self.verdict.parent.mkdir()
        self.started = time.time() - 100
        self.proc = fake_proc(root / "proc", self.started)

    def write(self, status: str, age_s: float = 0.0, diagnosis: str = "repeat: token 0") -> None:
        self.verdict.write_text(json.dumps(verdict(status, diagnosis)))
        mtime = time.time() - age_s
        os.utime(self.verdict, (mtime, mtime))

    def probe(self, mode: str, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-S", "-m", "deploykit.render.pod_probe", mode, "--health-url", url]
        command += ["--verdict-file", str(self.verdict), "--proc-root", str(self.proc), *extra]
        # -S and a PYTHONPATH of the zip alone: no site-packages, no checkout; the standard library only.
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(self.wheel_zip)}
        return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=self.root, env=env)


def url_of(server: Any) -> str:
    return f"http://127.0.0.1:{server.server_port}/health"


def outcome(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode in (0, 1), result.stderr
    assert result.stdout.count("\n") == 1, result.stdout  # one line
    return "pass" if result.returncode == 0 else "FAIL"


@pytest.mark.parametrize(
    ("situation", "live", "ready", "says"),
    [
        ("no file", "pass", "pass", "no readable canary verdict"),
        ("crash-looping", "pass", "pass", "hung or gone"),
        ("slow", "pass", "pass", "canary says healthy"),
        ("corrupt", "FAIL", "FAIL", "canary says corrupt"),
        ("unreachable", "pass", "FAIL", "canary says unreachable"),
        ("hung", "FAIL", "FAIL", "canary says hung"),
        ("corrupt before vLLM started", "pass", "pass", "predates this vLLM process"),
        ("malformed", "pass", "pass", "no readable canary verdict"),
        ("unknown status", "pass", "pass", "unknown: ignored"),
    ],
)
def test_the_command_with_vllm_up(
    pod: Pod, vllm: Any, situation: str, live: str, ready: str, says: str
) -> None:
    extra: list[str] = []
    if situation == "crash-looping":
        pod.write("corrupt", age_s=90)  # after vLLM started, but not rewritten for longer than the max age
        extra = ["--max-verdict-age", "60"]
    elif situation == "slow":
        pod.write("healthy", age_s=50)
    elif situation in ("corrupt", "unreachable", "hung"):
        pod.write(situation)
    elif situation == "corrupt before vLLM started":
        pod.write("corrupt", age_s=150)  # vLLM's PID 1 started 100 s ago
    elif situation == "malformed":
        pod.verdict.write_text('{"status": "corr')
    elif situation == "unknown status":
        pod.write("exploded")
    for mode, expected in (("live", live), ("ready", ready)):
        result = pod.probe(mode, url_of(vllm), *extra)
        assert outcome(result) == expected, result.stdout
        assert says in result.stdout and result.stdout.startswith(f"{mode}: {expected}: ")
    assert vllm.paths == ["/health", "/health"]


@pytest.mark.parametrize("health", ["503", "hang", "refused"])
@pytest.mark.parametrize("status", [None, "healthy", "corrupt"])
def test_the_command_with_vllm_down_fails_both(
    pod: Pod, vllm: Any, refused_url: str, health: str, status: str | None
) -> None:
    if status is not None:
        pod.write(status)
    url = refused_url if health == "refused" else url_of(vllm)
    vllm.behaviour = health
    for mode in ("live", "ready"):
        began = time.monotonic()
        result = pod.probe(mode, url, "--timeout", "0.3")
        assert outcome(result) == "FAIL"
        assert result.stdout.startswith(f"{mode}: FAIL: vLLM down: ")
        assert time.monotonic() - began < 20  # the hanging /health did not hold it for its 30 s
    detail = {
        "503": "answered HTTP 503",
        "hang": "did not answer within 0.3 s",
        "refused": "ConnectionRefused",
    }
    assert detail[health] in result.stdout


def test_the_command_imports_the_standard_library_only(pod: Pod, vllm: Any) -> None:
    """Run in the probe's own conditions (no site-packages, deploykit zipped), then list what it imported."""
    pod.write("corrupt")
    script = (
        "import json, sys\n"
        "from deploykit.render.pod_probe import main\n"
        f"code = main(['live', '--health-url', {url_of(vllm)!r}, '--verdict-file', {str(pod.verdict)!r},"
        f" '--proc-root', {str(pod.proc)!r}])\n"
        "print(json.dumps({'code': code, 'modules': sorted(sys.modules)}))\n"
    )
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(pod.wheel_zip)}
    result = subprocess.run(
        [sys.executable, "-S", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=pod.root,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    line, report = result.stdout.splitlines()
    found = json.loads(report)
    assert found["code"] == 1 and line.startswith("live: FAIL: canary says corrupt")  # it read everything
    ours = [m for m in found["modules"] if m.split(".")[0] == "deploykit"]
    assert ours == ["deploykit", "deploykit.exit_codes", "deploykit.render", "deploykit.render.pod_probe"]
    others = [
        m
        for m in found["modules"]
        if m.split(".")[0] not in sys.stdlib_module_names and m not in ("__main__", *ours)
    ]
    assert others == []
