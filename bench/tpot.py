"""Time per output token of one streamed request, from the token ids each chunk carries.

A stream chunk may carry several tokens (vLLM batches the detokenised output of a step, and a slow client
reads several chunks at once), so the gaps between chunks are not token times: averaging them says 0.0 ms
when tokens arrive together. TPOT is (time of the last token − time of the first) / (tokens − 1), every token
stamped with the arrival of the chunk that carried it, and counted by its id (`return_token_ids`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field


@dataclass
class StreamTiming:
    """(arrival time, tokens in that chunk) for every chunk that carried a token; the usage chunk's total."""

    chunks: list[tuple[float, int]] = field(default_factory=list)
    total_tokens: int = 0

    @property
    def tokens(self) -> int:
        return sum(count for _, count in self.chunks)

    def tpot(self) -> float | None:
        """Seconds per output token after the first; None with fewer than two tokens."""
        return tpot(self.chunks)


def tpot(chunks: Sequence[tuple[float, int]]) -> float | None:
    """(last token's time − first token's time) / (tokens − 1); None with fewer than two tokens."""
    carrying = [(at, count) for at, count in chunks if count > 0]
    tokens = sum(count for _, count in carrying)
    if tokens < 2:
        return None
    return (carrying[-1][0] - carrying[0][0]) / (tokens - 1)


def read_stream(lines: Iterable[str], clock: Callable[[], float] = time.monotonic) -> StreamTiming:
    """An OpenAI-style completions SSE stream (`data: {...}` lines) asked with `return_token_ids`."""
    timing = StreamTiming()
    for line in lines:
        if not line.startswith("data: {"):
            continue
        at = clock()
        chunk = json.loads(line[len("data: ") :])
        ids = sum(len(choice.get("token_ids") or []) for choice in chunk.get("choices") or [])
        if ids:
            timing.chunks.append((at, ids))
        usage = chunk.get("usage")
        if usage:
            timing.total_tokens = int(usage.get("total_tokens") or 0)
    return timing
