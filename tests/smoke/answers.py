"""Answers shaped like vLLM's (0.32) for the smoke's tests: a completion, a chat answer, a 200 exchange."""

from __future__ import annotations

import json
from typing import Any

from deploykit.smoke import Exchange


def completion_body(
    ids: list[int] | None = None,
    text: str | None = " a small dog",
    finish: str = "length",
    logprobs: list[float] | None = None,
    prompt_tokens: int = 5,
) -> dict[str, Any]:
    ids = [47, 76, 83, 274] if ids is None else ids
    values = [-1.5] * len(ids) if logprobs is None else logprobs
    return {
        "object": "text_completion",
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": {
                    "tokens": ["x"] * len(values),
                    "token_logprobs": values,
                    "top_logprobs": [{"x": v} for v in values],
                },
                "finish_reason": finish,
                "token_ids": ids,
                "prompt_token_ids": [5, 6, 7],
            }
        ],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids) if ids else 0},
    }


def chat_body(
    ids: list[int] | None = None, content: str | None = "Sunny.", logprob: float = -0.7
) -> dict[str, Any]:
    ids = [300, 301, 302] if ids is None else ids
    entries = [{"token": "x", "logprob": logprob, "top_logprobs": [{"token": "x", "logprob": logprob}]}]
    return {
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "logprobs": {"content": entries * len(ids)},
                "finish_reason": "length",
                "token_ids": ids,
            }
        ],
        "prompt_token_ids": [5, 47, 80],
        "usage": {"prompt_tokens": 3, "completion_tokens": len(ids)},
    }


def ok(body: Any, latency: float = 0.5) -> Exchange:
    return Exchange(status_code=200, body=body, raw_text=json.dumps(body), latency_s=latency)
