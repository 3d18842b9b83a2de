"""Every advisory: a facts + profile pair that triggers it, with the exact plan change (argv/env diff) or
warning, and a pair one condition away that does not.

The diff is taken against the same plan with the advisory set to `ignore`, so it is the advisory's own
change and nothing else."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from deploykit.advisories import advisories
from deploykit.plan import Plan
from tests.advisories.conftest import PlanFor

LLAMA_VOCAB = {"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16", "vocab_size": 128256}


def _profile(arch: str | None = None, *, version: str | None = None, **serve: Any) -> dict[str, Any]:
    model: dict[str, Any] = {"source": "org/model", "checkpoint_dtype": "bfloat16"}
    if arch:
        model["architecture"] = arch
    profile: dict[str, Any] = {"model": model, "serve": serve}
    if version:
        profile["vllm_version"] = version
    return profile


@dataclass
class Case:
    id: str
    facts: str
    profile: dict[str, Any]
    near_facts: str
    near_profile: dict[str, Any]
    added: list[str] = field(default_factory=list)  # argv words the advisory adds
    removed: list[str] = field(default_factory=list)  # argv words it takes out
    env: dict[str, str] = field(default_factory=dict)
    warned: bool = False
    fix: str | None = None
    config: dict[str, Any] | None = None
    near_config: dict[str, Any] | None = None


MISTRAL3 = _profile(
    "Mistral3ForConditionalGeneration", version="0.27.1", extra_args=["--kv-cache-dtype", "fp8"]
)
NVFP4 = {"architectures": ["Qwen3ForCausalLM"], "torch_dtype": "bfloat16", "vocab_size": 151936}
NVFP4["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
GPT_OSS_MXFP4 = {
    "architectures": ["GptOssForCausalLM"],
    "torch_dtype": "bfloat16",
    "vocab_size": 201088,
    "quantization_config": {"quant_method": "mxfp4"},
}
MXFP4_EP_DP = ["--moe-backend", "flashinfer_cutlass", "--enable-expert-parallel", "--data-parallel-size", "2"]
SPEC = ["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}']
BATCH_INVARIANT = {"VLLM_BATCH_INVARIANT": "1"}
AITER = {"VLLM_ROCM_USE_AITER": "1"}
SP_ON = ["--compilation-config.pass_config.enable_sp=true"]


def _with_env(profile: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    return {**profile, "env": env}


NEW_CASES = [  # issue 35
    Case(
        "gemma4-vision-fp16-standardize",
        "h100",
        _profile("Gemma4ForConditionalGeneration", dtype="float16"),
        "h100",
        _profile("Gemma4ForConditionalGeneration", dtype="bfloat16"),
        warned=True,
    ),
    Case(
        "nvfp4-kv-trtllm-blackwell",
        "b200",
        _profile("Qwen3ForCausalLM", extra_args=["--kv-cache-dtype", "nvfp4"]),
        "h100",  # CC 9.0: not the SM100 trtllm-gen path
        _profile("Qwen3ForCausalLM", extra_args=["--kv-cache-dtype", "nvfp4"]),
        warned=True,
    ),
    Case(
        "hybrid-mtp-prefix-cache-async",
        "h100",
        _profile("Qwen3NextForCausalLM", extra_args=[*SPEC, "--enable-prefix-caching"]),
        "h100",
        _profile(
            "Qwen3NextForCausalLM", extra_args=[*SPEC, "--enable-prefix-caching", "--no-async-scheduling"]
        ),
        warned=True,
    ),
    Case(
        "batch-invariant-co-resident",
        "h100",  # vLLM's default --max-num-seqs here is 1024
        _with_env(_profile("LlamaForCausalLM"), BATCH_INVARIANT),
        "h100",
        _with_env(_profile("LlamaForCausalLM", max_num_seqs=8), BATCH_INVARIANT),
        warned=True,
    ),
    Case(
        "batch-invariant-sequence-parallel",
        "h100",
        _with_env(_profile("LlamaForCausalLM", max_num_seqs=8, extra_args=SP_ON), BATCH_INVARIANT),
        "h100",
        _profile("LlamaForCausalLM", max_num_seqs=8, extra_args=SP_ON),
        warned=True,
    ),
    Case(
        "flashinfer-nvfp4-moe-nan",
        "b200-flashinfer-0.6.17",  # hand-written: FlashInfer 0.6.17 stated in the facts
        {"model": {"source": "x"}},
        "b200",  # vLLM 0.33, which pins FlashInfer 0.7.2.post1
        {"model": {"source": "x"}},
        warned=True,
        config=NVFP4,
        near_config=NVFP4,
    ),
    Case(
        "xpu-graph-arc-b70",
        "arc-pro-b70-x2",  # hand-written: platform xpu
        _profile("Qwen3ForCausalLM"),
        "arc-pro-b70-x2",
        _profile("Qwen3ForCausalLM", enforce_eager=True),
        warned=True,
    ),
    Case(
        "rocm-aiter-custom-ar-gfx942",
        "mi325x-x8",  # hand-written: platform rocm, gfx942
        _with_env(_profile("Qwen3ForCausalLM", tensor_parallel_size=8), AITER),
        "mi325x-x8",
        _profile("Qwen3ForCausalLM", tensor_parallel_size=8),  # AITER off: vLLM's own all-reduce
        env={"VLLM_ROCM_USE_AITER_CUSTOM_AR": "0"},
    ),
    Case(
        "rocm-aiter-moe-nan-gfx942",
        "mi325x-x8",
        _with_env(_profile("Qwen3MoeForCausalLM", version="0.26.0"), AITER),
        "mi325x-x8",
        _with_env(_profile("Qwen3MoeForCausalLM", version="0.27.0"), AITER),  # fixed in 0.27.0
        warned=True,
    ),
    Case(
        "rocm-aiter-mla-sparse-long-input",
        "mi325x-x8",
        _profile("GlmMoeDsaForCausalLM"),
        "h100",  # CUDA has other sparse-MLA backends
        _profile("GlmMoeDsaForCausalLM"),
        warned=True,
    ),
]

ISSUE_47_CASES = [  # hangs and silent corruption of vLLM 0.21-0.34
    # Facts: tests/fixtures/hand-facts/b200-flashinfer-0.6.13.json (new, proposed in /tmp/adv-research/hand-
    # facts/): the recorded B200 with vllm_version 0.25.1 and flashinfer_version 0.6.13 stated, as in vLLM
    # 0.25.x's pin. Near miss: the existing b200-flashinfer-0.6.17 (FlashInfer past 0.6.14); the profile pins
    # vLLM 0.25.1 in both.
    Case(
        "flashinfer-topk-sampler-hang",
        "b200-flashinfer-0.6.13",
        _profile("Qwen3ForCausalLM", version="0.25.1"),
        "b200-flashinfer-0.6.17",  # FlashInfer 0.6.17 holds #3615 (first in 0.6.14)
        _profile("Qwen3ForCausalLM", version="0.25.1"),
        env={"VLLM_USE_FLASHINFER_SAMPLER": "0"},
    ),
    # Facts: the proposed hand-facts/b200-flashinfer-0.6.13.json (B200, vLLM 0.25.1, FlashInfer 0.6.13), see
    # flashinfer-topk-sampler-hang.case.py. Near miss: the existing b200-flashinfer-0.6.17; the profile pins
    # 0.25.1 in both.
    Case(
        "flashinfer-gdn-prefill-hang-sm100",
        "b200-flashinfer-0.6.13",
        _profile("Qwen3_5MoeForConditionalGeneration", version="0.25.1"),
        "b200-flashinfer-0.6.17",  # FlashInfer past 0.6.14: holds flashinfer PR #3581
        _profile("Qwen3_5MoeForConditionalGeneration", version="0.25.1"),
        warned=True,
    ),
    # #52767 / #52805's shape: a Qwen3.5-family model with its MTP head and tool calling, vLLM 0.27.1.
    Case(
        "spec-decode-xgrammar-livelock",
        "h100",
        _profile(
            "Qwen3_5ForConditionalGeneration",
            version="0.27.1",
            extra_args=[*SPEC, "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"],
        ),
        "h100",
        _profile("Qwen3_5ForConditionalGeneration", version="0.27.1", extra_args=SPEC),  # no tool calling
        warned=True,
    ),
    # Facts: proposed hand-facts/a16-flashinfer-0.6.16.post3.json (one NVIDIA A16 GPU, CC 8.6, vLLM 0.27.1,
    # FlashInfer 0.6.16.post3 stated, as in flashinfer #4544). Near miss: the recorded a100 (108 SMs);
    # FlashInfer is unknown there (0.27.1 has no release table) but the GPU condition already fails, so the
    # verdict is does_not_apply.
    Case(
        "flashinfer-topk-low-sm-hang",
        "a16-flashinfer-0.6.16.post3",
        _profile("Qwen3ForCausalLM", version="0.27.1"),
        "a100",  # 108 SMs: every CTA group can be resident
        _profile("Qwen3ForCausalLM", version="0.27.1"),
        env={"VLLM_USE_FLASHINFER_SAMPLER": "0"},
    ),
    # #51396's shape: DeepSeek-V2-Lite (DeepseekV2ForCausalLM, a default-V2 architecture) on an RTX 5090 with
    # --cpu-offload-gb 12, vLLM 0.25.1. Near miss: the same with serve.model_runner v1
    # (VLLM_USE_V2_MODEL_RUNNER=0).
    Case(
        "v2-runner-cpu-offload-noop",
        "rtx5090",
        _profile("DeepseekV2ForCausalLM", version="0.25.1", extra_args=["--cpu-offload-gb", "12"]),
        "rtx5090",
        _profile(
            "DeepseekV2ForCausalLM",
            version="0.25.1",
            model_runner="v1",
            extra_args=["--cpu-offload-gb", "12"],
        ),  # the V1 runner installs the offloader
        warned=True,
    ),
    # DeepSeek-V4-Flash on 8x H100 (TP 8, FP8 KV as its fp8_ds_mla layout requires), default
    # FULL_AND_PIECEWISE graphs, vLLM 0.27.1. Near miss: the same on 0.28.0, which reverts the adaptive C128A
    # packing (#51318).
    Case(
        "dsv4-c128a-full-graph-stale-rows",
        "h100x8",
        _profile(
            "DeepseekV4ForCausalLM",
            version="0.27.1",
            tensor_parallel_size=8,
            extra_args=["--kv-cache-dtype", "fp8", "--block-size", "256"],
        ),
        "h100x8",
        _profile(
            "DeepseekV4ForCausalLM",
            version="0.28.0",  # fixed_in: the revert is in the 0.28.0 wheel
            tensor_parallel_size=8,
            extra_args=["--kv-cache-dtype", "fp8", "--block-size", "256"],
        ),
        warned=True,
    ),
    # gpt-oss (MXFP4 MoE) on two B200 with --moe-backend flashinfer_cutlass, expert parallelism and DP 2
    # (#42118's shape), vLLM 0.26.0. Near miss: the same without expert parallelism: no all-to-all dispatch,
    # the scales are quantized straight into the swizzled layout (#49335).
    Case(
        "mxfp8-moe-ep-unswizzled-scales",
        "b200-x2",
        _profile("GptOssForCausalLM", version="0.26.0", extra_args=MXFP4_EP_DP),
        "b200-x2",
        _profile(
            "GptOssForCausalLM",
            version="0.26.0",
            extra_args=[w for w in MXFP4_EP_DP if w != "--enable-expert-parallel"],
        ),
        warned=True,
        config=GPT_OSS_MXFP4,
        near_config=GPT_OSS_MXFP4,
    ),
    # #53894's shape: 2 nodes of 8x H100 (recorded h100x8 facts on each node), one TP 16 group across them,
    # vLLM 0.28.0. Near miss: the same deployment on 0.29.0, the first release with #53253's gate (NCCL
    # fallback before the rendezvous).
    Case(
        "cross-node-custom-ar-init-hang",
        "h100x8",
        {
            **_profile("DeepseekV4ForCausalLM", version="0.28.0", tensor_parallel_size=16),
            "deploy": {"nodes": 2},
        },
        "h100x8",
        {
            **_profile("DeepseekV4ForCausalLM", version="0.29.0", tensor_parallel_size=16),
            "deploy": {"nodes": 2},
        },
        warned=True,
    ),
    # #57635's field report: 8x H100, TP 8 + EP 8, an FP8 MoE model, vLLM 0.28.x (nightly 0.28.1rc1). Near
    # miss: the same on 0.33.0, which keeps one autotune file per rank and loads them only when all ranks
    # match.
    Case(
        "flashinfer-autotune-cache-hang",
        "h100x8",
        _profile(
            "Qwen3MoeForCausalLM",
            version="0.28.0",
            tensor_parallel_size=8,
            extra_args=["--enable-expert-parallel"],
        ),
        "h100x8",
        _profile(
            "Qwen3MoeForCausalLM",
            version="0.33.0",
            tensor_parallel_size=8,
            extra_args=["--enable-expert-parallel"],
        ),
        warned=True,
    ),
    # amd/skills #72's shape: openai/gpt-oss-120b (GptOssForCausalLM) on 8x MI350X/MI355X (gfx950) with
    # VLLM_ROCM_USE_AITER=1, vLLM 0.23.0. Near miss: the same on 0.24.0, which carries PR #44893's fix.
    # Facts: tests/fixtures/hand-facts/mi355x-x8.json (platform rocm, gfx950).
    Case(
        "gpt-oss-aiter-moe-gfx950",
        "mi355x-x8",  # hand-written: platform rocm, gfx950
        _with_env(_profile("GptOssForCausalLM", version="0.23.0", tensor_parallel_size=8), AITER),
        "mi355x-x8",
        _with_env(
            _profile("GptOssForCausalLM", version="0.24.0", tensor_parallel_size=8), AITER
        ),  # fixed in 0.24.0
        warned=True,
    ),
]

CASES = [
    *NEW_CASES,
    *ISSUE_47_CASES,
    Case(
        "flashinfer-sm120-mistral3",
        "rtx5090",
        MISTRAL3,
        "h100",  # CC 9.0, not sm_120
        MISTRAL3,
        added=["--attention-backend", "TRITON_ATTN"],
    ),
    Case(
        "custom-allreduce-patched-p2p",
        "rtx3090x2-p2p-patched",
        _profile("Qwen3ForCausalLM", tensor_parallel_size=2),
        "v100pcie-x2-nop2p",  # the driver reports no P2P: vLLM turns custom all-reduce off itself
        _profile("Qwen3ForCausalLM", tensor_parallel_size=2),
        added=["--disable-custom-all-reduce"],
    ),
    Case(
        "flashinfer-sampler-nan",
        "h100",
        _profile("LlamaForCausalLM", version="0.11.0"),
        "h100",
        _profile("LlamaForCausalLM", version="0.11.1"),  # fixed in 0.11.1: stops applying
        env={"VLLM_USE_FLASHINFER_SAMPLER": "0"},
    ),
    Case(
        "nvfp4-fp16-marlin-nan",
        "a100",  # CC 8.0: Marlin runs NVFP4
        {"vllm_version": "0.15.0", "model": {"source": "x"}, "serve": {"dtype": "float16"}},
        "b200",  # CC 10.0: native FP4, no Marlin
        {"vllm_version": "0.15.0", "model": {"source": "x"}, "serve": {"dtype": "float16"}},
        added=["--dtype", "bfloat16"],
        removed=["--dtype", "float16"],
        config=NVFP4,
        near_config=NVFP4,
    ),
    Case(
        "fp8-kv-deepseek-v3",
        "h20",
        _profile("DeepseekV3ForCausalLM", extra_args=["--kv-cache-dtype", "fp8"]),
        "h20",
        _profile("DeepseekV3ForCausalLM"),
        warned=True,
    ),
    Case(
        "fp8-kv-flashinfer-hopper-gemma3",
        "h100",
        _profile(
            "Gemma3ForCausalLM", extra_args=["--attention-backend", "FLASHINFER", "--kv-cache-dtype", "fp8"]
        ),
        "h100",
        _profile(
            "Gemma3ForCausalLM", extra_args=["--attention-backend", "FLASH_ATTN", "--kv-cache-dtype", "fp8"]
        ),
        warned=True,
    ),
    Case(
        "qwen2-fp16-overflow",
        "t4",  # no native BF16: a BF16 checkpoint runs in FP16 under --dtype auto
        _profile("Qwen2ForCausalLM"),
        "a100",
        _profile("Qwen2ForCausalLM"),
        warned=True,
    ),
    Case(
        "gemma3-fp16-zero",
        "t4",
        _profile("Gemma3ForCausalLM", version="0.8.5"),
        "t4",
        _profile("Gemma3ForCausalLM", version="0.9.0"),
        warned=True,
    ),
    Case(
        "gpt-oss-full-cudagraph-triton",
        "h200",
        _profile("GptOssForCausalLM", extra_args=["--attention-backend", "TRITON_ATTN"]),
        "h200",
        _profile("GptOssForCausalLM", enforce_eager=True, extra_args=["--attention-backend", "TRITON_ATTN"]),
        warned=True,
    ),
    Case(
        "hybrid-spec-decode-full-graph",
        "h100",
        _profile("Qwen3NextForCausalLM", extra_args=SPEC),
        "h100",
        _profile("Qwen3NextForCausalLM"),
        warned=True,
    ),
    Case(
        "hybrid-flashinfer-0.4",
        "h100",
        _profile("NemotronHForCausalLM", extra_args=["--attention-backend", "FLASHINFER"]),
        "h100",
        _profile("NemotronHForCausalLM"),
        warned=True,
    ),
    Case(
        "v2-penalty-table",
        "h100",  # vLLM's default --max-num-seqs is 1024 here: 1024 x 128256 int32 is ~500 MiB
        {"model": {"source": "x"}, "serve": {"max_num_seqs": 64}},  # any size (issue 33): 32 MiB
        "h100",
        {"model": {"source": "x"}, "serve": {"model_runner": "v1"}},  # the V1 runner (before 0.34) has none
        warned=True,
        config=LLAMA_VOCAB,
        near_config=LLAMA_VOCAB,
    ),
    Case(
        "fp32-projection",
        "t4",
        _profile("Gemma4UnifiedForConditionalGeneration"),
        "a100",
        _profile("Gemma4UnifiedForConditionalGeneration"),
        fix="fp32_projection",
    ),
    Case(
        "matmul-lora",
        "h100",
        _profile("Qwen3ForCausalLM", lora={"enabled": True}),
        "h100",
        _profile("Qwen3ForCausalLM"),
        fix="matmul_lora",
    ),
    Case(
        "device-penalties",
        "a100",
        {**_profile("LlamaForCausalLM", model_runner="v1"), "workload": {"penalties": True}},
        "a100",
        _profile("LlamaForCausalLM", model_runner="v1"),
        fix="device_penalties",
    ),
]


def test_every_advisory_has_a_case() -> None:
    assert sorted(case.id for case in CASES) == sorted(a.id for a in advisories())


def _outcome(plan: Plan, advisory: str) -> str | None:
    return next((a.outcome for a in plan.advisories if a.id == advisory), None)


def _with_mode(profile: dict[str, Any], advisory: str, mode: str) -> dict[str, Any]:
    return {**profile, "advisories": {advisory: mode}}


def _changed(before: list[str], removed: list[str], added: list[str]) -> list[str]:
    """`before` with the words `removed` (one contiguous run) taken out and `added` appended."""
    if removed:
        at = next(i for i in range(len(before)) if before[i : i + len(removed)] == removed)
        before = before[:at] + before[at + len(removed) :]
    return before + added


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_triggered(case: Case, plan_for: PlanFor) -> None:
    plan = plan_for(case.facts, case.profile, case.config)

    assert not plan.errors
    if case.fix:
        assert _outcome(plan, case.id) == "fixed"
        assert case.fix in plan.enabled_fixes
        assert case.id in plan.applied_advisories
        return
    baseline = plan_for(case.facts, _with_mode(case.profile, case.id, "ignore"), case.config)
    assert _outcome(baseline, case.id) == "ignored"
    assert not any(f"advisory {case.id} " in w for w in baseline.warnings)
    assert plan.argv == _changed(baseline.argv, case.removed, case.added)
    assert {k: v for k, v in plan.env.items() if baseline.env.get(k) != v} == case.env
    warning = [w for w in plan.warnings if w.startswith(f"advisory {case.id} ")]
    if case.warned:
        assert _outcome(plan, case.id) == "warned"
        assert len(warning) == 1
        assert case.id not in plan.applied_advisories
    else:
        assert _outcome(plan, case.id) == "applied"
        assert warning == []
        assert case.id in plan.applied_advisories


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_one_condition_away(case: Case, plan_for: PlanFor) -> None:
    plan = plan_for(case.near_facts, case.near_profile, case.near_config)

    assert _outcome(plan, case.id) is None
    assert not any(w.startswith(f"advisory {case.id} ") for w in plan.warnings)
    verdict = next(v for v in plan.verdicts if v.id == case.id)
    assert verdict.status == "does_not_apply", verdict.why


def _kind(case: Case) -> str:
    return next(a for a in advisories() if a.id == case.id).action.kind


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.warned and _kind(c) == "workaround"], ids=lambda c: c.id
)
def test_a_warned_workaround_applies_when_the_profile_says_apply(case: Case, plan_for: PlanFor) -> None:
    warned = plan_for(case.facts, case.profile, case.config)
    applied = plan_for(case.facts, _with_mode(case.profile, case.id, "apply"), case.config)

    advisory = next(a for a in advisories() if a.id == case.id)
    assert _outcome(applied, case.id) == "applied"
    [warning] = [w for w in warned.warnings if w.startswith(f"advisory {case.id} ")]
    if advisory.action.args:
        assert applied.argv[-len(advisory.action.args) :] == advisory.action.args
        assert applied.argv != warned.argv
        # The warning named the exact change the profile setting makes.
        assert " ".join(advisory.action.args) in warning
    for key, value in advisory.action.env.items():
        assert applied.env[key] == value and warned.env.get(key) != value
        assert f"{key}={value}" in warning


def test_an_applied_workaround_can_be_turned_down_to_a_warning(plan_for: PlanFor) -> None:
    case = next(c for c in CASES if c.id == "flashinfer-sm120-mistral3")
    plan = plan_for(case.facts, _with_mode(case.profile, case.id, "warn"))

    assert _outcome(plan, case.id) == "warned"
    assert "--attention-backend" not in plan.argv
    assert any("--attention-backend TRITON_ATTN" in w for w in plan.warnings)


def test_the_penalty_table_warning_gives_the_mib_for_the_profile(plan_for: PlanFor) -> None:
    plan = plan_for("h100", {"model": {"source": "x"}}, LLAMA_VOCAB)

    [outcome] = [a for a in plan.advisories if a.id == "v2-penalty-table"]
    # 1024 x (128256 + ceil(128256 / 32)) int32 = 516 MiB; a quarter of the sequences gives back 387 MiB.
    assert "reserves 516 MiB per GPU" in outcome.detail
    assert "int32[1024, 128256]" in outcome.detail
    assert "`--max-num-seqs 256` would give back about 387 MiB" in outcome.detail


def test_an_unknown_advisory_id_in_a_profile_is_a_plan_error(plan_for: PlanFor) -> None:
    plan = plan_for("h100", {**_profile("LlamaForCausalLM"), "advisories": {"no-such-thing": "apply"}})

    assert any("advisories.no-such-thing" in e and "deploykit advisories" in e for e in plan.errors)


def test_a_fix_is_set_under_fixes_not_advisories(plan_for: PlanFor) -> None:
    plan = plan_for("t4", {**_profile("LlamaForCausalLM"), "advisories": {"fp32-projection": "ignore"}})

    assert any("fixes:" in e and "fp32_projection" in e for e in plan.errors)


def test_a_fix_turned_off_is_recorded_and_warned_by_the_fix(plan_for: PlanFor) -> None:
    plan = plan_for(
        "t4", {**_profile("Gemma4UnifiedForConditionalGeneration"), "fixes": {"fp32_projection": "off"}}
    )

    assert _outcome(plan, "fp32-projection") == "fix_off"
    assert any("fix fp32_projection is turned off" in w for w in plan.warnings)


def test_a_tensor_group_inside_a_node_is_not_the_cross_node_hang(plan_for: PlanFor) -> None:
    """Pipeline parallelism across two nodes with TP 8 inside each builds no cross-node all-reduce: the
    layout, not the node count, decides (tensor_parallel_spans_nodes)."""
    layout = {"tensor_parallel_size": 8, "pipeline_parallel_size": 2}
    pipeline = {**_profile("DeepseekV4ForCausalLM", version="0.28.0", **layout), "deploy": {"nodes": 2}}
    across = {
        **_profile("DeepseekV4ForCausalLM", version="0.28.0", tensor_parallel_size=16),
        "deploy": {"nodes": 2},
    }
    verdicts = {}
    for name, profile in (("pipeline", pipeline), ("across", across)):
        plan = plan_for("h100x8", profile)
        verdicts[name] = {v.id: v.status for v in plan.verdicts}["cross-node-custom-ar-init-hang"]
    assert verdicts == {"pipeline": "does_not_apply", "across": "applies"}


@pytest.mark.parametrize("flag", ["--cpu-offload-gb", "--tensor-parallel-size", "--max-num-seqs"])
def test_a_numeric_option_that_is_no_number_is_the_parsers_error_not_a_crash(
    plan_for: PlanFor, flag: str
) -> None:
    plan = plan_for("h100", _profile("LlamaForCausalLM", extra_args=[flag, "lots"]))
    assert plan.advisories is not None  # judged, the mistake left to the argv validation's one line
