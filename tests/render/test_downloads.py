"""Reproducible model downloads (issue 48): a `download` volume's init container never lets vLLM start on a
partial snapshot, and the hub cache is a sized volume that a hub model is fetched into once.

The completeness check (deploykit.render.model_download) is tried on real directory layouts, with the real
huggingface_hub in offline mode, and then as the chart renders it: the init container's own command, run
against a local stand-in for the hub that serves a repo, fails a shard, and goes away. The cache volume is
checked in `helm template` output, validated strictly against Kubernetes' schemas."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import kubernetes_validate
import pytest

from deploykit.render import model_download
from deploykit.render.model_download import MANIFEST, incomplete, index_shards, is_commit
from tests.render.test_helm import (
    FACTS_DIR,
    KUBERNETES_VERSIONS,
    RELEASE,
    Chart,
    pod_of,
    render_chart,
    run_helm,
    template,
)

# Tensor 8 × pipeline 2 over two nodes of 8 H100s (tests/render/test_helm_group.py's group, whose module is
# helm-only: importing it would take this module's fast tests out of the fast tier).
GROUP = {
    "serve.host": "0.0.0.0",
    "serve.tensor_parallel_size": 8,
    "serve.pipeline_parallel_size": 2,
    "deploy.nodes": 2,
}
REPO_ID = "org/tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
INDEX = "model.safetensors.index.json"
REPO_FILES: dict[str, bytes] = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    INDEX: json.dumps(
        {"metadata": {}, "weight_map": {"a.weight": SHARDS[0], "b.weight": SHARDS[1]}}
    ).encode(),
    SHARDS[0]: b"\x01" * 1500,
    SHARDS[1]: b"\x02" * 2500,
    "tokenizer.json": b"{}",
}
SIZES: dict[str, int | None] = {name: len(data) for name, data in REPO_FILES.items()}


def write_snapshot(directory: Path, leave_out: tuple[str, ...] = ()) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in REPO_FILES.items():
        if name not in leave_out:
            (directory / name).write_bytes(data)
    return directory


# --- the check, on real directory layouts ----------------------------------------------------------------


def test_a_complete_snapshot_passes(tmp_path: Path) -> None:
    snapshot = write_snapshot(tmp_path / "m")
    assert incomplete(snapshot, SIZES) == []
    assert set(index_shards(snapshot)) == set(SHARDS)


def test_a_missing_or_short_shard_fails_with_one_line_each(tmp_path: Path) -> None:
    snapshot = write_snapshot(tmp_path / "m", leave_out=(SHARDS[1],))
    assert incomplete(snapshot, SIZES) == [f"{SHARDS[1]}: missing"]
    (snapshot / SHARDS[1]).write_bytes(b"\x02" * 1000)  # a download cut short
    assert incomplete(snapshot, SIZES) == [f"{SHARDS[1]}: 1000 bytes, the hub lists 2500"]


def test_the_safetensors_index_alone_names_the_shards(tmp_path: Path) -> None:
    """Without the hub's listing (sizes unknown), each shard the index names must be there and not empty."""
    snapshot = write_snapshot(tmp_path / "m", leave_out=(SHARDS[0],))
    (snapshot / SHARDS[1]).write_bytes(b"")
    assert incomplete(snapshot, {}) == [f"{SHARDS[0]}: missing", f"{SHARDS[1]}: empty"]
    (snapshot / INDEX).write_text("{")
    assert incomplete(snapshot, {}) == [f"{INDEX}: a safetensors index without a weight_map"]


def test_a_commit_is_forty_lowercase_hex_digits() -> None:
    assert is_commit(COMMIT)
    assert not any(is_commit(r) for r in ("main", "v1.0", COMMIT.upper(), COMMIT[:12], COMMIT + "0"))


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The real huggingface_hub in offline mode (HF_HUB_OFFLINE=1), its cache in the test's directory."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    revision = {"DEPLOYKIT_MODEL_REPO": REPO_ID, "DEPLOYKIT_MODEL_REVISION": COMMIT}
    return {**revision, "DEPLOYKIT_MODEL_DIR": str(tmp_path / "m")}


def test_offline_mode_never_passes_a_partial_download(
    offline_hub: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = write_snapshot(Path(offline_hub["DEPLOYKIT_MODEL_DIR"]), leave_out=(SHARDS[1],))
    assert model_download.main(offline_hub) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"deploykit model download: {REPO_ID}@{COMMIT}: the hub cannot be reached")
    assert "OfflineModeIsEnabled" in line and "holds no complete download" in line and "\n" not in line
    # A manifest says the download completed; the shard it lists is still missing.
    model_download.write_manifest(snapshot, REPO_ID, COMMIT, COMMIT, SIZES)
    assert model_download.main(offline_hub) == 1
    assert f"{SHARDS[1]}: missing" in capsys.readouterr().err


def test_offline_mode_passes_a_complete_download(
    offline_hub: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = write_snapshot(Path(offline_hub["DEPLOYKIT_MODEL_DIR"]))
    model_download.write_manifest(snapshot, REPO_ID, "main", COMMIT, SIZES)
    assert model_download.main(offline_hub) == 0  # asked for the commit the manifest records
    assert f"commit {COMMIT} is complete" in capsys.readouterr().out
    other = {**offline_hub, "DEPLOYKIT_MODEL_REVISION": "v2"}  # a revision this download is not known to be
    assert model_download.main(other) == 1


# --- a stand-in for the hub -------------------------------------------------------------------------------


class FakeHub:
    """The few routes huggingface_hub asks: a model's info and tree at a revision, each file's HEAD and GET.
    `failing` files answer 404, as a file gone mid-download would; `close()` makes the hub unreachable."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files: dict[str, bytes] = files
        self.failing: set[str] = set()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self.serve_file(body=False)

            def do_GET(self) -> None:
                path = urlparse(self.path).path
                if path.startswith(f"/api/models/{REPO_ID}/revision/"):
                    siblings = [{"rfilename": n, "size": len(d)} for n, d in hub.files.items()]
                    self.send_json({"id": REPO_ID, "sha": COMMIT, "siblings": siblings})
                elif path.startswith(f"/api/models/{REPO_ID}/tree/"):
                    tree = [
                        {"type": "file", "path": n, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                        for n, d in hub.files.items()
                    ]
                    self.send_json(tree)
                else:
                    self.serve_file(body=True)

            def send_json(self, value: Any) -> None:
                body = json.dumps(value).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def serve_file(self, body: bool) -> None:
                prefix = f"/{REPO_ID}/resolve/"
                path = unquote(urlparse(self.path).path)
                name = path[len(prefix) :].partition("/")[2] if path.startswith(prefix) else ""
                if name not in hub.files or name in hub.failing:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = hub.files[name]
                self.send_response(200)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{hashlib.sha1(data).hexdigest()}"')
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body:
                    self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        if self.thread.is_alive():
            self.server.shutdown()
            self.server.server_close()


@pytest.fixture
def fake_hub() -> Iterator[FakeHub]:
    hub = FakeHub(REPO_FILES)
    yield hub
    hub.close()


# --- the chart: the init container as rendered -----------------------------------------------------------


@pytest.fixture(scope="module")
def download_chart(tmp_path_factory: pytest.TempPathFactory) -> tuple[Chart, Path]:
    """gemma4-turing with its model from a `download` volume on a claim, at the moving revision `main`."""
    from tests.profile_variants import profile_variant

    directory = tmp_path_factory.mktemp("download")
    volume = {
        "kind": "download",
        "repo": REPO_ID,
        "revision": "main",
        "claim": "weights",
        "mount_path": "/models/m",
    }
    changes = {"serve.host": "0.0.0.0", "model.source": "/models/m", "model.volumes": [volume]}
    profile = profile_variant(directory, "gemma4-turing", changes)
    return render_chart(profile, FACTS_DIR / "t4.json", directory / "out"), profile


def init_container(chart: Chart) -> dict[str, Any]:
    found = [c for c in pod_of(chart.manifests)["initContainers"] if c["name"].startswith("download-")]
    assert len(found) == 1, found
    download: dict[str, Any] = found[0]
    return download


def run_as_rendered(
    download: dict[str, Any], hub_url: str, scratch: Path, model_dir: Path
) -> subprocess.CompletedProcess[str]:
    """The init container's command with its environment, here: the image's python3 is this one (with
    huggingface_hub), the container's /tmp is `scratch` (new at every start, as a container's is), the hub is
    `hub_url`, and the volume is `model_dir`."""
    env = {e["name"]: e["value"] for e in download["env"] if "value" in e}
    env.update(
        HOME=str(scratch),
        HF_HOME=str(scratch / "huggingface"),
        HF_ENDPOINT=hub_url,
        DEPLOYKIT_MODEL_DIR=str(model_dir),
        PATH=os.environ.get("PATH", ""),
    )
    command = download["command"]
    assert command[0] == "python3"
    return subprocess.run(
        [sys.executable, *command[1:]], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.external_tool
def test_the_init_container_runs_the_check(download_chart: tuple[Chart, Path]) -> None:
    chart, _ = download_chart
    download = init_container(chart)
    program = (Path(model_download.__file__)).read_text(encoding="utf-8")
    assert download["command"] == ["python3", "-c", program]
    assert (chart.root / "files" / "model_download.py").read_text(encoding="utf-8") == program
    env = {e["name"]: e.get("value") for e in download["env"]}
    assert env["DEPLOYKIT_MODEL_REPO"] == REPO_ID and env["DEPLOYKIT_MODEL_REVISION"] == "main"


@pytest.mark.external_tool
def test_vllm_never_starts_on_a_partial_snapshot(
    download_chart: tuple[Chart, Path], fake_hub: FakeHub, tmp_path: Path
) -> None:
    """A download cut short (one shard fails), then a pod restart while the hub is unreachable: before issue
    48, snapshot_download returned the non-empty volume as it was and the init container exited 0."""
    download = init_container(download_chart[0])
    model_dir = tmp_path / "volume"  # the claim: kept across pod restarts
    model_dir.mkdir()
    fake_hub.failing.add(SHARDS[1])
    first = run_as_rendered(download, fake_hub.url, tmp_path / "start-1", model_dir)
    assert first.returncode != 0, first.stdout + first.stderr
    assert (model_dir / SHARDS[0]).is_file() and not (model_dir / SHARDS[1]).exists()
    fake_hub.close()
    second = run_as_rendered(download, fake_hub.url, tmp_path / "start-2", model_dir)
    assert second.returncode == 1, second.stdout + second.stderr
    (line,) = second.stderr.strip().splitlines()
    assert line.startswith(f"deploykit model download: {REPO_ID}@main: the hub cannot be reached"), line
    assert "holds no complete download of it; vLLM would start on a partial snapshot" in line


@pytest.mark.external_tool
def test_a_complete_download_is_kept_and_checked_at_every_start(
    download_chart: tuple[Chart, Path], tmp_path: Path
) -> None:
    download = init_container(download_chart[0])
    model_dir = tmp_path / "volume"
    model_dir.mkdir()
    hub = FakeHub(REPO_FILES)
    try:
        done = run_as_rendered(download, hub.url, tmp_path / "start-1", model_dir)
    finally:
        hub.close()
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{REPO_ID} commit {COMMIT}: {len(REPO_FILES)} files complete" in done.stdout
    assert "main is not a commit" in done.stdout  # the moving revision, said in the pod's log too
    manifest = json.loads((model_dir / MANIFEST).read_text())
    assert manifest == {"repo": REPO_ID, "revision": "main", "commit": COMMIT, "files": SIZES}
    # The hub gone, a restarted pod starts on the complete copy; with a shard lost, it does not.
    again = run_as_rendered(download, hub.url, tmp_path / "start-2", model_dir)
    assert again.returncode == 0 and f"commit {COMMIT} is complete" in again.stdout, again.stderr
    (model_dir / SHARDS[0]).unlink()
    lost = run_as_rendered(download, hub.url, tmp_path / "start-3", model_dir)
    assert lost.returncode == 1 and f"{SHARDS[0]}: missing" in lost.stderr, lost.stderr


# --- the hub cache: a sized volume ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hub_chart(tmp_path_factory: pytest.TempPathFactory) -> Chart:
    """qwen-lora-hopper: its model comes from the hub (~56 GB) into the cache volume."""
    from tests.profile_variants import profile_variant

    directory = tmp_path_factory.mktemp("hub")
    profile = profile_variant(directory, "qwen-lora-hopper", {"serve.host": "0.0.0.0"})
    return render_chart(profile, FACTS_DIR / "h100.json", directory / "out")


def cache_of(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The pod's cache volume and the chart's PersistentVolumeClaims, each manifest validated strictly."""
    for doc in docs:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    (volume,) = [v for v in pod_of(docs)["volumes"] if v["name"] == "cache"]
    return volume, [d for d in docs if d["kind"] == "PersistentVolumeClaim"]


@pytest.mark.external_tool
def test_a_hub_model_is_cached_on_a_claim(hub_chart: Chart) -> None:
    """One pod: the chart's claim, so a new pod (an upgrade, a reschedule) finds the model already there."""
    assert hub_chart.values["cache"]["persistence"]["enabled"] == "auto"
    volume, (claim,) = cache_of(hub_chart.manifests)
    assert volume == {"name": "cache", "persistentVolumeClaim": {"claimName": f"{RELEASE}-cache"}}
    assert claim["metadata"]["name"] == f"{RELEASE}-cache"
    assert claim["spec"]["resources"]["requests"]["storage"] == "100Gi"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    sized = template(
        hub_chart.root,
        "--set", "cache.persistence.size=200Gi",
        "--set", "cache.persistence.storageClassName=fast-ssd",
    )  # fmt: skip
    _, (claim,) = cache_of(sized)
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "200Gi"


# Values that make the release more than one pod, or turn the claim off: a sized emptyDir per pod, no claim.
NO_CLAIM = {
    "two replicas": ("replicaCount=2",),
    "a surge": ("rollout.maxSurge=1",),
    "persistence off": ("cache.persistence.enabled=false",),
}


@pytest.mark.external_tool
@pytest.mark.parametrize("case", sorted(NO_CLAIM))
def test_more_pods_than_one_get_a_sized_empty_dir_each(hub_chart: Chart, case: str) -> None:
    options = [word for item in NO_CLAIM[case] for word in ("--set", item)]
    volume, claims = cache_of(template(hub_chart.root, *options, "--set", "cache.sizeLimit=80Gi"))
    assert volume == {"name": "cache", "emptyDir": {"sizeLimit": "80Gi"}} and claims == []


@pytest.mark.external_tool
def test_a_staged_model_keeps_a_sized_empty_dir(download_chart: tuple[Chart, Path]) -> None:
    """Nothing from the hub lands in the cache (the model is on its own volume): no claim to provision."""
    chart, _ = download_chart
    assert chart.values["cache"]["persistence"]["enabled"] is False
    volume, claims = cache_of(chart.manifests)
    assert volume == {"name": "cache", "emptyDir": {"sizeLimit": "100Gi"}} and claims == []
    volume, claims = cache_of(template(chart.root, "--set", "cache.persistence.enabled=true"))
    assert len(claims) == 1 and volume["persistentVolumeClaim"] == {"claimName": f"{RELEASE}-cache"}


def test_a_download_without_a_claim_gets_a_sized_scratch_volume() -> None:
    from deploykit.profile.schema import ModelVolume
    from deploykit.render.model_source import HUB_VOLUME_SIZE, _volume_values

    volume = ModelVolume(kind="download", repo=REPO_ID, revision=COMMIT, mount_path="/models/m")
    assert _volume_values(0, volume)["source"] == {"emptyDir": {"sizeLimit": HUB_VOLUME_SIZE}}
    claimed = volume.model_copy(update={"claim": "weights"})
    assert _volume_values(0, claimed)["source"] == {"persistentVolumeClaim": {"claimName": "weights"}}


@pytest.mark.external_tool
def test_the_schema_refuses_a_bad_cache_setting(hub_chart: Chart) -> None:
    for option in ("cache.persistence.enabled=sometimes", "cache.sizeLimit=big"):
        result = run_helm("template", RELEASE, str(hub_chart.root), "--set", option)
        assert result.returncode != 0 and "schema" in result.stderr, (option, result.stderr)


@pytest.fixture(scope="module")
def group_hub_chart(tmp_path_factory: pytest.TempPathFactory) -> Chart:
    from tests.profile_variants import profile_variant

    directory = tmp_path_factory.mktemp("group")
    profile = profile_variant(directory, "qwen-lora-hopper", GROUP)
    return render_chart(profile, FACTS_DIR / "h100x8.json", directory / "out")


@pytest.mark.external_tool
def test_a_group_never_shares_a_read_write_once_claim(group_hub_chart: Chart) -> None:
    """A group's pods run on different nodes: auto gives each its own emptyDir; the chart's claim needs
    ReadWriteMany, and is refused in one line without it."""
    (lws,) = [d for d in group_hub_chart.manifests if d["kind"] == "LeaderWorkerSet"]
    for role in ("leader", "worker"):
        spec = lws["spec"]["leaderWorkerTemplate"][f"{role}Template"]["spec"]
        (volume,) = [v for v in spec["volumes"] if v["name"] == "cache"]
        assert volume == {"name": "cache", "emptyDir": {"sizeLimit": "100Gi"}}
    refused = run_helm(
        "template", RELEASE, str(group_hub_chart.root), "--set", "cache.persistence.enabled=true"
    )
    assert refused.returncode != 0 and "cannot share a ReadWriteOnce claim" in refused.stderr, refused.stderr
    shared = template(
        group_hub_chart.root,
        "--set", "cache.persistence.enabled=true",
        "--set", "cache.persistence.accessModes={ReadWriteMany}",
    )  # fmt: skip
    assert [d["spec"]["accessModes"] for d in shared if d["kind"] == "PersistentVolumeClaim"] == [
        ["ReadWriteMany"]
    ]


# --- render's located warning for a moving revision ------------------------------------------------------


@pytest.mark.external_tool
def test_render_warns_of_a_moving_revision_at_its_line(download_chart: tuple[Chart, Path]) -> None:
    from tests.render.conftest import deploykit

    _, profile = download_chart
    line = next(n for n, text in enumerate(profile.read_text().splitlines(), 1) if "revision: main" in text)
    done = deploykit(
        "render", "helm", "--profile", str(profile), "--facts", str(FACTS_DIR / "t4.json"),
        "--out", str(profile.parent / "again"),
    )  # fmt: skip
    assert f"{profile}:{line}:" in done.stderr
    assert "model.volumes[0].revision: main is a branch or tag, not a commit" in done.stderr


def test_the_download_programs_statuses_are_deploykits() -> None:
    """The init container's program spells OK and FAILED itself (it imports nothing of deploykit)."""
    from deploykit import exit_codes
    from deploykit.render import model_download

    assert (model_download.OK, model_download.FAILED) == (exit_codes.OK, exit_codes.FAILED)
