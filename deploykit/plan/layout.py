"""The deployment's parallel layout: how many GPUs one group of vLLM ranks uses, and on how many nodes.

vLLM starts tensor × pipeline × prefill-context ranks per data-parallel rank (its `ParallelConfig.world_size`)
and as many data-parallel ranks on a node as `--data-parallel-size-local` says, else one with external load
balancing, else all of `--data-parallel-size` (vllm/engine/arg_utils.py, `create_engine_config`). Requires,
the plan's refusals, the advisories' facts, render and the fleet baseline all count GPUs here, once: the sizes
come from the profile's fields and `serve.extra_args` (the only parts of the planned argv that set them), read
in every spelling vLLM's parser takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from pydantic import BaseModel, ConfigDict, Field

from deploykit import argv as argv_reader
from deploykit.probe.facts import ProbeFacts
from deploykit.profile.schema import Profile

TENSOR = "--tensor-parallel-size"
PIPELINE = "--pipeline-parallel-size"
PREFILL_CONTEXT = "--prefill-context-parallel-size"
DATA = "--data-parallel-size"
DATA_LOCAL = "--data-parallel-size-local"
DATA_RANK = "--data-parallel-rank"
EXTERNAL_LB = "--data-parallel-external-lb"
NNODES = "--nnodes"
_SIZES = (TENSOR, PIPELINE, PREFILL_CONTEXT, DATA, DATA_LOCAL, DATA_RANK, NNODES)


class ParallelLayout(BaseModel):
    """One group's ranks and where they run. `gpu_request` is what a unit or pod on each node asks for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tensor: int = Field(ge=1)
    pipeline: int = Field(ge=1)
    prefill_context: int = Field(ge=1)
    data_parallel: int = Field(ge=1, description="--data-parallel-size: the data-parallel ranks in all")
    data_parallel_local: int = Field(ge=1, description="the data-parallel ranks each node runs")
    nodes: int = Field(ge=1, description="deploy.nodes: the nodes the group spans")
    world_size: int = Field(ge=1, description="the GPUs (ranks) of the whole group")
    gpus_per_node: int = Field(ge=1, description="world_size / nodes (rounded up when it does not divide)")
    gpu_request: int = Field(
        ge=1,
        description="the GPUs each node gives the group: gpus_per_node, or requires.gpu_count when that is "
        "more (a CPU plan asks for none: render.common.gpu_count)",
    )

    def factors(self) -> str:
        """`tensor 8 × pipeline 2`: the factors of the world size that are not 1 (tensor always)."""
        data = self.data_parallel if self.nodes > 1 else self.data_parallel_local
        named = [("tensor", self.tensor), ("pipeline", self.pipeline)]
        named += [("prefill-context", self.prefill_context), ("data-parallel", data)]
        return " × ".join(f"{name} {size}" for name, size in named if size > 1 or name == "tensor")

    def product(self) -> str:
        """The factors, and the nodes they are spread over when more than one."""
        return self.factors() + (f" over {self.nodes} nodes" if self.nodes > 1 else "")


def _settings(words: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Each parallel option the words set → (its value, the flag as written), the last setting winning as
    in argparse; the external-LB switch reads "1" or "0". A flag without its value is left to vLLM's parser
    check (deploykit.plan.validate)."""
    found: dict[str, tuple[str, str]] = {}
    for index, word in enumerate(words):
        name = argv_reader.flag_name(word)
        if name is None:
            continue
        flag = argv_reader.owned_flag(word, (*_SIZES, EXTERNAL_LB))
        written = word.split("=", 1)[0]
        if flag == EXTERNAL_LB:
            found[flag] = ("0" if name.startswith("--no-") else "1", written)
        elif flag is not None and "=" in word:
            found[flag] = (word.split("=", 1)[1], written)
        elif flag is not None and index + 1 < len(words) and argv_reader.flag_name(words[index + 1]) is None:
            found[flag] = (words[index + 1], written)
    return found


def _count(value: str) -> int | None:
    return int(value) if value.isdigit() and int(value) >= 1 else None


def parallel_layout(profile: Profile) -> tuple[ParallelLayout, list[str]]:
    """The layout the planned launch asks vLLM for, and the lines refusing what cannot be planned: a size
    that is no count, a flag that contradicts its field, nodes that do not divide the world size."""
    serve = profile.serve
    settings = _settings(serve.extra_args)
    errors: list[str] = []
    sizes = {TENSOR: serve.tensor_parallel_size, PIPELINE: serve.pipeline_parallel_size}
    for flag, (value, _) in settings.items():
        if flag in (EXTERNAL_LB, DATA_RANK):
            continue
        count = _count(value)
        if count is None:
            errors.append(f"serve.extra_args sets {flag} {value!r}: a parallel size is a whole number ≥ 1")
        else:
            sizes[flag] = count
    errors += _disagreements(profile, settings)
    nodes = profile.deploy.nodes
    rank_size = prod(sizes.get(flag, 1) for flag in (TENSOR, PIPELINE, PREFILL_CONTEXT))
    data = sizes.get(DATA, 1)
    if nodes > 1:  # vLLM's --nnodes arithmetic: the world split evenly, each node's ranks inferred
        world = rank_size * data
        per_node = -(-world // nodes)
        local = max(per_node // rank_size, 1)
    else:  # one rank with external load balancing, else all of --data-parallel-size (the mp backend)
        external = DATA_RANK in settings or settings.get(EXTERNAL_LB, ("0", ""))[0] == "1"
        local = sizes.get(DATA_LOCAL, 1 if external else data)
        world = per_node = rank_size * local
    layout = ParallelLayout(
        tensor=sizes[TENSOR],
        pipeline=sizes[PIPELINE],
        prefill_context=sizes.get(PREFILL_CONTEXT, 1),
        data_parallel=data,
        data_parallel_local=local,
        nodes=nodes,
        world_size=world,
        gpus_per_node=per_node,
        gpu_request=max(per_node, profile.requires.gpu_count),
    )
    if sizes.get(DATA_LOCAL, 1) > data:
        errors.append(
            f"serve.extra_args sets {DATA_LOCAL} {sizes[DATA_LOCAL]}, more than the {data} data-parallel "
            f"rank(s) of {DATA} {data}: vLLM refuses that at start-up; set {DATA} too"
        )
    elif world % nodes:
        errors.append(
            f"deploy.nodes {nodes} does not divide the world size {world} ({layout.factors()}): each node "
            f"runs an equal share; set deploy.nodes to a divisor of {world}"
        )
    elif nodes > 1 and DATA_LOCAL in sizes and sizes[DATA_LOCAL] != local:
        errors.append(
            f"serve.extra_args sets {DATA_LOCAL} {sizes[DATA_LOCAL]}, but {layout.product()} puts {local} "
            "data-parallel rank(s) on each node: remove it, or change the sizes"
        )
    return layout, errors


def _disagreements(profile: Profile, settings: dict[str, tuple[str, str]]) -> list[str]:
    """A flag in extra_args that says otherwise than the field for it: `--nnodes` against deploy.nodes, a
    pipeline flag against serve.pipeline_parallel_size when the profile sets that field. Tensor parallel is
    not here: its field owns the flag outright (launch.extra_arg_conflicts refuses it in any spelling)."""
    errors = []
    serve, nodes = profile.serve, profile.deploy.nodes
    for flag, (given, written) in settings.items():
        spelling = "" if written == flag else f" (written {written})"
        if flag == NNODES and _count(given) not in (None, nodes):
            errors.append(
                f"serve.extra_args sets {flag} {given}{spelling}, but deploy.nodes is {nodes}: set "
                "deploy.nodes (the nodes a group spans) instead"
            )
        pipeline_set = "pipeline_parallel_size" in serve.model_fields_set
        if flag == PIPELINE and pipeline_set and _count(given) not in (None, serve.pipeline_parallel_size):
            errors.append(
                f"serve.extra_args sets {flag} {given}{spelling}, but serve.pipeline_parallel_size is "
                f"{serve.pipeline_parallel_size}: set it in one place"
            )
    return errors


def parallel_flags(profile: Profile) -> list[str]:
    """The parallel flags the profile's fields write into the launch (a size of 1 is vLLM's default)."""
    flags: list[str] = []
    for flag, size in (
        (TENSOR, profile.serve.tensor_parallel_size),
        (PIPELINE, profile.serve.pipeline_parallel_size),
    ):
        if size != 1:
            flags += [flag, str(size)]
    return flags


def fit_problem(layout: ParallelLayout, facts: ProbeFacts, platform: str) -> str | None:
    """A group whose share of one node is more GPUs than the node has (the facts describe one node): vLLM
    could never start it. None on CPU, without GPU facts (the plan refuses those itself), or when it fits."""
    have = len(facts.gpus)
    if platform == "cpu" or not have or layout.gpus_per_node <= have:
        return None
    world = layout.world_size
    enough = next((n for n in range(layout.nodes, world + 1) if not world % n and world // n <= have), world)
    return (
        f"needs {layout.gpus_per_node} GPUs per node ({layout.product()}) but the node has {have}: set "
        f"deploy.nodes: {enough} or lower the parallel sizes"
    )


def multi_node_refusal(layout: ParallelLayout) -> str | None:
    """Why `serve` and `trace` do not run a group spanning nodes (they start one process on this host);
    None on one node. The renderers write such a group (a LeaderWorkerSet; a leader and a worker unit)."""
    if layout.nodes == 1:
        return None
    return (
        f"a group over several nodes is not served from one host: deploy.nodes is {layout.nodes} "
        f"({layout.world_size} GPUs, {layout.gpus_per_node} per node); `deploykit render helm` writes it as "
        "a LeaderWorkerSet and `render systemd` as a leader and a worker unit"
    )
