"""A systemd service unit, its smoke companion, its canary (which restarts it on corrupt output), a secrets
file template and a sysusers entry from a plan.

The unit's ExecStart is the plan's argv, quoted by systemd's rules, so `deploykit plan` and the unit run
the same vLLM command by construction.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from deploykit import net
from deploykit.canary import defaults as canary_defaults
from deploykit.canary.known_hangs import hang_ids
from deploykit.canary.settings import DEFAULTS, CanarySettings, canary_args, shown
from deploykit.plugin_contract import ENTRY_POINT, ENTRY_POINT_NAME
from deploykit.render import escape, root_helper
from deploykit.render.common import (
    RenderedFile,
    RenderError,
    RenderResult,
    gpu_count,
    jinja_environment,
    plain_env,
)
from deploykit.render.on_corruption import LEDGER_DIR, RESTART_EXIT_STATUSES
from deploykit.render.systemd_group import GroupLaunch, group_launch
from deploykit.render.unit_gpus import check_prefix_visible, unit_gpus

if TYPE_CHECKING:
    from deploykit.plan import Plan
    from deploykit.profile.schema import LoadedProfile

ENV_DIR = "/etc/deploykit"
# The canary's root helper: a file of the unit set, installed root-owned outside the prefix (docs/deploy.md).
ROOT_HELPER_FILE = "deploykit-root-helper.py"
ROOT_HELPER_PATH = "/usr/local/libexec/deploykit/root-helper.py"
# Beyond the profile's start-up time: process start, and the gap between health polls.
START_TIMEOUT_MARGIN_S = 60
# The canary unit: the canary's default settings (deploykit.canary.settings), its /healthz, /livez and
# /metrics listener on loopback, on a port of its own per profile: the server's port + CANARY_PORT_OFFSET
# (8000 → 9400), so that profiles on distinct server ports get distinct canary ports on one host.
CANARY_HOST = "127.0.0.1"
CANARY_PORT_OFFSET = 1400
# The settings the unit passes to `deploykit canary` (the rest are its defaults there too).
UNIT_SETTINGS = ("every_s", "listen")
# Restart storms: at most this many corruption restarts of the server within the window; the next corruption
# verdict stops it (deploykit/render/on_corruption.py).
CORRUPTION_MAX_RESTARTS = canary_defaults.MAX_RESTARTS_PER_HOUR
CORRUPTION_WINDOW_S = int(canary_defaults.RESTART_WINDOW_S)
# The canary's exit statuses that restart the server (through on_corruption, under the cap) and that must
# not restart the canary by itself: one list, read by both lines of the canary unit.
SERVER_RESTART_EXIT_STATUSES: tuple[int, ...] = RESTART_EXIT_STATUSES


class SystemdOptions(BaseModel):
    """Where the deployment's software lives on the target host."""

    prefix: Path
    """The environment (virtualenv or system prefix) whose bin/ holds vllm, deploykit and python."""
    gpus: list[int] | None = None
    """The GPU indices the server unit opens (`render systemd --gpus`); None: 0..N-1."""


class SecretLine(BaseModel):
    name: str
    why: str


def quote_word(word: str) -> str:
    """One argv word for ExecStart= (deploykit.render.escape.systemd_exec_word)."""
    return escape.systemd_exec_word(word)


class Expanded(str):
    """An ExecStart= word written as it is, never quoted: `${NAME}` (deploykit.render.gate.unit_variable),
    which systemd replaces by one variable's whole value, as one argument."""


def command_line(argv: list[str]) -> str:
    """ExecStart= value: one flag and its values per continued line, so the unit stays readable."""
    if not argv or not argv[0].startswith("/"):
        raise RenderError(f"ExecStart needs an absolute executable path, got {argv[:1]}")
    lines: list[list[str]] = [[]]
    for word in argv:
        if word.startswith("-") and lines[-1]:
            lines.append([])
        lines[-1].append(word if isinstance(word, Expanded) else quote_word(word))
    return " \\\n    ".join(" ".join(line) for line in lines)


def unit_name(loaded: LoadedProfile) -> str:
    return f"deploykit-{loaded.profile.name}"


def device_nodes(gpus: list[int], facts_mig: bool) -> list[str]:
    """NVIDIA nodes a CUDA process opens: the control and UVM nodes, one node per GPU used."""
    if not gpus:
        return []
    nodes = ["/dev/nvidiactl rw", "/dev/nvidia-uvm rw", "/dev/nvidia-uvm-tools rw"]
    nodes += [f"/dev/nvidia{index} rw" for index in gpus]
    if facts_mig:
        nodes.append("char-nvidia-caps r")
    return nodes


def service_environment(plan: Plan, loaded: LoadedProfile, state_dir: str, gpus: list[int]) -> dict[str, str]:
    """HOME and caches inside the writable paths, the GPUs the unit may open; the plan's own env wins."""
    cache_dir = loaded.profile.deploy.cache_dir.rstrip("/")
    env = {
        "HOME": state_dir,
        "XDG_CACHE_HOME": cache_dir,
        "HF_HOME": f"{cache_dir}/huggingface",
        "VLLM_CACHE_ROOT": f"{cache_dir}/vllm",
    }
    if gpus:
        # Only the GPUs that DeviceAllow= opens, in the order nvidia-smi and the device nodes use.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in gpus)
    env.update(plain_env(plan))
    return env


def secret_lines(plan: Plan) -> list[SecretLine]:
    """One line per secret the server reads; the smoke companion reads the API key from the same line."""
    lines = []
    for key, source in plan.secret_env.items():
        why = f"read by vLLM; in `deploykit plan --format shell` it comes from ${source}"
        if key == "VLLM_API_KEY":
            why += "; the smoke companion reads it too (--api-key-env VLLM_API_KEY)"
        lines.append(SecretLine(name=key, why=why))
    return lines


def canary_settings(loaded: LoadedProfile) -> CanarySettings:
    """The canary unit's settings: the defaults, listening on loopback at the server's port +
    CANARY_PORT_OFFSET (the server's port - CANARY_PORT_OFFSET when that would pass 65535); checked as
    `deploykit canary --listen` checks it (one line naming the option)."""
    port = loaded.profile.serve.port
    canary_port = (
        port + CANARY_PORT_OFFSET if port + CANARY_PORT_OFFSET <= 65535 else port - CANARY_PORT_OFFSET
    )
    return DEFAULTS.replace(listen=f"{CANARY_HOST}:{canary_port}")


def smoke_url(loaded: LoadedProfile) -> str:
    """The server's URL for the smoke companion and the health wait, on the same machine."""
    return net.base_url(loaded.profile.serve.host, loaded.profile.serve.port)


def smoke_ip_allow(loaded: LoadedProfile) -> str:
    """The addresses the smoke client may reach: loopback, and the server's own address when it is one."""
    host = loaded.profile.serve.host
    address = net.ip_address(host)
    if address is None:
        return ""  # a host name: its address is not known here, so no IP allow list
    if net.is_wildcard(host) or not net.listens_beyond_loopback(host):
        return "localhost"
    return f"localhost {address}"


_ENTRY_POINT_PROBE = (
    "import json\nfrom importlib.metadata import entry_points\n"
    "print(json.dumps([[e.name, e.value] for e in entry_points(group='vllm.general_plugins')]))"
)
PLUGIN_ENTRY_POINT = (ENTRY_POINT_NAME, ENTRY_POINT)


def check_prefix_sees_plugin(prefix: Path) -> None:
    """When `prefix` exists here, its Python must see deploykit's `vllm.general_plugins` entry point.

    Run isolated (`-I`: no PYTHONPATH, no user site), as the unit runs it; a prefix that does not exist on
    this host is the target host's business, so nothing is checked.
    """
    import json
    import subprocess

    if not prefix.exists():
        return
    python = prefix / "bin" / "python"
    if not python.exists():
        raise RenderError(f"--prefix {prefix}: there is no {python}; give the environment vLLM runs from")
    try:
        done = subprocess.run(
            [str(python), "-I", "-c", _ENTRY_POINT_PROBE], capture_output=True, text=True, timeout=60
        )
        found = [tuple(item) for item in json.loads(done.stdout)] if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        raise RenderError(f"--prefix {prefix}: cannot run {python}: {exc}") from exc
    if found is None:
        raise RenderError(f"--prefix {prefix}: {python} failed: {done.stderr.strip()[-300:]}")
    if PLUGIN_ENTRY_POINT not in found:
        from deploykit import DISTRIBUTION, __version__

        raise RenderError(
            f"--prefix {prefix}: its Python does not see deploykit's vLLM plugin (entry point "
            f"vllm.general_plugins {PLUGIN_ENTRY_POINT[0]} = {PLUGIN_ENTRY_POINT[1]}), so vLLM there would "
            f"ignore DEPLOYKIT_FIXES and serve without the planned fixes. Install deploykit beside vLLM: "
            f"{prefix}/bin/python -m pip install {DISTRIBUTION}=={__version__}"
        )


def check_prefix_trusted(prefix: Path) -> None:
    """When `prefix` exists here, root must be able to trust it as the canary's root helper will (every
    directory to its interpreter, its site-packages and the deploykit package root's own, none writable by
    another user: deploykit.render.root_helper), or the first corruption verdict would stop the server."""
    import subprocess

    if not prefix.exists():
        return
    python = prefix / "bin" / "python"
    argv = [str(python), "-I", "-S", str(Path(root_helper.__file__)), root_helper.CHECK_FLAG]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RenderError(f"--prefix {prefix}: cannot run {python}: {exc}") from exc
    if done.returncode != 0:
        why = (done.stdout.strip() or done.stderr.strip()).splitlines()[-1:] or ["no answer"]
        raise RenderError(
            f"--prefix {prefix}: root cannot trust it ({why[0][-300:]}), and the canary's root helper would "
            "refuse it; install the environment as root, writable by root alone (docs/security.md)"
        )


def root_helper_file() -> RenderedFile:
    """The root helper, installed root-owned outside the prefix (ROOT_HELPER_PATH): the unit runs it first."""
    source = Path(root_helper.__file__).read_text(encoding="utf-8")
    return RenderedFile(path=ROOT_HELPER_FILE, content=source, shared=True)  # every profile's set holds it


def monitoring_files() -> list[RenderedFile]:
    """The canary's alert rules for a local Prometheus and its Grafana dashboard (docs/alerts.md): the same
    for every profile (they match every canary scraped), so of no one profile's set, as the chart's copy."""
    from deploykit.render import alerts, dashboard

    return [
        RenderedFile(path=alerts.RULES_FILE, content=alerts.rules_yaml(), shared=True),
        RenderedFile(path=dashboard.DASHBOARD_FILE, content=dashboard.dashboard_json(), shared=True),
    ]


def release_check(plan: Plan, bin_dir: Path) -> str | None:
    """ExecStartPre=: the prefix's Python refuses to start vLLM when its installed vLLM is another release
    than the plan's (deploykit.render.vllm_release); None when the plan names no vLLM version."""
    from deploykit.render.vllm_release import MODULE

    if not plan.vllm_version:
        return None
    return command_line([str(bin_dir / "python"), "-P", "-m", MODULE, "--planned", plan.vllm_version])


def worker_unit_name(unit: str, node_rank: int) -> str:
    """`deploykit-P-worker-R`: the unit node rank R of a multi-node group runs on its host."""
    return f"{unit}-worker-{node_rank}"


def group_context(group: GroupLaunch | None, unit: str) -> dict[str, object] | None:
    """What the leader's and the workers' templates say about the group; None on one node."""
    if group is None:
        return None
    return {
        "nodes": group.nodes,
        "leader_address": group.leader_address,
        "rendezvous": group.rendezvous,
        "worker_units": [f"{worker_unit_name(unit, w.node_rank)}.service" for w in group.workers],
    }


def worker_units(
    group: GroupLaunch | None, context: Mapping[str, object], loaded: LoadedProfile, bin_dir: Path
) -> list[RenderedFile]:
    """One unit per worker node: the server unit's user, environment, devices and sandbox (one included
    template text), the worker's argv, no health wait (it serves no API)."""
    if group is None:
        return []
    template = jinja_environment().get_template("systemd/worker.service.j2")
    profile, files = loaded.profile, []
    for worker in group.workers:
        name = worker_unit_name(str(context["unit"]), worker.node_rank)
        description = (
            f"vLLM worker, node {worker.node_rank} of {group.nodes}, serving {profile.served_name} "
            f"(deploykit profile {profile.name})"
        )
        worker_context = {
            "unit": name,
            "node_rank": worker.node_rank,
            "description": escape.systemd_text(description, "model.served_name"),
            "exec_start": command_line([str(bin_dir / "vllm"), *worker.argv[1:]]),
        }
        content = template.render({**context, "worker": worker_context})
        files.append(RenderedFile(path=f"{name}.service", content=content))
    return files


def gate_files(
    context: Mapping[str, object], plan: Plan, loaded: LoadedProfile, bin_dir: Path, url: str
) -> list[RenderedFile]:
    """The upgrade gate (docs/deploy.md, The upgrade gate in a cluster and on a host): a oneshot unit the
    operator starts before switching the prefix, `deploykit gate` judging a candidate server (its URL from
    an environment file) against the running server, as the smoke companion's user and in its sandbox; an
    example of that file; and the facts the set was rendered from, for `--facts`."""
    from deploykit.render import gate

    name = loaded.profile.name
    unit = f"{context['unit']}-gate"
    facts_file = f"{ENV_DIR}/{name}.facts.json"
    report_file = f"{context['state_dir']}/{gate.REPORT_FILE}"
    argv = [str(bin_dir / "deploykit"), "gate", "--profile", f"{ENV_DIR}/{name}.yaml"]
    argv += ["--url", Expanded(gate.unit_variable(gate.CANDIDATE_VARIABLE)), "--baseline-url", url]
    argv += ["--facts", facts_file, "--format", "json", "--report-file", report_file]
    if "VLLM_API_KEY" in plan.secret_env:
        argv += ["--api-key-env", "VLLM_API_KEY"]  # one key for both servers, from the secrets file
    gate_context = {
        "unit": unit,
        "exec": command_line(argv),
        "timeout_s": gate.GATE_TIMEOUT_S,
        "candidate_file": f"{ENV_DIR}/{name}-gate.env",
        "candidate_example": f"{name}-gate.env.example",
        "candidate_variable": gate.CANDIDATE_VARIABLE,
        "baseline_url": url,
        "facts_file": facts_file,
        "facts_example": f"{name}.facts.json",
        "report_file": report_file,
    }
    jinja = jinja_environment()
    full = {**context, "gate": gate_context}
    return [
        RenderedFile(
            path=f"{unit}.service", content=jinja.get_template("systemd/gate.service.j2").render(full)
        ),
        RenderedFile(
            path=str(gate_context["candidate_example"]),
            content=jinja.get_template("systemd/gate.env.j2").render(full),
        ),
        RenderedFile(path=str(gate_context["facts_example"]), content=gate.facts_json(plan)),
    ]


def render_systemd(plan: Plan, loaded: LoadedProfile, options: SystemdOptions) -> RenderResult:
    from deploykit import __version__

    profile = loaded.profile
    if plan.argv[:2] != ["vllm", "serve"]:
        raise RenderError(f"the plan's argv does not start with `vllm serve`: {plan.argv[:2]}")
    group = group_launch(plan, loaded)  # None on one node
    check_prefix_sees_plugin(options.prefix)
    check_prefix_visible(options.prefix)
    check_prefix_trusted(options.prefix)
    unit = unit_name(loaded)
    smoke_unit = f"{unit}-smoke"
    state_dir_name = unit
    state_dir = f"/var/lib/{state_dir_name}"
    bin_dir = options.prefix / "bin"
    count = gpu_count(plan, loaded)
    gpus = unit_gpus(options.gpus, count, len(plan.facts.gpus))
    mig = any(gpu.mig_mode == "enabled" for gpu in plan.facts.gpus)
    cache_dir = profile.deploy.cache_dir.rstrip("/")
    if not cache_dir.startswith("/"):
        raise RenderError(f"deploy.cache_dir must be an absolute path, got {profile.deploy.cache_dir!r}")
    cache_path = escape.systemd_path(cache_dir, "deploy.cache_dir")
    cache_directory = cache_dir.removeprefix("/var/cache/") if cache_dir.startswith("/var/cache/") else ""
    if cache_directory:
        cache_directory = escape.systemd_path(cache_directory, "deploy.cache_dir", absolute=False)
    env_file = f"{ENV_DIR}/{profile.name}.env"
    profile_file = f"{ENV_DIR}/{profile.name}.yaml"
    url = smoke_url(loaded)
    secrets = secret_lines(plan)
    environment = service_environment(plan, loaded, state_dir, gpus)
    wait_health = [
        str(bin_dir / "python"),
        "-m",
        "deploykit.render.wait_health",
        f"{url}/health",
        "--timeout-s",
        str(profile.deploy.startup_timeout_s),
    ]
    smoke_argv = [str(bin_dir / "deploykit"), "smoke", "--url", url, "--profile", profile_file]
    # The plan's fixes must be active in vLLM's engine (GET /deploykit/status), or the smoke fails.
    smoke_argv += ["--expect-fixes", ",".join(plan.enabled_fixes) or "none"]
    if "VLLM_API_KEY" in plan.secret_env:
        smoke_argv += ["--api-key-env", "VLLM_API_KEY"]  # the server's key, from the same secrets file
    smoke_timeout = int(profile.smoke.timeout_s) * 6 + START_TIMEOUT_MARGIN_S
    canary_unit = f"{unit}-canary"
    canary_argv = [str(bin_dir / "deploykit"), "canary", "--url", url, "--profile", profile_file]
    canary = canary_settings(loaded)
    canary_argv += [*canary_args(canary, *UNIT_SETTINGS), "--exit-on-corruption"]
    # The hang advisories the plan matched: a `hung` verdict names them.
    hangs = hang_ids(plan.advisories)
    canary_argv += [word for hang in hangs for word in ("--known-hang", hang)]
    # Its own trouble (a key the server refuses, a name it does not serve) is a `misconfigured` verdict and a
    # journal line, never an exit (exit 3 restarts the server; issue 34).
    canary_argv += ["--keep-running"]
    if "VLLM_API_KEY" in plan.secret_env:
        canary_argv += ["--api-key-env", "VLLM_API_KEY"]
    # Run as root in the state directory (which the service user writes): `-I` keeps that directory and every
    # PYTHON* variable off sys.path, `-S` keeps the prefix's site-packages off it until the root helper (a
    # root-owned file outside the prefix) has found the prefix root's alone; the ledger is root's own
    # (on_corruption.LEDGER_DIR).
    on_corruption = [str(bin_dir / "python"), "-I", "-S", ROOT_HELPER_PATH]
    on_corruption += ["--restart", f"{unit}.service"]
    for status in SERVER_RESTART_EXIT_STATUSES:
        on_corruption += ["--exit-status", str(status)]
    on_corruption += ["--ledger-dir", LEDGER_DIR, "--state-dir", state_dir]
    on_corruption += ["--max-restarts", str(CORRUPTION_MAX_RESTARTS), "--window-s", str(CORRUPTION_WINDOW_S)]
    on_corruption += ["--profile", profile.name]
    server_argv = group.leader.argv if group else plan.argv
    node = f", node 0 of {group.nodes}" if group else ""
    description = f"vLLM serving {profile.served_name}{node} (deploykit profile {profile.name})"
    context = {
        "deploykit_version": __version__,
        "profile_name": profile.name,
        "profile_id": loaded.id,
        "description": escape.systemd_text(description, "model.served_name"),
        "unit": unit,
        "smoke_unit": smoke_unit,
        "user": escape.systemd_user(profile.deploy.user),
        "state_dir": state_dir,
        "state_dir_name": state_dir_name,
        "cache_dir": cache_path,
        "cache_directory": cache_directory,
        "exec_start": command_line([str(bin_dir / "vllm"), *server_argv[1:]]),
        "wait_health": command_line(wait_health),
        "release_check": release_check(plan, bin_dir),
        "smoke_exec": command_line(smoke_argv),
        "start_timeout_s": profile.deploy.startup_timeout_s + START_TIMEOUT_MARGIN_S,
        "smoke_timeout_s": smoke_timeout,
        # A plan that reads secrets must not start without them: no `-` (optional) prefix then.
        "env_file": env_file,
        "env_file_line": env_file if plan.secret_env else f"-{env_file}",
        "environment": [escape.systemd_environment(k, v) for k, v in environment.items()],
        "device_allow": device_nodes(gpus, mig),
        "secrets": secrets,
        "smoke_ip_allow": smoke_ip_allow(loaded),
        "canary_unit": canary_unit,
        "canary_exec": command_line(canary_argv),
        "on_corruption_exec": command_line(on_corruption),
        "canary": {name: shown(getattr(canary, name)) for name in UNIT_SETTINGS},
        "restart_exit_statuses": " ".join(str(status) for status in SERVER_RESTART_EXIT_STATUSES),
        "ledger": f"{LEDGER_DIR}/{unit}.service",
        # Known-bad combinations that apply (deploykit advisories); applied ones are in the argv/env below.
        "advisories": [
            f"{a.id} ({', '.join(r.split(' ', 1)[0] for r in a.references)}): {a.outcome}"
            + (f": {a.change}" if a.change else "")
            for a in plan.advisories
        ],
        "corruption_max_restarts": CORRUPTION_MAX_RESTARTS,
        "corruption_window_s": CORRUPTION_WINDOW_S,
        "group": group_context(group, unit),
    }
    jinja = jinja_environment()
    files = [
        RenderedFile(
            path=f"{unit}.service", content=jinja.get_template("systemd/server.service.j2").render(context)
        ),
        RenderedFile(
            path=f"{smoke_unit}.service",
            content=jinja.get_template("systemd/smoke.service.j2").render(context),
        ),
        RenderedFile(
            path=f"{canary_unit}.service",
            content=jinja.get_template("systemd/canary.service.j2").render(context),
        ),
        RenderedFile(
            path=f"{profile.name}.env.example",
            content=jinja.get_template("systemd/secrets.env.j2").render(context),
            mode=0o600,
            keep=True,  # once filled in, it holds the secrets: never overwritten
        ),
        RenderedFile(
            path=f"{unit}.sysusers.conf",
            content=jinja.get_template("systemd/sysusers.conf.j2").render(context),
        ),
        RenderedFile(path=f"{profile.name}.yaml", content=loaded.path.read_text()),
        root_helper_file(),
        *monitoring_files(),
    ]
    files += worker_units(group, context, loaded, bin_dir)
    files += gate_files(context, plan, loaded, bin_dir, url)
    warnings = list(plan.warnings) + (group.warnings if group else [])
    if plan.platform == "cuda" and not plan.facts.gpus:
        warnings.append(f"no GPU facts: the unit allows GPUs {','.join(map(str, gpus))} by index")
    return RenderResult(files=files, warnings=warnings, gpus=gpus)
