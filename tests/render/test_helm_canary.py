"""The chart's canary sidecar and the probes that read its verdict: the Service stops routing to a pod whose
output is corrupt and kubelet restarts vLLM, while a long model load, a busy server or a broken canary trips
nothing. The probes' decisions themselves (the failure table) are tested in tests/render/test_pod_probe.py."""

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
    assert canary["image"] == found["vllm"]["image"]  # the image the pod pulls anyway, with the chart's wheel
    assert canary["command"][:8] == KEEPER  # through its keeper (issue 34)
    assert canary["command"][8:] == [
        "python3", "-m", "deploykit", "canary", "--url", f"http://127.0.0.1:{port}",
        "--profile", "/etc/deploykit/profile.yaml",
        "--listen", f"0.0.0.0:{canary_port}", "--every", "60", "--miss-limit", "5",
        "--verdict-file", "/run/deploykit/verdict.json", "--no-store", "--keep-running",
        "--api-key-file", "/etc/deploykit-key/api-key",
    ]  # fmt: skip
    assert canary["ports"] == [{"name": "canary", "containerPort": canary_port, "protocol": "TCP"}]
    env = {e["name"]: e for e in canary["env"]}
    assert env["DEPLOYKIT_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "VLLM_API_KEY"
    assert "resources" not in canary or "nvidia.com/gpu" not in str(canary["resources"])  # no GPU
    assert canary["securityContext"]["runAsNonRoot"] and canary["securityContext"]["readOnlyRootFilesystem"]
    volumes = {v["name"]: v for v in pod_spec(chart.manifests)["volumes"]}
    assert volumes["canary-profile"]["configMap"]["name"] == "demo-profile"
    # The verdict file: written by the canary, read (only) by the vLLM container's probes.
    assert volumes["canary-verdict"] == {"name": "canary-verdict", "emptyDir": {}}
    mounts = {c: {m["name"]: m for m in found[c]["volumeMounts"]} for c in found}
    assert mounts["canary"]["canary-verdict"] == {"name": "canary-verdict", "mountPath": "/run/deploykit"}
    assert mounts["vllm"]["canary-verdict"]["readOnly"] is True
    # The corruption-restart ledger outlives the vLLM container (issue 34); only vLLM's probes write it.
    assert volumes["canary-ledger"] == {"name": "canary-ledger", "emptyDir": {}}
    assert mounts["vllm"]["canary-ledger"] == {"name": "canary-ledger", "mountPath": "/run/deploykit-ledger"}
    assert "canary-ledger" not in mounts["canary"]
    # The key as a file the kubelet updates when the Secret rotates, read again before every run.
    assert volumes["canary-key"]["secret"] == {
        "secretName": chart.values["secretName"],
        "items": [{"key": "VLLM_API_KEY", "path": "api-key"}],
    }
    assert mounts["canary"]["canary-key"]["readOnly"] is True and "canary-key" not in mounts["vllm"]


KEEPER = [
    "python3", "-m", "deploykit.render.canary_keeper",
    "--verdict-file", "/run/deploykit/verdict.json", "--max-verdict-age", "600", "--",
]  # fmt: skip


def test_the_canary_runs_under_its_keeper_and_has_no_probe_that_restarts_its_container(
    charts: dict[str, Chart],
) -> None:
    """A crashing or hung canary is restarted by its keeper (the container's first process) inside the
    container (tests/render/test_canary_keeper.py; in a real pod: tests/e2e/test_helm_pod_e2e.py). A container
    restart is what would put it in CrashLoopBackOff and take the pod out of the Service, so no probe of the
    canary container may cause one. The keeper's hung threshold is the verdict's maximum age."""
    chart = charts["turing"]
    canary = containers(chart.manifests)["canary"]
    assert canary["command"][:8] == KEEPER
    assert str(chart.values["canary"]["verdictMaxAgeSeconds"]) == KEEPER[6]
    assert "livenessProbe" not in canary and "startupProbe" not in canary
    assert "readinessProbe" not in canary  # a sidecar's readiness is the pod's: it must never fail it
    docs = template(chart.root, "--set", "canary.verdictMaxAgeSeconds=900")
    assert containers(docs)["canary"]["command"][5:7] == ["--max-verdict-age", "900"]
    # Waiting on a hung engine the canary is silent for HUNG_AFTER_S before it says `hung`: a shorter hung
    # threshold would have the keeper kill it first, every time, and a hung vLLM would never be restarted.
    from deploykit.canary.defaults import HUNG_AFTER_S

    refused = run_helm(
        "template", "x", str(chart.root), "--set", f"canary.verdictMaxAgeSeconds={HUNG_AFTER_S:.0f}"
    )
    assert refused.returncode != 0 and "verdictMaxAgeSeconds" in refused.stderr, refused.stderr
    least = template(chart.root, "--set", f"canary.verdictMaxAgeSeconds={2 * HUNG_AFTER_S:.0f}")
    assert containers(least)["canary"]["command"][6] == f"{2 * HUNG_AFTER_S:.0f}"


def test_vllm_probes_read_the_verdict_file_never_the_canary_port(charts: dict[str, Chart]) -> None:
    """A sidecar that is missing, crash-looping or slow must not kill vLLM: no probe of the vLLM container
    talks to the canary. They run in the vLLM container, ask vLLM's /health and read the verdict file."""
    chart = charts["turing"]
    vllm = containers(chart.manifests)["vllm"]
    port = chart.values["port"]
    startup, readiness, liveness = vllm["startupProbe"], vllm["readinessProbe"], vllm["livenessProbe"]
    # Model loading: vLLM's own /health, for the whole start-up time; the others wait for it.
    assert startup["httpGet"] == {"path": "/health", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800
    for probe, mode in ((readiness, "ready"), (liveness, "live")):
        assert "httpGet" not in probe
        assert probe["exec"]["command"] == [
            "python3", "-m", "deploykit.render.pod_probe", mode,
            "--health-url", f"http://127.0.0.1:{port}/health",
            "--verdict-file", "/run/deploykit/verdict.json",
            "--timeout", "5", "--max-verdict-age", "600", "--ledger-dir", "/run/deploykit-ledger",
        ]  # fmt: skip
        # The probe asks /health with a 5 s timeout: the kubelet waits longer than that.
        assert probe["timeoutSeconds"] > 5
    assert str(chart.values["canary"]["port"]) not in str(readiness) + str(liveness)
    # Out of the Service within ~30 s; restarted after ~60 s of corruption, never on one slow probe.
    assert readiness["periodSeconds"] * readiness["failureThreshold"] <= 30
    assert (
        liveness["failureThreshold"] >= 3 and liveness["periodSeconds"] * liveness["failureThreshold"] >= 60
    )
    # A verdict the canary has not rewritten for several runs says nothing.
    assert chart.values["canary"]["verdictMaxAgeSeconds"] >= 5 * chart.values["canary"]["every"]


def test_canary_off_restores_the_health_probes_and_drops_the_sidecar(charts: dict[str, Chart]) -> None:
    docs = template(charts["turing"].root, "--set", "canary.enabled=false")
    found = containers(docs)
    assert list(found) == ["vllm"]
    assert found["vllm"]["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert found["vllm"]["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert all(not v["name"].startswith("canary") for v in pod_spec(docs)["volumes"])
    assert "canary-verdict" not in {m["name"] for m in found["vllm"]["volumeMounts"]}


def test_an_interval_the_verdict_s_maximum_age_would_ignore_is_refused(charts: dict[str, Chart]) -> None:
    """`canary.every=900` with verdicts ignored after 600 s: the probes would never see a fresh verdict and
    the canary's keeper would take it for hung between runs (issue 34). Refused by helm, in one line."""
    root = charts["turing"].root
    refused = run_helm("template", "x", str(root), "--set", "canary.every=900")
    assert refused.returncode != 0
    assert "canary.every 900: a verdict older than canary.verdictMaxAgeSeconds (600 s) is ignored" in (
        refused.stderr
    )
    both = run_helm(
        "template", "x", str(root), "--set", "canary.every=900", "--set", "canary.verdictMaxAgeSeconds=1800"
    )
    assert both.returncode == 0, both.stderr
    assert run_helm("template", "x", str(root), "--set", "canary.every=300").returncode == 0


def test_each_declared_setting_reaches_the_canary_under_its_flag(charts: dict[str, Chart]) -> None:
    """The chart's canary keys (`HELM_KEYS`) become the canary's declared options: changed values arrive
    under `deploykit canary`'s flag for the setting (`port`: the listen address, every address)."""
    from deploykit.canary.settings import CANARY_FLAGS, HELM_KEYS

    given = {"every": "7.5", "missLimit": "9", "port": "9555"}
    assert set(given) == set(HELM_KEYS.values())
    docs = template(
        charts["turing"].root, *[f"--set-json=canary.{key}={value}" for key, value in given.items()]
    )
    command = containers(docs)["canary"]["command"]
    passed = {name: command[command.index(CANARY_FLAGS[name]) + 1] for name in HELM_KEYS}
    assert passed == {"every_s": "7.5", "miss_limit": "9", "listen": "0.0.0.0:9555"}


@pytest.mark.parametrize(
    ("key", "value"),
    [("every", "0.05"), ("every", "604801"), ("missLimit", "0"), ("missLimit", "1000001"), ("port", "0")],
)
def test_helm_refuses_what_the_canary_would_refuse(charts: dict[str, Chart], key: str, value: str) -> None:
    """Out of the declared bounds (values.schema.json, checked against `CanarySettings` in
    tests/canary/test_settings.py): refused at install, not a crash-looping sidecar."""
    refused = run_helm(
        "template", "x", str(charts["turing"].root), f"--set-json=canary.{key}={value}",
        "--set=canary.verdictMaxAgeSeconds=2000000",
    )  # fmt: skip
    assert refused.returncode != 0 and f"/canary/{key}" in refused.stderr, refused.stderr
