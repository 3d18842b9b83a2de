"""Which GPUs a rendered systemd unit opens, and where its software may live (issue 34).

GPUs: by default the first N (0..N-1, N = the plan's GPU count), as before; `render systemd --gpus 2,3`
chooses others, so two single-GPU profiles on one host do not both take GPU 0. A choice is checked
against the plan (as many GPUs as it needs, each one the facts know) and against the other deploykit
server units already rendered into the same `--out` directory (overlap: a warning naming the unit).

Prefix: the unit runs with `ProtectHome=yes` and `PrivateTmp=yes`, so an environment under /home, /root,
/run/user, /tmp or /var/tmp is invisible (or empty) inside its own sandbox: vLLM would never start.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from deploykit.render.common import RenderError

HIDDEN = {
    "/home": "ProtectHome=yes",
    "/root": "ProtectHome=yes",
    "/run/user": "ProtectHome=yes",
    "/tmp": "PrivateTmp=yes",
    "/var/tmp": "PrivateTmp=yes",
}
"""Directories the units' sandbox hides, and the directive that hides each."""


def check_prefix_visible(prefix: Path) -> None:
    """RenderError (one line) when `prefix` is under a directory the unit's own sandbox hides."""
    path = PurePosixPath(str(prefix))
    for top, directive in HIDDEN.items():
        if path == PurePosixPath(top) or PurePosixPath(top) in path.parents:
            raise RenderError(
                f"--prefix {prefix}: under {top}, which the unit's own sandbox hides ({directive}): vLLM "
                "would not start; install the environment elsewhere (e.g. /opt/deploykit, root-owned)"
            )


def parse_gpus(text: str | None) -> list[int] | None:
    """`--gpus 2,3` as indices (None: the default). RenderError for anything but distinct whole numbers."""
    if text is None:
        return None
    words = [word.strip() for word in text.split(",")]
    if not words or not all(word.isdigit() for word in words):
        raise RenderError(f"--gpus {text!r}: expected GPU indices separated by commas, e.g. 0 or 2,3")
    indices = [int(word) for word in words]
    if len(set(indices)) != len(indices):
        raise RenderError(f"--gpus {text!r}: a GPU is named twice")
    return indices


def unit_gpus(chosen: list[int] | None, count: int, known: int) -> list[int]:
    """The GPUs the unit opens: `chosen`, checked, else 0..count-1. `known`: the GPUs in the facts (0: no
    GPU facts, so an index cannot be checked)."""
    if chosen is None:
        return list(range(count))
    if len(chosen) != count:
        raise RenderError(f"--gpus names {len(chosen)} GPU(s); the plan needs {count}")
    missing = [index for index in chosen if known and index >= known]
    if missing:
        raise RenderError(f"--gpus {missing[0]}: the facts show GPUs 0..{known - 1} only")
    return chosen


_OWN_WORKER = re.compile(r"^-worker-[0-9]+\.service$")  # after the profile's unit name (render/systemd.py)
_VISIBLE = re.compile(r"^Environment=\"?CUDA_VISIBLE_DEVICES=([0-9,]+)\"?\s*$", re.MULTILINE)


def overlapping_units(out: Path, own_unit: str, gpus: list[int]) -> list[str]:
    """Warnings for the other deploykit server units in `out` that open one of `gpus` too."""
    warnings = []
    for other in sorted(out.glob("deploykit-*.service")) if out.is_dir() else []:
        if other.name == f"{own_unit}.service" or other.name.endswith(("-smoke.service", "-canary.service")):
            continue
        if _OWN_WORKER.match(other.name.removeprefix(own_unit)):
            continue  # this profile's own worker unit: the same GPUs, on another host of the group
        try:
            text = other.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        found = _VISIBLE.search(text)
        shared = sorted(set(gpus) & {int(i) for i in found.group(1).split(",") if i}) if found else []
        if shared:
            warnings.append(
                f"{other.name} in {out} opens GPU {','.join(map(str, shared))} too: two servers on one GPU "
                "run out of memory; render one of them with --gpus"
            )
    return warnings
