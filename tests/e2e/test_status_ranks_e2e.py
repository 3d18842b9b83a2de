"""Fixes active in every rank (issue 44): the status route and the fix check on a real tensor-parallel world.

Two servers, each started once. The first: the tiny model at `--tensor-parallel-size 2` over two vLLM nodes
on this machine, in vLLM's multi-node mode (the leader `--nnodes 2 --node-rank 0 --master-addr 127.0.0.1`,
the other node the same with `--node-rank 1 --headless`), each a launch of its own with its own
environment, as two hosts are. The
leader's DEPLOYKIT_FIXES names device_penalties and matmul_lora; node 1's names device_penalties only: a node
started with another environment, the way a rank misses a fix in the field. Nothing in deploykit is told to
skip a fix, so no switch exists that a production server could trip: the withheld fix is withheld the way
it is on a real cluster. The route must list both ranks (rank 1 answering from node 1 over the leader's
RPC), each with device_penalties; `deploykit smoke` must fail naming rank 1 for matmul_lora, and only it.
The second: one process group at TP 2 on one node, whose two ranks both report the fix and pass the smoke.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploykit.endpoint import Endpoint
from deploykit.fixes.penalties import PROCESSOR
from deploykit.net import free_port
from deploykit.serve.launch import read_tail, start_server
from deploykit.smoke.fix_check import fix_case, read_status
from tests.e2e.test_serve_e2e import command_env
from tests.serve_helpers import only_row
from tests.vllm_harness import REPO, RunningServer, base_env, running_vllm, tiny_serve_args, vllm_executable

pytestmark = pytest.mark.e2e

PENALTIES = "device_penalties"
LORA = "matmul_lora"
LEADER_FIXES = f"{PENALTIES},{LORA}"
NODE1_FIXES = PENALTIES  # node 1 started without matmul_lora


def _cores() -> tuple[str, str]:
    """One core per node (VLLM_CPU_OMP_THREADS_BIND), the two ranks apart where the machine has two."""
    cores = sorted(os.sched_getaffinity(0))
    return str(cores[0]), str(cores[-1])


@contextmanager
def two_node_world(model: Path) -> Iterator[RunningServer]:
    """The leader (API server, rank 0) and a headless node 1 (rank 1) of one TP 2 world; both stopped, with
    every process of theirs, at the end. The headless node starts first: the leader waits for it to join."""
    leader_core, node1_core = _cores()
    world = [
        *tiny_serve_args(model),
        *("--logits-processors", PROCESSOR),
        *("--tensor-parallel-size", "2", "--nnodes", "2"),
        *("--master-addr", "127.0.0.1", "--master-port", str(free_port())),
    ]
    node1_env = base_env({"DEPLOYKIT_FIXES": NODE1_FIXES, "VLLM_CPU_OMP_THREADS_BIND": node1_core})
    log_dir = REPO / ".deploykit-cache" / "test-logs"
    node1 = start_server(
        [vllm_executable(), "serve", *world, "--node-rank", "1", "--headless"],
        node1_env,
        log_path=log_dir / f"vllm-node1-{os.getpid()}-{int(time.time())}.log",
        host="127.0.0.1",
        port=1,  # a headless node serves no HTTP: its base_url is never used
    )
    try:
        leader_env = {"DEPLOYKIT_FIXES": LEADER_FIXES, "VLLM_CPU_OMP_THREADS_BIND": leader_core}
        try:
            with running_vllm([*world, "--node-rank", "0"], env=leader_env, log_dir=log_dir) as leader:
                yield leader
        except RuntimeError as exc:  # the leader did not come up: node 1's log says as much as its own
            raise RuntimeError(
                f"{exc}\n--- node 1 log ({node1.log_path}) ---\n{read_tail(node1.log_path)}"
            ) from exc
    finally:
        node1.stop()


def _deploykit(args: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deploykit", *args], env=dict(env), capture_output=True, text=True, timeout=600
    )


def test_every_rank_of_a_two_node_world_reports_its_fixes_and_smoke_names_the_one_that_lacks_one(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path / 'r.sqlite'}"
    with two_node_world(tiny_model_dir) as leader:
        status: dict[str, Any] = httpx.get(leader.base_url + "/deploykit/status", timeout=60).json()
        smoke = _deploykit(
            [
                "smoke",
                "--url",
                leader.base_url,
                "--model",
                "tiny",
                "--expect-fixes",
                LEADER_FIXES,
                "--store",
                store,
            ],
            command_env(tmp_path),
        )
        read = read_status(Endpoint(leader.base_url))
    ranks = sorted(status["engine"], key=lambda record: record["rank"])
    assert status["world"] == {"size": 2, "tensor_parallel_size": 2, "pipeline_parallel_size": 1, "nnodes": 2}
    assert status["ranks_unanswered"] == [] and status["engine_error"] is None, status
    assert [(r["rank"], r["tp_rank"], r["pp_rank"], r["node_rank"]) for r in ranks] == [
        (0, 0, 0, 0),
        (1, 1, 0, 1),
    ]
    api_pid = status["api_server"]["pid"]
    assert len({r["pid"] for r in ranks} | {api_pid}) == 3  # two worker processes, neither the API server
    # Each rank applied device_penalties itself (its target in vLLM); only the leader's rank matmul_lora.
    assert all(r["fixes_applied"][PENALTIES].startswith("vllm.") for r in ranks), ranks
    assert LORA in ranks[0]["fixes_applied"] and LORA not in ranks[1]["fixes_applied"]
    assert ranks[1]["fixes_requested"] == [PENALTIES] and ranks[0]["fixes_requested"] == [PENALTIES, LORA]
    # Active means in every rank: the API server's DEPLOYKIT_FIXES asks for both, one rank applied both.
    assert status["fixes_requested"] == [PENALTIES, LORA] and list(status["fixes_active"]) == [PENALTIES]

    output = smoke.stdout + smoke.stderr
    assert smoke.returncode == 1, output
    named = (
        f"{LORA}: requested, but rank 1 (tp 1, pp 0, node 1, host {ranks[1]['hostname']}) did not apply it "
        f"(its DEPLOYKIT_FIXES is {PENALTIES})"
    )
    row = only_row(store)
    assert named in row.diagnosis, row.diagnosis
    assert f"{PENALTIES}:" not in row.diagnosis  # every rank applied that one
    assert [c.name for c in row.cases if not c.passed] == ["fixes"]  # the TP 2 world answers correctly
    assert "rank 1 (tp 1, pp 0, node 1" in " ".join(output.split())  # so does the verdict (however wrapped)
    # Expecting only the fix every rank applied, the same check passes.
    assert fix_case([PENALTIES], read).passed and not fix_case([LORA], read).passed


def test_a_single_node_tensor_parallel_server_reports_both_ranks_and_passes_the_smoke(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """One process group at TP 2 on one node (vLLM's CPU build: one core per rank): both ranks answer the
    status route from node 0, each applied the fix, and `deploykit smoke` expecting it passes, row and all."""
    store = f"sqlite:///{tmp_path / 'r.sqlite'}"
    first, second = _cores()
    args = [
        *tiny_serve_args(tiny_model_dir),
        *("--logits-processors", PROCESSOR),
        "--tensor-parallel-size",
        "2",
    ]
    env = {"DEPLOYKIT_FIXES": PENALTIES, "VLLM_CPU_OMP_THREADS_BIND": f"{first}|{second}"}
    log_dir = REPO / ".deploykit-cache" / "test-logs"
    with running_vllm(args, env=env, log_dir=log_dir) as server:
        status: dict[str, Any] = httpx.get(server.base_url + "/deploykit/status", timeout=60).json()
        smoke = _deploykit(
            [
                "smoke",
                "--url",
                server.base_url,
                "--model",
                "tiny",
                "--expect-fixes",
                PENALTIES,
                "--store",
                store,
            ],
            command_env(tmp_path),
        )
    ranks = sorted(status["engine"], key=lambda record: record["rank"])
    assert status["world"] == {"size": 2, "tensor_parallel_size": 2, "pipeline_parallel_size": 1, "nnodes": 1}
    assert status["ranks_unanswered"] == [] and status["engine_error"] is None, status
    assert [(r["rank"], r["tp_rank"], r["node_rank"]) for r in ranks] == [(0, 0, 0), (1, 1, 0)]
    assert len({r["pid"] for r in ranks}) == 2  # a worker process per rank
    assert all(r["fixes_applied"][PENALTIES].startswith("vllm.") for r in ranks), ranks
    assert list(status["fixes_active"]) == [PENALTIES]
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr
    row = only_row(store)
    assert row.verdict == "pass" and all(case.passed for case in row.cases), row.diagnosis
