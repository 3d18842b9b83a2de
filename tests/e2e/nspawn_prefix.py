"""A root-owned Python prefix in the nspawn container, for rendered units (`render systemd --prefix`).

The canary unit's root helper runs `PREFIX/bin/python -I -S` and then the prefix's site-packages: isolated,
so neither PYTHONPATH nor the working directory can point it at this checkout. The prefix made here is a
venv configuration over this run's interpreter whose site-packages lists this checkout first and then this
run's venv, all three bound read-only at fixed places under /opt (tests/e2e/nspawn_runtime.py `CI_ROOT`), so
every command of the units, the isolated one included, runs the code under test, with the units' own
sandbox (`ProtectHome=yes`, `PrivateTmp=yes`) whatever directory the checkout was cloned into. Root-owned,
as docs/deploy.md asks of a production prefix; the root helper trusts it (the checkout is root's, as CI
clones it)."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from tests.e2e.nspawn_runtime import CHECKOUT_AT, PYTHON_AT, VENV_AT, NspawnMachine


def container_python_home(machine: NspawnMachine) -> str:
    """Where this run's interpreter prefix is in the container (its own /usr for a system Python)."""
    base = Path(sys.base_prefix).resolve()
    return PYTHON_AT if base in machine.placed_ro else str(base)


def make_prefix(machine: NspawnMachine, prefix: str, *, vllm: str | None = None) -> None:
    """`prefix`/bin/python (the checkout first), `prefix`/bin/deploykit, and `prefix`/bin/vllm: the venv's
    own, or the script text given."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    home = container_python_home(machine)
    if home == PYTHON_AT:  # its libpython, where the interpreter's build-time RUNPATH no longer points
        machine.write_file("/etc/ld.so.conf.d/deploykit-ci.conf", f"{PYTHON_AT}/lib\n")
        machine.run(["ldconfig"])
    machine.write_file(f"{prefix}/pyvenv.cfg", f"home = {home}/bin\ninclude-system-site-packages = false\n")
    machine.run(["mkdir", "-p", f"{prefix}/bin", f"{prefix}/lib/{version}/site-packages"])
    machine.run(["ln", "-sf", f"{home}/bin/{version}", f"{prefix}/bin/python"])
    venv_site = Path(sysconfig.get_paths()["purelib"]).relative_to(sys.prefix)
    machine.write_file(
        f"{prefix}/lib/{version}/site-packages/deploykit-under-test.pth",
        f"{CHECKOUT_AT}\nimport site; site.addsitedir({f'{VENV_AT}/{venv_site}'!r})\n",
    )
    machine.write_file(
        f"{prefix}/bin/deploykit", f'#!/bin/sh\nexec {prefix}/bin/python -m deploykit "$@"\n', 0o755
    )
    # the guard: vLLM's engine starts its processes by spawn, which imports this script again
    main = (
        "import sys\nfrom vllm.entrypoints.cli.main import main\n"
        "if __name__ == '__main__':\n    sys.exit(main())\n"
    )
    script = vllm or f"#!{prefix}/bin/python\n{main}"
    machine.write_file(f"{prefix}/bin/vllm", script, 0o755)


def install_root_helper(machine: NspawnMachine, rendered: Path) -> None:
    """The rendered set's root helper where the canary unit runs it, root-owned (docs/deploy.md's command)."""
    from deploykit.render.systemd import ROOT_HELPER_FILE, ROOT_HELPER_PATH

    machine.write_file(ROOT_HELPER_PATH, (rendered / ROOT_HELPER_FILE).read_text())
