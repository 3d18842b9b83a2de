"""`deploykit render probe-job`: the Job that runs `deploykit probe` on a GPU node, its manifest alone.

Validated against the Kubernetes schemas (kubernetes-validate, strict), admitted by Pod Security
"restricted", its command and the wheel's ConfigMap as the pod reads them, its placement, and every bad
option refused with one line. The pod itself is played in podman by tests/e2e/test_probe_job_e2e.py.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import importlib.util
import io
import sys
import zipfile
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from deploykit.cli.app import app
from deploykit.errors import RenderError
from deploykit.render.plugin_wheel import PluginWheel, build_plugin_wheel, wheel_filename
from deploykit.render.probe_job import PROBE_PROGRAM, probe_job, render_probe_job
from tests.cli_runner import CliRunner
from tests.render.test_helm import KUBERNETES_VERSIONS
from tests.render.test_helm_restricted import restricted_violations

IMAGE = "vllm/vllm-openai:v0.32.0"


@pytest.fixture(scope="module")
def real_wheel() -> PluginWheel:
    return build_plugin_wheel()


@pytest.fixture(scope="module")
def wheel() -> PluginWheel:
    """A stand-in of a few bytes where the wheel's content does not matter (dumping and parsing the real
    one's 1.1 MB of base64 takes most of a second each time)."""
    data = b"PK\x05\x06" + bytes(18)
    return PluginWheel(filename=wheel_filename(), data=data, sha256=hashlib.sha256(data).hexdigest())


def rendered(wheel: PluginWheel, **options: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(file name, ConfigMap, Job) as `render probe-job` writes them."""
    result = render_probe_job(probe_job(options.pop("image", IMAGE), **options), wheel)
    (file,) = result.files
    assert isinstance(file.content, str)
    configmap, job = (doc for doc in yaml.load_all(file.content, Loader=yaml.CSafeLoader) if doc)
    return file.path, configmap, job


def pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_manifests_validate_against_the_kubernetes_schemas(wheel: PluginWheel, version: str) -> None:
    _, configmap, job = rendered(wheel, node="gpu-1.example", node_selector=["nvidia.com/gpu.present=true"])
    for doc in (configmap, job):
        kubernetes_validate.validate(doc, version, strict=True)
    broken = copy.deepcopy(job)
    broken["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = [1]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)
    broken = copy.deepcopy(job)
    broken["spec"]["ttlSecondsAfterFinish"] = broken["spec"].pop("ttlSecondsAfterFinished")  # strict: refused
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def test_the_pod_is_restricted_runs_once_and_goes_away(wheel: PluginWheel) -> None:
    _, _, job = rendered(wheel)
    spec = pod_spec(job)
    assert restricted_violations(spec) == []
    (container,) = spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] != 0
    assert spec["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    assert job["spec"]["ttlSecondsAfterFinished"] > 0 and job["spec"]["activeDeadlineSeconds"] > 0
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert "initContainers" not in spec and "hostNetwork" not in spec


def test_the_command_runs_the_probe_from_the_wheel_of_the_configmap(real_wheel: PluginWheel) -> None:
    wheel = real_wheel
    name, configmap, job = rendered(wheel)
    assert name == "deploykit-probe.yaml" and job["metadata"]["name"] == "deploykit-probe"
    spec = pod_spec(job)
    (container,) = spec["containers"]
    assert container["image"] == IMAGE
    assert container["command"] == ["python3", "-c", PROBE_PROGRAM]
    assert '"deploykit", "probe", "--format", "json"' in PROBE_PROGRAM
    compile(PROBE_PROGRAM, "probe-job", "exec")
    env = {item["name"]: item["value"] for item in container["env"]}
    (mount,) = container["volumeMounts"]
    assert env["PYTHONPATH"] == f"{mount['mountPath']}/{wheel.filename}" and mount["readOnly"] is True
    (volume,) = spec["volumes"]
    assert volume["name"] == mount["name"]
    assert (
        volume["configMap"]["name"]
        == configmap["metadata"]["name"]
        == f"deploykit-probe-plugin-{wheel.sha256[:12]}"
    )
    assert volume["configMap"]["items"] == [{"key": wheel.filename, "path": wheel.filename}]
    assert configmap["immutable"] is True
    data = base64.b64decode(configmap["binaryData"][wheel.filename])
    assert data == wheel.data and hashlib.sha256(data).hexdigest() == wheel.sha256
    assert configmap["metadata"]["annotations"]["deploykit.io/wheel-sha256"] == wheel.sha256
    # The wheel carries what `python3 -m deploykit probe` imports; the renderer of this Job stays out of it.
    names = set(zipfile.ZipFile(io.BytesIO(data)).namelist())
    for module in ("__main__.py", "cli/app.py", "cli/probe.py", "probe/nvml_reader.py", "installed.py"):
        assert f"deploykit/{module}" in names, module
    assert "deploykit/render/probe_job.py" not in names


def run_program(monkeypatch: pytest.MonkeyPatch, exit_code: int | None, stderr: str) -> object:
    """The container's program, its `deploykit` a stand-in that writes `stderr` and exits `exit_code`; what
    it exited with (None: it ended without raising)."""
    import deploykit.cli

    def main() -> None:
        assert sys.argv == ["deploykit", "probe", "--format", "json"]
        sys.stderr.write(stderr)
        raise SystemExit(exit_code)

    monkeypatch.setattr(deploykit.cli, "main", main)
    monkeypatch.setattr(sys, "argv", ["python3", "-c"])
    try:
        exec(PROBE_PROGRAM, {})
    except SystemExit as exc:
        return exc.code
    return None


@pytest.mark.parametrize(
    ("probe_exit", "stderr", "job_exit", "shown"),
    [
        (0, "", None, ""),
        (None, "", None, ""),
        (4, "deploykit: probe: NVML could not start\n", None, ""),
        (2, "deploykit: a usage error\n", 2, "deploykit: a usage error\n"),
        (1, "deploykit: internal error: KeyError\n", 1, "deploykit: internal error: KeyError\n"),
    ],
)
def test_the_log_is_the_facts_and_only_a_failed_probe_fails_the_job(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    probe_exit: int | None,
    stderr: str,
    job_exit: int | None,
    shown: str,
) -> None:
    """No GPU (the probe's exit 4) leaves facts that say so: the pod ends 0, and the probe's stderr line stays
    out of the log (`kubectl logs` mixes both streams); any other failure keeps its exit status and shows
    its stderr."""
    assert run_program(monkeypatch, probe_exit, stderr) == job_exit
    assert capsys.readouterr().err == shown


def test_a_crash_shows_its_stderr_and_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import deploykit.cli

    def main() -> None:
        sys.stderr.write("half a line")
        raise RuntimeError("crashed")

    monkeypatch.setattr(deploykit.cli, "main", main)
    monkeypatch.setattr(sys, "argv", ["python3", "-c"])
    with pytest.raises(RuntimeError, match="crashed"):
        exec(PROBE_PROGRAM, {})
    assert capsys.readouterr().err == "half a line"


def test_without_nvidia_ml_py_the_program_reads_nvml_through_vllms_copy(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM's images have no pynvml module of their own (tests/fixtures/vllm-image/): the program loads vLLM's
    copy, vllm/third_party/pynvml.py, as `pynvml`, without importing vLLM (nor torch)."""
    found = importlib.util.find_spec("vllm")
    if found is None or not found.submodule_search_locations:
        pytest.skip("no vLLM installed here")
    copy_path = Path(next(iter(found.submodule_search_locations))) / "third_party" / "pynvml.py"
    assert copy_path.is_file(), copy_path
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` fails, as in the image
    assert run_program(monkeypatch, 0, "") is None
    loaded = sys.modules["pynvml"]
    assert loaded is not None and Path(str(loaded.__file__)) == copy_path
    assert callable(loaded.nvmlInit) and issubclass(loaded.NVMLError_LibraryNotFound, loaded.NVMLError)
    assert "vllm" not in sys.modules and "torch" not in sys.modules
    capsys.readouterr()


def test_the_pod_asks_for_gpus_and_goes_where_it_is_told(wheel: PluginWheel) -> None:
    _, _, job = rendered(wheel)
    spec = pod_spec(job)
    (container,) = spec["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in container["resources"]["requests"]  # an extended resource: limits only
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert "affinity" not in spec and "nodeSelector" not in spec and "nodeName" not in spec

    name, _, job = rendered(
        wheel, gpus=8, node="ip-10-0-1-5.ec2.internal", node_selector=["nvidia.com/gpu.present=true", "pool="]
    )
    spec = pod_spec(job)
    assert name == "deploykit-probe-ip-10-0-1-5-ec2-internal.yaml"
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": ""}
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term == {
        "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["ip-10-0-1-5.ec2.internal"]}]
    }
    assert rendered(wheel, node="n1", name="probe-a")[0] == "probe-a.yaml"
    digest = "sha256:" + "ab" * 32
    assert (
        pod_spec(rendered(wheel, image=f"registry.example:5000/team/vllm@{digest}")[2])["containers"][0][
            "image"
        ]
        == f"registry.example:5000/team/vllm@{digest}"
    )


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"image": "vllm/vllm-openai"}, "--image vllm/vllm-openai: name its tag or digest"),
        (
            {"image": "vllm/vllm-openai:v1\nkind: Secret"},
            "--image 'vllm/vllm-openai:v1\\nkind: Secret': not an",
        ),
        ({"image": "Vllm/Openai:v1"}, "not an image reference"),
        ({"image": "vllm/vllm-openai:v1 --x"}, "not an image reference"),
        ({"node": "GPU_node"}, "--node 'GPU_node': not a node name"),
        ({"node": "a" * 254}, "not a node name"),
        ({"node_selector": ["pool"]}, "--node-selector 'pool': expected KEY=VALUE"),
        ({"node_selector": ["-bad=x"]}, "expected KEY=VALUE"),
        ({"node_selector": ["pool=a b"]}, "expected KEY=VALUE"),
        ({"node_selector": ["pool=a", "pool=b"]}, "--node-selector pool: given twice"),
        ({"name": "a" * 64}, "--name 'aaaa"),
        ({"name": "Probe"}, "--name 'Probe'"),
        ({"gpus": 0}, "--gpus 0:"),
        ({"gpus": 65}, "--gpus 65:"),
    ],
)
def test_bad_options_are_refused_with_one_line(options: dict[str, Any], names: str) -> None:
    image = options.pop("image", IMAGE)
    with pytest.raises(RenderError) as refused:
        probe_job(image, **options)
    assert names in str(refused.value) and "\n" not in str(refused.value)


def test_the_command_writes_one_file_the_same_each_time(tmp_path: Path) -> None:
    runner = CliRunner()
    argv = ["render", "probe-job", "-o", str(tmp_path), "--image", IMAGE, "--node", "gpu-1", "--gpus", "2"]
    first = runner.invoke(app, argv)
    assert first.exit_code == 0, first.output
    written = tmp_path / "deploykit-probe-gpu-1.yaml"
    assert first.stdout.split() == [str(written)]
    before = written.read_bytes()
    again = runner.invoke(app, argv)
    assert again.exit_code == 0 and written.read_bytes() == before
    assert before.startswith(b"# `deploykit probe` on a GPU node (2 GPU(s))")
    assert b"#   kubectl logs job/deploykit-probe-gpu-1 > deploykit-probe-gpu-1.json\n" in before

    refused = runner.invoke(app, ["render", "probe-job", "-o", str(tmp_path), "--image", "vllm/vllm-openai"])
    assert refused.exit_code == 2
    assert refused.stderr.splitlines() == [
        "deploykit: render probe-job: --image vllm/vllm-openai: name its tag or digest (e.g. "
        "vllm/vllm-openai:v0.32.0): the facts record the vLLM of that image, and the chart is rendered for it"
    ]
    missing = runner.invoke(app, ["render", "probe-job", "-o", str(tmp_path)])
    assert missing.exit_code == 2 and "--image" in missing.stderr and len(missing.stderr.splitlines()) == 1
