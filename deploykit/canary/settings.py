"""The canary's settings, declared once: `CanarySettings` holds each one's name, default and bounds, and how
it is spelt wherever a canary is set up: `deploykit canary`'s option, `deploykit serve`'s, the key under the
chart's `canary:` values. The CLI's options, serve's, the systemd canary unit and the chart's values derive
from it; the chart's values.schema.json is checked against it (docs/serve.md has the table).

Every command that runs a canary checks its settings here, not only through the CLI's option types: a canary
that sends its runs back to back (`every_s` 0.01 or NaN) is a load generator, one with a zero timeout only
ever misses, and a listen address that is not HOST:PORT is refused by the one parser (`parse_listen`).

Standard library only: the CLI builds its options from it at import time, and pydantic would add ~0.25 s to
every command, `probe --format json` included (docs/benchmarks.md).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from deploykit.errors import CanaryError

LONGEST_WAIT_S = 7 * 24 * 3600.0
"""The longest interval or timeout a canary takes: a week (longer is a typo; the CLI's `SECONDS_MAX`)."""

MIN_EVERY_S = 0.1
"""The shortest interval between runs (and between reads of vLLM's /metrics): a canary next to user traffic
must leave it room."""

MISS_LIMIT_MAX = 1_000_000


class SettingRefused(CanaryError, ValueError):
    """A number setting out of its bounds: its name, the value and why, worded for one command's option."""

    def __init__(self, name: str, value: object, reason: str, flag: str) -> None:
        self.name, self.value, self.reason = name, value, reason
        super().__init__(f"{flag} {value}: {reason}")

    def for_flags(self, flags: dict[str, str]) -> SettingRefused:
        """The same refusal, naming another command's option (`SERVE_FLAGS`)."""
        return SettingRefused(self.name, self.value, self.reason, flags.get(self.name, self.name))


class ListenAddressError(CanaryError, ValueError):
    """A listen address that is not HOST:PORT, or one that cannot be bound."""


@dataclass(frozen=True)
class Bounds:
    """What a number setting may be: [low, high] (`(low, high]` with `low_open`), 0 too with `off`."""

    low: float
    high: float
    low_open: bool = False
    off: bool = False
    whole: bool = False

    def holds(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        if self.whole and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        if self.off and value == 0:
            return True
        too_low = value <= self.low if self.low_open else value < self.low
        return not too_low and value <= self.high


@dataclass(frozen=True)
class Setting:
    """One setting: its Python name (the field), default, bounds, and its spellings outside Python."""

    name: str
    default: Any
    flag: str
    """`deploykit canary`'s option (the systemd unit and the chart pass it)."""
    serve_flag: str | None
    """`deploykit serve`'s option for its in-process canary; None: serve uses the default."""
    helm_key: str | None
    """The key under the chart's `canary:` values; None: the chart leaves the canary's default."""
    bounds: Bounds | None
    """None: the setting has its own check (`listen`: `parse_listen`)."""
    reason: str
    """Why a value is refused; `{low}` and `{high}` are the bounds."""
    optional: bool = False
    """None is a value too (`timeout_s`: the profile's smoke timeout, else the canary's own)."""

    def problem(self, value: object) -> str | None:
        if value is None and self.optional:
            return None
        if self.bounds is not None and not self.bounds.holds(value):
            return self.reason.format(low=self.bounds.low, high=self.bounds.high)
        return None


def _declare(
    default: Any,
    *,
    flag: str,
    reason: str,
    bounds: Bounds | None = None,
    serve_flag: str | None = None,
    helm_key: str | None = None,
    optional: bool = False,
) -> Any:
    spelling = {"flag": flag, "serve_flag": serve_flag, "helm_key": helm_key, "bounds": bounds}
    return field(default=default, metadata={"setting": {**spelling, "reason": reason, "optional": optional}})


@dataclass(frozen=True)
class CanarySettings:
    """How often the canary runs, how long it waits, how often it reads vLLM's NaN counter, how many misses
    it allows, where it answers `/healthz`: the one place these are declared, defaulted and bounded. Made
    only with values that hold (`check_settings` words a refusal for another command's options)."""

    every_s: float = _declare(
        60.0,
        flag="--every",
        serve_flag="--canary-every",
        helm_key="every",
        bounds=Bounds(MIN_EVERY_S, LONGEST_WAIT_S),
        reason="must be a number of seconds of at least {low:g} between runs (at most {high:g})",
    )
    """Seconds between runs, start to start."""
    timeout_s: float | None = _declare(
        None,
        flag="--timeout",
        bounds=Bounds(0.0, LONGEST_WAIT_S, low_open=True),
        reason="must be a positive number of seconds per request (at most {high:g})",
        optional=True,
    )
    """Seconds per request; None: the profile's smoke timeout, else `defaults.REQUEST_TIMEOUT_S`."""
    metrics_every_s: float = _declare(
        2.0,
        flag="--metrics-every",
        bounds=Bounds(MIN_EVERY_S, LONGEST_WAIT_S, off=True),
        reason="must be 0 (off) or a number of seconds of at least {low:g} between reads of the server's "
        "/metrics (at most {high:g})",
    )
    """Seconds between reads of vLLM's own /metrics for its NaN counter, independent of `every_s`: a user
    request with NaN logits is seen within seconds, not at the next run. 0 turns the reading off."""
    miss_limit: int = _declare(
        5,
        flag="--miss-limit",
        helm_key="missLimit",
        bounds=Bounds(1, MISS_LIMIT_MAX, whole=True),
        reason="must be at least {low:g} (a whole number of runs, at most {high:g})",
    )
    """Runs in a row without an answer before the canary says `unreachable` (busy is not broken)."""
    listen: str = _declare(
        "127.0.0.1:9400",
        flag="--listen",
        serve_flag="--canary-listen",
        helm_key="port",
        reason="expected HOST:PORT",
    )
    """HOST:PORT of `/healthz`, `/livez` and `/metrics` (loopback; port 0 picks a free one). The chart's
    `canary.port` is its port, on every address of the pod."""

    def __post_init__(self) -> None:
        parse_listen(self.listen)
        for setting in SETTINGS.values():
            value = getattr(self, setting.name)
            reason = setting.problem(value)
            if reason is not None:
                raise SettingRefused(setting.name, value, reason, setting.flag)

    @property
    def listen_address(self) -> tuple[str, int]:
        """(host, port) of `listen` (`:9400` is every address)."""
        return parse_listen(self.listen)

    def replace(self, **changes: Any) -> CanarySettings:
        """A copy with `changes`, checked like any."""
        return dataclasses.replace(self, **changes)


def _settings() -> dict[str, Setting]:
    return {
        item.name: Setting(name=item.name, default=item.default, **item.metadata["setting"])
        for item in dataclasses.fields(CanarySettings)
    }


def parse_listen(value: str, flag: str = "--listen") -> tuple[str, int]:
    """HOST:PORT (`[::1]:9400`, `:9400` for every address; port 0 picks a free one): the one parser of the
    canary's listen address, whoever gives it (`deploykit canary --listen`, `deploykit serve
    --canary-listen`, render's units and chart, through `CanarySettings`)."""
    host, sep, port = str(value).rpartition(":")
    if not isinstance(value, str) or not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        example = SETTINGS["listen"].default
        raise ListenAddressError(f"{flag} {value!r}: {SETTINGS['listen'].reason}, e.g. {example}")
    return host.strip("[]") or "0.0.0.0", int(port)


def shown(value: object) -> str:
    """A setting's value as an option takes it: whole numbers without `.0` (`60`, not `60.0`)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


SETTINGS: dict[str, Setting] = _settings()
"""Every setting by its name, in declaration order."""

DEFAULTS = CanarySettings()
"""The settings a canary runs with when nothing says otherwise."""

CANARY_FLAGS = {setting.name: setting.flag for setting in SETTINGS.values()}
"""`deploykit canary`'s option for each setting."""

SERVE_FLAGS = {setting.name: setting.serve_flag for setting in SETTINGS.values() if setting.serve_flag}
"""`deploykit serve`'s option for each setting it takes (the rest are the defaults)."""

HELM_KEYS = {setting.name: setting.helm_key for setting in SETTINGS.values() if setting.helm_key}
"""The chart's key under `canary:` for each setting it sets (the rest are the defaults)."""


def check_settings(flags: dict[str, str] | None = None, **values: Any) -> CanarySettings:
    """`CanarySettings(**values)`, or one CanaryError naming the option (`flags`: setting → option, by
    default `deploykit canary`'s) and the value given."""
    names = flags or CANARY_FLAGS
    try:
        return CanarySettings(**values)
    except SettingRefused as exc:
        raise exc.for_flags(names) from None
    except ListenAddressError:
        parse_listen(values["listen"], names.get("listen", "listen"))  # the same refusal, its option named
        raise


def canary_args(settings: CanarySettings, *names: str) -> list[str]:
    """`deploykit canary`'s options for the settings `names`, as the units write them."""
    args: list[str] = []
    for name in names:
        args += [SETTINGS[name].flag, shown(getattr(settings, name))]
    return args


def helm_values(settings: CanarySettings) -> dict[str, Any]:
    """The chart's `canary:` values of the settings it sets (`port`: the listen address's port)."""
    values: dict[str, Any] = {}
    for name, key in HELM_KEYS.items():
        value = settings.listen_address[1] if name == "listen" else getattr(settings, name)
        values[key] = int(value) if isinstance(value, float) and value.is_integer() else value
    return values
