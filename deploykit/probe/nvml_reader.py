"""Read GPU facts through NVML only (no CUDA context, no torch, nothing that takes GPU memory) into
the plain JSON document of the probe contract.

No pydantic here: importing it and building the models costs ~0.25 s on this machine, most of
`deploykit probe --format json`'s 0.3 s budget. `deploykit.probe.facts` defines the same document as
pydantic models, and tests check that every document this module writes is exactly what those
models validate and serialise.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from types import ModuleType
from typing import Any

from deploykit.errors import MissingPackageError
from deploykit.installed import installed_version, installed_vllm_version
from deploykit.probe.gpu_table import bf16_native, family_from_nvml, fp8_native, is_hopper

FACTS_SCHEMA_VERSION = 1
# The distribution that provides the `pynvml` module: a dependency of deploykit, absent from the vLLM image.
NVML_PACKAGE = "nvidia-ml-py"

# NVML return codes (nvml.h nvmlReturn_t; the same numbers as pynvml's NVML_ERROR_*).
_NOT_SUPPORTED = 3
_FUNCTION_NOT_FOUND = 13  # the installed driver's library predates this query
_FATAL_HINTS = {
    9: "the NVIDIA kernel driver is not loaded",
    12: "the NVML library (libnvidia-ml.so.1) was not found: no NVIDIA driver is installed",
    15: "the GPU fell off the bus or is otherwise lost",
    18: "the NVIDIA kernel driver and the NVML library versions differ; reboot or reload the driver",
}
# After one of these a GPU answers nothing more; asking again only piles up the same error.
_GPU_GONE_CODES = {
    1,  # UNINITIALIZED: NVML itself went away under us
    9,  # DRIVER_NOT_LOADED
    15,  # GPU_IS_LOST
    16,  # RESET_REQUIRED
    18,  # LIB_RM_VERSION_MISMATCH
}
# nvml.h nvmlGpuP2PCapsIndex_t (pynvml's NVML_P2P_CAPS_INDEX_*): which peer-to-peer capability is asked.
_P2P_READ, _P2P_WRITE, _P2P_NVLINK = 0, 1, 2
# nvml.h nvmlGpuP2PStatus_t (pynvml's NVML_P2P_STATUS_*): what the driver answers for a pair of GPUs.
P2P_STATUS_NAMES = {
    0: "ok",
    1: "chipset_not_supported",
    2: "gpu_not_supported",
    3: "ioh_topology_not_supported",  # e.g. GPUs behind different CPU sockets
    4: "disabled_by_regkey",
    5: "not_supported",
    6: "unknown",
}
# nvml.h nvmlGpuTopologyLevel_t (pynvml's NVML_TOPOLOGY_*): the closest common ancestor of two GPUs.
TOPOLOGY_NAMES = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}
# Facts a plan cannot do without: a GPU that did not give them makes the whole probe an error.
_REQUIRED = {
    "nvmlDeviceGetCudaComputeCapability": "compute capability",
    "nvmlDeviceGetMemoryInfo": "memory size",
}


def _nvml_module() -> ModuleType:
    import pynvml

    module: ModuleType = pynvml
    return module


def require_nvml(needed_for: str, way_out: str = "") -> None:
    """Before a live probe whose result matters: without the pynvml module, a MissingPackageError naming
    nvidia-ml-py (`read_probe_document` would answer "no GPU" with the reason in its `error`)."""
    try:
        _nvml_module()
    except ImportError:
        raise MissingPackageError(
            f"{NVML_PACKAGE} (module pynvml)", needed_for, way_out, NVML_PACKAGE
        ) from None


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


class _GpuGone(Exception):
    """The GPU stopped answering; what was read so far is kept."""


class _GpuReader:
    """Calls NVML for one GPU, recording each failed call instead of raising."""

    def __init__(self, nvml: Any, index: int) -> None:
        self.nvml = nvml
        self.index = index
        self.errors: list[str] = []
        self.problem: str | None = None  # why this GPU makes the probe fail, if it does
        self.gone = False
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)

    def call(self, name: str, *, optional: bool = False) -> Any:
        function: Callable[..., Any] = getattr(self.nvml, name)
        try:
            return function(self.handle)
        except self.nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if optional and code in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                return None
            error = f"{name}: {_describe(exc)}"
            self.errors.append(error)
            if code in _GPU_GONE_CODES:
                self.gone = True
                self.problem = f"GPU {self.index} stopped answering: {error}"
                raise _GpuGone from exc
            if name in _REQUIRED and self.problem is None:
                self.problem = f"GPU {self.index} did not report its {_REQUIRED[name]}: {error}"
            return None

    def read(self) -> dict[str, Any]:
        answers: dict[str, Any] = {}
        queries = [
            ("nvmlDeviceGetCudaComputeCapability", False),
            ("nvmlDeviceGetArchitecture", True),
            ("nvmlDeviceGetMemoryInfo", False),
            ("nvmlDeviceGetMigMode", True),
            ("nvmlDeviceGetPciInfo", False),
            ("nvmlDeviceGetName", False),
            ("nvmlDeviceGetUUID", False),
        ]
        with contextlib.suppress(_GpuGone):
            for name, optional in queries:
                answers[name] = self.call(name, optional=optional)
        return self._document(answers)

    def _document(self, answers: dict[str, Any]) -> dict[str, Any]:
        capability = answers.get("nvmlDeviceGetCudaComputeCapability")
        major, minor = (int(capability[0]), int(capability[1])) if capability else (0, 0)
        memory = answers.get("nvmlDeviceGetMemoryInfo")
        mig = answers.get("nvmlDeviceGetMigMode")
        pci = answers.get("nvmlDeviceGetPciInfo")
        name = answers.get("nvmlDeviceGetName")
        uuid = answers.get("nvmlDeviceGetUUID")
        mib = 1024 * 1024
        return {
            "index": self.index,
            "name": _as_text(name) if name is not None else "unknown",
            "uuid": _as_text(uuid) if uuid is not None else None,
            "pci_bus_id": _as_text(pci.busId) if pci is not None else None,
            "compute_capability": f"{major}.{minor}",
            "compute_capability_tuple": [major, minor],
            "arch": (
                family_from_nvml(answers.get("nvmlDeviceGetArchitecture"), major, minor)
                if capability
                else "unknown"
            ),
            "bf16_native": bf16_native(major, minor),
            "fp8_native": fp8_native(major, minor),
            "is_hopper": is_hopper(major, minor),
            "memory_total_mib": int(memory.total) // mib if memory is not None else None,
            "memory_free_mib": int(memory.free) // mib if memory is not None else None,
            "mig_mode": None if mig is None else ("enabled" if int(mig[0]) == 1 else "disabled"),
            "errors": self.errors,
        }


def read_probe_document(
    nvml: Any | None = None, *, package_version: Callable[[str], str | None] = installed_version
) -> dict[str, Any]:
    """Probe every GPU. Never raises for NVML trouble: the document's `error` says what went wrong.

    `nvml` is the pynvml module (tests pass a fake); `package_version` reads installed versions.
    Keys are in the order of `deploykit.probe.facts.ProbeFacts`, so the JSON reads the same either way.
    """
    gpus: list[dict[str, Any]] = []
    document: dict[str, Any] = {
        "schema_version": FACTS_SCHEMA_VERSION,
        "driver_version": None,
        "cuda_driver_version": None,
        "nvml_version": None,
        "vllm_version": installed_vllm_version(package_version),
        "torch_version": package_version("torch"),
        "platform": None,  # NVML sees CUDA GPUs only; ROCm/XPU facts are written by hand
        "flashinfer_version": package_version("flashinfer-python"),
        "gpus": gpus,
        "gpu_links": [],
        "error": None,
        "source": "nvml",
    }
    try:
        nvml = nvml if nvml is not None else _nvml_module()
    except ImportError as exc:  # a dependency of deploykit, but the vLLM image (sidecars) lacks it
        document["error"] = (
            f"the pynvml module is missing ({exc}): pip install {NVML_PACKAGE}, or reinstall deploykit"
        )
        return document
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        document["error"] = f"NVML could not start: {_describe(exc)}"
        return document
    try:
        document["driver_version"] = _safe_text(nvml, "nvmlSystemGetDriverVersion")
        document["nvml_version"] = _safe_text(nvml, "nvmlSystemGetNVMLVersion")
        cuda = _safe(nvml, "nvmlSystemGetCudaDriverVersion_v2") or _safe(
            nvml, "nvmlSystemGetCudaDriverVersion"
        )
        document["cuda_driver_version"] = _cuda_version_text(int(cuda)) if cuda else None
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            document["error"] = f"NVML could not count GPUs: {_describe(exc)}"
            return document
        problems: list[str] = []
        readers: list[_GpuReader] = []
        for index in range(count):
            try:
                reader = _GpuReader(nvml, index)
            except nvml.NVMLError as exc:
                problems.append(f"GPU {index} could not be opened: {_describe(exc)}")
                continue
            gpus.append(reader.read())
            readers.append(reader)
            if reader.problem:
                problems.append(reader.problem)
        document["gpu_links"] = read_gpu_links(nvml, [r for r in readers if not r.gone])
        if count == 0:
            document["error"] = "NVML found no NVIDIA GPU on this machine"
        elif problems:
            document["error"] = "; ".join(problems)
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    return document


def read_gpu_links(nvml: Any, readers: list[_GpuReader]) -> list[dict[str, Any]]:
    """Peer-to-peer reach between every pair of GPUs, as the driver reports it (nvmlDeviceGetP2PStatus for
    read, write and NVLink; nvmlDeviceGetTopologyCommonAncestor). vLLM's custom all-reduce trusts the same
    driver answers (VLLM_SKIP_P2P_CHECK defaults to 1), so advisories about it read these. A failed query is
    recorded in the pair's `errors`, never fatal: the GPUs themselves were probed already."""
    links: list[dict[str, Any]] = []
    for position, first in enumerate(readers):
        for second in readers[position + 1 :]:
            links.append(_read_link(nvml, first, second))
    return links


def _read_link(nvml: Any, first: _GpuReader, second: _GpuReader) -> dict[str, Any]:
    errors: list[str] = []

    def ask(name: str, *args: Any) -> Any:
        try:
            return getattr(nvml, name)(first.handle, second.handle, *args)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) not in (_NOT_SUPPORTED, _FUNCTION_NOT_FOUND):
                errors.append(f"{name}: {_describe(exc)}")
            return None

    def status(caps: int) -> str:
        answer = ask("nvmlDeviceGetP2PStatus", caps)
        return "unknown" if answer is None else P2P_STATUS_NAMES.get(int(answer), "unknown")

    read, write, nvlink = status(_P2P_READ), status(_P2P_WRITE), status(_P2P_NVLINK)
    level = ask("nvmlDeviceGetTopologyCommonAncestor")
    return {
        "gpus": [first.index, second.index],
        "p2p_read": read,
        "p2p_write": write,
        "nvlink": nvlink,
        "topology": None if level is None else TOPOLOGY_NAMES.get(int(level), "unknown"),
        "errors": errors,
    }


def document_json(document: dict[str, Any]) -> str:
    """The document as `deploykit probe --format json` prints it: what pydantic's
    `model_dump_json(indent=2)` writes for the same facts (tests hold the two to the same bytes)."""
    return json.dumps(document, indent=2, ensure_ascii=False)


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
