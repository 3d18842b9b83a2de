"""Module-level proof of the FP32 projection fix with vLLM's real Gemma4UnifiedVisionEmbedder on the CPU.

Real sizes (patch_dim 6912, mm_embed_dim 3840), weights in the field report's range (patch_dense weight
-130..147, bias -127..126) stored as BF16 like the checkpoint, served in FP16, on 256 patches cut from a
synthetic 768x768 image. Without the fix one output channel of patch_dense overflows 65504 in every patch
and patch_ln2 turns those rows into NaN; with it everything is finite and matches an FP32 reference.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest

from deploykit.fixes import fp32_projection
from deploykit.fixes.base import FixError, TargetStatus
from deploykit.installed import vllm_version_label
from tests.gemma4_models import gemma4_unified_in_one_process

pytestmark = pytest.mark.vllm_import  # vLLM's Gemma4 module, in this process

PATCH_DIM = 6912  # (16 * 3) ** 2 * 3: Gemma4 Unified's default patch_size 16, pooling 3
EMBED_DIM = 3840
HOT_CHANNEL = 1215  # the channel that overflowed in the field report
IMAGE_SIDE = 768  # 16 x 16 = 256 model patches of 48 x 48 pixels, as in the report
FP16_MAX = 65504.0
# Tolerance of the fixed FP16 output against the all-FP32 reference, relative to max(|reference|, 1):
# the fixed path keeps patch_ln1 in FP16 (as vLLM does), rounds patch_ln2's output to FP16 and runs the
# position add and pos_norm in FP16. FP16 keeps 11 significant bits (relative step 2**-11 = 4.9e-4), so a
# few steps of rounding is expected; 2e-3 (four steps) still catches any real drift.
MAX_REL_ERROR = 2e-3
# patch_dense's own output: its input is patch_ln1's FP16 output, and 6912 products of weights up to 147
# partly cancel, so FP16 input rounding shows up to about 1e-2 of a channel's largest value.
MAX_DENSE_REL_ERROR = 1e-2


@pytest.fixture(scope="module")
def vllm_one_process() -> Iterator[Any]:
    """vLLM's distributed state for one process (gloo), as ColumnParallelLinear needs; the module itself."""
    with gemma4_unified_in_one_process() as gemma4_unified:
        yield gemma4_unified


@pytest.fixture
def fix_applied(vllm_one_process: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """The fix applied for one test; the class's original __init__ comes back afterwards."""
    embedder_class = vllm_one_process.Gemma4UnifiedVisionEmbedder
    monkeypatch.setattr(embedder_class, "__init__", embedder_class.__init__)
    return fp32_projection.apply()


@pytest.fixture(scope="module")
def checkpoint_weights() -> dict[str, Any]:
    """The embedder's weights as a BF16 checkpoint holds them, in the ranges of the field report.

    patch_ln1 has a bias (as trained LayerNorms do); channel HOT_CHANNEL's weights line up with it, so
    that channel gets a large positive sum for every patch: the mechanism behind "channel 1215 overflows
    for every valid patch". All other channels are ordinary and stay far below 65504.
    """
    import torch

    gen = torch.Generator().manual_seed(1215)
    ln1_bias = torch.empty(PATCH_DIM).uniform_(0.1, 0.3, generator=gen)
    ln1_bias *= torch.where(torch.rand(PATCH_DIM, generator=gen) < 0.5, -1.0, 1.0)
    weight = torch.randn(EMBED_DIM, PATCH_DIM, generator=gen) * 3.0
    aligned = torch.empty(PATCH_DIM).uniform_(100.0, 147.0, generator=gen)
    weight[HOT_CHANNEL] = torch.where(ln1_bias > 0, aligned, -aligned.clamp(max=130.0))
    bias = torch.empty(EMBED_DIM).uniform_(-127.0, 126.0, generator=gen)
    bias[HOT_CHANNEL] = 126.0
    floats = {
        "patch_ln1.weight": 1.0 + 0.05 * torch.randn(PATCH_DIM, generator=gen),
        "patch_ln1.bias": ln1_bias,
        "patch_dense.weight": weight.clamp(-130.0, 147.0),
        "patch_dense.bias": bias,
        "patch_ln2.weight": 1.0 + 0.05 * torch.randn(EMBED_DIM, generator=gen),
        "patch_ln2.bias": 0.02 * torch.randn(EMBED_DIM, generator=gen),
        "pos_embedding": 0.02 * torch.randn(1120, 2, EMBED_DIM, generator=gen),
        "pos_norm.weight": 1.0 + 0.05 * torch.randn(EMBED_DIM, generator=gen),
        "pos_norm.bias": 0.02 * torch.randn(EMBED_DIM, generator=gen),
    }
    return {name: tensor.to(torch.bfloat16) for name, tensor in floats.items()}


@pytest.fixture(scope="module")
def image_patches() -> tuple[Any, Any]:
    """Pixel patches and their (x, y) positions cut from a synthetic photo-like image (gradients, shapes,
    noise; values in [0, 1]), shaped (1, 256, 6912) and (1, 256, 2) as the Gemma4 processor emits them."""
    import torch

    gen = torch.Generator().manual_seed(7)
    axis = torch.linspace(0.0, 1.0, IMAGE_SIDE)
    yy, xx = torch.meshgrid(axis, axis, indexing="ij")
    disc = (((xx - 0.6) ** 2 + (yy - 0.4) ** 2) < 0.05).float()
    red = 0.6 * xx + 0.3 * disc
    green = 0.5 * yy + 0.2 * torch.sin(12.0 * xx)
    blue = 0.4 + 0.4 * disc * yy
    image = torch.stack([red, green, blue], dim=-1) + 0.03 * torch.randn(
        IMAGE_SIDE, IMAGE_SIDE, 3, generator=gen
    )
    image = image.clamp(0.0, 1.0)
    side = 48
    grid = IMAGE_SIDE // side
    patches = image.reshape(grid, side, grid, side, 3).permute(0, 2, 1, 3, 4).reshape(grid * grid, -1)
    rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    positions = torch.stack([cols.reshape(-1), rows.reshape(-1)], dim=-1)
    return patches.unsqueeze(0), positions.unsqueeze(0)


def build_embedder(module: Any, dtype: Any, weights: dict[str, Any], *, quant_config: Any = None) -> Any:
    """Build the real embedder in `dtype` as vLLM's loader does: default dtype, weight loaders, then
    process_weights_after_loading (on the CPU platform this repacks patch_dense's weight)."""
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.models.utils import AutoWeightsLoader
    from vllm.utils.torch_utils import set_default_torch_dtype

    with set_current_vllm_config(VllmConfig()), set_default_torch_dtype(dtype):
        embedder = module.Gemma4UnifiedVisionEmbedder(
            _vision_config(), quant_config=quant_config, prefix="vision_embedder"
        )
        loaded = AutoWeightsLoader(embedder).load_weights(weights.items())
    assert loaded == set(weights)
    embedder.patch_dense.quant_method.process_weights_after_loading(embedder.patch_dense)
    return embedder.eval().requires_grad_(False).to(torch.device("cpu"))


def _vision_config() -> Any:
    from transformers.models.gemma4_unified.configuration_gemma4_unified import Gemma4UnifiedVisionConfig

    config = Gemma4UnifiedVisionConfig()
    assert config.model_patch_size**2 * 3 == PATCH_DIM and config.mm_embed_dim == EMBED_DIM
    return config


def run_stages(embedder: Any, patches: Any, positions: Any) -> dict[str, Any]:
    """Run the embedder's own forward and capture what patch_dense and patch_ln2 hand on."""
    import torch

    seen: dict[str, Any] = {}

    def keep(name: str) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            seen[name] = (output[0] if isinstance(output, tuple) else output).detach().clone()

        return hook

    handles = [
        embedder.patch_dense.register_forward_hook(keep("dense")),
        embedder.patch_ln2.register_forward_hook(keep("ln2")),
    ]
    try:
        with torch.no_grad():
            seen["output"] = embedder(patches, positions)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def test_installed_vllm_is_applicable(vllm_one_process: Any) -> None:
    check = fp32_projection.check_target()
    assert check.status is TargetStatus.APPLICABLE, check.detail
    assert check.target.endswith("gemma4_unified.Gemma4UnifiedVisionEmbedder")


def test_without_fix_fp16_patch_dense_overflows_and_patch_ln2_is_nan(
    vllm_one_process: Any, checkpoint_weights: dict[str, Any], image_patches: tuple[Any, Any]
) -> None:
    import torch

    embedder = build_embedder(vllm_one_process, torch.float16, checkpoint_weights)
    stages = run_stages(embedder, *image_patches)
    dense, ln2, output = stages["dense"][0], stages["ln2"][0], stages["output"][0]
    inf_rows, inf_channels = torch.isinf(dense).nonzero(as_tuple=True)
    print(
        f"\nwithout fix: dense dtype={dense.dtype} inf={inf_rows.numel()} in channels "
        f"{sorted(set(inf_channels.tolist()))}; "
        f"finite absmax={dense[torch.isfinite(dense)].abs().max():.0f}; "
        f"ln2 NaN={int(torch.isnan(ln2).sum())}/{ln2.numel()}; output NaN={int(torch.isnan(output).sum())}"
    )
    assert dense.dtype == torch.float16
    assert inf_rows.numel() >= 1
    assert set(inf_channels.tolist()) == {HOT_CHANNEL}
    assert torch.isnan(ln2[inf_rows.unique()]).all()
    assert torch.isnan(output).any()


def test_with_fix_every_output_is_finite_and_matches_fp32_reference(
    fix_applied: str,
    vllm_one_process: Any,
    checkpoint_weights: dict[str, Any],
    image_patches: tuple[Any, Any],
) -> None:
    import torch

    fixed = build_embedder(vllm_one_process, torch.float16, checkpoint_weights)
    got = run_stages(fixed, *image_patches)
    # The reference is the unpatched class built entirely in FP32 from the same BF16 weights.
    with pytest.MonkeyPatch.context() as undo:
        embedder_class = vllm_one_process.Gemma4UnifiedVisionEmbedder
        undo.setattr(embedder_class, "__init__", inspect.unwrap(embedder_class.__init__))
        reference = build_embedder(vllm_one_process, torch.float32, checkpoint_weights)
    want = run_stages(reference, *image_patches)

    assert got["dense"].dtype == torch.float32
    assert got["ln2"].dtype == torch.float16 and got["output"].dtype == torch.float16
    for name in ("dense", "ln2", "output"):
        assert torch.isfinite(got[name]).all(), name
    assert got["dense"][..., HOT_CHANNEL].min() > FP16_MAX  # the overflowing channel, now representable
    errors = {}
    for name in ("dense", "output"):
        reference_values = want[name]
        diff = (got[name].float() - reference_values).abs()
        # dense: relative to each channel's largest |value| (channels differ by 100x in scale);
        # output: relative to max(|value|, 1), the scale LayerNorm outputs live on.
        scale = reference_values.abs().amax(dim=-2, keepdim=True) if name == "dense" else 1.0
        errors[name] = (float(diff.max()), float((diff / reference_values.abs().clamp(min=scale)).max()))
    print(
        f"\nwith fix ({fix_applied}): dense max abs err {errors['dense'][0]:.3g} "
        f"(rel {errors['dense'][1]:.3g}, hot channel min {got['dense'][..., HOT_CHANNEL].min():.0f}); "
        f"output max abs err {errors['output'][0]:.3g} (rel {errors['output'][1]:.3g}) vs FP32 reference"
    )
    assert errors["dense"][1] < MAX_DENSE_REL_ERROR
    assert errors["output"][1] < MAX_REL_ERROR


def test_with_fix_only_patch_dense_and_patch_ln2_are_fp32(
    fix_applied: str, vllm_one_process: Any, checkpoint_weights: dict[str, Any]
) -> None:
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.models.utils import AutoWeightsLoader
    from vllm.utils.torch_utils import set_default_torch_dtype

    with set_current_vllm_config(VllmConfig()), set_default_torch_dtype(torch.float16):
        embedder = vllm_one_process.Gemma4UnifiedVisionEmbedder(_vision_config(), prefix="vision_embedder")
        AutoWeightsLoader(embedder).load_weights(checkpoint_weights.items())
    dtypes = {name: param.dtype for name, param in embedder.named_parameters()}
    fp32 = {name for name, dtype in dtypes.items() if dtype == torch.float32}
    assert fp32 == {"patch_dense.weight", "patch_dense.bias", "patch_ln2.weight", "patch_ln2.bias"}
    assert all(dtype == torch.float16 for name, dtype in dtypes.items() if name not in fp32)
    # BF16 checkpoint tensors land in the FP32 parameters exactly (BF16 -> FP32 is lossless).
    for name in sorted(fp32):
        assert torch.equal(dict(embedder.named_parameters())[name], checkpoint_weights[name].float()), name
    dense = embedder.patch_dense
    assert dense.gather_output and dense.prefix == "vision_embedder.patch_dense"
    assert (dense.input_size, dense.output_size) == (PATCH_DIM, EMBED_DIM)


def _compressed_tensors_w4a16(ignore: list[str]) -> Any:
    """The field report's quantization: compressed-tensors W4A16 on Linear layers, minus `ignore`."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )

    return CompressedTensorsConfig.from_config(
        {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "ignore": ignore,
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {
                        "num_bits": 4,
                        "type": "int",
                        "symmetric": True,
                        "strategy": "group",
                        "group_size": 128,
                    },
                    "input_activations": None,
                }
            },
        }
    )


def test_quantized_patch_dense_is_refused_and_an_ignored_one_is_fixed(
    fix_applied: str, vllm_one_process: Any
) -> None:
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.utils.torch_utils import set_default_torch_dtype

    config = _vision_config()
    with set_current_vllm_config(VllmConfig()), set_default_torch_dtype(torch.float16):
        excluded = vllm_one_process.Gemma4UnifiedVisionEmbedder(
            config,
            quant_config=_compressed_tensors_w4a16(ignore=["vision_embedder.patch_dense"]),
            prefix="vision_embedder",
        )
        assert excluded.patch_dense.weight.dtype == torch.float32
        with pytest.raises(FixError) as refused:
            vllm_one_process.Gemma4UnifiedVisionEmbedder(
                config, quant_config=_compressed_tensors_w4a16(ignore=[]), prefix="vision_embedder"
            )
    message = str(refused.value)
    assert "fp32_projection" in message and vllm_version_label() in message  # the vLLM it runs in
    assert "vision_embedder.patch_dense is quantized" in message and "ignore" in message


def test_upstream_fix_is_detected_and_vllm_left_alone(
    vllm_one_process: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An embedder whose constructor picks the projection dtype from the platform, as the upstream fix
    in the field report does, counts as fixed upstream: apply() says so and changes nothing."""
    embedder_class = vllm_one_process.Gemma4UnifiedVisionEmbedder
    original_init = embedder_class.__init__

    def upstream_init(self: Any, config: Any, quant_config: Any = None, prefix: str = "") -> None:
        from vllm.platforms import current_platform

        dtype = getattr(config, "dtype", None)
        use_fp32 = dtype is not None and dtype not in current_platform.supported_dtypes
        original_init(self, config, quant_config, prefix)
        # stands for: self.patch_dense = ColumnParallelLinear(..., params_dtype=projection_dtype)
        # and: self.patch_ln2 = nn.LayerNorm(mm_embed_dim, dtype=projection_dtype)
        self.use_fp32_projection = use_fp32

    monkeypatch.setattr(embedder_class, "__init__", upstream_init)
    check = fp32_projection.check_target()
    assert check.status is TargetStatus.FIXED_UPSTREAM, check.detail
    assert "supported_dtypes" in check.detail
    described = fp32_projection.apply()
    assert "fixed upstream" in described and vllm_version_label() in described
    assert embedder_class.__init__ is upstream_init


def test_changed_target_shape_fails_loudly(vllm_one_process: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    embedder_class = vllm_one_process.Gemma4UnifiedVisionEmbedder

    def forward(self: Any, pixel_values: Any, pixel_position_ids: Any, image_mask: Any) -> Any:
        return self.patch_ln2(self.patch_dense(pixel_values)[0])

    monkeypatch.setattr(embedder_class, "forward", forward)
    check = fp32_projection.check_target()
    assert check.status is TargetStatus.TARGET_MISSING
    assert "image_mask" in check.detail
    version = re.escape(vllm_version_label())
    with pytest.raises(FixError, match=rf"fp32_projection: cannot apply to vLLM {version}.*forward"):
        fp32_projection.apply()
    assert not hasattr(embedder_class.__init__, fp32_projection.PATCH_MARKER)
