"""The rendered chart's pod, run in a real container runtime with no network at all: podman 4.3 `kube play`.

`deploykit render helm` → `helm template` → the Deployment and its ConfigMaps, played offline from an image
built locally (tools/pod-runtime.sh: a Debian root, no registry). The test changes only what
tests/e2e/pod_runtime.py lists: the image names (the local image), read-only hostPath volumes for the host's
vLLM environment and its interpreter, OnFailure instead of Always where podman 4.3 needs it (the pod has no
init container with the bundled wheel, so it stays Always), and the service links a kubelet would add (none:
the chart says `enableServiceLinks: false`). The model is NOT added by the test: the profile stages it on a
volume of the release (`model.volumes`, a node directory), the chart mounts it and gives vLLM its path, with
HF_HUB_OFFLINE set. The pod is played with `--network none`: its only interface is loopback, nothing outside
can be reached, and the test talks to its servers from inside (podman exec), never over the host's network.
podman 4.3 refuses a container `ports` list without a bridge ("PortMappings can only be used with Bridge or
slirp4netns networking"), so the played copy has none; the test reads the declared ports from the rendered
spec. The release is named `vllm`, as a platform team would name it: a kubelet would then hand vLLM
VLLM_PORT=tcp://... (which it refuses) unless service links are off. Two more, because vLLM runs non-root
(Pod Security "restricted", UID 65534): podman creates emptyDirs root-owned 0755 where kubelet makes them
0777, so vLLM's HOME, cache and /dev/shm are host directories made 0777 first; and the tiny model is a
world-readable copy. Only the Deployment and the
ConfigMaps are played: the Service is kube-proxy's and the `helm test` pod needs cluster DNS (its command is
run from the stock vLLM Python in tests/e2e/test_fix_status_e2e.py).

What it shows:
  - with no network at all, vLLM serves the model from the release's volume (its argv names the in-pod path;
    the hub is off), and a release named `vllm` starts;
  - vLLM loads deploykit from the chart's ConfigMap wheel alone (the module's file is inside the wheel; the
    host's editable install is not mounted), and `/deploykit/status` lists the planned fix active;
  - the API key arrives from a Secret: `/deploykit/status` answers 401 without it, 200 with it;
  - the canary container's command runs, its verdict file says healthy and its `/healthz` answers 200;
  - the chart's gate Job (issue 46; `gate.job.enabled`, both URLs the pod's own server): its container's
    command, as rendered, run in the canary container (the Job's image, user, wheel and Secret variable)
    with the gate ConfigMap's facts.json placed beside profile.yaml as the Job's projected volume has it:
    with `gate.load=false`, exit 0, `promote`, the pod's vLLM and fix on both sides, every case passed; with
    the default values the load sample measured on both sides in the pod (its speed verdict is not asserted);
  - the probes' declared ports and paths answer: the startup probe's `/health` on the http port; the
    liveness exec probe through `podman healthcheck run`; the readiness exec probe run as declared in the
    vLLM container (podman 4.3 ignores readiness probes);
  - a hung engine (issue 31; vLLM's engine core frozen with SIGSTOP inside the container: /health stays
    200): the real canary writes a fresh `hung` verdict and the liveness probe fails (so does readiness);
    the engine resumed, the canary's next pass makes both pass again;
  - a crashing or hung canary (issue 34): its child killed with SIGKILL again and again, then frozen with
    SIGSTOP, inside the canary container: the keeper (the container's first process) starts it again each
    time, the container itself is never restarted, and vLLM's readiness passes throughout;
  - the failure table in a real pod: canary stopped → its last verdict `unknown`: vLLM live, not ready; no
    verdict at all → live and ready; a fresh `corrupt` verdict → live and ready both fail; `unreachable` →
    ready fails, live passes; a verdict from before vLLM started → both pass.
What podman 4.3 cannot show (probe timing, restarts on liveness failure, Service routing) stays with the
`helm template` and schema checks in tests/render.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploykit.net import free_port
from tests.e2e.pod_runtime import (
    PlayedPod,
    PodRuntime,
    add_host_mounts,
    add_service_links,
    dump_kube_yaml,
    expand_env_references,
    pod_spec_of,
    replace_images,
    set_restart_policy,
)
from tests.e2e.test_serve_e2e import command_env, demo_variant
from tests.render.test_helm import find_helm
from tests.vllm_harness import REPO

pytestmark = pytest.mark.e2e

FIX = "device_penalties"
KEY_ENV = "DK_POD_API_KEY"
# A bound, not an expectation: vLLM's CPU build took 240 s to 5 min to start here with a load average of
# 16 on 2 cores (its imports alone); the wait ends as soon as /health answers.
START_TIMEOUT_S = 600.0
CANARY_TIMEOUT_S = 240.0
# The verdict's maximum age, also the canary keeper's hung threshold: above HUNG_AFTER_S (60 s) plus the
# hung-engine test's 30 s slack, so the keeper never takes the canary that is about to say `hung` for a hung
# canary itself, and short enough for the keeper's own hang test.
VERDICT_MAX_AGE_S = 150
# A platform team names the release after what it serves; the Service is named after the release.
RELEASE = "vllm"
# Where the pod sees the staged model: the release's volume, not the host's path.
MODEL_MOUNT = "/models"
# An HTTP GET from inside a container of the pod (`podman exec`: the pod has no network the host shares).
# `auth` sends the container's own VLLM_API_KEY (from the Secret), so the key never appears in an argv.
HTTP_GET = """
import os, sys, urllib.error, urllib.request
request = urllib.request.Request(sys.argv[1])
if sys.argv[2] == "auth":
    request.add_header("Authorization", "Bearer " + os.environ["VLLM_API_KEY"])
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(request, timeout=30) as response:
        status, body = response.status, response.read()
except urllib.error.HTTPError as error:
    status, body = error.code, error.read()
except OSError as error:
    status, body = 0, str(error).encode()
sys.stdout.write(f"{status}\\n{body.decode(errors='replace')}")
"""


class ChartPod:
    """The played pod, its ports, its key, and where the verdict volume lives on the host."""

    def __init__(self, runtime: PodRuntime, pod: PlayedPod, port: int, canary_port: int, key: str) -> None:
        self.runtime = runtime
        self.pod = pod
        self.port = port
        self.canary_port = canary_port
        self.key = key
        self.vllm = next(name for name in pod.containers if name.endswith("-vllm"))
        self.canary = next(name for name in pod.containers if name.endswith("-canary"))
        self.deployment: dict[str, Any] = {}
        # The chart the fixture rendered and the values it templated it with (`--set` pairs), so a test can
        # template more of the same release (the gate Job).
        self.chart = Path()
        self.helm_sets: list[str] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, url: str, *, auth: bool = False) -> tuple[int, str]:
        """(status, body) of a GET from inside the vLLM container; status 0 when nothing answered."""
        done = self.runtime.exec(
            self.vllm, ["python3", "-c", HTTP_GET, url, "auth" if auth else "-"], timeout=60
        )
        if done.returncode != 0 or "\n" not in done.stdout:
            return 0, done.stdout + done.stderr
        status, _, body = done.stdout.partition("\n")
        return int(status), body

    def container_spec(self, name: str) -> dict[str, Any]:
        spec = pod_spec_of(self.deployment)
        found: dict[str, Any] = next(c for c in spec["containers"] if c["name"] == name)
        return found

    def verdict_source(self) -> Path:
        """The host directory behind the canary's /run/deploykit (podman's volume for the emptyDir)."""
        mounts = self.runtime.inspect_raw(self.canary)["Mounts"]
        (mount,) = [m for m in mounts if m["Destination"] == "/run/deploykit"]
        return Path(mount["Source"])

    def volume_source(self, container: str, destination: str) -> Path:
        """The host directory behind one of `container`'s mounts."""
        mounts = self.runtime.inspect_raw(container)["Mounts"]
        (mount,) = [m for m in mounts if m["Destination"] == destination]
        return Path(mount["Source"])

    def probe(self, kind: str) -> int:
        """Run the vLLM container's readiness or liveness command as declared, inside it."""
        command = self.container_spec("vllm")[f"{kind}Probe"]["exec"]["command"]
        return self.runtime.exec(self.vllm, command, timeout=60).returncode


def render_chart(tmp_path: Path, model_dir: Path, port: int) -> Path:
    """The model staged on a node directory (a hostPath volume of the release), vLLM given its in-pod path."""
    profile = demo_variant(
        tmp_path,
        "demo-pod",
        model__source=f"{MODEL_MOUNT}/{model_dir.name}",
        model__volumes=[{"kind": "host_path", "path": str(model_dir.parent), "mount_path": MODEL_MOUNT}],
        serve__host="0.0.0.0",
        serve__port=port,
        serve__api_key_env=KEY_ENV,
    )
    out = tmp_path / "chart"
    done = subprocess.run(
        [sys.executable, "-m", "deploykit", "render", "helm", "-p", str(profile), "--fix", f"{FIX}=on",
         "--facts", str(REPO / "tests" / "fixtures" / "facts" / "no-gpu.json"), "--out", str(out)],
        env=command_env(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out / "demo-pod"


def wait_for(what: str, check: Any, timeout: float, interval: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})")


@pytest.fixture(scope="module")
def chart_pod(
    pod_runtime: PodRuntime,
    pod_base_image: str,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ChartPod]:
    tmp = tmp_path_factory.mktemp("helm-pod")
    port, canary_port = free_port(), free_port()
    # vLLM runs non-root in the pod (Pod Security "restricted"); the cached tiny model's weights are root's,
    # mode 0600, so the pod gets a world-readable copy (as the nspawn fixture does for its service user).
    model_dir = tmp / "model" / tiny_model_dir.name
    shutil.copytree(tiny_model_dir.resolve(), model_dir)
    for path in [model_dir.parent, model_dir, *model_dir.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    chart = render_chart(tmp, model_dir, port)
    helm_sets = ["--set", f"canary.port={canary_port}", "--set", "canary.every=5",
                 "--set", f"canary.verdictMaxAgeSeconds={VERDICT_MAX_AGE_S}"]  # fmt: skip
    rendered = subprocess.run(
        [find_helm(), "template", RELEASE, str(chart), *helm_sets],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    played = copy.deepcopy([d for d in docs if d["kind"] in ("Deployment", "ConfigMap")])
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    spec = pod_spec_of(next(d for d in played if d["kind"] == "Deployment"))
    for container in spec["containers"]:
        container.pop("ports")
    replace_images(spec, pod_base_image)
    add_host_mounts(spec, None)  # the venv and its interpreter; the model is the chart's own volume
    set_restart_policy(spec)
    add_service_links(spec, [d for d in docs if d["kind"] == "Service"])
    # podman 4.3 creates an emptyDir root-owned, mode 0755, as the pod starts; kubelet creates every emptyDir
    # world-writable (0777) before any container runs, which is what lets vLLM, run non-root under Pod
    # Security "restricted", write its HOME, its cache and /dev/shm. The played copy backs those three by host
    # directories made 0777 first, as kubelet would make them (shm_open needs no tmpfs, only the directory).
    key = base64.b16encode(os.urandom(12)).decode().lower()
    for volume in spec["volumes"]:
        if volume["name"] == "canary-key":
            # podman 4.3's kube play panics on a secret volume with `items`; kubelet writes the Secret's key
            # as this file (and rewrites it when the Secret changes). The played copy mounts it so.
            directory = tmp / "secret" / volume["name"]
            directory.mkdir(parents=True)
            (directory / "api-key").write_text(key)
            for path in (directory, directory / "api-key"):
                path.chmod(0o755 if path.is_dir() else 0o644)
            volume.pop("secret")
            volume["hostPath"] = {"path": str(directory), "type": "Directory"}
        if volume["name"] in ("home", "cache", "dshm"):
            directory = tmp / "emptydir" / volume["name"]
            directory.mkdir(parents=True)
            directory.chmod(0o777)
            volume.pop("emptyDir")
            volume["hostPath"] = {"path": str(directory), "type": "Directory"}
    pod_runtime.secret_create("demo-pod-secrets", {"VLLM_API_KEY": key})
    yaml_text = dump_kube_yaml(played)
    (pod,) = pod_runtime.play(yaml_text, extra_args=["--network", "none"], timeout=180)
    running = ChartPod(pod_runtime, pod, port, canary_port, key)
    running.deployment = deployment
    running.chart, running.helm_sets = chart, helm_sets
    # podman creates an emptyDir as root, mode 0755; kubelet creates every emptyDir world-writable (0777),
    # which is what lets the canary (user 65534) write its verdict there. Done here as kubelet does.
    running.verdict_source().chmod(0o777)
    running.volume_source(running.vllm, "/run/deploykit-ledger").chmod(0o777)  # the restart ledger, the same

    def started() -> bool:
        state = pod_runtime.inspect(running.vllm)
        assert state.running and state.restart_count == 0, f"vLLM's container ended: {state}"
        return running.get(running.base_url + "/health")[0] == 200

    verdict_file = running.verdict_source() / "verdict.json"

    def canary_healthy() -> bool:
        """The canary judged the server: its first passing run also warmed the engine (the CPU build
        compiles a kernel on the first logprobs request, and an engine RPC waits behind it)."""
        try:
            return bool(json.loads(verdict_file.read_text())["status"] == "healthy")
        except (OSError, ValueError, KeyError):
            return False

    started_at = time.monotonic()
    try:
        # Each check is a `podman exec` (a Python started in the pod): every 3 s, not to slow the load.
        wait_for("vLLM's /health in the pod", started, START_TIMEOUT_S, interval=3.0)
        print(f"\npod: vLLM healthy {time.monotonic() - started_at:.0f} s after kube play, no network")
        wait_for("the canary's healthy verdict", canary_healthy, CANARY_TIMEOUT_S)
        yield running
    except BaseException:
        for name in pod.containers:
            print(f"--- {name}\n{pod_runtime.logs(name)[-12000:]}")
        raise
    finally:
        pod_runtime.down(yaml_text, timeout=120)


def test_the_secret_is_read_by_the_chart_from_its_own_name(chart_pod: ChartPod) -> None:
    env = {e["name"]: e for e in chart_pod.container_spec("vllm")["env"]}
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "demo-pod-secrets",
        "key": "VLLM_API_KEY",
    }


def test_with_no_network_vllm_serves_the_model_from_the_releases_volume(chart_pod: ChartPod) -> None:
    """The pod has loopback only; vLLM was given the volume's in-pod path, the hub is off, and it answers."""
    interfaces = chart_pod.runtime.exec(chart_pod.vllm, ["ls", "/sys/class/net"], timeout=30).stdout.split()
    assert interfaces == ["lo"]
    outside = chart_pod.runtime.exec(
        chart_pod.vllm, ["curl", "-sS", "--max-time", "5", "http://192.0.2.1/"], timeout=30
    )
    assert outside.returncode != 0  # nothing outside the pod is reachable
    vllm = chart_pod.container_spec("vllm")
    assert vllm["command"][2].startswith(f"{MODEL_MOUNT}/")
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    status, body = chart_pod.get(chart_pod.base_url + "/v1/models", auth=True)
    assert status == 200 and json.loads(body)["data"][0]["root"] == vllm["command"][2], body


def test_a_release_named_vllm_starts_without_service_links(chart_pod: ChartPod) -> None:
    """A kubelet would give a release named `vllm` VLLM_PORT=tcp://... (the Service's link); the chart turns
    links off, so vLLM (which refuses that value) started; the played spec carries what a kubelet adds."""
    spec = pod_spec_of(chart_pod.deployment)
    assert spec["enableServiceLinks"] is False
    assert chart_pod.deployment["metadata"]["name"] == RELEASE
    env = chart_pod.runtime.exec(chart_pod.vllm, ["env"], timeout=30).stdout
    assert "VLLM_PORT=" not in env and "VLLM_SERVICE_HOST=" not in env


def test_vllm_loads_deploykit_from_the_charts_wheel_and_runs_the_fix(chart_pod: ChartPod) -> None:
    wheel = next(e["value"] for e in chart_pod.container_spec("vllm")["env"] if e["name"] == "PYTHONPATH")
    done = chart_pod.runtime.exec(
        chart_pod.vllm, ["python3", "-c", "import deploykit; print(deploykit.__file__)"], timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{wheel}/deploykit/__init__.py"  # nothing else offers deploykit there
    assert chart_pod.get(chart_pod.base_url + "/deploykit/status")[0] == 401
    code, body = chart_pod.get(chart_pod.base_url + "/deploykit/status", auth=True)
    assert code == 200, body
    status = json.loads(body)
    assert status["fixes_requested"] == [FIX]
    assert str(status["fixes_active"].get(FIX)).startswith("vllm."), json.dumps(status)


def test_the_startup_probe_answers_on_its_declared_port_and_path(chart_pod: ChartPod) -> None:
    startup = chart_pod.container_spec("vllm")["startupProbe"]["httpGet"]
    ports = {p["name"]: p["containerPort"] for p in chart_pod.container_spec("vllm")["ports"]}
    assert chart_pod.get(f"http://127.0.0.1:{ports[startup['port']]}{startup['path']}")[0] == 200


def test_the_canary_runs_and_writes_its_verdict(chart_pod: ChartPod) -> None:
    verdict = json.loads((chart_pod.verdict_source() / "verdict.json").read_text())
    assert verdict["status"] == "healthy"  # the fixture waited for it: the canary's runs pass
    assert chart_pod.get(f"http://127.0.0.1:{chart_pod.canary_port}/healthz")[0] == 200
    assert chart_pod.runtime.healthcheck_run(chart_pod.vllm) == 0
    assert chart_pod.probe("readiness") == 0


GATE_TIMEOUT_S = 600.0


def render_gate_job(chart_pod: ChartPod, *, load: bool) -> tuple[dict[str, Any], dict[str, dict[str, str]]]:
    """The gate Job's PodSpec (after the kubelet's `$(NAME)` expansion, which changes nothing here) and every
    ConfigMap's data, templated from the chart the pod was played from with the fixture's values and the
    gate's: the Job on, `gate.candidateUrl` and `gate.baselineUrl` both the pod's own server (values, not
    substitutions), `gate.load`."""
    url = chart_pod.base_url
    rendered = subprocess.run(
        [find_helm(), "template", RELEASE, str(chart_pod.chart), *chart_pod.helm_sets,
         "--set", "gate.job.enabled=true", "--set", f"gate.candidateUrl={url}",
         "--set", f"gate.baselineUrl={url}", "--set", f"gate.load={str(load).lower()}"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    (job,) = [d for d in docs if d["kind"] == "Job"]
    configmaps = {d["metadata"]["name"]: d.get("data") or {} for d in docs if d["kind"] == "ConfigMap"}
    return expand_env_references(copy.deepcopy(pod_spec_of(job))), configmaps


def gate_command(chart_pod: ChartPod, job_spec: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The Job's container's command + args as rendered, and its literal environment; checked to be what the
    values said, and the played canary container checked to be the Job's container in all the command sees."""
    (gate,) = job_spec["containers"]
    argv = [*gate["command"], *gate.get("args", [])]
    url = chart_pod.base_url
    assert argv[:4] == ["python3", "-m", "deploykit", "gate"], argv
    assert argv[argv.index("--url") + 1] == url and argv[argv.index("--baseline-url") + 1] == url
    assert argv[argv.index("--api-key-env") + 1] == KEY_ENV
    assert argv[argv.index("--profile") + 1] == "/etc/deploykit/profile.yaml"
    assert argv[argv.index("--facts") + 1] == "/etc/deploykit/facts.json"
    assert "--no-store" in argv and argv[-2:] == ["--format", "json"]  # no gate.store.secretName
    canary = chart_pod.container_spec("canary")
    pod_spec = pod_spec_of(chart_pod.deployment)
    assert gate["image"] == canary["image"]
    assert gate["securityContext"] == canary["securityContext"]
    assert job_spec["securityContext"] == pod_spec["securityContext"]
    job_volumes = {v["name"]: v for v in job_spec["volumes"]}
    pod_volumes = {v["name"]: v for v in pod_spec["volumes"]}
    job_mounts = {m["mountPath"]: job_volumes[m["name"]] for m in gate["volumeMounts"]}
    pod_mounts = {m["mountPath"]: pod_volumes[m["name"]] for m in canary["volumeMounts"]}
    assert set(job_mounts) == {"/etc/deploykit", "/scratch", "/opt/deploykit"}, job_mounts
    assert job_mounts["/opt/deploykit"]["configMap"] == pod_mounts["/opt/deploykit"]["configMap"]
    assert "emptyDir" in job_mounts["/scratch"] and "emptyDir" in pod_mounts["/scratch"]
    projected = [s["configMap"]["name"] for s in job_mounts["/etc/deploykit"]["projected"]["sources"]]
    assert projected == [f"{RELEASE}-profile", f"{RELEASE}-gate"], projected
    assert pod_mounts["/etc/deploykit"]["configMap"]["name"] == f"{RELEASE}-profile"
    literal_env: dict[str, str] = {}
    canary_env = {e["name"]: e for e in canary["env"]}
    for entry in gate["env"]:
        if "value" in entry:
            literal_env[entry["name"]] = entry["value"]
        else:  # from the Secret: the canary container has the same variable from the same key
            reference = entry["valueFrom"]["secretKeyRef"]
            assert reference == canary_env[entry["name"]]["valueFrom"]["secretKeyRef"], entry
    assert literal_env["PYTHONPATH"] == canary_env["PYTHONPATH"]["value"]
    return argv, literal_env


def run_gate_command(chart_pod: ChartPod, argv: list[str], env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """The command run in the canary container, the Job's literal environment given to `podman exec`; its
    exit status and JSON report. The API key appears in neither stream."""
    exec_env = [f"--env={name}={value}" for name, value in env.items()]
    started = time.monotonic()
    done = chart_pod.runtime.podman(
        "exec", *exec_env, chart_pod.canary, *argv, check=False, timeout=GATE_TIMEOUT_S
    )
    took = time.monotonic() - started
    print(f"\npod: the gate Job's command, exit {done.returncode} in {took:.0f} s: {shlex.join(argv)}")
    print(done.stderr[-3000:])
    assert chart_pod.key not in done.stdout and chart_pod.key not in done.stderr
    assert done.returncode in (0, 6), f"exit {done.returncode}\n{done.stderr[-4000:]}\n{done.stdout[-4000:]}"
    report: dict[str, Any] = json.loads(done.stdout)
    label = report["verdict"] + (f": {report['reason']}" if report["reason"] else "")
    print(f"pod: gate {label}: {report['summary']}")
    for role in ("baseline", "candidate"):
        figures = report[role]["figures"]
        shown = [f"KV cache {figures['kv_cache_tokens']} tokens"] + [
            f"{p['streams']} stream(s) {p['tokens_per_s']:g} tok/s, TPOT {p['tpot_ms']} ms "
            f"({p['tpot_source']})"
            for p in figures["load"]
        ]
        print(f"pod: {role}: " + "; ".join(shown))
    return done.returncode, report


def assert_answers_promote(chart_pod: ChartPod, report: dict[str, Any]) -> None:
    """Both sides are the pod's server answering as it does: its vLLM, its fix, all cases passed, no drift."""
    url = chart_pod.base_url
    status, body = chart_pod.get(url + "/version", auth=True)
    assert status == 200, body
    pod_vllm = json.loads(body)["version"]
    assert report["drift"] is None and report["changed"] == {} and report["row_id"] is None, report
    for role in ("baseline", "candidate"):
        side = report[role]
        assert side["source"] == "url" and side["url"] == url and side["problem"] == "", side
        assert side["vllm_version"] == pod_vllm
        assert str(side["fixes_active"].get(FIX)).startswith("vllm."), side["fixes_active"]
        assert side["cases"] and all(case["passed"] for case in side["cases"]), side["cases"]
        assert side["figures"]["kv_cache_tokens"] > 0  # vLLM's /metrics, read in the pod


def test_the_gate_jobs_command_runs_in_the_pod_and_promotes_the_server_against_itself(
    chart_pod: ChartPod,
) -> None:
    """Issue 46: the chart's gate Job (`gate.job.enabled=true`), templated from the chart the pod was played
    from, its container's command run for real against the played vLLM, the server judged against itself.

    The command runs exactly as rendered in the played canary container: the Job's own container in all but
    name (the same image, pod and container security context: user 65534, read-only root; the same wheel
    ConfigMap at /opt/deploykit on PYTHONPATH; an emptyDir at /scratch; the API key variable from the same
    Secret). The Job's literal environment is given to `podman exec --env` (the canary's lacks TMPDIR); its
    Secret variable is the container's own. The Job's /etc/deploykit projects the `<release>-profile` and
    `<release>-gate` ConfigMaps side by side; the canary's /etc/deploykit is the first of them (checked
    identical), and the second's files (facts.json) are written into that volume, as the projection places
    them, then removed. What stays different: the canary's memory limit (512 Mi, the Job's 2 Gi), and no
    wait-for-servers init container (the fixture waited for /health).

    Two runs. `gate.load=false` (`--no-load`): the answers, the fix check, the fingerprints and the KV cache,
    exact on both sides: exit 0, `promote`. The default values (the load sample): it runs in the pod, every
    stream count measured on both sides; its verdict is `promote` or `hold: slower`, never anything else.
    A server judged against itself held slower in 2 of 20 runs on this loaded 2-core machine (tokens/s at 4
    streams × 0.72 once, TPOT at 4 streams × 1.43 once; with the canary's child frozen or not): the sample's
    requests last well under a second each on the tiny model, and best of 3 does not hold them within the
    25 % threshold here. A speed verdict is no fact of the command, so the strict run is the `--no-load` one.
    """
    from deploykit.profile.schema import GateSpec

    answers_spec, configmaps = render_gate_job(chart_pod, load=False)
    load_spec, load_configmaps = render_gate_job(chart_pod, load=True)
    assert load_configmaps == configmaps
    answers_argv, env = gate_command(chart_pod, answers_spec)
    load_argv, load_env = gate_command(chart_pod, load_spec)
    assert load_env == env and "--no-load" not in load_argv
    assert answers_argv == [*load_argv[:-3], "--no-load", *load_argv[-3:]]  # what gate.load=false changes

    # /etc/deploykit as the Job's projected volume has it: profile.yaml (the canary's, the same ConfigMap) and
    # the gate ConfigMap's facts.json beside it.
    config_dir = chart_pod.volume_source(chart_pod.canary, "/etc/deploykit")
    profile_map = configmaps[f"{RELEASE}-profile"]
    assert {name: (config_dir / name).read_text() for name in profile_map} == profile_map
    placed = []
    for name, text in configmaps[f"{RELEASE}-gate"].items():
        assert not (config_dir / name).exists(), name
        (config_dir / name).write_text(text)
        (config_dir / name).chmod(0o644)
        placed.append(config_dir / name)
    assert sorted(p.name for p in config_dir.iterdir()) == ["facts.json", "profile.yaml"]
    # kubelet makes an emptyDir world-writable; podman 4.3 makes it root's 0755 (HOME and TMPDIR are there).
    chart_pod.volume_source(chart_pod.canary, "/scratch").chmod(0o777)
    try:
        answers_exit, answers = run_gate_command(chart_pod, answers_argv, env)
        load_exit, loaded = run_gate_command(chart_pod, load_argv, env)
    finally:
        for path in placed:
            path.unlink()

    assert answers_exit == 0 and answers["verdict"] == "promote" and answers["reason"] is None, answers
    assert_answers_promote(chart_pod, answers)
    assert answers["speed_judged"] is False
    assert answers["baseline"]["figures"]["load"] == answers["candidate"]["figures"]["load"] == []

    assert_answers_promote(chart_pod, loaded)
    expected = GateSpec.model_validate(yaml.safe_load(profile_map["profile.yaml"]).get("gate") or {}).streams
    for role in ("baseline", "candidate"):
        load = loaded[role]["figures"]["load"]
        assert [p["streams"] for p in load] == expected, load
        assert all(p["tokens_per_s"] > 0 and p["output_tokens"] > 0 for p in load), load
        assert all(p["problem"] == "" for p in load), load
    assert loaded["speed_judged"] is True
    slower = [f for f in loaded["speed"] if f["slower"]]
    if load_exit == 0:
        assert loaded["verdict"] == "promote" and loaded["reason"] is None and not slower, loaded
    else:  # noise on this machine, never a broken side or drift (see the docstring)
        assert (loaded["verdict"], loaded["reason"]) == ("hold", "slower") and slower, loaded


def write_verdict(directory: Path, status: str, mtime: float | None = None) -> None:
    path = directory / "verdict.json"
    path.write_text(
        json.dumps({"status": status, "diagnosis": "written by the test", "written_at": time.time()})
    )
    if mtime is not None:
        os.utime(path, (mtime, mtime))


# Freeze or thaw vLLM's engine core inside the vLLM container (its process title, set by vLLM): the API
# server stays up and /health keeps answering 200, while no token is produced: a hung engine, no plugin.
SIGNAL_ENGINE = """
import os, signal, sys
found = []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            title = handle.read().split(b"\\0")[0]
    except OSError:
        continue
    if title.startswith(b"VLLM::EngineCore"):
        os.kill(int(pid), getattr(signal, sys.argv[1]))
        found.append(pid)
print(" ".join(found))
sys.exit(0 if found else 1)
"""


def signal_engine(chart_pod: ChartPod, name: str) -> str:
    done = chart_pod.runtime.exec(chart_pod.vllm, ["python3", "-c", SIGNAL_ENGINE, name], timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def verdict_status(chart_pod: ChartPod) -> str | None:
    try:
        return str(json.loads((chart_pod.verdict_source() / "verdict.json").read_text())["status"])
    except (OSError, ValueError, KeyError):
        return None


def test_a_hung_engine_fails_liveness_through_the_real_canary(chart_pod: ChartPod) -> None:
    """The real canary (every 5 s) against the real vLLM whose engine is frozen: `hung` within
    HUNG_AFTER_S + 30 s, and the vLLM container's liveness probe fails on it (Kubernetes restarts it)."""
    from deploykit.canary.defaults import HUNG_AFTER_S

    assert chart_pod.runtime.healthcheck_run(chart_pod.vllm) == 0
    stopped = signal_engine(chart_pod, "SIGSTOP")
    frozen_at = time.monotonic()
    try:
        assert chart_pod.get(chart_pod.base_url + "/health")[0] == 200  # the hang keeps /health at 200
        wait_for("the canary's hung verdict", lambda: verdict_status(chart_pod) == "hung", HUNG_AFTER_S + 120)
        took = time.monotonic() - frozen_at
        print(f"\npod: hung verdict {took:.0f} s after the engine froze (engine pids {stopped})")
        assert took <= HUNG_AFTER_S + 30, took
        assert chart_pod.runtime.healthcheck_run(chart_pod.vllm) == 1  # liveness: the container restarts
        assert chart_pod.probe("liveness") == 1 and chart_pod.probe("readiness") == 1
    finally:
        signal_engine(chart_pod, "SIGCONT")
    wait_for("the canary healthy again", lambda: verdict_status(chart_pod) == "healthy", CANARY_TIMEOUT_S)
    assert chart_pod.runtime.healthcheck_run(chart_pod.vllm) == 0 and chart_pod.probe("readiness") == 0


# The canary keeper's children inside the canary container: `PID STATE` per line. The keeper is found by its
# module name (it is the container's first process unless the runtime adds an init), its children by parent.
CANARY_CHILDREN = """
import os
procs = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\\0")
    except OSError:
        continue
    procs[int(pid)] = (int(fields[1]), fields[0], argv)
keepers = {pid for pid, (_, _, argv) in procs.items() if b"deploykit.render.canary_keeper" in argv}
for pid, (ppid, state, argv) in sorted(procs.items()):
    if ppid in keepers:
        print(pid, state)
"""
SIGNAL_PID = "import os, signal, sys; os.kill(int(sys.argv[1]), getattr(signal, sys.argv[2]))"


def canary_children(chart_pod: ChartPod) -> dict[int, str]:
    done = chart_pod.runtime.exec(chart_pod.canary, ["python3", "-c", CANARY_CHILDREN], timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return {int(pid): state for pid, state in (line.split() for line in done.stdout.splitlines())}


def signal_in_canary(chart_pod: ChartPod, pid: int, name: str) -> None:
    done = chart_pod.runtime.exec(chart_pod.canary, ["python3", "-c", SIGNAL_PID, str(pid), name], timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_crashing_or_hung_canary_never_restarts_its_container_and_vllm_stays_ready(
    chart_pod: ChartPod,
) -> None:
    """Issue 34's "a broken canary leaves vLLM ready", in the played pod. Hung: the canary child frozen with
    SIGSTOP and its verdict's mtime set back past the maximum age (what VERDICT_MAX_AGE_S of silence would
    leave, without waiting it out; the child has run since the pod started, so its start is no fresher): the
    keeper kills it and starts another. Crash loop: the child killed with SIGKILL three times: started again
    after each. Throughout, the container's first process and start time stay, podman counts no restart,
    and the vLLM container's readiness command passes at every step."""
    runtime = chart_pod.runtime
    state = runtime.inspect_raw(chart_pod.canary)["State"]
    assert runtime.inspect(chart_pod.canary).restart_count == 0

    def ready_and_child(other_than: int | None = None) -> int | None:
        assert chart_pod.probe("readiness") == 0, "vLLM left the Service"
        children = [pid for pid, st in canary_children(chart_pod).items() if st != "Z"]
        return next((pid for pid in children if pid != other_than), None)

    first = wait_for("the canary child", ready_and_child, 60)
    signal_in_canary(chart_pod, first, "SIGSTOP")
    wait_for("the child stopped", lambda: canary_children(chart_pod).get(first) == "T", 60)
    verdict = chart_pod.verdict_source() / "verdict.json"
    old = time.time() - VERDICT_MAX_AGE_S - 60
    os.utime(verdict, (old, old))
    hung_at = time.monotonic()
    child = wait_for("the hung child replaced", lambda: ready_and_child(first), VERDICT_MAX_AGE_S + 120, 2.0)
    print(f"\npod: hung canary child replaced {time.monotonic() - hung_at:.0f} s after its verdict aged")
    for _ in range(3):
        signal_in_canary(chart_pod, child, "SIGKILL")
        child = wait_for("the killed child replaced", lambda c=child: ready_and_child(c), 120, 1.0)
    wait_for("the canary healthy again", lambda: verdict_status(chart_pod) == "healthy", CANARY_TIMEOUT_S)
    assert chart_pod.probe("readiness") == 0 and runtime.healthcheck_run(chart_pod.vllm) == 0
    after = runtime.inspect_raw(chart_pod.canary)["State"]
    assert after["Pid"] == state["Pid"] and after["StartedAt"] == state["StartedAt"], (state, after)
    assert runtime.inspect(chart_pod.canary).running and runtime.inspect(chart_pod.canary).restart_count == 0
    logs = runtime.logs(chart_pod.canary)
    assert "hung, killed" in logs and logs.count("was killed by SIGKILL") >= 3, logs[-4000:]
    assert "restart 4 in" in logs


def test_the_failure_table_in_the_pod(chart_pod: ChartPod) -> None:
    """Stopping the canary first: it would rewrite the verdict the test writes."""
    runtime, directory = chart_pod.runtime, chart_pod.verdict_source()
    runtime.podman("stop", "-t", "5", chart_pod.canary, timeout=60)
    # Canary stopped: its last verdict says `unknown` (never `healthy`): vLLM stays live, out of service.
    assert json.loads((directory / "verdict.json").read_text())["status"] == "unknown"
    assert runtime.healthcheck_run(chart_pod.vllm) == 0 and chart_pod.probe("readiness") == 1
    # No canary verdict at all (the canary not there): vLLM stays live and ready.
    (directory / "verdict.json").unlink(missing_ok=True)
    assert runtime.healthcheck_run(chart_pod.vllm) == 0 and chart_pod.probe("readiness") == 0
    # A fresh corrupt verdict: out of service and restarted.
    write_verdict(directory, "corrupt")
    assert runtime.healthcheck_run(chart_pod.vllm) == 1
    assert chart_pod.probe("liveness") == 1 and chart_pod.probe("readiness") == 1
    # A verdict about a vLLM process that has since been replaced: ignored.
    write_verdict(directory, "corrupt", mtime=time.time() - 24 * 3600)
    assert runtime.healthcheck_run(chart_pod.vllm) == 0 and chart_pod.probe("readiness") == 0
    # vLLM gave the canary no answer for a while: out of the Service, not restarted.
    write_verdict(directory, "unreachable")
    assert chart_pod.probe("liveness") == 0 and chart_pod.probe("readiness") == 1


def test_a_misconfigured_canary_leaves_vllm_ready_and_the_restart_cap_holds(chart_pod: ChartPod) -> None:
    """Issue 34, in the played pod (after the failure table stopped the canary): a `misconfigured` verdict
    (a refused key, a wrong name) leaves vLLM live and ready; with 3 corruption restarts already in the
    pod's ledger (the chart's emptyDir, written by the vLLM container's own liveness command), a fresh
    `corrupt` verdict no longer fails liveness (no restart loop) and readiness fails with the cap's reason."""
    runtime, directory = chart_pod.runtime, chart_pod.verdict_source()
    write_verdict(directory, "misconfigured")
    assert runtime.healthcheck_run(chart_pod.vllm) == 0
    assert chart_pod.probe("liveness") == 0 and chart_pod.probe("readiness") == 0
    ledger = chart_pod.volume_source(chart_pod.vllm, "/run/deploykit-ledger")
    write_verdict(directory, "corrupt")
    live = chart_pod.container_spec("vllm")["livenessProbe"]["exec"]["command"]
    first = runtime.exec(chart_pod.vllm, live, timeout=60)
    assert first.returncode == 1, first.stdout  # (the failure table's corrupt verdict counted it first)
    assert (ledger / "corruption-restarts").read_text().count("restart ") == 1  # once per vLLM process
    now = time.time()
    earlier = "".join(f"restart {now - 900 + k:.2f} {now - 800 + k:.3f}\n" for k in range(3))
    (ledger / "corruption-restarts").write_text(earlier)  # three earlier vLLM processes, this hour
    write_verdict(directory, "corrupt")
    held = runtime.exec(chart_pod.vllm, live, timeout=60)
    assert held.returncode == 0 and "the cap is 3" in held.stdout, held.stdout
    ready = chart_pod.container_spec("vllm")["readinessProbe"]["exec"]["command"]
    out = runtime.exec(chart_pod.vllm, ready, timeout=60)
    assert out.returncode == 1 and "delete the pod to start afresh" in out.stdout, out.stdout
