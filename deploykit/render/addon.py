"""deploykit as an add-on: manifests another chart rendered in, the same manifests out with deploykit added to
the vLLM containers they run (docs/addon.md). Helm's post-renderer, a pipe after `helm template` or
`kustomize build`, an Argo CD plugin: each hands this a YAML stream.

What is added is what `render helm` puts in deploykit's own pod, for the same plan: the plugin wheel in an
immutable ConfigMap named by its digest (plugin_wheel), on PYTHONPATH; the plan's fix environment; the canary
beside vLLM (its keeper as first process) with its profile, scratch, verdict and ledger volumes; the verdict
probes (pod_probe) as vLLM's readiness and liveness, after a startup probe. The values are render.helm's
(canary_values, probes, kubernetes_literal, PLUGIN_PATH); the shapes restate templates/helm/chart/templates
(`deploykit.canaryContainer`, `deploykit.verdictProbe`, the plugin's volume and mount), and
tests/render/test_addon_chart.py holds the two equal: deploykit's chart with its deploykit parts taken out,
through this, gives deploykit's chart's pods again.

vLLM containers are found by what they run: `vllm serve` (any path to `vllm`), `python -m
vllm.entrypoints.openai.api_server`, or an image named for vLLM with arguments and no command (its entrypoint
serves); in Deployments, StatefulSets, LeaderWorkerSets (the leader serves: canary and probes there; every
rank gets the plugin and the fixes), KServe (Cluster)ServingRuntimes and InferenceServices' own predictor
containers. Where the plan's decisions depend on the argv (the model, the parallel sizes, the dtype, LoRA, the
served name, the flags of its fixes and applied workarounds, its variables), the container must run what the
plan says: otherwise one line names the object, the container and the flag, and nothing is written. Applied
twice, the second pass changes nothing. Nothing here imports torch or vLLM; `apply_addon` is pure.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, Literal

import yaml
from pydantic import BaseModel, ConfigDict

from deploykit import argv as argv_reader
from deploykit.errors import RenderError
from deploykit.plan.layout import DATA, PIPELINE, TENSOR
from deploykit.render.common import RenderedFile, RenderResult, plain_env
from deploykit.render.helm import (
    DEFAULT_UID,
    PLUGIN_PATH,
    canary_values,
    kubernetes_literal,
    probes,
)
from deploykit.render.plugin_wheel import PluginWheel

if TYPE_CHECKING:
    from deploykit.plan import Plan
    from deploykit.profile.schema import FixMode, LoadedProfile

PluginSource = Literal["configmap", "image"]
Role = Literal["server", "leader", "worker"]

# The names deploykit's own pod uses (templates/helm/chart/templates/_pod.tpl, _helpers.tpl): the same here,
# so deploykit's chart passes through unchanged and a second pass finds the first pass's work.
CANARY = "canary"
PLUGIN_VOLUME = "deploykit-plugin"
PROFILE_VOLUME = "canary-profile"
SCRATCH_VOLUME = "canary-scratch"
VERDICT_VOLUME = "canary-verdict"
LEDGER_VOLUME = "canary-ledger"
KEY_VOLUME = "canary-key"
VERDICT_DIR = "/run/deploykit"
VERDICT_FILE = f"{VERDICT_DIR}/verdict.json"
LEDGER_DIR = "/run/deploykit-ledger"
PROFILE_DIR = "/etc/deploykit"
KEY_DIR = "/etc/deploykit-key"
SCRATCH_DIR = "/scratch"
KEEPER = ["python3", "-m", "deploykit.render.canary_keeper"]
PLUGIN_ANNOTATION = "deploykit.io/plugin"
PROFILE_ID_ANNOTATION = "deploykit.io/profile-id"
# vLLM's own defaults for what the checks read when an argv leaves it out.
VLLM_DEFAULT_PORT = 8000
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Flags whose value the plan's decisions (its fixes, its advisories) were made for, with vLLM's default for
# each: an argv with another value runs a deployment the plan did not decide for.
DECISIVE: dict[str, str] = {"--dtype": "auto", "--quantization": "none", "--kv-cache-dtype": "auto"}
DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"}
SIZES = (TENSOR, PIPELINE, DATA)
KSERVE_RUNTIMES = ("ServingRuntime", "ClusterServingRuntime")
ISVC = "InferenceService"
KSERVE_NAME = "{{.Name}}"  # KServe fills it with the InferenceService's name (ReplacePlaceholders)
# Helm's longest release name: `<name>-plugin-<12 hex>` and `<name>-profile` are then DNS subdomains, as a
# ConfigMap's name must be (deploykit's chart names them so too).
MAX_NAME = 53
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh"})
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DOCUMENT_START = re.compile(r"^---(?:[ \t].*)?$")
_VERSION_TAG = re.compile(r"^v?\d+\.\d+")


class AddonOptions(BaseModel):
    """How the add-on is applied (the command line's options)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    """Names the ConfigMaps (`<name>-plugin-<digest>`, `<name>-profile`): the release's name. None: the
    first vLLM pod's `app.kubernetes.io/instance` label, else its object's name."""
    plugin_source: PluginSource = "configmap"
    """configmap: the wheel in a ConfigMap, on PYTHONPATH (the chart's `bundled`); image: the vLLM image has
    deploykit installed already (docker/Dockerfile.vllm), nothing to mount."""


class LaunchSetting(BaseModel):
    """One setting the plan's argv carries for a fix or an applied workaround: the words the plan writes, the
    setting they make (`--flag`, or `--option.dotted.key`), its value, and whose it is."""

    model_config = ConfigDict(extra="forbid")

    words: list[str]
    key: str
    value: str | bool | None
    why: str


class AddonParts(BaseModel):
    """What one plan asks the add-on to check and add (`addon_parts`): everything but the stream."""

    model_config = ConfigDict(extra="forbid")

    profile_name: str
    profile_id: str
    profile_yaml: str
    served_name: str
    api_key_env: str | None
    model: str
    sizes: dict[str, int]
    nodes: int
    decisive: dict[str, str]
    lora: bool
    launch: list[LaunchSetting]
    env: dict[str, str]
    """The plan's variables as a container gets them: secrets and PYTHONPATH aside, every `$` doubled."""
    python_path: str
    """The profile's own PYTHONPATH, after the plugin's on the vLLM container's ("" for none)."""
    vllm_version: str | None
    wheel: PluginWheel | None
    canary: dict[str, Any]
    startup_probe: dict[str, Any]
    object_annotations: dict[str, str]


class AddonResult(BaseModel):
    """The stream with deploykit added, and what the person running it should know."""

    text: str
    warnings: list[str]


# --- what the plan says -----------------------------------------------------------------------------------


def _setting_key(word: str) -> str:
    """The setting a word makes: `--compilation-config.a.b=x` keeps its dotted key, `--no-x` is `--x`."""
    written = word.split("=", 1)[0]
    name = argv_reader.flag_name(word) or written
    if "." in written:
        return name + "." + written.split(".", 1)[1]
    return "--" + name[5:] if name.startswith("--no-") else name


def setting_value(words: list[str], key: str) -> str | bool | None:
    """What an argv sets `key` (as `_setting_key` names it) to: a dotted JSON key's value, a flag's value, a
    switch's True or False; None when the argv does not set it."""
    flag, dot, path = key.partition(".")
    if dot:
        found: Any = argv_reader.json_option(words, flag)
        for part in path.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        return found if found is None or isinstance(found, str) else json.dumps(found)
    value = argv_reader.flag_value(words, flag)
    return value if value is not None else argv_reader.flag_switch(words, flag)


def _groups(args: list[str]) -> list[list[str]]:
    """Arguments as settings: `--flag value`, `--flag=value`, or a switch alone."""
    groups: list[list[str]] = []
    index = 0
    while index < len(args):
        takes = "=" not in args[index] and index + 1 < len(args)
        takes = takes and argv_reader.flag_name(args[index + 1]) is None
        groups.append(args[index : index + (2 if takes else 1)])
        index += len(groups[-1])
    return groups


def launch_settings(plan: Plan) -> list[LaunchSetting]:
    """The settings the plan's argv carries for its enabled fixes (their launch flags) and the workarounds it
    applied (each advisory's action), each read back from the plan's argv."""
    from deploykit.advisories.catalog import advisories
    from deploykit.plan import owned_flags

    settings: list[LaunchSetting] = []
    enabled = set(plan.enabled_fixes)
    for flag, owner in owned_flags().items():
        fix = owner.removeprefix("fixes.")
        value = setting_value(plan.argv, flag)
        if owner.startswith("fixes.") and fix in enabled and value is not None:
            words = [flag] if isinstance(value, bool) else [flag, value]
            settings.append(LaunchSetting(words=words, key=flag, value=value, why=f"fix {fix}"))
    applied = {outcome.id for outcome in plan.advisories if outcome.outcome == "applied"}
    for advisory in advisories():
        if advisory.id in applied:
            for group in _groups(list(advisory.action.args)):
                key = _setting_key(group[0])
                value = setting_value(plan.argv, key)
                settings.append(
                    LaunchSetting(words=group, key=key, value=value, why=f"workaround {advisory.id}")
                )
    return settings


def _normal(flag: str, value: str) -> str:
    """A decisive flag's value in one spelling (`--dtype half` is float16)."""
    if flag != "--dtype":
        return value
    return DTYPE_ALIASES.get(value.lower(), value.lower())


def addon_parts(plan: Plan, loaded: LoadedProfile, wheel: PluginWheel | None) -> AddonParts:
    """What the add-on checks and adds for this plan (the values `render helm` writes), read once."""
    from deploykit.canary.known_hangs import hang_ids

    profile = loaded.profile
    layout = plan.layout
    env = {key: kubernetes_literal(value) for key, value in plain_env(plan).items()}
    python_path = env.pop("PYTHONPATH", "")
    decisive = {
        flag: _normal(flag, argv_reader.flag_value(plan.argv, flag) or default)
        for flag, default in DECISIVE.items()
    }
    annotations = {
        "deploykit.io/profile": profile.name,
        "deploykit.io/profile-id": loaded.id,
        "deploykit.io/vllm-version": plan.vllm_version or "unknown",
    }
    if plan.advisories:
        annotations["deploykit.io/advisories"] = ",".join(f"{a.id}={a.outcome}" for a in plan.advisories)
    return AddonParts(
        profile_name=profile.name,
        profile_id=loaded.id,
        profile_yaml=loaded.path.read_text(),
        served_name=profile.served_name,
        api_key_env=profile.serve.api_key_env,
        model=plan.model_path,
        sizes={TENSOR: layout.tensor, PIPELINE: layout.pipeline, DATA: layout.data_parallel},
        nodes=layout.nodes,
        decisive=decisive,
        lora=bool(argv_reader.flag_switch(plan.argv, "--enable-lora")),
        launch=launch_settings(plan),
        env=env,
        python_path=python_path,
        vllm_version=plan.vllm_version,
        wheel=wheel,
        canary=canary_values(hang_ids(plan.advisories)),
        startup_probe=probes(profile.deploy.startup_timeout_s)["startup"],
        object_annotations=annotations,
    )


# --- what a container runs --------------------------------------------------------------------------------


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def is_vllm_image(image: str) -> bool:
    """An image named for vLLM: vllm/vllm-openai, lmcache/vllm-openai, kserve/vllmserver, quay.io/x/vllm."""
    repository = image.split("@", 1)[0]
    name, sep, tag = repository.rpartition(":")
    return "vllm" in (name if sep and "/" not in tag else repository).lower()


def expand(word: str, env: dict[str, str]) -> str:
    """A command word as the container gets it: Kubernetes puts a variable's value for `$(NAME)` (when the
    container's env sets it literally before; otherwise it stays as written) and `$` for `$$`."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        return "$" if name is None else env.get(name, match.group(0))

    return _REFERENCE.sub(value, word)


def literal_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's variables with a literal value (the last of a name wins, as in Kubernetes)."""
    found: dict[str, str] = {}
    for entry in _list(container.get("env")):
        name = _dict(entry).get("name")
        if not isinstance(name, str):
            continue
        if "valueFrom" in entry:
            found.pop(name, None)
        else:
            found[name] = expand(str(entry.get("value") or ""), found)
    return found


def vllm_arguments(container: dict[str, Any], where: str) -> list[str] | None:
    """The arguments vLLM's server parses (after `vllm serve` or the api_server module), as the container gets
    them; None for a container that runs no vLLM server. One that starts vLLM from a shell string cannot be
    read, so it is refused."""
    command = [str(word) for word in _list(container.get("command"))]
    args = [str(word) for word in _list(container.get("args"))]
    env = literal_env(container)
    words = [expand(word, env) for word in [*command, *args]]
    if not command:  # the image's entrypoint serves: a vLLM image, given a model
        image = str(container.get("image") or "")
        return words if is_vllm_image(image) and model_of(words) is not None else None
    program = PurePosixPath(words[0]).name
    if program == "vllm" and words[1:2] == ["serve"]:
        return words[2:]
    if _PYTHON.match(program) and words[1:3] == ["-m", API_SERVER_MODULE]:
        return words[3:]
    if program in _SHELLS and any("vllm serve" in w or API_SERVER_MODULE in w for w in words[1:]):
        raise RenderError(
            f"{where} starts vLLM from a {program} command line, whose argv cannot be checked against the "
            "plan: give it as a list (command: [vllm, serve, MODEL, ...])"
        )
    return None


def model_of(words: list[str]) -> str | None:
    """`vllm serve MODEL` or `--model MODEL`."""
    if words and argv_reader.flag_name(words[0]) is None:
        return words[0]
    return argv_reader.flag_value(words, "--model")


def served_names(words: list[str]) -> list[str]:
    """The names of `--served-model-name a [b ...]` (vLLM takes several; the last setting wins)."""
    names: list[str] = []
    for index, word in enumerate(words):
        if argv_reader.owned_flag(word, ("--served-model-name",)) is None:
            continue
        if "=" in word:
            names = [word.split("=", 1)[1]]
            continue
        names = []
        for later in words[index + 1 :]:
            if argv_reader.flag_name(later) is not None:
                break
            names.append(later)
    return names


def port_of(words: list[str], where: str) -> int:
    """The port vLLM listens on: the canary and the probes ask it there."""
    text = argv_reader.flag_value(words, "--port")
    if text is None:
        return VLLM_DEFAULT_PORT
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise RenderError(
            f"{where}: --port {text[:80]!r} is no port number; the canary and the probes need it"
        )
    return int(text)


# --- the checks -------------------------------------------------------------------------------------------


def check_argv(words: list[str], parts: AddonParts, where: str, served_as: str | None) -> None:
    """Refuse, in one line, an argv that runs what the plan did not decide for. `served_as`: what KServe's
    `{{.Name}}` stands for (None: unknown, and a name holding it is not checked)."""
    plan_runs = f"the plan (profile {parts.profile_name}) runs"
    model = model_of(words)
    if model is None:
        raise RenderError(f"{where} names no model (vLLM would serve its default); {plan_runs} {parts.model}")
    if model.rstrip("/") != parts.model.rstrip("/"):
        raise RenderError(
            f"{where} serves {model}; {plan_runs} {parts.model}: use the profile made for that model"
        )
    for flag in SIZES:
        given = argv_reader.flag_value(words, flag) or "1"
        if not given.isdigit() or int(given) != parts.sizes[flag]:
            raise RenderError(
                f"{where}: {flag} {given}; {plan_runs} {flag} {parts.sizes[flag]}, and its fixes were "
                "decided for that layout"
            )
    launched = {setting.key for setting in parts.launch}
    for flag, planned in parts.decisive.items():
        given = _normal(flag, argv_reader.flag_value(words, flag) or DECISIVE[flag])
        if flag not in launched and given != planned:
            raise RenderError(
                f"{where}: {flag} {given}; {plan_runs} {flag} {planned}, and its fixes were decided so"
            )
    if bool(argv_reader.flag_switch(words, "--enable-lora")) != parts.lora:
        has, wants = ("no --enable-lora", "with") if parts.lora else ("--enable-lora", "without")
        raise RenderError(f"{where}: {has}; {plan_runs} {wants} LoRA, and its fixes were decided so")
    if any(argv_reader.owned_flag(word, ("--api-key",)) for word in words):
        raise RenderError(
            f"{where} passes --api-key in its argv: give vLLM VLLM_API_KEY from a Secret instead (the canary "
            "reads the key from that Secret)"
        )
    for setting in parts.launch:
        value = setting_value(words, setting.key)
        if value is not None and value != setting.value:
            shown = value if isinstance(value, str) else ("on" if value else "off")
            raise RenderError(
                f"{where}: {setting.key} {shown} conflicts with {setting.why}, which the plan runs as "
                f"{' '.join(setting.words)}"
            )
    names = served_names(words) or [model]
    if served_as is not None:
        names = [name.replace(KSERVE_NAME, served_as) for name in names]
    elif any("{{" in name for name in names):
        return
    if parts.served_name not in names:
        raise RenderError(
            f"{where} serves the model as {' '.join(names)}, the profile {parts.profile_name} as "
            f"{parts.served_name}: the canary asks for the profile's name"
        )


def check_env(container: dict[str, Any], parts: AddonParts, where: str) -> None:
    """Refuse a variable the container sets otherwise than the plan, and a VLLM_PLUGINS without deploykit."""
    entries = {str(e.get("name")): e for e in _list(container.get("env")) if isinstance(e, dict)}
    for name, value in parts.env.items():
        entry = entries.get(name)
        if entry is not None and ("valueFrom" in entry or str(entry.get("value") or "") != value):
            shown = "set from a reference (valueFrom)" if "valueFrom" in entry else f"{entry.get('value')!r}"
            raise RenderError(f"{where}: env {name} is {shown}; the plan sets {name}={value!r}")
    plugins = entries.get("VLLM_PLUGINS")
    if plugins is not None and "VLLM_PLUGINS" not in parts.env:
        listed = [name.strip() for name in str(plugins.get("value") or "").split(",")]
        if "valueFrom" in plugins or "deploykit" not in listed:
            raise RenderError(
                f"{where}: env VLLM_PLUGINS leaves deploykit out, so vLLM would load no fix: add "
                "deploykit to it"
            )


def check_image(image: str, parts: AddonParts, where: str) -> str | None:
    """vLLM's own image (`*/vllm-openai:vX.Y.Z`) says its release in the tag: another than the plan's is
    refused. Another image: a warning that its vLLM is not read."""
    from deploykit.vllm_compat import vllm_image_tag

    reference = image.split("@", 1)[0]
    repository, sep, tag = reference.rpartition(":")
    if not sep or "/" in tag:
        repository, tag = reference, ""
    if parts.vllm_version is None:
        return f"{where}: the plan names no vLLM version, so image {image} is unchecked"
    try:
        wanted = vllm_image_tag(parts.vllm_version)
    except ValueError:
        return f"{where}: the plan's vLLM {parts.vllm_version} is no release, so image {image} is unchecked"
    if repository.rsplit("/", 1)[-1] != "vllm-openai" or not _VERSION_TAG.match(tag):
        return (
            f"{where}: image {image} must run vLLM {parts.vllm_version}, the plan's (its release is not read)"
        )
    if tag.lstrip("v") != wanted.lstrip("v"):
        raise RenderError(
            f"{where} runs {image}; the plan's fixes were decided for vLLM {parts.vllm_version} "
            f"({repository}:{wanted})"
        )
    return None


# --- what is added ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SecretKey:
    """Where vLLM's VLLM_API_KEY comes from: the canary reads the same Secret's key."""

    secret: str
    key: str


def _text(value: Any) -> str:
    """A value as Helm's `quote` writes it from values.yaml (60 → "60", 0.5 → "0.5")."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def plugin_configmap_name(name: str, wheel: PluginWheel) -> str:
    """`deploykit.pluginConfigMap`: one name always holds the same bytes."""
    return f"{name}-plugin-{wheel.sha256[:12]}"


def plugin_path(parts: AddonParts, source: PluginSource) -> str:
    """The wheel on PYTHONPATH (Python imports from a zip): `deploykit.pythonPath`; "" for an image source."""
    return f"{PLUGIN_PATH}/{parts.wheel.filename}" if source == "configmap" and parts.wheel else ""


def plugin_mount() -> dict[str, Any]:
    return {"name": PLUGIN_VOLUME, "mountPath": PLUGIN_PATH, "readOnly": True}


def verdict_probe(parts: AddonParts, mode: Literal["ready", "live"], port: int) -> dict[str, Any]:
    """vLLM's readiness or liveness: its /health and the canary's fresh verdict (`deploykit.verdictProbe`)."""
    command = [
        "python3", "-m", "deploykit.render.pod_probe", mode,
        "--health-url", f"http://127.0.0.1:{port}/health",
        "--verdict-file", VERDICT_FILE,
        "--timeout", "5",
        "--max-verdict-age", _text(parts.canary["verdictMaxAgeSeconds"]),
        "--ledger-dir", LEDGER_DIR,
    ]  # fmt: skip
    timing = parts.canary["readiness" if mode == "ready" else "liveness"]
    return {"exec": {"command": command}, **timing}


def canary_container(
    parts: AddonParts, *, image: str, port: int, key: SecretKey | None, source: PluginSource, run_as: bool
) -> dict[str, Any]:
    """The canary beside vLLM, under its keeper (`deploykit.canaryContainer`), in vLLM's image. `run_as`: the
    pod names no user, so the canary gets the chart's (a non-root container whose image runs as root would
    never start, and a pod with a container not running is never Ready)."""
    canary = parts.canary
    command = [
        *KEEPER, "--verdict-file", VERDICT_FILE, "--max-verdict-age", _text(canary["verdictMaxAgeSeconds"]),
        "--", "python3", "-m", "deploykit", "canary",
        "--url", f"http://127.0.0.1:{port}",
        "--profile", f"{PROFILE_DIR}/profile.yaml",
        "--listen", f"0.0.0.0:{canary['port']}",
        "--every", _text(canary["every"]),
        "--miss-limit", _text(canary["missLimit"]),
        "--verdict-file", VERDICT_FILE,
        "--no-store", "--keep-running",
    ]  # fmt: skip
    for hang in canary["knownHangs"]:
        command += ["--known-hang", hang]
    if key is not None:
        command += ["--api-key-file", f"{KEY_DIR}/api-key"]
    env: list[dict[str, Any]] = []
    if plugin_path(parts, source):
        env.append({"name": "PYTHONPATH", "value": plugin_path(parts, source)})
    env += [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},  # no GPU for the canary
        {"name": "HOME", "value": SCRATCH_DIR},
        {"name": "XDG_DATA_HOME", "value": SCRATCH_DIR},
    ]
    if key is not None and parts.api_key_env:
        reference = {"secretKeyRef": {"name": key.secret, "key": key.key}}
        env.append({"name": parts.api_key_env, "valueFrom": reference})
    security = copy.deepcopy(canary["securityContext"])
    if run_as:
        security.update(runAsUser=DEFAULT_UID, runAsGroup=DEFAULT_UID)
    mounts: list[dict[str, Any]] = [
        {"name": PROFILE_VOLUME, "mountPath": PROFILE_DIR, "readOnly": True},
        {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_DIR},
        {"name": VERDICT_VOLUME, "mountPath": VERDICT_DIR},
    ]
    if key is not None:
        mounts.append({"name": KEY_VOLUME, "mountPath": KEY_DIR, "readOnly": True})
    if source == "configmap":
        mounts.append(plugin_mount())
    return {
        "name": CANARY,
        "image": canary["image"] or image,
        "imagePullPolicy": canary["pullPolicy"],
        "command": command,
        "ports": [{"name": "canary", "containerPort": canary["port"], "protocol": "TCP"}],
        "env": env,
        "resources": copy.deepcopy(canary["resources"]),
        "securityContext": security,
        "volumeMounts": mounts,
    }


def pod_volumes(
    parts: AddonParts, name: str, *, canary: bool, key: SecretKey | None, source: PluginSource
) -> list[dict[str, Any]]:
    """The plugin's volume (`deploykit.pluginVolume`) and, in a pod that serves, the canary's."""
    volumes: list[dict[str, Any]] = []
    if source == "configmap" and parts.wheel is not None:
        items = [{"key": parts.wheel.filename, "path": parts.wheel.filename}]
        volumes.append(
            {
                "name": PLUGIN_VOLUME,
                "configMap": {"name": plugin_configmap_name(name, parts.wheel), "items": items},
            }
        )
    if canary:
        volumes += [
            {"name": PROFILE_VOLUME, "configMap": {"name": f"{name}-profile"}},
            {"name": SCRATCH_VOLUME, "emptyDir": {}},
            {"name": VERDICT_VOLUME, "emptyDir": {}},
            {"name": LEDGER_VOLUME, "emptyDir": {}},
        ]
        if key is not None:
            items = [{"key": key.key, "path": "api-key"}]
            volumes.append({"name": KEY_VOLUME, "secret": {"secretName": key.secret, "items": items}})
    return volumes


def added_objects(
    parts: AddonParts, name: str, namespace: str | None, source: PluginSource
) -> list[dict[str, Any]]:
    """The plugin's ConfigMap (immutable, named by the wheel's digest, as `configmap-plugin.yaml`'s) and
    the canary's profile (`configmap-profile.yaml`)."""
    labels = {"app.kubernetes.io/name": "deploykit", "app.kubernetes.io/instance": name}
    place = {"namespace": namespace} if namespace else {}
    objects: list[dict[str, Any]] = []
    if source == "configmap" and parts.wheel is not None:
        wheel = parts.wheel
        annotations = {
            "deploykit.io/wheel-sha256": wheel.sha256,
            # Over the 256 KiB that client-side apply's last-applied annotation holds: applied server-side.
            "argocd.argoproj.io/sync-options": "ServerSideApply=true",
        }
        metadata = {
            "name": plugin_configmap_name(name, wheel),
            **place,
            "labels": labels,
            "annotations": annotations,
        }
        binary = {wheel.filename: base64.b64encode(wheel.data).decode()}
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": metadata,
                "immutable": True,
                "binaryData": binary,
            }
        )
    metadata = {"name": f"{name}-profile", **place, "labels": labels}
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": {"profile.yaml": parts.profile_yaml},
        }
    )
    return objects


# --- the pods in the stream -------------------------------------------------------------------------------


@dataclass
class PodSite:
    """One pod template the add-on reads: the object it is in, its pod spec, and where its pods' metadata is
    (a template's `metadata`; a KServe runtime's or predictor's spec itself holds `annotations`)."""

    doc: dict[str, Any]
    where: str
    spec: dict[str, Any]
    metadata_owner: dict[str, Any]
    metadata_key: str | None
    role: Role
    checks: list[tuple[str, list[str], str | None]] = field(default_factory=lambda: [("", [], None)])
    """KServe: (the InferenceService, the args KServe appends to this runtime's, its name for {{.Name}})."""

    @property
    def namespace(self) -> str | None:
        found = _dict(self.doc.get("metadata")).get("namespace")
        return found if isinstance(found, str) else None

    def pod_metadata(self) -> dict[str, Any]:
        """The pods' metadata map, made when missing (only ever called on a pod that is changed)."""
        if self.metadata_key is None:
            return self.metadata_owner
        if not isinstance(self.metadata_owner.get(self.metadata_key), dict):
            self.metadata_owner[self.metadata_key] = {}
        found: dict[str, Any] = self.metadata_owner[self.metadata_key]
        return found

    def labels(self) -> dict[str, Any]:
        owner = (
            self.metadata_owner
            if self.metadata_key is None
            else _dict(self.metadata_owner.get(self.metadata_key))
        )
        return _dict(owner.get("labels")) or _dict(_dict(self.doc.get("metadata")).get("labels"))


def _name(doc: dict[str, Any]) -> str:
    return str(_dict(doc.get("metadata")).get("name") or "(unnamed)")


def _serves_vllm(spec: dict[str, Any]) -> bool:
    for container in _list(spec.get("containers")):
        try:
            if isinstance(container, dict) and vllm_arguments(container, "") is not None:
                return True
        except RenderError:
            return True  # refused when the site itself is read
    return False


def pod_sites(docs: list[Any]) -> list[PodSite]:
    """Every pod template of the stream that runs vLLM, in stream order. A LeaderWorkerSet without a leader
    template runs its leader from the workers' (LWS API): that leader template is written out, a copy of the
    workers', so the canary goes to the leader only."""
    predictors: dict[str, list[tuple[str, list[str], str | None]]] = {}
    for doc in docs:
        if isinstance(doc, dict) and doc.get("kind") == ISVC:
            model = _dict(_dict(_dict(doc.get("spec")).get("predictor")).get("model"))
            if isinstance(model.get("runtime"), str):
                args = [str(arg) for arg in _list(model.get("args"))]
                predictors.setdefault(model["runtime"], []).append(
                    (f"InferenceService {_name(doc)}", args, _name(doc))
                )
    sites: list[PodSite] = []
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        kind, name, spec = doc.get("kind"), _name(doc), _dict(doc.get("spec"))
        if kind in ("Deployment", "StatefulSet") and isinstance(spec.get("template"), dict):
            template = spec["template"]
            sites.append(
                PodSite(doc, f"{kind} {name}", _dict(template.get("spec")), template, "metadata", "server")
            )
        elif kind == "LeaderWorkerSet":
            group = _dict(spec.get("leaderWorkerTemplate"))
            worker = group.get("workerTemplate")
            if not isinstance(worker, dict) or not _serves_vllm(_dict(worker.get("spec"))):
                continue
            if not isinstance(group.get("leaderTemplate"), dict):
                group["leaderTemplate"] = copy.deepcopy(worker)
            leader = group["leaderTemplate"]
            where = f"{kind} {name}"
            sites.append(
                PodSite(doc, f"{where} (leader)", _dict(leader.get("spec")), leader, "metadata", "leader")
            )
            sites.append(
                PodSite(doc, f"{where} (workers)", _dict(worker.get("spec")), worker, "metadata", "worker")
            )
        elif kind in KSERVE_RUNTIMES:
            site = PodSite(doc, f"{kind} {name}", spec, spec, None, "server")
            site.checks = predictors.get(name) or site.checks
            sites.append(site)
        elif kind == ISVC and _list(_dict(spec.get("predictor")).get("containers")):
            predictor = _dict(spec.get("predictor"))
            site = PodSite(doc, f"{kind} {name} (predictor)", predictor, predictor, None, "server")
            site.checks = [("", [], name)]
            sites.append(site)
    return [site for site in sites if _serves_vllm(site.spec)]


# --- the stream -------------------------------------------------------------------------------------------


def split_documents(text: str) -> list[str]:
    """The stream's documents as written, each from its `---` line (a line that is `---` alone, or followed by
    a blank, is a document marker wherever it is: never part of a scalar)."""
    chunks: list[list[str]] = [[]]
    for line in text.splitlines(keepends=True):
        if _DOCUMENT_START.match(line.rstrip("\r\n")) and any(s.strip() for s in chunks[-1]):
            chunks.append([])
        chunks[-1].append(line)
    return ["".join(chunk) for chunk in chunks]


class _Dumper(getattr(yaml, "CSafeDumper", yaml.SafeDumper)):  # type: ignore[misc]
    """libyaml's emitter where installed: the plugin's ConfigMap carries a ~1 MiB string, which PyYAML's own
    emitter writes a character at a time. Multi-line strings (the profile) as literal blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _represent_str)


def dump(doc: Any) -> str:
    """One document as YAML, its keys in their order (as render.helm's to_yaml writes values.yaml)."""
    text: str = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=110)
    return text


def parse_documents(chunks: list[str]) -> list[Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    docs = []
    for number, chunk in enumerate(chunks, start=1):
        try:
            docs.append(yaml.load(chunk, Loader=loader))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f", line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or type(exc).__name__
            raise RenderError(f"the input's document {number} is not YAML ({problem}{line})") from None
    return docs


def _written(chunk: str, doc: Any) -> str:
    """A changed document: a `---` line, its leading comments (helm's `# Source:`), the rest written anew."""
    comments = []
    for line in chunk.splitlines(keepends=True)[1 if chunk.startswith("---") else 0 :]:
        if line.strip() and not line.lstrip().startswith("#"):
            break
        comments.append(line)
    return "---\n" + "".join(comments) + dump(doc)


# --- applying it ------------------------------------------------------------------------------------------


def release_name(sites: list[PodSite], given: str | None) -> str:
    """What the ConfigMaps are named after: the option, else the first vLLM pod's app.kubernetes.io/instance
    label (Helm charts set it to the release's name), else its object's name."""
    name = given
    if name is None:
        first = sites[0]
        name = str(first.labels().get("app.kubernetes.io/instance") or _name(first.doc))
    if not _DNS_LABEL.match(name) or len(name) > MAX_NAME:
        raise RenderError(
            f"name {name[:80]!r}: the add-on's ConfigMaps are named after it, so it must be a DNS label of "
            f"at most {MAX_NAME} characters: give --name (the release's name)"
        )
    return name


def _secret_key(container: dict[str, Any], where: str) -> SecretKey | None:
    """The Secret key vLLM's VLLM_API_KEY comes from; None when it has none; refused when it is a literal."""
    for entry in reversed(_list(container.get("env"))):
        if isinstance(entry, dict) and entry.get("name") == "VLLM_API_KEY":
            ref = _dict(_dict(entry.get("valueFrom")).get("secretKeyRef"))
            if ref.get("name") and ref.get("key"):
                return SecretKey(secret=str(ref["name"]), key=str(ref["key"]))
            raise RenderError(
                f"{where}: env VLLM_API_KEY is not from a Secret (valueFrom.secretKeyRef): the canary reads "
                "the key from the Secret vLLM reads it from"
            )
    return None


def _upsert(items: list[Any], new: dict[str, Any]) -> None:
    """The item of the same name replaced where it is, else appended."""
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("name") == new["name"]:
            items[index] = new
            return
    items.append(new)


def _add_launch(container: dict[str, Any], words: list[str], parts: AddonParts) -> None:
    """The fixes' and the applied workarounds' settings the argv lacks, appended (to args when it has any)."""
    missing = [
        w for setting in parts.launch if setting_value(words, setting.key) is None for w in setting.words
    ]
    if missing:
        target = "args" if container.get("args") or not container.get("command") else "command"
        container[target] = [*_list(container.get(target)), *(kubernetes_literal(word) for word in missing)]


def _add_env(container: dict[str, Any], parts: AddonParts, source: PluginSource, where: str) -> None:
    """PYTHONPATH with the plugin first (`deploykit.pythonPathEnv`: never replaced by the container's own,
    which goes after it), then the plan's variables the container lacks."""
    env = container["env"] = _list(container.get("env"))
    existing = next((e for e in reversed(env) if isinstance(e, dict) and e.get("name") == "PYTHONPATH"), None)
    if existing is not None and "valueFrom" in existing:
        raise RenderError(f"{where}: env PYTHONPATH is set from a reference; the plugin must be on it")
    mine = plugin_path(parts, source)
    theirs = ":".join(p for p in str((existing or {}).get("value") or "").split(":") if p and p != mine)
    if parts.python_path and theirs and theirs != parts.python_path:
        raise RenderError(f"{where}: env PYTHONPATH is {theirs!r}; the profile's is {parts.python_path!r}")
    value = ":".join(p for p in (mine, parts.python_path or theirs) if p)
    if existing is not None and value:
        existing.clear()
        existing.update(name="PYTHONPATH", value=value)
    elif value:
        env.insert(0, {"name": "PYTHONPATH", "value": value})
    for name, literal in parts.env.items():
        if not any(isinstance(entry, dict) and entry.get("name") == name for entry in env):
            env.append({"name": name, "value": literal})


def _taken_ports(spec: dict[str, Any]) -> set[Any]:
    """The ports the pod's containers (a restartable init container's too) declare, the canary's aside."""
    return {
        port.get("containerPort")
        for container in [*_list(spec.get("containers")), *_list(spec.get("initContainers"))]
        if isinstance(container, dict) and container.get("name") != CANARY
        for port in _list(container.get("ports"))
        if isinstance(port, dict)
    }


@dataclass
class _Found:
    container: dict[str, Any]
    words: list[str]
    where: str


def _found(site: PodSite) -> list[_Found]:
    found = []
    for container in _list(site.spec.get("containers")):
        if isinstance(container, dict) and container.get("name") != CANARY:
            where = f"{site.where}, container {container.get('name')}"
            words = vllm_arguments(container, where)
            if words is not None:
                found.append(_Found(container, words, where))
    return found


def check_site(site: PodSite, parts: AddonParts) -> list[_Found]:
    """Every check of one pod template, before anything is changed; its vLLM containers."""
    found = _found(site)
    for item in found:
        for isvc, extra, served_as in site.checks:
            where = f"{item.where} (with {isvc})" if isvc else item.where
            check_argv([*item.words, *extra], parts, where, served_as)
        check_env(item.container, parts, item.where)
    expected = parts.nodes
    size = _dict(_dict(site.doc.get("spec")).get("leaderWorkerTemplate")).get("size", 1)
    pods = size if site.doc.get("kind") == "LeaderWorkerSet" else 1
    if pods != expected:
        raise RenderError(
            f"{site.where} runs a group of {pods} pod(s); the plan (profile {parts.profile_name}) spans "
            f"{expected} node(s) (deploy.nodes)"
        )
    return found


def apply_site(
    site: PodSite, found: list[_Found], parts: AddonParts, options: AddonOptions, name: str
) -> None:
    """Add deploykit to one checked pod template, in place."""
    source = options.plugin_source
    serving = [item for item in found if site.role != "worker" and "--headless" not in item.words]
    if len(serving) > 1:
        raise RenderError(
            f"{site.where} runs {len(serving)} vLLM servers in one pod; the add-on gives a pod one canary"
        )
    for item in found:
        _add_launch(item.container, item.words, parts)
        _add_env(item.container, parts, source, item.where)
        if source == "configmap":
            item.container["volumeMounts"] = _list(item.container.get("volumeMounts"))
            _upsert(item.container["volumeMounts"], plugin_mount())
    key = None
    if serving:
        server = serving[0]
        key = _secret_key(server.container, server.where)
        if parts.api_key_env and key is None:
            raise RenderError(
                f"{server.where} has no VLLM_API_KEY, but the profile {parts.profile_name} serves with a key "
                f"(serve.api_key_env {parts.api_key_env}): give vLLM VLLM_API_KEY from a Secret"
            )
        port = port_of(server.words, server.where)
        if parts.canary["port"] in _taken_ports(site.spec):
            raise RenderError(f"{site.where}: port {parts.canary['port']} is taken; the canary listens on it")
        containers = site.spec["containers"]
        other = next((c for c in containers if isinstance(c, dict) and c.get("name") == CANARY), None)
        if other is not None and _list(other.get("command"))[: len(KEEPER)] != KEEPER:
            raise RenderError(
                f"{site.where} has a container named {CANARY} of its own; the add-on's has that name"
            )
        container = server.container
        if not isinstance(container.get("startupProbe"), dict):  # the verdict probes wait for it
            container["startupProbe"] = {**parts.startup_probe, "httpGet": {"path": "/health", "port": port}}
        container["readinessProbe"] = verdict_probe(parts, "ready", port)
        container["livenessProbe"] = verdict_probe(parts, "live", port)
        mounts = container["volumeMounts"] = _list(container.get("volumeMounts"))
        _upsert(mounts, {"name": VERDICT_VOLUME, "mountPath": VERDICT_DIR, "readOnly": True})
        _upsert(mounts, {"name": LEDGER_VOLUME, "mountPath": LEDGER_DIR})
        run_as = "runAsUser" not in _dict(site.spec.get("securityContext"))
        image = str(container.get("image") or "")
        _upsert(
            containers, canary_container(parts, image=image, port=port, key=key, source=source, run_as=run_as)
        )
    volumes = site.spec["volumes"] = _list(site.spec.get("volumes"))
    for volume in pod_volumes(parts, name, canary=bool(serving), key=key, source=source):
        _upsert(volumes, volume)
    metadata = site.pod_metadata()
    if not isinstance(metadata.get("annotations"), dict):
        metadata["annotations"] = {}
    # A new plugin or profile rolls the pods (`deploykit.podMetadata`).
    plugin = (
        f"sha256:{parts.wheel.sha256}"
        if plugin_path(parts, source) and parts.wheel
        else f"image:{found[0].container.get('image')}"
    )
    metadata["annotations"].update({PLUGIN_ANNOTATION: plugin, PROFILE_ID_ANNOTATION: parts.profile_id})


def apply_addon(text: str, parts: AddonParts, options: AddonOptions) -> AddonResult:
    """The stream with deploykit added to every vLLM container in it. A RenderError (one line) when one
    contradicts the plan; the documents it leaves alone keep their bytes."""
    chunks = split_documents(text)
    docs = parse_documents(chunks)
    originals = copy.deepcopy(docs)
    sites = pod_sites(docs)
    if not sites:
        raise RenderError(
            f"no vLLM container in the input (one running `vllm serve`, python -m {API_SERVER_MODULE}, or an "
            "image named for vLLM with arguments and no command): nothing to add deploykit to"
        )
    checked = [(site, check_site(site, parts)) for site in sites]
    name = release_name(sites, options.name)
    warnings: list[str] = []
    namespaces: dict[str | None, None] = {}
    images: set[str] = set()
    for site, found in checked:
        apply_site(site, found, parts, options, name)
        namespaces[site.namespace] = None
        metadata = site.doc.setdefault("metadata", {})
        if not isinstance(metadata.get("annotations"), dict):
            metadata["annotations"] = {}
        metadata["annotations"].update(parts.object_annotations)
        for item in found:
            image = str(item.container.get("image") or "")
            note = None if image in images else check_image(image, parts, item.where)
            images.add(image)
            if note is not None:
                warnings.append(note)
        if site.doc.get("kind") == "ClusterServingRuntime":
            warnings.append(
                f"{site.where} is cluster-wide: its pods run in each InferenceService's namespace, which "
                f"must hold the ConfigMaps {name}-profile and {name}-plugin-* too (they have no namespace)"
            )
    present = {
        (doc.get("kind"), _dict(doc.get("metadata")).get("namespace"), _name(doc)): doc
        for doc in docs
        if isinstance(doc, dict)
    }
    added: list[dict[str, Any]] = []
    for namespace in namespaces:
        for obj in added_objects(parts, name, namespace, options.plugin_source):
            there = present.get(("ConfigMap", namespace, obj["metadata"]["name"]))
            if there is None:
                added.append(obj)
            elif "data" in obj and there.get("data") != obj["data"]:
                there["data"] = obj["data"]  # the profile changed; the plugin's name is its content
    out = [_written("", obj) for obj in added]
    for chunk, doc, original in zip(chunks, docs, originals, strict=True):
        out.append(chunk if doc == original else _written(chunk, doc))
    body = "".join(out)
    return AddonResult(text=body if body.endswith("\n") else body + "\n", warnings=warnings)


# --- the command ------------------------------------------------------------------------------------------

# A rendered release is a few MiB (a Helm release's record is capped at 1 MiB, compressed).
MAX_INPUT_BYTES = 64 * 1024 * 1024


def read_stream(path: str | None, stdin: BinaryIO) -> str:
    """The manifests from a file or stdin (`-`): bounded, UTF-8."""
    where = "stdin" if path in (None, "-") else str(path)
    try:
        if path in (None, "-"):
            data = stdin.read(MAX_INPUT_BYTES + 1)
        else:
            with open(str(path), "rb") as handle:
                data = handle.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise RenderError(f"addon: cannot read {where}: {exc.strerror or exc}") from None
    if len(data) > MAX_INPUT_BYTES:
        raise RenderError(
            f"addon: {where} is over {MAX_INPUT_BYTES >> 20} MiB; give it the rendered manifests"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RenderError(f"addon: {where} is not UTF-8 (byte {exc.start})") from None


def run_addon(
    profile: str, facts: str, overrides: dict[str, FixMode], options: AddonOptions, text: str, *, force: bool
) -> AddonResult:
    """`deploykit addon`: the plan `render helm` makes for the profile and facts, applied to the stream; its
    warnings (the plan's, the add-on's) in the result. A RenderError names what is refused."""
    from deploykit.plan import host_vllm_warning
    from deploykit.probe.load import load_facts
    from deploykit.profile.load import load_profile
    from deploykit.render.common import plan_for_render, requirements_refusal
    from deploykit.render.plugin_wheel import build_plugin_wheel

    loaded = load_profile(profile)
    try:
        plan = plan_for_render(loaded, load_facts(facts), overrides)
        refused = requirements_refusal(plan)
        if refused is not None and not force:
            raise RenderError(f"{refused} (--force adds it anyway)")
        wheel = build_plugin_wheel() if options.plugin_source == "configmap" else None
        result = apply_addon(text, addon_parts(plan, loaded, wheel), options)
    except RenderError as exc:
        raise RenderError(f"addon: {exc}") from None
    host_only = host_vllm_warning(plan)
    notes = [warning for warning in plan.warnings if warning != host_only]
    if refused is not None:
        notes.insert(0, f"{refused}, added anyway (--force)")
    return result.model_copy(update={"warnings": notes + result.warnings})


# --- the Helm post-renderer plugin ------------------------------------------------------------------------

HELM_PLUGIN = "deploykit-addon"
PLUGIN_SCRIPT = "addon.sh"


def helm_plugin(python: str) -> RenderResult:
    """A Helm 4 post-renderer plugin (`type: postrenderer/v1`, subprocess runtime) that pipes Helm's manifests
    through `python -m deploykit addon` with the arguments given as --post-renderer-args. Helm 4 reads a
    post-renderer plugin's stderr into a buffer it never shows (v4.1, internal/plugin/runtime_subprocess.go),
    so the script copies deploykit's lines to Helm's own stderr."""
    from deploykit import __version__

    if not python or any(ch in python for ch in "\n\r\0"):
        raise RenderError(f"--python {python!r}: give a path on one line")
    plugin = {
        "apiVersion": "v1",
        "type": "postrenderer/v1",
        "name": HELM_PLUGIN,
        "version": __version__,
        "runtime": "subprocess",
        "runtimeConfig": {"platformCommand": [{"command": f"${{HELM_PLUGIN_DIR}}/{PLUGIN_SCRIPT}"}]},
    }
    script = f"""#!/bin/sh
# deploykit's Helm post-renderer (`deploykit render addon-plugin`; docs/addon.md): Helm's rendered manifests
# on stdin, the same with deploykit added on stdout. Its arguments are `deploykit addon`'s, given as
# --post-renderer-args:
#   helm install NAME CHART --post-renderer {HELM_PLUGIN} --post-renderer-args=--profile=PROFILE \\
#     --post-renderer-args=--facts=FACTS --post-renderer-args=--name=NAME
# Helm 4 keeps a post-renderer plugin's stderr to itself: deploykit's lines (a refusal, the warnings) are
# copied to Helm's stderr (its descriptor 2, this script's parent's), where the person running helm sees them.
errors=$(mktemp) || exit 1
trap 'rm -f "$errors"' EXIT
{shlex.quote(python)} -m deploykit addon "$@" 2>"$errors"
status=$?
if [ -s "$errors" ] && [ -w "/proc/$PPID/fd/2" ]; then
  cat "$errors" >>"/proc/$PPID/fd/2"
fi
exit $status
"""
    files = [
        RenderedFile(path=f"{HELM_PLUGIN}/plugin.yaml", content=dump(plugin)),
        RenderedFile(path=f"{HELM_PLUGIN}/{PLUGIN_SCRIPT}", content=script, mode=0o755),
    ]
    return RenderResult(files=files)
