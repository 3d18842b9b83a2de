"""The canary's settings, declared once (`CanarySettings`) and checked alike whatever runs the canary:
`deploykit canary`, `deploykit serve --canary-every`, the rendered units and chart."""

from __future__ import annotations

import math

import pytest

from deploykit.canary.settings import (
    DEFAULTS,
    MIN_EVERY_S,
    SERVE_FLAGS,
    CanarySettings,
    check_settings,
)
from deploykit.errors import CanaryError


@pytest.mark.parametrize("every", [0.01, 0.0999, 0.0, -1.0, math.nan, math.inf])
def test_an_interval_under_the_floor_is_refused_by_every_command(every: float) -> None:
    with pytest.raises(CanaryError, match=r"^--every .*at least 0\.1"):
        check_settings(every_s=every)
    with pytest.raises(CanaryError, match=r"^--canary-every .*at least 0\.1"):
        check_settings(SERVE_FLAGS, every_s=every)


def test_the_floor_itself_and_the_defaults_pass() -> None:
    assert check_settings(every_s=MIN_EVERY_S).every_s == MIN_EVERY_S
    settings = CanarySettings()
    assert (settings.every_s, settings.metrics_every_s, settings.miss_limit, settings.listen) == (
        60.0,
        2.0,
        5,
        "127.0.0.1:9400",
    )
    assert settings == DEFAULTS


def test_what_render_writes_into_the_units_and_the_chart_passes_the_same_check() -> None:
    """The units and the chart run `deploykit canary` with these: they must be settings it accepts."""
    from deploykit.render import helm

    values = helm.canary_values()
    check_settings(every_s=values["every"], miss_limit=values["missLimit"], listen=f":{values['port']}")


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"timeout_s": 0.0}, "--timeout 0.0: must be a positive number"),
        ({"timeout_s": math.nan}, "--timeout nan"),
        ({"metrics_every_s": 0.05}, "--metrics-every 0.05: must be 0 (off)"),
        ({"miss_limit": 0}, "--miss-limit 0: must be at least 1"),
        ({"listen": "nowhere"}, "--listen 'nowhere': expected HOST:PORT"),
    ],
)
def test_each_setting_is_named_with_its_value(values: dict[str, float], needle: str) -> None:
    with pytest.raises(CanaryError) as caught:
        check_settings(**values)
    assert str(caught.value).startswith(needle), str(caught.value)
    assert "\n" not in str(caught.value)
