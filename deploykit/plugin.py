"""deploykit's vLLM general plugin (entry point group `vllm.general_plugins`).

vLLM calls `register()` in every process it starts (API server, engine core, workers), so it must be
re-entrant and cheap. With DEPLOYKIT_FIXES unset or empty it does nothing at all: installing
deploykit never changes another vLLM deployment. With fixes named, it applies them and adds
`GET /deploykit/status`, which reports what the engine processes applied (`deploykit.plugin_status`).
"""

from __future__ import annotations

import logging
import os

from deploykit.fixes import FIX_NAMES, load_fix
from deploykit.fixes.base import FixError

ENV_VAR = "DEPLOYKIT_FIXES"
logger = logging.getLogger("deploykit.plugin")

_applied: dict[str, str] = {}


def requested_fixes(value: str | None = None) -> list[str]:
    """The fix names in DEPLOYKIT_FIXES, validated; an unknown name is an error, never ignored."""
    raw = os.environ.get(ENV_VAR, "") if value is None else value
    names = [part.strip() for part in raw.split(",") if part.strip()]
    unknown = [name for name in names if name not in FIX_NAMES]
    if unknown:
        raise FixError(
            f"{ENV_VAR} names unknown fix(es) {', '.join(unknown)}; known fixes: {', '.join(FIX_NAMES)}"
        )
    return list(dict.fromkeys(names))


def register() -> None:
    """Apply each fix named in DEPLOYKIT_FIXES once per process; fail loudly when one cannot apply.

    With DEPLOYKIT_TRACE set (by `deploykit trace` only) also hook the model for the trace; unset, the
    trace module is not even imported.
    """
    if os.environ.get("DEPLOYKIT_TRACE"):
        from deploykit.trace.hooks import install

        install()
    names = requested_fixes()
    if not names:
        return
    from deploykit.installed import vllm_version_label

    version = vllm_version_label()
    for name in names:
        if name in _applied:
            continue
        target = load_fix(name).apply()
        _applied[name] = target
        # vLLM configures the root handler; use its logger so the line lands in the server log.
        logging.getLogger("vllm").info("deploykit: applied fix %s to %s (vLLM %s)", name, target, version)
    from deploykit import plugin_status

    try:
        plugin_status.install(version)
    except plugin_status.StatusRouteError as exc:  # a fix nobody can verify must not start either
        raise FixError(str(exc)) from exc


def applied_fixes() -> dict[str, str]:
    return dict(_applied)
