"""Shipped profiles with a few fields changed, written as new files: how tests make a profile variant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.vllm_harness import REPO

PROFILES = REPO / "profiles"


def profile_variant(directory: Path, base: str, changes: dict[str, Any]) -> Path:
    """`base` (a shipped profile's name) with dotted keys (`serve.host`) replaced; the file is named after
    the resulting profile's name."""
    data = yaml.safe_load((PROFILES / f"{base}.yaml").read_text())
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    path = directory / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
