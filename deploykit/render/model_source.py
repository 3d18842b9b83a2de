"""Where the chart's pod finds its model and LoRA adapters: the profile's `model.volumes` as chart values.

The chart never rewrites the argv, so a local `model.source` or adapter path is the path vLLM opens inside
the pod, and something in the release must put the files there: a PVC, a node directory, an image volume, or
an init container that downloads them (for clusters with egress, never by default). A local path that no
volume holds would make vLLM crash-loop at start-up (static adapters are loaded then), so render refuses
it. When every path is local the pod runs with the hub switched off (`HF_HUB_OFFLINE`,
`TRANSFORMERS_OFFLINE`): a cluster without egress never waits on a hub it cannot reach. The rule is the plan's
(deploykit.plan.hub_sources), whose env carries the same variables to serve and the systemd unit.

A `download` volume should name a commit: a branch or tag (or no revision: `main`) moves, and two pods of one
chart could start on different weights. The plan warns (deploykit.profile.revisions), located in the
profile, rather than refusing: nothing here asks the hub, so it cannot offer the commit, and a moving
revision is fine for a first try. The init
container runs deploykit.render.model_download, which the chart carries under files/.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Any

from deploykit.profile.schema import ModelVolume, covering_volume
from deploykit.render.common import RenderError

if TYPE_CHECKING:
    from deploykit.plan import Plan
    from deploykit.profile.schema import LoadedProfile


# A volume a hub model lands in (the cache; a download's scratch volume): the biggest shipped model
# (qwen-lora-hopper's 27B in bf16, ~56 GB) and vLLM's compile caches, with room to spare. Values:
# cache.persistence.size, cache.sizeLimit.
HUB_VOLUME_SIZE = "100Gi"


def _is_local(path: str) -> bool:
    return path.startswith("/")


def _volume_source(volume: ModelVolume) -> dict[str, Any]:
    """The Kubernetes volume source of one entry (the chart adds name and mounts)."""
    if volume.kind == "pvc":
        return {"persistentVolumeClaim": {"claimName": volume.claim, "readOnly": True}}
    if volume.kind == "host_path":
        return {"hostPath": {"path": volume.path, "type": "Directory"}}
    if volume.kind == "image":
        return {"image": {"reference": volume.image, "pullPolicy": "IfNotPresent"}}
    if volume.claim:  # download into a claim of the user's: kept across pod restarts
        return {"persistentVolumeClaim": {"claimName": volume.claim}}
    return {"emptyDir": {"sizeLimit": HUB_VOLUME_SIZE}}  # filled at every pod start; sized like the cache


def _volume_values(index: int, volume: ModelVolume) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": f"model-{index}",
        "mountPath": volume.mount_path,
        "source": _volume_source(volume),
    }
    if volume.sub_path:
        entry["subPath"] = volume.sub_path
    if volume.kind == "download":
        entry["download"] = {"repo": volume.repo, "revision": volume.revision or ""}
    return entry


DOWNLOAD_PROGRAM = "model_download.py"  # under the chart's files/: templates/_helpers.tpl reads it


def download_program() -> str:
    """The download init container's program: deploykit.render.model_download's text, run as `python3 -c`."""
    return resources.files("deploykit.render").joinpath("model_download.py").read_text(encoding="utf-8")


def required_paths(plan: Plan, loaded: LoadedProfile) -> list[tuple[str, str]]:
    """(field, path) for every local path vLLM opens at start-up: the model and each static adapter."""
    model_path = plan.argv[2]
    paths = [("model.source", model_path)] if _is_local(model_path) else []
    for name, path in loaded.profile.serve.lora.adapters.items():
        if _is_local(path):
            paths.append((f"serve.lora.adapters.{name}", path))
    return paths


def model_values(plan: Plan, loaded: LoadedProfile) -> tuple[dict[str, Any], list[str]]:
    """The chart's `model` values and the warnings: refused when a local path has no volume."""
    profile = loaded.profile
    volumes = profile.model.volumes
    paths = required_paths(plan, loaded)
    for field, path in paths:
        if covering_volume(path, volumes) is None:
            what = f"{field} {path} is a local path"
            if field == "model.source" and profile.model.source != path:
                what = f"model.source {profile.model.source} is built on the rendering machine (at {path})"
            raise RenderError(
                f"{loaded.path}: {what}, and nothing in the release puts it in the pod: add a model.volumes "
                "entry whose mount_path holds it (kind pvc, host_path, image or download; docs/deploy.md, "
                "offline model staging)"
            )
    from deploykit.plan import hub_sources

    warnings: list[str] = []  # a moving download revision: the plan's warning (profile.revisions)
    hub = hub_sources(profile, plan.argv[2])  # the plan's rule: it runs offline when this is empty
    for field, name in hub:
        warnings.append(
            f"{field} {name} is fetched from the Hugging Face hub at every pod start: the cluster must reach "
            "it; to run without egress stage it on a volume (model.volumes) and give its local path"
        )
    if hub:
        warnings.append(
            "the hub cache (values cache) is a PersistentVolumeClaim of cache.persistence.size while the "
            "release is one pod, so a new pod does not fetch the model again: the cluster needs a default "
            "StorageClass "
            "(or set cache.persistence.storageClassName), else the pod stays Pending; "
            "cache.persistence.enabled=false gives an emptyDir of cache.sizeLimit, filled at every pod start"
        )
    values = {
        "offline": not hub,
        "paths": [path for _, path in paths],
        "volumes": [_volume_values(index, volume) for index, volume in enumerate(volumes)],
    }
    return values, warnings
