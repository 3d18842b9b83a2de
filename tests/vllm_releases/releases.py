"""Which vLLM release this process imports, and the environment that imports another one.

The tier (tests/vllm_releases) runs its checks in this process against the installed vLLM (0.32, the CPU
build) and, for every other supported release, in a child pytest whose `import vllm` gives that release's
Python sources (tools/fetch-vllm-sources.sh, tools/vllm_tables.py's release_env). What the release tool
(tools/vllm_release.py) needs as well lives in tools/ (vllm_tables.py, vllm_tier.py), imported from there.
"""

from __future__ import annotations

import os
from pathlib import Path

from tools.vllm_tables import installed_release as importable_release
from tools.vllm_tables import vllm_root
from tools.vllm_tier import CHILD_ENV

REPO = Path(__file__).resolve().parents[2]
__all__ = ["NEXT_RELEASE", "REPO", "importable_release", "in_child", "vllm_root"]


def in_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def next_release() -> str:
    """The release after the newest one deploykit ships a table for (0.35.0 while 0.34.0 is the newest):
    the tests' "not known, outside the range" version, so adding a release edits none of them."""
    from deploykit.vllm_tables import NEWEST_KNOWN_RELEASE

    major, minor, _ = (int(part) for part in NEWEST_KNOWN_RELEASE.split("."))
    return f"{major}.{minor + 1}.0"


NEXT_RELEASE = next_release()
