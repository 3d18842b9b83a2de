"""deploykit's errors: one root, `DeploykitError`, with the process exit code and a one-line message,
and a family per pipeline stage. The classes modules raise subclass their family (the profile loader's
`ProfileError` is a `deploykit.errors.ProfileError`), so one handler can turn any into a code and a line.
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


class UsageError(DeploykitError):
    """The command line asks for something that cannot be done."""

    exit_code = EXIT_USAGE


class ProfileError(DeploykitError):
    """A profile cannot be found, read or validated."""

    exit_code = EXIT_USAGE


class FactsError(DeploykitError):
    """GPU facts (a saved probe file) cannot be used."""

    exit_code = EXIT_USAGE


class RenderError(DeploykitError):
    """A plan cannot be rendered as a systemd unit or Helm chart."""

    exit_code = EXIT_USAGE


class StoreError(DeploykitError):
    """The results store cannot be opened, read or written."""


class LaunchError(DeploykitError):
    """vLLM could not be started or did not become healthy."""


class SmokeError(DeploykitError):
    """The smoke requests could not be run."""
