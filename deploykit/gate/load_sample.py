"""A short streamed load on one server: each stream sends its requests one after another, all streams at
once; TPOT per request from the token ids each chunk carries, throughput over the whole sample.

A chunk may carry several tokens, so TPOT is (last token's arrival − first token's) / (tokens − 1), every
token stamped with the arrival of the chunk that carried it. Every request is one bounded read
(`deploykit.http_bounded`): a whole-request deadline and a size cap, like every other read from a server.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from deploykit.endpoint import Endpoint
from deploykit.gate.model import LoadPoint
from deploykit.http_bounded import ANSWER_CAP_BYTES, METRICS_CAP_BYTES, fetch

_ITL = "vllm:inter_token_latency_seconds"

_FIRST_PROMPT_ID, _PROMPT_IDS = 128, 128
"""Load prompts are ids in 128..255, as the fingerprint's are: ordinary tokens in every vocabulary deploykit
serves (the demo's tiny model has barely more than a thousand), so a prompt is the same whatever the
tokenizer."""


@dataclass
class StreamedAnswer:
    """One streamed request: (arrival, tokens) for every chunk that carried tokens, or why it failed."""

    chunks: list[tuple[float, int]] = field(default_factory=list)
    started: float = 0.0
    problem: str = ""

    @property
    def tokens(self) -> int:
        return sum(count for _, count in self.chunks)

    def tpot_s(self) -> float | None:
        if self.tokens < 2:
            return None
        return (self.chunks[-1][0] - self.chunks[0][0]) / (self.tokens - 1)

    def ttft_s(self) -> float | None:
        return self.chunks[0][0] - self.started if self.chunks else None


class _SseReader:
    """Splits a body arriving in pieces into `data: {...}` events and counts each one's token ids."""

    def __init__(self, answer: StreamedAnswer) -> None:
        self.answer = answer
        self.pending = b""

    def feed(self, piece: bytes) -> None:
        at = time.monotonic()
        self.pending += piece
        *lines, self.pending = self.pending.split(b"\n")
        count = 0
        for line in lines:
            if not line.startswith(b"data: {"):
                continue
            try:
                event = json.loads(line[len(b"data: ") :])
            except ValueError:
                continue
            if not isinstance(event, dict):
                continue
            if "error" in event and not self.answer.problem:  # vLLM reports a refused stream as an event
                error = event["error"]
                message = error.get("message") if isinstance(error, dict) else error
                self.answer.problem = f"the server's stream ended in an error: {str(message)[:200]}"
            choices = event.get("choices")
            for choice in choices if isinstance(choices, list) else []:
                ids = choice.get("token_ids") if isinstance(choice, dict) else None
                count += len(ids) if isinstance(ids, list) else 0
        if count:
            self.answer.chunks.append((at, count))


def prompt_ids(length: int, salt: int) -> list[int]:
    """A prompt of `length` ids, different per request (`salt`), so no request is a prefix-cache hit."""
    return [_FIRST_PROMPT_ID + (salt * 7 + i * 13 + (i * i) % 5) % _PROMPT_IDS for i in range(length)]


def load_body(served_name: str, prompt: list[int], output_tokens: int) -> dict[str, object]:
    return {
        "model": served_name,
        "prompt": prompt,
        "max_tokens": output_tokens,
        "min_tokens": output_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "return_token_ids": True,
    }


def stream_once(endpoint: Endpoint, body: dict[str, object]) -> StreamedAnswer:
    answer = StreamedAnswer(started=time.monotonic())
    reader = _SseReader(answer)
    reply = fetch(
        endpoint.at("/v1/completions"),
        method="POST",
        json_body=body,
        headers=endpoint.headers(),
        deadline_s=endpoint.request_deadline_s,
        max_bytes=ANSWER_CAP_BYTES,
        on_chunk=reader.feed,
    )
    if not reply.ok:
        answer.problem = reply.problem
    elif reply.status != 200:
        answer.problem = f"HTTP {reply.status}"
    return answer


def metrics_text(endpoint: Endpoint) -> str | None:
    """The server's /metrics page, one bounded read (the endpoint's metrics deadline, the metrics cap); None
    when it cannot be read."""
    reply = fetch(
        endpoint.at("/metrics"),
        deadline_s=endpoint.metrics_deadline_s,
        max_bytes=METRICS_CAP_BYTES,
        headers=endpoint.headers(),
    )
    return reply.text if reply.ok and reply.status == 200 else None


def inter_token_totals(endpoint: Endpoint) -> tuple[float, float] | None:
    """vLLM's inter-token latency histogram, sum and count over every engine: the server's own time per
    output token, which a client's clock cannot give on a busy machine (its threads read several chunks at
    once). None when the page cannot be read or has no such histogram."""
    from deploykit.canary.nan_counter import parse_sample

    page = metrics_text(endpoint)
    if page is None:
        return None
    total, count, seen = 0.0, 0.0, False
    for line in page.splitlines():
        if not line.startswith(_ITL):
            continue
        found = parse_sample(line)
        if found is None:
            continue
        if found.name == _ITL + "_sum":
            total, seen = total + found.value, True
        elif found.name == _ITL + "_count":
            count += found.value
    return (total, count) if seen else None


def sample(
    endpoint: Endpoint,
    served_name: str,
    *,
    streams: int,
    requests_per_stream: int,
    prompt_tokens: int,
    output_tokens: int,
    salt: int = 0,
) -> LoadPoint:
    """`streams` concurrent streams of `requests_per_stream` requests each; throughput counts every token
    that arrived over the sample's wall time, TPOT and TTFT are medians over the requests."""

    def one_stream(stream: int) -> list[StreamedAnswer]:
        answers = []
        for n in range(requests_per_stream):
            prompt = prompt_ids(prompt_tokens, salt * 10_000 + stream * 100 + n)
            answers.append(stream_once(endpoint, load_body(served_name, prompt, output_tokens)))
        return answers

    before = inter_token_totals(endpoint)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=streams) as pool:
        answers = [a for per_stream in pool.map(one_stream, range(streams)) for a in per_stream]
    wall = time.monotonic() - started
    point = summarise(streams, answers, wall, output_tokens)
    after = inter_token_totals(endpoint) if before is not None else None
    if before is not None and after is not None and after[1] > before[1]:
        server_tpot = (after[0] - before[0]) / (after[1] - before[1])
        point = point.model_copy(update={"tpot_ms": round(server_tpot * 1000, 3), "tpot_source": "server"})
    return point


def summarise(
    streams: int, answers: Sequence[StreamedAnswer], wall_s: float, output_tokens: int
) -> LoadPoint:
    tokens = sum(a.tokens for a in answers)
    tpots = [t for a in answers if (t := a.tpot_s()) is not None]
    ttfts = [t for a in answers if (t := a.ttft_s()) is not None]
    failed = [a for a in answers if a.problem or a.tokens < output_tokens]
    problem = ""
    if failed:
        first = failed[0]
        why = first.problem or f"{first.tokens} of {output_tokens} tokens"
        problem = f"{len(failed)} of {len(answers)} load request(s) incomplete: {why}"
    return LoadPoint(
        streams=streams,
        requests=len(answers),
        output_tokens=tokens,
        wall_s=round(wall_s, 4),
        tokens_per_s=round(tokens / wall_s, 2) if wall_s > 0 else 0.0,
        tpot_ms=round(statistics.median(tpots) * 1000, 3) if tpots else None,
        tpot_source="client",
        ttft_ms=round(statistics.median(ttfts) * 1000, 3) if ttfts else None,
        problem=problem,
    )


def best(points: Sequence[LoadPoint]) -> LoadPoint:
    """Of repeated samples at one stream count, the best of each figure (the highest throughput, the lowest
    TPOT): a sample can only be slowed by what else the machine did, never sped up, so the best of a few is
    the closest to what the server can do. The worst of each is kept too: the spread is the noise the other
    side must fall outside of (`judge.speed_findings`). A sample with a problem is kept as it is: it is the
    finding."""
    failed = [p for p in points if p.problem]
    if failed:
        return failed[0]
    fastest = max(points, key=lambda p: p.tokens_per_s)
    tpots = [p.tpot_ms for p in points if p.tpot_ms is not None]
    return fastest.model_copy(
        update={
            "tpot_ms": min(tpots) if tpots else None,
            "samples": len(points),
            "tokens_per_s_worst": min(p.tokens_per_s for p in points),
            "tpot_ms_worst": max(tpots) if tpots else None,
        }
    )
