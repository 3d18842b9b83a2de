"""Compute capability → family and native number formats, checked against NVIDIA's published tables."""

from __future__ import annotations

import pynvml
import pytest

from deploykit.probe.gpu_table import (
    KNOWN_FAMILIES,
    NVML_ARCH_NAMES,
    bf16_native,
    family_from_compute_capability,
    family_from_nvml,
    fp8_native,
    is_hopper,
)

# (major, minor) → family, from the CUDA C++ Programming Guide's compute capability table and
# NVIDIA's CUDA GPUs list; one real product named for each row.
CC_FAMILIES = [
    ((3, 7), "kepler"),  # Tesla K80
    ((5, 2), "maxwell"),  # Tesla M60
    ((6, 0), "pascal"),  # Tesla P100
    ((6, 1), "pascal"),  # Tesla P4 / GTX 1080 Ti
    ((7, 0), "volta"),  # Tesla V100
    ((7, 2), "volta"),  # Jetson AGX Xavier
    ((7, 5), "turing"),  # Tesla T4, RTX 2080 Ti
    ((8, 0), "ampere"),  # A100
    ((8, 6), "ampere"),  # A10G, RTX 3090
    ((8, 7), "ampere"),  # Jetson AGX Orin
    ((8, 9), "ada"),  # L4, L40S, RTX 4090
    ((9, 0), "hopper"),  # H100, H20, H200
    ((10, 0), "blackwell"),  # B200
    ((10, 3), "blackwell"),  # B300
    ((12, 0), "blackwell"),  # RTX 5090, RTX PRO 6000 Blackwell
]


@pytest.mark.parametrize(("cc", "family"), CC_FAMILIES)
def test_family_from_compute_capability(cc: tuple[int, int], family: str) -> None:
    assert family_from_compute_capability(*cc) == family


def test_unknown_future_compute_capability_is_not_guessed() -> None:
    """A GPU newer than this table must say "unknown", not be planned for as Blackwell."""
    assert family_from_compute_capability(13, 0) == "unknown"
    assert family_from_compute_capability(2, 1) == "unknown"
    assert family_from_compute_capability(12, 9) == "blackwell"  # a new minor of a known major


def test_nvml_architecture_codes_match_pynvml_constants() -> None:
    """Our code → family table agrees with the NVML_DEVICE_ARCH_* constants of the installed pynvml."""
    for code, family in NVML_ARCH_NAMES.items():
        assert getattr(pynvml, f"NVML_DEVICE_ARCH_{family.upper()}") == code
    for name in dir(pynvml):
        if name.startswith("NVML_DEVICE_ARCH_") and name.removeprefix("NVML_DEVICE_ARCH_").lower() in (
            KNOWN_FAMILIES
        ):
            assert NVML_ARCH_NAMES[getattr(pynvml, name)] == name.removeprefix("NVML_DEVICE_ARCH_").lower()


def test_every_gpu_architecture_pynvml_knows_is_in_the_table() -> None:
    """A newer pynvml naming a new GPU family makes this fail, so the table gets updated."""
    not_gpus = {"UNKNOWN", "DLA", "DLA2", "NPU3"}  # accelerators without CUDA, or no answer
    for name in dir(pynvml):
        suffix = name.removeprefix("NVML_DEVICE_ARCH_")
        if name.startswith("NVML_DEVICE_ARCH_") and suffix not in not_gpus and not suffix.startswith("NPU"):
            assert NVML_ARCH_NAMES.get(getattr(pynvml, name)) == suffix.lower(), name


def test_every_family_is_known() -> None:
    assert set(NVML_ARCH_NAMES.values()) <= set(KNOWN_FAMILIES)
    assert {family for _, family in CC_FAMILIES} <= set(KNOWN_FAMILIES)


def test_nvml_answer_wins_over_the_cc_table() -> None:
    assert family_from_nvml(pynvml.NVML_DEVICE_ARCH_ADA, 8, 9) == "ada"
    # Volta and Turing share major 7: only NVML (or the minor) tells them apart.
    assert family_from_nvml(pynvml.NVML_DEVICE_ARCH_TURING, 7, 5) == "turing"


@pytest.mark.parametrize("code", [None, pynvml.NVML_DEVICE_ARCH_UNKNOWN, pynvml.NVML_DEVICE_ARCH_DLA])
def test_nvml_without_a_family_falls_back_to_the_cc_table(code: int | None) -> None:
    assert family_from_nvml(code, 9, 0) == "hopper"


@pytest.mark.parametrize(
    ("cc", "bf16", "fp8", "hopper"),
    [
        ((7, 0), False, False, False),  # V100: FP16 tensor cores only
        ((7, 5), False, False, False),  # T4: FP16/INT8 tensor cores, no BF16
        ((8, 0), True, False, False),  # A100: BF16 arrives with Ampere
        ((8, 6), True, False, False),  # A10G
        ((8, 9), True, True, False),  # L4 / Ada: FP8 tensor cores
        ((9, 0), True, True, True),  # H100 / H200 / H20
        ((10, 0), True, True, False),  # B200
        ((12, 0), True, True, False),  # RTX 5090
    ],
)
def test_native_formats(cc: tuple[int, int], bf16: bool, fp8: bool, hopper: bool) -> None:
    assert bf16_native(*cc) is bf16
    assert fp8_native(*cc) is fp8
    assert is_hopper(*cc) is hopper
