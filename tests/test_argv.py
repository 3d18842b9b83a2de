"""The one argv reader (deploykit.argv): serving facts read from an argv, owned flags found in any spelling,
ports and workarounds written into it, as vLLM's parser reads them."""

from __future__ import annotations

import json

from deploykit import plan as plan_module
from deploykit.argv import (
    apply_args,
    flag_name,
    flag_switch,
    flag_value,
    json_option,
    owned_flag,
    value_or,
    with_port,
)
from deploykit.vllm_tables import SUPPORTED_VLLM_RELEASES, shipped_option_table


def test_values_in_every_spelling_the_last_one_winning() -> None:
    argv = ["vllm", "serve", "m", "--kv_cache_dtype", "fp8", "--kv-cache-dtype=fp8_e5m2"]

    assert flag_value(argv, "--kv-cache-dtype") == "fp8_e5m2"
    assert flag_value(argv, "--attention-backend") is None


def test_boolean_switches_and_their_negations() -> None:
    assert flag_switch(["--enable-prefix-caching"], "--enable-prefix-caching") is True
    assert (
        flag_switch(["--enable-prefix-caching", "--no-enable-prefix-caching"], "--enable-prefix-caching")
        is False
    )
    assert flag_switch([], "--enable-prefix-caching") is None


def test_json_options_merge_json_and_dotted_keys() -> None:
    argv = ["-cc", '{"cudagraph_mode": "FULL", "level": 3}', "--compilation-config.cudagraph_mode=PIECEWISE"]

    assert json_option(argv, "--compilation-config") == {"cudagraph_mode": "PIECEWISE", "level": 3}


def test_a_workaround_replaces_the_setting_it_overrides() -> None:
    argv = ["vllm", "serve", "m", "--kv-cache-dtype", "fp8", "--port", "8000"]

    assert apply_args(argv, ["--kv-cache-dtype", "auto"]) == [
        "vllm",
        "serve",
        "m",
        "--port",
        "8000",
        "--kv-cache-dtype",
        "auto",
    ]
    assert apply_args(["--kv-cache-dtype=fp8"], ["--kv-cache-dtype", "auto"]) == ["--kv-cache-dtype", "auto"]


def test_a_switch_replaces_its_negation() -> None:
    argv = ["vllm", "serve", "m", "--no-disable-custom-all-reduce"]

    assert apply_args(argv, ["--disable-custom-all-reduce"]) == [
        "vllm",
        "serve",
        "m",
        "--disable-custom-all-reduce",
    ]


def test_a_dotted_key_is_merged_into_an_existing_json_value() -> None:
    argv = ["vllm", "serve", "m", "--compilation-config", '{"cudagraph_mode": "FULL", "level": 3}']

    changed = apply_args(argv, ["--compilation-config.cudagraph_mode=PIECEWISE"])

    assert changed[:4] == ["vllm", "serve", "m", "--compilation-config"]
    assert json.loads(changed[4]) == {"cudagraph_mode": "PIECEWISE", "level": 3}
    assert len(changed) == 5


def test_a_dotted_key_is_appended_when_there_is_no_json_value() -> None:
    argv = ["vllm", "serve", "m", "--compilation-config.cudagraph_mode", "FULL"]

    assert apply_args(argv, ["--compilation-config.cudagraph_mode=PIECEWISE"]) == [
        "vllm",
        "serve",
        "m",
        "--compilation-config.cudagraph_mode=PIECEWISE",
    ]


def test_every_spelling_vllm_reads_as_a_flag_is_that_flag() -> None:
    owned = {"--max-num-seqs", "--enforce-eager", "--tensor-parallel-size", "--port"}

    assert owned_flag("--max_num_seqs", owned) == "--max-num-seqs"
    assert owned_flag("--max_num_seqs=8", owned) == "--max-num-seqs"
    assert owned_flag("--max-num-seq", owned) == "--max-num-seqs"  # argparse's abbreviation
    assert owned_flag("--no-enforce-eager", owned) == "--enforce-eager"
    assert owned_flag("--no_enforce_eager", owned) == "--enforce-eager"
    assert owned_flag("-tp=2", owned) == "--tensor-parallel-size"
    assert owned_flag("--max-model-len", owned) is None
    assert owned_flag("8", owned) is None and owned_flag("-1", owned) is None


def test_no_real_option_of_a_shipped_release_is_taken_for_an_owned_flag_it_is_not() -> None:
    """owned_flag expands abbreviations: no distinct option vLLM has may read as one the profile owns."""
    owned = set(plan_module.owned_flags())
    for release in SUPPORTED_VLLM_RELEASES:
        table = shipped_option_table(release)
        assert table is not None
        for action in table["actions"]:
            names = {flag_name(option) for option in action["options"]}
            for option in action["options"]:
                taken = owned_flag(option, owned)
                assert taken is None or taken in names, (release, option, taken)


def test_values_and_ports_read_and_set_in_any_spelling() -> None:
    argv = ["vllm", "serve", "m", "--port=8123", "--host", "0.0.0.0"]

    assert value_or(argv, "--port", "0") == "8123"
    moved = with_port(argv, 9001)
    assert value_or(moved, "--port", "0") == "9001"
    assert [word for word in moved if "8123" in word] == []
    assert with_port(["vllm", "serve", "m"], 5)[-2:] == ["--port", "5"]
    assert value_or(["vllm"], "--host", "127.0.0.1") == "127.0.0.1"
    assert flag_value(["-tp", "2"], "--tensor-parallel-size") == "2"
    assert flag_value(["--seed", "-1"], "--seed") == "-1"
