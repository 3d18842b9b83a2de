"""The option tables decide every argv as vLLM's live `vllm serve` parser does, for the vLLM a plan targets.

The live parser runs in this process (vLLM imported once for the module). The table held to it is the one
deploykit ships for the importable vLLM's release (deploykit/vllm_tables), and the shipped table must be
what that parser describes today. tests/vllm_releases runs this module once per supported release (0.33
from its wheel's sources), so every shipped table meets its own release's parser.
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
from deploykit.vllm_tables import SUPPORTED_VLLM_RELEASES, release_of, shipped_option_table
from tests.cli_process import run_deploykit, run_python
from tests.vllm_releases.releases import NEXT_RELEASE

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
    (["--enable-lora", "--disable-lora"], "0.33: --disable- form of an --enable- flag"),
    (["--no-disable-lora"], "--no-disable- form of an --enable- flag"),
    (["--disable-log-stats"], "a --disable- flag"),
    (["--no-disable-log-stats"], "--no- form of a store_true --disable- flag"),
    (["--no-disable-uvicorn-access-log"], "--no- form of a --disable- flag"),
    (["--enable-uvicorn-access-log"], "0.33: --enable- form of a --disable- flag"),
    (["--enable-lora=1"], "enable/disable flag with ="),
    (["--disable-lora=1"], "enable/disable negative with ="),
    (["--disable-prefix-caching"], "0.33: --disable- form"),
    (["--no-enable-prefix-caching", "--enable-prefix-caching"], "last spelling wins"),
    (["--enable-lor"], "abbreviation of an --enable- flag"),
    (["--no-enable-lo"], "abbreviation of a hidden --no-enable- spelling"),
    (["--reasoning-effort-map", '{"low": "low"}'], "0.33: new flag (post-parse check: live parser)"),
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
    except vllm_options.NeedsLiveParser:
        return "live"
    return "accept"


def needs_vllm(test: Any) -> Any:
    """vLLM's own parser: skipped without vLLM, and out of the fast tier (it imports vLLM)."""
    skip = pytest.mark.skipif(not vllm_importable(), reason="vLLM is not installed")
    return pytest.mark.vllm_import(skip(test))


@pytest.fixture(scope="module")
def table() -> Iterator[dict[str, Any]]:
    """The shipped table of the importable vLLM's release (read from its parser when none is shipped)."""
    from deploykit.installed import installed_vllm_version
    from deploykit.vllm_args import option_table

    version = installed_vllm_version()
    yield shipped_option_table(version) or json.loads(json.dumps(option_table(version)))


@needs_vllm
def test_the_shipped_table_is_what_the_release_parser_describes() -> None:
    """A stale table would check argvs against a parser that no longer exists: regenerate with
    tools/vllm_tables.py when this fails."""
    from deploykit.installed import installed_vllm_version
    from deploykit.vllm_args import option_table

    release = release_of(installed_vllm_version())
    assert release is not None, f"vLLM {installed_vllm_version()} has no shipped table"
    assert shipped_option_table(release) == json.loads(json.dumps(option_table(release)))


@needs_vllm
def test_every_spelling_of_every_boolean_flag_is_decided_as_vllm_does(table: dict[str, Any]) -> None:
    """0.32's BooleanOptionalAction (`--x`, `--no-x`) and 0.33's EnableDisableAction (`--enable-x`,
    `--disable-x`, `--no-enable-x`; `--no-disable-x` where the flag was declared as `--disable-x`)."""
    from deploykit.vllm_args import _make_parser, _parser_module

    live = _make_parser(_parser_module())
    registered = {s for s, _ in live._option_string_actions.items()}
    flags = vllm_options.known_serve_flags(table["vllm_version"])
    boolean = [a for a in table["actions"] if a["kind"] in ("boolean_optional", "enable_disable")]
    assert len(boolean) > 80
    checked = 0
    for entry in boolean:
        spellings = set(entry["options"])
        if entry["kind"] == "boolean_optional":
            spellings |= {"--no-" + o[2:] for o in entry["options"] if o.startswith("--")}
        assert spellings <= registered and spellings <= flags, entry["dest"]
        for spelling in sorted(spellings):
            argv = [*BASE, spelling]
            if table_verdict(table, argv) == "live":  # vLLM's post-parse checks read this flag
                assert entry["dest"] in table["post_parse_dests"], argv
                continue
            assert table_verdict(table, argv) == live_verdict(argv) == "accept", argv
            checked += 1
        for unknown in ("--no-no-" + entry["dest"].replace("_", "-"), "--enable-disable-" + entry["dest"]):
            assert table_verdict(table, [*BASE, unknown]) == live_verdict([*BASE, unknown]), unknown
    assert checked > 2 * len(boolean) - 10


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
    version = {"now": "0.31.0+cpu"}  # releases without a shipped table: the installed parser is read
    monkeypatch.setattr(vllm_options, "installed_vllm_version", lambda: version["now"])

    def build() -> dict[str, Any]:
        builds.append(version["now"])
        return fake_table(version["now"])

    monkeypatch.setattr(vllm_options, "build_table", build)
    argv = [*BASE, "--port", "8000"]
    assert vllm_options.check_serve_argv(argv, tmp_path).how == "cached option table"
    vllm_options.check_serve_argv(argv, tmp_path)
    assert builds == ["0.31.0+cpu"]
    version["now"] = NEXT_RELEASE
    vllm_options.check_serve_argv(argv, tmp_path)
    vllm_options.check_serve_argv(argv, tmp_path)
    assert builds == ["0.31.0+cpu", NEXT_RELEASE]
    assert {p.name for p in tmp_path.iterdir()} == {
        f"vllm-serve-0.31.0+cpu.schema{TABLE_SCHEMA}.json",
        f"vllm-serve-{NEXT_RELEASE}.schema{TABLE_SCHEMA}.json",
    }


def test_a_damaged_or_foreign_cache_file_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_options, "installed_vllm_version", lambda: "0.31.0+cpu")
    monkeypatch.setattr(vllm_options, "build_table", lambda: fake_table("0.31.0+cpu"))
    path = vllm_options.table_path("0.31.0+cpu", tmp_path)
    path.write_text("{not json")
    vllm_options.check_serve_argv([*BASE], tmp_path)
    assert json.loads(path.read_text())["vllm_version"] == "0.31.0+cpu"
    path.write_text(json.dumps({**fake_table("0.31.0+cpu"), "schema": TABLE_SCHEMA - 1}))
    vllm_options.check_serve_argv([*BASE], tmp_path)
    assert json.loads(path.read_text())["schema"] == TABLE_SCHEMA


def test_the_cache_directory_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOYKIT_CACHE_DIR", str(tmp_path))
    assert vllm_options.table_path("0.32.0+cpu").parent == tmp_path / "vllm-options"


def test_without_vllm_the_check_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(vllm_options, "installed_vllm_version", lambda: None)
    with pytest.raises(vllm_options.OptionTableUnavailable, match="not installed"):
        vllm_options.check_serve_argv([*BASE], tmp_path)


# --- the table of the vLLM a plan targets -------------------------------------------------------------

REASONING_MAP = ["--reasoning-effort-map", '{"low": "low"}']  # new in vLLM 0.33


def no_live_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(argv: Any) -> str:
        raise AssertionError(f"the live parser was asked about {argv}")

    monkeypatch.setattr(vllm_options, "check_live", refuse)
    monkeypatch.setattr(vllm_options, "build_table", lambda: refuse("the table"))


@pytest.mark.parametrize("installed", ["0.32.0+cpu", "0.33.0", None])
def test_a_plan_is_checked_against_the_release_it_targets(
    installed: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Whatever is installed here (0.32, 0.33, nothing): 0.33's new flag passes for a 0.33 target and is
    refused for a 0.32 target, from the shipped tables alone."""
    monkeypatch.setattr(vllm_options, "installed_vllm_version", lambda: installed)
    no_live_parser(monkeypatch)
    if installed != "0.33.0":  # not installed: its post-parse check is named as not run
        verdict = vllm_options.check_serve_argv([*BASE, *REASONING_MAP], tmp_path, vllm_version="0.33.0")
        assert (
            verdict.vllm_version == "0.33.0" and verdict.parser_module == "vllm.entrypoints.common.cli_args"
        )
        assert "not checked: vLLM checks reasoning_effort_map after parsing" in verdict.how
    for target in ("0.32.0", "0.32.0+cpu"):
        with pytest.raises(ArgvRejected, match="unrecognized arguments: --reasoning-effort-map"):
            vllm_options.check_serve_argv([*BASE, *REASONING_MAP], tmp_path, vllm_version=target)
    for spelling in ("--disable-lora", "--no-enable-lora", "--enforce-eager", "--no-enforce-eager"):
        verdict = vllm_options.check_serve_argv([*BASE, spelling], tmp_path, vllm_version="0.33.0")
        assert verdict.how == "shipped option table", spelling
    with pytest.raises(ArgvRejected, match="--disable-lora"):
        vllm_options.check_serve_argv([*BASE, "--disable-lora"], tmp_path, vllm_version="0.32.0")
    assert list(tmp_path.iterdir()) == []  # nothing built, nothing cached


def test_a_release_without_a_table_that_is_not_installed_is_not_checked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(vllm_options, "installed_vllm_version", lambda: "0.32.0+cpu")
    no_live_parser(monkeypatch)
    with pytest.raises(
        vllm_options.OptionTableUnavailable,
        match=rf"no .* table for vLLM 0.31.0 .*{', '.join(SUPPORTED_VLLM_RELEASES)}",
    ):
        vllm_options.check_serve_argv([*BASE], tmp_path, vllm_version="0.31.0")


def test_a_release_newer_than_any_is_checked_against_the_newest_table(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 33: a target after every known release (0.35 today) is checked against the newest shipped
    table, and the verdict says so; an option that newest release refuses is refused."""
    monkeypatch.setattr(vllm_options, "installed_vllm_version", lambda: "0.32.0+cpu")
    no_live_parser(monkeypatch)
    newest = SUPPORTED_VLLM_RELEASES[-1]
    verdict = vllm_options.check_serve_argv([*BASE], tmp_path, vllm_version=NEXT_RELEASE)
    assert verdict.vllm_version == newest
    assert verdict.how.startswith(vllm_options.NEWEST_TABLE_HOW) and NEXT_RELEASE in verdict.how
    with pytest.raises(ArgvRejected, match="--no-such-option"):
        vllm_options.check_serve_argv([*BASE, "--no-such-option"], tmp_path, vllm_version=NEXT_RELEASE)


def test_the_installed_release_without_a_table_uses_its_own_parser(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(vllm_options, "installed_vllm_version", lambda: NEXT_RELEASE)
    monkeypatch.setattr(vllm_options, "build_table", lambda: fake_table(NEXT_RELEASE))
    verdict = vllm_options.check_serve_argv([*BASE, "--port", "1"], tmp_path, vllm_version=NEXT_RELEASE)
    assert (verdict.vllm_version, verdict.how) == (NEXT_RELEASE, "cached option table")


def test_known_flags_and_env_vars_per_release() -> None:
    assert SUPPORTED_VLLM_RELEASES[:3] == ("0.32.0", "0.33.0", "0.34.0")
    new_in_033 = {"--reasoning-effort-map", "--disable-lora", "--enable-uvicorn-access-log"}
    flags_033 = vllm_options.known_serve_flags("0.33.0")
    flags_032 = vllm_options.known_serve_flags("0.32.0+cpu")
    assert new_in_033 <= flags_033 and not new_in_033 & flags_032
    both = {"--enable-lora", "--no-enable-lora", "--enforce-eager", "--no-enforce-eager", "--port", "-tp"}
    assert both <= flags_032 & flags_033
    assert "--no-port" not in flags_033
    for release in SUPPORTED_VLLM_RELEASES:
        names = vllm_options.known_env_vars(release)
        assert {"VLLM_TARGET_DEVICE", "VLLM_COMPUTE_NANS_IN_LOGITS"} <= names
        assert ("VLLM_USE_V2_MODEL_RUNNER" in names) is (release < "0.34.0")  # 0.34 removed the V1 runner
        assert len(names) > 250 and all(n.isupper() for n in names)
    with pytest.raises(vllm_options.OptionTableUnavailable, match=NEXT_RELEASE.replace(".", r"\.")):
        vllm_options.known_serve_flags(NEXT_RELEASE)
    with pytest.raises(vllm_options.OptionTableUnavailable, match=r"0\.31\.0"):
        vllm_options.known_env_vars("0.31.0")


def test_checking_against_a_shipped_table_imports_no_vllm() -> None:
    import time

    code = (
        "import sys, time\n"
        "from deploykit.vllm_options import check_serve_argv\n"
        "start = time.perf_counter()\n"
        "for target in ('0.32.0', '0.33.0'):\n"
        "    argv = ['vllm', 'serve', '/m', '--enable-lora', '--no-enforce-eager']\n"
        "    check_serve_argv(argv, vllm_version=target)\n"
        "heavy = [m for m in ('vllm', 'torch') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print(time.perf_counter() - start)\n"
    )
    started = time.perf_counter()
    done = run_python(["-c", code])  # forked from a warm interpreter: tests/cli_process.py
    assert done.returncode == 0, done.stderr
    assert time.perf_counter() - started < 30  # seconds would mean a vLLM import somewhere


def test_cli_plan_with_facts_of_a_033_host_validates_against_033(tmp_path: Path) -> None:
    """Through the real command on this 0.32 machine: a 0.33-only flag passes for facts of a 0.33 host
    and is refused for the same host running 0.32."""

    profile = tmp_path / "effort.yaml"
    profile.write_text(
        "name: effort\nmodel: {source: /models/m}\n"
        'serve:\n  extra_args: ["--reasoning-effort-map", \'{"low": "low"}\']\n'
    )
    results = {}
    for version in ("0.33.0", "0.32.0"):
        facts = ProbeFacts.model_validate_json((FACTS_DIR / "h100.json").read_text())
        path = tmp_path / f"h100-{version}.json"
        path.write_text(facts.model_copy(update={"vllm_version": version}).model_dump_json())
        done = run_deploykit(["plan", "-p", str(profile), "--facts", str(path), "-f", "json"])
        results[version] = (done.returncode, json.loads(done.stdout)["validation"] if done.stdout else None)
    code, validation = results["0.33.0"]
    assert code == 0 and validation["status"] == "ok"
    # 0.33's shipped table; where 0.33 itself is the installed vLLM (the 0.33 tier), its live parser decides
    # what the table cannot (vLLM checks this flag after parsing).
    from deploykit.installed import installed_vllm_version

    target_installed = release_of(installed_vllm_version()) == "0.33.0"
    judged_by = "vLLM's live parser" if target_installed else "shipped option table"
    assert f"vllm.entrypoints.common.cli_args (vLLM 0.33.0, {judged_by}" in validation["detail"]
    code, validation = results["0.32.0"]
    assert code != 0 and validation["status"] == "error"
    assert "unrecognized arguments: --reasoning-effort-map" in validation["detail"]
