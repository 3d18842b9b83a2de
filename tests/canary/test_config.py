"""The canary's settings, declared once (`CanarySettings`) and checked alike whatever runs the canary:
`deploykit canary`, `deploykit serve --canary-every`, the rendered units and chart."""

from __future__ import annotations

import math

import pytest

from deploykit.canary import defaults
from deploykit.canary.config import (
    MIN_EVERY_S,
    SERVE_FLAGS,
    CanaryOptions,
    CanarySettings,
    check_options,
    check_settings,
)
from deploykit.errors import CanaryError


@pytest.mark.parametrize("every", [0.01, 0.0999, 0.0, -1.0, math.nan, math.inf])
def test_an_interval_under_the_floor_is_refused_by_every_command(every: float) -> None:
    with pytest.raises(CanaryError, match=r"^--every .*at least 0\.1"):
        check_options(CanaryOptions(url="http://127.0.0.1:8000", every_s=every))
    with pytest.raises(CanaryError, match=r"^--canary-every .*at least 0\.1"):
        check_settings(SERVE_FLAGS, every_s=every)


def test_the_floor_itself_and_the_defaults_pass() -> None:
    assert check_settings(every_s=MIN_EVERY_S).every_s == MIN_EVERY_S
    settings = CanarySettings()
    assert (settings.every_s, settings.metrics_every_s, settings.miss_limit) == (
        defaults.EVERY_S,
        defaults.METRICS_EVERY_S,
        defaults.MISS_LIMIT,
    )


def test_what_render_writes_into_the_units_and_the_chart_passes_the_same_check() -> None:
    """The units and the chart run `deploykit canary` with these: they must be settings it accepts."""
    from deploykit.render import helm, systemd

    check_settings(every_s=systemd.CANARY_EVERY_S)
    check_settings(every_s=helm.CANARY_EVERY_S, miss_limit=helm.CANARY_MISS_LIMIT)


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"timeout_s": 0.0}, "--timeout 0.0: must be a positive number"),
        ({"timeout_s": math.nan}, "--timeout nan"),
        ({"metrics_every_s": 0.05}, "--metrics-every 0.05: must be 0 (off)"),
        ({"miss_limit": 0}, "--miss-limit 0: must be at least 1"),
    ],
)
def test_each_setting_is_named_with_its_value(values: dict[str, float], needle: str) -> None:
    with pytest.raises(CanaryError) as caught:
        check_settings(**values)
    assert str(caught.value).startswith(needle), str(caught.value)
    assert "\n" not in str(caught.value)
