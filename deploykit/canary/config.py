"""The canary's settings, declared and checked once (`CanarySettings`), `deploykit canary`'s options, and
the `CanaryConfig` they make: cases, served name and limits from the profile, else from the server's own
`/v1/models`.

Every command that runs a canary (`deploykit canary`, `deploykit serve --canary-every`, the units and the
chart that `render` writes, which run `deploykit canary`) checks its timing through `CanarySettings`, not
only through the CLI's option types: a canary that sends its runs back to back (`every_s` 0.01 or NaN) is
a load generator, and one with a zero timeout only ever misses.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from deploykit.canary import defaults
from deploykit.canary.rotation import rotation_for
from deploykit.canary.runner import CanaryConfig
from deploykit.errors import CanaryError

if TYPE_CHECKING:
    from deploykit.profile.schema import Profile

MIN_EVERY_S = defaults.MIN_EVERY_S
"""The shortest interval: a canary next to user traffic must leave it room."""


class CanarySettings(BaseModel):
    """How often the canary runs, how long it waits, how often it reads vLLM's NaN counter, how many misses
    it allows: the one place these are declared and checked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    every_s: float = defaults.EVERY_S
    timeout_s: float | None = None
    metrics_every_s: float = defaults.METRICS_EVERY_S
    miss_limit: int = defaults.MISS_LIMIT

    @field_validator("every_s")
    @classmethod
    def _every(cls, value: float) -> float:
        if not (math.isfinite(value) and value >= MIN_EVERY_S):
            raise ValueError(f"must be a number of seconds of at least {MIN_EVERY_S:g} between runs")
        return value

    @field_validator("timeout_s")
    @classmethod
    def _timeout(cls, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError("must be a positive number of seconds per request")
        return value

    @field_validator("metrics_every_s")
    @classmethod
    def _metrics_every(cls, value: float) -> float:
        if not (math.isfinite(value) and (value == 0 or value >= MIN_EVERY_S)):
            raise ValueError(
                f"must be 0 (off) or a number of seconds of at least {MIN_EVERY_S:g} between reads of the "
                "server's /metrics"
            )
        return value

    @field_validator("miss_limit")
    @classmethod
    def _miss_limit(cls, value: int) -> int:
        if value < 1:
            raise ValueError("must be at least 1")
        return value


CANARY_FLAGS = {
    "every_s": "--every",
    "timeout_s": "--timeout",
    "metrics_every_s": "--metrics-every",
    "miss_limit": "--miss-limit",
}
"""`deploykit canary`'s option for each setting."""

SERVE_FLAGS = {"every_s": "--canary-every"}
"""`deploykit serve`'s option for each setting it takes (the rest are the defaults)."""


def check_settings(flags: dict[str, str] | None = None, **values: float | int | None) -> CanarySettings:
    """`CanarySettings(**values)`, or one CanaryError naming the option (`flags`: setting → option, by
    default `deploykit canary`'s) and the value given."""
    names = CANARY_FLAGS if flags is None else flags
    try:
        return CanarySettings.model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else ""
        message = str(error["msg"]).removeprefix("Value error, ")
        raise CanaryError(f"{names.get(field, field)} {values.get(field)}: {message}") from None


@dataclass
class CanaryOptions:
    """`deploykit canary`'s options, as given."""

    url: str
    profile: str | None = None
    model: str | None = None
    every_s: float = defaults.EVERY_S
    listen: str = defaults.LISTEN
    store_url: str | None = None
    store: bool = True
    api_key_env: str | None = None
    timeout_s: float | None = None
    miss_limit: int = defaults.MISS_LIMIT
    exit_on_corruption: bool = False
    watch_restarts: bool = True
    verdict_file: str | None = None
    metrics_every_s: float = defaults.METRICS_EVERY_S
    api_key_file: str | None = None
    keep_running: bool = False


def check_options(options: CanaryOptions) -> CanarySettings:
    """Refuse what no canary can run with, before anything starts: one CanaryError naming the option."""
    from deploykit.net import redact_url, server_url_problem

    problem = server_url_problem(options.url)
    if problem is not None:
        raise CanaryError(f"--url {redact_url(options.url)!r}: {problem}")
    return check_settings(
        every_s=options.every_s,
        timeout_s=options.timeout_s,
        metrics_every_s=options.metrics_every_s,
        miss_limit=options.miss_limit,
    )


def build_config(options: CanaryOptions) -> CanaryConfig:
    """Cases, served name and limits from the profile, else from the server's own `/v1/models` (which
    then also proves the URL is vLLM). Raises CanaryError (or the profile's ProfileError)."""
    from deploykit.canary.discovery import discover_model

    check_options(options)
    profile = None
    profile_id = None
    if options.profile is not None:
        from deploykit.profile.load import load_profile

        loaded = load_profile(options.profile)  # a ProfileError lists its located issues, then one line
        profile, profile_id = loaded.profile, loaded.id
    api_key = read_api_key(options, profile)
    if profile is not None:
        from deploykit.plan import resolve_model_path

        config = config_for_profile(
            profile,
            profile_id,
            url=options.url,
            model_path=resolve_model_path(profile),
            every_s=options.every_s,
            api_key=api_key,
            served_name=options.model,
            timeout_s=options.timeout_s,
            miss_limit=options.miss_limit,
            store_url=options.store_url,
            store=options.store,
            verdict_file=options.verdict_file,
            metrics_every_s=options.metrics_every_s,
        )
        config.identify = True
        config.api_key_file, config.keep_running = options.api_key_file, options.keep_running
        from deploykit.fleet_baseline import check_for_server  # the fingerprint's key (docs/fingerprints.md)

        config.fingerprint = check_for_server(
            loaded, options.url, api_key=api_key, store_url=options.store_url, store=options.store
        )
        return config
    served, max_len = discover_model(options.url, api_key, options.model)
    return CanaryConfig(
        url=options.url,
        served_name=served,
        cases=rotation_for(None),
        every_s=options.every_s,
        timeout_s=options.timeout_s or defaults.REQUEST_TIMEOUT_S,
        api_key=api_key,
        max_model_len=max_len,
        miss_limit=options.miss_limit,
        store_url=options.store_url,
        store=options.store,
        verdict_file=options.verdict_file,
        metrics_every_s=options.metrics_every_s,
        api_key_file=options.api_key_file,
        keep_running=options.keep_running,
    )


def read_api_key(options: CanaryOptions, profile: Profile | None) -> str | None:
    """The key from `--api-key-file` (read again before every run), else from the variable `--api-key-env`
    or the profile's `api_key_env` names; a CanaryError (never the value) when it cannot be had."""
    if options.api_key_file is not None:
        from deploykit.canary.api_key import read_api_key_file

        return read_api_key_file(options.api_key_file)
    key_env = options.api_key_env or (profile.serve.api_key_env if profile else None)
    from deploykit.net import SecretRefused, secret_from_env

    try:
        api_key = secret_from_env(key_env, os.environ) if key_env else None
    except SecretRefused as exc:
        raise CanaryError(str(exc)) from None
    if key_env and not api_key:
        raise CanaryError(f"the API key variable {key_env} is not set")
    return api_key


def config_for_profile(
    profile: Profile,
    profile_id: str | None,
    *,
    url: str,
    model_path: str | None,
    every_s: float = defaults.EVERY_S,
    api_key: str | None = None,
    served_name: str | None = None,
    timeout_s: float | None = None,
    miss_limit: int = defaults.MISS_LIMIT,
    store_url: str | None = None,
    store: bool = True,
    verdict_file: str | None = None,
    metrics_every_s: float = defaults.METRICS_EVERY_S,
) -> CanaryConfig:
    """The canary of a profile's server: its rotation, served name, limits and smoke tolerances; no reads
    of vLLM's NaN counter when the profile's server does not export it."""
    from deploykit.smoke import first_adapter, special_token_ids, vocab_size

    return CanaryConfig(
        url=url,
        served_name=served_name or profile.served_name,
        cases=rotation_for(profile),
        every_s=every_s,
        timeout_s=timeout_s or profile.smoke.timeout_s,
        api_key=api_key,
        special_ids=special_token_ids(model_path),
        vocab_size=vocab_size(model_path),
        max_model_len=profile.serve.max_model_len,
        tie_tolerance=profile.smoke.tie_tolerance,
        logprob_tolerance=profile.smoke.logprob_tolerance,
        miss_limit=miss_limit,
        store_url=store_url,
        store=store,
        profile_name=profile.name,
        profile_id=profile_id,
        adapter=first_adapter(profile),
        verdict_file=verdict_file,
        metrics_every_s=metrics_every_s if counts_nan_logits(profile) else 0.0,
    )


def counts_nan_logits(profile: Profile) -> bool:
    """Whether the profile's vLLM exports `vllm:corrupted_requests` (its env's value wins, as in the plan)."""
    value = profile.env.get(defaults.NAN_COUNTER_ENV)
    if isinstance(value, str):
        return value.strip() not in ("", "0")
    return profile.serve.count_nan_logits
