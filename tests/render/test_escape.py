"""deploykit/render/escape.py: one function per destination, each escaping exactly for it or refusing."""

from __future__ import annotations

import json

import pytest
import yaml

from deploykit.render import escape
from deploykit.render.common import RenderError


def test_exec_words_double_specifiers_and_dollars_and_escape_a_lone_semicolon() -> None:
    assert escape.systemd_exec_word("plain-word=1") == "plain-word=1"
    assert escape.systemd_exec_word("100%") == '"100%%"'
    assert escape.systemd_exec_word("$HOME") == '"$$HOME"'
    assert escape.systemd_exec_word(";") == "\\;"
    assert escape.systemd_exec_word("a\nb") == '"a\\nb"'
    with pytest.raises(RenderError, match="U\\+0000"):
        escape.systemd_exec_word("a\x00b")


def test_environment_quotes_and_doubles_percent_and_refuses_line_breaks() -> None:
    assert escape.systemd_environment("K", "v") == "K=v"
    assert escape.systemd_environment("K", 'a "b" %h\\') == '"K=a \\"b\\" %%h\\\\"'
    for bad in ("a\nExecStartPre=+/bin/true", "a\rb", "a\x00b"):
        with pytest.raises(RenderError, match=r"env\.K: holds the control character"):
            escape.systemd_environment("K", bad)


def test_paths_double_percent_and_refuse_what_systemd_would_split_or_unquote() -> None:
    assert escape.systemd_path("/var/cache/dk-%H", "deploy.cache_dir") == "/var/cache/dk-%%H"
    assert escape.systemd_path("dk-%H", "f", absolute=False) == "dk-%%H"
    for bad in ("/a b", '/a"b', "/a'b", "/a\\b", "/a/../b", "relative", "/a\nb"):
        with pytest.raises(RenderError, match=r"deploy\.cache_dir"):
            escape.systemd_path(bad, "deploy.cache_dir")


def test_description_text_is_one_line_without_specifiers_or_a_continuation() -> None:
    assert escape.systemd_text("serving m%h", "model.served_name") == "serving m%%h"
    assert escape.systemd_text("ends with a backslash\\", "f") == "ends with a backslash"
    with pytest.raises(RenderError, match=r"model\.served_name"):
        escape.systemd_text("a\nDescription=x", "model.served_name")


def test_user_names_are_portable_or_refused() -> None:
    assert escape.systemd_user("vllm") == "vllm"
    for bad in ("root\nUser=root", "Vllm", "a b", "x" * 40, "%u", ""):
        with pytest.raises(RenderError, match=r"deploy\.user"):
            escape.systemd_user(bad)


def test_comment_text_never_leaves_its_line() -> None:
    assert escape.comment("a\nExecStartPre=+x\rb\x00") == "a\\nExecStartPre=+x\\rb\\x00"
    assert escape.comment("é✓ plain") == "é✓ plain"


@pytest.mark.parametrize(
    "text", ["a\nb: c", "'quoted' \"x\"", "#not a comment", "é✓", "a\x00b", "- item", "{x}"]
)
def test_yaml_scalars_read_back_exactly(text: str) -> None:
    written = escape.yaml_scalar(text)
    assert "\n" not in written and written.isascii()
    assert yaml.safe_load(f"key: {written}") == {"key": text} and json.loads(written) == text
