"""Where the advisories show: `plan --format json` carries them, the shell form applies the workaround, the
text form lists them, `profiles list` names them, `render` writes them into the unit and the chart, and
a results row keeps them (inside the plan it stores)."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from deploykit.results.record import ResultRecord
from deploykit.results.sql.store import open_store
from deploykit.serve.helpers import plan_for_store
from tests.advisories.conftest import FACTS_DIR, PlanFor
from tests.cli_process import run_deploykit
from tests.unit_prefix import ABSENT_PREFIX

TP2 = {
    "name": "tp2",
    "model": {"source": "Qwen/Qwen3-8B", "checkpoint_dtype": "bfloat16", "architecture": "Qwen3ForCausalLM"},
    "serve": {
        "tensor_parallel_size": 2,
        "max_num_seqs": 64,
        "host": "0.0.0.0",
        "allow_unauthenticated": True,
        "model_runner": "v1",  # vLLM 0.33's V1 runner: no V2 penalty table to warn about (issue 33)
    },
}
PATCHED = str(FACTS_DIR / "rtx3090x2-p2p-patched.json")


@pytest.fixture
def tp2(tmp_path: Path) -> Path:
    path = tmp_path / "tp2.yaml"
    path.write_text(yaml.safe_dump(TP2))
    return path


def deploykit(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_deploykit(args, timeout=300, cwd=cwd)


def test_plan_json_carries_the_applied_advisory(tp2: Path) -> None:
    done = deploykit("plan", "-p", str(tp2), "--facts", PATCHED, "--no-validate", "-f", "json")

    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    by_id = {advisory["id"]: advisory for advisory in plan["advisories"]}
    assert set(by_id) <= {"custom-allreduce-patched-p2p", "v2-penalty-table"}  # the latter: a V2 target
    advisory = by_id["custom-allreduce-patched-p2p"]
    assert advisory["outcome"] == "applied"
    assert advisory["change"] == "--disable-custom-all-reduce"
    assert any("club-3090/issues/922" in ref for ref in advisory["references"])
    assert plan["argv"][-1] == "--disable-custom-all-reduce"


def test_plan_shell_applies_the_workaround_and_text_lists_it(tp2: Path) -> None:
    shell = deploykit("plan", "-p", str(tp2), "--facts", PATCHED, "--no-validate", "-f", "shell")
    text = deploykit("plan", "-p", str(tp2), "--facts", PATCHED, "--no-validate")

    command = [line for line in shell.stdout.splitlines() if not line.startswith("#")]
    assert "--disable-custom-all-reduce" in shlex.split(command[-1])
    assert "advisory custom-allreduce-patched-p2p (noonghunna/club-3090#922, #56128): applied" in text.stdout


def test_the_plan_validates_with_the_workaround_in_it(tp2: Path) -> None:
    """The applied argv goes through the same vLLM option-table check as every argv."""
    done = deploykit("plan", "-p", str(tp2), "--facts", PATCHED, "-f", "json")

    plan = json.loads(done.stdout)
    assert plan["validation"]["status"] == "ok", plan["validation"]


def test_a_warned_advisory_in_shell_form_goes_to_stderr_with_the_change(tmp_path: Path) -> None:
    profile = {
        "name": "ds",
        "model": {"source": "deepseek-ai/DeepSeek-V3.1", "architecture": "DeepseekV3ForCausalLM"},
        "serve": {"extra_args": ["--kv-cache-dtype", "fp8"]},
    }
    path = tmp_path / "ds.yaml"
    path.write_text(yaml.safe_dump(profile))

    done = deploykit(
        "plan", "-p", str(path), "--facts", str(FACTS_DIR / "h20.json"), "--no-validate", "-f", "shell"
    )

    assert "--kv-cache-dtype fp8" in done.stdout
    assert "advisory fp8-kv-deepseek-v3 (#33638)" in done.stderr
    assert "--kv-cache-dtype auto" in done.stderr
    assert "advisories: {fp8-kv-deepseek-v3: apply}" in done.stderr


def test_profiles_list_names_the_advisories(tmp_path: Path) -> None:
    (tmp_path / "tp2.yaml").write_text(yaml.safe_dump(TP2))

    done = deploykit("profiles", "list", "--facts", PATCHED, "--dir", str(tmp_path), "-f", "json")

    rows = {row["name"]: row for row in json.loads(done.stdout)}
    assert rows["tp2"]["advisories"] == ["custom-allreduce-patched-p2p (applied)"]
    assert rows["penalties-high-concurrency"]["advisories"] == ["device-penalties (fixed)"]


def test_render_writes_the_advisory_into_the_unit_and_the_chart(tp2: Path, tmp_path: Path) -> None:
    unit_dir, chart_dir = tmp_path / "units", tmp_path / "chart"

    systemd = deploykit(
        "render",
        "systemd",
        "-p",
        str(tp2),
        "--facts",
        PATCHED,
        "-o",
        str(unit_dir),
        "--prefix",
        ABSENT_PREFIX,
    )
    helm = deploykit("render", "helm", "-p", str(tp2), "--facts", PATCHED, "-o", str(chart_dir))

    assert systemd.returncode == 0, systemd.stderr
    assert helm.returncode == 0, helm.stderr
    unit = (unit_dir / "deploykit-tp2.service").read_text()
    assert "# Advisory custom-allreduce-patched-p2p (noonghunna/club-3090#922, #56128): applied" in unit
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    block = unit[unit.index(exec_start) :].split("\n\n")[0]
    assert "--disable-custom-all-reduce" in block
    values = yaml.safe_load((chart_dir / "tp2" / "values.yaml").read_text())
    assert values["deploykit"]["advisories"] == "custom-allreduce-patched-p2p=applied"
    assert values["command"][-1] == "--disable-custom-all-reduce"
    templates = chart_dir / "tp2" / "templates"
    annotations = (templates / "_pod.tpl").read_text().split('define "deploykit.objectAnnotations"')[1]
    assert "deploykit.io/advisories: {{ . | quote }}" in annotations.split("{{- end -}}")[0]
    for workload in ("deployment.yaml", "leaderworkerset.yaml"):  # one node, or a group over several
        assert 'include "deploykit.objectAnnotations"' in (templates / workload).read_text()


def test_a_results_row_records_which_advisories_applied(plan_for: PlanFor, tmp_path: Path) -> None:
    plan = plan_for("rtx3090x2-p2p-patched", {k: v for k, v in TP2.items() if k != "name"})
    record = ResultRecord(verdict="pass", stage="done", plan=plan_for_store(plan, plan.argv))

    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        row_id = store.add(record)
        stored = store.get(row_id)
    finally:
        store.close()

    assert stored is not None and stored.plan is not None
    assert [(a["id"], a["outcome"]) for a in stored.plan["advisories"]] == [
        ("custom-allreduce-patched-p2p", "applied")
    ]
