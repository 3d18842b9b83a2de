"""deploykit's own lines during serve and smoke, as a pipe or a log file receives them."""

from __future__ import annotations

import pytest

from deploykit.serve.console import ConsoleUI

LONG_PATH = "/srv/models/" + "a" * 150 + "/profile.yaml"


def test_a_verdict_line_is_never_reflowed_when_piped(capsys: pytest.CaptureFixture[str]) -> None:
    message = f"verdict: ERROR (profile): the profile cannot be used: {LONG_PATH}:1:1: (file): no such file"
    ConsoleUI(quiet=True).say(message)
    assert capsys.readouterr().out == message + "\n"


def test_a_warning_is_one_line_with_the_whole_path(capsys: pytest.CaptureFixture[str]) -> None:
    ConsoleUI(quiet=True).warn(f"the result could not be stored: {LONG_PATH} is read-only")
    assert capsys.readouterr().err == f"deploykit: the result could not be stored: {LONG_PATH} is read-only\n"


def test_a_case_line_shows_the_answer_beside_its_ids_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    from deploykit.smoke import CaseResult

    ui = ConsoleUI(quiet=True)
    paris = "The capital of France is Paris."
    ui.case(CaseResult(name="known:capital", kind="chat", endpoint="e", model="m", passed=True, text=paris))
    ui.case(CaseResult(name="c", kind="chat", endpoint="e", model="m", passed=True, text="\x1b[31m[red]x\n"))
    first, second = capsys.readouterr().out.splitlines()
    assert first.endswith("ids []  'The capital of France is Paris.'")
    assert second.endswith(r"ids []  '\x1b[31m[red]x\n'")  # a terminal control is shown, never sent
