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


def test_a_servers_words_in_any_line_are_shown_escaped_and_a_diagnosis_stays_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 43: a server's escape sequences and markup in a diagnosis reached the terminal raw; a line
    break in a case's diagnosis could print a line of its own (`verdict: PASS`)."""
    from deploykit.smoke import CaseResult

    ui = ConsoleUI(quiet=True)
    ui.say("verdict: FAIL (done): HTTP 500: \x1b[2J[/x]\u202e\nsecond line")
    ui.warn("\x9b2J[bold]")
    ui.case(
        CaseResult(name="c", kind="chat", endpoint="e", model="m", passed=False, diagnosis="a\nverdict: PASS")
    )
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        r"verdict: FAIL (done): HTTP 500: \x1b[2J[/x]\u202e",
        "second line",  # deploykit's own line breaks stay
        "  FAIL c              0.00 s             -  ids []",
        r"       a\nverdict: PASS",
    ]
    assert err == "deploykit: \\x9b2J[bold]\n"
