"""Play Kubernetes YAML in real podman (4.3, rootful) on a CI machine, for tests of the rendered Helm pod.

`tools/pod-runtime.sh` (run by tools/ci-services.sh as root) installs podman and caches a minimal Debian
bookworm root as a tarball; `PodRuntime` imports it as an image and plays pods from it, with all of podman's
state under one scratch directory that `close()` removes. No registry is reachable here, so every image is
that root; the host's venv (`sys.prefix`) and its interpreter's prefix (`sys.base_prefix`) are brought into
the pods as read-only hostPath volumes at the same paths, so the pods run the very vLLM the tests run.

A test changes a rendered spec in these ways only (all visible in the YAML it plays):
  1. `replace_images`: container images become the locally imported one (and `imagePullPolicy: Never`,
     since nothing can be pulled);
  2. `add_host_mounts`: hostPath volumes + read-only mounts for the venv, the interpreter prefix and any
     host directory the test names;
  3. `set_restart_policy`, only where the pod has init containers and `restartPolicy: Always` (every
     Deployment): podman 4.3 gives init containers the pod's restart policy, so under Always the init
     container restarts forever and `kube play` fails ("failed to remove once init container").
  4. `add_service_links`: what a kubelet adds and podman does not: the Docker-link variables of the
     namespace's Services (`<NAME>_PORT=tcp://...`), unless the pod says `enableServiceLinks: false`;
  5. for the pods of a LeaderWorkerSet (a custom resource: no controller here makes them), each pod is its
     template played as a Pod, with what the controller and the cluster's DNS give it: `add_lws_identity`
     (LWS_* variables, hostname, subdomain) and `add_host_aliases` (the leader's DNS name → its address on a
     `network_create` network of the runtime's own, the pods' static addresses given to `play --ip`);
  6. `expand_env_references`: the kubelet's `$(NAME)` expansion in command and args (podman 4.3 passes
     `$(NAME)` on as it is).

What podman 4.3 does with the rest of a pod, as measured (see also /work/shared/notes/runtimes.md):
  - containers are named `<pod name>-<container name>`; a Deployment's pod is `<deployment name>-pod-0`;
  - init containers run first, to completion, and are then removed (podman's "once" init containers): their
    effect (a file in an emptyDir) is visible, their logs are not;
  - a `kind: Secret` in the YAML is mis-read: create secrets first with `secret_create` (a JSON map of
    base64 values, what `secretKeyRef` reads);
  - liveness probes become healthchecks (exec → `/bin/sh -c "<argv joined by spaces> || exit 1"`, httpGet →
    `curl -f http://localhost:<port><path> || exit 1`) that never run on their own here (no systemd timers):
    run them with `healthcheck_run`; a failing one never restarts the container. Readiness and startup
    probes are ignored;
  - `kube down` leaves ConfigMap volumes and secrets behind (`close()` removes them);
  - a container that ended is `exited` or `stopped` (both mean done; see `wait_for_exit`);
  - a multi-line string starting with whitespace anywhere in the YAML fails the whole play with a YAML error
    (`play` checks first, see `check_kube_yaml`); write YAML with `dump_kube_yaml`, not `yaml.dump`.
The image's /root is 0755 (tools/pod-runtime.sh) so that a pod running as a non-root user (the chart's
securityContext) reaches a Python prefix under /root (pyenv). The one thing podman writes outside the scratch
directory is its blob-info cache, /var/lib/containers/cache (a 64 KB database).

Use (the fixtures `pod_runtime` and `pod_base_image` are in tests/e2e/conftest.py; plain Python here):

    docs = list(yaml.safe_load_all(rendered_chart))
    spec = pod_spec_of(deployment)
    replace_images(spec, pod_base_image)                 # PATH in the image: the venv's bin first
    add_host_mounts(spec, ["vllm"], extra_dirs=[REPO])   # venv + interpreter prefix (+ the checkout)
    set_restart_policy(spec)                             # init containers + Always: OnFailure (4.3)
    pod_runtime.secret_create("hf-token", {"token": "x"})
    (pod,) = pod_runtime.play(dump_kube_yaml(docs))
    pod_runtime.wait_for_log(f"{pod.name}-vllm", r"Application startup complete", timeout=300)
    assert pod_runtime.healthcheck_run(f"{pod.name}-vllm") == 0
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

CACHE_DIR = Path(os.environ.get("DEPLOYKIT_CI_CACHE", "/var/cache/deploykit-ci"))
ROOTFS_TAR = CACHE_DIR / "rootfs-bookworm.tar"
STATUS_FILE = CACHE_DIR / "pod-runtime.status"
SETUP_HINT = "run tools/pod-runtime.sh as root"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Below this much free disk at the scratch directory a session would fill the disk (image ~180 MB, overlays).
MIN_FREE_BYTES = 1 << 30
# The ulimits this kind of VM allows: root lacks CAP_SYS_RESOURCE and the hard open-files limit is 20000, so
# podman's defaults (raising them) fail with EPERM.
DEFAULT_ULIMITS = ("nofile=20000:20000", "nproc=32768:32768")
# Directories that must not be mounted over the image's own (a system Python's prefix is /usr).
_SYSTEM_PREFIXES = frozenset({"/", "/usr", "/bin", "/lib", "/etc", "/var"})

T = TypeVar("T")


class PodmanError(RuntimeError):
    """A podman command failed; carries its argv, exit status and output."""

    def __init__(self, argv: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(
            f"podman {' '.join(argv)} exited {returncode}\n--- stdout\n{stdout[-4000:]}\n--- stderr\n"
            f"{_quiet_stderr(stderr)[-4000:]}"
        )


def _quiet_stderr(stderr: str) -> str:
    """Podman 4.3's stderr without its noise on this machine (no systemd for healthcheck timers)."""
    noise = ("unable to get systemd connection", "Removing container", "Removing timer for container")
    return "\n".join(line for line in stderr.splitlines() if not any(n in line for n in noise))


def read_status(path: Path = STATUS_FILE) -> dict[str, str]:
    """The `key=value` lines that tools/pod-runtime.sh writes; {} when there is no such file."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def unavailable_reason(scratch_parent: Path | None = None) -> str | None:
    """Why this machine cannot play pods (a sentence for a skip), or None when it can."""
    if os.geteuid() != 0:
        return "podman pod tests need root (rootful podman with --root/--runroot)"
    if shutil.which("podman") is None:
        return f"podman not installed: {SETUP_HINT}"
    status = read_status()
    if not status:
        return f"podman runtime not set up (no {STATUS_FILE}): {SETUP_HINT}"
    if status.get("status") != "ready":
        return f"podman runtime not ready: {status.get('reason') or 'unknown'} ({STATUS_FILE})"
    rootfs = Path(status.get("rootfs", str(ROOTFS_TAR)))
    if not rootfs.is_file():
        return f"the cached Debian root {rootfs} is missing: {SETUP_HINT}"
    parent = scratch_parent or Path(tempfile.gettempdir())
    free = shutil.disk_usage(parent).free
    if free < MIN_FREE_BYTES:
        return f"only {free >> 20} MB free at {parent}: pods need {MIN_FREE_BYTES >> 20} MB"
    return None


@dataclass(frozen=True)
class ContainerState:
    """What `podman container inspect` says about one container."""

    name: str
    status: str  # created | running | exited | stopped | paused | ...
    running: bool
    exit_code: int
    restart_count: int
    health: str  # "" without a healthcheck; starting | healthy | unhealthy
    failing_streak: int
    pid: int
    oom_killed: bool


@dataclass(frozen=True)
class PlayedPod:
    """A pod that `kube play` created: its name, id and containers (names, infra container left out)."""

    name: str
    id: str
    containers: tuple[str, ...]


@dataclass
class PendingPlay:
    """A `kube play` still running (`PodRuntime.start_play`)."""

    runtime: PodRuntime
    process: subprocess.Popen[str]
    args: list[str]

    def done(self) -> bool:
        return self.process.poll() is not None

    def wait(self, timeout: float) -> list[PlayedPod]:
        """The pods it created, once it returned; PodmanError when it failed or took longer than `timeout`
        (then it is stopped)."""
        try:
            stdout, stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise PodmanError(self.args, -1, "", f"timed out after {timeout} s") from None
        if self.process.returncode != 0:
            raise PodmanError(self.args, self.process.returncode, stdout, stderr)
        return [self.runtime.pod(pod_id) for pod_id in _section(stdout, "Pod")]

    def stop(self) -> None:
        """End the `kube play` process (what it made stays, for `down` or `close`)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


class PodRuntime:
    """Rootful podman with all state under `workdir` (storage, runroot, tmp, events, secrets, kube files).

    Every podman call has a time limit; `close()` tears down what was played, unmounts what podman left
    mounted under `workdir`, kills any process still working in it, and removes it.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        rootfs: Path | None = None,
        command_timeout: float = 180.0,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.rootfs = rootfs or Path(read_status().get("rootfs", str(ROOTFS_TAR)))
        self.command_timeout = command_timeout
        self._played: list[Path] = []
        self._networks: list[str] = []
        self._counter = 0
        self._closed = False
        for sub in ("root", "runroot", "tmp", "net", "kube", "secrets"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        self.conf = self.workdir / "containers.conf"
        ulimits = ", ".join(json.dumps(u) for u in DEFAULT_ULIMITS)
        self.conf.write_text(
            "[containers]\n"
            f"default_ulimits = [{ulimits}]\n"
            'log_driver = "k8s-file"\n'
            "\n[engine]\n"
            # crun refuses this machine's cgroup layout; PID 1 is not systemd, and there is no journald.
            'runtime = "runc"\n'
            'cgroup_manager = "cgroupfs"\n'
            'events_logger = "file"\n'
            f'tmp_dir = "{self.workdir / "tmp"}"\n'
            "\n[network]\n"
            f'network_config_dir = "{self.workdir / "net"}"\n'
        )

    # -- podman ----------------------------------------------------------------------------------------------
    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def base_argv(self) -> list[str]:
        """`podman` with this runtime's storage: for a test that runs podman itself."""
        return ["podman", "--root", str(self.workdir / "root"), "--runroot", str(self.workdir / "runroot")]

    def podman(
        self,
        *args: str,
        check: bool = True,
        timeout: float | None = None,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run one podman command (bounded by `timeout`, default `command_timeout`)."""
        if self._closed:
            raise RuntimeError("PodRuntime is closed")
        argv = [*self.base_argv(), *args]
        try:
            proc = subprocess.run(
                argv,
                env=self.env,
                capture_output=True,
                text=True,
                input=input,
                stdin=None if input is not None else subprocess.DEVNULL,
                timeout=timeout or self.command_timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise PodmanError(list(args), -1, _text(exc.stdout), f"timed out after {exc.timeout} s") from exc
        if check and proc.returncode != 0:
            raise PodmanError(list(args), proc.returncode, proc.stdout, proc.stderr)
        return proc

    # -- images, secrets -------------------------------------------------------------------------------------
    def import_image(
        self,
        name: str,
        *,
        path_prefix: Sequence[str | os.PathLike[str]] = (),
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Import the cached root as image `name` (`localhost/` added when it has no registry part).

        The imported image has no environment at all: PATH is set to the usual Debian one, with
        `path_prefix` (e.g. `host_venv_bin()`) first; `env` adds other variables.
        """
        ref = name if "/" in name.split(":", 1)[0] else f"localhost/{name}"
        if ":" not in ref.rsplit("/", 1)[-1]:
            ref += ":latest"
        path = ":".join([*(os.fspath(p) for p in path_prefix), DEFAULT_PATH])
        changes = [f"ENV=PATH={path}", *(f"ENV={k}={v}" for k, v in (env or {}).items())]
        argv = ["import", "--quiet"]
        for change in changes:
            argv += ["--change", change]
        self.podman(*argv, str(self.rootfs), ref)
        return ref

    def secret_create(self, name: str, mapping: Mapping[str, str | bytes], *, replace: bool = True) -> None:
        """Create secret `name` the way podman 4.3's `secretKeyRef` reads it: a JSON map of base64 values
        (`{"token": "czNjcjN0"}`), made with `podman secret create NAME FILE`. `replace` first removes a
        secret of that name (4.3 has no `--replace`).

        (A `kind: Secret` document in the played YAML is mis-read by 4.3, so secrets are made here.)
        """
        if replace:
            self.podman("secret", "rm", name, check=False)
        data = {
            key: base64.b64encode(value.encode() if isinstance(value, str) else value).decode()
            for key, value in mapping.items()
        }
        path = self.workdir / "secrets" / f"{name}.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle)
        self.podman("secret", "create", name, str(path))

    # -- kube play -------------------------------------------------------------------------------------------
    def _kube_file(self, yaml_text: str) -> Path:
        for path in self._played:
            if path.read_text() == yaml_text:
                return path
        self._counter += 1
        path = self.workdir / "kube" / f"play-{self._counter}.yaml"
        path.write_text(yaml_text)
        return path

    def play(
        self, yaml_text: str, *, extra_args: Sequence[str] = (), timeout: float | None = None
    ) -> list[PlayedPod]:
        """`podman kube play --network host` the YAML; the pods it created with their containers.

        Returns once the init containers have finished and the containers have started (that is when
        `kube play` returns). On failure the YAML is still torn down by `down`/`close`.
        """
        check_kube_yaml(yaml_text)
        path = self._kube_file(yaml_text)
        if path not in self._played:
            self._played.append(path)
        argv = ["kube", "play"]
        if not any(a == "--network" or a.startswith("--network=") for a in extra_args):
            argv += ["--network", "host"]
        proc = self.podman(*argv, *extra_args, str(path), timeout=timeout)
        return [self.pod(pod_id) for pod_id in _section(proc.stdout, "Pod")]

    def start_play(self, yaml_text: str, *, extra_args: Sequence[str] = ()) -> PendingPlay:
        """`play`, without waiting for it: for a pod whose init containers wait for something the test does
        next (a group's worker waits for its leader). `PendingPlay.wait` gives the pods; until `kube play`
        has returned, podman holds the pod and neither `kube down` nor `close` can remove it, so a test that
        gives up calls `PendingPlay.stop` first."""
        check_kube_yaml(yaml_text)
        path = self._kube_file(yaml_text)
        if path not in self._played:
            self._played.append(path)
        argv = [*self.base_argv(), "kube", "play"]
        if not any(a == "--network" or a.startswith("--network=") for a in extra_args):
            argv += ["--network", "host"]
        process = subprocess.Popen(
            [*argv, *extra_args, str(path)],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return PendingPlay(self, process, [*argv[len(self.base_argv()) :], *extra_args, str(path)])

    def pod(self, name_or_id: str) -> PlayedPod:
        info = json.loads(self.podman("pod", "inspect", name_or_id).stdout)
        if isinstance(info, list):
            info = info[0]
        infra = info.get("InfraContainerID", "")
        names = tuple(c["Name"] for c in info.get("Containers") or [] if c.get("Id") != infra)
        return PlayedPod(name=info["Name"], id=info["Id"], containers=names)

    def down(self, yaml_text: str, *, timeout: float | None = None) -> None:
        """`podman kube down` the YAML (what `play` created; ConfigMap volumes and secrets stay)."""
        path = self._kube_file(yaml_text)
        self.podman("kube", "down", str(path), timeout=timeout)
        if path in self._played:
            self._played.remove(path)

    # -- networks --------------------------------------------------------------------------------------------
    def network_create(self, name: str, subnet: str) -> str:
        """A bridge network of this runtime's own (its CNI config lives under `workdir`), for pods that must
        reach each other by address, as a cluster's pods do; `close()` removes it. Podman 4.3 with CNI has no
        name service on it: give pods the names they look up with `add_host_aliases`."""
        self.podman("network", "create", "--driver", "bridge", "--subnet", subnet, name)
        self._networks.append(name)
        return name

    def network_remove(self, name: str) -> None:
        """Remove the network and what still uses it; never raises (a teardown step)."""
        with contextlib.suppress(PodmanError):
            self.podman("network", "rm", "--force", name, check=False, timeout=120)
        if name in self._networks:
            self._networks.remove(name)

    # -- containers ------------------------------------------------------------------------------------------
    def exec(
        self, container: str, argv: Sequence[str], *, check: bool = False, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`podman exec CONTAINER argv...` (argv is not passed through a shell)."""
        return self.podman("exec", container, *argv, check=check, timeout=timeout)

    def healthcheck_run(self, container: str, *, timeout: float | None = None) -> int:
        """Run the container's healthcheck (its liveness probe) once: 0 healthy, 1 unhealthy, else error."""
        return self.podman("healthcheck", "run", container, check=False, timeout=timeout).returncode

    def logs(self, container: str) -> str:
        """stdout and stderr of the container (all of its runs), as text."""
        proc = self.podman("logs", container)
        return proc.stdout + proc.stderr

    def inspect_raw(self, container: str) -> dict[str, Any]:
        data = json.loads(self.podman("container", "inspect", container).stdout)
        result: dict[str, Any] = data[0]
        return result

    def inspect(self, container: str) -> ContainerState:
        raw = self.inspect_raw(container)
        state = raw.get("State") or {}
        health = state.get("Health") or state.get("Healthcheck") or {}
        return ContainerState(
            name=raw.get("Name", container),
            status=state.get("Status", ""),
            running=bool(state.get("Running")),
            exit_code=int(state.get("ExitCode", 0)),
            restart_count=int(raw.get("RestartCount", 0)),
            health=health.get("Status", "") if raw.get("Config", {}).get("Healthcheck") else "",
            failing_streak=int(health.get("FailingStreak", 0)),
            pid=int(state.get("Pid", 0)),
            oom_killed=bool(state.get("OOMKilled")),
        )

    def exists(self, container: str) -> bool:
        return self.podman("container", "exists", container, check=False).returncode == 0

    # -- bounded waits ---------------------------------------------------------------------------------------
    @staticmethod
    def wait_until(
        probe: Callable[[], T | None],
        *,
        timeout: float,
        what: str,
        interval: float = 0.2,
    ) -> T:
        """Call `probe` until it returns something truthy (returned), for at most `timeout` seconds."""
        deadline = time.monotonic() + timeout
        last: T | None = None
        while True:
            last = probe()
            if last:
                return last
            if time.monotonic() >= deadline:
                raise TimeoutError(f"not within {timeout:g} s: {what} (last: {last!r})")
            time.sleep(interval)

    def wait_for_state(
        self, container: str, accept: Callable[[ContainerState], bool], *, timeout: float, what: str
    ) -> ContainerState:
        """Inspect `container` until `accept(state)`; the accepted state."""

        def probe() -> ContainerState | None:
            state = self.inspect(container)
            return state if accept(state) else None

        return self.wait_until(probe, timeout=timeout, what=f"{container}: {what}")

    def wait_for_exit(self, container: str, *, timeout: float) -> ContainerState:
        return self.wait_for_state(
            container, lambda s: s.status in ("exited", "stopped"), timeout=timeout, what="exited"
        )

    def wait_for_log(self, container: str, pattern: str, *, timeout: float) -> re.Match[str]:
        """Wait until the container's logs match the regex `pattern`; the match."""
        regex = re.compile(pattern, re.MULTILINE)
        return self.wait_until(
            lambda: regex.search(self.logs(container)), timeout=timeout, what=f"{container} logs /{pattern}/"
        )

    # -- teardown --------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Tear everything down: played YAML, pods, containers, volumes, secrets, mounts, processes, files."""
        if self._closed:
            return
        quick = 60.0
        for path in reversed(self._played):
            self.podman("kube", "down", str(path), check=False, timeout=quick)
        self._played.clear()
        self.podman("pod", "rm", "--all", "--force", "--time", "0", check=False, timeout=quick)
        self.podman("rm", "--all", "--force", "--time", "0", check=False, timeout=quick)
        self.podman("volume", "rm", "--all", "--force", check=False, timeout=quick)
        self.podman("secret", "rm", "--all", check=False, timeout=quick)
        for network in list(self._networks):  # after the pods that used them
            self.network_remove(network)
        self._closed = True
        _kill_processes_using(self.workdir)
        _unmount_below(self.workdir)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> PodRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- spec edits (the only changes a test makes to a rendered spec; see the module docstring) -----------------
def host_venv() -> Path:
    """The venv of this test run (`sys.prefix`), mounted read-only at the same path in pods."""
    return Path(sys.prefix)


def host_venv_bin() -> Path:
    return host_venv() / "bin"


def host_python_prefix() -> Path:
    """The venv interpreter's prefix (`sys.base_prefix`: the venv's `python` is a symlink into it)."""
    return Path(sys.base_prefix)


def pod_spec_of(doc: dict[str, Any]) -> dict[str, Any]:
    """The PodSpec inside a Pod, or a Deployment / StatefulSet / DaemonSet / ReplicaSet / Job template."""
    if doc.get("kind") == "Pod":
        spec: dict[str, Any] = doc["spec"]
        return spec
    template = doc.get("spec", {}).get("template")
    if doc.get("kind") == "CronJob":
        template = doc["spec"]["jobTemplate"]["spec"]["template"]
    if not template or "spec" not in template:
        raise ValueError(f"no pod spec in a {doc.get('kind')!r} document")
    spec = template["spec"]
    return spec


def _containers(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from spec.get("initContainers") or []
    yield from spec.get("containers") or []


def add_host_mounts(
    spec: dict[str, Any],
    containers: Iterable[str] | None = None,
    *,
    extra_dirs: Iterable[str | os.PathLike[str]] = (),
    venv: bool = True,
) -> dict[str, Any]:
    """Mount host directories read-only at their own paths into the named containers (all when None).

    `spec` is a PodSpec (see `pod_spec_of`), changed in place and returned. Brought in: the test run's venv
    (`sys.prefix`) and its interpreter's prefix (`sys.base_prefix`) when `venv`, and every `extra_dirs` entry
    (e.g. the checkout, for an editable install's `.pth`). A system prefix (/usr) is never mounted over the
    image's own. Volumes are named `host-<n>`, hostPath type Directory.
    """
    dirs: list[str] = []
    if venv:
        dirs += [os.fspath(host_venv()), os.fspath(host_python_prefix())]
    dirs += [os.fspath(d) for d in extra_dirs]
    unique: list[str] = []
    for d in dirs:
        d = os.path.abspath(d)
        if d not in unique and d not in _SYSTEM_PREFIXES:
            unique.append(d)
    wanted = None if containers is None else set(containers)
    targets = [c for c in _containers(spec) if wanted is None or c.get("name") in wanted]
    if wanted is not None:
        missing = wanted - {c.get("name") for c in targets}
        if missing:
            raise KeyError(f"no container named {sorted(missing)} in the pod spec")
    volumes = spec.setdefault("volumes", [])
    taken = {v.get("name") for v in volumes}
    mounts = []
    n = 0
    for d in unique:
        while f"host-{n}" in taken:
            n += 1
        name = f"host-{n}"
        taken.add(name)
        volumes.append({"name": name, "hostPath": {"path": d, "type": "Directory"}})
        mounts.append({"name": name, "mountPath": d, "readOnly": True})
    for container in targets:
        container.setdefault("volumeMounts", []).extend(copy.deepcopy(mounts))
    return spec


def replace_images(spec: dict[str, Any], images: str | Mapping[str, str]) -> dict[str, Any]:
    """Point containers at local images, with `imagePullPolicy: Never` (no registry is reachable).

    `images` is one image for every container (init ones too), or a map whose keys are container names or
    original image references. A key that matches nothing is an error (a typo would test the wrong pod).
    """
    used: set[str] = set()
    for container in _containers(spec):
        if isinstance(images, str):
            new = images
        else:
            key = container.get("name", "") if container.get("name") in images else container.get("image", "")
            if key not in images:
                continue
            used.add(key)
            new = images[key]
        container["image"] = new
        container["imagePullPolicy"] = "Never"
    if not isinstance(images, str) and set(images) - used:
        raise KeyError(f"no container or image {sorted(set(images) - used)} in the pod spec")
    return spec


def set_restart_policy(spec: dict[str, Any], policy: str = "OnFailure") -> dict[str, Any]:
    """Podman 4.3 workaround: init containers inherit the pod's restartPolicy, and under `Always` they
    restart forever (kube play then fails). Change `Always` (explicit or default) to `policy`, only when the
    pod has init containers; a test that does so says it."""
    if spec.get("initContainers") and spec.get("restartPolicy", "Always") == "Always":
        spec["restartPolicy"] = policy
    return spec


def add_service_links(spec: dict[str, Any], services: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Kubelet's service links, which podman never injects: unless `enableServiceLinks` is false, every
    container gets, for each Service of the namespace, `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT`,
    `<NAME>_PORT=tcp://IP:PORT` and the `<NAME>_PORT_<P>_TCP*` family (NAME upper-cased, `-` as `_`); a
    variable the container sets itself wins. The Service's cluster IP is made up (10.96.0.10): nothing here
    routes to it. Changes `spec` in place and returns it."""
    if spec.get("enableServiceLinks", True) is False:
        return spec
    links: dict[str, str] = {}
    for service in services:
        name = service["metadata"]["name"].upper().replace("-", "_")
        ports = service["spec"]["ports"]
        ip = "10.96.0.10"
        links[f"{name}_SERVICE_HOST"] = ip
        links[f"{name}_SERVICE_PORT"] = str(ports[0]["port"])
        links[f"{name}_PORT"] = f"tcp://{ip}:{ports[0]['port']}"
        for port in ports:
            prefix = f"{name}_PORT_{port['port']}_TCP"
            links[prefix] = f"tcp://{ip}:{port['port']}"
            links[f"{prefix}_PROTO"] = "tcp"
            links[f"{prefix}_PORT"] = str(port["port"])
            links[f"{prefix}_ADDR"] = ip
    for container in _containers(spec):
        own = {e["name"] for e in container.get("env") or []}
        extra = [{"name": k, "value": v} for k, v in links.items() if k not in own]
        container["env"] = [*extra, *(container.get("env") or [])]
    return spec


def add_lws_identity(
    spec: dict[str, Any],
    *,
    leader_address: str,
    group_size: int,
    worker_index: int,
    hostname: str,
    subdomain: str,
) -> dict[str, Any]:
    """What the LeaderWorkerSet controller gives each pod of a group and podman cannot: LWS_LEADER_ADDRESS,
    LWS_GROUP_SIZE and LWS_WORKER_INDEX in every container's environment, init containers too (put first,
    as LWS does, so a later variable may refer to them), and the pod's hostname and subdomain (the set's
    headless Service). Changes `spec` (a PodSpec) in place and returns it."""
    identity = [
        {"name": "LWS_LEADER_ADDRESS", "value": leader_address},
        {"name": "LWS_GROUP_SIZE", "value": str(group_size)},
        {"name": "LWS_WORKER_INDEX", "value": str(worker_index)},
    ]
    for container in _containers(spec):
        own = [e for e in container.get("env") or [] if e["name"] not in {i["name"] for i in identity}]
        container["env"] = [*copy.deepcopy(identity), *own]
    spec["hostname"] = hostname
    spec["subdomain"] = subdomain
    return spec


def expand_env_references(spec: dict[str, Any]) -> dict[str, Any]:
    """The kubelet's expansion of `$(NAME)` in each container's command and args, which podman 4.3 does not
    do: from the container's own `env` values; `$$` is a literal `$`; a name the container does not define
    stays `$(NAME)`, as Kubernetes leaves it (k8s.io/kubernetes third_party/forked/golang/expansion). Changes
    `spec` in place and returns it."""
    for container in _containers(spec):
        values = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
        for field_name in ("command", "args"):
            if field_name in container:
                container[field_name] = [_expand(word, values) for word in container[field_name]]
    return spec


def _expand(word: str, values: Mapping[str, str]) -> str:
    out: list[str] = []
    index = 0
    while index < len(word):
        if word.startswith("$$", index):
            out.append("$")
            index += 2
        elif word.startswith("$(", index) and ")" in word[index + 2 :]:
            end = word.index(")", index + 2)
            name = word[index + 2 : end]
            out.append(values.get(name, word[index : end + 1]))
            index = end + 1
        else:
            out.append(word[index])
            index += 1
    return "".join(out)


def add_host_aliases(spec: dict[str, Any], names: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """What a cluster's DNS answers and podman 4.3's CNI networks do not: each address's names, as the
    pod's /etc/hosts entries (`hostAliases`). Changes `spec` in place and returns it."""
    aliases = spec.setdefault("hostAliases", [])
    aliases.extend({"ip": ip, "hostnames": list(hostnames)} for ip, hostnames in names.items())
    return spec


class _KubeDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    # Multi-line text as a `|` block (PyYAML's folded double-quoted form is another thing 4.3 misreads).
    style = "|" if "\n" in value and not value[:1].isspace() else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_KubeDumper.add_representer(str, _represent_str)


def dump_kube_yaml(docs: Iterable[Mapping[str, Any]]) -> str:
    """Kubernetes documents as one multi-document YAML for `play`: key order kept, no anchors/aliases
    (PyYAML writes them for shared objects), multi-line strings as literal blocks, no line folding:
    podman 4.3's `kube play` reads this form (but see `check_kube_yaml`)."""
    return yaml.dump_all(
        [dict(doc) for doc in docs],
        Dumper=_KubeDumper,
        sort_keys=False,
        default_flow_style=False,
        width=1 << 20,
    )


def check_kube_yaml(yaml_text: str) -> None:
    """Raise ValueError, naming the field, for what podman 4.3's `kube play` cannot read.

    Measured: a multi-line string that starts with whitespace (a newline, a space, a tab) fails the whole
    play with "unable to sort kube kinds: ... did not find expected '-' indicator", whatever its quoting
    (podman re-encodes each document and then misreads its own block scalar with an indentation indicator).
    """

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")
        elif isinstance(node, str) and "\n" in node and node[:1].isspace():
            raise ValueError(
                f"{where}: podman 4.3 kube play cannot read a multi-line string starting with whitespace "
                f"({node[:40]!r}...): strip the leading whitespace"
            )

    for n, doc in enumerate(yaml.safe_load_all(yaml_text)):
        walk(doc, f"document {n}")


# -- helpers -------------------------------------------------------------------------------------------------
def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _section(output: str, title: str) -> list[str]:
    """The ids listed under `Title:` in `kube play`'s output (`Pod:\\n<id>\\nContainer:\\n<id>...`)."""
    ids: list[str] = []
    current = ""
    for line in output.splitlines():
        line = line.strip()
        if line.endswith(":") and " " not in line:
            current = line[:-1]
        elif line and current == title and re.fullmatch(r"[0-9a-f]{12,64}", line):
            ids.append(line)
    return ids


def _mount_points_below(directory: Path) -> list[str]:
    prefix = os.fspath(directory).rstrip("/") + "/"
    points = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
            if point.startswith(prefix) or point == prefix[:-1]:
                points.append(point)
    return points


def _unmount_below(directory: Path) -> None:
    """Unmount whatever podman left mounted under `directory` (overlay merged dirs, shm, its private
    bind mount of the overlay home), deepest first; lazily when busy."""
    for _ in range(3):
        points = _mount_points_below(directory)
        if not points:
            return
        for point in sorted(points, key=lambda p: p.count("/"), reverse=True):
            if subprocess.run(["umount", point], capture_output=True, timeout=30).returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)


def _processes_using(directory: Path) -> list[int]:
    """Processes (conmon, podman cleanup, container processes) whose command line names `directory`."""
    needle = os.fspath(directory).encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                if needle in handle.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def _kill_processes_using(directory: Path, *, timeout: float = 10.0) -> None:
    """Give podman's processes for `directory` `timeout` seconds to end on their own, then SIGKILL them."""
    deadline = time.monotonic() + timeout
    while _processes_using(directory) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in _processes_using(directory):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
