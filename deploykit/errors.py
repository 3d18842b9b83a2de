"""deploykit's errors: one root, `DeploykitError`, with the process exit code and a one-line message,
and a family per pipeline stage, each defined here once (tests/test_error_tree.py holds that); a module's
own error (a probe's `ProbeError`, the canary's `ListenAddressError`) subclasses its
family, so one handler (`deploykit.cli.app.main`) turns any of them into a code and a line, never a
traceback. Every code is one of `deploykit.exit_codes`.

A message names the input it is about (the file, URL, flag or value) and the way out.
"""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True)
class ProfileIssue:
    """One problem in a profile, where it is: file, line, column, field."""

    file: str
    line: int
    column: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}: {self.field}: {self.message}"


class ProfileError(DeploykitError):
    """A profile cannot be found, read or validated; `issues` lists every problem with its location."""

    exit_code = exit_codes.USAGE

    def __init__(self, issues: list[ProfileIssue]) -> None:
        self.issues = issues
        super().__init__("\n".join(str(issue) for issue in issues))

    @property
    def details(self) -> list[str]:
        return [str(issue) for issue in self.issues] if len(self.issues) > 1 else []

    @property
    def message(self) -> str:
        if len(self.issues) == 1:
            return str(self.issues[0])
        where = self.issues[0].file if self.issues else "the profile"
        return f"{len(self.issues)} problems in profile {where} (listed above); fix them and run again"


class FactsError(DeploykitError):
    """GPU facts (a saved probe file) cannot be used."""

    exit_code = exit_codes.USAGE


class PlanError(DeploykitError):
    """A plan cannot be made or has errors (vLLM's own parser refusing the argv among them)."""

    exit_code = exit_codes.USAGE


class RenderError(DeploykitError):
    """A plan cannot be rendered as a systemd unit or Helm chart, or its files cannot be written; the
    message says what to change."""

    exit_code = exit_codes.USAGE


class StoreError(DeploykitError, RuntimeError):
    """The results store cannot be opened, read or written. `spoolable`: the row may yet be written to this
    store (it is away, full, locked): keep it in the spool (deploykit.results.spool). False where it never
    will be (no SQLAlchemy, not a URL, an in-memory store)."""

    def __init__(self, message: str, *, spoolable: bool = True) -> None:
        super().__init__(message)
        self.spoolable = spoolable


class LaunchError(DeploykitError, RuntimeError):
    """vLLM could not be started or did not become healthy; `server_exit_code` is vLLM's own exit code
    (None when it did not exit), `log_tail` the end of its log. `exit_code` stays deploykit's, as for every
    `DeploykitError`."""

    def __init__(self, message: str, *, server_exit_code: int | None = None, log_tail: str = "") -> None:
        super().__init__(message)
        self.server_exit_code = server_exit_code
        self.log_tail = log_tail


class CanaryError(DeploykitError):
    """`deploykit canary` cannot check its server: a bad option or listen address, an API key not set, or a
    URL that is not the vLLM server it should check."""

    exit_code = exit_codes.USAGE


class FixError(DeploykitError, RuntimeError):
    """A fix could not be applied (in vLLM's processes, through the plugin); the message names the fix and
    the vLLM version."""
