"""Every place a canary is set up reads its settings from the one declaration (`CanarySettings`): the options
of `deploykit canary` and `deploykit serve`, the systemd unit render writes, the chart's values and the
bounds of its values.schema.json; and every listen address goes through one parser, whoever gives it.

The chart's schema is a shipped file (Helm reads it as it is): `schema_drift` compares it with the
declaration, and is shown to catch a drift."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import typer

from deploykit.canary import settings as settings_module
from deploykit.canary.settings import (
    CANARY_FLAGS,
    DEFAULTS,
    HELM_KEYS,
    SERVE_FLAGS,
    SETTINGS,
    CanarySettings,
    Setting,
    canary_args,
    helm_values,
)
from deploykit.cli import app
from deploykit.cli.options import FiniteFloat, WholeNumber
from deploykit.render.common import template_root
from tests.cli_runner import CliRunner

SCHEMA = template_root() / "helm" / "chart" / "values.schema.json"


def options_of(command: str) -> dict[str, Any]:
    """A command's options by their flag, as Typer built them."""
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]  # a group
    return {flag: param for param in commands[command].params for flag in param.opts}


def bounds_of(param: Any) -> tuple[float, float]:
    parser = getattr(param.type, "func", None)
    assert isinstance(parser, FiniteFloat | WholeNumber), param
    return parser.low, parser.high


def test_the_mapping_is_one_table() -> None:
    """setting → `deploykit canary` flag → `deploykit serve` flag → Helm key (docs/serve.md)."""
    table = {name: (s.flag, s.serve_flag, s.helm_key) for name, s in SETTINGS.items()}
    assert table == {
        "every_s": ("--every", "--canary-every", "every"),
        "timeout_s": ("--timeout", None, None),
        "metrics_every_s": ("--metrics-every", None, None),
        "miss_limit": ("--miss-limit", None, "missLimit"),
        "listen": ("--listen", "--canary-listen", "port"),
    }
    assert list(SETTINGS) == [f.name for f in CanarySettings.__dataclass_fields__.values()]


@pytest.mark.parametrize("name", list(SETTINGS))
def test_deploykit_canary_s_options_are_the_declared_ones(name: str) -> None:
    setting = SETTINGS[name]
    option = options_of("canary")[CANARY_FLAGS[name]]
    assert option.default == setting.default == getattr(DEFAULTS, name)
    if setting.bounds is not None:
        low, high = bounds_of(option)
        assert high == setting.bounds.high
        assert low == (0.0 if setting.bounds.off else setting.bounds.low)


def test_deploykit_serve_s_options_are_the_declared_ones() -> None:
    options = options_of("serve")
    every = options[SERVE_FLAGS["every_s"]]
    assert every.default == DEFAULTS.every_s
    assert bounds_of(every) == (0.0, SETTINGS["every_s"].bounds.high)  # type: ignore[union-attr]  # 0: off
    assert options[SERVE_FLAGS["listen"]].default is None  # no listener unless asked
    assert set(SERVE_FLAGS) == {"every_s", "listen"}


def test_the_systemd_unit_passes_the_declared_flags() -> None:
    from deploykit.profile.load import load_profile
    from deploykit.render import systemd

    unit = systemd.canary_settings(load_profile("demo-cpu"))
    assert unit == DEFAULTS.replace(listen="127.0.0.1:9400")  # demo-cpu serves on 8000: 8000 + 1400
    assert canary_args(unit, *systemd.UNIT_SETTINGS) == ["--every", "60", "--listen", "127.0.0.1:9400"]


def test_the_chart_s_values_are_the_declared_defaults() -> None:
    from deploykit.render import helm

    values = helm.canary_values()
    assert {key: values[key] for key in HELM_KEYS.values()} == helm_values(DEFAULTS)
    assert helm_values(DEFAULTS) == {"every": 60, "missLimit": 5, "port": 9400}


def schema_drift(schema: dict[str, Any], declared: dict[str, Setting]) -> list[str]:
    """Where the chart's `canary` schema disagrees with the declaration: each Helm key required, a number
    typed as such, its minimum and maximum the setting's bounds (`port`: 1-65535, a fixed port a Service
    can name; the canary's own `:0`, a free port, is nothing a probe could find)."""
    canary = schema["properties"]["canary"]
    drift = []
    for name, key in HELM_KEYS.items():
        setting, spec = declared[name], canary["properties"].get(key, {})
        if key not in canary["required"]:
            drift.append(f"canary.{key} is not required")
        if setting.bounds is None:  # the listen address: the chart sets its port
            wanted: dict[str, Any] = {"type": "integer", "minimum": 1, "maximum": 65535}
        else:
            bounds = setting.bounds
            low = "exclusiveMinimum" if bounds.low_open else "minimum"
            wanted = {"type": "integer" if bounds.whole else "number", low: 0 if bounds.off else bounds.low}
            wanted["maximum"] = bounds.high
        for field, value in wanted.items():
            if spec.get(field) != value:
                drift.append(f"canary.{key}.{field} is {spec.get(field)!r}, the declaration says {value!r}")
        drift += [f"canary.{key}.{field} is not declared" for field in set(spec) - set(wanted)]
    return drift


def test_the_chart_s_schema_bounds_are_the_declared_ones() -> None:
    schema = json.loads(SCHEMA.read_text())
    assert schema_drift(schema, SETTINGS) == []


def test_the_schema_check_catches_a_drift_either_way() -> None:
    """A bound changed in the declaration, or in the chart, fails the check above."""
    schema = json.loads(SCHEMA.read_text())
    stale = copy.deepcopy(schema)
    stale["properties"]["canary"]["properties"]["every"] = {"type": "number", "exclusiveMinimum": 0}
    assert schema_drift(stale, SETTINGS) == [
        "canary.every.minimum is None, the declaration says 0.1",
        "canary.every.maximum is None, the declaration says 604800.0",
        "canary.every.exclusiveMinimum is not declared",
    ]
    every = SETTINGS["every_s"]
    raised = {
        **SETTINGS,
        "every_s": Setting(**{**vars(every), "bounds": every.bounds.__class__(1.0, 3600.0)}),
    }
    assert schema_drift(schema, raised) == [
        "canary.every.minimum is 0.1, the declaration says 1.0",
        "canary.every.maximum is 604800, the declaration says 3600.0",
    ]


# --- one listen parser ------------------------------------------------------------------------------


def test_canary_serve_and_render_parse_the_listen_address_with_the_one_parser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`deploykit canary --listen`, `deploykit serve --canary-listen` and render's unit: each value reaches
    `settings.parse_listen`, and a bad one is the same one line from canary and serve."""
    from deploykit.profile.load import load_profile
    from deploykit.render import systemd

    seen: list[tuple[str, str]] = []
    real = settings_module.parse_listen

    def spy(value: str, flag: str = "--listen") -> tuple[str, int]:
        seen.append((value, flag))
        return real(value, flag)

    monkeypatch.setattr(settings_module, "parse_listen", spy)
    runner = CliRunner()
    canary = runner.invoke(app, ["canary", "--url", "http://127.0.0.1:8000", "--listen", "nowhere"])
    serve = runner.invoke(app, ["serve", "-p", "demo-cpu", "--canary-listen", "nowhere"])
    systemd.canary_settings(load_profile("demo-cpu"))
    assert ("nowhere", "--listen") in seen and ("nowhere", "--canary-listen") in seen
    assert ("127.0.0.1:9400", "--listen") in seen  # the unit's
    expected = "expected HOST:PORT, e.g. 127.0.0.1:9400"
    assert (canary.exit_code, serve.exit_code) == (2, 2)
    assert canary.stderr == f"deploykit: --listen 'nowhere': {expected}\n"
    assert serve.stderr == f"deploykit: serve: --canary-listen 'nowhere': {expected}\n"
