"""Peer-to-peer and NVLink status between GPUs, read through the fake NVML with recorded hosts
(tests/fixtures/hosts: an NVSwitch board, a patched-P2P GeForce pair, a cross-socket PCIe pair)."""

from __future__ import annotations

import json
from pathlib import Path

import pynvml
import pytest

from deploykit.advisories import judge_all, machine_facts
from deploykit.probe.load import load_facts, probe
from tests.fakes.fake_nvml import FakeNvml, host_fixture_keys, load_gpu_fixture, load_host_fixture

EXPECTED = {
    "h100x8": ("ok", "ok", "ok", "internal"),
    "a100x2": ("ok", "ok", "ok", "internal"),
    "rtx3090x2-p2p-patched": ("ok", "ok", "not_supported", "hostbridge"),
    "v100pcie-x2-nop2p": (
        "ioh_topology_not_supported",
        "ioh_topology_not_supported",
        "not_supported",
        "system",
    ),
}


def test_every_host_fixture_names_its_sources() -> None:
    assert set(host_fixture_keys()) == set(EXPECTED)
    for key in host_fixture_keys():
        assert {"host", "link"} <= set(load_host_fixture(key).source)


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_every_pair_of_gpus_gets_its_link(key: str) -> None:
    host = load_host_fixture(key)

    facts = probe(nvml=FakeNvml.from_host(host))

    assert facts.error is None
    assert facts.gpu_links is not None
    pairs = [link.gpus for link in facts.gpu_links]
    assert pairs == [(a, b) for a in range(host.count) for b in range(a + 1, host.count)]
    for link in facts.gpu_links:
        assert (link.p2p_read, link.p2p_write, link.nvlink, link.topology) == EXPECTED[key]
        assert link.errors == []


def test_one_gpu_has_no_links_and_asks_no_pair_question() -> None:
    fake = FakeNvml.from_fixture(load_gpu_fixture("h100"))

    facts = probe(nvml=fake)

    assert facts.gpu_links == []
    assert "nvmlDeviceGetP2PStatus" not in fake.call_names()


def test_a_driver_without_the_queries_gives_unknown_not_an_error() -> None:
    fake = FakeNvml.from_fixture(load_gpu_fixture("l4"), count=2)  # link=None: NOT_SUPPORTED

    facts = probe(nvml=fake)

    assert facts.error is None
    [link] = facts.gpu_links or []
    assert (link.p2p_read, link.nvlink, link.topology, link.errors) == ("unknown", "unknown", None, [])


def test_a_failed_pair_query_is_recorded_on_the_pair_only() -> None:
    host = load_host_fixture("a100x2")
    fake = FakeNvml.from_host(host, failures={("nvmlDeviceGetP2PStatus", 0): pynvml.NVML_ERROR_UNKNOWN})

    facts = probe(nvml=fake)

    assert facts.error is None
    [link] = facts.gpu_links or []
    assert link.p2p_read == "unknown"
    assert link.errors and all(e.startswith("nvmlDeviceGetP2PStatus") for e in link.errors)
    assert facts.gpus[0].errors == []


def test_facts_saved_before_links_were_probed_still_load(tmp_path: Path) -> None:
    saved = json.loads((Path(__file__).parents[1] / "fixtures" / "facts" / "a100x2.json").read_text())
    del saved["gpu_links"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(saved))

    facts = load_facts(str(path))

    assert facts.gpu_links is None
    deployment = machine_facts(facts, vllm_version="0.33.0", platform="cuda", gpu_count=2)
    verdict = next(v for v in judge_all(deployment) if v.id == "custom-allreduce-patched-p2p")
    assert any(c.condition == "p2p" and c.met is None for c in verdict.checks)
