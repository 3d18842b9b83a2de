"""The models the serving benchmarks measure, side by side in one run: the tiny random Llama (always there,
built locally) and SmolLM2-135M-Instruct, the real model deploykit converts from a pinned package (issue 37).
Each is served as its shipped profile serves it (demo-cpu, smollm2-cpu)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.vllm_harness import tiny_serve_args


@dataclass
class Subject:
    """A model to measure: where it is, its profile, its served name, how `vllm serve` is asked."""

    key: str
    title: str
    model_dir: Path
    profile: str
    served_name: str
    max_model_len: int
    kv_cache: str

    def serve_args(self, dtype: str = "float32") -> list[str]:
        """The profile's `vllm serve` arguments (CPU build), with `dtype` (the profiles say float32)."""
        args = tiny_serve_args(self.model_dir, served_name=self.served_name, max_model_len=self.max_model_len)
        args[args.index("--dtype") + 1] = dtype
        args[args.index("--kv-cache-memory-bytes") + 1] = self.kv_cache
        return args


def tiny() -> Subject | None:
    from deploykit.tinymodel import build_tiny_model

    return Subject("tiny", "tiny random Llama (~1 M)", build_tiny_model(), "demo-cpu", "tiny", 1024, "64M")


def smollm2() -> Subject | None:
    """None where this checkout has no conversion (deploykit.smollm2); fetched and converted on first use."""
    try:
        from deploykit.smollm2 import ensure_smollm2  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return Subject(
        "smollm2", "SmolLM2-135M-Instruct", Path(ensure_smollm2()), "smollm2-cpu", "smollm2", 2048, "256M"
    )


SUBJECTS: dict[str, Callable[[], Subject | None]] = {"tiny": tiny, "smollm2": smollm2}


def subjects(keys: str) -> list[tuple[str, Subject | None]]:
    """The comma-separated `keys` (tiny, smollm2), each made ready; None where it is not in this checkout."""
    return [(key.strip(), SUBJECTS[key.strip()]()) for key in keys.split(",") if key.strip()]
