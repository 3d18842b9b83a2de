"""The model download init container's program (a `download` model volume; docs/deploy.md, offline model
staging): fetch a hub repo at its revision into the volume and exit non-zero unless every file of that
commit is there at its size, so vLLM never starts on a partial snapshot.

huggingface_hub's snapshot_download returns a non-empty `local_dir` as it is when the hub cannot be reached,
whatever a download cut short left in it. So a complete download leaves a manifest (the commit and each
file's size, from the hub's listing); without the hub, only a manifest for this repo and revision whose files
are all there lets the pod go on. The chart runs this file's text with the vLLM image's `python3 -c`
(`files/` of the chart): stdlib and huggingface_hub only, never deploykit.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

MANIFEST = ".deploykit-snapshot.json"
# deploykit.exit_codes' OK and FAILED, spelled here because this program imports nothing of deploykit
# (tests/render/test_downloads.py holds them equal).
OK, FAILED = 0, 1
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_INDEX_SUFFIX = ".safetensors.index.json"


def is_commit(revision: str) -> bool:
    """A commit id as the hub and huggingface_hub take it: 40 lowercase hex digits (a branch or tag moves)."""
    return bool(_COMMIT.match(revision))


def index_shards(directory: Path) -> dict[str, int | None]:
    """The weight shards each safetensors index of the snapshot names (`weight_map`), relative paths."""
    shards: dict[str, int | None] = {}
    for index in sorted(directory.rglob(f"*{_INDEX_SUFFIX}")):
        if ".cache" in index.relative_to(directory).parts:
            continue
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        except (OSError, ValueError, AttributeError):
            weight_map = {}
        if not isinstance(weight_map, dict) or not weight_map:
            shards[str(index.relative_to(directory))] = -1  # unreadable: reported as such
            continue
        for shard in set(weight_map.values()):
            shards[str((index.parent / str(shard)).relative_to(directory))] = None
    return shards


def incomplete(directory: Path, files: Mapping[str, int | None]) -> list[str]:
    """One line per file of the snapshot (`files`, name → size or None, plus every shard its safetensors
    indexes name) that is missing, empty, or of another size than the hub's listing says."""
    expected: dict[str, int | None] = {**index_shards(directory), **files}
    problems = []
    for name, size in sorted(expected.items()):
        path = directory / name
        if size == -1:
            problems.append(f"{name}: a safetensors index without a weight_map")
        elif not path.is_file():
            problems.append(f"{name}: missing")
        elif size is None and path.stat().st_size == 0:
            problems.append(f"{name}: empty")
        elif size is not None and path.stat().st_size != size:
            problems.append(f"{name}: {path.stat().st_size} bytes, the hub lists {size}")
    return problems


def read_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    keys = {"repo": str, "revision": str, "commit": str, "files": dict}
    if not isinstance(manifest, dict) or any(not isinstance(manifest.get(k), t) for k, t in keys.items()):
        return None
    return manifest


def write_manifest(
    directory: Path, repo: str, revision: str, commit: str, files: Mapping[str, int | None]
) -> None:
    """Written last, atomically: its presence says the files it lists were all there at these sizes."""
    text = json.dumps({"repo": repo, "revision": revision, "commit": commit, "files": dict(files)}, indent=1)
    partial = directory / (MANIFEST + ".partial")
    partial.write_text(text + "\n", encoding="utf-8")
    os.replace(partial, directory / MANIFEST)


def _fail(what: str, problems: list[str]) -> int:
    shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
    print(f"deploykit model download: {what}: {shown}", file=sys.stderr)
    return FAILED


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def without_hub(directory: Path, repo: str, revision: str, error: BaseException) -> int:
    """The hub could not be asked (unreachable, offline mode, a server error): go on only with a complete
    earlier download of this repo at this revision (a PVC kept across restarts)."""
    reason = f"the hub cannot be reached ({_first_line(error)})"
    manifest = read_manifest(directory) or {}
    wanted = revision or "main"
    if manifest.get("repo") != repo or wanted not in (manifest.get("revision"), manifest.get("commit")):
        return _fail(
            f"{repo}@{wanted}: {reason}",
            [f"{directory} holds no complete download of it; vLLM would start on a partial snapshot"],
        )
    problems = incomplete(directory, manifest["files"])
    if problems:
        return _fail(f"{repo}@{wanted}: {reason}, and the download in {directory} is incomplete", problems)
    commit = manifest["commit"]
    print(f"deploykit model download: {reason}; {repo} commit {commit} is complete in {directory}")
    return OK


def _size(sibling: Any) -> int | None:
    size = getattr(sibling, "size", None)
    if size is None and isinstance(getattr(sibling, "lfs", None), dict):
        size = sibling.lfs.get("size")
    return size if isinstance(size, int) else None


def main(environ: Mapping[str, str] = os.environ) -> int:
    repo, revision = environ["DEPLOYKIT_MODEL_REPO"], environ.get("DEPLOYKIT_MODEL_REVISION", "")
    directory = Path(environ["DEPLOYKIT_MODEL_DIR"])
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.utils import RepositoryNotFoundError, RevisionNotFoundError

    wanted = revision or "main"
    if not is_commit(wanted):
        print(f"deploykit model download: {repo}@{wanted} is not a commit: the files may change at any start")
    try:
        info = HfApi().model_info(repo, revision=revision or None, files_metadata=True)
    except (RepositoryNotFoundError, RevisionNotFoundError) as error:  # gated without HF_TOKEN included
        return _fail(f"{repo}@{wanted}", [_first_line(error)])
    except Exception as error:  # any other failure to ask the hub: only a complete copy will do
        return without_hub(directory, repo, revision, error)
    files = {sibling.rfilename: _size(sibling) for sibling in info.siblings or []}
    if not info.sha or not files:
        return _fail(f"{repo}@{wanted}", ["the hub listed no commit or no files"])
    (directory / MANIFEST).unlink(missing_ok=True)  # from here until it is written again, nothing is complete
    try:
        snapshot_download(repo_id=repo, revision=info.sha, local_dir=str(directory))
    except Exception as error:  # a download cut short: said in one line, the pod fails
        return _fail(f"{repo} commit {info.sha}: the download failed", [_first_line(error)])
    problems = incomplete(directory, files)
    if problems:
        return _fail(f"{repo} commit {info.sha}: the download in {directory} is incomplete", problems)
    write_manifest(directory, repo, wanted, info.sha, files)
    print(f"deploykit model download: {repo} commit {info.sha}: {len(files)} files complete in {directory}")
    return OK


if __name__ == "__main__":
    sys.exit(main())
