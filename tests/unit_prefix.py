"""The prefix the render tests give `render systemd --prefix`: a root-owned environment where a unit's sandbox
can see it, wherever this checkout lies.

A checkout (and so its `.venv`) under /root, /home or /tmp is hidden from the units (`ProtectHome=yes`,
`PrivateTmp=yes`), and `render systemd` rightly refuses such a prefix; one under a directory another user owns
(`/home/alice`) is one the canary's root helper may not trust. So the tests never pass the checkout's own
environment: this builds one of their own under `/var/lib/deploykit-tests` (`$DEPLOYKIT_TEST_PREFIX_ROOT`),
as docs/deploy.md asks of a production prefix: `bin/python` (a venv over this run's interpreter),
`bin/vllm` and `bin/deploykit`, and deploykit installed in its site-packages (a copy of this checkout's
package with its distribution metadata, so the plugin's entry point is seen in isolated mode); the other
packages come from this run's venv through a `.pth` line. One per test process, removed at its exit; one a
killed process left is removed by the next.
"""

from __future__ import annotations

import atexit
import functools
import os
import secrets
import shutil
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from deploykit.files import process_exists
from tests.vllm_harness import REPO

ROOT = Path(os.environ.get("DEPLOYKIT_TEST_PREFIX_ROOT", "/var/lib/deploykit-tests"))
_METADATA_FILES = ("METADATA", "entry_points.txt", "top_level.txt")


def _remove_stale(root: Path) -> None:
    for old in root.glob("prefix-*-*"):
        pid = old.name.split("-")[1]
        if pid.isdigit() and not process_exists(int(pid)):
            shutil.rmtree(old, ignore_errors=True)


def build_prefix(target: Path) -> Path:
    """A prefix at `target` (see the module docstring); `target` must not exist yet."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base_python = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    site = target / "lib" / version / "site-packages"
    (target / "bin").mkdir(parents=True, mode=0o755)
    site.mkdir(parents=True, mode=0o755)
    (target / "pyvenv.cfg").write_text(f"home = {base_python.parent}\ninclude-system-site-packages = false\n")
    (target / "bin" / "python").symlink_to(base_python)
    shutil.copytree(REPO / "deploykit", site / "deploykit", ignore=shutil.ignore_patterns("__pycache__"))
    distribution = metadata.distribution("vllm-deploykit")
    info = site / f"vllm_deploykit-{distribution.version}.dist-info"
    info.mkdir(mode=0o755)
    for name in _METADATA_FILES:
        text = distribution.read_text(name)
        if text is not None:
            (info / name).write_text(text)
    (site / "zz-deploykit-test-dependencies.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
    )
    for command, module in (("deploykit", "deploykit"), ("vllm", "vllm.entrypoints.cli.main")):
        script = target / "bin" / command
        script.write_text(f'#!/bin/sh\nexec {target}/bin/python -m {module} "$@"\n')
        script.chmod(0o755)
    for path in [target, *target.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() or path.parent.name == "bin" else 0o644)
    return target


@functools.cache
def unit_prefix() -> Path:
    """This test process's prefix, built on first use."""
    ROOT.mkdir(mode=0o755, parents=True, exist_ok=True)
    _remove_stale(ROOT)
    owner = os.getpid()
    target = ROOT / f"prefix-{owner}-{secrets.token_hex(4)}"
    atexit.register(_remove_own, target, owner)
    return build_prefix(target)


def _remove_own(target: Path, owner: int) -> None:
    """At exit, by the process that built it only (a forked child inherits the atexit list)."""
    if os.getpid() == owner:
        shutil.rmtree(target, ignore_errors=True)


ABSENT_PREFIX = "/opt/deploykit-not-on-this-host"
"""For tests about something else: a prefix that does not exist here is the target host's business, so
`render systemd` checks nothing of it (and it is visible to the units' sandbox)."""
