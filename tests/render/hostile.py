"""The hostile-profile matrix of issue 30: every string field a profile has, with each character that could
break out of its line, its quotes or its meaning in a unit file, a chart or a shell. Shared by the render
tests (tests/render/test_hostile_profiles.py) and the real-systemd proof (tests/e2e)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deploykit.tinymodel import tiny_model_dir
from tests.profile_variants import profile_variant

# The directive a newline would plant, as the issue found it: `+` runs it as root outside all hardening.
PLANTED_MARK = "/var/lib/dk-planted"
PLANTED = f"x\nExecStartPre=+/usr/bin/touch {PLANTED_MARK}\nX-Y=z"
CONTROL = {"newline": "a\nb", "carriage-return": "a\rb", "nul": "a\x00b", "planted": PLANTED, "tab": "a\tb"}
PRINTABLE = {
    "percent": "a%hb%%c%",
    "double-quote": 'a"b',
    "single-quote": "a'b",
    "backslash": "a\\b\\",
    "unicode": "é✓ñ—日本",
    "dollar": "$HOME${USER}$$",
    "semicolon": ";",
    "space": "a b",
}
PAYLOADS = {**CONTROL, **PRINTABLE}


def field_values(payload: str) -> dict[str, Any]:
    """Dotted profile field → its value carrying `payload`, for every string field a unit or chart uses."""
    return {
        "description": f"d{payload}",
        "model.served_name": f"tiny{payload}",
        "serve.generation_config": f"vllm{payload}",
        "serve.extra_args": ["--chat-template", payload],  # a lone `;` is systemd's command separator
        "env.DK_VALUE": payload,
        "deploy.cache_dir": f"/var/cache/dk{payload}",
        "deploy.user": f"vllm{payload}",
        "deploy.image": f"vllm/vllm-openai{payload}",
        "deploy.namespace": f"ns{payload}",
        "smoke.cases": [{"kind": "completion", "prompt": f"p{payload}", "expect_substring": f"e{payload}"}],
    }


FIELDS = list(field_values("x"))
# A chart is only rendered for a server beyond loopback; the demo model has no API key; its (builtin, local)
# model must be on a volume of the release: the node directory it is built in (systemd ignores the entry).
_TINY_MODELS = str(tiny_model_dir().parent)
BASE_CHANGES: dict[str, Any] = {
    "serve.host": "0.0.0.0",
    "serve.allow_unauthenticated": True,
    "model.volumes": [{"kind": "host_path", "path": _TINY_MODELS, "mount_path": _TINY_MODELS}],
}


def hostile_profile(directory: Path, field: str, payload: str, name: str = "hostile") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    # every field set (to a plain value but the one under test), so a clean render has the same lines
    changes = {**BASE_CHANGES, **field_values("plain"), "name": name, field: field_values(payload)[field]}
    return profile_variant(directory, "demo-cpu", changes)
