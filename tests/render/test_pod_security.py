"""Issue 48, item 3: the chart's pods pass Pod Security "restricted", and `render helm` names each value that
takes them out of it (a node-path model volume, a security context, an init container of the user's) and each
image volume below the Kubernetes version it needs, judged for `--kube-version` (default 1.28).

The checker (deploykit.render.pod_security.restricted_violations) is written from the Pod Security
Standards page; its own tests below hold it to each control of the Baseline and Restricted tables, so a
checker that passed everything would fail here before it could pass a chart.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploykit.render.pod_security import (
    OLDEST_KUBERNETES,
    chart_exceptions,
    image_volume_needs,
    main,
    manifest_pods,
    parse_kube_version,
    restricted_violations,
)
from tests.profile_variants import profile_variant
from tests.render.conftest import deploykit
from tests.render.test_helm import (
    FACTS_DIR,
    INDEX_SOURCE,
    LISTEN,
    URL_SOURCE,
    Chart,
    render_chart,
    run_helm,
    template,
)

# A pod that passes restricted: what the chart writes, cut down to the fields the standard reads.
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CLEAN_POD: dict[str, Any] = {
    "securityContext": {
        "runAsNonRoot": True,
        "runAsUser": 65534,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "volumes": [
        {"name": "cache", "emptyDir": {}},
        {"name": "models", "persistentVolumeClaim": {"claimName": "models"}},
        {"name": "plugin", "configMap": {"name": "plugin"}},
    ],
    "initContainers": [{"name": "fetch", "securityContext": dict(RESTRICTED_CONTAINER)}],
    "containers": [
        {
            "name": "vllm",
            "securityContext": dict(RESTRICTED_CONTAINER),
            "ports": [{"containerPort": 8000}],
            "startupProbe": {"httpGet": {"path": "/health", "port": 8000}},
        }
    ],
}


def without(key: str) -> dict[str, Any]:
    """The restricted container context less one key."""
    return {k: v for k, v in RESTRICTED_CONTAINER.items() if k != key}


def changed(path: str, value: Any) -> dict[str, Any]:
    """CLEAN_POD with one dotted field set (`containers.0.securityContext.privileged`)."""
    pod = copy.deepcopy(CLEAN_POD)
    *parents, last = path.split(".")
    node: Any = pod
    for part in parents:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    if last.isdigit():
        node.append(value)
    else:
        node[last] = value
    return pod


# Each control of the standard, broken once: (field, value, the control it names, the version judged).
OLD = OLDEST_KUBERNETES
VLLM = "containers.0.securityContext."
INIT = "initContainers.0.securityContext"
BROKEN: dict[str, tuple[str, Any, str, tuple[int, int]]] = {
    "host network": ("hostNetwork", True, "Host Namespaces", OLD),
    "host PID": ("hostPID", True, "Host Namespaces", OLD),
    "privileged": (VLLM + "privileged", True, "Privileged Containers", OLD),
    "host process": ("securityContext.windowsOptions", {"hostProcess": True}, "HostProcess", OLD),
    "capability added": (VLLM + "capabilities", {"drop": ["ALL"], "add": ["SYS_ADMIN"]}, "Capabilities", OLD),
    "baseline capability": (
        VLLM + "capabilities",
        {"drop": ["ALL"], "add": ["CHOWN"]},
        "NET_BIND_SERVICE",
        OLD,
    ),
    "nothing dropped": (VLLM + "capabilities", {}, "drop must include ALL", OLD),
    "host path": ("volumes.3", {"name": "m", "hostPath": {"path": "/srv"}}, "HostPath", OLD),
    "nfs": ("volumes.3", {"name": "m", "nfs": {"server": "s", "path": "/"}}, "Volume Types", OLD),
    "image volume before 1.33": (
        "volumes.3",
        {"name": "m", "image": {"reference": "r:1"}},
        "Volume Types",
        (1, 32),
    ),
    "host port": ("containers.0.ports.1", {"containerPort": 9, "hostPort": 9}, "Host Ports", OLD),
    "SELinux user": ("securityContext.seLinuxOptions", {"user": "system_u"}, "SELinux", OLD),
    "SELinux type": (VLLM + "seLinuxOptions", {"type": "spc_t"}, "SELinux", OLD),
    "engine type before 1.31": (
        "securityContext.seLinuxOptions",
        {"type": "container_engine_t"},
        "SELinux",
        (1, 30),
    ),
    "unmasked /proc": (VLLM + "procMount", "Unmasked", "/proc Mount", OLD),
    "AppArmor unconfined": (VLLM + "appArmorProfile", {"type": "Unconfined"}, "AppArmor", OLD),
    "unsafe sysctl": ("securityContext.sysctls", [{"name": "kernel.msgmax", "value": "1"}], "Sysctls", OLD),
    "keepalive before 1.29": (
        "securityContext.sysctls",
        [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}],
        "Sysctls",
        (1, 28),
    ),
    "escalation allowed": (VLLM + "allowPrivilegeEscalation", True, "Privilege Escalation", OLD),
    "escalation unset": (INIT, without("allowPrivilegeEscalation"), "Privilege Escalation", OLD),
    "root allowed": ("securityContext.runAsNonRoot", False, "Running as Non-root", OLD),
    "root user": (VLLM + "runAsUser", 0, "Running as Non-root user", OLD),
    "seccomp unconfined": (VLLM + "seccompProfile", {"type": "Unconfined"}, "Seccomp", OLD),
    "probe host from 1.34": (
        "containers.0.startupProbe",
        {"httpGet": {"host": "10.0.0.1", "path": "/", "port": 1}},
        "Host Probes",
        (1, 34),
    ),
}


def test_a_restricted_pod_passes() -> None:
    assert restricted_violations(CLEAN_POD) == []


def test_the_pod_level_seccomp_covers_containers_without_one() -> None:
    pod = changed("initContainers.0.securityContext.seccompProfile", None)
    assert restricted_violations(pod) == []  # the pod's RuntimeDefault holds for it
    pod["securityContext"].pop("seccompProfile")
    assert [str(v) for v in restricted_violations(pod)] == [
        "container fetch: seccompProfile must be RuntimeDefault or Localhost, container's or pod's (Seccomp)"
    ]


@pytest.mark.parametrize("case", BROKEN)
def test_each_control_of_the_standard_is_checked(case: str) -> None:
    path, value, control, version = BROKEN[case]
    found = restricted_violations(changed(path, value), version)
    assert len(found) == 1 and control in found[0].problem, found


@pytest.mark.parametrize(
    ("path", "value", "version"),
    [
        ("volumes.3", {"name": "m", "image": {"reference": "r/a:1"}}, (1, 33)),
        ("securityContext.seLinuxOptions", {"type": "container_engine_t"}, (1, 31)),
        ("securityContext.sysctls", [{"name": "net.ipv4.tcp_keepalive_time", "value": "60"}], (1, 29)),
        ("containers.0.startupProbe", {"httpGet": {"host": "10.0.0.1", "path": "/", "port": 1}}, (1, 33)),
        (
            "containers.0.securityContext.capabilities",
            {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
            (1, 28),
        ),
    ],
    ids=["image volume 1.33", "engine type 1.31", "keepalive 1.29", "probe host before 1.34", "bind service"],
)
def test_what_the_standard_allows_from_its_version_passes(
    path: str, value: Any, version: tuple[int, int]
) -> None:
    assert restricted_violations(changed(path, value), version) == []


def test_the_image_volume_gate_history() -> None:
    """ImageVolume: alpha (off) 1.31-1.32, beta but off 1.33-1.34, on by default from 1.35."""
    assert "has no image volumes" in (image_volume_needs((1, 30)) or "")
    for minor in (31, 32, 33, 34):
        assert "feature gate is off by default" in (image_volume_needs((1, minor)) or ""), minor
    assert image_volume_needs((1, 35)) is None and image_volume_needs((1, 36)) is None


@pytest.mark.parametrize(
    ("text", "version"), [("1.33", (1, 33)), ("v1.35", (1, 35)), ("1.31.4", (1, 31)), (" 1.28 ", (1, 28))]
)
def test_the_kube_version_is_major_minor(text: str, version: tuple[int, int]) -> None:
    assert parse_kube_version(text) == version


@pytest.mark.parametrize("text", ["1.27", "2.0", "133", "1.x", "", "1.33-eks"])
def test_a_kube_version_it_cannot_judge_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--kube-version"):
        parse_kube_version(text)


# --- the warnings of `render helm` ------------------------------------------------------------------------


def render(profile: Path, out: Path, *options: str) -> tuple[int, list[str], Path | None]:
    """`deploykit render helm`: (exit status, its Pod Security and image-volume warnings, the chart)."""
    result = deploykit(
        "render", "helm", "-p", str(profile), "--facts", str(FACTS_DIR / "t4.json"), "-o", str(out), *options,
        check=False,
    )  # fmt: skip
    lines = [
        line.removeprefix("deploykit render: warning: ")
        for line in result.stderr.splitlines()
        if "Pod Security" in line or "(image " in line
    ]
    chart = Path(result.stdout.splitlines()[0]).parent if result.returncode == 0 else None
    return result.returncode, lines, chart


def staged(make_profile: Callable[[str, dict[str, Any]], Path], *volumes: dict[str, Any]) -> Path:
    """gemma4-turing with its model on `volumes` (the first mounted at /models)."""
    return make_profile(
        "gemma4-turing", {**LISTEN, "model.source": "/models/gemma", "model.volumes": list(volumes)}
    )


PVC = {"kind": "pvc", "claim": "models", "mount_path": "/models"}
HOST_PATH = {"kind": "host_path", "path": "/srv/models", "mount_path": "/models"}
IMAGE = {"kind": "image", "image": "registry.internal/adapters:v3", "mount_path": "/srv/lora"}


def test_a_restricted_chart_warns_nothing(
    make_profile: Callable[[str, dict[str, Any]], Path], tmp_path: Path
) -> None:
    code, lines, chart = render(staged(make_profile, PVC), tmp_path)
    assert code == 0 and lines == []
    assert chart is not None
    values = yaml.safe_load((chart / "values.yaml").read_text())
    for minor in (28, 33, 35):
        assert chart_exceptions(values, (1, minor)) == [], minor


def test_a_node_path_model_volume_is_named(
    make_profile: Callable[[str, dict[str, Any]], Path], tmp_path: Path
) -> None:
    code, lines, _ = render(staged(make_profile, HOST_PATH), tmp_path, "--kube-version", "1.35")
    assert code == 0
    assert lines == [
        "Pod Security restricted (Kubernetes 1.35): model.volumes[0] (hostPath /srv/models): a node "
        "directory (hostPath), refused by baseline and restricted (HostPath Volumes): a namespace that "
        "enforces restricted refuses the pod (docs/deploy.md, Pod Security)"
    ]


@pytest.mark.parametrize(
    ("options", "restricted", "gate"),
    [
        ((), True, "Kubernetes 1.28 has no image volumes"),
        (("--kube-version", "1.31"), True, "feature gate is off by default on Kubernetes 1.31"),
        (("--kube-version", "1.33"), False, "feature gate is off by default on Kubernetes 1.33"),
        (("--kube-version", "1.34"), False, "feature gate is off by default on Kubernetes 1.34"),
        (("--kube-version", "1.35"), False, None),
    ],
    ids=["default 1.28", "1.31", "1.33", "1.34", "1.35"],
)
def test_an_image_volume_is_named_below_the_versions_it_needs(
    make_profile: Callable[[str, dict[str, Any]], Path],
    tmp_path: Path,
    options: tuple[str, ...],
    restricted: bool,
    gate: str | None,
) -> None:
    code, lines, _ = render(staged(make_profile, PVC, IMAGE), tmp_path, *options)
    assert code == 0
    where = "model.volumes[1] (image registry.internal/adapters:v3)"
    assert all(where in line for line in lines), lines
    assert any("an image volume, admitted by restricted from 1.33" in line for line in lines) is restricted
    assert len(lines) == int(restricted) + int(gate is not None), lines
    if gate is not None:
        assert gate in lines[-1]


def test_a_kube_version_it_cannot_judge_is_one_line(
    make_profile: Callable[[str, dict[str, Any]], Path], tmp_path: Path
) -> None:
    result = deploykit(
        "render", "helm", "-p", str(staged(make_profile, PVC)), "--facts", str(FACTS_DIR / "t4.json"),
        "-o", str(tmp_path / "out"), "--kube-version", "1.2x", check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == (
        "deploykit: render helm: --kube-version '1.2x': give the cluster's Kubernetes as MAJOR.MINOR, "
        "e.g. 1.33\n"
    )
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def restricted_values() -> dict[str, Any]:
    """The security values the chart renders with, and no volume: a values dict that names nothing."""
    from deploykit.render.helm import container_security_context, pod_security_context

    return {
        "podSecurityContext": pod_security_context(),
        "securityContext": container_security_context(read_only_root=False),
        "canary": {"enabled": True, "securityContext": container_security_context(read_only_root=True)},
        "smokeTest": {"securityContext": container_security_context(read_only_root=True)},
        "model": {"volumes": []},
        "extraVolumes": [],
        "initContainers": [],
    }


# Values a user sets at install that leave restricted, and the value each warning names.
ESCALATING = {**RESTRICTED_CONTAINER, "allowPrivilegeEscalation": True}
RAW_SOCKETS = {**RESTRICTED_CONTAINER, "capabilities": {"drop": ["ALL"], "add": ["NET_RAW"]}}
USER_VALUES: dict[str, tuple[dict[str, Any], str]] = {
    "an init container of one's own": (
        {"initContainers": [{"name": "warm-cache", "image": "busybox:1.36"}]},
        "initContainers[0] (warm-cache)",
    ),
    "a root UID": (
        {"podSecurityContext": {**CLEAN_POD["securityContext"], "runAsUser": 0}},
        "podSecurityContext",
    ),
    "a privileged vLLM": (
        {"securityContext": {**RESTRICTED_CONTAINER, "privileged": True}},
        "securityContext",
    ),
    "an escalating canary": (
        {"canary": {"enabled": True, "securityContext": ESCALATING}},
        "canary.securityContext",
    ),
    "a smoke test with a capability": (
        {"smokeTest": {"securityContext": RAW_SOCKETS}},
        "smokeTest.securityContext",
    ),
    "a node directory of one's own": (
        {"extraVolumes": [{"name": "scratch", "hostPath": {"path": "/mnt/nvme"}}]},
        "extraVolumes[0]",
    ),
}


@pytest.mark.parametrize("case", USER_VALUES)
def test_each_value_that_leaves_restricted_is_named(case: str) -> None:
    change, where = USER_VALUES[case]
    lines = chart_exceptions({**restricted_values(), **change})
    assert len(lines) == 1 and f"): {where}: " in lines[0], lines


def test_an_init_container_that_keeps_the_rules_is_not_named() -> None:
    init = [{"name": "warm-cache", "image": "busybox:1.36", "securityContext": RESTRICTED_CONTAINER}]
    assert chart_exceptions({**restricted_values(), "initContainers": init}) == []
    assert chart_exceptions(restricted_values()) == []


# --- every pod the chart renders passes (helm template) -------------------------------------------------


@pytest.fixture(scope="module")
def turing(tmp_path_factory: pytest.TempPathFactory, turing_facts: Path) -> Chart:
    directory = tmp_path_factory.mktemp("pss")
    return render_chart(profile_variant(directory, "gemma4-turing", LISTEN), turing_facts, directory / "out")


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Chart:
    from tests.render.test_helm_group import GROUP

    directory = tmp_path_factory.mktemp("pss-group")
    profile = profile_variant(directory, "qwen-lora-hopper", GROUP)
    return render_chart(profile, FACTS_DIR / "h100x8.json", directory / "out")


GATE_JOB = ("--set", "gate.job.enabled=true")


@pytest.mark.external_tool  # helm template
@pytest.mark.parametrize(
    "options", [(), GATE_JOB, INDEX_SOURCE, URL_SOURCE], ids=["defaults", "gate job", "index", "url"]
)
def test_every_pod_the_chart_renders_passes_restricted(turing: Chart, options: tuple[str, ...]) -> None:
    found = manifest_pods(template(turing.root, *options))
    assert "Deployment/demo" in found and any(name.startswith("Pod/demo-smoke") for name in found)
    for name, spec in found.items():
        for version in (OLDEST_KUBERNETES, (1, 35)):
            assert restricted_violations(spec, version) == [], name


@pytest.mark.external_tool  # helm template
def test_a_groups_leader_and_workers_pass_restricted(group: Chart) -> None:
    found = manifest_pods(group.manifests)
    roles = sorted(name.rpartition("/")[2] for name in found if name.startswith("LeaderWorkerSet/"))
    assert roles == ["leader", "worker"], sorted(found)
    for name, spec in found.items():
        assert restricted_violations(spec) == [], name


@pytest.mark.external_tool  # helm template
def test_an_init_container_given_at_install_is_caught_in_the_rendered_pod(
    turing: Chart, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `render` cannot see (a value set at `helm install`), the checker finds in `helm template`'s
    output: `helm template ... -f mine.yaml | python3 -m deploykit.render.pod_security` (docs/deploy.md)."""
    init = 'initContainers=[{"name": "warm-cache", "image": "busybox:1.36"}]'
    result = run_helm("template", "demo", str(turing.root), "--set-json", init)
    assert result.returncode == 0, result.stderr
    monkeypatch.setattr("sys.stdin", io.StringIO(result.stdout))
    assert main(["--kube-version", "1.33"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "Deployment/demo: container warm-cache: allowPrivilegeEscalation must be false "
        "(Privilege Escalation)",
        "Deployment/demo: container warm-cache: capabilities.drop must include ALL (Capabilities)",
    ]
    monkeypatch.setattr("sys.stdin", io.StringIO(run_helm("template", "demo", str(turing.root)).stdout))
    assert main([]) == 0 and capsys.readouterr().out == ""


def test_the_manifest_check_reads_every_kind_of_pod(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pods = [
        {"kind": "Pod", "metadata": {"name": "p"}, "spec": CLEAN_POD},
        {"kind": "Job", "metadata": {"name": "j"}, "spec": {"template": {"spec": changed("hostIPC", True)}}},
        {"kind": "LeaderWorkerSet", "metadata": {"name": "g"}, "spec": {"leaderWorkerTemplate": {
            "leaderTemplate": {"spec": CLEAN_POD}, "workerTemplate": {"spec": changed("hostPID", True)}}}},
        {"kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}},
    ]  # fmt: skip
    assert sorted(manifest_pods(pods)) == [
        "Job/j",
        "LeaderWorkerSet/g/leader",
        "LeaderWorkerSet/g/worker",
        "Pod/p",
    ]
    monkeypatch.setattr("sys.stdin", io.StringIO(yaml.safe_dump_all(pods)))
    assert main([]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "Job/j: pod: hostIPC (Host Namespaces)",
        "LeaderWorkerSet/g/worker: pod: hostPID (Host Namespaces)",
    ]
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["--kube-version", "1.9"]) == 2
    assert "--kube-version" in capsys.readouterr().err
