"""deploykit's errors: one root, `DeploykitError`, with the process exit code and a one-line message,
and a family per pipeline stage. The classes modules raise subclass their family (the profile loader's
`ProfileError` is a `deploykit.errors.ProfileError`), so one handler (`deploykit.cli.app.main`) turns any
of them into a code and a line, never a traceback. Every code is one of `deploykit.exit_codes`.

A message names the input it is about (the file, URL, flag or value) and the way out.
"""

from __future__ import annotations

from deploykit import exit_codes


class DeploykitError(Exception):
    """The root of every error deploykit reports to a person."""

    exit_code: int = exit_codes.FAILED

    @property
    def message(self) -> str:
        """The first line of the error, for a one-line report."""
        text = str(self).strip()
        return text.splitlines()[0] if text else type(self).__name__

    @property
    def details(self) -> list[str]:
        """Lines printed before the one-line message (a profile's located issues, say); none by default."""
        return []


class MissingPackageError(DeploykitError):
    """A command needs a Python package that is not installed. Every package deploykit depends on is there
    after a `pip install`, but its sidecars (`deploykit smoke` and `deploykit canary` in a Helm chart) run
    inside the vLLM image with only the packages vLLM brought: no SQLAlchemy, platformdirs or nvidia-ml-py.
    Such a package is imported only where it is really needed, and its absence is this one line."""

    def __init__(self, package: str, needed_for: str, way_out: str = "", pip_name: str | None = None) -> None:
        super().__init__(missing_package_message(package, needed_for, way_out, pip_name))
        self.package = package


def missing_package_message(
    package: str, needed_for: str, way_out: str = "", pip_name: str | None = None
) -> str:
    """`NEEDED_FOR needs the Python package PACKAGE, which is not installed: pip install ..., or WAY_OUT`."""
    message = (
        f"{needed_for} needs the Python package {package}, which is not installed: "
        f"pip install {pip_name or package}"
    )
    return message + (f", or {way_out}" if way_out else "")


class UsageError(DeploykitError):
    """The command line asks for something that cannot be done."""

    exit_code = exit_codes.USAGE


class ProfileError(DeploykitError):
    """A profile cannot be found, read or validated."""

    exit_code = exit_codes.USAGE


class FactsError(DeploykitError):
    """GPU facts (a saved probe file) cannot be used."""

    exit_code = exit_codes.USAGE


class PlanError(DeploykitError):
    """A plan cannot be made or has errors (vLLM's own parser refusing the argv among them)."""

    exit_code = exit_codes.USAGE


class RenderError(DeploykitError):
    """A plan cannot be rendered as a systemd unit or Helm chart, or its files cannot be written."""

    exit_code = exit_codes.USAGE


class StoreError(DeploykitError):
    """The results store cannot be opened, read or written."""


class LaunchError(DeploykitError):
    """vLLM could not be started or did not become healthy."""


class SmokeError(DeploykitError):
    """The smoke requests could not be run."""


class CanaryError(DeploykitError):
    """`deploykit canary` cannot check its server: a bad option or listen address, an API key not set, or a
    URL that is not the vLLM server it should check."""

    exit_code = exit_codes.USAGE


class FixError(DeploykitError):
    """A fix could not be applied (in vLLM's processes, through the plugin)."""
