"""The cached option table decides every argv as vLLM's live `vllm serve` parser does.

The live parser runs in this process (vLLM imported once for the module); the table is built from that
same parser and round-tripped through JSON, exactly what the cache holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploykit import vllm_options
from deploykit.plan import make_plan
from deploykit.probe.facts import ProbeFacts
from deploykit.profile.load import load_profile
from deploykit.vllm_args import TABLE_SCHEMA, ArgvRejected, validate_serve_argv, vllm_importable

REPO = Path(__file__).resolve().parents[1]
FACTS_DIR = REPO / "tests" / "fixtures" / "facts"
BASE = ["vllm", "serve", "/models/tiny"]


def shipped_profile_argvs() -> list[list[str]]:
    """Every shipped profile planned on every fixture GPU (and with no GPU), each argv once."""
    seen: dict[str, list[str]] = {}
    facts = [ProbeFacts(vllm_version="0.32.0+cpu")] + [
        ProbeFacts.model_validate_json(path.read_text()).model_copy(update={"vllm_version": "0.33.0"})
        for path in sorted(FACTS_DIR.glob("*.json"))
    ]
    for profile in sorted((REPO / "profiles").glob("*.yaml")):
        loaded = load_profile(str(profile))
        for fact in facts:
            argv = make_plan(loaded, fact).argv
            seen.setdefault(json.dumps(argv), argv)
    return list(seen.values())


# (extra args after BASE, what the case shows)
CORPUS: list[tuple[list[str], str]] = [
    ([], "model only"),
    (["--port", "8000", "--host", "::1"], "plain values"),
    (["--port=8000"], "--flag=value"),
    (["--max-model-len", "4k"], "human-readable int"),
    (["--max-model-len", "1K"], "binary suffix"),
    (["--max-model-len", "1.5K"], "decimal with a binary suffix"),
    (["--max-model-len", "auto"], "auto"),
    (["--max-model-len", "lots"], "bad int"),
    (["--max_model_len", "1024"], "underscores"),
    (["--max-model", "1024"], "unique abbreviation"),
    (["--max", "1024"], "ambiguous abbreviation"),
    (["--no-such-flag", "3"], "bogus flag"),
    (["--no-such-flag=3"], "bogus flag with ="),
    (["-x"], "bogus short flag"),
    (["--dtype", "float32"], "good choice"),
    (["--dtype", "float33"], "bad choice"),
    (["--dtype=half"], "choice with ="),
    (["--dtype"], "missing value"),
    (["--port"], "missing value at the end"),
    (["--port", "--enforce-eager"], "a flag where a value belongs"),
    (["--port", "eighty"], "bad int type"),
    (["--gpu-memory-utilization", "0.5"], "float"),
    (["--gpu-memory-utilization", "half"], "bad float"),
    (["--enforce-eager"], "boolean flag"),
    (["--no-enforce-eager"], "boolean --no- form"),
    (["--enforce-eager", "yes"], "boolean flag given a value (taken as a second positional)"),
    (["--enforce-eager=1"], "boolean flag with ="),
    (["--enable-prefix-caching", "--no-enable-prefix-caching"], "both forms"),
    (["--no-enable-lora"], "boolean --no- form of enable-lora"),
    (["--tensor-parallel-size", "2"], "long form"),
    (["-tp", "2"], "short form"),
    (["-tp", "two"], "short form, bad int"),
    (["-O3"], "-O3"),
    (["-O", "2"], "-O 2"),
    (["-O=1"], "-O=1"),
    (["--served-model-name", "a", "b"], "nargs +"),
    (["--served-model-name"], "nargs + without values"),
    (["--hf-overrides", '{"a": 1}'], "dict or str, JSON"),
    (["--hf-overrides", "{broken"], "dict or str, broken JSON"),
    (["--hf-overrides", "plain"], "dict or str, plain"),
    (["--default-chat-template-kwargs", "{not json"], "JSON type, broken"),
    (["--default-chat-template-kwargs", '{"x": true}'], "JSON type"),
    (["--kv-cache-memory-bytes", "64M"], "optional human int"),
    (["--kv-cache-memory-bytes", "None"], "optional: None"),
    (["--kv-cache-memory-bytes", "sixty"], "optional human int, bad"),
    (["--compilation-config", '{"level": 0}'], "dataclass JSON (live parser)"),
    (["--compilation-config", '{"no_such_key": 0}'], "dataclass JSON, bad key (live parser)"),
    (["--compilation-config.mode", "0"], "dotted JSON argument (live parser)"),
    (["-cc.mode=0"], "dotted short form (live parser)"),
    (["--lora-modules", "a=/a", "b=/b", "--enable-lora"], "LoRA name=path"),
    (["--lora-modules", '{"name": "a", "path": "/a"}', "--enable-lora"], "LoRA JSON (live parser)"),
    (["--lora-modules", '{"nam": "a"}'], "LoRA bad JSON (live parser)"),
    (["--enable-auto-tool-choice"], "post-parse check fails (live parser)"),
    (["--enable-auto-tool-choice", "--tool-call-parser", "hermes"], "post-parse check passes (live parser)"),
    (["--device-ids", "0,1"], "opaque lambda type (live parser)"),
    (["--moe-backend", "NOT-A-BACKEND"], "opaque type with choices (live parser)"),
    (["--help"], "help is not a launch"),
    (["--api-server-count", "1"], "int"),
    (["--uvicorn-log-level", "debug"], "choice"),
    (["--uvicorn-log-level", "chatty"], "bad choice"),
    (["--middleware", "a", "--middleware", "b"], "append"),
    (["extra-positional"], "second positional"),
    (["--", "--port", "1"], "double dash"),
    (["--port", "-1"], "negative number as a value"),
]


def live_verdict(argv: list[str]) -> str:
    try:
        validate_serve_argv(argv)
    except ArgvRejected:
        return "reject"
    return "accept"


def table_verdict(table: dict[str, Any], argv: list[str]) -> str:
    """The table's answer, or "live" when it hands the argv to vLLM's parser."""
    try:
        vllm_options.check_with_table(table, argv)
    except ArgvRejected:
        return "reject"
    except vllm_options._NeedsLiveParser:
        return "live"
    return "accept"


needs_vllm = pytest.mark.skipif(not vllm_importable(), reason="vLLM is not installed")


@pytest.fixture(scope="module")
def table() -> Iterator[dict[str, Any]]:
    from deploykit.installed import installed_vllm_version
    from deploykit.vllm_args import option_table

    yield json.loads(json.dumps(option_table(installed_vllm_version())))


@needs_vllm
@pytest.mark.parametrize(("extra", "what"), CORPUS, ids=[what for _, what in CORPUS])
def test_the_table_agrees_with_vllms_parser(table: dict[str, Any], extra: list[str], what: str) -> None:
    argv = [*BASE, *extra]
    mine = table_verdict(table, argv)
    if mine == "live":
        assert "live parser" in what, f"{what}: the table should decide this itself"
        return
    assert mine == live_verdict(argv), f"{what}: {argv}"


@needs_vllm
def test_every_shipped_profile_is_decided_by_the_table_as_vllm_does(table: dict[str, Any]) -> None:
    argvs = shipped_profile_argvs()
    assert len(argvs) >= 5
    for argv in argvs:
        assert table_verdict(table, argv) == live_verdict(argv) == "accept", argv


@needs_vllm
def test_the_corpus_holds_both_verdicts(table: dict[str, Any]) -> None:
    """The agreement above is not vacuous: the table alone accepts some argvs and rejects others."""
    verdicts = {table_verdict(table, [*BASE, *extra]) for extra, _ in CORPUS}
    assert verdicts == {"accept", "reject", "live"}


def test_rejections_name_the_flag() -> None:
    table = fake_table()
    with pytest.raises(ArgvRejected, match="--no-such-flag"):
        vllm_options.check_with_table(table, [*BASE, "--no-such-flag"])


# --- the cache -------------------------------------------------------------------------------------


def fake_table(version: str = "0.32.0+cpu") -> dict[str, Any]:
    return {
        "schema": TABLE_SCHEMA,
        "vllm_version": version,
        "parser_module": "fake.cli_args",
        "python": [3, 11],
        "prog": "vllm serve",
        "prefix_chars": "-",
        "allow_abbrev": True,
        "fromfile_prefix_chars": None,
        "actions": [
            {
                "options": [],
                "dest": "model_tag",
                "kind": "store",
                "nargs": "?",
                "type": {"kind": "str"},
                "choices": None,
                "choices_opaque": False,
                "required": False,
            },
            {
                "options": ["--port"],
                "dest": "port",
                "kind": "store",
                "nargs": None,
                "type": {"kind": "int"},
                "choices": None,
                "choices_opaque": False,
                "required": False,
            },
        ],
        "mutually_exclusive": [],
        "post_parse_dests": [],
    }


def test_the_table_is_built_once_per_vllm_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds: list[str] = []
    version = {"now": "0.32.0+cpu"}
    monkeypatch.setattr(vllm_options, "installed_vllm_version", lambda: version["now"])

    def build() -> dict[str, Any]:
        builds.append(version["now"])
        return fake_table(version["now"])

    monkeypatch.setattr(vllm_options, "build_table", build)
    argv = [*BASE, "--port", "8000"]
    assert vllm_options.check_serve_argv(argv, tmp_path).how == "cached option table"
    vllm_options.check_serve_argv(argv, tmp_path)
    assert builds == ["0.32.0+cpu"]
    version["now"] = "0.33.0"
    vllm_options.check_serve_argv(argv, tmp_path)
    vllm_options.check_serve_argv(argv, tmp_path)
    assert builds == ["0.32.0+cpu", "0.33.0"]
    assert {p.name for p in tmp_path.iterdir()} == {
        f"vllm-serve-0.32.0+cpu.schema{TABLE_SCHEMA}.json",
        f"vllm-serve-0.33.0.schema{TABLE_SCHEMA}.json",
    }


def test_a_damaged_or_foreign_cache_file_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_options, "installed_vllm_version", lambda: "0.32.0+cpu")
    monkeypatch.setattr(vllm_options, "build_table", fake_table)
    path = vllm_options.table_path("0.32.0+cpu", tmp_path)
    path.write_text("{not json")
    vllm_options.check_serve_argv([*BASE], tmp_path)
    assert json.loads(path.read_text())["vllm_version"] == "0.32.0+cpu"
    path.write_text(json.dumps({**fake_table(), "schema": TABLE_SCHEMA - 1}))
    vllm_options.check_serve_argv([*BASE], tmp_path)
    assert json.loads(path.read_text())["schema"] == TABLE_SCHEMA


def test_the_cache_directory_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOYKIT_CACHE_DIR", str(tmp_path))
    assert vllm_options.table_path("0.32.0+cpu").parent == tmp_path / "vllm-options"


def test_without_vllm_the_check_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(vllm_options, "installed_vllm_version", lambda: None)
    with pytest.raises(vllm_options.OptionTableUnavailable, match="not installed"):
        vllm_options.check_serve_argv([*BASE], tmp_path)
