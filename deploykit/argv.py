"""The one reader (and writer) of a `vllm serve` argv, seeing it the way vLLM's parser does.

The plan's owned-flag check, the advisories' serving facts (KV-cache dtype, attention backend,
quantization, CUDA graph mode are never declared a second time: they are read from the argv the plan
builds), serve's host and port and trace's eager launch all read or change an argv here, so a spelling one
of them understands is one all of them understand. The forms are the ones vLLM's FlexibleArgumentParser
accepts: `--flag value`, `--flag=value`, underscores for dashes, the short aliases (`-tp`, `-pp`, `-dp`,
`-n`, `-q`, `-cc`, `-sc`, ...), `--no-flag` for booleans, abbreviations (argparse's allow_abbrev, on in
vLLM), and for JSON options (`--compilation-config`) a JSON value or dotted keys
(`--compilation-config.cudagraph_mode=PIECEWISE`); the last setting wins, as in argparse.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

# The short aliases of the options deploykit reads or owns (vllm/engine/arg_utils.py, in every shipped table).
SHORT_ALIASES = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-pcp": "--prefill-context-parallel-size",
    "-dp": "--data-parallel-size",
    "-dpl": "--data-parallel-size-local",
    "-dpn": "--data-parallel-rank",
    "-dpe": "--data-parallel-external-lb",
    "-n": "--nnodes",
    "-r": "--node-rank",
    "-q": "--quantization",
    "-cc": "--compilation-config",
    "-sc": "--speculative-config",
}
# JSON-valued options and their spellings (after _normal, the alias `-cc` reads as the long form).
JSON_OPTIONS = {"--compilation-config": ("--compilation-config", "-cc")}


def _normal(word: str) -> str:
    """`--kv_cache_dtype=fp8` → `--kv-cache-dtype=fp8` (vLLM turns underscores in a flag into dashes);
    `-tp=2` → `--tensor-parallel-size=2`. A word that is no flag is returned as it is."""
    if not word.startswith("-"):
        return word
    key, sep, value = word.partition("=")
    head, dot, rest = key.partition(".")
    if not word.startswith("--"):
        return SHORT_ALIASES.get(head, head) + dot + rest + sep + value
    return head.replace("_", "-") + dot + rest + sep + value


def flag_name(word: str) -> str | None:
    """The flag a word sets, in vLLM's spelling (`--max_num_seqs=8` → `--max-num-seqs`, `-tp` →
    `--tensor-parallel-size`, `--compilation-config.mode` → `--compilation-config`); None for a value."""
    if not word.startswith("-") or word == "-" or _is_number(word):
        return None
    return _normal(word).split("=", 1)[0].split(".", 1)[0]


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def owned_flag(word: str, owned: Collection[str]) -> str | None:
    """The flag of `owned` that `word` sets, however it is spelled: underscores, `=value`, an alias, its
    `--no-` form, or an abbreviation argparse would expand to it; None when it sets none of them."""
    name = flag_name(word)
    if name is None:
        return None
    spellings = {flag: flag for flag in owned}
    spellings.update({"--no-" + flag[2:]: flag for flag in owned if flag.startswith("--")})
    if name in spellings:
        return spellings[name]
    if not name.startswith("--") or name == "--":
        return None
    expanded = {flag for spelling, flag in spellings.items() if spelling.startswith(name)}
    return expanded.pop() if len(expanded) == 1 else None


def _takes_value(argv: Sequence[str], index: int) -> bool:
    """Whether the word after argv[index] is a value (a number such as -1 is one), not the next flag."""
    return index + 1 < len(argv) and flag_name(argv[index + 1]) is None


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value the last `flag` in argv sets (`--flag value` or `--flag=value`), or None when absent."""
    flag = _normal(flag)
    found: str | None = None
    words = [_normal(w) for w in argv]
    for index, word in enumerate(words):
        if word == flag and _takes_value(words, index):
            found = words[index + 1]
        elif word.startswith(flag + "="):
            found = word[len(flag) + 1 :]
    return found


def flag_switch(argv: Sequence[str], flag: str) -> bool | None:
    """A boolean flag: True for `--x`, False for `--no-x`, None when neither appears (the last wins)."""
    flag = _normal(flag)
    negative = "--no-" + flag[2:]
    state: bool | None = None
    for word in (_normal(w) for w in argv):
        if word == flag:
            state = True
        elif word == negative:
            state = False
    return state


def json_option(argv: Sequence[str], option: str) -> dict[str, Any]:
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


def value_or(argv: Sequence[str], flag: str, default: str) -> str:
    """The value the argv gives `flag` (as flag_value reads it), else `default`."""
    found = flag_value(argv, flag)
    return default if found is None else found


def with_port(argv: Sequence[str], port: int) -> list[str]:
    """The argv with its `--port` setting (any spelling) replaced by `port`."""
    return apply_args(argv, ["--port", str(port)])


def apply_args(argv: Sequence[str], args: list[str]) -> list[str]:
    """argv with a workaround's arguments in force: every earlier setting of the same flag removed (its
    value too), then the arguments appended, so the launch reads as one setting per flag."""
    result = list(argv)
    index = 0
    while index < len(args):
        word = args[index]
        has_value = "=" not in word and _takes_value(args, index)
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
