"""device_penalties end to end: the real vLLM (CPU build, V1 runner) gives the same greedy token ids for
concurrent requests with mixed penalties with the fix as without it.

One extra vLLM start: the plain server is the session's shared `tiny_vllm`; the fixed one runs with
DEPLOYKIT_FIXES=device_penalties and `--logits-processors deploykit.fixes.penalties:DevicePenaltiesProcessor`.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from deploykit.fixes import penalties
from tests.vllm_harness import RunningServer, running_vllm, tiny_serve_args

pytestmark = pytest.mark.e2e

MAX_TOKENS = 40
PROMPTS = [
    "Once upon a time",
    "The quick brown fox",
    "Penalties change only the logits",
    "A deployment that answers",
    "0123456789",
    "LoRA adds a low-rank update",
    "vLLM serves large language models",
    "Compute capability 7.5",
    "There was a small model",
    "Hello there",
    "paged attention and continuous batching",
    "no words is not healthy",
]
# (repetition, frequency, presence): every kind, mixed within one batch, plus rows without penalties.
PENALTIES = [
    (1.0, 0.0, 0.0),
    (1.3, 0.0, 0.0),
    (2.0, 0.0, 0.0),
    (0.7, 0.0, 0.0),
    (1.0, 0.8, 0.0),
    (1.0, -0.5, 0.0),
    (1.0, 0.0, 1.2),
    (1.0, 0.0, -0.6),
    (1.2, 0.5, 0.5),
    (1.5, 1.5, 1.0),
    (1.0, 0.0, 0.0),
    (1.1, 0.3, -0.3),
]


@pytest.fixture(scope="module")
def fixed_vllm(tiny_model_dir: Path) -> Iterator[RunningServer]:
    args = [*tiny_serve_args(tiny_model_dir), "--logits-processors", penalties.PROCESSOR]
    with running_vllm(args, env={"DEPLOYKIT_FIXES": penalties.NAME}) as server:
        yield server


def completion(server: RunningServer, prompt: str, penalty: tuple[float, float, float]) -> list[int]:
    repetition, frequency, presence = penalty
    return server.completion_ids(
        prompt,
        max_tokens=MAX_TOKENS,
        repetition_penalty=repetition,
        frequency_penalty=frequency,
        presence_penalty=presence,
        ignore_eos=True,
    )


def concurrent_ids(server: RunningServer, penalty_rows: list[tuple[float, float, float]]) -> list[list[int]]:
    """All requests at once, so the server batches rows with different penalties together."""
    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        futures = [
            pool.submit(completion, server, p, pen) for p, pen in zip(PROMPTS, penalty_rows, strict=True)
        ]
        return [f.result() for f in futures]


@pytest.fixture(scope="module")
def results(tiny_vllm: RunningServer, fixed_vllm: RunningServer) -> dict[str, Any]:
    no_penalties = [(1.0, 0.0, 0.0)] * len(PROMPTS)
    return {
        "plain": concurrent_ids(tiny_vllm, PENALTIES),
        "plain_unpenalised": concurrent_ids(tiny_vllm, no_penalties),
        "fixed": concurrent_ids(fixed_vllm, PENALTIES),
        "fixed_unpenalised": concurrent_ids(fixed_vllm, no_penalties),
        "fixed_again": concurrent_ids(fixed_vllm, list(reversed(PENALTIES))),
        "plain_again": concurrent_ids(tiny_vllm, list(reversed(PENALTIES))),
    }


def test_same_token_ids_with_and_without_the_fix(results: dict[str, Any]) -> None:
    assert len(results["fixed"]) == len(PROMPTS) >= 8
    assert all(len(ids) == MAX_TOKENS for ids in results["fixed"])
    for index, (plain, fixed) in enumerate(zip(results["plain"], results["fixed"], strict=True)):
        assert fixed == plain, f"request {index} ({PROMPTS[index]!r}, penalties {PENALTIES[index]})"
    # A second mix (penalties on other prompts) too.
    assert results["fixed_again"] == results["plain_again"]


def test_penalties_really_changed_the_output(results: dict[str, Any]) -> None:
    """Without this the comparison above could pass with penalties ignored on both sides."""
    penalised = [i for i, pen in enumerate(PENALTIES) if pen != (1.0, 0.0, 0.0)]
    changed = [i for i in penalised if results["plain"][i] != results["plain_unpenalised"][i]]
    assert len(changed) >= len(penalised) * 2 // 3, (changed, penalised)
    unpenalised = [i for i, pen in enumerate(PENALTIES) if pen == (1.0, 0.0, 0.0)]
    for i in unpenalised:
        assert results["fixed"][i] == results["fixed_unpenalised"][i]
    assert results["fixed_unpenalised"] == results["plain_unpenalised"]


def test_fixed_server_ran_the_processor_and_the_stand_aside(
    fixed_vllm: RunningServer, results: dict[str, Any]
) -> None:
    log = fixed_vllm.process.log_path.read_text(errors="replace")
    assert (
        "deploykit: applied fix device_penalties to vllm.v1.worker.gpu_input_batch.InputBatch.no_penalties"
        in log
    )
    assert "DevicePenaltiesProcessor engaged" in log
    assert "Traceback" not in log
