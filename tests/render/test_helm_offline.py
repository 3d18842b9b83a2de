"""The chart on a cluster without egress, and the extension points a platform team expects (issue 34).

The model and LoRA adapters come from a source in the release (`model.volumes`: a PVC, a node directory, an
image volume, or a download init container, never by default), render refuses a local path that none holds,
and a staged model runs with the hub switched off. Values a platform team sets (extra env with valueFrom,
volumes, mounts, init containers, service links, the update strategy, the `helm test` pod's placement) reach
the pods, typed by the values schema; PYTHONPATH is joined with the plugin's, never replaced; containers that
want no GPU see none."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from deploykit.profile.load import parse_profile
from deploykit.profile.schema import ProfileError
from tests.render.conftest import deploykit
from tests.render.test_helm import (
    FACTS_DIR,
    KUBERNETES_VERSIONS,
    Chart,
    charts,
    pod_of,
    render_chart,
    run_helm,
    template,
    values_file,
    wheel_path,
)

__all__ = ["charts"]  # the fixture, shared with test_helm.py


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = next(c for c in spec["containers"] if c["name"] == name)
    return found


def env_of(item: dict[str, Any]) -> dict[str, dict[str, Any]]:
    names = [e["name"] for e in item.get("env", [])]
    assert len(names) == len(set(names)), f"an env var is given twice (Kubernetes keeps the last): {names}"
    return {e["name"]: e for e in item.get("env", [])}


def template_fails(chart: Chart, *options: str) -> str:
    result = run_helm("template", "demo", str(chart.root), *options)
    assert result.returncode != 0, f"helm template {' '.join(options)} rendered"
    return result.stderr


# --- the model and its adapters ------------------------------------------------------------
def test_profile_volumes_are_typed_with_located_errors() -> None:
    base = "name: p\nmodel:\n  source: /models/m\n  volumes:\n"
    cases = {
        "    - kind: pvc\n      mount_path: /models\n": "a pvc volume needs claim",
        "    - {kind: host_path, path: /srv/m, claim: x, mount_path: /models}\n": "takes no claim",
        "    - kind: nfs\n      mount_path: /models\n": "kind",
        "    - kind: pvc\n      claim: m\n      mount_path: models\n": "mount_path",
        "    - kind: pvc\n      claim: m\n      mount_path: /models/../etc\n": "no . or ..",
        "    - kind: download\n      repo: a b\n      mount_path: /models\n": "repo",
    }
    for text, words in cases.items():
        with pytest.raises(ProfileError) as caught:
            parse_profile(base + text, "p.yaml")
        message = str(caught.value)
        assert message.startswith("p.yaml:") and "model.volumes" in message and words in message, message
    twice = (
        base + "    - {kind: pvc, claim: a, mount_path: /m}\n    - {kind: pvc, claim: b, mount_path: /m}\n"
    )
    with pytest.raises(ProfileError, match="two volumes are mounted at /m"):
        parse_profile(twice, "p.yaml")


def test_a_profile_without_volumes_keeps_its_id() -> None:
    """Rows and fingerprint baselines are stored under a profile's id: a new field left at its default
    must not change it."""
    plain = parse_profile("name: p\nmodel:\n  source: org/m\n", "p.yaml")
    empty = parse_profile("name: p\nmodel:\n  source: org/m\n  volumes: []\n", "p.yaml")
    staged = parse_profile(
        "name: p\nmodel:\n  source: org/m\n  volumes: [{kind: pvc, claim: c, mount_path: /m}]\n", "p.yaml"
    )
    assert plain.profile_id() == empty.profile_id() != staged.profile_id()


def test_a_static_adapter_with_no_source_in_the_release_is_refused(
    make_profile: Callable[[str, dict[str, Any]], Path],
) -> None:
    """vLLM loads static adapters at start-up: one that is not in the pod crash-loops it."""
    profile = make_profile("qwen-lora-hopper", {"model.volumes": []})
    done = deploykit(
        "render", "helm", "-p", str(profile), "--facts", str(FACTS_DIR / "h100.json"),
        "--out", str(profile.parent / "out"), check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "serve.lora.adapters.tomb-survey /srv/adapters/tomb-survey" in lines[0]
    assert "model.volumes" in lines[0] and str(profile) in lines[0]
    assert not (profile.parent / "out").exists() or not any((profile.parent / "out").iterdir())


def test_a_local_or_builtin_model_with_no_source_is_refused(
    make_profile: Callable[[str, dict[str, Any]], Path],
) -> None:
    open_server = {"serve.host": "0.0.0.0", "serve.allow_unauthenticated": True}
    for changes, words in (
        ({}, "model.source builtin:tiny-llama is built on the rendering machine"),
        ({"model.source": "/models/tiny"}, "model.source /models/tiny is a local path"),
        # A volume at another path does not hold it.
        (
            {"model.source": "/models/tiny", "model.volumes": [
                {"kind": "pvc", "claim": "c", "mount_path": "/models/tin"}]},
            "model.source /models/tiny is a local path",
        ),
    ):  # fmt: skip
        profile = make_profile("demo-cpu", {**open_server, **changes})
        done = deploykit(
            "render", "helm", "-p", str(profile), "--facts", str(FACTS_DIR / "no-gpu.json"),
            "--out", str(profile.parent / "out"), check=False,
        )  # fmt: skip
        assert done.returncode == 2 and words in done.stderr, done.stderr


def test_the_adapters_volume_is_mounted_and_a_hub_model_is_named(
    charts: dict[str, Chart], make_profile: Callable[[str, dict[str, Any]], Path]
) -> None:
    spec = pod_of(charts["hopper"].manifests)
    vllm = container(spec, "vllm")
    argv = vllm["command"]
    assert "tomb-survey=/srv/adapters/tomb-survey" in argv
    assert {"name": "model-0", "mountPath": "/srv/adapters", "readOnly": True} in vllm["volumeMounts"]
    assert {"name": "model-0", "persistentVolumeClaim": {"claimName": "lora-adapters", "readOnly": True}} in (
        spec["volumes"]
    )
    # The model itself is a hub id: the pod needs the hub, so the hub stays on and render says so.
    assert "HF_HUB_OFFLINE" not in env_of(vllm)
    profile = make_profile("qwen-lora-hopper", {})
    done = deploykit(
        "render", "helm", "-p", str(profile), "--facts", str(FACTS_DIR / "h100.json"),
        "--out", str(profile.parent / "out"),
    )  # fmt: skip
    assert "model.source Qwen/Qwen3.6-27B is fetched from the Hugging Face hub at every pod start" in (
        done.stderr
    )


def test_a_staged_model_runs_offline(charts: dict[str, Chart]) -> None:
    spec = pod_of(charts["cpu"].manifests)
    vllm = container(spec, "vllm")
    assert vllm["command"][2] == "/models/tiny-llama"
    assert {"name": "model-0", "mountPath": "/models", "readOnly": True} in vllm["volumeMounts"]
    assert {"name": "model-0", "hostPath": {"path": "/srv/models", "type": "Directory"}} in spec["volumes"]
    env = env_of(vllm)
    assert env["HF_HUB_OFFLINE"]["value"] == "1" and env["TRANSFORMERS_OFFLINE"]["value"] == "1"
    assert charts["cpu"].values["model"]["offline"] is True


def test_the_chart_refuses_values_that_take_the_models_volume_away(charts: dict[str, Chart]) -> None:
    """values.yaml is the user's to change: the chart itself checks that every model path is mounted."""
    stderr = template_fails(charts["cpu"], "--set-json", "model.volumes=[]")
    assert "model path /models/tiny-llama: no volume in model.volumes or extraVolumeMounts" in stderr
    # A volume of the user's own (extraVolumes + extraVolumeMounts) holds it just as well.
    docs = template(
        charts["cpu"].root, "--set-json", "model.volumes=[]",
        "--set", "extraVolumes[0].name=weights", "--set", "extraVolumes[0].nfs.server=nas",
        "--set", "extraVolumes[0].nfs.path=/export/models",
        "--set", "extraVolumeMounts[0].name=weights", "--set", "extraVolumeMounts[0].mountPath=/models",
    )  # fmt: skip
    spec = pod_of(docs)
    assert {"name": "weights", "nfs": {"server": "nas", "path": "/export/models"}} in spec["volumes"]
    assert {"name": "weights", "mountPath": "/models"} in container(spec, "vllm")["volumeMounts"]


@pytest.mark.external_tool  # helm renders the chart
def test_a_download_volume_is_filled_by_an_init_container(
    make_profile: Callable[[str, dict[str, Any]], Path], tmp_path: Path
) -> None:
    profile = make_profile(
        "gemma4-turing",
        {
            "model.source": "/models/gemma",
            "model.volumes": [
                {"kind": "download", "repo": "google/gemma-4-12b-it-qat-w4a16-ct", "revision": "main",
                 "claim": "gemma-weights", "mount_path": "/models/gemma"},
            ],
        },
    )  # fmt: skip
    chart = render_chart(profile, FACTS_DIR / "t4.json", tmp_path / "out")
    spec = pod_of(chart.manifests)
    (download,) = spec["initContainers"]
    assert download["name"] == "download-model-0" and download["image"] == container(spec, "vllm")["image"]
    env = env_of(download)
    assert env["DEPLOYKIT_MODEL_REPO"]["value"] == "google/gemma-4-12b-it-qat-w4a16-ct"
    assert env["DEPLOYKIT_MODEL_DIR"]["value"] == "/models/gemma"
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "HF_TOKEN"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"
    assert download["volumeMounts"] == [{"name": "model-0", "mountPath": "/models/gemma"}]
    assert {"name": "model-0", "persistentVolumeClaim": {"claimName": "gemma-weights"}} in spec["volumes"]
    # vLLM reads what the init container wrote, read-only, and never asks the hub.
    vllm = container(spec, "vllm")
    assert {"name": "model-0", "mountPath": "/models/gemma", "readOnly": True} in vllm["volumeMounts"]
    assert env_of(vllm)["HF_HUB_OFFLINE"]["value"] == "1"
    for version in KUBERNETES_VERSIONS:
        for doc in chart.manifests:
            kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.external_tool  # helm renders the chart
def test_an_image_volume_is_a_valid_source(
    make_profile: Callable[[str, dict[str, Any]], Path], tmp_path: Path
) -> None:
    profile = make_profile(
        "qwen-lora-hopper",
        {"model.volumes": [{"kind": "image", "image": "registry.internal/adapters:tomb-survey-3",
                            "mount_path": "/srv/adapters"}]},
    )  # fmt: skip
    chart = render_chart(profile, FACTS_DIR / "h100.json", tmp_path / "out")
    spec = pod_of(chart.manifests)
    assert {
        "name": "model-0",
        "image": {"reference": "registry.internal/adapters:tomb-survey-3", "pullPolicy": "IfNotPresent"},
    } in spec["volumes"]
    # Image volumes are Kubernetes 1.31+; the newest bundled schema knows them.
    (deployment,) = [d for d in chart.manifests if d["kind"] == "Deployment"]
    kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[-1], strict=True)


# --- extension points ----------------------------------------------------------------------
def test_set_env_numbers_and_booleans_are_strings(charts: dict[str, Chart]) -> None:
    docs = template(charts["hopper"].root, "--set", "env.HF_HUB_OFFLINE=1", "--set", "env.VLLM_X=true")
    env = env_of(container(pod_of(docs), "vllm"))
    assert env["HF_HUB_OFFLINE"]["value"] == "1" and env["VLLM_X"]["value"] == "true"


def test_extra_env_volumes_and_init_containers_reach_the_pod(
    charts: dict[str, Chart], tmp_path: Path
) -> None:
    values = {
        "extraEnv": [
            {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "WANDB_KEY", "valueFrom": {"secretKeyRef": {"name": "ml", "key": "wandb"}}},
        ],
        "extraVolumes": [{"name": "certs", "secret": {"secretName": "corp-ca"}}],
        "extraVolumeMounts": [{"name": "certs", "mountPath": "/etc/ssl/corp", "readOnly": True}],
        "initContainers": [{"name": "warm", "image": "registry.internal/tools:1", "command": ["true"]}],
        "runtimeClassName": "nvidia",
    }
    docs = template(charts["turing"].root, "-f", values_file(tmp_path, values))
    spec = pod_of(docs)
    env = env_of(container(spec, "vllm"))
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["WANDB_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "ml", "key": "wandb"}
    assert {"name": "certs", "secret": {"secretName": "corp-ca"}} in spec["volumes"]
    assert values["extraVolumeMounts"][0] in container(spec, "vllm")["volumeMounts"]
    assert spec["initContainers"][-1]["name"] == "warm" and spec["runtimeClassName"] == "nvidia"
    for version in KUBERNETES_VERSIONS:
        for doc in docs:
            kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize(
    ("values", "why"),
    [
        ({"extraEnv": [{"name": "PYTHONPATH", "value": "/x"}]}, "PYTHONPATH belongs in env, joined"),
        ({"extraEnv": [{"name": "A", "value": "1", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}, "both"),
        ({"extraEnv": [{"name": "A", "valueFrom": {"secretRef": {"name": "s"}}}]}, "not an EnvVarSource"),
        ({"extraVolumes": [{"name": "x"}]}, "a volume with no source"),
        ({"extraVolumeMounts": [{"name": "x", "mountPath": "relative"}]}, "a relative mount path"),
        ({"initContainers": [{"name": "x"}]}, "an init container with no image"),
        ({"enableServiceLinks": "no"}, "not a boolean"),
        ({"rollout": {"maxSurge": 0, "maxUnavailable": 0}}, "Kubernetes refuses a rollout that cannot move"),
        ({"model": {"offline": True, "paths": [], "volumes": [
            {"name": "m", "mountPath": "/m", "source": {"nfs": {"server": "x"}}}]}}, "not a model source"),
        ({"smokeTest": {"resources": {"requets": {}}}}, "a misspelt key"),
    ],
)  # fmt: skip
def test_the_schema_types_the_extension_points(
    charts: dict[str, Chart], tmp_path: Path, values: dict[str, Any], why: str
) -> None:
    template_fails(charts["turing"], "-f", str(values_file(tmp_path, values)))


def test_service_links_are_off_in_every_pod(charts: dict[str, Chart]) -> None:
    """A release named `vllm`: the kubelet would give its pods VLLM_PORT=tcp://..., which vLLM refuses."""
    docs = charts["hopper"].manifests
    pods = [pod_of(docs), *(d["spec"] for d in docs if d["kind"] == "Pod")]
    assert len(pods) == 2 and all(spec["enableServiceLinks"] is False for spec in pods)


def test_more_than_one_replica_rolls_one_pod_at_a_time(
    make_profile: Callable[[str, dict[str, Any]], Path], charts: dict[str, Chart], tmp_path: Path
) -> None:
    assert "strategy" not in charts["hopper"].values  # decided at install time, from replicaCount
    profile = make_profile("qwen-lora-hopper", {"deploy.replicas": 3})
    chart = render_chart(profile, FACTS_DIR / "h100.json", tmp_path / "out")
    (deployment,) = [d for d in chart.manifests if d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }


def test_the_test_pod_has_its_own_placement_and_is_never_selected(
    charts: dict[str, Chart], tmp_path: Path
) -> None:
    values = {
        "podDisruptionBudget": {"enabled": True},
        "metrics": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}},
        "smokeTest": {
            "nodeSelector": {"pool": "cpu"},
            "tolerations": [{"key": "spot", "operator": "Exists"}],
        },
    }
    docs = template(charts["turing"].root, "-f", values_file(tmp_path, values))
    (test_pod,) = [d for d in docs if d["kind"] == "Pod"]
    labels = test_pod["metadata"]["labels"]
    selectors = [d["spec"]["selector"] for d in docs if d["kind"] == "Service"]
    selectors += [d["spec"]["selector"]["matchLabels"] for d in docs if d["kind"] != "Service" and
                  d["kind"] in ("PodDisruptionBudget", "PodMonitor", "Deployment")]  # fmt: skip
    assert len(selectors) == 4
    for selector in selectors:
        assert not all(labels.get(key) == value for key, value in selector.items()), selector
    spec = test_pod["spec"]
    assert spec["nodeSelector"] == {"pool": "cpu"}
    assert {"key": "spot", "operator": "Exists"} in spec["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    (smoke,) = spec["containers"]
    assert smoke["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert "nvidia.com/gpu" not in json.dumps(smoke["resources"])
    # By default it prefers a node where a server pod runs: the (large) vLLM image is there already.
    default = next(d for d in charts["turing"].manifests if d["kind"] == "Pod")
    preferred = default["spec"]["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred[0]["podAffinityTerm"]["labelSelector"]["matchLabels"] == selectors[0]


def test_containers_that_want_no_gpu_see_none(charts: dict[str, Chart]) -> None:
    manifests = charts["turing"].manifests
    spec = pod_of(manifests)
    assert env_of(container(spec, "canary"))["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(container(spec, "vllm"))
    (test_pod,) = [d for d in manifests if d["kind"] == "Pod"]
    assert env_of(test_pod["spec"]["containers"][0])["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"


def test_pythonpath_is_joined_with_the_plugins_never_replaced(charts: dict[str, Chart]) -> None:
    """demo-gemma4-fp16's profile puts torchvision on PYTHONPATH: vLLM gets both, the plugin first."""
    gemma = charts["cpu-gemma4"]
    own = gemma.values["env"]["PYTHONPATH"]
    env = env_of(container(pod_of(gemma.manifests), "vllm"))
    assert env["PYTHONPATH"]["value"] == f"{wheel_path(gemma)}:{own}"
    docs = template(charts["turing"].root, "--set", "env.PYTHONPATH=/opt/extra")
    env = env_of(container(pod_of(docs), "vllm"))
    assert env["PYTHONPATH"]["value"] == f"{wheel_path(charts['turing'])}:/opt/extra"
    # The canary runs the plugin's alone.
    assert env_of(container(pod_of(docs), "canary"))["PYTHONPATH"]["value"] == wheel_path(charts["turing"])
