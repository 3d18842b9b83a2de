"""`terminal_text` and `hidden_character` (deploykit/untrusted_text.py): what a terminal would act on is
shown as its escape, never dropped, and the test for names finds the bidirectional controls too."""

from __future__ import annotations

import pytest

from deploykit.untrusted_text import BIDI_CONTROLS, hidden_character, terminal_text


def test_every_character_a_terminal_acts_on_is_shown_as_its_escape() -> None:
    assert (
        terminal_text("a\x1b[2J\x07\x7f\x9b\u2028\u202e\u2066b") == r"a\x1b[2J\x07\x7f\x9b\u2028\u202e\u2066b"
    )
    assert terminal_text("one\ttwo\r\nthree") == r"one\ttwo\r\nthree"
    assert terminal_text("one\r\ntwo\x1b", lines=True) == "one\\r\ntwo\\x1b"  # a log's lines stay lines
    every = "".join(chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]) + "\u2028\u2029" + BIDI_CONTROLS
    assert terminal_text(every).isprintable() and terminal_text(every).isascii()


@pytest.mark.parametrize("text", ["plain", "ünïcödé ✓ 日本", "[bold]markup[/] is text", r"C:\path\x1b"])
def test_text_a_terminal_only_shows_is_left_as_it_is(text: str) -> None:
    assert terminal_text(text) == text
    assert terminal_text(terminal_text("\x1b" + text)) == terminal_text("\x1b" + text)  # idempotent


def test_names_hold_no_control_or_bidirectional_character() -> None:
    assert hidden_character("NVIDIA H100 80GB HBM3") is None
    assert hidden_character("NVIDIA \x1b[2J") == "U+001B (a control character)"
    assert hidden_character("H100\u202e") == "U+202E (RIGHT-TO-LEFT OVERRIDE)"
    assert hidden_character("H100\n") == "U+000A (LINE FEED)"
