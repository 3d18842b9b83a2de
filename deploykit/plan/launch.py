"""The exact launch a plan writes: the `vllm serve` argv, the environment (secrets as references; private by
default: vLLM's usage-stats opt-out, and the hub off for a local model), and the flags the profile owns, which
`serve.extra_args` may not set again in any spelling."""

from __future__ import annotations

from deploykit import argv as argv_reader
from deploykit.fixes import FIX_NAMES, load_fix
from deploykit.fixes.base import DecisionInputs
from deploykit.plan.layout import parallel_flags
from deploykit.plugin_contract import FIXES_ENV as FIXES_ENV_VAR
from deploykit.profile.schema import BUILTIN_PREFIX, Profile, SecretRef
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
    for flag, value in optional:
        if value is not None:
            argv += [flag, str(value)]
    argv += parallel_flags(profile)
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

# vLLM reports usage to its stats server unless one of these is exactly "1" (vLLM 0.32:
# vllm/usage/usage_lib.py, is_usage_stats_enabled; vllm/envs.py reads VLLM_DO_NOT_TRACK, else DO_NOT_TRACK).
# Every plan writes the first two unless the profile opts in (`serve.usage_stats: true`); DO_NOT_TRACK also
# turns off the Hugging Face hub's telemetry.
USAGE_STATS_OPT_OUT = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
USAGE_STATS_VARIABLES = ("VLLM_NO_USAGE_STATS", "DO_NOT_TRACK", "VLLM_DO_NOT_TRACK")
# The hub switched off (huggingface_hub reads either) when vLLM opens only local paths: serve, the systemd
# unit and the chart's vLLM container all run with it then.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def hub_sources(profile: Profile, model_path: str) -> list[tuple[str, str]]:
    """(field, hub id) for the model and each static adapter vLLM would fetch from the hub: every one that
    is not a local (absolute) path. `model_path` is the path vLLM is given (a builtin model is local)."""
    sources = [] if model_path.startswith(("/", BUILTIN_PREFIX)) else [("model.source", model_path)]
    for name, path in profile.serve.lora.adapters.items():
        if not path.startswith("/"):
            sources.append((f"serve.lora.adapters.{name}", path))
    return sources


def private_env(profile: Profile, model_path: str) -> dict[str, str]:
    """What a plan adds to keep the deployment to itself: the usage-stats opt-out (unless the profile opts
    in), and the hub switched off when every model path is local. A value the profile's env gives wins."""
    env = {} if profile.serve.usage_stats else dict(USAGE_STATS_OPT_OUT)
    if not hub_sources(profile, model_path):
        env.update(OFFLINE_ENV)
    return env


def usage_stats_conflicts(profile: Profile) -> list[str]:
    """The profile's env contradicting `serve.usage_stats`: one line per variable. Off (the default) with a
    variable that is not "1" (the only value vLLM reads as off); on with one that turns the report off."""
    errors = []
    for name in USAGE_STATS_VARIABLES:
        value = profile.env.get(name)
        if value is None:
            continue
        shown = f"{{secret: {value.secret}}}" if isinstance(value, SecretRef) else repr(value)
        if profile.serve.usage_stats and value == "1":
            errors.append(
                f"serve.usage_stats is true, but env {name}={shown} turns vLLM's usage report off: remove "
                "one of the two"
            )
        elif not profile.serve.usage_stats and value != "1":
            errors.append(
                f'env {name}={shown} would let vLLM report usage (only "1" turns it off), but '
                "serve.usage_stats is false (private, the default): remove it from env, or set "
                "`serve.usage_stats: true` to let vLLM report usage"
            )
    return errors


def build_env(
    profile: Profile, enabled: list[str], vllm_version: str | None = None, model_path: str | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """The launch env (secrets as `${NAME}` references) and each secret's host variable. `model_path`: the
    path vLLM is given (default: the profile's model.source)."""
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
    for key, value in private_env(profile, model_path or profile.model.source).items():
        env.setdefault(key, value)
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
