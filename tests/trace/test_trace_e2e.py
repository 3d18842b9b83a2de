"""`deploykit trace` against the real vLLM (CPU build): each broken tiny model names its culprit.

One vLLM start per test (about a minute each on a 2-core machine); every case asks for 4 tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from deploykit import exit_codes
from deploykit.profile.schema import FixMode
from deploykit.trace.report import TraceReport
from deploykit.trace.run import TraceOptions, run_trace
from tests.trace.models import tiny_variant, write_profile
from tests.vllm_harness import REPO

pytestmark = pytest.mark.e2e


def trace(profile: Path, tmp_path: Path, **options: object) -> tuple[int, TraceReport]:
    code, report = run_trace(
        TraceOptions(
            profile=str(profile),
            store_url=f"sqlite:///{tmp_path / 'results.sqlite'}",
            log_dir=tmp_path / "logs",
            **options,  # type: ignore[arg-type]
        ),
        print,
    )
    assert report is not None
    print(report.model_dump_json(indent=2, by_alias=True))
    return code, report


def stored_rows(tmp_path: Path) -> list[object]:
    from deploykit.results.sql.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 'results.sqlite'}")
    try:
        return list(store.recent(limit=10))
    finally:
        store.close()


def test_final_norm_weight_inf_names_model_norm_through_the_cli(tiny_model_dir: Path, tmp_path: Path) -> None:
    profile = write_profile(tmp_path, "trace-norm-inf", tiny_variant(tiny_model_dir, "norm-inf"))
    store = f"sqlite:///{tmp_path / 'results.sqlite'}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [str(Path(sys.executable).parent / "deploykit"), "trace", "--profile", str(profile)]
    run = subprocess.run(
        [*command, "--format", "json", "--store", store],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    print(run.stderr[-3000:])
    assert run.returncode == exit_codes.FAILED, run.stderr[-2000:]
    report = json.loads(run.stdout)
    first = report["first"]
    assert first["module"] == "model.norm"
    assert first["class"] == "RMSNorm" and first["dtype"] == "float32"
    assert first["inputs_finite"] is True and first["nonfinite"] > 0
    assert first["first_bad"]["token"] == 0
    assert report["suggested_fix"] is None
    assert report["modules_hooked"] > 20 and report["requests"]
    # what follows the norm: the logits processor (and the model wrappers) carry the NaN on
    assert report["spread"] and all(s["module"] != "model.norm" for s in report["spread"])
    rows = stored_rows(tmp_path)
    assert rows[0].command == "trace" and rows[0].verdict == "fail"  # type: ignore[attr-defined]
    assert "model.norm" in rows[0].diagnosis  # type: ignore[attr-defined]


def test_layer_weight_inf_names_that_layer(tiny_model_dir: Path, tmp_path: Path) -> None:
    profile = write_profile(tmp_path, "trace-layer-inf", tiny_variant(tiny_model_dir, "layer-inf"))
    code, report = trace(profile, tmp_path)
    assert code == exit_codes.FAILED
    assert report.first is not None
    assert report.first.module == "model.layers.1.mlp.down_proj"
    assert report.first.class_name == "RowParallelLinear" and report.first.inputs_finite
    assert report.first.request is not None and report.first.request.startswith("cmpl-dktrace-0-completion")
    # nothing in layer 0 or before the down projection of layer 1 went bad
    assert not any(s.module.startswith("model.layers.0") for s in report.spread)


def test_healthy_model_reports_none(tiny_model_dir: Path, tmp_path: Path) -> None:
    profile = write_profile(tmp_path, "trace-healthy", tiny_model_dir)
    code, report = trace(profile, tmp_path, case="completion")
    assert code == exit_codes.OK
    assert report.first is None and report.spread == [] and report.suggested_fix is None
    assert report.logits is not None and report.logits.nonfinite == 0
    assert report.logits.constant_rows == 0
    assert any("no module produced a non-finite value" in f for f in report.findings)
    assert stored_rows(tmp_path)[0].verdict == "pass"  # type: ignore[attr-defined]


def test_all_zero_lm_head_reports_none_with_constant_logits(tiny_model_dir: Path, tmp_path: Path) -> None:
    profile = write_profile(tmp_path, "trace-lm-head-zero", tiny_variant(tiny_model_dir, "lm-head-zero"))
    code, report = trace(profile, tmp_path)
    assert report.first is None and report.spread == []
    assert report.logits is not None and report.logits.nonfinite == 0
    assert report.logits.rows > 0 and report.logits.constant_rows == report.logits.rows
    assert report.logits.min == report.logits.max == 0.0 and set(report.logits.argmax) == {0}
    assert any("finite but constant" in f and "token 0" in f for f in report.findings)
    assert code == exit_codes.FAILED  # the smoke case fails: token 0 forever


def test_start_up_dummy_run_never_counts(tiny_model_dir: Path, tmp_path: Path) -> None:
    """NaN in token 0's embedding row: vLLM's all-zero dummy run hits it, real prompts never do."""
    model = tiny_variant(tiny_model_dir, "zero-input-fault")
    profile = write_profile(
        tmp_path,
        "trace-zero-input-fault",
        model,
        extra_args=["--worker-cls", "tests.trace.profiling_worker.ProfilingCPUWorker"],
    )
    code, report = trace(profile, tmp_path)
    log = next((tmp_path / "logs").glob("trace-*/vllm.log")).read_text()
    # the dummy run did go through the fault at start-up ...
    assert "test worker: start-up dummy run, non-finite hidden states: True" in log
    # ... and the trace does not count it
    assert report.first is None and report.spread == []
    assert report.requests and all(r.id.startswith("cmpl-dktrace-") for r in report.requests)
    assert code == exit_codes.OK


# --- the FP16 Gemma4 Unified of the fp32_projection tests --------------------------------------------


def gemma4_profile(tmp_path: Path) -> Path:
    from tests.gemma4_models import tiny_gemma4_unified_dir, torchvision_server_env

    model = tiny_gemma4_unified_dir()
    env = torchvision_server_env()

    def edit(data: dict[str, object]) -> None:
        serve = data["serve"]
        assert isinstance(serve, dict)
        serve["extra_args"] = ["--limit-mm-per-prompt", '{"image": 1, "audio": 0, "video": 0}']
        data["model"] = {
            "source": str(model),
            "served_name": "tiny-gemma4-unified",
            "checkpoint_dtype": "bfloat16",
            "architecture": "Gemma4UnifiedForConditionalGeneration",
            "multimodal": True,
        }
        data["smoke"] = {"timeout_s": 300, "cases": [{"kind": "image", "max_tokens": 4}]}
        data["deploy"] = {"startup_timeout_s": 600}

    pythonpath = os.pathsep.join([env.get("PYTHONPATH", ""), str(REPO)]).strip(os.pathsep)
    return write_profile(
        tmp_path, "trace-gemma4-fp16", model, dtype="float16", env={"PYTHONPATH": pythonpath}, edit=edit
    )


def test_gemma4_fp16_names_patch_dense_and_suggests_fp32_projection(tmp_path: Path) -> None:
    code, report = trace(gemma4_profile(tmp_path), tmp_path, overrides={"fp32_projection": FixMode.OFF})
    assert code == exit_codes.FAILED
    assert report.first is not None
    assert report.first.module.endswith("vision_embedder.patch_dense"), report.first.module
    assert report.first.dtype == "float16" and report.first.inf > 0
    assert report.first.first_bad is not None and report.first.first_bad.channel == 5  # HOT_CHANNEL
    assert report.suggested_fix is not None and report.suggested_fix.name == "fp32_projection"
    assert not report.suggested_fix.already_enabled
    assert any(s.module.endswith("patch_ln2") for s in report.spread)


def test_gemma4_fp16_with_fp32_projection_has_no_non_finite_value(tmp_path: Path) -> None:
    """The fix by its own `auto` rule (float16 compute), and with it no module of the model, vision embedder,
    multimodal embedder or language model, goes non-finite: nothing beyond patch_dense/patch_ln2 to widen
    the fix to (issue 35)."""
    code, report = trace(gemma4_profile(tmp_path), tmp_path)
    assert report.fixes_enabled == ["fp32_projection"]
    assert report.first is None and report.spread == []
    assert report.logits is not None and report.logits.nonfinite == 0
    assert code == exit_codes.OK
