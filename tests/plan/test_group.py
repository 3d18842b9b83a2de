"""Each node of a multi-node group runs the plan's argv with vLLM's node flags, one setting each."""

from __future__ import annotations

from deploykit.plan.group import GROUP_MASTER_PORT, NodeRole, master_port, node_argv
from deploykit.plan.layout import ParallelLayout

LAYOUT = ParallelLayout(
    tensor=8,
    pipeline=2,
    prefill_context=1,
    data_parallel=1,
    data_parallel_local=1,
    nodes=2,
    world_size=16,
    gpus_per_node=8,
    gpu_request=8,
)
PLAN_ARGV = [
    "vllm",
    "serve",
    "/models/m",
    "--tensor-parallel-size",
    "8",
    "-pp",
    "2",
    "-n",
    "2",
    "--port",
    "8000",
]


def test_the_leader_serves_and_the_worker_is_headless() -> None:
    leader = node_argv(PLAN_ARGV, LAYOUT, NodeRole(node_rank="0", master_addr="10.0.0.1", leader=True))
    worker = node_argv(
        PLAN_ARGV,
        LAYOUT,
        NodeRole(node_rank="$(LWS_WORKER_INDEX)", master_addr="$(LWS_LEADER_ADDRESS)", leader=False),
    )
    port = str(GROUP_MASTER_PORT)
    assert leader == [
        "vllm", "serve", "/models/m", "--tensor-parallel-size", "8", "-pp", "2", "--port", "8000",
        "--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1", "--master-port", port,
    ]  # fmt: skip
    assert worker[-9:] == [
        "--nnodes", "2", "--node-rank", "$(LWS_WORKER_INDEX)", "--master-addr", "$(LWS_LEADER_ADDRESS)",
        "--master-port", port, "--headless",
    ]  # fmt: skip
    assert "-n" not in leader  # the profile's own `-n 2` is replaced, not repeated


def test_a_master_port_of_the_profile_wins() -> None:
    argv = [*PLAN_ARGV, "--master-port=29555"]
    assert master_port(argv) == 29555
    done = node_argv(argv, LAYOUT, NodeRole(node_rank="1", master_addr="leader", leader=False))
    assert done.count("--master-port") == 1 and done[done.index("--master-port") + 1] == "29555"
    assert not any(word.startswith("--master-port=") for word in done)
