"""Profiles: YAML files that say what to serve, on what, and which fixes to use. The schema lives here;
finding and loading the files (with located errors) is `deploykit.profile.load`."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from deploykit import net
from deploykit.errors import ProfileError as ProfileError  # defined once, in deploykit.errors
from deploykit.errors import ProfileIssue as ProfileIssue
from deploykit.fixes import FIX_NAMES
from deploykit.fixes.base import FixMode as FixMode  # the modes a profile sets: the fixes' vocabulary

BUILTIN_PREFIX = "builtin:"
BUILTIN_MODELS = ("tiny-llama", "smollm2-135m-instruct")  # deploykit.builtin_models.NAMES
# Names whose values are secrets: a profile must reference them, and serve redacts their values.
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASS|KEY|CREDENTIAL)", re.I)
# A literal env value with a token's shape is refused whatever its name.
_SECRET_VALUE = re.compile(
    r"\b(hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{16,}|xox[abprs]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16})"
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# One label of a host name (RFC 1123): letters, digits and inner hyphens, at most 63 characters.
_HOST_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def given_twice(values: Iterable[str]) -> list[str]:
    """The values that occur more than once, sorted (for a profile error that names them)."""
    counts = Counter(values)
    return sorted(value for value, count in counts.items() if count > 1)


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
    source: str = Field(description="local directory, hub id, or builtin:NAME (deploykit.builtin_models)")
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
        if twice := given_twice(v.mount_path for v in volumes):
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
    pipeline_parallel_size: Annotated[int, Field(ge=1, le=64)] = Field(
        default=1,
        description="--pipeline-parallel-size; `extra_args` may set the flag instead, but never to another "
        "value than one set here (deploykit.plan.layout)",
    )
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
    usage_stats: bool = Field(
        default=False,
        description="let vLLM report usage to its stats server; off by default: every plan sets "
        "VLLM_NO_USAGE_STATS=1 and DO_NOT_TRACK=1 unless this is true",
    )


class Requires(_Strict):
    min_compute_capability: Annotated[str, Field(pattern=r"^\d+\.\d+$")] | None = None
    architectures: list[
        Literal["kepler", "maxwell", "pascal", "volta", "turing", "ampere", "ada", "hopper", "blackwell"]
    ] = Field(default_factory=list)
    min_memory_mib: Annotated[int, Field(gt=0)] | None = None
    gpu_count: Annotated[int, Field(ge=1)] = 1


class FixModesBase(_Strict):
    """The profile's `fixes:` section: one mode per fix of the registry (FixModes is built from it)."""

    def mode(self, name: str) -> FixMode:
        """The mode the profile sets for the registered fix `name`."""
        return cast(FixMode, getattr(self, name))


def _fix_modes_model() -> type[FixModesBase]:
    """`fixes:` as a model with one field per registered fix (deploykit.fixes), in registry order: what a
    profile may set, its located errors and the JSON schema all follow the registry, never a hand list."""
    fields: dict[str, Any] = {name: (FixMode, FixMode.AUTO) for name in FIX_NAMES}
    return create_model("FixModes", __base__=FixModesBase, __module__=__name__, **fields)


if TYPE_CHECKING:
    FixModes = FixModesBase
else:
    FixModes = _fix_modes_model()


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
    expect_ids: list[Annotated[int, Field(ge=0)]] | None = Field(
        default=None,
        description="completion/chat: the first generated token ids, exactly (a known answer, greedy)",
    )
    name: str | None = Field(default=None, description="the case's name in reports (known answers)")
    max_tokens: Annotated[int, Field(gt=0, le=4096)] = 16
    adapter: str | None = None
    prompt_tokens: Annotated[int, Field(gt=0)] | None = Field(
        default=None,
        description="long_then_short / prefix_cache: the long prompt's length in tokens "
        "(default: 512, fewer when serve.max_model_len has no room; the canary sends at most 512)",
    )
    batch_size: Annotated[int, Field(ge=2, le=64)] = Field(
        default=4, description="batch: how many identical requests are sent at once"
    )

    @model_validator(mode="after")
    def _ids_only_for_plain_answers(self) -> SmokeCase:
        if self.expect_ids is not None and self.kind not in ("completion", "chat"):
            raise ValueError("expect_ids: only a completion or chat case has one answer to compare")
        return self


KNOWN_ANSWER_PREFIX = "known:"


class KnownAnswer(_Strict):
    """A prompt whose greedy answer is known: a wrong answer fails the smoke (and the canary's rotation).

    The answer is checked by a substring of its text or by its first token ids, exactly."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")]
    kind: Literal["completion", "chat"] = "chat"
    prompt: Annotated[str, Field(min_length=1)]
    expect_substring: Annotated[str, Field(min_length=1)] | None = None
    expect_ids: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)] | None = None
    max_tokens: Annotated[int, Field(gt=0, le=256)] | None = Field(
        default=None, description="default: 16 for a substring, the number of expected ids for ids"
    )

    @model_validator(mode="after")
    def _one_expectation(self) -> KnownAnswer:
        if (self.expect_substring is None) == (self.expect_ids is None):
            raise ValueError("give exactly one of expect_substring and expect_ids")
        if (
            self.expect_ids is not None
            and self.max_tokens is not None
            and self.max_tokens < len(self.expect_ids)
        ):
            raise ValueError(
                f"max_tokens {self.max_tokens} is fewer than the {len(self.expect_ids)} expected ids"
            )
        return self

    def as_case(self) -> SmokeCase:
        """The smoke case that asks it: greedy, as many tokens as the expectation needs."""
        default = len(self.expect_ids) if self.expect_ids is not None else KNOWN_ANSWER_MAX_TOKENS
        return SmokeCase(
            kind=self.kind,
            prompt=self.prompt,
            expect_substring=self.expect_substring,
            expect_ids=self.expect_ids,
            max_tokens=self.max_tokens or default,
            name=KNOWN_ANSWER_PREFIX + self.name,
        )


KNOWN_ANSWER_MAX_TOKENS = 16


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
    known_answers: list[KnownAnswer] = Field(
        default_factory=list,
        description="prompts with a known greedy answer, run beside the cases (docs/known-answers.md)",
    )

    @field_validator("known_answers")
    @classmethod
    def _unique_names(cls, answers: list[KnownAnswer]) -> list[KnownAnswer]:
        if twice := given_twice(answer.name for answer in answers):
            raise ValueError(
                f"each known answer needs its own name; given more than once: {', '.join(twice)}"
            )
        return answers


class GateSpec(_Strict):
    """How `deploykit gate` samples speed and what it calls slower (docs/gate.md)."""

    streams: Annotated[list[Annotated[int, Field(ge=1, le=256)]], Field(min_length=1, max_length=8)] = Field(
        default_factory=lambda: [1, 4],
        description="the concurrent stream counts of the load sample, each measured on both sides",
    )
    requests_per_stream: Annotated[int, Field(ge=1, le=64)] = Field(
        default=2, description="requests each stream sends one after another"
    )
    prompt_tokens: Annotated[int, Field(ge=1, le=8192)] = Field(
        default=64, description="prompt length of a load request, in token ids"
    )
    output_tokens: Annotated[int, Field(ge=2, le=4096)] = Field(
        default=128, description="tokens each load request generates (`ignore_eos`)"
    )
    slower_threshold: Annotated[float, Field(gt=0, lt=1)] = Field(
        default=0.25,
        description="hold when, at any stream count, throughput or KV-cache capacity falls by more than "
        "this fraction of the baseline's, or TPOT grows by more than it",
    )


class DeploySpec(_Strict):
    startup_timeout_s: Annotated[int, Field(gt=0)] = 900
    # A portable user name: it is written into User=/Group= and the sysusers line as it stands.
    user: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_-]{0,30}$")] = "vllm"
    image: str = "vllm/vllm-openai"  # the tag follows the vLLM version the plan targets
    replicas: Annotated[int, Field(ge=1)] = 1
    nodes: Annotated[int, Field(ge=1, le=64)] = Field(
        default=1,
        description="the nodes one group (one replica's vLLM ranks) spans: its world size split evenly "
        "over them; the probe facts describe one of them",
    )
    leader_address: str | None = Field(
        default=None,
        description="the host name or IP address every worker node reaches the group's leader at (its "
        "`--master-addr`); `render systemd` needs it when deploy.nodes > 1",
    )
    cache_dir: str = "/var/cache/deploykit"
    namespace: str | None = None

    @field_validator("leader_address")
    @classmethod
    def _reachable_host(cls, value: str | None) -> str | None:
        """A name or address a worker can dial, nothing else: it becomes one word of the workers' argv."""
        if value is None:
            return None
        address = net.ip_address(value)
        if address is not None:
            if address.is_unspecified:
                raise ValueError(f"{value!r} is a wildcard: give the address the workers reach the leader at")
            return str(address)  # one spelling: an IPv6 address without brackets, in its short form
        labels = value.removesuffix(".").split(".")
        if len(value) > 253 or not all(_HOST_LABEL.match(label) for label in labels) or labels[-1].isdigit():
            raise ValueError(
                f"{value!r} is neither a host name (letters, digits and `-` in dot-separated labels) nor an "
                "IP address"
            )
        return value


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
    gate: GateSpec = Field(default_factory=GateSpec)

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
        for name in [n for n, mode in dumped["fixes"].items() if n not in _FIXES_IN_FIRST_IDS]:
            if dumped["fixes"][name] == FixMode.AUTO.value:
                del dumped["fixes"][name]  # a fix registered later, left at auto: the id stays
        for case in dumped["smoke"]["cases"] or []:
            for key, default in _LATER_CASE_FIELD_DEFAULTS.items():
                if case.get(key) == default:
                    del case[key]
        canonical = json.dumps(dumped, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def served_name(self) -> str:
        return self.model.served_name or self.name


# The fixes that were registered when profile ids were first stored (a historical fact, never edited): a fix
# registered since is left out of the id while the profile leaves it at auto (see Profile.profile_id).
_FIXES_IN_FIRST_IDS = ("fp32_projection", "matmul_lora", "device_penalties")
# Fields added since profile ids were first stored (see Profile.profile_id), with their defaults in JSON form.
_LATER_FIELD_DEFAULTS: dict[tuple[str, ...], object] = {
    ("advisories",): {},
    ("model", "volumes"): [],
    ("serve", "count_nan_logits"): True,
    ("serve", "pipeline_parallel_size"): 1,
    ("deploy", "nodes"): 1,
    ("deploy", "leader_address"): None,
    ("serve", "usage_stats"): False,
    ("smoke", "fingerprint"): FingerprintSpec().model_dump(mode="json"),
    ("smoke", "known_answers"): [],
    ("gate",): GateSpec().model_dump(mode="json"),
}
# The same for the fields of each entry of smoke.cases.
_LATER_CASE_FIELD_DEFAULTS: dict[str, object] = {"expect_ids": None, "name": None}


# Where each field of a profile file is: its dotted path as a tuple (`("env", "NAME")`, `("serve",
# "extra_args", 2)`) → (line, column), 1-based; a scalar's value under `(*path, "<value>")`.
Positions = dict[tuple[str | int, ...], tuple[int, int]]


@dataclass(frozen=True)
class LoadedProfile:
    profile: Profile
    path: Path
    # Where each field is in the file (deploykit.profile.load fills it; empty for a profile made in code):
    # a check made later, against the plan's target, still names the line (deploykit.profile.load.located).
    positions: Positions = dataclass_field(default_factory=dict, compare=False, repr=False)

    @property
    def id(self) -> str:
        return self.profile.profile_id()
