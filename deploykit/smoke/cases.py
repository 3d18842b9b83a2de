"""Which requests a smoke sends: a profile's cases (its own, or the ones its settings call for) turned into
exact request bodies, greedy with token ids and logprobs on so that every rule has something to read. Pure:
no server, no HTTP.

Consistency cases (`repeat`, `long_then_short`, `prefix_cache`, `batch`) are groups of requests whose
answers must agree (deploykit.smoke.consistency judges them).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from deploykit.smoke.image import smoke_image_data_url
from deploykit.smoke.models import Endpoint, SmokeRequest

if TYPE_CHECKING:
    from deploykit.profile.schema import Profile, SmokeCase, SmokeKind

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
# Consistency cases: a long prompt of this many tokens, or fewer when max_model_len has no room for it.
LONG_PROMPT_TOKENS = 512
# The long prompts are token ids, so their length is exact whatever the tokenizer. Ids 128..255 are
# ordinary tokens in every vocabulary deploykit serves: byte tokens in byte-level BPE (Llama 3, Qwen, the
# tiny demo model, whose vocabulary has only ~550 ids), byte fallbacks in SentencePiece (Mistral), plain
# pieces after Gemma's reserved ids; specials sit below 128 or at the vocabulary's end.
_LONG_ID_BASE = 128
_LONG_ID_SPAN = 128
CONSISTENCY_TOP_LOGPROBS = 2


def derive_cases(profile: Profile) -> list[SmokeCase]:
    """The profile's own cases, or the ones its settings call for."""
    from deploykit.profile.schema import SmokeCase

    max_model_len = profile.serve.max_model_len
    known = [answer.as_case() for answer in profile.smoke.known_answers]
    if profile.smoke.cases is not None:
        return [_sized(case, max_model_len) for case in [*profile.smoke.cases, *known]]
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
    # A known answer is a completion or chat case with its expectation: deploykit.profile.schema.KnownAnswer.
    return [_sized(case, max_model_len) for case in [*cases, *known]]


def long_prompt_tokens(max_model_len: int | None, max_tokens: int) -> int:
    """The long prompt's length: 512 tokens, fewer only when max_model_len leaves no room for them and the
    answer. Never more: what the long cases detect needs a length, not the whole context (see
    deploykit.canary.rotation)."""
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


def requests_for_profile(
    profile: Profile,
    cases: Sequence[SmokeCase] | None = None,
    *,
    served_name: str | None = None,
) -> list[SmokeRequest]:
    """The requests of `cases` (default: the profile's) as the profile's server is asked: under its served
    name (or `served_name`), a LoRA case with no adapter of its own on the profile's first adapter."""
    return smoke_requests(
        derive_cases(profile) if cases is None else cases,
        served_name or profile.served_name,
        first_adapter(profile),
    )


def first_adapter(profile: Profile) -> str | None:
    """The adapter a LoRA case names when it names none: the profile's first."""
    return next(iter(profile.serve.lora.adapters), None)


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
    expect_ids = tuple(case.expect_ids) if case.expect_ids is not None else None
    if kind in ("repeat", "long_then_short", "prefix_cache", "batch"):
        yield from _consistency_requests(case, case.adapter or served_name, salt)
        return
    if kind == "completion":
        prompt = case.prompt or DEFAULT_PROMPTS["completion"]
        body = _completion(served_name, prompt, case.max_tokens)
        yield SmokeRequest(case.name or kind, kind, "/v1/completions", body, expect, expect_ids=expect_ids)
    elif kind == "chat":
        prompt = case.prompt or DEFAULT_PROMPTS["chat"]
        body = _chat(served_name, prompt, case.max_tokens)
        yield SmokeRequest(
            case.name or kind, kind, "/v1/chat/completions", body, expect, expect_ids=expect_ids
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
