"""A Helm chart (apiVersion v2) from a plan: values.yaml is generated, the chart's templates are shipped.

The Deployment's command is `.Values.command`, which is the plan's argv; the fix environment is the plan's
env. A group that spans nodes is a LeaderWorkerSet instead, its leader's and workers' commands the same argv
with vLLM's node flags (`.Values.group`, deploykit.render.group_chart). The chart's own templates are Helm
(Go) templates copied verbatim: deploykit never renders them.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from deploykit import net
from deploykit.canary.known_hangs import hang_ids
from deploykit.canary.settings import DEFAULTS, helm_values
from deploykit.driver_cuda import with_driver_expression
from deploykit.render.common import (
    RenderedFile,
    RenderError,
    RenderResult,
    gpu_count,
    jinja_environment,
    kubernetes_name,
    plain_env,
    template_root,
)
from deploykit.render.gate import FACTS_FILE, facts_json, gate_values
from deploykit.render.group_chart import checked_group, group_values
from deploykit.render.model_source import (
    DOWNLOAD_PROGRAM,
    HUB_VOLUME_SIZE,
    download_program,
    model_values,
)
from deploykit.render.plugin_wheel import PluginWheel, build_plugin_wheel
from deploykit.render.pod_security import OLDEST_KUBERNETES, KubeVersion, chart_exceptions
from deploykit.vllm_removed import CHART_FILE as REMOVED_ENV_FILE
from deploykit.vllm_removed import chart_json as removed_env_json

if TYPE_CHECKING:
    from deploykit.plan import Plan
    from deploykit.profile.schema import LoadedProfile

# The chart's version is this base with SemVer 2 build metadata naming what was rendered (chart_version).
CHART_VERSION = "0.1.0"
CHART_DIGEST_HEX = 12
GPU_RESOURCE = "nvidia.com/gpu"
# GPU Feature Discovery (NVIDIA k8s-device-plugin) node labels.
LABEL_CC_MAJOR = "nvidia.com/gpu.compute.major"
LABEL_CC_MINOR = "nvidia.com/gpu.compute.minor"
LABEL_MEMORY = "nvidia.com/gpu.memory"
LABEL_FAMILY = "nvidia.com/gpu.family"
# deploykit's family names → GFD's `nvidia.com/gpu.family` values.
GFD_FAMILIES = {"ada": "ada-lovelace"}
PROBE_PERIOD_S = 10
# Where the pod sees deploykit: the bundled wheel's ConfigMap, or the folder an init container installs into.
PLUGIN_PATH = "/opt/deploykit"
# The chart's own copy of the plugin wheel, beside its templates (read by `.Files.Get`).
CHART_FILES_DIR = "files"
# A verdict file the canary has not rewritten for this long says nothing (a hung canary): several runs.
VERDICT_MAX_AGE_S = 600
# Kubernetes' default progress deadline (600 s) is shorter than a big model's load: the rollout may take
# the whole start-up window plus an image pull and scheduling before it counts as failed.
PROGRESS_MARGIN_S = 600
# How a rollout of more than one replica replaces pods: one at a time, no extra pod (a surge needs a spare
# GPU). The chart picks the strategy from replicaCount when the release is installed, so `--set
# replicaCount=3` rolls; the PodDisruptionBudget lets a drain take as many pods (docs/deploy.md, Replicas).
ROLLOUT = {"maxSurge": 0, "maxUnavailable": 1}
# What the vLLM container asks of its node besides GPUs, per GPU (tensor parallel runs one worker process
# per GPU, each loading its shard): the API server, the engine core and the workers, and host memory for
# loading weights. A CPU-only plan runs the tiny demo model.
VLLM_CPU_PER_GPU = 2
VLLM_MEMORY_GIB_PER_GPU = 8
VLLM_REQUESTS_CPU = {"cpu": "1", "memory": "2Gi"}
# The `helm test` pod: one HTTP client, in the (large) vLLM image.
SMOKE_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
# vLLM's processes (API server, engine core, workers) exchange requests and tensors through /dev/shm; a
# container's default 64 MiB is too small even for one process group (vLLM's CPU build asked for 160 MiB in
# the podman test), and tensor parallel workers need far more. Memory-backed: it counts as the pod's memory.
# Run non-root, vLLM needs a writable HOME (Triton, torch.compile, Hugging Face write under it): an emptyDir.
VLLM_HOME = "/home/vllm"
# The UID the chart runs as where the cluster assigns none (nobody); a value, so OpenShift can null it.
DEFAULT_UID = 65534
# The label Grafana's dashboard sidecar (kube-prometheus-stack's default) looks for on ConfigMaps.
DASHBOARD_SIDECAR_LABEL = {"grafana_dashboard": "1"}
SHM_SINGLE = "2Gi"
SHM_TP = "16Gi"
_VERSION_TAG = re.compile(r"^v?\d+\.\d+(\.\d+)?")


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so the profile in values.yaml reads like the profile."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _represent_str)


def to_yaml(value: Any) -> str:
    text: str = yaml.dump(value, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False, width=110)
    return text.rstrip("\n")


def kubernetes_literal(word: str) -> str:
    """`word` as Kubernetes must be given it in a container's command or env so the container sees it
    unchanged: Kubernetes expands `$(NAME)` there and reduces `$$` to `$`, so every `$` is doubled."""
    return word.replace("$", "$$")


def split_image(reference: str) -> tuple[str, str | None]:
    """`repo[:tag]` → (repo, tag or None)."""
    if "@" in reference:
        raise RenderError(f"deploy.image {reference!r}: use a tag, not a digest, for the chart")
    name, sep, tag = reference.rpartition(":")
    if not sep or "/" in tag:
        return reference, None
    return name, tag


def vllm_image(reference: str, vllm_version: str | None) -> tuple[str, str, list[str]]:
    """(repository, tag, warnings): the tag is the vLLM version the plan targeted, so the chart runs the
    release its decisions were made for (`plan` warns when it validated the argv with another release)."""
    from deploykit.vllm_compat import vllm_image_tag

    repository, tag = split_image(reference)
    if vllm_version is None:
        if tag is None or tag == "latest":
            raise RenderError(
                f"deploy.image {reference!r}: the plan targets no known vLLM version, so the chart cannot "
                "pick the image tag; set the profile's vllm_version or render with --facts that name one"
            )
        return (
            repository,
            tag,
            [f"the plan names no vLLM version: image tag {tag} is the profile's, unchecked"],
        )
    try:
        wanted = vllm_image_tag(vllm_version)
    except ValueError:
        raise RenderError(
            f"the plan targets vLLM {vllm_version!r}, which is no release version, so it names no image tag; "
            "set the profile's vllm_version to a release (e.g. 0.32.0)"
        ) from None
    if tag is None or tag == wanted:
        return repository, wanted, []
    if tag == "latest" or _VERSION_TAG.match(tag):
        raise RenderError(
            f"deploy.image {reference!r}: tag {tag} is not the vLLM {vllm_version} the plan targets; "
            f"drop the tag (the chart then uses {wanted}) or change "
            "vllm_version"
        )
    return repository, tag, [f"deploy.image {reference}: a custom tag; it must run vLLM {vllm_version}"]


def gpu_node_terms(plan: Plan, loaded: LoadedProfile) -> tuple[list[dict[str, Any]], list[str]]:
    """Required node-selector terms on GFD labels: the compute capability the fixes were decided for. The
    chart ANDs them with any node affinity of the user's own (templates/_helpers.tpl)."""
    requires = loaded.profile.requires
    memory: list[dict[str, Any]] = []
    if requires.min_memory_mib:
        memory = [{"key": LABEL_MEMORY, "operator": "Gt", "values": [str(requires.min_memory_mib - 1)]}]
    terms: list[dict[str, Any]] = []
    warnings: list[str] = []
    capabilities = sorted({gpu.compute_capability_tuple for gpu in plan.facts.gpus})
    for major, minor in capabilities:
        expressions = [
            {"key": LABEL_CC_MAJOR, "operator": "In", "values": [str(major)]},
            {"key": LABEL_CC_MINOR, "operator": "In", "values": [str(minor)]},
            *memory,
        ]
        terms.append({"matchExpressions": expressions})
    if not terms and requires.architectures:
        families = [GFD_FAMILIES.get(arch, arch) for arch in requires.architectures]
        terms.append(
            {"matchExpressions": [{"key": LABEL_FAMILY, "operator": "In", "values": families}, *memory]}
        )
        warnings.append("no GPU facts: node affinity from the profile's requires.architectures only")
    if not terms:
        warnings.append(
            "no GPU facts and no requires.architectures: the chart may land on any GPU node; "
            "render with --facts from the target GPU"
        )
        return [], warnings
    return terms, warnings


def vllm_resources(gpus: int) -> dict[str, Any]:
    """Requests that follow the GPU count (the plan's layout: GPUs per node, or requires.gpu_count): CPU
    and host memory per GPU worker, and the GPUs both requested and limited (Kubernetes wants them equal)."""
    if not gpus:
        return {"requests": dict(VLLM_REQUESTS_CPU)}
    requests = {
        "cpu": str(VLLM_CPU_PER_GPU * gpus),
        "memory": f"{VLLM_MEMORY_GIB_PER_GPU * gpus}Gi",
        GPU_RESOURCE: gpus,
    }
    return {"requests": requests, "limits": {GPU_RESOURCE: gpus}}


def probes(startup_timeout_s: int) -> dict[str, Any]:
    """/health probes: the startup probe covers model loading; the others only run after it succeeds."""

    def http(period: int, failures: int, timeout: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": period,
            "timeoutSeconds": timeout,
            "failureThreshold": failures,
        }

    return {
        "startup": http(PROBE_PERIOD_S, max(1, math.ceil(startup_timeout_s / PROBE_PERIOD_S)), 5),
        "readiness": http(PROBE_PERIOD_S, 3, 5),
        "liveness": http(20, 3, 10),
    }


def pod_security_context() -> dict[str, Any]:
    """Every pod of the chart (vLLM's, the `helm test` hook) under Pod Security "restricted": not root, the
    runtime's default seccomp profile. The UID is a value, never a template's: 65534 (nobody) where the
    cluster assigns none (the vLLM image would run as root); on OpenShift, whose namespaces assign a UID
    from their own range, set runAsUser, runAsGroup and fsGroup to null."""
    return {
        "runAsNonRoot": True,
        "runAsUser": DEFAULT_UID,
        "runAsGroup": DEFAULT_UID,
        "fsGroup": DEFAULT_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(*, read_only_root: bool) -> dict[str, Any]:
    """Every container's: no privilege escalation, no capabilities, not root, RuntimeDefault seccomp (the
    restricted rules hold even where the pod's context is changed). vLLM writes its image's Python caches
    and /tmp, so only the canary and the smoke test also get a read-only root."""
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    if read_only_root:
        context["readOnlyRootFilesystem"] = True
    return context


def canary_values(known_hangs: list[str] | None = None) -> dict[str, Any]:
    """The canary sidecar and the timing of the vLLM probes that read its verdict (docs/deploy.md).

    The canary writes its verdict to a file on a shared emptyDir; vLLM's readiness and liveness are exec
    probes in the vLLM container (`python3 -m deploykit.render.pod_probe`) that ask vLLM's own /health
    and read that file. A missing or stuck canary leaves no fresh verdict, so it can never fail vLLM's
    liveness; a fresh `corrupt` or `hung` verdict fails both (out of the Service within ~30 s, vLLM
    restarted after ~60 s), an `unreachable` or `unknown` one (a canary that stopped or crashed) only
    readiness."""
    return {
        "enabled": True,
        "image": "",
        "pullPolicy": "IfNotPresent",
        **helm_values(DEFAULTS),  # `every`, `missLimit`, `port`: the canary's own defaults (HELM_KEYS)
        "verdictMaxAgeSeconds": VERDICT_MAX_AGE_S,
        # The hang advisories the plan matched, for the `hung` verdict to name (--known-hang).
        "knownHangs": list(known_hangs or []),
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": container_security_context(read_only_root=True),
        "readiness": {"periodSeconds": PROBE_PERIOD_S, "timeoutSeconds": 10, "failureThreshold": 3},
        "liveness": {"periodSeconds": 20, "timeoutSeconds": 10, "failureThreshold": 3},
    }


def smoke_secret_env(plan: Plan, loaded: LoadedProfile) -> dict[str, str]:
    """The API key under the name `deploykit smoke` reads, from the Secret key the server reads."""
    api_key_env = loaded.profile.serve.api_key_env
    if not api_key_env or "VLLM_API_KEY" not in plan.secret_env:
        return {}
    return {api_key_env: "VLLM_API_KEY"}


def plugin_values(wheel: PluginWheel) -> dict[str, Any]:
    """How deploykit reaches the pod. `bundled` (default): the wheel inside the chart, from a ConfigMap,
    on PYTHONPATH: nothing fetched. The others are opt-in: `index` (a private index whose URL, credentials
    included, comes from a Secret), `url` (one wheel by URL, pip --require-hashes), `image` (a derived
    image with deploykit installed: docker/Dockerfile.vllm)."""
    from deploykit import DISTRIBUTION, __version__

    return {
        "source": "bundled",
        "wheel": {"file": wheel.filename, "sha256": wheel.sha256},
        "path": PLUGIN_PATH,
        "index": {
            "secretName": "",
            "secretKey": "index-url",
            "requirement": f"{DISTRIBUTION}=={__version__}",
        },
        "url": {"url": "", "sha256": ""},
    }


def chart_values(plan: Plan, loaded: LoadedProfile, wheel: PluginWheel) -> tuple[dict[str, Any], list[str]]:
    from deploykit import __version__

    profile = loaded.profile
    name = kubernetes_name(profile.name)
    repository, tag, warnings = vllm_image(profile.deploy.image, plan.vllm_version)
    count = gpu_count(plan, loaded)
    cache_path = profile.deploy.cache_dir.rstrip("/")
    terms, affinity_warnings = gpu_node_terms(plan, loaded) if count else ([], [])
    terms = with_driver_expression(terms, plan.vllm_version)  # nodes whose driver runs the wheel's CUDA
    env = {"HF_HOME": f"{cache_path}/huggingface", "VLLM_CACHE_ROOT": f"{cache_path}/vllm"}
    env.update({key: kubernetes_literal(value) for key, value in plain_env(plan).items()})
    resources = vllm_resources(count)
    model, model_warnings = model_values(plan, loaded)
    command = [kubernetes_literal(word) for word in plan.argv]
    values: dict[str, Any] = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
        "imagePullSecrets": [],
        "replicaCount": profile.deploy.replicas,
        "rollout": dict(ROLLOUT),
        "progressDeadlineSeconds": profile.deploy.startup_timeout_s + PROGRESS_MARGIN_S,
        "command": command,
        "env": env,
        "extraEnv": [],
        "secretEnv": {key: key for key in plan.secret_env},
        "secretName": f"{name}-secrets",
        "port": profile.serve.port,
        "service": {"type": "ClusterIP", "port": profile.serve.port, "annotations": {}},
        "resources": resources,
        "model": model,
        "extraVolumes": [],
        "extraVolumeMounts": [],
        "initContainers": [],
        # Platform fields (docs/deploy.md, Extension points): each where Kubernetes expects it.
        "topologySpreadConstraints": [],
        "terminationGracePeriodSeconds": None,  # Kubernetes' own (30 s)
        "envFrom": [],
        "extraObjects": [],
        "enableServiceLinks": False,
        "shm": {
            "enabled": True,
            "sizeLimit": SHM_TP if count > 1 else SHM_SINGLE,
        },
        # A model from the hub lands in the cache: on a claim ("auto": while the release is one pod) it is
        # fetched once, not at every pod start; otherwise an emptyDir of sizeLimit (templates/_pod.tpl).
        "cache": {
            "path": cache_path,
            "existingClaim": "",
            "persistence": {
                "enabled": False if model["offline"] else "auto",
                "size": HUB_VOLUME_SIZE,
                "storageClassName": "",
                "accessModes": ["ReadWriteOnce"],
            },
            "sizeLimit": HUB_VOLUME_SIZE,
        },
        "gpuNodeSelectorTerms": terms,
        # gfd: the terms above (GPU Feature Discovery's labels); none: the user's own placement only.
        "gpuNodeSelection": "gfd",
        "affinity": {},
        "nodeSelector": {},
        "gpuTolerations": (
            [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}] if count else []
        ),
        "tolerations": [],
        "podAnnotations": {},
        "podLabels": {},
        "serviceAccountName": "",
        "priorityClassName": "",
        "runtimeClassName": "",
        "podSecurityContext": pod_security_context(),
        "securityContext": container_security_context(read_only_root=False),
        "home": {"path": VLLM_HOME},
        "probes": probes(profile.deploy.startup_timeout_s),
        "plugin": plugin_values(wheel),
        "canary": canary_values(hang_ids(plan.advisories)),
        "smokeTest": {
            "image": "",
            "pullPolicy": "IfNotPresent",
            "secretEnv": smoke_secret_env(plan, loaded),
            "expectFixes": ",".join(plan.enabled_fixes) or "none",
            "securityContext": container_security_context(read_only_root=True),
            "resources": SMOKE_RESOURCES,
            "nodeSelector": {},
            "tolerations": [],
            "affinity": {},
        },
        "podDisruptionBudget": {"enabled": False},
        # The upgrade gate (deploykit.render.gate; templates/_gate.tpl): both forms off.
        "gate": gate_values(profile.deploy.startup_timeout_s),
        "metrics": {
            "podMonitor": {"enabled": False, "interval": "30s", "labels": {}},
            "serviceMonitor": {"enabled": False, "interval": "30s", "labels": {}},
            "prometheusRule": {"enabled": False, "labels": {}},
            "grafanaDashboard": {
                "enabled": False,
                "labels": dict(DASHBOARD_SIDECAR_LABEL),
                "annotations": {},
            },
        },
        "profileYaml": loaded.path.read_text(),
        "deploykit": {
            "profile": profile.name,
            "profileId": loaded.id,
            "version": __version__,
            "vllmVersion": plan.vllm_version or "unknown",
            "advisories": ",".join(f"{a.id}={a.outcome}" for a in plan.advisories),
        },
    }
    group = group_values(plan, loaded, command)
    if group is not None:  # a group over several nodes: a LeaderWorkerSet (templates/leaderworkerset.yaml)
        values["group"] = group
    return values, [*warnings, *affinity_warnings, *model_warnings, *checked_group(plan)]


def monitoring_files() -> list[RenderedFile]:
    """The canary's alert rules and Grafana dashboard under files/, read by templates/prometheusrule.yaml
    and templates/grafana-dashboard.yaml (`.Files.Get`: Helm never templates them, so Prometheus's and
    Grafana's own `{{ }}` stay as written): the same bytes as `render systemd` writes."""
    from deploykit.render import alerts, dashboard

    return [
        RenderedFile(path=f"{CHART_FILES_DIR}/{alerts.RULES_FILE}", content=alerts.rules_yaml()),
        RenderedFile(
            path=f"{CHART_FILES_DIR}/{dashboard.DASHBOARD_FILE}", content=dashboard.dashboard_json()
        ),
    ]


def chart_files(root: Path) -> list[RenderedFile]:
    """The chart's Helm templates and schema, copied byte for byte."""
    files = []
    for path in sorted(root.rglob("*")):
        if path.is_file():
            files.append(RenderedFile(path=str(path.relative_to(root)), content=path.read_text()))
    return files


def chart_version(files: list[RenderedFile]) -> str:
    """`CHART_VERSION+<digest>`: SemVer 2 build metadata naming the rendered chart (every file, Chart.yaml
    with its version bare), so tools that cache a chart by its version (Flux's default ChartVersion
    strategy, chart repositories, Argo CD's repo server) see each new render and the same render is the same
    version. Build metadata has no precedence, as renders have no order; helm turns `+` into `_` in an OCI
    tag and back, and the labels carry it as `_` (deploykit.chartLabel). docs/deploy.md, GitOps."""
    digest = hashlib.sha256()
    for item in sorted(files, key=lambda f: f.path):
        data = item.content.encode() if isinstance(item.content, str) else item.content
        digest.update(b"%s\0%d\0" % (item.path.encode(), len(data)))
        digest.update(data)
    return f"{CHART_VERSION}+{digest.hexdigest()[:CHART_DIGEST_HEX]}"


def render_helm(
    plan: Plan, loaded: LoadedProfile, kube_version: KubeVersion = OLDEST_KUBERNETES
) -> RenderResult:
    """The chart; its warnings name each value that takes the pod out of Pod Security "restricted" on
    Kubernetes `kube_version` (deploykit.render.pod_security)."""
    from deploykit import __version__

    profile = loaded.profile
    if plan.argv[:2] != ["vllm", "serve"]:
        raise RenderError(f"the plan's argv does not start with `vllm serve`: {plan.argv[:2]}")
    if not net.listens_beyond_loopback(profile.serve.host):
        raise RenderError(
            f"serve.host is {profile.serve.host}: inside a pod the Service cannot reach a loopback address. "
            "Set `serve: {host: 0.0.0.0}` in the profile (then `deploykit plan` shows the same argv)."
        )
    wheel = build_plugin_wheel()
    values, warnings = chart_values(plan, loaded, wheel)
    warnings += chart_exceptions(values, kube_version)
    chart_name = kubernetes_name(profile.name)
    context = {
        "deploykit_version": __version__,
        "profile_name": profile.name,
        "profile_id": loaded.id,
        "chart_name": chart_name,
        "chart_version": CHART_VERSION,
        "app_version": values["image"]["tag"],
        "description": f"vLLM serving {profile.served_name} (deploykit profile {profile.name})",
        "facts_source": plan.facts.source if plan.facts.gpus else "no GPU",
        "vllm_version": plan.vllm_version or "unknown",
        "startup_timeout_s": profile.deploy.startup_timeout_s,
        "wheel_kib": round(wheel.size_kib),
        "facts_file": FACTS_FILE,
        "values": values,
    }
    jinja = jinja_environment()
    jinja.filters["to_yaml"] = to_yaml
    files = [
        RenderedFile(path="Chart.yaml", content=jinja.get_template("helm/Chart.yaml.j2").render(context)),
        RenderedFile(path="values.yaml", content=jinja.get_template("helm/values.yaml.j2").render(context)),
        *chart_files(template_root() / "helm" / "chart"),
        RenderedFile(path=f"{CHART_FILES_DIR}/{wheel.filename}", content=wheel.data),
        *monitoring_files(),
        # The download init container's program (templates/_helpers.tpl, deploykit.modelDownload).
        RenderedFile(path=f"{CHART_FILES_DIR}/{DOWNLOAD_PROGRAM}", content=download_program()),
        # The facts the chart was rendered from: the gate's --facts (templates/configmap-gate.yaml).
        RenderedFile(path=f"{CHART_FILES_DIR}/{FACTS_FILE}", content=facts_json(plan)),
        # The variables the chart's vLLM no longer reads: templates/_removed_env.tpl refuses them in extraEnv.
        RenderedFile(
            path=f"{CHART_FILES_DIR}/{REMOVED_ENV_FILE}", content=removed_env_json(plan.vllm_version)
        ),
    ]
    # Chart.yaml again, its version naming every file above (chart_version): keep this after the last one.
    chart_yaml = jinja.get_template("helm/Chart.yaml.j2")
    versioned = chart_yaml.render({**context, "chart_version": chart_version(files)})
    files = [
        item.model_copy(update={"content": versioned}) if item.path == "Chart.yaml" else item
        for item in files
    ]
    # The chart is a directory named after it, as `helm create` makes it.
    files = [item.model_copy(update={"path": f"{chart_name}/{item.path}"}) for item in files]
    # The pod runs the profile's release (the image tag), never a host's installed vLLM: that warning is not
    # the chart's.
    from deploykit.plan import host_vllm_warning

    host_only = host_vllm_warning(plan)
    return RenderResult(files=files, warnings=[*(w for w in plan.warnings if w != host_only), *warnings])
