"""The verdict file (`--verdict-file`): the canary's state as one JSON object, for the pod's exec probes
(`deploykit.render.pod_probe`), which read it from a shared volume instead of depending on the canary's port.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any


def write_verdict_file(path: str | os.PathLike[str], verdict: dict[str, Any]) -> None:
    """Atomically: a temporary file in the same directory (same filesystem), fsynced, then renamed over
    `path`; a reader sees the old verdict or the new one, never half of one. Mode 0644: the probes run in
    the vLLM container, often under another user. Raises OSError; the temporary file never stays."""
    target = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(target))
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(verdict) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), 0o644)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
