"""A multi-node group's chart, run: the LeaderWorkerSet's leader and worker pods as two podman pods (4.3) on a
network of their own, one vLLM world over them (issue 44).

`deploykit render helm` of the tiny model at tensor parallel 2 over `deploy.nodes: 2` → `helm template` → the
LeaderWorkerSet, whose two pod templates are played as Pods (no LWS controller runs here). Each pod gets what
the controller and the cluster would give it and podman does not (tests/e2e/pod_runtime.py lists every edit):
LWS_LEADER_ADDRESS (the leader's DNS name as LWS makes it, `<set>-0.<set>.<namespace>`), LWS_GROUP_SIZE and
LWS_WORKER_INDEX in every container, its hostname and subdomain, and an /etc/hosts entry for the leader's name
(podman 4.3's CNI networks have no name service), its own static address on the network, and the kubelet's
expansion of `$(NAME)` in the rendered commands (podman 4.3 passes it on unexpanded); podman 4.3 refuses
a Pod's annotation longer than 63 characters, so the two digests that roll the pods stay out. Beyond that, the
edits of tests/e2e/test_helm_pod_e2e.py (the local image, the host's venv read-only, world-writable emptyDirs
as kubelet makes them, the API key file, no `ports` lists) and one core per pod (VLLM_CPU_OMP_THREADS_BIND:
two vLLM CPU ranks on one core each, as docs/vllm-cpu notes say), and OnFailure for the worker pod (podman
4.3 gives init containers the pod's restart policy), and the leader's DEPLOYKIT_FIXES one fix longer than
the worker's (WITHHELD). The model is the release's own volume, as in the pod
test. The rendered argv, probes, init container, canary and volumes are played as rendered.

What it shows:
  - the worker, started first, waits in its init container while nothing listens, and its vLLM starts only
    once the leader's rendezvous answers; the two form one world (the leader's /health answers);
  - the chart's smoke (`deploykit smoke`, the `helm test` command, run in the leader pod) passes;
  - `GET /deploykit/status` on the leader answers for both ranks, one in each pod, with the planned fix; the
    leader's vLLM started with one fix more than the worker's (WITHHELD), `deploykit smoke` expecting it
    fails naming rank 1 in the worker pod;
  - the worker killed, the leader's readiness probe (as rendered, run in its vLLM container) fails: the leader
    leaves the Service while LeaderWorkerSet recreates the group (RecreateGroupOnPodRestart, which no
    controller plays here).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploykit.net import free_port
from tests.e2e.pod_runtime import (
    PlayedPod,
    PodmanError,
    PodRuntime,
    add_host_aliases,
    add_host_mounts,
    add_lws_identity,
    add_service_links,
    dump_kube_yaml,
    expand_env_references,
    replace_images,
    set_restart_policy,
)
from tests.e2e.test_helm_pod_e2e import HTTP_GET, wait_for
from tests.e2e.test_serve_e2e import command_env, demo_variant
from tests.render.test_helm import find_helm
from tests.vllm_harness import REPO

pytestmark = pytest.mark.e2e

FIX = "device_penalties"
# The leader's vLLM is started with one fix more than the worker's (an edit of the played copy): a node
# started from another environment, the way a rank misses a fix in the field. The fix check names its rank.
WITHHELD = "matmul_lora"
KEY_ENV = "DK_GROUP_API_KEY"
RELEASE = "vllm"
SET = f"{RELEASE}-group"  # the chart's LeaderWorkerSet
NAMESPACE = "default"
LEADER_POD = f"{SET}-0"  # LWS names a group's leader `<set>-<group>`, its workers `<set>-<group>-<index>`
WORKER_POD = f"{SET}-0-1"
LEADER_ADDRESS = f"{LEADER_POD}.{SET}.{NAMESPACE}"  # LWS_LEADER_ADDRESS as LWS writes it
MODEL_MOUNT = "/models"
# A network of the test's own: a /24 unlikely to be anyone's on a CI machine; the pods' static addresses.
SUBNET = "10.231.87.0/24"
LEADER_IP, WORKER_IP = "10.231.87.10", "10.231.87.11"
# Bounds, not expectations (see test_helm_pod_e2e.py): the world's start on a loaded 2-core machine.
START_TIMEOUT_S = 600.0
CANARY_TIMEOUT_S = 240.0
VERDICT_MAX_AGE_S = 150
# The leader's readiness, after the worker is gone: the leader's next collective fails at once (its peer's
# sockets close), or the canary, every 5 s, finds it hung within HUNG_AFTER_S (60 s).
DOWN_TIMEOUT_S = 180.0


@dataclass
class Group:
    runtime: PodRuntime
    leader: PlayedPod
    worker: PlayedPod
    port: int
    canary_port: int
    lws: dict[str, Any]
    timeline: dict[str, float] = field(default_factory=dict)

    def container(self, pod: PlayedPod, name: str) -> str:
        return next(c for c in pod.containers if c == f"{pod.name}-{name}")

    @property
    def leader_vllm(self) -> str:
        return self.container(self.leader, "vllm")

    def get(self, path: str, *, auth: bool = False) -> tuple[int, str]:
        """(status, body) of a GET to the leader's API from inside its vLLM container; 0: no answer."""
        url = f"http://127.0.0.1:{self.port}{path}"
        done = self.runtime.exec(self.leader_vllm, ["python3", "-c", HTTP_GET, url, "auth" if auth else "-"])
        if done.returncode != 0 or "\n" not in done.stdout:
            return 0, done.stdout + done.stderr
        status, _, body = done.stdout.partition("\n")
        return int(status), body

    def template(self, role: str) -> dict[str, Any]:
        found: dict[str, Any] = self.lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]
        return found

    def readiness(self) -> subprocess.CompletedProcess[str]:
        """The leader's readiness probe as rendered, run in its vLLM container."""
        vllm = next(c for c in self.template("leader")["spec"]["containers"] if c["name"] == "vllm")
        return self.runtime.exec(self.leader_vllm, vllm["readinessProbe"]["exec"]["command"], timeout=60)


def render_group_chart(tmp: Path, model_dir: Path, port: int) -> Path:
    profile = demo_variant(
        tmp,
        "demo-group",
        model__source=f"{MODEL_MOUNT}/{model_dir.name}",
        model__volumes=[{"kind": "host_path", "path": str(model_dir.parent), "mount_path": MODEL_MOUNT}],
        serve__host="0.0.0.0",
        serve__port=port,
        serve__api_key_env=KEY_ENV,
        serve__tensor_parallel_size=2,
        deploy__nodes=2,
        deploy__startup_timeout_s=int(START_TIMEOUT_S),
    )
    out = tmp / "chart"
    done = subprocess.run(
        [sys.executable, "-m", "deploykit", "render", "helm", "-p", str(profile), "--fix", f"{FIX}=on",
         "--facts", str(REPO / "tests" / "fixtures" / "facts" / "no-gpu.json"), "--out", str(out)],
        env=command_env(tmp), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out / "demo-group"


def as_pod(template: dict[str, Any], name: str) -> dict[str, Any]:
    """A LeaderWorkerSet pod template as the Pod the controller would make of it."""
    metadata = {"name": name, **copy.deepcopy(template.get("metadata", {}))}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": copy.deepcopy(template["spec"])}


def playable(
    pod: dict[str, Any],
    tmp: Path,
    image: str,
    services: list[dict[str, Any]],
    key: str,
    core: str,
    index: int,
) -> dict[str, Any]:
    """The test's edits (module docstring) to one pod of the group, in place; the pod returned."""
    spec = pod["spec"]
    name = pod["metadata"]["name"]
    # podman 4.3 refuses a Pod's annotation value over 63 characters (a label's limit; an annotation may hold
    # 256 KiB): the digests that roll the pods are left out of the played copy.
    pod["metadata"]["annotations"] = {
        key: value for key, value in pod["metadata"].get("annotations", {}).items() if len(value) <= 63
    }
    for container in spec["containers"]:
        container.pop("ports", None)
    replace_images(spec, image)
    add_host_mounts(spec, None)
    set_restart_policy(spec)
    add_service_links(spec, services)
    add_lws_identity(
        spec, leader_address=LEADER_ADDRESS, group_size=2, worker_index=index, hostname=name, subdomain=SET
    )
    add_host_aliases(spec, {LEADER_IP: [LEADER_ADDRESS]})
    expand_env_references(spec)  # the kubelet's $(LWS_*) in the rendered commands
    vllm = next(c for c in spec["containers"] if c["name"] == "vllm")
    vllm["env"].append({"name": "VLLM_CPU_OMP_THREADS_BIND", "value": core})
    if index == 0:  # the leader: one fix the worker lacks (WITHHELD)
        (fixes,) = [item for item in vllm["env"] if item["name"] == "DEPLOYKIT_FIXES"]
        assert fixes["value"] == FIX, fixes
        fixes["value"] = f"{FIX},{WITHHELD}"
    for volume in spec["volumes"]:
        if volume["name"] == "canary-key":  # podman 4.3 panics on a secret volume with items (pod test)
            directory = tmp / name / "secret"
            directory.mkdir(parents=True)
            (directory / "api-key").write_text(key)
            directory.chmod(0o755)
            (directory / "api-key").chmod(0o644)
            volume.pop("secret")
            volume["hostPath"] = {"path": str(directory), "type": "Directory"}
        if volume["name"] in ("home", "cache", "dshm"):  # each pod its own, world-writable as kubelet's
            directory = tmp / name / "emptydir" / volume["name"]
            directory.mkdir(parents=True)
            directory.chmod(0o777)
            volume.pop("emptyDir")
            volume["hostPath"] = {"path": str(directory), "type": "Directory"}
    return pod


def cores() -> tuple[str, str]:
    every = sorted(os.sched_getaffinity(0))
    return str(every[0]), str(every[-1])


def running(runtime: PodRuntime, container: str) -> bool:
    return runtime.exists(container) and runtime.inspect(container).running


@pytest.fixture(scope="module")
def group(
    pod_runtime: PodRuntime,
    pod_base_image: str,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Group]:
    tmp = tmp_path_factory.mktemp("helm-group")
    port, canary_port = free_port(), free_port()
    model_dir = tmp / "model" / tiny_model_dir.name  # world-readable, for vLLM's non-root user (pod test)
    shutil.copytree(tiny_model_dir.resolve(), model_dir)
    for path in [model_dir.parent, model_dir, *model_dir.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    chart = render_group_chart(tmp, model_dir, port)
    rendered = subprocess.run(
        [find_helm(), "template", RELEASE, str(chart), "--namespace", NAMESPACE,
         "--set", f"canary.port={canary_port}", "--set", "canary.every=5",
         "--set", f"canary.verdictMaxAgeSeconds={VERDICT_MAX_AGE_S}"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    (lws,) = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    config_maps = [d for d in docs if d["kind"] == "ConfigMap"]
    services = [d for d in docs if d["kind"] == "Service"]
    key = base64.b16encode(os.urandom(12)).decode().lower()
    pod_runtime.secret_create("demo-group-secrets", {"VLLM_API_KEY": key})
    leader_core, worker_core = cores()
    template = lws["spec"]["leaderWorkerTemplate"]
    leader = as_pod(template["leaderTemplate"], LEADER_POD)
    worker = as_pod(template["workerTemplate"], WORKER_POD)
    playable(leader, tmp, pod_base_image, services, key, leader_core, 0)
    playable(worker, tmp, pod_base_image, services, key, worker_core, 1)
    network = pod_runtime.network_create(f"dk-group-{os.getpid()}", SUBNET)
    worker_yaml = dump_kube_yaml([*config_maps, worker])
    leader_yaml = dump_kube_yaml([*config_maps, leader])
    timeline: dict[str, float] = {}
    played: list[str] = []
    # The worker first. Its `kube play` returns only once its init containers are done, so it runs aside.
    timeline["worker played"] = time.monotonic()
    worker_play = pod_runtime.start_play(worker_yaml, extra_args=["--network", network, "--ip", WORKER_IP])
    played.append(worker_yaml)
    try:
        waiting, worker_vllm = f"{WORKER_POD}-wait-for-leader", f"{WORKER_POD}-vllm"

        def worker_waits() -> bool:
            if worker_play.done():  # kube play ended before the leader is there: its error, or this
                worker_play.wait(0)
                raise AssertionError("the worker's pod started without waiting for its leader")
            return running(pod_runtime, waiting)

        wait_for("the worker's wait for the leader", worker_waits, 120)
        time.sleep(5)  # nothing listens at the leader's address: the worker keeps waiting
        assert running(pod_runtime, waiting) and not running(pod_runtime, worker_vllm), "did not wait"
        timeline["leader played"] = time.monotonic()
        (leader_pod,) = pod_runtime.play(
            leader_yaml, extra_args=["--network", network, "--ip", LEADER_IP], timeout=180
        )
        played.append(leader_yaml)
        (worker_pod,) = worker_play.wait(START_TIMEOUT_S)
        timeline["worker's vLLM started"] = time.monotonic()
        running_group = Group(pod_runtime, leader_pod, worker_pod, port, canary_port, lws, timeline)
        verdict = pod_runtime.inspect_raw(running_group.container(leader_pod, "canary"))["Mounts"]
        for mount in verdict:
            if mount["Destination"] in ("/run/deploykit", "/run/deploykit-ledger"):
                Path(mount["Source"]).chmod(0o777)  # kubelet's emptyDir is world-writable (pod test)
        wait_for("the leader's /health", lambda: running_group.get("/health")[0] == 200, START_TIMEOUT_S, 3.0)
        timeline["leader healthy"] = time.monotonic()
        verdicts = next(Path(m["Source"]) for m in verdict if m["Destination"] == "/run/deploykit")
        verdict_file = verdicts / "verdict.json"
        wait_for("the canary's healthy verdict", lambda: healthy(verdict_file), CANARY_TIMEOUT_S)
        start = timeline["worker played"]
        print("\ngroup: " + ", ".join(f"{what} {at - start:.0f} s" for what, at in timeline.items()))
        yield running_group
    except BaseException:
        for name in ("wait-for-leader", "vllm"):
            if pod_runtime.exists(f"{WORKER_POD}-{name}"):
                print(f"--- {WORKER_POD}-{name}\n{pod_runtime.logs(f'{WORKER_POD}-{name}')[-8000:]}")
        for name in ("vllm", "canary"):
            if pod_runtime.exists(f"{LEADER_POD}-{name}"):
                print(f"--- {LEADER_POD}-{name}\n{pod_runtime.logs(f'{LEADER_POD}-{name}')[-8000:]}")
        raise
    finally:
        worker_play.stop()  # (podman holds a pod whose play still runs: nothing could remove it)
        for text in reversed(played):
            with contextlib.suppress(PodmanError):
                pod_runtime.down(text, timeout=120)
        pod_runtime.network_remove(network)


def healthy(verdict_file: Path) -> bool:
    try:
        return bool(json.loads(verdict_file.read_text())["status"] == "healthy")
    except (OSError, ValueError, KeyError):
        return False


def test_the_worker_waited_for_the_leader_and_the_world_formed(group: Group) -> None:
    """Played first, the worker's vLLM started only after the leader was played (its init container held
    it), and the leader's API answered once both ranks had joined."""
    timeline = group.timeline
    assert timeline["worker played"] < timeline["leader played"] < timeline["worker's vLLM started"]
    worker_vllm = group.container(group.worker, "vllm")
    state = group.runtime.inspect(worker_vllm)
    assert state.running and state.restart_count == 0
    cmdline = group.runtime.exec(worker_vllm, ["cat", "/proc/1/cmdline"], timeout=60).stdout
    argv = cmdline.rstrip("\0").split("\0")
    assert argv[-9:] == [
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--master-addr",
        LEADER_ADDRESS,
        "--master-port",
        "29501",
        "--headless",
    ]  # fmt: skip  (the kubelet's expansion of the rendered $(LWS_*) placeholders, done by podman)


def test_the_smoke_passes_against_the_leader(group: Group) -> None:
    """The `helm test` command (`deploykit smoke`, the chart's wheel, the release's profile and key), run in
    the leader pod's canary container against the leader's API."""
    smoke = [
        "python3", "-m", "deploykit", "smoke", "--url", f"http://127.0.0.1:{group.port}",
        "--profile", "/etc/deploykit/profile.yaml", "--expect-fixes", FIX, "--no-store",
    ]  # fmt: skip
    done = group.runtime.exec(group.container(group.leader, "canary"), smoke, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def test_the_status_answers_for_both_ranks_one_in_each_pod(group: Group) -> None:
    code, body = group.get("/deploykit/status", auth=True)
    assert code == 200, body
    status = json.loads(body)
    ranks = status["engine"]
    assert len(ranks) == 2, json.dumps(status)
    assert sorted(r.get("rank") for r in ranks) == [0, 1], json.dumps(ranks)
    assert sorted(r["hostname"] for r in ranks) == [LEADER_POD, WORKER_POD]  # the pods' hostnames
    for rank in ranks:
        assert FIX in (rank.get("fixes_applied") or {}), json.dumps(rank)
    assert str(status["fixes_active"].get(FIX)).startswith("vllm."), json.dumps(status)
    by_host = {r["hostname"]: r for r in ranks}
    assert (
        WITHHELD in by_host[LEADER_POD]["fixes_applied"]
        and WITHHELD not in by_host[WORKER_POD]["fixes_applied"]
    )
    assert WITHHELD not in status["fixes_active"]  # active means in every rank


def test_the_fix_check_names_the_rank_in_the_pod_that_lacks_a_fix(group: Group) -> None:
    """`deploykit smoke` expecting the fix the worker's node was started without fails, naming rank 1 in the
    worker pod (and only that fix: every rank applied the other)."""
    smoke = [
        "python3", "-m", "deploykit", "smoke", "--url", f"http://127.0.0.1:{group.port}",
        "--profile", "/etc/deploykit/profile.yaml", "--expect-fixes", f"{FIX},{WITHHELD}", "--no-store",
    ]  # fmt: skip
    done = group.runtime.exec(group.container(group.leader, "canary"), smoke, timeout=300)
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, said[-4000:]
    named = f"{WITHHELD}: requested, but rank 1 (tp 1, pp 0, node 1, host {WORKER_POD}) did not apply it"
    assert named in said, said[-4000:]
    assert f"{FIX}: requested" not in said


def test_the_worker_gone_takes_the_leader_out_of_the_service(group: Group) -> None:
    """RecreateGroupOnPodRestart recreates the group when the worker's container restarts; until then the
    leader must not take traffic: its readiness probe fails (runs last: the world does not recover)."""
    assert group.readiness().returncode == 0
    group.runtime.podman("kill", "--signal", "KILL", group.container(group.worker, "vllm"), timeout=60)
    killed_at = time.monotonic()
    group.get("/v1/models", auth=True)  # traffic as usual; the canary asks every 5 s as well

    def not_ready() -> str | None:
        done = group.readiness()
        if done.returncode == 1:
            return f"readiness failed: {done.stdout.strip()}"
        if not running(group.runtime, group.leader_vllm):
            return "the leader's vLLM exited"
        return None

    how = wait_for("the leader's readiness down", not_ready, DOWN_TIMEOUT_S, 1.0)
    print(f"\ngroup: worker killed, leader not ready {time.monotonic() - killed_at:.0f} s later ({how})")
    assert how.startswith("readiness failed"), how
