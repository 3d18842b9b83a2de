"""`deploykit probe` on a cluster's GPU node: a one-shot Job whose log is the facts file.

A chart is rendered from the facts of the node it will run on (`--facts`); on a cluster nobody may log in to
that node. So `render probe-job` writes a batch/v1 Job that runs the probe there, in the vLLM image the
deployment will run (its facts then name that image's vLLM and torch), with deploykit carried as the chart
carries it: the plugin wheel in an immutable ConfigMap named by its digest, put on PYTHONPATH, and NVML read
through vLLM's own copy of pynvml where the image lacks nvidia-ml-py (vLLM's do). The pod asks for GPUs
like the chart's pod (NVML in a container sees the GPUs it was given, no more), runs under Pod Security
"restricted" with the chart's security contexts, once (restartPolicy Never, no retry), and is removed a
while after it ends. Its log holds the facts and nothing else: `kubectl logs job/NAME > F.json`.

The probe exits 4 when it reads no GPU and writes its facts all the same (their `error` says why); the Job
counts that as done, so `kubectl wait --for=condition=complete` returns either way and `render --facts`
refuses facts without a GPU for a GPU profile with that reason. Any other failure (deploykit not importable,
a crash) fails the Job with the probe's stderr in its log. Nothing here imports torch or vLLM.
"""

from __future__ import annotations

import base64
import re
from typing import Any

from pydantic import BaseModel

from deploykit.render.common import RenderedFile, RenderError, RenderResult, kubernetes_name
from deploykit.render.helm import (
    GPU_RESOURCE,
    PLUGIN_PATH,
    container_security_context,
    pod_security_context,
    to_yaml,
)
from deploykit.render.plugin_wheel import PluginWheel, build_plugin_wheel

DEFAULT_NAME = "deploykit-probe"
# Every probe Job of one deploykit shares one wheel ConfigMap (the same bytes, the same name); not the
# chart's `<release>-plugin-<digest>`, which Helm owns.
CONFIGMAP_PREFIX = "deploykit-probe-plugin-"
# One try: a second run on the same node reads the same GPUs. The deadline covers pulling a vLLM image
# (several GB) and waiting for a free GPU; the finished Job stays this long for `kubectl logs`.
BACKOFF_LIMIT = 0
ACTIVE_DEADLINE_S = 1800
TTL_AFTER_FINISHED_S = 3600
# A Python process that imports typer and reads NVML.
RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
MAX_GPUS = 64
# The container's program: `deploykit probe --format json`, in this process, with two things around it.
# pynvml: vLLM's images lack nvidia-ml-py, where deploykit gets the module (deploykit/probe/nvml_reader.py;
# tests/fixtures/vllm-image/), and carry vLLM's copy of that module, vllm/third_party/pynvml.py: loaded as
# `pynvml` from its file, since importing vllm would import torch. The log: the probe's stdout is the facts;
# its stderr is kept out of it unless it failed past "no GPU" (exit 4: the facts say why, and the pod ends 0),
# so the log parses as facts or shows why the Job failed.
PROBE_PROGRAM = """import contextlib, importlib.util, io, os, sys
try:
    import pynvml
except ImportError:
    vllm = importlib.util.find_spec("vllm")
    for root in (vllm.submodule_search_locations or []) if vllm else []:
        path = os.path.join(root, "third_party", "pynvml.py")
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("pynvml", path)
            sys.modules["pynvml"] = module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            break
from deploykit.cli import main
sys.argv = ["deploykit", "probe", "--format", "json"]
stderr = io.StringIO()
try:
    with contextlib.redirect_stderr(stderr):
        main()
except SystemExit as exc:
    if exc.code not in (None, 0, 4):
        sys.stderr.write(stderr.getvalue())
        raise
except BaseException:
    sys.stderr.write(stderr.getvalue())
    raise
"""

# Kubernetes' names (apimachinery's validation): a DNS-1123 label, a DNS-1123 subdomain (a node name), a
# label key's name part and a label value.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# An image reference as container runtimes parse it (the distribution project's grammar): an optional
# registry host[:port], lower-case path components, then a tag, a digest, or both.
_REFERENCE = re.compile(
    r"^(?:(?P<host>[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"(?::[0-9]+)?)/)?"
    r"(?P<path>[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?$"
)


class ProbeJob(BaseModel):
    """What the Job is made of, each field checked (`probe_job`)."""

    name: str
    image: str
    gpus: int = 1
    node: str | None = None
    node_selector: dict[str, str] = {}


def _checked_image(image: str) -> str:
    found = _REFERENCE.match(image)
    if found is None or len(image) > 4096:
        raise RenderError(
            f"--image {image[:80]!r}: not an image reference; give the vLLM image the deployment runs, "
            "e.g. vllm/vllm-openai:v0.32.0"
        )
    if found["tag"] is None and found["digest"] is None:
        raise RenderError(
            f"--image {image}: name its tag or digest (e.g. {image}:v0.32.0): the facts record the vLLM "
            "of that image, and the chart is rendered for it"
        )
    return image


def _checked_node(node: str) -> str:
    if len(node) > 253 or not _DNS_SUBDOMAIN.match(node):
        raise RenderError(
            f"--node {node[:80]!r}: not a node name (lower-case letters, digits, '-' and '.'; "
            "`kubectl get nodes` lists them)"
        )
    return node


def _checked_selector(pair: str) -> tuple[str, str]:
    key, sep, value = pair.partition("=")
    prefix, slash, label = key.rpartition("/")
    valid_key = bool(label) and len(label) <= 63 and _LABEL_NAME.match(label) is not None
    if slash:
        valid_key = valid_key and len(prefix) <= 253 and _DNS_SUBDOMAIN.match(prefix) is not None
    valid_value = value == "" or (len(value) <= 63 and _LABEL_NAME.match(value) is not None)
    if not sep or not valid_key or not valid_value:
        raise RenderError(
            f"--node-selector {pair[:120]!r}: expected KEY=VALUE with a node label's key and value "
            "(e.g. nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3)"
        )
    return key, value


def _checked_name(name: str) -> str:
    if len(name) > 63 or not _DNS_LABEL.match(name):
        raise RenderError(
            f"--name {name[:80]!r}: a Job's name is at most 63 lower-case letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return name


def probe_job(
    image: str,
    *,
    gpus: int = 1,
    node: str | None = None,
    node_selector: list[str] | None = None,
    name: str | None = None,
) -> ProbeJob:
    """The Job's parts from the command line, each refused with one line when Kubernetes would refuse it
    (or it could reach the manifest as anything but one value). The default name names the node."""
    if not 1 <= gpus <= MAX_GPUS:
        raise RenderError(
            f"--gpus {gpus}: give the number of GPUs the deployment uses on a node, 1 to {MAX_GPUS}"
        )
    selector: dict[str, str] = {}
    for pair in node_selector or []:
        key, value = _checked_selector(pair)
        if selector.get(key, value) != value:
            raise RenderError(f"--node-selector {key}: given twice with different values")
        selector[key] = value
    checked_node = _checked_node(node) if node is not None else None
    if name is None:
        name = DEFAULT_NAME if checked_node is None else kubernetes_name(f"{DEFAULT_NAME}-{checked_node}")
    return ProbeJob(
        name=_checked_name(name),
        image=_checked_image(image),
        gpus=gpus,
        node=checked_node,
        node_selector=selector,
    )


def configmap_name(wheel: PluginWheel) -> str:
    return CONFIGMAP_PREFIX + wheel.sha256[:12]


def _labels(job: ProbeJob) -> dict[str, str]:
    return {"app.kubernetes.io/name": DEFAULT_NAME, "app.kubernetes.io/instance": job.name}


def wheel_configmap(wheel: PluginWheel) -> dict[str, Any]:
    """The plugin wheel as the chart ships it (templates/helm/chart/templates/configmap-plugin.yaml)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(wheel),
            "labels": {"app.kubernetes.io/name": DEFAULT_NAME},
            # Over the 256 KiB client-side apply's last-applied annotation holds: apply it server-side.
            "annotations": {"deploykit.io/wheel-sha256": wheel.sha256},
        },
        "immutable": True,
        "binaryData": {wheel.filename: base64.b64encode(wheel.data).decode("ascii")},
    }


def _placement(job: ProbeJob) -> dict[str, Any]:
    """On GPU nodes (the GPU request, the GPU taint tolerated as the chart does), on one node by its name
    (`metadata.name`, as the DaemonSet controller pins pods: through the scheduler, which waits for a free
    GPU, where `nodeName` would skip it), or on nodes with the given labels."""
    placement: dict[str, Any] = {
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    }
    if job.node_selector:
        placement["nodeSelector"] = dict(job.node_selector)
    if job.node is not None:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [job.node]}]}
        placement["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
    return placement


def job_manifest(job: ProbeJob, wheel: PluginWheel) -> dict[str, Any]:
    """The Job: the probe in the vLLM image, deploykit from the wheel's ConfigMap, restricted, once."""
    wheel_dir = PLUGIN_PATH
    container = {
        "name": "probe",
        "image": job.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python3", "-c", PROBE_PROGRAM],
        "env": [
            {"name": "PYTHONPATH", "value": f"{wheel_dir}/{wheel.filename}"},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        ],
        # Extended resources are given as limits (the request is the same).
        "resources": {**RESOURCES, "limits": {**RESOURCES["limits"], GPU_RESOURCE: job.gpus}},
        "securityContext": container_security_context(read_only_root=True),
        "volumeMounts": [{"name": "deploykit-plugin", "mountPath": wheel_dir, "readOnly": True}],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job.name,
            "labels": _labels(job),
            "annotations": {"deploykit.io/wheel-sha256": wheel.sha256},
        },
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "activeDeadlineSeconds": ACTIVE_DEADLINE_S,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "template": {
                "metadata": {"labels": _labels(job)},
                "spec": {
                    "restartPolicy": "Never",
                    # The probe reads NVML only: no API token, no Service variables.
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": pod_security_context(),
                    **_placement(job),
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "deploykit-plugin",
                            "configMap": {
                                "name": configmap_name(wheel),
                                "items": [{"key": wheel.filename, "path": wheel.filename}],
                            },
                        }
                    ],
                },
            },
        },
    }


def _header(job: ProbeJob) -> str:
    """How to run it, in the file itself (docs/probe.md, "From a cluster", says more)."""
    return (
        f"# `deploykit probe` on a GPU node ({job.gpus} GPU(s)), a one-shot Job: its log is the facts file.\n"
        f"#   kubectl apply --server-side -f {job.name}.yaml\n"
        f"#   kubectl wait --for=condition=complete --timeout={ACTIVE_DEADLINE_S}s job/{job.name}\n"
        f"#   kubectl logs job/{job.name} > {job.name}.json\n"
        f"#   deploykit render helm -p PROFILE --facts {job.name}.json -o chart/\n"
        f"# Again: kubectl delete job {job.name} first (it goes {TTL_AFTER_FINISHED_S} s after it ends).\n"
    )


def render_probe_job(job: ProbeJob, wheel: PluginWheel | None = None) -> RenderResult:
    """`<name>.yaml`: the wheel's ConfigMap and the Job, applied together."""
    wheel = wheel or build_plugin_wheel()
    docs = [wheel_configmap(wheel), job_manifest(job, wheel)]
    text = _header(job) + "".join(f"---\n{to_yaml(doc)}\n" for doc in docs)
    return RenderResult(files=[RenderedFile(path=f"{job.name}.yaml", content=text)])
