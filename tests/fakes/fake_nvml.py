"""A fake of the `pynvml` module, faked at the library boundary and nowhere else.

It answers the NVML calls deploykit's probe makes with the facts of one real GPU model
(tests/fixtures/gpus/*.json), returns the same Python types `pynvml` returns (its own ctypes
structures for memory and PCI info), and fails the way `pynvml` fails: `pynvml.NVMLError(code)`,
which `pynvml` turns into the matching `NVMLError_*` subclass with `.value` set. It also keeps
NVML's state rules: every call but `nvmlInit` raises UNINITIALIZED before init and after shutdown,
a missing `libnvidia-ml.so.1` fails `nvmlInit` with LIBRARY_NOT_FOUND, and a function absent from
an old driver's library raises FUNCTION_NOT_FOUND. Every call is recorded in `calls`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import pynvml

GPU_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "gpus"
# Hosts with several GPUs of one model and how they reach each other (NVLink, PCIe P2P).
HOST_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hosts"

MigSupport = Literal["not_supported", "disabled", "enabled"]

# The NVML calls a read-only probe may make. Anything else (a context, a clock change) is a bug.
READ_ONLY_CALLS = frozenset(
    {
        "nvmlInit",
        "nvmlShutdown",
        "nvmlSystemGetDriverVersion",
        "nvmlSystemGetNVMLVersion",
        "nvmlSystemGetCudaDriverVersion",
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetName",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetCudaComputeCapability",
        "nvmlDeviceGetArchitecture",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetP2PStatus",
        "nvmlDeviceGetTopologyCommonAncestor",
    }
)

# The top-level keys of `deploykit probe --format json` that other tools may rely on.
CONTRACT_KEYS = {
    "schema_version",
    "driver_version",
    "cuda_driver_version",
    "vllm_version",
    "torch_version",
    "gpus",
    "gpu_links",
    "error",
}


@dataclass(frozen=True)
class FakeGpu:
    """One GPU as NVML describes it."""

    name: str
    uuid: str
    pci_bus_id: str
    compute_capability: tuple[int, int]
    nvml_architecture: int
    memory_total_bytes: int
    memory_used_bytes: int
    mig: MigSupport


@dataclass(frozen=True)
class GpuFixture:
    """A tests/fixtures/gpus/*.json file: one real GPU model, the host it was seen on, and its sources."""

    key: str
    model: str
    gpu: FakeGpu
    driver_version: str
    cuda_driver_version: int
    expected: dict[str, Any]
    source: dict[str, str]


@dataclass(frozen=True)
class FakeLink:
    """What the driver answers for every pair of GPUs in a host: nvmlGpuP2PStatus_t codes for read, write
    and NVLink, and the nvmlGpuTopologyLevel_t of their common ancestor (None: the query is not supported)."""

    p2p_read: int
    p2p_write: int
    nvlink: int
    topology: int | None


@dataclass(frozen=True)
class HostFixture:
    """A tests/fixtures/hosts/*.json file: `count` GPUs of one GPU fixture, their link, and its sources."""

    key: str
    gpu: str
    count: int
    link: FakeLink
    source: dict[str, str]


def host_fixture_keys() -> list[str]:
    return sorted(path.stem for path in HOST_FIXTURES.glob("*.json"))


def load_host_fixture(key: str) -> HostFixture:
    data = json.loads((HOST_FIXTURES / f"{key}.json").read_text())
    link = data["link"]
    return HostFixture(
        key=key,
        gpu=data["gpu"],
        count=data["count"],
        link=FakeLink(link["p2p_read"], link["p2p_write"], link["nvlink"], link["topology"]),
        source=data["source"],
    )


@dataclass(frozen=True)
class FakeHandle:
    """Stands in for pynvml's opaque `c_nvmlDevice_t`."""

    index: int


def gpu_fixture_keys() -> list[str]:
    return sorted(path.stem for path in GPU_FIXTURES.glob("*.json"))


def load_gpu_fixture(key: str) -> GpuFixture:
    data = json.loads((GPU_FIXTURES / f"{key}.json").read_text())
    gpu = data["gpu"]
    return GpuFixture(
        key=key,
        model=data["model"],
        gpu=FakeGpu(
            name=gpu["name"],
            uuid=gpu["uuid"],
            pci_bus_id=gpu["pci_bus_id"],
            compute_capability=(gpu["compute_capability"][0], gpu["compute_capability"][1]),
            nvml_architecture=gpu["nvml_architecture"],
            memory_total_bytes=gpu["memory_total_bytes"],
            memory_used_bytes=gpu["memory_used_bytes"],
            mig=gpu["mig"],
        ),
        driver_version=data["driver_version"],
        cuda_driver_version=data["cuda_driver_version"],
        expected=data["expected"],
        source=data["source"],
    )


def copies(gpu: FakeGpu, count: int) -> list[FakeGpu]:
    """`count` GPUs of one model in one host: the same facts, each with its own uuid and PCI bus."""
    result = []
    for index in range(count):
        bus = int(gpu.pci_bus_id.split(":")[1], 16) + index
        result.append(
            replace(
                gpu,
                uuid=gpu.uuid[:-2] + f"{index:02x}" if index else gpu.uuid,
                pci_bus_id=f"{gpu.pci_bus_id[:9]}{bus:02X}{gpu.pci_bus_id[11:]}",
            )
        )
    return result


@dataclass
class FakeNvml:
    """Use in place of the `pynvml` module: `probe(nvml=FakeNvml(...))`.

    Failures to inject:
      library_found=False        libnvidia-ml.so.1 missing (no driver): nvmlInit → LIBRARY_NOT_FOUND
      init_error=code            nvmlInit fails, e.g. LIB_RM_VERSION_MISMATCH after a driver upgrade
      missing_functions={...}    functions an old driver's library lacks → FUNCTION_NOT_FOUND
      failures={(name, i): code} that call fails for device i (i=None for a system call)
      lost={i: name}             device i falls off the bus at that call: it and every later call
                                 for device i raise GPU_IS_LOST
    """

    gpus: list[FakeGpu] = field(default_factory=list)
    driver_version: str = "535.129.03"
    cuda_driver_version: int = 12020
    library_found: bool = True
    init_error: int | None = None
    missing_functions: frozenset[str] = frozenset()
    failures: dict[tuple[str, int | None], int] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)
    link: FakeLink | None = None  # None: the driver answers NOT_SUPPORTED for every pair query
    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    initialized: int = 0
    _lost_now: set[int] = field(default_factory=set)

    NVMLError = pynvml.NVMLError

    @classmethod
    def from_host(cls, host: HostFixture, **kwargs: Any) -> FakeNvml:
        return cls.from_fixture(load_gpu_fixture(host.gpu), count=host.count, link=host.link, **kwargs)

    @classmethod
    def from_fixture(cls, fixture: GpuFixture, count: int = 1, **kwargs: Any) -> FakeNvml:
        return cls(
            gpus=copies(fixture.gpu, count),
            driver_version=fixture.driver_version,
            cuda_driver_version=fixture.cuda_driver_version,
            **kwargs,
        )

    # -- the rules every call goes through -------------------------------------------------

    def _enter(self, name: str, *args: Any, device: int | None = None) -> None:
        self.calls.append((name, args))
        if not self.library_found:
            # pynvml raises UNINITIALIZED for any call while no library is loaded.
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if name in self.missing_functions:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if not self.initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if device is not None:
            if self.lost.get(device) == name:
                self._lost_now.add(device)
            if device in self._lost_now:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        code = self.failures.get((name, device))
        if code is not None:
            raise pynvml.NVMLError(code)

    def _gpu(self, name: str, handle: Any) -> FakeGpu:
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(self.gpus):
            self.calls.append((name, (handle,)))
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._enter(name, handle, device=handle.index)
        return self.gpus[handle.index]

    def call_names(self) -> list[str]:
        return [name for name, _ in self.calls]

    # -- library lifetime -------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append(("nvmlInit", ()))
        if not self.library_found:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1

    # -- system -----------------------------------------------------------------------------

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")
        return f"{self.cuda_driver_version // 1000}.{self.driver_version}"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion")
        return self.cuda_driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._enter("nvmlDeviceGetHandleByIndex", index, device=index)
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    # -- per device -------------------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        domain, bus, rest = gpu.pci_bus_id.split(":")
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        info.domain = int(domain, 16)
        info.bus = int(bus, 16)
        info.device = int(rest.split(".")[0], 16)
        return info

    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]:
        return self._gpu("nvmlDeviceGetCudaComputeCapability", handle).compute_capability

    def nvmlDeviceGetArchitecture(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetArchitecture", handle).nvml_architecture

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        return pynvml.c_nvmlMemory_t(
            total=gpu.memory_total_bytes,
            free=gpu.memory_total_bytes - gpu.memory_used_bytes,
            used=gpu.memory_used_bytes,
        )

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetMigMode", handle)
        if gpu.mig == "not_supported":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig == "enabled" else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    # -- pairs of devices -------------------------------------------------------------------

    def _pair(self, name: str, first: Any, second: Any) -> FakeLink:
        self._gpu(name, first)
        self._gpu(name, second)
        if self.link is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.link

    def nvmlDeviceGetP2PStatus(self, first: Any, second: Any, caps_index: int) -> int:
        link = self._pair("nvmlDeviceGetP2PStatus", first, second)
        # nvml.h nvmlGpuP2PCapsIndex_t: READ 0, WRITE 1, NVLINK 2 (pynvml spells READ as the tuple `(0,)`).
        answers = {0: link.p2p_read, 1: link.p2p_write, 2: link.nvlink}
        if caps_index not in answers:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return answers[caps_index]

    def nvmlDeviceGetTopologyCommonAncestor(self, first: Any, second: Any) -> int:
        link = self._pair("nvmlDeviceGetTopologyCommonAncestor", first, second)
        if link.topology is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return link.topology
