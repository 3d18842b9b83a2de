"""Plans: each fix rule against real GPU facts, the launch it writes, and vLLM's own parser on it."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from deploykit import __version__
from deploykit.fixes.base import Decision
from deploykit.plan import Plan, make_plan, validate_plan
from deploykit.probe.facts import ProbeFacts
from deploykit.profile.load import load_profile, parse_profile
from deploykit.profile.schema import FixMode, LoadedProfile
from deploykit.vllm_compat import TESTED_VLLM
from tests.cli_process import run_deploykit
from tests.vllm_releases.releases import NEXT_RELEASE

REPO = Path(__file__).resolve().parents[2]
FACTS_DIR = REPO / "tests" / "fixtures" / "facts"
TESTED_IN = f"this deploykit {__version__} is tested with ({TESTED_VLLM})"
UNPROVEN = "the fixes and launch flags are unproven there"


def facts(gpu: str, vllm_version: str = "0.33.0") -> ProbeFacts:
    """Saved probe facts of a real GPU model (tests/fixtures/facts), as if the target ran `vllm_version`."""
    loaded = ProbeFacts.model_validate_json((FACTS_DIR / f"{gpu}.json").read_text())
    return loaded.model_copy(update={"vllm_version": vllm_version})


def plan_for(profile: str, gpu: str, vllm_version: str = "0.33.0", **overrides: FixMode) -> Plan:
    return make_plan(load_profile(profile), facts(gpu, vllm_version), overrides)


def decision(plan: Plan, name: str) -> tuple[Decision, str]:
    found = next(f for f in plan.fixes if f.name == name)
    return found.decision, found.reason


@pytest.mark.parametrize("gpu", ["t4", "rtx2080ti", "v100"])
def test_fp32_projection_enabled_without_native_bf16(gpu: str) -> None:
    plan = plan_for("gemma4-turing", gpu)
    verdict, reason = decision(plan, "fp32_projection")
    assert verdict is Decision.ENABLED
    assert plan.facts.gpus[0].compute_capability in reason and "bfloat16" in reason
    assert plan.env["DEPLOYKIT_FIXES"] == "fp32_projection"


@pytest.mark.parametrize("gpu", ["a100", "h100", "l4"])
def test_fp32_projection_not_needed_with_native_bf16(gpu: str) -> None:
    plan = plan_for("gemma4-turing", gpu)
    verdict, reason = decision(plan, "fp32_projection")
    assert verdict is Decision.NOT_NEEDED
    assert "native BF16" in reason
    assert "DEPLOYKIT_FIXES" not in plan.env


def gemma4_with(tmp_path: Path, serve_dtype: str, config: dict[str, object] | None = None) -> LoadedProfile:
    """gemma4-turing with `serve.dtype`; with `config`, a local checkpoint folder holding that config.json
    instead of the profile's stated checkpoint dtype."""
    text = (REPO / "profiles" / "gemma4-turing.yaml").read_text()
    text = text.replace("  max_model_len: 8192", f"  dtype: {serve_dtype}\n  max_model_len: 8192")
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
        text = text.replace("google/gemma-4-12b-it-qat-w4a16-ct", str(tmp_path))
        text = text.replace("  checkpoint_dtype: bfloat16\n", "")
    path = tmp_path / "gemma4.yaml"
    path.write_text(text)
    return load_profile(str(path))


@pytest.mark.parametrize("gpu", ["t4", "v100", "a100", "l4", "h100", "b200"])
def test_fp32_projection_follows_fp16_compute_on_any_gpu(gpu: str, tmp_path: Path) -> None:
    """Issue 35: `serve.dtype: float16` computes in FP16 whatever the GPU; the reason names the dtype and
    where it came from."""
    plan = make_plan(gemma4_with(tmp_path, "float16"), facts(gpu))
    verdict, reason = decision(plan, "fp32_projection")
    assert verdict is Decision.ENABLED, reason
    assert reason.startswith("float16 compute (serve.dtype float16 (--dtype float16))")
    assert plan.env["DEPLOYKIT_FIXES"] == "fp32_projection"
    assert plan.argv[plan.argv.index("--dtype") + 1] == "float16"
    outcome = next(a for a in plan.advisories if a.id == "fp32-projection")
    assert outcome.outcome == "fixed"


@pytest.mark.parametrize("gpu", ["a100", "h100"])
def test_fp32_projection_not_needed_for_bf16_compute(gpu: str, tmp_path: Path) -> None:
    for serve_dtype in ("bfloat16", "auto"):
        verdict, reason = decision(
            make_plan(gemma4_with(tmp_path, serve_dtype), facts(gpu)), "fp32_projection"
        )
        assert verdict is Decision.NOT_NEEDED
        assert reason.startswith("bfloat16 compute (") and "no FP16 arithmetic" in reason


def test_fp32_projection_float32_compute_is_not_needed_even_without_bf16(tmp_path: Path) -> None:
    verdict, reason = decision(make_plan(gemma4_with(tmp_path, "float32"), facts("t4")), "fp32_projection")
    assert verdict is Decision.NOT_NEEDED
    assert reason.startswith("float32 compute (serve.dtype float32")


def test_fp32_projection_for_an_fp16_checkpoint_under_auto_on_hopper(tmp_path: Path) -> None:
    """An AWQ export saved in float16 (#40290): `auto` keeps float16 on an H100, read from config.json."""
    config = {
        "architectures": ["Gemma4UnifiedForConditionalGeneration"],
        "model_type": "gemma4_unified",
        "torch_dtype": "float16",
        "quantization_config": {"quant_method": "awq", "bits": 4},
    }
    plan = make_plan(gemma4_with(tmp_path, "auto", config), facts("h100"))
    verdict, reason = decision(plan, "fp32_projection")
    assert verdict is Decision.ENABLED
    assert "auto keeps the float16 checkpoint (config.json)" in reason
    assert "NVIDIA H100" in reason and "native BF16" in reason


def test_fp32_projection_names_vllms_fallback_on_turing(tmp_path: Path) -> None:
    verdict, reason = decision(make_plan(gemma4_with(tmp_path, "auto"), facts("t4")), "fp32_projection")
    assert verdict is Decision.ENABLED
    assert "vLLM's fallback" in reason and "(CC 7.5) has no native BF16" in reason
    assert "bfloat16 checkpoint (model.checkpoint_dtype) in float16" in reason


def test_fp32_projection_with_a_bf16_only_quantization_in_fp16_is_refused_not_fixed(tmp_path: Path) -> None:
    config = {
        "architectures": ["Gemma4UnifiedForConditionalGeneration"],
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "mxfp4"},
    }
    verdict, reason = decision(
        make_plan(gemma4_with(tmp_path, "float16", config), facts("h100")), "fp32_projection"
    )
    assert verdict is Decision.NOT_NEEDED
    assert "vLLM refuses float16 for quantization mxfp4" in reason


@pytest.mark.parametrize("gpu", ["h20", "h100", "h200"])
def test_matmul_lora_enabled_on_hopper(gpu: str) -> None:
    plan = plan_for("qwen-lora-hopper", gpu)
    verdict, reason = decision(plan, "matmul_lora")
    assert verdict is Decision.ENABLED
    assert "Hopper" in reason and "9.0" in reason
    assert "--enable-lora" in plan.argv


@pytest.mark.parametrize("gpu", ["t4", "a100", "b200"])
def test_matmul_lora_not_needed_off_hopper(gpu: str) -> None:
    verdict, reason = decision(plan_for("qwen-lora-hopper", gpu), "matmul_lora")
    assert verdict is Decision.NOT_NEEDED
    assert "not Hopper" in reason


def test_matmul_lora_forced_on_without_lora_is_an_error() -> None:
    plan = plan_for("gemma4-turing", "h100", matmul_lora=FixMode.ON)
    assert decision(plan, "matmul_lora")[0] is Decision.IMPOSSIBLE
    assert any("matmul_lora is forced on" in e for e in plan.errors)


def _penalties_profile(runner: str) -> LoadedProfile:
    loaded = load_profile("penalties-high-concurrency")
    profile = loaded.profile.model_copy(deep=True)
    profile.serve.model_runner = runner  # type: ignore[assignment]
    profile.vllm_version = None  # the shipped profile targets 0.33 on purpose; here the facts decide
    return LoadedProfile(profile=profile, path=loaded.path)


@pytest.mark.parametrize(
    ("vllm_version", "runner", "expected"),
    [
        ("0.24.1", "auto", Decision.ENABLED),  # V1 runner by default before 0.25
        ("0.33.0", "auto", Decision.NOT_NEEDED),  # V2 runner by default: penalties already on the device
        ("0.33.0", "v1", Decision.ENABLED),  # the profile pins V1: the plan says so
        ("0.32.0+cpu", "auto", Decision.ENABLED),  # the CPU build has no Triton: V1 runner
    ],
)
def test_device_penalties_follows_the_target_vllm(vllm_version: str, runner: str, expected: Decision) -> None:
    plan = make_plan(_penalties_profile(runner), facts("a100", vllm_version))
    verdict, reason = decision(plan, "device_penalties")
    assert verdict is expected, reason
    assert vllm_version in reason
    has_processor = "--logits-processors" in plan.argv
    assert has_processor is (expected is Decision.ENABLED)
    if runner == "v1":
        assert plan.env["VLLM_USE_V2_MODEL_RUNNER"] == "0"
        assert any("V1 model runner" in w for w in plan.warnings)


@pytest.mark.parametrize("vllm_version", ["0.34.0", NEXT_RELEASE])
def test_vllm_034_has_no_v1_runner_and_device_penalties_is_obsolete(vllm_version: str) -> None:
    """Issue 33: from 0.34 the V2 runner everywhere; the fix stands aside naming 0.34; no runner variable."""
    plan = make_plan(_penalties_profile("auto"), facts("h100", vllm_version))
    verdict, reason = decision(plan, "device_penalties")
    assert verdict is Decision.NOT_NEEDED and reason.startswith("obsolete from vLLM 0.34.0:"), reason
    assert plan.model_runner == "v2" and plan.errors == []
    assert "VLLM_USE_V2_MODEL_RUNNER" not in plan.env and "--logits-processors" not in plan.argv
    assert not any("V1" in w and "selects" in w for w in plan.warnings)
    cpu = make_plan(load_profile("demo-cpu"), facts("no-gpu", f"{vllm_version}+cpu"))
    assert cpu.model_runner == "v2"  # on every platform
    v2 = make_plan(_penalties_profile("v2"), facts("h100", vllm_version))
    assert "VLLM_USE_V2_MODEL_RUNNER" not in v2.env  # =1 is redundant there (vLLM warns)
    forced = make_plan(
        _penalties_profile("auto"), facts("h100", vllm_version), {"device_penalties": FixMode.ON}
    )
    assert any(
        "device_penalties is forced on" in e and "obsolete from vLLM 0.34.0" in e for e in forced.errors
    )


def test_a_v1_profile_on_vllm_034_is_one_clear_error(tmp_path: Path) -> None:
    """The shipped penalties profile asks for V1; for a 0.34 host: one line naming 0.34, exit 2, no =0."""
    plan = make_plan(_penalties_profile("v1"), facts("h100", "0.34.0"))
    [error] = [e for e in plan.errors if "model_runner" in e]
    assert "removed in vLLM 0.34.0" in error and "VLLM_USE_V2_MODEL_RUNNER" not in plan.env
    loaded = load_profile("penalties-high-concurrency")
    path = tmp_path / "v1-on-034.yaml"
    text = loaded.path.read_text().replace('vllm_version: "0.33.0"', 'vllm_version: "0.34.0"')
    path.write_text(text)
    done = _deploykit("plan", "-p", str(path), "--facts", str(FACTS_DIR / "h100.json"), "--no-validate")
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in (done.stdout + done.stderr).splitlines() if "error:" in line]
    assert len([e for e in errors if "removed in vLLM 0.34.0" in e]) == 1, errors
    assert "VLLM_USE_V2_MODEL_RUNNER=0" not in done.stdout


def test_a_target_newer_than_any_known_release_says_what_is_not_known() -> None:
    """Issue 33: the next release: the fixes never checked on it named, the newest table used and said,
    no variable a known release removed written."""
    plan = make_plan(load_profile("qwen-lora-hopper"), facts("h100", NEXT_RELEASE))
    [unknown] = [w for w in plan.warnings if "newer than every release" in w]
    assert "matmul_lora (enabled)" in unknown and "fp32_projection" in unknown
    assert "device_penalties" not in unknown  # obsolete from 0.34: known gone, not unchecked
    validate_plan(plan)
    assert plan.validation is not None and plan.validation.status == "ok"
    assert any(f"not against vLLM {NEXT_RELEASE}'s own parser" in w for w in plan.warnings)
    assert "VLLM_USE_V2_MODEL_RUNNER" not in plan.env


def test_a_variable_the_target_no_longer_defines_is_refused(tmp_path: Path) -> None:
    """The profile's own env naming VLLM_USE_V2_MODEL_RUNNER, for a release that dropped it (issue 47: an
    error, was a warning): said, by name, field and release; deploykit itself never writes it there, and a
    target before the removal plans it as before. tests/profile/test_removed_names.py has the rest."""
    loaded = load_profile("demo-cpu")
    profile = loaded.profile.model_copy(update={"env": {"VLLM_USE_V2_MODEL_RUNNER": "1"}})
    plan = make_plan(LoadedProfile(profile, tmp_path / "p.yaml"), facts("no-gpu", "0.34.0+cpu"))
    [error] = [e for e in plan.errors if "env.VLLM_USE_V2_MODEL_RUNNER" in e]
    assert error.startswith(f"{tmp_path / 'p.yaml'}: env.VLLM_USE_V2_MODEL_RUNNER: vLLM 0.34.0+cpu no longer")
    assert "vLLM 0.34.0 removed it" in error
    assert not [w for w in plan.warnings if "VLLM_USE_V2_MODEL_RUNNER" in w]
    older = make_plan(LoadedProfile(profile, tmp_path / "p.yaml"), facts("no-gpu", "0.33.0+cpu"))
    assert not [m for m in older.errors + older.warnings if "VLLM_USE_V2_MODEL_RUNNER" in m]


def test_device_penalties_forced_on_a_v2_runner_is_refused() -> None:
    plan = make_plan(_penalties_profile("auto"), facts("a100", "0.33.0"), {"device_penalties": FixMode.ON})
    assert any("rejects V1-interface logits processors" in e for e in plan.errors)
    assert "--logits-processors" not in plan.argv


def test_off_disables_a_fix_that_auto_would_enable() -> None:
    plan = plan_for("gemma4-turing", "t4", fp32_projection=FixMode.OFF)
    assert decision(plan, "fp32_projection") == (Decision.NOT_NEEDED, "turned off by the profile")


def test_requirements_are_checked_against_the_gpu() -> None:
    assert plan_for("qwen-lora-hopper", "h100").requires.status == "compatible"
    incompatible = plan_for("qwen-lora-hopper", "t4").requires
    assert incompatible.status == "incompatible"
    assert any("turing not in hopper" in p for p in incompatible.problems)
    assert any("MiB" in p for p in incompatible.problems)


def test_shell_output_round_trips_through_shlex() -> None:
    plan = plan_for("qwen-lora-hopper", "h20")
    words = shlex.split(plan.shell())
    assert words[len(plan.env) :] == plan.argv
    assert [w.split("=", 1)[0] for w in words[: len(plan.env)]] == list(plan.env)


def test_awkward_argv_values_survive_shell_quoting(tmp_path: Path) -> None:
    text = (
        "name: quoting\nmodel:\n  source: \"/models/it's here/$HOME\"\n  served_name: 'a b'\n"
        "serve:\n  extra_args: ['--chat-template', '{{ x }} \"q\" ; rm -rf /']\n"
        'env:\n  NOTE: "two words; $(whoami)"\n'
    )
    loaded = LoadedProfile(profile=parse_profile(text), path=tmp_path / "q.yaml")
    plan = make_plan(loaded, facts("a100"))
    words = shlex.split(plan.shell())
    assert words[len(plan.env) :] == plan.argv
    assert words[0] == "NOTE=two words; $(whoami)"


def test_secrets_are_references_never_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_SECRET_VALUE_123")
    monkeypatch.setenv("DEPLOYKIT_API_KEY", "sk-SECRET-456")
    plan = plan_for("gemma4-turing", "t4")
    dumped = plan.model_dump_json() + plan.shell()
    assert "hf_SECRET_VALUE_123" not in dumped and "sk-SECRET-456" not in dumped
    assert plan.env["HF_TOKEN"] == "${HF_TOKEN}"
    assert plan.secret_env == {"HF_TOKEN": "HF_TOKEN", "VLLM_API_KEY": "DEPLOYKIT_API_KEY"}
    assert "--api-key" not in plan.argv


def test_extra_args_may_not_repeat_a_typed_setting(tmp_path: Path) -> None:
    text = (
        "name: x\nmodel: {source: /m}\nserve:\n  extra_args: ['--max-model-len', '4096', '--api-key=abc']\n"
    )
    plan = make_plan(LoadedProfile(parse_profile(text), tmp_path / "x.yaml"), facts("a100"))
    assert any("serve.max_model_len" in e for e in plan.errors)
    assert any("secrets never go in argv" in e for e in plan.errors)


@pytest.mark.parametrize(
    ("extra", "written"),
    [
        (["--max_num_seqs", "8"], " (written --max_num_seqs)"),
        (["--max_num_seqs=8"], " (written --max_num_seqs)"),
        (["--max-num-seqs=8"], ""),
        (["--max-num-seq", "8"], " (written --max-num-seq)"),
    ],
)
def test_an_owned_flag_is_refused_in_any_spelling_vllm_reads(
    tmp_path: Path, extra: list[str], written: str
) -> None:
    """The underscore bypass (issue 36): vLLM reads `--max_num_seqs` as `--max-num-seqs`, which the profile
    owns (`serve.max_num_seqs`), so the plan refuses it with one line naming the flag."""
    text = f"name: x\nmodel: {{source: /m}}\nserve:\n  max_num_seqs: 4\n  extra_args: {json.dumps(extra)}\n"
    plan = make_plan(LoadedProfile(parse_profile(text), tmp_path / "x.yaml"), facts("a100"))
    assert plan.errors == [
        f"serve.extra_args sets --max-num-seqs{written}; use the profile field `serve.max_num_seqs` instead"
    ]


def test_a_secret_flag_is_refused_in_any_spelling(tmp_path: Path) -> None:
    text = "name: x\nmodel: {source: /m}\nserve:\n  extra_args: ['--hf_token=abc']\n"
    plan = make_plan(LoadedProfile(parse_profile(text), tmp_path / "x.yaml"), facts("a100"))
    assert plan.errors == ["serve.extra_args must not carry --hf-token: secrets never go in argv"]


def test_json_plan_has_the_documented_keys() -> None:
    data = json.loads(plan_for("gemma4-turing", "rtx2080ti").model_dump_json())
    for key in ("profile", "facts", "fixes", "argv", "env", "warnings"):
        assert key in data
    assert set(data["profile"]) >= {"name", "id"}
    assert all(set(f) >= {"name", "decision", "reason"} for f in data["fixes"])


def test_real_vllm_parser_accepts_the_demo_and_rejects_a_bogus_flag(tmp_path: Path) -> None:
    """vLLM's own parser (the CPU build installed here) checks the argv; an unknown flag is named."""
    good = make_plan(load_profile("demo-cpu"), ProbeFacts(vllm_version="0.32.0+cpu"))
    validate_plan(good)
    assert good.validation.status == "ok", good.validation.detail
    text = "name: x\nplatform: cpu\nmodel: {source: /m}\nserve:\n  extra_args: ['--no-such-flag', '3']\n"
    cpu_facts = ProbeFacts(vllm_version="0.32.0+cpu")
    bad = make_plan(LoadedProfile(parse_profile(text), tmp_path / "x.yaml"), cpu_facts)
    validate_plan(bad)
    assert bad.validation.status == "error"
    assert "--no-such-flag" in bad.validation.detail
    assert any("--no-such-flag" in e for e in bad.errors)


def _deploykit(*args: str) -> subprocess.CompletedProcess[str]:
    return run_deploykit(args)


def test_cli_plan_with_saved_facts_from_any_directory(tmp_path: Path) -> None:
    t4 = str(FACTS_DIR / "t4.json")
    result = _deploykit("plan", "--profile", "gemma4-turing", "--facts", t4, "--no-validate", "-f", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["env"]["DEPLOYKIT_FIXES"] == "fp32_projection"


def test_cli_plan_fix_override_and_error_exit() -> None:
    result = _deploykit("plan", "-p", "demo-cpu", "--fix", "matmul_lora=on", "--no-validate", "-f", "json")
    assert result.returncode == 2
    assert "matmul_lora is forced on" in result.stderr
    bad = _deploykit("plan", "-p", "demo-cpu", "--fix", "nonsense=on", "--no-validate")
    assert bad.returncode == 2 and "NAME=on|off|auto" in bad.stderr


def test_cli_plan_broken_profile_lists_located_errors(tmp_path: Path) -> None:
    path = tmp_path / "b.yaml"
    path.write_text("name: b\nmodel: {source: /m}\nserve:\n  port: -1\n  dtyp: half\n")
    result = _deploykit("plan", "-p", str(path), "--no-validate")
    assert result.returncode == 2
    assert f"{path}:4:9: serve.port:" in result.stderr
    assert f"{path}:5:3: serve.dtyp: unknown key" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_profiles_list_judges_each_profile() -> None:
    result = _deploykit("profiles", "list", "--facts", str(FACTS_DIR / "t4.json"), "-f", "json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["gemma4-turing"]["status"] in ("compatible", "compatible_with_warnings")
    assert rows["gemma4-turing"]["enabled_fixes"] == ["fp32_projection"]
    assert rows["qwen-lora-hopper"]["status"] == "incompatible"
    # t4.json's vLLM 0.33.0 is inside the tested range (issue 25): nothing to warn the CPU demo about
    assert rows["demo-cpu"]["status"] == "compatible"
    assert not any(TESTED_IN in r for r in rows["demo-cpu"]["reasons"])


def test_matmul_lora_on_the_cpu_build_and_refused_with_fully_sharded_loras(tmp_path: Path) -> None:
    cpu = "name: x\nplatform: cpu\nmodel: {source: /m}\nserve:\n  lora: {enabled: true}\n"
    plan = make_plan(
        LoadedProfile(parse_profile(cpu), tmp_path / "x.yaml"), ProbeFacts(vllm_version="0.32.0+cpu")
    )
    verdict, reason = decision(plan, "matmul_lora")
    assert verdict is Decision.ENABLED and "last adapter" in reason
    profile = load_profile("qwen-lora-hopper").profile.model_copy(deep=True)
    profile.serve.extra_args = ["--fully-sharded-loras"]
    sharded = make_plan(
        LoadedProfile(profile, tmp_path / "q.yaml"), facts("h100"), {"matmul_lora": FixMode.ON}
    )
    assert decision(sharded, "matmul_lora")[0] is Decision.IMPOSSIBLE
    assert any("matmul_lora is forced on" in e for e in sharded.errors)


def test_gpus_in_the_facts_with_a_cpu_build_of_vllm_warn_that_they_go_unused() -> None:
    plan = make_plan(load_profile("demo-cpu"), facts("t4", vllm_version="0.32.0+cpu"))
    assert any("GPUs would go unused" in w for w in plan.warnings)
    assert not any("unused" in w for w in make_plan(load_profile("demo-cpu"), facts("t4")).warnings)


def version_warnings(plan: Plan) -> list[str]:
    """The plan's warnings about the vLLM version it targets (outside the tested range, or unknown)."""
    return [w for w in plan.warnings if TESTED_IN in w]


@pytest.mark.parametrize(
    ("profile", "gpu", "vllm_version", "inside"),
    [
        ("gemma4-turing", "t4", "0.32.0", True),
        ("gemma4-turing", "t4", "0.32.7", True),
        ("demo-cpu", "no-gpu", "0.32.0+cpu", True),  # the CPU build this suite runs: +cpu is no matter
        ("gemma4-turing", "t4", "0.33.0", True),  # issue 25: 0.33 is tested (tests/vllm_releases)
        ("gemma4-turing", "t4", "0.34.0", True),  # issue 33: 0.34 too
        ("gemma4-turing", "t4", "0.31.4", False),  # below
        ("gemma4-turing", "t4", NEXT_RELEASE, False),  # above: the next release is not proven yet
        ("gemma4-turing", "t4", NEXT_RELEASE + "rc1", False),  # nor its release candidate
        ("demo-cpu", "no-gpu", NEXT_RELEASE + "+cpu", False),
    ],
)
def test_plan_warns_when_the_target_vllm_is_outside_the_tested_range(
    profile: str, gpu: str, vllm_version: str, inside: bool
) -> None:
    plan = make_plan(load_profile(profile), facts(gpu, vllm_version))
    assert plan.vllm_version == vllm_version
    if inside:
        assert version_warnings(plan) == []
    else:
        [warning] = version_warnings(plan)
        assert warning.startswith(f"vLLM {vllm_version} is outside the range {TESTED_IN}; {UNPROVEN}")
    assert not any(TESTED_IN in e for e in plan.errors)  # a warning, never an error


def test_the_profiles_vllm_version_is_the_target_before_the_facts(tmp_path: Path) -> None:
    loaded = load_profile("demo-cpu")
    pinned = LoadedProfile(
        loaded.profile.model_copy(update={"vllm_version": "0.32.1+cpu"}), tmp_path / "p.yaml"
    )
    plan = make_plan(pinned, facts("no-gpu", "0.33.0+cpu"))
    assert plan.vllm_version == "0.32.1+cpu" and version_warnings(plan) == []
    outside = LoadedProfile(
        loaded.profile.model_copy(update={"vllm_version": NEXT_RELEASE}), tmp_path / "p.yaml"
    )
    plan = make_plan(outside, facts("no-gpu", "0.32.0+cpu"))
    assert [w[: w.index(";")] for w in version_warnings(plan)] == [
        f"vLLM {NEXT_RELEASE} is outside the range {TESTED_IN}"
    ]


@pytest.mark.parametrize(
    ("vllm_version", "said"),
    [(None, "unknown (no vllm_version in the profile or the facts)"), ("main", "'main', not a version")],
)
def test_an_unknown_target_vllm_version_is_one_warning(vllm_version: str | None, said: str) -> None:
    """From the profile: a facts file's vllm_version is always a version (probe/facts.py, issue 43)."""
    loaded = load_profile("demo-cpu")
    pinned = LoadedProfile(loaded.profile.model_copy(update={"vllm_version": vllm_version}), loaded.path)
    plan = make_plan(pinned, ProbeFacts())
    assert plan.vllm_version == vllm_version and plan.errors == []
    [warning] = version_warnings(plan)
    assert warning.startswith(f"the target vLLM version is {said}")
    assert "set the profile's vllm_version" in warning
    assert [w for w in plan.warnings if "vLLM" in w and "version" in w] == [warning]  # said once


def test_cli_plan_warns_about_an_untested_vllm_in_json_and_text(tmp_path: Path) -> None:
    """Through the real command: t4.json's facts with the next vLLM, outside the range; a warning, exit 0."""
    t4_path = tmp_path / "t4-next.json"
    t4_path.write_text(facts("t4", NEXT_RELEASE).model_dump_json())
    t4 = str(t4_path)
    as_json = _deploykit("plan", "-p", "gemma4-turing", "--facts", t4, "--no-validate", "-f", "json")
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["vllm_version"] == NEXT_RELEASE
    expected = f"vLLM {NEXT_RELEASE} is outside the range {TESTED_IN}; {UNPROVEN}"
    assert [w for w in data["warnings"] if w.startswith(expected)] == [data["warnings"][0]]
    as_text = _deploykit("plan", "-p", "gemma4-turing", "--facts", t4, "--no-validate")
    assert as_text.returncode == 0, as_text.stderr
    assert f"warning: {data['warnings'][0]}" in as_text.stdout.splitlines()  # one whole line
    as_shell = _deploykit("plan", "-p", "gemma4-turing", "--facts", t4, "--no-validate", "-f", "shell")
    assert as_shell.returncode == 0, as_shell.stderr
    assert f"deploykit plan: warning: {data['warnings'][0]}" in as_shell.stderr.splitlines()
    assert "warning" not in as_shell.stdout  # stdout stays a runnable script
    inside = str(FACTS_DIR / "no-gpu.json")  # vLLM 0.32.0+cpu
    quiet = _deploykit("plan", "-p", "demo-cpu", "--facts", inside, "--no-validate", "-f", "json")
    assert quiet.returncode == 0, quiet.stderr
    assert not any(TESTED_IN in w for w in json.loads(quiet.stdout)["warnings"])


def test_a_plan_validated_with_another_release_says_so() -> None:
    """The argv is checked with the installed vLLM's parser: a plan for a host running another release is
    told so; the CPU build of the same release is the same release."""
    from deploykit.plan import validated_elsewhere_warning

    warning = validated_elsewhere_warning("0.33.0", "0.32.0+cpu")
    assert warning is not None and "installed vLLM 0.32.0+cpu's parser, not with the vLLM 0.33.0" in warning
    assert validated_elsewhere_warning("0.32.0", "0.32.0+cpu") is None
    assert validated_elsewhere_warning(None, "0.32.0+cpu") is None
