"""A model's special token ids, read from its JSON files."""

from __future__ import annotations

import json
from pathlib import Path

from deploykit.smoke import special_token_ids


def test_special_ids_read_from_the_tiny_model(tiny_model_dir: Path) -> None:
    ids = special_token_ids(tiny_model_dir)
    tokenizer = json.loads((tiny_model_dir / "tokenizer.json").read_text())
    assert ids == {t["id"] for t in tokenizer["added_tokens"] if t["special"]}
    assert 0 in ids and len(ids) == 8
    assert special_token_ids(None) == frozenset()
    assert special_token_ids(tiny_model_dir / "missing") == frozenset()
