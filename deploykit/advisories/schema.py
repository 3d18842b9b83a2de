"""The advisory catalog's format (deploykit/advisories/catalog.yaml), validated on load.

An advisory is one known-bad combination from the field: what goes wrong, the upstream threads that show
it, the conditions under which it happens (each one a fact deploykit has), and what to do about it. The
format is documented for people in docs/advisories.md.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from deploykit.profile.schema import AdvisoryMode as AdvisoryMode  # the modes a profile sets

_ID = r"^[a-z0-9][a-z0-9.-]*$"
_VERSION = r"^\d+\.\d+(\.\d+)?$"
_PACKAGE_VERSION = r"^\d+(\.\d+)*((rc|a|b)\d+|\.post\d+)?$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


AdvisoryKind = Literal["hang", "corruption", "performance"]
"""hang: the engine stops producing tokens while /health says 200 (the canary's `hung` verdict names these);
corruption: fluent, wrong output; performance: speed or memory only."""
ADVISORY_KINDS: tuple[str, ...] = ("hang", "corruption", "performance")


class Reference(_Strict):
    """One upstream thread: an issue or pull request, with its repository and what it shows."""

    repo: str = Field(default="vllm-project/vllm", pattern=r"^[\w.-]+/[\w.-]+$")
    number: Annotated[int, Field(gt=0)]
    kind: Literal["issue", "pr"] = "issue"
    note: str = Field(description="what the thread shows, in a few words")

    @property
    def label(self) -> str:
        prefix = "" if self.repo == "vllm-project/vllm" else self.repo
        return f"{prefix}#{self.number}"

    @property
    def url(self) -> str:
        path = "pull" if self.kind == "pr" else "issues"
        return f"https://github.com/{self.repo}/{path}/{self.number}"


class VllmRange(_Strict):
    """The vLLM versions affected, as far as known: from `affected_from` (inclusive; null: as far back as
    the thread goes) up to `fixed_in` (exclusive; null: no release fixes it yet)."""

    affected_from: Annotated[str, Field(pattern=_VERSION)] | None = None
    fixed_in: Annotated[str, Field(pattern=_VERSION)] | None = None
    evidence: str = Field(
        description="where each bound comes from: release notes, the PR's merge, the source"
    )


class IntRange(_Strict):
    min: int | None = None
    max: int | None = None


class VersionRange(_Strict):
    """A package version range: from `min` (inclusive) up to `below` (exclusive); rc < final < post."""

    min: Annotated[str, Field(pattern=_PACKAGE_VERSION)] | None = None
    below: Annotated[str, Field(pattern=_PACKAGE_VERSION)] | None = None


class Conditions(_Strict):
    """Every field set here must hold (lists: one of). Unset fields are not looked at."""

    platform: Literal["cuda", "rocm", "xpu", "cpu"] | None = Field(
        default=None, description="the facts' platform (ROCm and XPU: a hand-written --facts file)"
    )
    gpu_arch: list[str] | None = Field(
        default=None, description="families: volta, turing, ampere, hopper, ..."
    )
    compute_capability_major: list[int] | None = None
    compute_capability_below: Annotated[str, Field(pattern=r"^\d+\.\d+$")] | None = None
    gpu_name_contains: list[str] | None = Field(default=None, description="the product, e.g. GeForce")
    bf16_native: bool | None = None
    tensor_parallel: IntRange | None = None
    p2p: bool | None = Field(
        default=None, description="the driver reports PCIe/NVLink P2P read+write between the GPUs"
    )
    nvlink: bool | None = Field(default=None, description="every pair of the GPUs used is NVLink-connected")
    architectures: list[str] | None = Field(
        default=None, description="the model's architectures (config.json)"
    )
    checkpoint_dtype: list[str] | None = None
    dtype: list[str] | None = Field(
        default=None, description="the dtype vLLM computes in (after --dtype auto)"
    )
    quantization: list[str] | None = None
    kv_cache_dtype: list[str] | None = None
    attention_backend: list[str] | None = Field(default=None, description="auto when the argv names none")
    cudagraph_mode: list[str] | None = None
    lora: bool | None = None
    speculative_decoding: bool | None = None
    prefix_caching: bool | None = None
    async_scheduling: bool | None = Field(
        default=None, description="--[no-]async-scheduling; on by default since vLLM 0.14.0"
    )
    max_num_seqs: IntRange | None = Field(default=None, description="--max-num-seqs, else vLLM's default")
    env: dict[str, str] | None = Field(
        default=None, description="environment variables the launch sets to exactly these values"
    )
    flashinfer_version: VersionRange | None = Field(
        default=None, description="the facts' flashinfer_version, else the FlashInfer the target vLLM pins"
    )
    sequence_parallelism: bool | None = Field(
        default=None, description="--compilation-config pass_config.enable_sp or fuse_gemm_comms"
    )
    penalties: bool | None = None
    model_runner: list[Literal["v1", "v2"]] | None = None
    penalty_table_mib: IntRange | None = Field(
        default=None, description="the V2 model runner's penalty state per GPU, in MiB (needs the vocab size)"
    )
    speculative_method: list[str] | None = Field(
        default=None,
        description="--speculative-config's method: mtp (any *_mtp), draft_model (a model only), eagle, ...",
    )
    tool_calling: bool | None = Field(default=None, description="--enable-auto-tool-choice")
    mamba_cache_mode: list[str] | None = Field(
        default=None,
        description="--mamba-cache-mode, else vLLM's choice for a hybrid model: align under prefix caching",
    )
    kv_connector: list[str] | None = Field(default=None, description="--kv-transfer-config's kv_connector")
    cpu_offload: bool | None = Field(default=None, description="--cpu-offload-gb above 0")
    expert_parallel: bool | None = Field(default=None, description="--enable-expert-parallel")
    nodes: IntRange | None = Field(default=None, description="the nodes one replica spans (plan layout)")
    data_parallel: IntRange | None = Field(default=None, description="--data-parallel-size (plan layout)")
    tensor_parallel_spans_nodes: bool | None = Field(
        default=None, description="one tensor-parallel group is wider than a node's GPUs (plan layout)"
    )
    moe_backend: list[str] | None = Field(default=None, description="--moe-backend, else auto")
    gdn_prefill_backend: list[str] | None = Field(
        default=None, description="--gdn-prefill-backend, else auto"
    )

    def fields_set(self) -> list[str]:
        return [name for name in type(self).model_fields if getattr(self, name) is not None]


_FLAG = re.compile(r"^--?[A-Za-z][\w-]*(\.[\w.-]+)?(=.*)?$")


class Action(_Strict):
    """What to do. `fix`: a deploykit fix decides and applies it (the profile's `fixes:` section).
    `workaround`: vLLM arguments and/or environment. `warning`: nothing known to do; say so."""

    kind: Literal["fix", "workaround", "warning"]
    fix: str | None = None
    args: list[str] = Field(default_factory=list, description="`vllm serve` arguments, as argv words")
    env: dict[str, str] = Field(default_factory=dict)
    default: Literal["apply", "warn"] = "warn"
    why: str = Field(description="why it is applied by default, or what applying it costs")
    note: Literal["v2_penalty_table"] | None = Field(
        default=None, description="a figure computed for the deployment (deploykit/advisories/notes.py)"
    )

    @model_validator(mode="after")
    def _consistent(self) -> Action:
        if self.kind == "fix" and (not self.fix or self.args or self.env):
            raise ValueError("a fix action names `fix` and carries no args or env")
        if self.kind == "workaround" and not (self.args or self.env):
            raise ValueError("a workaround carries args and/or env")
        if self.kind == "warning" and (self.args or self.env or self.fix or self.default == "apply"):
            raise ValueError("a warning carries nothing to apply")
        if self.args and not _FLAG.match(self.args[0]):
            raise ValueError(f"args must start with a flag, not {self.args[0]!r}")
        return self

    @property
    def flags(self) -> list[str]:
        """The flags the args set (`--x.y=z` → `--x`): what must exist in the target vLLM's option table."""
        return [word.split("=", 1)[0].split(".", 1)[0] for word in self.args if word.startswith("-")]


class Advisory(_Strict):
    id: Annotated[str, Field(pattern=_ID)]
    title: str
    symptom: str = Field(description="what goes wrong, in one line")
    kind: AdvisoryKind
    references: Annotated[list[Reference], Field(min_length=1)]
    vllm: VllmRange
    when: Conditions = Field(default_factory=Conditions)
    any_of: list[Conditions] = Field(default_factory=list, description="at least one of these must hold too")
    action: Action

    @model_validator(mode="after")
    def _fix_conditions_live_in_code(self) -> Advisory:
        if self.action.kind == "fix" and (self.when.fields_set() or self.any_of):
            raise ValueError("a fix's conditions are its decide() rule: state none here (they would drift)")
        return self


class Catalog(_Strict):
    advisories: list[Advisory]

    @model_validator(mode="after")
    def _unique_ids(self) -> Catalog:
        seen: set[str] = set()
        for advisory in self.advisories:
            if advisory.id in seen:
                raise ValueError(f"advisory id {advisory.id} appears twice")
            seen.add(advisory.id)
        return self
