"""The fixes this process was asked for (DEPLOYKIT_FIXES) and the ones it applied, with their targets.

Its own module so that the entry point (which applies fixes) and the status route (which reports them)
both read it without importing each other.
"""

from __future__ import annotations

import os

from deploykit.fixes import FIX_NAMES
from deploykit.fixes.base import FixError
from deploykit.plugin_contract import FIXES_ENV

_applied: dict[str, str] = {}


def requested_fixes(value: str | None = None) -> list[str]:
    """The fix names in DEPLOYKIT_FIXES, validated; an unknown name is an error, never ignored."""
    raw = os.environ.get(FIXES_ENV, "") if value is None else value
    names = [part.strip() for part in raw.split(",") if part.strip()]
    unknown = [name for name in names if name not in FIX_NAMES]
    if unknown:
        raise FixError(
            f"{FIXES_ENV} names unknown fix(es) {', '.join(unknown)}; known fixes: {', '.join(FIX_NAMES)}"
        )
    return list(dict.fromkeys(names))


def record_applied(name: str, target: str) -> None:
    _applied[name] = target


def is_applied(name: str) -> bool:
    return name in _applied


def applied_fixes() -> dict[str, str]:
    """Fix name → the target it patched (or why nothing was), in this process."""
    return dict(_applied)
