"""The baseline a fingerprint is compared with: its key (what must make answers identical) and the verdict
against the key's baseline in the results store, shared by a fleet when the store is PostgreSQL.

Serve's start-up smoke, `deploykit smoke` and the canary call `fingerprint_case`; the store records the
fingerprint with the row and settles the key's baseline in the same transaction (`Store.add`). The rule
for replicas that disagree before any baseline is confirmed: docs/fingerprints.md.
"""

from __future__ import annotations

import hashlib
import json
import platform
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploykit.results.judge import CASE_NAME as CASE_NAME
from deploykit.results.judge import judge_against as judge_against
from deploykit.smoke.fingerprint import (
    PROBE_SET_VERSION,
    Comparison,
    Fingerprint,
    normalise_dtype,
)
from deploykit.smoke.models import CaseResult, SmokeReport

if TYPE_CHECKING:
    from deploykit.endpoint import Endpoint
    from deploykit.plan import Plan
    from deploykit.profile.schema import LoadedProfile, Profile

_SAMPLE_BYTES = 64 * 1024
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def model_identity(model_path: str, revision: str | None = None) -> str:
    """What identifies the weights: a hub id with its revision, or for a local directory a hash of its
    config.json and, per weight file, its name, size and three 64 KiB samples (start, middle, end): a
    fine-tune changes every block, and hashing three blocks costs the same for 1 MB or 140 GB."""
    path = Path(model_path)
    if not path.is_dir():
        return f"{model_path}@{revision or 'default'}"
    digest = hashlib.sha256()
    config = path / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for file in sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _WEIGHT_SUFFIXES):
        size = file.stat().st_size
        digest.update(f"{file.relative_to(path)}:{size}".encode())
        with file.open("rb") as handle:
            for offset in sorted({0, max(0, size // 2 - _SAMPLE_BYTES // 2), max(0, size - _SAMPLE_BYTES)}):
                handle.seek(offset)
                digest.update(handle.read(_SAMPLE_BYTES))
    return "sha256:" + digest.hexdigest()[:32]


def cpu_name() -> str:
    """The CPU model (a CPU build's kernels differ by instruction set, so it is the CPU's "GPU product")."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_part(facts: Mapping[str, Any] | None, platform_name: str, gpus_used: int) -> str:
    """The GPU product and compute capability of the GPUs a deployment uses (`cpu: MODEL` on CPU);
    `gpus_used`: the plan's layout's GPUs on the node."""
    if platform_name == "cpu":
        return f"cpu: {cpu_name()} ({platform.machine()})"
    gpus = list((facts or {}).get("gpus") or [])[: max(1, gpus_used)]
    names = sorted({f"{g.get('name')} sm{g.get('compute_capability')}" for g in gpus})
    return ", ".join(names) or "unknown GPU"


def effective_dtype(serve_dtype: str, checkpoint_dtype: str | None) -> str:
    """The dtype the model computes in: the profile's, else the checkpoint's half precision; a float32
    checkpoint under `auto` may be cast down by vLLM, so it counts as bfloat16 (the loosest tolerance)."""
    if serve_dtype != "auto":
        return normalise_dtype(serve_dtype)
    if checkpoint_dtype in ("bfloat16", "float16"):
        return checkpoint_dtype
    return "bfloat16"


def key_digest(parts: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(dict(parts), sort_keys=True).encode()).hexdigest()[:32]


def key_parts_for_plan(
    profile: Profile, plan: Plan, fixes_active: Mapping[str, str] | None, top_k: int
) -> tuple[dict[str, Any], str]:
    """A deployment's key parts and its compute dtype: model and weights, dtype, vLLM, GPU product and
    compute capability, tensor-parallel size, active fixes, the probe set and its top-k."""
    from deploykit.plan import checkpoint_facts

    checkpoint, _ = checkpoint_facts(profile, plan.model_path)
    dtype = effective_dtype(profile.serve.dtype, checkpoint)
    argv = plan.argv
    revision = argv[argv.index("--revision") + 1] if "--revision" in argv[:-1] else None
    fixes = sorted(fixes_active) if fixes_active is not None else sorted(plan.enabled_fixes)
    parts = {
        "model": profile.model.source,
        "weights": model_identity(plan.model_path, revision),
        "dtype": dtype,
        "vllm": plan.vllm_version or plan.facts.vllm_version,
        "device": device_part(plan.facts.model_dump(mode="json"), plan.platform, plan.layout.gpu_request),
        "tensor_parallel_size": profile.serve.tensor_parallel_size,
        "fixes": fixes,
        "probe_set": PROBE_SET_VERSION,
        "top_k": top_k,
    }
    return parts, dtype


@dataclass
class FingerprintCheck:
    """What a smoke or canary needs to take a fingerprint and find its baseline."""

    key_parts: dict[str, Any]
    dtype: str
    top_k: int = 5
    store_url: str | None = None
    store: bool = True
    tolerance: float | None = None
    hostname: str = field(default_factory=socket.gethostname)

    @property
    def key(self) -> str:
        return key_digest(self.key_parts)


def fingerprint_case(
    check: FingerprintCheck,
    endpoint: Endpoint,
    served_name: str,
    *,
    readings: int,
) -> tuple[CaseResult, Fingerprint | None]:
    """Take the fingerprint (each probe within the endpoint's request deadline), compare it with its key's
    baseline: one smoke case, and the fingerprint (with its comparison) for the row."""
    import time

    from deploykit.smoke.fingerprint_probe import ProbeFailed, ProbeUnstable

    started = time.monotonic()
    case = CaseResult(
        name=CASE_NAME, kind=CASE_NAME, endpoint="/v1/completions", model=served_name, passed=False
    )
    try:
        fingerprint = _take(check, endpoint, served_name, readings)
        comparison = _compare_in_store(check, fingerprint)
        if comparison.verdict == "new" and readings < 2:
            # This reading would become the key's baseline (a canary's first run): a baseline's tolerance
            # must rest on measured noise, never on one reading's zero, so it is taken as the smoke takes it.
            fingerprint = _take(check, endpoint, served_name, 2)
            comparison = _compare_in_store(check, fingerprint)
    except ProbeFailed as exc:
        case.diagnosis, case.miss = f"the probe set could not be read: {exc}", exc.miss
        case.latency_s = round(time.monotonic() - started, 4)
        return case, None
    except ProbeUnstable as exc:
        case.diagnosis = str(exc)
        case.latency_s = round(time.monotonic() - started, 4)
        return case, None
    case.latency_s = round(time.monotonic() - started, 4)
    case.http_status, case.finish_reason = 200, "length"  # every probe answered, `ignore_eos`
    case.completion_tokens = sum(len(a.ids) for a in fingerprint.answers)
    case.first_ids = fingerprint.answers[0].ids if fingerprint.answers else []
    fingerprint.comparison = comparison
    case.passed = comparison.verdict in ("new", "match", "decides", "unchecked")
    if case.passed:
        case.text = comparison.diagnosis[:200]
        if comparison.verdict == "unchecked":
            case.warning = comparison.diagnosis
    else:
        case.diagnosis = comparison.diagnosis
    return case, fingerprint


def _take(check: FingerprintCheck, endpoint: Endpoint, served_name: str, readings: int) -> Fingerprint:
    from deploykit.smoke.fingerprint_probe import take_fingerprint

    fingerprint = take_fingerprint(
        endpoint,
        served_name,
        dtype=check.dtype,
        top_k=check.top_k,
        readings=readings,
        tolerance_override=check.tolerance,
    )
    fingerprint.key, fingerprint.key_parts = check.key, check.key_parts
    return fingerprint


def _compare_in_store(check: FingerprintCheck, fingerprint: Fingerprint) -> Comparison:
    if not check.store:
        return Comparison(
            verdict="unchecked", diagnosis="not compared: no store (--no-store) to hold a baseline"
        )
    from deploykit.errors import StoreError
    from deploykit.results.stores import open_store

    try:
        store = open_store(check.store_url)
    except StoreError as exc:
        return Comparison(verdict="unchecked", diagnosis=f"not compared: {exc}")
    try:
        baseline = store.active_baseline(check.key)
        return judge_against(fingerprint, baseline, store, check.hostname)
    except StoreError as exc:
        return Comparison(verdict="unchecked", diagnosis=f"not compared: {exc}")
    finally:
        store.close()


def check_for_server(
    loaded: LoadedProfile,
    endpoint: Endpoint,
    *,
    store_url: str | None,
    store: bool = True,
    facts_file: str | None = None,
    fixes_active: Mapping[str, str] | None = None,
    ask_fixes: bool = True,
    plan: Plan | None = None,
) -> FingerprintCheck | None:
    """The key of a server this process did not start (`deploykit smoke --url`, `deploykit canary`): the
    profile's plan on this machine's probe (or a saved one, `facts_file`) and the fixes the server reports.
    None when no plan can be made here (no NVML for a GPU profile, a plan with errors): nothing to key by.
    `plan`: the one the caller made already (`smoke --url` plans once)."""
    from deploykit.errors import DeploykitError
    from deploykit.plan import make_plan
    from deploykit.probe.load import load_facts, probe

    settings = loaded.profile.smoke.fingerprint
    if not settings.enabled:
        return None
    try:
        if plan is None:
            facts = load_facts(facts_file) if facts_file else probe()
            plan = make_plan(loaded, facts)
    except (DeploykitError, OSError, ImportError):  # e.g. the vLLM image's test pod: no NVML binding
        return None
    if plan.errors or (loaded.profile.platform != "cpu" and not plan.facts.gpus):
        return None
    if ask_fixes:
        from deploykit.smoke.fix_check import read_status

        fixes_active = read_status(endpoint, timeout_s=30.0).fixes_active
    parts, dtype = key_parts_for_plan(loaded.profile, plan, fixes_active, settings.top_k)
    return FingerprintCheck(
        key_parts=parts,
        dtype=dtype,
        top_k=settings.top_k,
        store_url=store_url,
        store=store,
        tolerance=settings.logprob_tolerance,
    )


def with_case(report: SmokeReport, case: CaseResult) -> SmokeReport:
    """The report with the fingerprint case added, before the fix check's case (which stays last: it is
    about the server's set-up, the others about its answers)."""
    from deploykit.smoke import summarise
    from deploykit.smoke.fix_check import CASE_NAME as FIX_CASE

    cases = list(report.cases)
    at = len(cases) - 1 if cases and cases[-1].name == FIX_CASE else len(cases)
    return summarise([*cases[:at], case, *cases[at:]], report.elapsed_s)
