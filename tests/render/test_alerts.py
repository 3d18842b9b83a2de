"""The canary's alert rules and dashboard (deploykit.render.alerts, .dashboard), checked with what an operator
runs: Prometheus's own `promtool check rules` on the systemd rules file and on the chart's PrometheusRule,
and `promtool test rules` over series that make every alert fire when it should and stay silent when it
should not (a saturated replica for 10 minutes, a canary still starting, a target that is not a canary...).
The chart renders the PrometheusRule and the dashboard ConfigMap only when asked, through the real helm.

promtool comes with Debian's `prometheus` package (tools/ci-services.sh installs it); without it these tests
fail, saying how to install it: a skipped check would pass CI without checking anything."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from deploykit.render import alerts, dashboard
from tests.profile_variants import profile_variant
from tests.render.conftest import deploykit
from tests.render.test_helm import KUBERNETES_VERSIONS, lint, render_chart, run_helm, template
from tests.unit_prefix import ABSENT_PREFIX

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts" / "no-gpu.json"
INSTALL_HINT = (
    "install Debian's prometheus package (`apt-get install -y prometheus`; tools/ci-services.sh does)"
)
# Where the chart's copy lies, and where the PrometheusRule and the ConfigMap read it (`.Files.Get`).
CHART_RULES = f"files/{alerts.RULES_FILE}"
CHART_DASHBOARD = f"files/{dashboard.DASHBOARD_FILE}"
# A chart of the demo profile, listening beyond loopback with its model staged (tests/render/test_helm.py).
CHART_CHANGES = {
    "serve.host": "0.0.0.0",
    "serve.allow_unauthenticated": True,
    "model.source": "/models/tiny-llama",
    "model.volumes": [{"kind": "host_path", "path": "/srv/models", "mount_path": "/models"}],
}
# What the canary exports (deploykit/canary/metrics.py), as the issue names them.
EXPORTED = {
    "deploykit_canary_healthy",
    "deploykit_canary_last_run_timestamp_seconds",
    "deploykit_canary_last_pass_timestamp_seconds",
    "deploykit_canary_runs_total",
    "deploykit_canary_failures_total",
    "deploykit_canary_consecutive_misses",
    "deploykit_canary_corrupt",
    "deploykit_canary_hung",
    "deploykit_canary_misconfigured",
    "deploykit_canary_live_nan_requests_total",
    "deploykit_canary_vllm_metrics_last_read_timestamp_seconds",
    "deploykit_canary_status",
    "deploykit_canary_saturated",
    "deploykit_canary_every_seconds",
    "deploykit_canary_request_timeout_seconds",
    "deploykit_canary_server_restarts_total",
    "deploykit_canary_progress_tokens",
    "deploykit_canary_progress_advanced_timestamp_seconds",
    "deploykit_canary_server_start_timestamp_seconds",
}
METRIC_NAME = re.compile(r"\bdeploykit_canary_[a-z_]+\b")


def find_promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail(f"promtool is not on PATH: {INSTALL_HINT}", pytrace=False)
    return found


def test_promtool_is_found_or_the_test_fails_saying_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(pytest.fail.Exception, match=r"apt-get install -y prometheus"):
        find_promtool()


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([find_promtool(), *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def check_rules(path: Path) -> str:
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


# --- the rendered files --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def systemd_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`render systemd` of the demo profile and of a second profile into one --out: both sets hold the rules
    file and the dashboard (of no one profile's set, so the second render may write them too)."""
    directory = tmp_path_factory.mktemp("systemd")
    out = directory / "out"
    second = profile_variant(directory, "demo-cpu", {"name": "demo-two", "serve.port": 8001})
    for profile in ("demo-cpu", str(second)):
        args = ["render", "systemd", "--profile", profile, "--facts", str(FACTS), "--prefix", ABSENT_PREFIX]
        deploykit(*args, "--out", str(out))
    return out


@pytest.fixture(scope="module")
def chart_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("chart")
    return render_chart(profile_variant(directory, "demo-cpu", CHART_CHANGES), FACTS, directory / "out").root


ENABLED = (
    "--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.prometheusRule.labels.release=kps",
    "--set", "metrics.grafanaDashboard.enabled=true",
    "--set", "metrics.grafanaDashboard.annotations.grafana_folder=LLM",
)  # fmt: skip


@pytest.mark.external_tool  # promtool or helm
def test_the_systemd_set_and_the_chart_carry_one_rules_file_and_one_dashboard(
    systemd_out: Path, chart_root: Path
) -> None:
    rules = (systemd_out / alerts.RULES_FILE).read_text()
    assert rules == alerts.rules_yaml() == (chart_root / CHART_RULES).read_text()
    assert yaml.safe_load(rules) == alerts.rule_groups()
    board = (systemd_out / dashboard.DASHBOARD_FILE).read_text()
    assert board == (chart_root / CHART_DASHBOARD).read_text()
    assert json.loads(board) == dashboard.dashboard()


@pytest.mark.external_tool  # promtool or helm
def test_promtool_accepts_the_systemd_rules_file(systemd_out: Path) -> None:
    output = check_rules(systemd_out / alerts.RULES_FILE)
    assert f"SUCCESS: {len(alerts.alerts())} rules found" in output, output


@pytest.mark.external_tool  # promtool or helm
def test_promtool_refuses_a_broken_rule(tmp_path: Path) -> None:
    """`check rules` is a real check: the same file with one expression broken is refused."""
    broken = alerts.rules_yaml().replace("deploykit_canary_hung[10m]) == 1", "deploykit_canary_hung[10m]) ==")
    assert broken != alerts.rules_yaml()
    (tmp_path / "broken.yml").write_text(broken)
    result = promtool("check", "rules", str(tmp_path / "broken.yml"))
    assert result.returncode != 0 and "DeploykitEngineHung" in result.stdout + result.stderr


@pytest.mark.external_tool  # promtool or helm
def test_the_chart_renders_the_rule_and_the_dashboard_only_when_enabled(
    chart_root: Path, tmp_path: Path
) -> None:
    plain = {doc["kind"] for doc in template(chart_root)}
    assert "PrometheusRule" not in plain
    assert not [
        d for d in template(chart_root) if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]
    ]
    docs = template(chart_root, *ENABLED)
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    (board,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "demo-deploykit-dashboard"
    ]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["metadata"]["labels"]["app.kubernetes.io/instance"] == "demo"
    assert rule["spec"] == alerts.rule_groups()
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    assert json.loads(board["data"]["deploykit-canary.json"]) == dashboard.dashboard()
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(board, version, strict=True)
    # Each alone.
    only_rule = template(chart_root, "--set", "metrics.prometheusRule.enabled=true")
    assert "PrometheusRule" in {d["kind"] for d in only_rule}
    assert "demo-deploykit-dashboard" not in {d["metadata"]["name"] for d in only_rule}
    only_board = template(chart_root, "--set", "metrics.grafanaDashboard.enabled=true")
    assert "PrometheusRule" not in {d["kind"] for d in only_board}
    # The PrometheusRule's spec is a rules file promtool accepts.
    (tmp_path / "from-chart.yml").write_text(yaml.safe_dump(rule["spec"]))
    check_rules(tmp_path / "from-chart.yml")


@pytest.mark.external_tool  # promtool or helm
def test_the_chart_with_both_enabled_lints_clean_and_the_schema_refuses_unknown_keys(
    chart_root: Path,
) -> None:
    result = run_helm("lint", "--strict", str(chart_root), *ENABLED)
    assert result.returncode == 0 and "[ERROR]" not in result.stdout, result.stdout + result.stderr
    assert lint(chart_root).returncode == 0
    typo = run_helm("template", "demo", str(chart_root), "--set", "metrics.prometheusRule.enable=true")
    assert typo.returncode != 0 and "enable" in typo.stderr
    number = run_helm("template", "demo", str(chart_root), "--set", "metrics.grafanaDashboard.labels.x=1")
    assert number.returncode != 0 and "/metrics/grafanaDashboard/labels/x" in number.stderr
    # The sidecar's label is a value: another sidecar's value replaces it.
    other = ("--set", "metrics.grafanaDashboard.labels.grafana_dashboard=dashboards")
    docs = template(chart_root, "--set", "metrics.grafanaDashboard.enabled=true", *other)
    (board,) = [d for d in docs if d["metadata"]["name"] == "demo-deploykit-dashboard"]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "dashboards"


@pytest.mark.external_tool  # promtool or helm
def test_a_chart_without_its_rules_file_refuses_to_render_the_rule(chart_root: Path, tmp_path: Path) -> None:
    copy = tmp_path / "chart"
    shutil.copytree(chart_root, copy)
    (copy / CHART_RULES).unlink()
    assert run_helm("template", "demo", str(copy)).returncode == 0  # off: not needed
    refused = run_helm("template", "demo", str(copy), "--set", "metrics.prometheusRule.enabled=true")
    assert refused.returncode != 0 and "deploykit-alerts.rules.yml is missing" in refused.stderr


# --- the rules as data ---------------------------------------------------------------------------------


def test_rules_read_only_exported_series_and_add_no_label_but_severity() -> None:
    for alert in alerts.alerts():
        rule = alert.rule()
        assert set(rule["labels"]) == {"severity"}, alert.name
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert set(METRIC_NAME.findall(alert.expr)) == set(alert.metrics), alert.name
        assert set(alert.metrics) <= EXPORTED, alert.name
        # No matcher names a namespace, pod, job or instance: those come from the series.
        assert not re.search(r"\b(namespace|pod|job|instance)\s*=", alert.expr), alert.name
        assert alerts.DOCS in rule["annotations"]["description"]
    assert len({alert.name for alert in alerts.alerts()}) == len(alerts.alerts())


def test_the_names_read_are_the_canarys_own() -> None:
    """What the rules and the dashboard read, and the issue's list, are in the canary's registry
    (deploykit/canary/metrics.py; prometheus_client's counters gain `_total`): a renamed series fails here,
    not silently in Prometheus."""
    from deploykit.canary.metrics import CanaryMetrics

    metrics = CanaryMetrics()
    metrics.note_server_start(1.7e9)  # registered at the first reading of the server's page
    exported = {
        family.name + ("_total" if family.type == "counter" else "") for family in metrics.registry.collect()
    }
    read = {name for alert in alerts.alerts() for name in alert.metrics}
    read |= {name for expr in dashboard_exprs() for name in METRIC_NAME.findall(expr)}
    assert read <= EXPORTED
    assert exported >= EXPORTED, sorted(EXPORTED - exported)


def test_the_restart_cap_is_the_canarys_and_the_pods() -> None:
    from deploykit.canary import defaults
    from deploykit.render import pod_restarts

    assert alerts.RESTART_CAP == defaults.MAX_RESTARTS_PER_HOUR == pod_restarts.MAX_RESTARTS
    (cap,) = [a for a in alerts.alerts() if a.name == "DeploykitRestartCapReached"]
    cap_value = defaults.MAX_RESTARTS_PER_HOUR
    assert cap.expr == (
        f"increase(deploykit_canary_server_restarts_total[1h]) >= {cap_value} or "
        f"changes(deploykit_canary_server_start_timestamp_seconds[1h]) >= {cap_value}"
    )


# --- promtool test rules ---------------------------------------------------------------------------------

POD = {"namespace": "llm", "pod": "qwen-5d8f7-x2kq9", "instance": "10.0.0.7:9400", "job": "llm/qwen"}
OTHER_POD = {**POD, "pod": "qwen-5d8f7-b7vlm", "instance": "10.0.0.8:9400"}
HOST = {"instance": "127.0.0.1:9400", "job": "deploykit-canary"}


def series(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
    matchers = ", ".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{metric}{{{matchers}}}", "values": values}


def annotations(name: str, where: str, **fill: str) -> dict[str, str]:
    """The annotations Prometheus should write for `name` about replica `where`: the rule's own text with
    its templates filled in as the test expects them (the summaries are checked word for word below)."""
    (alert,) = [a for a in alerts.alerts() if a.name == name]
    rule = alert.rule()["annotations"]
    filled = {}
    for key, text in rule.items():
        text = text.replace(alerts.WHERE, where)
        for label, value in fill.items():
            text = text.replace(f"{{{{ $labels.{label} }}}}", value)
        if "branch" in fill:
            text = re.sub(
                r"\{\{ if eq \$value 0\.0 \}\}(.*?)\{\{ else \}\}(.*?)\{\{ end \}\}", fill["branch"], text
            )
        filled[key] = text
    return filled


def firing(name: str, labels: dict[str, str], where: str, severity: str, **fill: str) -> dict[str, Any]:
    return {
        "exp_labels": {**labels, "severity": severity},
        "exp_annotations": annotations(name, where, **fill),
    }


def unit_tests() -> list[dict[str, Any]]:
    """Series at one sample a minute, and what each alert says at chosen minutes (promtool lists firing
    alerts only: a pending one is silent)."""
    k8s = f"{POD['namespace']}/{POD['pod']}"
    host = HOST["instance"]
    stale_left = "the canary's last run ended 9m 0s ago, more than twice its interval and request deadline"
    stale_down = (
        "Prometheus cannot scrape the canary's /metrics (the canary is not running, or its port is closed)"
    )
    corrupt = firing("DeploykitCanaryCorrupt", {**POD, "cause": "probe"}, k8s, "critical", cause="probe")
    hung = firing("DeploykitEngineHung", HOST, host, "critical")
    cap = firing("DeploykitRestartCapReached", POD, k8s, "critical")
    cap_host = firing("DeploykitRestartCapReached", HOST, host, "critical")
    stale = firing("DeploykitCanaryVerdictStale", POD, k8s, "warning", branch=stale_left)
    down = firing("DeploykitCanaryVerdictStale", HOST, host, "warning", branch=stale_down)
    misconfigured = firing("DeploykitCanaryMisconfigured", POD, k8s, "warning")
    saturated = firing("DeploykitReplicaSaturated", OTHER_POD, f"llm/{OTHER_POD['pod']}", "warning")

    def at(minute: int, name: str, *expected: dict[str, Any]) -> dict[str, Any]:
        return {"eval_time": f"{minute}m", "alertname": name, "exp_alerts": list(expected)}

    return [
        {
            "name": "corrupt fires at once, holds 10m after the last corrupt sample, a flap is one alert",
            "interval": "1m",
            "input_series": [
                series("deploykit_canary_corrupt", {**POD, "cause": "probe"}, "0 0 1 0 0 0 1 0x20"),
                series("deploykit_canary_corrupt", {**POD, "cause": "live_nan"}, "0x27"),
                series("deploykit_canary_corrupt", {**OTHER_POD, "cause": "probe"}, "0x27"),
            ],
            "alert_rule_test": [
                at(1, "DeploykitCanaryCorrupt"),
                at(2, "DeploykitCanaryCorrupt", corrupt),
                at(4, "DeploykitCanaryCorrupt", corrupt),  # healthy again after the restart: still firing
                at(7, "DeploykitCanaryCorrupt", corrupt),
                at(16, "DeploykitCanaryCorrupt", corrupt),
                at(17, "DeploykitCanaryCorrupt"),
            ],
        },
        {
            "name": "hung on a systemd host: the target's own labels",
            "interval": "1m",
            "input_series": [series("deploykit_canary_hung", HOST, "0 0 1 1 0x15")],
            "alert_rule_test": [
                at(1, "DeploykitEngineHung"),
                at(2, "DeploykitEngineHung", hung),
                at(13, "DeploykitEngineHung", hung),
                at(14, "DeploykitEngineHung"),
            ],
        },
        {
            "name": "the restart cap: the third restart within the hour fires, the second does not",
            "interval": "1m",
            "input_series": [
                series("deploykit_canary_server_restarts_total", POD, "0 0 1 1 1 2 2 2 2 3+0x70"),
                series("deploykit_canary_server_restarts_total", OTHER_POD, "0 1 1 2+0x70"),
            ],
            "alert_rule_test": [
                at(8, "DeploykitRestartCapReached"),
                at(9, "DeploykitRestartCapReached", cap),
                at(60, "DeploykitRestartCapReached", cap),
                at(75, "DeploykitRestartCapReached"),  # the restarts left the window
            ],
        },
        {
            "name": "the restart cap on a systemd host: each restart starts a new canary (gaps), the start "
            "time changes",
            "interval": "1m",
            "input_series": [
                # Server and canary started at 100, 400, 700, 1000 s: the canary's series has a gap each time.
                series(
                    "deploykit_canary_server_start_timestamp_seconds", HOST, "100x3 _ 400x3 _ 700x3 _ 1000x70"
                ),
            ],
            "alert_rule_test": [
                at(13, "DeploykitRestartCapReached"),  # two restarts so far
                at(16, "DeploykitRestartCapReached", cap_host),
                at(70, "DeploykitRestartCapReached"),  # they left the window
            ],
        },
        {
            "name": "stale: runs stopped, or the target is down; a starting canary, a vLLM target: silent",
            "interval": "1m",
            "input_series": [
                # Runs every minute until minute 10, then none: the bound is 2 * (60 + 120) + 30 s = 6.5 min.
                series("deploykit_canary_last_run_timestamp_seconds", POD, "0+60x10 600+0x20"),
                series("deploykit_canary_every_seconds", POD, "60+0x30"),
                series("deploykit_canary_request_timeout_seconds", POD, "120+0x30"),
                # Starting: no run has ended yet (0), which is no stale verdict.
                series("deploykit_canary_last_run_timestamp_seconds", OTHER_POD, "0+0x30"),
                series("deploykit_canary_every_seconds", OTHER_POD, "60+0x30"),
                series("deploykit_canary_request_timeout_seconds", OTHER_POD, "120+0x30"),
                # A canary on a host whose target goes down at minute 11, and a vLLM target that is down
                # throughout (no canary series: not the canary's alert).
                series("up", HOST, "1x10 0x10"),
                series("deploykit_canary_healthy", HOST, "1x10 _x10"),
                series("up", {"instance": "127.0.0.1:8000", "job": "vllm"}, "0x20"),
            ],
            "alert_rule_test": [
                at(12, "DeploykitCanaryVerdictStale"),  # down since 11: pending
                at(13, "DeploykitCanaryVerdictStale", down),
                at(16, "DeploykitCanaryVerdictStale", down),  # 960 - 600 = 360 s: not stale yet
                at(18, "DeploykitCanaryVerdictStale", down),  # stale since 17: pending
                at(19, "DeploykitCanaryVerdictStale", stale, down),
            ],
        },
        {
            "name": "misconfigured for 10m fires; for 5m it does not",
            "interval": "1m",
            "input_series": [
                series("deploykit_canary_misconfigured", POD, "0 0 1x15 0x5"),
                series("deploykit_canary_misconfigured", OTHER_POD, "0 1x5 0x15"),
            ],
            "alert_rule_test": [
                at(11, "DeploykitCanaryMisconfigured"),
                at(12, "DeploykitCanaryMisconfigured", misconfigured),
                at(17, "DeploykitCanaryMisconfigured", misconfigured),
                at(18, "DeploykitCanaryMisconfigured"),
            ],
        },
        {
            "name": "saturated for 10m does not fire; for 16m it does",
            "interval": "1m",
            "input_series": [
                series("deploykit_canary_saturated", POD, "1x10 0x10"),
                series("deploykit_canary_saturated", OTHER_POD, "1x20"),
            ],
            "alert_rule_test": [
                at(10, "DeploykitReplicaSaturated"),
                at(12, "DeploykitReplicaSaturated"),
                at(14, "DeploykitReplicaSaturated"),
                at(16, "DeploykitReplicaSaturated", saturated),
            ],
        },
    ]


@pytest.mark.external_tool  # promtool or helm
def test_promtool_unit_tests_cover_every_alert(tmp_path: Path) -> None:
    (tmp_path / alerts.RULES_FILE).write_text(alerts.rules_yaml())
    tests = unit_tests()
    fired = {case["alertname"] for test in tests for case in test["alert_rule_test"] if case["exp_alerts"]}
    silent = {
        case["alertname"] for test in tests for case in test["alert_rule_test"] if not case["exp_alerts"]
    }
    names = {alert.name for alert in alerts.alerts()}
    assert fired == names and silent == names  # every alert shown firing, and shown silent
    document = {"rule_files": [alerts.RULES_FILE], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(document, sort_keys=False, width=200))
    result = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.external_tool  # promtool or helm
def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """The same tests against rules whose saturation bound is 10 minutes instead of 15: they fail, naming the
    alert, so a passing run means the bounds are the ones stated."""
    (tmp_path / alerts.RULES_FILE).write_text(alerts.rules_yaml().replace("for: 15m", "for: 10m"))
    document = {"rule_files": [alerts.RULES_FILE], "evaluation_interval": "1m", "tests": unit_tests()}
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(document, sort_keys=False, width=200))
    result = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "DeploykitReplicaSaturated" in result.stdout + result.stderr


def test_the_summaries_read_as_written() -> None:
    """Word for word, what an on-call reads for a pod and for a systemd host (the rest of each annotation is
    the rule's own text, filled in the same way and checked by promtool above)."""
    k8s = annotations("DeploykitCanaryCorrupt", "llm/qwen-5d8f7-x2kq9", cause="live_nan")
    assert k8s["summary"] == "llm/qwen-5d8f7-x2kq9 served corrupt output (live_nan)"
    host = annotations("DeploykitEngineHung", "127.0.0.1:9400")
    assert host["summary"] == "127.0.0.1:9400: the vLLM engine is hung"
    assert host["runbook"] == "docs/alerts.md#deploykitenginehung"


# --- the dashboard -------------------------------------------------------------------------------------


def dashboard_exprs() -> list[str]:
    return [target["expr"] for panel in dashboard.dashboard()["panels"] for target in panel["targets"]]


def test_every_panel_reads_exported_canary_series() -> None:
    board = dashboard.dashboard()
    titles = [panel["title"] for panel in board["panels"]]
    assert len(titles) == len(set(titles)) == len({panel["id"] for panel in board["panels"]})
    for panel in board["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = set(METRIC_NAME.findall(target["expr"]))
            assert names and names <= EXPORTED, (panel["title"], names - EXPORTED)
            assert 'namespace=~"$namespace"' in target["expr"], panel["title"]
    shown = {name for expr in dashboard_exprs() for name in METRIC_NAME.findall(expr)}
    for wanted in (
        "deploykit_canary_status",
        "deploykit_canary_runs_total",
        "deploykit_canary_failures_total",
        "deploykit_canary_progress_tokens",
        "deploykit_canary_progress_advanced_timestamp_seconds",
        "deploykit_canary_saturated",
        "deploykit_canary_server_restarts_total",
        "deploykit_canary_live_nan_requests_total",
    ):
        assert wanted in shown, wanted
    # No two panels overlap on Grafana's 24-column grid.
    cells = set()
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & mine, panel["title"]
        cells |= mine


def test_the_verdict_panel_maps_every_status() -> None:
    from deploykit.canary.state import STATUSES

    (panel,) = [p for p in dashboard.dashboard()["panels"] if p["title"] == "Verdict by replica"]
    texts = {
        option["text"]
        for mapping in panel["fieldConfig"]["defaults"]["mappings"]
        for option in mapping["options"].values()
    }
    assert set(STATUSES) | {"unknown"} <= texts
    assert texts == {name for name, _ in dashboard.VERDICTS}


@pytest.mark.external_tool  # promtool or helm
def test_promtool_parses_every_panel_query(tmp_path: Path) -> None:
    """Each panel's query, with Grafana's variables as Grafana fills them, as a recording rule: promtool
    refuses a query that does not parse."""
    rules = [
        {
            "record": f"dashboard:panel_query:{i}",
            "expr": expr.replace("$__rate_interval", "2m").replace("$namespace", ".*"),
        }
        for i, expr in enumerate(dashboard_exprs())
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert f"SUCCESS: {len(rules)} rules found" in check_rules(path)
