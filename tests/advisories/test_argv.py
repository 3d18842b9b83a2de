"""Serving facts read from an argv, and workarounds written into it, as vLLM's parser reads them."""

from __future__ import annotations

import json

from deploykit.advisories.argv import apply_args, flag_switch, flag_value, json_option


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
