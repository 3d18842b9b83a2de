"""What each node of a multi-node group runs: the plan's argv with vLLM's own node flags (no Ray).

vLLM splits one world over `--nnodes` nodes itself: every node runs the same `vllm serve` argv with its
`--node-rank`, all of them given the leader's `--master-addr` and `--master-port`; the leader (rank 0) serves
the API, the others run `--headless` (engine ranks only, no API server). So the group's argv is the plan's,
word for word, plus those flags: one plan, one argv per rank, nothing a renderer invents. The address and the
rank may be placeholders the runtime fills in (a LeaderWorkerSet gives `$(LWS_LEADER_ADDRESS)` and
`$(LWS_WORKER_INDEX)`; a systemd worker unit is written for one rank).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from deploykit import argv as argv_reader
from deploykit.plan.layout import ParallelLayout

GROUP_MASTER_PORT = 29501
"""The port the leader's rendezvous listens on: vLLM's own default (ParallelConfig.master_port), written
out so a chart can name it on the leader's Service and a firewall rule can open it. A `--master-port` in the
profile's extra_args wins."""


class NodeRole(BaseModel):
    """One node of a group, as a renderer writes it."""

    model_config = ConfigDict(frozen=True)

    node_rank: str = Field(description="`0` for the leader; a number or a runtime placeholder for a worker")
    master_addr: str = Field(description="the leader's address, or a runtime placeholder")
    leader: bool


def master_port(plan_argv: Sequence[str]) -> int:
    """The rendezvous port the group uses: the profile's `--master-port`, else vLLM's default."""
    given = argv_reader.flag_value(plan_argv, "--master-port")
    return int(given) if given and given.isdigit() else GROUP_MASTER_PORT


def node_argv(plan_argv: Sequence[str], layout: ParallelLayout, role: NodeRole) -> list[str]:
    """The argv one node of the group runs: the plan's, with the node flags in force (one setting each)."""
    flags = [
        "--nnodes",
        str(layout.nodes),
        "--node-rank",
        role.node_rank,
        "--master-addr",
        role.master_addr,
        "--master-port",
        str(master_port(plan_argv)),
    ]
    if not role.leader:
        flags.append("--headless")
    return argv_reader.apply_args(plan_argv, flags)
