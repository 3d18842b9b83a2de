"""Every location deploykit reads or writes: environment overrides, platformdirs, shipped data.

Each user directory is "the environment variable when set, else platformdirs". The shipped profiles and
templates live at the top of the repository and ship inside the package as `deploykit/_data/` (setup.py
copies them into every wheel); an installed deploykit reads them through `importlib.resources` whatever the
install mode (venv, `--user`, `--target`), and a source checkout or editable install, which has no
`_data/`, reads the repository's own folders. platformdirs and importlib.resources are imported inside the
functions, so importing this module costs nothing.

platformdirs is needed only when a user directory is, with no environment variable naming it. The vLLM image,
where `deploykit smoke` and `canary` run as sidecars, has no platformdirs: there a MissingPackageError names
it, with the variable (or option) that stands in for it.
"""

from __future__ import annotations

import os
from pathlib import Path

from deploykit.errors import MissingPackageError

# Owner-only directories and files are deploykit.files' job; re-exported for the modules that import
# them from here.
from deploykit.files import create_private_file as create_private_file
from deploykit.files import make_private_dirs as make_private_dirs

APP_NAME = "deploykit"
PROFILE_DIR_ENV_VAR = "DEPLOYKIT_PROFILE_DIR"
MODEL_CACHE_ENV_VAR = "DEPLOYKIT_MODEL_CACHE"
STORE_ENV_VAR = "DEPLOYKIT_STORE"
SPOOL_DIR_ENV_VAR = "DEPLOYKIT_SPOOL_DIR"  # rows kept while their store is away (deploykit.results.spool)
CACHE_DIR_ENV_VAR = "DEPLOYKIT_CACHE_DIR"  # deploykit's cache root (the vLLM option tables)

PACKAGE_DIR = Path(__file__).resolve().parent
DATA_PACKAGE_DIR = "_data"  # inside the package: where a wheel holds profiles/ and templates/
SHIPPED_DATA = ("profiles", "templates")


# --- user directories -------------------------------------------------------------------------------


def _user_dir(kind: str, env_var: str | None, below: str, *, what: str, instead: str = "") -> Path:
    """`env_var` when set, else `below` in platformdirs' user directory of that kind (config, cache, log,
    data). `what` names the directory and `instead` what else to do when platformdirs is not installed."""
    configured = os.environ.get(env_var) if env_var else None
    if configured:
        return Path(configured)
    try:
        import platformdirs
    except ImportError:
        way_out = " or ".join(part for part in (f"set ${env_var}" if env_var else "", instead) if part)
        raise MissingPackageError("platformdirs", what, way_out) from None

    finder = {
        "config": platformdirs.user_config_dir,
        "cache": platformdirs.user_cache_dir,
        "log": platformdirs.user_log_dir,
        "data": platformdirs.user_data_dir,
    }[kind]
    return Path(finder(APP_NAME)) / below


def user_profile_dir() -> Path:
    """DEPLOYKIT_PROFILE_DIR, else profiles/ in the user's config directory."""
    return _user_dir(
        "config",
        PROFILE_DIR_ENV_VAR,
        "profiles",
        what="looking up a profile by name in the user profile directory",
        instead="give the profile's path",
    )


def default_cache_dir() -> Path:
    """Where built tiny models are cached: DEPLOYKIT_MODEL_CACHE, else models/ in the user cache directory."""
    return _user_dir("cache", MODEL_CACHE_ENV_VAR, "models", what="the builtin model's cache directory")


def vllm_options_cache_dir() -> Path:
    """Where the option table of each installed vLLM version is cached (deploykit.vllm_options):
    vllm-options/ below DEPLOYKIT_CACHE_DIR, else below the user cache directory."""
    return _user_dir("cache", CACHE_DIR_ENV_VAR, "", what="the vLLM option-table cache") / "vllm-options"


def default_log_dir() -> Path:
    """Where `deploykit serve` writes vLLM's log unless told otherwise."""
    return _user_dir("log", None, "", what="the default log directory", instead="pass --log-dir")


def default_spool_root() -> Path:
    """Where rows for a store that is away are kept when not beside it (a PostgreSQL store; a SQLite store
    whose directory cannot be written): DEPLOYKIT_SPOOL_DIR, else spool/ in the user data directory."""
    return _user_dir(
        "data", SPOOL_DIR_ENV_VAR, "spool", what="the spool of rows for an unreachable results store"
    )


def default_store_url() -> str:
    """DEPLOYKIT_STORE when set, else SQLite in the user's data directory."""
    configured = os.environ.get(STORE_ENV_VAR)
    if configured:
        return configured
    data = _user_dir(
        "data",
        None,
        "",
        what="the default results store (SQLite in the user data directory)",
        instead=f"set ${STORE_ENV_VAR} or pass --store sqlite:///PATH",
    )
    return f"sqlite:///{data / 'results.sqlite'}"


# --- shipped data -----------------------------------------------------------------------------------


def packaged_data_dir(name: str, package_dir: Path | None = None) -> Path:
    """Where the package holds a shipped folder (`profiles` or `templates`), read by importlib.resources.

    `package_dir` stands in for the installed package (tests)."""
    if name not in SHIPPED_DATA:
        raise ValueError(f"no shipped data folder {name!r}; there are {', '.join(SHIPPED_DATA)}")
    if package_dir is not None:
        return package_dir / DATA_PACKAGE_DIR / name
    from importlib.resources import files

    # A package on the file system (every pip install mode) is a plain directory: its path is the Path.
    return Path(str(files(APP_NAME).joinpath(DATA_PACKAGE_DIR, name)))


def shipped_data_dir(name: str, package_dir: Path | None = None) -> Path | None:
    """The shipped `profiles` or `templates` folder: the package's own copy (any installed wheel), else the
    repository's top-level folder (a source checkout or an editable install); None when neither is there."""
    package = package_dir or PACKAGE_DIR
    for candidate in (packaged_data_dir(name, package_dir), package.parent / name):
        if candidate.is_dir():
            return candidate
    return None


def shipped_profile_dirs() -> list[Path]:
    found = shipped_data_dir("profiles")
    return [found] if found else []


def template_dir() -> Path | None:
    """The shipped templates (systemd/ and helm/), or None when this install lacks them."""
    found = shipped_data_dir("templates")
    return found if found and (found / "systemd").is_dir() and (found / "helm").is_dir() else None
