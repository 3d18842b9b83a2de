"""The harness itself: a real vLLM answers with real token ids, and stopping leaves nothing running."""

from __future__ import annotations

import os

import pytest

from tests.vllm_harness import RunningServer

pytestmark = pytest.mark.e2e


def test_real_vllm_returns_token_ids(tiny_vllm: RunningServer) -> None:
    ids = tiny_vllm.completion_ids("Hello there", max_tokens=8)
    assert len(ids) == 8
    assert all(isinstance(i, int) and i >= 0 for i in ids)
    # Greedy decoding is deterministic: the same prompt gives the same ids.
    assert tiny_vllm.completion_ids("Hello there", max_tokens=8) == ids


def test_chat_returns_prompt_and_output_ids(tiny_vllm: RunningServer) -> None:
    with tiny_vllm.client() as client:
        response = client.post(
            "/v1/chat/completions",
            json={
                "model": tiny_vllm.served_name,
                "messages": [{"role": "user", "content": "Say something."}],
                "max_tokens": 6,
                "temperature": 0,
                "return_token_ids": True,
            },
        )
    response.raise_for_status()
    body = response.json()
    assert body["prompt_token_ids"], body
    assert len(body["choices"][0]["token_ids"]) == 6


def test_server_is_its_own_process_group(tiny_vllm: RunningServer) -> None:
    pid = tiny_vllm.process.pid
    assert os.getpgid(pid) == pid


def test_plugin_loads_in_real_vllm_and_does_nothing_when_unset(tiny_vllm: RunningServer) -> None:
    log = tiny_vllm.process.log_tail(max_lines=100000)
    assert "Failed to load plugin" not in log
    assert "deploykit: applied fix" not in log
