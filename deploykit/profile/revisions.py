"""A `download` model volume names the commit it fetches: a branch or tag moves, so two pods of one release
could start on different weights. Judged on the profile alone, so `plan` and `render` both say it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from deploykit.profile.load import located

if TYPE_CHECKING:
    from deploykit.profile.schema import LoadedProfile

# The hub's commit ids, as huggingface_hub takes a revision: 40 lowercase hex digits. The init container's
# program (deploykit.render.model_download, which imports nothing of deploykit) spells the same rule; a test
# holds the two alike.
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def is_commit(revision: str) -> bool:
    return bool(_COMMIT.match(revision))


def revision_warnings(loaded: LoadedProfile) -> list[str]:
    """One located line per `download` volume whose revision is not a commit (or is not given)."""
    warnings = []
    for index, volume in enumerate(loaded.profile.model.volumes):
        if volume.kind != "download" or (volume.revision and is_commit(volume.revision)):
            continue
        moving = (
            "the files a pod starts on change whenever the branch does, so two pods of this chart can serve "
            "different weights: pin the commit (revision: its 40 lowercase hex digits, from the repository's "
            "history on the hub; the init container's log names the commit it fetched)"
        )
        if volume.revision is None:
            field: tuple[str | int, ...] = ("model", "volumes", index)
            message = f"no revision: {volume.repo} is fetched at main; {moving}"
            warnings.append(located(loaded, field, message))
        else:
            field = ("model", "volumes", index, "revision")
            what = f"{volume.revision} is a branch or tag, not a commit"
            warnings.append(located(loaded, field, f"{what}: {moving}"))
    return warnings
