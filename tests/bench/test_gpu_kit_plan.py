"""The GPU kit's plan, without running it (issue 33): the V2 penalties step is in the one prepared call, at
the users the issue names, inside the device time, and its memory figure is the advisory's own formula."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from deploykit.advisories.facts import DeploymentFacts

REPO = Path(__file__).resolve().parents[2]
DEVICE_BUDGET_S = 15 * 60  # all device time of a session, start-up included
START_UP_S = 240  # a fresh machine (the device README's "minutes"), counted generously


def kit() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploykit_gpu_kit", REPO / "bench" / "gpu" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_the_v2_penalties_step_is_in_the_one_call_at_the_issues_users() -> None:
    run = kit()
    assert run.STEPS[-1] == "v2_penalties" and set(run.STEP_LIMIT_S) == set(run.STEPS) == set(run.DRY_LIMIT_S)
    assert run.V2_USERS == (8, 32, 64) and run.V2_RELEASE == "0.34.0"
    assert set(run.STEP_FUNCTIONS) == set(run.STEPS)


def test_the_call_fits_well_inside_the_device_time() -> None:
    """Every step's own limit together, the call's timeout (600 s, the most one command may run) and a
    machine start-up: a rerun of one step (--only, 240 s) must still fit."""
    run = kit()
    steps_s = sum(run.STEP_LIMIT_S.values())
    assert steps_s <= 575
    assert START_UP_S + 600 + 20 <= DEVICE_BUDGET_S  # the call, its start-up, the transfers
    assert run.STEP_LIMIT_S["v2_penalties"] <= 75  # a vLLM import, 3 x 2 x 53 GEMMs + kernels, 3 allocations


def test_the_measured_table_is_compared_with_the_advisorys_formula() -> None:
    run = kit()
    for rows in run.V2_TABLE_ROWS:
        advisory = DeploymentFacts(max_num_seqs=rows, vocab_size=run.V2_VOCAB).penalty_table_mib
        assert advisory == int(run.v2_table_formula_mib(rows, run.V2_VOCAB))


def test_results_md_shows_the_v2_rows() -> None:
    run = kit()
    record = {
        "step": "v2_penalties",
        "status": "passed",
        "reason": None,
        "seconds": 1.0,
        "checks": {},
        "data": {
            "v2_penalties": {
                "release": "0.34.0",
                "tpot": [
                    {
                        "users": u,
                        "without_ms": 1.0,
                        "with_ms": 1.5,
                        "penalty_ms": 0.5,
                        "with_over_without": 1.5,
                    }
                    for u in run.V2_USERS
                ],
                "table": [
                    {"max_num_seqs": 256, "measured_mib": 129.0, "formula_mib": 129.0, "how": "x"},
                ],
            }
        },
    }
    summary = {"dry_run": False, "seconds": 1.0, "environment": {}, "steps": {}}
    text = run.markdown(summary, [record])
    assert "| 64 | 1.000 | 1.500 | 0.500 | 1.50 |" in text and "| 256 | 129.0 | 129.0 | x |" in text
