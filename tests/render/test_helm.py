"""`deploykit render helm`, checked with what users run: the real helm (`helm lint --strict`, `helm template`;
tools/install-helm.sh installs it), the rendered values against values.schema.json, what `helm template`
renders against the Kubernetes schemas (kubernetes-validate, bundled schemas, strict), the same argv as
`deploykit plan`, and node affinity that keeps a Turing plan off Hopper nodes and the other way round.
Every shipped profile's chart is rendered; without helm these tests fail (CI must run them)."""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.profile_variants import PROFILES, profile_variant
from tests.render.conftest import deploykit, planned
from tests.unit_prefix import ABSENT_PREFIX

FACTS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "facts"  # saved probe facts of real GPUs
RELEASE = "demo"
NAMESPACE = "default"
# The oldest and the newest Kubernetes the bundled schemas cover from our support window.
KUBERNETES_VERSIONS = ("1.28", kubernetes_validate.utils.latest_version())
# GPU Feature Discovery labels of real nodes.
T4_NODE = {
    "nvidia.com/gpu.compute.major": "7",
    "nvidia.com/gpu.compute.minor": "5",
    "nvidia.com/gpu.family": "turing",
    "nvidia.com/gpu.memory": "15360",
    "nvidia.com/gpu.product": "Tesla-T4",
    "nvidia.com/cuda.driver-version.major": "570",  # a driver that runs the vLLM wheel's CUDA 12
}
H100_NODE = {
    "nvidia.com/gpu.compute.major": "9",
    "nvidia.com/gpu.compute.minor": "0",
    "nvidia.com/gpu.family": "hopper",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/cuda.driver-version.major": "570",
}
A10_NODE = {
    "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "6",
    "nvidia.com/gpu.family": "ampere",
    "nvidia.com/gpu.memory": "23028",
    "nvidia.com/cuda.driver-version.major": "570",
}
INSTALL_HINT = (
    "run `bash tools/install-helm.sh` (VENV=<the venv running pytest>, default .venv) to install it"
)


def find_helm() -> str:
    """helm beside the running Python (`.venv/bin/helm`, where tools/install-helm.sh puts it), else on PATH.
    Missing, the calling test fails: a skipped chart check would pass CI without checking anything."""
    beside = Path(sys.executable).parent / "helm"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("helm")
    if found is None:
        pytest.fail(f"helm is neither at {beside} nor on PATH: {INSTALL_HINT}", pytrace=False)
    return found


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([find_helm(), *args], capture_output=True, text=True, timeout=60)


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return run_helm("lint", "--strict", str(root))


def template(root: Path, *options: str) -> list[dict[str, Any]]:
    """`helm template` of the chart: its manifests, hooks (the `helm test` pod) included."""
    result = run_helm("template", RELEASE, str(root), "--namespace", NAMESPACE, *options)
    if result.returncode != 0:
        raise AssertionError(f"helm template {root} {' '.join(options)} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


class Chart:
    def __init__(self, root: Path, plan: dict[str, Any]) -> None:
        self.root = root
        self.plan = plan
        self.values: dict[str, Any] = yaml.safe_load((root / "values.yaml").read_text())
        self.schema: dict[str, Any] = json.loads((root / "values.schema.json").read_text())

    @functools.cached_property
    def manifests(self) -> list[dict[str, Any]]:
        """What `helm template` renders with the chart's own values."""
        return template(self.root)

    def one(self, kind: str) -> dict[str, Any]:
        found = [d for d in self.manifests if d["kind"] == kind]
        assert len(found) == 1, kind
        return found[0]


def render_chart(profile: Path | str, facts: Path, out: Path) -> Chart:
    out.mkdir(parents=True, exist_ok=True)
    result = deploykit("render", "helm", "--profile", str(profile), "--facts", str(facts), "--out", str(out))
    chart_dir = Path(result.stdout.splitlines()[0]).parent
    return Chart(chart_dir, planned(profile, facts))


# Every shipped profile, listening beyond loopback as a pod must: chart name → (profile, changes, facts).
# "turing", "hopper" and "cpu" carry the semantic checks below; the rest go through lint and validation.
LISTEN = {"serve.host": "0.0.0.0"}
# The demo profiles have no API key: a chart of them listening beyond loopback must say it is meant.
LISTEN_OPEN = {**LISTEN, "serve.allow_unauthenticated": True}
# A local model must be on a volume of the release (render refuses it otherwise): the demo profiles' are
# staged on a node directory and a PVC.
STAGED_TINY = {
    "model.source": "/models/tiny-llama",
    "model.volumes": [{"kind": "host_path", "path": "/srv/models", "mount_path": "/models"}],
}
STAGED_GEMMA4 = {
    "model.volumes": [{"kind": "pvc", "claim": "models", "mount_path": "/var/cache/deploykit/models"}],
}
STAGED_SMOLLM2 = {
    "model.source": "/models/smollm2-135m-instruct",
    "model.volumes": [{"kind": "pvc", "claim": "models", "mount_path": "/models"}],
}
CHARTED: dict[str, tuple[str, dict[str, Any], str]] = {
    "turing": ("gemma4-turing", {**LISTEN, "serve.tensor_parallel_size": 2}, "turing_facts"),
    "hopper": ("qwen-lora-hopper", LISTEN, "hopper_facts"),
    "cpu": ("demo-cpu", {**LISTEN_OPEN, **STAGED_TINY}, "turing_facts"),
    "cpu-gemma4": ("demo-gemma4-fp16", {**LISTEN_OPEN, **STAGED_GEMMA4}, "no-gpu.json"),
    "cpu-smollm2": ("smollm2-cpu", {**LISTEN_OPEN, **STAGED_SMOLLM2}, "turing_facts"),
    "penalties": ("penalties-high-concurrency", LISTEN, "a100.json"),
}


@pytest.fixture(scope="module")
def charts(
    tmp_path_factory: pytest.TempPathFactory, turing_facts: Path, hopper_facts: Path
) -> dict[str, Chart]:
    probed = {"turing_facts": turing_facts, "hopper_facts": hopper_facts}
    directory = tmp_path_factory.mktemp("charts")
    rendered = {}
    for name, (base, changes, facts) in CHARTED.items():
        (directory / name).mkdir()
        profile = profile_variant(directory / name, base, changes)
        facts_path = probed.get(facts, FACTS_DIR / facts)
        rendered[name] = render_chart(profile, facts_path, directory / name / "out")
    return rendered


def test_every_shipped_profile_is_charted() -> None:
    assert sorted(base for base, _, _ in CHARTED.values()) == sorted(p.stem for p in PROFILES.glob("*.yaml"))


def test_helm_is_found_or_the_test_fails_saying_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/bin/python")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(pytest.fail.Exception, match=r"tools/install-helm\.sh"):
        find_helm()


@pytest.mark.parametrize("name", CHARTED)
def test_helm_lint_strict_is_clean(charts: dict[str, Chart], name: str) -> None:
    result = lint(charts[name].root)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "[WARNING]" not in output and "[ERROR]" not in output, output


def test_values_validate_against_the_schema(charts: dict[str, Chart]) -> None:
    for chart in charts.values():
        jsonschema.Draft7Validator.check_schema(chart.schema)
        jsonschema.validate(chart.values, chart.schema, cls=jsonschema.Draft7Validator)


WRONG_VALUES: list[Callable[[dict[str, Any]], None]] = [
    lambda v: v.update(port="8000"),
    lambda v: v["command"].__setitem__(0, "python"),
    lambda v: v["probes"]["startup"]["httpGet"].update(path="/v1/models"),
    lambda v: v["shm"].update(sizeLimit="lots"),
    lambda v: v.update(replicas=2),  # a typo of replicaCount
    lambda v: v.update(imagePullSecrets=["regcred"]),  # a list of {name: ...}
    lambda v: v.update(nodeSelector={"pool": 1}),
    lambda v: v.update(podAnnotations="team=ml"),
    lambda v: v.update(serviceAccountName="Not_A_Name"),
    lambda v: v["tolerations"].append({"key": "gpu", "operator": "Matches"}),
    lambda v: v["affinity"].update(nodeAfinity={}),  # a typo
    lambda v: v["cache"]["persistence"].update(size="big"),
    lambda v: v["rollout"].update(maxUnavailable="one"),
    lambda v: v["metrics"]["podMonitor"].update(interval="often"),
    lambda v: v["plugin"].update(source="pypi"),
    lambda v: v["plugin"].update(source="index"),  # without index.secretName
    lambda v: v["plugin"].update(source="url"),  # without url.url and url.sha256
    lambda v: v["plugin"]["index"].update(requirement="deploykit==0.1.0"),  # another project's name
    lambda v: v["plugin"]["url"].update(url="http://mirror/vllm_deploykit-0.1.0-py3-none-any.whl"),
    lambda v: v["plugin"]["wheel"].update(sha256="abc"),
    lambda v: v.update(progressDeadlineSeconds=0),
]


def test_schema_rejects_wrong_values(charts: dict[str, Chart], tmp_path: Path) -> None:
    """Rejected by the schema itself and by helm, which checks values.schema.json at install/template time."""
    chart = charts["turing"]
    for number, mutate in enumerate(WRONG_VALUES):
        values = copy.deepcopy(chart.values)
        mutate(values)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(values, chart.schema, cls=jsonschema.Draft7Validator)
        override = tmp_path / f"wrong-{number}.yaml"
        override.write_text(yaml.safe_dump(values))
        result = run_helm("template", RELEASE, str(chart.root), "-f", str(override))
        assert result.returncode != 0 and "schema" in result.stderr, (number, result.stderr)


def all_manifests(charts: dict[str, Chart]) -> list[dict[str, Any]]:
    """Every chart's default rendering, plus the branches its defaults leave out: a PersistentVolumeClaim for
    the caches instead of an emptyDir."""
    docs = [doc for chart in charts.values() for doc in chart.manifests]
    return docs + template(charts["turing"].root, "--set", "cache.existingClaim=model-cache")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_helm_template_output_validates_against_kubernetes_schemas(
    charts: dict[str, Chart], version: str
) -> None:
    kinds = set()
    for doc in all_manifests(charts):
        kubernetes_validate.validate(doc, version, strict=True)
        kinds.add(doc["kind"])
    assert kinds == {"Deployment", "Service", "ConfigMap", "Pod", "PersistentVolumeClaim"}  # the hub cache


def test_existing_claim_mounts_the_cache_volume(charts: dict[str, Chart]) -> None:
    docs = template(charts["turing"].root, "--set", "cache.existingClaim=model-cache")
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "cache", "persistentVolumeClaim": {"claimName": "model-cache"}} in volumes


def test_kubernetes_validation_does_reject_a_bad_manifest(charts: dict[str, Chart]) -> None:
    deployment = copy.deepcopy(charts["turing"].one("Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["periodSecond"] = 10
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


# Template breakages in a copy of the rendered chart: (file, text, replacement, what `helm lint` says).
BROKEN_TEMPLATES = {
    "unclosed action": (
        "templates/deployment.yaml",
        "{{ .Values.replicaCount }}",
        "{{ .Values.replicaCount ",
        "parse error",
    ),
    "bad indentation": ("templates/deployment.yaml", "\n  selector:", "\n selector:", "unable to parse YAML"),
    "missing value map": (
        "templates/_pod.tpl",  # the vLLM pod, shared by the Deployment and a group's LeaderWorkerSet
        ".Values.probes.startup",
        ".Values.probe.startup",
        "nil pointer evaluating",
    ),
    "value against the schema": (
        "values.yaml",
        "\nreplicaCount: 1\n",
        '\nreplicaCount: "1"\n',
        "want integer",
    ),
}


def broken_copy(chart: Chart, directory: Path, file: str, text: str, replacement: str) -> Path:
    root = directory / chart.root.name
    shutil.copytree(chart.root, root)
    target = root / file
    original = target.read_text()
    assert text in original, (file, text)
    target.write_text(original.replace(text, replacement, 1))
    return root


@pytest.mark.parametrize("case", BROKEN_TEMPLATES)
def test_helm_lint_catches_a_broken_chart(charts: dict[str, Chart], tmp_path: Path, case: str) -> None:
    file, text, replacement, message = BROKEN_TEMPLATES[case]
    result = lint(broken_copy(charts["turing"], tmp_path, file, text, replacement))
    assert result.returncode != 0, result.stdout
    assert "[ERROR]" in result.stdout and message in result.stdout, result.stdout


def test_a_misspelt_value_passes_lint_but_not_kubernetes_validation(
    charts: dict[str, Chart], tmp_path: Path
) -> None:
    """helm renders a missing scalar as null and `helm lint --strict` (helm 4) accepts it: the Kubernetes
    schemas are what catch it, which is why the tests validate `helm template`'s output too."""
    root = broken_copy(
        charts["turing"], tmp_path, "templates/_pod.tpl", "{{ $root.Values.port }}", "{{ $root.Values.prot }}"
    )
    assert lint(root).returncode == 0
    (deployment,) = [d for d in template(root) if d["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] is None
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
    # API server, engine, one worker per GPU (tensor parallel 2 on the Turing chart); host memory for loading
    # weights, per worker; the GPUs requested as they are limited.
    requests = {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": 2}
    assert turing["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 2}, "requests": requests}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in turing["containers"][0]["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}} in turing["volumes"]
    requests = {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": 1}
    assert hopper["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}, "requests": requests}
    # vLLM's engine needs more than the container's 64 MiB even without tensor parallelism (the CPU build
    # asked for 160 MiB in tests/e2e/test_helm_pod_e2e.py).
    for spec in (hopper, cpu):
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in spec["volumes"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]
    assert cpu["containers"][0]["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}}
    assert "affinity" not in cpu and "tolerations" not in cpu


def test_probes_cover_model_loading(charts: dict[str, Chart]) -> None:
    container = charts["turing"].one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    startup = container["startupProbe"]
    assert startup["httpGet"] == {"path": "/health", "port": "http"}
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800  # deploy.startup_timeout_s
    # With the canary sidecar (the default) readiness and liveness read it: tests/render/test_helm_canary.py.
    # canary.enabled=false brings back these /health ones.
    for probe in ("readiness", "liveness"):
        assert charts["turing"].values["probes"][probe]["httpGet"]["path"] == "/health"
    # Kubernetes' default progress deadline (600 s) would call a slow, healthy load a failed rollout.
    window = startup["periodSeconds"] * startup["failureThreshold"]
    assert charts["turing"].one("Deployment")["spec"]["progressDeadlineSeconds"] > window


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
    assert command == [
        "python3",
        "-m",
        "deploykit",
        "smoke",
        "--url",
        url,
        "--profile",
        "/etc/deploykit/profile.yaml",
        "--expect-fixes",
        "fp32_projection",  # the plan's fixes: a pod without them fails its test
        "--no-store",
    ]
    # The vLLM image, with the chart's own wheel: nothing pulled or fetched that the release does not carry.
    assert pod["spec"]["containers"][0]["image"] == vllm_image(chart)
    assert {"name": "PYTHONPATH", "value": wheel_path(chart)} in pod["spec"]["containers"][0]["env"]
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["DEPLOYKIT_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "VLLM_API_KEY"
    config_map = config_maps(chart)["demo-profile"]
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

    from tests.render.test_systemd import split_command_line, unit_value

    profile = make_profile("gemma4-turing", {"serve.host": "0.0.0.0", "serve.tensor_parallel_size": 2})
    shell = deploykit(
        "plan", "-p", str(profile), "--facts", str(turing_facts), "--format", "shell", "--no-validate"
    ).stdout
    assert shell.splitlines()[0].startswith("# Needs deploykit ") and "beside vLLM" in shell.splitlines()[0]
    words = shlex.split(shell, comments=True)
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
        ABSENT_PREFIX,
    )
    unit_argv = split_command_line(
        unit_value((tmp_path / "deploykit-gemma4-turing.service").read_text(), "ExecStart")
    )
    chart_argv = charts["turing"].one("Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert shell_argv == chart_argv == ["vllm", *unit_argv[1:]]
    assert "DEPLOYKIT_FIXES=fp32_projection" in words


def vllm_image(chart: Chart) -> str:
    return f"{chart.values['image']['repository']}:{chart.values['image']['tag']}"


def wheel_path(chart: Chart) -> str:
    return f"/opt/deploykit/{chart.values['plugin']['wheel']['file']}"


def plugin_config_map(chart: Chart) -> str:
    """The bundled wheel's ConfigMap: named by the wheel's digest (immutable)."""
    return f"{RELEASE}-plugin-{chart.values['plugin']['wheel']['sha256'][:12]}"


def config_maps(chart: Chart, docs: list[dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in (docs or chart.manifests) if d["kind"] == "ConfigMap"}


def pod_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def test_the_chart_carries_the_plugin_wheel_pinned_by_its_sha256(charts: dict[str, Chart]) -> None:
    """No index: the wheel travels in a ConfigMap; its digest is pinned in values, checked by the chart and
    carried by the pod template, so a new wheel rolls the pods."""
    import base64
    import hashlib

    for name, fixes in (("turing", "fp32_projection"), ("hopper", "matmul_lora")):
        chart = charts[name]
        wheel = chart.values["plugin"]["wheel"]
        config_map = config_maps(chart)[plugin_config_map(chart)]
        assert config_map["immutable"] is True  # never new bytes under a running pod's zipimport
        data = base64.b64decode(config_map["binaryData"][wheel["file"]])
        assert data == (chart.root / "files" / wheel["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == wheel["sha256"]
        deployment = chart.one("Deployment")
        assert deployment["spec"]["template"]["metadata"]["annotations"]["deploykit.io/plugin"] == (
            f"sha256:{wheel['sha256']}"
        )
        spec = deployment["spec"]["template"]["spec"]
        assert "initContainers" not in spec  # nothing to install
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["deploykit-plugin"]["configMap"]["name"] == plugin_config_map(chart)
        for container in spec["containers"]:  # vLLM and the canary both run deploykit from the wheel
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert env["PYTHONPATH"] == wheel_path(chart), container["name"]
            mounts = {m["name"]: m for m in container["volumeMounts"]}
            assert mounts["deploykit-plugin"] == {
                "name": "deploykit-plugin",
                "mountPath": "/opt/deploykit",
                "readOnly": True,
            }
        vllm = spec["containers"][0]
        assert {"name": "DEPLOYKIT_FIXES", "value": fixes} in vllm["env"]
        assert chart.one("Pod")["spec"]["containers"][0]["command"][-3:] == [
            "--expect-fixes",
            fixes,
            "--no-store",
        ]


def test_python_loads_the_plugin_from_the_wheel_alone(charts: dict[str, Chart], tmp_path: Path) -> None:
    """What vLLM does in the pod: import deploykit from the wheel on PYTHONPATH and find its entry point."""
    chart = charts["turing"]
    wheel = chart.root / "files" / chart.values["plugin"]["wheel"]["file"]
    probe = (
        "import json, deploykit, importlib.metadata as m\n"
        "eps = [e.value for e in m.entry_points(group='vllm.general_plugins') if e.name == 'deploykit']\n"
        "print(json.dumps([deploykit.__file__, eps, m.version('vllm-deploykit')]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(wheel), "PATH": os.environ["PATH"]},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    module_file, entry_points, version = json.loads(done.stdout)
    assert module_file.startswith(f"{wheel}/deploykit/")
    assert entry_points == ["deploykit.vllm_plugin.entry:register"]
    assert version == chart.values["deploykit"]["version"]


def test_a_swapped_wheel_fails_the_chart(charts: dict[str, Chart], tmp_path: Path) -> None:
    chart = charts["turing"]
    root = tmp_path / chart.root.name
    shutil.copytree(chart.root, root)
    wheel = root / "files" / chart.values["plugin"]["wheel"]["file"]
    wheel.write_bytes(wheel.read_bytes() + b"tampered")
    result = run_helm("template", RELEASE, str(root))
    assert result.returncode != 0 and "does not match plugin.wheel.sha256" in result.stderr, result.stderr
    wheel.unlink()
    result = run_helm("template", RELEASE, str(root))
    assert result.returncode != 0 and "render the chart again" in result.stderr, result.stderr


def test_a_plan_without_fixes_still_carries_deploykit_for_the_canary(charts: dict[str, Chart]) -> None:
    chart = charts["cpu"]
    spec = pod_of(chart.manifests)
    vllm, canary = spec["containers"]
    assert "DEPLOYKIT_FIXES" not in {e["name"] for e in vllm["env"]}  # the plugin loads and applies nothing
    assert {"name": "PYTHONPATH", "value": wheel_path(chart)} in canary["env"]
    assert chart.one("Pod")["spec"]["containers"][0]["command"][-3:] == [
        "--expect-fixes",
        "none",
        "--no-store",
    ]


INDEX_SOURCE = ("--set", "plugin.source=index", "--set", "plugin.index.secretName=pip-index")
URL_SOURCE = (
    "--set",
    "plugin.source=url",
    "--set",
    "plugin.url.url=https://wheels.internal/vllm_deploykit-0.1.0-py3-none-any.whl",
    "--set",
    f"plugin.url.sha256={'a' * 64}",
)


def test_a_private_index_takes_its_url_from_a_secret(charts: dict[str, Chart]) -> None:
    chart = charts["turing"]
    docs = template(chart.root, *INDEX_SOURCE)
    for spec in (pod_of(docs), next(d for d in docs if d["kind"] == "Pod")["spec"]):
        (init,) = spec["initContainers"]
        assert init["image"] == vllm_image(chart)
        assert init["command"][:4] == ["python3", "-m", "pip", "install"] and "--no-deps" in init["command"]
        assert init["command"][-1] == f"vllm-deploykit=={chart.values['deploykit']['version']}"
        env = {e["name"]: e for e in init["env"]}
        assert env["PIP_INDEX_URL"]["valueFrom"]["secretKeyRef"] == {"name": "pip-index", "key": "index-url"}
        assert {"name": "deploykit-plugin", "emptyDir": {}} in spec["volumes"]
        assert {"name": "PYTHONPATH", "value": "/opt/deploykit"} in spec["containers"][0]["env"]
    assert plugin_config_map(chart) not in config_maps(chart, docs)


def test_a_wheel_url_is_installed_with_require_hashes(charts: dict[str, Chart]) -> None:
    docs = template(charts["turing"].root, *URL_SOURCE)
    (init,) = pod_of(docs)["initContainers"]
    script = init["command"][2]
    assert init["command"][:2] == ["sh", "-c"] and "--require-hashes" in script and "--no-deps" in script
    env = {e["name"]: e.get("value") for e in init["env"]}
    assert env["DEPLOYKIT_WHEEL_SHA256"] == "a" * 64
    annotations = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["metadata"]
    assert annotations["annotations"]["deploykit.io/plugin"] == f"sha256:{'a' * 64}"


def test_a_derived_image_needs_no_plugin_volume(charts: dict[str, Chart]) -> None:
    docs = template(
        charts["turing"].root,
        "--set",
        "plugin.source=image",
        "--set",
        "image.repository=registry.internal/vllm-dk",
    )
    spec = pod_of(docs)
    assert "initContainers" not in spec and all(v["name"] != "deploykit-plugin" for v in spec["volumes"])
    for container in spec["containers"]:
        assert container["image"].startswith("registry.internal/vllm-dk:")
        assert "PYTHONPATH" not in {e["name"] for e in container["env"]}


def test_every_source_validates_against_kubernetes_schemas(charts: dict[str, Chart]) -> None:
    for options in (INDEX_SOURCE, URL_SOURCE, ("--set", "plugin.source=image")):
        for doc in template(charts["hopper"].root, *options):
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)


def test_nothing_rendered_names_a_package_or_image_we_do_not_own(charts: dict[str, Chart]) -> None:
    """The bare PyPI name `deploykit` is another project's; the only image is the plan's vLLM image."""
    import re

    for name, chart in charts.items():
        for docs in (chart.manifests, template(chart.root, *INDEX_SOURCE), template(chart.root, *URL_SOURCE)):
            text = yaml.safe_dump_all(docs)
            assert not re.search(r"(?<![\w-])deploykit(\[[^\]]*\])?\s*(==|>=|~=|@)", text), name
            pods = [pod_of(docs), next(d for d in docs if d["kind"] == "Pod")["spec"]]
            containers = [c for pod in pods for c in [*pod.get("initContainers", []), *pod["containers"]]]
            assert {c["image"] for c in containers} == {vllm_image(chart)}, name
        assert chart.values["image"]["tag"] == f"v{chart.plan['vllm_version'].split('+')[0]}", name


# A line break in a value the chart writes into YAML, then YAML (issue 43): the text after it became a key of
# the object around it (`optional: true` in a secretKeyRef: vLLM then starts without its key when the Secret
# is missing). Each override: (values, the object the injected key would land in). `injected` marks the rest.
INJECTED_VALUES: dict[str, dict[str, Any]] = {
    "secretEnv": {"secretEnv": {"VLLM_API_KEY": "VLLM_API_KEY\n                  optional: true"}},
    "smokeTest.secretEnv": {
        "canary": {"enabled": False},  # (the canary's copies are indented otherwise: one site at a time)
        "smokeTest": {"secretEnv": {"DEPLOYKIT_API_KEY": "VLLM_API_KEY\n              optional: true"}},
    },
    "cache.existingClaim": {"cache": {"existingClaim": "claim\n            injected: true"}},
    "plugin.index.secretKey": {
        "plugin": {
            "source": "index",
            "index": {"secretName": "idx", "secretKey": "k\n          optional: true"},
        }
    },
    "plugin.path": {"plugin": {"path": "/opt/deploykit\n  - injected"}},
}
# Values whose schema pattern already refuses a line break: the templates quote them too, so a chart
# installed with --skip-schema-validation (helm 3.16 on) is not injected either.
INJECTED_PAST_THE_SCHEMA: dict[str, dict[str, Any]] = {
    **INJECTED_VALUES,
    "priorityClassName": {"priorityClassName": "pc\n      injected: true"},
    "shm.sizeLimit": {"shm": {"sizeLimit": "1Gi\n            injected: true"}},
    "rollout": {
        "podDisruptionBudget": {"enabled": True},
        "rollout": {"maxSurge": "1\n    injected: true", "maxUnavailable": "1\n  injected: true"},
    },
    "metrics.interval": {
        "metrics": {"podMonitor": {"enabled": True, "interval": "30s\n      injected: true"}}
    },
    "cache.persistence.size": {
        "cache": {"persistence": {"enabled": True, "size": "1Gi\n      injected: true"}}
    },
}


def injected_keys(docs: list[dict[str, Any]]) -> list[str]:
    """Where a key the values smuggled in landed: `injected` anywhere, `optional` in a secretKeyRef, an
    item `injected` in a list."""
    found: list[str] = []

    def walk(node: object, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "injected" or (key == "optional" and where.endswith("secretKeyRef")):
                    found.append(f"{where}.{key}")
                walk(value, f"{where}.{key}")
        elif isinstance(node, list):
            found.extend(f"{where}[]" for item in node if item == "injected")
            for item in node:
                walk(item, f"{where}[]")

    for doc in docs:
        walk(doc, str(doc.get("kind")))
    return found


def values_file(folder: Path, values: dict[str, Any]) -> Path:
    """A `-f` values file holding `values`."""
    override = folder / "values.yaml"
    override.write_text(yaml.safe_dump(values))
    return override


@pytest.mark.parametrize("name", INJECTED_VALUES)
def test_the_schema_refuses_a_line_break_in_a_name_or_key(
    charts: dict[str, Chart], tmp_path: Path, name: str
) -> None:
    """Secret and claim names are DNS-1123 names, Secret keys `[-._a-zA-Z0-9]+`: the schema says so."""
    override = values_file(tmp_path, INJECTED_VALUES[name])
    result = run_helm("template", RELEASE, str(charts["hopper"].root), "-f", str(override))
    assert result.returncode != 0 and "schema" in result.stderr, result.stdout[-3000:]


@pytest.mark.parametrize("name", INJECTED_PAST_THE_SCHEMA)
def test_no_value_injects_yaml_even_past_the_schema(
    charts: dict[str, Chart], tmp_path: Path, name: str
) -> None:
    """The templates quote every string they write: the value stays one scalar, line break and all."""
    override = values_file(tmp_path, INJECTED_PAST_THE_SCHEMA[name])
    docs = template(charts["hopper"].root, "-f", str(override), "--skip-schema-validation")
    assert injected_keys(docs) == []
    assert injected_keys(charts["hopper"].manifests) == []  # (the finder finds nothing in a clean chart)


# Replicas (docs/deploy.md, Scaling out): the chart decides the update strategy from replicaCount when the
# release is installed, never deploykit at render time, and the PodDisruptionBudget lets a drain take as many
# pods as a rollout does: one at a time by default, with no surge (GPUs are scarce).
RECREATE = {"type": "Recreate"}


def rolling(surge: int, unavailable: int) -> dict[str, Any]:
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}


# replicaCount → (the Deployment's strategy, the budget's maxUnavailable) with the chart's own rollout values.
REPLICAS = {
    0: (RECREATE, 1),
    1: (RECREATE, 1),  # the budget lets a drain take the only pod: 0 would block the drain forever
    2: (rolling(0, 1), 1),
    3: (rolling(0, 1), 1),
    5: (rolling(0, 1), 1),
}


def rollout(chart: Chart, *settings: str) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """The replicas, update strategy and disruption budget `helm template --set SETTING...` renders with the
    budget on; the Deployment and the budget validated against the Kubernetes schemas."""
    options = [word for setting in settings for word in ("--set", setting)]
    docs = template(chart.root, "--set", "podDisruptionBudget.enabled=true", *options)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (budget,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    for doc in (deployment, budget):
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    return deployment["spec"]["replicas"], deployment["spec"]["strategy"], budget["spec"]


@pytest.mark.parametrize("replicas", REPLICAS)
def test_the_strategy_and_the_budget_follow_replica_count_at_install(
    charts: dict[str, Chart], replicas: int
) -> None:
    """The Hopper chart was rendered from a one-replica profile; `--set replicaCount=N` decides."""
    assert charts["hopper"].values["replicaCount"] == 1
    count, strategy, budget = rollout(charts["hopper"], f"replicaCount={replicas}")
    assert (count, strategy, budget["maxUnavailable"]) == (replicas, *REPLICAS[replicas])
    assert "minAvailable" not in budget
    if replicas > 1:  # a drain takes no more pods than the rollout does, and is never blocked
        assert budget["maxUnavailable"] == strategy["rollingUpdate"]["maxUnavailable"] >= 1


@pytest.mark.external_tool  # helm template (no `charts` fixture to say so)
def test_the_values_hold_no_strategy_of_the_profile(
    make_profile: Callable[[str, dict[str, Any]], Path], tmp_path: Path
) -> None:
    """A three-replica profile's chart installed with one replica recreates it: nothing decided at render."""
    profile = make_profile("qwen-lora-hopper", {**LISTEN, "deploy.replicas": 3})
    chart = render_chart(profile, FACTS_DIR / "h100.json", tmp_path / "out")
    assert chart.values["replicaCount"] == 3 and "strategy" not in chart.values
    assert rollout(chart)[:2] == (3, rolling(0, 1))
    assert rollout(chart, "replicaCount=1")[:2] == (1, RECREATE)


# Teams with spare GPUs opt in to a surge: (settings, the strategy, the budget's maxUnavailable).
SURGES = {
    "one replica, a new pod before the old goes": (
        ("replicaCount=1", "rollout.maxSurge=1"),
        rolling(1, 0),
        1,  # a drain may still take the only pod; 0 would block it forever
    ),
    "three replicas, one extra and one down": (("replicaCount=3", "rollout.maxSurge=1"), rolling(1, 1), 1),
    "three replicas, none down in a rollout": (
        ("replicaCount=3", "rollout.maxSurge=1", "rollout.maxUnavailable=0"),
        rolling(1, 0),
        1,  # a drain still takes one at a time: 0 would block it forever
    ),
    "four replicas, two at a time": (("replicaCount=4", "rollout.maxUnavailable=2"), rolling(0, 2), 2),
}


@pytest.mark.parametrize("case", SURGES)
def test_a_surge_is_opted_in_through_values(charts: dict[str, Chart], case: str) -> None:
    settings, strategy, unavailable = SURGES[case]
    _, rendered, budget = rollout(charts["hopper"], *settings)
    assert (rendered, budget["maxUnavailable"]) == (strategy, unavailable)


# Rollout values the schema refuses (and with it `helm template -f`): (change to the values, why).
ROLLOUT_NONSENSE: dict[str, Callable[[dict[str, Any]], None]] = {
    "a negative surge": lambda v: v["rollout"].update(maxSurge=-1),
    "a negative unavailability": lambda v: v["rollout"].update(maxUnavailable=-1),
    "a percentage (the budget counts pods)": lambda v: v["rollout"].update(maxSurge="25%"),
    "a rollout that cannot move": lambda v: v["rollout"].update(maxSurge=0, maxUnavailable=0),
    "an unknown rollout key": lambda v: v["rollout"].update(maxSurges=1),
    "a strategy of its own (the chart decides it)": lambda v: v.update(strategy=RECREATE),
    "a budget of its own (it follows the rollout)": lambda v: v["podDisruptionBudget"].update(minAvailable=1),
}


@pytest.mark.parametrize("case", ROLLOUT_NONSENSE)
def test_the_schema_refuses_rollout_nonsense(charts: dict[str, Chart], tmp_path: Path, case: str) -> None:
    chart = charts["hopper"]
    values = copy.deepcopy(chart.values)
    ROLLOUT_NONSENSE[case](values)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, chart.schema, cls=jsonschema.Draft7Validator)
    result = run_helm("template", RELEASE, str(chart.root), "-f", str(values_file(tmp_path, values)))
    assert result.returncode != 0 and "schema" in result.stderr, result.stderr
