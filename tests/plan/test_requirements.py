"""The GPUs a plan needs are its parallel world size, not its tensor-parallel size (issue 44): tensor ×
pipeline × prefill context × the data-parallel ranks a node runs, spread over `deploy.nodes`. A layout that
cannot fit the node the facts describe is a plan error naming the numbers; `requires` checks the GPUs the
layout uses. Facts: the recorded 8× H100 host (tests/fixtures/facts/h100x8.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from deploykit.plan import Plan, make_plan
from deploykit.probe.facts import ProbeFacts
from deploykit.profile.load import load_profile
from tests.vllm_harness import REPO

FACTS_DIR = REPO / "tests" / "fixtures" / "facts"
NEEDS_16 = (
    "needs 16 GPUs per node (tensor 8 × pipeline 2) but the node has 8: set deploy.nodes: 2 or lower the "
    "parallel sizes"
)


def facts(gpu: str) -> ProbeFacts:
    return ProbeFacts.model_validate_json((FACTS_DIR / f"{gpu}.json").read_text())


def plan_of(
    tmp_path: Path, serve: dict[str, Any], deploy: dict[str, Any] | None = None, gpu: str = "h100x8"
) -> Plan:
    """A plain CUDA profile (a local model path, no fixes called for) with these serve and deploy settings."""
    data = {"name": "big", "model": {"source": "/models/big", "checkpoint_dtype": "bfloat16"}, "serve": serve}
    if deploy:
        data["deploy"] = deploy
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(data))
    return make_plan(load_profile(str(path)), facts(gpu))


@pytest.mark.parametrize(
    "pipeline",
    [
        {"extra_args": ["--pipeline-parallel-size", "2"]},
        {"extra_args": ["-pp", "2"]},
        {"extra_args": ["--pipeline-parallel-size=2"]},
        {"extra_args": ["--pipeline_parallel_size", "2"]},
        {"extra_args": ["-pp=2"]},
        {"pipeline_parallel_size": 2},
    ],
    ids=["long", "short", "equals", "underscores", "short-equals", "field"],
)
def test_tensor_8_pipeline_2_on_one_8_gpu_node_is_refused_naming_16(
    tmp_path: Path, pipeline: dict[str, Any]
) -> None:
    plan = plan_of(tmp_path, {"tensor_parallel_size": 8, **pipeline})
    assert plan.errors == [NEEDS_16]


def test_on_two_nodes_it_plans_with_8_gpus_per_node(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, {"tensor_parallel_size": 8, "pipeline_parallel_size": 2}, {"nodes": 2})
    assert plan.errors == []
    layout = plan.layout
    assert (layout.world_size, layout.nodes, layout.gpus_per_node, layout.gpu_request) == (16, 2, 8, 8)
    assert plan.argv[-4:] == ["--tensor-parallel-size", "8", "--pipeline-parallel-size", "2"]


def test_a_pipeline_flag_that_disagrees_with_the_field_is_refused(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, {"pipeline_parallel_size": 2, "extra_args": ["-pp", "4"]})
    assert plan.errors == [
        "serve.extra_args sets --pipeline-parallel-size 4 (written -pp), but serve.pipeline_parallel_size is "
        "2: set it in one place"
    ]


def test_a_pipeline_flag_that_agrees_with_the_field_is_counted_once(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, {"pipeline_parallel_size": 2, "extra_args": ["--pipeline-parallel-size=2"]})
    assert plan.errors == []
    assert (plan.layout.pipeline, plan.layout.gpus_per_node) == (2, 2)


def test_tensor_parallel_in_extra_args_is_still_the_fields_alone(tmp_path: Path) -> None:
    """`-tp` stays owned by serve.tensor_parallel_size (refused in extra_args); the layout counts it all the
    same, as vLLM would read the argv, so no other line miscounts."""
    plan = plan_of(tmp_path, {"extra_args": ["-tp", "16"]})
    assert plan.layout.tensor == 16
    assert plan.errors == [
        "serve.extra_args sets --tensor-parallel-size (written -tp); use the profile field "
        "`serve.tensor_parallel_size` instead",
        "needs 16 GPUs per node (tensor 16) but the node has 8: set deploy.nodes: 2 or lower the parallel "
        "sizes",
    ]


@pytest.mark.parametrize(
    ("extra", "per_node"),
    [
        (["--data-parallel-size", "4", "--data-parallel-size-local", "2"], 8),
        (["-dp", "4", "-dpl=2"], 8),
        (["-dp", "2"], 8),  # all of a group's data-parallel ranks run on its one node (the mp backend)
        (["-dp", "4", "-dpl", "1"], 4),  # the other ranks run on other hosts
        (["--data-parallel-size", "4", "--data-parallel-rank", "1"], 4),  # external load balancing: one rank
        (["-dp", "2", "--data-parallel-external-lb", "--data-parallel-rank", "0"], 4),
    ],
)
def test_data_parallel_ranks_on_the_node_are_counted(tmp_path: Path, extra: list[str], per_node: int) -> None:
    plan = plan_of(tmp_path, {"tensor_parallel_size": 4, "extra_args": extra})
    assert plan.errors == []
    assert plan.layout.gpus_per_node == per_node


def test_more_local_data_parallel_ranks_than_ranks_is_refused(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, {"extra_args": ["-dpl", "2"]})
    assert plan.errors == [
        "serve.extra_args sets --data-parallel-size-local 2, more than the 1 data-parallel rank(s) of "
        "--data-parallel-size 1: vLLM refuses that at start-up; set --data-parallel-size too"
    ]


def test_data_parallel_beyond_the_node_is_refused_naming_the_product(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, {"tensor_parallel_size": 4, "extra_args": ["--data-parallel-size", "4"]})
    assert plan.errors == [
        "needs 16 GPUs per node (tensor 4 × data-parallel 4) but the node has 8: set deploy.nodes: 2 or "
        "lower the parallel sizes"
    ]


def test_prefill_context_parallel_is_part_of_the_world_size(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, {"tensor_parallel_size": 4, "extra_args": ["-pcp", "2", "-dcp", "4"]})
    assert plan.errors == []  # decode context parallel reuses the tensor-parallel GPUs
    assert plan.layout.gpus_per_node == 8


def test_nodes_that_do_not_divide_the_world_size_are_refused(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, {"tensor_parallel_size": 8, "pipeline_parallel_size": 2}, {"nodes": 3})
    assert plan.errors == [
        "deploy.nodes 3 does not divide the world size 16 (tensor 8 × pipeline 2): each node runs an equal "
        "share; set deploy.nodes to a divisor of 16"
    ]


def test_vllms_nnodes_flag_must_agree_with_deploy_nodes(tmp_path: Path) -> None:
    plan = plan_of(tmp_path, {"tensor_parallel_size": 8, "extra_args": ["--nnodes", "2"]})
    assert plan.errors == [
        "serve.extra_args sets --nnodes 2, but deploy.nodes is 1: set deploy.nodes (the nodes a group spans) "
        "instead"
    ]


@pytest.mark.parametrize("value", ["two", "0"])
def test_a_parallel_size_that_is_no_count_is_refused(tmp_path: Path, value: str) -> None:
    plan = plan_of(tmp_path, {"extra_args": ["-pp", value]})
    assert plan.errors == [
        f"serve.extra_args sets --pipeline-parallel-size {value!r}: a parallel size is a whole number ≥ 1"
    ]


def test_requires_checks_every_gpu_the_layout_uses(tmp_path: Path) -> None:
    """TP 4 × PP 2 runs on GPUs 0-7: a memory floor GPU 5 misses is a `requires` problem (it was checked
    against the first 4 only)."""
    data = {
        "name": "big",
        "model": {"source": "/models/big", "checkpoint_dtype": "bfloat16"},
        "serve": {"tensor_parallel_size": 4, "pipeline_parallel_size": 2},
        "requires": {"min_memory_mib": 80000},
    }
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(data))
    host = facts("h100x8")
    host.gpus[5] = host.gpus[5].model_copy(update={"memory_total_mib": 40960})
    plan = make_plan(load_profile(str(path)), host)
    assert plan.requires.status == "incompatible"
    assert plan.requires.problems == ["GPU 5 (NVIDIA H100 80GB HBM3, CC 9.0): 40960 MiB < 80000 MiB"]


def test_a_cpu_profile_needs_no_gpu(tmp_path: Path) -> None:
    plan = make_plan(load_profile("demo-cpu"), ProbeFacts(vllm_version="0.32.0+cpu"))
    assert plan.errors == []
    assert (plan.layout.world_size, plan.layout.gpu_request) == (1, 1)
    assert plan.requires.status == "compatible"
