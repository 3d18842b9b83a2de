"""Probe facts: the versioned JSON contract between `deploykit probe` and everything that plans.

A saved facts file is written by hand as often as by `probe --save`, and what it says reaches the plan, a
terminal and the results store: its values are checked here, at the boundary. Sizes, counts and indexes
are never negative; a version is a version (a digit first, then digits, letters, `.`, `+`, `-`, `_`: no
space, line break or escape); a name (a GPU's, its UUID, its architecture) holds no control or
bidirectional character. NVML's own error texts stay free text: deploykit prints them escaped."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, NonNegativeInt
from pydantic_core import PydanticCustomError

from deploykit.probe.nvml_reader import FACTS_SCHEMA_VERSION as SCHEMA_VERSION
from deploykit.untrusted_text import hidden_character

_VERSION = re.compile(r"[0-9][0-9A-Za-z.+_-]{0,99}")


def _version(value: str) -> str:
    if not _VERSION.fullmatch(value):
        raise PydanticCustomError(
            "not_a_version", "not a version (a digit, then only digits, letters, '.', '+', '-' or '_')"
        )
    return value


def _name(value: str) -> str:
    found = hidden_character(value)
    if found is not None:
        raise PydanticCustomError(
            "hidden_character",
            "holds {found}: a name holds no control or bidirectional character",
            {"found": found},
        )
    return value


Version = Annotated[str, AfterValidator(_version)]
"""`535.129.03`, `12.2`, `0.33.0`, `0.11.1rc2.dev12+g1a2b3c.cu128`."""
Name = Annotated[str, AfterValidator(_name)]


class GpuFacts(BaseModel):
    """What deploykit knows about one GPU, read through NVML only."""

    model_config = ConfigDict(extra="forbid")

    index: NonNegativeInt
    name: Name
    uuid: Name | None = None
    pci_bus_id: Name | None = None
    compute_capability: str = Field(pattern=r"^\d{1,3}\.\d{1,3}$", description='"major.minor", e.g. "7.5"')
    compute_capability_tuple: tuple[NonNegativeInt, NonNegativeInt]
    arch: Name = Field(description="volta, turing, ampere, ada, hopper, blackwell, ... or unknown")
    bf16_native: bool
    fp8_native: bool
    is_hopper: bool
    memory_total_mib: NonNegativeInt | None = None
    memory_free_mib: NonNegativeInt | None = None
    mig_mode: Name | None = Field(default=None, description="enabled, disabled, or null when not supported")
    errors: list[str] = Field(default_factory=list, description="NVML calls that failed for this GPU")


class GpuLink(BaseModel):
    """How two GPUs reach each other, as the NVIDIA driver reports it through NVML (nvml.h:
    nvmlDeviceGetP2PStatus per nvmlGpuP2PCapsIndex_t, nvmlDeviceGetTopologyCommonAncestor)."""

    model_config = ConfigDict(extra="forbid")

    gpus: tuple[NonNegativeInt, NonNegativeInt]
    p2p_read: Name = Field(
        description="ok, chipset_not_supported, gpu_not_supported, ioh_topology_not_supported, "
        "disabled_by_regkey, not_supported or unknown"
    )
    p2p_write: Name
    nvlink: Name = Field(description="P2P over NVLink: ok when the pair is NVLink-connected")
    topology: Name | None = Field(
        default=None,
        description="internal, single, multiple, hostbridge, node or system (null: not reported)",
    )
    errors: list[str] = Field(default_factory=list, description="NVML calls that failed for this pair")


class ProbeFacts(BaseModel):
    """The whole probe result. `error` is null when the probe succeeded."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    driver_version: Version | None = None
    cuda_driver_version: Version | None = None
    nvml_version: Version | None = None
    vllm_version: Version | None = None
    torch_version: Version | None = None
    platform: Literal["cuda", "rocm", "xpu"] | None = Field(
        default=None,
        description="the GPUs' platform; null means CUDA (what NVML probes). ROCm and XPU hosts are planned "
        "for with a hand-written --facts file that says so (docs/advisories.md)",
    )
    flashinfer_version: Version | None = Field(
        default=None,
        description="the FlashInfer installed beside vLLM, when known (hand-written); null: the one the "
        "target vLLM release pins",
    )
    gpus: list[GpuFacts] = Field(default_factory=list)
    gpu_links: list[GpuLink] | None = Field(
        default=None, description="every pair of GPUs; null in facts saved before deploykit probed links"
    )
    error: str | None = None
    source: str = Field(default="nvml", description="nvml, or the file a saved probe was read from")
