"""The podman groundwork (tests/e2e/pod_runtime.py) proved on one short pod (~20 s, most of it `import vllm`).

One Kubernetes YAML: a ConfigMap carrying a zip in `binaryData`, and a pod whose init container writes a
marker into an emptyDir before the main container starts. The main container runs the host venv's Python
(hostPath, PATH from the imported image) with PYTHONPATH pointing at the zip in the mounted ConfigMap: it
imports a module from the zip and `vllm` from the venv (no server), reads its env from a secret created
beforehand, then stays up so its exec liveness probe can be run through `podman healthcheck run`: passing,
then failing once the probed file is removed. A second container fails once and is restarted by the pod's
restartPolicy (restart count 1, then exit 0).

restartPolicy is OnFailure: podman 4.3 gives init containers the pod's policy, and under Always the init
container would restart forever.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.pod_runtime import (
    PodRuntime,
    _section,
    add_host_mounts,
    add_service_links,
    check_kube_yaml,
    dump_kube_yaml,
    host_python_prefix,
    host_venv,
    pod_spec_of,
    read_status,
    replace_images,
    set_restart_policy,
    unavailable_reason,
)

pytestmark = pytest.mark.e2e

POD = "groundwork"
SECRET = "groundwork-secret"
TOKEN = "s3cr3t-from-a-podman-secret"

MAIN = """import hashlib, json, os, sys, time
import probelib
import vllm
zip_path = os.environ["PYTHONPATH"]
report = {
    "greeting": probelib.GREETING,
    "probelib_file": probelib.__file__,
    "vllm_file": vllm.__file__,
    "prefix": sys.prefix,
    "base_prefix": sys.base_prefix,
    "token_sha256": hashlib.sha256(os.environ["API_TOKEN"].encode()).hexdigest(),
    "init": open("/work/init-marker").read().strip(),
    "zip_sha256": hashlib.sha256(open(zip_path, "rb").read()).hexdigest(),
}
print("REPORT " + json.dumps(report), flush=True)
open("/work/alive", "w").close()
time.sleep(600)
"""

FLAKY = (
    "if [ -f /work/flaky-ran ]; then echo second run; exit 0; fi; "
    "touch /work/flaky-ran; echo first run; exit 3"
)


def _zip_with_module() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("probelib.py", 'GREETING = "hello from a ConfigMap zip"\n')
    return buffer.getvalue()


def _kube_yaml(image: str, zip_bytes: bytes) -> str:
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "probe-lib"},
        "binaryData": {"probelib.zip": base64.b64encode(zip_bytes).decode()},
    }
    work = {"name": "work", "mountPath": "/work"}
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD},
        "spec": {
            "initContainers": [
                {
                    "name": "init",
                    "image": "docker.io/vllm/vllm-openai:v0",
                    "command": ["sh", "-c", "echo init-done > /work/init-marker"],
                    "volumeMounts": [work],
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "docker.io/vllm/vllm-openai:v0",
                    "command": ["python", "-c", MAIN],
                    "env": [
                        {"name": "PYTHONPATH", "value": "/opt/lib/probelib.zip"},
                        {
                            "name": "API_TOKEN",
                            "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "token"}},
                        },
                    ],
                    "livenessProbe": {
                        "exec": {"command": ["test", "-f", "/work/alive"]},
                        "periodSeconds": 10,
                        "failureThreshold": 1,
                    },
                    "volumeMounts": [work, {"name": "lib", "mountPath": "/opt/lib", "readOnly": True}],
                },
                {"name": "flaky", "image": "busybox", "command": ["sh", "-c", FLAKY], "volumeMounts": [work]},
            ],
            "volumes": [
                {"name": "work", "emptyDir": {}},
                {"name": "lib", "configMap": {"name": "probe-lib"}},
            ],
        },
    }
    spec = pod["spec"]
    replace_images(spec, image)
    add_host_mounts(spec, ["main"])
    set_restart_policy(spec)
    assert spec["restartPolicy"] == "OnFailure"
    return dump_kube_yaml([configmap, pod])


def test_one_pod_proves_the_groundwork(pod_runtime: PodRuntime, pod_base_image: str) -> None:
    zip_bytes = _zip_with_module()
    kube = _kube_yaml(pod_base_image, zip_bytes)
    pod_runtime.secret_create(SECRET, {"token": TOKEN})

    pods = pod_runtime.play(kube)
    try:
        assert [p.name for p in pods] == [POD]
        # Init containers ran and were removed ("once"); the others are named <pod>-<container>.
        assert sorted(pods[0].containers) == [f"{POD}-flaky", f"{POD}-main"]
        main = f"{POD}-main"

        match = pod_runtime.wait_for_log(main, r"^REPORT (.*)$", timeout=180)
        report = json.loads(match.group(1))
        assert report["greeting"] == "hello from a ConfigMap zip"
        assert report["probelib_file"] == "/opt/lib/probelib.zip/probelib.py"
        assert report["zip_sha256"] == hashlib.sha256(zip_bytes).hexdigest(), "binaryData not byte-identical"
        assert report["vllm_file"].startswith(os.fspath(host_venv()) + "/")
        assert report["prefix"] == os.fspath(host_venv())
        assert report["base_prefix"] == os.fspath(host_python_prefix())
        assert report["token_sha256"] == hashlib.sha256(TOKEN.encode()).hexdigest()
        assert report["init"] == "init-done"

        # The venv is mounted read-only.
        denied = pod_runtime.exec(main, ["touch", os.fspath(host_venv() / "written-from-a-pod")])
        assert denied.returncode != 0 and "Read-only" in denied.stderr, denied

        # The liveness probe, run by hand (no systemd timers here): passing, then failing.
        pod_runtime.wait_until(
            lambda: pod_runtime.exec(main, ["test", "-f", "/work/alive"]).returncode == 0,
            timeout=30,
            what="/work/alive written",
        )
        assert pod_runtime.healthcheck_run(main) == 0
        assert pod_runtime.inspect(main).health == "healthy"
        assert pod_runtime.exec(main, ["rm", "/work/alive"]).returncode == 0
        assert pod_runtime.healthcheck_run(main) == 1
        state = pod_runtime.inspect(main)
        assert state.health == "unhealthy", state
        assert state.running and state.restart_count == 0, state  # 4.3: a failed probe restarts nothing

        # restartPolicy OnFailure: the flaky container exits 3, is restarted once, then exits 0.
        flaky = pod_runtime.wait_for_state(
            f"{POD}-flaky",
            # Exit code 0 only comes from the second run (podman counts the restart before it starts it).
            lambda s: s.status in ("exited", "stopped") and s.exit_code == 0 and s.restart_count >= 1,
            timeout=60,
            what="restarted once, then exited 0",
        )
        assert (flaky.restart_count, flaky.exit_code) == (1, 0), flaky
        assert pod_runtime.logs(f"{POD}-flaky").split() == ["first", "run", "second", "run"]
    finally:
        pod_runtime.down(kube)
    assert not pod_runtime.exists(f"{POD}-main")


# -- the spec helpers and parsers, without podman ---------------------------------------------------------
def _deployment() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "template": {
                "spec": {
                    "initContainers": [{"name": "install", "image": "python:3.11"}],
                    "containers": [
                        {"name": "vllm", "image": "vllm/vllm-openai:v0.9", "imagePullPolicy": "IfNotPresent"},
                        {"name": "canary", "image": "ghcr.io/x/canary:1"},
                    ],
                    "volumes": [{"name": "host-0", "emptyDir": {}}],
                }
            }
        },
    }


def test_spec_helpers_change_only_images_mounts_and_restart_policy() -> None:
    doc = _deployment()
    spec = pod_spec_of(doc)
    replace_images(spec, {"vllm": "localhost/base:1", "ghcr.io/x/canary:1": "localhost/base:2"})
    add_host_mounts(spec, ["vllm", "install"], extra_dirs=["/srv/checkout", "/usr"])
    set_restart_policy(spec)

    containers = {c["name"]: c for c in [*spec["initContainers"], *spec["containers"]]}
    assert containers["vllm"]["image"] == "localhost/base:1"
    assert containers["canary"]["image"] == "localhost/base:2"
    assert containers["install"]["image"] == "python:3.11"  # not named: unchanged
    assert containers["vllm"]["imagePullPolicy"] == "Never"
    assert spec["restartPolicy"] == "OnFailure"

    host = [v for v in spec["volumes"] if "hostPath" in v]
    paths = [v["hostPath"]["path"] for v in host]
    assert paths == [os.fspath(host_venv()), os.fspath(host_python_prefix()), "/srv/checkout"]  # no /usr
    assert "host-0" not in {v["name"] for v in host}  # an existing volume name is not reused
    for name in ("vllm", "install"):
        mounts = containers[name]["volumeMounts"]
        assert [(m["mountPath"], m["readOnly"]) for m in mounts] == [(p, True) for p in paths]
    assert "volumeMounts" not in containers["canary"]

    with pytest.raises(KeyError):
        replace_images(pod_spec_of(_deployment()), {"no-such-container": "x"})
    with pytest.raises(KeyError):
        add_host_mounts(pod_spec_of(_deployment()), ["no-such-container"])

    no_init = {"containers": [{"name": "a"}], "restartPolicy": "Always"}
    assert set_restart_policy(no_init)["restartPolicy"] == "Always"


def test_service_links_are_added_as_a_kubelet_adds_them_unless_the_pod_turns_them_off() -> None:
    service = {"metadata": {"name": "vllm"}, "spec": {"ports": [{"port": 8000}, {"port": 9400}]}}
    spec = {"containers": [{"name": "a", "env": [{"name": "VLLM_SERVICE_HOST", "value": "mine"}]}]}
    env = {e["name"]: e["value"] for e in add_service_links(spec, [service])["containers"][0]["env"]}
    assert env["VLLM_PORT"] == "tcp://10.96.0.10:8000"  # what vLLM refuses
    assert env["VLLM_PORT_9400_TCP_PORT"] == "9400" and env["VLLM_SERVICE_HOST"] == "mine"  # its own wins
    off = {"enableServiceLinks": False, "containers": [{"name": "a"}]}
    assert "env" not in add_service_links(off, [service])["containers"][0]


def test_kube_yaml_is_written_in_a_form_podman_reads() -> None:
    shared = {"name": "work", "mountPath": "/work"}
    pod = {
        "kind": "Pod",
        "spec": {"containers": [{"name": "a", "args": ["x\ny\n"], "volumeMounts": [shared]}]},
    }
    text = dump_kube_yaml([pod, {"kind": "Pod", "spec": {"containers": [{"volumeMounts": [shared]}]}}])
    assert "&id" not in text and "*id" not in text
    assert "- |\n" in text
    check_kube_yaml(text)
    with pytest.raises(ValueError, match=r"document 0\.spec\.containers\[0\]\.args\[0\]"):
        check_kube_yaml(dump_kube_yaml([{"kind": "Pod", "spec": {"containers": [{"args": ["\nx\n"]}]}}]))


def test_kube_play_output_and_status_file_parsing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    output = (
        "Pod:\n4bf470850fd33c71a62302409a648359dd8236ff56d4745882b6829afa83c64a\nContainer:\n794e3fcc7582\n\n"
    )
    assert _section(output, "Pod") == ["4bf470850fd33c71a62302409a648359dd8236ff56d4745882b6829afa83c64a"]
    assert _section(output, "Container") == ["794e3fcc7582"]
    status = tmp_path / "pod-runtime.status"
    status.write_text("status=unavailable\nreason=only 10 MB free at /var/cache (need 2048 MB)\n")
    assert read_status(status) == {
        "status": "unavailable",
        "reason": "only 10 MB free at /var/cache (need 2048 MB)",
    }
    assert read_status(tmp_path / "missing") == {}
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "need root" in (unavailable_reason() or "")
