"""The canary's alert rules in a real Prometheus: no alert before the fault, DeploykitCanaryCorrupt after it.

A real `prometheus` (Debian's package; its own config and storage, scrape and evaluation every second) loads
the rules file `deploykit render systemd` writes and scrapes a real `deploykit canary` that watches the real
vLLM CPU build with the test fault worker (tests/e2e/test_live_nan_e2e.py's set-up: a 600 s probe interval,
vLLM's NaN counter read every second). Before the fault every rule evaluates cleanly and nothing is pending
or firing; one user request with NaN logits then makes the corruption alert fire, read back through
Prometheus's HTTP API (/api/v1/alerts), within `WITHIN_S` of the request's answer. Every dashboard query
runs in the same Prometheus. One vLLM start.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from deploykit.net import free_port
from deploykit.render import alerts, dashboard
from tests.cli_process import run_deploykit
from tests.e2e.fault_worker import FAULT_KEY, TOKENS_ENV, WORKER_CLS
from tests.e2e.test_canary_e2e import CanaryRun
from tests.e2e.test_live_nan_e2e import start_canary
from tests.unit_prefix import ABSENT_PREFIX
from tests.vllm_harness import REPO, RunningServer, running_vllm, tiny_serve_args

pytestmark = pytest.mark.e2e

FACTS = REPO / "tests" / "fixtures" / "facts" / "no-gpu.json"
WITHIN_S = 20.0
"""The canary reads vLLM's counter every second and turns corrupt ~1 s after the answer (test_live_nan_e2e);
then one scrape (1 s) and one evaluation (1 s): 20 s leaves room for a loaded 2-core machine."""
QUIET_S = 5.0
"""How long nothing may be pending or firing before the fault: five evaluations of every rule."""
INSTALL_HINT = (
    "install Debian's prometheus package (`apt-get install -y prometheus`; tools/ci-services.sh does)"
)


@dataclass
class Prometheus:
    base: str
    process: subprocess.Popen[str]
    log: Path

    def api(self, path: str, **params: str) -> Any:
        response = httpx.get(f"{self.base}/api/v1/{path}", params=params, timeout=10)
        body = response.json()
        assert body["status"] == "success", body
        return body["data"]

    def alerts(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return found

    def query(self, expr: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("query", query=expr)["result"]
        return result

    def wait(self, what: str, done: Callable[[], bool], timeout: float) -> float:
        started = time.monotonic()
        while not done():
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() - started < timeout, f"{what}: not within {timeout} s"
            time.sleep(0.2)
        return time.monotonic() - started


def start_prometheus(tmp: Path, rules: Path, target: str) -> Prometheus:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(f"prometheus is not on PATH: {INSTALL_HINT}", pytrace=False)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "deploykit-canary", "static_configs": [{"targets": [target]}]}],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = tmp / "prometheus.log"
    argv = [
        binary,
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with log.open("w") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, text=True)
    prometheus = Prometheus(f"http://127.0.0.1:{port}", process, log)

    def ready() -> bool:
        try:
            return httpx.get(f"{prometheus.base}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    prometheus.wait("prometheus ready", ready, 60)
    return prometheus


@pytest.fixture(scope="module")
def watched(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningServer, CanaryRun, Prometheus]]:
    tmp = tmp_path_factory.mktemp("alerts")
    out = tmp / "units"
    args = ["render", "systemd", "--profile", "demo-cpu", "--facts", str(FACTS), "--prefix", ABSENT_PREFIX]
    rendered = run_deploykit([*args, "--out", str(out)])
    assert rendered.returncode == 0, rendered.stderr
    rules = out / alerts.RULES_FILE
    env = {"PYTHONPATH": str(REPO), TOKENS_ENV: "off", "VLLM_COMPUTE_NANS_IN_LOGITS": "1"}
    with running_vllm([*tiny_serve_args(tiny_model_dir), "--worker-cls", WORKER_CLS], env=env) as server:
        canary = start_canary(server, tiny_model_dir, tmp, "alerts", 1)
        try:
            prometheus = start_prometheus(tmp, rules, canary.base.removeprefix("http://"))
            try:
                yield server, canary, prometheus
            finally:
                prometheus.process.terminate()
                prometheus.process.wait(30)
        finally:
            canary.run.stop(120)


def test_the_corruption_alert_fires_in_a_real_prometheus_and_nothing_before(
    watched: tuple[RunningServer, CanaryRun, Prometheus],
) -> None:
    server, canary, prometheus = watched
    canary.wait_runs(1)
    canary.run.wait_for(r"^state: healthy: ", 120)
    # Scraped and judged: the canary's series are in, every rule has been evaluated and evaluates cleanly.
    prometheus.wait(
        "the canary scraped healthy", lambda: prometheus.query("deploykit_canary_healthy == 1") != [], 30
    )

    def evaluated() -> list[dict[str, Any]]:
        return [rule for group in prometheus.api("rules")["groups"] for rule in group["rules"]]

    prometheus.wait("every rule evaluated", lambda: all(r["health"] == "ok" for r in evaluated()), 30)
    rules = evaluated()
    assert sorted(r["name"] for r in rules) == sorted(a.name for a in alerts.alerts())
    assert all(r["health"] == "ok" and not r.get("lastError") for r in rules), rules
    quiet_until = time.monotonic() + QUIET_S
    while time.monotonic() < quiet_until:
        assert prometheus.alerts() == [], prometheus.alerts()
        time.sleep(0.5)

    request = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "vllm_xargs": {FAULT_KEY: "corrupt"}}
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        assert client.post("/v1/completions", json=request).status_code == 200
    # From the answer on: the wait's own clock.

    def corrupt_firing() -> bool:
        return any(
            a["labels"]["alertname"] == "DeploykitCanaryCorrupt" and a["state"] == "firing"
            for a in prometheus.alerts()
        )

    took = prometheus.wait("DeploykitCanaryCorrupt firing", corrupt_firing, WITHIN_S)
    target = canary.base.removeprefix("http://")
    (alert,) = prometheus.alerts()  # the corruption alert alone
    assert alert["labels"] == {
        "alertname": "DeploykitCanaryCorrupt",
        "cause": "live_nan",
        "instance": target,
        "job": "deploykit-canary",
        "severity": "critical",
    }
    assert alert["annotations"]["summary"] == f"{target} served corrupt output (live_nan)"
    assert alert["annotations"]["runbook"] == "docs/alerts.md#deploykitcanarycorrupt"
    assert canary.healthz() == 503
    print(
        f"\nDeploykitCanaryCorrupt firing {took:.1f} s after the faulty request's answer (bound {WITHIN_S} s)"
    )

    # The dashboard's queries run here too; the verdict panel says corrupt (its highest code).
    for panel in dashboard.dashboard()["panels"]:
        for target_query in panel["targets"]:
            expr = target_query["expr"].replace("$__rate_interval", "1m").replace("$namespace", ".*")
            prometheus.query(expr)  # status success, or the helper fails naming the answer
    corrupt_code = [name for name, _ in dashboard.VERDICTS].index("corrupt") + 1
    verdict = prometheus.query(dashboard.verdict_expr().replace("$namespace", ".*"))
    assert [(r["metric"].get("instance"), float(r["value"][1])) for r in verdict] == [(target, corrupt_code)]
