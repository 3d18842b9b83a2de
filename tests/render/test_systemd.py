"""`deploykit render systemd`: systemd itself checks the units (verify, security), and the unit's ExecStart
is `deploykit plan`'s argv word for word, quoting included."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deploykit.render.systemd import quote_word
from tests.render.conftest import deploykit, planned
from tests.unit_prefix import unit_prefix

# Exposure thresholds (systemd-analyze security, 0 = locked down, 10 = unprotected); docs/deploy.md
# justifies them: the rendered score plus 0.1, so dropping most single hardening lines already fails.
SERVER_EXPOSURE_MAX = 1.7
SMOKE_EXPOSURE_MAX = 1.0
SERVER_HARDENING = [
    "NoNewPrivileges=yes", "ProtectSystem=strict", "ReadWritePaths=/var/cache/deploykit", "ProtectHome=yes",
    "PrivateTmp=yes", "PrivateMounts=yes", "ProtectKernelTunables=yes", "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes", "ProtectControlGroups=yes", "ProtectClock=yes", "ProtectHostname=yes",
    "ProtectProc=invisible", "RestrictNamespaces=yes", "RestrictRealtime=yes", "RestrictSUIDSGID=yes",
    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK", "LockPersonality=yes", "RemoveIPC=yes",
    "CapabilityBoundingSet=", "AmbientCapabilities=", "SystemCallArchitectures=native",
    "SystemCallFilter=@system-service", "SystemCallFilter=~@privileged", "SystemCallErrorNumber=EPERM",
    "UMask=0077", "DevicePolicy=closed",
]  # fmt: skip


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("systemd-analyze is missing: CI must install Debian's `systemd` package")
    pytest.skip("systemd-analyze is not installed (Debian package `systemd`)")


def verify(*units: Path) -> str:
    """systemd's own checks of the given units. Their dependencies are not verified (--recursive-errors=no):
    each test passes every unit of its own; the host's units are not under test, and loading them took
    two thirds of each call (~36 ms of ~48)."""
    result = subprocess.run(
        [systemd_analyze(), "verify", "--man=no", "--recursive-errors=no", *[str(u) for u in units]],
        capture_output=True,
        text=True,
        cwd=units[0].parent,
        timeout=60,
    )
    return (result.stdout + result.stderr).strip() + (
        "" if result.returncode == 0 else f"\nrc={result.returncode}"
    )


def exposure(unit: Path) -> float:
    result = subprocess.run(
        [systemd_analyze(), "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        cwd=unit.parent,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout + result.stderr)
    assert match, result.stdout + result.stderr
    return float(match.group(1))


# --- reading ExecStart back ---------------------------------------------------------------------------
# The subset of systemd's command-line syntax (systemd.service(5), "Command lines") that the renderer
# emits: backslash-newline continuations, `%%` specifiers, words separated by blanks, double-quoted words
# with C escapes (\\ \" \n \t), and `$$` for a literal dollar. Anything else is refused, not guessed.
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t"}


def unit_value(unit_text: str, key: str) -> str:
    joined = re.sub(r"\\\n[ \t]*", " ", unit_text)
    values = [line[len(key) + 1 :] for line in joined.splitlines() if line.startswith(f"{key}=")]
    assert len(values) == 1, f"{key}= appears {len(values)} times"
    return values[0]


def split_command_line(value: str) -> list[str]:
    if re.search(r"%[^%]", value.replace("%%", "")):
        raise ValueError(f"unexpected specifier in {value!r}")
    value = value.replace("%%", "%")
    words: list[str] = []
    i = 0
    while i < len(value):
        if value[i] in " \t":
            i += 1
            continue
        word = ""
        if value[i] == '"':
            i += 1
            while value[i] != '"':
                if value[i] == "\\":
                    word += _ESCAPES[value[i + 1]]
                    i += 2
                else:
                    word += value[i]
                    i += 1
            i += 1
            if i < len(value) and value[i] not in " \t":
                raise ValueError("text right after a closing quote")
        elif value[i : i + 2] == "\\;" and value[i + 2 : i + 3] in ("", " ", "\t"):
            word, i = ";", i + 2  # a literal `;` word (a bare one separates commands)
        else:
            while i < len(value) and value[i] not in " \t":
                if value[i] in "\\\"'":
                    raise ValueError(f"unquoted {value[i]} in {value!r}")
                word += value[i]
                i += 1
        if re.search(r"\$[^$]", word.replace("$$", "")) or word.replace("$$", "").endswith("$"):
            raise ValueError(f"variable expansion in {word!r}")
        words.append(word.replace("$$", "$"))
    return words


def test_command_line_reader_on_the_quoting_rules() -> None:
    tricky = ["a b", 'say "hi"', "100%", "$HOME", "back\\slash", "tab\there", "", "plain-word=1", ";", "a;b"]
    assert split_command_line(" ".join(quote_word(w) for w in tricky)) == tricky
    assert quote_word("100%") == '"100%%"' and quote_word("$HOME") == '"$$HOME"'
    with pytest.raises(ValueError):
        split_command_line("vllm $HOME")  # would be expanded by systemd
    with pytest.raises(ValueError):
        split_command_line("vllm %h")  # a specifier


# --- rendering ------------------------------------------------------------------------------------------


def render(profile: Path | str, facts: Path, out: Path, *extra: str) -> dict[str, str]:
    deploykit(
        "render",
        "systemd",
        "--profile",
        str(profile),
        "--facts",
        str(facts),
        "--out",
        str(out),
        "--prefix",
        str(unit_prefix()),
        *extra,
    )
    return {p.name: p.read_text() for p in out.iterdir()}


@pytest.fixture(scope="module")
def turing_render(
    tmp_path_factory: pytest.TempPathFactory, turing_facts: Path
) -> tuple[Path, dict[str, Any]]:
    """gemma4-turing (HF token and API key secrets, fp32_projection on for CC 7.5), tensor parallel 2."""
    from tests.render.conftest import profile_variant

    directory = tmp_path_factory.mktemp("turing")
    profile = profile_variant(directory, "gemma4-turing", {"serve.tensor_parallel_size": 2})
    out = directory / "out"
    render(profile, turing_facts, out)
    return out, planned(profile, turing_facts)


def test_verify_reports_nothing_for_the_rendered_units(turing_render: tuple[Path, dict[str, Any]]) -> None:
    out, _ = turing_render
    server, smoke = out / "deploykit-gemma4-turing.service", out / "deploykit-gemma4-turing-smoke.service"
    assert verify(server, smoke) == ""


def test_verify_does_see_a_broken_unit(turing_render: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """The check above can fail: an unbalanced quote in ExecStart and an unknown key both get warnings."""
    out, _ = turing_render
    text = (out / "deploykit-gemma4-turing.service").read_text()
    broken = tmp_path / "deploykit-gemma4-turing.service"
    shutil.copy(out / "deploykit-gemma4-turing-smoke.service", tmp_path)
    broken.write_text(text.replace("ProtectClock=", "ProtectClok="))
    assert "Unknown key 'ProtectClok'" in verify(broken)
    broken.write_text(text.replace("--max-model-len", '"--max-model-len'))
    assert "Unbalanced quoting" in verify(broken)


def test_exposure_is_below_the_justified_thresholds(turing_render: tuple[Path, dict[str, Any]]) -> None:
    out, _ = turing_render
    server = exposure(out / "deploykit-gemma4-turing.service")
    smoke = exposure(out / "deploykit-gemma4-turing-smoke.service")
    assert server <= SERVER_EXPOSURE_MAX, f"server exposure {server}"
    assert smoke <= SMOKE_EXPOSURE_MAX, f"smoke exposure {smoke}"


def test_exposure_check_fails_without_the_hardening_lines(
    turing_render: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    out, _ = turing_render
    text = (out / "deploykit-gemma4-turing.service").read_text()
    start, end = text.index("NoNewPrivileges="), text.index("[Install]")
    bare = tmp_path / "deploykit-gemma4-turing.service"
    bare.write_text(text[:start] + text[end:])
    assert exposure(bare) > SERVER_EXPOSURE_MAX + 3
    for line in ("CapabilityBoundingSet=", "SystemCallFilter=@system-service", "NoNewPrivileges=yes"):
        bare.write_text(text.replace(line + "\n", ""))
        assert exposure(bare) > SERVER_EXPOSURE_MAX, line


def test_exec_start_is_the_planned_argv(turing_render: tuple[Path, dict[str, Any]]) -> None:
    out, plan = turing_render
    argv = split_command_line(unit_value((out / "deploykit-gemma4-turing.service").read_text(), "ExecStart"))
    assert argv[0] == str(unit_prefix() / "bin" / "vllm")
    assert argv[1:] == plan["argv"][1:]
    assert plan["argv"][0] == "vllm" and "--tensor-parallel-size" in argv


def test_fix_environment_is_the_plans_and_secrets_stay_in_the_env_file(
    turing_render: tuple[Path, dict[str, Any]],
) -> None:
    out, plan = turing_render
    unit = (out / "deploykit-gemma4-turing.service").read_text()
    assert plan["env"]["DEPLOYKIT_FIXES"] == "fp32_projection"
    for key, value in plan["env"].items():
        if key in plan["secret_env"]:
            assert f"Environment={key}" not in unit and f'Environment="{key}' not in unit
        else:
            assert f"Environment={key}={value}" in unit
    assert "EnvironmentFile=/etc/deploykit/gemma4-turing.env\n" in unit  # required: no `-` prefix
    env_file = (out / "gemma4-turing.env.example").read_text()
    assigned = sorted(line.split("=")[0] for line in env_file.splitlines() if re.match(r"^[A-Z_]+=", line))
    assert assigned == ["HF_TOKEN", "VLLM_API_KEY"]
    assert "--api-key" not in unit and "hf-token" not in unit


def test_gpu_nodes_are_allowed_one_by_one(turing_render: tuple[Path, dict[str, Any]]) -> None:
    out, _ = turing_render
    unit = (out / "deploykit-gemma4-turing.service").read_text()
    allowed = re.findall(r"^DeviceAllow=(\S+) rw$", unit, re.M)
    assert allowed == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia0",
        "/dev/nvidia1",
    ]
    assert "DevicePolicy=closed" in unit
    assert not re.search(r"^PrivateDevices=", unit, re.M)  # it would hide /dev/nvidia*
    assert "Environment=CUDA_VISIBLE_DEVICES=0,1" in unit
    for line in ["Type=exec", "Restart=on-failure", "User=vllm", "Group=vllm", *SERVER_HARDENING]:
        assert re.search(rf"^{re.escape(line)}$", unit, re.M), line
    assert int(unit_value(unit, "TimeoutStartSec")) > 1800  # the profile's start-up time, plus margin


def test_smoke_companion_runs_after_the_server_with_the_profile(
    turing_render: tuple[Path, dict[str, Any]],
) -> None:
    out, _ = turing_render
    smoke = (out / "deploykit-gemma4-turing-smoke.service").read_text()
    server = (out / "deploykit-gemma4-turing.service").read_text()
    assert (
        "After=deploykit-gemma4-turing.service" in smoke
        and "BindsTo=deploykit-gemma4-turing.service" in smoke
    )
    assert "deploykit-gemma4-turing-smoke.service" in unit_value(server, "Wants")
    argv = split_command_line(unit_value(smoke, "ExecStart"))
    assert argv == [
        str(unit_prefix() / "bin" / "deploykit"),
        "smoke",
        "--url",
        "http://127.0.0.1:8000",
        "--profile",
        "/etc/deploykit/gemma4-turing.yaml",
        "--expect-fixes",
        "fp32_projection",  # the plan's fixes: the companion fails when the server does not run them
        "--api-key-env",
        "VLLM_API_KEY",
    ]
    wait = split_command_line(unit_value(server, "ExecStartPost"))
    assert wait[1:4] == ["-m", "deploykit.render.wait_health", "http://127.0.0.1:8000/health"]
    assert (out / "gemma4-turing.yaml").read_text().startswith("name: gemma4-turing")


@pytest.mark.parametrize(
    ("host", "url", "allow"),
    [("::1", "http://[::1]:8000", "localhost"), ("::", "http://[::1]:8000", "localhost")],
)
def test_an_ipv6_host_gives_the_smoke_companion_a_bracketed_url(
    host: str,
    url: str,
    allow: str,
    make_profile: Callable[[str, dict[str, Any]], Path],
    turing_facts: Path,
    tmp_path: Path,
) -> None:
    # `::` listens beyond loopback: render refuses it unless the profile says it may be unauthenticated.
    profile = make_profile("demo-cpu", {"serve.host": host, "serve.allow_unauthenticated": True})
    files = render(profile, turing_facts, tmp_path / "out")
    smoke = files["deploykit-demo-cpu-smoke.service"]
    argv = split_command_line(unit_value(smoke, "ExecStart"))
    assert argv[argv.index("--url") + 1] == url
    assert unit_value(smoke, "IPAddressAllow") == allow
    wait = split_command_line(unit_value(files["deploykit-demo-cpu.service"], "ExecStartPost"))
    assert wait[3] == f"{url}/health"


def test_tricky_extra_args_survive_quoting(
    make_profile: Callable[[str, dict[str, Any]], Path], turing_facts: Path, tmp_path: Path
) -> None:
    """Spaces, quotes, %, $ and backslashes in argv: systemd accepts the unit and reads the same words."""
    extra = [
        "--override-generation-config",
        '{"temperature": 0.5, "stop": ["\\n"]}',
        "--chat-template",
        "/srv/templates/my template 100% $HOME.jinja",
    ]
    profile = make_profile("gemma4-turing", {"serve.extra_args": extra})
    out = tmp_path / "out"
    files = render(profile, turing_facts, out)
    assert (
        verify(out / "deploykit-gemma4-turing.service", out / "deploykit-gemma4-turing-smoke.service") == ""
    )
    argv = split_command_line(unit_value(files["deploykit-gemma4-turing.service"], "ExecStart"))
    assert argv[1:] == planned(profile, turing_facts)["argv"][1:]
    assert argv[-4:] == extra


def test_cpu_profile_opens_no_gpu_and_verifies(turing_facts: Path, tmp_path: Path) -> None:
    files = render("demo-cpu", turing_facts, tmp_path)
    unit = files["deploykit-demo-cpu.service"]
    assert "DeviceAllow=" not in unit and "DevicePolicy=closed" in unit and "CUDA_VISIBLE_DEVICES" not in unit
    assert "EnvironmentFile=-/etc/deploykit/demo-cpu.env" in unit  # no secret needed: optional file
    assert (
        verify(tmp_path / "deploykit-demo-cpu.service", tmp_path / "deploykit-demo-cpu-smoke.service") == ""
    )


def test_a_planted_secret_never_reaches_a_rendered_file(turing_facts: Path, tmp_path: Path) -> None:
    planted = "hf_PLANTED_secret_7f3a"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "deploykit",
            "render",
            "systemd",
            "-p",
            "gemma4-turing",
            "--facts",
            str(turing_facts),
            "--out",
            str(tmp_path),
            "--prefix",
            str(unit_prefix()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_TOKEN": planted, "DEPLOYKIT_API_KEY": planted},
    )
    assert result.returncode == 0, result.stderr
    for path in tmp_path.iterdir():
        assert planted not in path.read_text(), path.name
    assert planted not in result.stdout + result.stderr


def test_a_prefix_without_deploykits_plugin_is_refused(turing_facts: Path, tmp_path: Path) -> None:
    """A Python environment that exists here but cannot load deploykit's plugin would run vLLM without the
    planned fixes: render refuses it, saying how to install deploykit there. A prefix that is not on this
    host (rendering for another machine) is not checked."""
    import venv

    bare = tmp_path / "bare-env"
    venv.create(bare, with_pip=False)  # a Python without deploykit (nor anything else)
    args = ["render", "systemd", "-p", "gemma4-turing", "--facts", str(turing_facts)]
    refused = deploykit(*args, "--out", str(tmp_path / "out"), "--prefix", str(bare), check=False)
    assert refused.returncode == 2
    assert "does not see deploykit's vLLM plugin" in refused.stderr
    assert f"{bare}/bin/python -m pip install vllm-deploykit==" in refused.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    elsewhere = deploykit(*args, "--out", str(tmp_path / "other"), "--prefix", "/opt/not-on-this-host")
    assert "deploykit-gemma4-turing.service" in elsewhere.stdout
