"""Issue 30, point 1: a matrix of hostile profiles (newline, carriage return, NUL, tab, `%`, quotes,
backslash, `$`, `;`, unicode in every string field a unit or a chart uses) through `render systemd` and
`render helm`. Each one is either refused with one line naming the file, line and field (control
characters: at load), or rendered so that nothing is injected: the units hold exactly the directives a
clean profile's hold and verify clean, the values systemd reads back are the profile's, the chart's values
and `helm template`'s manifests read back the profile's strings. The real systemd proof is
tests/e2e/test_systemd_hostile_e2e.py."""

from __future__ import annotations

import collections
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploykit.errors import DeploykitError
from deploykit.probe.load import load_facts
from deploykit.profile.load import load_profile
from deploykit.profile.schema import ProfileError
from deploykit.render.common import RenderError, RenderResult, plan_for_render
from deploykit.render.helm import kubernetes_literal, render_helm
from deploykit.render.systemd import SystemdOptions, render_systemd
from deploykit.render.vllm_release import MODULE as VLLM_RELEASE
from tests.render.hostile import CONTROL, FIELDS, PAYLOADS, PLANTED_MARK, field_values, hostile_profile
from tests.render.test_helm import template
from tests.render.test_systemd import split_command_line, unit_value, verify

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts" / "no-gpu.json"
PREFIX = Path("/opt/deploykit-hostile")  # not on this host: the prefix check is the target host's
UNITS = ("deploykit-hostile.service", "deploykit-hostile-smoke.service", "deploykit-hostile-canary.service")


def render(profile: Path, kind: str) -> RenderResult:
    loaded = load_profile(str(profile))
    plan = plan_for_render(loaded, load_facts(str(FACTS)))
    if kind == "systemd":
        return render_systemd(plan, loaded, SystemdOptions(prefix=PREFIX))
    return render_helm(plan, loaded)


def directives(text: str) -> collections.Counter[str]:
    """The keys of every setting line (continuations joined, comments and sections left out)."""
    joined = re.sub(r"\\\n[ \t]*", " ", text)
    keys = collections.Counter[str]()
    for line in joined.splitlines():
        if line and not line.startswith(("#", ";", "[")):
            assert "=" in line, f"a line that is no setting: {line!r}"
            keys[line.split("=", 1)[0]] += 1
    return keys


def files_of(result: RenderResult) -> dict[str, str]:
    return {f.path: f.content for f in result.files if isinstance(f.content, str)}


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    directory = tmp_path_factory.mktemp("clean")
    profile = hostile_profile(directory, "description", "d-plain")
    return {kind: files_of(render(profile, kind)) for kind in ("systemd", "helm")}


def refused_in_one_line(exc: BaseException, profile: Path, payload: str) -> str:
    message = exc.message if isinstance(exc, DeploykitError) else str(exc)
    assert "\n" not in message and "\r" not in message and "\x00" not in message, repr(message)
    assert PLANTED_MARK not in message
    return message


@pytest.mark.parametrize("payload", CONTROL)
@pytest.mark.parametrize("field", FIELDS)
def test_control_characters_are_refused_at_load_naming_file_line_and_field(
    tmp_path: Path, field: str, payload: str
) -> None:
    profile = hostile_profile(tmp_path, field, CONTROL[payload])
    with pytest.raises(ProfileError) as caught:
        load_profile(str(profile))
    refused_in_one_line(caught.value, profile, payload)
    top = field.split(".")[0]
    for issue in caught.value.issues:  # one located line per string that holds one (smoke.cases: two)
        line = str(issue)
        assert "\n" not in line and "\r" not in line and "\x00" not in line and PLANTED_MARK not in line
        assert re.match(rf"{re.escape(str(profile))}:\d+:\d+: {top}", line), line
        if field != "deploy.user":  # a user name may be refused by its pattern; both are one located line
            assert "control character U+" in line, line


def environment_assignment(value: str) -> str:
    """One Environment= assignment read back as systemd reads it: `%%` is `%`, one quoted word with `\\` and
    `\"` escapes, and no `$` expansion at all."""
    assert not re.search(r"%[^%]", value.replace("%%", "")), f"a specifier in {value!r}"
    value = value.replace("%%", "%")
    if not value.startswith('"'):
        assert not re.search(r"[\s\"'\\]", value), value
        return value
    assert value.endswith('"') and len(value) >= 2, value
    word, i = "", 1
    while i < len(value) - 1:
        if value[i] == "\\":
            word += {"\\": "\\", '"': '"'}[value[i + 1]]
            i += 2
        else:
            assert value[i] != '"', f"an unescaped quote in {value!r}"
            word += value[i]
            i += 1
    return word


def checked_systemd(files: dict[str, str], clean: dict[str, str], field: str, payload: str) -> None:
    for unit in UNITS:
        assert directives(files[unit]) == directives(clean[unit]), unit
    server = files["deploykit-hostile.service"]
    value = field_values(payload)[field]
    environment = [
        environment_assignment(line[len("Environment=") :])
        for line in server.splitlines()
        if line.startswith("Environment=")
    ]
    if field == "env.DK_VALUE":
        assert f"DK_VALUE={payload}" in environment
    if field == "model.served_name":
        description = unit_value(server, "Description").replace("%%", "%")
        assert description.startswith(f"vLLM serving {value.rstrip(chr(92) + ' ')}")
    if field == "deploy.cache_dir":
        assert unit_value(server, "ReadWritePaths").replace("%%", "%") == value
        assert f"XDG_CACHE_HOME={value}" in environment
    argv = split_command_line(unit_value(server, "ExecStart"))
    if field == "serve.extra_args":
        assert argv[-2:] == value
    if field == "serve.generation_config":
        assert argv[argv.index("--generation-config") + 1] == value


@pytest.mark.parametrize("payload", [p for p in PAYLOADS if p not in CONTROL])
@pytest.mark.parametrize("field", FIELDS)
def test_printable_payloads_render_systemd_without_injection(
    tmp_path: Path, clean: dict[str, dict[str, str]], field: str, payload: str
) -> None:
    profile = hostile_profile(tmp_path, field, PAYLOADS[payload])
    try:
        result = render(profile, "systemd")
    except (ProfileError, RenderError) as exc:
        refused_in_one_line(exc, profile, payload)
        return
    files = files_of(result)
    checked_systemd(files, clean["systemd"], field, PAYLOADS[payload])
    out = tmp_path / "out"
    out.mkdir()
    for unit in UNITS:
        (out / unit).write_text(files[unit])
    # systemd's own parser: no unknown directive, no broken line (the prefix does not exist here)
    report = verify(*(out / unit for unit in UNITS))
    problems = [
        line for line in report.splitlines() if "/opt/deploykit-hostile" not in line and "rc=" not in line
    ]
    assert problems == [], report


@pytest.mark.external_tool  # helm template
@pytest.mark.parametrize("payload", [p for p in PAYLOADS if p not in CONTROL])
@pytest.mark.parametrize("field", FIELDS)
def test_printable_payloads_render_helm_without_injection(
    tmp_path: Path, clean: dict[str, dict[str, str]], field: str, payload: str
) -> None:
    value = field_values(PAYLOADS[payload])[field]
    profile = hostile_profile(tmp_path, field, PAYLOADS[payload])
    try:
        result = render(profile, "helm")
    except (ProfileError, RenderError) as exc:
        refused_in_one_line(exc, profile, payload)
        return
    files = files_of(result)
    values: dict[str, Any] = yaml.safe_load(files["hostile/values.yaml"])
    assert set(values) == set(yaml.safe_load(clean["helm"]["hostile/values.yaml"]))
    assert values["profileYaml"] == profile.read_text()
    chart = yaml.safe_load(files["hostile/Chart.yaml"])
    assert set(chart) == set(yaml.safe_load(clean["helm"]["hostile/Chart.yaml"]))
    if field == "env.DK_VALUE":
        assert values["env"]["DK_VALUE"] == kubernetes_literal(value)
    if field == "deploy.cache_dir":
        assert values["cache"]["path"] == value
    if field == "model.served_name":
        assert chart["description"].startswith(f"vLLM serving {value} ")
    root = tmp_path / "chart"
    for item in result.files:
        path = root / item.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(item.content.encode() if isinstance(item.content, str) else item.content)
    docs = template(root / "hostile")
    kinds = sorted(doc["kind"] for doc in docs)
    assert kinds == sorted(["ConfigMap", "ConfigMap", "Deployment", "Pod", "Service"]), kinds
    deployment = next(doc for doc in docs if doc["kind"] == "Deployment")
    (vllm,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    if field == "env.DK_VALUE":
        assert env["DK_VALUE"] == kubernetes_literal(value)
    if field == "deploy.cache_dir":
        mounts = {m["name"]: m["mountPath"] for m in vllm["volumeMounts"]}
        assert mounts["cache"] == value and env["XDG_CACHE_HOME"] == value


@pytest.mark.parametrize("payload", CONTROL)
@pytest.mark.parametrize(
    "field",
    ["model.served_name", "serve.generation_config", "serve.extra_args", "env.DK_VALUE", "deploy.cache_dir"],
)
def test_the_unit_writer_refuses_control_characters_even_past_the_loader(
    tmp_path: Path, field: str, payload: str
) -> None:
    """The second wall: a profile that did not come through the loader (built in code) still cannot put a
    control character into a unit: the escaping layer refuses it in one line naming the field."""
    from deploykit.profile.schema import LoadedProfile, Profile

    profile_path = hostile_profile(tmp_path, field, "plain")
    data = yaml.safe_load(profile_path.read_text())
    *parents, last = field.split(".")
    node = data
    for part in parents:
        node = node[part]
    node[last] = field_values(CONTROL[payload])[field]
    loaded = LoadedProfile(profile=Profile.model_validate(data), path=profile_path)
    plan = plan_for_render(loaded, load_facts(str(FACTS)))
    try:
        files = files_of(render_systemd(plan, loaded, SystemdOptions(prefix=PREFIX)))
    except RenderError as exc:
        refused_in_one_line(exc, profile_path, payload)
        return
    # A line feed, tab or carriage return in an argv word is escaped (ExecStart= takes C escapes): still
    # no new line in any unit.
    assert field in ("serve.extra_args", "serve.generation_config"), field
    assert payload in ("newline", "carriage-return", "tab", "planted"), payload
    for unit in UNITS:
        keys = directives(files[unit])
        # The server's one ExecStartPre= is its own vLLM release check (deploykit.render.vllm_release).
        assert keys["ExecStartPre"] == (unit == UNITS[0]) and "X-Y" not in keys, unit
        if keys["ExecStartPre"]:
            assert split_command_line(unit_value(files[unit], "ExecStartPre"))[2:4] == ["-m", VLLM_RELEASE]
