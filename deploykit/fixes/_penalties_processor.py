"""The device penalties processor and the patch that makes vLLM's host penalty path stand aside.

Imported only on demand through `deploykit.fixes.penalties`, because it imports torch and vLLM.

State per row is a small table of the row's distinct tokens, kept on the logits' device:
    ids[row, slot]        int32  the token id held by the slot
    counts[row, slot]     int32  how often it occurs in the output (frequency / presence penalties)
    in_prompt[row, slot]  bool   whether it occurs in the prompt (repetition penalty only)
    size[row]             int64  live slots; slots >= size are ignored
All tables share one width W that follows the largest row's upper bound on distinct tokens (prompt
distinct + output tokens so far), grows by 1.5x and is capped at min(vocab, max_model_len): a row can
never hold more distinct tokens than that, so the cap is never exceeded in vLLM. State memory is
max_num_seqs x W x 9 bytes instead of a dense [rows, vocab] table; it returns to the initial width
whenever no request with penalties is left in the batch.

Per step the host walks the penalised rows once and hands over only the newest output token(s) of each
row; the "is it already in the row's table" lookup, the insert and the penalty itself run on the device
over [rows, W], never over [rows, vocab], and nothing waits for the device.
"""

from __future__ import annotations

import inspect
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from deploykit.fixes.base import FixError, TargetCheck, TargetStatus

logger = logging.getLogger("vllm.deploykit.penalties")

FIX_NAME = "device_penalties"
INITIAL_WIDTH = 256
WIDTH_ROUND = 256
WIDTH_GROWTH = 1.5
# A row that gains more tokens than this in one step (a resumed request, a long catch-up) is rebuilt
# from its lists on the host instead of being inserted token by token.
MAX_INSERT_WAVES = 4
PLACEHOLDER = -1
BYTES_PER_SLOT = 4 + 4 + 1  # ids int32 + counts int32 + in_prompt bool


def _vllm_version() -> str:
    from deploykit.installed import installed_vllm_version

    return installed_vllm_version() or "unknown"


# --------------------------------------------------------------------------------------------------
# Target checks and the stand-aside patch


@dataclass
class _StandAside:
    installed: bool = False
    original: Any = None


_STAND_ASIDE = _StandAside()


def check_target() -> TargetCheck:
    """Does the installed vLLM have the V1 pieces we patch, in the shape we expect?"""
    target = "vllm.v1.worker.gpu_input_batch.InputBatch.no_penalties"
    try:
        from vllm.v1.sample import sampler as sampler_module
        from vllm.v1.sample.metadata import SamplingMetadata
        from vllm.v1.sample.ops import penalties as penalties_ops
        from vllm.v1.worker import gpu_input_batch
    except ImportError as exc:
        return TargetCheck(status=TargetStatus.TARGET_MISSING, target=target, detail=f"import failed: {exc}")

    problems: list[str] = []
    input_batch = getattr(gpu_input_batch, "InputBatch", None)
    if input_batch is None:
        problems.append("InputBatch class is gone")
    else:
        prop = input_batch.__dict__.get("no_penalties")
        if not isinstance(prop, property) and not _STAND_ASIDE.installed:
            problems.append("InputBatch.no_penalties is not a property")
        init_params = inspect.signature(input_batch.__init__).parameters
        for name in ("logitsprocs", "logitsprocs_need_output_token_ids"):
            if name not in init_params:
                problems.append(f"InputBatch.__init__ has no {name!r} parameter")
    if "no_penalties" not in getattr(SamplingMetadata, "__dataclass_fields__", {}):
        problems.append("SamplingMetadata has no no_penalties field")
    sampler_cls = getattr(sampler_module, "Sampler", None)
    apply_penalties = getattr(sampler_cls, "apply_penalties", None)
    if apply_penalties is None or "no_penalties" not in inspect.getsource(apply_penalties):
        problems.append("Sampler.apply_penalties no longer consults sampling_metadata.no_penalties")
    processor_init = inspect.signature(LogitsProcessor.__init__).parameters
    if list(processor_init)[:4] != ["self", "vllm_config", "device", "is_pin_memory"]:
        problems.append(f"LogitsProcessor.__init__ takes {list(processor_init)}")
    for method in ("apply", "update_state", "is_argmax_invariant"):
        if method not in getattr(LogitsProcessor, "__abstractmethods__", ()):
            problems.append(f"LogitsProcessor.{method} is not part of the interface")
    batch_fields = set(getattr(BatchUpdate, "__dataclass_fields__", {}))
    if not {"batch_size", "removed", "added", "moved"} <= batch_fields:
        problems.append(f"BatchUpdate fields are {sorted(batch_fields)}")
    if not {"SWAP", "UNIDIRECTIONAL"} <= set(MoveDirectionality.__members__):
        problems.append("MoveDirectionality lost SWAP/UNIDIRECTIONAL")
    host_path = getattr(penalties_ops, "apply_all_penalties", None)
    if host_path is None:
        problems.append("vllm.v1.sample.ops.penalties.apply_all_penalties is gone")
    if problems:
        return TargetCheck(status=TargetStatus.TARGET_MISSING, target=target, detail="; ".join(problems))

    assert host_path is not None
    output_param = inspect.signature(host_path).parameters.get("output_token_ids")
    if output_param is None or "list" not in str(output_param.annotation):
        return TargetCheck(
            status=TargetStatus.FIXED_UPSTREAM,
            target=target,
            detail="apply_all_penalties no longer takes per-request Python lists of output ids "
            f"(output_token_ids: {None if output_param is None else output_param.annotation})",
        )
    return TargetCheck(
        status=TargetStatus.APPLICABLE,
        target=target,
        detail="V1 sampler pads Python output-id lists into a new tensor every step (apply_all_penalties)",
    )


def _batch_uses_device_penalties(batch: Any) -> bool:
    procs = getattr(batch, "logitsprocs", None)
    return any(
        isinstance(proc, DevicePenaltiesProcessor) and proc.engaged
        for proc in getattr(procs, "non_argmax_invariant", ())
    )


def install_stand_aside() -> str:
    """Make InputBatch report "no penalties" to vLLM's sampler when our processor serves the batch.

    vLLM then skips apply_all_penalties, the per-step list padding and the prompt tensor it builds
    for it. A batch without our processor (the fix on, but no --logits-processors) keeps the host path,
    so penalties are applied exactly once either way.
    """
    from vllm.v1.worker.gpu_input_batch import InputBatch

    if _STAND_ASIDE.installed:
        return "vllm.v1.worker.gpu_input_batch.InputBatch.no_penalties"
    original = InputBatch.__dict__["no_penalties"]

    def no_penalties(self: Any) -> bool:
        if _batch_uses_device_penalties(self):
            return True
        return bool(original.fget(self))

    patched = property(no_penalties, doc="deploykit device_penalties: the host penalty path stands aside")
    setattr(InputBatch, "no_penalties", patched)  # noqa: B010 (mypy: a property replaced on the class)
    _STAND_ASIDE.installed = True
    _STAND_ASIDE.original = original
    return "vllm.v1.worker.gpu_input_batch.InputBatch.no_penalties"


def remove_stand_aside() -> None:
    """Undo install_stand_aside (tests use it to compare with and without the patch in one process)."""
    from vllm.v1.worker.gpu_input_batch import InputBatch

    if _STAND_ASIDE.installed:
        setattr(InputBatch, "no_penalties", _STAND_ASIDE.original)  # noqa: B010
        _STAND_ASIDE.installed = False
        _STAND_ASIDE.original = None


def engage_or_pass_through() -> bool:
    """Called by each processor: True when it must apply penalties (host path made to stand aside)."""
    check = check_target()
    if check.status is TargetStatus.FIXED_UPSTREAM:
        logger.info(
            "deploykit %s: vLLM %s already fixed upstream (%s); the processor passes logits through",
            FIX_NAME,
            _vllm_version(),
            check.detail,
        )
        return False
    if check.status is not TargetStatus.APPLICABLE:
        raise FixError(f"{FIX_NAME}: cannot apply to vLLM {_vllm_version()}: {check.detail}")
    install_stand_aside()
    return True


# --------------------------------------------------------------------------------------------------
# Host-to-device staging


class _PinnedRing:
    """A few reusable host buffers for host-to-device copies: no allocation per step, and a buffer is
    rewritten only after the copy issued from it several uploads ago finished (its event), so filling
    it never races the DMA and, in steady state, never waits."""

    def __init__(self, device: torch.device, dtype: torch.dtype, capacity: int, pin: bool, slots: int = 4):
        self.device = device
        self.dtype = dtype
        self.pin = pin
        self.use_events = device.type == "cuda"
        self.buffers = [self._allocate(capacity) for _ in range(slots)]
        self.events: list[Any] = [None] * slots
        self.current = 0

    def _allocate(self, capacity: int) -> torch.Tensor:
        return torch.empty(max(1, capacity), dtype=self.dtype, pin_memory=self.pin)

    def upload(self, data: np.ndarray, dest: torch.Tensor) -> torch.Tensor:
        """Copy `data` (1-D) into dest[:n] on the device; returns that view."""
        n = int(data.shape[0])
        self.current = (self.current + 1) % len(self.buffers)
        slot = self.current
        event = self.events[slot]
        if event is not None:
            event.synchronize()
        if self.buffers[slot].shape[0] < n:  # only on an unusually large batch change
            self.buffers[slot] = self._allocate(int(n * 1.5))
        host = self.buffers[slot][:n]
        host.numpy()[:] = data
        view = dest[:n]
        view.copy_(host, non_blocking=self.use_events)
        if self.use_events:
            if event is None:
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                self.events[slot] = event
            event.record()
        return view


# --------------------------------------------------------------------------------------------------
# The processor


@dataclass
class _Row:
    """Host bookkeeping of one penalised row: O(1) per step, never the whole list."""

    repetition: float
    frequency: float
    presence: float
    prompt: list[int] | None
    outputs: list[int]  # vLLM's running list for the request (a reference, it grows in place)
    seen: int = 0  # positions of `outputs` already handed to the device
    pending: list[int] = field(default_factory=list)  # seen positions that still held a -1 placeholder
    bound: int = 0  # upper bound on the row's distinct tokens


def _uses_penalties(params: Any) -> bool:
    return bool(
        params is not None
        and (
            params.repetition_penalty != 1.0
            or params.frequency_penalty != 0.0
            or params.presence_penalty != 0.0
        )
    )


class DevicePenaltiesProcessor(LogitsProcessor):
    """repetition / frequency / presence penalties from on-device per-row tables of distinct tokens.

    Same semantics as vLLM's apply_penalties: repetition over prompt ∪ output (positive logits divided,
    negative multiplied), frequency x count and presence x (count > 0) over the output.
    """

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.device = torch.device(device)
        self.max_rows = int(vllm_config.scheduler_config.max_num_seqs)
        model_config = vllm_config.model_config
        self.vocab_size = int(model_config.get_vocab_size())
        self.max_width = max(1, min(self.vocab_size, int(model_config.max_model_len)))
        self.engaged = engage_or_pass_through()
        pin = bool(is_pin_memory) and self.device.type == "cuda"
        self.rows: dict[int, _Row] = {}
        self._width = 0
        self._ids = self._counts = self._in_prompt = torch.empty(0)
        self._allocate_tables(min(INITIAL_WIDTH, self.max_width))
        self._size = torch.zeros(self.max_rows, dtype=torch.int64, device=self.device)
        # Compact per-step inputs, refreshed only when the batch changes.
        self._active_rows = torch.zeros(self.max_rows, dtype=torch.int64, device=self.device)
        self._active_params = torch.zeros(3 * self.max_rows, dtype=torch.float32, device=self.device)
        self._active_inverse = torch.ones(self.max_rows, dtype=torch.float32, device=self.device)
        self._active_offsets = torch.zeros(self.max_rows, dtype=torch.int64, device=self.device)
        self._num_active = 0
        self._active_prefix = False  # penalised rows are exactly 0..n-1: slice the tables, no gather
        self._ordered: list[int] = []
        self._offsets_vocab = -1
        self._active_dirty = False
        self._new_tokens = torch.zeros(
            2 * self.max_rows * MAX_INSERT_WAVES, dtype=torch.int64, device=self.device
        )
        self._load = torch.zeros(3 * INITIAL_WIDTH, dtype=torch.int64, device=self.device)
        self._int_ring = _PinnedRing(self.device, torch.int64, 2 * self.max_rows * MAX_INSERT_WAVES, pin)
        self._float_ring = _PinnedRing(self.device, torch.float32, 3 * self.max_rows, pin)
        self._load_ring = _PinnedRing(self.device, torch.int64, 3 * INITIAL_WIDTH, pin, slots=2)
        if self.engaged:
            logger.info(
                "deploykit %s: DevicePenaltiesProcessor engaged on %s (%d rows, table width %d..%d slots)",
                FIX_NAME,
                self.device,
                self.max_rows,
                self._width,
                self.max_width,
            )

    # -- interface -----------------------------------------------------------------------------------

    def is_argmax_invariant(self) -> bool:
        """Penalties can change which token is the largest."""
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if not batch_update or not self.engaged:
            return
        for index in batch_update.removed:
            if self.rows.pop(index, None) is not None:
                self._active_dirty = True
        loads: list[int] = []
        for index, params, prompt, outputs in batch_update.added:
            if _uses_penalties(params):
                self.rows[index] = _Row(
                    repetition=float(params.repetition_penalty),
                    frequency=float(params.frequency_penalty),
                    presence=float(params.presence_penalty),
                    prompt=prompt,
                    outputs=outputs,
                )
                loads.append(index)
                self._active_dirty = True
            elif self.rows.pop(index, None) is not None:
                self._active_dirty = True
        # Load the added rows before any move, which may carry them to another index.
        if loads:
            self._load_rows(loads)
        for a, b, direction in batch_update.moved:
            self._move(a, b, swap=direction == MoveDirectionality.SWAP)
        if not self.rows and self._width > INITIAL_WIDTH:
            self._allocate_tables(min(INITIAL_WIDTH, self.max_width))  # give the memory back

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows or not self.engaged:
            return logits
        if self._active_dirty:
            self._refresh_active()
        self._take_new_tokens()
        self._penalise(logits)
        return logits

    # -- state size ----------------------------------------------------------------------------------

    @property
    def width(self) -> int:
        return self._width

    def state_bytes(self) -> int:
        """Device bytes of the per-row tables (all max_num_seqs rows at the current width)."""
        return self.max_rows * (self._width * BYTES_PER_SLOT + 8)

    # -- tables --------------------------------------------------------------------------------------

    def _allocate_tables(self, width: int) -> None:
        # One extra column is a sink for an insert that would not fit; it is never live.
        shape = (self.max_rows, width + 1)
        ids = torch.zeros(shape, dtype=torch.int32, device=self.device)
        counts = torch.zeros(shape, dtype=torch.int32, device=self.device)
        in_prompt = torch.zeros(shape, dtype=torch.bool, device=self.device)
        if self._width and width > self._width:
            keep = self._width
            ids[:, :keep] = self._ids[:, :keep]
            counts[:, :keep] = self._counts[:, :keep]
            in_prompt[:, :keep] = self._in_prompt[:, :keep]
        self._ids, self._counts, self._in_prompt = ids, counts, in_prompt
        self._slots = torch.arange(width + 1, dtype=torch.int64, device=self.device)
        self._width = width

    def _ensure_width(self, needed: int) -> None:
        needed = min(needed, self.max_width)
        if needed <= self._width:
            return
        grown = max(needed, int(self._width * WIDTH_GROWTH))
        grown = -(-grown // WIDTH_ROUND) * WIDTH_ROUND
        self._allocate_tables(min(grown, self.max_width))

    def _move(self, a: int, b: int, *, swap: bool) -> None:
        row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
        if row_a is not None:
            self.rows[b] = row_a
        if swap and row_b is not None:
            self.rows[a] = row_b
        if row_a is None and (row_b is None or not swap):
            self._active_dirty = True
            return
        tables = (self._ids, self._counts, self._in_prompt, self._size)
        if swap and row_a is not None and row_b is not None:
            for table in tables:
                held = table[a].clone()
                table[a] = table[b]
                table[b] = held
        elif row_a is not None:
            for table in tables:
                table[b] = table[a]
        else:  # swap where only b is penalised
            for table in tables:
                table[a] = table[b]
        self._active_dirty = True

    def _load_rows(self, indices: list[int]) -> None:
        """(Re)build rows from their prompt and output lists on the host: once per added request."""
        slices: list[tuple[int, int, int]] = []
        chunks: list[np.ndarray] = []
        offset = 0
        widest = 0
        for index in indices:
            row = self.rows[index]
            prompt_tokens = dict.fromkeys(t for t in (row.prompt or ()) if 0 <= t < self.vocab_size)
            outputs = row.outputs
            row.seen = len(outputs)
            row.pending = [pos for pos, tok in enumerate(outputs) if tok == PLACEHOLDER]
            output_counts = Counter(t for t in outputs if 0 <= t < self.vocab_size)
            distinct = list(prompt_tokens) + [t for t in output_counts if t not in prompt_tokens]
            m = len(distinct)
            row.bound = m
            widest = max(widest, m)
            block = np.empty((3, m), dtype=np.int64)
            block[0] = distinct
            block[1] = [output_counts.get(t, 0) for t in distinct]
            block[2] = [t in prompt_tokens for t in distinct]
            chunks.append(block.reshape(-1))
            slices.append((index, offset, m))
            offset += 3 * m
        self._ensure_width(widest)
        if offset > self._load.shape[0]:
            self._load = torch.zeros(int(offset * 1.5), dtype=torch.int64, device=self.device)
        staged = self._load_ring.upload(np.concatenate(chunks), self._load) if offset else self._load[:0]
        for index, start, m in slices:
            loaded = staged[start : start + 3 * m].view(3, m)
            self._ids[index, :m] = loaded[0]
            self._counts[index, :m] = loaded[1]
            self._in_prompt[index, :m] = loaded[2].bool()
            self._counts[index, m:] = 0
            self._in_prompt[index, m:] = False
            self._size[index] = m

    def _refresh_active(self) -> None:
        indices = sorted(self.rows)
        self._ordered = indices
        n = len(indices)
        self._num_active = n
        self._active_prefix = indices == list(range(n))
        self._int_ring.upload(np.asarray(indices, dtype=np.int64), self._active_rows)
        params = np.empty((3, n), dtype=np.float32)
        for column, index in enumerate(indices):
            row = self.rows[index]
            params[:, column] = (row.repetition, row.frequency, row.presence)
        self._float_ring.upload(params.reshape(-1), self._active_params)
        # The reciprocal exactly as vLLM's torch path computes it: float32 1.0 / penalty, on the device.
        torch.reciprocal(self._active_params[:n], out=self._active_inverse[:n])
        self._offsets_vocab = -1
        self._active_dirty = False

    # -- per step ------------------------------------------------------------------------------------

    def _fresh_tokens(self, row: _Row) -> list[int] | None:
        """The row's output tokens not yet on the device; None when the row must be rebuilt."""
        outputs = row.outputs
        n = len(outputs)
        fresh: list[int] = []
        if n < row.seen:
            # vLLM dropped trailing placeholders it could not fill; anything else needs a rebuild.
            if any(pos not in row.pending for pos in range(n, row.seen)):
                return None
            row.pending = [pos for pos in row.pending if pos < n]
            row.seen = n
        if row.pending:
            still: list[int] = []
            for pos in row.pending:
                token = outputs[pos]
                if token == PLACEHOLDER:
                    still.append(pos)
                else:
                    fresh.append(token)
            row.pending = still
        for pos in range(row.seen, n):
            token = outputs[pos]
            if token == PLACEHOLDER:
                row.pending.append(pos)
            else:
                fresh.append(token)
        row.seen = n
        if len(fresh) > MAX_INSERT_WAVES:
            return None
        return fresh

    def _take_new_tokens(self) -> None:
        waves: list[list[tuple[int, int]]] = [[] for _ in range(MAX_INSERT_WAVES)]
        rebuild: list[int] = []
        widest = 0
        for index in self._ordered:  # ascending rows: a full wave is rows 0..n-1, sliced not gathered
            row = self.rows[index]
            fresh = self._fresh_tokens(row)
            if fresh is None:
                rebuild.append(index)
                continue
            for wave, token in enumerate(fresh):
                waves[wave].append((index, token))
            row.bound = min(row.bound + len(fresh), self.max_width)
            widest = max(widest, row.bound)
        if rebuild:
            self._load_rows(rebuild)
        if not waves[0]:
            return
        self._ensure_width(widest)
        flat = [pair for wave in waves for pair in wave]
        pairs = np.asarray(flat, dtype=np.int64).T.reshape(-1)  # row ids, then token ids
        staged = self._int_ring.upload(pairs, self._new_tokens).view(2, len(flat))
        start = 0
        for wave_pairs in waves:
            if not wave_pairs:
                break
            end = start + len(wave_pairs)
            prefix = self._active_prefix and len(wave_pairs) == self._num_active
            self._insert(staged[0, start:end], staged[1, start:end], prefix)
            start = end

    def _insert(self, rows: torch.Tensor, tokens: torch.Tensor, prefix: bool) -> None:
        """Count one token per row (rows distinct): find it in the row's table or append it.

        `prefix`: the rows are exactly 0..n-1, so the tables are sliced instead of gathered."""
        width = self._width
        n = rows.shape[0]
        if prefix:
            size, table = self._size[:n].clone(), self._ids[:n]
        else:
            size, table = self._size.index_select(0, rows), self._ids.index_select(0, rows)
        tokens32 = tokens.to(torch.int32)
        live = self._slots.unsqueeze(0) < size.unsqueeze(1)
        hit = (table == tokens32.unsqueeze(1)) & live
        found = hit.any(dim=1)
        position = torch.where(found, hit.to(torch.int32).argmax(dim=1), size)
        fits = position < width
        position = torch.clamp(position, max=width)  # the sink column when the table is full
        flat = rows * (width + 1) + position
        self._ids.view(-1).index_copy_(0, flat, tokens32)
        self._counts.view(-1).index_add_(0, flat, torch.ones_like(tokens32))
        self._size.index_copy_(0, rows, size + (~found & fits).to(torch.int64))

    def _penalise(self, logits: torch.Tensor) -> None:
        n, width = self._num_active, self._width
        if self._active_prefix:
            ids, counts, size = self._ids[:n, :width], self._counts[:n, :width], self._size[:n]
        else:
            rows = self._active_rows[:n]
            ids = self._ids.index_select(0, rows)[:, :width]
            counts = self._counts.index_select(0, rows)[:, :width]
            size = self._size.index_select(0, rows)
        params = self._active_params[: 3 * n].view(3, n)
        repetition, frequency, presence = (params[i].unsqueeze(1) for i in range(3))
        live = self._slots[:width].unsqueeze(0) < size.unsqueeze(1)
        # Dead slots read and later write slot 0's logit with slot 0's value: duplicates agree, and their
        # stale counts never matter. (Integer arithmetic: torch.where is several times slower on CPU.)
        first = ids[:, :1].to(torch.int64)
        columns = (ids.to(torch.int64) - first) * live + first
        contiguous = logits.is_contiguous()
        if contiguous:  # flat 1-D gather/scatter: several times cheaper than 2-D indexing
            if self._offsets_vocab != logits.shape[1]:
                torch.mul(self._active_rows[:n], logits.shape[1], out=self._active_offsets[:n])
                self._offsets_vocab = logits.shape[1]
            flat_logits = logits.view(-1)
            flat_index = (columns + self._active_offsets[:n].unsqueeze(1)).view(-1)
            values = flat_logits.index_select(0, flat_index).view(n, width)
        else:
            row_index = self._active_rows[:n].unsqueeze(1).expand(n, width)
            values = logits[row_index, columns]
        # Every live slot holds a token of the prompt or the output, so the repetition penalty applies to
        # all of them; same float32 arithmetic as vLLM: its CUDA kernel divides, its torch fallback
        # multiplies by the reciprocal (vllm/_custom_ops.py apply_repetition_penalties).
        if logits.is_cuda and contiguous:
            values = torch.where(values > 0, values / repetition, values * repetition)
        else:
            values = values * torch.where(values > 0, self._active_inverse[:n].unsqueeze(1), repetition)
        occurred = counts > 0
        values = values - frequency * counts
        values = values - presence * occurred
        values = torch.where(live, values, values[:, :1])
        if contiguous:
            flat_logits.scatter_(0, flat_index, values.view(-1))
        else:
            logits.index_put_((row_index, columns), values)
