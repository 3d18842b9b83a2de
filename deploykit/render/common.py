"""What the systemd and Helm renderers share: the plan they both start from, the templates, the files out.

Both forms are rendered from one `Plan`, so the vLLM argv and the fix environment are the plan's own lists,
never rebuilt. Nothing here imports torch or vLLM.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from deploykit import errors
from deploykit.paths import packaged_data_dir, template_dir

if TYPE_CHECKING:
    import jinja2

    from deploykit.plan import Plan
    from deploykit.probe.facts import ProbeFacts
    from deploykit.profile.schema import FixMode, LoadedProfile


class RenderError(errors.RenderError):
    """The profile or plan cannot be rendered into this form; the message says what to change."""


class RenderedFile(BaseModel):
    """One output file, its path relative to the output directory."""

    path: str
    content: str
    mode: int = 0o644


class RenderResult(BaseModel):
    """What a renderer produced, and what the person running it should know."""

    files: list[RenderedFile]
    warnings: list[str] = []


def template_root() -> Path:
    found = template_dir()
    if found is None:
        raise RenderError(
            f"deploykit's templates are missing: looked in {packaged_data_dir('templates')} and in a source "
            "checkout's templates/; reinstall deploykit"
        )
    return found


def jinja_environment() -> jinja2.Environment:
    """Strict: a name missing from the context is an error, never an empty string in a unit file."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_root())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    return env


def plan_for_render(
    loaded: LoadedProfile, facts: ProbeFacts, overrides: dict[str, FixMode] | None = None
) -> Plan:
    """The same plan `deploykit plan` makes; a plan with errors is not rendered."""
    from deploykit.plan import make_plan

    plan = make_plan(loaded, facts, overrides)
    if plan.errors:
        raise RenderError("the plan has errors:\n" + "\n".join(f"  - {e}" for e in plan.errors))
    return plan


def kubernetes_name(name: str, max_length: int = 63) -> str:
    """A DNS-1123 label from a profile name (profile names may hold `.` and `_`)."""
    label = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")
    return label[:max_length].rstrip("-") or "deploykit"


def gpu_count(plan: Plan, loaded: LoadedProfile) -> int:
    """GPUs one replica needs: the profile's count, or more when tensor parallelism asks for more."""
    profile = loaded.profile
    if plan.platform == "cpu" or profile.platform == "cpu":
        return 0
    return max(profile.requires.gpu_count, profile.serve.tensor_parallel_size)


def plain_env(plan: Plan) -> dict[str, str]:
    """The plan's environment without the secret references (those come from a file or a Secret)."""
    return {key: value for key, value in plan.env.items() if key not in plan.secret_env}


def write_files(result: RenderResult, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for item in result.files:
        target = out_dir / item.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(item.content)
        target.chmod(item.mode)
        written.append(target)
    return written
