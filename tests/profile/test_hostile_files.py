"""Profiles and facts files that try to hang, exhaust or crash the loader: each is refused at once, with
its location, through the one safe reader (deploykit.input_files). Real files, FIFOs and devices."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from deploykit.input_files import MAX_INPUT_BYTES, MAX_NESTING
from deploykit.probe.facts import ProbeFacts
from deploykit.probe.load import ProbeError, load_facts
from deploykit.profile.catalog import assess_profiles
from deploykit.profile.load import load_profile, parse_profile
from deploykit.profile.schema import ProfileError

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts"
BASE = "name: p\nplatform: cpu\nmodel: {source: /m}\n"


def billion_laughs(levels: int = 9) -> str:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for index in range(1, levels):
        name, previous = chr(ord("a") + index), chr(ord("a") + index - 1)
        lines.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    return "\n".join(lines) + "\n"


def refused_within(seconds: float, call: object, error: type[Exception]) -> Exception:
    """`call()` raises `error` in under `seconds` (run in a thread, so a hang fails the test, not CI)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()  # type: ignore[operator]
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)
        else:
            outcome.append(None)

    worker = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(seconds)
    assert outcome, f"still running after {seconds} s"
    assert isinstance(outcome[0], error), outcome[0]
    assert time.monotonic() - started < seconds
    return outcome[0]


def test_a_yaml_alias_bomb_is_refused_at_the_alias() -> None:
    exc = refused_within(2, lambda: parse_profile(billion_laughs(), "bomb.yaml"), ProfileError)
    assert "bomb.yaml:2:" in str(exc) and "alias *a is not allowed" in str(exc)


def test_a_20000_deep_profile_is_refused_not_a_recursion_error() -> None:
    text = BASE + "serve: " + "[" * 20_000 + "]" * 20_000 + "\n"
    exc = refused_within(2, lambda: parse_profile(text, "deep.yaml"), ProfileError)
    assert f"nested deeper than {MAX_NESTING} levels" in str(exc)


def test_a_deep_block_style_profile_is_refused() -> None:
    text = BASE + "serve:\n" + "".join(" " * depth + "a:\n" for depth in range(1, 500))
    exc = refused_within(2, lambda: parse_profile(text, "deep.yaml"), ProfileError)
    assert "nested deeper" in str(exc)


@pytest.mark.parametrize(
    ("path", "kind"), [("/dev/zero", "a character device"), ("/dev/null", "a character device")]
)
def test_a_device_is_not_a_profile_or_facts_file(path: str, kind: str) -> None:
    exc = refused_within(2, lambda: load_profile(path), ProfileError)
    assert f"not a regular file ({kind})" in str(exc)
    exc = refused_within(2, lambda: load_facts(path), ProbeError)
    assert f"not a regular file ({kind})" in str(exc)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "p.yaml"
    os.mkfifo(fifo)
    assert "named pipe" in str(refused_within(2, lambda: load_profile(str(fifo)), ProfileError))
    assert "named pipe" in str(refused_within(2, lambda: load_facts(str(fifo)), ProbeError))


def test_a_huge_file_is_refused_by_its_size(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text(BASE + "description: " + "x" * MAX_INPUT_BYTES + "\n")
    assert "too large" in str(refused_within(2, lambda: load_profile(str(big)), ProfileError))


def test_profiles_list_lists_hostile_files_as_invalid_and_returns(tmp_path: Path) -> None:
    """`profiles list` reads every file in the directory: a bomb, a FIFO or a deep file is one invalid row."""
    (tmp_path / "bomb.yaml").write_text(billion_laughs())
    (tmp_path / "deep.yaml").write_text(BASE + "serve: " + "[" * 5000 + "]" * 5000 + "\n")
    os.mkfifo(tmp_path / "fifo.yaml")
    facts = load_facts(str(FACTS / "no-gpu.json"))

    def assess() -> None:
        from deploykit.plan import make_plan

        rows = {row.name: row for row in assess_profiles(facts, tmp_path, make_plan=make_plan)}
        assert {rows[name].status for name in ("bomb", "deep", "fifo")} == {"invalid"}
        raise StopIteration  # the thread's way of saying "done"

    refused_within(10, assess, StopIteration)


def test_a_100000_deep_facts_file_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text('{"schema_version": 1, "gpus": ' + "[" * 100_000 + "]" * 100_000 + "}")
    exc = refused_within(2, lambda: load_facts(str(deep)), ProbeError)
    assert "nested deeper than" in str(exc)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[]", "the top level is a list, not an object with schema_version and gpus"),
        ("null", "the top level is null, not an object"),
        ('{"schema_version": "1", "gpus": []}', "schema_version is the string '1': write the number 1"),
    ],
)
def test_facts_of_the_wrong_shape_say_what_is_wrong(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "facts.json"
    path.write_text(text)
    with pytest.raises(ProbeError) as raised:
        load_facts(str(path))
    assert expected in str(raised.value)


def test_a_compute_capability_that_is_not_major_minor_is_refused(tmp_path: Path) -> None:
    data = json.loads((FACTS / "t4.json").read_text())
    data["gpus"][0]["compute_capability"] = "banana"
    path = tmp_path / "banana.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProbeError) as raised:
        load_facts(str(path))
    assert "gpus.0.compute_capability" in str(raised.value) and "'banana'" in str(raised.value)
    assert ProbeFacts.model_validate(json.loads((FACTS / "t4.json").read_text())).gpus


@pytest.mark.parametrize(
    ("yaml_text", "where", "message"),
    [
        ("serve: {max_model_len: true}", "serve.max_model_len", "true is a boolean, not a number"),
        (
            "serve: {gpu_memory_utilization: yes}",
            "serve.gpu_memory_utilization",
            "is a boolean, not a number",
        ),
        ("fixes: {matmul_lora: off}", "fixes.matmul_lora", "YAML reads unquoted off/no/false as the boolean"),
        ("fixes: {matmul_lora: on}", "fixes.matmul_lora", 'quote it, e.g. "on"'),
        ("env: {MY_FLAG: on}", "env.MY_FLAG", "quote it"),
        ('schema_version: "1"', "schema_version", "a profile has no schema_version"),
    ],
)
def test_yaml_booleans_and_stray_fields_get_a_message_that_says_what_to_do(
    yaml_text: str, where: str, message: str
) -> None:
    with pytest.raises(ProfileError) as raised:
        parse_profile(BASE + yaml_text + "\n", "p.yaml")
    assert f": {where}: " in str(raised.value) and message in str(raised.value), raised.value


def test_booleans_where_booleans_are_meant_still_load() -> None:
    profile = parse_profile(BASE + "serve: {enforce_eager: yes, max_model_len: 256}\n", "p.yaml")
    assert profile.serve.enforce_eager is True and profile.serve.max_model_len == 256
