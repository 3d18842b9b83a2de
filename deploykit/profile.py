"""Profiles: YAML files that say what to serve, on what, and which fixes to use.

Every error — YAML syntax, duplicate keys, wrong types, bad values, unknown keys, a missing or empty
file — is reported as `FILE:LINE:COL: field.path: message`, all of them at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from deploykit.fixes.base import FixMode

BUILTIN_PREFIX = "builtin:"
BUILTIN_MODELS = ("tiny-llama",)
_SECRET_NAME = re.compile(
    r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL)", re.I
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SecretRef(_Strict):
    """A value taken from the launching process's environment at launch time, never stored."""

    secret: Annotated[str, Field(pattern=_ENV_NAME.pattern)]


class ModelSpec(_Strict):
    source: str = Field(description="local directory, hub id, or builtin:tiny-llama")
    served_name: str | None = None
    checkpoint_dtype: Literal["bfloat16", "float16", "float32"] | None = Field(
        default=None, description="read from config.json when the model is local; state it otherwise"
    )
    architecture: str | None = Field(default=None, description="e.g. Gemma4UnifiedForConditionalGeneration")
    multimodal: bool = False

    @field_validator("source")
    @classmethod
    def _known_builtin(cls, value: str) -> str:
        if value.startswith(BUILTIN_PREFIX) and value[len(BUILTIN_PREFIX) :] not in BUILTIN_MODELS:
            raise ValueError(
                f"unknown builtin model; known: {', '.join(BUILTIN_PREFIX + m for m in BUILTIN_MODELS)}"
            )
        if not value.strip():
            raise ValueError("must not be empty")
        return value


class LoraSpec(_Strict):
    enabled: bool = False
    adapters: dict[str, str] = Field(default_factory=dict, description="name → local path or hub id")
    max_lora_rank: Annotated[int, Field(gt=0, le=1024)] = 16
    max_loras: Annotated[int, Field(gt=0, le=256)] = 1

    @model_validator(mode="after")
    def _adapters_need_lora(self) -> LoraSpec:
        if self.adapters and not self.enabled:
            raise ValueError("adapters are listed but `enabled` is false")
        return self


class ServeSettings(_Strict):
    dtype: Literal["auto", "bfloat16", "float16", "half", "float32", "float"] = "auto"
    max_model_len: Annotated[int, Field(gt=0)] | None = None
    tensor_parallel_size: Annotated[int, Field(ge=1, le=64)] = 1
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = None
    enforce_eager: bool = False
    max_num_seqs: Annotated[int, Field(gt=0)] | None = None
    kv_cache_memory_bytes: Annotated[str, Field(pattern=r"^\d+[KMGT]?$")] | None = None
    generation_config: str | None = None
    model_runner: Literal["auto", "v1", "v2"] = "auto"
    lora: LoraSpec = Field(default_factory=LoraSpec)
    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    api_key_env: Annotated[str, Field(pattern=_ENV_NAME.pattern)] | None = Field(
        default=None, description="name of the environment variable that holds the server's API key"
    )
    extra_args: list[str] = Field(default_factory=list, description="further `vllm serve` flags, verbatim")


class Requires(_Strict):
    min_compute_capability: Annotated[str, Field(pattern=r"^\d+\.\d+$")] | None = None
    architectures: list[
        Literal["kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"]
    ] = Field(default_factory=list)
    min_memory_mib: Annotated[int, Field(gt=0)] | None = None
    gpu_count: Annotated[int, Field(ge=1)] = 1


class FixModes(_Strict):
    fp32_projection: FixMode = FixMode.AUTO
    matmul_lora: FixMode = FixMode.AUTO
    device_penalties: FixMode = FixMode.AUTO


class Workload(_Strict):
    penalties: bool = Field(
        default=False, description="requests will set repetition/presence/frequency penalties"
    )
    concurrency: Annotated[int, Field(gt=0)] | None = None


SmokeKind = Literal[
    "completion",
    "chat",
    "image",
    "lora_long",
    "penalties",
    # Consistency: the same greedy question must get the same answer.
    "repeat",
    "long_then_short",
    "prefix_cache",
    "batch",
]
CONSISTENCY_KINDS: tuple[SmokeKind, ...] = ("repeat", "long_then_short", "prefix_cache", "batch")


class SmokeCase(_Strict):
    kind: SmokeKind
    prompt: str | None = None
    expect_substring: str | None = None
    max_tokens: Annotated[int, Field(gt=0, le=4096)] = 16
    adapter: str | None = None
    prompt_tokens: Annotated[int, Field(gt=0)] | None = Field(
        default=None,
        description="long_then_short / prefix_cache: the long prompt's length in tokens "
        "(default: 512, or as long as serve.max_model_len allows)",
    )
    batch_size: Annotated[int, Field(ge=2, le=64)] = Field(
        default=4, description="batch: how many identical requests are sent at once"
    )


class SmokeSpec(_Strict):
    timeout_s: Annotated[float, Field(gt=0)] = 120.0
    cases: list[SmokeCase] | None = Field(default=None, description="null: derived from the profile")
    tie_tolerance: Annotated[float, Field(ge=0)] = Field(
        default=0.05,
        description="a divergence where the top-2 logprob gap is below this is a near tie: a warning",
    )
    logprob_tolerance: Annotated[float, Field(ge=0)] = Field(
        default=0.05, description="prefix_cache: how far the chosen tokens' logprobs may move on a cache hit"
    )


class DeploySpec(_Strict):
    startup_timeout_s: Annotated[int, Field(gt=0)] = 900
    user: str = "vllm"
    image: str = "vllm/vllm-openai:latest"
    replicas: Annotated[int, Field(ge=1)] = 1
    cache_dir: str = "/var/cache/deploykit"
    namespace: str | None = None


class Profile(_Strict):
    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")]
    description: str = ""
    platform: Literal["cuda", "cpu"] = "cuda"
    vllm_version: str | None = Field(
        default=None, description="the vLLM the deployment runs; default installed"
    )
    model: ModelSpec
    serve: ServeSettings = Field(default_factory=ServeSettings)
    env: dict[str, str | SecretRef] = Field(default_factory=dict)
    requires: Requires = Field(default_factory=Requires)
    workload: Workload = Field(default_factory=Workload)
    fixes: FixModes = Field(default_factory=FixModes)
    smoke: SmokeSpec = Field(default_factory=SmokeSpec)
    deploy: DeploySpec = Field(default_factory=DeploySpec)

    @field_validator("env")
    @classmethod
    def _no_secret_values(cls, env: dict[str, str | SecretRef]) -> dict[str, str | SecretRef]:
        for key, value in env.items():
            if not _ENV_NAME.match(key):
                raise ValueError(f"env var {key}: not a valid environment variable name")
            if isinstance(value, str) and _SECRET_NAME.search(key):
                raise ValueError(
                    f"env var {key}: looks like a secret: never write its value in a profile; "
                    f"use `{key}: {{secret: {key}}}` to take it from the environment at launch"
                )
        return env

    def profile_id(self) -> str:
        """sha256 of the canonical form: one id names one exact configuration, whatever the formatting."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def served_name(self) -> str:
        return self.model.served_name or self.name


@dataclass(frozen=True)
class ProfileIssue:
    file: str
    line: int
    column: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.field}: {self.message}"


class ProfileError(Exception):
    """A profile could not be loaded; `issues` lists every problem with its location."""

    def __init__(self, issues: list[ProfileIssue]) -> None:
        self.issues = issues
        super().__init__("\n".join(str(issue) for issue in issues))


@dataclass(frozen=True)
class LoadedProfile:
    profile: Profile
    path: Path

    @property
    def id(self) -> str:
        return self.profile.profile_id()


# --- finding profiles -------------------------------------------------------------------------------


def shipped_profile_dirs() -> list[Path]:
    """Where shipped profiles live: the repo (editable install) and <prefix>/share/deploykit (wheel)."""
    here = Path(__file__).resolve().parent
    candidates = [here.parent / "profiles", Path(sys.prefix) / "share" / "deploykit" / "profiles"]
    return [c for c in candidates if c.is_dir()]


def user_profile_dir() -> Path:
    env = os.environ.get("DEPLOYKIT_PROFILE_DIR")
    if env:
        return Path(env)
    from platformdirs import user_config_dir

    return Path(user_config_dir("deploykit")) / "profiles"


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
    seen: dict[str, Path] = {}
    for directory in [*shipped_profile_dirs(), user_profile_dir(), *([extra_dir] if extra_dir else [])]:
        if directory.is_dir():
            for path in sorted(directory.glob("*.y*ml")):
                seen[path.name] = path  # later directories override shipped ones of the same name
    return sorted(seen.values(), key=lambda p: p.name)


# --- loading with located errors --------------------------------------------------------------------

Positions = dict[tuple[str | int, ...], tuple[int, int]]


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _to_python(
    node: yaml.Node, path: tuple[str | int, ...], positions: Positions, issues: list[ProfileIssue], file: str
) -> Any:
    positions.setdefault(path, _mark(node))
    if isinstance(node, yaml.MappingNode):
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _to_python(key_node, (*path, "<key>"), {}, issues, file)
            key_path = (*path, key if isinstance(key, (str, int)) else str(key))
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
    return yaml.SafeLoader("").construct_object(node, deep=True)


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
    if kind == "extra_forbidden":
        return "unknown key (check the spelling; see docs/profiles.md for every field)"
    if kind == "missing":
        return "required field is missing"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def parse_profile(text: str, file: str = "<profile>") -> Profile:
    issues: list[ProfileIssue] = []
    if not text.strip():
        raise ProfileError([ProfileIssue(file, 1, 1, "(top level)", "the profile is empty")])
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        raise ProfileError(
            [ProfileIssue(file, line, column, "(yaml)", f"YAML syntax error: {problem}")]
        ) from None
    except yaml.YAMLError as exc:
        raise ProfileError([ProfileIssue(file, 1, 1, "(yaml)", f"YAML error: {exc}")]) from None
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
        for error in exc.errors():
            loc = _refine_env_location(tuple(error["loc"]), str(error["msg"]))
            path, (line, column) = _locate(loc, positions, at_key=error["type"] == "extra_forbidden")
            issues.append(ProfileIssue(file, line, column, _dotted(path), _pydantic_message(error)))
        issues.sort(key=lambda issue: (issue.line, issue.column))
        raise ProfileError(_unique(issues)) from None
    if issues:
        raise ProfileError(issues)
    return profile


def _refine_env_location(loc: tuple[str | int, ...], message: str) -> tuple[str | int, ...]:
    """The env validator sees the whole mapping; point its error at the variable it names."""
    match = re.search(r"env var ([A-Za-z_][A-Za-z0-9_]*):", message)
    return ("env", match.group(1)) if loc == ("env",) and match else loc


def _unique(issues: list[ProfileIssue]) -> list[ProfileIssue]:
    return list(dict.fromkeys(issues))


def load_profile(name_or_path: str) -> LoadedProfile:
    path = resolve_profile_path(name_or_path)
    try:
        text = path.read_text()
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
    except OSError as exc:
        raise ProfileError(
            [ProfileIssue(str(path), 1, 1, "(file)", f"cannot read: {exc.strerror}")]
        ) from None
    return LoadedProfile(profile=parse_profile(text, str(path)), path=path)
