"""Issue 30, point 6: every pod the chart makes (vLLM's Deployment and the `helm test` hook, with each plugin
source) is admissible under Pod Security "restricted" (the Kubernetes Pod Security Standards, v1.28+), with
the chart's own values and with a UID the namespace picks (OpenShift: runAsUser null, or any high UID); and
vLLM, run non-root, has a writable HOME and cache. The rules are checked by `restricted_violations` below,
written from the standard's text; a manifest shaped like the chart before this issue fails them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.profile_variants import profile_variant
from tests.render.test_helm import INDEX_SOURCE, LISTEN, URL_SOURCE, Chart, render_chart, template

# The volume types "restricted" allows; everything else (hostPath first) is refused.
ALLOWED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
    "secret",
}  # fmt: skip
OPENSHIFT = (
    *("--set", "podSecurityContext.runAsUser=null", "--set", "podSecurityContext.runAsGroup=null"),
    *("--set", "podSecurityContext.fsGroup=null"),
)
ARBITRARY_UID = (
    "--set",
    "podSecurityContext.runAsUser=1000770000",
    "--set",
    "podSecurityContext.fsGroup=1000770000",
)


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """What Pod Security "restricted" (which includes "baseline") refuses in one pod spec; [] = admitted."""
    found: list[str] = []
    pod = spec.get("securityContext") or {}
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            found.append(f"pod: {flag}")
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            found.append(f"volume {volume['name']}: {sorted(kinds)}")
    if pod.get("runAsUser") == 0:
        found.append("pod: runAsUser 0")
    pod_seccomp = (pod.get("seccompProfile") or {}).get("type")
    if pod_seccomp not in (None, "RuntimeDefault", "Localhost"):
        found.append(f"pod: seccompProfile {pod_seccomp}")
    containers = [*spec.get("initContainers", []), *spec.get("containers", [])]
    for container in containers:
        name = container["name"]
        context = container.get("securityContext") or {}
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation must be false")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{name}: capabilities must drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append(f"{name}: capabilities add {capabilities['add']}")
        non_root = context.get("runAsNonRoot", pod.get("runAsNonRoot"))
        if non_root is not True:
            found.append(f"{name}: runAsNonRoot must be true (pod or container)")
        if context.get("runAsUser") == 0:
            found.append(f"{name}: runAsUser 0")
        seccomp = (context.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{name}: seccompProfile must be RuntimeDefault or Localhost (pod or container)")
        for port in container.get("ports", []):
            if port.get("hostPort"):
                found.append(f"{name}: hostPort")
    return found


def pods(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod spec in the manifests: a Deployment's template and a bare Pod (the `helm test` hook)."""
    found = {}
    for doc in docs:
        if doc["kind"] == "Deployment":
            found["Deployment/" + doc["metadata"]["name"]] = doc["spec"]["template"]["spec"]
        elif doc["kind"] == "Pod":
            found["Pod/" + doc["metadata"]["name"]] = doc["spec"]
    return found


@pytest.fixture(scope="module")
def chart(tmp_path_factory: pytest.TempPathFactory, turing_facts: Path) -> Chart:
    directory = tmp_path_factory.mktemp("restricted")
    profile = profile_variant(directory, "gemma4-turing", LISTEN)
    return render_chart(profile, turing_facts, directory / "out")


@pytest.mark.external_tool  # helm template
@pytest.mark.parametrize(
    "options",
    [(), OPENSHIFT, ARBITRARY_UID, INDEX_SOURCE, URL_SOURCE, ("--set", "plugin.source=image")],
    ids=["defaults", "openshift-null-uid", "arbitrary-uid", "index", "url", "image"],
)
def test_every_pod_passes_pod_security_restricted(chart: Chart, options: tuple[str, ...]) -> None:
    found = pods(template(chart.root, *options))
    assert sorted(found)[0] == "Deployment/demo" and len(found) == 2, sorted(found)
    assert re.fullmatch(r"Pod/demo-smoke-[0-9a-f]{8}", sorted(found)[1]), sorted(found)  # the test hook too
    for name, spec in found.items():
        assert restricted_violations(spec) == [], name


def test_no_template_hard_codes_a_uid(chart: Chart) -> None:
    for path in (chart.root / "templates").rglob("*"):
        if path.is_file():
            assert "runAsUser" not in path.read_text(), path


@pytest.mark.external_tool  # helm template
def test_openshift_values_leave_the_uid_to_the_namespace(chart: Chart) -> None:
    for name, spec in pods(template(chart.root, *OPENSHIFT)).items():
        context = spec["securityContext"]
        assert "runAsUser" not in context and "fsGroup" not in context, name
        assert context["runAsNonRoot"] is True and context["seccompProfile"] == {"type": "RuntimeDefault"}
    for spec in pods(template(chart.root, *ARBITRARY_UID)).values():
        assert spec["securityContext"]["runAsUser"] == 1000770000


@pytest.mark.external_tool  # helm template
def test_vllm_has_a_writable_home_and_cache(chart: Chart) -> None:
    spec = pods(chart.manifests)["Deployment/demo"]
    vllm = next(c for c in spec["containers"] if c["name"] == "vllm")
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    mounts = {m["mountPath"]: m["name"] for m in vllm["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert env["HOME"] == chart.values["home"]["path"] and mounts[env["HOME"]] == "home"
    assert volumes["home"] == {"name": "home", "emptyDir": {}}  # writable by whatever UID runs it
    assert env["XDG_CACHE_HOME"] == chart.values["cache"]["path"] and mounts[env["XDG_CACHE_HOME"]] == "cache"


def test_the_checker_refuses_the_chart_as_it_was() -> None:
    """The vLLM container and the hook as they were before this issue: the checker must catch each gap."""
    before = {
        "securityContext": {},
        "volumes": [{"name": "cache", "emptyDir": {}}],
        "containers": [
            {
                "name": "vllm",
                "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            },
            {
                "name": "canary",
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "runAsNonRoot": True,
                    "runAsUser": 65534,
                    "capabilities": {"drop": ["ALL"]},
                },
            },
        ],
    }
    found = restricted_violations(before)
    assert "vllm: runAsNonRoot must be true (pod or container)" in found
    assert "vllm: seccompProfile must be RuntimeDefault or Localhost (pod or container)" in found
    assert "canary: seccompProfile must be RuntimeDefault or Localhost (pod or container)" in found
    assert restricted_violations({**before, "volumes": [{"name": "x", "hostPath": {"path": "/"}}]})
