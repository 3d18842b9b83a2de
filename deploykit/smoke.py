"""Smoke cases and their verdict: a deployment that answers HTTP 200 with no words is not healthy.

Three layers, so the rules can be tested without a server:
  `smoke_requests()` turns a profile's cases into exact request bodies (pure),
  `judge()` reads one answer and says what is wrong with it (pure),
  `run_smoke()` sends the requests over HTTP and judges each answer.

Consistency cases (`repeat`, `long_then_short`, `prefix_cache`, `batch`) are groups of requests whose
answers must agree: `compare_traces()` finds the first differing position and says whether it is a near
tie (a warning: vLLM does not promise bit-identical results across batch shapes) or a real divergence.
"""

from __future__ import annotations

import json
import math
import struct
import time
import zlib
from base64 import b64encode
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from deploykit.profile.schema import Profile, SmokeCase, SmokeKind

FIRST_IDS_KEPT = 32
LORA_LONG_MIN_PROMPT_TOKENS = 400
DEFAULT_PROMPTS: dict[str, str] = {
    "completion": "Once upon a time there was",
    "chat": "Say something about the weather.",
    "image": "Describe this image in one sentence.",
    "lora_short": "Once upon a time",
    "penalties": "the the the the the the the the the the",
}
# About ten tokens per sentence in common tokenizers, so 60 of them is well over 400 tokens.
_LONG_SENTENCE = "The quick brown fox jumps over the lazy dog near the river bank. "
_LONG_REPEATS = 60
_OUT_OF_RANGE_HINTS = ("out of range float", "not json compliant")
# Consistency cases: a long prompt of at least this many tokens, or as long as max_model_len allows.
LONG_PROMPT_TOKENS = 512
# The long prompts are token ids, so their length is exact whatever the tokenizer. Ids 128..255 are
# ordinary tokens in every vocabulary deploykit serves: byte tokens in byte-level BPE (Llama 3, Qwen, the
# tiny demo model, whose vocabulary has only ~550 ids), byte fallbacks in SentencePiece (Mistral), plain
# pieces after Gemma's reserved ids; specials sit below 128 or at the vocabulary's end.
_LONG_ID_BASE = 128
_LONG_ID_SPAN = 128
CONSISTENCY_TOP_LOGPROBS = 2
DEFAULT_TIE_TOLERANCE = 0.05
DEFAULT_LOGPROB_TOLERANCE = 0.05

Endpoint = Literal["/v1/completions", "/v1/chat/completions"]


class CaseResult(BaseModel):
    """One smoke request and what the verdict made of it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    kind: str
    endpoint: str
    model: str
    passed: bool
    diagnosis: str = ""
    http_status: int | None = None
    latency_s: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    tokens_per_s: float | None = None
    first_ids: list[int] = Field(default_factory=list, description=f"first {FIRST_IDS_KEPT} generated ids")
    finish_reason: str | None = None
    text: str | None = Field(default=None, description="the start of the generated text")
    warning: str = Field(default="", description="a near-tie divergence or a comparison that was skipped")
    miss: bool = Field(
        default=False,
        description="failed only by being slow or unreachable (timeout, transport error, HTTP 5xx/429)",
    )


class SmokeReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    passed: bool
    diagnosis: str
    cases: list[CaseResult]
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class SmokeRequest:
    """One request to send: where, what, and what the answer must satisfy beyond the common rules."""

    name: str
    kind: str
    endpoint: Endpoint
    body: dict[str, Any]
    expect_substring: str | None = None
    min_prompt_tokens: int | None = None
    group: str | None = None  # the requests of one consistency case share a group
    compare_to: str | None = None
    concurrent: bool = False
    check_logprobs: bool = False

    @property
    def model(self) -> str:
        return str(self.body["model"])


@dataclass
class Exchange:
    """What came back for one request, before judging it."""

    status_code: int | None = None
    body: Any = None
    raw_text: str = ""
    latency_s: float = 0.0
    timed_out: bool = False
    transport_error: str | None = None
    timeout_s: float | None = None


# --- which requests ---------------------------------------------------------------------------------


def derive_cases(profile: Profile) -> list[SmokeCase]:
    """The profile's own cases, or the ones its settings call for."""
    from deploykit.profile.schema import SmokeCase

    max_model_len = profile.serve.max_model_len
    if profile.smoke.cases is not None:
        return [_sized(case, max_model_len) for case in profile.smoke.cases]
    cases = [SmokeCase(kind="completion"), SmokeCase(kind="chat")]
    if profile.model.multimodal:
        cases.append(SmokeCase(kind="image"))
    if profile.serve.lora.enabled and profile.serve.lora.adapters:
        cases.append(SmokeCase(kind="lora_long", adapter=next(iter(profile.serve.lora.adapters))))
    if profile.workload.penalties:
        cases.append(SmokeCase(kind="penalties"))
    # Every profile checks that the same question gets the same answer, and that one long prompt does
    # not break the short ones after it (the LoRA field report's failure).
    cases += [SmokeCase(kind="repeat"), SmokeCase(kind="long_then_short")]
    return [_sized(case, max_model_len) for case in cases]


def long_prompt_tokens(max_model_len: int | None, max_tokens: int) -> int:
    """The long prompt's length: 512 tokens, or as long as max_model_len leaves room for the answer."""
    if max_model_len is None:
        return LONG_PROMPT_TOKENS
    return max(1, min(LONG_PROMPT_TOKENS, max_model_len - max_tokens - 1))


def _sized(case: SmokeCase, max_model_len: int | None) -> SmokeCase:
    if (
        case.kind in ("long_then_short", "prefix_cache")
        and case.prompt_tokens is None
        and case.prompt is None
    ):
        return case.model_copy(update={"prompt_tokens": long_prompt_tokens(max_model_len, case.max_tokens)})
    return case


def long_prompt_ids(length: int, salt: int = 0) -> list[int]:
    """A prompt of exactly `length` ordinary token ids. A different `salt` changes the first token, so
    no prefix-cache block is shared with another salt's prompt: the forward pass is really that long."""
    return [_LONG_ID_BASE + (salt * 37 + i * 7919) % _LONG_ID_SPAN for i in range(length)]


def long_prompt() -> str:
    return _LONG_SENTENCE * _LONG_REPEATS


def smoke_requests(
    cases: Sequence[SmokeCase],
    served_name: str,
    default_adapter: str | None = None,
    *,
    max_model_len: int | None = None,
    salt: int = 0,
) -> list[SmokeRequest]:
    """Exact bodies: greedy, token ids and logprobs on, so every rule has something to read.

    `salt` varies the long prompts (a canary passes its run number, so each run's long prompt is a real
    long forward pass, not a prefix-cache hit on the previous run's)."""
    requests: list[SmokeRequest] = []
    seen: dict[str, int] = {}
    for index, case in enumerate(cases):
        case = _sized(case, max_model_len)
        renamed: dict[str, str] = {}
        for request in _requests_for(case, served_name, default_adapter, salt + index):
            count = seen.get(request.name, 0)
            seen[request.name] = count + 1
            changes: dict[str, Any] = {}
            if count:
                changes["name"] = renamed[request.name] = f"{request.name}#{count + 1}"
            if request.group is not None:
                changes["group"] = f"{request.group}@{index}"
            if request.compare_to is not None:
                changes["compare_to"] = renamed.get(request.compare_to, request.compare_to)
            if changes:
                request = SmokeRequest(**{**request.__dict__, **changes})
            requests.append(request)
    return requests


def _completion(model: str, prompt: str | list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
        "logprobs": 1,
        **extra,
    }


def _chat(model: str, content: Any, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 1,
    }


def _consistency(model: str, prompt: str | list[int], max_tokens: int) -> dict[str, Any]:
    """Greedy with the top-2 logprobs as token ids: enough to say where two answers part and by how much.

    `ignore_eos`: every answer has `max_tokens` ids, so two answers are compared over the same length, and
    a model that ends a long prompt of arbitrary ids at once (EOS first, a fair answer) is not taken for
    one that emits only specials."""
    return _completion(
        model,
        prompt,
        max_tokens,
        logprobs=CONSISTENCY_TOP_LOGPROBS,
        return_tokens_as_token_ids=True,
        ignore_eos=True,
    )


def _consistency_requests(case: SmokeCase, model: str, salt: int) -> Iterator[SmokeRequest]:
    kind = case.kind
    short = case.prompt or DEFAULT_PROMPTS["completion"]
    length = case.prompt_tokens or LONG_PROMPT_TOKENS
    long: str | list[int] = case.prompt if case.prompt is not None else long_prompt_ids(length, salt)
    need_long = None if case.prompt is not None else length - 1
    endpoint: Endpoint = "/v1/completions"
    if kind == "repeat":
        body = _consistency(model, short, case.max_tokens)
        yield SmokeRequest("repeat:1", kind, endpoint, body, case.expect_substring, group=kind)
        yield SmokeRequest(
            "repeat:2", kind, endpoint, body, case.expect_substring, group=kind, compare_to="repeat:1"
        )
    elif kind == "long_then_short":
        body = _consistency(model, short, case.max_tokens)
        yield SmokeRequest(f"{kind}:short", kind, endpoint, body, case.expect_substring, group=kind)
        yield SmokeRequest(
            f"{kind}:long", kind, endpoint, _consistency(model, long, case.max_tokens), None, need_long, kind
        )
        yield SmokeRequest(
            f"{kind}:again",
            kind,
            endpoint,
            body,
            case.expect_substring,
            group=kind,
            compare_to=f"{kind}:short",
        )
    elif kind == "prefix_cache":
        body = _consistency(model, long, case.max_tokens)
        yield SmokeRequest(f"{kind}:1", kind, endpoint, body, None, need_long, kind)
        yield SmokeRequest(
            f"{kind}:2",
            kind,
            endpoint,
            body,
            None,
            need_long,
            kind,
            compare_to=f"{kind}:1",
            check_logprobs=True,
        )
    elif kind == "batch":
        body = _consistency(model, short, case.max_tokens)
        for number in range(1, case.batch_size + 1):
            yield SmokeRequest(
                f"{kind}:{number}",
                kind,
                endpoint,
                body,
                case.expect_substring,
                group=kind,
                compare_to=None if number == 1 else f"{kind}:1",
                concurrent=True,
            )


def _requests_for(
    case: SmokeCase, served_name: str, default_adapter: str | None, salt: int = 0
) -> Iterator[SmokeRequest]:
    kind: SmokeKind = case.kind
    expect = case.expect_substring
    if kind in ("repeat", "long_then_short", "prefix_cache", "batch"):
        yield from _consistency_requests(case, case.adapter or served_name, salt)
        return
    if kind == "completion":
        prompt = case.prompt or DEFAULT_PROMPTS["completion"]
        yield SmokeRequest(
            "completion", kind, "/v1/completions", _completion(served_name, prompt, case.max_tokens), expect
        )
    elif kind == "chat":
        prompt = case.prompt or DEFAULT_PROMPTS["chat"]
        yield SmokeRequest(
            "chat", kind, "/v1/chat/completions", _chat(served_name, prompt, case.max_tokens), expect
        )
    elif kind == "image":
        content = [
            {"type": "text", "text": case.prompt or DEFAULT_PROMPTS["image"]},
            {"type": "image_url", "image_url": {"url": smoke_image_data_url()}},
        ]
        yield SmokeRequest(
            "image", kind, "/v1/chat/completions", _chat(served_name, content, case.max_tokens), expect
        )
    elif kind == "lora_long":
        adapter = case.adapter or default_adapter or served_name
        yield SmokeRequest(
            "lora_long",
            kind,
            "/v1/completions",
            _completion(adapter, case.prompt or long_prompt(), case.max_tokens),
            None,
            min_prompt_tokens=LORA_LONG_MIN_PROMPT_TOKENS,
        )
        # The short prompt right after the long one is where a stale LoRA buffer shows.
        yield SmokeRequest(
            "lora_short",
            kind,
            "/v1/completions",
            _completion(adapter, DEFAULT_PROMPTS["lora_short"], case.max_tokens),
            expect,
        )
    elif kind == "penalties":
        body = _completion(
            served_name,
            case.prompt or DEFAULT_PROMPTS["penalties"],
            case.max_tokens,
            repetition_penalty=1.3,
            presence_penalty=0.5,
            frequency_penalty=0.5,
        )
        yield SmokeRequest("penalties", kind, "/v1/completions", body, expect)


def smoke_image_png(size: int = 32) -> bytes:
    """A small RGB gradient PNG made here (zlib + the PNG chunk format): no image library, no download."""
    rows = b"".join(
        b"\x00" + bytes(channel for x in range(size) for channel in (x * 8 % 256, y * 8 % 256, 128))
        for y in range(size)
    )

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def smoke_image_data_url() -> str:
    return "data:image/png;base64," + b64encode(smoke_image_png()).decode()


def special_token_ids(model_dir: str | Path | None) -> frozenset[int]:
    """Ids that carry no words (pad, bos, eos, other specials), read from a local model's JSON files."""
    ids: set[int] = set()
    if model_dir is None:
        return frozenset(ids)
    root = Path(model_dir)
    tokenizer = _read_json(root / "tokenizer.json")
    for token in tokenizer.get("added_tokens", []) if isinstance(tokenizer, dict) else []:
        if isinstance(token, dict) and token.get("special") and isinstance(token.get("id"), int):
            ids.add(token["id"])
    for name in ("config.json", "generation_config.json"):
        config = _read_json(root / name)
        for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
            value = config.get(key) if isinstance(config, dict) else None
            values = value if isinstance(value, list) else [value]
            ids.update(v for v in values if isinstance(v, int))
    return frozenset(ids)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


# --- the verdict ------------------------------------------------------------------------------------


@dataclass
class _Answer:
    """The parts of a completion or chat answer the rules read."""

    token_ids: list[int] | None
    text: str | None
    finish_reason: str | None
    logprobs: list[float | None] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def _parse_answer(endpoint: str, body: dict[str, Any]) -> _Answer:
    choice = body["choices"][0]
    usage = body.get("usage") or {}
    raw_ids = choice.get("token_ids")
    ids = [int(i) for i in raw_ids] if isinstance(raw_ids, list) else None
    values: list[float | None] = []
    logprobs = choice.get("logprobs") or {}
    if endpoint == "/v1/chat/completions":
        text = (choice.get("message") or {}).get("content")
        for entry in logprobs.get("content") or []:
            values.append(entry.get("logprob"))
            values.extend(top.get("logprob") for top in entry.get("top_logprobs") or [])
    else:
        text = choice.get("text")
        values.extend(logprobs.get("token_logprobs") or [])
        for top in logprobs.get("top_logprobs") or []:
            values.extend((top or {}).values())
    return _Answer(
        token_ids=ids,
        text=text,
        finish_reason=choice.get("finish_reason"),
        logprobs=values,
        prompt_tokens=usage.get("prompt_tokens"),
        completion_tokens=usage.get("completion_tokens"),
    )


def _non_finite(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if isinstance(v, (int, float)) and not math.isfinite(v)]


def _error_message(exchange: Exchange) -> str:
    body = exchange.body
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(body.get("message"), str):
            return str(body["message"])
        if isinstance(body.get("detail"), str):
            return str(body["detail"])
    return exchange.raw_text.strip()[:300] or "(empty body)"


def _http_problem(exchange: Exchange) -> str:
    message = _error_message(exchange)
    code = exchange.status_code
    if any(hint in message.lower() for hint in _OUT_OF_RANGE_HINTS):
        return (
            f"HTTP {code}: the server could not encode its answer because float values are out of range "
            f"({message}): the model produced NaN or infinite numbers"
        )
    hint = {
        401: " (the API key is missing or wrong)",
        404: " (the served model or adapter name is not what the server serves)",
    }.get(code or 0, "")
    return f"HTTP {code}{hint}: {message}"


def judge(request: SmokeRequest, exchange: Exchange, special_ids: frozenset[int] = frozenset()) -> CaseResult:
    """Every rule one answer must pass; all problems found, most fundamental first."""
    result = CaseResult(
        name=request.name,
        kind=request.kind,
        endpoint=request.endpoint,
        model=request.model,
        passed=False,
        http_status=exchange.status_code,
        latency_s=round(exchange.latency_s, 4),
    )
    if exchange.timed_out:
        limit = f" within {exchange.timeout_s:g} s" if exchange.timeout_s else ""
        result.diagnosis = f"timeout: no answer{limit}"
        result.miss = True
        return result
    if exchange.transport_error is not None:
        result.diagnosis = f"request failed: {exchange.transport_error}"
        result.miss = True
        return result
    if exchange.status_code != 200:
        result.diagnosis = _http_problem(exchange)
        busy = (exchange.status_code or 0) >= 500 or exchange.status_code == 429
        result.miss = busy and not any(hint in result.diagnosis.lower() for hint in _OUT_OF_RANGE_HINTS)
        return result
    body = exchange.body
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
        result.diagnosis = f"the answer has no choices: {exchange.raw_text.strip()[:200]!r}"
        return result
    try:
        answer = _parse_answer(request.endpoint, body)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        result.diagnosis = f"the answer is not shaped like an OpenAI {request.endpoint} answer ({exc!r})"
        return result

    ids = answer.token_ids or []
    result.first_ids = ids[:FIRST_IDS_KEPT]
    result.finish_reason = answer.finish_reason
    result.text = answer.text[:200] if answer.text is not None else None
    result.prompt_tokens = answer.prompt_tokens
    result.completion_tokens = answer.completion_tokens if answer.completion_tokens is not None else len(ids)
    if exchange.latency_s > 0 and result.completion_tokens:
        result.tokens_per_s = round(result.completion_tokens / exchange.latency_s, 2)

    problems: list[str] = []
    bad = _non_finite(answer.logprobs)
    if bad:
        problems.append(
            f"{len(bad)} of {len(answer.logprobs)} logprobs are NaN or infinite (e.g. {bad[0]}): "
            "the model computes NaN/inf, so its tokens are meaningless"
        )
    if answer.token_ids is None:
        problems.append("the answer has no token ids: the server ignored `return_token_ids`")
    elif not ids:
        problems.append("the server generated no tokens at all")
    elif all(i == 0 or i in special_ids for i in ids):
        shown = ", ".join(str(i) for i in ids[:8]) + (", …" if len(ids) > 8 else "")
        problems.append(
            f"every generated id is 0 or a special/pad token ({shown}): the model emits no words "
            "(broken weights, a wrong dtype, or logits that are all equal)"
        )
    if not answer.text and answer.finish_reason == "length":
        shown = "null" if answer.text is None else "empty"
        problems.append(
            f"content is {shown} while finish_reason is `length`: {len(ids)} tokens were generated "
            "but no text came back"
        )
    if (
        request.min_prompt_tokens is not None
        and answer.prompt_tokens is not None
        and answer.prompt_tokens <= request.min_prompt_tokens
    ):
        problems.append(
            f"the long prompt had only {answer.prompt_tokens} tokens; this case needs more than "
            f"{request.min_prompt_tokens}"
        )
    if request.expect_substring is not None and request.expect_substring not in (answer.text or ""):
        problems.append(
            f"expected {request.expect_substring!r} in the text, got {(answer.text or '')[:80]!r}"
        )
    result.passed = not problems
    result.diagnosis = "; ".join(problems)
    return result


# --- consistency: do two answers to the same greedy request agree? -----------------------------------


@dataclass(frozen=True)
class Trace:
    """A completion's generated ids with, per position, the chosen token's logprob and the top ids."""

    ids: list[int]
    chosen: list[float | None]
    top: list[dict[int, float]]


def parse_trace(body: Any) -> Trace | None:
    """Read a /v1/completions answer made with `return_tokens_as_token_ids`; None when it has no ids."""
    try:
        choice = body["choices"][0]
        ids = [int(i) for i in choice["token_ids"]]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    logprobs = choice.get("logprobs") or {}
    chosen = list(logprobs.get("token_logprobs") or [])
    top: list[dict[int, float]] = []
    for entry in logprobs.get("top_logprobs") or []:
        row: dict[int, float] = {}
        for key, value in (entry or {}).items():
            token = _token_id(key)
            if token is not None and isinstance(value, (int, float)):
                row[token] = float(value)
        top.append(row)
    return Trace(ids=ids, chosen=chosen, top=top)


def _token_id(key: str) -> int | None:
    _, sep, number = str(key).rpartition("token_id:")
    try:
        return int(number) if sep else None
    except ValueError:
        return None


def top2_gap(trace: Trace, position: int) -> float | None:
    """How far the best token led the second best at `position`; None when it is not known."""
    if position >= len(trace.top):
        return None
    values = sorted((v for v in trace.top[position].values() if math.isfinite(v)), reverse=True)
    return values[0] - values[1] if len(values) >= 2 else None


@dataclass(frozen=True)
class Divergence:
    """Where two answers part. `position` None: same ids, but the logprobs moved past the tolerance."""

    position: int | None
    reference_ids: list[int]
    ids: list[int]
    reference_gap: float | None = None
    gap: float | None = None
    near_tie: bool = False
    logprob_delta: float | None = None
    logprob_position: int | None = None
    bad_token: int | None = None

    def describe(self, what: str, reference: str, tie_tolerance: float) -> str:
        if self.position is None:
            return (
                f"{what}: same ids as {reference}, but a chosen token's logprob moved by "
                f"{_fmt(self.logprob_delta)} at generated position {self.logprob_position}"
            )
        gaps = f"{_fmt(self.reference_gap)} ({reference}) vs {_fmt(self.gap)} (this one)"
        text = (
            f"{what}: differs from {reference} at generated position {self.position}: ids "
            f"{_around(self.reference_ids, self.position)} vs {_around(self.ids, self.position)}; "
            f"top-2 logprob gap there {gaps}"
        )
        if self.bad_token is not None:
            return text + f"; the diverging id {self.bad_token} is 0 or a special/pad token"
        if self.near_tie:
            return text + (
                f", below the near-tie tolerance {tie_tolerance:g}: a near tie (vLLM does not promise "
                "bit-identical results across batch shapes)"
            )
        return text + f", a clear margin (near-tie tolerance {tie_tolerance:g}): the answer really changed"


def _fmt(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4g}"


def _around(ids: Sequence[int], position: int, width: int = 2) -> str:
    start = max(0, position - width)
    parts = [
        f">{i}<" if start + n == position else str(i) for n, i in enumerate(ids[start : position + width + 1])
    ]
    if position >= len(ids):
        parts.append(">end<")
    return (
        ("[…, " if start else "[") + ", ".join(parts) + (", …]" if position + width + 1 < len(ids) else "]")
    )


def compare_traces(
    reference: Trace,
    other: Trace,
    *,
    tie_tolerance: float = DEFAULT_TIE_TOLERANCE,
    logprob_tolerance: float | None = None,
    special_ids: frozenset[int] = frozenset(),
) -> Divergence | None:
    """None when the answers agree; else where they part, and whether it is only a near tie."""
    position = next(
        (n for n, (a, b) in enumerate(zip(reference.ids, other.ids, strict=False)) if a != b),
        None if len(reference.ids) == len(other.ids) else min(len(reference.ids), len(other.ids)),
    )
    if position is not None:
        gap_a, gap_b = top2_gap(reference, position), top2_gap(other, position)
        chosen = [seq[position] for seq in (reference.ids, other.ids) if position < len(seq)]
        bad = next((i for i in chosen if i == 0 or i in special_ids), None)
        near = (
            bad is None
            and len(chosen) == 2
            and gap_a is not None
            and gap_b is not None
            and max(gap_a, gap_b) < tie_tolerance
        )
        return Divergence(position, reference.ids, other.ids, gap_a, gap_b, near, bad_token=bad)
    if logprob_tolerance is not None:
        for n, (a, b) in enumerate(zip(reference.chosen, other.chosen, strict=False)):
            if a is None or b is None:
                continue
            delta = abs(a - b)
            if not math.isfinite(delta) or delta > logprob_tolerance:
                return Divergence(None, reference.ids, other.ids, logprob_delta=delta, logprob_position=n)
    return None


_WHAT = {
    "repeat": "the same greedy request again",
    "long_then_short": "the short prompt again after the long one",
    "prefix_cache": "the same long prompt again (a prefix-cache hit)",
    "batch": "identical requests sent at once",
}


def judge_consistency(
    request: SmokeRequest,
    result: CaseResult,
    exchange: Exchange,
    reference: SmokeRequest,
    reference_result: CaseResult,
    reference_exchange: Exchange,
    *,
    special_ids: frozenset[int] = frozenset(),
    tie_tolerance: float = DEFAULT_TIE_TOLERANCE,
    logprob_tolerance: float = DEFAULT_LOGPROB_TOLERANCE,
) -> CaseResult:
    """Compare an answer that passed on its own with the one it must equal; fail or warn on a divergence."""
    if not result.passed:
        if reference_result.passed and not result.miss:
            result.diagnosis += (
                f" ({_WHAT.get(request.kind, request.kind)}: {reference.name} had a good answer before)"
            )
        return result
    if not reference_result.passed:
        result.warning = f"not compared: {reference.name} failed"
        return result
    mine, theirs = parse_trace(exchange.body), parse_trace(reference_exchange.body)
    if mine is None or theirs is None:
        result.warning = "not compared: an answer has no token ids"
        return result
    divergence = compare_traces(
        theirs,
        mine,
        tie_tolerance=tie_tolerance,
        logprob_tolerance=logprob_tolerance if request.check_logprobs else None,
        special_ids=special_ids,
    )
    if divergence is None:
        return result
    what = _WHAT.get(request.kind, request.kind)
    if divergence.position is None:
        result.passed = False
        result.diagnosis = (
            f"{what}: same ids as {reference.name}, but a chosen token's logprob moved by "
            f"{_fmt(divergence.logprob_delta)} at generated position {divergence.logprob_position} "
            f"(tolerance {logprob_tolerance:g})"
        )
    elif divergence.near_tie:
        result.warning = divergence.describe(what, reference.name, tie_tolerance)
    else:
        result.passed = False
        result.diagnosis = divergence.describe(what, reference.name, tie_tolerance)
    return result


def summarise(results: Sequence[CaseResult], elapsed_s: float = 0.0) -> SmokeReport:
    failed = [r for r in results if not r.passed]
    if not results:
        return SmokeReport(passed=False, diagnosis="no smoke case was run", cases=[], elapsed_s=elapsed_s)
    if failed:
        diagnosis = " | ".join(f"{r.name}: {r.diagnosis}" for r in failed)
    else:
        diagnosis = f"all {len(results)} cases passed ({', '.join(r.name for r in results)})"
    warnings = [r for r in results if r.warning]
    if warnings:
        diagnosis += " | warnings: " + " | ".join(f"{r.name}: {r.warning}" for r in warnings)
    return SmokeReport(passed=not failed, diagnosis=diagnosis, cases=list(results), elapsed_s=elapsed_s)


# --- over HTTP --------------------------------------------------------------------------------------


def send(client: Any, request: SmokeRequest, timeout_s: float) -> Exchange:
    """POST one request; never raises for HTTP trouble, the Exchange says what happened."""
    import httpx

    started = time.monotonic()
    exchange = Exchange(timeout_s=timeout_s)
    try:
        response = client.post(request.endpoint, json=request.body, timeout=timeout_s)
    except httpx.TimeoutException:
        exchange.timed_out = True
    except httpx.HTTPError as exc:
        exchange.transport_error = f"{type(exc).__name__}: {exc}"
    else:
        exchange.status_code = response.status_code
        exchange.raw_text = response.text
        try:
            exchange.body = json.loads(response.text)  # json accepts NaN/Infinity, which the rules want
        except ValueError:
            exchange.body = None
    exchange.latency_s = time.monotonic() - started
    return exchange


def batches(requests: Sequence[SmokeRequest]) -> list[list[SmokeRequest]]:
    """The sending order: one request at a time, except a group's concurrent requests, sent together."""
    out: list[list[SmokeRequest]] = []
    for request in requests:
        previous = out[-1][-1] if out else None
        if (
            request.concurrent
            and previous is not None
            and previous.concurrent
            and previous.group == request.group
        ):
            out[-1].append(request)
        else:
            out.append([request])
    return out


def run_smoke(
    base_url: str,
    requests: Sequence[SmokeRequest],
    *,
    timeout_s: float,
    api_key: str | None = None,
    special_ids: frozenset[int] = frozenset(),
    on_case: Callable[[CaseResult], None] | None = None,
    tie_tolerance: float = DEFAULT_TIE_TOLERANCE,
    logprob_tolerance: float = DEFAULT_LOGPROB_TOLERANCE,
) -> SmokeReport:
    """Send each request in order and judge it; `on_case(result)` is called after each."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    started = time.monotonic()
    results: list[CaseResult] = []
    done: dict[str, tuple[SmokeRequest, Exchange, CaseResult]] = {}
    with httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s) as client:
        for batch in batches(requests):
            if len(batch) == 1:
                exchanges = [send(client, batch[0], timeout_s)]
            else:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                    exchanges = list(pool.map(lambda r: send(client, r, timeout_s), batch))
            for request, exchange in zip(batch, exchanges, strict=True):
                result = judge(request, exchange, special_ids)
                reference = done.get(request.compare_to) if request.compare_to else None
                if reference is not None:
                    result = judge_consistency(
                        request,
                        result,
                        exchange,
                        reference[0],
                        reference[2],
                        reference[1],
                        special_ids=special_ids,
                        tie_tolerance=tie_tolerance,
                        logprob_tolerance=logprob_tolerance,
                    )
                done[request.name] = (request, exchange, result)
                results.append(result)
                if on_case is not None:
                    on_case(result)
    return summarise(results, time.monotonic() - started)
