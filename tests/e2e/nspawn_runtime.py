"""Boot a real systemd (PID 1 of its own) in `systemd-nspawn` on a CI machine, for the rendered units' tests.

`tools/nspawn-root.sh` (run by tools/ci-services.sh as root) installs systemd-container and caches a minimal
Debian bookworm root with systemd as a directory; `NspawnMachine` boots it:

    systemd-nspawn -q -D ROOT --boot --register=no --keep-unit --private-network --volatile=overlay
                   --console=passive --bind-ro=P ...

- `--volatile=overlay`: every write lands in a tmpfs overlay that vanishes at power-off; the cached root is
  never changed, and the container has its own `/tmp` (never boot systemd in a namespace that shares the
  host's `/tmp`: its tmpfiles empty it).
- `--private-network`: the container has only its own loopback. Nothing in it can reach the host's servers
  or any other address, and its servers take any port without racing the host's (another CI run's vLLM
  servers). The tests talk to it from inside: `run()` is `nsenter -t LEADER -a ARGV` (curl, python,
  systemctl, journalctl all run in the container's namespaces, with its root).
- `--register=no --keep-unit`: there is no machined on this kind of host (PID 1 is not systemd).
- read-only binds: this run's software at fixed places under `/opt/deploykit-ci` (`CI_ROOT`), whatever the
  host path: the checkout, its venv (`sys.prefix`) and the venv's interpreter prefix (`sys.base_prefix`,
  pyenv under /root here; its `libpython` is found through an ld.so.conf entry). So the units' sandbox
  (`ProtectHome=yes` hides /root and /home, `PrivateTmp=yes` /tmp) sees them wherever the checkout was cloned.
  Directories a test names (the tiny model) are bound at the same paths; one under another is bound once.

`close()` powers the machine off (`systemctl poweroff` inside), waits for systemd-nspawn to exit, kills its
process group if it does not, and checks that no mount of the root is left on the host.

Use (the session fixture `nspawn_machine` is in tests/e2e/conftest.py):

    nspawn_machine.write_file("/etc/systemd/system/x.service", text)
    nspawn_machine.systemctl("daemon-reload")
    nspawn_machine.systemctl("start", "x.service")
    assert nspawn_machine.unit_property("x.service", "ActiveState") == "active"
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

CACHE_DIR = Path(os.environ.get("DEPLOYKIT_CI_CACHE", "/var/cache/deploykit-ci"))
ROOT_DIR = CACHE_DIR / "nspawn-bookworm"
STATUS_FILE = CACHE_DIR / "nspawn-root.status"
SETUP_HINT = "run tools/nspawn-root.sh as root"
# The container's writes live in a tmpfs overlay (memory), logs and the console file here.
MIN_FREE_BYTES = 512 << 20
MIN_AVAILABLE_MEMORY_BYTES = 3 << 30
BOOT_TIMEOUT_S = 120.0
POWEROFF_TIMEOUT_S = 60.0
_SYSTEMD_EXES = ("/usr/lib/systemd/systemd", "/lib/systemd/systemd")
# Where this run's software is bound in the container: visible to every unit's sandbox, owned as on the host.
CI_ROOT = "/opt/deploykit-ci"
CHECKOUT_AT = f"{CI_ROOT}/checkout"
VENV_AT = f"{CI_ROOT}/venv"
PYTHON_AT = f"{CI_ROOT}/python"
_SYSTEM_PREFIXES = ("/", "/usr", "/etc", "/var", "/bin", "/lib")


class NspawnError(RuntimeError):
    """A command in the container failed; carries its argv, exit status and output."""

    def __init__(self, argv: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(
            f"in the container: {shlex.join(argv)} exited {returncode}\n--- stdout\n{stdout[-4000:]}\n"
            f"--- stderr\n{stderr[-4000:]}"
        )


def read_status(path: Path = STATUS_FILE) -> dict[str, str]:
    """The `key=value` lines that tools/nspawn-root.sh writes; {} when there is no such file."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def unavailable_reason(scratch_parent: Path | None = None) -> str | None:
    """Why this machine cannot boot the container (a sentence for a skip), or None when it can."""
    if sys.platform != "linux":
        return "systemd-nspawn needs Linux"
    if os.geteuid() != 0:
        return "the systemd unit tests need root (systemd-nspawn)"
    for tool in ("systemd-nspawn", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} not installed: {SETUP_HINT}"
    status = read_status()
    if not status:
        return f"the systemd-nspawn root is not set up (no {STATUS_FILE}): {SETUP_HINT}"
    if status.get("status") != "ready":
        return f"the systemd-nspawn root is not ready: {status.get('reason') or 'unknown'} ({STATUS_FILE})"
    root = Path(status.get("root", str(ROOT_DIR)))
    if not any((root / exe.lstrip("/")).exists() for exe in _SYSTEMD_EXES):
        return f"the cached root {root} has no systemd: {SETUP_HINT}"
    parent = scratch_parent or Path("/var/tmp")
    free = shutil.disk_usage(parent).free
    if free < MIN_FREE_BYTES:
        return f"only {free >> 20} MB free at {parent}: the container needs {MIN_FREE_BYTES >> 20} MB"
    memory = _available_memory()
    if memory < MIN_AVAILABLE_MEMORY_BYTES:
        need = MIN_AVAILABLE_MEMORY_BYTES >> 20
        return f"only {memory >> 20} MB memory available: the container's servers need {need} MB"
    return None


def distinct_binds(paths: Iterable[Path]) -> list[Path]:
    """Resolved, existing directories, without one that lies inside another (bound once, through it)."""
    resolved = sorted(
        {Path(os.path.realpath(p)) for p in paths if Path(p).exists()}, key=lambda p: len(p.parts)
    )
    chosen: list[Path] = []
    for path in resolved:
        if str(path) in _SYSTEM_PREFIXES:
            continue  # a system Python's prefix is the container's own /usr
        if not any(path == c or path.is_relative_to(c) for c in chosen):
            chosen.append(path)
    return chosen


def wait_for(fact: Callable[[], bool], what: str, timeout: float, interval: float = 0.5) -> None:
    """Poll `fact` until it holds; AssertionError naming `what` after `timeout` seconds. Never a fixed sleep
    that hopes: every wait in these tests is for a state."""
    deadline = time.monotonic() + timeout
    while not fact():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


class NspawnMachine:
    """One booted container; every command runs in it through `nsenter -t LEADER -a`."""

    def __init__(
        self,
        workdir: Path,
        *,
        root: Path | None = None,
        binds_ro: Iterable[Path] = (),
        placed_ro: Mapping[Path, str] | None = None,
        command_timeout: float = 120.0,
        model_cache: Path | None = None,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.root = root or Path(read_status().get("root", str(ROOT_DIR)))
        self.binds_ro = distinct_binds(binds_ro)
        # host directory -> its path in the container (a system prefix is the container's own, not bound)
        self.placed_ro = {
            Path(os.path.realpath(host)): at
            for host, at in (placed_ro or {}).items()
            if str(Path(os.path.realpath(host))) not in _SYSTEM_PREFIXES
        }
        self.command_timeout = command_timeout
        # where a service user finds the tiny model (DEPLOYKIT_MODEL_CACHE when rendering), when bound
        self.model_cache = model_cache
        self.console_log = self.workdir / "console.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.leader = 0
        self.systemd_version = ""

    # -- boot and power-off ----------------------------------------------------------------------------------
    def argv(self) -> list[str]:
        argv = ["systemd-nspawn", "-q", "-D", str(self.root), "--boot", "--register=no", "--keep-unit"]
        argv += ["--private-network", "--volatile=overlay", "--console=passive"]
        argv += [f"--bind-ro={p}" for p in self.binds_ro]
        argv += [f"--bind-ro={host}:{at}" for host, at in self.placed_ro.items()]
        return argv

    def boot(self, timeout: float = BOOT_TIMEOUT_S) -> None:
        with self.console_log.open("wb") as console:
            self.process = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self.leader:
            if self.process.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self.process.returncode}: {self.console_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"systemd-nspawn started no systemd within {timeout:.0f} s: {self.console_tail()}"
                )
            self.leader = self._find_leader(self.process.pid)
            if not self.leader:
                time.sleep(0.1)
        # Poll: until systemd's private bus is up, systemctl cannot connect at all (empty output).
        state = ""
        while state not in ("running", "degraded", "maintenance", "stopping"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the container's systemd is {state!r} after {timeout:.0f} s, not running")
            if state:
                time.sleep(0.1)
            state = (
                self.run(["systemctl", "is-system-running"], check=False, timeout=30).stdout.strip() or "?"
            )
        if state != "running":
            failed = self.run(["systemctl", "--failed", "--no-legend", "--plain"], check=False).stdout
            raise RuntimeError(f"the container's systemd is {state!r}, not running; failed: {failed}")
        self.systemd_version = self.run(["systemctl", "--version"]).stdout.split()[1]

    @staticmethod
    def _find_leader(nspawn_pid: int) -> int:
        """The container's PID 1 as the host sees it: a child of systemd-nspawn running systemd."""
        try:
            children = Path(f"/proc/{nspawn_pid}/task/{nspawn_pid}/children").read_text().split()
        except OSError:
            return 0
        for child in children:
            try:
                if os.readlink(f"/proc/{child}/exe") in _SYSTEMD_EXES:
                    return int(child)
            except OSError:
                continue
        return 0

    def console_tail(self, chars: int = 2000) -> str:
        try:
            return self.console_log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def close(self) -> None:
        """Power off (systemd stops every unit, so every server stops), wait, kill if it hangs; then check
        that systemd-nspawn left no mount of the root behind."""
        process = self.process
        if process is None:
            return
        if process.poll() is None and self.leader:
            self.run(["systemctl", "poweroff"], check=False, timeout=30)
        try:
            process.wait(POWEROFF_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
        self.process = None
        left = [
            line.split()[4]
            for line in Path("/proc/self/mountinfo").read_text().splitlines()
            if str(self.root) in line.split()[4] or str(self.root) in line.split()[3]
        ]
        if left:
            raise RuntimeError(f"mounts of {self.root} left after power-off: {left}")

    # -- commands in the container ---------------------------------------------------------------------------
    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float | None = None,
        input: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """`argv` in all of the container's namespaces (its root, its network, its PID 1), as its root,
        with a clean environment (PATH, plus `env`)."""
        if not self.leader:
            raise RuntimeError("the container is not booted")
        variables = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "LANG": "C.UTF-8",
        }
        variables.update(env or {})
        command = ["nsenter", "-t", str(self.leader), "-a", "env", "-i"]
        command += [f"{k}={v}" for k, v in variables.items()]
        command += list(argv)
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                input=input,
                stdin=None if input is not None else subprocess.DEVNULL,
                timeout=timeout or self.command_timeout,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
            raise NspawnError(list(argv), -1, out, f"timed out after {exc.timeout} s") from exc
        if check and done.returncode != 0:
            raise NspawnError(list(argv), done.returncode, done.stdout, done.stderr)
        return done

    def systemctl(self, *args: str, check: bool = True, timeout: float | None = None) -> str:
        return self.run(["systemctl", *args], check=check, timeout=timeout).stdout

    def unit_property(self, unit: str, name: str) -> str:
        return self.systemctl("show", "-p", name, "--value", unit).strip()

    def journal(self, *args: str) -> str:
        """`journalctl --no-pager ARGS` (everything since boot, with `-o verbose` all fields)."""
        return self.run(["journalctl", "--no-pager", *args], timeout=120).stdout

    def write_file(self, path: str, content: str, mode: int = 0o644, owner: str = "root") -> None:
        """Write a file in the container (its overlay), created with `mode` from the start."""
        # Parent directories 0755 (as `install -d -m 0755`), the file private until it has its mode.
        script = (
            'set -e; umask 022; mkdir -p "$(dirname "$1")"; umask 077; cat >"$1.tmp"; chmod "$2" "$1.tmp"'
        )
        script += '; chown "$3" "$1.tmp"; mv -f "$1.tmp" "$1"'
        self.run(["sh", "-c", script, "sh", path, f"{mode:o}", owner], input=content)

    def host_path(self, path: str) -> Path:
        """A path inside the container as the host reaches it (read-only use: /proc/LEADER/root/...)."""
        return Path(f"/proc/{self.leader}/root") / path.lstrip("/")
