"""Finding profiles (user and shipped directories) and loading them with located errors.

Every error — YAML syntax, duplicate keys, wrong types, bad values, unknown keys, a missing or empty
file — is reported as `FILE:LINE:COL: field.path: message`, all of them at once.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from deploykit.input_files import InputFileError, compose_yaml, read_text
from deploykit.paths import shipped_profile_dirs, user_profile_dir
from deploykit.profile.schema import LoadedProfile, Positions, Profile, ProfileError, ProfileIssue
from deploykit.untrusted_text import control_character

# --- finding profiles -------------------------------------------------------------------------------


def resolve_profile_path(name_or_path: str) -> Path:
    """A path as given, else a bare name looked up among user and shipped profiles (`.yaml` optional)."""
    given = Path(name_or_path).expanduser()
    if given.exists() or os.sep in name_or_path:
        return given
    names = [name_or_path] if name_or_path.endswith((".yaml", ".yml")) else [f"{name_or_path}.yaml"]
    for directory in [user_profile_dir(), *shipped_profile_dirs()]:
        for name in names:
            if (directory / name).is_file():
                return directory / name
    return given


def list_profile_paths(extra_dir: Path | None = None) -> list[Path]:
    if extra_dir is not None and not extra_dir.is_dir():
        raise ProfileError(
            [ProfileIssue(str(extra_dir), 1, 1, "(--dir)", "not a directory: give a directory of profiles")]
        )
    seen: dict[str, Path] = {}
    for directory in [*shipped_profile_dirs(), user_profile_dir(), *([extra_dir] if extra_dir else [])]:
        if directory.is_dir():
            for path in sorted(directory.glob("*.y*ml")):
                seen[path.name] = path  # later directories override shipped ones of the same name
    return sorted(seen.values(), key=lambda p: p.name)


# --- loading with located errors --------------------------------------------------------------------


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _to_python(
    node: yaml.Node, path: tuple[str | int, ...], positions: Positions, issues: list[ProfileIssue], file: str
) -> Any:
    positions.setdefault(path, _mark(node))
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _to_python(key_node, (*path, "<key>"), {}, [], file)
            key_path = (*path, key if isinstance(key, (str, int)) else str(key))
            _refuse_control_characters(key_node, key, key_path, issues, file, "its name")
            if key in result:
                line, column = _mark(key_node)
                issues.append(ProfileIssue(file, line, column, _dotted(key_path), "duplicate key"))
                continue
            positions[key_path] = _mark(key_node)
            result[key] = _to_python(value_node, key_path, positions, issues, file)
            if isinstance(value_node, yaml.ScalarNode):
                positions[(*key_path, "<value>")] = _mark(value_node)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            items.append(_to_python(item, (*path, index), positions, issues, file))
            if isinstance(item, yaml.ScalarNode):
                positions[(*path, index, "<value>")] = _mark(item)
        return items
    value = yaml.SafeLoader("").construct_object(node, deep=True)
    if path[-1:] != ("<key>",):
        _refuse_control_characters(node, value, path, issues, file, "its value")
    return value


def _refuse_control_characters(
    node: yaml.Node, value: Any, path: tuple[str | int, ...], issues: list[ProfileIssue], file: str, what: str
) -> None:
    """No string in a profile may hold a control character: each one could end a line in a unit file, a
    header or a manifest and start one of the profile's own making (a `\\n` in an env value writing
    `ExecStartPre=+...` into the unit). One located line, the character named, never echoed."""
    found = control_character(value) if isinstance(value, str) else None
    if found:
        line, column = _mark(node)
        issues.append(
            ProfileIssue(
                file,
                line,
                column,
                _dotted(path),
                f"{what} holds the control character {found}: profiles take no control characters "
                "(line breaks, tabs, NUL); write it on one line without them",
            )
        )


def _dotted(path: tuple[str | int, ...]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _locate(
    loc: tuple[str | int, ...], positions: Positions, at_key: bool
) -> tuple[tuple[str | int, ...], tuple[int, int]]:
    """The longest prefix of a pydantic error location that exists in the YAML, and where it is."""
    clean = tuple(part for part in loc if not _is_union_tag(part))
    for cut in range(len(clean), -1, -1):
        prefix = clean[:cut]
        value_position = positions.get((*prefix, "<value>"))
        if prefix in positions:
            # Point at the value for type/value errors on a leaf, at the key for unknown keys.
            if cut == len(clean) and value_position and not at_key:
                return clean, value_position
            return clean, positions[prefix]
    return clean, (1, 1)


def _is_union_tag(part: str | int) -> bool:
    # pydantic puts the union member's type in the location ("str", "SecretRef", "int", "constrained-int").
    return isinstance(part, str) and (part in {"str", "int", "float", "bool", "SecretRef"} or "[" in part)


def _pydantic_message(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden" and tuple(error["loc"]) == ("schema_version",):
        return (
            "a profile has no schema_version (a saved facts file does): remove this line; "
            "see docs/profiles.md for every field"
        )
    if kind == "extra_forbidden":
        return "unknown key (check the spelling; see docs/profiles.md for every field)"
    if kind == "missing":
        return "required field is missing"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def parse_profile(text: str, file: str = "<profile>") -> Profile:
    return _parse_located(text, file)[0]


def _parse_located(text: str, file: str) -> tuple[Profile, Positions]:
    """The profile and where each of its fields is in `text` (for checks made after loading: `located`)."""
    issues: list[ProfileIssue] = []
    if not text.strip():
        raise ProfileError([ProfileIssue(file, 1, 1, "(top level)", "the profile is empty")])
    try:
        node = compose_yaml(text)
    except InputFileError as exc:
        raise ProfileError([ProfileIssue(file, exc.line, exc.column, "(yaml)", exc.reason)]) from None
    if node is None:
        raise ProfileError([ProfileIssue(file, 1, 1, "(top level)", "the profile is empty")])
    positions: Positions = {}
    data = _to_python(node, (), positions, issues, file)
    if not isinstance(data, dict):
        line, column = _mark(node)
        issues.append(
            ProfileIssue(file, line, column, "(top level)", "a profile must be a mapping of fields")
        )
        raise ProfileError(issues)
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        refused = {issue.field for issue in issues}  # a control character: that field's one line says it
        for error in exc.errors():
            loc = _refine_env_location(tuple(error["loc"]), str(error["msg"]))
            path, (line, column) = _locate(loc, positions, at_key=error["type"] == "extra_forbidden")
            if _dotted(path) not in refused:
                issues.append(ProfileIssue(file, line, column, _dotted(path), _pydantic_message(error)))
        issues.sort(key=lambda issue: (issue.line, issue.column))
        raise ProfileError(_unique(issues)) from None
    if issues:
        raise ProfileError(issues)
    return profile, positions


def _refine_env_location(loc: tuple[str | int, ...], message: str) -> tuple[str | int, ...]:
    """The env validator sees the whole mapping; point its error at the variable it names."""
    match = re.search(r"env var ([A-Za-z_][A-Za-z0-9_]*):", message)
    return ("env", match.group(1)) if loc == ("env",) and match else loc


def _unique(issues: list[ProfileIssue]) -> list[ProfileIssue]:
    return list(dict.fromkeys(issues))


def load_profile(name_or_path: str) -> LoadedProfile:
    """The profile at a path or of a bare name, read through `deploykit.input_files` (a regular file of
    bounded size, YAML without aliases): no file can hang or crash the loader."""
    path = resolve_profile_path(name_or_path)
    try:
        text = read_text(path)
    except FileNotFoundError:
        where = ", ".join(str(d) for d in [user_profile_dir(), *shipped_profile_dirs()])
        raise ProfileError(
            [
                ProfileIssue(
                    str(path),
                    1,
                    1,
                    "(file)",
                    f"no such profile file (also looked for a named profile in {where})",
                )
            ]
        ) from None
    except InputFileError as exc:
        reason = exc.reason
        if reason.startswith("not UTF-8"):
            reason += ": a profile is a YAML file saved as UTF-8"
        raise ProfileError([ProfileIssue(str(path), 1, 1, "(file)", reason)]) from None
    profile, positions = _parse_located(text, str(path))
    return LoadedProfile(profile=profile, path=path, positions=positions)


def located(loaded: LoadedProfile, field: tuple[str | int, ...], message: str) -> str:
    """`message` as a profile error at `field` (`("env", "NAME")`, `("serve", "extra_args", 2)`), for a check
    that needs more than the file (the plan's target vLLM): `FILE:LINE:COL: env.NAME: message`, the line of
    the key (a mapping entry) or of the item (a list's). `FILE: field: message` for a profile made in code."""
    position = loaded.positions.get(field)
    if position is None:
        return f"{loaded.path}: {_dotted(field)}: {message}"
    return str(ProfileIssue(str(loaded.path), position[0], position[1], _dotted(field), message))
