"""Profiles: YAML files that say what to serve, on what, and which fixes to use. The schema lives here;
finding and loading the files (with located errors) is `deploykit.profile.load`."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from deploykit import errors

BUILTIN_PREFIX = "builtin:"
BUILTIN_MODELS = ("tiny-llama",)
# Names whose values are secrets: a profile must reference them, and serve redacts their values.
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASS|KEY|CREDENTIAL)", re.I)
# A literal env value with a token's shape is refused whatever its name.
_SECRET_VALUE = re.compile(
    r"\b(hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{16,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16})"
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class FixMode(StrEnum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"


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
    allow_unauthenticated: bool = Field(
        default=False,
        description="serve beyond loopback without an API key (something in front authenticates); "
        "without it `serve` and `render` refuse such a profile",
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
    image: str = "vllm/vllm-openai"  # the tag follows the vLLM version the plan targets
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
            if isinstance(value, str) and (SECRET_NAME.search(key) or _SECRET_VALUE.search(value)):
                why = "its name" if SECRET_NAME.search(key) else "its value has a token's shape"
                raise ValueError(
                    f"env var {key}: looks like a secret ({why}): never write its value in a profile; "
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


class ProfileError(errors.ProfileError):
    """A profile could not be loaded; `issues` lists every problem with its location."""

    def __init__(self, issues: list[ProfileIssue]) -> None:
        self.issues = issues
        super().__init__("\n".join(str(issue) for issue in issues))

    @property
    def details(self) -> list[str]:
        return [str(issue) for issue in self.issues] if len(self.issues) > 1 else []

    @property
    def message(self) -> str:
        if len(self.issues) == 1:
            return str(self.issues[0])
        where = self.issues[0].file if self.issues else "the profile"
        return f"{len(self.issues)} problems in profile {where} (listed above); fix them and run again"


@dataclass(frozen=True)
class LoadedProfile:
    profile: Profile
    path: Path

    @property
    def id(self) -> str:
        return self.profile.profile_id()
