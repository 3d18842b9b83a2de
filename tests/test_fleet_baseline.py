"""The fingerprint key's parts: weights identity, compute dtype, and a real plan's key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from deploykit.fleet_baseline import (
    device_part,
    effective_dtype,
    key_digest,
    key_parts_for_plan,
    model_identity,
)


def weights(directory: Path, payload: bytes) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (directory / "model.safetensors").write_bytes(payload)
    return directory


def test_the_weights_identity_follows_the_content_not_the_place(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 2048  # 512 KiB: start, middle and end samples are distinct blocks
    original = weights(tmp_path / "a", payload)
    copy = tmp_path / "b"
    shutil.copytree(original, copy)
    assert model_identity(str(original)) == model_identity(str(copy))  # another host's copy: same key
    tuned = bytearray(payload)
    tuned[len(payload) // 2] ^= 0xFF  # one byte in the middle block
    assert model_identity(str(weights(tmp_path / "c", bytes(tuned)))) != model_identity(str(original))
    assert model_identity("org/model", "abc123") == "org/model@abc123"


@pytest.mark.parametrize(
    ("serve", "checkpoint", "expected"),
    [
        ("float32", "bfloat16", "float32"),
        ("half", None, "float16"),
        ("auto", "bfloat16", "bfloat16"),
        ("auto", "float16", "float16"),
        ("auto", "float32", "bfloat16"),  # vLLM may cast a float32 checkpoint down: the loosest
        ("auto", None, "bfloat16"),
    ],
)
def test_the_compute_dtype(serve: str, checkpoint: str | None, expected: str) -> None:
    assert effective_dtype(serve, checkpoint) == expected


def test_the_device_is_the_gpus_product_and_compute_capability() -> None:
    facts = {"gpus": [{"name": "NVIDIA H100", "compute_capability": "9.0"}] * 2}
    assert device_part(facts, "cuda", 2) == "NVIDIA H100 sm9.0"
    assert device_part(facts, "cpu", 1).startswith("cpu: ")


def test_a_real_plans_key_is_stable_and_says_what_it_is_made_of(tiny_model_dir: Path) -> None:
    from deploykit.plan import make_plan
    from deploykit.probe.load import probe
    from deploykit.profile.load import load_profile

    loaded = load_profile("demo-cpu")
    plan = make_plan(loaded, probe())
    parts, dtype = key_parts_for_plan(loaded.profile, plan, {}, 5)
    again, _ = key_parts_for_plan(loaded.profile, make_plan(loaded, probe()), {}, 5)
    assert dtype == "float32" and parts == again and key_digest(parts) == key_digest(again)
    assert set(parts) == {
        "model",
        "weights",
        "dtype",
        "vllm",
        "device",
        "tensor_parallel_size",
        "fixes",
        "probe_set",
        "top_k",
    }
    assert parts["model"] == "builtin:tiny-llama" and parts["weights"].startswith("sha256:")
    with_fix, _ = key_parts_for_plan(loaded.profile, plan, {"device_penalties": "x"}, 5)
    assert key_digest(with_fix) != key_digest(parts)
