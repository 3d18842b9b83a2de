"""`deploykit advisories`: the catalog, and every shipped profile on every GPU fixture compared with a table
written by hand; it imports neither torch nor vLLM and stays fast."""

from __future__ import annotations

import json
import time

import pytest

from deploykit.cli.app import app
from deploykit.profile.load import list_profile_paths
from tests.advisories.conftest import FACTS_DIR, HAND_FACTS_DIR
from tests.cli.test_imports import DEPLOYKIT, heavy, imported_modules
from tests.cli_runner import CliRunner

runner = CliRunner()

FACTS = sorted(path.stem for path in FACTS_DIR.glob("*.json"))
PROFILES = sorted(path.stem for path in list_profile_paths(None))
NO_BF16 = {"t4", "rtx2080ti", "v100", "v100pcie", "v100pcie-x2-nop2p"}
HOPPER = {"h100", "h100x8", "h20", "h200"}

# What applies, by hand: (facts, profile) → advisory ids. Every pair not listed: nothing applies.
#   gemma4-turing: a BF16 Gemma4 Unified checkpoint: fp32_projection on GPUs without native BF16.
#   demo-gemma4-fp16: the same model with serve.dtype float16: fp32_projection on every machine.
#   qwen-lora-hopper: LoRA: matmul_lora on Hopper, and on the CPU build (no-gpu: vLLM 0.32.0+cpu), whose
#   LoRA path the fix also corrects (slot -1 read as the last adapter; docs/status.md).
#   penalties-high-concurrency: penalties on the V1 runner it selects: device_penalties on every machine,
#   the CPU build's (which runs V1 too) included.
#   v2-penalty-table (issue 33: every V2 target, with its MiB): the two V2 profiles whose model's vocab is
#   known (gemma4-turing, qwen-lora-hopper) on every CUDA machine; penalties-high-concurrency runs V1.
# No workaround advisory meets a shipped profile: they name no FP8 KV cache, no backend, no speculative
# decoding.
CUDA = {facts for facts in FACTS if facts != "no-gpu"}
EXPECTED: dict[tuple[str, str], set[str]] = {
    **{(facts, "gemma4-turing"): {"v2-penalty-table"} for facts in CUDA},
    **{(facts, "gemma4-turing"): {"fp32-projection", "v2-penalty-table"} for facts in NO_BF16},
    **{(facts, "qwen-lora-hopper"): {"v2-penalty-table"} for facts in CUDA},
    **{(facts, "qwen-lora-hopper"): {"matmul-lora", "v2-penalty-table"} for facts in HOPPER},
    ("no-gpu", "qwen-lora-hopper"): {"matmul-lora"},
    **{(facts, "demo-gemma4-fp16"): {"fp32-projection"} for facts in FACTS},
    **{(facts, "penalties-high-concurrency"): {"device-penalties"} for facts in FACTS},
}


def _run(*args: str) -> list[dict[str, object]]:
    result = runner.invoke(app, ["advisories", *args, "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert isinstance(rows, list)
    return rows


def test_the_fixture_set_is_the_nine_gpus_and_the_added_machines() -> None:
    assert {"t4", "rtx2080ti", "v100", "a100", "l4", "h100", "h20", "h200", "b200"} <= set(FACTS)
    assert {"rtx5090", "rtx3090x2-p2p-patched", "v100pcie-x2-nop2p"} <= set(FACTS)
    assert PROFILES == [
        "demo-cpu",
        "demo-gemma4-fp16",
        "gemma4-turing",
        "penalties-high-concurrency",
        "qwen-lora-hopper",
        "smollm2-cpu",
    ]


@pytest.mark.parametrize("facts", FACTS)
def test_every_shipped_profile_on_every_machine(facts: str) -> None:
    for profile in PROFILES:
        rows = _run("--facts", str(FACTS_DIR / f"{facts}.json"), "--profile", profile)

        assert len(rows) >= 13
        applies = {row["id"] for row in rows if row["status"] == "applies"}
        assert applies == EXPECTED.get((facts, profile), set()), (facts, profile)
        for row in rows:
            assert row["why"], row
            if row["status"] == "applies":
                assert row["outcome"] in {"applied", "warned", "fixed", "fix_off", "in_place", "ignored"}


def test_the_catalog_alone_probes_nothing() -> None:
    rows = _run()

    assert {row["id"] for row in rows} >= {"custom-allreduce-patched-p2p", "flashinfer-sm120-mistral3"}
    assert all(row["references"] and row["vllm"]["evidence"] for row in rows)


def test_facts_alone_leave_profile_conditions_unknown() -> None:
    rows = {row["id"]: row for row in _run("--facts", str(FACTS_DIR / "rtx5090.json"))}

    sm120 = rows["flashinfer-sm120-mistral3"]
    assert sm120["status"] == "unknown"
    assert "architectures: unknown" in sm120["why"]
    assert rows["fp8-kv-deepseek-v3"]["status"] == "does_not_apply"  # not Hopper: the machine decides
    assert "gpu_arch" in rows["fp8-kv-deepseek-v3"]["why"]


def test_the_table_for_people() -> None:
    result = runner.invoke(
        app, ["advisories", "--facts", str(FACTS_DIR / "h100.json"), "-p", "qwen-lora-hopper"]
    )

    assert result.exit_code == 0, result.output
    assert "matmul-lora" in result.stdout and "applies" in result.stdout


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--facts", str(FACTS_DIR / "h100.json")],
        ["--facts", str(FACTS_DIR / "h100.json"), "-p", "qwen-lora-hopper"],
        ["hybrid-mtp-prefix-cache-async"],
        ["rocm-aiter-custom-ar-gfx942", "--facts", str(HAND_FACTS_DIR / "mi325x-x8.json")],
    ],
    ids=["catalog", "facts", "facts+profile", "one", "one+facts"],
)
def test_piped_output_fits_80_columns(args: list[str]) -> None:
    """Issue 35: the catalog table was 175 columns wide when piped."""
    result = runner.invoke(app, ["advisories", *args])

    assert result.exit_code == 0, result.output
    assert _widest(result.stdout) <= 80, result.stdout
    # nothing is cut: every id appears whole in the lists
    if not args or args[0].startswith("--"):
        for advisory in _run():
            assert str(advisory["id"]) in result.stdout


def test_one_advisory_in_full() -> None:
    result = runner.invoke(app, ["advisories", "batch-invariant-co-resident"])

    assert result.exit_code == 0, result.output
    assert "https://github.com/vllm-project/vllm/issues/51187" in result.stdout
    assert "env VLLM_BATCH_INVARIANT=1" in result.stdout and "max_num_seqs >= 9" in result.stdout
    as_json = json.loads(
        runner.invoke(app, ["advisories", "batch-invariant-co-resident", "-f", "json"]).stdout
    )
    assert as_json["id"] == "batch-invariant-co-resident" and as_json["references"][0]["number"] == 51187


def test_an_unknown_id_is_one_line() -> None:
    result = runner.invoke(app, ["advisories", "no-such-advisory"])

    assert result.exit_code == 2
    assert "no advisory has the id 'no-such-advisory'" in result.output


def test_advisories_imports_neither_torch_nor_vllm_and_is_fast() -> None:
    argv = [
        str(DEPLOYKIT),
        "advisories",
        "--facts",
        str(FACTS_DIR / "h100.json"),
        "-p",
        "qwen-lora-hopper",
        "-f",
        "json",
    ]
    start = time.monotonic()
    modules, result = imported_modules(argv)
    elapsed = time.monotonic() - start

    assert result.returncode == 0, result.stderr[-2000:]
    assert "deploykit.advisories.evaluate" in modules
    assert heavy(modules) == set()
    assert elapsed < 5.0  # ~0.8 s here when the machine is idle; the bound allows for a loaded CI box
