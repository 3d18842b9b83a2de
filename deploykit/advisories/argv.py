"""Reading serving facts from a `vllm serve` argv, and changing it, the way vLLM's parser sees it.

The profile's KV-cache dtype, attention backend, quantization and CUDA graph mode are never declared a
second time for advisories: they are read here from the argv the plan builds. The forms understood are
the ones vLLM's FlexibleArgumentParser accepts: `--flag value`, `--flag=value`, underscores for dashes,
`--no-flag` for booleans, and for JSON options (`--compilation-config`, alias `-cc`) a JSON value or dotted
keys (`--compilation-config.cudagraph_mode=PIECEWISE`); the last setting wins, as in argparse.
"""

from __future__ import annotations

import json
from typing import Any

# JSON-valued options and their aliases (vllm/engine/arg_utils.py: "--compilation-config", "-cc").
JSON_OPTIONS = {"--compilation-config": ("--compilation-config", "-cc")}


def _normal(word: str) -> str:
    """`--kv_cache_dtype=fp8` → `--kv-cache-dtype=fp8` (vLLM turns underscores in a flag into dashes)."""
    if not word.startswith("--"):
        return word
    key, sep, value = word.partition("=")
    head, dot, rest = key.partition(".")
    return head.replace("_", "-") + dot + rest + sep + value


def _takes_value(argv: list[str], index: int) -> bool:
    return index + 1 < len(argv) and not argv[index + 1].startswith("-")


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value the last `flag` in argv sets (`--flag value` or `--flag=value`), or None when absent."""
    found: str | None = None
    words = [_normal(w) for w in argv]
    for index, word in enumerate(words):
        if word == flag and _takes_value(words, index):
            found = words[index + 1]
        elif word.startswith(flag + "="):
            found = word[len(flag) + 1 :]
    return found


def flag_switch(argv: list[str], flag: str) -> bool | None:
    """A boolean flag: True for `--x`, False for `--no-x`, None when neither appears (the last wins)."""
    negative = "--no-" + flag[2:]
    state: bool | None = None
    for word in (_normal(w) for w in argv):
        if word == flag:
            state = True
        elif word == negative:
            state = False
    return state


def json_option(argv: list[str], option: str) -> dict[str, Any]:
    """A JSON option's settings, the JSON value and dotted keys merged in argv order."""
    names = JSON_OPTIONS.get(option, (option,))
    merged: dict[str, Any] = {}
    words = [_normal(w) for w in argv]
    for index, word in enumerate(words):
        key, _, inline = word.partition("=")
        name, dot, path = key.partition(".")
        if name not in names:
            continue
        text = inline if "=" in word else (words[index + 1] if index + 1 < len(words) else "")
        if dot:
            value: Any = _json_or_text(text)
            for part in reversed(path.split(".")):
                value = {part: value}
            _merge(merged, value)
        else:
            loaded = _json_or_text(text)
            if isinstance(loaded, dict):
                _merge(merged, loaded)
    return merged


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def apply_args(argv: list[str], args: list[str]) -> list[str]:
    """argv with a workaround's arguments in force: every earlier setting of the same flag removed (its
    value too), then the arguments appended, so the launch reads as one setting per flag."""
    result = list(argv)
    index = 0
    while index < len(args):
        word = args[index]
        has_value = index + 1 < len(args) and not args[index + 1].startswith("-") and "=" not in word
        pair = args[index : index + 2] if has_value else [word]
        result = _set(result, pair)
        index += len(pair)
    return result


def _set(argv: list[str], pair: list[str]) -> list[str]:
    flag = _normal(pair[0]).split("=", 1)[0]
    name, dot, path = flag.partition(".")
    aliases = JSON_OPTIONS.get(name, (name,))
    if dot:
        return _set_json_key(argv, aliases, path, pair)
    # `--no-x` replaces `--x` as `--x` replaces `--no-x`.
    negative = "--" + name[5:] if name.startswith("--no-") else "--no-" + name[2:]
    kept: list[str] = []
    skip = False
    words = [_normal(w) for w in argv]
    for index, word in enumerate(words):
        if skip:
            skip = False
            continue
        key = word.split("=", 1)[0]
        if key in aliases or key == negative:
            skip = "=" not in word and len(pair) == 2 and _takes_value(words, index)
            continue
        kept.append(argv[index])
    return [*kept, *pair]


def _set_json_key(argv: list[str], aliases: tuple[str, ...], path: str, pair: list[str]) -> list[str]:
    """A dotted key: merged into the option's JSON value when argv has one (so its other keys stay), else
    appended as given. Earlier settings of the same dotted key are removed."""
    text = pair[0].split("=", 1)[1] if "=" in pair[0] else pair[1]
    value: Any = _json_or_text(text)
    keys = path.split(".")
    words = [_normal(w) for w in argv]
    kept: list[str] = []
    skip = False
    json_at: int | None = None
    for index, word in enumerate(words):
        if skip:
            skip = False
            continue
        key = word.split("=", 1)[0]
        name, dot, sub = key.partition(".")
        if name in aliases and dot and sub == path:
            skip = "=" not in word
            continue
        plain = name in aliases and not dot and "=" not in word and index + 1 < len(words)
        if plain and isinstance(_json_or_text(words[index + 1]), dict):
            json_at = len(kept) + 1
        kept.append(argv[index])
    if json_at is None:
        return [*kept, *pair]
    loaded = _json_or_text(kept[json_at])
    target = loaded
    for part in keys[:-1]:
        target = target.setdefault(part, {})
    target[keys[-1]] = value
    kept[json_at] = json.dumps(loaded)
    return kept
