"""The chart values of a group that spans nodes: one LeaderWorkerSet instead of the Deployment.

A LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, https://lws.sigs.k8s.io/docs/reference/leaderworkerset.v1/)
runs each replica as a group of `size` pods, the leader first in name and the workers after it, and gives
every container LWS_LEADER_ADDRESS (the leader pod's DNS name under the set's headless Service),
LWS_GROUP_SIZE and LWS_WORKER_INDEX (0 for the leader). The kubelet expands `$(NAME)` in a container's command
from its environment, so one worker template serves every worker: its argv names the rank and the leader by
those placeholders. The argv themselves are the plan's, with vLLM's node flags (deploykit.plan.group), so the
chart invents no launch of its own. Nothing here imports torch or vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from deploykit.plan.group import NodeRole, master_port, node_argv

if TYPE_CHECKING:
    from deploykit.plan import Plan
    from deploykit.profile.schema import LoadedProfile

# What LeaderWorkerSet puts in every container's environment (api/leaderworkerset/v1: LwsLeaderAddress,
# LwsWorkerIndex), as the kubelet expands them in a command.
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
WORKER_INDEX = "$(LWS_WORKER_INDEX)"


def checked_group(plan: Plan) -> list[str]:
    """The leader's and a worker's argv as a pod of the group runs them (placeholders filled as the kubelet
    would: a worker index, the leader's name), each checked against the target vLLM's option table."""
    from deploykit.render.common import check_node_argv

    if plan.layout.nodes == 1:
        return []
    warnings: list[str] = []
    for rank in (0, 1):
        role = NodeRole(node_rank=str(rank), master_addr="leader-0.group", leader=rank == 0)
        warnings += check_node_argv(plan, rank, node_argv(plan.argv, plan.layout, role))
    return sorted(set(warnings), key=warnings.index)


def group_values(plan: Plan, loaded: LoadedProfile, command: Sequence[str]) -> dict[str, Any] | None:
    """The `group` values for a plan whose group spans nodes; None on one node (the chart's Deployment).

    `command` is the plan's argv as the chart writes it (every `$` doubled, so Kubernetes leaves it alone);
    the node flags are added after that, so their placeholders are the only words Kubernetes expands."""
    layout = plan.layout
    if layout.nodes == 1:
        return None
    leader = NodeRole(node_rank="0", master_addr=LEADER_ADDRESS, leader=True)
    worker = NodeRole(node_rank=WORKER_INDEX, master_addr=LEADER_ADDRESS, leader=False)
    return {
        "size": layout.nodes,
        "leaderCommand": node_argv(command, layout, leader),
        "workerCommand": node_argv(command, layout, worker),
        "masterPort": master_port(plan.argv),
        # The leader opens its rendezvous before it loads weights, so its whole start-up window bounds it.
        "leaderWaitSeconds": loaded.profile.deploy.startup_timeout_s,
        "fabricEnv": {},
    }
