"""A local model's special token ids (pad, bos, eos and the tokenizer's specials): an answer made only of
them carries no words, which the verdict fails; and its vocabulary size, which no generated id reaches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def special_token_ids(model_dir: str | Path | None) -> frozenset[int]:
    """Ids that carry no words (pad, bos, eos, other specials), read from a local model's JSON files."""
    ids: set[int] = set()
    if model_dir is None:
        return frozenset(ids)
    root = Path(model_dir)
    tokenizer = _read_json(root / "tokenizer.json")
    for token in tokenizer.get("added_tokens", []) if isinstance(tokenizer, dict) else []:
        if isinstance(token, dict) and token.get("special") and isinstance(token.get("id"), int):
            ids.add(token["id"])
    for name in ("config.json", "generation_config.json"):
        config = _read_json(root / name)
        for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
            value = config.get(key) if isinstance(config, dict) else None
            values = value if isinstance(value, list) else [value]
            ids.update(v for v in values if isinstance(v, int))
    return frozenset(ids)


def vocab_size(model_dir: str | Path | None) -> int | None:
    """The model's vocabulary size from its config.json (`vocab_size`, or its text model's): every id it
    can emit is below it. None when there is no local model or the config does not say."""
    if model_dir is None:
        return None
    config = _read_json(Path(model_dir) / "config.json")
    if not isinstance(config, dict):
        return None
    for where in (config, config.get("text_config"), config.get("llm_config")):
        size = where.get("vocab_size") if isinstance(where, dict) else None
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            return size
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
