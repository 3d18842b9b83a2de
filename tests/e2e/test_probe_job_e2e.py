"""`deploykit render probe-job`'s pod, run in a real container runtime without network: podman 4.3 kube play.

It shares the pod runtime and the locally built image of tests/e2e/test_helm_pod_e2e.py (the session's
`pod_runtime` and `pod_base_image` fixtures: one image per session, no second one). The rendered file is the
wheel's ConfigMap and a batch/v1 Job; podman 4.3 plays Pods and Deployments, not Jobs, so the test plays the
Job's pod template as a Pod of the Job's name (what the Job controller would create from it, less the
controller's labels). The played copy changes only what tests/e2e/pod_runtime.py lists: the image (the local
one), and read-only hostPath volumes for the host's venv and its interpreter (the image's `python3` is the
venv's; the checkout, and with it the editable install of deploykit, is not mounted). One more, to make the
venv what vLLM's images are: they lack nvidia-ml-py (tests/fixtures/vllm-image/), so a file that refuses
the import is mounted over the venv's `pynvml` module, and the pod must read NVML through vLLM's own copy of
it (vllm/third_party/pynvml.py, in the venv's vLLM too). The GPU request, the toleration and the restricted
security contexts are played as rendered. There is no GPU and no NVIDIA driver
here: the probe must still write valid facts that say so, and the pod must end with exit 0 (a done Job).

What it shows:
  - the pod runs `deploykit probe` from the ConfigMap's wheel alone, as user 65534 on a read-only root, with
    vLLM's copy of pynvml (without it, the facts would say that pynvml is missing, not what NVML said), and
    its log is the facts, nothing else: `deploykit.probe.load` reads it as a facts file, and it is exactly
    what the probe reports on this host (the same venv, no GPU: `gpus` empty, NVML's error recorded);
  - the same pod without the wheel on PYTHONPATH fails (exit 1) with Python's reason in its log: the probe
    came from the wheel, and a probe that cannot run fails the Job instead of leaving a log that is no facts.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploykit.probe.load import load_facts
from deploykit.probe.nvml_reader import read_probe_document
from tests.e2e.pod_runtime import PodRuntime, add_host_mounts, dump_kube_yaml, pod_spec_of, replace_images

pytestmark = pytest.mark.e2e

IMAGE = "vllm/vllm-openai:v0.32.0"  # what a platform team would name; replaced by the local image to play
EXIT_TIMEOUT_S = 180.0


def job_as_pod(job: dict[str, Any], name: str) -> dict[str, Any]:
    """The Job's pod template as the Pod the Job controller would make of it."""
    template = copy.deepcopy(job["spec"]["template"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    }


def test_the_probe_job_pod_logs_valid_facts_and_completes_without_a_gpu(
    pod_runtime: PodRuntime, pod_base_image: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "deploykit", "render", "probe-job", "-o", str(out), "--image", IMAGE],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = Path(done.stdout.strip())
    assert written == out / "deploykit-probe.yaml"
    configmap, job = (d for d in yaml.safe_load_all(written.read_text()) if d)
    assert (configmap["kind"], job["kind"]) == ("ConfigMap", "Job")

    probe = job_as_pod(job, job["metadata"]["name"])
    without_wheel = job_as_pod(job, "deploykit-probe-no-wheel")
    container = pod_spec_of(without_wheel)["containers"][0]
    container["env"] = [e for e in container["env"] if e["name"] != "PYTHONPATH"]
    for pod in (probe, without_wheel):
        spec = pod_spec_of(pod)
        replace_images(spec, pod_base_image)
        add_host_mounts(spec, None)  # the venv and its interpreter; not the checkout
    # The venv as vLLM's images are: no nvidia-ml-py (its one module, pynvml.py, refuses to be imported).
    found = importlib.util.find_spec("pynvml")
    assert found is not None and found.origin is not None and found.origin.endswith("/pynvml.py")
    blocker = tmp_path / "no-nvidia-ml-py.py"
    blocker.write_text("raise ModuleNotFoundError(\"No module named 'pynvml'\", name='pynvml')\n")
    blocker.chmod(0o644)
    spec = pod_spec_of(probe)
    spec["volumes"].append({"name": "no-nvidia-ml-py", "hostPath": {"path": str(blocker), "type": "File"}})
    spec["containers"][0]["volumeMounts"].append(
        {"name": "no-nvidia-ml-py", "mountPath": found.origin, "readOnly": True}
    )
    pods = pod_runtime.play(
        dump_kube_yaml([configmap, probe, without_wheel]), extra_args=["--network", "none"], timeout=180
    )
    assert sorted(p.name for p in pods) == ["deploykit-probe", "deploykit-probe-no-wheel"]

    name = "deploykit-probe-probe"
    state = pod_runtime.wait_for_exit(name, timeout=EXIT_TIMEOUT_S)
    log = pod_runtime.logs(name)
    took = time.monotonic() - started
    print(f"\nprobe job pod: exit {state.exit_code}, {took:.1f} s from render to its facts")
    assert state.exit_code == 0, log
    config = pod_runtime.inspect_raw(name)
    assert (
        config["Config"]["User"].split(":")[0] == "65534" and config["HostConfig"]["ReadonlyRootfs"] is True
    )

    facts_file = tmp_path / "node.json"
    facts_file.write_text(log)  # `kubectl logs job/deploykit-probe > node.json`
    facts = load_facts(str(facts_file))
    assert facts.gpus == [] and facts.error is not None and "libnvidia-ml.so.1" in facts.error, facts
    assert json.loads(log) == read_probe_document()  # what the probe says on this host, no more, no less

    failed = pod_runtime.wait_for_exit("deploykit-probe-no-wheel-probe", timeout=EXIT_TIMEOUT_S)
    failed_log = pod_runtime.logs("deploykit-probe-no-wheel-probe")
    assert failed.exit_code == 1, failed_log
    assert "ModuleNotFoundError: No module named 'deploykit'" in failed_log, failed_log
