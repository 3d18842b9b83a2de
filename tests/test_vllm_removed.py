"""deploykit.vllm_removed (issue 47): the release that removed an environment variable or a `vllm serve`
option, for a target release, from the shipped tables and the history before them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from importlib import resources

import pytest

from deploykit import vllm_removed
from deploykit.vllm_options import known_serve_flags
from deploykit.vllm_removed import (
    Removal,
    chart_json,
    env_removal,
    env_removals_for,
    history,
    option_removal,
    table_removals,
)
from deploykit.vllm_tables import NEWEST_KNOWN_RELEASE, SUPPORTED_VLLM_RELEASES, shipped_env_vars

OLDEST = SUPPORTED_VLLM_RELEASES[0]


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


@pytest.fixture
def fresh_tables() -> Iterator[None]:
    """table_removals is read once per process: a test that changes what it reads starts and ends clean."""
    table_removals.cache_clear()
    yield
    table_removals.cache_clear()


# The history: what went before the oldest table, each entry with its release and evidence.


def test_the_history_file_records_each_removal_with_its_release_and_evidence() -> None:
    data = json.loads(
        resources.files("deploykit.vllm_tables")
        .joinpath(vllm_removed.HISTORY_FILE)
        .read_text(encoding="utf-8")
    )
    for section in ("env_vars", "options"):
        for name, entry in data[section].items():
            # Before the oldest table (after it, the tables say it), with the pull request and the evidence.
            assert _key(entry["release"]) < _key(OLDEST), name
            assert re.fullmatch(r"[\w.-]+/[\w.-]+#\d+", entry["pr"]), name
            assert entry["evidence"] and all(isinstance(line, str) and line for line in entry["evidence"])
    assert {"VLLM_USE_V1", "VLLM_ATTENTION_BACKEND", "VLLM_ALL2ALL_BACKEND", "VLLM_TORCH_PROFILER_*"} <= set(
        data["env_vars"]
    )


def test_nothing_the_history_names_is_in_the_oldest_table() -> None:
    """A name the history calls removed before 0.32 that the 0.32 table still defined would be a wrong
    release: the table is the release's own envs.py and parser."""
    env = shipped_env_vars(OLDEST) or frozenset()
    flags = known_serve_flags(OLDEST)
    for removal in history():
        if removal.kind == "env":
            assert not [name for name in env if removal.matches(name)], removal.name
        else:
            assert not [flag for flag in flags if removal.matches(flag)], removal.name


def test_what_the_history_says_replaces_an_option_exists_in_the_newest_release() -> None:
    """`use `--attention-backend` instead` must name an option vLLM has."""
    flags = known_serve_flags(NEWEST_KNOWN_RELEASE)
    named = [
        (removal.name, option.split("=")[0].split(".")[0])
        for removal in history()
        for option in re.findall(r"`(--[a-z0-9-]+[^`\s]*)", removal.instead or "")
    ]
    assert named
    assert [pair for pair in named if pair[1] not in flags] == []


@pytest.mark.parametrize(
    ("name", "release", "before"),
    [
        ("VLLM_USE_V1", "0.11.1", "0.11.0"),
        ("VLLM_ATTENTION_BACKEND", "0.15.0", "0.14.1"),
        ("VLLM_ALL2ALL_BACKEND", "0.16.0", "0.15.1"),
        ("VLLM_TORCH_PROFILER_WITH_STACK", "0.16.0", "0.15.1"),  # the prefix entry VLLM_TORCH_PROFILER_*
        ("VLLM_TORCH_PROFILER_DIR", "0.16.0", "0.15.1"),
    ],
)
def test_a_removed_variable_is_named_with_its_release_at_and_past_it_never_before(
    name: str, release: str, before: str
) -> None:
    for target in (release, OLDEST, NEWEST_KNOWN_RELEASE, "0.40.0", f"{NEWEST_KNOWN_RELEASE}+cpu"):
        removal = env_removal(name, target)
        assert removal is not None and removal.release == release, target
    assert env_removal(name, before) is None  # the same name for a target before its removal
    assert env_removal(name, None) is None and env_removal(name, "main") is None  # unknown: nothing refused


def test_a_prefix_matches_only_names_under_it() -> None:
    assert env_removal("VLLM_TORCH_PROFILER", NEWEST_KNOWN_RELEASE) is None
    assert env_removal("VLLM_TORCH_PROFILERS", NEWEST_KNOWN_RELEASE) is None
    assert env_removal("XVLLM_TORCH_PROFILER_DIR", NEWEST_KNOWN_RELEASE) is None


def test_what_replaces_it_or_why_nothing_does_is_said() -> None:
    attention = env_removal("VLLM_ATTENTION_BACKEND", "0.33.0")
    assert attention is not None
    assert attention.explained() == (
        "vLLM 0.15.0 removed it (vllm-project/vllm#32812): use `--attention-backend` instead"
    )
    v1 = env_removal("VLLM_USE_V1", "0.33.0")
    assert v1 is not None and "nothing replaces it, the V1 engine is the only one" in v1.explained()


# The tables: removals from 0.32 on, release after release.


def test_the_tables_name_the_v1_runner_switch_removed_by_0_34() -> None:
    """VLLM_USE_V2_MODEL_RUNNER: 0.33's envs.py defines it, 0.34's does not (deploykit.vllm_compat)."""
    removal = env_removal("VLLM_USE_V2_MODEL_RUNNER", "0.34.0")
    assert removal is not None and removal.release == "0.34.0"
    assert "shipped tables 0.33.0 → 0.34.0" in removal.source and removal.instead is None
    assert "the V2 model runner is the only one" in removal.explained()
    assert env_removal("VLLM_USE_V2_MODEL_RUNNER", "0.33.0") is None
    assert env_removal("VLLM_USE_V2_MODEL_RUNNER", "0.35.0") is not None  # newer than every table


def test_what_a_table_derives_is_in_the_release_before_and_gone_from_its_own() -> None:
    """Options compared as every spelling the parser accepts: 0.33's hidden `--no-enable-x` is no removal.
    Variables: only vLLM's own (`VLLM_...`): `LD_LIBRARY_PATH` leaving envs.py still means something."""
    releases = list(SUPPORTED_VLLM_RELEASES)
    for removal in table_removals():
        before = releases[releases.index(removal.release) - 1]
        if removal.kind == "env":
            assert removal.name.startswith("VLLM_")
            assert removal.name in (shipped_env_vars(before) or ())
            assert removal.name not in (shipped_env_vars(removal.release) or ())
        else:
            assert removal.name in known_serve_flags(before)
            assert removal.name not in known_serve_flags(removal.release)
    assert option_removal("--no-enable-log-requests", "0.33.0") is None


def test_a_name_the_target_defines_is_never_refused() -> None:
    assert env_removal("VLLM_COMPUTE_NANS_IN_LOGITS", NEWEST_KNOWN_RELEASE) is None
    assert env_removal("CUDA_VISIBLE_DEVICES", NEWEST_KNOWN_RELEASE) is None
    assert option_removal("--max-num-seqs", NEWEST_KNOWN_RELEASE) is None


def test_an_option_the_tables_show_removed_is_named_with_that_release(
    monkeypatch: pytest.MonkeyPatch, fresh_tables: None
) -> None:
    """No shipped table has dropped an option yet (0.32 → 0.33 → 0.34 only added some): the derivation is
    shown on 0.34's parser without `--max-num-seqs`."""
    real = vllm_removed._serve_flags

    def without(release: str) -> frozenset[str] | None:
        flags = real(release)
        return None if flags is None else flags - ({"--max-num-seqs"} if release == "0.34.0" else set())

    monkeypatch.setattr(vllm_removed, "_serve_flags", without)
    removal = option_removal("--max_num_seqs=8", "0.34.0")
    assert removal is not None and removal.release == "0.34.0" and removal.kind == "option"
    assert "shipped tables 0.33.0 → 0.34.0" in removal.source
    assert option_removal("--max-num-seqs", "0.33.0") is None


def test_a_name_brought_back_is_refused_only_where_it_was_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--disable-log-requests`: absent from 0.32's parser, back in 0.33's (EnableDisableAction). Had the
    history recorded its removal, 0.32 would refuse it and 0.33 not."""
    gone = Removal("option", "--disable-log-requests", "0.12.0", "`--no-enable-log-requests`", "", "x/y#1")
    monkeypatch.setattr(vllm_removed, "history", lambda: (gone,))
    assert option_removal("--disable-log-requests", "0.32.0") == gone
    assert option_removal("--disable-log-requests", "0.33.0") is None
    assert option_removal("--disable-log-requests", "0.11.0") is None


def test_without_the_option_tables_the_variables_still_count(
    monkeypatch: pytest.MonkeyPatch, fresh_tables: None
) -> None:
    """The chart's plugin wheel carries the tables without their option tables (a pod checks no argv): the
    pod's plan still knows the variables, and the history's options."""
    import deploykit.vllm_options

    monkeypatch.setattr(deploykit.vllm_options, "shipped_option_table", lambda version: None)
    assert [r for r in table_removals() if r.kind == "option"] == []
    removal = env_removal("VLLM_USE_V2_MODEL_RUNNER", "0.34.0")
    assert removal is not None and removal.release == "0.34.0"
    assert option_removal("--task", "0.34.0") is not None


# Options: every spelling vLLM's parser reads as the removed one.


@pytest.mark.parametrize("word", ["--task", "--task=embed"])
def test_a_removed_option_is_named_in_any_spelling(word: str) -> None:
    removal = option_removal(word, "0.33.0")
    assert removal is not None and removal.name == "--task" and removal.release == "0.13.0"
    assert "`--runner`" in (removal.instead or "")


def test_an_option_before_its_removal_or_a_value_is_not_named() -> None:
    assert option_removal("--task", "0.12.0") is None
    assert option_removal("embed", "0.33.0") is None and option_removal("-1", "0.33.0") is None
    assert option_removal("--task", None) is None


# The chart's copy.


def test_the_chart_list_is_the_targets_own() -> None:
    older, newer = json.loads(chart_json("0.33.0")), json.loads(chart_json("0.34.0"))
    assert older["vllmVersion"] == "0.33.0"
    names = {entry["name"]: entry for entry in older["removed"]}
    assert names["VLLM_ATTENTION_BACKEND"]["why"].startswith("vLLM 0.15.0 removed it")
    profiler = names["VLLM_TORCH_PROFILER_"]
    assert profiler["prefix"] is True and profiler["except"] == [] and profiler["release"] == "0.16.0"
    assert "VLLM_USE_V2_MODEL_RUNNER" not in names  # 0.33 still reads it
    assert "VLLM_USE_V2_MODEL_RUNNER" in {entry["name"] for entry in newer["removed"]}
    assert json.loads(chart_json(None)) == {"vllmVersion": "unknown", "removed": []}
    assert [r.name for r in env_removals_for("0.11.0")] == []
