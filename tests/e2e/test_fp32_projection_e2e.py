"""End to end: a BF16 Gemma4 Unified checkpoint served in FP16 by the real vLLM (CPU build), image request.

Two servers (the budget allows three): without the fix the image's embeddings are NaN, every logit is
NaN and greedy decoding emits token id 0 behind HTTP 200, as in the field report; with
DEPLOYKIT_FIXES=fp32_projection the same request yields finite logprobs and ordinary tokens.
Both launches are the plans `deploykit plan` makes for a `serve.dtype: float16` profile against recorded
GPU facts (issue 35): the same fix and environment whatever the GPU, T4, A100 or H100, because the engine
computes in FP16 on all of them; the server without the fix runs the same plan with the fix turned off.
The checkpoint is tiny and built here (tests/gemma4_models.py); see that module for torchvision.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deploykit.plan import Plan, make_plan
from deploykit.probe.load import load_facts
from deploykit.profile.load import load_profile
from tests.gemma4_models import tiny_gemma4_unified_dir, torchvision_server_env
from tests.vllm_harness import REPO, RunningServer, running_vllm

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


FACTS_DIR = REPO / "tests" / "fixtures" / "facts"
GPU_FACTS = ("t4", "a100", "h100")  # no native BF16, and two that have it


@pytest.fixture(scope="module")
def gemma4_model() -> Path:
    return tiny_gemma4_unified_dir()


def fp16_plan(model: Path, facts: str, folder: Path, fix_mode: str = "auto") -> Plan:
    """`deploykit plan` for the tiny model with serve.dtype float16 on recorded GPU facts (a CUDA profile:
    the facts decide as they would on that GPU); the checkpoint dtype comes from its config.json."""
    args = fp16_serve_args(model)
    extra = args[args.index("--limit-mm-per-prompt") : args.index("--max-num-seqs")]
    profile = folder / f"fp16-{facts}-{fix_mode}.yaml"
    profile.write_text(
        "name: gemma4-fp16-e2e\n"
        "vllm_version: 0.32.0\n"
        f"model: {{source: {model}, served_name: {SERVED_NAME}}}\n"
        "serve:\n  dtype: float16\n  max_model_len: 256\n  enforce_eager: true\n"
        "  kv_cache_memory_bytes: 64M\n  generation_config: vllm\n  max_num_seqs: 4\n"
        f"  extra_args: {extra!r}\n"
        f'fixes: {{fp32_projection: "{fix_mode}"}}\n'
    )
    return make_plan(load_profile(str(profile)), load_facts(str(FACTS_DIR / f"{facts}.json")))


def planned_launch(plan: Plan) -> tuple[list[str], dict[str, str]]:
    """The plan's `vllm serve` arguments (the harness adds host and port) and the environment it sets."""
    assert plan.argv[:2] == ["vllm", "serve"] and not plan.errors, plan.errors
    return plan.argv[2:], {**torchvision_server_env(), **plan.env}


def test_every_gpus_plan_enables_the_fix_with_the_same_launch(gemma4_model: Path, tmp_path: Path) -> None:
    """So the one server below stands for each of them."""
    plans = {facts: fp16_plan(gemma4_model, facts, tmp_path) for facts in GPU_FACTS}
    for facts, plan in plans.items():
        [decision] = [f for f in plan.fixes if f.name == "fp32_projection"]
        assert decision.decision.value == "enabled", (facts, decision.reason)
        assert "float16 compute (serve.dtype float16" in decision.reason
    launches = {facts: planned_launch(plan) for facts, plan in plans.items()}
    assert len({repr(launch) for launch in launches.values()}) == 1
    args, env = launches["h100"]
    assert env["DEPLOYKIT_FIXES"] == "fp32_projection"
    assert args[args.index("--dtype") + 1] == "float16"


@pytest.fixture(scope="module")
def server_without_fix(
    gemma4_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    plan = fp16_plan(gemma4_model, "h100", tmp_path_factory.mktemp("plans"), fix_mode="off")
    args, env = planned_launch(plan)
    assert "DEPLOYKIT_FIXES" not in env
    with running_vllm(args, served_name=SERVED_NAME, env=env) as s:
        yield s


@pytest.fixture(scope="module")
def server_with_fix(gemma4_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # The A100's plan: native BF16, where the rule before issue 35 said "not needed".
    args, env = planned_launch(fp16_plan(gemma4_model, "a100", tmp_path_factory.mktemp("plans")))
    assert env["DEPLOYKIT_FIXES"] == "fp32_projection"
    with running_vllm(args, served_name=SERVED_NAME, env=env) as server:
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
