"""Smoke cases and their verdict: a deployment that answers HTTP 200 with no words is not healthy.

Three layers, so the rules can be tested without a server:
  `smoke_requests()` turns a profile's cases into exact request bodies (pure),
  `judge()` reads one answer and says what is wrong with it (pure),
  `run_smoke()` sends the requests over HTTP and judges each answer.
"""

from __future__ import annotations

import json
import math
import struct
import time
import zlib
from base64 import b64encode
from collections.abc import Iterable, Iterator, Sequence
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

    if profile.smoke.cases is not None:
        return list(profile.smoke.cases)
    cases = [SmokeCase(kind="completion"), SmokeCase(kind="chat")]
    if profile.model.multimodal:
        cases.append(SmokeCase(kind="image"))
    if profile.serve.lora.enabled and profile.serve.lora.adapters:
        cases.append(SmokeCase(kind="lora_long", adapter=next(iter(profile.serve.lora.adapters))))
    if profile.workload.penalties:
        cases.append(SmokeCase(kind="penalties"))
    return cases


def long_prompt() -> str:
    return _LONG_SENTENCE * _LONG_REPEATS


def smoke_requests(
    cases: Sequence[SmokeCase], served_name: str, default_adapter: str | None = None
) -> list[SmokeRequest]:
    """Exact bodies: greedy, token ids and logprobs on, so every rule has something to read."""
    requests: list[SmokeRequest] = []
    seen: dict[str, int] = {}
    for case in cases:
        for request in _requests_for(case, served_name, default_adapter):
            count = seen.get(request.name, 0)
            seen[request.name] = count + 1
            if count:
                request = SmokeRequest(**{**request.__dict__, "name": f"{request.name}#{count + 1}"})
            requests.append(request)
    return requests


def _completion(model: str, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
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


def _requests_for(case: SmokeCase, served_name: str, default_adapter: str | None) -> Iterator[SmokeRequest]:
    kind: SmokeKind = case.kind
    expect = case.expect_substring
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
        return result
    if exchange.transport_error is not None:
        result.diagnosis = f"request failed: {exchange.transport_error}"
        return result
    if exchange.status_code != 200:
        result.diagnosis = _http_problem(exchange)
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


def summarise(results: Sequence[CaseResult], elapsed_s: float = 0.0) -> SmokeReport:
    failed = [r for r in results if not r.passed]
    if not results:
        return SmokeReport(passed=False, diagnosis="no smoke case was run", cases=[], elapsed_s=elapsed_s)
    if failed:
        diagnosis = " | ".join(f"{r.name}: {r.diagnosis}" for r in failed)
    else:
        diagnosis = f"all {len(results)} cases passed ({', '.join(r.name for r in results)})"
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


def run_smoke(
    base_url: str,
    requests: Sequence[SmokeRequest],
    *,
    timeout_s: float,
    api_key: str | None = None,
    special_ids: frozenset[int] = frozenset(),
    on_case: Any = None,
) -> SmokeReport:
    """Send each request in order and judge it; `on_case(result)` is called after each."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    started = time.monotonic()
    results: list[CaseResult] = []
    with httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s) as client:
        for request in requests:
            result = judge(request, send(client, request, timeout_s), special_ids)
            results.append(result)
            if on_case is not None:
                on_case(result)
    return summarise(results, time.monotonic() - started)
