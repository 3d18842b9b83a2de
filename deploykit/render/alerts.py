"""Prometheus alert rules for the deploykit canary, built once, as data.

One text serves both deployments: `render systemd` writes it beside the units (a rules file for a local
Prometheus) and `render helm` puts the same bytes in the chart, whose PrometheusRule embeds them (opt-in:
`metrics.prometheusRule.enabled`). Every label of an alert comes from the scraped series (namespace and pod
under Kubernetes, instance elsewhere); the rules add only `severity`. Numbers that the canary knows are read
from its own gauges (`deploykit_canary_every_seconds`, ...), so a canary run with other settings needs no
other rules; the one number rendered in is the restart cap, the canary's own default. The meaning of each
alert and what to do: docs/alerts.md. Standard library and PyYAML only: `deploykit render` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from deploykit.canary import defaults as canary_defaults

RULES_FILE = "deploykit-alerts.rules.yml"
"""The rules file's name, beside the units and under the chart's files/."""
GROUP = "deploykit-canary"
DOCS = "docs/alerts.md"

HOLD = "10m"
"""A corrupt or hung verdict keeps its alert firing this long after it clears: the verdict lasts only until
the restart it causes (about a minute), and a replica that turns corrupt again after each restart is one
alert, not a storm of fired-resolved pairs."""
RESTART_CAP = canary_defaults.MAX_RESTARTS_PER_HOUR
"""Restarts within `RESTART_WINDOW_S` after which the next corruption or hang restarts nothing (systemd stops
the server; the chart keeps the pod out of its Service): the cap of `on_corruption` and `pod_restarts`."""
RESTART_WINDOW_S = int(canary_defaults.RESTART_WINDOW_S)
STALE_GRACE_S = int(canary_defaults.RUN_GRACE_S)
"""Added to twice (interval + request deadline): a run may take its deadline and this before it counts as
stuck, and twice that without a new run is a canary that stopped judging."""
DOWN_MEMORY = "1d"
"""How far back a scrape target counts as a canary's (it exported canary series within this window)."""
STALE_FOR = "2m"
MISCONFIGURED_FOR = "10m"
SATURATED_FOR = "15m"

Severity = Literal["critical", "warning"]

WHERE = (
    "{{ if $labels.pod }}{{ $labels.namespace }}/{{ $labels.pod }}{{ else }}{{ $labels.instance }}{{ end }}"
)
"""The replica an alert is about, in its annotations: the pod under Kubernetes, else the scrape target."""


@dataclass(frozen=True)
class Alert:
    """One alerting rule, and the canary series it reads (a test holds them to what the canary exports)."""

    name: str
    expr: str
    duration: str
    severity: Severity
    summary: str
    description: str
    metrics: tuple[str, ...]

    def rule(self) -> dict[str, Any]:
        anchor = self.name.lower()
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.duration,
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": f"{self.description} Runbook: deploykit {DOCS}#{anchor}.",
                "runbook": f"{DOCS}#{anchor}",
            },
        }


def duration(seconds: int) -> str:
    """A PromQL duration, in the largest whole unit (3600 → `1h`)."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def alerts() -> tuple[Alert, ...]:
    """The canary's alerts, most urgent first."""
    window = duration(RESTART_WINDOW_S)
    stale = (
        "(\n"
        "  time() - (deploykit_canary_last_run_timestamp_seconds > 0)\n"
        "    > 2 * (deploykit_canary_every_seconds + deploykit_canary_request_timeout_seconds)"
        f" + {STALE_GRACE_S}\n"
        ")\n"
        f"or (up == 0 and last_over_time(deploykit_canary_healthy[{DOWN_MEMORY}]))"
    )
    return (
        Alert(
            name="DeploykitCanaryCorrupt",
            expr=f"max_over_time(deploykit_canary_corrupt[{HOLD}]) == 1",
            duration="0m",
            severity="critical",
            summary=f"{WHERE} served corrupt output ({{{{ $labels.cause }}}})",
            description=(
                f"The deploykit canary of {WHERE} judged its output corrupt within the last {HOLD} (cause "
                "{{ $labels.cause }}: probe = a wrong answer to a canary request, live_nan = vLLM counted "
                "NaN logits on user traffic). HTTP and /health look fine; the answers are wrong. The replica "
                "leaves its Service and vLLM is restarted (pod liveness, or the systemd canary unit), at "
                f"most {RESTART_CAP} times an hour. Read the canary's state:corrupt row or log line for the "
                "diagnosis, and check the GPU, the model and the fixes (the server's GET /deploykit/status, "
                "deploykit trace)."
            ),
            metrics=("deploykit_canary_corrupt",),
        ),
        Alert(
            name="DeploykitEngineHung",
            expr=f"max_over_time(deploykit_canary_hung[{HOLD}]) == 1",
            duration="0m",
            severity="critical",
            summary=f"{WHERE}: the vLLM engine is hung",
            description=(
                f"Within the last {HOLD} the canary of {WHERE} saw requests wait "
                f"{canary_defaults.HUNG_AFTER_S:g} s with vLLM's token counters standing still while "
                "/health answered 200: an engine step that never returns (a kernel, a collective). vLLM is "
                f"restarted, at most {RESTART_CAP} times an hour. Look for a stuck GPU (nvidia-smi, Xid "
                "errors in the kernel log) and for a collective waiting on a lost rank."
            ),
            metrics=("deploykit_canary_hung",),
        ),
        Alert(
            name="DeploykitRestartCapReached",
            expr=(
                f"increase(deploykit_canary_server_restarts_total[{window}]) >= {RESTART_CAP} or "
                f"changes(deploykit_canary_server_start_timestamp_seconds[{window}]) >= {RESTART_CAP}"
            ),
            duration="0m",
            severity="critical",
            summary=f"{WHERE}: vLLM restarted {RESTART_CAP} times within {window} (the restart cap)",
            description=(
                f"The server under the canary of {WHERE} came back from a restart {RESTART_CAP} times "
                f"within {window}. When they were restarts for corruption or a hung engine (the Corrupt "
                "or Hung alert fired), the cap is reached: the next such verdict restarts nothing, the "
                "chart keeps the pod out of its Service and systemd stops the server. A restart does not "
                "cure this replica: find the cause before starting it again (delete the pod, or "
                "systemctl start). Other restarts (a crash, an OOM kill) count here too: a replica that "
                "restarts this often needs a look either way. Counted twice over: the restarts one canary "
                "process saw, and the changes of the server's start time across canary processes (a "
                "systemd canary starts afresh with each server)."
            ),
            metrics=(
                "deploykit_canary_server_restarts_total",
                "deploykit_canary_server_start_timestamp_seconds",
            ),
        ),
        Alert(
            name="DeploykitCanaryVerdictStale",
            expr=stale,
            duration=STALE_FOR,
            severity="warning",
            summary=f"{WHERE}: the deploykit canary gives no fresh verdict",
            description=(
                f"Nothing judges the output of {WHERE}: "
                "{{ if eq $value 0.0 }}Prometheus cannot scrape the canary's /metrics (the canary is not "
                "running, or its port is closed){{ else }}the canary's last run ended "
                "{{ $value | humanizeDuration }} ago, more than twice its interval and request deadline"
                "{{ end }}. vLLM keeps serving, unguarded: corruption would go unseen. Look at the "
                "canary's container or unit (logs, restarts) and its /livez."
            ),
            metrics=(
                "deploykit_canary_last_run_timestamp_seconds",
                "deploykit_canary_every_seconds",
                "deploykit_canary_request_timeout_seconds",
                "deploykit_canary_healthy",
            ),
        ),
        Alert(
            name="DeploykitCanaryMisconfigured",
            expr="deploykit_canary_misconfigured == 1",
            duration=MISCONFIGURED_FOR,
            severity="warning",
            summary=f"{WHERE}: the deploykit canary cannot judge the server",
            description=(
                f"For {MISCONFIGURED_FOR} the canary of {WHERE} has been refused for a reason of its own "
                "(HTTP 400/401/403/404/413/422: a stale API key, a served name or adapter the server does "
                "not serve, a prompt over --max-model-len) or cannot be set up. vLLM is left alone; the "
                "output goes unjudged. The canary's MISCONFIGURED log line says what to fix."
            ),
            metrics=("deploykit_canary_misconfigured",),
        ),
        Alert(
            name="DeploykitReplicaSaturated",
            expr="deploykit_canary_saturated == 1",
            duration=SATURATED_FOR,
            severity="warning",
            summary=f"{WHERE} has been saturated for {SATURATED_FOR}",
            description=(
                f"For {SATURATED_FOR} the canary's requests to {WHERE} have timed out while vLLM's token "
                "counters kept advancing: a busy replica, not a broken one (it stays in its Service). "
                "Users wait as long as the canary does. Add replicas or capacity, or lower the load."
            ),
            metrics=("deploykit_canary_saturated",),
        ),
    )


def rule_groups() -> dict[str, Any]:
    """The rules as Prometheus reads them (a rules file, and a PrometheusRule's spec)."""
    return {"groups": [{"name": GROUP, "rules": [alert.rule() for alert in alerts()]}]}


def rules_yaml() -> str:
    """The rules file's text: the same bytes for the systemd set and the chart."""
    import yaml

    class Dumper(yaml.SafeDumper):
        """Multi-line expressions as literal blocks (they read like PromQL), long text folded (one line to
        Prometheus, several to a person)."""

    def represent(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else ">" if len(value) > 80 else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, represent)
    body = yaml.dump(rule_groups(), Dumper=Dumper, sort_keys=False, width=100, allow_unicode=False)
    header = (
        "# Prometheus alert rules for the deploykit canary (deploykit render; docs/alerts.md says what each\n"
        "# alert means and what to do). The same file serves systemd hosts and the chart's PrometheusRule.\n"
    )
    return header + body
