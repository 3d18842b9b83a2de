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
from deploykit.files import OutFile, SetWritten, WriteRefused, write_set
from deploykit.paths import packaged_data_dir, template_dir

if TYPE_CHECKING:
    import jinja2

    from deploykit.plan import Plan
    from deploykit.probe.facts import ProbeFacts
    from deploykit.profile.schema import FixMode, LoadedProfile


RenderError = errors.RenderError  # defined once, in deploykit.errors; raised here


class RenderedFile(BaseModel):
    """One output file, its path relative to the output directory: text, or bytes (the chart's wheel)."""

    path: str
    content: str | bytes
    mode: int = 0o644
    keep: bool = False
    """A file a person fills in (the secrets file): once it exists it is theirs, never overwritten."""
    shared: bool = False
    """A file every profile's set holds alike (the root helper): of no one profile's set, so two profiles'
    sets in one --out may both write it. Every other file is of its profile's alone (`write_files`)."""


class RenderResult(BaseModel):
    """What a renderer produced, and what the person running it should know."""

    files: list[RenderedFile]
    warnings: list[str] = []
    gpus: list[int] | None = None
    """The GPU indices a systemd server unit opens (None: not a systemd rendering)."""


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
    from deploykit.render.escape import comment, yaml_scalar

    env.filters["comment"] = comment  # text inside a `#` line stays on that line, whatever it holds
    env.filters["yaml_scalar"] = yaml_scalar
    return env


def check_node_argv(plan: Plan, node_rank: int, argv: list[str]) -> list[str]:
    """One node's argv of a group against the target vLLM's option table (deploykit.vllm_options), as
    `deploykit plan` checks the plan's own: RenderError when rejected, a warning when it cannot be checked."""
    from deploykit.vllm_args import ArgvRejected
    from deploykit.vllm_options import OptionTableUnavailable, check_serve_argv

    try:
        check_serve_argv(argv, vllm_version=plan.vllm_version)
    except ArgvRejected as exc:
        raise RenderError(
            f"node {node_rank}'s argv is rejected by the parser of vLLM {plan.vllm_version}: {exc}"
        ) from None
    except OptionTableUnavailable as exc:
        return [f"the group's node argvs were not checked: {exc}"]
    return []


def plan_for_render(
    loaded: LoadedProfile, facts: ProbeFacts, overrides: dict[str, FixMode] | None = None
) -> Plan:
    """The same plan `deploykit plan` makes; a plan with errors, or a server open to the network without an
    API key (unless the profile allows it), is not rendered."""
    from deploykit.plan import make_plan, unauthenticated_exposure

    plan = make_plan(loaded, facts, overrides)
    if plan.errors:
        listed = "; ".join(plan.errors)
        raise RenderError(f"the plan for {loaded.path} has {len(plan.errors)} error(s): {listed}")
    exposure = unauthenticated_exposure(loaded.profile)
    if exposure:
        raise RenderError(f"{loaded.path}: refused: {exposure}")
    return plan


def kubernetes_name(name: str, max_length: int = 63) -> str:
    """A DNS-1123 label from a profile name (profile names may hold `.` and `_`)."""
    label = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")
    return label[:max_length].rstrip("-") or "deploykit"


def gpu_count(plan: Plan, loaded: LoadedProfile) -> int:
    """GPUs a unit or pod asks for on its node: the plan's layout (its ranks' GPUs per node, or
    requires.gpu_count when more), read from the plan, never recounted; none for a CPU plan."""
    if plan.platform == "cpu" or loaded.profile.platform == "cpu":
        return 0
    return plan.layout.gpu_request


def plain_env(plan: Plan) -> dict[str, str]:
    """The plan's environment without the secret references (those come from a file or a Secret)."""
    return {key: value for key, value in plan.env.items() if key not in plan.secret_env}


def write_files(
    result: RenderResult, out_dir: Path, *, force: bool = False, owner: str | None = None
) -> SetWritten:
    """Write the set under `out_dir` through `deploykit.files.write_set`: all files or none, never through
    a link, a file a person changed kept unless `force`, a filled-in secrets file always kept. `owner` (the
    profile's name): a file of another profile's set is never written over, whatever `force` says."""
    if out_dir.exists() and not out_dir.is_dir():
        raise RenderError(f"--out {out_dir}: is a file, not a directory; give a directory to write into")
    files = [
        OutFile(
            item.path,
            item.content.encode() if isinstance(item.content, str) else item.content,
            item.mode,
            item.keep,
            None if item.shared else owner,
        )
        for item in result.files
    ]
    try:
        return write_set(out_dir, files, force=force)
    except WriteRefused as exc:
        raise RenderError(f"--out {out_dir}: {exc}") from None
    except OSError as exc:
        where = exc.filename or out_dir
        raise RenderError(f"--out {out_dir}: cannot write {where}: {exc.strerror}") from None


def requirements_refusal(plan: Plan) -> str | None:
    """Why a plan must not be rendered without `--force`: the profile's `requires` fail for the facts (a
    Hopper-only profile on an A100, `requires.gpu_count` 16 on 8 GPUs): the unit or the pod could never run
    there (a pod asking for 16 GPUs stays Pending for ever). None when they pass or were not checked. A
    parallel layout the node cannot hold is a plan error already (deploykit.plan.layout.fit_problem)."""
    if plan.requires.status != "incompatible":
        return None
    return f"the profile's requires fail for these facts: {'; '.join(plan.requires.problems)}"
