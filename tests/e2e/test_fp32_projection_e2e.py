"""End to end: a BF16 Gemma4 Unified checkpoint served in FP16 by the real vLLM (CPU build), image request.

Two servers (the budget allows three): without the fix the image's embeddings are NaN, every logit is
NaN and greedy decoding emits token id 0 behind HTTP 200, as in the field report; with
DEPLOYKIT_FIXES=fp32_projection the same request yields finite logprobs and ordinary tokens.
The checkpoint is tiny and built here (tests/e2e/gemma4_models.py); see that module for torchvision.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.gemma4_models import tiny_gemma4_unified_dir, torchvision_server_env
from tests.vllm_harness import RunningServer, running_vllm

pytestmark = pytest.mark.e2e

SERVED_NAME = "tiny-gemma4-unified"
MAX_TOKENS = 12


def fp16_serve_args(model: Path) -> list[str]:
    return [
        str(model),
        "--served-model-name",
        SERVED_NAME,
        "--dtype",
        "float16",  # what vLLM falls back to for a BF16 checkpoint on a GPU without BF16
        "--max-model-len",
        "256",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        "64M",
        "--generation-config",
        "vllm",
        "--limit-mm-per-prompt",
        '{"image": 1, "audio": 0, "video": 0}',
        "--max-num-seqs",
        "4",
    ]


@pytest.fixture(scope="module")
def gemma4_model() -> Path:
    return tiny_gemma4_unified_dir()


@pytest.fixture(scope="module")
def server_without_fix(gemma4_model: Path) -> Iterator[RunningServer]:
    with running_vllm(
        fp16_serve_args(gemma4_model), served_name=SERVED_NAME, env=torchvision_server_env()
    ) as s:
        yield s


@pytest.fixture(scope="module")
def server_with_fix(gemma4_model: Path) -> Iterator[RunningServer]:
    env = {**torchvision_server_env(), "DEPLOYKIT_FIXES": "fp32_projection"}
    with running_vllm(fp16_serve_args(gemma4_model), served_name=SERVED_NAME, env=env) as server:
        yield server


def image_data_url() -> str:
    """A 64x64 PNG with a gradient and a disc: 64 soft tokens for this checkpoint."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (64, 64))
    image.putdata([(4 * x, 4 * y, 128) for y in range(64) for x in range(64)])
    ImageDraw.Draw(image).ellipse((16, 16, 44, 44), fill=(250, 200, 10))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def post_image_request(server: RunningServer, *, logprobs: bool, sampled: bool = False) -> Any:
    """One chat request with an image asking for token ids (and logprobs if asked); greedy unless
    `sampled`, then temperature 1 with a fixed seed."""
    body = {
        "model": SERVED_NAME,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": image_data_url()}},
                    {"type": "text", "text": "What is in the picture?"},
                ],
            }
        ],
        "max_tokens": MAX_TOKENS,
        "temperature": 1.0 if sampled else 0,
        **({"seed": 1234} if sampled else {}),
        "return_token_ids": True,
        **({"logprobs": True, "top_logprobs": 1} if logprobs else {}),
    }
    with server.client(timeout=300) as client:
        return client.post("/v1/chat/completions", json=body)


def ask_about_image(server: RunningServer) -> dict[str, Any]:
    """Generated ids, their logprobs and the prompt ids of one image request."""
    response = post_image_request(server, logprobs=True)
    assert response.status_code == 200, response.text
    payload = response.json()
    choice = payload["choices"][0]
    return {
        "token_ids": list(choice["token_ids"]),
        "logprobs": [entry["logprob"] for entry in choice["logprobs"]["content"]],
        "prompt_token_ids": list(payload.get("prompt_token_ids") or []),
        "finish_reason": choice["finish_reason"],
    }


def test_without_fix_image_request_returns_only_token_0_and_non_finite_logprobs(
    server_without_fix: RunningServer,
) -> None:
    response = post_image_request(server_without_fix, logprobs=False)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    token_ids = list(choice["token_ids"])
    prompt_ids = list(response.json().get("prompt_token_ids") or [])
    print(f"\nwithout fix: HTTP 200, token_ids={token_ids}, finish_reason={choice['finish_reason']}")
    assert len(prompt_ids) > 64  # the image expanded into its soft tokens
    assert token_ids == [0] * MAX_TOKENS and choice["finish_reason"] == "length"
    # Asking for logprobs exposes the NaN scores: they are not even JSON-encodable.
    with_logprobs = post_image_request(server_without_fix, logprobs=True)
    print(f"without fix, logprobs asked: HTTP {with_logprobs.status_code} {with_logprobs.text[:120]}")
    if with_logprobs.status_code == 200:
        values = [e["logprob"] for e in with_logprobs.json()["choices"][0]["logprobs"]["content"]]
        assert not all(math.isfinite(v) for v in values)
    else:
        assert "Out of range float values are not JSON compliant" in with_logprobs.text
    # Sampling does not help: a distribution made of NaN still collapses onto id 0.
    sampled = post_image_request(server_without_fix, logprobs=False, sampled=True)
    assert sampled.status_code == 200, sampled.text
    assert list(sampled.json()["choices"][0]["token_ids"]) == [0] * MAX_TOKENS
    assert "deploykit: applied fix" not in server_without_fix.process.log_path.read_text()


def test_with_fix_image_request_returns_finite_varied_tokens(server_with_fix: RunningServer) -> None:
    result = ask_about_image(server_with_fix)
    print(f"\nwith fix: token_ids={result['token_ids']} logprobs={result['logprobs'][:4]}...")
    assert len(result["prompt_token_ids"]) > 64
    assert all(math.isfinite(value) for value in result["logprobs"])
    # The scores are real numbers again and decoding no longer collapses onto id 0: normal, varied ids.
    assert set(result["token_ids"]) != {0}
    assert len(set(result["token_ids"])) > 3
    assert result["finish_reason"] == "length"
    # Sampled from the now finite distribution, the same request gives varied ids.
    sampled = post_image_request(server_with_fix, logprobs=False, sampled=True)
    assert sampled.status_code == 200, sampled.text
    sampled_ids = list(sampled.json()["choices"][0]["token_ids"])
    print(f"with fix, sampled: token_ids={sampled_ids}")
    assert len(set(sampled_ids)) > 3
    log = server_with_fix.process.log_path.read_text()
    assert "deploykit: applied fix fp32_projection to vllm.model_executor.models.gemma4_unified" in log
