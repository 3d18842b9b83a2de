"""Strings on their way into a unit file, a chart or a shell: one function per destination, each either
escaping the string for exactly that destination or refusing it with one line that names the field.

Profiles refuse control characters at load (deploykit/profile/load.py), so a refusal here is the second
wall: a string from elsewhere (a facts file, an option) can never add a line to a unit or a manifest.

- `systemd_exec_word`: one argv word of ExecStart= (quotes and C escapes, `%` and `$` doubled, a lone `;`).
- `systemd_environment`: one Environment= assignment (quoted, C escapes, `%` doubled).
- `systemd_path`: an absolute path in ReadWritePaths= (and a relative one in CacheDirectory=): `%` doubled,
  nothing systemd would split or unquote.
- `systemd_text`: Description= and other free text taken literally: `%` doubled, one line.
- `systemd_user`: User=/Group=: a valid user name or nothing.
- `comment`: text inside a `#` comment line of a unit or a YAML file: one line whatever it holds.
- `yaml_scalar`: one double-quoted YAML (= JSON) string (Chart.yaml; values.yaml is dumped by PyYAML).
Shell words are `shlex.quote`'s, in `deploykit plan --format shell` (deploykit/plan/model.py, Plan.shell),
the one shell writer.
"""

from __future__ import annotations

import json
import re

from deploykit.errors import RenderError
from deploykit.untrusted_text import control_character

# Words systemd takes literally: no quotes, no escapes, no `$` expansion, no `%` specifiers.
_PLAIN_WORD = re.compile(r"^[A-Za-z0-9_@+,./:=-]+$")
# systemd's own rule for user names it accepts everywhere (and useradd's default): portable names.
_USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")
# What a systemd path setting would split, unquote or continue on: white space, quotes, a backslash.
_PATH_BREAKERS = re.compile(r"[\s\"'\\]")


def _one_line(text: str, field: str) -> None:
    found = control_character(text)
    if found:
        raise RenderError(
            f"{field}: holds the control character {found}; it cannot be written to a unit file"
        )


def systemd_exec_word(word: str, field: str = "ExecStart") -> str:
    """One argv word for ExecStart=: `%` and `$` doubled (no specifier or variable expansion), quoted with
    C escapes when it holds anything but plain characters (a line feed, tab or carriage return as `\\n`,
    `\\t`, `\\r`; any other control character refused); a lone `;` (systemd's command separator) as `\\;`."""
    _one_line(word.translate(_EXEC_ESCAPES), field)
    if word == ";":
        return "\\;"
    escaped = word.replace("%", "%%").replace("$", "$$")
    if _PLAIN_WORD.match(word):
        return escaped
    escaped = escaped.replace("\\", "\\\\").replace('"', '\\"').translate(_EXEC_ESCAPES)
    return f'"{escaped}"'


_EXEC_ESCAPES = str.maketrans({"\n": "\\n", "\t": "\\t", "\r": "\\r"})


def systemd_environment(key: str, value: str, field: str = "env") -> str:
    """Environment= value: `%` doubled, quoted with backslash escapes (no `$` expansion happens here)."""
    _one_line(key, field)
    _one_line(value, f"{field}.{key}")
    text = f"{key}={value}"
    if _PLAIN_WORD.match(text):
        return text
    return '"' + text.replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_path(path: str, field: str, *, absolute: bool = True) -> str:
    """A path for ReadWritePaths= (absolute) or CacheDirectory= (relative): `%` doubled; white space,
    quotes and backslashes refused (systemd would split or unquote there), and so is `..`."""
    _one_line(path, field)
    if absolute != path.startswith("/"):
        raise RenderError(f"{field}: {path!r} must be {'an absolute' if absolute else 'a relative'} path")
    if _PATH_BREAKERS.search(path):
        raise RenderError(
            f"{field}: {path!r} holds white space, a quote or a backslash, which systemd's path settings "
            "split or unquote; choose a path without them"
        )
    if ".." in path.split("/"):
        raise RenderError(f"{field}: {path!r} must not hold `..`")
    return path.replace("%", "%%")


def systemd_text(text: str, field: str) -> str:
    """Description= and other settings systemd takes literally to the end of the line: `%` doubled, one
    line, and no trailing backslash (which would continue the setting on the next line)."""
    _one_line(text, field)
    return text.replace("%", "%%").rstrip("\\ ")


def systemd_user(name: str, field: str = "deploy.user") -> str:
    """User=/Group=: a portable user name (lower case letters, digits, `_`, `-`), or refused."""
    if not _USER_NAME.match(name):
        raise RenderError(
            f"{field}: {name!r} is not a valid user name (lower case letters, digits, `_` and `-`, "
            "starting with a letter or `_`, at most 31 characters)"
        )
    return name


def comment(text: object) -> str:
    """Text inside a `#` comment line: every control character written as its escape, so nothing after
    it can start a line of its own."""
    return "".join(
        char.encode("unicode_escape").decode("ascii") if control_character(char) else char
        for char in str(text)
    )


def yaml_scalar(text: str) -> str:
    """One YAML double-quoted scalar (JSON's string syntax is a subset of it), ASCII only."""
    return json.dumps(text, ensure_ascii=True)
