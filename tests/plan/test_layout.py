"""The parallel layout (deploykit.plan.layout, issue 44): one count of a deployment's GPUs that requires, the
plan, the advisories' facts, render, serve and the fleet baseline all read, never recount."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deploykit import exit_codes
from deploykit.advisories import DeploymentFacts, deployment_facts
from deploykit.fleet_baseline import key_parts_for_plan
from deploykit.plan import Plan, make_plan
from deploykit.plan.layout import ParallelLayout, parallel_layout
from deploykit.probe.facts import ProbeFacts
from deploykit.profile.load import load_profile, parse_profile
from deploykit.render.common import gpu_count
from deploykit.serve import attempt as attempt_module
from deploykit.serve import stages as stages_module
from deploykit.serve.attempt import run_serve
from deploykit.serve.console import ConsoleUI
from deploykit.serve.options import ServeOptions
from deploykit.trace.run import TraceOptions, run_trace
from tests.profile_variants import profile_variant
from tests.serve_helpers import only_row
from tests.vllm_harness import REPO

FACTS_DIR = REPO / "tests" / "fixtures" / "facts"


def layout_of(
    serve: dict[str, Any], deploy: dict[str, Any] | None = None
) -> tuple[ParallelLayout, list[str]]:
    text = json.dumps({"name": "x", "model": {"source": "/m"}, "serve": serve, "deploy": deploy or {}})
    return parallel_layout(parse_profile(text))


def h100x8() -> ProbeFacts:
    return ProbeFacts.model_validate_json((FACTS_DIR / "h100x8.json").read_text())


def test_a_profile_without_parallel_settings_is_one_gpu_on_one_node() -> None:
    layout, errors = layout_of({})
    assert errors == []
    assert layout == ParallelLayout(
        tensor=1,
        pipeline=1,
        prefill_context=1,
        data_parallel=1,
        data_parallel_local=1,
        nodes=1,
        world_size=1,
        gpus_per_node=1,
        gpu_request=1,
    )


@pytest.mark.parametrize(
    ("extra", "pipeline"),
    [
        (["-pp", "2"], 2),
        (["--pipeline-parallel-size=2"], 2),
        (["--pipeline-parallel", "3"], 3),  # an abbreviation argparse expands
        (["-pp", "2", "--pipeline-parallel-size", "4"], 4),  # the last setting wins, as in argparse
    ],
)
def test_pipeline_parallel_is_read_in_every_spelling(extra: list[str], pipeline: int) -> None:
    layout, errors = layout_of({"tensor_parallel_size": 2, "extra_args": extra})
    assert errors == []
    assert (layout.pipeline, layout.world_size) == (pipeline, 2 * pipeline)


def test_the_flag_wins_over_a_field_left_at_its_default() -> None:
    """Only a field the profile sets can disagree; one left at 1 is vLLM's default, and the flag says more."""
    layout, errors = layout_of({"extra_args": ["-pp", "2"]})
    assert errors == [] and layout.pipeline == 2
    _, stated = layout_of({"pipeline_parallel_size": 1, "extra_args": ["-pp", "2"]})
    assert stated == [
        "serve.extra_args sets --pipeline-parallel-size 2 (written -pp), but serve.pipeline_parallel_size "
        "is 1: set it in one place"
    ]


def test_a_disabled_external_load_balancer_runs_every_rank_here() -> None:
    layout, _ = layout_of(
        {"extra_args": ["-dp", "4", "--data-parallel-external-lb", "--no-data-parallel-external-lb"]}
    )
    assert layout.data_parallel_local == 4


def test_on_several_nodes_each_runs_an_equal_share_of_the_ranks() -> None:
    """vLLM's --nnodes arithmetic: data parallel 4 of tensor 4 over 2 nodes is 2 ranks (8 GPUs) per node."""
    layout, errors = layout_of({"tensor_parallel_size": 4, "extra_args": ["-dp", "4"]}, {"nodes": 2})
    assert errors == []
    assert (layout.world_size, layout.gpus_per_node, layout.data_parallel_local) == (16, 8, 2)
    assert layout.product() == "tensor 4 × data-parallel 4 over 2 nodes"
    _, wrong = layout_of({"tensor_parallel_size": 4, "extra_args": ["-dp", "4", "-dpl", "1"]}, {"nodes": 2})
    assert wrong == [
        "serve.extra_args sets --data-parallel-size-local 1, but tensor 4 × data-parallel 4 over 2 nodes "
        "puts 2 data-parallel rank(s) on each node: remove it, or change the sizes"
    ]


def test_requires_gpu_count_raises_the_request_but_not_the_world_size() -> None:
    text = json.dumps({"name": "x", "model": {"source": "/m"}, "requires": {"gpu_count": 4}})
    layout, _ = parallel_layout(parse_profile(text))
    assert (layout.world_size, layout.gpus_per_node, layout.gpu_request) == (1, 1, 4)


def big_plan(tmp_path: Path, changes: dict[str, Any], facts: ProbeFacts | None = None) -> tuple[Plan, Any]:
    loaded = load_profile(str(profile_variant(tmp_path, "qwen-lora-hopper", changes)))
    return make_plan(loaded, facts or h100x8()), loaded


GROUP_OF_8 = {
    "serve.tensor_parallel_size": 2,
    "serve.pipeline_parallel_size": 2,
    "serve.extra_args": ["-dp", "4", "-dpl", "2"],
}


def test_render_asks_for_the_layouts_gpus_and_a_node_that_holds_fewer_is_refused(tmp_path: Path) -> None:
    """Tensor 2 × pipeline 2 × 2 of the 4 data-parallel ranks on this node = 8 GPUs: the chart and the unit
    ask for 8 (the tensor-parallel 2 before); a node with 7 is one plan error naming the product."""
    plan, loaded = big_plan(tmp_path, GROUP_OF_8)
    assert plan.errors == []
    assert gpu_count(plan, loaded) == 8
    short, _ = big_plan(tmp_path, GROUP_OF_8, h100x8().model_copy(update={"gpus": h100x8().gpus[:7]}))
    assert short.errors == [
        "needs 8 GPUs per node (tensor 2 × pipeline 2 × data-parallel 2) but the node has 7: set "
        "deploy.nodes: 2 or lower the parallel sizes"
    ]


def test_the_fleet_baselines_device_names_every_gpu_of_the_group(tmp_path: Path) -> None:
    """GPUs 4-7 of this host are another product: the group of 8 runs on both, so the baseline key's device
    names both (it named the first tensor-parallel 2 only)."""
    host = h100x8()
    host.gpus[4:] = [gpu.model_copy(update={"name": "NVIDIA H100 NVL"}) for gpu in host.gpus[4:]]
    plan, loaded = big_plan(tmp_path, GROUP_OF_8, host)
    parts, _ = key_parts_for_plan(loaded.profile, plan, {}, 5)
    assert parts["device"] == "NVIDIA H100 80GB HBM3 sm9.0, NVIDIA H100 NVL sm9.0"
    assert parts["tensor_parallel_size"] == 2  # the rest of the key is as it was


def test_the_advisories_see_every_gpu_of_the_group(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deployment facts the advisories judge hold the layout's GPUs (and the links between them): 8 for
    tensor 4 × pipeline 2, where the tensor-parallel 4 were counted before."""
    import deploykit.plan as plan_package

    seen: list[DeploymentFacts] = []

    def recorded(*args: Any, **kwargs: Any) -> DeploymentFacts:
        seen.append(deployment_facts(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(plan_package, "deployment_facts", recorded)
    big_plan(tmp_path, {"serve.tensor_parallel_size": 4, "serve.extra_args": ["-pp", "2"]})
    (deployment,) = seen
    assert [gpu.index for gpu in deployment.gpus] == list(range(8))
    assert deployment.tensor_parallel == 4


def test_the_plan_json_carries_the_layout(tmp_path: Path) -> None:
    plan, _ = big_plan(
        tmp_path, {"serve.tensor_parallel_size": 8, "deploy.nodes": 2, "serve.extra_args": ["-pp", "2"]}
    )
    data = json.loads(plan.model_dump_json())
    assert data["layout"]["world_size"] == 16 and data["layout"]["gpus_per_node"] == 8
    assert data["errors"] == []


def test_a_cpu_plan_asks_for_no_gpu(tmp_path: Path) -> None:
    """The CPU build runs tensor-parallel ranks as processes: the layout counts them, no GPU is asked for
    and the GPUs in the facts are never "too few"."""
    loaded = load_profile(str(profile_variant(tmp_path, "demo-cpu", {"serve.tensor_parallel_size": 16})))
    plan = make_plan(loaded, h100x8().model_copy(update={"vllm_version": "0.32.0+cpu"}))
    assert plan.layout.world_size == 16
    assert gpu_count(plan, loaded) == 0
    assert not any("GPUs per node" in error for error in plan.errors)


def _serve(options: dict[str, Any]) -> int:
    return run_serve(ServeOptions(**options), ConsoleUI(quiet=True))


def _trace(options: dict[str, Any]) -> int:
    return run_trace(TraceOptions(**options))[0]


@pytest.mark.parametrize("command", [_serve, _trace], ids=["serve", "trace"])
def test_serve_and_trace_refuse_a_multi_node_group_before_any_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: Callable[[dict[str, Any]], int]
) -> None:
    """`deploykit serve` and `trace` run one node's group: a plan for two nodes is refused at the plan stage
    (exit 2), in the line render gives, and the row is stored."""

    def tripwire(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model stage was reached")

    monkeypatch.setattr(attempt_module, "ensure_model", tripwire)
    monkeypatch.setattr(stages_module, "ensure_model", tripwire)
    profile = profile_variant(tmp_path, "demo-cpu", {"serve.tensor_parallel_size": 2, "deploy.nodes": 2})
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    options = {"profile": str(profile), "store_url": store_url, "log_dir": tmp_path / "logs"}
    assert command(options) == exit_codes.USAGE
    record = only_row(store_url)
    assert (record.verdict, record.stage) == ("error", "plan")
    assert record.diagnosis.startswith(
        "refused: a group over several nodes is not served from one host: deploy.nodes is 2"
    )
