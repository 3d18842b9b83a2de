"""A group that spans nodes, on systemd hosts: the leader's argv, and each other node's argv for its own unit.

The leader (node rank 0) is the server unit as on one node, with its smoke and canary: it serves the API.
Every other node gets `deploykit-P-worker-R.service`, one unit per rank rather than one template unit
(`...-worker@.service`): its ExecStart is that rank's argv word for word, checked here against the target
vLLM's option table, with no instance a person could get wrong (`@0` would be a second rank 0, which vLLM's
headless path runs as a data-parallel engine waiting for a handshake that never comes). Each argv is
deploykit.plan.group's: the plan's, plus vLLM's node flags; the leader's address is the profile's
`deploy.leader_address`, the one string here that comes from no plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, ValidationError

from deploykit import net
from deploykit.plan.group import NodeRole, master_port, node_argv
from deploykit.render.common import RenderError, check_node_argv

if TYPE_CHECKING:
    from deploykit.plan import Plan
    from deploykit.profile.schema import LoadedProfile


class NodeLaunch(BaseModel):
    """One node's rank and the argv its unit runs (`vllm serve ...`, before the prefix's path)."""

    model_config = ConfigDict(frozen=True)

    node_rank: int
    argv: list[str]


class GroupLaunch(BaseModel):
    """What the units of a multi-node group run, and the warnings a person rendering it should read."""

    nodes: int
    leader_address: str
    master_port: int
    leader: NodeLaunch
    workers: list[NodeLaunch]
    warnings: list[str] = []

    @property
    def rendezvous(self) -> str:
        """HOST:PORT the workers dial (an IPv6 address in brackets)."""
        return f"{net.url_host(self.leader_address)}:{self.master_port}"


def leader_address(loaded: LoadedProfile, nodes: int) -> str:
    """The profile's deploy.leader_address, required for a group and checked again here (a profile built in
    code skips the schema): RenderError, one line, when it is missing or no host a worker can dial."""
    from deploykit.profile.schema import DeploySpec

    given = loaded.profile.deploy.leader_address
    if given is None:
        raise RenderError(
            f"{loaded.path}: deploy.nodes is {nodes}, so deploy.leader_address is required: the host name or "
            "IP address every worker node reaches the leader at (docs/profiles.md)"
        )
    try:
        checked = DeploySpec(leader_address=given).leader_address
    except ValidationError as exc:
        why = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise RenderError(f"{loaded.path}: deploy.leader_address: {why}") from None
    assert checked is not None
    return checked


def group_launch(plan: Plan, loaded: LoadedProfile) -> GroupLaunch | None:
    """The leader's and every worker's argv, each checked as the target vLLM's parser would; None for a
    group on one node. RenderError when a node's argv is rejected."""
    layout = plan.layout
    if layout.nodes == 1:
        return None
    address = leader_address(loaded, layout.nodes)
    warnings: list[str] = []
    ip = net.ip_address(address)
    if address == "localhost" or (ip is not None and ip.is_loopback):
        warnings.append(
            f"deploy.leader_address {address} is a loopback address: only worker units on the leader's own "
            "host can reach it (a group tried out on one host); give the leader's network address"
        )
    launches = []
    for rank in range(layout.nodes):
        role = NodeRole(node_rank=str(rank), master_addr=address, leader=rank == 0)
        launches.append(NodeLaunch(node_rank=rank, argv=node_argv(plan.argv, layout, role)))
    for launch in launches:
        warnings += check_node_argv(plan, launch.node_rank, launch.argv)
    return GroupLaunch(
        nodes=layout.nodes,
        leader_address=address,
        master_port=master_port(plan.argv),
        leader=launches[0],
        workers=launches[1:],
        warnings=sorted(set(warnings), key=warnings.index),
    )
