"""The chart's canary sidecar and the probes that read it: the Service stops routing to a pod whose output
is corrupt and kubelet restarts vLLM, while a long model load or a busy server trips nothing."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from tests.render.test_helm import KUBERNETES_VERSIONS, Chart, charts, lint, run_helm, template

__all__ = ["charts"]  # the fixture, shared with test_helm.py


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def containers(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod_spec(docs)["containers"]}


def test_lint_strict_is_clean_with_and_without_the_canary(charts: dict[str, Chart]) -> None:
    root = charts["turing"].root
    for result in (lint(root), run_helm("lint", "--strict", str(root), "--set", "canary.enabled=false")):
        assert result.returncode == 0 and "[WARNING]" not in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_both_renderings_validate_against_kubernetes_schemas(charts: dict[str, Chart], version: str) -> None:
    for chart in charts.values():
        for doc in [*chart.manifests, *template(chart.root, "--set", "canary.enabled=false")]:
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_sidecar_runs_deploykit_canary_against_the_local_vllm(charts: dict[str, Chart]) -> None:
    chart = charts["turing"]
    found = containers(chart.manifests)
    assert list(found) == ["vllm", "canary"]  # vLLM stays the first container
    canary = found["canary"]
    port = chart.values["port"]
    canary_port = chart.values["canary"]["port"]
    assert canary["image"] == chart.values["smokeTest"]["image"]  # the deploykit image the smoke test uses
    assert canary["command"] == [
        "deploykit", "canary", "--url", f"http://127.0.0.1:{port}",
        "--profile", "/etc/deploykit/profile.yaml",
        "--listen", f"0.0.0.0:{canary_port}", "--every", "60", "--miss-limit", "5",
    ]  # fmt: skip
    assert canary["ports"] == [{"name": "canary", "containerPort": canary_port, "protocol": "TCP"}]
    env = {e["name"]: e for e in canary["env"]}
    assert env["DEPLOYKIT_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "VLLM_API_KEY"
    assert "resources" not in canary or "nvidia.com/gpu" not in str(canary["resources"])  # no GPU
    assert canary["securityContext"]["runAsNonRoot"] and canary["securityContext"]["readOnlyRootFilesystem"]
    volumes = {v["name"]: v for v in pod_spec(chart.manifests)["volumes"]}
    assert volumes["canary-profile"]["configMap"]["name"] == chart.one("ConfigMap")["metadata"]["name"]


def test_vllm_probes_read_the_canary_after_the_startup_probe(charts: dict[str, Chart]) -> None:
    chart = charts["turing"]
    vllm = containers(chart.manifests)["vllm"]
    canary_port = chart.values["canary"]["port"]
    startup, readiness, liveness = vllm["startupProbe"], vllm["readinessProbe"], vllm["livenessProbe"]
    # Model loading: vLLM's own /health, for the whole start-up time; the others wait for it.
    assert startup["httpGet"] == {"path": "/health", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    assert readiness["httpGet"] == {"path": "/healthz", "port": canary_port}
    assert liveness["httpGet"] == {"path": "/livez", "port": canary_port}
    # Out of the Service within ~30 s; restarted after ~60 s of corruption, never on one slow probe.
    assert readiness["periodSeconds"] * readiness["failureThreshold"] <= 30
    assert (
        liveness["failureThreshold"] >= 3 and liveness["periodSeconds"] * liveness["failureThreshold"] >= 60
    )
    # /livez asks vLLM's /health with a 5 s timeout: the probe waits longer than that.
    assert liveness["timeoutSeconds"] > 5 and readiness["timeoutSeconds"] >= 5


def test_canary_off_restores_the_health_probes_and_drops_the_sidecar(charts: dict[str, Chart]) -> None:
    docs = template(charts["turing"].root, "--set", "canary.enabled=false")
    found = containers(docs)
    assert list(found) == ["vllm"]
    assert found["vllm"]["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert found["vllm"]["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert all(not v["name"].startswith("canary") for v in pod_spec(docs)["volumes"])
