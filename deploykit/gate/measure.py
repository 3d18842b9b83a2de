"""One live side measured: the version it reports, the profile's smoke with its known answers and the fix
check (every rank, as `serve` judges a server), the fingerprint read twice (its own noise measured), the
KV-cache capacity and, separately (`load_points`), the load sample. Every read is bounded."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from deploykit.endpoint import Endpoint
from deploykit.gate import load_sample
from deploykit.gate.model import Figures, LoadPoint, Role, Side
from deploykit.http_bounded import HEALTH_CAP_BYTES, fetch

if TYPE_CHECKING:
    from deploykit.plan import Plan
    from deploykit.profile.schema import GateSpec, Profile
    from deploykit.smoke.models import CaseResult

_CACHE_INFO = "vllm:cache_config_info"
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def server_version(endpoint: Endpoint) -> str | None:
    """The vLLM release the server says it runs (`GET /version`), None when it does not say."""
    reply = fetch(
        endpoint.at("/version"),
        deadline_s=endpoint.metrics_deadline_s,
        max_bytes=HEALTH_CAP_BYTES,
        headers=endpoint.headers(),
    )
    if not reply.ok or reply.status != 200:
        return None
    try:
        version = json.loads(reply.body).get("version")
    except (ValueError, AttributeError):
        return None
    return version if isinstance(version, str) and 0 < len(version) <= 64 else None


def kv_cache_tokens(endpoint: Endpoint) -> int | None:
    """Blocks × block size from vLLM's `cache_config_info` gauge on /metrics: how many tokens of KV cache
    the engine has, the capacity an upgrade must not shrink unnoticed. None when the page does not say."""
    from deploykit.canary.nan_counter import parse_sample

    page = load_sample.metrics_text(endpoint)
    if page is None:
        return None
    for line in page.splitlines():
        if not line.startswith(_CACHE_INFO):
            continue
        sample = parse_sample(line)
        if sample is None or sample.name != _CACHE_INFO:
            continue
        labels = dict(_LABEL.findall(sample.labels))
        blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
        if blocks.isdigit() and size.isdigit():
            return int(blocks) * int(size)
    return None


def measure_answers(
    role: Role,
    source: str,
    profile: Profile,
    plan: Plan,
    endpoint: Endpoint,
    *,
    expected_fixes: Sequence[str],
    key_for: Callable[[dict[str, str] | None, str | None], tuple[dict[str, Any], str]],
    on_case: Callable[[CaseResult], None] | None = None,
) -> Side:
    """The side's answers: smoke cases, known answers and the fix check, then the fingerprint twice.
    `key_for(fixes_active, vllm_version)` gives its key parts and compute dtype."""
    from deploykit.fleet_baseline import key_digest
    from deploykit.smoke import requests_for_profile, special_token_ids, vocab_size
    from deploykit.smoke.fingerprint_probe import ProbeFailed, ProbeUnstable, take_fingerprint
    from deploykit.smoke.fix_check import smoke_with_fix_check

    version = server_version(endpoint)
    report, status = smoke_with_fix_check(
        endpoint,
        requests_for_profile(profile),
        expected=list(expected_fixes),
        special_ids=special_token_ids(plan.model_path),
        vocab_size=vocab_size(plan.model_path),
        tie_tolerance=profile.smoke.tie_tolerance,
        logprob_tolerance=profile.smoke.logprob_tolerance,
        on_case=on_case,
    )
    parts, dtype = key_for(status.fixes_active, version)
    side = Side(
        role=role,
        source=source,
        url=endpoint.shown,
        vllm_version=version,
        key=key_digest(parts),
        key_parts=parts,
        fixes_active=status.fixes_active,
        cases=list(report.cases),
    )
    settings = profile.smoke.fingerprint
    try:
        fingerprint = take_fingerprint(
            endpoint,
            profile.served_name,
            dtype=dtype,
            top_k=settings.top_k,
            readings=2,
            tolerance_override=settings.logprob_tolerance,
        )
    except (ProbeFailed, ProbeUnstable) as exc:
        side.problem = f"the fingerprint could not be taken: {exc}"
        return side
    fingerprint.key, fingerprint.key_parts = side.key or "", parts
    side.fingerprint = fingerprint
    return side


def figures(endpoint: Endpoint, startup_s: float | None = None) -> Figures:
    """The side's figures before its load sample: KV-cache capacity and start-up time."""
    return Figures(kv_cache_tokens=kv_cache_tokens(endpoint), startup_s=startup_s)


def warm_up(endpoint: Endpoint, served_name: str, spec: GateSpec) -> None:
    """The load sample's heaviest point once, not counted: a server's first requests of a shape pay for
    compilation and allocation, which would count against whichever side is measured first."""
    load_point(endpoint, served_name, spec, max(spec.streams), salt=99_999)


def load_point(endpoint: Endpoint, served_name: str, spec: GateSpec, streams: int, salt: int) -> LoadPoint:
    return load_sample.sample(
        endpoint,
        served_name,
        streams=streams,
        requests_per_stream=spec.requests_per_stream,
        prompt_tokens=spec.prompt_tokens,
        output_tokens=spec.output_tokens,
        salt=salt,
    )
