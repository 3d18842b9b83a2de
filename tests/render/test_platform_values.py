"""Issue 48, items 4 and 5: the fields a platform sets on every workload (topologySpreadConstraints,
terminationGracePeriodSeconds, envFrom, extra objects, Service annotations), each rendered where Kubernetes
expects it, in the Deployment's pod and in a group's leader and workers alike, typed by the values schema as
Kubernetes types them; and the GPU node selection on GPU Feature Discovery's labels, with a switch for a
cluster without them (`gpuNodeSelection: none`: the user's own placement only, refused without one).

Checked with the real helm and kubernetes-validate (strict, the oldest and the newest schemas).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.profile_variants import profile_variant
from tests.render.test_helm import (
    FACTS_DIR,
    H100_NODE,
    KUBERNETES_VERSIONS,
    LISTEN,
    T4_NODE,
    Chart,
    node_matches,
    pod_of,
    render_chart,
    run_helm,
    template,
    values_file,
)
from tests.render.test_helm_group import GROUP, containers, pod, the_set
from tests.render.test_helm_group import validate as validate_group

pytestmark = pytest.mark.external_tool  # every test here renders with helm

ZONE_SPREAD = {
    "maxSkew": 1,
    "topologyKey": "topology.kubernetes.io/zone",
    "whenUnsatisfiable": "ScheduleAnyway",
}
HOST_SPREAD = {
    "maxSkew": 1,
    "topologyKey": "kubernetes.io/hostname",
    "whenUnsatisfiable": "DoNotSchedule",
    "labelSelector": {"matchLabels": {"team": "ml"}},
    "matchLabelKeys": ["pod-template-hash"],
}
PLATFORM = {
    "topologySpreadConstraints": [ZONE_SPREAD, HOST_SPREAD],
    "terminationGracePeriodSeconds": 120,
    "envFrom": [
        {"configMapRef": {"name": "platform-env"}},
        {"secretRef": {"name": "platform-secrets", "optional": True}, "prefix": "PLATFORM_"},
    ],
    "service": {"annotations": {"service.beta.kubernetes.io/aws-load-balancer-internal": "true"}},
    "extraObjects": [
        # A map, its name templated with the release's.
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "{{ .Release.Name }}-extra"},
         "data": {"owner": "platform"}},
        # A string: written as a template would be.
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\n"
        "metadata:\n  name: {{ .Release.Name }}-ingress\n"
        "spec:\n  podSelector:\n    matchLabels:\n      app.kubernetes.io/instance: {{ .Release.Name }}\n"
        "  policyTypes: [Ingress]\n",
    ],
}  # fmt: skip
# A cluster without GPU Feature Discovery: GKE labels its GPU nodes with the accelerator's name.
OWN_SELECTOR = {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}
OWN_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["t4"]}]}]
        }
    }
}


@pytest.fixture(scope="module")
def chart(tmp_path_factory: pytest.TempPathFactory, turing_facts: Path) -> Chart:
    directory = tmp_path_factory.mktemp("platform")
    return render_chart(profile_variant(directory, "gemma4-turing", LISTEN), turing_facts, directory / "out")


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Chart:
    directory = tmp_path_factory.mktemp("platform-group")
    profile = profile_variant(directory, "qwen-lora-hopper", GROUP)
    return render_chart(profile, FACTS_DIR / "h100x8.json", directory / "out")


@pytest.fixture(scope="module")
def platform_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return values_file(tmp_path_factory.mktemp("platform-values"), PLATFORM)


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def assert_platform_pod(spec: dict[str, Any], selector: dict[str, str], *, serves: bool) -> None:
    """One pod spec carries the platform fields where Kubernetes reads them."""
    assert spec["terminationGracePeriodSeconds"] == 120
    zone, host = spec["topologySpreadConstraints"]
    # Without a labelSelector the constraint would match no pod and spread nothing: the release's own.
    assert zone == {**ZONE_SPREAD, "labelSelector": {"matchLabels": selector}}
    assert host == HOST_SPREAD
    by_name = containers(spec)
    assert by_name["vllm"]["envFrom"] == PLATFORM["envFrom"]
    # The chart's own variables stay explicit `env` entries, which win over envFrom of the same name.
    assert "PYTHONPATH" in {e["name"] for e in by_name["vllm"]["env"]}
    if serves:
        assert "envFrom" not in by_name["canary"]  # the vLLM container's, not the sidecar's


def test_each_field_lands_where_kubernetes_expects_it(chart: Chart, platform_file: Path) -> None:
    docs = template(chart.root, "-f", str(platform_file))
    selector = {"app.kubernetes.io/name": "gemma4-turing", "app.kubernetes.io/instance": "demo"}
    assert_platform_pod(pod_of(docs), selector, serves=True)
    (service,) = by_kind(docs, "Service")
    assert service["metadata"]["annotations"] == PLATFORM["service"]["annotations"]
    (extra,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == "demo-extra"]
    assert extra["data"] == {"owner": "platform"}
    (policy,) = by_kind(docs, "NetworkPolicy")
    assert policy["metadata"]["name"] == "demo-ingress"
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/instance": "demo"}
    (smoke,) = by_kind(docs, "Pod")
    assert "topologySpreadConstraints" not in smoke["spec"]  # the test hook is no serving pod
    for doc in docs:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_a_groups_leader_and_workers_get_them_too(group: Chart, platform_file: Path) -> None:
    docs = template(group.root, "-f", str(platform_file))
    lws = the_set(docs)
    selector = {"app.kubernetes.io/name": "qwen-lora-hopper", "app.kubernetes.io/instance": "demo"}
    assert_platform_pod(pod(lws, "leader"), selector, serves=True)
    assert_platform_pod(pod(lws, "worker"), selector, serves=False)
    (service,) = by_kind(docs, "Service")
    assert service["metadata"]["annotations"] == PLATFORM["service"]["annotations"]
    assert {d["metadata"]["name"] for d in docs} >= {"demo-extra", "demo-ingress"}
    validate_group(docs)


def test_lint_strict_is_clean_with_them(chart: Chart, platform_file: Path) -> None:
    result = run_helm("lint", "--strict", str(chart.root), "-f", str(platform_file))
    assert result.returncode == 0 and "[WARNING]" not in result.stdout, result.stdout + result.stderr


def test_by_default_nothing_changes(chart: Chart) -> None:
    """Empty defaults: Kubernetes' own grace period (30 s), no spread, no envFrom, no annotation, no
    object."""
    docs = chart.manifests
    spec = pod_of(docs)
    for key in ("terminationGracePeriodSeconds", "topologySpreadConstraints"):
        assert key not in spec, key
    assert all("envFrom" not in c for c in spec["containers"])
    assert "annotations" not in by_kind(docs, "Service")[0]["metadata"]
    rendered = run_helm("template", "demo", str(chart.root))
    assert rendered.returncode == 0 and "templates/extra-objects.yaml" not in rendered.stdout
    assert chart.values["terminationGracePeriodSeconds"] is None and chart.values["extraObjects"] == []


def test_a_grace_period_of_zero_is_written(chart: Chart) -> None:
    """0 is a value (kill at once), not "unset": the template must not drop it as false."""
    spec = pod_of(template(chart.root, "--set", "terminationGracePeriodSeconds=0"))
    assert spec["terminationGracePeriodSeconds"] == 0


# Values the schema refuses, as Kubernetes would refuse the object they make: (change, why).
MALFORMED: dict[str, tuple[dict[str, Any], str]] = {
    "negative grace": ({"terminationGracePeriodSeconds": -1}, "terminationGracePeriodSeconds"),
    "grace as text": ({"terminationGracePeriodSeconds": "30s"}, "terminationGracePeriodSeconds"),
    "spread without key": (
        {"topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}]},
        "topologySpreadConstraints",
    ),
    "spread, unknown policy": (
        {"topologySpreadConstraints": [{**ZONE_SPREAD, "whenUnsatisfiable": "Never"}]},
        "topologySpreadConstraints",
    ),
    "spread, zero skew": ({"topologySpreadConstraints": [{**ZONE_SPREAD, "maxSkew": 0}]}, "maxSkew"),
    "envFrom with two sources": (
        {"envFrom": [{"configMapRef": {"name": "a"}, "secretRef": {"name": "b"}}]},
        "envFrom",
    ),
    "envFrom without a source": ({"envFrom": [{"prefix": "X_"}]}, "envFrom"),
    "envFrom ref without name": ({"envFrom": [{"configMapRef": {"optional": True}}]}, "envFrom"),
    "envFrom name with a line break": ({"envFrom": [{"secretRef": {"name": "a\ninjected: x"}}]}, "envFrom"),
    "extra object without kind": (
        {"extraObjects": [{"apiVersion": "v1", "metadata": {"name": "x"}}]},
        "extraObjects",
    ),
    "annotation not a string": ({"service": {"annotations": {"lb": 1}}}, "annotations"),
    "unknown node selection": ({"gpuNodeSelection": "labels"}, "gpuNodeSelection"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_the_schema_types_them_as_kubernetes_does(chart: Chart, tmp_path: Path, case: str) -> None:
    change, field = MALFORMED[case]
    values = {**chart.values, **change}
    if "service" in change:
        values["service"] = {**chart.values["service"], **change["service"]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, chart.schema, cls=jsonschema.Draft7Validator)
    (tmp_path / "v.json").write_text(json.dumps(change))
    result = run_helm("template", "demo", str(chart.root), "-f", str(tmp_path / "v.json"))
    assert result.returncode != 0 and field in result.stderr, result.stderr[-2000:]


# --- GPU Feature Discovery, or the user's own placement ----------------------------------------------


def test_by_default_the_pod_is_placed_on_gpu_feature_discoverys_labels(chart: Chart) -> None:
    assert chart.values["gpuNodeSelection"] == "gfd"
    affinity = pod_of(chart.manifests)["affinity"]
    assert node_matches(affinity, T4_NODE) and not node_matches(affinity, H100_NODE)
    assert not node_matches(affinity, {"kubernetes.io/hostname": "gpu-1"})  # a node without GFD's labels


def test_without_gfd_the_users_node_selector_places_the_pod(chart: Chart) -> None:
    settings = ("--set", "gpuNodeSelection=none", "--set-json", f"nodeSelector={json.dumps(OWN_SELECTOR)}")
    docs = template(chart.root, *settings)
    spec = pod_of(docs)
    assert spec["nodeSelector"] == OWN_SELECTOR
    assert "affinity" not in spec  # no GFD term left to match on a cluster without those labels
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"  # the GPU taint is still tolerated
    # The GPUs are still asked of the NVIDIA device plugin, which must run on the cluster either way.
    assert spec["containers"][0]["resources"]["limits"] == chart.values["resources"]["limits"]
    assert "nvidia.com/gpu" in chart.values["resources"]["limits"]
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(by_kind(docs, "Deployment")[0], version, strict=True)


def test_without_gfd_the_users_node_affinity_is_kept_as_given(chart: Chart, group: Chart) -> None:
    settings = ("--set", "gpuNodeSelection=none", "--set-json", f"affinity={json.dumps(OWN_AFFINITY)}")
    assert pod_of(template(chart.root, *settings))["affinity"] == OWN_AFFINITY
    lws = the_set(template(group.root, *settings))
    for role in ("leader", "worker"):
        assert pod(lws, role)["affinity"] == OWN_AFFINITY, role


@pytest.mark.parametrize(
    "extra", [(), ("--set-json", 'affinity={"podAntiAffinity": {}}')], ids=["bare", "anti"]
)
def test_without_gfd_and_without_a_placement_of_ones_own_the_chart_refuses(
    chart: Chart, group: Chart, extra: tuple[str, ...]
) -> None:
    """Nothing would keep the pod off a GPU of another compute capability, whose fixes differ."""
    for root in (chart.root, group.root):
        result = run_helm("template", "demo", str(root), "--set", "gpuNodeSelection=none", *extra)
        assert result.returncode != 0, root
        assert "gpuNodeSelection none: set nodeSelector or a required node affinity" in result.stderr


def test_a_cpu_chart_has_nothing_to_select(tmp_path: Path, turing_facts: Path) -> None:
    """No GPU terms (a CPU plan): `none` asks for nothing more."""
    profile = profile_variant(
        tmp_path,
        "demo-cpu",
        {
            **LISTEN,
            "serve.allow_unauthenticated": True,
            "model.source": "/models/tiny-llama",
            "model.volumes": [{"kind": "pvc", "claim": "models", "mount_path": "/models"}],
        },
    )
    cpu = render_chart(profile, turing_facts, tmp_path / "out")
    assert cpu.values["gpuNodeSelectorTerms"] == []
    assert "affinity" not in pod_of(template(cpu.root, "--set", "gpuNodeSelection=none"))
