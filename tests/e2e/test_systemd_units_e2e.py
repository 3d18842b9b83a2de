"""The units `deploykit render systemd` writes, installed as docs/deploy.md says, under a real systemd (PID 1
of a systemd-nspawn container: tests/e2e/nspawn_runtime.py). Issue 21, points 1-6.

Two profiles of the demo model, `dk-a` (port 8000, canary 9400) and `dk-b` (port 8001, canary 9401), each on
the test fault worker (`--worker-cls tests.e2e.fault_worker.FaultWorker`, length trigger off: healthy until
one request marked `deploykit_test_fault` breaks it for good) and each with an API key from its secrets file.
Both start side by side; the tests then run in this order, sharing the two servers (3 vLLM starts in all:
two at the start, one on the hang's restart, one on the corruption restart):

0. (first, alone, stopped before the two profiles start) a group over two nodes (issue 44): the leader unit
   and the worker unit of one profile serve the tiny model as one two-node world on this one machine, the
   worker started first and waiting on vLLM's own rendezvous retry; the smoke passes on the leader; then the
   worker's rank is killed: the leader fails its next request and exits, both units restart themselves
   (Restart=always: both exits are status 0) and the group serves again (2 group starts);
1. each server unit is active only once healthy; its smoke companion ran after it and passed; rows stored;
5. the two run side by side: their own ports, canary ports, state directories and stores;
6. hardening in the real run: the service user, writes only to state and cache, the secret in neither ps
   nor the journal;
3. a killed canary is restarted by itself and never restarts the server;
7. a hung engine (issue 31: one request blocks the forward pass for good, /health stays 200): the canary
   says `hung` and exits 5, systemd restarts the server through the same capped path as corruption;
2. a corruption after start-up: the canary exits 3, systemd restarts the server (a new invocation), the
   smoke passes again, the canary turns healthy again, and the rows say so in order;
4. a restart storm: with the cap's earlier restarts already in the ledger, the next corruption verdict
   stops the server and leaves it stopped (journal line, row, no job queued).

What the test changes, all visible here: the secrets file gets values. Everything else is the rendered
files, installed with the docs' commands, with their own sandbox: the prefix's software is bound under /opt
(tests/e2e/nspawn_prefix.py), so no unit needs /root, /home or /tmp wherever the checkout lies. The
container has a private network: every request is made from inside it (curl, python), to its own loopback.
Every wait polls for a state with a bound; none sleeps a fixed time.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploykit.canary.defaults import HUNG_AFTER_S
from deploykit.canary.settings import DEFAULTS as CANARY_DEFAULTS
from deploykit.render.on_corruption import LEDGER_DIR, STAGE_RESTART, STAGE_STOPPED
from deploykit.render.systemd import CORRUPTION_MAX_RESTARTS
from tests.e2e.fault_worker import FAULT_KEY, TOKENS_ENV, WORKER_CLS
from tests.e2e.nspawn_prefix import install_root_helper, make_prefix
from tests.e2e.nspawn_runtime import CHECKOUT_AT, NspawnMachine, wait_for
from tests.profile_variants import profile_variant
from tests.vllm_harness import STARTUP_TIMEOUT_S

pytestmark = pytest.mark.e2e

USER = "vllm"
# A start of the tiny model is 20-60 s here, far more when another CI run shares the 2 cores: a bound.
START_S = max(STARTUP_TIMEOUT_S, 600.0)
# The canary's interval is the rendered 60 s: a corruption is seen within one interval and one run.
DETECT_S = 300.0
CANARY_RESTART_S = 180.0  # RestartSec=30 and the canary's start
# The units' prefix: root-owned, made in the container, running this checkout (tests/e2e/nspawn_prefix.py).
PREFIX = "/opt/deploykit-e2e"
VENV_PYTHON = f"{PREFIX}/bin/python"

ROWS = """
import json
from deploykit.results.sql.store import open_store
store = open_store()
print(json.dumps([[r.command, r.stage, r.verdict, r.diagnosis] for r in reversed(store.recent(limit=100))]))
store.close()
"""


@dataclass
class Deployment:
    """One rendered profile, installed in the container."""

    machine: NspawnMachine
    name: str
    port: int
    canary_port: int
    api_key: str

    @property
    def unit(self) -> str:
        return f"deploykit-{self.name}.service"

    @property
    def smoke(self) -> str:
        return f"deploykit-{self.name}-smoke.service"

    @property
    def canary(self) -> str:
        return f"deploykit-{self.name}-canary.service"

    @property
    def state_dir(self) -> str:
        return f"/var/lib/deploykit-{self.name}"

    def prop(self, unit: str, name: str) -> str:
        return self.machine.unit_property(unit, name)

    def http_status(self, url: str, *extra: str) -> int:
        done = self.machine.run(
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "60", *extra, url],
            check=False,
            timeout=90,
        )
        return int(done.stdout or 0)

    def authorized(self) -> list[str]:
        # The key from a header file, never on curl's command line (point 6 greps every command line).
        return ["-H", f"@/run/dk-test/{self.name}.headers"]

    def healthz(self) -> int:
        return self.http_status(f"http://127.0.0.1:{self.canary_port}/healthz")

    def completion(self, body: dict[str, object]) -> tuple[int, str]:
        done = self.machine.run(
            [
                *("curl", "-s", "-w", "\n%{http_code}", "--max-time", "120", *self.authorized()),
                *("-H", "Content-Type: application/json", "--data-binary", "@-"),
                f"http://127.0.0.1:{self.port}/v1/completions",
            ],
            input=json.dumps(body),
            timeout=150,
        )
        text, _, code = done.stdout.rpartition("\n")
        return int(code or 0), text

    def rows(self) -> list[tuple[str, str, str, str]]:
        """The service's results store, read inside the container as the service user (the store is its)."""
        if not self.machine.host_path(f"{self.state_dir}/deploykit/results.sqlite").exists():
            return []
        done = self.machine.run(
            ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups", VENV_PYTHON, "-c", ROWS],
            env={"XDG_DATA_HOME": self.state_dir, "HOME": self.state_dir},
            timeout=120,
        )
        return [(c, s, v, diagnosis) for c, s, v, diagnosis in json.loads(done.stdout)]

    def story(self) -> list[tuple[str, str, str]]:
        return [(c, s, v) for c, s, v, _ in self.rows()]

    def journal(self, unit: str) -> str:
        return self.machine.journal("-b", "-u", unit, "-o", "cat")

    def wait_active(self, what: str) -> None:
        restarts = self.prop(self.unit, "NRestarts")

        def active() -> bool:
            state, sub = self.prop(self.unit, "ActiveState"), self.prop(self.unit, "SubState")
            failed = (
                state == "failed" or sub == "auto-restart" or self.prop(self.unit, "NRestarts") != restarts
            )
            assert not failed, f"{self.unit} failed to start:\n{self.journal(self.unit)[-6000:]}"
            return state == "active"

        wait_for(active, f"{self.unit} active ({what})", START_S, interval=1.0)

    def wait_smoke_passed(self, after_invocation: str = "") -> None:
        """The smoke companion ran (a new invocation, when one is given) and ended with success."""

        def done() -> bool:
            invocation = self.prop(self.smoke, "InvocationID")
            if not invocation or invocation == after_invocation:
                return False
            if self.prop(self.smoke, "ActiveState") in ("activating", "active", "deactivating"):
                return False
            return self.prop(self.smoke, "ExecMainStartTimestampMonotonic") not in ("", "0")

        wait_for(done, f"{self.smoke} ran", START_S, interval=1.0)
        assert self.prop(self.smoke, "Result") == "success", self.journal(self.smoke)[-4000:]
        assert self.prop(self.smoke, "ExecMainStatus") == "0", self.journal(self.smoke)[-4000:]

    def wait_healthy_canary(self) -> None:
        wait_for(lambda: self.healthz() == 200, f"{self.canary} /healthz 200", START_S, interval=1.0)


def render_profile(profile: Path, rendered: Path, machine: NspawnMachine) -> Path:
    """`deploykit render systemd` of `profile` into `rendered`, for the units' prefix in the container."""
    env = {**os.environ, "DEPLOYKIT_MODEL_CACHE": str(machine.model_cache)}
    done = subprocess.run(
        [
            f"{sys.prefix}/bin/deploykit",
            "render",
            "systemd",
            "--profile",
            str(profile),
            "--out",
            str(rendered),
            "--prefix",
            PREFIX,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return rendered


def render_and_install(machine: NspawnMachine, out: Path, name: str, port: int) -> Deployment:
    assert machine.model_cache is not None
    model_cache = machine.model_cache
    profile = profile_variant(
        out,
        "demo-cpu",
        {
            "name": name,
            "serve.port": port,
            "serve.api_key_env": "DK_TEST_API_KEY",
            "serve.extra_args": ["--worker-cls", WORKER_CLS],
            # the fault worker is imported from the checkout (bound read-only under /opt)
            "env.PYTHONPATH": CHECKOUT_AT,
            "env.DEPLOYKIT_MODEL_CACHE": str(model_cache),
            f"env.{TOKENS_ENV}": {"secret": TOKENS_ENV},
        },
    )
    rendered = render_profile(profile, out / f"render-{name}", machine)
    api_key = f"dk-test-secret-{secrets.token_hex(16)}"
    unit = f"deploykit-{name}"
    # docs/deploy.md's install commands, file by file (the same modes).
    for suffix in ("", "-smoke", "-canary"):
        machine.write_file(
            f"/etc/systemd/system/{unit}{suffix}.service", (rendered / f"{unit}{suffix}.service").read_text()
        )
    machine.write_file(f"/etc/deploykit/{name}.yaml", (rendered / f"{name}.yaml").read_text())
    example = (rendered / f"{name}.env.example").read_text()
    assert "VLLM_API_KEY=\n" in example and f"{TOKENS_ENV}=\n" in example, example
    filled = example.replace("VLLM_API_KEY=\n", f"VLLM_API_KEY={api_key}\n").replace(
        f"{TOKENS_ENV}=\n", f"{TOKENS_ENV}=off\n"
    )
    machine.write_file(f"/etc/deploykit/{name}.env", filled, mode=0o600)
    machine.write_file(f"/etc/sysusers.d/{unit}.conf", (rendered / f"{unit}.sysusers.conf").read_text())
    machine.run(["systemd-sysusers"])
    install_root_helper(machine, rendered)
    machine.write_file(f"/run/dk-test/{name}.headers", f"Authorization: Bearer {api_key}\n", mode=0o600)
    return Deployment(machine, name, port, port + 1400, api_key)


@pytest.fixture(scope="module")
def deployments(
    nspawn_machine: NspawnMachine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Deployment, Deployment]]:
    out = tmp_path_factory.mktemp("systemd-units")
    make_prefix(nspawn_machine, PREFIX)
    a = render_and_install(nspawn_machine, out, "dk-a", 8000)
    b = render_and_install(nspawn_machine, out, "dk-b", 8001)
    nspawn_machine.systemctl("daemon-reload")
    for d in (a, b):
        nspawn_machine.systemctl("enable", d.canary)  # WantedBy= the server: starts with it
        nspawn_machine.systemctl("enable", d.unit)
    for d in (a, b):  # side by side: both start jobs queued at once
        nspawn_machine.systemctl("start", "--no-block", d.unit)
    try:
        yield a, b
    finally:
        for d in (a, b):
            nspawn_machine.systemctl("stop", d.unit, check=False, timeout=180)


def two_rows(d: Deployment) -> bool:
    return len(d.rows()) >= 2


# --- 0. a group over two nodes: a leader unit and a worker unit of one profile (issue 44) ------------------

GROUP_NAME = "dk-group"
GROUP_PORT = 8002
# Each unit as if on a host of its own (the drop-ins below): its own core, its own address (the container has
# no route, so vLLM's guess would be 0.0.0.0, which its message queues cannot connect to) and its own /dev/shm
# (one shared /dev/shm makes vLLM take the other node's rank for a local one and wait for it on an ipc socket
# in /tmp, which each unit's PrivateTmp= keeps apart: the start hangs, seen here before these lines).
GROUP_DROPIN = """[Service]
Environment=VLLM_CPU_OMP_THREADS_BIND={core}
Environment=VLLM_HOST_IP=127.0.0.1
TemporaryFileSystem=/dev/shm:mode=1777,nosuid,nodev
"""
RENDEZVOUS = "distributed_init_method=tcp://127.0.0.1:29501"
GROUP_RESTART_S = 300.0  # RestartSec=30 for each unit, and a group start on a loaded 2-core machine


def render_and_install_group(machine: NspawnMachine, out: Path) -> tuple[Deployment, str]:
    """The demo model at tensor parallel 2 over `deploy.nodes: 2`, its leader at 127.0.0.1: the leader's set
    and the worker's unit installed as docs/deploy.md says, both on this one machine, each with the drop-in
    above (the one thing the test adds to the rendered units)."""
    assert machine.model_cache is not None
    changes = {
        "name": GROUP_NAME,
        "serve.port": GROUP_PORT,
        "serve.api_key_env": "DK_TEST_API_KEY",
        "serve.tensor_parallel_size": 2,
        "deploy.nodes": 2,
        "deploy.leader_address": "127.0.0.1",
        "env.DEPLOYKIT_MODEL_CACHE": str(machine.model_cache),
    }
    rendered = render_profile(profile_variant(out, "demo-cpu", changes), out / "render-group", machine)
    unit, worker = f"deploykit-{GROUP_NAME}", f"deploykit-{GROUP_NAME}-worker-1"
    for name in (unit, f"{unit}-smoke", f"{unit}-canary", worker):
        machine.write_file(f"/etc/systemd/system/{name}.service", (rendered / f"{name}.service").read_text())
    for name, core in ((unit, 0), (worker, 1)):
        machine.write_file(
            f"/etc/systemd/system/{name}.service.d/one-host.conf", GROUP_DROPIN.format(core=core)
        )
    machine.write_file(f"/etc/deploykit/{GROUP_NAME}.yaml", (rendered / f"{GROUP_NAME}.yaml").read_text())
    api_key = f"dk-test-secret-{secrets.token_hex(16)}"
    example = (rendered / f"{GROUP_NAME}.env.example").read_text()
    filled = example.replace("VLLM_API_KEY=\n", f"VLLM_API_KEY={api_key}\n")
    machine.write_file(f"/etc/deploykit/{GROUP_NAME}.env", filled, mode=0o600)
    machine.write_file(f"/etc/sysusers.d/{unit}.conf", (rendered / f"{unit}.sysusers.conf").read_text())
    machine.run(["systemd-sysusers"])
    install_root_helper(machine, rendered)
    machine.write_file(f"/run/dk-test/{GROUP_NAME}.headers", f"Authorization: Bearer {api_key}\n", mode=0o600)
    return Deployment(machine, GROUP_NAME, GROUP_PORT, GROUP_PORT + 1400, api_key), f"{worker}.service"


def test_a_group_over_two_nodes_serves_from_a_leader_and_a_worker_unit(
    nspawn_machine: NspawnMachine, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """One group start, then one worker death: the leader exits (status 0) at the next request, both units
    restart themselves (Restart=always) and the group serves again."""
    import time

    machine = nspawn_machine
    make_prefix(machine, PREFIX)
    d, worker = render_and_install_group(machine, tmp_path_factory.mktemp("systemd-group"))
    machine.systemctl("daemon-reload")
    machine.systemctl("enable", d.canary)
    timeline: list[str] = []
    started = time.monotonic()

    def seen(what: str) -> None:
        timeline.append(f"{time.monotonic() - started:5.0f} s  {what}")

    try:
        # The worker first: its rank dials the rendezvous before anything listens there, and waits (vLLM's
        # own retry, torch's TCPStore client): no ExecStartPre is needed.
        machine.systemctl("start", "--no-block", worker)
        wait_for(lambda: RENDEZVOUS in d.journal(worker), f"{worker} dialing the rendezvous", START_S, 1.0)
        assert machine.run(["ss", "-Hltn", "sport = :29501"]).stdout.strip() == ""  # no leader yet
        waiting_pid = d.prop(worker, "MainPID")
        seen(f"worker's rank 1 dialing 127.0.0.1:29501, nothing listening; {d.prop(worker, 'SubState')}")
        machine.systemctl("start", "--no-block", d.unit)
        d.wait_active("the group's first start")
        seen("leader active (healthy)")
        d.wait_smoke_passed()
        seen("smoke passed")
        # the same worker process that waited joined the world: one world of two ranks, one per unit
        assert d.prop(worker, "MainPID") == waiting_pid and d.prop(worker, "NRestarts") == "0"
        assert "world_size=2 rank=0" in d.journal(d.unit) and RENDEZVOUS in d.journal(d.unit)
        assert "world_size=2 rank=1" in d.journal(worker)
        assert {user for _, user in service_processes(d, worker)} == {USER}
        worker_argv = machine.run(["ps", "-o", "args=", "-p", waiting_pid]).stdout
        assert "--node-rank 1" in worker_argv and worker_argv.rstrip().endswith("--headless"), worker_argv
        code, text = d.completion({"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0})
        assert code == 200, text
        d.wait_healthy_canary()
        assert ("smoke", "done", "pass") in d.story(), d.rows()

        # A worker rank dies (SIGKILL, as an OOM kill would): its headless vLLM exits 0 and Restart=always
        # brings the unit back; the idle leader notices nothing until a request runs on the lost peer.
        leader_invocation, smoke_before = d.prop(d.unit, "InvocationID"), d.prop(d.smoke, "InvocationID")
        rank = machine.run(["pgrep", "-P", waiting_pid, "-f", "VLLM::Worker"]).stdout.split()
        assert len(rank) == 1, rank
        machine.run(["kill", "-KILL", rank[0]])
        health = d.http_status(f"http://127.0.0.1:{d.port}/health")
        seen(f"worker's rank killed (SIGKILL); leader /health {health}")
        # The next request runs on the lost peer (ours, unless the canary's run came first): the leader's
        # engine dies and its vLLM exits with status 0.
        request = [
            *("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "120"),
            *d.authorized(),
        ]
        body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 4})
        request += [
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            body,
            f"http://127.0.0.1:{d.port}/v1/completions",
        ]
        answer = machine.run(request, check=False, timeout=150)
        seen(f"a request to the leader: HTTP {answer.stdout or '-'} (curl exit {answer.returncode})")
        assert answer.stdout != "200"
        wait_for(lambda: d.prop(worker, "NRestarts") == "1", f"{worker} restarted", GROUP_RESTART_S, 1.0)
        seen(f"worker restarted by systemd; leader {d.prop(d.unit, 'SubState')}")
        # both ended with status 0 (Restart=on-failure would restart neither)
        assert "Deactivated successfully" in d.journal(worker)
        wait_for(
            lambda: d.prop(d.unit, "InvocationID") != leader_invocation,
            f"{d.unit} restarted after losing its peer",
            GROUP_RESTART_S,
            1.0,
        )
        restarts, canary = d.prop(d.unit, "NRestarts"), d.prop(d.canary, "ActiveState")
        seen(f"leader restarted by systemd (NRestarts {restarts}); canary {canary}")
        assert "deploykit-dk-group.service: Deactivated successfully" in d.journal(d.unit)
        d.wait_active("the group's restart")
        code, text = d.completion({"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0})
        seen(f"leader active again (healthy), a request: HTTP {code}")
        assert code == 200, text
        assert d.prop(d.unit, "NRestarts") == "1" and d.prop(worker, "NRestarts") == "1"
        # the leader's restart pulls its smoke companion in again (Wants=)
        wait_for(
            lambda: d.prop(d.smoke, "InvocationID") not in ("", smoke_before),
            f"{d.smoke} started again",
            120,
            1.0,
        )
    finally:
        print("\nsystemd group (leader + worker unit, TP 2 over 2 nodes):\n" + "\n".join(timeline))
        for unit in (d.unit, worker):
            machine.systemctl("stop", unit, check=False, timeout=180)
        machine.systemctl("disable", d.canary, check=False)


# --- 1. active means healthy; the smoke companion runs after it and passes; the row is stored -------------


def test_server_unit_active_means_healthy_and_its_smoke_passes(
    deployments: tuple[Deployment, Deployment],
) -> None:
    for d in deployments:
        d.wait_active("first start")
        assert d.http_status(f"http://127.0.0.1:{d.port}/health") == 200
        d.wait_smoke_passed()
        # ordered after the server: the smoke's process started once the server was active (healthy)
        server_active = int(d.prop(d.unit, "ActiveEnterTimestampMonotonic"))
        smoke_started = int(d.prop(d.smoke, "ExecMainStartTimestampMonotonic"))
        assert 0 < server_active <= smoke_started, (server_active, smoke_started)
        assert "healthy after" in d.journal(d.unit)
        d.wait_healthy_canary()
        wait_for(functools.partial(two_rows, d), f"{d.name}: the smoke's and the canary's rows", 120)
        # the smoke companion and the canary both start once the server is active: either row may be first
        assert sorted(d.story()) == [("canary", "state:healthy", "pass"), ("smoke", "done", "pass")], d.rows()


# --- 5. two profiles side by side -------------------------------------------------------------------------


def test_two_profiles_run_side_by_side(deployments: tuple[Deployment, Deployment]) -> None:
    a, b = deployments
    for d in deployments:
        d.wait_active("side by side")
        code, text = d.completion({"model": "tiny", "prompt": "hello", "max_tokens": 4, "temperature": 0})
        assert code == 200, text
        assert d.healthz() == 200
    assert a.prop(a.unit, "MainPID") != b.prop(b.unit, "MainPID")
    listening = a.machine.run(["ss", "-Hltn"]).stdout
    for port in (a.port, b.port, a.canary_port, b.canary_port):
        assert f"127.0.0.1:{port} " in listening, listening
    # state directories (and so the results stores) are each profile's own
    assert a.prop(a.unit, "StateDirectory") == "deploykit-dk-a"
    assert b.prop(b.unit, "StateDirectory") == "deploykit-dk-b"
    for d in deployments:
        assert d.machine.host_path(f"{d.state_dir}/deploykit/results.sqlite").is_file()
        assert d.prop(d.canary, "StateDirectory") == f"deploykit-{d.name}"


# --- 6. the hardening holds in the real run ---------------------------------------------------------------


def service_processes(d: Deployment, unit: str) -> list[tuple[int, str]]:
    """(pid, user) of every process in the unit's cgroup, as the container sees them."""
    out = d.machine.run(["ps", "-e", "-o", "pid=,user=,unit="]).stdout
    return [
        (int(p), u) for p, u, un in (line.split(None, 2) for line in out.splitlines()) if un.strip() == unit
    ]


def test_hardening_holds_in_the_real_run(deployments: tuple[Deployment, Deployment]) -> None:
    a, b = deployments
    machine = a.machine
    a.wait_active("hardening")
    processes = service_processes(a, a.unit)
    assert len(processes) >= 2, processes  # the API server and vLLM's engine core
    assert {user for _, user in processes} == {USER}, processes
    assert {user for _, user in service_processes(a, a.canary)} == {USER}
    main_pid = int(a.prop(a.unit, "MainPID"))
    uid = machine.run(["id", "-u", USER]).stdout.strip()

    def can_write(path: str) -> bool:
        """A file created inside the server's own mount namespace, as its user (no capabilities)."""
        script = 'echo x >"$1" && rm -f "$1"'
        done = machine.run(
            [
                "nsenter",
                "-t",
                str(main_pid),
                "-m",
                "-S",
                uid,
                "-G",
                uid,
                "--",
                "sh",
                "-c",
                script,
                "sh",
                path,
            ],
            check=False,
        )
        return done.returncode == 0

    assert can_write(f"{a.state_dir}/.dk-write-probe")
    assert can_write("/var/cache/deploykit/.dk-write-probe")
    # Directories the service user may write by their owner and mode, so only the sandbox stops it: the other
    # profile's state directory (same user) and one made for this check.
    owned = "/srv/dk-owned-by-the-service-user"
    machine.run(["install", "-d", "-o", USER, "-g", USER, "-m", "0755", owned])
    as_user = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--init-groups", "sh", "-c"]
    machine.run([*as_user, f'echo x >"{owned}/.outside" && echo x >"{b.state_dir}/.outside"'])
    for path in (
        owned,
        b.state_dir,
        "/etc",
        "/usr/local",
        "/var/lib",
        "/opt",
        "/root",
        "/var/log",
        CHECKOUT_AT,
    ):
        assert not can_write(f"{path}/.dk-write-probe"), path
    # /tmp is writable but its own (PrivateTmp=yes): a file there is not in the container's /tmp
    assert can_write("/tmp/.dk-private-probe")
    machine.run(
        ["nsenter", "-t", str(main_pid), "-m", "-S", uid, "-G", uid, "--", "touch", "/tmp/.dk-private-probe"]
    )
    assert machine.run(["test", "-e", "/tmp/.dk-private-probe"], check=False).returncode == 1

    # the secret works (the server read it) ...
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    assert a.http_status(f"http://127.0.0.1:{a.port}/v1/models") == 401
    assert a.http_status(f"http://127.0.0.1:{a.port}/v1/models", *a.authorized()) == 200
    assert a.completion(body)[0] == 200
    # ... and appears in no command line and nowhere in the journal (every field of every entry since boot)
    command_lines = machine.run(["ps", "-e", "-ww", "-o", "args="]).stdout
    assert "vllm serve" in command_lines.replace("/bin/vllm serve", "vllm serve") and len(command_lines) > 200
    journal = machine.journal("-b", "-o", "verbose")
    for d in deployments:
        assert d.api_key not in command_lines
        assert d.api_key not in journal
    assert len(journal) > 10_000  # the journal does hold the services' output


# --- 3. a killed canary restarts itself, never the server -------------------------------------------------


def test_killed_canary_restarts_itself_never_the_server(deployments: tuple[Deployment, Deployment]) -> None:
    _, b = deployments
    b.wait_active("canary kill")
    b.wait_healthy_canary()
    server_invocation = b.prop(b.unit, "InvocationID")
    server_pid = b.prop(b.unit, "MainPID")
    canary_pid = b.prop(b.canary, "MainPID")
    restarts = int(b.prop(b.canary, "NRestarts"))
    b.machine.systemctl("kill", "--signal=SIGKILL", b.canary)

    def restarted() -> bool:
        return (
            int(b.prop(b.canary, "NRestarts")) == restarts + 1
            and b.prop(b.canary, "ActiveState") == "active"
            and b.prop(b.canary, "MainPID") not in ("0", canary_pid)
        )

    wait_for(restarted, f"{b.canary} restarted by systemd", CANARY_RESTART_S, interval=1.0)
    b.wait_healthy_canary()
    assert b.prop(b.unit, "InvocationID") == server_invocation
    assert b.prop(b.unit, "MainPID") == server_pid
    assert b.prop(b.unit, "NRestarts") == "0"
    assert f"canary ended (killed KILL): not a corruption verdict, {b.unit} left alone" in b.journal(b.canary)
    assert [row for row in b.story() if row[1] != "state:healthy" and row[0] != "smoke"] == [], b.rows()


# --- 7. a hung engine restarts the server through the canary (issue 31) -----------------------------------

HANG = {"model": "tiny", "prompt": "hello", "max_tokens": 2, "vllm_xargs": {FAULT_KEY: "hang"}}
# The rendered canary runs every 60 s: its next request waits on the hung engine, `hung` once it has waited
# HUNG_AFTER_S with no token; then exit 5, the stop of a hung vLLM (SIGTERM, then SIGKILL) and the new start.
HANG_DETECT_S = CANARY_DEFAULTS.every_s + HUNG_AFTER_S + 180.0


def test_a_hung_engine_restarts_the_server_through_the_canary(
    deployments: tuple[Deployment, Deployment],
) -> None:
    import threading
    import time

    _, b = deployments
    b.wait_active("before the hang")
    b.wait_healthy_canary()
    first = b.prop(b.unit, "InvocationID")
    smoke_before = b.prop(b.smoke, "InvocationID")
    rows_before = len(b.rows())

    def send() -> None:  # its answer never comes: curl gives up, or the server goes away under it
        with contextlib.suppress(Exception):  # (a thread: nothing of it may fail the test)
            b.completion(HANG)

    sent = time.monotonic()
    threading.Thread(target=send, name="hang-trigger", daemon=True).start()
    assert b.http_status(f"http://127.0.0.1:{b.port}/health") == 200  # the hang keeps /health at 200
    wait_for(
        lambda: b.prop(b.unit, "InvocationID") != first,
        f"{b.unit} restarted on the hang",
        HANG_DETECT_S,
        1.0,
    )
    restarted_at = time.monotonic() - sent
    print(
        f"\nsystemd: hung engine restarted {restarted_at:.0f} s after the trigger (bound {HANG_DETECT_S:g} s)"
    )
    b.wait_active("after the hang's restart")
    b.wait_smoke_passed(after_invocation=smoke_before)
    b.wait_healthy_canary()
    wait_for(lambda: len(b.rows()) >= rows_before + 4, "the rows after the hang's restart", 120)
    story = b.story()[rows_before:]
    assert story[:2] == [("canary", "state:hung", "fail"), ("canary", STAGE_RESTART, "fail")], b.rows()
    assert sorted(story[2:4]) == [("canary", "state:healthy", "pass"), ("smoke", "done", "pass")], b.rows()
    canary_log = b.journal(b.canary)
    assert "HUNG: the engine is hung" in canary_log
    assert f"the engine is hung, restarting {b.unit} (corruption restart 1 of at most" in canary_log
    ledger = b.machine.host_path(f"{LEDGER_DIR}/{b.unit}").read_text().split()
    assert len(ledger) == 1, ledger  # the same ledger, the same cap as corruption


# --- 2. a corruption after start-up restarts the server through the canary --------------------------------

TRIGGER = {"model": "tiny", "prompt": "hello", "max_tokens": 2, "vllm_xargs": {FAULT_KEY: "corrupt"}}


def test_corruption_restarts_the_server_and_the_canary_turns_healthy(
    deployments: tuple[Deployment, Deployment],
) -> None:
    a, _ = deployments
    a.wait_active("before the corruption")
    a.wait_healthy_canary()
    first = a.prop(a.unit, "InvocationID")
    smoke_before = a.prop(a.smoke, "InvocationID")
    rows_before = a.story()
    assert sorted(rows_before) == [("canary", "state:healthy", "pass"), ("smoke", "done", "pass")], (
        rows_before
    )

    code, text = a.completion(TRIGGER)  # HTTP 200 and /health 200 all the same
    assert code == 200, text
    assert a.http_status(f"http://127.0.0.1:{a.port}/health") == 200

    wait_for(
        lambda: a.prop(a.unit, "InvocationID") != first, f"{a.unit} restarted (new invocation)", DETECT_S, 1.0
    )
    a.wait_active("after the corruption restart")
    a.wait_smoke_passed(after_invocation=smoke_before)
    a.wait_healthy_canary()
    wait_for(lambda: len(a.rows()) >= 6, "the rows after the restart", 120)
    story = a.story()
    assert story[2:4] == [("canary", "state:corrupt", "fail"), ("canary", STAGE_RESTART, "fail")], a.rows()
    assert sorted(story[4:]) == [("canary", "state:healthy", "pass"), ("smoke", "done", "pass")], a.rows()
    corrupt = a.rows()[2][3]
    assert "NaN" in corrupt or "special/pad token" in corrupt, corrupt
    canary_log = a.journal(a.canary)
    assert f"restarting {a.unit} (corruption restart 1 of at most {CORRUPTION_MAX_RESTARTS}" in canary_log
    ledger = a.machine.host_path(f"{LEDGER_DIR}/{a.unit}").read_text().split()
    assert len(ledger) == 1, ledger


# --- 4. restart storms are bounded ------------------------------------------------------------------------


def test_restart_storm_stops_the_server_instead_of_looping(
    deployments: tuple[Deployment, Deployment],
) -> None:
    a, _ = deployments
    a.wait_active("before the storm")
    a.wait_healthy_canary()
    machine = a.machine
    ledger_path = f"{LEDGER_DIR}/{a.unit}"
    recorded = machine.host_path(ledger_path).read_text().split()
    assert len(recorded) == 1, recorded  # the real restart of the test above
    # The cap's other restarts, as if they had happened minutes ago (3 real vLLM restarts would take minutes).
    now = float(machine.run(["date", "+%s"]).stdout)
    earlier = [f"{now - 120 * (i + 1):.3f}" for i in range(CORRUPTION_MAX_RESTARTS - 1)]
    machine.write_file(ledger_path, "\n".join([*earlier, *recorded]) + "\n")
    invocation = a.prop(a.unit, "InvocationID")
    rows_before = len(a.rows())

    code, text = a.completion(TRIGGER)
    assert code == 200, text

    wait_for(
        lambda: a.prop(a.unit, "ActiveState") == "inactive", f"{a.unit} stopped at the cap", DETECT_S, 1.0
    )
    # the canary ended with its verdict (exit 3: "failed", not restarted by itself), the server stopped
    wait_for(
        lambda: a.prop(a.canary, "ActiveState") in ("inactive", "failed"), f"{a.canary} stopped", 120, 1.0
    )
    assert a.prop(a.canary, "ExecMainStatus") == "3"
    assert a.machine.systemctl("list-jobs", "--no-legend").strip() == ""  # nothing queued: no loop
    assert a.prop(a.unit, "InvocationID") == invocation  # never started again
    assert a.prop(a.unit, "SubState") == "dead"
    assert "leaving it stopped, no restart loop" in a.journal(a.canary)
    assert a.story()[rows_before:] == [("canary", "state:corrupt", "fail"), ("canary", STAGE_STOPPED, "fail")]
    stopped = a.rows()[-1][3]
    assert f"after {CORRUPTION_MAX_RESTARTS} corruption restarts" in stopped, stopped
    assert len(machine.host_path(ledger_path).read_text().split()) == CORRUPTION_MAX_RESTARTS
