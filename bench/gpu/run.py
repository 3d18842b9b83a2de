"""GPU evidence kit: one call that checks deploykit's three fixes on a real GPU (issue 15).

    python bench/gpu/run.py --out DIR            # on the GPU machine (see bench/gpu/README.md), < 8 min
    python bench/gpu/run.py --dry-run --out DIR  # here: every step that needs no CUDA, at small sizes

Each step runs in its own process with its own time limit, so a crash, a hang or a CUDA error in one step
is recorded in its JSON and the kit goes on. DIR gets one `<step>.json` per step, `summary.json`,
`results.md`, and `probe-facts.json` (the probe's output, to commit as tests/fixtures/facts/h200-real.json).

Steps: probe (deploykit probe vs the H200 fixture), matmul_lora (the fix vs a float64 reference, under
torch.compile and a CUDA graph; punica's Triton ops on zero weights; timings; and stock punica of every
carried vLLM release, 0.32 and 0.33, at the #48590 / #47869 shapes, each release in its own process, so the
first GPU run answers whether 0.33's sm90 guard makes the fix unnecessary), penalties (the processor vs
vLLM's apply_all_penalties over random batch updates; per-step time vs vLLM V1, the V2 kernel and one logits
copy), fp32_projection (vLLM's Gemma4 Unified embedder in FP16: non-finite without the fix, finite with it),
v2_penalties (issue 33, vLLM 0.34's V2 runner, the only one left: the per-token decode time with and without
sampling penalties at 8, 32 and 64 concurrent users, and the memory its dense penalty table takes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for path in (str(REPO), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)

import carry  # noqa: E402

FIXTURE = REPO / "tests" / "fixtures" / "facts" / "h200.json"
STEPS = ("probe", "matmul_lora", "penalties", "fp32_projection", "v2_penalties")
# Seconds per step on the device: 575 s in all at most, so the call (timeout_s 600) and the machine's
# start-up stay well inside 15 minutes of device time; the dry run gets its own.
STEP_LIMIT_S = {"probe": 60, "matmul_lora": 220, "penalties": 130, "fp32_projection": 90, "v2_penalties": 75}
DRY_LIMIT_S = {"probe": 60, "matmul_lora": 270, "penalties": 150, "fp32_projection": 150, "v2_penalties": 90}
# The V2 penalties measurement (issue 33): the release whose V2 runner is the only one, the concurrent
# users measured, and the sizes of a Llama-3-8B step (hidden 4096, vocab 128256).
V2_RELEASE = "0.34.0"
V2_USERS = (8, 32, 64)
V2_TABLE_ROWS = (64, 256, 1024)  # max_num_seqs whose penalty table is allocated and measured
V2_HIDDEN, V2_VOCAB = 4096, 128_256
# Stock punica per vLLM release (matmul_lora step): 0.32 from `.gpu-carry/vllm`, each other release from
# `.gpu-carry/releases/vllm-<release>.tar.xz` (`run.py --pack-release`; its .py sources, no compiled code).
RELEASES_DIR = REPO / ".gpu-carry" / "releases"
PUNICA_RELEASE_LIMIT_S = 70  # each; a vLLM import and 16 small Triton launches
# Facts that must agree with the H200 fixture on any H200 (drivers, versions, UUIDs, memory free may not).
STABLE_FACTS = ("name", "compute_capability", "arch", "bf16_native", "fp8_native", "is_hopper")
SCHEMA = 1


# --------------------------------------------------------------------------------------------------
# Step records
# --------------------------------------------------------------------------------------------------


class Step:
    """What one step found: named checks (True / False / None = not run here), data, errors per part."""

    def __init__(self, name: str, dry_run: bool) -> None:
        self.name = name
        self.dry_run = dry_run
        self.checks: dict[str, bool | None] = {}
        self.data: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        self.started = time.monotonic()

    def part(self, name: str, fn: Callable[[], None]) -> None:
        """Run one part; an exception is recorded under its name and the step goes on."""
        try:
            fn()
        except Exception as exc:
            self.errors[name] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"

    def check(self, name: str, ok: bool | None) -> None:
        self.checks[name] = None if ok is None else bool(ok)

    def skip(self, name: str, reason: str) -> None:
        self.skipped[name] = reason
        self.checks.setdefault(name, None)

    def record(self) -> dict[str, Any]:
        failed = [k for k, v in self.checks.items() if v is False]
        ran = [k for k, v in self.checks.items() if v is not None]
        if failed or self.errors:
            status = "failed"
        elif ran:
            status = "passed"
        else:
            status = "skipped"
        reason = None
        if failed:
            reason = "checks failed: " + ", ".join(failed)
        elif self.errors:
            reason = "errors in: " + ", ".join(self.errors)
        elif status == "skipped":
            reason = "; ".join(sorted(set(self.skipped.values()))) or "nothing to run"
        return {
            "schema": SCHEMA,
            "step": self.name,
            "status": status,
            "reason": reason,
            "dry_run": self.dry_run,
            "seconds": round(time.monotonic() - self.started, 2),
            "checks": self.checks,
            "skipped": self.skipped,
            "errors": self.errors,
            "data": self.data,
        }


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    except Exception as exc:
        info["torch_error"] = repr(exc)
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception as exc:
        info["triton"] = f"unavailable: {type(exc).__name__}"
    return info


def device_for(step: Step) -> Any:
    """CUDA on the device; the CPU in a dry run (or when no GPU is visible)."""
    import torch

    return torch.device("cuda" if torch.cuda.is_available() and not step.dry_run else "cpu")


def cuda_ms(fn: Callable[[], Any], repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of `fn` by CUDA events, one event pair per call."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def wall_ms(fn: Callable[[], Any], repeats: int, sync: Callable[[], None]) -> float:
    """Median wall milliseconds of `fn` including its host work, synchronising after each call."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


# --------------------------------------------------------------------------------------------------
# 1. probe
# --------------------------------------------------------------------------------------------------


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value and isinstance(value[0], dict):
        out = {}
        for index, item in enumerate(value):
            out.update(flatten(item, f"{prefix}[{index}]"))
        return out
    return {prefix: value}


def compare_facts(real: dict[str, Any], fixture: dict[str, Any]) -> list[dict[str, Any]]:
    """Every field whose value differs (or exists on one side only), as {field, fixture, real}."""
    flat_real, flat_fixture = flatten(real), flatten(fixture)
    return [
        {"field": key, "fixture": flat_fixture.get(key), "real": flat_real.get(key)}
        for key in sorted(set(flat_real) | set(flat_fixture))
        if flat_real.get(key) != flat_fixture.get(key)
    ]


def step_probe(step: Step, out: Path) -> None:
    code = "import sys; from deploykit.cli import main; sys.argv[0] = 'deploykit'; main()"
    done = subprocess.run(
        [sys.executable, "-c", code, "probe", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=50,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
        cwd=REPO,
    )
    step.data["exit_code"] = done.returncode
    step.data["stderr_tail"] = done.stderr[-1500:]
    facts = json.loads(done.stdout)
    (out / "probe-facts.json").write_text(json.dumps(facts, indent=2) + "\n")
    step.check("probe_json_parsed", True)
    fixture = json.loads(FIXTURE.read_text())
    differences = compare_facts(facts, fixture)
    step.data["fixture"] = str(FIXTURE.relative_to(REPO))
    step.data["differences"] = differences
    gpus = facts.get("gpus") or []
    step.data["gpu_count"] = len(gpus)
    if step.dry_run or not gpus:
        step.skip("probe_found_gpu", "no GPU on this machine" if not gpus else "dry run")
        step.skip("stable_facts_match_fixture", "no GPU facts to compare")
        return
    step.check("probe_found_gpu", True)
    mismatched = [k for k in STABLE_FACTS if gpus[0].get(k) != fixture["gpus"][0].get(k)]
    step.data["stable_facts_mismatched"] = mismatched
    step.check("stable_facts_match_fixture", not mismatched)


# --------------------------------------------------------------------------------------------------
# 2. matmul_lora
# --------------------------------------------------------------------------------------------------

# Upstream reports' layers. The issues name the model and GPU, not the layer; these are the attention
# projections of the named model families (in, output slices q/k/v), our reading, recorded as such.
UPSTREAM_SHAPES = {
    "48590_qwen3.6-35b-a3b_qkv": {"in": 2048, "slices": (4096, 512, 512), "rank": 16, "tokens": 512},
    "47869_h20_qkv": {"in": 4096, "slices": (4096, 1024, 1024), "rank": 64, "tokens": 400},
}
TIMING_GRID = {"ranks": (16, 64, 128), "adapters": (1, 4), "tokens": (1, 16, 256, 2048), "features": 4096}


def lora_inputs(
    tokens: int,
    features: int,
    slices: tuple[int, ...],
    rank: int,
    max_loras: int,
    dtype: Any,
    device: Any,
    seed: int,
    zero: bool = False,
) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float = 1.0) -> Any:
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

    x = rand(tokens, features)
    maker = (lambda *s, scale=1.0: torch.zeros(*s, dtype=dtype, device=device)) if zero else rand
    lora_a = tuple(maker(max_loras, 1, rank, features, scale=features**-0.5) for _ in slices)
    lora_b = tuple(maker(max_loras, 1, width, rank, scale=rank**-0.5) for width in slices)
    y = rand(tokens, sum(slices))
    return {"x": x, "a": lora_a, "b": lora_b, "y": y, "slices": tuple(slices)}


def mixed_slots(tokens: int, max_loras: int, seed: int) -> list[int]:
    """Several adapters and slot -1 (no adapter) in one batch, in runs as requests sit in a batch."""
    rng = random.Random(seed)
    slots: list[int] = []
    while len(slots) < tokens:
        slots += [rng.choice([-1, *range(max_loras)])] * rng.randrange(1, 9)
    return slots[:tokens]


def lora_reference64(inp: dict[str, Any], slots: list[int], scale: float, add_inputs: bool) -> Any:
    """y (+)= scale * (x @ A^T) @ B^T per token's slot, in float64 on the CPU."""
    import torch

    x = inp["x"].double().cpu()
    y = inp["y"].double().cpu() if add_inputs else torch.zeros_like(inp["y"], dtype=torch.float64).cpu()
    index = torch.tensor(slots)
    offset = 0
    for a, b, width in zip(inp["a"], inp["b"], inp["slices"], strict=True):
        a64, b64 = a.double().cpu()[:, 0], b.double().cpu()[:, 0]
        for slot in set(slots) - {-1}:
            rows = index == slot
            delta = (x[rows] @ a64[slot].t()) @ b64[slot].t() * scale
            y[rows, offset : offset + width] += delta
        offset += width
    return y


def rel_error(got: Any, want64: Any) -> float:
    diff = (got.double().cpu() - want64).abs().max()
    return float(diff / want64.abs().max().clamp(min=1e-30))


def matmul_exactness(step: Step, device: Any, dtype_name: str, small: bool) -> None:
    import torch

    from deploykit.fixes.matmul_lora import add_lora_linear

    dtype = getattr(torch, dtype_name)
    eps = torch.finfo(dtype).eps
    features, slices, rank, loras, tokens = (
        (256, (256, 64, 64), 16, 4, 37)
        if small
        else (
            4096,
            (4096, 1024, 1024),
            64,
            4,
            300,
        )
    )
    slots = mixed_slots(tokens, loras, seed=5)
    indices = torch.tensor(slots, device=device)
    key = f"matmul_lora_{dtype_name}"
    results: dict[str, Any] = {"features": features, "slices": slices, "rank": rank, "tokens": tokens}

    zero = lora_inputs(tokens, features, slices, rank, loras, dtype, device, 1, zero=True)
    before = zero["y"].clone()
    add_lora_linear(zero["y"], zero["x"], zero["a"], zero["b"], 1.0, slices, indices)
    step.check(f"{key}_zero_adapters_bit_exact", torch.equal(zero["y"], before))

    inp = lora_inputs(tokens, features, slices, rank, loras, dtype, device, 2)
    want = lora_reference64(inp, slots, 0.5, add_inputs=False)
    y = torch.full_like(inp["y"], float("nan"))
    add_lora_linear(y, inp["x"], inp["a"], inp["b"], 0.5, slices, indices, add_inputs=False)
    results["nan_buffer_rel_error"] = rel_error(y, want)
    step.check(f"{key}_nan_filled_output_finite", bool(torch.isfinite(y).all()))
    step.check(f"{key}_nan_filled_output_matches_float64", results["nan_buffer_rel_error"] <= 2 * eps)

    want = lora_reference64(inp, slots, 0.5, add_inputs=True)
    y = inp["y"].clone()
    add_lora_linear(y, inp["x"], inp["a"], inp["b"], 0.5, slices, indices)
    results["mixed_rel_error"] = rel_error(y, want)
    no_adapter = indices == -1
    results["rows_without_adapter"] = int(no_adapter.sum())
    step.check(f"{key}_mixed_batch_matches_float64", results["mixed_rel_error"] <= 2 * eps)
    step.check(f"{key}_slot_minus1_rows_untouched", torch.equal(y[no_adapter], inp["y"][no_adapter]))
    eager = y

    def compiled() -> None:
        backend = "aot_eager" if device.type == "cpu" else "inductor"
        results["compile_backend"] = backend
        fn = torch.compile(add_lora_linear, fullgraph=True, backend=backend, dynamic=False)
        got = inp["y"].clone()
        fn(got, inp["x"], inp["a"], inp["b"], 0.5, slices, indices)
        results["compiled_rel_error"] = rel_error(got, want)
        results["compiled_bit_equal_eager"] = torch.equal(got, eager)
        step.check(f"{key}_torch_compile_matches_float64", results["compiled_rel_error"] <= 2 * eps)

    step.part(f"{key}_torch_compile", compiled)
    if device.type != "cuda":
        step.skip(f"{key}_cuda_graph_replay", "CUDA graphs need CUDA")
    else:

        def graphed() -> None:
            static_y = inp["y"].clone()
            static_x = inp["x"].clone()
            static_idx = torch.full_like(indices, -1)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                add_lora_linear(static_y.clone(), static_x, inp["a"], inp["b"], 0.5, slices, static_idx)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                add_lora_linear(static_y, static_x, inp["a"], inp["b"], 0.5, slices, static_idx)
            # Replay with the real mapping written into the captured index buffer (as vLLM does).
            static_y.copy_(inp["y"])
            static_idx.copy_(indices)
            graph.replay()
            torch.cuda.synchronize()
            results["graph_rel_error"] = rel_error(static_y, want)
            results["graph_bit_equal_eager"] = torch.equal(static_y, eager)
            step.check(f"{key}_cuda_graph_replay", results["graph_rel_error"] <= 2 * eps)

        step.part(f"{key}_cuda_graph", graphed)
    step.data[key] = results


def punica_ops() -> tuple[Any, Any, Any]:
    from vllm.lora.ops.triton_ops.lora_expand_op import lora_expand
    from vllm.lora.ops.triton_ops.lora_kernel_metadata import LoRAKernelMeta
    from vllm.lora.ops.triton_ops.lora_shrink_op import lora_shrink

    return lora_shrink, lora_expand, LoRAKernelMeta


def punica_add_lora_linear(
    inp: dict[str, Any], slots: list[int], max_loras: int, scale: float, buffer_dtype: Any
) -> Callable[[], Any]:
    """punica_gpu.add_lora_linear's two calls on our inputs, its buffer in `buffer_dtype` (float32 as
    vLLM 0.32 allocates it; x.dtype as upstream #47869 proposes). Returns the call (y updated in place)."""
    import torch

    lora_shrink, lora_expand, meta_class = punica_ops()
    x, y = inp["x"], inp["y"]
    tokens = x.shape[0]
    meta = meta_class.make(max_loras, tokens, x.device)
    meta.prepare_tensors(torch.tensor(slots, dtype=torch.int64, device=x.device))
    rank = inp["b"][0].shape[-1]

    def call() -> Any:
        buffer = torch.empty((len(inp["slices"]), tokens, rank), dtype=buffer_dtype, device=x.device)
        lora_shrink(x, inp["a"], buffer, *meta.meta_args(tokens, False), scale)
        lora_expand(buffer, inp["b"], y, *meta.meta_args(tokens, False), offset_start=0, add_inputs=True)
        return y

    return call


def punica_nan_check(step: Step, device: Any) -> None:
    import torch

    results: dict[str, Any] = {}
    for name, shape in UPSTREAM_SHAPES.items():
        for dtype_name in ("float16", "bfloat16"):
            dtype = getattr(torch, dtype_name)
            for buffer_name, buffer_dtype in (("fp32_buffer", torch.float32), ("x_dtype_buffer", dtype)):
                case = f"{name}_{dtype_name}_{buffer_name}"

                def one(case: str = case, shape: dict[str, Any] = shape, dtype: Any = dtype,
                        buffer_dtype: Any = buffer_dtype) -> None:  # fmt: skip
                    loras = 4
                    slots = mixed_slots(shape["tokens"], loras, seed=11)
                    inp = lora_inputs(
                        shape["tokens"], shape["in"], shape["slices"], shape["rank"], loras, dtype, device, 3,
                        zero=True,
                    )  # fmt: skip
                    before = inp["y"].clone()
                    punica_add_lora_linear(inp, slots, loras, 1.0, buffer_dtype)()
                    torch.cuda.synchronize()
                    results[case] = {
                        "nan": int(torch.isnan(inp["y"]).sum()),
                        "inf": int(torch.isinf(inp["y"]).sum()),
                        "changed": int((inp["y"] != before).sum()),
                        "elements": inp["y"].numel(),
                    }

                step.part(f"punica_{case}", one)
    step.data["punica_zero_weights"] = results
    step.data["punica_returns_nan_on_zero_weights"] = any(r["nan"] for r in results.values())
    # A finding, not a pass/fail of deploykit: recorded as data. Our path on the same inputs must be clean.


def lora_timings(step: Step, device: Any, budget_s: float) -> None:
    import torch

    from deploykit.fixes.matmul_lora import add_lora_linear

    features = TIMING_GRID["features"]
    rows: list[dict[str, Any]] = []
    deadline = time.monotonic() + budget_s
    for rank in TIMING_GRID["ranks"]:
        for adapters in TIMING_GRID["adapters"]:
            for tokens in TIMING_GRID["tokens"]:
                if time.monotonic() > deadline:
                    step.data["lora_timing_truncated"] = True
                    step.data["lora_timings"] = rows
                    return
                inp = lora_inputs(tokens, features, (features,), rank, adapters, torch.bfloat16, device, 4)
                slots = [min(t * adapters // tokens, adapters - 1) for t in range(tokens)]
                indices = torch.tensor(slots, device=device)
                weight = torch.randn(features, features, device=device, dtype=torch.bfloat16)
                row: dict[str, Any] = {"rank": rank, "adapters": adapters, "tokens": tokens}
                row["base_ms"] = cuda_ms(lambda i=inp, w=weight: torch.nn.functional.linear(i["x"], w), 20)

                def ours(i: dict[str, Any] = inp, idx: Any = indices) -> Any:
                    return add_lora_linear(i["y"], i["x"], i["a"], i["b"], 1.0, (features,), idx)

                row["ours_ms"] = cuda_ms(ours, 20)
                try:
                    row["punica_ms"] = cuda_ms(
                        punica_add_lora_linear(inp, slots, adapters, 1.0, torch.float32), 20
                    )
                except Exception as exc:
                    row["punica_error"] = f"{type(exc).__name__}: {exc}"[:300]
                rows.append(row)
    step.data["lora_timings"] = rows


def step_matmul_lora(step: Step, out: Path) -> None:
    import torch

    device = device_for(step)
    step.data["device"] = str(device)
    for dtype_name in ("float16", "bfloat16"):
        step.part(
            f"exactness_{dtype_name}", lambda d=dtype_name: matmul_exactness(step, device, d, step.dry_run)
        )

    def imports() -> None:
        punica_ops()
        step.check("punica_ops_import_from_carried_sources", True)

    step.part("punica_import", imports)
    if device.type != "cuda":
        step.skip("punica_zero_weight_nan_check", "punica's Triton LoRA ops need CUDA")
        step.skip("lora_timings", "timings are taken on the GPU only")
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    step.part("punica_nan", lambda: punica_nan_check(step, device))
    step.part("timings", lambda: lora_timings(step, device, budget_s=50))


def step_matmul_lora_releases(step: Step, out: Path) -> None:
    """Stock punica of each carried vLLM release, each in its own process (one vLLM per process)."""
    releases = carried_releases()
    step.data["punica_releases"] = {}
    for release in ("0.32.0", "0.33.0"):
        if release not in releases:
            step.skip(
                f"punica_{release}_imports", f"vLLM {release}'s sources are not carried (--pack-release)"
            )
            continue
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--punica-release",
            release,
            "--out",
            str(out),
        ]
        if step.dry_run:
            command.append("--dry-run")
        target = out / f"punica-{release}.json"
        target.unlink(missing_ok=True)
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=PUNICA_RELEASE_LIMIT_S, cwd=REPO
            )
            tail = (done.stdout + done.stderr)[-1500:]
        except subprocess.TimeoutExpired:
            tail = f"timed out after {PUNICA_RELEASE_LIMIT_S} s"
        if not target.exists():
            step.errors[f"punica_{release}"] = tail
            continue
        record = json.loads(target.read_text())
        target.unlink()  # its content is in matmul_lora.json: the files that come back stay within 8
        step.data["punica_releases"][release] = record
        step.check(f"punica_{release}_imports", record.get("imports"))
        for name, reason in record.get("skipped", {}).items():
            step.skip(f"punica_{release}_{name}", reason)
        if record.get("error"):
            step.errors[f"punica_{release}"] = record["error"]


def carried_releases() -> dict[str, Path]:
    """Release → its carried sources: a folder holding `vllm/` or a .tar.xz of one."""
    found: dict[str, Path] = {}
    version_file = carry.CARRY / "vllm-version.txt"
    if (carry.CARRY / "vllm" / "__init__.py").exists() and version_file.exists():
        found[version_file.read_text().strip().split("+")[0]] = carry.CARRY
    for archive in sorted(RELEASES_DIR.glob("vllm-*.tar.xz")):
        found[archive.name[len("vllm-") : -len(".tar.xz")]] = archive
    return found


def pack_release(release: str, sources: Path) -> Path:
    """Here, not on the device: `sources/vllm` (an unpacked wheel, tools/fetch-vllm-sources.sh) → a small
    .tar.xz of its .py files and the few JSON files modules read at import, with vllm-compiled.txt (the
    compiled modules left behind, for carry.py's stand-ins) and vllm-version.txt."""
    import io
    import re
    import tarfile

    keep_models = re.compile(
        r"^model_executor/models/(__init__|adapters|config|interfaces[^/]*|module_mapping|registry|utils)\.py$"
    )
    package = sources / "vllm"
    RELEASES_DIR.mkdir(parents=True, exist_ok=True)
    target = RELEASES_DIR / f"vllm-{release}.tar.xz"
    compiled = sorted(
        "vllm." + str(path.relative_to(package)).split(".")[0].replace("/", ".")
        for path in package.rglob("*.so")
    )
    listed = (
        (sources / "COMPILED-LEFT-OUT.txt").read_text().split()
        if (sources / "COMPILED-LEFT-OUT.txt").exists()
        else []
    )
    compiled += sorted(name[: name.index(".")].replace("/", ".") for name in listed)
    with tarfile.open(target, "w:xz") as archive:
        for path in sorted(package.rglob("*")):
            relative = str(path.relative_to(package))
            if not path.is_file() or relative.startswith("benchmarks/"):
                continue
            if relative.startswith("model_executor/models/") and not keep_models.match(relative):
                continue
            if path.suffix == ".py" or (path.suffix == ".json" and path.stat().st_size < 64 * 1024
                                        and "/configs/" not in relative):  # fmt: skip
                archive.add(path, arcname=f"vllm/{relative}")
        for name, text in (
            ("vllm-compiled.txt", "\n".join(compiled) + "\n"),
            ("vllm-version.txt", release + "\n"),
        ):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return target


def punica_release_main(release: str, out: Path, dry_run: bool) -> int:
    """In its own process: import `release`'s punica Triton ops from its carried sources and, on a GPU, run
    them at the upstream shapes (random adapters, mixed slots with -1, the float32 shrink buffer vLLM
    allocates) against a float64 reference. Writes out/punica-<release>.json."""
    import tarfile
    import tempfile

    record: dict[str, Any] = {"release": release, "imports": None, "skipped": {}, "cases": {}}
    unpacked: Path | None = None
    try:
        source = carried_releases()[release]
        if source.is_file():
            unpacked = Path(tempfile.mkdtemp(prefix=f"vllm-{release}-"))
            with tarfile.open(source) as archive:
                archive.extractall(unpacked, filter="data")
            source = unpacked
        record["carry"] = carry.setup(simulate_bare=dry_run, carry=source)
        from deploykit.fixes.matmul_lora import read_source_facts

        record["source_facts"] = read_source_facts(source)
        punica_ops()
        record["imports"] = True
        record["carry"].update(carry.report())
        record["environment"] = environment()
        import torch

        if dry_run or not torch.cuda.is_available():
            record["skipped"]["stock_at_upstream_shapes"] = "punica's Triton LoRA ops need CUDA"
        else:
            torch.backends.cuda.matmul.allow_tf32 = False
            record["cases"] = punica_release_cases(torch.device("cuda"))
            record["returns_nan"] = any(c.get("nan") for c in record["cases"].values())
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
    (out / f"punica-{release}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    if unpacked is not None:
        import shutil

        shutil.rmtree(unpacked, ignore_errors=True)
    return 0


def punica_release_cases(device: Any) -> dict[str, Any]:
    import torch

    cases: dict[str, Any] = {}
    for name, shape in UPSTREAM_SHAPES.items():
        for dtype_name in ("float16", "bfloat16"):
            for zero in (False, True):
                case = f"{name}_{dtype_name}_{'zero' if zero else 'random'}_weights"
                try:
                    loras = 4
                    slots = mixed_slots(shape["tokens"], loras, seed=21)
                    inp = lora_inputs(
                        shape["tokens"], shape["in"], shape["slices"], shape["rank"], loras,
                        getattr(torch, dtype_name), device, 5, zero=zero,
                    )  # fmt: skip
                    want = lora_reference64(inp, slots, 1.0, add_inputs=True)
                    punica_add_lora_linear(inp, slots, loras, 1.0, torch.float32)()
                    torch.cuda.synchronize()
                    cases[case] = {
                        "nan": int(torch.isnan(inp["y"]).sum()),
                        "inf": int(torch.isinf(inp["y"]).sum()),
                        "rel_error": rel_error(torch.nan_to_num(inp["y"]), want),
                        "elements": inp["y"].numel(),
                    }
                except Exception as exc:
                    cases[case] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
    return cases


# --------------------------------------------------------------------------------------------------
# 3. penalties
# --------------------------------------------------------------------------------------------------


def fake_config(rows: int, vocab: int, max_model_len: int) -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=rows),
        model_config=SimpleNamespace(get_vocab_size=lambda: vocab, max_model_len=max_model_len),
    )


def cuda_repetition_stand_in() -> str:
    """vLLM's CUDA repetition kernel lives in its compiled `_C`, which is not carried. Where torch.ops._C
    lacks it, stand in with the kernel's rule (divide positive logits, multiply the others)."""
    import torch
    from vllm import _custom_ops

    try:
        torch.ops._C.apply_repetition_penalties_  # noqa: B018
        return "vLLM's compiled CUDA kernel"
    except (AttributeError, RuntimeError):
        pass

    def divide_rule(logits: Any, prompt_mask: Any, output_mask: Any, penalties: Any) -> None:
        scale = torch.where(prompt_mask | output_mask, penalties.unsqueeze(1), 1.0)
        logits.copy_(torch.where(logits > 0, logits / scale, logits * scale))

    _custom_ops.apply_repetition_penalties_cuda = divide_rule
    return "stand-in for vLLM's CUDA kernel (torch.ops._C not carried): positive / p, others * p"


class BatchTraffic:
    """Random requests through BatchUpdate as vLLM's V1 InputBatch sends them: removes, adds into the
    freed slots, condensing one-way moves from the end, and swaps."""

    def __init__(self, vocab: int, seed: int, max_rows: int) -> None:
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.max_rows = max_rows
        self.slots: list[dict[str, Any] | None] = []

    def params(self) -> Any:
        from vllm import SamplingParams

        rng = self.rng
        if rng.random() < 0.2:
            return SamplingParams(temperature=0.0)
        return SamplingParams(
            repetition_penalty=rng.choice([1.0, 1.1, 1.7, 0.6]),
            frequency_penalty=rng.choice([0.0, 0.3, -0.5, 1.9]),
            presence_penalty=rng.choice([0.0, 0.4, -1.2]),
        )

    def token(self) -> int:
        return self.rng.randrange(40) if self.rng.random() < 0.5 else self.rng.randrange(self.vocab)

    def step(self) -> Any:
        from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

        rng = self.rng
        removed = [i for i, s in enumerate(self.slots) if s is not None and rng.random() < 0.15]
        for i in removed:
            self.slots[i] = None
        added = []
        for _ in range(rng.randrange(0, 4)):
            holes = [i for i, s in enumerate(self.slots) if s is None]
            if not holes and len(self.slots) >= self.max_rows:
                break
            index = holes[0] if holes else len(self.slots)
            if index == len(self.slots):
                self.slots.append(None)
            outputs = [self.token() for _ in range(rng.randrange(0, 300))] if rng.random() < 0.2 else []
            req = {"params": self.params(), "prompt": [self.token() for _ in range(rng.randrange(1, 50))],
                   "outputs": outputs}  # fmt: skip
            self.slots[index] = req
            added.append((index, req["params"], req["prompt"], req["outputs"]))
        moved = []
        while True:  # condense: the last live row fills the first hole
            holes = [i for i, s in enumerate(self.slots) if s is None]
            live = [i for i, s in enumerate(self.slots) if s is not None]
            if not holes or not live or holes[0] > live[-1]:
                break
            self.slots[holes[0]], self.slots[live[-1]] = self.slots[live[-1]], None
            moved.append((live[-1], holes[0], MoveDirectionality.UNIDIRECTIONAL))
        while self.slots and self.slots[-1] is None:
            self.slots.pop()
        if len(self.slots) >= 2 and rng.random() < 0.5:
            a, b = rng.sample(range(len(self.slots)), 2)
            self.slots[a], self.slots[b] = self.slots[b], self.slots[a]
            moved.append((a, b, MoveDirectionality.SWAP))
        for req in self.slots:
            assert req is not None
            req["outputs"].append(self.token())
        return BatchUpdate(batch_size=len(self.slots), removed=removed, added=added, moved=moved)


def reference_penalties(traffic: BatchTraffic, logits: Any) -> Any:
    import torch
    from vllm.v1.sample.ops.penalties import apply_all_penalties

    reqs = [r for r in traffic.slots if r is not None]
    longest = max(len(r["prompt"]) for r in reqs)
    prompt = torch.full((len(reqs), longest), traffic.vocab, dtype=torch.int64)
    for i, r in enumerate(reqs):
        prompt[i, : len(r["prompt"])] = torch.tensor(r["prompt"])

    def column(name: str) -> Any:
        return torch.tensor(
            [getattr(r["params"], name) for r in reqs], dtype=torch.float32, device=logits.device
        )

    return apply_all_penalties(
        logits.clone(),
        prompt.to(logits.device),
        column("presence_penalty"),
        column("frequency_penalty"),
        column("repetition_penalty"),
        [list(r["outputs"]) for r in reqs],
    )


def penalties_exactness(step: Step, device: Any, steps: int, vocab: int, max_rows: int) -> None:
    import torch

    from deploykit.fixes._penalties_processor import DevicePenaltiesProcessor, remove_stand_aside

    if device.type == "cuda":
        step.data["repetition_reference"] = cuda_repetition_stand_in()
    proc = DevicePenaltiesProcessor(fake_config(max_rows, vocab, 4096), device, device.type == "cuda")
    remove_stand_aside()
    traffic = BatchTraffic(vocab, seed=2026, max_rows=max_rows)
    gen = torch.Generator().manual_seed(3)
    mismatched_steps, worst, rows_seen = [], 0.0, 0
    for index in range(steps):
        proc.update_state(traffic.step())
        if not traffic.slots:
            continue
        logits = (torch.randn(len(traffic.slots), vocab, generator=gen) * 4).to(device)
        want = reference_penalties(traffic, logits)
        got = proc.apply(logits.clone())
        rows_seen = max(rows_seen, len(traffic.slots))
        if not torch.equal(got, want):
            mismatched_steps.append(index)
            worst = max(worst, float((got - want).abs().max()))
    step.data["penalties_exactness"] = {
        "steps": steps,
        "vocab": vocab,
        "max_rows_seen": rows_seen,
        "mismatched_steps": mismatched_steps[:20],
        "max_abs_diff": worst,
    }
    step.check("penalties_exact_vs_vllm_apply_all_penalties", not mismatched_steps)


def penalties_timing(step: Step, device: Any, batch: int, length: int, vocab: int) -> dict[str, Any]:
    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate
    from vllm.v1.sample.ops.penalties import apply_all_penalties

    from deploykit.fixes._penalties_processor import DevicePenaltiesProcessor, remove_stand_aside

    rng = random.Random(batch + length)
    prompts = [[rng.randrange(vocab) for _ in range(128)] for _ in range(batch)]
    outputs = [[rng.randrange(vocab) for _ in range(length)] for _ in range(batch)]
    ours_outputs = [list(o) for o in outputs]
    params = SamplingParams(repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=0.3)
    logits = torch.randn(batch, vocab, device=device)
    scratch = torch.empty_like(logits)
    prompt_t = torch.tensor(prompts, dtype=torch.int64, device=device)
    pres, freq, rep = (torch.full((batch,), v, device=device) for v in (0.3, 0.5, 1.2))
    proc = DevicePenaltiesProcessor(fake_config(batch, vocab, 128 + length + 256), device, True)
    remove_stand_aside()
    added = [(i, params, prompts[i], ours_outputs[i]) for i in range(batch)]
    proc.update_state(BatchUpdate(batch_size=batch, removed=[], added=added, moved=[]))

    def ours() -> None:
        for ids in ours_outputs:
            ids.append(rng.randrange(vocab))
        proc.apply(logits)

    def vllm_v1() -> None:
        for ids in outputs:
            ids.append(rng.randrange(vocab))
        apply_all_penalties(logits, prompt_t, pres, freq, rep, outputs)

    sync = torch.cuda.synchronize
    row: dict[str, Any] = {"batch": batch, "output_len": length, "vocab": vocab}
    row["copy_ms"] = cuda_ms(lambda: scratch.copy_(logits), 50)
    row["ours_ms"] = wall_ms(ours, 50, sync)
    row["ours_gpu_ms"] = cuda_ms(ours, 50)
    row["vllm_v1_ms"] = wall_ms(vllm_v1, 5, sync)
    row["ours_over_copy"] = row["ours_ms"] / row["copy_ms"]
    row["vllm_v1_over_ours"] = row["vllm_v1_ms"] / row["ours_ms"]
    try:
        from vllm.v1.worker.gpu.sample.penalties import apply_penalties as v2_apply

        counts = torch.zeros(batch, vocab, dtype=torch.int32, device=device)
        counts.index_put_(
            (torch.arange(batch, device=device).repeat_interleave(length),
             torch.tensor(outputs, device=device)[:, :length].reshape(-1)),
            torch.ones(batch * length, dtype=torch.int32, device=device),
            accumulate=True,
        )  # fmt: skip
        mask = torch.zeros(batch, -(-vocab // 32), dtype=torch.int32, device=device)
        idx = torch.arange(batch, dtype=torch.int32, device=device)
        pos = torch.zeros(batch, dtype=torch.int32, device=device)
        token_ids = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        new = torch.zeros(batch, dtype=torch.int64, device=device)
        ones = torch.ones(batch, dtype=torch.int32, device=device)
        rows = torch.arange(batch, device=device)

        def v2() -> None:  # one new token per row into the bin counts (as MRv2 does), then the kernel
            counts.index_put_((rows, new), ones, accumulate=True)
            v2_apply(logits, idx, token_ids, pos, rep, freq, pres, mask, counts)

        row["vllm_v2_kernel_ms"] = cuda_ms(v2, 50)
        row["v2_over_copy"] = row["vllm_v2_kernel_ms"] / row["copy_ms"]
    except Exception as exc:
        row["vllm_v2_error"] = f"{type(exc).__name__}: {exc}"[:300]
    return row


def step_penalties(step: Step, out: Path) -> None:
    device = device_for(step)
    step.data["device"] = str(device)
    if step.dry_run:
        step.part("exactness", lambda: penalties_exactness(step, device, steps=25, vocab=512, max_rows=16))
    else:
        step.part(
            "exactness", lambda: penalties_exactness(step, device, steps=200, vocab=32_000, max_rows=64)
        )
    if device.type != "cuda":
        step.skip("penalties_timings", "per-step timings are taken on the GPU only")
        return
    rows: list[dict[str, Any]] = []
    for batch in (128, 256):
        step.part(
            f"timing_{batch}x2048",
            lambda b=batch: rows.append(penalties_timing(step, device, b, 2048, 128_256)),
        )
    step.data["penalties_timings"] = rows


# --------------------------------------------------------------------------------------------------
# 4. fp32_projection
# --------------------------------------------------------------------------------------------------


def fixture_value(fixture: Any) -> Any:
    """Call a pytest fixture's function directly (the test module's weight and image recipes)."""
    return getattr(fixture, "__wrapped__", fixture)()


def embedder_stats(embedder: Any, patches: Any, positions: Any, device: Any) -> dict[str, Any]:
    import torch

    from tests.fixes.test_fp32_projection import run_stages

    stages = run_stages(embedder, patches.to(device), positions.to(device))
    return {
        name: {
            "dtype": str(t.dtype),
            "inf": int(torch.isinf(t).sum()),
            "nan": int(torch.isnan(t).sum()),
            "elements": t.numel(),
        }
        for name, t in stages.items()
    }


def step_fp32_projection(step: Step, out: Path) -> None:
    import pytest
    import torch

    from deploykit.fixes import fp32_projection
    from tests.fixes import test_fp32_projection as recipe
    from tests.gemma4_models import gemma4_unified_in_one_process

    device = device_for(step)
    step.data["device"] = str(device)
    weights = fixture_value(recipe.checkpoint_weights)
    patches, positions = fixture_value(recipe.image_patches)
    if step.dry_run:  # small: the first 16 patches of the image (the weights keep their real size)
        patches, positions = patches[:, :16], positions[:, :16]
    step.data["patches"] = int(patches.shape[1])
    with gemma4_unified_in_one_process() as module:
        embedder_class = module.Gemma4UnifiedVisionEmbedder
        plain = recipe.build_embedder(module, torch.float16, weights).to(device)
        without = embedder_stats(plain, patches, positions, device)
        step.data["without_fix"] = without
        step.check("without_fix_non_finite", without["output"]["nan"] + without["output"]["inf"] > 0)
        with pytest.MonkeyPatch.context() as undo:
            undo.setattr(embedder_class, "__init__", embedder_class.__init__)
            step.data["applied"] = fp32_projection.apply()
            fixed = recipe.build_embedder(module, torch.float16, weights).to(device)
        with_fix = embedder_stats(fixed, patches, positions, device)
        step.data["with_fix"] = with_fix
        step.check("with_fix_finite", all(s["nan"] == 0 and s["inf"] == 0 for s in with_fix.values()))
        moved = sum(t.numel() for n, t in weights.items() if n.startswith(("patch_dense.", "patch_ln2.")))
        whole = sum(t.numel() for t in weights.values())
        step.data["memory"] = {
            "fp32_layers_extra_mib": moved * 2 / 2**20,
            "embedder_fp16_mib": whole * 2 / 2**20,
            "ratio": (whole * 2 + moved * 2) / (whole * 2),
        }
        if device.type != "cuda":
            step.skip("fp32_projection_timing", "timed on the GPU only")
            return
        step.data["memory"]["cuda_param_bytes"] = {
            name: sum(p.numel() * p.element_size() for p in m.parameters())
            for name, m in (("plain", plain), ("fixed", fixed))
        }
        timings = []
        for images in (1, 4):
            batch = patches.expand(images, -1, -1).contiguous().to(device)
            pos = positions.expand(images, -1, -1).contiguous().to(device)
            with torch.no_grad():
                row = {
                    "images": images,
                    "plain_ms": cuda_ms(lambda b=batch, p=pos: plain(b, p), 20),
                    "fixed_ms": cuda_ms(lambda b=batch, p=pos: fixed(b, p), 20),
                }
            row["ratio"] = row["fixed_ms"] / row["plain_ms"]
            timings.append(row)
        step.data["timings"] = timings


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------------------
# 5. the V2 runner's penalties (vLLM 0.34)
# --------------------------------------------------------------------------------------------------


def step_v2_penalties(step: Step, out: Path) -> None:
    """vLLM 0.34's V2 penalty path in its own process (its sources, carried with --pack-release 0.34.0)."""
    if V2_RELEASE not in carried_releases():
        step.skip("v2_penalties_imports", f"vLLM {V2_RELEASE}'s sources are not carried (--pack-release)")
        return
    command = [sys.executable, str(Path(__file__).resolve()), "--v2-penalties", V2_RELEASE]
    command += ["--out", str(out)]
    if step.dry_run:
        command.append("--dry-run")
    target = out / f"v2-penalties-{V2_RELEASE}.json"
    target.unlink(missing_ok=True)
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=STEP_LIMIT_S["v2_penalties"] - 5, cwd=REPO
        )
        tail = (done.stdout + done.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        tail = "timed out"
    if not target.exists():
        step.errors["v2_penalties"] = tail
        return
    record = json.loads(target.read_text())
    target.unlink()  # its content is in v2_penalties.json: the files that come back stay within 8
    step.data["v2_penalties"] = record
    step.check("v2_penalties_imports", record.get("imports"))
    for name, reason in record.get("skipped", {}).items():
        step.skip(name, reason)
    if record.get("error"):
        step.errors["v2_penalties"] = record["error"]
    table = record.get("table") or []
    if table:
        step.check(
            "v2_table_measured_matches_int32_rows_x_vocab", all(row["matches_formula"] for row in table)
        )


def v2_table_formula_mib(rows: int, vocab: int) -> float:
    """int32[rows, vocab] output bin counts + int32[rows, ceil(vocab / 32)] prompt bitmask (0.34's
    PenaltiesState.__init__), the figure deploykit's v2-penalty-table advisory states."""
    return 4 * rows * (vocab + -(-vocab // 32)) / 2**20


def v2_penalties_main(release: str, out: Path, dry_run: bool) -> int:
    """In its own process: import `release`'s V2 penalty module from its carried sources and, on a GPU,
    measure its table and its per-step cost. Writes out/v2-penalties-<release>.json."""
    import tarfile
    import tempfile

    record: dict[str, Any] = {"release": release, "imports": None, "skipped": {}}
    unpacked: Path | None = None
    try:
        source = carried_releases()[release]
        if source.is_file():
            unpacked = Path(tempfile.mkdtemp(prefix=f"vllm-{release}-"))
            with tarfile.open(source) as archive:
                archive.extractall(unpacked, filter="data")
            source = unpacked
        record["carry"] = carry.setup(simulate_bare=dry_run, carry=source)
        from vllm.v1.worker.gpu.sample import penalties as v2

        record["imports"] = True
        record["carry"].update(carry.report())
        record["environment"] = environment()
        import torch

        if dry_run or not torch.cuda.is_available():
            reason = "the V2 penalty kernel is Triton on CUDA"
            record["skipped"]["v2_table_measured_matches_int32_rows_x_vocab"] = reason
            record["skipped"]["v2_tpot_with_and_without_penalties"] = reason
        else:
            device = torch.device("cuda")
            record["table"] = v2_table_rows(v2, device)
            record["tpot"] = v2_tpot_rows(v2, device)
    except Exception as exc:
        record["error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
    (out / f"v2-penalties-{release}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    if unpacked is not None:
        import shutil

        shutil.rmtree(unpacked, ignore_errors=True)
    return 0


def v2_table_rows(v2: Any, device: Any) -> list[dict[str, Any]]:
    """The table PenaltiesState allocates, measured by the allocator around its construction (its own
    __init__ where it builds here, else the two tensors exactly as that __init__ allocates them)."""
    from types import SimpleNamespace

    import torch

    rows_out = []
    for rows in V2_TABLE_ROWS:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated(device)
        how = "PenaltiesState.__init__"
        try:
            req_states = SimpleNamespace(device=device, max_num_reqs=rows, vocab_size=V2_VOCAB)
            state: Any = v2.PenaltiesState(None, req_states)
        except Exception as exc:  # UVA buffers need vLLM's compiled ops: allocate as its __init__ does
            how = f"the two tensors of PenaltiesState.__init__ ({type(exc).__name__}: {str(exc)[:120]})"
            state = (
                torch.zeros(rows, -(-V2_VOCAB // 32), dtype=torch.int32, device=device),
                torch.zeros(rows, V2_VOCAB, dtype=torch.int32, device=device),
            )
        torch.cuda.synchronize()
        measured = (torch.cuda.memory_allocated(device) - before) / 2**20
        formula = v2_table_formula_mib(rows, V2_VOCAB)
        del state
        rows_out.append({
            "max_num_seqs": rows, "vocab": V2_VOCAB, "measured_mib": round(measured, 2),
            "formula_mib": round(formula, 2), "matches_formula": abs(measured - formula) <= 2.0, "how": how,
        })  # fmt: skip
    return rows_out


def v2_tpot_rows(v2: Any, device: Any) -> list[dict[str, Any]]:
    """Per-token decode time of the part of a V2 step that penalties touch, with and without them, at each
    number of concurrent users: the lm_head GEMM (bf16 [users, 4096] x [4096, 128256]) and the float32
    logits it yields, then 0.34's apply_penalties over the dense table when every user sets penalties.
    The rest of a step (attention, MLP) is the same either way; a served TPOT needs vLLM's compiled
    kernels, which the device does not have (bench/gpu/README.md)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(33)
    weight = torch.randn(V2_VOCAB, V2_HIDDEN, device=device, dtype=torch.bfloat16, generator=gen) * 0.02
    max_reqs = 256
    prompt_mask = torch.zeros(max_reqs, -(-V2_VOCAB // 32), dtype=torch.int32, device=device)
    counts = torch.randint(0, 3, (max_reqs, V2_VOCAB), dtype=torch.int32, device=device, generator=gen)
    rep = torch.full((max_reqs,), 1.2, device=device)
    freq = torch.full((max_reqs,), 0.5, device=device)
    pres = torch.full((max_reqs,), 0.3, device=device)
    table = (prompt_mask, counts, rep, freq, pres)
    return [v2_tpot_row(v2, users, weight, table, gen) for users in V2_USERS]


def v2_tpot_row(v2: Any, users: int, weight: Any, table: tuple[Any, ...], gen: Any) -> dict[str, Any]:
    import torch

    device = weight.device
    prompt_mask, counts, rep, freq, pres = table
    hidden = torch.randn(users, V2_HIDDEN, device=device, dtype=torch.bfloat16, generator=gen)
    idx = torch.arange(users, dtype=torch.int32, device=device)
    tokens = torch.randint(0, V2_VOCAB, (users,), dtype=torch.int64, device=device, generator=gen)
    local_pos = torch.zeros(users, dtype=torch.int32, device=device)

    def plain() -> Any:
        return (hidden @ weight.T).float()

    def penalised() -> Any:
        logits = (hidden @ weight.T).float()
        v2.apply_penalties(logits, idx, tokens, local_pos, rep, freq, pres, prompt_mask, counts)
        return logits

    without = cuda_ms(plain, repeats=50)
    with_penalties = cuda_ms(penalised, repeats=50)
    return {
        "users": users,
        "without_ms": round(without, 4),
        "with_ms": round(with_penalties, 4),
        "penalty_ms": round(with_penalties - without, 4),
        "with_over_without": round(with_penalties / without, 3),
    }


STEP_FUNCTIONS: dict[str, Callable[[Step, Path], None]] = {
    "probe": step_probe,
    "matmul_lora": step_matmul_lora,
    "penalties": step_penalties,
    "fp32_projection": step_fp32_projection,
    "v2_penalties": step_v2_penalties,
}


def run_one_step(name: str, out: Path, dry_run: bool) -> int:
    """In the step's own process: set up the carried vLLM, run the step, write <name>.json."""
    step = Step(name, dry_run)
    if name not in ("probe", "v2_penalties"):  # v2_penalties carries its own release, in a child
        step.data["carry"] = carry.setup(simulate_bare=dry_run)
    step.data["environment"] = environment()
    step.part(name, lambda: STEP_FUNCTIONS[name](step, out))
    if name == "matmul_lora":
        step.part("punica_releases", lambda: step_matmul_lora_releases(step, out))
    if name not in ("probe", "v2_penalties"):
        step.data["carry"].update(carry.report())
    record = step.record()
    (out / f"{name}.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    return 0


def run_isolated(name: str, out: Path, dry_run: bool, limit_s: float) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--step", name, "--out", str(out)]
    if dry_run:
        command.append("--dry-run")
    started = time.monotonic()
    target = out / f"{name}.json"
    target.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit_s, env=env, cwd=REPO)
        tail = (done.stdout + done.stderr)[-3000:]
        failure = None if done.returncode == 0 else f"exit code {done.returncode}"
    except subprocess.TimeoutExpired as exc:
        tail = ((exc.stdout or b"") + (exc.stderr or b""))[-3000:].decode(errors="replace")
        failure = f"timed out after {limit_s:.0f} s"
    if target.exists() and failure is None:
        record = json.loads(target.read_text())
    else:
        record = {
            "schema": SCHEMA,
            "step": name,
            "status": "error",
            "reason": failure or "the step wrote no result",
            "dry_run": dry_run,
            "seconds": round(time.monotonic() - started, 2),
            "checks": {},
            "skipped": {},
            "errors": {name: tail},
            "data": {},
        }
        target.write_text(json.dumps(record, indent=2) + "\n")
    record["log_tail"] = tail[-1500:]
    return record


def markdown(summary: dict[str, Any], records: list[dict[str, Any]]) -> str:
    lines = [
        f"# GPU evidence kit results ({'dry run' if summary['dry_run'] else 'device run'})",
        "",
        f"Environment: {json.dumps(summary['environment'])}",
        "",
        "| step | status | checks passed | checks failed | not run here | seconds | reason |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in records:
        checks = r["checks"]
        passed = sum(1 for v in checks.values() if v is True)
        failed = sum(1 for v in checks.values() if v is False)
        not_run = sum(1 for v in checks.values() if v is None)
        reason = (r.get("reason") or "").replace("|", "/")[:160]
        lines.append(
            f"| {r['step']} | {r['status']} | {passed} | {failed} | {not_run} | {r['seconds']} | {reason} |"
        )
    lines += ["", "## Checks", "", "| step | check | result |", "|---|---|---|"]
    for r in records:
        for check, value in r["checks"].items():
            shown = {True: "pass", False: "FAIL", None: "not run: " + r["skipped"].get(check, "")}[value]
            lines.append(f"| {r['step']} | {check} | {shown} |")
    for r in records:
        data = r.get("data", {})
        if data.get("lora_timings"):
            lines += ["", "## matmul_lora timings (bf16, in = out = 4096)", ""]
            lines += [
                "| rank | adapters | tokens | base ms | ours ms | punica ms |",
                "|---:|---:|---:|---:|---:|---:|",
            ]
            for t in data["lora_timings"]:
                lines.append(
                    f"| {t['rank']} | {t['adapters']} | {t['tokens']} | {t['base_ms']:.3f} "
                    f"| {t['ours_ms']:.3f} | {t.get('punica_ms', float('nan')):.3f} |"
                )
        if data.get("punica_zero_weights"):
            lines += ["", "## punica Triton ops, zero LoRA weights", "", "| case | NaN | Inf | changed |",
                      "|---|---:|---:|---:|"]  # fmt: skip
            for case, v in data["punica_zero_weights"].items():
                lines.append(f"| {case} | {v['nan']} | {v['inf']} | {v['changed']} |")
        for release, rec in (data.get("punica_releases") or {}).items():
            guard = (rec.get("source_facts") or {}).get("lora_expand_sm90_single_stage")
            lines += ["", f"## stock punica of vLLM {release} (sm90 single-stage guard: {guard})", "",
                      "| case | NaN | Inf | rel. error vs float64 |", "|---|---:|---:|---:|"]  # fmt: skip
            for case, v in (rec.get("cases") or {}).items():
                cells = v.get("error") or f"{v['nan']} | {v['inf']} | {v['rel_error']:.3g}"
                lines.append(f"| {case} | {cells} |")
        if data.get("penalties_timings"):
            lines += ["", "## device_penalties per step (V = 128256, L = 2048)", "",
                      "| batch | copy ms | ours ms | vLLM V1 ms | V2 kernel ms | ours / copy |",
                      "|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
            for t in data["penalties_timings"]:
                v2 = t.get("vllm_v2_kernel_ms")
                lines.append(
                    f"| {t['batch']} | {t['copy_ms']:.3f} | {t['ours_ms']:.3f} | {t['vllm_v1_ms']:.2f} "
                    f"| {'n/a' if v2 is None else f'{v2:.3f}'} | {t['ours_over_copy']:.2f} |"
                )
        v2 = data.get("v2_penalties") or {}
        if v2.get("tpot"):
            title = f"## V2 runner penalties, vLLM {v2['release']} (lm_head GEMM + apply_penalties)"
            lines += ["", title, "",
                      "| users | without ms | with ms | penalties ms | with / without |",
                      "|---:|---:|---:|---:|---:|"]  # fmt: skip
            lines += [
                f"| {t['users']} | {t['without_ms']:.3f} | {t['with_ms']:.3f} | {t['penalty_ms']:.3f} "
                f"| {t['with_over_without']:.2f} |"
                for t in v2["tpot"]
            ]
        if v2.get("table"):
            lines += ["", "## V2 penalty table memory (V = 128256)", "",
                      "| max_num_seqs | measured MiB | advisory's formula MiB | how |",
                      "|---:|---:|---:|---|"]  # fmt: skip
            lines += [
                f"| {t['max_num_seqs']} | {t['measured_mib']} | {t['formula_mib']} | {t['how']} |"
                for t in v2["table"]
            ]
        if r["step"] == "probe" and "differences" in data:
            lines += [
                "",
                f"## probe vs {data.get('fixture')}: {len(data['differences'])} field(s) differ",
                "",
            ]
            lines += [
                f"- `{d['field']}`: fixture {d['fixture']!r}, real {d['real']!r}" for d in data["differences"]
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for the JSON results and results.md (required)")
    parser.add_argument("--dry-run", action="store_true", help="CPU only, small sizes; CUDA parts skipped")
    parser.add_argument("--only", action="append", choices=STEPS, help="run only these steps (repeatable)")
    parser.add_argument("--step", choices=STEPS, help=argparse.SUPPRESS)  # one step, in its own process
    parser.add_argument("--punica-release", help=argparse.SUPPRESS)  # one release's punica, its own process
    parser.add_argument(
        "--v2-penalties", help=argparse.SUPPRESS
    )  # one release's V2 penalties, its own process
    parser.add_argument(
        "--pack-release",
        nargs=2,
        metavar=("RELEASE", "SOURCES"),
        help="here: carry RELEASE's sources (SOURCES holds vllm/, e.g. from tools/fetch-vllm-sources.sh)",
    )
    args = parser.parse_args(argv)
    if args.pack_release:
        print(pack_release(args.pack_release[0], Path(args.pack_release[1])))
        return 0
    if args.out is None:
        parser.error("the following arguments are required: --out")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.step:
        return run_one_step(args.step, args.out, args.dry_run)
    if args.punica_release:
        return punica_release_main(args.punica_release, args.out, args.dry_run)
    if args.v2_penalties:
        return v2_penalties_main(args.v2_penalties, args.out, args.dry_run)
    limits = DRY_LIMIT_S if args.dry_run else STEP_LIMIT_S
    started = time.monotonic()
    records = []
    for name in args.only or STEPS:
        record = run_isolated(name, args.out, args.dry_run, limits[name])
        records.append(record)
        print(f"{name}: {record['status']} ({record['seconds']} s) {record.get('reason') or ''}", flush=True)
    summary = {
        "schema": SCHEMA,
        "dry_run": args.dry_run,
        "seconds": round(time.monotonic() - started, 2),
        "environment": environment(),
        "carried_vllm_version": (carry.CARRY / "vllm-version.txt").read_text().strip()
        if (carry.CARRY / "vllm-version.txt").exists()
        else None,
        "steps": {
            r["step"]: {
                "status": r["status"],
                "reason": r.get("reason"),
                "seconds": r["seconds"],
                "checks": r["checks"],
            }
            for r in records
        },
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "results.md").write_text(markdown(summary, records))
    print((args.out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
