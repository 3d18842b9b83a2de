"""Serving with penalties on the real vLLM (CPU build): TPOT and output tokens/s with and without the
device_penalties fix, N concurrent streams, same prompts, same run.

The model is a tiny random Llama whose vocabulary is realistic (128256 entries, like Llama 3), because
the host penalty path's cost scales with it; its tokenizer is a small one trained here (vLLM accepts a
model vocabulary larger than the tokenizer's). Not part of CI: it takes several minutes.

    .venv/bin/python bench/bench_penalties_serving.py [--max-tokens 192] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.benchmarks_doc import write_section  # noqa: E402
from deploykit.fixes import penalties  # noqa: E402
from tests.vllm_harness import RunningServer, running_vllm, tiny_serve_args  # noqa: E402

VOCAB = 128_256
STREAMS = (1, 8, 32, 64)
SECTION = "bench_penalties_serving"
PENALTY_FIELDS = {"repetition_penalty": 1.1, "frequency_penalty": 0.3, "presence_penalty": 0.2}


def build_big_vocab_model() -> Path:
    """A tiny Llama with a 128256-entry vocabulary and a small local tokenizer; cached."""
    import os

    cache = Path(os.environ.get("DEPLOYKIT_MODEL_CACHE", REPO / ".deploykit-cache" / "models"))
    target = cache / f"tiny-llama-vocab{VOCAB}-v1"
    if (target / "config.json").exists():
        return target
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from deploykit.tinymodel import train_tokenizer

    torch.manual_seed(0)
    tokenizer = train_tokenizer(2048)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.5 if param.dim() > 1 else 0.02)
    staging = target.with_name(target.name + f".{os.getpid()}")
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    (staging / "generation_config.json").write_text(json.dumps({"bos_token_id": config.bos_token_id}))
    staging.rename(target)
    return target


def stream_one(server: RunningServer, prompt: str, max_tokens: int) -> dict[str, float]:
    """One streamed completion: time to its first token, and time of each token chunk for TPOT."""
    payload = {
        "model": server.served_name,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
        **PENALTY_FIELDS,
    }
    stamps: list[float] = []
    tokens = 0
    sent = time.perf_counter()
    with (
        server.client(timeout=600) as client,
        client.stream("POST", "/v1/completions", json=payload) as response,
    ):
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            ids = chunk["choices"][0].get("token_ids") or []
            if ids:
                tokens += len(ids)
                stamps.append(time.perf_counter())
    tpot = (stamps[-1] - stamps[0]) / max(1, tokens - 1)
    return {"tokens": tokens, "tpot_s": tpot, "ttft_s": stamps[0] - sent}


def run_streams(server: RunningServer, n: int, max_tokens: int) -> dict[str, float]:
    prompts = [f"Story {i}: once upon a time there was a small model number {i}" for i in range(n)]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=n) as pool:
        results = list(pool.map(lambda p: stream_one(server, p, max_tokens), prompts))
    wall = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in results)
    assert tokens == n * max_tokens, (tokens, n, max_tokens)
    return {
        "tpot_s": statistics.median(r["tpot_s"] for r in results),
        "tok_per_s": tokens / wall,
        "ttft_max_s": max(r["ttft_s"] for r in results),
    }


def measure_server(model: Path, fixed: bool, max_tokens: int, streams: tuple[int, ...]) -> dict[int, Any]:
    args = [*tiny_serve_args(model, max_model_len=1024), "--max-num-seqs", str(max(streams))]
    env: dict[str, str] = {}
    if fixed:
        args += ["--logits-processors", penalties.PROCESSOR]
        env["DEPLOYKIT_FIXES"] = penalties.NAME
    label = "with fix" if fixed else "without fix"
    out: dict[int, Any] = {}
    with running_vllm(args, env=env) as server:
        print(f"{label}: started in {server.startup_s:.0f} s", flush=True)
        run_streams(server, 2, 16)  # warm-up
        for n in streams:
            out[n] = run_streams(server, n, max_tokens)
            print(
                f"{label}: N={n:3d} TPOT {out[n]['tpot_s'] * 1e3:8.1f} ms  {out[n]['tok_per_s']:8.1f} tok/s  "
                f"slowest first token {out[n]['ttft_max_s']:.2f} s",
                flush=True,
            )
    return out


def render(plain: dict[int, Any], fixed: dict[int, Any], max_tokens: int, streams: tuple[int, ...]) -> str:
    fields = ", ".join(f"{k}={v}" for k, v in PENALTY_FIELDS.items())
    lines = [
        f"Real `vllm serve` (CPU build 0.32, V1 runner, 2 cores shared with other work), tiny random Llama "
        f"with vocab {VOCAB}, float32, `--enforce-eager`; every stream greedy with {fields}, "
        f"{max_tokens} output tokens (`ignore_eos`); TPOT = median over streams of (last - first token "
        "time) / (tokens - 1); tokens/s = all output tokens / wall time, so it also counts the wait for "
        "the slowest stream's first token (last columns: on this shared 2-core machine it varies by "
        "seconds from run to run, which moves tokens/s far more than the penalty path does; TPOT is the "
        "figure the fix is about). Both servers in the same run, one after the other, same prompts.",
        "",
        "| N streams | TPOT without ms | TPOT with ms | TPOT ratio "
        "| tok/s without | tok/s with | tok/s ratio | slowest first token without s | with s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in streams:
        a, b = plain[n], fixed[n]
        lines.append(
            f"| {n} | {a['tpot_s'] * 1e3:.1f} | {b['tpot_s'] * 1e3:.1f} | {a['tpot_s'] / b['tpot_s']:.2f}x "
            f"| {a['tok_per_s']:.1f} | {b['tok_per_s']:.1f} | {b['tok_per_s'] / a['tok_per_s']:.2f}x "
            f"| {a['ttft_max_s']:.2f} | {b['ttft_max_s']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--streams", default=",".join(map(str, STREAMS)))
    parser.add_argument("--write-docs", action="store_true", help="record the table in docs/benchmarks.md")
    args = parser.parse_args()
    streams = tuple(int(n) for n in args.streams.split(","))

    model = build_big_vocab_model()
    plain = measure_server(model, fixed=False, max_tokens=args.max_tokens, streams=streams)
    fixed = measure_server(model, fixed=True, max_tokens=args.max_tokens, streams=streams)
    table = render(plain, fixed, args.max_tokens, streams)
    print()
    print(table)
    if args.write_docs:
        write_section(
            REPO / "docs" / "benchmarks.md",
            SECTION,
            "Device penalties: serving on the real vLLM (bench/bench_penalties_serving.py)",
            table,
        )


if __name__ == "__main__":
    main()
