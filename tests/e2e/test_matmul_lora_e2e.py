"""Matmul LoRA fix end to end: a real vLLM (CPU build) serving LoRA through deploykit's matmul path.

Three servers, one each per module: the tiny Llama with two local adapters and the fix forced on
(DEPLOYKIT_FIXES=matmul_lora); the same LoRA server without the fix (stock vLLM); and the model with
adapter alpha merged into its weights, served without LoRA. With the fix, greedy ids equal the
merged model's for a long prompt (> 400 tokens) then a short one, and a base-model request batched
with both adapters equals the base model alone. Without the fix, vLLM 0.32's CPU punica path indexes
the adapter stack with the "no adapter" id -1, so that base request gets the last slot's adapter.
References not served (adapter beta merged, the bare base model) come from transformers in-process.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from pydantic import BaseModel

from tests.e2e.batch_gate import GATE_KEY
from tests.e2e.lora_models import AdapterRecipe, build_adapter, build_merged_model
from tests.vllm_harness import REPO, RunningServer, running_vllm, tiny_serve_args

pytestmark = pytest.mark.e2e

RANK = 8
MAX_TOKENS = 16
ADAPTER_TOKENS = 48  # how much of each adapter's output is compared with its reference
MAX_MODEL_LEN = 1024  # the tiny model's max_position_embeddings
LOGPROB_TOLERANCE = 1e-3  # FP32 end to end: LoRA-on-the-fly vs merged weights differ by rounding only
ALPHA = AdapterRecipe(seed=1, rank=RANK, std=0.5)
BETA = AdapterRecipe(seed=2, rank=RANK, std=0.5)
CPU_TARGET = "vllm.lora.punica_wrapper.punica_cpu.PunicaWrapperCPU.add_lora_linear"
# The LoRA servers schedule with the test-only GatedScheduler, so a mixed batch is a fact of scheduling.
GATED_SCHEDULER = ["--scheduler-cls", "tests.e2e.batch_gate.GatedScheduler"]
GATED_ENV = {"PYTHONPATH": str(REPO)}
_batch_numbers = itertools.count()


class Generation(BaseModel):
    token_ids: list[int]
    logprobs: list[float]


class LoraArtifacts(BaseModel):
    base: Path
    alpha_adapter: Path
    beta_adapter: Path
    alpha_merged: Path
    beta_merged: Path


def prompt_ids(length: int, seed: int) -> list[int]:
    """Token ids (not text), so every server and the in-process reference see the same prompt."""
    rng = random.Random(seed)
    return [rng.randrange(8, 500) for _ in range(length)]  # 0-7 are special; the tiny vocab has 548


LONG_PROMPT = prompt_ids(450, seed=5)
SHORT_PROMPT = prompt_ids(12, seed=6)
BATCH_PROMPT = prompt_ids(40, seed=7)


def request_body(
    model: str, prompt: list[int], max_tokens: int, xargs: dict[str, str] | None = None
) -> dict[str, object]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": 1,
        "return_token_ids": True,
        **({"vllm_xargs": xargs} if xargs else {}),
    }


def generate(
    server: RunningServer,
    model: str,
    prompt: list[int],
    max_tokens: int = MAX_TOKENS,
    xargs: dict[str, str] | None = None,
) -> Generation:
    with server.client() as client:
        response = client.post("/v1/completions", json=request_body(model, prompt, max_tokens, xargs))
    response.raise_for_status()
    choice = response.json()["choices"][0]
    return Generation(token_ids=choice["token_ids"], logprobs=choice["logprobs"]["token_logprobs"])


class MixedBatch(BaseModel):
    alpha: Generation
    beta: Generation
    base: Generation


def run_mixed_batch(server: RunningServer, prompt: list[int]) -> MixedBatch:
    """Adapters alpha and beta and the base model, prefilled in one step and decoded side by side.

    The server's GatedScheduler (tests/e2e/batch_gate.py) holds the three requests until all have arrived,
    so they share every step from prefill until the base request's last token (the adapters ask for more
    tokens than the base): the batch mixes by construction, whatever order the threads send in.
    """
    group = f"mixed-{next(_batch_numbers)}:3"
    budgets = {"alpha": ADAPTER_TOKENS, "beta": ADAPTER_TOKENS, "tiny": MAX_TOKENS}
    with ThreadPoolExecutor(max_workers=len(budgets)) as pool:
        futures = {
            model: pool.submit(generate, server, model, prompt, max_tokens, {GATE_KEY: group})
            for model, max_tokens in budgets.items()
        }
        results = {model: future.result(timeout=300) for model, future in futures.items()}
    return MixedBatch(alpha=results["alpha"], beta=results["beta"], base=results["tiny"])


def assert_same_generation(got: Generation, reference: Generation, what: str) -> None:
    assert got.token_ids == reference.token_ids, f"{what}: greedy ids differ"
    assert all(math.isfinite(v) for v in got.logprobs), f"{what}: non-finite logprob {got.logprobs}"
    worst = max(abs(a - b) for a, b in zip(got.logprobs, reference.logprobs, strict=True))
    assert worst < LOGPROB_TOLERANCE, f"{what}: logprobs differ by up to {worst}"


def hf_generate(model_dir: Path, prompt: list[int], max_tokens: int) -> Generation:
    """Greedy ids and their logprobs from transformers in this process (FP32): an unserved reference."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    step_input, cache = torch.tensor([prompt]), None
    ids: list[int] = []
    logprobs: list[float] = []
    with torch.no_grad():
        for _ in range(max_tokens):
            out = model(step_input, past_key_values=cache, use_cache=True)
            log_softmax = torch.log_softmax(out.logits[0, -1].double(), dim=-1)
            next_id = int(log_softmax.argmax())
            ids.append(next_id)
            logprobs.append(float(log_softmax[next_id]))
            step_input, cache = torch.tensor([[next_id]]), out.past_key_values
    return Generation(token_ids=ids, logprobs=logprobs)


@pytest.fixture(scope="module")
def artifacts(tiny_model_dir: Path) -> LoraArtifacts:
    return LoraArtifacts(
        base=tiny_model_dir,
        alpha_adapter=build_adapter(tiny_model_dir, ALPHA),
        beta_adapter=build_adapter(tiny_model_dir, BETA),
        alpha_merged=build_merged_model(tiny_model_dir, ALPHA),
        beta_merged=build_merged_model(tiny_model_dir, BETA),
    )


def lora_serve_args(artifacts: LoraArtifacts) -> list[str]:
    return [
        *tiny_serve_args(artifacts.base, max_model_len=MAX_MODEL_LEN),
        "--enable-lora",
        "--max-lora-rank",
        str(RANK),
        "--max-loras",
        "2",
        "--lora-modules",
        f"alpha={artifacts.alpha_adapter}",
        f"beta={artifacts.beta_adapter}",
        *GATED_SCHEDULER,
    ]


@contextmanager
def warmed_up(server: RunningServer) -> Iterator[RunningServer]:
    # The first request with logprobs compiles a helper (10-20 s here); keep it out of the checks.
    generate(server, "tiny", SHORT_PROMPT)
    yield server


@pytest.fixture(scope="module")
def fixed_server(artifacts: LoraArtifacts) -> Iterator[RunningServer]:
    with (
        running_vllm(
            lora_serve_args(artifacts), env={**GATED_ENV, "DEPLOYKIT_FIXES": "matmul_lora"}
        ) as server,
        warmed_up(server),
    ):
        yield server


@pytest.fixture(scope="module")
def stock_server(artifacts: LoraArtifacts) -> Iterator[RunningServer]:
    with running_vllm(lora_serve_args(artifacts), env=GATED_ENV) as server, warmed_up(server):
        yield server


@pytest.fixture(scope="module")
def alpha_merged_server(artifacts: LoraArtifacts) -> Iterator[RunningServer]:
    with running_vllm(tiny_serve_args(artifacts.alpha_merged)) as server, warmed_up(server):
        yield server


@pytest.fixture(scope="module")
def references(artifacts: LoraArtifacts, alpha_merged_server: RunningServer) -> MixedBatch:
    """What each model of the mixed batch must produce on BATCH_PROMPT."""
    return MixedBatch(
        alpha=generate(alpha_merged_server, "tiny", BATCH_PROMPT, ADAPTER_TOKENS),
        beta=hf_generate(artifacts.beta_merged, BATCH_PROMPT, ADAPTER_TOKENS),
        base=hf_generate(artifacts.base, BATCH_PROMPT, MAX_TOKENS),
    )


def test_plugin_applied_the_fix_to_the_cpu_wrapper(fixed_server: RunningServer) -> None:
    log = fixed_server.process.log_path.read_text(errors="replace")
    applied = [line for line in log.splitlines() if "deploykit: applied fix matmul_lora" in line]
    assert applied, "the plugin never logged the matmul_lora patch"
    assert all(CPU_TARGET in line for line in applied), applied


def test_long_prompt_then_short_prompt_match_the_merged_model(
    fixed_server: RunningServer, alpha_merged_server: RunningServer
) -> None:
    long_lora = generate(fixed_server, "alpha", LONG_PROMPT)
    short_lora = generate(fixed_server, "alpha", SHORT_PROMPT)
    assert_same_generation(long_lora, generate(alpha_merged_server, "tiny", LONG_PROMPT), "long prompt")
    assert_same_generation(short_lora, generate(alpha_merged_server, "tiny", SHORT_PROMPT), "short prompt")
    # The adapter must matter, or the equality above would hold for a no-op LoRA path too.
    assert long_lora.token_ids != generate(fixed_server, "tiny", LONG_PROMPT).token_ids
    assert short_lora.token_ids != generate(fixed_server, "tiny", SHORT_PROMPT).token_ids


def test_mixed_batch_with_the_fix_matches_every_reference(
    fixed_server: RunningServer, references: MixedBatch
) -> None:
    batch = run_mixed_batch(fixed_server, BATCH_PROMPT)
    assert_same_generation(batch.alpha, references.alpha, "alpha in the batch vs merged alpha (served)")
    assert_same_generation(batch.beta, references.beta, "beta in the batch vs merged beta (transformers)")
    assert_same_generation(batch.base, references.base, "base in the batch vs base (transformers)")
    assert_same_generation(
        batch.base, generate(fixed_server, "tiny", BATCH_PROMPT), "base in the batch vs alone"
    )
    # Three different models answered: a path that applied one adapter to every row would fail above.
    assert len({tuple(g.token_ids[:MAX_TOKENS]) for g in (batch.alpha, batch.beta, batch.base)}) == 3


def test_mixed_batch_without_the_fix_gives_the_base_request_an_adapter(
    stock_server: RunningServer, references: MixedBatch
) -> None:
    """Stock vLLM 0.32 CPU path: weights[-1] for "no adapter" rows is the last slot, not nothing."""
    batch = run_mixed_batch(stock_server, BATCH_PROMPT)
    # The adapters themselves are right on the stock path...
    assert_same_generation(batch.alpha, references.alpha, "stock: alpha in the batch")
    assert_same_generation(batch.beta, references.beta, "stock: beta in the batch")
    # ...the base request alone is right too (a batch without adapters skips LoRA entirely)...
    assert_same_generation(generate(stock_server, "tiny", BATCH_PROMPT), references.base, "stock: base alone")
    # ...but batched with adapters it is answered by one of them.
    assert batch.base.token_ids != references.base.token_ids
    adapters = (batch.alpha.token_ids[:MAX_TOKENS], batch.beta.token_ids[:MAX_TOKENS])
    assert batch.base.token_ids in adapters, "expected the adapter in the last slot to answer"
