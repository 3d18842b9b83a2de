"""Every location deploykit reads or writes: environment overrides, platformdirs, shipped data.

Each user directory is "the environment variable when set, else platformdirs"; shipped profiles and
templates are found next to the package (editable install) or under <prefix>/share/deploykit (wheel).
platformdirs is imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

APP_NAME = "deploykit"
PROFILE_DIR_ENV_VAR = "DEPLOYKIT_PROFILE_DIR"
MODEL_CACHE_ENV_VAR = "DEPLOYKIT_MODEL_CACHE"
STORE_ENV_VAR = "DEPLOYKIT_STORE"
CACHE_DIR_ENV_VAR = "DEPLOYKIT_CACHE_DIR"  # deploykit's cache root (the vLLM option tables)

PACKAGE_DIR = Path(__file__).resolve().parent


# --- user directories -------------------------------------------------------------------------------


def user_profile_dir() -> Path:
    env = os.environ.get(PROFILE_DIR_ENV_VAR)
    if env:
        return Path(env)
    from platformdirs import user_config_dir

    return Path(user_config_dir(APP_NAME)) / "profiles"


def default_cache_dir() -> Path:
    """Where built tiny models are cached."""
    env = os.environ.get(MODEL_CACHE_ENV_VAR)
    if env:
        return Path(env)
    from platformdirs import user_cache_dir

    return Path(user_cache_dir(APP_NAME)) / "models"


def default_log_dir() -> Path:
    """Where `deploykit serve` writes vLLM's log unless told otherwise."""
    from platformdirs import user_log_dir

    return Path(user_log_dir(APP_NAME))


def default_store_url() -> str:
    """DEPLOYKIT_STORE when set, else SQLite in the user's data directory."""
    configured = os.environ.get(STORE_ENV_VAR)
    if configured:
        return configured
    from platformdirs import user_data_dir

    return f"sqlite:///{Path(user_data_dir(APP_NAME)) / 'results.sqlite'}"


# --- shipped data -----------------------------------------------------------------------------------


def shipped_profile_dirs() -> list[Path]:
    """Where shipped profiles live: the repo (editable install) and <prefix>/share/deploykit (wheel)."""
    candidates = [PACKAGE_DIR.parent / "profiles", Path(sys.prefix) / "share" / APP_NAME / "profiles"]
    return [c for c in candidates if c.is_dir()]


def installed_template_dir(prefix: Path | None = None) -> Path:
    """<prefix>/share/deploykit/templates, where a wheel installs the templates."""
    return (prefix or Path(sys.prefix)) / "share" / APP_NAME / "templates"


def template_dirs(package_dir: Path | None = None, prefix: Path | None = None) -> list[Path]:
    """Where templates live: the repo (editable install), then <prefix>/share/deploykit (wheel)."""
    package = package_dir or PACKAGE_DIR
    candidates = [package.parent / "templates", installed_template_dir(prefix)]
    return [c for c in candidates if (c / "systemd").is_dir() and (c / "helm").is_dir()]


def vllm_options_cache_dir() -> Path:
    """Where the option table of each installed vLLM version is cached (deploykit.vllm_options)."""
    env = os.environ.get(CACHE_DIR_ENV_VAR)
    if env:
        return Path(env) / "vllm-options"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir(APP_NAME)) / "vllm-options"
