"""The hang advisories a deployment's plan matched, named by the canary's `hung` verdict.

A hung engine looks the same whatever wedged it: `/health` 200, requests waiting, no token. The catalog
knows combinations that wedge (advisories of `kind: hang`); when the plan matched one, the verdict says so,
so the person paged reads the thread and its way out instead of starting from "the engine is hung".
Imports no torch or vLLM: the canary runs in a sidecar.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from deploykit.errors import CanaryError

if TYPE_CHECKING:
    from deploykit.advisories import AdvisoryOutcome

KNOWN_HANG_OPTION = "--known-hang"
# A matched hang the plan already took the way out of (its workaround in the argv, its fix on) is not the
# likely cause of a hang: only those left open are named.
_OPEN_OUTCOMES = frozenset({"warned", "ignored", "fix_off"})


def _hang_catalog() -> dict[str, str]:
    """Every hang advisory of the shipped catalog: id → its one-line name for a diagnosis."""
    from deploykit.advisories import advisories

    return {
        advisory.id: f"{advisory.id} ({', '.join(ref.label for ref in advisory.references[:2])})"
        for advisory in advisories()
        if advisory.kind == "hang"
    }


def hang_ids(outcomes: Iterable[AdvisoryOutcome]) -> list[str]:
    """The hang advisories a plan matched and left open (warned, or ignored by the profile), in catalog
    order: what serve's canary names, and what the chart and the units pass the canary as `--known-hang`."""
    wanted = {outcome.id for outcome in outcomes if outcome.outcome in _OPEN_OUTCOMES}
    return [advisory_id for advisory_id in _hang_catalog() if advisory_id in wanted]


def named_hangs(ids: Iterable[str]) -> tuple[str, ...]:
    """The diagnosis names of `--known-hang` ids; a CanaryError for an id the catalog lacks or that is no
    hang (a chart rendered by a newer deploykit than the image's must not pass silently)."""
    catalog = _hang_catalog()
    names = []
    for advisory_id in ids:
        if advisory_id not in catalog:
            raise CanaryError(
                f"{KNOWN_HANG_OPTION} {advisory_id}: not a hang advisory of this deploykit's catalog "
                f"(`deploykit advisories --kind hang` lists {len(catalog)})"
            )
        names.append(catalog[advisory_id])
    return tuple(names)


def hang_suffix(known: tuple[str, ...]) -> str:
    """What the `hung` diagnosis adds when the plan matched hang advisories; empty when it matched none."""
    if not known:
        return ""
    return (
        f"; this deployment matches known hang{'s' if len(known) > 1 else ''} {', '.join(known)}: "
        "`deploykit advisories ID` gives the way out"
    )
