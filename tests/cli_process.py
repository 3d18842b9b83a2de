"""Python children of the tests (`python -m deploykit ...`, `python -c CODE ...`) as processes of their own,
forked from an interpreter that imported deploykit already.

The fast tier starts a few hundred of them. A fresh interpreter spends ~0.4 s of a command's ~0.5 s CPU
importing Typer, pydantic and SQLAlchemy and building deploykit's models: most of the tier's CPU. Here one
server process per test process imports them once (every deploykit module but the vLLM side's), puts its heap
out of the collector's reach (gc.freeze: a child's first collection would copy it all) and forks a child for
each request. The child is still a process of its own: its own pid (a signal reaches it), exit status (a
signal's too), stdin, stdout and stderr through pipes, working directory and environment; `__main__`,
sys.argv and sys.path[0] as `-m` or `-c` set them; nothing it changes outlives it.

`run_deploykit` is `subprocess.run` of the command line; `start_python` is `subprocess.Popen` of a Python
child (the pipes and methods the tests use). What a forked child does not repeat is the interpreter's
start: tests about the start itself (which modules a command imports, how long it takes, what the pod's
`python -S` finds) start a fresh interpreter, and so do these helpers when given another interpreter flag or
an environment that sets a `PYTHON*` variable differently from this process's."""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import importlib.util
import io
import json
import locale
import os
import re
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
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

# What the commands import between them, short of vLLM and torch (the fast CLI never imports those): every
# deploykit module but the vLLM side's (preloaded_modules), and what they import inside functions.
PRELOAD = (
    "httpx",
    "jinja2",
    "platformdirs",
    "pynvml",
    "sqlite3",
    "sqlalchemy.dialects.sqlite.pysqlite",
    "typer._click.decorators",
    "rich._emoji_codes",
)
# Imported too where installed (the postgres extra): the store's children connect to PostgreSQL.
PRELOAD_IF_INSTALLED = ("psycopg", "sqlalchemy.dialects.postgresql.psycopg")
# Modules never preloaded: deploykit's entry point, and those that run inside vLLM or import torch.
NOT_PRELOADED = ("deploykit.__main__", "deploykit.vllm_plugin")
NEVER_PRELOADED = ("torch", "vllm")
# An import of one of them at module level (unindented): what importing the module would run.
HEAVY_IMPORT = re.compile(rf"^(?:import|from)\s+(?:{'|'.join(NEVER_PRELOADED)})\b", re.MULTILINE)
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
    return run_python(["-m", "deploykit", *args], env=env, cwd=cwd, input=input, timeout=timeout)


def run_python(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    input: str | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """As `subprocess.run([sys.executable, *args], capture_output=True, text=True)` (start_python's child):
    killed at the deadline, TimeoutExpired raised."""
    stdin = subprocess.PIPE if input is not None else subprocess.DEVNULL
    process = start_python(
        args, env=env, cwd=cwd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    with process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


class PythonProcess(Protocol):
    """What the tests use of a Python child, a real `subprocess.Popen` or a ForkedProcess."""

    args: Any
    pid: int
    returncode: Any
    stdin: IO[Any] | None
    stdout: IO[Any] | None
    stderr: IO[Any] | None

    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: Any) -> Any: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]: ...
    def send_signal(self, sig: int) -> None: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


def start_python(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: int | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
    text: bool = False,
) -> PythonProcess:
    """As `subprocess.Popen([sys.executable, *args], ...)` for `-m MODULE ...` or `-c CODE ...`: forked from
    the warm interpreter unless the interpreter's own start matters (another flag, such as -S, or a PYTHON*
    variable in env). stdin, stdout, stderr: None (this process's), subprocess.PIPE or DEVNULL (stderr also
    STDOUT)."""
    child_env = dict(os.environ if env is None else env)
    argv = [sys.executable, *args]
    if len(args) < 2 or args[0] not in ("-m", "-c") or _start_matters(child_env):
        return subprocess.Popen(
            argv, env=child_env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, text=text
        )
    return ForkedProcess(
        argv, list(args), child_env, os.fspath(cwd or os.getcwd()), (stdin, stdout, stderr), text
    )


class ForkedProcess:
    """A Python child forked by the fork server: the pipes and methods of subprocess.Popen that the tests use.
    Its exit status comes over the server's connection (the server's process, not this one, is its parent);
    a signal reaches it by its pid."""

    def __init__(
        self,
        argv: list[str],
        args: list[str],
        env: dict[str, str],
        cwd: str,
        streams: tuple[int | None, int | None, int | None],
        text: bool,
    ) -> None:
        self.args = argv
        self.returncode: int | None = None
        self.stdin: IO[Any] | None = None
        self.stdout: IO[Any] | None = None
        self.stderr: IO[Any] | None = None
        self._text = text
        self._status = b""
        self._output: dict[int, list[bytes]] = {}
        theirs, ours = self._pipes(*streams)
        self._connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._connection.connect(str(_server_socket()))
            payload = json.dumps({"args": args, "env": env, "cwd": cwd}).encode()
            socket.send_fds(self._connection, [LENGTH.pack(len(payload))], theirs)
            self._connection.sendall(payload)
            self.pid: int = json.loads(self._read_line(None))["pid"]
        except BaseException:
            self._connection.close()
            for fd in ours.values():
                os.close(fd)
            raise
        finally:
            for fd in set(theirs) - {0, 1, 2}:
                os.close(fd)
        if 0 in ours:
            self.stdin = self._open(ours[0], "w")
        if 1 in ours:
            self.stdout = self._open(ours[1], "r")
        if 2 in ours:
            self.stderr = self._open(ours[2], "r")

    @staticmethod
    def _pipes(*streams: int | None) -> tuple[list[int], dict[int, int]]:
        """The child's three descriptors, and this side's ends of its pipes (by the child's fd number)."""
        theirs: list[int] = []
        ours: dict[int, int] = {}
        for number, stream in enumerate(streams):
            if stream is None:
                theirs.append(number)
            elif stream == subprocess.DEVNULL:
                theirs.append(os.open(os.devnull, os.O_RDWR))
            elif stream == subprocess.STDOUT and number == 2:
                theirs.append(os.dup(theirs[1]))
            elif stream == subprocess.PIPE:
                read, write = os.pipe()
                theirs.append(read if number == 0 else write)
                ours[number] = write if number == 0 else read
            else:
                raise ValueError(f"stream {number}: {stream!r} is not supported here")
        return theirs, ours

    def _open(self, fd: int, mode: str) -> IO[Any]:
        if not self._text:
            return os.fdopen(fd, mode + "b")
        encoding = locale.getpreferredencoding(False)
        return os.fdopen(
            fd, mode, encoding=encoding, newline=None, **({"buffering": 1} if mode == "w" else {})
        )

    def __enter__(self) -> ForkedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if self.returncode is None:
            self.wait()
        self._connection.close()

    def _read_line(self, timeout: float | None) -> bytes:
        """The next line the server sends (pid, then exit status); TimeoutExpired when none comes in time."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._status:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            self._connection.settimeout(remaining)
            try:
                chunk = self._connection.recv(4096)
            except (TimeoutError, BlockingIOError):
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
            if not chunk:
                raise RuntimeError("the fork server closed the connection before the child's exit status")
            self._status += chunk
        line, _, self._status = self._status.partition(b"\n")
        return line

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._finish(self._read_line(0))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._finish(self._read_line(timeout))
        assert self.returncode is not None
        return self.returncode

    def _finish(self, line: bytes) -> None:
        self.returncode = os.waitstatus_to_exitcode(json.loads(line)["status"])

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        """Writes input, reads stdout and stderr to their ends and waits, as Popen.communicate; a second call
        after TimeoutExpired goes on where the first stopped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None and not self.stdin.closed:
            if input:
                writer = threading.Thread(target=_write_and_close, args=(self.stdin, input), daemon=True)
                writer.start()
            else:
                self.stdin.close()
        readers = [
            stream for stream in (self.stdout, self.stderr) if stream is not None and not stream.closed
        ]
        for stream in readers:
            self._output.setdefault(stream.fileno(), [])
        with selectors.DefaultSelector() as selector:
            for stream in readers:
                selector.register(stream.fileno(), selectors.EVENT_READ)
            while selector.get_map():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0)
                for key, _ in selector.select(remaining):
                    data = os.read(key.fd, 65536)
                    if data:
                        self._output[key.fd].append(data)
                    else:
                        selector.unregister(key.fd)
        results: list[Any] = []
        for stream in (self.stdout, self.stderr):
            if stream is None:
                results.append(None)
                continue
            data = b"".join(self._output.get(stream.fileno(), [])) if not stream.closed else b""
            stream.close()
            results.append(_text(data) if self._text else data)
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 0.001))
        return results[0], results[1]


def _start_matters(env: Mapping[str, str]) -> bool:
    """A PYTHON* variable acts when an interpreter starts, which a forked child never does."""
    names = {name for name in (*env, *os.environ) if name.startswith("PYTHON")}
    return any(env.get(name) != os.environ.get(name) for name in names)


def _text(data: bytes) -> str:
    """Decoded as `subprocess.run(text=True)` decodes: the locale's encoding and universal newlines."""
    return io.TextIOWrapper(io.BytesIO(data), encoding=locale.getpreferredencoding(False)).read()


def _write_and_close(stream: IO[Any], data: Any) -> None:
    try:
        with stream:
            stream.write(data)
    except BrokenPipeError:
        pass


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


def preloaded_modules() -> list[str]:
    """deploykit's modules that a command may import: all but NOT_PRELOADED and those that import vLLM or
    torch at module level (read from the files, without importing anything; serve checks what came in)."""
    package = Path(importlib.util.find_spec("deploykit").origin or "").parent  # type: ignore[union-attr]
    names = []
    for source in sorted(package.rglob("*.py")):
        parts = source.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if not name.startswith(NOT_PRELOADED) and not HEAVY_IMPORT.search(source.read_text()):
            names.append(name)
    return names


def serve(path: Path) -> None:
    for name in (*preloaded_modules(), *PRELOAD):
        importlib.import_module(name)
    for name in PRELOAD_IF_INSTALLED:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    importlib.import_module("deploykit.cli.app").root_command()  # the command tree, built once for all forks
    # The warm heap out of the collector's sight: a child's first full collection would otherwise walk every
    # object the server made and write to each one's page, copying the whole heap (~0.1 s a command).
    gc.collect()
    gc.freeze()
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
        flag, target, *rest = request["args"]
        try:
            _run_main(flag, target, rest)
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
            if stream is None or stream.closed:  # as the interpreter: a closed stream is not flushed
                continue
            try:
                stream.flush()
            except Exception:
                code = code or 120  # what the interpreter returns when it cannot flush at exit
        os._exit(code)


def _run_main(flag: str, target: str, rest: list[str]) -> None:
    """`-m module` or `-c code`, with sys.argv and sys.path[0] as the interpreter sets them for each."""
    if flag == "-m":
        sys.path[0] = os.getcwd()
        sys.argv = ["-m", *rest]  # run_module puts the module's file first
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    sys.path[0] = ""
    sys.argv = ["-c", *rest]
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    exec(compile(target, "<string>", "exec"), main.__dict__)


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
