"""Profiles: YAML files that say what to serve, on what, and which fixes to use. The schema lives here;
finding and loading the files (with located errors) is `deploykit.profile.load`."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

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


class AdvisoryMode(StrEnum):
    """What a profile does with a known-bad combination (`deploykit advisories`) that applies to it."""

    APPLY = "apply"
    WARN = "warn"
    IGNORE = "ignore"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_stray_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML 1.1 reads unquoted on/off/yes/no/true/false as booleans, and pydantic would take True as
        the number 1 (`max_model_len: true` → `--max-model-len 1`): a boolean only where one is meant."""
        field = cls.model_fields.get(info.field_name or "")
        if field is None:
            return value
        if isinstance(value, bool):
            _refuse_stray_boolean(value, field.annotation)
        elif isinstance(value, dict) and get_origin(field.annotation) is dict:
            value_type = get_args(field.annotation)[1]
            for key, item in value.items():
                if isinstance(item, bool) and not _accepts(value_type, bool):
                    raise ValueError(f"env var {key}: {_boolean_hint(item)}")
        return value


def _accepts(annotation: Any, kind: type) -> bool:
    """Whether `annotation` (unions and Annotated unwrapped) names `kind` itself."""
    if annotation is kind:
        return True
    return any(_accepts(arg, kind) for arg in get_args(annotation) if arg is not type(None))


def _refuse_stray_boolean(value: bool, annotation: Any) -> None:
    if _accepts(annotation, bool):
        return
    if _accepts(annotation, int) or _accepts(annotation, float):
        raise ValueError(f"{str(value).lower()} is a boolean, not a number: write a number")
    raise ValueError(_boolean_hint(value))


def _boolean_hint(value: bool) -> str:
    word, example = ("on/yes/true", "on") if value else ("off/no/false", "off")
    return f'YAML reads unquoted {word} as the boolean {str(value).lower()}: quote it, e.g. "{example}"'


class SecretRef(_Strict):
    """A value taken from the launching process's environment at launch time, never stored."""

    secret: Annotated[str, Field(pattern=_ENV_NAME.pattern)]


_K8S_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
_ABSOLUTE_PATH = r"^/[^:\s]*$"
_HUB_ID = r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$"
_VOLUME_FIELDS: dict[str, tuple[str, ...]] = {
    "pvc": ("claim",),
    "host_path": ("path",),
    "image": ("image",),
    "download": ("repo",),
}
_OPTIONAL_FIELDS: dict[str, tuple[str, ...]] = {
    "pvc": ("sub_path",),
    "host_path": (),
    "image": ("sub_path",),
    "download": ("claim", "revision", "sub_path"),
}


class ModelVolume(_Strict):
    """Where a pod (`render helm`) finds a local model or adapter path: a volume mounted at `mount_path`.
    A systemd unit reads the same paths on its host and ignores these entries."""

    kind: Literal["pvc", "host_path", "image", "download"] = Field(
        description="pvc: an existing PersistentVolumeClaim; host_path: a directory on the node; image: an "
        "OCI image holding the files (Kubernetes image volumes); download: fetched from the hub by an init "
        "container (needs egress), into `claim` or a scratch volume"
    )
    mount_path: Annotated[str, Field(pattern=_ABSOLUTE_PATH)] = Field(
        description="where the pod sees the files: the model's and adapters' paths lie under it"
    )
    claim: Annotated[str, Field(pattern=_K8S_NAME, max_length=253)] | None = None
    path: Annotated[str, Field(pattern=_ABSOLUTE_PATH)] | None = None
    image: Annotated[str, Field(pattern=r"^[^\s]+$")] | None = None
    sub_path: Annotated[str, Field(pattern=r"^[^/\s:][^\s:]*$")] | None = None
    repo: Annotated[str, Field(pattern=_HUB_ID)] | None = None
    revision: Annotated[str, Field(pattern=r"^[A-Za-z0-9._/-]+$")] | None = None

    @field_validator("mount_path", "path")
    @classmethod
    def _plain_path(cls, value: str | None) -> str | None:
        if value is not None and (value == "/" or any(part in (".", "..") for part in value.split("/"))):
            raise ValueError("must be an absolute directory other than / with no . or .. in it")
        return value.rstrip("/") if value else value

    @model_validator(mode="after")
    def _fields_of_its_kind(self) -> ModelVolume:
        needed, optional = _VOLUME_FIELDS[self.kind], _OPTIONAL_FIELDS[self.kind]
        missing = [name for name in needed if getattr(self, name) is None]
        if missing:
            raise ValueError(f"a {self.kind} volume needs {', '.join(missing)}")
        stray = [
            name
            for name in ("claim", "path", "image", "sub_path", "repo", "revision")
            if getattr(self, name) is not None and name not in needed + optional
        ]
        if stray:
            raise ValueError(f"a {self.kind} volume takes no {', '.join(stray)}")
        return self


def covering_volume(path: str, volumes: list[ModelVolume]) -> ModelVolume | None:
    """The volume whose mount holds `path` (the deepest one), or None."""
    holding = [v for v in volumes if path == v.mount_path or path.startswith(v.mount_path + "/")]
    return max(holding, key=lambda v: len(v.mount_path), default=None)


class ModelSpec(_Strict):
    source: str = Field(description="local directory, hub id, or builtin:tiny-llama")
    volumes: list[ModelVolume] = Field(
        default_factory=list,
        description="where a pod finds a local model.source and local LoRA adapters (render helm): "
        "`render helm` refuses a local path that none of them holds",
    )
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

    @field_validator("volumes")
    @classmethod
    def _distinct_mounts(cls, volumes: list[ModelVolume]) -> list[ModelVolume]:
        seen = [v.mount_path for v in volumes]
        twice = sorted({m for m in seen if seen.count(m) > 1})
        if twice:
            raise ValueError(f"two volumes are mounted at {', '.join(twice)}")
        return volumes


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
    count_nan_logits: bool = Field(
        default=True,
        description="set VLLM_COMPUTE_NANS_IN_LOGITS=1: vLLM counts requests with NaN logits "
        "(vllm:corrupted_requests), which the canary reads every few seconds",
    )


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


class FingerprintSpec(_Strict):
    """The probe set's answers compared with the baseline of the deployment's key (docs/fingerprints.md)."""

    enabled: bool = True
    top_k: Annotated[int, Field(ge=2, le=20)] = Field(default=5, description="logprobs kept per position")
    logprob_tolerance: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="null: derived from the dtype and the measured run-to-run noise"
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
    fingerprint: FingerprintSpec = Field(default_factory=FingerprintSpec)


class DeploySpec(_Strict):
    startup_timeout_s: Annotated[int, Field(gt=0)] = 900
    # A portable user name: it is written into User=/Group= and the sysusers line as it stands.
    user: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_-]{0,30}$")] = "vllm"
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
    advisories: dict[str, AdvisoryMode] = Field(
        default_factory=dict, description="advisory id → apply, warn or ignore (default: the advisory's own)"
    )
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
        """sha256 of the canonical form: one id names one exact configuration, whatever the formatting.
        A field added after ids were first stored is left out while it holds its default, so a profile
        that does not use it keeps the id its rows (and fingerprint baselines) were stored under."""
        dumped = self.model_dump(mode="json")
        for path, default in _LATER_FIELD_DEFAULTS.items():
            *parents, last = path
            section = dumped
            for part in parents:
                section = section[part]
            if section[last] == default:
                del section[last]
        canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def served_name(self) -> str:
        return self.model.served_name or self.name


# Fields added since profile ids were first stored (see Profile.profile_id), with their defaults in JSON form.
_LATER_FIELD_DEFAULTS: dict[tuple[str, ...], object] = {
    ("advisories",): {},
    ("model", "volumes"): [],
    ("serve", "count_nan_logits"): True,
    ("smoke", "fingerprint"): FingerprintSpec().model_dump(mode="json"),
}


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
