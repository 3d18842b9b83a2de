"""A root-owned Python prefix in the nspawn container, for rendered units (`render systemd --prefix`).

The canary unit's root helper runs `PREFIX/bin/python -I`: isolated, so neither PYTHONPATH nor the working
directory can point it at this checkout. The prefix made here is a venv configuration over this run's
interpreter whose site-packages lists this checkout first and then this run's venv (both bound read-only
at the same paths), so every command of the units, the isolated one included, runs the code under test,
whatever checkout the venv's own editable install names. Root-owned, as docs/deploy.md asks of a
production prefix."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from tests.e2e.nspawn_runtime import NspawnMachine
from tests.vllm_harness import REPO


def make_prefix(machine: NspawnMachine, prefix: str, *, vllm: str | None = None) -> None:
    """`prefix`/bin/python (the checkout first), `prefix`/bin/deploykit, and `prefix`/bin/vllm: the venv's
    own, or the script text given."""
    base = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    machine.write_file(
        f"{prefix}/pyvenv.cfg", f"home = {base / 'bin'}\ninclude-system-site-packages = false\n"
    )
    machine.run(["mkdir", "-p", f"{prefix}/bin", f"{prefix}/lib/{version}/site-packages"])
    machine.run(["ln", "-sf", str(base / "bin" / version), f"{prefix}/bin/python"])
    venv_site = sysconfig.get_paths()["purelib"]
    machine.write_file(
        f"{prefix}/lib/{version}/site-packages/deploykit-under-test.pth",
        f"{REPO}\nimport site; site.addsitedir({venv_site!r})\n",
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
