"""A Helm chart (apiVersion v2) from a plan: values.yaml is generated, the chart's templates are shipped.

The Deployment's command is `.Values.command`, which is the plan's argv; the fix environment is the plan's
env. The chart's own templates are Helm (Go) templates copied verbatim: deploykit never renders them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from deploykit import net
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

if TYPE_CHECKING:
    from deploykit.plan import Plan
    from deploykit.profile.schema import LoadedProfile

CHART_VERSION = "0.1.0"
GPU_RESOURCE = "nvidia.com/gpu"
# GPU Feature Discovery (NVIDIA k8s-device-plugin) node labels.
LABEL_CC_MAJOR = "nvidia.com/gpu.compute.major"
LABEL_CC_MINOR = "nvidia.com/gpu.compute.minor"
LABEL_MEMORY = "nvidia.com/gpu.memory"
LABEL_FAMILY = "nvidia.com/gpu.family"
# deploykit's family names → GFD's `nvidia.com/gpu.family` values.
GFD_FAMILIES = {"ada": "ada-lovelace"}
PROBE_PERIOD_S = 10
SMOKE_IMAGE = "deploykit:0.1.0"
# Where the init container installs deploykit's plugin; the vLLM container has it on PYTHONPATH.
PLUGIN_PATH = "/opt/deploykit"
CANARY_PORT = 9400
CANARY_EVERY_S = 60
CANARY_MISS_LIMIT = 5


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so the profile in values.yaml reads like the profile."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _represent_str)


def to_yaml(value: Any) -> str:
    text: str = yaml.dump(value, Dumper=_BlockDumper, sort_keys=False, default_flow_style=False, width=110)
    return text.rstrip("\n")


def split_image(reference: str) -> tuple[str, str]:
    """`repo[:tag]` → (repo, tag); the tag defaults to latest, as for `docker pull`."""
    if "@" in reference:
        raise RenderError(f"deploy.image {reference!r}: use a tag, not a digest, for the chart")
    name, sep, tag = reference.rpartition(":")
    if not sep or "/" in tag:
        return reference, "latest"
    return name, tag


def node_affinity(plan: Plan, loaded: LoadedProfile) -> tuple[dict[str, Any], list[str]]:
    """Required node affinity on GFD labels: the compute capability the fixes were decided for."""
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
        return {}, warnings
    selector = {"nodeSelectorTerms": terms}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": selector}}, warnings


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


def canary_values() -> dict[str, Any]:
    """The canary sidecar and the timing of the probes that read it (docs/deploy.md justifies each).

    readiness: /healthz every 10 s, 3 failures: out of the Service within ~30 s of a wrong answer; a busy
    server never gets there (the canary answers from its own process, and turns 503 for misses only after
    canary.missLimit runs in a row, minutes, got no answer at all).
    liveness: /livez every 20 s, timeout 10 s, 3 failures: vLLM restarted ~60 s after a wrong answer, or
    when its /health stops answering (the canary asks it with a 5 s timeout), as the /health probe did."""
    return {
        "enabled": True,
        "image": SMOKE_IMAGE,
        "pullPolicy": "IfNotPresent",
        "port": CANARY_PORT,
        "every": CANARY_EVERY_S,
        "missLimit": CANARY_MISS_LIMIT,
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "readiness": {"periodSeconds": PROBE_PERIOD_S, "timeoutSeconds": 5, "failureThreshold": 3},
        "liveness": {"periodSeconds": 20, "timeoutSeconds": 10, "failureThreshold": 3},
    }


def smoke_secret_env(plan: Plan, loaded: LoadedProfile) -> dict[str, str]:
    """The API key under the name `deploykit smoke` reads, from the Secret key the server reads."""
    api_key_env = loaded.profile.serve.api_key_env
    if not api_key_env or "VLLM_API_KEY" not in plan.secret_env:
        return {}
    return {api_key_env: "VLLM_API_KEY"}


def plugin_values(plan: Plan) -> dict[str, Any]:
    """The init container that installs deploykit's plugin (only when the plan enables a fix)."""
    from deploykit import __version__

    return {
        "enabled": bool(plan.enabled_fixes),
        "image": "",
        "requirement": f"deploykit=={__version__}",
        "pipArgs": [],
        "path": PLUGIN_PATH,
    }


def chart_values(plan: Plan, loaded: LoadedProfile) -> tuple[dict[str, Any], list[str]]:
    from deploykit import __version__

    profile = loaded.profile
    name = kubernetes_name(profile.name)
    repository, tag = split_image(profile.deploy.image)
    count = gpu_count(plan, loaded)
    cache_path = profile.deploy.cache_dir.rstrip("/")
    affinity, warnings = node_affinity(plan, loaded) if count else ({}, [])
    env = {"HF_HOME": f"{cache_path}/huggingface", "VLLM_CACHE_ROOT": f"{cache_path}/vllm"}
    env.update(plain_env(plan))
    values: dict[str, Any] = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
        "replicaCount": profile.deploy.replicas,
        "strategy": {"type": "Recreate"},
        "command": list(plan.argv),
        "env": env,
        "secretEnv": {key: key for key in plan.secret_env},
        "secretName": f"{name}-secrets",
        "port": profile.serve.port,
        "service": {"type": "ClusterIP", "port": profile.serve.port},
        "resources": {"limits": {GPU_RESOURCE: count}} if count else {},
        "shm": {"enabled": profile.serve.tensor_parallel_size > 1, "sizeLimit": "16Gi"},
        "cache": {"path": cache_path, "existingClaim": ""},
        "affinity": affinity,
        "tolerations": (
            [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}] if count else []
        ),
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "probes": probes(profile.deploy.startup_timeout_s),
        "plugin": plugin_values(plan),
        "smokeTest": {
            "image": SMOKE_IMAGE,
            "pullPolicy": "IfNotPresent",
            "secretEnv": smoke_secret_env(plan, loaded),
            "expectFixes": ",".join(plan.enabled_fixes) or "none",
        },
        "canary": canary_values(),
        "profileYaml": loaded.path.read_text(),
        "deploykit": {"profile": profile.name, "profileId": loaded.id, "version": __version__},
    }
    return values, warnings


def chart_files(root: Path) -> list[RenderedFile]:
    """The chart's Helm templates and schema, copied byte for byte."""
    files = []
    for path in sorted(root.rglob("*")):
        if path.is_file():
            files.append(RenderedFile(path=str(path.relative_to(root)), content=path.read_text()))
    return files


def render_helm(plan: Plan, loaded: LoadedProfile) -> RenderResult:
    from deploykit import __version__

    profile = loaded.profile
    if plan.argv[:2] != ["vllm", "serve"]:
        raise RenderError(f"the plan's argv does not start with `vllm serve`: {plan.argv[:2]}")
    if not net.listens_beyond_loopback(profile.serve.host):
        raise RenderError(
            f"serve.host is {profile.serve.host}: inside a pod the Service cannot reach a loopback address. "
            "Set `serve: {host: 0.0.0.0}` in the profile (then `deploykit plan` shows the same argv)."
        )
    values, warnings = chart_values(plan, loaded)
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
        "values": values,
    }
    jinja = jinja_environment()
    jinja.filters["to_yaml"] = to_yaml
    files = [
        RenderedFile(path="Chart.yaml", content=jinja.get_template("helm/Chart.yaml.j2").render(context)),
        RenderedFile(path="values.yaml", content=jinja.get_template("helm/values.yaml.j2").render(context)),
        *chart_files(template_root() / "helm" / "chart"),
    ]
    # The chart is a directory named after it, as `helm create` makes it.
    files = [item.model_copy(update={"path": f"{chart_name}/{item.path}"}) for item in files]
    return RenderResult(files=files, warnings=[*plan.warnings, *warnings])
