"""The verdict on one answer: every rule it must pass (HTTP 200, finite logprobs, token ids that are words,
text when tokens were generated, a long prompt that was long), and the report over all the cases. Pure:
an `Exchange` in, a `CaseResult` out, testable without a server."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from deploykit.smoke.bodies import excerpt
from deploykit.smoke.models import (
    FIRST_IDS_KEPT,
    CaseResult,
    ChatAnswer,
    CompletionAnswer,
    Exchange,
    SmokeReport,
    SmokeRequest,
)

OUT_OF_RANGE_HINTS = ("out of range float", "not json compliant")


UNKNOWN_VOCAB_BOUND = 2**31
"""The token id bound when the model's vocabulary size is not known: vLLM holds token ids as int32, so no
model it serves can emit an id at or past 2**31 (nor a negative one). With the model's config.json at hand
(`tokens.vocab_size`) the bound is its vocabulary."""


@dataclass
class _Answer:
    """The parts of a completion or chat answer the rules read, validated (`models.CompletionAnswer`)."""

    token_ids: list[int] | None
    text: str | None
    finish_reason: str | None
    logprobs: list[float | None] = field(default_factory=list)
    chosen: int | None = None
    """How many generated tokens came with their own logprob; None: the answer has no logprobs."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def _parse_answer(endpoint: str, body: dict[str, Any]) -> _Answer:
    """Raises pydantic's ValidationError for an answer not shaped (and typed) like an OpenAI one."""
    values: list[float | None] = []
    chosen: int | None = None
    if endpoint == "/v1/chat/completions":
        chat = ChatAnswer.model_validate(body)
        choice, usage = chat.choices[0], chat.usage
        text = choice.message.content if choice.message is not None else None
        if choice.logprobs is not None and choice.logprobs.content is not None:
            entries = choice.logprobs.content
            chosen = sum(1 for entry in entries if entry.logprob is not None)
            for entry in entries:
                values.append(entry.logprob)
                values.extend(top.logprob for top in entry.top_logprobs or [])
        return _Answer(
            token_ids=choice.token_ids,
            text=text,
            finish_reason=choice.finish_reason,
            logprobs=values,
            chosen=chosen,
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
        )
    completion = CompletionAnswer.model_validate(body)
    one, usage = completion.choices[0], completion.usage
    if one.logprobs is not None and one.logprobs.token_logprobs is not None:
        values.extend(one.logprobs.token_logprobs)
        chosen = sum(1 for value in one.logprobs.token_logprobs if value is not None)
    if one.logprobs is not None:
        for top in one.logprobs.top_logprobs or []:
            values.extend((top or {}).values())
    return _Answer(
        token_ids=one.token_ids,
        text=one.text,
        finish_reason=one.finish_reason,
        logprobs=values,
        chosen=chosen,
        prompt_tokens=usage.prompt_tokens if usage else None,
        completion_tokens=usage.completion_tokens if usage else None,
    )


def first_error(exc: ValidationError) -> str:
    """A validation error in one line: where in the answer, what is wrong, what came."""
    errors = exc.errors()
    if not errors:
        return str(exc).splitlines()[0]
    error = errors[0]
    where = ".".join(str(part) for part in error["loc"]) or "the answer"
    shown = excerpt(repr(error.get("input")), 60)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {error['msg'].lower()}, got {shown}{more}"


def asked_for_logprobs(request: SmokeRequest) -> bool:
    """The request asked for the chosen tokens' logprobs (completions: `logprobs` N; chat: true)."""
    asked = request.body.get("logprobs")
    return asked is not None and asked is not False


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
    if any(hint in message.lower() for hint in OUT_OF_RANGE_HINTS):
        return (
            f"HTTP {code}: the server could not encode its answer because float values are out of range "
            f"({message}): the model produced NaN or infinite numbers"
        )
    hint = {
        400: " (the server refused the request: a prompt longer than its --max-model-len, or a parameter it "
        "does not take)",
        401: " (the API key is missing or wrong)",
        403: " (the API key is not allowed here)",
        404: " (the served model or adapter name is not what the server serves)",
    }.get(code or 0, "")
    return f"HTTP {code}{hint}: {message}"


def judge(
    request: SmokeRequest,
    exchange: Exchange,
    special_ids: frozenset[int] = frozenset(),
    vocab_size: int | None = None,
) -> CaseResult:
    """Every rule one answer must pass; all problems found, most fundamental first. Never raises: an answer
    that cannot be judged is a failed case that says why."""
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
    if exchange.too_big is not None:
        result.diagnosis = f"the answer cannot be judged: {exchange.too_big}"
        return result
    if exchange.status_code != 200:
        result.diagnosis = http_problem(exchange)
        busy = (exchange.status_code or 0) >= 500 or exchange.status_code == 429
        result.miss = busy and not any(hint in result.diagnosis.lower() for hint in OUT_OF_RANGE_HINTS)
        return result
    body = exchange.body
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list) or not body["choices"]:
        result.diagnosis = f"the answer has no choices: {excerpt(exchange.raw_text, 200)!r}"
        return result
    try:
        answer = _parse_answer(request.endpoint, body)
    except ValidationError as exc:
        result.diagnosis = (
            f"the answer is not a well-formed OpenAI {request.endpoint} answer: {first_error(exc)}"
        )
        return result

    ids = answer.token_ids or []
    bound = vocab_size if vocab_size is not None else UNKNOWN_VOCAB_BOUND
    impossible = [i for i in ids if not 0 <= i < bound]
    result.first_ids = [] if impossible else ids[:FIRST_IDS_KEPT]
    result.finish_reason = answer.finish_reason
    result.text = answer.text[:200] if answer.text is not None else None
    result.prompt_tokens = answer.prompt_tokens
    result.completion_tokens = answer.completion_tokens if answer.completion_tokens is not None else len(ids)
    if exchange.latency_s > 0 and result.completion_tokens:
        result.tokens_per_s = round(result.completion_tokens / exchange.latency_s, 2)

    problems: list[str] = []
    if impossible:
        where = (
            f"the model's vocabulary of {vocab_size}" if vocab_size is not None else "vLLM's int32 token ids"
        )
        shown = excerpt(str(impossible[0]), 40)
        problems.append(
            f"{len(impossible)} generated token id(s) are impossible (e.g. {shown}): "
            f"outside 0..{bound - 1}, {where}"
        )
    if asked_for_logprobs(request) and ids and answer.chosen is None:
        problems.append(
            "the answer has no logprobs though the request asked for them (a proxy or gateway that drops "
            "them?): the NaN rule cannot be checked"
        )
    elif asked_for_logprobs(request) and answer.chosen is not None and answer.chosen < len(ids):
        problems.append(
            f"logprobs came for {answer.chosen} of {len(ids)} generated tokens: the NaN rule cannot check "
            "the rest"
        )
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
    problems += wrong_answer(request, answer.text, ids)
    result.passed = not problems
    result.diagnosis = "; ".join(problems)
    return result


def wrong_answer(request: SmokeRequest, text: str | None, ids: Sequence[int]) -> list[str]:
    """A known answer that did not come: one line with what was expected and what came (shortened)."""
    problems = []
    if request.expect_substring is not None and request.expect_substring not in (text or ""):
        problems.append(f"expected {request.expect_substring!r} in the text, got {(text or '')[:80]!r}")
    expected = request.expect_ids
    if expected is not None and list(ids[: len(expected)]) != list(expected):
        shown = list(ids[: max(len(expected), 1)][:FIRST_IDS_KEPT])
        problems.append(
            f"expected ids {list(expected)[:FIRST_IDS_KEPT]} first, got {shown} ({(text or '')[:60]!r})"
        )
    return problems


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
