"""deploykit's errors: one root, `DeploykitError`, with the process exit code and a one-line message,
and a family per pipeline stage. The classes modules raise subclass their family (the profile loader's
`ProfileError` is a `deploykit.errors.ProfileError`), so one handler (`deploykit.cli.app.main`) turns any
of them into a code and a line, never a traceback.

A message names the input it is about (the file, URL, flag or value) and the way out.
"""

from __future__ import annotations

EXIT_FAILURE = 1
EXIT_USAGE = 2


class DeploykitError(Exception):
    """The root of every error deploykit reports to a person."""

    exit_code: int = EXIT_FAILURE

    @property
    def message(self) -> str:
        """The first line of the error, for a one-line report."""
        text = str(self).strip()
        return text.splitlines()[0] if text else type(self).__name__

    @property
    def details(self) -> list[str]:
        """Lines printed before the one-line message (a profile's located issues, say); none by default."""
        return []


class UsageError(DeploykitError):
    """The command line asks for something that cannot be done."""

    exit_code = EXIT_USAGE


class ProfileError(DeploykitError):
    """A profile cannot be found, read or validated."""

    exit_code = EXIT_USAGE


class FactsError(DeploykitError):
    """GPU facts (a saved probe file) cannot be used."""

    exit_code = EXIT_USAGE


class PlanError(DeploykitError):
    """A plan cannot be made or has errors (vLLM's own parser refusing the argv among them)."""

    exit_code = EXIT_USAGE


class RenderError(DeploykitError):
    """A plan cannot be rendered as a systemd unit or Helm chart, or its files cannot be written."""

    exit_code = EXIT_USAGE


class StoreError(DeploykitError):
    """The results store cannot be opened, read or written."""


class LaunchError(DeploykitError):
    """vLLM could not be started or did not become healthy."""


class SmokeError(DeploykitError):
    """The smoke requests could not be run."""


class FixError(DeploykitError):
    """A fix could not be applied (in vLLM's processes, through the plugin)."""
