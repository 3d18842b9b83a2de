"""Issue 33: the two penalties advisories on vLLM 0.34, which removed the V1 model runner."""

from __future__ import annotations

import json
from pathlib import Path

from deploykit.advisories.catalog import advisories
from deploykit.advisories.evaluate import judge
from deploykit.advisories.facts import DeploymentFacts
from deploykit.advisories.notes import note_text
from deploykit.cli.app import app
from deploykit.probe.facts import ProbeFacts
from tests.cli_runner import CliRunner

FACTS_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "facts"


def rows(tmp_path: Path, vllm_version: str, *profile: str) -> dict[str, dict[str, object]]:
    facts = ProbeFacts.model_validate_json((FACTS_DIR / "h100.json").read_text())
    path = tmp_path / f"h100-{vllm_version}.json"
    path.write_text(facts.model_copy(update={"vllm_version": vllm_version}).model_dump_json())
    result = CliRunner().invoke(app, ["advisories", "--facts", str(path), *profile, "--format", "json"])
    assert result.exit_code == 0, result.output
    return {row["id"]: row for row in json.loads(result.stdout)}


def test_on_034_device_penalties_is_obsolete_and_the_v2_table_applies(tmp_path: Path) -> None:
    machine = rows(tmp_path, "0.34.0")
    assert machine["device-penalties"]["status"] == "does_not_apply"
    assert "fixed in 0.34.0" in str(machine["device-penalties"]["why"])
    assert machine["v2-penalty-table"]["status"] == "applies"  # the only runner there is V2
    planned = rows(tmp_path, "0.34.0", "--profile", "gemma4-turing")
    table = planned["v2-penalty-table"]
    assert table["status"] == "applies" and table["outcome"] == "warned"

    # with the sizes known, any size: 64 sequences of Llama-3's vocab is 32 MiB, below the old 256 MiB bar
    facts = DeploymentFacts(
        vllm_version="0.34.0", platform="cuda", model_runner="v2", max_num_seqs=64, vocab_size=128_256
    )
    [advisory] = [a for a in advisories() if a.id == "v2-penalty-table"]
    assert judge(advisory, facts).status == "applies"
    assert "reserves 32 MiB per GPU" in note_text("v2_penalty_table", facts)


def test_on_033_the_machine_alone_does_not_know_the_runner(tmp_path: Path) -> None:
    machine = rows(tmp_path, "0.33.0")
    assert machine["v2-penalty-table"]["status"] == "unknown"
    assert machine["device-penalties"]["status"] != "does_not_apply"
