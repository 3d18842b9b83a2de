"""The GPU evidence kit's dry run (bench/gpu/run.py --dry-run): same JSON shape as on the device, and every
step that needs no CUDA passes here, importing vLLM from the carried sources as the GPU machine will."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm_import  # the dry run imports vLLM from the carried sources (~30 s)

REPO = Path(__file__).resolve().parents[2]
STEPS = ("probe", "matmul_lora", "penalties", "fp32_projection", "v2_penalties")
STEP_KEYS = {
    "schema",
    "step",
    "status",
    "reason",
    "dry_run",
    "seconds",
    "checks",
    "skipped",
    "errors",
    "data",
}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (REPO / ".gpu-carry" / ".prepared").exists():  # written last by prepare.sh
        subprocess.run(["bash", str(REPO / "bench" / "gpu" / "prepare.sh")], check=True, timeout=600)
    out = tmp_path_factory.mktemp("gpu-dry")
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu" / "run.py"), "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_dry_run_writes_every_file_in_the_device_shape(dry_run: Path) -> None:
    summary = json.loads((dry_run / "summary.json").read_text())
    assert summary["dry_run"] is True and set(summary["steps"]) == set(STEPS)
    assert (dry_run / "results.md").read_text().startswith("# GPU evidence kit results (dry run)")
    assert json.loads((dry_run / "probe-facts.json").read_text())["schema_version"] == 1
    for step in STEPS:
        record = json.loads((dry_run / f"{step}.json").read_text())
        assert set(record) >= STEP_KEYS, step
        assert record["step"] == step and record["dry_run"] is True
        # Whatever needs CUDA is recorded as not run, with its reason.
        for check, value in record["checks"].items():
            if value is None:
                assert record["skipped"][check], (step, check)


def test_cpu_runnable_steps_pass(dry_run: Path) -> None:
    records = {step: json.loads((dry_run / f"{step}.json").read_text()) for step in STEPS}
    for step, record in records.items():
        if step == "v2_penalties" and record["status"] == "skipped":  # 0.34's sources not carried here
            assert "--pack-release" in record["reason"]
            continue
        assert record["status"] == "passed", (step, record["reason"], record["errors"])
    lora = records["matmul_lora"]["checks"]
    for dtype in ("float16", "bfloat16"):
        assert lora[f"matmul_lora_{dtype}_zero_adapters_bit_exact"] is True
        assert lora[f"matmul_lora_{dtype}_nan_filled_output_finite"] is True
        assert lora[f"matmul_lora_{dtype}_mixed_batch_matches_float64"] is True
        assert lora[f"matmul_lora_{dtype}_slot_minus1_rows_untouched"] is True
        assert lora[f"matmul_lora_{dtype}_torch_compile_matches_float64"] is True
        assert lora[f"matmul_lora_{dtype}_cuda_graph_replay"] is None
    assert lora["punica_ops_import_from_carried_sources"] is True
    penalties = records["penalties"]
    assert penalties["checks"]["penalties_exact_vs_vllm_apply_all_penalties"] is True
    assert penalties["data"]["penalties_exactness"]["mismatched_steps"] == []
    projection = records["fp32_projection"]["checks"]
    assert projection["without_fix_non_finite"] is True and projection["with_fix_finite"] is True


def test_dry_run_imports_vllm_from_the_carried_sources(dry_run: Path) -> None:
    record = json.loads((dry_run / "penalties.json").read_text())
    carried = record["data"]["carry"]
    assert carried["vllm_sources"] == "carried"
    assert carried["vllm_file"].endswith(".gpu-carry/vllm/__init__.py")
    assert carried["carried_vllm_version"].startswith("0.32")
