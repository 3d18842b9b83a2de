"""Sizes and headroom of the chart that carries deploykit (issue 34): the plugin ConfigMap under the
ConfigMap limit, Helm's release record under the Secret limit, and the one limit it cannot meet (client-side
apply's last-applied annotation) handed to server-side apply. Run with `-s` to see the figures."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.profile_variants import PROFILES
from tests.render.test_helm import FACTS_DIR, Chart, render_chart, run_helm

pytestmark = pytest.mark.external_tool  # every test here renders with helm

MIB = 1024 * 1024
CONFIGMAP_LIMIT = MIB  # data + binaryData bytes (the API server's validation)
RELEASE_LIMIT = MIB  # Helm's release record: one Secret's data
LAST_APPLIED_LIMIT = 256 * 1024  # all annotations of an object together (client-side apply writes one)
RELEASE = "vllm"


@pytest.fixture(scope="module")
def chart(tmp_path_factory: pytest.TempPathFactory) -> Chart:
    out = tmp_path_factory.mktemp("sizes")
    return render_chart(PROFILES / "qwen-lora-hopper.yaml", FACTS_DIR / "h100.json", out)


def rendered(chart: Chart) -> tuple[str, list[str]]:
    """(manifest, hooks) as Helm keeps them: the `helm test` pod is a hook."""
    done = run_helm("template", RELEASE, str(chart.root))
    assert done.returncode == 0, done.stderr
    manifests, hooks = [], []
    for text in done.stdout.split("\n---\n"):
        doc = yaml.safe_load(text)
        if doc:
            annotations = doc.get("metadata", {}).get("annotations") or {}
            (hooks if "helm.sh/hook" in annotations else manifests).append(text)
    return "\n---\n".join(manifests), hooks


def release_record(chart: Chart) -> bytes:
    """What Helm stores (its storage driver's encodeRelease): base64(gzip(JSON of the release)), the chart's
    templates, schema and files base64 inside the JSON, the rendered manifest and hooks as text."""
    root = chart.root

    def b64(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    templates = sorted(p for p in (root / "templates").rglob("*") if p.is_file())
    files = sorted(p for p in (root / "files").rglob("*") if p.is_file())
    manifest, hooks = rendered(chart)
    release: dict[str, Any] = {
        "name": RELEASE,
        "info": {"status": "deployed", "description": "Install complete"},
        "chart": {
            "metadata": yaml.safe_load((root / "Chart.yaml").read_text()),
            "templates": [{"name": str(p.relative_to(root)), "data": b64(p)} for p in templates],
            "values": chart.values,
            "schema": b64(root / "values.schema.json"),
            "files": [{"name": str(p.relative_to(root)), "data": b64(p)} for p in files],
        },
        "config": {},
        "manifest": manifest,
        "hooks": [{"name": "smoke", "kind": "Pod", "manifest": hook} for hook in hooks],
        "version": 1,
        "namespace": "default",
    }
    body = gzip.compress(json.dumps(release).encode(), compresslevel=9)  # gzip.BestCompression
    return base64.b64encode(body)


def plugin_config_map(chart: Chart) -> dict[str, Any]:
    manifest, _ = rendered(chart)
    (found,) = [
        d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "ConfigMap" and "binaryData" in d
    ]
    return found


def test_the_plugin_config_map_and_the_release_record_fit_with_headroom(chart: Chart) -> None:
    wheel = chart.root / "files" / chart.values["plugin"]["wheel"]["file"]
    config_map = plugin_config_map(chart)
    data = sum(len(base64.b64decode(v)) for v in config_map["binaryData"].values())
    record = len(release_record(chart))
    print(
        f"\nwheel {wheel.stat().st_size / 1024:.0f} KiB (stored); ConfigMap data {data / 1024:.0f} KiB of "
        f"{CONFIGMAP_LIMIT // 1024} KiB ({100 * data / CONFIGMAP_LIMIT:.0f} %); release record "
        f"{record / 1024:.0f} KiB of {RELEASE_LIMIT // 1024} KiB ({100 * record / RELEASE_LIMIT:.0f} %)"
    )
    assert data == wheel.stat().st_size
    # The headroom is printed (docs/deploy.md has the figures); render's own cap keeps both under their limit
    # as deploykit grows (the next test).
    assert data < CONFIGMAP_LIMIT
    assert record < RELEASE_LIMIT


def test_render_refuses_a_wheel_before_the_release_record_would_not_fit(chart: Chart) -> None:
    """render's cap (MAX_WHEEL_BYTES) is below what the release record can carry: the record grows about
    1.2 times as fast as the wheel (two base64 copies, gzipped, base64 again)."""
    from deploykit.render.plugin_wheel import MAX_WHEEL_BYTES

    wheel = (chart.root / "files" / chart.values["plugin"]["wheel"]["file"]).stat().st_size
    record = len(release_record(chart))
    rest = record - 1.2 * wheel  # templates, values, the other manifests
    assert rest + 1.2 * MAX_WHEEL_BYTES < RELEASE_LIMIT
    assert MAX_WHEEL_BYTES < CONFIGMAP_LIMIT


def test_client_side_apply_cannot_carry_it_so_the_config_map_asks_for_server_side_apply(chart: Chart) -> None:
    """`kubectl apply` (client-side, Argo CD's default) copies the whole object into the
    kubectl.kubernetes.io/last-applied-configuration annotation: over 256 KiB the API server refuses it.
    The plugin ConfigMap is far over, so it asks Argo CD for server-side apply (no such annotation); Helm
    itself writes none (docs/deploy.md, sizes and headroom)."""
    config_map = plugin_config_map(chart)
    last_applied = len(json.dumps(config_map, separators=(",", ":")))
    print(
        f"\nlast-applied annotation would be {last_applied / 1024:.0f} KiB, "
        f"of {LAST_APPLIED_LIMIT // 1024} KiB"
    )
    assert last_applied > LAST_APPLIED_LIMIT
    annotations = config_map["metadata"]["annotations"]
    assert annotations["argocd.argoproj.io/sync-options"] == "ServerSideApply=true"
    assert config_map["immutable"] is True
    assert (
        config_map["metadata"]["name"] == f"{RELEASE}-plugin-{chart.values['plugin']['wheel']['sha256'][:12]}"
    )
