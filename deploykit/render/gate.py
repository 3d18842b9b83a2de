"""What a progressive rollout needs to call `deploykit gate` (docs/deploy.md, The upgrade gate in a cluster
and on a host), shared by the chart and the units: the probe facts the gate is given (`--facts`, the facts
the set was rendered from, written as `deploykit probe --save` writes them), and how long a gate may take.

The chart's AnalysisTemplate and Job write the gate's command in their Helm templates (templates/_gate.tpl);
the systemd gate unit's is built in deploykit.render.systemd. Both are the command-line contract of
`deploykit gate`: `--profile`, `--url` (the candidate), `--baseline-url`, `--facts`, `--format json`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from deploykit.errors import RenderError

if TYPE_CHECKING:
    from deploykit.plan import Plan

# One gate run: the fingerprint and the load sample on both servers. The chart's Job adds the wait for the
# two servers' /health before it (gate.waitSeconds); the systemd unit's baseline is running already.
GATE_TIMEOUT_S = 1800
# How long the chart's gate pod waits for the candidate's and the baseline's /health before the gate runs:
# the profile's start-up window plus this (an image pull, scheduling).
WAIT_MARGIN_S = 600
# Where the chart keeps the facts (read by templates/configmap-gate.yaml with `.Files.Get`), beside the wheel.
FACTS_FILE = "probe-facts.json"
# The systemd gate unit reads the candidate's URL from this variable of its environment file.
CANDIDATE_VARIABLE = "DEPLOYKIT_GATE_CANDIDATE_URL"
# Where the gate writes its JSON report in the unit's state directory.
REPORT_FILE = "gate.json"
# The `helm test` pod's resources are for one client; the gate also runs a short concurrent load sample.
GATE_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
# A finished plain Job (and its pod's log, the JSON report) is kept this long, then Kubernetes removes it.
JOB_TTL_S = 86400

_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def facts_json(plan: Plan) -> str:
    """The facts the plan was made from, as `deploykit probe --save` writes them (the gate's `--facts`).
    `source` is left out: it is where this host read them from, and a loaded file says its own path."""
    return plan.facts.model_dump_json(indent=2, exclude={"source"}) + "\n"


def gate_values(startup_timeout_s: int) -> dict[str, object]:
    """The chart's `gate` values: both forms off, the URLs derived from the release (templates/_gate.tpl)."""
    wait = startup_timeout_s + WAIT_MARGIN_S
    return {
        "analysisTemplate": {"enabled": False},
        "job": {"enabled": False, "ttlSecondsAfterFinished": JOB_TTL_S},
        "candidateUrl": "",
        "baselineUrl": "",
        "load": True,
        "waitSeconds": wait,
        "activeDeadlineSeconds": wait + GATE_TIMEOUT_S,
        "store": {"secretName": "", "secretKey": "store-url"},
        "resources": {kind: dict(amounts) for kind, amounts in GATE_RESOURCES.items()},
    }


def unit_variable(name: str) -> str:
    """`${NAME}`: an ExecStart= word systemd replaces by the variable's whole value, always one argument."""
    if not _VARIABLE.match(name):
        raise RenderError(f"{name!r} is no environment variable name")
    return "${" + name + "}"
