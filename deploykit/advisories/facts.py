"""The facts advisories are matched on: the machine's (probe), the model's (config.json or the profile),
and the serving features, read from the argv and environment the plan builds (never declared twice).

A fact that is None is unknown (a hub model's config, facts saved before links were probed, no profile
given): a condition on it is neither met nor failed, and `deploykit advisories` says which fact it lacks.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from deploykit import argv as argv_reader
from deploykit.advisories.compute_dtype import ComputeDtype, quantization_method
from deploykit.probe.facts import GpuFacts, GpuLink, ProbeFacts
from deploykit.vllm_compat import parse_version, v1_runner_removed
from deploykit.vllm_tables import flashinfer_pin

# vLLM 0.14.0 turned async scheduling on by default (PR #33352's description).
ASYNC_SCHEDULING_DEFAULT_SINCE = (0, 14, 0)
# vLLM's release notes for 0.11.0: "turns on FULL_AND_PIECEWISE as the CUDA graph mode default".
FULL_AND_PIECEWISE_DEFAULT_SINCE = (0, 11, 0)
# vllm/engine/arg_utils.py (0.32) get_batch_defaults, OPENAI_API_SERVER on CUDA: 1024 sequences on GPUs of
# at least 160 GiB, or of at least 70 GiB that are not an A100; 256 otherwise.
_GIB_MIB = 1024


class DeploymentFacts(BaseModel):
    """Everything an advisory condition may look at; pure data so matching is a pure function."""

    model_config = ConfigDict(extra="forbid")

    vllm_version: str | None = None
    platform: str | None = None
    gpus: list[GpuFacts] = Field(default_factory=list, description="the GPUs the deployment uses")
    gpu_links: list[GpuLink] | None = None
    architectures: list[str] | None = None
    checkpoint_dtype: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    attention_backend: str | None = None
    cudagraph_mode: str | None = None
    tensor_parallel: int | None = None
    lora: bool | None = None
    speculative_decoding: bool | None = None
    prefix_caching: bool | None = None
    async_scheduling: bool | None = None
    sequence_parallelism: bool | None = None
    flashinfer_version: str | None = None
    penalties: bool | None = None
    model_runner: str | None = None
    max_num_seqs: int | None = None
    vocab_size: int | None = None
    speculative_method: str | None = None
    tool_calling: bool | None = None
    mamba_cache_mode: str | None = None
    kv_connector: str | None = None
    cpu_offload: bool | None = None
    expert_parallel: bool | None = None
    nodes: int | None = None
    data_parallel: int | None = None
    tensor_parallel_spans_nodes: bool | None = None
    moe_backend: str | None = None
    gdn_prefill_backend: str | None = None
    env: dict[str, str] = Field(default_factory=dict)

    @property
    def penalty_table_mib(self) -> int | None:
        """The V2 model runner's penalty state per GPU: int32[max_num_seqs, vocab] bin counts plus an
        int32[max_num_seqs, ceil(vocab/32)] bitmask (vllm/v1/worker/gpu/sample/penalties.py, 0.32)."""
        if self.max_num_seqs is None or self.vocab_size is None:
            return None
        words = self.max_num_seqs * (self.vocab_size + -(-self.vocab_size // 32))
        return (4 * words) // (1024 * 1024)


def machine_facts(
    facts: ProbeFacts, *, vllm_version: str | None, platform: str, gpu_count: int
) -> DeploymentFacts:
    """Only what the probe knows: for `deploykit advisories --facts F` without a profile. The runner is
    known without a profile only where the release has one runner (V2 from 0.34)."""
    used = facts.gpus[: max(gpu_count, 1)]
    return DeploymentFacts(
        vllm_version=vllm_version,
        platform=facts_platform(facts, platform),
        gpus=used,
        gpu_links=_links_between(facts.gpu_links, used),
        model_runner="v2" if v1_runner_removed(vllm_version) else None,
        flashinfer_version=flashinfer_version(facts, vllm_version),
    )


def facts_platform(facts: ProbeFacts, platform: str) -> str:
    """`rocm` or `xpu` when the (hand-written) facts say so and the plan is for GPUs; else the plan's."""
    if platform != "cpu" and facts.platform in ("rocm", "xpu"):
        return facts.platform
    return platform


def flashinfer_version(facts: ProbeFacts, vllm_version: str | None) -> str | None:
    """The facts' FlashInfer when they carry one, else the one the target vLLM release's wheel pins (its
    release table, written from the wheel's METADATA by `make vllm-release`; the 0.32 CPU build names none,
    and a release without a table is unknown)."""
    if facts.flashinfer_version:
        return facts.flashinfer_version
    return flashinfer_pin(vllm_version)


def deployment_facts(
    facts: ProbeFacts,
    *,
    argv: list[str],
    env: dict[str, str],
    vllm_version: str | None,
    platform: str,
    gpu_count: int,
    architectures: list[str],
    checkpoint_dtype: str | None,
    compute: ComputeDtype,
    model_config: dict[str, Any],
    penalties: bool,
    model_runner: str,
    nodes: int = 1,
    data_parallel: int = 1,
    gpus_per_node: int | None = None,
) -> DeploymentFacts:
    """The facts of one planned deployment; serving features come from its argv and env, the compute dtype
    from the plan's one resolution of it (deploykit.advisories.compute_dtype). `gpu_count`: the GPUs of one
    node the deployment uses, the plan's parallel layout's count (deploykit.plan.layout, never recounted)."""
    tensor_parallel = _number(argv, "--tensor-parallel-size", int) or 1
    used = facts.gpus[: max(gpu_count, 1)]
    eager = bool(argv_reader.flag_switch(argv, "--enforce-eager"))
    compilation = argv_reader.json_option(argv, "--compilation-config")
    backend = (
        argv_reader.flag_value(argv, "--attention-backend") or env.get("VLLM_ATTENTION_BACKEND") or "auto"
    )
    max_num_seqs = argv_reader.flag_value(argv, "--max-num-seqs")
    enable_sp = compilation.get("pass_config", {})
    sequence_parallel = isinstance(enable_sp, dict) and bool(
        enable_sp.get("enable_sp") or enable_sp.get("fuse_gemm_comms")
    )
    prefix_caching = argv_reader.flag_switch(argv, "--enable-prefix-caching") is not False
    speculative = argv_reader.json_option(argv, "--speculative-config")
    return DeploymentFacts(
        vllm_version=vllm_version,
        platform=facts_platform(facts, platform),
        gpus=used,
        gpu_links=_links_between(facts.gpu_links, used),
        architectures=architectures or None,
        checkpoint_dtype=checkpoint_dtype,
        dtype=compute.dtype,
        quantization=quantization_method(argv, model_config),
        kv_cache_dtype=(argv_reader.flag_value(argv, "--kv-cache-dtype") or "auto").lower(),
        attention_backend=backend if backend == "auto" else backend.upper(),
        cudagraph_mode=_cudagraph_mode(eager, compilation, vllm_version),
        tensor_parallel=tensor_parallel,
        lora=bool(argv_reader.flag_switch(argv, "--enable-lora")),
        speculative_decoding=argv_reader.flag_value(argv, "--speculative-config") is not None,
        prefix_caching=prefix_caching,
        async_scheduling=_async_scheduling(argv, vllm_version),
        sequence_parallelism=sequence_parallel,
        flashinfer_version=flashinfer_version(facts, vllm_version),
        penalties=penalties,
        model_runner=model_runner,
        max_num_seqs=_number(argv, "--max-num-seqs", int)
        if max_num_seqs
        else _default_max_num_seqs(used, platform),
        vocab_size=_vocab_size(model_config),
        speculative_method=_speculative_method(speculative),
        tool_calling=bool(argv_reader.flag_switch(argv, "--enable-auto-tool-choice")),
        mamba_cache_mode=_mamba_cache_mode(argv, prefix_caching),
        kv_connector=_kv_connector(argv_reader.json_option(argv, "--kv-transfer-config")),
        cpu_offload=_offloads(argv),
        expert_parallel=bool(argv_reader.flag_switch(argv, "--enable-expert-parallel")),
        nodes=nodes,
        data_parallel=data_parallel,
        tensor_parallel_spans_nodes=tensor_parallel > (gpus_per_node or tensor_parallel),
        moe_backend=(argv_reader.flag_value(argv, "--moe-backend") or "auto").lower(),
        gdn_prefill_backend=(argv_reader.flag_value(argv, "--gdn-prefill-backend") or "auto").lower(),
        env=dict(env),
    )


def _number(argv: list[str], flag: str, kind: type[int] | type[float]) -> int | float | None:
    """A numeric option's value; None (unknown) when the argv's text is no number: the plan's validation of
    the argv against vLLM's option table names that mistake in one line, which a crash here would hide."""
    text = argv_reader.flag_value(argv, flag)
    try:
        return None if text is None else kind(text)
    except ValueError:
        return None


def _offloads(argv: list[str]) -> bool | None:
    if argv_reader.flag_value(argv, "--cpu-offload-gb") is None:
        return False
    size = _number(argv, "--cpu-offload-gb", float)
    return None if size is None else size > 0


def _speculative_method(config: dict[str, Any]) -> str:
    """vLLM's own reading of --speculative-config (config/speculative.py, 0.34): every `*_mtp` method is
    MTP, `model: ngram` is n-gram, and a draft `model` without a method is a draft model (vLLM detects the
    method from the draft checkpoint and falls back to draft_model; deploykit does not read the draft's
    config, so an EAGLE head named only by `model` reads as draft_model); `none` without speculation."""
    if not config:
        return "none"
    method = config.get("method")
    if isinstance(method, str) and method:
        return "mtp" if method.lower().endswith("mtp") else method.lower()
    model = config.get("model")
    if model in ("ngram", "[ngram]"):
        return "ngram"
    return "draft_model" if model else "none"


def _mamba_cache_mode(argv: list[str], prefix_caching: bool) -> str:
    """The argv's --mamba-cache-mode, else what vLLM picks for a hybrid model: `align` under prefix caching,
    `none` without (model_executor/models/config.py, 0.33 and 0.34). Only hybrid models read it."""
    stated = argv_reader.flag_value(argv, "--mamba-cache-mode")
    if stated:
        return stated.lower()
    return "align" if prefix_caching else "none"


def _kv_connector(config: dict[str, Any]) -> str:
    connector = config.get("kv_connector")
    return connector if isinstance(connector, str) and connector else "none"


def _links_between(links: list[GpuLink] | None, used: list[GpuFacts]) -> list[GpuLink] | None:
    if links is None:
        return None
    indexes = {gpu.index for gpu in used}
    return [link for link in links if set(link.gpus) <= indexes]


def _async_scheduling(argv: list[str], vllm_version: str | None) -> bool | None:
    stated = argv_reader.flag_switch(argv, "--async-scheduling")
    if stated is not None:
        return stated
    parsed = parse_version(vllm_version)
    return None if parsed is None else parsed >= ASYNC_SCHEDULING_DEFAULT_SINCE


def _cudagraph_mode(eager: bool, compilation: dict[str, Any], vllm_version: str | None) -> str:
    if eager:
        return "NONE"
    mode = compilation.get("cudagraph_mode")
    if isinstance(mode, str):
        return mode.upper()
    parsed = parse_version(vllm_version)
    if parsed is not None and parsed < FULL_AND_PIECEWISE_DEFAULT_SINCE:
        return "PIECEWISE"
    return "FULL_AND_PIECEWISE"


def _default_max_num_seqs(gpus: list[GpuFacts], platform: str) -> int | None:
    if platform != "cuda" or not gpus or gpus[0].memory_total_mib is None:
        return None
    mib = gpus[0].memory_total_mib
    if mib >= 160 * _GIB_MIB or (mib >= 70 * _GIB_MIB and "a100" not in gpus[0].name.lower()):
        return 1024
    return 256


def _vocab_size(config: dict[str, Any]) -> int | None:
    for source in (config, config.get("text_config")):
        if isinstance(source, dict) and isinstance(source.get("vocab_size"), int):
            return int(source["vocab_size"])
    return None
