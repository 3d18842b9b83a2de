"""Pod Security "restricted" for the chart's pods: the check of one pod spec, and the exceptions a chart's
values take, named when `render helm` writes the chart.

A namespace that enforces the restricted profile (Pod Security Admission, `pod-security.kubernetes.io/
enforce: restricted`) refuses a pod that breaks any of its rules, and nothing in `helm install` says why
beforehand. The chart's own pods pass it (tests/render/test_pod_security.py), so what leaves it is a value:
a node-path model volume, a security context of the user's, an init container of the user's. An image
volume is admitted by restricted from Kubernetes 1.33 only, and it exists at all only where the
ImageVolume feature gate is on, which is by default from 1.35 (below).

`restricted_violations` is written from the Pod Security Standards page (kubernetes.io/docs/concepts/
security/pod-security-standards, the Baseline and Restricted tables), version by version where the
standard changed; user namespaces (`hostUsers: false`), which relax some rules, are not modelled: a pod
judged here without them is judged as strictly as the standard allows.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from deploykit import exit_codes

KubeVersion = tuple[int, int]

# The oldest Kubernetes the chart is checked against (its manifests validate against the 1.28 API schemas):
# `render helm` judges for it unless told the target (--kube-version), so a chart rendered without a target
# holds on every cluster it claims.
OLDEST_KUBERNETES: KubeVersion = (1, 28)

# The ImageVolume feature gate (kubernetes.io feature-gates page; KEP-4639): alpha and off in 1.31-1.32, beta
# and still off in 1.33-1.34, beta and on by default in 1.35, GA in 1.36. Off, the API server drops the field
# and the pod is refused for a volume without a source.
IMAGE_VOLUME_ALPHA: KubeVersion = (1, 31)
IMAGE_VOLUME_ON_BY_DEFAULT: KubeVersion = (1, 35)
# Pod Security admission's restricted level lists the volume types it admits; `image` joined the list in
# 1.33 (kubernetes/kubernetes#130394); before, an image volume is an unknown, refused type.
IMAGE_VOLUME_RESTRICTED: KubeVersion = (1, 33)

# Restricted: every volume must be one of these (the Volume Types control).
RESTRICTED_VOLUME_TYPES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
     "secret"}
)  # fmt: skip
# Baseline's Capabilities control: what may be added (restricted narrows it to NET_BIND_SERVICE).
BASELINE_CAPABILITIES = frozenset(
    {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
     "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
)  # fmt: skip
# Baseline's Sysctls control, each safe from the version that made it so.
SAFE_SYSCTLS: dict[str, KubeVersion] = {
    "kernel.shm_rmid_forced": (1, 0),
    "net.ipv4.ip_local_port_range": (1, 0),
    "net.ipv4.ip_unprivileged_port_start": (1, 0),
    "net.ipv4.tcp_syncookies": (1, 0),
    "net.ipv4.ping_group_range": (1, 0),
    "net.ipv4.ip_local_reserved_ports": (1, 27),
    "net.ipv4.tcp_keepalive_time": (1, 29),
    "net.ipv4.tcp_fin_timeout": (1, 29),
    "net.ipv4.tcp_keepalive_intvl": (1, 29),
    "net.ipv4.tcp_keepalive_probes": (1, 29),
}
# Baseline's SELinux control: the types a pod may ask for.
SELINUX_TYPES: dict[str, KubeVersion] = {
    "container_t": (1, 0),
    "container_init_t": (1, 0),
    "container_kvm_t": (1, 0),
    "container_engine_t": (1, 31),
}
# Baseline's Host Probes / Lifecycle Hooks control, from 1.34: no `host` in a probe's or hook's handler.
PROBE_HOST_FROM: KubeVersion = (1, 34)
_SECCOMP_ALLOWED = ("RuntimeDefault", "Localhost")
_HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?$")


class Violation(NamedTuple):
    """One broken rule: `subject` is `pod`, `container NAME` or `volume NAME`; `problem` says which rule."""

    subject: str
    problem: str

    def __str__(self) -> str:
        return f"{self.subject}: {self.problem}"


def parse_kube_version(text: str) -> KubeVersion:
    """`1.31`, `v1.31` or `1.31.2` → (1, 31); anything else, or a Kubernetes older than the chart's, is
    refused."""
    match = _VERSION.match(text.strip())
    if match is None or match.group(1) != "1":
        raise ValueError(f"--kube-version {text!r}: give the cluster's Kubernetes as MAJOR.MINOR, e.g. 1.33")
    version = (1, int(match.group(2)))
    if version < OLDEST_KUBERNETES:
        raise ValueError(
            f"--kube-version {text}: the chart supports Kubernetes {show(OLDEST_KUBERNETES)} and newer"
        )
    return version


def show(version: KubeVersion) -> str:
    return f"{version[0]}.{version[1]}"


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        *(spec.get("initContainers") or []),
        *(spec.get("containers") or []),
        *(spec.get("ephemeralContainers") or []),
    ]


def _baseline_container(container: dict[str, Any], version: KubeVersion) -> list[str]:
    context = container.get("securityContext") or {}
    found = []
    if (context.get("windowsOptions") or {}).get("hostProcess"):
        found.append("windowsOptions.hostProcess must be unset or false (HostProcess)")
    if context.get("privileged"):
        found.append("privileged must be unset or false (Privileged Containers)")
    added = set((context.get("capabilities") or {}).get("add") or [])
    if added - BASELINE_CAPABILITIES:
        found.append(f"capabilities.add {sorted(added - BASELINE_CAPABILITIES)} (Capabilities)")
    for port in container.get("ports") or []:
        if port.get("hostPort"):
            found.append(f"hostPort {port['hostPort']} (Host Ports)")
    found += _selinux(context.get("seLinuxOptions"), version)
    if context.get("procMount") not in (None, "Default"):
        found.append(f"procMount {context['procMount']} (/proc Mount Type)")
    if (context.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
        found.append(f"appArmorProfile {context['appArmorProfile']['type']} (AppArmor)")
    if (context.get("seccompProfile") or {}).get("type") == "Unconfined":
        found.append("seccompProfile Unconfined (Seccomp)")
    if version >= PROBE_HOST_FROM:
        found += _probe_hosts(container)
    return found


def _selinux(options: dict[str, Any] | None, version: KubeVersion) -> list[str]:
    options = options or {}
    found = []
    kind = options.get("type")
    if kind and SELINUX_TYPES.get(kind, (99, 0)) > version:
        found.append(f"seLinuxOptions.type {kind} (SELinux)")
    for key in ("user", "role"):
        if options.get(key):
            found.append(f"seLinuxOptions.{key} must be unset (SELinux)")
    return found


def _probe_hosts(container: dict[str, Any]) -> list[str]:
    handlers = [container.get(p) or {} for p in ("livenessProbe", "readinessProbe", "startupProbe")]
    handlers += [hook or {} for hook in (container.get("lifecycle") or {}).values()]
    found = []
    for handler in handlers:
        for kind in ("httpGet", "tcpSocket"):
            if (handler.get(kind) or {}).get("host"):
                found.append(f"{kind}.host in a probe or hook (Host Probes / Lifecycle Hooks)")
    return found


def _restricted_container(container: dict[str, Any], pod: dict[str, Any], linux: bool) -> list[str]:
    context = container.get("securityContext") or {}
    found = []
    if linux and context.get("allowPrivilegeEscalation") is not False:
        found.append("allowPrivilegeEscalation must be false (Privilege Escalation)")
    if context.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True:
        found.append("runAsNonRoot must be true, in the container or the pod (Running as Non-root)")
    if context.get("runAsUser") == 0:
        found.append("runAsUser 0 (Running as Non-root user)")
    seccomp = (context.get("seccompProfile") or pod.get("seccompProfile") or {}).get("type")
    if linux and seccomp not in (*_SECCOMP_ALLOWED, "Unconfined"):  # Unconfined: baseline's, named there
        found.append("seccompProfile must be RuntimeDefault or Localhost, container's or pod's (Seccomp)")
    if linux:
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append("capabilities.drop must include ALL (Capabilities)")
        # What baseline allows to be added but restricted does not (the rest is named by baseline's rule).
        added = sorted(set(capabilities.get("add") or []) & BASELINE_CAPABILITIES - {"NET_BIND_SERVICE"})
        if added:
            found.append(f"capabilities.add {added}: only NET_BIND_SERVICE may be added (Capabilities)")
    return found


def _volume_problem(volume: dict[str, Any], version: KubeVersion) -> str | None:
    kinds = sorted(set(volume) - {"name"})
    allowed = RESTRICTED_VOLUME_TYPES | ({"image"} if version >= IMAGE_VOLUME_RESTRICTED else set())
    if set(kinds) <= allowed:
        return None
    if "hostPath" in kinds:
        return "a node directory (hostPath), refused by baseline and restricted (HostPath Volumes)"
    if "image" in kinds:
        return f"an image volume, admitted by restricted from {show(IMAGE_VOLUME_RESTRICTED)} (Volume Types)"
    return f"volume type {', '.join(k for k in kinds if k not in allowed)} (Volume Types)"


def _pod_level(spec: dict[str, Any], version: KubeVersion) -> list[str]:
    """The rules on the pod spec itself and its securityContext."""
    pod = spec.get("securityContext") or {}
    pod_problems = [f"{flag} (Host Namespaces)" for flag in _HOST_NAMESPACES if spec.get(flag)]
    if (pod.get("windowsOptions") or {}).get("hostProcess"):
        pod_problems.append("windowsOptions.hostProcess (HostProcess)")
    pod_problems += _selinux(pod.get("seLinuxOptions"), version)
    if (pod.get("appArmorProfile") or {}).get("type") not in (None, "RuntimeDefault", "Localhost"):
        pod_problems.append(f"appArmorProfile {pod['appArmorProfile']['type']} (AppArmor)")
    if (pod.get("seccompProfile") or {}).get("type") == "Unconfined":
        pod_problems.append("seccompProfile Unconfined (Seccomp)")
    for sysctl in pod.get("sysctls") or []:
        if SAFE_SYSCTLS.get(sysctl.get("name", ""), (99, 0)) > version:
            pod_problems.append(f"sysctl {sysctl.get('name')} (Sysctls)")
    if pod.get("runAsNonRoot") is False:
        pod_problems.append("runAsNonRoot false (Running as Non-root)")
    if pod.get("runAsUser") == 0:
        pod_problems.append("runAsUser 0 (Running as Non-root user)")
    return pod_problems


def restricted_violations(spec: dict[str, Any], version: KubeVersion = OLDEST_KUBERNETES) -> list[Violation]:
    """What Pod Security "restricted" (which includes "baseline") refuses in one pod spec on Kubernetes
    `version`; [] = admitted."""
    pod = spec.get("securityContext") or {}
    linux = (spec.get("os") or {}).get("name") != "windows"
    found = [Violation("pod", problem) for problem in _pod_level(spec, version)]
    for volume in spec.get("volumes") or []:
        problem = _volume_problem(volume, version)
        if problem is not None:
            found.append(Violation(f"volume {volume.get('name')}", problem))
    for container in _containers(spec):
        subject = f"container {container.get('name')}"
        problems = _baseline_container(container, version) + _restricted_container(container, pod, linux)
        found += [Violation(subject, problem) for problem in problems]
    return found


def image_volume_needs(version: KubeVersion) -> str | None:
    """What an image volume needs that Kubernetes `version` does not give by default; None: nothing."""
    if version < IMAGE_VOLUME_ALPHA:
        return (
            f"Kubernetes {show(version)} has no image volumes (alpha from {show(IMAGE_VOLUME_ALPHA)}, "
            f"on by default from {show(IMAGE_VOLUME_ON_BY_DEFAULT)}): the pod is refused"
        )
    if version < IMAGE_VOLUME_ON_BY_DEFAULT:
        return (
            f"the ImageVolume feature gate is off by default on Kubernetes {show(version)} (alpha in "
            f"1.31-1.32, beta but off in 1.33-1.34, on from {show(IMAGE_VOLUME_ON_BY_DEFAULT)}): turn it on "
            "in the API server and every kubelet, and run a container runtime that mounts image volumes, or "
            "the pod is refused"
        )
    return None


class _ValuesPod(NamedTuple):
    """A pod spec as the chart's values make it, and which value each subject of it comes from."""

    spec: dict[str, Any]
    origin: dict[str, str]


def _values_pod(values: dict[str, Any]) -> _ValuesPod:
    """The vLLM pod as far as Pod Security sees the values: the pod's and containers' security contexts, the
    model volumes and extra volumes, the user's init containers. The chart's own volumes (emptyDir, the
    plugin's ConfigMap, the API key's Secret, the cache's PVC) are allowed types and left out."""
    origin = {"pod": "podSecurityContext", "container vllm": "securityContext"}
    volumes = []
    for index, entry in enumerate((values.get("model") or {}).get("volumes") or []):
        volumes.append({"name": entry["name"], **entry["source"]})
        origin[f"volume {entry['name']}"] = _model_volume(index, entry)
    for index, volume in enumerate(values.get("extraVolumes") or []):
        volumes.append(volume)
        origin[f"volume {volume.get('name')}"] = f"extraVolumes[{index}]"
    containers = [{"name": "vllm", "securityContext": values.get("securityContext")}]
    canary = values.get("canary") or {}
    if canary.get("enabled"):
        containers.append({"name": "canary", "securityContext": canary.get("securityContext")})
        origin["container canary"] = "canary.securityContext"
    init = []
    for index, container in enumerate(values.get("initContainers") or []):
        init.append(container)
        origin[f"container {container.get('name')}"] = f"initContainers[{index}] ({container.get('name')})"
    spec = {
        "securityContext": values.get("podSecurityContext"),
        "volumes": volumes,
        "initContainers": init,
        "containers": containers,
    }
    return _ValuesPod(spec, origin)


def _model_volume(index: int, entry: dict[str, Any]) -> str:
    """`model.volumes[0] (hostPath /srv/models)`: the value and what it mounts."""
    source = entry["source"]
    if "hostPath" in source:
        return f"model.volumes[{index}] (hostPath {source['hostPath'].get('path')})"
    if "image" in source:
        return f"model.volumes[{index}] (image {source['image'].get('reference')})"
    return f"model.volumes[{index}]"


def chart_exceptions(values: dict[str, Any], version: KubeVersion = OLDEST_KUBERNETES) -> list[str]:
    """One line per value that takes the chart's pod out of Pod Security "restricted" on Kubernetes
    `version`, and per image volume that `version` does not run by default."""
    pod = _values_pod(values)
    lines: dict[str, list[str]] = {}
    for violation in restricted_violations(pod.spec, version):
        where = pod.origin.get(violation.subject, violation.subject)
        lines.setdefault(where, []).append(violation.problem)
    smoke = (values.get("smokeTest") or {}).get("securityContext")
    smoke_pod = {"securityContext": values.get("podSecurityContext"), "containers": [{"name": "smoke",
                 "securityContext": smoke}]}  # fmt: skip
    for violation in restricted_violations(smoke_pod, version):
        if violation.subject != "pod":  # the pod's own context is named once, above
            lines.setdefault("smokeTest.securityContext", []).append(violation.problem)
    found = [
        f"Pod Security restricted (Kubernetes {show(version)}): {where}: {'; '.join(problems)}: a namespace "
        "that enforces restricted refuses the pod (docs/deploy.md, Pod Security)"
        for where, problems in lines.items()
    ]
    needs = image_volume_needs(version)
    for index, entry in enumerate((values.get("model") or {}).get("volumes") or []):
        if needs is not None and "image" in entry["source"]:
            found.append(f"{_model_volume(index, entry)}: {needs} (--kube-version names the target)")
    return found


def manifest_pods(docs: list[Any]) -> dict[str, dict[str, Any]]:
    """Every pod spec in rendered manifests, by `Kind/name`: Deployments', StatefulSets', DaemonSets', Jobs'
    and a LeaderWorkerSet's leader and worker templates, and bare Pods."""
    found: dict[str, dict[str, Any]] = {}
    for doc in docs:
        if not isinstance(doc, dict) or not isinstance(doc.get("spec"), dict):
            continue
        name = f"{doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
        spec = doc["spec"]
        if doc.get("kind") == "Pod":
            found[name] = spec
        elif doc.get("kind") == "LeaderWorkerSet":
            templates = spec.get("leaderWorkerTemplate") or {}
            for role in ("leader", "worker"):
                if f"{role}Template" in templates:
                    found[f"{name}/{role}"] = templates[f"{role}Template"].get("spec") or {}
        elif isinstance((spec.get("template") or {}).get("spec"), dict):
            found[name] = spec["template"]["spec"]
    return found


def main(argv: list[str] | None = None) -> int:
    """`helm template ... | python3 -m deploykit.render.pod_security [--kube-version 1.N]`: what restricted
    refuses in the rendered pods, values set at install included; exit 1 when anything is."""
    import argparse
    import sys

    import yaml

    parser = argparse.ArgumentParser(
        prog="python3 -m deploykit.render.pod_security", description=main.__doc__
    )
    parser.add_argument("--kube-version", default=show(OLDEST_KUBERNETES))
    options = parser.parse_args(argv)
    try:
        version = parse_kube_version(options.kube_version)
        docs = list(yaml.safe_load_all(sys.stdin))
    except (ValueError, yaml.YAMLError) as exc:
        print(f"pod_security: {str(exc).splitlines()[0]}", file=sys.stderr)
        return exit_codes.USAGE
    refused = 0
    for name, spec in manifest_pods(docs).items():
        for violation in restricted_violations(spec, version):
            print(f"{name}: {violation}")
            refused += 1
    return exit_codes.FAILED if refused else exit_codes.OK


if __name__ == "__main__":
    raise SystemExit(main())
