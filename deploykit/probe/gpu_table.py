"""Compute capability → architecture family and native number formats.

Sources: NVIDIA's CUDA C++ Programming Guide, "Compute Capabilities" table, and the
`nvmlDeviceArchitecture_t` constants of nvml.h (NVML_DEVICE_ARCH_*).
"""

from __future__ import annotations

# nvml.h: NVML_DEVICE_ARCH_KEPLER = 2 ... NVML_DEVICE_ARCH_RUBIN = 13 (11, 12 and 15 are not GPUs).
NVML_ARCH_NAMES: dict[int, str] = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada",
    9: "hopper",
    10: "blackwell",
    13: "rubin",
}

# (major, minor) → family, for drivers whose NVML lacks nvmlDeviceGetArchitecture or answers UNKNOWN.
_CC_FAMILIES: dict[tuple[int, int], str] = {
    (3, 0): "kepler",
    (3, 5): "kepler",
    (3, 7): "kepler",
    (5, 0): "maxwell",
    (5, 2): "maxwell",
    (5, 3): "maxwell",
    (6, 0): "pascal",
    (6, 1): "pascal",
    (6, 2): "pascal",
    (7, 0): "volta",
    (7, 2): "volta",
    (7, 5): "turing",
    (8, 0): "ampere",
    (8, 6): "ampere",
    (8, 7): "ampere",
    (8, 9): "ada",
    (9, 0): "hopper",
    (10, 0): "blackwell",
    (10, 3): "blackwell",
    (11, 0): "blackwell",
    (12, 0): "blackwell",
    (12, 1): "blackwell",
}

KNOWN_FAMILIES = (
    "kepler",
    "maxwell",
    "pascal",
    "volta",
    "turing",
    "ampere",
    "ada",
    "hopper",
    "blackwell",
    "rubin",
)
# A minor version this table has not seen yet still belongs to its major's family; an unseen major
# is a GPU newer than this table, and guessing its family would plan for the wrong hardware.
_MAJOR_FAMILIES = {
    3: "kepler",
    5: "maxwell",
    6: "pascal",
    7: "volta",
    8: "ampere",
    9: "hopper",
    10: "blackwell",
    11: "blackwell",
    12: "blackwell",
}


def family_from_compute_capability(major: int, minor: int) -> str:
    family = _CC_FAMILIES.get((major, minor))
    if family is not None:
        return family
    return _MAJOR_FAMILIES.get(major, "unknown")


def family_from_nvml(arch_code: int | None, major: int, minor: int) -> str:
    """NVML's answer wins when it names a family; the CC table covers old drivers and UNKNOWN."""
    if arch_code is not None and arch_code in NVML_ARCH_NAMES:
        return NVML_ARCH_NAMES[arch_code]
    return family_from_compute_capability(major, minor)


def bf16_native(major: int, minor: int) -> bool:
    """BF16 tensor-core math and storage arrived with Ampere (sm80)."""
    return (major, minor) >= (8, 0)


def fp8_native(major: int, minor: int) -> bool:
    """FP8 tensor cores arrived with Ada (sm89) and Hopper (sm90)."""
    return (major, minor) >= (8, 9)


def is_hopper(major: int, minor: int) -> bool:
    return major == 9
