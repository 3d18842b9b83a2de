"""Per-step cost of sampling penalties: vLLM's V1 host path vs deploykit's DevicePenaltiesProcessor.

Each step appends one output token to every row (as decoding does) and then applies penalties to a
[batch, 128256] float32 logits tensor. vLLM's path is `apply_all_penalties` with the rows' Python lists
(what the V1 sampler calls); ours is the processor's `apply`. The yardstick is one plain copy of the
logits (`scratch.copy_(logits)` into a preallocated tensor: a single full pass over [batch, vocab]). Ours
and the copy alternate, one call each per round, so both are timed under the same machine conditions, and
each reports its median (and fastest) call over the rounds; the copy also leaves the logits and our
tables out of cache for our next call, as a fresh step would. All numbers come from the same run;
ratios, not absolute times, are the result (the machine is shared).

    .venv/bin/python bench/bench_penalties.py [--quick] [--case 128x2048 ...] [--write-docs]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.benchmarks_doc import write_section  # noqa: E402

VOCAB = 128_256
PROMPT_LEN = 128
BATCHES = (1, 8, 32, 128, 256)
LENGTHS = (16, 256, 2048)
SECTION = "bench_penalties"
ROUNDS = 50  # ours and the copy, alternately; below the 64 tokens of headroom each row has


def fake_config(rows: int, max_model_len: int) -> Any:
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=rows),
        model_config=SimpleNamespace(get_vocab_size=lambda: VOCAB, max_model_len=max_model_len),
    )


def median_seconds(step: Any, repeats: int) -> float:
    """Median of `repeats` timed calls after one warm-up call."""
    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved_seconds(steps: dict[str, Any], rounds: int) -> dict[str, list[float]]:
    """Each step once per round, in turn, after one warm-up call each: every call's time, per step."""
    for step in steps.values():
        step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return times


def one_case(batch: int, length: int, vllm_repeats: int, rounds: int) -> dict[str, float]:
    """Time one batch x output length case; each call of ours adds a token per row, so `rounds` + 1
    must stay within the 64 tokens of headroom the processor's max_model_len leaves."""
    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate
    from vllm.v1.sample.ops.penalties import apply_all_penalties

    from deploykit.fixes._penalties_processor import DevicePenaltiesProcessor, remove_stand_aside

    rng = random.Random(batch * 7919 + length)
    prompts = [[rng.randrange(VOCAB) for _ in range(PROMPT_LEN)] for _ in range(batch)]
    # Uniform ids: nearly every output token is distinct, the largest table the processor can need.
    outputs_vllm = [[rng.randrange(VOCAB) for _ in range(length)] for _ in range(batch)]
    outputs_ours = [list(ids) for ids in outputs_vllm]
    params = SamplingParams(repetition_penalty=1.2, frequency_penalty=0.5, presence_penalty=0.3)
    logits = torch.randn(batch, VOCAB, dtype=torch.float32)
    scratch = torch.empty_like(logits)

    prompt_t = torch.tensor(prompts, dtype=torch.int64)
    presence = torch.full((batch,), params.presence_penalty, dtype=torch.float32)
    frequency = torch.full((batch,), params.frequency_penalty, dtype=torch.float32)
    repetition = torch.full((batch,), params.repetition_penalty, dtype=torch.float32)

    def vllm_step() -> None:
        for ids in outputs_vllm:
            ids.append(rng.randrange(VOCAB))
        apply_all_penalties(logits, prompt_t, presence, frequency, repetition, outputs_vllm)

    proc = DevicePenaltiesProcessor(fake_config(batch, PROMPT_LEN + length + 64), torch.device("cpu"), False)
    remove_stand_aside()  # the benchmark calls both paths directly; no InputBatch is involved
    added = [(i, params, prompts[i], outputs_ours[i]) for i in range(batch)]
    proc.update_state(BatchUpdate(batch_size=batch, removed=[], added=added, moved=[]))

    def our_step() -> None:
        for ids in outputs_ours:
            ids.append(rng.randrange(VOCAB))
        proc.apply(logits)

    def copy_step() -> None:
        scratch.copy_(logits)

    times = interleaved_seconds({"ours": our_step, "copy": copy_step}, rounds)
    result = {f"{name}_s": statistics.median(spent) for name, spent in times.items()}
    result.update({f"{name}_fastest_s": min(spent) for name, spent in times.items()})
    result["vllm_s"] = median_seconds(vllm_step, vllm_repeats)
    result["ours_bytes_per_row"] = proc.state_bytes() / batch
    result["width"] = proc.width
    return result


def dense_v2_bytes_per_row() -> int:
    # vLLM V2 runner (v1/worker/gpu/sample/penalties.py): int32 output_bin_counts [rows, vocab]
    # plus an int32 prompt bit mask [rows, ceil(vocab / 32)].
    return VOCAB * 4 + -(-VOCAB // 32) * 4


def render(rows: list[dict[str, Any]], threads: int, rounds: int) -> str:
    lines = [
        f"Vocab {VOCAB}, float32 logits, prompt {PROMPT_LEN} tokens, uniform random ids "
        "(nearly all distinct: "
        f"the largest tables), CPU build, torch threads {threads}. "
        "Each step appends one token per row. Ours and one logits copy (`dst.copy_(logits)` into a "
        "preallocated tensor) alternate call by call, "
        f"{rounds} calls each; times are medians of those calls (vLLM's path: median of its own calls), "
        "and the last ratio compares the fastest calls.",
        "",
        "| batch | output len | vLLM host path ms | ours ms | one logits copy ms | vLLM / ours "
        "| ours / copy | ours / copy, fastest calls | our state per row | V2 dense per row |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    dense = dense_v2_bytes_per_row()
    for row in rows:
        lines.append(
            f"| {row['batch']} | {row['length']} | {row['vllm_s'] * 1e3:.2f} | {row['ours_s'] * 1e3:.3f} "
            f"| {row['copy_s'] * 1e3:.2f} | {row['vllm_s'] / row['ours_s']:.0f}x "
            f"| {row['ours_s'] / row['copy_s']:.2f} | {row['ours_fastest_s'] / row['copy_fastest_s']:.2f} "
            f"| {row['ours_bytes_per_row'] / 1024:.1f} KiB "
            f"(W={row['width']}) | {dense / 1024:.0f} KiB |"
        )
    return "\n".join(lines)


def parse_case(text: str) -> tuple[int, int]:
    batch, length = text.lower().split("x")
    return int(batch), int(length)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer cases and repeats (smoke run)")
    parser.add_argument(
        "--case",
        action="append",
        metavar="BATCHxLEN",
        help="only these cases, e.g. --case 128x2048 (repeatable; not with --write-docs)",
    )
    parser.add_argument("--write-docs", action="store_true", help="record the table in docs/benchmarks.md")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (1: on a loaded 2-core box a 2-thread op waits for a preempted peer)",
    )
    args = parser.parse_args()
    if args.case and (args.write_docs or args.quick):
        parser.error("--case runs a partial grid: it does not go with --write-docs or --quick")

    import torch

    torch.set_num_threads(args.threads)

    if args.case:
        cases = [parse_case(case) for case in args.case]
    elif args.quick:
        cases = [(batch, length) for batch in (1, 32) for length in (16, 256)]
    else:
        cases = [(batch, length) for batch in BATCHES for length in LENGTHS]
    rounds = 5 if args.quick else ROUNDS
    rows: list[dict[str, Any]] = []
    for batch, length in cases:
        large = batch * length >= 128 * 256
        vllm_repeats = 3 if args.quick else (5 if large else 15)
        result = one_case(batch, length, vllm_repeats, rounds)
        result.update(batch=batch, length=length)
        rows.append(result)
        print(
            f"batch {batch:4d} len {length:5d}: vLLM {result['vllm_s'] * 1e3:9.2f} ms  "
            f"ours {result['ours_s'] * 1e3:8.3f} ms  copy {result['copy_s'] * 1e3:7.2f} ms  "
            f"vLLM/ours {result['vllm_s'] / result['ours_s']:7.1f}x  ours/copy "
            f"{result['ours_s'] / result['copy_s']:.2f} (fastest calls "
            f"{result['ours_fastest_s'] / result['copy_fastest_s']:.2f})",
            flush=True,
        )
    table = render(rows, torch.get_num_threads(), rounds)
    print()
    print(table)
    if args.write_docs:
        write_section(
            REPO / "docs" / "benchmarks.md",
            SECTION,
            "Device penalties: per-step cost (bench/bench_penalties.py)",
            table,
        )


if __name__ == "__main__":
    main()
