"""The device penalties processor (the stand-aside patch: `_penalties_stand_aside`; its host buffers:
`_pinned_ring`).

Imported only on demand through `deploykit.fixes.penalties`, because it imports torch and vLLM.

State per row is a small table of the row's distinct tokens, kept on the logits' device:
    flat_ids[row, slot]  int64    row * vocab + token id: the token's index in the flattened logits
    counts[row, slot]    float32  how often it occurs in the output (exact: at most max_model_len)
    size[row]            int64    live slots; dead slots (>= size, and the sink) repeat slot 0
Flat ids let a step gather and scatter the logits with no index arithmetic, and float32 counts are what
vLLM multiplies its penalties with. All tables share one width W that follows the largest row's upper
bound on distinct tokens (prompt distinct + output tokens so far), grows by 1.5x and is capped at
min(vocab, max_model_len): a row can never hold more distinct tokens than that, so the cap is never
exceeded in vLLM. State memory is max_num_seqs x (12 (W + 1) + 8) bytes instead of a dense
[rows, vocab] table; it returns to the initial width whenever no request with penalties is left.

Per step the host walks the penalised rows once and hands over only the newest output token(s) of each
row; the "is it already in the row's table" lookup, the insert and the penalty itself run on the device
over [rows, W], never over [rows, vocab], and nothing waits for the device.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from deploykit.fixes._penalties_stand_aside import (
    FIX_NAME,
    engage_or_pass_through,
    install_stand_aside,
    remove_stand_aside,
)
from deploykit.fixes._pinned_ring import PinnedRing

logger = logging.getLogger("vllm.deploykit.penalties")

INITIAL_WIDTH = 256
WIDTH_ROUND = 256
WIDTH_GROWTH = 1.5
# A row that gains more tokens than this in one step (a resumed request, a long catch-up) is rebuilt
# from its lists on the host instead of being inserted token by token.
MAX_INSERT_WAVES = 4
PLACEHOLDER = -1
BYTES_PER_SLOT = 8 + 4  # flat_ids int64 + counts float32
BYTES_PER_ROW = 8  # size int64
# On CPU the penalty runs over chunks of rows holding about this many slots: the logits a chunk gathers
# (one 64-byte line each) stay in the L2/L3 cache until the chunk scatters them back.
CPU_CHUNK_SLOTS = 16384

__all__ = ["DevicePenaltiesProcessor", "install_stand_aside", "remove_stand_aside"]


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

    deploykit_stands_in_for_host_penalties = True  # _penalties_stand_aside.STANDS_IN_MARKER

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
        self._flat_ids = self._counts = torch.empty(0)
        self._allocate_tables(min(INITIAL_WIDTH, self.max_width))
        self._size = torch.zeros(self.max_rows, dtype=torch.int64, device=self.device)
        # Compact per-step inputs, refreshed only when the batch changes.
        self._active_rows = torch.zeros(self.max_rows, dtype=torch.int64, device=self.device)
        self._active_factors = torch.ones(5 * self.max_rows, dtype=torch.float32, device=self.device)
        self._num_active = 0
        self._active_prefix = False  # penalised rows are exactly 0..n-1: slice the tables, no gather
        self._ordered: list[int] = []
        self._active_dirty = False
        self._any_repetition = self._any_reversed = self._any_frequency = self._any_presence = False
        self._live_width = 0
        self._new_tokens = torch.zeros(
            2 * self.max_rows * MAX_INSERT_WAVES, dtype=torch.int64, device=self.device
        )
        self._load = torch.zeros(2 * INITIAL_WIDTH, dtype=torch.int64, device=self.device)
        self._int_ring = PinnedRing(self.device, torch.int64, 2 * self.max_rows * MAX_INSERT_WAVES, pin)
        self._float_ring = PinnedRing(self.device, torch.float32, 5 * self.max_rows, pin)
        self._load_ring = PinnedRing(self.device, torch.int64, 2 * INITIAL_WIDTH, pin, slots=2)
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
        if logits.is_contiguous():
            self._penalise(logits, divide=logits.is_cuda)
        else:
            # vLLM itself never hands over strided logits; its repetition rule there is the torch one.
            work = logits.contiguous()
            self._penalise(work, divide=False)
            logits.copy_(work)
        return logits

    # -- state size ----------------------------------------------------------------------------------

    @property
    def width(self) -> int:
        return self._width

    def state_bytes(self) -> int:
        """Device bytes of the per-row state (all max_num_seqs rows at the current width, sink included)."""
        return self.max_rows * ((self._width + 1) * BYTES_PER_SLOT + BYTES_PER_ROW)

    # -- tables --------------------------------------------------------------------------------------

    def _allocate_tables(self, width: int) -> None:
        # One extra column is a sink for an insert that would not fit; it is never live.
        shape = (self.max_rows, width + 1)
        counts = torch.zeros(shape, dtype=torch.float32, device=self.device)
        if self._width and width > self._width:
            keep = self._width
            flat_ids = torch.empty(shape, dtype=torch.int64, device=self.device)
            flat_ids[:, :keep] = self._flat_ids[:, :keep]
            flat_ids[:, keep:] = self._flat_ids[:, :1]  # new slots are dead: they repeat slot 0
            counts[:, :keep] = self._counts[:, :keep]
        else:  # every row empty, its slots at its own row's column 0
            row_starts = torch.arange(self.max_rows, dtype=torch.int64, device=self.device) * self.vocab_size
            flat_ids = row_starts.unsqueeze(1).repeat(1, width + 1)
        self._flat_ids, self._counts = flat_ids, counts
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
        tables = (self._flat_ids, self._counts, self._size)
        # A row's flat ids point into its own logits row: moving the row shifts them by whole rows.
        shift = (b - a) * self.vocab_size
        if swap and row_a is not None and row_b is not None:
            for table in tables:
                held = table[a].clone()
                table[a] = table[b]
                table[b] = held
            self._flat_ids[a] -= shift
            self._flat_ids[b] += shift
        elif row_a is not None:
            for table in tables:
                table[b] = table[a]
            self._flat_ids[b] += shift
        else:  # swap where only b is penalised
            for table in tables:
                table[a] = table[b]
            self._flat_ids[a] -= shift
        self._active_dirty = True

    def _load_rows(self, indices: list[int]) -> None:
        """(Re)build rows from their prompt and output lists on the host: once per added request."""
        slices: list[tuple[int, int, int, int]] = []
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
            row_start = index * self.vocab_size
            block = np.empty((2, m), dtype=np.int64)
            block[0] = distinct
            block[0] += row_start
            block[1] = [output_counts.get(t, 0) for t in distinct]
            chunks.append(block.reshape(-1))
            # Dead slots repeat slot 0 (the row's own column 0 while it is empty): see _penalise.
            slices.append((index, offset, m, row_start + (distinct[0] if m else 0)))
            offset += 2 * m
        self._ensure_width(widest)
        if offset > self._load.shape[0]:
            self._load = torch.zeros(int(offset * 1.5), dtype=torch.int64, device=self.device)
        staged = self._load_ring.upload(np.concatenate(chunks), self._load) if offset else self._load[:0]
        for index, start, m, dead in slices:
            loaded = staged[start : start + 2 * m].view(2, m)
            self._flat_ids[index, :m] = loaded[0]
            self._flat_ids[index, m:] = dead
            counts = self._counts[index]
            counts[:m] = loaded[1]
            counts[m:] = 0
            self._size[index] = m

    def _refresh_active(self) -> None:
        indices = sorted(self.rows)
        self._ordered = indices
        n = len(indices)
        self._num_active = n
        self._active_prefix = indices == list(range(n))
        self._int_ring.upload(np.asarray(indices, dtype=np.int64), self._active_rows)
        rows = [self.rows[index] for index in indices]
        repetition = np.asarray([row.repetition for row in rows], dtype=np.float32)
        frequency = np.asarray([row.frequency for row in rows], dtype=np.float32)
        presence = np.asarray([row.presence for row in rows], dtype=np.float32)
        # With sign s = -1 where the penalty is below 1 (else +1), s * min(s v / r, s v r) is v / r for
        # v > 0 and v r otherwise: vLLM's repetition rule without a comparison or a select per slot.
        sign = np.where(repetition < 1, np.float32(-1), np.float32(1))
        # The reciprocal exactly as vLLM's torch path computes it: float32 1.0 / penalty.
        inverse = np.float32(1) / repetition
        factors = np.concatenate([sign * repetition, sign * inverse, sign, frequency, presence])
        self._float_ring.upload(factors, self._active_factors)
        self._any_repetition = any(row.repetition != 1.0 for row in rows)
        self._any_reversed = any(row.repetition < 1.0 for row in rows)
        self._any_frequency = any(row.frequency != 0.0 for row in rows)
        self._any_presence = any(row.presence != 0.0 for row in rows)
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
        if len(fresh) > MAX_INSERT_WAVES or (fresh and not row.bound):
            return None  # an empty row is rebuilt on its first token, which sets its dead slots' id
        return fresh

    def _take_new_tokens(self) -> None:
        wave_rows: list[list[int]] = [[] for _ in range(MAX_INSERT_WAVES)]
        wave_tokens: list[list[int]] = [[] for _ in range(MAX_INSERT_WAVES)]
        rebuild: list[int] = []
        for index in self._ordered:  # ascending rows: a full wave is rows 0..n-1, sliced not gathered
            row = self.rows[index]
            outputs, seen = row.outputs, row.seen
            if len(outputs) == seen + 1 and not row.pending and row.bound and outputs[seen] != PLACEHOLDER:
                # The usual decode step, kept cheap on the host: exactly one new token.
                row.seen = seen + 1
                row.bound += 1
                wave_rows[0].append(index)
                wave_tokens[0].append(outputs[seen])
                continue
            fresh = self._fresh_tokens(row)
            if fresh is None:
                rebuild.append(index)
                continue
            for wave_number, token in enumerate(fresh):
                wave_rows[wave_number].append(index)
                wave_tokens[wave_number].append(token)
            row.bound += len(fresh)
        if rebuild:
            self._load_rows(rebuild)
        widest = max(self.rows[index].bound for index in self._ordered)
        self._ensure_width(widest)
        self._live_width = min(widest, self._width)
        if not wave_rows[0]:
            return
        rows = [index for members in wave_rows for index in members]
        tokens = [token for members in wave_tokens for token in members]
        staged = self._int_ring.upload(np.asarray(rows + tokens, dtype=np.int64), self._new_tokens)
        staged = staged.view(2, len(rows))
        start = 0
        for members in wave_rows:
            if not members:
                break
            end = start + len(members)
            prefix = self._active_prefix and len(members) == self._num_active
            self._insert(staged[0, start:end], staged[1, start:end], prefix)
            start = end

    def _insert(self, rows: torch.Tensor, tokens: torch.Tensor, prefix: bool) -> None:
        """Count one token per row (rows distinct): find it in the row's table or append it.

        The token is first written at the row's first free slot (the sink when the table is full), so the
        first slot holding it is where it belongs: an earlier slot if it is known, else that new one. Dead
        slots repeat slot 0, so they are never the first match. `prefix`: the rows are exactly 0..n-1, so
        the tables are sliced instead of gathered."""
        width = self._width
        n = rows.shape[0]
        searched = self._live_width + 1
        size = self._size[:n].clone() if prefix else self._size.index_select(0, rows)
        keys = rows * self.vocab_size + tokens
        row_start = rows * (width + 1)
        free = row_start + size.clamp(max=width)
        flat_ids = self._flat_ids.view(-1)
        flat_ids.index_copy_(0, free, keys)
        searched_ids = self._flat_ids[:, :searched]
        table = searched_ids[:n] if prefix else searched_ids.index_select(0, rows)
        # Flat ids are non-negative: id ^ key is 0 exactly where they match, and positive elsewhere.
        position = torch.bitwise_xor(table, keys.unsqueeze(1)).argmin(dim=1)
        added = (position == size) & (size < width)
        flat_ids.index_copy_(0, free, torch.where(added, keys, table[:, 0]))  # a free slot stays dead
        self._size.index_copy_(0, rows, size + added)
        slot = row_start + position
        self._counts.view(-1).index_copy_(0, slot, self._counts.view(-1).index_select(0, slot) + 1)

    def _penalise(self, logits: torch.Tensor, *, divide: bool) -> None:
        """Gather each row's table columns from the logits, penalise them, scatter them back.

        Dead slots (at or past the row's size, and the sink) repeat slot 0's flat id: they read slot 0's
        logit and write a stale value to it, which the last scatter overwrites with slot 0's own result
        (or, for a row with no token yet, with the untouched logit). On CPU the rows go in chunks whose
        gathered logits stay in cache until they are scattered back, so each logit's line comes from
        memory once."""
        n, live, width = self._num_active, self._live_width, self._width
        if not live:
            return
        # Whole table rows are contiguous, so their flat ids index the logits as they are; the dead slots
        # past the live width cost little (their logit is slot 0's, already in cache).
        columns = width + 1 if 2 * live > width else live
        if self._active_prefix:
            flat_ids, size = self._flat_ids[:n, :columns], self._size[:n]
            counts = self._counts[:n, :columns]
            flat_ids = flat_ids.contiguous()
        else:
            rows = self._active_rows[:n]
            flat_ids = self._flat_ids[:, :columns].index_select(0, rows)
            size = self._size.index_select(0, rows)
            counts = self._counts[:, :columns].index_select(0, rows)
        if logits.shape[1] != self.vocab_size:
            flat_ids = flat_ids + self._active_rows[:n].unsqueeze(1) * (logits.shape[1] - self.vocab_size)
        flat_logits = logits.view(-1)
        untouched_first = flat_logits.index_select(0, flat_ids[:, 0])
        values = torch.empty(n, columns, dtype=logits.dtype, device=logits.device)
        chunk = n if logits.device.type != "cpu" else max(1, CPU_CHUNK_SLOTS // columns)
        repetition, inverse, sign, frequency, presence = self._active_factors[: 5 * n].view(5, n, 1)
        parts = zip(
            torch.split(flat_ids.view(-1), chunk * columns),
            torch.split(values.view(-1), chunk * columns),
            torch.split(values, chunk),
            torch.split(repetition, chunk),
            torch.split(inverse, chunk),
            torch.split(sign, chunk),
            torch.split(frequency, chunk),
            torch.split(counts, chunk),
            torch.split(presence, chunk),
            strict=True,
        )
        for (
            part_ids,
            flat_values,
            part_values,
            part_repetition,
            part_inverse,
            part_sign,
            part_frequency,
            part_counts,
            part_presence,
        ) in parts:
            torch.index_select(flat_logits, 0, part_ids, out=flat_values)
            # Same float32 arithmetic as vLLM: its CUDA kernel divides, its torch fallback multiplies by
            # the reciprocal (vllm/_custom_ops.py apply_repetition_penalties); then frequency x count,
            # then presence x (count > 0) (the count clamped to 1 is vLLM's 0/1 mask), subtracted one
            # after the other.
            if self._any_repetition:
                shrunk = part_values / part_repetition if divide else part_values * part_inverse
                part_values.mul_(part_repetition)
                torch.minimum(shrunk, part_values, out=part_values)
                if self._any_reversed:
                    part_values.mul_(part_sign)
            if self._any_frequency:
                part_values.sub_(part_counts * part_frequency)
            if self._any_presence:
                part_values.sub_(part_counts.clamp(max=1).mul_(part_presence))
            flat_logits.scatter_(0, part_ids, flat_values)
        first = torch.where(size > 0, values[:, 0], untouched_first)
        flat_logits.index_copy_(0, flat_ids[:, 0], first)
