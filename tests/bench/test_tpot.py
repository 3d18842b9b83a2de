"""TPOT per request from the token ids each stream chunk carries (bench/tpot.py), not from chunk gaps."""

from __future__ import annotations

import json
from collections.abc import Iterator

from bench.tpot import read_stream, tpot


def sse(*token_counts: int, usage: int = 0) -> Iterator[str]:
    """An OpenAI-style completions stream asked with `return_token_ids`: one chunk per count."""
    for n, count in enumerate(token_counts):
        ids = list(range(100 + n * 10, 100 + n * 10 + count))
        yield "data: " + json.dumps({"choices": [{"index": 0, "text": "x" * count, "token_ids": ids}]})
        yield ""
    if usage:
        yield "data: " + json.dumps({"choices": [], "usage": {"total_tokens": usage}})
    yield "data: [DONE]"


def test_tokens_that_arrive_together_are_counted_by_id() -> None:
    # The first chunk carries 1 token, the next two carry 3 and 4: 8 tokens over 20 ms.
    stamps = iter([0.0, 0.010, 0.020, 0.021])  # the last: the usage chunk
    timing = read_stream(sse(1, 3, 4, usage=14), clock=lambda: next(stamps))
    assert timing.tokens == 8 and timing.total_tokens == 14
    assert timing.tpot() == 0.020 / 7
    # What bench_canary.py computed before: gaps between chunks, the last one left out, 20 ms / 1 = 10 ms
    # per "token" here (and 0.0 ms when the chunks arrive together): not a time per token.
    chunk_gaps = (timing.chunks[-2][0] - timing.chunks[0][0]) / (len(timing.chunks) - 2)
    assert chunk_gaps != timing.tpot()


def test_a_request_with_fewer_than_two_tokens_has_no_tpot() -> None:
    assert tpot([]) is None and tpot([(1.0, 1)]) is None and tpot([(1.0, 0), (2.0, 1)]) is None
    assert tpot([(1.0, 2)]) == 0.0  # two tokens in one chunk: they arrived together
    assert tpot([(1.0, 1), (1.5, 0), (3.0, 1)]) == 2.0  # a chunk without tokens is no token's time
