"""Cost of the FP32 projection fix: memory of the FP32 layers and the vision embedder's time.

vLLM's real Gemma4UnifiedVisionEmbedder at real sizes (patch_dim 6912, mm_embed_dim 3840), FP16 model
dtype, one image of 256 patches (and a batch of 4 images), on this machine's CPU. The baseline is the
unpatched embedder measured in the same run; the script prints ratios against it.

    .venv/bin/python bench/bench_fp32_projection.py [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PATCH_DIM, EMBED_DIM, POSEMB = 6912, 3840, 1120


def random_checkpoint() -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(0)
    shapes = {
        "patch_ln1.weight": (PATCH_DIM,),
        "patch_ln1.bias": (PATCH_DIM,),
        "patch_dense.weight": (EMBED_DIM, PATCH_DIM),
        "patch_dense.bias": (EMBED_DIM,),
        "patch_ln2.weight": (EMBED_DIM,),
        "patch_ln2.bias": (EMBED_DIM,),
        "pos_embedding": (POSEMB, 2, EMBED_DIM),
        "pos_norm.weight": (EMBED_DIM,),
        "pos_norm.bias": (EMBED_DIM,),
    }
    return {name: torch.randn(shape, generator=gen).to(torch.bfloat16) for name, shape in shapes.items()}


def time_forward(embedder: Any, patches: Any, positions: Any, repeats: int) -> float:
    import torch

    with torch.no_grad():
        for _ in range(3):
            embedder(patches, positions)
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            embedder(patches, positions)
            samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    from tests.fixes.test_fp32_projection import build_embedder
    from tests.gemma4_models import gemma4_unified_in_one_process

    with gemma4_unified_in_one_process() as gemma4_unified:
        measure(args.repeats, gemma4_unified, build_embedder)


def measure(repeats: int, gemma4_unified: Any, build_embedder: Any) -> None:
    import pytest
    import torch

    from deploykit.fixes import fp32_projection

    weights = random_checkpoint()
    baseline = build_embedder(gemma4_unified, torch.float16, weights)
    with pytest.MonkeyPatch.context() as undo:
        embedder_class = gemma4_unified.Gemma4UnifiedVisionEmbedder
        undo.setattr(embedder_class, "__init__", embedder_class.__init__)
        fp32_projection.apply()
        fixed = build_embedder(gemma4_unified, torch.float16, weights)
    assert fixed.patch_dense.bias.dtype == torch.float32 and fixed.patch_ln2.weight.dtype == torch.float32
    # Element counts from the checkpoint (the CPU build repacks patch_dense.weight out of the module).
    moved = sum(t.numel() for n, t in weights.items() if n.startswith(("patch_dense.", "patch_ln2.")))
    plain_bytes, fixed_bytes = moved * 2, moved * 4
    whole_fp16 = sum(t.numel() * 2 for t in weights.values())

    print(f"torch threads: {torch.get_num_threads()}, repeats: {repeats} (median)")
    print(
        f"memory: patch_dense+patch_ln2 FP16 {plain_bytes / 2**20:.1f} MiB"
        f" -> FP32 {fixed_bytes / 2**20:.1f} MiB "
        f"(+{(fixed_bytes - plain_bytes) / 2**20:.1f} MiB; whole embedder FP16 {whole_fp16 / 2**20:.1f} MiB, "
        f"x{(whole_fp16 + fixed_bytes - plain_bytes) / whole_fp16:.2f})"
    )
    for images in (1, 4):
        patches = torch.rand(images, 256, PATCH_DIM)
        grid = torch.arange(16)
        rows, cols = torch.meshgrid(grid, grid, indexing="ij")
        positions = torch.stack([cols.reshape(-1), rows.reshape(-1)], -1).expand(images, 256, 2).contiguous()
        base_s = time_forward(baseline, patches, positions, repeats)
        fixed_s = time_forward(fixed, patches, positions, repeats)
        print(
            f"embedder forward, {images} image(s) x 256 patches: FP16 baseline {base_s * 1e3:.1f} ms, "
            f"with fix {fixed_s * 1e3:.1f} ms, ratio {fixed_s / base_s:.2f}"
        )


if __name__ == "__main__":
    main()
