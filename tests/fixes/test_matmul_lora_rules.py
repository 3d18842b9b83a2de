"""matmul_lora's decision per vLLM release: the facts it reads from each release's source, and the rule.

vLLM 0.33's torch LoRA ops (the CPU build's punica path) clamp the slot index and zero rows without an
adapter, which is the CPU bug the rule enabled the fix for; 0.33 also forces one pipeline stage in
lora_expand on sm90, which may or may not cure the Hopper NaN (#52568). The detectors read the source with
`ast`; these tests run them on the installed 0.32 source, on that source changed the way 0.33 changed it,
and the rule on the shipped facts of both releases. tests/vllm_releases holds the detectors to 0.33's files.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from deploykit.fixes import _matmul_lora_source as matmul_lora_source
from deploykit.fixes import matmul_lora
from deploykit.fixes.base import Decision, DecisionInputs, FixMode
from deploykit.probe.facts import ProbeFacts
from tests.vllm_releases.releases import NEXT_RELEASE

REPO = Path(__file__).resolve().parents[2]


def inputs(vllm_version: str | None, platform: str = "cpu", gpu: str | None = None) -> DecisionInputs:
    gpus = []
    if gpu is not None:
        gpus = ProbeFacts.model_validate_json(
            (REPO / "tests/fixtures/facts" / f"{gpu}.json").read_text()
        ).gpus
    return DecisionInputs(
        gpus=gpus,
        vllm_version=vllm_version,
        checkpoint_dtype="bfloat16",
        lora_enabled=True,
        platform=platform,
    )


def installed_source(relative: str) -> str:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vLLM is not installed")
    return (Path(next(iter(spec.submodule_search_locations))).parent / relative).read_text()


# --- the detectors -------------------------------------------------------------------------------------

# The change 0.33 made to each torch op, in 0.32's own source: clamp the ids, then zero the rows of -1.
CLAMPED = (
    "lora_b_weights[lora_indices_tensor.clamp(min=0)]",
    'outputs = torch.einsum("bi, boi -> bo", inputs, selected_loras)\n'
    "    outputs = outputs.masked_fill((lora_indices_tensor == -1).unsqueeze(-1), 0)",
)


def masked_like_033(source: str) -> str:
    changed = source.replace("lora_b_weights[lora_indices_tensor]", CLAMPED[0])
    return changed.replace('outputs = torch.einsum("bi, boi -> bo", inputs, selected_loras)', CLAMPED[1])


def test_the_cpu_ops_detector_on_032_and_on_032_changed_as_033_changed_it() -> None:
    source = installed_source(matmul_lora.CPU_OPS_FILE)
    installed = matmul_lora.read_source_facts(
        Path(next(iter(importlib.util.find_spec("vllm").submodule_search_locations))).parent  # type: ignore[union-attr]
    )
    if installed[matmul_lora.CPU_OPS_MASK_NO_ADAPTER]:
        pytest.skip("the installed vLLM masks slot -1 already (0.33 or later)")
    assert matmul_lora.cpu_ops_mask_no_adapter(source) is False
    assert matmul_lora.cpu_ops_mask_no_adapter(masked_like_033(source)) is True
    # Half a fix is no fix: one op still indexing with the raw ids keeps the bug.
    one_left = masked_like_033(source).replace(CLAMPED[0], "lora_b_weights[lora_indices_tensor]", 1)
    assert matmul_lora.cpu_ops_mask_no_adapter(one_left) is False
    assert matmul_lora.cpu_ops_mask_no_adapter("def unrelated():\n    pass\n") is None


SM90_GUARD = """
def _lora_expand(inputs, current_platform, kernel_config):
    NUM_STAGES = kernel_config["num_stages"]
    if inputs.dtype == torch.float32:
        CAST_TYPE = True
        if current_platform.is_cuda() and current_platform.is_device_capability(90):
            NUM_STAGES = 1
"""


def test_the_sm90_guard_detector() -> None:
    assert matmul_lora.expand_sm90_single_stage(SM90_GUARD) is True
    assert (
        matmul_lora.expand_sm90_single_stage(SM90_GUARD.replace("NUM_STAGES = 1", "NUM_STAGES = 2")) is False
    )
    assert matmul_lora.expand_sm90_single_stage(SM90_GUARD.replace("(90)", "(100)")) is False
    assert matmul_lora.expand_sm90_single_stage("x = 1\n") is None
    source = installed_source(matmul_lora.EXPAND_OP_FILE)
    assert matmul_lora.expand_sm90_single_stage(source) in (True, False)  # the file has NUM_STAGES


# --- the rule, per release -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "decision"),
    [
        ("0.32.0+cpu", Decision.ENABLED),  # the CPU build this suite runs: slot -1 reads the last adapter
        ("0.32.0", Decision.ENABLED),
        ("0.33.0", Decision.NOT_NEEDED),  # 0.33's torch ops clamp and mask
        ("0.33.0+cpu", Decision.NOT_NEEDED),  # a CPU build of 0.33 would carry the same ops
    ],
)
def test_the_cpu_rule_follows_the_release_source(version: str, decision: Decision) -> None:
    made = matmul_lora.decide(inputs(version), FixMode.AUTO)
    assert made.decision is decision, made.reason
    if decision is Decision.NOT_NEEDED:
        assert "clamp the slot index" in made.reason and matmul_lora.CPU_OPS_FILE in made.reason
    else:
        assert "last adapter" in made.reason
    assert matmul_lora.decide(inputs(version), FixMode.ON).decision is Decision.ENABLED  # forced on: on


def test_an_unknown_release_keeps_the_cpu_fix_on_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matmul_lora_source, "installed_vllm_version", lambda: "0.32.0+cpu")
    made = matmul_lora.decide(inputs(NEXT_RELEASE), FixMode.AUTO)
    assert made.decision is Decision.ENABLED and "source unknown" in made.reason


def test_a_release_not_shipped_but_installed_is_read_from_its_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.32.9 has no shipped record; installed here (this venv's files are 0.32's), its source decides."""
    installed_source(matmul_lora.CPU_OPS_FILE)  # skips without vLLM
    monkeypatch.setattr(matmul_lora_source, "installed_vllm_version", lambda: "0.32.9+cpu")
    facts = matmul_lora.release_source_facts("0.32.9+cpu")
    assert set(facts) == set(matmul_lora.SOURCE_FACTS) and all(v in (True, False) for v in facts.values())
    made = matmul_lora.decide(inputs("0.32.9+cpu"), FixMode.AUTO)
    masked = facts[matmul_lora.CPU_OPS_MASK_NO_ADAPTER]
    assert made.decision is (Decision.NOT_NEEDED if masked else Decision.ENABLED)
    assert "source unknown" not in made.reason


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0"])
def test_hopper_keeps_the_fix_on_and_names_033s_sm90_guard(version: str) -> None:
    made = matmul_lora.decide(inputs(version, "cuda", "h100"), FixMode.AUTO)
    assert made.decision is Decision.ENABLED
    assert made.reason.startswith("LoRA on ") and "Hopper): punica's Triton add_lora_linear" in made.reason
    if version == "0.33.0":
        assert "NUM_STAGES = 1" in made.reason and "triton-lang/triton#9433" in made.reason
        assert "no GPU run has shown it yet" in made.reason
    else:
        assert "NUM_STAGES" not in made.reason


def test_off_hopper_gpus_stay_off_on_both_releases() -> None:
    for version in ("0.32.0", "0.33.0"):
        assert (
            matmul_lora.decide(inputs(version, "cuda", "a100"), FixMode.AUTO).decision is Decision.NOT_NEEDED
        )
