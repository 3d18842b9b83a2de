"""Issue 30 in the real systemd (PID 1 of the systemd-nspawn container the suite shares:
tests/e2e/nspawn_runtime.py, one boot per test session).

1. The hostile-profile matrix's printable payloads (`%`, quotes, backslash, `$`, a lone `;`, white space,
   unicode: tests/render/hostile.py) rendered by `render systemd` into units that systemd loads and starts:
   no planted directive ran, the unit's directives are the clean profile's, and the words, environment,
   description and paths systemd hands the service are the profile's strings exactly. (Control
   characters never reach a unit: the profile loader and the escaping layer refuse them,
   tests/render/test_hostile_profiles.py.)
2. The canary unit's root helper (`ExecStopPost=+PREFIX/bin/python -I -S .../root-helper.py`, then
   deploykit.render.on_corruption): a module the service user plants in the canary's working directory is
   never executed as root, a symlink the service user places where the old ledger lived and a symlink at the
   root-owned ledger's own path are never followed (the victim files unchanged); the helper, unable to trust
   that ledger, stops the server (fail closed) instead of restarting it uncounted.
3. (issue 43) A prefix the service user can write is refused before any of its code runs as root: a `.pth`
   file the service user plants in the prefix's site-packages never runs, and the server is stopped with one
   journal line instead of restarted.

No vLLM runs here: each server unit's `vllm` is a recorder that writes the argv and environment systemd gave
it to its state directory and sleeps; the canary's own command is replaced by `exit 3` (its corruption
verdict) in a drop-in, so the rendered ExecStopPost= line is what runs. The helper's Python is a root-owned
prefix made in the container (a venv config over this run's interpreter that imports this checkout), as
docs/deploy.md asks of a production prefix.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from deploykit.probe.load import load_facts
from deploykit.profile.load import load_profile
from deploykit.render.common import RenderError, plan_for_render, write_files
from deploykit.render.on_corruption import LEDGER_DIR
from deploykit.render.systemd import SystemdOptions, render_systemd
from tests.e2e.nspawn_prefix import install_root_helper, make_prefix
from tests.e2e.nspawn_runtime import NspawnMachine, wait_for
from tests.render.hostile import PLANTED_MARK, PRINTABLE, field_values, hostile_profile
from tests.vllm_harness import REPO

pytestmark = pytest.mark.e2e

PREFIX = "/opt/dk-hostile"  # root-owned, made in the container
FACTS = REPO / "tests" / "fixtures" / "facts" / "no-gpu.json"
# Every field a unit carries, with the payload; a cache_dir systemd cannot take is refused at render and
# then left plain (that refusal is the render tests' business).
UNIT_FIELDS = (
    "description",
    "model.served_name",
    "serve.generation_config",
    "serve.extra_args",
    "env.DK_VALUE",
)
RECORDER = """#!/usr/bin/python3
import json, os, sys, time
with open(os.path.join(os.environ["HOME"], "recorded.json"), "w") as out:
    json.dump({"argv": sys.argv, "env": dict(os.environ)}, out)
time.sleep(100000)
"""
PLANTED_MODULE = """import os
with open("/run/dk-planted-ran", "w") as out:
    out.write(str(os.geteuid()))
"""


@dataclass
class Rendered:
    name: str
    payload: str
    argv: list[str]
    values: dict[str, object]
    cache_dir: str

    @property
    def unit(self) -> str:
        return f"deploykit-{self.name}.service"

    @property
    def state_dir(self) -> str:
        return f"/var/lib/deploykit-{self.name}"


def render_one(machine: NspawnMachine, out: Path, name: str, payload: str, port: int) -> Rendered:
    changes = {field: field_values(payload)[field] for field in UNIT_FIELDS}
    changes["serve.port"] = port
    changes["deploy.cache_dir"] = field_values(payload)["deploy.cache_dir"]
    directory = out / name
    profile = hostile_profile(directory, "description", payload, name=name)
    text = profile.read_text()
    import yaml

    data = yaml.safe_load(text)
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    profile.write_text(yaml.safe_dump(data, sort_keys=False))
    loaded = load_profile(str(profile))
    plan = plan_for_render(loaded, load_facts(str(FACTS)))
    try:
        result = render_systemd(plan, loaded, SystemdOptions(prefix=Path(PREFIX)))
    except RenderError:
        data["deploy"]["cache_dir"] = f"/var/cache/{name}"
        profile.write_text(yaml.safe_dump(data, sort_keys=False))
        loaded = load_profile(str(profile))
        plan = plan_for_render(loaded, load_facts(str(FACTS)))
        result = render_systemd(plan, loaded, SystemdOptions(prefix=Path(PREFIX)))
    write_files(result, directory / "out")
    unit = f"deploykit-{name}"
    for suffix in ("", "-smoke", "-canary"):
        path = f"/etc/systemd/system/{unit}{suffix}.service"
        machine.write_file(path, (directory / "out" / f"{unit}{suffix}.service").read_text())
    machine.write_file(f"/etc/deploykit/{name}.yaml", (directory / "out" / f"{name}.yaml").read_text())
    machine.write_file(
        f"/etc/sysusers.d/{unit}.conf", (directory / "out" / f"{unit}.sysusers.conf").read_text()
    )
    install_root_helper(machine, directory / "out")
    # Test only: no vLLM here, so no /health to wait for; the canary's verdict is `exit 3` at once.
    machine.write_file(f"/etc/systemd/system/{unit}.service.d/50-test.conf", "[Service]\nExecStartPost=\n")
    machine.write_file(
        f"/etc/systemd/system/{unit}-canary.service.d/50-test.conf",
        "[Service]\nExecStart=\nExecStart=/bin/sh -c 'exit 3'\n",
    )
    return Rendered(
        name, payload, [f"{PREFIX}/bin/vllm", *plan.argv[1:]], data, loaded.profile.deploy.cache_dir
    )


@pytest.fixture(scope="module")
def hostile(
    nspawn_machine: NspawnMachine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Rendered]]:
    machine = nspawn_machine
    out = tmp_path_factory.mktemp("hostile-units")
    make_prefix(machine, PREFIX, vllm=RECORDER)
    rendered = [
        render_one(machine, out, f"dk-h{index}", payload, 8100 + index)
        for index, payload in enumerate(PRINTABLE.values())
    ]
    machine.run(["systemd-sysusers"])
    machine.systemctl("daemon-reload")
    try:
        yield rendered
    finally:
        for item in rendered:
            machine.systemctl("stop", item.unit, check=False, timeout=120)


def recorded(machine: NspawnMachine, item: Rendered) -> dict[str, object]:
    path = machine.host_path(f"{item.state_dir}/recorded.json")
    wait_for(lambda: path.exists() and path.stat().st_size > 0, f"{item.unit} recorded its start", 60)
    data: dict[str, object] = json.loads(path.read_text())
    return data


def test_hostile_units_load_start_and_carry_the_profiles_strings_exactly(
    nspawn_machine: NspawnMachine, hostile: list[Rendered]
) -> None:
    machine = nspawn_machine
    for item in hostile:
        machine.systemctl("start", item.unit)
        seen = recorded(machine, item)
        assert seen["argv"] == item.argv, item.payload
        env = seen["env"]
        assert isinstance(env, dict)
        assert env["DK_VALUE"] == item.payload, item.payload
        assert env["XDG_CACHE_HOME"] == item.cache_dir.rstrip("/"), item.payload
        description = machine.unit_property(item.unit, "Description")
        served = field_values(item.payload)["model.served_name"]
        assert description.startswith(f"vLLM serving {served}".rstrip("\\ ")), (item.payload, description)
        for unit in (item.unit, item.unit.replace(".service", "-smoke.service")):
            assert machine.unit_property(unit, "LoadState") == "loaded", unit
            # nothing planted: the server's one ExecStartPre= is its vLLM release check
            pre = machine.unit_property(unit, "ExecStartPre")
            assert (pre == "") is (unit != item.unit) and pre.count("path=") <= 1, (unit, pre)
            assert pre == "" or "deploykit.render.vllm_release" in pre, (unit, pre)
    assert not machine.host_path(PLANTED_MARK).exists()
    log = machine.journal("-b", "--no-pager", "-o", "cat")
    assert "Unknown key" not in log and "Ignoring" not in log.replace("Ignoring unknown", ""), log[-3000:]


def test_the_root_helper_runs_no_planted_module_and_follows_no_link(
    nspawn_machine: NspawnMachine, hostile: list[Rendered]
) -> None:
    machine = nspawn_machine
    item = hostile[0]
    deploy = item.values["deploy"]
    assert isinstance(deploy, dict)
    user = str(deploy["user"])  # the service user the unit runs as
    machine.systemctl("start", item.unit)
    first = machine.unit_property(item.unit, "InvocationID")
    # What the service user can do: plant a package in its own state directory (the canary's working
    # directory), and links where the old ledger was written.
    plant = f"{item.state_dir}/deploykit/render"
    for folder in (f"{item.state_dir}/deploykit", plant):
        machine.run(["runuser", "-u", user, "--", "mkdir", "-p", folder])
        machine.run(["runuser", "-u", user, "--", "touch", f"{folder}/__init__.py"])
    machine.run(
        ["runuser", "-u", user, "--", "sh", "-c", f"cat > {plant}/on_corruption.py"], input=PLANTED_MODULE
    )
    victim = "/etc/dk-victim"
    machine.write_file(victim, "precious\n")
    machine.run(["runuser", "-u", user, "--", "ln", "-s", victim, f"{item.state_dir}/corruption-restarts"])
    # ... and, as if it had got there, a link at the root-owned ledger's own path.
    machine.run(["mkdir", "-p", "-m", "0700", LEDGER_DIR])
    machine.run(["ln", "-sf", victim, f"{LEDGER_DIR}/{item.unit}"])

    canary = item.unit.replace(".service", "-canary.service")
    stopped_by_the_helper(machine, item.unit, first)
    assert not machine.host_path("/run/dk-planted-ran").exists(), "the planted module ran as root"
    assert machine.host_path(victim).read_text() == "precious\n"
    assert machine.host_path(f"{LEDGER_DIR}/{item.unit}").is_symlink()
    log = machine.journal("-u", canary, "-o", "cat")
    assert "cannot be trusted" in log and f"{item.unit} is stopped" in log, log[-3000:]
    # With the link gone the helper makes its own ledger and restarts the server, counted.
    machine.run(["rm", "-f", f"{LEDGER_DIR}/{item.unit}"])
    machine.systemctl("start", item.unit)
    second = machine.unit_property(item.unit, "InvocationID")
    machine.systemctl("start", canary, check=False)
    wait_for(
        lambda: machine.unit_property(item.unit, "InvocationID") not in ("", second),
        f"{item.unit} restarted by the helper",
        120,
    )
    assert not machine.host_path("/run/dk-planted-ran").exists(), "the planted module ran as root"
    assert machine.host_path(victim).read_text() == "precious\n"
    ledger = machine.host_path(f"{LEDGER_DIR}/{item.unit}")
    assert not ledger.is_symlink() and len(ledger.read_text().split()) == 1
    assert oct(machine.host_path(LEDGER_DIR).stat().st_mode & 0o777) == oct(0o700)


def stopped_by_the_helper(machine: NspawnMachine, unit: str, invocation: str) -> None:
    """Start the unit's canary (whose verdict restarts the server) and wait for the helper to stop the server
    instead: the canary exits 3, the server goes inactive and is never started again."""
    canary = unit.replace(".service", "-canary.service")
    machine.systemctl("start", canary, check=False)
    wait_for(lambda: machine.unit_property(canary, "ExecMainStatus") == "3", "the canary's exit 3", 60)
    wait_for(
        lambda: machine.unit_property(unit, "ActiveState") == "inactive", f"{unit} stopped by the helper", 120
    )
    assert machine.unit_property(unit, "InvocationID") == invocation  # stopped, never restarted


PLANTED_PTH = "import os; open('/run/dk-pth-ran', 'w').write(str(os.geteuid()))\n"


def test_the_root_helper_refuses_a_prefix_the_service_user_can_write(
    nspawn_machine: NspawnMachine, hostile: list[Rendered]
) -> None:
    """A prefix whose site-packages the service user owns: the `.pth` file it plants there (code Python runs
    at start-up) never runs as root; the helper refuses the prefix in one journal line and stops the server
    (fail closed) instead of restarting it."""
    machine = nspawn_machine
    item = hostile[1]  # not the ledger test's unit
    deploy = item.values["deploy"]
    assert isinstance(deploy, dict)
    user = str(deploy["user"])
    site = f"{PREFIX}/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    canary = item.unit.replace(".service", "-canary.service")
    machine.run(["chown", user, site])
    try:
        machine.run(
            ["runuser", "-u", user, "--", "sh", "-c", f"cat > {site}/zz-planted.pth"], input=PLANTED_PTH
        )
        machine.systemctl("start", item.unit)
        first = machine.unit_property(item.unit, "InvocationID")
        stopped_by_the_helper(machine, item.unit, first)
        assert not machine.host_path("/run/dk-pth-ran").exists(), "the planted .pth ran as root"
        refused = [
            line
            for line in machine.journal("-u", canary, "-o", "cat").splitlines()
            if line.startswith("root helper: refused")
        ]
        assert len(refused) == 1, machine.journal("-u", canary, "-o", "cat")[-3000:]
        assert f"{site} is owned by uid" in refused[0] and f"{item.unit} is stopped" in refused[0], refused
    finally:
        machine.run(["rm", "-f", f"{site}/zz-planted.pth", "/run/dk-pth-ran"])
        machine.run(["chown", "root", site])


KEY = "sk-live-0123456789abcdefXYZ"


@pytest.mark.parametrize(
    ("label", "line"), [("non-ascii", f"VLLM_API_KEY={KEY}é\n"), ("crlf", f"VLLM_API_KEY={KEY}\r\n")]
)
def test_a_bad_api_key_never_reaches_the_journal_or_the_store(
    nspawn_machine: NspawnMachine, hostile: list[Rendered], tmp_path: Path, label: str, line: str
) -> None:
    """The smoke companion with a key it cannot send (from a secrets file as an editor or kubectl leaves
    it): one line naming the variable in the journal, the row stored without the key."""
    machine = nspawn_machine
    name = f"dk-key-{label}"
    item = render_one(machine, tmp_path, name, "plain", 8300 + len(label))
    profile = Path(tmp_path / name / f"{name}.yaml")
    # the same unit set, for a profile whose server reads an API key (the smoke companion sends it)
    import yaml

    data = yaml.safe_load(profile.read_text())
    data["serve"]["api_key_env"] = "DK_TEST_KEY"
    data["serve"]["allow_unauthenticated"] = False
    profile.write_text(yaml.safe_dump(data, sort_keys=False))
    loaded = load_profile(str(profile))
    plan = plan_for_render(loaded, load_facts(str(FACTS)))
    result = render_systemd(plan, loaded, SystemdOptions(prefix=Path(PREFIX)))
    write_files(result, tmp_path / name / "keyed", force=True)
    unit = f"deploykit-{name}"
    for suffix in ("", "-smoke", "-canary"):
        text = (tmp_path / name / "keyed" / f"{unit}{suffix}.service").read_text()
        machine.write_file(f"/etc/systemd/system/{unit}{suffix}.service", text)
    machine.write_file(f"/etc/deploykit/{name}.yaml", profile.read_text())
    machine.write_file(f"/etc/deploykit/{name}.env", line, mode=0o600)
    machine.run(["systemd-sysusers"])
    machine.systemctl("daemon-reload")
    machine.systemctl("start", item.unit)
    smoke = f"{unit}-smoke.service"
    machine.systemctl("start", smoke, check=False, timeout=300)
    wait_for(
        lambda: machine.unit_property(smoke, "ActiveState") in ("inactive", "failed"), "the smoke ran", 300
    )
    journal = machine.journal("-u", smoke, "-o", "cat")
    assert KEY not in journal and "0123456789abcdef" not in journal, journal[-3000:]
    assert "deploykit smoke" in journal or "smoke" in journal
    if label == "non-ascii":  # refused before any request, one line naming the variable
        lines = [entry for entry in journal.splitlines() if "VLLM_API_KEY" in entry and "non-ASCII" in entry]
        assert len(lines) == 1, journal[-3000:]
    store = machine.host_path(f"{item.state_dir}")
    stored = b"".join(path.read_bytes() for path in store.rglob("*.sqlite*") if path.is_file())
    assert stored, "the smoke stored no row"
    assert KEY.encode() not in stored
    machine.systemctl("stop", item.unit, check=False, timeout=120)
