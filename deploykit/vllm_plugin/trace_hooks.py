"""Forward hooks on every module of the served model, inside vLLM's worker process.

Installed by the plugin's `register()` only when DEPLOYKIT_TRACE names a directory; otherwise this module
is never imported. After the worker loads the model, every module from `named_modules()` gets a pre-hook
(are the inputs finite, their absmax) and a hook (is the output finite, how many values are not, where the
first bad one is, the absmax of its finite part). Forward calls count only inside the runner's
`execute_model` / `sample_tokens` and never inside its dummy runs (`_dummy_run`, `profile_run`, ...):
vLLM's start-up profile run feeds all-zero inputs and must not be blamed. One JSON line per module call,
in execution order (a module's line is written when its forward returns, so children come before their
parent), to `trace-rank{R}-{pid}.jsonl` where R is the tensor parallel rank. The records are the models
of `deploykit.trace_records`, the schema `deploykit.trace.report` reads them with.

Torch and vLLM are imported inside functions: importing this module is cheap.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deploykit.files import make_private_dirs, private_append
from deploykit.plugin_contract import (
    FIXES_ENV,
    TRACE_DEFAULT_MAX_STEPS,
    TRACE_ENV,
    TRACE_MAX_STEPS_ENV,
    trace_file_name,
)
from deploykit.trace_records import HeaderLine, LogitsLine, ModuleLine, StepLine, TraceRecord

MAX_STEPS_ENV = TRACE_MAX_STEPS_ENV
DEFAULT_MAX_STEPS = TRACE_DEFAULT_MAX_STEPS
WORKER_MODULE = "vllm.v1.worker.gpu_worker"
WORKER_CLASS = "Worker"
# The runner methods that carry real requests, and the ones vLLM uses for dummy / profile / warm-up runs
# (vllm/v1/worker/gpu_model_runner.py in 0.32; the CPU runner inherits them).
REAL_METHODS = ("execute_model", "sample_tokens")
DUMMY_METHODS = ("_dummy_run", "profile_run", "_dummy_sampler_run", "_dummy_pooler_run")
REQUIRED_METHODS = ("execute_model", "_dummy_run")
PATCH_MARKER = "__deploykit_trace__"
ROOT_NAME = "(model)"

logger = logging.getLogger("vllm.deploykit.trace")


class TraceError(RuntimeError):
    """Tracing was asked for but cannot be installed; the message names the vLLM version."""


def _vllm_version() -> str:
    from deploykit.installed import installed_vllm_version

    return installed_vllm_version() or "unknown"


def trace_dir() -> Path | None:
    value = os.environ.get(TRACE_ENV, "").strip()
    return Path(value) if value else None


def install() -> str:
    """Patch the worker's `load_model` so the model is hooked right after it is loaded; returns the target."""
    import importlib

    version = _vllm_version()
    try:
        module = importlib.import_module(WORKER_MODULE)
    except ImportError as exc:
        raise TraceError(f"deploykit trace (vLLM {version}): cannot import {WORKER_MODULE}: {exc}") from exc
    worker_class = getattr(module, WORKER_CLASS, None)
    original = getattr(worker_class, "load_model", None)
    if worker_class is None or original is None:
        raise TraceError(
            f"deploykit trace (vLLM {version}): {WORKER_MODULE}.{WORKER_CLASS}.load_model is missing; "
            "this vLLM loads models differently than the 0.32 worker the trace was written against"
        )
    target = f"{WORKER_MODULE}.{WORKER_CLASS}.load_model"
    if getattr(original, PATCH_MARKER, False):
        return target

    @functools.wraps(original)
    def load_model_then_hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        hook_runner(self.model_runner, trace_dir() or Path("."))
        return result

    setattr(load_model_then_hook, PATCH_MARKER, True)
    worker_class.load_model = load_model_then_hook
    return target


# --- tensor statistics ------------------------------------------------------------------------------


def floating_tensors(value: Any, depth: int = 0) -> list[Any]:
    """The floating-point tensors in a value: itself, or inside tuples, lists and dicts (two levels)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() and value.numel() > 0 else []
    if depth >= 2:
        return []
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in floating_tensors(item, depth + 1)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in floating_tensors(item, depth + 1)]
    return []


def input_stats(tensors: list[Any]) -> tuple[bool, float | None]:
    """(all finite, absmax of the finite values) over the tensors."""
    import torch

    finite = True
    absmax: float | None = None
    for tensor in tensors:
        data = tensor.detach()
        ok = torch.isfinite(data)
        if not bool(ok.all()):
            finite = False
        peak = float(torch.where(ok, data.abs(), torch.zeros((), dtype=data.dtype)).max())
        absmax = peak if absmax is None else max(absmax, peak)
    return finite, absmax


def output_stats(tensors: list[Any]) -> dict[str, Any]:
    """Finite or not, how many values are not (NaN, Inf), the first bad index, absmax of the finite part."""
    import torch

    stats: dict[str, Any] = {
        "output_finite": True,
        "nonfinite": 0,
        "nan": 0,
        "inf": 0,
        "numel": 0,
        "first_bad": None,
        "output_absmax": None,
        "dtype": str(tensors[0].dtype).removeprefix("torch.") if tensors else None,
        "shape": list(tensors[0].shape) if tensors else [],
    }
    for index, tensor in enumerate(tensors):
        data = tensor.detach()
        ok = torch.isfinite(data)
        stats["numel"] += data.numel()
        peak = float(torch.where(ok, data.abs(), torch.zeros((), dtype=data.dtype)).max())
        stats["output_absmax"] = peak if stats["output_absmax"] is None else max(stats["output_absmax"], peak)
        if bool(ok.all()):
            continue
        bad = int((~ok).sum())
        stats["nonfinite"] += bad
        stats["nan"] += int(torch.isnan(data).sum())
        stats["inf"] += int(torch.isinf(data).sum())
        if stats["output_finite"]:
            stats["output_finite"] = False
            stats["first_bad"] = [int(i) for i in (~ok).nonzero()[0].tolist()]
            stats["dtype"] = str(data.dtype).removeprefix("torch.")
            stats["shape"] = list(data.shape)
            stats["output_index"] = index
    return stats


def logits_stats(logits: Any) -> dict[str, Any] | None:
    import torch

    tensors = floating_tensors(logits)
    if not tensors:
        return None
    data = tensors[0].detach().float()
    if data.dim() == 1:
        data = data.unsqueeze(0)
    ok = torch.isfinite(data)
    finite_values = data[ok]
    zeros = torch.zeros((), dtype=data.dtype)
    row_max = torch.where(ok, data, zeros - float("inf")).amax(dim=-1)
    row_min = torch.where(ok, data, zeros + float("inf")).amin(dim=-1)
    constant = int(((row_max == row_min) & ok.all(dim=-1)).sum())
    have = finite_values.numel() > 0
    return {
        "rows": int(data.shape[0]),
        "vocab": int(data.shape[-1]),
        "nonfinite": int((~ok).sum()),
        "min": float(finite_values.min()) if have else None,
        "max": float(finite_values.max()) if have else None,
        "mean": float(finite_values.mean()) if have else None,
        "std": float(finite_values.std()) if finite_values.numel() > 1 else None,
        "constant_rows": constant,
        "argmax": [int(i) for i in torch.nan_to_num(data, nan=-float("inf")).argmax(dim=-1)[:8].tolist()],
    }


# --- the state of one worker ------------------------------------------------------------------------


class TraceState:
    """When to record, what was recorded, and where it goes."""

    def __init__(self, path: Path, rank: int, max_steps: int) -> None:
        self.path = path
        self.rank = rank
        self.max_steps = max_steps
        self.real_depth = 0
        self.dummy_depth = 0
        self.step = -1
        self.order = 0
        self.lines: list[str] = []
        self.pending: dict[int, list[tuple[bool, float | None]]] = {}

    @property
    def recording(self) -> bool:
        return self.real_depth > 0 and self.dummy_depth == 0 and 0 <= self.step < self.max_steps

    def emit(self, record: TraceRecord) -> None:
        """Buffer one record, stamped with this worker's rank; written at the end of the step."""
        record.rank = self.rank
        self.lines.append(record.to_json_line())

    def flush(self) -> None:
        if not self.lines:
            return
        with private_append(self.path) as handle:  # 0600, never through a link
            handle.write(("\n".join(self.lines) + "\n").encode("utf-8"))
        self.lines.clear()


def _tensor_parallel(default_rank: int) -> tuple[int, int]:
    try:
        from vllm.distributed import parallel_state

        group = parallel_state.get_tp_group()
        return int(group.rank_in_group), int(group.world_size)
    except Exception:  # not initialised (tests without vLLM's distributed state)
        return default_rank, 1


def _step_requests(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[str], int]:
    scheduler_output = args[0] if args else kwargs.get("scheduler_output")
    scheduled = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
    return [str(r) for r in scheduled], int(sum(int(n) for n in scheduled.values()))


def _wrap_runner_method(
    runner: Any, name: str, on_enter: Callable[..., None], on_exit: Callable[[], None]
) -> None:
    original = getattr(runner, name)

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        on_enter(*args, **kwargs)
        try:
            return original(*args, **kwargs)
        finally:
            on_exit()

    setattr(runner, name, wrapped)


def hook_runner(runner: Any, directory: Path, *, rank: int | None = None) -> TraceState:
    """Hook every module of the runner's model and mark its real and dummy runs; returns the state."""
    import torch

    version = _vllm_version()
    missing = [name for name in REQUIRED_METHODS if not callable(getattr(runner, name, None))]
    if missing:
        raise TraceError(
            f"deploykit trace (vLLM {version}): the model runner {type(runner).__name__} has no "
            f"{', '.join(missing)}; cannot tell real requests from dummy runs"
        )
    model = runner.get_model() if callable(getattr(runner, "get_model", None)) else runner.model
    if not isinstance(model, torch.nn.Module):
        raise TraceError(
            f"deploykit trace (vLLM {version}): the runner's model is a {type(model).__name__}, "
            "not a torch.nn.Module (compiled or wrapped?); trace needs --enforce-eager"
        )
    tp_rank, tp_size = _tensor_parallel(0 if rank is None else rank)
    make_private_dirs(directory)
    max_steps = int(os.environ.get(MAX_STEPS_ENV, DEFAULT_MAX_STEPS))
    state = TraceState(directory / trace_file_name(tp_rank, os.getpid()), tp_rank, max_steps)

    def enter_real(*args: Any, **kwargs: Any) -> None:
        if state.real_depth == 0 and state.dummy_depth == 0:
            requests, tokens = _step_requests(args, kwargs)
            if requests:
                state.step += 1
                state.order = 0
                state.pending.clear()
                if 0 <= state.step < state.max_steps:
                    state.emit(StepLine(step=state.step, requests=requests, num_tokens=tokens))
        state.real_depth += 1

    def exit_real() -> None:
        state.real_depth -= 1
        if state.real_depth == 0:
            state.flush()

    def enter_dummy(*_args: Any, **_kwargs: Any) -> None:
        state.dummy_depth += 1

    def exit_dummy() -> None:
        state.dummy_depth -= 1

    for name in REAL_METHODS:
        if callable(getattr(runner, name, None)):
            _wrap_runner_method(runner, name, enter_real, exit_real)
    for name in DUMMY_METHODS:
        if callable(getattr(runner, name, None)):
            _wrap_runner_method(runner, name, enter_dummy, exit_dummy)

    hooked = 0
    for module_name, module in model.named_modules():
        _hook_module(module, module_name or ROOT_NAME, state)
        hooked += 1
    _wrap_compute_logits(model, state)

    architectures = getattr(
        getattr(getattr(runner, "model_config", None), "hf_config", None), "architectures", None
    )
    first_param = next(model.parameters(), None)
    state.emit(
        HeaderLine(
            pid=os.getpid(),
            vllm=version,
            model_class=type(model).__name__,
            architectures=list(architectures or []),
            modules_hooked=hooked,
            dtype=str(first_param.dtype).removeprefix("torch.") if first_param is not None else None,
            fixes=[f.strip() for f in os.environ.get(FIXES_ENV, "").split(",") if f.strip()],
            tp_size=tp_size,
        )
    )
    state.flush()
    logger.info(
        "deploykit trace: hooked %d modules of %s (vLLM %s), writing %s",
        hooked,
        type(model).__name__,
        version,
        state.path,
    )
    return state


def _hook_module(module: Any, name: str, state: TraceState) -> None:
    class_name = type(module).__name__
    key = id(module)

    def before(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not state.recording:
            return
        tensors = floating_tensors(args) + floating_tensors(kwargs)
        state.pending.setdefault(key, []).append(input_stats(tensors))

    def after(_module: Any, _args: tuple[Any, ...], _kwargs: dict[str, Any], output: Any) -> None:
        if not state.recording:
            return
        stack = state.pending.get(key)
        inputs_finite, input_absmax = stack.pop() if stack else (True, None)
        record = ModuleLine(
            step=state.step,
            order=state.order,
            module=name,
            class_name=class_name,
            inputs_finite=inputs_finite,
            input_absmax=input_absmax,
            **output_stats(floating_tensors(output)),
        )
        state.order += 1
        state.emit(record)

    module.register_forward_pre_hook(before, with_kwargs=True)
    module.register_forward_hook(after, with_kwargs=True)


def _wrap_compute_logits(model: Any, state: TraceState) -> None:
    original = getattr(model, "compute_logits", None)
    if not callable(original):
        return

    @functools.wraps(original)
    def compute_logits(*args: Any, **kwargs: Any) -> Any:
        logits = original(*args, **kwargs)
        if state.recording:
            stats = logits_stats(logits)
            if stats is not None:
                state.emit(LogitsLine(step=state.step, **stats))
        return logits

    model.compute_logits = compute_logits
