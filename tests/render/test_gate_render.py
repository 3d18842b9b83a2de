"""The upgrade gate as a progressive rollout calls it (docs/deploy.md, The upgrade gate in a cluster and on a
host). The chart's Argo Rollouts AnalysisTemplate and plain Job render only when enabled, pass `helm lint
--strict`, and validate: the Job (and the Job inside the AnalysisTemplate) against the Kubernetes schemas
(kubernetes-validate, strict), the AnalysisTemplate against Argo Rollouts' own types (npm's
@kubernetes-models/argo-rollouts, pinned, installed by tools/ci-services.sh: its compiled validators, and the
property names its type declarations list). The systemd gate unit passes `systemd-analyze verify` and runs in
the smoke companion's sandbox. In all three the command is `deploykit gate`'s contract, read back; a hostile
URL is refused by the values schema and, past it, stays one escaped word."""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from deploykit.probe.facts import ProbeFacts
from deploykit.profile.schema import ProfileError
from deploykit.render.common import RenderError
from deploykit.render.gate import CANDIDATE_VARIABLE
from tests.profile_variants import profile_variant
from tests.render.hostile import FIELDS, PRINTABLE, hostile_profile
from tests.render.test_helm import (
    KUBERNETES_VERSIONS,
    LISTEN,
    RELEASE,
    Chart,
    injected_keys,
    lint,
    render_chart,
    run_helm,
    template,
    values_file,
    vllm_image,
    wheel_path,
)
from tests.render.test_helm_restricted import restricted_violations
from tests.render.test_hostile_profiles import directives, files_of
from tests.render.test_hostile_profiles import render as hostile_render
from tests.render.test_systemd import exposure, render, split_command_line, unit_value, verify
from tests.unit_prefix import unit_prefix

ARGO_MODELS_DIR = Path(os.environ.get("DEPLOYKIT_ARGO_MODELS_DIR", "/var/cache/deploykit-ci/npm"))
ARGO_MODELS = ARGO_MODELS_DIR / "node_modules" / "@kubernetes-models" / "argo-rollouts"
ARGO_TYPES = ARGO_MODELS / "argoproj.io" / "v1alpha1"
ARGO_INSTALL_HINT = "run `bash tools/ci-services.sh` (it installs @kubernetes-models/argo-rollouts with npm)"
BOTH = ("--set", "gate.analysisTemplate.enabled=true", "--set", "gate.job.enabled=true")
JOB = ("--set", "gate.job.enabled=true")
TEMPLATE = ("--set", "gate.analysisTemplate.enabled=true")
PROFILE_FILE = "/etc/deploykit/profile.yaml"
FACTS_FILE = "/etc/deploykit/facts.json"
# The systemd gate unit's exposure (systemd-analyze security): the smoke companion's lines without its address
# allow list (the candidate may run on another host), plus 0.1 as test_systemd.py's thresholds.
GATE_EXPOSURE_MAX = 1.2


# --- `deploykit gate`'s command-line contract -----------------------------------------------------------


def contract() -> argparse.ArgumentParser:
    """`deploykit gate`'s options as the contract gives them, and no others (no abbreviations)."""
    parser = argparse.ArgumentParser(prog="deploykit gate", add_help=False, allow_abbrev=False)
    parser.add_argument("--profile", required=True)
    candidate = parser.add_mutually_exclusive_group(required=True)
    candidate.add_argument("--url")
    candidate.add_argument("--launch", action="store_true")
    parser.add_argument("--candidate-profile")
    parser.add_argument("--candidate-python")
    baseline = parser.add_mutually_exclusive_group()
    baseline.add_argument("--baseline-url")
    baseline.add_argument("--launch-baseline", action="store_true")
    baseline.add_argument("--baseline-row")
    parser.add_argument("--facts")
    parser.add_argument("--api-key-env")
    store = parser.add_mutually_exclusive_group()
    store.add_argument("--store")
    store.add_argument("--no-store", action="store_true")
    parser.add_argument("--no-load", action="store_true")
    parser.add_argument("--adopt", action="store_true")
    parser.add_argument("--accept-drift", action="store_true")
    parser.add_argument("--format", choices=["table", "json"], default="table")
    parser.add_argument("--report-file")
    return parser


def gate_args(words: list[str]) -> argparse.Namespace:
    """The gate's arguments after `deploykit gate` (or `python3 -m deploykit gate`), by the contract."""
    program = words[: words.index("gate")] if "gate" in words else words
    assert program == ["python3", "-m", "deploykit"] or (
        len(program) == 1 and program[0].endswith("/bin/deploykit")
    ), words
    try:
        return contract().parse_args(words[len(program) + 1 :])
    except SystemExit:
        raise AssertionError(f"not `deploykit gate`'s contract: {words}") from None


def test_the_contract_reader_refuses_what_the_gate_does_not_take() -> None:
    assert (
        gate_args(["/opt/v/bin/deploykit", "gate", "--profile", "p", "--url", "http://h:1"]).url
        == "http://h:1"
    )
    for words in (
        ["--url", "http://h:1"],  # no profile
        ["--profile", "p", "--url", "u", "--launch"],  # two candidates
        ["--profile", "p", "--url", "u", "--expect-fixes", "none"],  # smoke's option, not the gate's
        ["--profile", "p", "--url", "u", "--no-store", "--store", "s"],
        ["--profile", "p", "--url", "u", "--form", "json"],  # an abbreviation
    ):
        with pytest.raises(AssertionError):
            gate_args(["python3", "-m", "deploykit", "gate", *words])


def test_the_contract_is_the_gate_commands_own() -> None:
    """Every option the contract reader takes is one `deploykit gate` itself declares."""
    import typer.main

    from deploykit.cli import app

    command = typer.main.get_command(app)
    gate = getattr(command, "commands", {}).get("gate")
    if gate is None:
        pytest.skip("`deploykit gate` is not registered in this checkout")
    declared = {option for param in gate.params for option in param.opts}
    readers = {option for action in contract()._actions for option in action.option_strings}
    assert readers <= declared, sorted(readers - declared)


# --- the chart -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gate_chart(tmp_path_factory: pytest.TempPathFactory, turing_facts: Path) -> Chart:
    """gemma4-turing (an API key) listening beyond loopback, on the two T4s' facts."""
    directory = tmp_path_factory.mktemp("gate-chart")
    profile = profile_variant(directory, "gemma4-turing", LISTEN)
    return render_chart(profile, turing_facts, directory / "out")


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, kinds(docs)
    return found[0]


def job_pod(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


def template_job(analysis: dict[str, Any]) -> dict[str, Any]:
    """The AnalysisTemplate's Job provider as the Job Argo Rollouts creates from it."""
    (metric,) = analysis["spec"]["metrics"]
    job = metric["provider"]["job"]
    metadata = {**job.get("metadata", {}), "name": "run-uid.deploykit-gate.1"}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": metadata, "spec": job["spec"]}


def argo_resolved(analysis: dict[str, Any], words: list[str]) -> list[str]:
    """`words` with `{{args.NAME}}` replaced by the AnalysisTemplate's default value, as Argo Rollouts does
    when the Rollout passes no value of its own."""
    defaults = {arg["name"]: arg["value"] for arg in analysis["spec"]["args"]}
    return [re.sub(r"\{\{args\.([-\w]+)\}\}", lambda m: defaults[m.group(1)], word) for word in words]


def gate_container(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["containers"]
    assert container["name"] == "gate"
    found: dict[str, Any] = container
    return found


@pytest.mark.external_tool
def test_the_gate_renders_only_when_enabled(gate_chart: Chart) -> None:
    assert gate_chart.values["gate"]["analysisTemplate"] == {"enabled": False}
    assert gate_chart.values["gate"]["job"]["enabled"] is False
    plain = kinds(gate_chart.manifests)
    assert not any(k.startswith(("Job/", "AnalysisTemplate/", "ConfigMap/demo-gate")) for k in plain), plain
    with_template = kinds(template(gate_chart.root, *TEMPLATE))
    with_job = kinds(template(gate_chart.root, *JOB))
    with_both = kinds(template(gate_chart.root, *BOTH))
    assert sorted(set(with_template) - set(plain)) == ["AnalysisTemplate/demo-gate", "ConfigMap/demo-gate"]
    (job,) = set(with_job) - set(plain) - {"ConfigMap/demo-gate"}
    assert re.fullmatch(r"Job/demo-gate-[0-9a-f]{8}", job), job
    assert set(with_both) == set(with_template) | set(with_job)


@pytest.mark.external_tool
@pytest.mark.parametrize(
    "options",
    [
        BOTH,
        (*BOTH, "--set", "gate.store.secretName=results", "--set", "gate.load=false"),
        (*BOTH, "--set", "plugin.source=index", "--set", "plugin.index.secretName=pip-index"),
    ],
    ids=["both", "store-no-load", "index-plugin"],
)
def test_helm_lint_strict_is_clean_with_the_gate_on(gate_chart: Chart, options: tuple[str, ...]) -> None:
    result = run_helm("lint", "--strict", str(gate_chart.root), *options)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "[WARNING]" not in output and "[ERROR]" not in output, output
    assert lint(gate_chart.root).returncode == 0  # and off, as rendered


@pytest.mark.external_tool
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_job_and_the_templates_job_validate_against_the_kubernetes_schemas(
    gate_chart: Chart, version: str
) -> None:
    docs = template(gate_chart.root, *BOTH)
    gate_docs = [d for d in docs if d["kind"] in ("Job", "ConfigMap") and "gate" in d["metadata"]["name"]]
    for doc in [*gate_docs, template_job(only(docs, "AnalysisTemplate"))]:
        kubernetes_validate.validate(doc, version, strict=True)
    assert sorted(d["kind"] for d in gate_docs) == ["ConfigMap", "Job"]
    broken = copy.deepcopy(only(docs, "Job"))
    broken["spec"]["backofLimit"] = broken["spec"].pop("backoffLimit")  # strict: a misspelt key is refused
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, version, strict=True)


def argo_models() -> Path:
    """The installed @kubernetes-models/argo-rollouts; missing: the test fails under CI, skips elsewhere."""
    node = shutil.which("node")
    if node and (ARGO_MODELS / "package.json").is_file():
        return ARGO_MODELS
    if os.environ.get("CI"):
        pytest.fail(f"{ARGO_MODELS} or node is missing: {ARGO_INSTALL_HINT}")
    pytest.skip(f"{ARGO_MODELS} or node is missing: {ARGO_INSTALL_HINT}")


_VALIDATE_JS = """
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";
const [models, kind] = process.argv.slice(1);
const module = await import(pathToFileURL(`${models}/argoproj.io/v1alpha1/${kind}.js`).href);
const docs = JSON.parse(readFileSync(0, "utf8"));
const errors = docs.map((doc) => {
  try { new module[kind](doc).validate(); return null; } catch (error) { return String(error.message); }
});
process.stdout.write(JSON.stringify(errors));
"""


def argo_validate(docs: list[dict[str, Any]], kind: str = "AnalysisTemplate") -> list[str | None]:
    """Each document through Argo Rollouts' validator for `kind`: None when valid, else what it says."""
    done = subprocess.run(
        ["node", "--input-type=module", "-e", _VALIDATE_JS, str(argo_models()), kind],
        input=json.dumps(docs),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    errors: list[str | None] = json.loads(done.stdout)
    return errors


def declared(type_name: str) -> set[str]:
    """The properties Argo Rollouts' type declares (its `I<Type>` interface in the package's .d.ts)."""
    text = (ARGO_TYPES / f"{type_name}.d.ts").read_text()
    body = re.search(rf"export interface I{type_name} (?:extends \w+ )?\{{(.*?)\n\}}", text, re.S)
    assert body, type_name
    return set(re.findall(r'^    "(\w+)"\??:', body.group(1), re.M))


def undeclared_keys(analysis: dict[str, Any]) -> list[str]:
    """Keys the Argo Rollouts types do not declare, down to the Job provider (whose JobSpec is checked
    against the Kubernetes schemas): the validators themselves let unknown keys pass."""
    found: list[str] = []

    def check(node: dict[str, Any], type_name: str, where: str) -> None:
        found.extend(f"{where}.{key}" for key in sorted(set(node) - declared(type_name)))

    spec = analysis["spec"]
    check(analysis, "AnalysisTemplate", "")
    check(spec, "AnalysisTemplateSpec", "spec")
    for arg in spec.get("args", []):
        check(arg, "Argument", "spec.args[]")
    for metric in spec.get("metrics", []):
        check(metric, "Metric", "spec.metrics[]")
        check(metric["provider"], "MetricProvider", "spec.metrics[].provider")
        check(metric["provider"].get("job", {}), "JobMetric", "spec.metrics[].provider.job")
    return found


@pytest.mark.external_tool
def test_the_analysis_template_validates_against_argo_rollouts_types(gate_chart: Chart) -> None:
    argo_models()
    analysis = only(template(gate_chart.root, *TEMPLATE), "AnalysisTemplate")
    assert analysis["apiVersion"] == "argoproj.io/v1alpha1"
    wrong_type = copy.deepcopy(analysis)
    job_spec = wrong_type["spec"]["metrics"][0]["provider"]["job"]["spec"]
    job_spec["template"]["spec"]["containers"][0]["command"] = "deploykit gate"  # a string, not a list
    no_provider = copy.deepcopy(analysis)
    del no_provider["spec"]["metrics"][0]["provider"]
    valid, *invalid = argo_validate([analysis, wrong_type, no_provider])
    assert valid is None
    assert all(invalid), invalid  # the validator does refuse a wrong type and a missing provider
    assert undeclared_keys(analysis) == []
    misspelt = copy.deepcopy(analysis)
    misspelt["spec"]["metrics"][0]["failureLimt"] = 0
    assert undeclared_keys(misspelt) == ["spec.metrics[].failureLimt"]


@pytest.mark.external_tool
def test_the_analysis_template_aborts_the_rollout_on_any_failed_run(gate_chart: Chart) -> None:
    """One measurement (count 1), no failure allowed (failureLimit 0), one try of the Job (backoffLimit 0):
    any exit but 0 (6 hold, 1 broken, 2 usage) fails the analysis, and Argo Rollouts aborts the rollout."""
    analysis = only(template(gate_chart.root, *TEMPLATE), "AnalysisTemplate")
    (metric,) = analysis["spec"]["metrics"]
    assert (metric["count"], metric["failureLimit"]) == (1, 0)
    assert "interval" not in metric and "successCondition" not in metric  # a Job succeeds or fails
    assert metric["provider"]["job"]["spec"]["backoffLimit"] == 0
    assert analysis["metadata"]["name"] == f"{RELEASE}-gate"


@pytest.mark.external_tool
def test_the_gate_command_is_the_contract_in_the_job_and_the_analysis_template(gate_chart: Chart) -> None:
    docs = template(gate_chart.root, *BOTH)
    job, analysis = only(docs, "Job"), only(docs, "AnalysisTemplate")
    port = gate_chart.values["service"]["port"]
    candidate, baseline = f"http://{RELEASE}-canary:{port}", f"http://{RELEASE}:{port}"
    assert {a["name"]: a["value"] for a in analysis["spec"]["args"]} == {
        "canary-url": candidate,
        "stable-url": baseline,
    }
    command = gate_container(job_pod(template_job(analysis)))["command"]
    assert command[:4] == ["python3", "-m", "deploykit", "gate"]
    args = gate_args(command)
    assert (args.url, args.baseline_url) == ("{{args.canary-url}}", "{{args.stable-url}}")
    for words in (gate_container(job_pod(job))["command"], argo_resolved(analysis, command)):
        args = gate_args(words)
        assert (args.profile, args.url, args.baseline_url, args.facts) == (
            PROFILE_FILE,
            candidate,
            baseline,
            FACTS_FILE,
        )
        assert args.format == "json" and args.api_key_env == "DEPLOYKIT_API_KEY"  # serve.api_key_env
        assert args.no_store and args.store is None and not args.no_load
        assert not (args.launch or args.launch_baseline or args.adopt or args.report_file)


@pytest.mark.external_tool
def test_urls_load_and_store_come_from_values(gate_chart: Chart) -> None:
    options = (
        *BOTH,
        *(
            "--set",
            "gate.candidateUrl=https://next.llm.svc:8443",
            "--set",
            "gate.baselineUrl=http://[fd00::1]:80",
        ),
        *("--set", "gate.load=false", "--set", "gate.store.secretName=results"),
    )
    docs = template(gate_chart.root, *options)
    job, analysis = only(docs, "Job"), only(docs, "AnalysisTemplate")
    for container in (gate_container(job_pod(job)), gate_container(job_pod(template_job(analysis)))):
        words = argo_resolved(analysis, container["command"])
        args = gate_args(words)
        assert (args.url, args.baseline_url) == ("https://next.llm.svc:8443", "http://[fd00::1]:80")
        assert args.no_load
        # The store URL holds credentials: from the Secret into $DEPLOYKIT_STORE (the gate's default store),
        # never into an argv (`ps` shows every argv).
        assert not args.no_store and args.store is None and "--store" not in words
        env = {e["name"]: e for e in container["env"]}
        assert env["DEPLOYKIT_STORE"]["valueFrom"]["secretKeyRef"] == {"name": "results", "key": "store-url"}
    unkeyed = template(gate_chart.root, *JOB, "--set", "smokeTest.secretEnv.DEPLOYKIT_API_KEY=null")
    words = gate_container(job_pod(only(unkeyed, "Job")))["command"]
    assert gate_args(words).api_key_env is None and "--api-key-env" not in words


@pytest.mark.external_tool
def test_the_gate_pod_is_the_test_pods_with_the_profile_and_the_facts(gate_chart: Chart) -> None:
    """The same image, wheel on PYTHONPATH, security contexts, API key and placement as the `helm test` pod;
    Pod Security "restricted" admits it."""
    docs = template(gate_chart.root, *BOTH)
    smoke = only(docs, "Pod")["spec"]
    smoke_container = smoke["containers"][0]
    for pod in (job_pod(only(docs, "Job")), job_pod(template_job(only(docs, "AnalysisTemplate")))):
        assert restricted_violations(pod) == []
        container = gate_container(pod)
        assert container["image"] == smoke_container["image"] == vllm_image(gate_chart)
        assert container["securityContext"] == smoke_container["securityContext"]
        assert pod["securityContext"] == smoke["securityContext"]
        assert pod["affinity"] == smoke["affinity"] and pod["tolerations"] == smoke["tolerations"]
        assert pod["restartPolicy"] == "Never"
        env = {e["name"]: e for e in container["env"]}
        assert env["PYTHONPATH"]["value"] == wheel_path(gate_chart)
        assert env["DEPLOYKIT_API_KEY"] == {
            "name": "DEPLOYKIT_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "gemma4-turing-secrets", "key": "VLLM_API_KEY"}},
        }
        assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void"
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert mounts["/opt/deploykit"] == "deploykit-plugin" and "deploykit-plugin" in volumes
        sources = volumes[mounts["/etc/deploykit"]]["projected"]["sources"]
        assert [s["configMap"]["name"] for s in sources] == [f"{RELEASE}-profile", f"{RELEASE}-gate"]
        assert [c["name"] for c in pod["initContainers"]] == ["wait-for-servers"]


@pytest.mark.external_tool
def test_the_facts_are_the_ones_the_chart_was_rendered_from(gate_chart: Chart, turing_facts: Path) -> None:
    docs = template(gate_chart.root, *JOB)
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "demo-gate"]
    shipped = ProbeFacts.model_validate_json(config_map["data"]["facts.json"])
    rendered_from = ProbeFacts.model_validate_json(turing_facts.read_text())
    assert shipped.model_dump(exclude={"source"}) == rendered_from.model_dump(exclude={"source"})
    assert shipped.gpus and (gate_chart.root / "files" / "probe-facts.json").is_file()


@pytest.mark.external_tool
def test_a_new_candidate_is_a_new_job_and_a_long_release_name_still_fits(gate_chart: Chart) -> None:
    """A Job's pod template cannot change: its name is the digest of what it runs."""

    def job_name(*options: str, release: str = RELEASE) -> str:
        result = run_helm("template", release, str(gate_chart.root), *JOB, *options)
        assert result.returncode == 0, result.stderr
        (job,) = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "Job"]
        name: str = job["metadata"]["name"]
        return name

    first = job_name()
    assert job_name() == first
    assert job_name("--set", "gate.candidateUrl=http://next:8000") != first
    long = job_name(release="r" * 53)  # Helm's longest release name
    assert len(long) <= 63 and long.startswith("r" * 49 + "-gate-"), long


# Hostile URLs: a line break with a key after it, a quote, a command substitution, a space, credentials.
HOSTILE_URLS = {
    "newline": "http://next:8000\n          injected: true",
    "quote": 'http://next:8000"',
    "command-substitution": "http://$(cat /etc/shadow):8000",
    "dollar-variable": "http://next:8000/$(DEPLOYKIT_API_KEY)",
    "space": "http://next:8000 --adopt",
    "credentials": "http://user:secret@next:8000",
}


@pytest.mark.external_tool
@pytest.mark.parametrize("field", ["candidateUrl", "baselineUrl"])
@pytest.mark.parametrize("hostile", HOSTILE_URLS)
def test_the_schema_refuses_a_hostile_url(
    gate_chart: Chart, tmp_path: Path, field: str, hostile: str
) -> None:
    values = copy.deepcopy(gate_chart.values)
    values["gate"][field] = HOSTILE_URLS[hostile]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(values, gate_chart.schema, cls=jsonschema.Draft7Validator)
    override = values_file(tmp_path, {"gate": {field: HOSTILE_URLS[hostile], "job": {"enabled": True}}})
    result = run_helm("template", RELEASE, str(gate_chart.root), "-f", str(override))
    assert result.returncode != 0 and "schema" in result.stderr, result.stderr


@pytest.mark.external_tool
@pytest.mark.parametrize("hostile", HOSTILE_URLS)
def test_past_the_schema_a_hostile_url_stays_one_escaped_word(
    gate_chart: Chart, tmp_path: Path, hostile: str
) -> None:
    """With --skip-schema-validation the templates still quote the URL and double every `$`: Kubernetes hands
    the gate the value as given, one argv word, and nothing is added to the manifests."""
    url = HOSTILE_URLS[hostile]
    override = values_file(tmp_path, {"gate": {"candidateUrl": url, "job": {"enabled": True}}})
    docs = template(gate_chart.root, "-f", str(override), *TEMPLATE, "--skip-schema-validation")
    assert injected_keys(docs) == []
    literal = url.replace("$", "$$")
    job, analysis = only(docs, "Job"), only(docs, "AnalysisTemplate")
    assert gate_args(gate_container(job_pod(job))["command"]).url == literal
    assert {a["name"]: a["value"] for a in analysis["spec"]["args"]}["canary-url"] == literal
    assert job_pod(job)["initContainers"][0]["command"][3] == f"{literal}/health"


@pytest.mark.external_tool
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"gate": {"store": {"secretName": "Results_Store"}}}, "secretName"),
        ({"gate": {"store": {"secretName": "r", "secretKey": "url\n  optional: true"}}}, "secretKey"),
        ({"gate": {"waitSeconds": -1}}, "waitSeconds"),
        ({"gate": {"job": {"enabled": True, "ttlSecondsAfterFinished": "1d"}}}, "ttlSecondsAfterFinished"),
        ({"gate": {"analysisTemplate": {"enabled": "yes"}}}, "enabled"),
        ({"gate": {"noLoad": True}}, "noLoad"),  # a typo of load: false
        ({"smokeTest": {"secretEnv": {"A_KEY": "VLLM_API_KEY", "B_KEY": "VLLM_API_KEY"}}}, "secretEnv"),
    ],
)
def test_the_schema_refuses_wrong_gate_values(
    gate_chart: Chart, tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    result = run_helm("template", RELEASE, str(gate_chart.root), "-f", str(values_file(tmp_path, values)))
    assert result.returncode != 0 and "schema" in result.stderr and message in result.stderr, result.stderr


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[str]:
    """A loopback server whose /health answers 200."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.mark.external_tool
def test_the_pod_waits_for_both_servers_health(gate_chart: Chart, health_server: str) -> None:
    """The init container's script, run as the pod runs it (Python's standard library, the URLs as argv):
    both servers answer, it goes on; one does not within waitSeconds, it fails naming that URL."""
    down = f"http://127.0.0.1:{closed_port()}"
    options = (*JOB, "--set", f"gate.candidateUrl={health_server}", "--set", f"gate.baselineUrl={down}")
    (init,) = job_pod(only(template(gate_chart.root, *options), "Job"))["initContainers"]
    assert init["command"][:2] == ["python3", "-c"]
    script, candidate, baseline, limit = init["command"][2:]
    assert (candidate, baseline) == (f"{health_server}/health", f"{down}/health")
    assert int(limit) == gate_chart.values["gate"]["waitSeconds"]

    def run(*urls: str, limit: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-I", "-c", script, *urls, limit]
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=30, env={"PATH": os.environ["PATH"]}
        )

    ok = run(candidate, candidate, limit="5")
    assert ok.returncode == 0 and ok.stdout.count("answers 200") == 2, ok.stderr
    failed = run(candidate, baseline, limit="0")
    assert failed.returncode == 1 and f"{down}/health did not answer 200 within 0 s" in failed.stderr


# --- the systemd unit ------------------------------------------------------------------------------------

GATE_UNIT = "deploykit-gemma4-turing-gate.service"
SERVER_UNIT = "deploykit-gemma4-turing.service"
SMOKE_UNIT = "deploykit-gemma4-turing-smoke.service"
MARK = "CANDIDATE-FROM-THE-ENVIRONMENT-FILE"
HOSTILE_GATE_UNIT = "deploykit-hostile-gate.service"  # tests/render/hostile.py's profile


@pytest.fixture(scope="module")
def gate_units(tmp_path_factory: pytest.TempPathFactory, turing_facts: Path) -> tuple[Path, dict[str, str]]:
    out = tmp_path_factory.mktemp("gate-units")
    return out, render("gemma4-turing", turing_facts, out)


def gate_exec(unit: str) -> list[str]:
    """ExecStart= read back as systemd reads it, the candidate's variable as a marker: the one `$` word."""
    value = unit_value(unit, "ExecStart")
    assert value.count("$") == 1, value
    return split_command_line(value.replace("${" + CANDIDATE_VARIABLE + "}", MARK))


def test_the_gate_unit_verifies(gate_units: tuple[Path, dict[str, str]]) -> None:
    out, _ = gate_units
    assert verify(out / GATE_UNIT, out / SERVER_UNIT) == ""


def test_the_gate_unit_runs_the_contract_once_against_the_running_server(
    gate_units: tuple[Path, dict[str, str]], turing_facts: Path
) -> None:
    _, files = gate_units
    unit = files[GATE_UNIT]
    words = gate_exec(unit)
    assert words[0] == str(unit_prefix() / "bin" / "deploykit")
    args = gate_args(words)
    assert (args.profile, args.url, args.baseline_url, args.facts) == (
        "/etc/deploykit/gemma4-turing.yaml",
        MARK,
        "http://127.0.0.1:8000",  # the server unit's own, as the smoke companion's
        "/etc/deploykit/gemma4-turing.facts.json",
    )
    assert args.format == "json" and args.report_file == "/var/lib/deploykit-gemma4-turing/gate.json"
    assert args.api_key_env == "VLLM_API_KEY" and not (args.no_store or args.store or args.no_load)
    assert "${" + CANDIDATE_VARIABLE + "}" in unit_value(unit, "ExecStart").split()  # a word of its own
    for line in (
        "Type=oneshot",
        f"Requisite={SERVER_UNIT}",
        f"After={SERVER_UNIT}",
        "User=vllm",
        "Group=vllm",
    ):
        assert re.search(rf"^{re.escape(line)}$", unit, re.M), line
    environment_files = re.findall(r"^EnvironmentFile=(.*)$", unit, re.M)
    assert environment_files == ["/etc/deploykit/gemma4-turing.env", "/etc/deploykit/gemma4-turing-gate.env"]
    assert "WantedBy=" not in unit and "Restart=" not in unit  # started by hand, once
    example = files["gemma4-turing-gate.env.example"]
    assert re.findall(r"^([A-Z_]+)=(.*)$", example, re.M) == [(CANDIDATE_VARIABLE, "")]
    shipped = ProbeFacts.model_validate_json(files["gemma4-turing.facts.json"])
    rendered_from = ProbeFacts.model_validate_json(turing_facts.read_text())
    assert shipped.model_dump(exclude={"source"}) == rendered_from.model_dump(exclude={"source"})


HARDENING_KEYS = re.compile(r"^(DevicePolicy|Private\w+|NoNewPrivileges|Protect\w+|ProcSubset|Restrict\w+|"
                            r"LockPersonality|MemoryDenyWriteExecute|RemoveIPC|\w+Capabilities|"
                            r"CapabilityBoundingSet|SystemCall\w+|UMask)=", re.M)  # fmt: skip


def hardening(unit: str) -> list[str]:
    return [line for line in unit.splitlines() if HARDENING_KEYS.match(line)]


def test_the_gate_unit_has_the_smoke_companions_sandbox(gate_units: tuple[Path, dict[str, str]]) -> None:
    """An HTTP client like the smoke companion: its hardening line for line, no device; the address allow
    list alone is left out (the candidate may run on another host)."""
    out, files = gate_units
    gate, smoke = files[GATE_UNIT], files[SMOKE_UNIT]
    assert hardening(gate) == hardening(smoke) and len(hardening(gate)) > 25
    assert not re.search(r"^(DeviceAllow|IPAddressDeny|IPAddressAllow)=", gate, re.M)
    for key in ("User", "Group", "WorkingDirectory", "StateDirectory"):
        assert unit_value(gate, key) == unit_value(smoke, key), key
    assert exposure(out / GATE_UNIT) <= GATE_EXPOSURE_MAX


def test_a_cpu_profile_without_a_key_passes_none(turing_facts: Path, tmp_path: Path) -> None:
    files = render("demo-cpu", turing_facts, tmp_path)
    unit = files["deploykit-demo-cpu-gate.service"]
    args = gate_args(gate_exec(unit))
    assert args.api_key_env is None and args.baseline_url == "http://127.0.0.1:8000"
    assert "EnvironmentFile=-/etc/deploykit/demo-cpu.env" in unit  # the server's optional secrets file
    assert verify(tmp_path / "deploykit-demo-cpu-gate.service", tmp_path / "deploykit-demo-cpu.service") == ""


@pytest.fixture(scope="module")
def clean_gate_unit(tmp_path_factory: pytest.TempPathFactory) -> str:
    profile = hostile_profile(tmp_path_factory.mktemp("clean-gate"), "description", "d-plain")
    return files_of(hostile_render(profile, "systemd"))[HOSTILE_GATE_UNIT]


@pytest.mark.parametrize("payload", PRINTABLE)
def test_a_hostile_profile_string_never_changes_the_gate_units_lines(
    tmp_path: Path, clean_gate_unit: str, payload: str
) -> None:
    """Every string field a profile has, holding `%`, quotes, a backslash, `$`, `;`, unicode or a space:
    refused in one line, or the gate unit holds exactly the clean one's settings, verifies clean, and runs the
    same gate command."""
    clean_words = gate_exec(clean_gate_unit)
    for field in FIELDS:
        profile = hostile_profile(tmp_path / field, field, PRINTABLE[payload])
        try:
            unit = files_of(hostile_render(profile, "systemd"))[HOSTILE_GATE_UNIT]
        except (ProfileError, RenderError) as exc:
            assert "\n" not in str(exc), (field, str(exc))
            continue
        assert directives(unit) == directives(clean_gate_unit), field
        assert gate_exec(unit) == clean_words, field
        (tmp_path / field / HOSTILE_GATE_UNIT).write_text(unit)
        report = verify(tmp_path / field / HOSTILE_GATE_UNIT)
        problems = [line for line in report.splitlines() if "/opt/deploykit-hostile" not in line]
        assert problems in ([], ["rc=1"]), (field, report)
