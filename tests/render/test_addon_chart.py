"""The add-on against deploykit's own chart, and as Helm 4's post-renderer, with the real helm.

deploykit's chart for a shipped GPU profile and recorded facts (qwen-lora-hopper on an H100; and the same as
a LeaderWorkerSet over two 8-GPU nodes), rendered by `helm template`, with its deploykit parts taken out as a
reader would take them out (`strip`): through the add-on, its pods are the chart's again. Compared as
canonical JSON with one normalisation (`canonical`): the lists Kubernetes keys by name (a pod's volumes, a
container's env by name and its volumeMounts by mountPath: their strategic-merge keys) are sorted, because
the add-on appends what the chart writes in its own places. Their order means nothing to Kubernetes here: no
env value refers to another (`$(NAME)`, asserted), and no mount path lies under another.

Then the post-renderer on a real chart directory (tests/fixtures/addon/charts/vllm-stack, in
production-stack's shape): `helm lint --strict` passes, `deploykit render addon-plugin` installs with `helm
plugin install`, `helm template --post-renderer deploykit-addon` adds deploykit (every manifest valid,
strict), and a chart whose argv contradicts the plan fails with deploykit's one line on helm's stderr."""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from deploykit.probe.load import load_facts
from deploykit.profile.load import load_profile
from deploykit.render.addon import AddonOptions, AddonParts, addon_parts, apply_addon
from deploykit.render.common import plan_for_render
from deploykit.render.plugin_wheel import build_plugin_wheel
from tests.profile_variants import profile_variant
from tests.render.conftest import deploykit
from tests.render.test_helm import FACTS_DIR, KUBERNETES_VERSIONS, RELEASE, Chart, find_helm, render_chart
from tests.render.test_helm_group import GROUP

pytestmark = pytest.mark.external_tool  # helm renders every chart here

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "addon"
STACK_CHART = FIXTURES / "charts" / "vllm-stack"
STACK_PROFILE = FIXTURES / "profiles" / "stack-llama.yaml"
# What is deploykit's in its chart's pods, by name (templates/helm/chart/templates/_pod.tpl).
DEPLOYKIT_VOLUMES = ("deploykit-plugin", "canary-")


def helm_output(root: Path, *options: str) -> str:
    result = subprocess.run(
        [find_helm(), "template", RELEASE, str(root), "--namespace", "default", *options],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def docs_of(text: str) -> list[dict[str, Any]]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the plugin's ConfigMap is ~1 MiB of text
    return [doc for doc in yaml.load_all(text, Loader=loader) if doc]


def parts_for(profile: Path | str, facts: Path) -> AddonParts:
    loaded = load_profile(str(profile))
    plan = plan_for_render(loaded, load_facts(str(facts)))
    return addon_parts(plan, loaded, build_plugin_wheel())


@functools.cache
def rendered(kind: str, directory: str) -> tuple[Chart, str, AddonParts]:
    """deploykit's chart (its `helm template` text) and the add-on's parts for the same profile and facts."""
    where = Path(directory)
    if kind == "single":
        profile: Path | str = "qwen-lora-hopper"
        facts = FACTS_DIR / "h100.json"
    else:
        profile = profile_variant(where, "qwen-lora-hopper", GROUP)
        facts = FACTS_DIR / "h100x8.json"
    chart = render_chart(profile, facts, where / "out")
    return chart, helm_output(chart.root), parts_for(profile, facts)


@pytest.fixture(scope="module", params=["single", "group"])
def chart(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Chart, str, AddonParts]:
    return rendered(request.param, str(tmp_path_factory.mktemp(request.param)))


def templates(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if doc["kind"] == "Deployment":
        yield doc["spec"]["template"]
    elif doc["kind"] == "LeaderWorkerSet":
        group = doc["spec"]["leaderWorkerTemplate"]
        yield from (group[role] for role in ("leaderTemplate", "workerTemplate") if role in group)


def ours(name: str) -> bool:
    return name.startswith(DEPLOYKIT_VOLUMES)


def drop_deploykit_annotations(metadata: dict[str, Any]) -> None:
    annotations = {
        k: v for k, v in metadata.get("annotations", {}).items() if not k.startswith("deploykit.io/")
    }
    metadata.pop("annotations", None)
    if annotations:
        metadata["annotations"] = annotations


def strip(docs: list[dict[str, Any]], plan: dict[str, Any]) -> list[dict[str, Any]]:
    """deploykit's chart without deploykit, as a reader takes it out: the plugin's and the canary profile's
    ConfigMaps, the `helm test` smoke pod, the deploykit.io annotations, the canary container, the plugin's
    and the canary's volumes and mounts, PYTHONPATH and the plan's variables, the exec (verdict) probes."""
    fix_env = (set(plan["env"]) - set(plan["secret_env"])) | {"PYTHONPATH"}
    kept = []
    for doc in copy.deepcopy(docs):
        metadata = doc["metadata"]
        if doc["kind"] == "ConfigMap" and (
            metadata["name"].endswith("-profile")
            or "deploykit.io/wheel-sha256" in metadata.get("annotations", {})
        ):
            continue
        if doc["kind"] == "Pod":
            continue
        drop_deploykit_annotations(metadata)
        for template in templates(doc):
            drop_deploykit_annotations(template["metadata"])
            spec = template["spec"]
            spec["containers"] = [c for c in spec["containers"] if c["name"] != "canary"]
            spec["volumes"] = [v for v in spec["volumes"] if not ours(v["name"])]
            for container in spec["containers"]:
                container["env"] = [e for e in container["env"] if e["name"] not in fix_env]
                container["volumeMounts"] = [m for m in container["volumeMounts"] if not ours(m["name"])]
                for probe in ("readinessProbe", "livenessProbe"):
                    if "exec" in container.get(probe, {}):
                        del container[probe]
        kept.append(doc)
    return kept


def canonical(template: dict[str, Any]) -> str:
    """A pod template as sorted JSON, its name-keyed lists sorted (the module docstring says why)."""
    template = copy.deepcopy(template)
    spec = template["spec"]
    spec["volumes"] = sorted(spec.get("volumes", []), key=lambda v: v["name"])
    for container in [*spec["containers"], *spec.get("initContainers", [])]:
        for entry in container.get("env", []):
            assert "$(" not in str(entry.get("value", "")), entry  # else their order would matter
        container["env"] = sorted(container.get("env", []), key=lambda e: e["name"])
        container["volumeMounts"] = sorted(container.get("volumeMounts", []), key=lambda m: m["mountPath"])
    return json.dumps(template, sort_keys=True)


def workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in docs if doc["kind"] in ("Deployment", "LeaderWorkerSet")}


def test_the_addon_on_the_stripped_chart_gives_the_charts_pods(chart: tuple[Chart, str, AddonParts]) -> None:
    full_chart, text, parts = chart
    full = docs_of(text)
    stripped = strip(full, full_chart.plan)
    (kind, before), (_, after) = (*workloads(stripped).items(), *workloads(full).items())
    left = json.dumps([t["spec"] for t in templates(before)])
    for part in ("deploykit.render", "/opt/deploykit", "canary", "DEPLOYKIT_FIXES", "PYTHONPATH"):
        assert part not in left  # really taken out (the chart's caches are under /var/cache/deploykit)
    result = apply_addon(yaml.safe_dump_all(stripped, sort_keys=False), parts, AddonOptions())
    added = docs_of(result.text)
    (addon,) = workloads(added).values()
    pairs = list(zip(templates(addon), templates(after), strict=True))
    assert len(pairs) == (2 if kind == "LeaderWorkerSet" else 1)
    for got, want in pairs:
        assert canonical(got) == canonical(want)
        assert got != before  # the comparison compares something
    # The workload's own annotations too, and the ConfigMaps it mounts: the same names and bytes.
    assert addon["metadata"]["annotations"] == after["metadata"]["annotations"]
    want_maps = {d["metadata"]["name"]: d for d in full if d["kind"] == "ConfigMap"}
    for doc in added:
        if doc["kind"] == "ConfigMap" and doc not in stripped:
            want = want_maps[doc["metadata"]["name"]]
            assert doc.get("binaryData") == want.get("binaryData") and doc.get("data") == want.get("data")


def test_the_full_chart_passes_through_unchanged(chart: tuple[Chart, str, AddonParts]) -> None:
    _, text, parts = chart
    assert apply_addon(text, parts, AddonOptions()).text == text


# --- the Helm post-renderer -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A helm of its own (plugins, config, cache in a temporary home) with deploykit's post-renderer plugin
    installed as the docs say: `deploykit render addon-plugin -o DIR`, `helm plugin install DIR/...`."""
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
    }
    env.pop("HELM_PLUGINS", None)
    out = home / "plugin"
    deploykit("render", "addon-plugin", "-o", str(out), "--python", sys.executable)
    installed = subprocess.run(
        [find_helm(), "plugin", "install", str(out / "deploykit-addon")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert installed.returncode == 0, installed.stderr
    return env


def post_rendered(env: dict[str, str], *options: str) -> subprocess.CompletedProcess[str]:
    args = [f"--profile={STACK_PROFILE}", f"--facts={FACTS_DIR / 'h100.json'}", "--name=vllm"]
    post_render = ["--post-renderer", "deploykit-addon", *(f"--post-renderer-args={arg}" for arg in args)]
    return subprocess.run(
        [find_helm(), "template", "vllm", str(STACK_CHART), "--namespace", "default", *options, *post_render],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_the_upstream_shaped_chart_lints_strict() -> None:
    result = subprocess.run(
        [find_helm(), "lint", "--strict", str(STACK_CHART)], capture_output=True, text=True
    )
    assert result.returncode == 0 and "[WARNING]" not in result.stdout, result.stdout + result.stderr


def test_the_post_renderer_adds_deploykit_to_a_charts_release(helm_home: dict[str, str]) -> None:
    result = post_rendered(helm_home)
    assert result.returncode == 0, result.stderr
    docs = docs_of(result.stdout)
    for doc in docs:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    wheel = build_plugin_wheel()
    assert {("ConfigMap", f"vllm-plugin-{wheel.sha256[:12]}"), ("ConfigMap", "vllm-profile")} <= names
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    spec = deployment["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["containers"]] == ["vllm", "canary"]
    vllm = spec["containers"][0]
    assert vllm["livenessProbe"]["exec"]["command"][3] == "live"
    assert vllm["command"][-2:] == [
        "--logits-processors",
        "deploykit.fixes.penalties:DevicePenaltiesProcessor",
    ]
    # The same as the pipe: `helm template` without it, through `deploykit addon`.
    plain = helm_output(STACK_CHART).replace(RELEASE, "vllm")
    piped = apply_addon(plain, parts_for(STACK_PROFILE, FACTS_DIR / "h100.json"), AddonOptions(name="vllm"))
    assert sorted(map(json.dumps, docs)) == sorted(map(json.dumps, docs_of(piped.text)))
    # deploykit's warnings reach helm's stderr (Helm 4 keeps a post-renderer plugin's own to itself).
    assert "deploykit addon: warning: " in result.stderr


def test_a_chart_that_contradicts_the_plan_fails_with_deploykits_line(
    helm_home: dict[str, str], tmp_path: Path
) -> None:
    values = yaml.safe_load((STACK_CHART / "values.yaml").read_text())
    values["servingEngineSpec"]["modelSpec"][0]["vllmConfig"]["tensorParallelSize"] = 2
    override = tmp_path / "tp2.yaml"
    override.write_text(yaml.safe_dump(values))
    result = post_rendered(helm_home, "-f", str(override))
    assert result.returncode != 0 and result.stdout == ""
    assert (
        "deploykit: addon: Deployment vllm-llama3-deployment-vllm, container vllm: --tensor-parallel-size 2; "
        "the plan (profile stack-llama) runs --tensor-parallel-size 1, and its fixes were decided for that "
        "layout"
    ) in result.stderr.splitlines()
