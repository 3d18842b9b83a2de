"""deploykit's vLLM general plugin: the function its entry point names (`deploykit.plugin_contract`).

vLLM calls `register()` in every process it starts (API server, engine core, workers), so it must be
re-entrant and cheap. With DEPLOYKIT_FIXES unset or empty it does nothing at all: installing
deploykit never changes another vLLM deployment. With fixes named, it applies them and adds
`GET /deploykit/status`, which reports what the engine processes applied (`status_route`).
"""

from __future__ import annotations

import logging
import os

from deploykit.fixes import load_fix
from deploykit.fixes.base import FixError
from deploykit.plugin_contract import TRACE_ENV
from deploykit.vllm_plugin import applied

logger = logging.getLogger("deploykit.vllm_plugin")


def register() -> None:
    """Apply each fix named in DEPLOYKIT_FIXES once per process; fail loudly when one cannot apply.

    With DEPLOYKIT_TRACE set (by `deploykit trace` only) also hook the model for the trace; unset, the
    trace hooks are not even imported.
    """
    if os.environ.get(TRACE_ENV):
        from deploykit.vllm_plugin.trace_hooks import install

        install()
    names = applied.requested_fixes()
    if not names:
        return
    from deploykit.installed import vllm_version_label

    version = vllm_version_label()
    for name in names:
        if applied.is_applied(name):
            continue
        target = load_fix(name).apply()
        applied.record_applied(name, target)
        # vLLM configures the root handler; use its logger so the line lands in the server log.
        logging.getLogger("vllm").info("deploykit: applied fix %s to %s (vLLM %s)", name, target, version)
    from deploykit.vllm_plugin import status_route

    try:
        status_route.install(version)
    except status_route.StatusRouteError as exc:  # a fix nobody can verify must not start either
        raise FixError(str(exc)) from exc
