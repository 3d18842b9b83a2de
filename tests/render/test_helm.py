"""`deploykit render helm`: values.yaml against values.schema.json, the manifests against the Kubernetes
schemas (kubernetes-validate, bundled schemas, strict), the same argv as `deploykit plan`, and node affinity
that keeps a Turing plan off Hopper nodes and the other way round. With helm on PATH, `helm lint` and
`helm template` run too, and helm's output must equal the test interpreter's (tests/render/gotemplate.py)."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.render.conftest import deploykit, planned
from tests.render.gotemplate import helm_context, render

RELEASE = "demo"
# The oldest and the newest Kubernetes the bundled schemas cover from our support window.
KUBERNETES_VERSIONS = ("1.28", kubernetes_validate.utils.latest_version())
# GPU Feature Discovery labels of real nodes.
T4_NODE = {
    "nvidia.com/gpu.compute.major": "7",
    "nvidia.com/gpu.compute.minor": "5",
    "nvidia.com/gpu.family": "turing",
    "nvidia.com/gpu.memory": "15360",
    "nvidia.com/gpu.product": "Tesla-T4",
}
H100_NODE = {
    "nvidia.com/gpu.compute.major": "9",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/gpu.family": "hopper",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
}
A10_NODE = {
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "6",
    "nvidia.com/gpu.family": "ampere",
    "nvidia.com/gpu.memory": "23028",
}


class Chart:
    def __init__(self, root: Path, plan: dict[str, Any]) -> None:
        self.root = root
        self.plan = plan
        self.values: dict[str, Any] = yaml.safe_load((root / "values.yaml").read_text())
        self.meta: dict[str, Any] = yaml.safe_load((root / "Chart.yaml").read_text())
        self.schema: dict[str, Any] = json.loads((root / "values.schema.json").read_text())

    def manifests(self, values: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
        context = helm_context(self.meta, values or self.values, RELEASE, "default")
        rendered = {}
        for template in sorted((self.root / "templates").rglob("*.yaml")):
            text = render(template.read_text(), context)
            rendered[str(template.relative_to(self.root))] = [d for d in yaml.safe_load_all(text) if d]
        return rendered

    def one(self, kind: str) -> dict[str, Any]:
        found = [d for docs in self.manifests().values() for d in docs if d["kind"] == kind]
        assert len(found) == 1, kind
        return found[0]


def render_chart(profile: Path | str, facts: Path, out: Path) -> Chart:
    result = deploykit("render", "helm", "--profile", str(profile), "--facts", str(facts), "--out", str(out))
    chart_dir = Path(result.stdout.splitlines()[0]).parent
    return Chart(chart_dir, planned(profile, facts))


@pytest.fixture(scope="module")
def charts(
    tmp_path_factory: pytest.TempPathFactory, turing_facts: Path, hopper_facts: Path
) -> dict[str, Chart]:
    from tests.render.conftest import profile_variant

    directory = tmp_path_factory.mktemp("charts")
    listen = {"serve.host": "0.0.0.0"}
    turing = profile_variant(directory, "gemma4-turing", {**listen, "serve.tensor_parallel_size": 2})
    hopper_dir = directory / "h"
    hopper_dir.mkdir()
    hopper = profile_variant(hopper_dir, "qwen-lora-hopper", listen)
    cpu_dir = directory / "c"
    cpu_dir.mkdir()
    cpu = profile_variant(cpu_dir, "demo-cpu", listen)
    return {
        "turing": render_chart(turing, turing_facts, directory / "out-turing"),
        "hopper": render_chart(hopper, hopper_facts, directory / "out-hopper"),
        "cpu": render_chart(cpu, turing_facts, directory / "out-cpu"),
    }


def test_values_validate_against_the_schema(charts: dict[str, Chart]) -> None:
    for chart in charts.values():
        jsonschema.Draft7Validator.check_schema(chart.schema)
        jsonschema.validate(chart.values, chart.schema, cls=jsonschema.Draft7Validator)


def test_schema_rejects_wrong_values(charts: dict[str, Chart]) -> None:
    chart = charts["turing"]
    for mutate in (
        lambda v: v.update(port="8000"),
        lambda v: v["command"].__setitem__(0, "python"),
        lambda v: v["probes"]["startup"]["httpGet"].update(path="/v1/models"),
        lambda v: v["shm"].update(sizeLimit="lots"),
        lambda v: v.update(replicas=2),  # a typo of replicaCount
    ):
        values = copy.deepcopy(chart.values)
        mutate(values)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(values, chart.schema, cls=jsonschema.Draft7Validator)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_manifests_validate_against_kubernetes_schemas(charts: dict[str, Chart], version: str) -> None:
    kinds = set()
    for chart in charts.values():
        for docs in chart.manifests().values():
            for doc in docs:
                kubernetes_validate.validate(doc, version, strict=True)
                kinds.add(doc["kind"])
    assert kinds == {"Deployment", "Service", "ConfigMap", "Pod"}


def test_kubernetes_validation_does_reject_a_bad_manifest(charts: dict[str, Chart]) -> None:
    deployment = copy.deepcopy(charts["turing"].one("Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["periodSecond"] = 10
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


def test_deployment_command_is_the_planned_argv(charts: dict[str, Chart]) -> None:
    for name, chart in charts.items():
        container = chart.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
        assert chart.values["command"] == chart.plan["argv"], name
        assert container["command"] == chart.plan["argv"], name
        assert "args" not in container


def test_fix_environment_and_secret_references(charts: dict[str, Chart]) -> None:
    turing = charts["turing"]
    container = turing.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert turing.plan["env"]["DEPLOYKIT_FIXES"] == "fp32_projection"
    for key, value in turing.plan["env"].items():
        if key in turing.plan["secret_env"]:
            assert env[key]["valueFrom"]["secretKeyRef"] == {"name": "gemma4-turing-secrets", "key": key}
        else:
            assert env[key]["value"] == value
    hopper_env = charts["hopper"].one("Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "DEPLOYKIT_FIXES", "value": "matmul_lora"} in hopper_env


def test_gpu_resources_and_shared_memory(charts: dict[str, Chart]) -> None:
    def pod(chart: Chart) -> dict[str, Any]:
        spec: dict[str, Any] = chart.one("Deployment")["spec"]["template"]["spec"]
        return spec

    turing, hopper, cpu = pod(charts["turing"]), pod(charts["hopper"]), pod(charts["cpu"])
    assert turing["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in turing["containers"][0]["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in turing["volumes"]
    assert hopper["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert all(v["name"] != "dshm" for v in hopper["volumes"])  # tensor parallel 1
    assert cpu["containers"][0]["resources"] == {} and "affinity" not in cpu and "tolerations" not in cpu


def test_probes_cover_model_loading(charts: dict[str, Chart]) -> None:
    container = charts["turing"].one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    startup = container["startupProbe"]
    assert startup["httpGet"] == {"path": "/health", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800  # deploy.startup_timeout_s
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"


def node_matches(affinity: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes' required node affinity: any term matches when all its expressions do (In, Gt)."""
    terms = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]

    def holds(expression: dict[str, Any]) -> bool:
        value = labels.get(expression["key"])
        if value is None:
            return False
        if expression["operator"] == "In":
            return value in expression["values"]
        if expression["operator"] == "Gt":
            return int(value) > int(expression["values"][0])
        raise AssertionError(expression["operator"])

    return any(all(holds(e) for e in term["matchExpressions"]) for term in terms)


def test_turing_plan_cannot_land_on_hopper_and_back(charts: dict[str, Chart]) -> None:
    turing = charts["turing"].one("Deployment")["spec"]["template"]["spec"]["affinity"]
    hopper = charts["hopper"].one("Deployment")["spec"]["template"]["spec"]["affinity"]
    assert node_matches(turing, T4_NODE) and not node_matches(turing, H100_NODE)
    assert node_matches(hopper, H100_NODE) and not node_matches(hopper, T4_NODE)
    assert not node_matches(turing, A10_NODE) and not node_matches(hopper, A10_NODE)


def test_helm_test_hook_runs_smoke_against_the_service(charts: dict[str, Chart]) -> None:
    chart = charts["turing"]
    pod = chart.one("Pod")
    service = chart.one("Service")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    command = pod["spec"]["containers"][0]["command"]
    url = f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    assert command == ["deploykit", "smoke", "--url", url, "--profile", "/etc/deploykit/profile.yaml"]
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["DEPLOYKIT_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "VLLM_API_KEY"
    config_map = chart.one("ConfigMap")
    assert yaml.safe_load(config_map["data"]["profile.yaml"])["name"] == "gemma4-turing"
    deployment = chart.one("Deployment")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_loopback_host_is_refused_with_the_fix(
    turing_facts: Path, tmp_path: Path, make_profile: Callable[[str, dict[str, Any]], Path]
) -> None:
    profile = make_profile("gemma4-turing", {"serve.host": "127.0.0.1"})
    out = tmp_path / "chart"
    out.mkdir()
    result = deploykit(
        "render",
        "helm",
        "-p",
        str(profile),
        "--facts",
        str(turing_facts),
        "--out",
        str(out),
        check=False,
    )
    assert result.returncode == 2
    assert "serve.host is 127.0.0.1" in result.stderr and "0.0.0.0" in result.stderr
    assert not any(out.iterdir())


def test_plan_shell_systemd_and_chart_agree(
    charts: dict[str, Chart],
    make_profile: Callable[[str, dict[str, Any]], Path],
    turing_facts: Path,
    tmp_path: Path,
) -> None:
    """One profile, three forms: `plan --format shell`, the unit's ExecStart, the chart's command."""
    import shlex
    import sys

    from tests.render.test_systemd import split_command_line, unit_value

    profile = make_profile("gemma4-turing", {"serve.host": "0.0.0.0", "serve.tensor_parallel_size": 2})
    shell = deploykit(
        "plan", "-p", str(profile), "--facts", str(turing_facts), "--format", "shell", "--no-validate"
    ).stdout
    words = shlex.split(shell)
    shell_argv = words[words.index("vllm") :]
    deploykit(
        "render",
        "systemd",
        "-p",
        str(profile),
        "--facts",
        str(turing_facts),
        "--out",
        str(tmp_path),
        "--prefix",
        sys.prefix,
    )
    unit_argv = split_command_line(
        unit_value((tmp_path / "deploykit-gemma4-turing.service").read_text(), "ExecStart")
    )
    chart_argv = charts["turing"].one("Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert shell_argv == chart_argv == ["vllm", *unit_argv[1:]]
    assert "DEPLOYKIT_FIXES=fp32_projection" in words


def helm() -> str:
    found = shutil.which("helm")
    if not found:
        pytest.skip("helm is not on PATH; the chart was checked through tests/render/gotemplate.py")
    return found


def test_helm_lint_and_template_agree_with_the_interpreter(charts: dict[str, Chart]) -> None:
    binary = helm()
    for chart in charts.values():
        lint = subprocess.run([binary, "lint", "--strict", str(chart.root)], capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout + lint.stderr
        for template, docs in chart.manifests().items():
            result = subprocess.run(
                [binary, "template", RELEASE, str(chart.root), "--show-only", template],
                capture_output=True,
                text=True,
                check=True,
            )
            assert [d for d in yaml.safe_load_all(result.stdout) if d] == docs, template
