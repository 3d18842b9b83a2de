"""Probe facts: the versioned JSON contract between `deploykit probe` and everything that plans."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from deploykit.probe.nvml_reader import FACTS_SCHEMA_VERSION as SCHEMA_VERSION


class GpuFacts(BaseModel):
    """What deploykit knows about one GPU, read through NVML only."""

    model_config = ConfigDict(extra="forbid")

    index: int
    name: str
    uuid: str | None = None
    pci_bus_id: str | None = None
    compute_capability: str = Field(pattern=r"^\d{1,3}\.\d{1,3}$", description='"major.minor", e.g. "7.5"')
    compute_capability_tuple: tuple[int, int]
    arch: str = Field(description="volta, turing, ampere, ada, hopper, blackwell, ... or unknown")
    bf16_native: bool
    fp8_native: bool
    is_hopper: bool
    memory_total_mib: int | None = None
    memory_free_mib: int | None = None
    mig_mode: str | None = Field(default=None, description="enabled, disabled, or null when not supported")
    errors: list[str] = Field(default_factory=list, description="NVML calls that failed for this GPU")


class GpuLink(BaseModel):
    """How two GPUs reach each other, as the NVIDIA driver reports it through NVML (nvml.h:
    nvmlDeviceGetP2PStatus per nvmlGpuP2PCapsIndex_t, nvmlDeviceGetTopologyCommonAncestor)."""

    model_config = ConfigDict(extra="forbid")

    gpus: tuple[int, int]
    p2p_read: str = Field(
        description="ok, chipset_not_supported, gpu_not_supported, ioh_topology_not_supported, "
        "disabled_by_regkey, not_supported or unknown"
    )
    p2p_write: str
    nvlink: str = Field(description="P2P over NVLink: ok when the pair is NVLink-connected")
    topology: str | None = Field(
        default=None,
        description="internal, single, multiple, hostbridge, node or system (null: not reported)",
    )
    errors: list[str] = Field(default_factory=list, description="NVML calls that failed for this pair")


class ProbeFacts(BaseModel):
    """The whole probe result. `error` is null when the probe succeeded."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nvml_version: str | None = None
    vllm_version: str | None = None
    torch_version: str | None = None
    platform: Literal["cuda", "rocm", "xpu"] | None = Field(
        default=None,
        description="the GPUs' platform; null means CUDA (what NVML probes). ROCm and XPU hosts are planned "
        "for with a hand-written --facts file that says so (docs/advisories.md)",
    )
    flashinfer_version: str | None = Field(
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
