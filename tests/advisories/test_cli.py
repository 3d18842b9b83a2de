"""`deploykit advisories`: the catalog, and every shipped profile on every GPU fixture compared with a table
written by hand; it imports neither torch nor vLLM and stays fast."""

from __future__ import annotations

import json
import re
import time

import pytest

from deploykit.advisories import advisories, catalog
from deploykit.advisories.schema import ADVISORY_KINDS, Advisory, Catalog
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


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _widest(text: str) -> int:
    """The widest line as a terminal shows it: colour codes (FORCE_COLOR) take no column."""
    return max(len(ANSI.sub("", line)) for line in text.splitlines())


H100 = str(FACTS_DIR / "h100.json")
# Every table view: the catalog, judged on a machine (--facts), on a plan (--facts --profile), filtered by
# kind, and one advisory alone (with its verdict). How the width is decided: deploykit.cli.advisories's
# output_is_terminal (stdout's isatty, or TTY_COMPATIBLE), not Rich's FORCE_COLOR-swayed is_terminal.
VIEWS = {
    "catalog": [],
    "facts": ["--facts", H100],
    "facts+profile": ["--facts", H100, "-p", "qwen-lora-hopper"],
    "kind": ["--kind", "performance", "--kind", "corruption"],
    "kind+facts": ["--kind", "corruption", "--facts", H100],
    "one": ["hybrid-mtp-prefix-cache-async"],
    "one+facts": ["rocm-aiter-custom-ar-gfx942", "--facts", str(HAND_FACTS_DIR / "mi325x-x8.json")],
    "one+facts+profile": ["matmul-lora", "--facts", H100, "-p", "qwen-lora-hopper"],
}
# Piped with colour forced and a wide terminal behind the pipe (a CI log): still 80 columns.
PIPED_ENVS = {
    "plain": {"TTY_COMPATIBLE": None, "FORCE_COLOR": None, "COLUMNS": None},
    "forced-colour": {"TTY_COMPATIBLE": None, "FORCE_COLOR": "1", "COLUMNS": "200"},
}


@pytest.mark.parametrize("env", PIPED_ENVS.values(), ids=PIPED_ENVS.keys())
@pytest.mark.parametrize("args", VIEWS.values(), ids=VIEWS.keys())
def test_piped_output_fits_80_columns(args: list[str], env: dict[str, str | None]) -> None:
    """Issue 35: the catalog table was 175 columns wide when piped; issue 47: every view, any env."""
    result = runner.invoke(app, ["advisories", *args], env=env)

    assert result.exit_code == 0, result.output
    assert _widest(result.stdout) <= 80, result.stdout
    # nothing is cut: every id listed appears whole
    if not args or args[0].startswith("--"):
        for advisory in _run(*args):
            assert str(advisory["id"]) in result.stdout


def test_every_advisory_in_full_fits_80_columns() -> None:
    for advisory_id in catalog.advisory_ids():
        result = runner.invoke(app, ["advisories", advisory_id], env=PIPED_ENVS["plain"])

        assert result.exit_code == 0, result.output
        assert _widest(result.stdout) <= 80, result.stdout


def test_a_terminal_gets_its_own_width(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("deploykit.cli.advisories.output_is_terminal", lambda: True)
    result = runner.invoke(app, ["advisories"], env={"COLUMNS": "150"})

    assert result.exit_code == 0, result.output
    assert 80 < _widest(result.stdout) <= 150


LONG_ID = "a-very-long-advisory-id-that-names-every-condition-of-the-combination-it-covers-one-by-one"
LONG_ENTRY = {
    "id": LONG_ID,
    "title": "A title that goes on and on: " + "the model, the GPU, the dtype and the feature " * 4,
    "symptom": "wrong output " * 20,
    "kind": "corruption",
    "references": [
        {
            "repo": "an-organisation-with-a-long-name/a-repository-with-an-even-longer-name",
            "number": 123456789,
            "kind": "pr",
            "note": "a note " * 30,
        }
    ],
    "vllm": {"affected_from": "0.10.0", "fixed_in": "0.99.0", "evidence": "evidence " * 30},
    "when": {"architectures": ["AModelArchitectureWhoseNameHasNoBreakAnywhereInItForCausalLM"]},
    "action": {
        "kind": "workaround",
        "args": ["--compilation-config.a_very_long_key_with_no_space_in_it_anywhere_at_all=VALUE"],
        "env": {"A_VERY_LONG_ENVIRONMENT_VARIABLE_NAME_THAT_DOES_NOT_BREAK": "1"},
        "why": "why " * 40,
    },
}


@pytest.fixture
def long_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real catalog with one more advisory whose id, title, thread, flag and variable are too long for
    80 columns; every reader of the catalog (the CLI, the evaluation) sees it."""
    real = catalog.load_catalog()
    longer = Catalog(advisories=[*real.advisories, Advisory.model_validate(LONG_ENTRY)])
    monkeypatch.setattr(catalog, "load_catalog", lambda: longer)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--facts", H100],
        ["--facts", H100, "-p", "qwen-lora-hopper"],
        [LONG_ID],
        [LONG_ID, "--facts", H100],
    ],
    ids=["catalog", "facts", "facts+profile", "one", "one+facts"],
)
@pytest.mark.usefixtures("long_catalog")
def test_a_long_id_and_title_still_fit_80_columns(args: list[str]) -> None:
    result = runner.invoke(app, ["advisories", *args], env=PIPED_ENVS["plain"])

    assert result.exit_code == 0, result.output
    assert _widest(result.stdout) <= 80, result.stdout
    # folded, not cut: every character of the id is there, in order (in a table, in its column: up to
    # where the header's second column starts)
    lines = result.stdout.splitlines()
    column = len(lines[0]) - len(lines[0].split(maxsplit=1)[1]) if not args or args[0] != LONG_ID else None
    assert LONG_ID in re.sub(r"\s+", "", "".join(line[:column] for line in lines))


def _table_ids(text: str) -> set[str]:
    """The ids a catalog table lists: the first word of each row that is an advisory's id."""
    known = set(catalog.advisory_ids())
    return {line.split()[0] for line in text.splitlines() if line.split() and line.split()[0] in known}


@pytest.mark.parametrize("kind", ADVISORY_KINDS)
def test_kind_keeps_exactly_the_advisories_of_that_kind(kind: str) -> None:
    """Computed from the catalog, whatever it holds (hang may have none yet: then the lists are empty)."""
    expected = {advisory.id for advisory in advisories() if advisory.kind == kind}

    assert {row["id"] for row in _run("--kind", kind)} == expected
    assert {row["kind"] for row in _run("--kind", kind)} <= {kind}
    assert {row["id"] for row in _run("-k", kind, "--facts", H100)} == expected
    judged = _run("--kind", kind, "--facts", H100, "-p", "qwen-lora-hopper")
    assert {row["id"] for row in judged} == expected
    assert all(row["kind"] == kind for row in judged)

    table = runner.invoke(app, ["advisories", "--kind", kind], env=PIPED_ENVS["plain"])
    assert table.exit_code == 0, table.output
    assert _table_ids(table.stdout) == expected
    if not expected:
        assert f"No advisories of kind {kind}." in table.stdout
    judged_table = runner.invoke(app, ["advisories", "--kind", kind, "--facts", H100])
    assert judged_table.exit_code == 0, judged_table.output
    assert _table_ids(judged_table.stdout) == expected


def test_the_kinds_cover_the_catalog_and_several_may_be_given() -> None:
    everything = {row["id"] for row in _run()}
    by_kind = {kind: {row["id"] for row in _run("--kind", kind)} for kind in ADVISORY_KINDS}

    assert set().union(*by_kind.values()) == everything
    assert sum(len(ids) for ids in by_kind.values()) == len(everything)  # one kind each
    first, second = ADVISORY_KINDS[0], ADVISORY_KINDS[-1]
    both = {row["id"] for row in _run("--kind", first, "--kind", second)}
    assert both == by_kind[first] | by_kind[second]


def test_the_catalog_table_shows_each_kind_hangs_first() -> None:
    """The table groups the advisories under a line naming their kind, in the schema's order."""
    result = runner.invoke(app, ["advisories"], env=PIPED_ENVS["plain"])
    assert result.exit_code == 0, result.output

    counts = {kind: sum(1 for a in advisories() if a.kind == kind) for kind in ADVISORY_KINDS}
    headings = [line.split()[0] for line in result.stdout.splitlines() if re.match(r"^[a-z]+ \(\d+\)", line)]
    assert headings == [kind for kind in ADVISORY_KINDS if counts[kind]]
    for kind in headings:
        assert f"{kind} ({counts[kind]})" in result.stdout
    # each advisory under its own kind's heading
    current = None
    known = {a.id: a.kind for a in advisories()}
    for line in result.stdout.splitlines():
        words = line.split()
        if words and words[0] in ADVISORY_KINDS and re.match(r"^[a-z]+ \(\d+\)", line):
            current = words[0]
        elif words and words[0] in known:
            assert known[words[0]] == current, line


def test_an_unknown_kind_is_a_usage_error_naming_the_kinds() -> None:
    result = runner.invoke(app, ["advisories", "--kind", "slow"])

    assert result.exit_code == 2  # USAGE (docs/exit-codes.md)
    assert result.stdout == ""
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("deploykit: ")
    assert "'slow' is not a kind of advisory" in line
    for kind in ADVISORY_KINDS:
        assert kind in line


def test_the_help_names_every_kind() -> None:
    result = runner.invoke(app, ["advisories", "--help"])

    assert result.exit_code == 0, result.output
    for kind in ADVISORY_KINDS:
        assert kind in result.stdout


def test_one_advisory_shows_its_kind_and_kind_filters_it() -> None:
    entry = advisories()[0]
    other = next(kind for kind in ADVISORY_KINDS if kind != entry.kind)

    shown = runner.invoke(app, ["advisories", entry.id])
    assert shown.exit_code == 0, shown.output
    assert f"kind: {entry.kind}" in shown.stdout.splitlines()
    assert json.loads(runner.invoke(app, ["advisories", entry.id, "-f", "json"]).stdout)["kind"] == entry.kind
    assert runner.invoke(app, ["advisories", entry.id, "--kind", entry.kind]).exit_code == 0
    refused = runner.invoke(app, ["advisories", entry.id, "--kind", other])
    assert refused.exit_code == 2
    assert f"is of kind {entry.kind}, not {other}" in refused.stderr


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
