"""`python -m deploykit ...` as its own process, forked from an interpreter that imported deploykit already.

The fast tier runs the command line a few hundred times. A fresh interpreter spends ~0.4 s of a command's
~0.5 s CPU importing Typer, pydantic and SQLAlchemy and building deploykit's models: most of the tier's CPU.
Here one server process per test process imports them once and forks a child for each command. The command
still runs as a process of its own: its own exit status (a signal's too), stdout and stderr through pipes,
stdin, working directory and environment; `__main__` is deploykit's, as under `-m`; nothing it changes
outlives it.

What a forked child does not repeat is the interpreter's start. Tests about the start itself (which modules a
command imports, how long it takes) run `python -m deploykit` or the `deploykit` script; `run_deploykit`
starts a fresh interpreter too when the environment it is given sets a `PYTHON*` variable differently from
this process's."""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import json
import locale
import os
import runpy
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# What the commands import between them, short of vLLM and torch (the fast CLI never imports those).
PRELOAD = (
    "deploykit.cli",
    "deploykit.plan",
    "deploykit.probe",
    "deploykit.render.helm",
    "deploykit.render.systemd",
    "deploykit.advisories.catalog",
    "deploykit.results.stores",
    "deploykit.results.sql",
    "deploykit.smoke.client",
    "deploykit.canary.command",
    "deploykit.canary.runner",
    "deploykit.serve.driver",
    "deploykit.serve.stages",
    "deploykit.trace",
    "httpx",
)
NEVER_PRELOADED = ("torch", "vllm")
LENGTH = struct.Struct("!I")
START_TIMEOUT_S = 60.0

_server: subprocess.Popen[bytes] | None = None
_socket_path: Path | None = None
_server_lock = threading.Lock()


def run_deploykit(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input: str | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """As `subprocess.run([sys.executable, "-m", "deploykit", *args], capture_output=True, text=True)`."""
    argv = [sys.executable, "-m", "deploykit", *args]
    child_env = dict(os.environ if env is None else env)
    if _start_matters(child_env):
        return subprocess.run(
            argv, env=child_env, cwd=cwd, input=input, capture_output=True, text=True, timeout=timeout
        )
    deadline = time.monotonic() + timeout
    stdin_read, stdin_write = os.pipe() if input is not None else (os.open(os.devnull, os.O_RDONLY), -1)
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(str(_server_socket()))
        request = json.dumps({"args": list(args), "env": child_env, "cwd": os.fspath(cwd or os.getcwd())})
        payload = request.encode()
        socket.send_fds(connection, [LENGTH.pack(len(payload))], [stdin_read, out_write, err_write])
        connection.sendall(payload)
    finally:
        for fd in (stdin_read, out_write, err_write):
            os.close(fd)
    replies = connection.makefile("rb")
    pid = json.loads(replies.readline())["pid"]
    if stdin_write != -1:
        writer = threading.Thread(target=_write_all, args=(stdin_write, (input or "").encode()), daemon=True)
        writer.start()
    try:
        stdout, stderr = _read_until_closed(out_read, err_read, deadline)
        status_line = _readline_before(connection, replies, deadline)
    except subprocess.TimeoutExpired:
        _kill(pid)
        raise subprocess.TimeoutExpired(argv, timeout) from None
    finally:
        os.close(out_read)
        os.close(err_read)
        replies.close()
        connection.close()
    returncode = os.waitstatus_to_exitcode(json.loads(status_line)["status"])
    return subprocess.CompletedProcess(argv, returncode, _text(stdout), _text(stderr))


def _start_matters(env: Mapping[str, str]) -> bool:
    """A PYTHON* variable acts when an interpreter starts, which a forked child never does."""
    names = {name for name in (*env, *os.environ) if name.startswith("PYTHON")}
    return any(env.get(name) != os.environ.get(name) for name in names)


def _text(data: bytes) -> str:
    """Decoded as `subprocess.run(text=True)` decodes: the locale's encoding and universal newlines."""
    return io.TextIOWrapper(io.BytesIO(data), encoding=locale.getpreferredencoding(False)).read()


def _write_all(fd: int, data: bytes) -> None:
    try:
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(data)
    except BrokenPipeError:
        pass


def _read_until_closed(out_fd: int, err_fd: int, deadline: float) -> tuple[bytes, bytes]:
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired("deploykit", 0)
            for key, _ in selector.select(remaining):
                data = os.read(key.fd, 65536)
                if data:
                    chunks[key.fd].append(data)
                else:
                    selector.unregister(key.fd)
    return b"".join(chunks[out_fd]), b"".join(chunks[err_fd])


def _readline_before(connection: socket.socket, replies: io.BufferedReader, deadline: float) -> bytes:
    connection.settimeout(max(deadline - time.monotonic(), 0.001))
    try:
        line = replies.readline()
    except TimeoutError:
        raise subprocess.TimeoutExpired("deploykit", 0) from None
    if not line:
        raise RuntimeError("the deploykit fork server closed the connection without an exit status")
    return line


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _server_socket() -> Path:
    """The server of this process, started on first use and stopped when this process exits (or dies: it reads
    its stdin, a pipe from here, and leaves at end of file)."""
    global _server, _socket_path
    with _server_lock:
        if _server is not None and _server.poll() is None and _socket_path is not None:
            return _socket_path
        folder = Path(tempfile.mkdtemp(prefix="dk-fork-"))
        path = folder / "s"
        _server = subprocess.Popen(
            [sys.executable, "-m", "tests.cli_process", str(path)],
            stdin=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[1],
        )
        atexit.register(_stop, _server, folder)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (folder / "ready").exists():
            if _server.poll() is not None:
                raise RuntimeError(
                    f"the deploykit fork server exited ({_server.returncode}) before it was ready"
                )
            if time.monotonic() > deadline:
                raise RuntimeError("the deploykit fork server was not ready in time")
            time.sleep(0.01)
        _socket_path = path
        return path


def _stop(server: subprocess.Popen[bytes], folder: Path) -> None:
    if server.stdin is not None:
        server.stdin.close()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
    for name in ("s", "ready"):
        (folder / name).unlink(missing_ok=True)
    folder.rmdir()


# --- the server side ----------------------------------------------------------------------------------------


def serve(path: Path) -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    importlib.import_module("deploykit.cli.app").root_command()  # the command tree, built once for all forks
    loaded = [name for name in NEVER_PRELOADED if name in sys.modules]
    if loaded:
        raise SystemExit(f"the fork server must not import {loaded}: the fast CLI never does")
    if threading.active_count() != 1:
        raise SystemExit("the fork server started a thread; forking it would copy a held lock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # each connection's process is reaped by the kernel
    sys.stdout.flush()
    sys.stderr.flush()
    (path.parent / "ready").touch()
    with selectors.DefaultSelector() as selector:
        selector.register(listener, selectors.EVENT_READ)
        selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is not listener:
                    return  # the test process is gone
                connection, _ = listener.accept()
                if os.fork() == 0:
                    listener.close()
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    _handle(connection)  # never returns
                connection.close()


def _handle(connection: socket.socket) -> None:
    """The connection's process: forks the command, says its pid, waits for it and says how it ended."""
    try:
        header, fds, _, _ = socket.recv_fds(connection, LENGTH.size, 3)
        (length,) = LENGTH.unpack(header)
        request = json.loads(_recv_exactly(connection, length))
        pid = os.fork()
        if pid == 0:
            connection.close()
            _run_command(request, fds)  # never returns
        for fd in fds:
            os.close(fd)
        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _, status = os.waitpid(pid, 0)
        connection.sendall(json.dumps({"status": status}).encode() + b"\n")
    finally:
        os._exit(0)


def _recv_exactly(connection: socket.socket, length: int) -> bytes:
    data = bytearray()
    while len(data) < length:
        chunk = connection.recv(length - len(data))
        if not chunk:
            raise ConnectionError("the request was cut short")
        data += chunk
    return bytes(data)


def _run_command(request: dict[str, Any], fds: list[int]) -> None:
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(str(request["cwd"]))
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = ["deploykit", *request["args"]]
        try:
            runpy.run_module("deploykit", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit_request:
            code = _exit_status(exit_request.code)
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                code = code or 120  # what the interpreter returns when it cannot flush at exit
        os._exit(code)


def _exit_status(code: object) -> int:
    """As the interpreter turns `sys.exit(x)` into a status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
