"""A Grafana dashboard for the deploykit canary, built as data: the chart ships it in a ConfigMap that
Grafana's dashboard sidecar loads (opt-in: `metrics.grafanaDashboard.enabled`), and `render systemd` writes
the same JSON beside the units for a person to import. Every panel reads only the canary's own series, so
it works wherever Prometheus scrapes a canary; `$namespace` narrows it under Kubernetes (elsewhere it stays
"All", which also matches series without a namespace). Standard library only: `deploykit render` stays
fast."""

from __future__ import annotations

import json
from typing import Any

from deploykit.canary import defaults as canary_defaults
from deploykit.render import alerts

DASHBOARD_FILE = "deploykit-dashboard.json"
UID = "deploykit-canary"
BY = "namespace, pod, instance"
REPLICA = "{{namespace}}/{{pod}} {{instance}}"
"""A series' legend: the pod under Kubernetes, the scrape target everywhere."""

# The verdict as one number per replica, for a state timeline: worse verdicts get higher codes.
VERDICTS: tuple[tuple[str, str], ...] = (
    ("healthy", "green"),
    ("saturated", "yellow"),
    ("starting", "blue"),
    ("misconfigured", "orange"),
    ("unreachable", "orange"),
    ("unknown", "purple"),
    ("hung", "red"),
    ("corrupt", "dark-red"),
)
WIDTH, HEIGHT = 12, 8


def _series(metric: str, **matchers: str) -> str:
    """`metric{namespace=~"$namespace", key="value"...}`."""
    pairs = ['namespace=~"$namespace"', *(f'{key}="{value}"' for key, value in matchers.items())]
    return f"{metric}{{{', '.join(pairs)}}}"


def verdict_expr() -> str:
    """One series per replica whose value is its verdict's code (1 = healthy ... 8 = corrupt)."""
    parts = [f"{code} * {_series('deploykit_canary_status', status=name)}" for code, (name, _) in _coded()]
    return f"max by ({BY}) (\n  " + "\n  or ".join(parts) + "\n)"


def _coded() -> list[tuple[int, tuple[str, str]]]:
    return list(enumerate(VERDICTS, start=1))


def _target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "expr": expr,
        "legendFormat": legend,
        "refId": ref,
    }


def _panel(
    number: int, title: str, description: str, kind: str, targets: list[tuple[str, str]], **field: Any
) -> dict[str, Any]:
    row, column = divmod(number - 1, 24 // WIDTH)
    return {
        "id": number,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": HEIGHT, "w": WIDTH, "x": column * WIDTH, "y": row * HEIGHT},
        "targets": [_target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(targets)],
        "fieldConfig": {"defaults": field, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
    }


def _threshold(value: float) -> dict[str, Any]:
    """A red line (and area) from `value` up: the bound an alert or a verdict uses."""
    return {
        "thresholds": {
            "mode": "absolute",
            "steps": [{"color": "green", "value": None}, {"color": "red", "value": value}],
        },
        "custom": {"thresholdsStyle": {"mode": "line+area"}},
    }


def panels() -> list[dict[str, Any]]:
    """The panels, two a row, in the order an on-call reads them."""
    mappings = [
        {"type": "value", "options": {str(code): {"text": name, "color": color, "index": code - 1}}}
        for code, (name, color) in _coded()
    ]
    window = alerts.duration(alerts.RESTART_WINDOW_S)
    rate = "$__rate_interval"
    since_run = f"time() - ({_series('deploykit_canary_last_run_timestamp_seconds')} > 0)"
    stale_after = (
        f"2 * ({_series('deploykit_canary_every_seconds')} + "
        f"{_series('deploykit_canary_request_timeout_seconds')}) + {alerts.STALE_GRACE_S}"
    )
    return [
        _panel(
            1,
            "Verdict by replica",
            "The canary's verdict (deploykit_canary_status): healthy, saturated (busy, still serving), "
            "starting, misconfigured (the canary cannot judge), unreachable, unknown (the canary ended), "
            "hung, corrupt.",
            "state-timeline",
            [(verdict_expr(), REPLICA)],
            mappings=mappings,
            color={"mode": "thresholds"},
        ),
        _panel(
            2,
            "Canary runs and failures per minute",
            "Runs by replica, and failed runs by reason (wrong: corrupt output; miss: no answer in time; "
            "misconfigured: a request the server refused).",
            "timeseries",
            [
                (
                    f"60 * sum by ({BY}) (rate({_series('deploykit_canary_runs_total')}[{rate}]))",
                    f"runs {REPLICA}",
                ),
                (
                    f"60 * sum by ({BY}, reason) "
                    f"(rate({_series('deploykit_canary_failures_total')}[{rate}]))",
                    f"failures {{{{reason}}}} {REPLICA}",
                ),
            ],
            unit="short",
        ),
        _panel(
            3,
            "vLLM tokens per second (the canary's progress reading)",
            "How fast vLLM's own token counters (prompt + generated) advance, as the canary reads them: "
            "flat while requests wait is a hung engine.",
            "timeseries",
            [(f"rate({_series('deploykit_canary_progress_tokens')}[{rate}])", REPLICA)],
            unit="short",
        ),
        _panel(
            4,
            "Seconds since vLLM's token counters advanced",
            f"The canary calls the engine hung once requests have waited {canary_defaults.HUNG_AFTER_S:g} s "
            "with no token produced (the red line); an idle engine climbs here too and is not hung.",
            "timeseries",
            [(f"time() - {_series('deploykit_canary_progress_advanced_timestamp_seconds')}", REPLICA)],
            unit="s",
            **_threshold(canary_defaults.HUNG_AFTER_S),
        ),
        _panel(
            5,
            "Saturated",
            f"1 while the replica answers late but keeps producing tokens: busy, not broken; it stays in "
            f"its Service. DeploykitReplicaSaturated fires after {alerts.SATURATED_FOR}.",
            "timeseries",
            [(_series("deploykit_canary_saturated"), REPLICA)],
            min=0,
            max=1,
        ),
        _panel(
            6,
            f"Server restarts for corruption or a hang (last {window})",
            f"Restarts of vLLM under the canary within {window}; at {alerts.RESTART_CAP} (the red line) the "
            "next corruption or hang restarts nothing (DeploykitRestartCapReached).",
            "timeseries",
            [(f"increase({_series('deploykit_canary_server_restarts_total')}[{window}])", REPLICA)],
            min=0,
            **_threshold(alerts.RESTART_CAP),
        ),
        _panel(
            7,
            f"Live traffic with NaN logits (last {window}) and corruption by cause",
            "User requests vLLM counted with NaN logits while the canary watched, and the corrupt verdict "
            "by cause (probe: a canary answer; live_nan: user traffic).",
            "timeseries",
            [
                (
                    f"increase({_series('deploykit_canary_live_nan_requests_total')}[{window}])",
                    f"NaN requests {REPLICA}",
                ),
                (_series("deploykit_canary_corrupt"), f"corrupt {{{{cause}}}} {REPLICA}"),
            ],
            min=0,
        ),
        _panel(
            8,
            "Seconds since the canary's last run",
            "Climbs between runs; past the stale bound (twice the interval and request deadline, plus "
            f"{alerts.STALE_GRACE_S} s) DeploykitCanaryVerdictStale fires.",
            "timeseries",
            [(since_run, f"since last run {REPLICA}"), (stale_after, f"stale bound {REPLICA}")],
            unit="s",
        ),
    ]


def dashboard() -> dict[str, Any]:
    """The dashboard as Grafana imports it (a `datasource` variable, so any Prometheus can back it)."""
    return {
        "uid": UID,
        "title": "deploykit canary",
        "description": "Is the served output right? The deploykit canary's verdicts, runs and restarts "
        "(deploykit docs/alerts.md).",
        "tags": ["deploykit", "vllm"],
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "timezone": "",
        "templating": {
            "list": [
                {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
                {
                    "name": "namespace",
                    "label": "Namespace",
                    "type": "query",
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": {"query": "label_values(deploykit_canary_healthy, namespace)", "refId": "N"},
                    "definition": "label_values(deploykit_canary_healthy, namespace)",
                    "refresh": 2,
                    "includeAll": True,
                    "multi": True,
                    "allValue": ".*",
                    "current": {"text": "All", "value": "$__all"},
                },
            ]
        },
        "annotations": {"list": []},
        "panels": panels(),
    }


def dashboard_json() -> str:
    """The file's text: the same bytes for the systemd set and the chart."""
    return json.dumps(dashboard(), indent=1, ensure_ascii=True) + "\n"
