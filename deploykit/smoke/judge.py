"""The verdict on one answer: every rule it must pass (HTTP 200, finite logprobs, token ids that are words,
text when tokens were generated, a long prompt that was long), and the report over all the cases. Pure:
an `Exchange` in, a `CaseResult` out, testable without a server."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from deploykit.smoke.bodies import excerpt
from deploykit.smoke.models import FIRST_IDS_KEPT, CaseResult, Exchange, SmokeReport, SmokeRequest

_OUT_OF_RANGE_HINTS = ("out of range float", "not json compliant")


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
    return excerpt(exchange.raw_text, 300) or "(empty body)"


def http_problem(exchange: Exchange) -> str:
    """An HTTP error answer in words; an answer vLLM could not encode (NaN, Inf) says so."""
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
        result.diagnosis = http_problem(exchange)
        busy = (exchange.status_code or 0) >= 500 or exchange.status_code == 429
        result.miss = busy and not any(hint in result.diagnosis.lower() for hint in _OUT_OF_RANGE_HINTS)
        return result
    body = exchange.body
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
        result.diagnosis = f"the answer has no choices: {excerpt(exchange.raw_text, 200)!r}"
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
    warnings = [r for r in results if r.warning]
    if warnings:
        diagnosis += " | warnings: " + " | ".join(f"{r.name}: {r.warning}" for r in warnings)
    return SmokeReport(passed=not failed, diagnosis=diagnosis, cases=list(results), elapsed_s=elapsed_s)
