"""The exact launch a plan writes: the `vllm serve` argv, the environment (secrets as references), and the
flags the profile owns, which `serve.extra_args` may not set again in any spelling."""

from __future__ import annotations

from deploykit import argv as argv_reader
from deploykit.fixes import FIX_NAMES, load_fix
from deploykit.fixes.base import DecisionInputs
from deploykit.plugin_contract import FIXES_ENV as FIXES_ENV_VAR
from deploykit.profile.schema import Profile, SecretRef
from deploykit.vllm_compat import (
    RUNNER_ENV,
    runner_env_value,
)

# Flags the typed settings own; setting them again in extra_args would be ambiguous.
_TYPED_FLAGS = {
    "--served-model-name": "model.served_name",
    "--host": "serve.host",
    "--port": "serve.port",
    "--dtype": "serve.dtype",
    "--max-model-len": "serve.max_model_len",
    "--tensor-parallel-size": "serve.tensor_parallel_size",
    "--gpu-memory-utilization": "serve.gpu_memory_utilization",
    "--enforce-eager": "serve.enforce_eager",
    "--max-num-seqs": "serve.max_num_seqs",
    "--kv-cache-memory-bytes": "serve.kv_cache_memory_bytes",
    "--generation-config": "serve.generation_config",
    "--enable-lora": "serve.lora.enabled",
    "--lora-modules": "serve.lora.adapters",
    "--max-lora-rank": "serve.lora.max_lora_rank",
    "--max-loras": "serve.lora.max_loras",
    "--api-key": "serve.api_key_env",
}


def owned_flags() -> dict[str, str]:
    """Each flag the profile's typed settings own → that setting; a fix's LAUNCH_FLAGS are `fixes.NAME`'s."""
    fix_flags = {flag: f"fixes.{name}" for name in FIX_NAMES for flag in load_fix(name).LAUNCH_FLAGS}
    return {**_TYPED_FLAGS, **fix_flags}


def secret_reference(name: str) -> str:
    return f"${{{name}}}"


def build_argv(profile: Profile, model_path: str, enabled: list[str], inputs: DecisionInputs) -> list[str]:
    serve = profile.serve
    argv = ["vllm", "serve", model_path, "--served-model-name", profile.served_name]
    argv += ["--host", serve.host, "--port", str(serve.port)]
    if serve.dtype != "auto":
        argv += ["--dtype", serve.dtype]
    optional: list[tuple[str, object | None]] = [
        ("--max-model-len", serve.max_model_len),
        ("--gpu-memory-utilization", serve.gpu_memory_utilization),
        ("--max-num-seqs", serve.max_num_seqs),
        ("--kv-cache-memory-bytes", serve.kv_cache_memory_bytes),
        ("--generation-config", serve.generation_config),
    ]
    if serve.tensor_parallel_size != 1:
        optional.append(("--tensor-parallel-size", serve.tensor_parallel_size))
    for flag, value in optional:
        if value is not None:
            argv += [flag, str(value)]
    if serve.enforce_eager:
        argv.append("--enforce-eager")
    if serve.lora.enabled:
        argv += ["--enable-lora", "--max-lora-rank", str(serve.lora.max_lora_rank)]
        argv += ["--max-loras", str(serve.lora.max_loras)]
        if serve.lora.adapters:
            argv += ["--lora-modules", *(f"{n}={p}" for n, p in serve.lora.adapters.items())]
    for name in enabled:
        argv += load_fix(name).launch_args(inputs)
    argv += serve.extra_args
    return argv


NAN_COUNTER_ENV = "VLLM_COMPUTE_NANS_IN_LOGITS"
"""Makes vLLM count requests with NaN logits (`vllm:corrupted_requests`), which the canary reads."""


def build_env(
    profile: Profile, enabled: list[str], vllm_version: str | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    env: dict[str, str] = {}
    secrets: dict[str, str] = {}
    for key, value in profile.env.items():
        if isinstance(value, SecretRef):
            env[key] = secret_reference(value.secret)
            secrets[key] = value.secret
        else:
            env[key] = value
    if profile.serve.api_key_env:
        # vLLM reads VLLM_API_KEY; the value never appears in argv.
        env["VLLM_API_KEY"] = secret_reference(profile.serve.api_key_env)
        secrets["VLLM_API_KEY"] = profile.serve.api_key_env
    runner_value = runner_env_value(vllm_version, profile.serve.model_runner)
    if runner_value is not None:
        env[RUNNER_ENV] = runner_value
    if profile.serve.count_nan_logits:
        # vLLM counts requests with NaN logits for the canary; a value the profile's env gives wins.
        env.setdefault(NAN_COUNTER_ENV, "1")
    if enabled:
        env[FIXES_ENV_VAR] = ",".join(enabled)
    return env, secrets


_SECRET_FLAGS = ("--api-key", "--hf-token")


def extra_arg_conflicts(profile: Profile) -> list[str]:
    """A flag the profile's typed settings (or a fix) own, or a secret's flag, set again in extra_args, in
    any spelling vLLM's parser reads as it (deploykit.argv.owned_flag): one line per word, naming the flag."""
    errors = []
    owned = owned_flags()
    for arg in profile.serve.extra_args:
        flag = argv_reader.owned_flag(arg, owned)
        if flag is not None:
            written = arg.split("=", 1)[0]
            spelling = "" if written == flag else f" (written {written})"
            errors.append(
                f"serve.extra_args sets {flag}{spelling}; use the profile field `{owned[flag]}` instead"
            )
        secret = argv_reader.owned_flag(arg, _SECRET_FLAGS)
        if secret is not None:
            errors.append(f"serve.extra_args must not carry {secret}: secrets never go in argv")
    return errors
