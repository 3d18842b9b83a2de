"""The pydantic-free probe document is exactly the `ProbeFacts` contract, byte for byte.

`deploykit probe --format json` prints `document_json(read_probe_document())` without importing
pydantic; every other reader validates the same document with `deploykit.probe.facts`. Here both are
held to the same bytes for every GPU model fixture and every way NVML fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml
import pytest

from deploykit.probe.facts import ProbeFacts
from deploykit.probe.nvml_reader import document_json, read_probe_document
from tests.fakes.fake_nvml import FakeNvml, gpu_fixture_keys, load_gpu_fixture


def fixture_nvml(key: str, **kwargs: Any) -> Callable[[], FakeNvml]:
    return lambda: FakeNvml.from_fixture(load_gpu_fixture(key), **kwargs)


SCENARIOS: dict[str, Callable[[], FakeNvml]] = {
    **{f"gpu-{key}": fixture_nvml(key) for key in gpu_fixture_keys()},
    "two-h100": fixture_nvml("h100", count=2),
    "gpu-lost-mid-probe": fixture_nvml("h100", count=2, lost={1: "nvmlDeviceGetMemoryInfo"}),
    "gpu-lost-before-handle": fixture_nvml("a100", count=2, lost={1: "nvmlDeviceGetHandleByIndex"}),
    "version-mismatch-at-init": fixture_nvml("t4", init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH),
    "library-not-found": lambda: FakeNvml(library_found=False),
    "no-gpu": lambda: FakeNvml(gpus=[]),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_document_is_what_the_facts_model_validates_and_writes(scenario: str) -> None:
    document = read_probe_document(SCENARIOS[scenario](), package_version={"torch": "2.13.0"}.get)

    facts = ProbeFacts.model_validate(document)  # extra="forbid": no key the model does not know

    assert facts.model_dump(mode="json") == document  # and none it would have filled in
    assert document_json(document) == facts.model_dump_json(indent=2)


def test_the_comparison_can_fail() -> None:
    """A document whose keys drift from the model's order or names is caught above."""
    document = read_probe_document(FakeNvml(gpus=[]), package_version=lambda name: None)
    reordered = {"error": document["error"], **{k: v for k, v in document.items() if k != "error"}}

    assert document_json(reordered) != ProbeFacts.model_validate(reordered).model_dump_json(indent=2)
    with pytest.raises(ValueError, match="Extra inputs"):
        ProbeFacts.model_validate({**document, "gpu_count": 0})


def test_non_ascii_names_are_written_as_pydantic_writes_them() -> None:
    document = read_probe_document(FakeNvml(gpus=[]), package_version=lambda name: None)
    document["error"] = "GPU 0: nvmlDeviceGetName: «Übertaktet» ✓"

    assert document_json(document) == ProbeFacts.model_validate(document).model_dump_json(indent=2)
