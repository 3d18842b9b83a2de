"""A group over several nodes as a LeaderWorkerSet (issue 44): `render helm` of tensor 8 × pipeline 2 over
`deploy.nodes: 2`, on the recorded 8-GPU H100 facts, checked with the real helm and against the API schemas.

The LeaderWorkerSet is a custom resource, so kubernetes-validate has no schema for it: the set itself is held
to tests/fixtures/lws/leaderworkerset-v1.schema.json, written from the LWS API reference
(https://lws.sigs.k8s.io/docs/reference/leaderworkerset.v1/, leaderworkerset.x-k8s.io/v1; the fields the chart
writes exist since LWS v0.3.0), strict (an unknown field fails), and each of its pod templates is validated as
a Pod with kubernetes-validate's bundled schemas, strict, as the Deployment's pod is in test_helm.py. That
the group's pods really form one vLLM world, wait for each other and fail together:
tests/e2e/test_helm_group_e2e.py.
"""

from __future__ import annotations

import copy
import functools
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from deploykit.plan.group import NodeRole, node_argv
from deploykit.plan.layout import ParallelLayout
from tests.profile_variants import profile_variant
from tests.render.test_helm import (
    FACTS_DIR,
    H100_NODE,
    KUBERNETES_VERSIONS,
    RELEASE,
    T4_NODE,
    Chart,
    injected_keys,
    lint,
    node_matches,
    render_chart,
    run_helm,
    template,
    values_file,
)

pytestmark = pytest.mark.external_tool  # every test here renders with helm

LWS_SCHEMA = Path(__file__).resolve().parents[1] / "fixtures" / "lws" / "leaderworkerset-v1.schema.json"
# Tensor 8 × pipeline 2 is 16 GPUs: two nodes of 8 H100s.
GROUP = {
    "serve.host": "0.0.0.0",
    "serve.tensor_parallel_size": 8,
    "serve.pipeline_parallel_size": 2,
    "deploy.nodes": 2,
}
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
WORKER_INDEX = "$(LWS_WORKER_INDEX)"
LEADER_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"


@pytest.fixture(scope="module")
def group_chart(tmp_path_factory: pytest.TempPathFactory) -> Chart:
    directory = tmp_path_factory.mktemp("group")
    profile = profile_variant(directory, "qwen-lora-hopper", GROUP)
    return render_chart(profile, FACTS_DIR / "h100x8.json", directory / "out")


@functools.cache
def lws_schema() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads(LWS_SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return schema


def the_set(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (lws,) = [d for d in docs if d["kind"] == "LeaderWorkerSet"]
    return lws


def pod(lws: dict[str, Any], role: str) -> dict[str, Any]:
    """The leader's or the workers' PodSpec."""
    spec: dict[str, Any] = lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]["spec"]
    return spec


def containers(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in spec["containers"]}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def validate(docs: list[dict[str, Any]]) -> None:
    """Every manifest against its API schema: the LeaderWorkerSet against the LWS fields' schema, each of its
    pod templates as a Pod, everything else with kubernetes-validate (strict, 1.28 and the newest)."""
    for doc in docs:
        if doc["kind"] != "LeaderWorkerSet":
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)
            continue
        jsonschema.validate(doc, lws_schema(), cls=jsonschema.Draft7Validator)
        for role in ("leader", "worker"):
            template_spec = doc["spec"]["leaderWorkerTemplate"][f"{role}Template"]
            as_pod = {"apiVersion": "v1", "kind": "Pod", **template_spec}
            as_pod["metadata"] = {"name": f"{role}", **template_spec.get("metadata", {})}
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(as_pod, version, strict=True)


def test_a_group_over_two_nodes_is_one_leaderworkerset_of_two_pods(group_chart: Chart) -> None:
    docs = group_chart.manifests
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "ConfigMap", "LeaderWorkerSet", "Pod", "Service"]
    lws = the_set(docs)
    assert lws["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
    assert lws["spec"]["replicas"] == 1  # deploy.replicas: each replica is a whole group
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2 == group_chart.plan["layout"]["nodes"]
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    # Workers are made with the leader, not once it is ready: it is ready only after they joined its world.
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"
    # LWS names its headless Service (the pods' DNS names) after the set: not the release's API Service.
    (service,) = [d for d in docs if d["kind"] == "Service"]
    assert lws["metadata"]["name"] == f"{RELEASE}-group" != service["metadata"]["name"]


def test_leader_and_worker_run_the_plans_argv_with_vllms_node_flags(group_chart: Chart) -> None:
    """The leader is node rank 0 and serves; the workers are headless, their rank and the leader's address
    the placeholders the kubelet fills in from what LWS gives each container."""
    plan = group_chart.plan
    layout = ParallelLayout(**plan["layout"])
    lws = the_set(group_chart.manifests)
    leader = containers(pod(lws, "leader"))["vllm"]["command"]
    worker = containers(pod(lws, "worker"))["vllm"]["command"]
    assert leader == node_argv(
        plan["argv"], layout, NodeRole(node_rank="0", master_addr=LEADER_ADDRESS, leader=True)
    )
    assert worker == node_argv(
        plan["argv"], layout, NodeRole(node_rank=WORKER_INDEX, master_addr=LEADER_ADDRESS, leader=False)
    )
    assert leader[: len(plan["argv"])] == plan["argv"] == worker[: len(plan["argv"])]
    assert leader[len(plan["argv"]) :] == [
        "--nnodes", "2", "--node-rank", "0", "--master-addr", LEADER_ADDRESS, "--master-port", "29501",
    ]  # fmt: skip
    assert worker[len(plan["argv"]) :] == [
        "--nnodes", "2", "--node-rank", WORKER_INDEX, "--master-addr", LEADER_ADDRESS,
        "--master-port", "29501", "--headless",
    ]  # fmt: skip
    assert "--headless" not in leader
    assert group_chart.values["command"] == plan["argv"]  # the single-node argv stays in values, unchanged


def test_each_pod_asks_for_its_nodes_share_of_the_gpus_and_gets_the_same_plugin_and_fixes(
    group_chart: Chart,
) -> None:
    """8 GPUs per pod (the layout's gpu_request, not the world's 16), /dev/shm in memory, the plugin wheel on
    PYTHONPATH and DEPLOYKIT_FIXES in both: every rank runs the fixes the plan decided."""
    assert group_chart.plan["layout"]["gpu_request"] == 8
    lws = the_set(group_chart.manifests)
    wheel = f"/opt/deploykit/{group_chart.values['plugin']['wheel']['file']}"
    for role in ("leader", "worker"):
        spec = pod(lws, role)
        vllm = containers(spec)["vllm"]
        assert vllm["resources"]["limits"] == {"nvidia.com/gpu": 8}, role
        assert vllm["resources"]["requests"]["nvidia.com/gpu"] == 8, role
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}, role
        assert {"name": "dshm", "mountPath": "/dev/shm"} in vllm["volumeMounts"], role
        env = env_of(vllm)
        assert env["PYTHONPATH"] == wheel and env["DEPLOYKIT_FIXES"] == "matmul_lora", role
        assert volumes["deploykit-plugin"]["configMap"]["name"].startswith(f"{RELEASE}-plugin-"), role
        # The node affinity by GPU product of the Deployment's pod: every rank on the GPU the fixes were for.
        assert node_matches(spec["affinity"], H100_NODE) and not node_matches(spec["affinity"], T4_NODE), role


def test_the_service_routes_to_the_leader_only(group_chart: Chart) -> None:
    docs = group_chart.manifests
    (service,) = [d for d in docs if d["kind"] == "Service"]
    assert service["spec"]["selector"] == {
        "app.kubernetes.io/name": "qwen-lora-hopper",
        "app.kubernetes.io/instance": RELEASE,
        LEADER_LABEL: "0",  # LWS labels the leader worker index 0, each worker its own index
    }
    lws = the_set(docs)
    leader_labels = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"]
    worker_labels = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"]
    template_selector = {k: v for k, v in service["spec"]["selector"].items() if k != LEADER_LABEL}
    assert (
        template_selector.items() <= leader_labels.items()
        and template_selector.items() <= worker_labels.items()
    )
    leader, worker = containers(pod(lws, "leader"))["vllm"], containers(pod(lws, "worker"))["vllm"]
    ports = {p["name"]: p["containerPort"] for p in leader["ports"]}
    assert ports == {"http": 8000, "rendezvous": 29501}  # the API, and the world's rendezvous (pod to pod)
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert "ports" not in worker  # headless: nothing to route to


def test_probes_and_the_canary_are_the_leaders_the_workers_wait_for_it(group_chart: Chart) -> None:
    lws = the_set(group_chart.manifests)
    leader, worker = pod(lws, "leader"), pod(lws, "worker")
    assert list(containers(leader)) == ["vllm", "canary"]
    vllm = containers(leader)["vllm"]
    assert vllm["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    for probe, mode in (("readinessProbe", "ready"), ("livenessProbe", "live")):
        assert vllm[probe]["exec"]["command"][:4] == ["python3", "-m", "deploykit.render.pod_probe", mode]
    assert {"canary-verdict", "canary-ledger", "canary-profile"} <= {v["name"] for v in leader["volumes"]}
    assert list(containers(worker)) == ["vllm"]
    headless = containers(worker)["vllm"]
    assert not {"startupProbe", "readinessProbe", "livenessProbe"} & set(headless)
    assert not any(v["name"].startswith("canary") for v in worker["volumes"])
    (wait,) = worker["initContainers"]
    assert wait["name"] == "wait-for-leader" and wait["command"][:2] == ["python3", "-c"]
    # The leader's rendezvous, for at most deploy.startup_timeout_s.
    assert wait["command"][3:] == [LEADER_ADDRESS, "29501", "2400"]
    assert "initContainers" not in leader


def test_without_the_canary_the_leader_gets_the_health_probes_and_the_workers_none(
    group_chart: Chart,
) -> None:
    docs = template(group_chart.root, "--set", "canary.enabled=false")
    lws = the_set(docs)
    vllm = containers(pod(lws, "leader"))["vllm"]
    assert list(containers(pod(lws, "leader"))) == ["vllm"]
    assert (
        vllm["readinessProbe"]["httpGet"]
        == vllm["livenessProbe"]["httpGet"]
        == {"path": "/health", "port": "http"}
    )
    assert not {"readinessProbe", "livenessProbe"} & set(containers(pod(lws, "worker"))["vllm"])
    validate(docs)


def wait_command(chart: Chart, port: int, seconds: int) -> list[str]:
    """The workers' wait for the leader as `helm template` renders it, with the address the kubelet would
    put in for $(LWS_LEADER_ADDRESS)."""
    docs = template(
        chart.root, "--set", f"group.masterPort={port}", "--set", f"group.leaderWaitSeconds={seconds}"
    )
    (wait,) = pod(the_set(docs), "worker")["initContainers"]
    command = [word.replace(LEADER_ADDRESS, "127.0.0.1") for word in wait["command"]]
    assert command[0] == "python3"
    return [sys.executable, *command[1:]]


def test_the_workers_wait_ends_when_the_leader_listens_and_fails_past_its_deadline(
    group_chart: Chart,
) -> None:
    """The rendered init container's own command, run: it returns once the port takes a connection (a
    leader that starts listening while it waits), and fails, saying so, when nothing listens in time."""
    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        port = spare.getsockname()[1]
    started = time.monotonic()
    refused = subprocess.run(wait_command(group_chart, port, 1), capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1, refused.stderr
    assert f"127.0.0.1:{port} did not answer within 1 s" in refused.stderr
    assert time.monotonic() - started < 30
    with socket.socket() as leader:
        leader.bind(("127.0.0.1", 0))
        port = leader.getsockname()[1]
        waiter = subprocess.Popen(
            wait_command(group_chart, port, 120), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        time.sleep(3)  # the worker is up first: nothing listens yet
        assert waiter.poll() is None
        leader.listen()
        out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, err
    assert f"the leader's rendezvous 127.0.0.1:{port} answers after" in out


@pytest.mark.parametrize("canary", ["true", "false"])
def test_lint_strict_is_clean(group_chart: Chart, canary: str) -> None:
    result = run_helm("lint", "--strict", str(group_chart.root), "--set", f"canary.enabled={canary}")
    output = result.stdout + result.stderr
    assert result.returncode == 0 and "[WARNING]" not in output and "[ERROR]" not in output, output
    assert lint(group_chart.root).returncode == 0


def test_values_and_every_manifest_validate_against_their_schemas(group_chart: Chart) -> None:
    jsonschema.validate(group_chart.values, group_chart.schema, cls=jsonschema.Draft7Validator)
    validate(group_chart.manifests)
    for options in (
        ("--set", "plugin.source=index", "--set", "plugin.index.secretName=pip-index"),
        ("--set", "podDisruptionBudget.enabled=true", "--set", "replicaCount=3"),
        ("--set", "cache.existingClaim=model-cache"),
    ):
        validate(template(group_chart.root, *options))


def rolling_update(lws: dict[str, Any]) -> dict[str, Any]:
    update: dict[str, Any] = lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]
    return update


# LWS schema checks that must fail, so a passing validation means something: (change, why).
WRONG_SETS = {
    "a misspelt field": lambda lws: lws["spec"]["leaderWorkerTemplate"].update(sizes=2),
    "a restart policy LWS does not have": lambda lws: lws["spec"]["leaderWorkerTemplate"].update(
        restartPolicy="RecreateGroupOnRestart"
    ),
    "a size that is no count": lambda lws: lws["spec"]["leaderWorkerTemplate"].update(size="2"),
    "a rollout that cannot move": lambda lws: rolling_update(lws).update(maxSurge=0, maxUnavailable=0),
    "no worker template": lambda lws: lws["spec"]["leaderWorkerTemplate"].pop("workerTemplate"),
}


@pytest.mark.parametrize("case", WRONG_SETS)
def test_the_lws_schema_rejects_a_wrong_set(group_chart: Chart, case: str) -> None:
    lws = copy.deepcopy(the_set(group_chart.manifests))
    WRONG_SETS[case](lws)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(lws, lws_schema(), cls=jsonschema.Draft7Validator)


def test_a_worker_pod_template_with_a_misspelt_field_fails_kubernetes_validation(group_chart: Chart) -> None:
    lws = copy.deepcopy(the_set(group_chart.manifests))
    containers(pod(lws, "worker"))["vllm"]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        validate([lws])


def rollout_of(chart: Chart, *settings: str) -> tuple[int, dict[str, Any]]:
    options = [word for setting in settings for word in ("--set", setting)]
    docs = template(chart.root, *options)
    validate(docs)
    lws = the_set(docs)
    assert lws["spec"]["rolloutStrategy"]["type"] == "RollingUpdate"
    return lws["spec"]["replicas"], lws["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]


# replicaCount and rollout settings → (groups, the set's rolling update), as the Deployment decides it
# (docs/deploy.md, Replicas): one group at a time with no extra group unless a surge is asked for.
GROUP_ROLLOUTS = {
    "three groups, one at a time": (("replicaCount=3",), (3, {"maxSurge": 0, "maxUnavailable": 1})),
    "one group, replaced (LWS has no Recreate)": (
        ("replicaCount=1",),
        (1, {"maxSurge": 0, "maxUnavailable": 1}),
    ),
    "one group with a surge": (
        ("replicaCount=1", "rollout.maxSurge=1"),
        (1, {"maxSurge": 1, "maxUnavailable": 0}),
    ),
    "three groups, one extra": (
        ("replicaCount=3", "rollout.maxSurge=1"),
        (3, {"maxSurge": 1, "maxUnavailable": 1}),
    ),
    "four groups, two at a time": (
        ("replicaCount=4", "rollout.maxUnavailable=2"),
        (4, {"maxSurge": 0, "maxUnavailable": 2}),
    ),
}


@pytest.mark.parametrize("case", GROUP_ROLLOUTS)
def test_groups_roll_like_the_deployments_pods(group_chart: Chart, case: str) -> None:
    settings, expected = GROUP_ROLLOUTS[case]
    assert rollout_of(group_chart, *settings) == expected


def test_the_budget_counts_the_groups_pods(group_chart: Chart) -> None:
    """A drain takes as many pods at a time as a rollout takes groups (one pod down takes its group down)."""
    docs = template(group_chart.root, "--set", "podDisruptionBudget.enabled=true", "--set", "replicaCount=3")
    (budget,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels(the_set(docs), "worker").items()


def pod_labels(lws: dict[str, Any], role: str) -> dict[str, str]:
    labels: dict[str, str] = lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]["metadata"]["labels"]
    return labels


def test_the_fabric_environment_reaches_leader_and_workers(group_chart: Chart, tmp_path: Path) -> None:
    fabric = {"group": {"fabricEnv": {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_IB_HCA": "mlx5", "NCCL_DEBUG": 1}}}
    docs = template(group_chart.root, "-f", str(values_file(tmp_path, fabric)))
    validate(docs)
    for role in ("leader", "worker"):
        env = env_of(containers(pod(the_set(docs), role))["vllm"])
        fabric_env = (env["NCCL_SOCKET_IFNAME"], env["NCCL_IB_HCA"], env["NCCL_DEBUG"])
        assert fabric_env == ("eth0", "mlx5", "1"), role
    assert "NCCL_DEBUG" not in env_of(containers(pod(the_set(docs), "leader"))["canary"])


# Values the chart refuses for a group: (values, what helm says).
GROUP_REFUSALS: dict[str, tuple[dict[str, Any], str]] = {
    "a size the commands were not planned for": (
        {"group": {"size": 3}},
        "group.size 3: the group's commands were planned for --nnodes 2",
    ),
    "PYTHONPATH as fabric (the plugin's would be lost)": (
        {"group": {"fabricEnv": {"PYTHONPATH": "/x"}}},
        "schema",
    ),
    "a fabric variable the env sets too": (
        {"group": {"fabricEnv": {"DEPLOYKIT_FIXES": ""}}},
        "group.fabricEnv.DEPLOYKIT_FIXES: env sets DEPLOYKIT_FIXES too",
    ),
    "a worker command that is not headless": (
        {"group": {"workerCommand": ["vllm", "serve", "m", "--nnodes", "2"]}},
        "schema",
    ),
    "a group of one": ({"group": {"size": 1}}, "schema"),
    "an unknown group key": ({"group": {"nodes": 2}}, "schema"),
}


@pytest.mark.parametrize("case", GROUP_REFUSALS)
def test_the_chart_refuses_group_values_that_cannot_form_the_world(
    group_chart: Chart, tmp_path: Path, case: str
) -> None:
    values, message = GROUP_REFUSALS[case]
    result = run_helm("template", RELEASE, str(group_chart.root), "-f", str(values_file(tmp_path, values)))
    assert result.returncode != 0 and message in result.stderr, result.stderr


def test_a_release_name_too_long_for_the_sets_pod_names_is_refused(group_chart: Chart) -> None:
    result = run_helm("template", "r" * 44, str(group_chart.root))
    assert result.returncode != 0 and "use a release name of at most 43" in result.stderr, result.stderr
    assert run_helm("template", "r" * 43, str(group_chart.root)).returncode == 0


def test_no_group_value_injects_yaml_even_past_the_schema(group_chart: Chart, tmp_path: Path) -> None:
    """A line break in a fabric variable's name or value stays inside one quoted scalar."""
    hostile = {
        "group": {
            "fabricEnv": {"NCCL_DEBUG\n        injected: true": "INFO\n        injected: true"},
            "leaderWaitSeconds": "1\n    injected: true",
            "masterPort": "2\n  - injected",
        }
    }
    docs = template(group_chart.root, "-f", str(values_file(tmp_path, hostile)), "--skip-schema-validation")
    assert injected_keys(docs) == []
    assert injected_keys(group_chart.manifests) == []


def test_a_single_node_chart_has_no_group(tmp_path: Path) -> None:
    """deploy.nodes: 1 (the default) renders the Deployment as before: no group values, no set."""
    profile = profile_variant(
        tmp_path, "qwen-lora-hopper", {"serve.host": "0.0.0.0", "serve.tensor_parallel_size": 8}
    )
    chart = render_chart(profile, FACTS_DIR / "h100x8.json", tmp_path / "out")
    assert "group" not in chart.values
    kinds = sorted(d["kind"] for d in chart.manifests)
    assert kinds == ["ConfigMap", "ConfigMap", "Deployment", "PersistentVolumeClaim", "Pod", "Service"]
    (service,) = [d for d in chart.manifests if d["kind"] == "Service"]
    assert LEADER_LABEL not in service["spec"]["selector"]
