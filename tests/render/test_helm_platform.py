"""What a platform team sets on the chart: pod fields, scheduling merged with the GPU affinity the facts
give, a PVC for the caches, a PodDisruptionBudget, Prometheus monitors; and the image tag that is the
plan's vLLM."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.render.conftest import deploykit
from tests.render.test_helm import (
    A10_NODE,
    H100_NODE,
    KUBERNETES_VERSIONS,
    T4_NODE,
    Chart,
    charts,
    node_matches,
    pod_of,
    run_helm,
    template,
)

__all__ = ["charts"]  # the fixture, shared with test_helm.py

POD_FIELDS = {
    "imagePullSecrets": [{"name": "mirror-credentials"}],
    "nodeSelector": {"pool": "inference"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
    "podAnnotations": {"team": "ml-platform"},
    "podLabels": {"cost-center": "4711"},
    "serviceAccountName": "vllm-runner",
    "priorityClassName": "inference-critical",
    "runtimeClassName": "nvidia",
    "podSecurityContext": {"fsGroup": 2000, "seccompProfile": {"type": "RuntimeDefault"}},
    # The user's own required node affinity: a node pool label. The chart ANDs it with the GPU terms.
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}
                ]
            }
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "demo"}},
                    },
                }
            ]
        },
    },
    "cache": {"persistence": {"enabled": True, "size": "200Gi", "storageClassName": "fast-ssd"}},
    "podDisruptionBudget": {"enabled": True},
    "metrics": {
        "podMonitor": {"enabled": True},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
    },
}
MONITOR_KINDS = {"PodMonitor", "ServiceMonitor"}  # Prometheus Operator CRDs: not in Kubernetes' schemas


@pytest.fixture(scope="module")
def platform_docs(charts: dict[str, Chart], tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    values = tmp_path_factory.mktemp("values") / "platform.yaml"
    values.write_text(json.dumps(POD_FIELDS))  # JSON is YAML
    return template(charts["turing"].root, "-f", str(values))


def test_standard_pod_fields_reach_the_pod(platform_docs: list[dict[str, Any]]) -> None:
    (deployment,) = [d for d in platform_docs if d["kind"] == "Deployment"]
    metadata = deployment["spec"]["template"]["metadata"]
    spec = pod_of(platform_docs)
    assert metadata["annotations"]["team"] == "ml-platform" and metadata["labels"]["cost-center"] == "4711"
    # The selector stays the chart's: a label of the user's cannot orphan the ReplicaSet.
    assert "cost-center" not in deployment["spec"]["selector"]["matchLabels"]
    for key in (
        "imagePullSecrets",
        "nodeSelector",
        "serviceAccountName",
        "priorityClassName",
        "runtimeClassName",
    ):
        assert spec[key] == POD_FIELDS[key], key
    # Helm merges the user's map into the chart's (restricted: not root, RuntimeDefault); the user's keys win.
    from deploykit.render.helm import pod_security_context

    assert spec["securityContext"] == {**pod_security_context(), **POD_FIELDS["podSecurityContext"]}
    # The GPU toleration the facts need stays, the user's is added.
    keys = [t["key"] for t in spec["tolerations"]]
    assert keys == ["nvidia.com/gpu", "dedicated"]
    (smoke,) = [d for d in platform_docs if d["kind"] == "Pod"]
    assert smoke["spec"]["imagePullSecrets"] == POD_FIELDS["imagePullSecrets"]


def test_user_node_affinity_is_anded_with_the_gpu_terms(platform_docs: list[dict[str, Any]]) -> None:
    affinity = pod_of(platform_docs)["affinity"]
    assert node_matches(affinity, {**T4_NODE, "pool": "a"})
    assert not node_matches(affinity, T4_NODE)  # the user's pool is required too
    assert not node_matches(affinity, {**H100_NODE, "pool": "a"})  # and so is the Turing GPU
    assert not node_matches(affinity, {**A10_NODE, "pool": "a"})
    # A T4 node whose driver (a 470) cannot run the vLLM wheel's CUDA 12 (issue 34): vLLM would not start.
    old_driver = {**T4_NODE, "pool": "a", "nvidia.com/cuda.driver-version.major": "470"}
    assert not node_matches(affinity, old_driver)
    assert affinity["podAntiAffinity"] == POD_FIELDS["affinity"]["podAntiAffinity"]


def test_optional_objects_are_valid_kubernetes(platform_docs: list[dict[str, Any]]) -> None:
    kinds = {d["kind"]: d for d in platform_docs}
    assert set(kinds) == {"Deployment", "Service", "ConfigMap", "Pod", "PersistentVolumeClaim",
                          "PodDisruptionBudget", "PodMonitor", "ServiceMonitor"}  # fmt: skip
    claim = kinds["PersistentVolumeClaim"]
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "200Gi"
    volumes = {v["name"]: v for v in pod_of(platform_docs)["volumes"]}
    assert volumes["cache"] == {"name": "cache", "persistentVolumeClaim": {"claimName": "demo-cache"}}
    assert kinds["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
    for doc in platform_docs:
        if doc["kind"] not in MONITOR_KINDS:
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)


def test_monitors_scrape_vllm_and_the_canary(platform_docs: list[dict[str, Any]]) -> None:
    kinds = {d["kind"]: d for d in platform_docs}
    pod_ports = {p["name"] for c in pod_of(platform_docs)["containers"] for p in c["ports"]}
    service_ports = {p["name"] for p in kinds["Service"]["spec"]["ports"]}
    pod_monitor = kinds["PodMonitor"]
    assert pod_monitor["apiVersion"] == "monitoring.coreos.com/v1"
    endpoints = pod_monitor["spec"]["podMetricsEndpoints"]
    assert [(e["port"], e["path"]) for e in endpoints] == [("http", "/metrics"), ("canary", "/metrics")]
    assert {e["port"] for e in endpoints} <= pod_ports
    service_monitor = kinds["ServiceMonitor"]
    assert service_monitor["metadata"]["labels"]["release"] == "kps"
    assert {e["port"] for e in service_monitor["spec"]["endpoints"]} <= service_ports
    selector = service_monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= kinds["Service"]["metadata"]["labels"].items()


def test_off_by_default(charts: dict[str, Chart]) -> None:
    kinds = {d["kind"] for d in charts["turing"].manifests}
    assert kinds == {"Deployment", "Service", "ConfigMap", "Pod", "PersistentVolumeClaim"}  # the hub cache


def test_a_budget_of_its_own_is_refused(charts: dict[str, Chart]) -> None:
    """The budget follows the rollout (docs/deploy.md, Scaling out): a `minAvailable` of its own could block
    every drain of a one-replica release (50% of 1 rounds up to 1), so the schema refuses it by name."""
    result = run_helm(
        "template", "demo", str(charts["turing"].root),
        "--set", "podDisruptionBudget.enabled=true", "--set", "podDisruptionBudget.minAvailable=50%",
    )  # fmt: skip
    assert result.returncode != 0 and "minAvailable" in result.stderr, result.stdout[-2000:]


def render(profile: Path, facts: Path, out: Path) -> Any:
    out.mkdir(parents=True, exist_ok=True)
    return deploykit(
        "render", "helm", "-p", str(profile), "--facts", str(facts), "--out", str(out), check=False
    )


def test_the_image_tag_is_the_vllm_the_plan_targets(
    turing_facts: Path, tmp_path: Path, make_profile: Callable[[str, dict[str, Any]], Path]
) -> None:
    """One fact: the facts say vLLM 0.33.0, so the chart runs v0.33.0; the profile may pin the version."""
    open_profile = {"serve.host": "0.0.0.0"}
    chart = Chart(Path(render(make_profile("gemma4-turing", open_profile), turing_facts, tmp_path / "a")
                       .stdout.splitlines()[0]).parent, {})  # fmt: skip
    assert chart.values["image"] == {
        "repository": "vllm/vllm-openai",
        "tag": "v0.33.0",
        "pullPolicy": "IfNotPresent",
    }
    pinned = make_profile("gemma4-turing", {**open_profile, "vllm_version": "0.32.1"})
    chart = Chart(Path(render(pinned, turing_facts, tmp_path / "b").stdout.splitlines()[0]).parent, {})
    assert chart.values["image"]["tag"] == "v0.32.1" and chart.values["deploykit"]["vllmVersion"] == "0.32.1"


def test_an_image_tag_of_another_vllm_is_refused(
    turing_facts: Path, tmp_path: Path, make_profile: Callable[[str, dict[str, Any]], Path]
) -> None:
    for tag in ("v0.32.0", "latest"):
        profile = make_profile(
            "gemma4-turing", {"serve.host": "0.0.0.0", "deploy.image": f"vllm/vllm-openai:{tag}"}
        )
        out = tmp_path / tag
        result = render(profile, turing_facts, out)
        assert result.returncode == 2, result.stderr
        assert f"tag {tag} is not the vLLM 0.33.0 the plan targets" in result.stderr
        assert "Traceback" not in result.stderr and not any(out.iterdir())


def test_a_custom_tag_is_kept_with_a_warning(
    turing_facts: Path, tmp_path: Path, make_profile: Callable[[str, dict[str, Any]], Path]
) -> None:
    """A derived image (docker/Dockerfile.vllm) has a tag of its own: kept, with what to check."""
    image = "registry.internal/vllm-deploykit:2026-12-build3"
    profile = make_profile("gemma4-turing", {"serve.host": "0.0.0.0", "deploy.image": image})
    result = render(profile, turing_facts, tmp_path / "c")
    assert result.returncode == 0, result.stderr
    assert "a custom tag; it must run vLLM 0.33.0" in result.stderr
    chart = Chart(Path(result.stdout.splitlines()[0]).parent, {})
    assert chart.values["image"]["tag"] == "2026-12-build3"


def test_a_target_that_is_no_release_names_no_image(
    turing_facts: Path, tmp_path: Path, make_profile: Callable[[str, dict[str, Any]], Path]
) -> None:
    profile = make_profile("gemma4-turing", {"serve.host": "0.0.0.0", "vllm_version": "main"})
    out = tmp_path / "main"
    result = render(profile, turing_facts, out)
    assert result.returncode == 2 and "vLLM 'main', which is no release version" in result.stderr
    assert "Traceback" not in result.stderr and not any(out.iterdir())
