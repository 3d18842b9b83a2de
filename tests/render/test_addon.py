"""`deploykit addon` (deploykit.render.addon) on manifests of the shapes production-stack, llm-d's
modelservice (a Deployment, and a LeaderWorkerSet for multinode) and KServe's vLLM runtime render
(tests/fixtures/addon/, written from their public documentation). Each gets the plugin, the fix environment,
the canary and the verdict probes; every manifest validates against the Kubernetes API schemas
(kubernetes-validate, strict; a LeaderWorkerSet against tests/fixtures/lws, its pod templates and KServe's
containers as Pods); an argv that contradicts the plan is refused in one line naming the object, the
container and the flag; a second pass changes nothing; what runs no vLLM is left as it was. In process, no
helm: tests/render/test_addon_chart.py runs deploykit's own chart and the Helm post-renderer."""

from __future__ import annotations

import base64
import copy
import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from deploykit import exit_codes
from deploykit.errors import RenderError
from deploykit.probe.load import load_facts
from deploykit.profile.load import load_profile
from deploykit.render.addon import (
    AddonOptions,
    AddonParts,
    LaunchSetting,
    addon_parts,
    apply_addon,
    helm_plugin,
    setting_value,
    split_documents,
)
from deploykit.render.common import plan_for_render
from deploykit.render.helm import PLUGIN_PATH
from deploykit.render.plugin_wheel import PluginWheel, build_plugin_wheel
from tests.cli_process import run_deploykit

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "addon"
FACTS = REPO / "tests" / "fixtures" / "facts"
LWS_SCHEMA = REPO / "tests" / "fixtures" / "lws" / "leaderworkerset-v1.schema.json"
KUBERNETES_VERSIONS = ("1.28", kubernetes_validate.utils.latest_version())
CORE_KINDS = {"ConfigMap", "Deployment", "Service", "StatefulSet"}
# shape → (manifests, profile, facts, the vLLM container's name, the port vLLM listens on)
SHAPES: dict[str, tuple[str, str, str, str, int]] = {
    "production-stack": ("production-stack.yaml", "stack-llama", "h100.json", "vllm", 8000),
    "llm-d": ("llm-d-modelservice.yaml", "llmd-qwen", "h100.json", "vllm", 8200),
    "llm-d-multinode": (
        "llm-d-modelservice-multinode.yaml",
        "llmd-qwen-multinode",
        "h100x8.json",
        "vllm",
        8200,
    ),
    "kserve": ("kserve-vllm.yaml", "kserve-granite", "h100.json", "kserve-container", 8080),
}


@functools.cache
def wheel() -> PluginWheel:
    return build_plugin_wheel()


@functools.cache
def parts_for(profile: str, facts: str) -> AddonParts:
    loaded = load_profile(str(FIXTURES / "profiles" / f"{profile}.yaml"))
    plan = plan_for_render(loaded, load_facts(str(FACTS / facts)))
    return addon_parts(plan, loaded, wheel())


def stream(shape: str) -> str:
    return (FIXTURES / SHAPES[shape][0]).read_text()


def parts(shape: str) -> AddonParts:
    return parts_for(SHAPES[shape][1], SHAPES[shape][2])


def docs_of(text: str) -> list[dict[str, Any]]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the plugin's ConfigMap is ~1 MiB of text
    return [doc for doc in yaml.load_all(text, Loader=loader) if doc]


@functools.cache
def added(shape: str) -> str:
    return apply_addon(stream(shape), parts(shape), AddonOptions()).text


def pods(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(role, pod spec, pod metadata) of each pod template of a manifest; KServe's spec holds its metadata."""
    spec = doc.get("spec") or {}
    if doc["kind"] in ("Deployment", "StatefulSet"):
        yield "server", spec["template"]["spec"], spec["template"].get("metadata") or {}
    elif doc["kind"] == "LeaderWorkerSet":
        group = spec["leaderWorkerTemplate"]
        if "leaderTemplate" in group:
            yield "leader", group["leaderTemplate"]["spec"], group["leaderTemplate"].get("metadata") or {}
        yield "worker", group["workerTemplate"]["spec"], group["workerTemplate"].get("metadata") or {}
    elif doc["kind"] == "ServingRuntime":
        yield "server", spec, spec
    elif doc["kind"] == "InferenceService" and spec["predictor"].get("containers"):
        yield "server", spec["predictor"], spec["predictor"]


def vllm_pods(doc: dict[str, Any], vllm: str) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """The pod templates of a manifest that run the vLLM container (named `vllm`)."""
    for role, spec, metadata in pods(doc):
        if any(container["name"] == vllm for container in spec["containers"]):
            yield role, spec, metadata


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [item for item in items if item.get("name") == name]
    return found


# --- what is added ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_each_shape_gets_the_plugin_the_fixes_the_canary_and_the_probes(shape: str) -> None:
    _, profile, _, vllm, port = SHAPES[shape]
    planned = parts(shape)
    docs = docs_of(added(shape))
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    (plugin,) = [d for d in configmaps.values() if "binaryData" in d]
    assert plugin["immutable"] is True and plugin["metadata"]["name"].endswith(wheel().sha256[:12])
    assert base64.b64decode(plugin["binaryData"][wheel().filename]) == wheel().data
    (profile_map,) = [d for d in configmaps.values() if "data" in d]
    assert profile_map["data"]["profile.yaml"] == (FIXTURES / "profiles" / f"{profile}.yaml").read_text()
    servers = 0
    for doc in docs:
        for role, spec, metadata in vllm_pods(doc, vllm):
            container = named(spec["containers"], vllm)
            env = env_of(container)
            assert container["env"][0] == {"name": "PYTHONPATH", "value": f"{PLUGIN_PATH}/{wheel().filename}"}
            assert {key: env[key] for key in planned.env} == planned.env and planned.env
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            assert mounts["deploykit-plugin"] == PLUGIN_PATH
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert volumes["deploykit-plugin"]["configMap"]["name"] == plugin["metadata"]["name"]
            assert metadata["annotations"]["deploykit.io/plugin"] == f"sha256:{wheel().sha256}"
            names = [c["name"] for c in spec["containers"]]
            if role == "worker":
                assert "canary" not in names and "canary-verdict" not in volumes
                continue
            servers += 1
            canary = named(spec["containers"], "canary")
            assert canary["command"][:3] == ["python3", "-m", "deploykit.render.canary_keeper"]
            assert canary["command"][canary["command"].index("--url") + 1] == f"http://127.0.0.1:{port}"
            assert volumes["canary-profile"]["configMap"]["name"] == profile_map["metadata"]["name"]
            assert {"canary-scratch", "canary-verdict", "canary-ledger"} <= set(volumes)
            for probe, mode in (("readinessProbe", "ready"), ("livenessProbe", "live")):
                command = container[probe]["exec"]["command"]
                assert command[:4] == ["python3", "-m", "deploykit.render.pod_probe", mode]
                assert command[command.index("--health-url") + 1] == f"http://127.0.0.1:{port}/health"
            assert "startupProbe" in container  # the verdict probes only start after it passes
            assert mounts["canary-verdict"] == "/run/deploykit"
    assert servers == (2 if shape == "kserve" else 1)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_manifest_validates_against_its_schema(shape: str) -> None:
    lws_schema = json.loads(LWS_SCHEMA.read_text())
    for doc in docs_of(added(shape)):
        if doc["kind"] in CORE_KINDS:
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)
            continue
        if doc["kind"] == "LeaderWorkerSet":
            jsonschema.validate(doc, lws_schema, cls=jsonschema.Draft7Validator)
        for role, spec, _ in pods(doc):
            # KServe's and LWS's pod parts as a Pod: the containers and volumes are Kubernetes' own types.
            pod_spec: dict[str, Any] = {
                k: spec[k] for k in ("containers", "volumes", "initContainers") if k in spec
            }
            if doc["kind"] == "LeaderWorkerSet":
                pod_spec = spec
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": role}, "spec": pod_spec}
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(pod, version, strict=True)


def test_the_schema_check_can_fail() -> None:
    doc = docs_of(added("production-stack"))[-1]
    broken = copy.deepcopy(doc)
    broken["spec"]["template"]["spec"]["containers"][1]["readinessProbe"] = {"exec": {"commands": ["x"]}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[-1], strict=True)


def test_a_planned_fix_flag_and_its_variables_are_added_to_production_stacks_argv() -> None:
    (deployment,) = [d for d in docs_of(added("production-stack")) if d["metadata"]["name"].endswith("-vllm")]
    spec = deployment["spec"]["template"]["spec"]
    container = named(spec["containers"], "vllm")
    assert container["command"][-2:] == [
        "--logits-processors",
        "deploykit.fixes.penalties:DevicePenaltiesProcessor",
    ]
    env = env_of(container)
    assert env["DEPLOYKIT_FIXES"] == "device_penalties" and env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    # The canary reads vLLM's key from the Secret vLLM reads it from; it runs as nobody in a pod with no user.
    canary = named(spec["containers"], "canary")
    assert canary["command"][-2:] == ["--api-key-file", "/etc/deploykit-key/api-key"]
    assert env_of(canary)["DEPLOYKIT_API_KEY"] == {"secretKeyRef": {"name": "vllm-api-key", "key": "key"}}
    key = named(spec["volumes"], "canary-key")["secret"]
    assert key == {"secretName": "vllm-api-key", "items": [{"key": "key", "path": "api-key"}]}
    assert canary["securityContext"]["runAsUser"] == 65534
    assert deployment["metadata"]["annotations"]["deploykit.io/profile"] == "stack-llama"
    # production-stack's own startup probe is kept; its liveness is the verdict probe now.
    assert container["startupProbe"]["failureThreshold"] == 60


def test_llm_d_multinode_gets_a_leader_template_with_the_canary_and_workers_with_the_plugin() -> None:
    source = docs_of(stream("llm-d-multinode"))[0]["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    (lws,) = docs_of(added("llm-d-multinode"))[2:]
    group = lws["spec"]["leaderWorkerTemplate"]
    leader, worker = group["leaderTemplate"], group["workerTemplate"]
    assert [c["name"] for c in leader["spec"]["containers"]] == ["vllm", "canary"]
    assert [c["name"] for c in worker["spec"]["containers"]] == ["vllm"]
    # The leader runs what the workers run (LWS ran it from the worker template before), plus deploykit.
    assert (
        leader["spec"]["initContainers"]
        == worker["spec"]["initContainers"]
        == source["spec"]["initContainers"]
    )
    assert named(leader["spec"]["containers"], "vllm")["args"] == source["spec"]["containers"][0]["args"]
    workers_vllm = named(worker["spec"]["containers"], "vllm")
    assert "readinessProbe" not in workers_vllm and env_of(workers_vllm)["DEPLOYKIT_FIXES"] == "matmul_lora"


def test_kserve_runtime_serves_the_inference_services_name_and_its_pods_get_the_annotations() -> None:
    docs = {d["metadata"]["name"]: d for d in docs_of(added("kserve"))}
    runtime = docs["vllm-runtime"]["spec"]
    assert runtime["annotations"]["deploykit.io/plugin"] == f"sha256:{wheel().sha256}"
    assert runtime["annotations"]["prometheus.io/port"] == "8080"  # theirs kept
    assert [c["name"] for c in runtime["containers"]] == ["kserve-container", "canary"]
    # The InferenceService that only names the runtime is left alone.
    assert docs["granite"] == docs_of(stream("kserve"))[1]


@pytest.mark.parametrize("shape", SHAPES)
def test_what_runs_no_vllm_is_left_as_it_was(shape: str) -> None:
    before = docs_of(stream(shape))
    after = {(d["kind"], d["metadata"]["name"]): d for d in docs_of(added(shape))}
    vllm = SHAPES[shape][3]
    for doc in before:
        changed = after[(doc["kind"], doc["metadata"]["name"])]
        if not list(vllm_pods(doc, vllm)):
            assert changed == doc  # the router, the Services, an InferenceService that names a runtime
            continue
        for (_, spec, _), (_, new_spec, _) in zip(pods(doc), pods(changed), strict=False):
            assert new_spec.get("initContainers") == spec.get("initContainers")
            for container in spec["containers"]:
                if container["name"] != vllm:
                    assert named(new_spec["containers"], container["name"]) == container


def test_the_text_of_unchanged_documents_is_kept() -> None:
    text = stream("production-stack")
    out = added("production-stack")
    router = [chunk for chunk in split_documents(text) if "vllm-deployment-router" in chunk]
    assert router and router[0] in out  # comments and quoting as written


@pytest.mark.parametrize("shape", SHAPES)
def test_applying_it_twice_changes_nothing(shape: str) -> None:
    once = added(shape)
    assert apply_addon(once, parts(shape), AddonOptions()).text == once


def test_the_configmaps_take_the_name_given_and_the_namespace_of_the_workload() -> None:
    out = apply_addon(stream("production-stack"), parts("production-stack"), AddonOptions(name="vllm")).text
    names = {
        (d["metadata"]["name"], d["metadata"].get("namespace"))
        for d in docs_of(out)
        if d["kind"] == "ConfigMap"
    }
    assert names == {(f"vllm-plugin-{wheel().sha256[:12]}", "default"), ("vllm-profile", "default")}


def test_with_the_plugin_in_the_image_nothing_is_mounted() -> None:
    planned = parts("llm-d").model_copy(update={"wheel": None})
    out = apply_addon(stream("llm-d"), planned, AddonOptions(plugin_source="image")).text
    docs = docs_of(out)
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"] == [
        "qwen-llm-d-modelservice-decode-profile"
    ]
    ((_, spec, metadata),) = list(pods(docs[-1]))
    container = named(spec["containers"], "vllm")
    assert "PYTHONPATH" not in env_of(container) and "deploykit-plugin" not in str(spec)
    assert metadata["annotations"]["deploykit.io/plugin"] == "image:ghcr.io/llm-d/llm-d-cuda:v0.3.0"


def test_a_workaround_setting_is_added_when_missing_and_refused_when_set_otherwise() -> None:
    """A dotted JSON key, the form several workarounds take (--compilation-config.cudagraph_mode=...)."""
    workaround = LaunchSetting(
        words=["--compilation-config.cudagraph_mode=PIECEWISE"],
        key="--compilation-config.cudagraph_mode",
        value="PIECEWISE",
        why="workaround gpt-oss-full-cudagraph-triton",
    )
    planned = parts("llm-d").model_copy(update={"launch": [workaround]})
    out = docs_of(apply_addon(stream("llm-d"), planned, AddonOptions()).text)
    args = named(out[-1]["spec"]["template"]["spec"]["containers"], "vllm")["args"]
    assert args[-1] == "--compilation-config.cudagraph_mode=PIECEWISE"
    assert setting_value(["-cc", '{"cudagraph_mode": "PIECEWISE"}'], workaround.key) == "PIECEWISE"
    text = stream("llm-d").replace(
        '- "64"', '- "64"\n            - -cc\n            - \'{"cudagraph_mode": "FULL"}\''
    )
    with pytest.raises(
        RenderError, match=r"--compilation-config\.cudagraph_mode FULL conflicts with workaround"
    ):
        apply_addon(text, planned, AddonOptions())


# --- refused ----------------------------------------------------------------------------------------------


def edit(shape: str, old: str, new: str) -> str:
    text = stream(shape)
    assert old in text, old
    return text.replace(old, new, 1)


STACK = "Deployment vllm-llama3-deployment-vllm, container vllm"
LLMD = "Deployment qwen-llm-d-modelservice-decode, container vllm"
# (shape, the manifests changed, what the one line must say)
REFUSALS: dict[str, tuple[str, Callable[[], str], list[str]]] = {
    "another model": (
        "production-stack",
        lambda: edit(
            "production-stack", '"meta-llama/Meta-Llama-3-8B-Instruct"', '"mistralai/Mistral-7B-v0.3"'
        ),
        [STACK, "serves mistralai/Mistral-7B-v0.3", "meta-llama/Meta-Llama-3-8B-Instruct"],
    ),
    "another tensor parallel size": (
        "production-stack",
        lambda: edit(
            "production-stack",
            '- "8192"\n',
            '- "8192"\n          - "--tensor-parallel-size"\n          - "2"\n',
        ),
        [STACK, "--tensor-parallel-size 2", "--tensor-parallel-size 1"],
    ),
    "a fix's launch flag set otherwise": (
        "production-stack",
        lambda: edit(
            "production-stack", '- "8192"\n', '- "8192"\n          - "--logits-processors=my.mod:Proc"\n'
        ),
        [STACK, "--logits-processors my.mod:Proc conflicts with fix device_penalties"],
    ),
    "a fix's variable set otherwise": (
        "production-stack",
        lambda: edit(
            "production-stack",
            "- name: HF_HOME\n            value: /tmp",
            '- name: VLLM_USE_V2_MODEL_RUNNER\n            value: "1"',
        ),
        [STACK, "env VLLM_USE_V2_MODEL_RUNNER is '1'", "VLLM_USE_V2_MODEL_RUNNER='0'"],
    ),
    "vLLM's plugins without deploykit": (
        "llm-d",
        lambda: edit(
            "llm-d",
            "- name: HF_HOME",
            "- name: VLLM_PLUGINS\n              value: lora_resolver\n            - name: HF_HOME",
        ),
        [LLMD, "VLLM_PLUGINS leaves deploykit out"],
    ),
    "another dtype": (
        "llm-d",
        lambda: edit("llm-d", '- "64"', '- "64"\n            - --dtype=half'),
        [LLMD, "--dtype float16", "--dtype auto"],
    ),
    "no LoRA where the plan decided with it": (
        "llm-d",
        lambda: edit("llm-d", "            - --enable-lora\n", ""),
        [LLMD, "no --enable-lora", "with LoRA"],
    ),
    "another served name": (
        "llm-d",
        lambda: edit("llm-d", '- "Qwen/Qwen3-8B"', '- "qwen"'),
        [LLMD, "serves the model as qwen", "as Qwen/Qwen3-8B"],
    ),
    "a group of another size": (
        "llm-d-multinode",
        lambda: edit("llm-d-multinode", "size: 2", "size: 3"),
        ["LeaderWorkerSet qwen-llm-d-modelservice-decode (leader)", "group of 3 pod(s)", "spans 2 node(s)"],
    ),
    "a runtime with another tensor parallel size": (
        "kserve",
        lambda: edit("kserve", "- --port=8080", "- --port=8080\n        - --tensor-parallel-size=2"),
        [
            "ServingRuntime vllm-runtime, container kserve-container (with InferenceService granite)",
            "--tensor-parallel-size 2",
        ],
    ),
    "an InferenceService's args that change the runtime's model": (
        "kserve",
        lambda: edit(
            "kserve",
            "      runtime: vllm-runtime",
            "      runtime: vllm-runtime\n      args: [--model=/mnt/other]",
        ),
        ["(with InferenceService granite)", "serves /mnt/other"],
    ),
    "vLLM started from a shell": (
        "llm-d",
        lambda: edit(
            "llm-d",
            'command: ["vllm", "serve"]',
            'command: ["/bin/sh", "-c", "exec vllm serve \\"$@\\"", "--"]',
        ),
        [LLMD, "from a sh command line"],
    ),
    "an API key in the argv": (
        "llm-d",
        lambda: edit("llm-d", '- "64"', '- "64"\n            - --api-key\n            - s3cret'),
        [LLMD, "passes --api-key in its argv"],
    ),
    "no API key where the profile serves with one": (
        "production-stack",
        lambda: edit(
            "production-stack",
            "- name: VLLM_API_KEY\n            valueFrom:\n              secretKeyRef:\n"
            "                name: vllm-api-key\n                key: key\n          ports",
            "ports",
        ),
        [STACK, "has no VLLM_API_KEY", "serve.api_key_env DEPLOYKIT_API_KEY"],
    ),
    "another vLLM release in vLLM's image": (
        "production-stack",
        lambda: edit("production-stack", '"vllm/vllm-openai:v0.33.0"', '"vllm/vllm-openai:v0.32.0"'),
        [STACK, "runs vllm/vllm-openai:v0.32.0", "vLLM 0.33.0"],
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_an_argv_that_contradicts_the_plan_is_refused_in_one_line(case: str) -> None:
    shape, text, says = REFUSALS[case]
    with pytest.raises(RenderError) as refused:
        apply_addon(text(), parts(shape), AddonOptions())
    line = str(refused.value)
    assert "\n" not in line
    for words in says:
        assert words in line, line
    assert refused.value.exit_code == exit_codes.USAGE


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("apiVersion: v1\nkind: Service\nmetadata: {name: x}\n", "no vLLM container in the input"),
        ("a: [unclosed\n", "document 1 is not YAML"),
    ],
)
def test_input_without_vllm_or_yaml_is_refused(text: str, says: str) -> None:
    with pytest.raises(RenderError, match=says):
        apply_addon(text, parts("llm-d"), AddonOptions())


def test_a_name_that_cannot_name_a_configmap_is_refused() -> None:
    with pytest.raises(RenderError, match=r"name 'Not_A_Name'.*DNS label"):
        apply_addon(stream("llm-d"), parts("llm-d"), AddonOptions(name="Not_A_Name"))


def test_a_router_image_named_for_vllm_without_a_model_is_no_vllm_server() -> None:
    text = stream("production-stack").replace(
        "lmcache/lmstack-router:latest", "vllm/production-stack-router:v1"
    )
    out = docs_of(apply_addon(text, parts("production-stack"), AddonOptions()).text)
    (router,) = [d for d in out if d["metadata"]["name"] == "vllm-deployment-router"]
    assert router == docs_of(text)[1]


def test_a_cluster_wide_runtime_is_warned_of_its_namespaces() -> None:
    text = stream("kserve").replace("kind: ServingRuntime", "kind: ClusterServingRuntime", 1)
    result = apply_addon(text, parts("kserve"), AddonOptions())
    assert any("ClusterServingRuntime vllm-runtime is cluster-wide" in w for w in result.warnings)


# --- the command line -------------------------------------------------------------------------------------


def addon_args(shape: str) -> list[str]:
    _, profile, facts, _, _ = SHAPES[shape]
    return [
        "addon",
        "--profile",
        str(FIXTURES / "profiles" / f"{profile}.yaml"),
        "--facts",
        str(FACTS / facts),
    ]


def test_the_command_reads_stdin_and_writes_the_same_as_the_transform() -> None:
    result = run_deploykit(addon_args("llm-d"), input=stream("llm-d"))
    assert result.returncode == exit_codes.OK, result.stderr
    assert result.stdout == added("llm-d")
    assert all(line.startswith("deploykit addon: warning: ") for line in result.stderr.splitlines())


def test_the_command_refuses_with_one_line_and_the_usage_code() -> None:
    text = REFUSALS["another tensor parallel size"][1]()
    result = run_deploykit(addon_args("production-stack"), input=text)
    assert result.returncode == exit_codes.USAGE and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"deploykit: addon: {STACK}: --tensor-parallel-size 2; the plan (profile stack-llama) runs "
        "--tensor-parallel-size 1, and its fixes were decided for that layout"
    ]


def test_the_command_imports_neither_torch_nor_vllm(tmp_path: Path) -> None:
    """`python -X importtime` lists every module the command imported (as tests/cli/test_imports.py does)."""
    manifests = tmp_path / "in.yaml"
    manifests.write_text(stream("kserve"))
    deploykit = Path(sys.executable).with_name("deploykit")
    result = subprocess.run(
        [sys.executable, "-X", "importtime", str(deploykit), *addon_args("kserve"), "--in", str(manifests)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "deploykit.render.addon" in modules and "kind: ServingRuntime" in result.stdout
    assert {m for m in modules if m.split(".")[0] in ("torch", "vllm", "transformers", "triton")} == set()


def test_the_helm_plugin_runs_the_addon_with_its_arguments_and_shows_its_lines() -> None:
    files = {f.path: f for f in helm_plugin("/opt/my python/bin/python3").files}
    plugin = yaml.safe_load(str(files["deploykit-addon/plugin.yaml"].content))
    assert plugin["type"] == "postrenderer/v1" and plugin["runtime"] == "subprocess"
    assert plugin["runtimeConfig"]["platformCommand"] == [{"command": "${HELM_PLUGIN_DIR}/addon.sh"}]
    script = files["deploykit-addon/addon.sh"]
    assert script.mode == 0o755
    assert "'/opt/my python/bin/python3' -m deploykit addon \"$@\"" in str(script.content)
    with pytest.raises(RenderError, match="on one line"):
        helm_plugin("/bin/python3\nrm -rf /")
