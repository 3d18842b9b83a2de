"""`deploykit canary`'s options (`CanaryOptions`: its settings, declared and checked in
`settings.CanarySettings`, and what each run needs besides) and the `CanaryConfig` they make: cases, served
name and limits from the profile, else from the server's own `/v1/models`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deploykit.canary import defaults
from deploykit.canary.rotation import rotation_for
from deploykit.canary.runner import CanaryConfig
from deploykit.canary.settings import DEFAULTS, CanarySettings, SettingRefused
from deploykit.endpoint import Endpoint
from deploykit.errors import CanaryError

if TYPE_CHECKING:
    from deploykit.profile.schema import Profile


@dataclass
class CanaryOptions:
    """`deploykit canary`'s options, as given: its settings (checked when they were made), and the rest."""

    url: str
    settings: CanarySettings = DEFAULTS
    profile: str | None = None
    model: str | None = None
    store_url: str | None = None
    store: bool = True
    api_key_env: str | None = None
    exit_on_corruption: bool = False
    watch_restarts: bool = True
    verdict_file: str | None = None
    api_key_file: str | None = None
    keep_running: bool = False
    known_hangs: tuple[str, ...] = ()
    """`--known-hang` ids: the hang advisories the deployment's plan matched (the chart and units pass
    them)."""


def check_options(options: CanaryOptions) -> None:
    """Refuse what no canary can run with, before anything starts: one CanaryError naming the option (the
    settings were checked when they were made)."""
    from deploykit.net import redact_url, server_url_problem

    problem = server_url_problem(options.url)
    if problem is not None:
        raise CanaryError(f"--url {redact_url(options.url)!r}: {problem}")


def build_config(options: CanaryOptions) -> CanaryConfig:
    """Cases, served name and limits from the profile, else from the server's own `/v1/models` (which
    then also proves the URL is vLLM). Raises CanaryError (or the profile's ProfileError)."""
    from deploykit.canary.discovery import discover_model

    check_options(options)
    from deploykit.canary.known_hangs import named_hangs

    known_hangs = named_hangs(options.known_hangs)  # a CanaryError for an id this catalog lacks
    profile = None
    profile_id = None
    if options.profile is not None:
        from deploykit.profile.load import load_profile

        loaded = load_profile(options.profile)  # a ProfileError lists its located issues, then one line
        profile, profile_id = loaded.profile, loaded.id
    endpoint = Endpoint(options.url, read_api_key(options, profile))
    if profile is not None:
        from deploykit.plan import resolve_model_path

        config = config_for_profile(
            profile,
            profile_id,
            endpoint=endpoint,
            model_path=resolve_model_path(profile),
            settings=options.settings,
            served_name=options.model,
            store_url=options.store_url,
            store=options.store,
            verdict_file=options.verdict_file,
        )
        config.identify = True
        config.api_key_file, config.keep_running = options.api_key_file, options.keep_running
        config.known_hangs = known_hangs
        from deploykit.fleet_baseline import check_for_server  # the fingerprint's key (docs/fingerprints.md)

        config.fingerprint = check_for_server(
            loaded, endpoint, store_url=options.store_url, store=options.store
        )
        return config
    served, max_len = discover_model(endpoint, options.model)
    return CanaryConfig(
        endpoint=endpoint,
        served_name=served,
        cases=rotation_for(None),
        settings=options.settings,
        max_model_len=max_len,
        store_url=options.store_url,
        store=options.store,
        verdict_file=options.verdict_file,
        api_key_file=options.api_key_file,
        keep_running=options.keep_running,
        known_hangs=known_hangs,
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
    endpoint: Endpoint,
    model_path: str | None,
    settings: CanarySettings = DEFAULTS,
    served_name: str | None = None,
    store_url: str | None = None,
    store: bool = True,
    verdict_file: str | None = None,
) -> CanaryConfig:
    """The canary of a profile's server: its rotation, served name, limits and smoke tolerances; the
    profile's smoke timeout where the settings give none; no reads of vLLM's NaN counter when the profile's
    server does not export it."""
    from deploykit.smoke import first_adapter, special_token_ids, vocab_size

    if settings.timeout_s is None:
        try:
            settings = settings.replace(timeout_s=profile.smoke.timeout_s)
        except SettingRefused as exc:
            raise CanaryError(f"the profile's smoke.timeout_s {exc.value}: {exc.reason}") from None
    if not counts_nan_logits(profile):
        settings = settings.replace(metrics_every_s=0.0)
    return CanaryConfig(
        endpoint=endpoint,
        served_name=served_name or profile.served_name,
        cases=rotation_for(profile),
        settings=settings,
        special_ids=special_token_ids(model_path),
        vocab_size=vocab_size(model_path),
        max_model_len=profile.serve.max_model_len,
        tie_tolerance=profile.smoke.tie_tolerance,
        logprob_tolerance=profile.smoke.logprob_tolerance,
        store_url=store_url,
        store=store,
        profile_name=profile.name,
        profile_id=profile_id,
        adapter=first_adapter(profile),
        verdict_file=verdict_file,
    )


def counts_nan_logits(profile: Profile) -> bool:
    """Whether the profile's vLLM exports `vllm:corrupted_requests` (its env's value wins, as in the plan)."""
    value = profile.env.get(defaults.NAN_COUNTER_ENV)
    if isinstance(value, str):
        return value.strip() not in ("", "0")
    return profile.serve.count_nan_logits
