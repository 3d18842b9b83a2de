"""Issue 48, GitOps: the chart as Argo CD, Flux and `helm template | kubectl apply --server-side` deploy it.

1. The fix check (templates/tests/smoke-test.yaml) is an Argo CD PostSync hook as well as Helm's test hook
   (Argo CD runs no `test` hook), and its name is the digest of its spec: a Pod's spec cannot change, so a new
   plugin is a new Pod that server-side apply creates, never an update the API server refuses. Checked on
   every object whose spec cannot change (Pods, Jobs' templates, immutable ConfigMaps): between two renders,
   one name always holds one spec. The documented kubectl path leaves the hook out (`--skip-tests`).
2. The chart's version is `0.1.0+<digest of the render>`: the same profile rendered twice (two directories)
   is the same chart byte for byte and the same version; a changed profile, alert rule or wheel is another
   version. helm lints and packages it, and every label value holds it as Kubernetes allows (no `+`).
3. `helm upgrade` with the same plugin rolls nothing: the Deployment's (or a group's LeaderWorkerSet's) pod
   templates are the same across two renders of one profile, and across renders that differ outside the pod
   (an alert rule: another chart version; values that are not the pod's); another wheel changes them (the
   plugin ConfigMap's name is the wheel's digest).
Renders are made in-process (deploykit.render.helm, as `deploykit render helm` makes them) where a test
changes one input (the alert rules, the wheel); the CLI renders the reproducibility check."""

from __future__ import annotations

import functools
import hashlib
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploykit.probe.load import load_facts
from deploykit.profile.load import load_profile
from deploykit.render import alerts
from deploykit.render import helm as helm_render
from deploykit.render.common import RenderedFile, plan_for_render, write_files
from deploykit.render.plugin_wheel import PluginWheel, build_plugin_wheel
from tests.profile_variants import profile_variant
from tests.render.conftest import deploykit
from tests.render.test_helm import FACTS_DIR, RELEASE, run_helm, template

REPO = Path(__file__).resolve().parents[2]
DEPLOY_DOC = REPO / "docs" / "deploy.md"
LISTEN = {"serve.host": "0.0.0.0"}
# Tensor 8 × pipeline 2 over two nodes of 8 H100s: a LeaderWorkerSet (tests/render/test_helm_group.py).
GROUP = {**LISTEN, "serve.tensor_parallel_size": 8, "serve.pipeline_parallel_size": 2, "deploy.nodes": 2}
SHAPES: dict[str, tuple[dict[str, Any], str]] = {
    "single": (LISTEN, "h100.json"),
    "group": (GROUP, "h100x8.json"),
}
VERSION = re.compile(r"0\.1\.0\+[0-9a-f]{12}")
# Kubernetes' label value: 63 characters at most, alphanumeric at both ends, `-`, `_` and `.` inside.
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
# The gate's Job is a Job whose template cannot change either: rendered on, so it is checked too.
GATE_JOB = ("--set", "gate.job.enabled=true")
WHEEL_COMMENT = b"another plugin"
# Values an upgrade may change that are no part of the pod.
# (Not replicaCount: more than one replica changes the cache volume, a claim being one pod's.)
NOT_THE_POD = (
    ("--set", "podDisruptionBudget.enabled=true"),
    ("--set", "metrics.grafanaDashboard.enabled=true"),
    ("--set", "metrics.prometheusRule.enabled=true"),
    ("--set", "service.type=NodePort"),
)


# --- fast: the version's digest, and the documented kubectl path ----------------------------------------


def test_the_chart_version_is_a_digest_of_every_file() -> None:
    files = [
        RenderedFile(path="Chart.yaml", content="name: x\nversion: 0.1.0\n"),
        RenderedFile(path="values.yaml", content="a: 1\n"),
        RenderedFile(path="files/plugin.whl", content=b"PK\x03\x04 wheel"),
    ]
    version = helm_render.chart_version(files)
    assert VERSION.fullmatch(version), version
    assert helm_render.chart_version(list(reversed(files))) == version  # the files' order is no part of it
    changed = [
        [files[0], files[1].model_copy(update={"content": "a: 2\n"}), files[2]],
        [files[0], files[1], files[2].model_copy(update={"content": b"PK\x03\x04 wheel!"})],
        [files[0], files[1].model_copy(update={"path": "values.yml"}), files[2]],
        [files[0].model_copy(update={"content": "name: y\nversion: 0.1.0\n"}), *files[1:]],
        files[:2],
        # The same bytes cut into files another way: the framing keeps them apart.
        [files[0], RenderedFile(path="values.yaml", content="a: 1\nfiles/plugin.whl"), files[2]],
    ]
    versions = {helm_render.chart_version(variant) for variant in changed}
    assert version not in versions and len(versions) == len(changed), versions


def test_the_documented_kubectl_apply_leaves_the_test_hook_to_its_own_step() -> None:
    """`helm template | kubectl apply` applies Helm's hooks as plain objects, at once: the fix check would run
    before the model is loaded. The docs pass --skip-tests there and apply the check on its own
    (--show-only templates/tests/...) once the rollout is done."""
    text = DEPLOY_DOC.read_text()
    joined = re.sub(r"\\\n\s*", " ", text)  # shell continuations
    # `helm template ARGS | kubectl apply` in a command (a table's escaped `\|` is prose, not a pipe).
    applies = [m.group(1) for m in re.finditer(r"helm template([^`\n]*?)(?<!\\)\|\s*kubectl apply", joined)]
    assert applies, "docs/deploy.md shows no `helm template | kubectl apply` command"
    for arguments in applies:
        assert "--skip-tests" in arguments or "--show-only templates/tests/" in arguments, arguments
    assert "## GitOps: Argo CD, Flux, helm template" in text


# --- renders ---------------------------------------------------------------------------------------------


def render_into(profile: Path, facts: Path, out: Path) -> Path:
    """`deploykit render helm`, in-process (so a test may change one of its inputs): the chart's directory."""
    loaded = load_profile(str(profile))
    result = helm_render.render_helm(plan_for_render(loaded, load_facts(str(facts))), loaded)
    write_files(result, out)
    (chart,) = {Path(f.path).parts[0] for f in result.files}
    return out / chart


def chart_version_of(chart: Path) -> str:
    version: str = yaml.safe_load((chart / "Chart.yaml").read_text())["version"]
    return version


def other_wheel() -> Callable[[], PluginWheel]:
    """The renderer's wheel with a zip comment: a valid wheel of other bytes, as a changed plugin is."""

    def build_other() -> PluginWheel:
        wheel = build_plugin_wheel()
        assert wheel.data[-2:] == b"\0\0"  # a zip ends with its comment's length: none
        data = wheel.data[:-2] + len(WHEEL_COMMENT).to_bytes(2, "little") + WHEEL_COMMENT
        return PluginWheel(filename=wheel.filename, data=data, sha256=hashlib.sha256(data).hexdigest())

    return build_other


class Renders:
    """One profile rendered four ways: `base`; `again` (the same, another directory); `alert` (an alert rule
    changed: outside the pod); `wheel` (another plugin wheel)."""

    def __init__(self, shape: str, root: Path, changes: dict[str, Any], facts: Path) -> None:
        self.shape = shape
        profile = profile_variant(root, "qwen-lora-hopper", changes)
        self.base = render_into(profile, facts, root / "base")
        self.again = render_into(profile, facts, root / "again")
        with pytest.MonkeyPatch.context() as patch:
            rules = alerts.rules_yaml()
            changed = rules.replace("for: 10m", "for: 11m", 1)
            assert changed != rules, "no `for: 10m` in the alert rules to change"
            patch.setattr(alerts, "rules_yaml", lambda: changed)
            self.alert = render_into(profile, facts, root / "alert")
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(helm_render, "build_plugin_wheel", other_wheel())
            self.wheel = render_into(profile, facts, root / "wheel")


@pytest.fixture(scope="module", params=sorted(SHAPES))
def renders(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Renders]:
    changes, facts = SHAPES[request.param]
    root = tmp_path_factory.mktemp(f"gitops-{request.param}")
    yield Renders(request.param, root, changes, FACTS_DIR / facts)
    shutil.rmtree(root, ignore_errors=True)


OWNERS = ("Deployment", "LeaderWorkerSet")  # the objects that hold the server's pod templates


def pod_templates(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The server's pod templates: the Deployment's, or a LeaderWorkerSet's leader and worker."""
    found: dict[str, Any] = {}
    for doc in docs:
        if doc["kind"] == "Deployment":
            found[f"Deployment/{doc['metadata']['name']}"] = doc["spec"]["template"]
        elif doc["kind"] == "LeaderWorkerSet":
            group = doc["spec"]["leaderWorkerTemplate"]
            for role in ("leaderTemplate", "workerTemplate"):
                found[f"LeaderWorkerSet/{doc['metadata']['name']}/{role}"] = group[role]
    assert found, "no Deployment and no LeaderWorkerSet rendered"
    return found


def unchangeable(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """What the API server refuses to change in place, by kind and name: a Pod's spec, a Job's template (and
    selector), an immutable ConfigMap's or Secret's data."""
    found: dict[str, Any] = {}
    for doc in docs:
        key = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "Pod":
            found[key] = doc["spec"]
        elif doc["kind"] == "Job":
            found[key] = {"template": doc["spec"]["template"], "selector": doc["spec"].get("selector")}
        elif doc["kind"] in ("ConfigMap", "Secret") and doc.get("immutable"):
            found[key] = {"data": doc.get("data"), "binaryData": doc.get("binaryData")}
    return found


@functools.cache
def manifests(chart: Path, *options: str) -> list[dict[str, Any]]:
    """`helm template` of a render, the gate's Job on (a Job whose template cannot change either): once per
    chart and options for the module."""
    return template(chart, *GATE_JOB, *options)


def smoke_hook(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (hook,) = [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    return hook


# --- 1. the fix check under Argo CD and server-side apply ------------------------------------------------


@pytest.mark.external_tool  # helm template
def test_the_fix_check_is_an_argo_cd_post_sync_hook_and_helms_test(renders: Renders) -> None:
    hook = smoke_hook(manifests(renders.base))
    annotations = hook["metadata"]["annotations"]
    assert hook["kind"] == "Pod"  # `helm test --logs` reads a test hook's logs from the Pod of its name
    assert annotations["helm.sh/hook"] == "test"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation"
    # Argo CD maps no `test` hook to a phase (it never runs one) and reads its own annotation first.
    assert annotations["argocd.argoproj.io/hook"] == "PostSync"
    policies = annotations["argocd.argoproj.io/hook-delete-policy"].split(",")
    assert policies == ["BeforeHookCreation", "HookSucceeded"], policies
    # What it runs is unchanged: the fixes checked through the Service.
    (container,) = hook["spec"]["containers"]
    assert container["command"][:5] == ["python3", "-m", "deploykit", "smoke", "--url"]
    expected = yaml.safe_load((renders.base / "values.yaml").read_text())["smokeTest"]["expectFixes"]
    assert container["command"][-3:-1] == ["--expect-fixes", expected]


@pytest.mark.external_tool  # helm template
def test_one_name_always_holds_one_spec_across_renders_and_upgrades(renders: Renders) -> None:
    """Server-side apply of a second render over the first: every object whose spec cannot change keeps its
    name and its spec, or takes a new name (created; the old one left to prune or to its hook's policy)."""
    base = unchangeable(manifests(renders.base))
    assert any(key.startswith("Pod/") for key in base) and any(key.startswith("Job/") for key in base), base
    for other, options in (
        (renders.again, ()),
        (renders.alert, ()),
        (renders.wheel, ()),
        (renders.base, ("--set", "smokeTest.expectFixes=none")),
        *((renders.base, option) for option in NOT_THE_POD),
    ):
        after = unchangeable(manifests(other, *options))
        for key in base.keys() & after.keys():
            assert base[key] == after[key], f"{key} changes in place ({other.parent.name} {options})"
    # A new plugin is a new fix-check Pod; the same one keeps its name (Argo CD and helm delete it first).
    name = smoke_hook(manifests(renders.base))["metadata"]["name"]
    assert re.fullmatch(rf"{RELEASE}-smoke-[0-9a-f]{{8}}", name), name
    assert smoke_hook(manifests(renders.again))["metadata"]["name"] == name
    assert smoke_hook(manifests(renders.alert))["metadata"]["name"] == name  # its labels change, not its spec
    assert smoke_hook(manifests(renders.wheel))["metadata"]["name"] != name


@pytest.mark.external_tool  # helm template
def test_the_fix_checks_name_fits_helms_longest_release_name(renders: Renders) -> None:
    # Helm's longest release name; a group's LeaderWorkerSet refuses more than 43 characters.
    release = "r" * (43 if renders.shape == "group" else 53)
    result = run_helm("template", release, str(renders.base))
    assert result.returncode == 0, result.stderr
    (hook,) = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "Pod"]
    name = hook["metadata"]["name"]
    assert len(name) <= 63 and re.fullmatch(rf"{release[:48]}-smoke-[0-9a-f]{{8}}", name), name


# --- 2. the chart's version -------------------------------------------------------------------------------


def cli_render(profile: Path, out: Path) -> Path:
    facts = str(FACTS_DIR / "h100.json")
    result = deploykit("render", "helm", "--profile", str(profile), "--facts", facts, "--out", str(out))
    return Path(result.stdout.splitlines()[0]).parent


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.external_tool  # helm lint, package, template
def test_one_profile_rendered_twice_is_one_chart_and_one_version(tmp_path: Path) -> None:
    profile = profile_variant(tmp_path, "qwen-lora-hopper", LISTEN)
    first, second = cli_render(profile, tmp_path / "one"), cli_render(profile, tmp_path / "two")
    assert tree(first) == tree(second)
    version = chart_version_of(first)
    assert VERSION.fullmatch(version), version
    (tmp_path / "replicas").mkdir()
    replicas = profile_variant(tmp_path / "replicas", "qwen-lora-hopper", {**LISTEN, "deploy.replicas": 2})
    assert chart_version_of(cli_render(replicas, tmp_path / "three")) not in (version, "0.1.0")
    # Helm takes build metadata: lint --strict, package (the archive named by it), the packaged chart's.
    lint = run_helm("lint", "--strict", str(first))
    assert lint.returncode == 0 and "WARNING" not in lint.stdout, lint.stdout + lint.stderr
    packaged = run_helm("package", str(first), "--destination", str(tmp_path / "packages"))
    assert packaged.returncode == 0, packaged.stderr
    archive = tmp_path / "packages" / f"{first.name}-{version}.tgz"
    assert archive.is_file(), list((tmp_path / "packages").iterdir())
    shown = run_helm("show", "chart", str(archive))
    assert yaml.safe_load(shown.stdout)["version"] == version


@pytest.mark.external_tool  # helm template
def test_every_label_value_is_one_kubernetes_takes(renders: Renders) -> None:
    """helm.sh/chart carries the version, and a label value holds no `+`: it is written `_`, as helm writes it
    in an OCI tag."""
    docs = manifests(renders.base)
    for doc in docs:
        for metadata in labelled(doc):
            for key, value in (metadata.get("labels") or {}).items():
                assert len(value) <= 63 and LABEL_VALUE.fullmatch(value), f"{doc['kind']} {key}: {value!r}"
    chart_labels = {(d["metadata"].get("labels") or {}).get("helm.sh/chart") for d in docs} - {None}
    assert chart_labels == {chart_label(renders.base)}, chart_labels


def labelled(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The object's metadata and its pod templates' (a Deployment's, a LeaderWorkerSet's, a Job's)."""
    found = [doc["metadata"]]
    if doc["kind"] in ("Deployment", "LeaderWorkerSet"):
        found += [template["metadata"] for template in pod_templates([doc]).values()]
    elif doc["kind"] == "Job":
        found.append(doc["spec"]["template"]["metadata"])
    return found


def chart_label(chart: Path) -> str:
    return f"{chart.name}-{chart_version_of(chart).replace('+', '_')}"


# --- 3. an upgrade with the same plugin rolls nothing ----------------------------------------------------


@pytest.mark.external_tool  # helm template
def test_an_upgrade_with_the_same_plugin_rolls_nothing(renders: Renders) -> None:
    base = pod_templates(manifests(renders.base))
    assert pod_templates(manifests(renders.again)) == base
    # Another chart version (an alert rule changed): the objects' labels say so, the pods' templates do not.
    assert chart_version_of(renders.alert) != chart_version_of(renders.base)
    alert_docs = manifests(renders.alert)
    assert pod_templates(alert_docs) == base
    owners = {d["metadata"]["labels"]["helm.sh/chart"] for d in alert_docs if d["kind"] in OWNERS}
    assert owners == {chart_label(renders.alert)} != {chart_label(renders.base)}, owners
    assert not [key for key, pod in base.items() if "helm.sh/chart" in pod["metadata"]["labels"]]
    for options in NOT_THE_POD:
        assert pod_templates(manifests(renders.base, *options)) == base, options


@pytest.mark.external_tool  # helm template
def test_another_wheel_rolls_the_pods_through_its_config_map(renders: Renders) -> None:
    values = yaml.safe_load((renders.wheel / "values.yaml").read_text())["plugin"]["wheel"]
    base_values = yaml.safe_load((renders.base / "values.yaml").read_text())["plugin"]["wheel"]
    assert values["sha256"] != base_values["sha256"] and values["file"] == base_values["file"]
    config_map = f"{RELEASE}-plugin-{values['sha256'][:12]}"
    docs = manifests(renders.wheel)
    assert config_map in {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    base = pod_templates(manifests(renders.base))
    for key, pod in pod_templates(docs).items():
        assert pod != base[key], key
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["deploykit-plugin"]["configMap"]["name"] == config_map, key
        assert pod["metadata"]["annotations"]["deploykit.io/plugin"] == f"sha256:{values['sha256']}", key
