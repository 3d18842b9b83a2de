"""deploykit as a wheel, built from the deploykit that is running: what a Helm chart carries to its pod.

A chart must not fetch the plugin from an index (the cluster may reach none, and the bare PyPI name
`deploykit` is another project's). So `render helm` packs the running package into a pure-Python wheel and
the chart ships it in a ConfigMap. Python imports straight from a wheel on PYTHONPATH (zipimport), and
`importlib.metadata` reads the entry points in its `.dist-info`, so vLLM finds the plugin with no install
step.

The wheel is reproducible on every machine: the same code gives the same bytes (sorted members, fixed
timestamps, modes and creator system, members stored uncompressed, so no zlib build decides a byte, and a
METADATA of the headers the pod reads only). Its modules are the pod's copies (`pod_source`: comments and
module docstrings blanked, line numbers kept). Its sha256 is therefore a digest of the uncompressed code the
pod runs: it names the chart's immutable ConfigMap and rolls the pods exactly when that code changes; a
comment, a module docstring, a profile or the README never does. Nothing here imports torch or vLLM.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import yaml
from pydantic import BaseModel

from deploykit import DISTRIBUTION, __version__
from deploykit.errors import RenderError
from deploykit.paths import PACKAGE_DIR, shipped_data_dir
from deploykit.plugin_contract import ENTRY_POINT
from deploykit.render.pod_source import pod_source

WHEEL_TAG = "py3-none-any"
# Two limits (docs/deploy.md, sizes and headroom; tests/render/test_chart_sizes.py measures both): a
# ConfigMap's data is capped at 1 MiB, and Helm keeps each release as one Secret (1 MiB) holding
# base64(gzip(JSON)) of the chart's files and the rendered manifests, the wheel in it twice (a chart file, and
# the ConfigMap's binaryData), both base64. Measured: the release record is about 1.2 times the stored wheel.
# Past this size the release would not fit, so render refuses.
MAX_WHEEL_BYTES = 840 * 1024
# 1980-01-01, the earliest time a zip member can carry: no build clock in the bytes.
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_PACKAGE_SUFFIXES = (".py", ".typed")
# What the pod runs: the plugin, the canary, the smoke (`deploykit smoke --url`: serve/remote_smoke.py; it
# plans, to know the fixes to expect), the upgrade gate's Job (`deploykit gate --url`) and the exec probes.
# Nothing in the pod renders, traces or launches vLLM itself (`deploykit serve`: serve/attempt.py, serving
# mode's serve/watch.py; `gate --launch`: gate/launch.py), and it reads its profile from a file, so the
# templates, the shipped profiles, render's modules but the probes, trace/ and those three stay out of a wheel
# that must fit a Helm release (MAX_WHEEL_BYTES). tests/test_sidecar_imports.py runs the canary, the smoke and
# the gate from this wheel with nothing else to import from.
POD_DATA: tuple[str, ...] = ()
# Package data a pod reads: the advisory catalog, which every plan judges (the gate's Job plans its profile on
# the chart's probe facts, for the fixes to expect and the fingerprint key) and the canary names hangs from.
_POD_CATALOG = "advisories/catalog.yaml"
_POD_RENDER_MODULES = {"__init__.py", "pod_probe.py", "pod_restarts.py", "canary_keeper.py"}
_LEFT_OUT_PACKAGES = {"trace"}
# Commands nothing in a pod runs (the pod plans, smokes, canaries, gates and probes; it never renders,
# traces, lists profiles or judges a catalog for a person): their CLI modules stay out, and deploykit.cli.app
# registers what is there. About 40 KB of the wheel's cap.
POD_LEFT_OUT_COMMANDS = ("render", "trace", "addon", "advisories", "profiles")
_LEFT_OUT_MODULES = {
    *(("cli", f"{name}.py") for name in POD_LEFT_OUT_COMMANDS),
    ("serve", "attempt.py"),  # `deploykit serve` launches vLLM: never in the pod
    ("serve", "watch.py"),
    ("gate", "launch.py"),  # `deploykit gate --launch` starts vLLM: a pod gates running servers (`--url`)
    ("vllm_plugin", "trace_hooks.py"),  # `deploykit trace` only
    # The real model's converter: a pod never converts it (render refuses a builtin model). The tiny model's
    # module stays: it is small, and a smoke of a profile that names builtin:tiny-llama resolves its path.
    ("smollm2.py",),
}
# The METADATA headers a pod reads (importlib.metadata: the name, the version, the requirements); the rest
# (Summary, License, the README) depend on the build tool's version and would change the bytes.
_METADATA_HEADERS = ("Name", "Version", "Requires-Python", "Provides-Extra", "Requires-Dist")
_UNIX = 3  # the zip creator system: fixed, so a wheel built on Windows has the same bytes
# The release tables (deploykit.vllm_tables) go in without their option tables: the pod's plan needs each
# release's env vars and source facts, never its `vllm serve` parser (argv is checked where render runs).
_TABLES_DIR = "vllm_tables"
_POD_TABLE_DROPS = ("option_table",)


def _runs_in_the_pod(relative: Path) -> bool:
    parts = relative.parts
    if parts[0] in _LEFT_OUT_PACKAGES or parts in _LEFT_OUT_MODULES:
        return False
    return not (parts[0] == "render" and parts[-1] not in _POD_RENDER_MODULES)


def _pod_table(path: Path) -> bytes:
    """A release table as the pod reads it: the same keys but the option table, in a stable form. The
    history of removals before the first table (deploykit.vllm_removed) goes without its `about` and each
    entry's `evidence`, the prose people read in the checkout; the record of the wheels' FlashInfer pins with
    the pins alone."""
    data = json.loads(path.read_text(encoding="utf-8"))
    for key in _POD_TABLE_DROPS:
        data.pop(key, None)
    if path.name == "flashinfer-pins.json":  # the pod reads each release's pin, not the wheel it came from
        data = {"pins": {release: {"flashinfer": e["flashinfer"]} for release, e in data["pins"].items()}}
    if path.name.startswith("removed-"):
        data.pop("about", None)
        for entries in data.values():
            for entry in entries.values() if isinstance(entries, dict) else ():
                entry.pop("evidence", None)
    return (json.dumps(data, sort_keys=True, indent=1) + "\n").encode()


def _pod_catalog(path: Path) -> bytes:
    """The advisory catalog as the pod reads it: every advisory with its conditions, action, title and
    threads, without the prose only people read (each range's evidence, each thread's note: `deploykit
    advisories ID` and docs/advisories.md outside the pod have them) and without comments, as one line of
    JSON (which is YAML). The pod's plans judge and act alike (tests/render/test_plugin_wheel.py)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    for advisory in data["advisories"]:
        advisory["vllm"]["evidence"] = ""
        for reference in advisory["references"]:
            reference["note"] = ""
    return (json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


class PluginWheel(BaseModel):
    filename: str
    data: bytes
    sha256: str

    @property
    def size_kib(self) -> float:
        return len(self.data) / 1024


def wheel_filename(version: str = __version__) -> str:
    """PEP 427's name: the distribution with `-` as `_`, the version, the tag."""
    return f"{DISTRIBUTION.replace('-', '_')}-{version}-{WHEEL_TAG}.whl"


def _package_files(package_dir: Path) -> Iterator[tuple[str, bytes]]:
    """The import package's code, and its shipped data as `deploykit/_data/...` (as setup.py lays it)."""
    for path in sorted(package_dir.rglob("*")):
        relative = path.relative_to(package_dir)
        if not path.is_file() or "__pycache__" in relative.parts or not _runs_in_the_pod(relative):
            continue
        if path.suffix == ".py" and relative.parts[0] != "_data":
            yield f"deploykit/{relative.as_posix()}", pod_source(path.read_bytes())
        elif path.suffix in _PACKAGE_SUFFIXES and relative.parts[0] != "_data":
            yield f"deploykit/{relative.as_posix()}", path.read_bytes()
        elif relative.parts[0] == _TABLES_DIR and path.suffix == ".json":
            yield f"deploykit/{relative.as_posix()}", _pod_table(path)
        elif relative.as_posix() == _POD_CATALOG:
            yield f"deploykit/{relative.as_posix()}", _pod_catalog(path)
    for name in POD_DATA:
        folder = shipped_data_dir(name, package_dir)
        if folder is None:
            raise RenderError(
                f"deploykit's shipped {name}/ are missing beside {package_dir}; reinstall deploykit"
            )
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                yield f"deploykit/_data/{name}/{path.relative_to(folder).as_posix()}", path.read_bytes()


def _dist_info_files(version: str) -> list[tuple[str, bytes]]:
    """METADATA and entry_points.txt as installed (so Requires-Dist and the plugin entry point are the
    package's own), and a WHEEL file of ours; RECORD is added last by the caller."""
    try:
        installed = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise RenderError(
            f"the plugin wheel needs {DISTRIBUTION}'s metadata, and this Python has none: install deploykit "
            "(in a checkout: pip install -e .) and render again"
        ) from None
    if installed.version != version:
        raise RenderError(
            f"installed {DISTRIBUTION} metadata says {installed.version}, the running code {version}: "
            "reinstall deploykit so both agree"
        )
    entry_points = installed.read_text("entry_points.txt") or ""
    if ENTRY_POINT not in entry_points:
        raise RenderError(
            f"{DISTRIBUTION}'s metadata lacks the vllm.general_plugins entry point; reinstall it"
        )
    # A .dist-info has METADATA; the .egg-info an editable install leaves in a checkout (first on sys.path
    # when Python runs there) has the same headers as PKG-INFO. Without a Name, importlib.metadata breaks.
    core = installed.read_text("METADATA") or installed.read_text("PKG-INFO") or ""
    # The headers alone: the long description (the README) after the first blank line is for an index page,
    # and the pod reads only Name, Version and the requirements.
    headers = core.split("\n\n", 1)[0].splitlines()
    kept = [line for line in headers if line.split(":", 1)[0] in _METADATA_HEADERS]
    core = "\n".join(["Metadata-Version: 2.1", *kept]) + "\n"
    if f"\nName: {DISTRIBUTION}\n" not in f"\n{core}":
        raise RenderError(f"{DISTRIBUTION}'s installed metadata names no distribution; reinstall it")
    info = f"{DISTRIBUTION.replace('-', '_')}-{version}.dist-info"
    wheel = f"Wheel-Version: 1.0\nGenerator: deploykit {version}\nRoot-Is-Purelib: true\nTag: {WHEEL_TAG}\n"
    return [
        (f"{info}/METADATA", core.encode()),
        (f"{info}/WHEEL", wheel.encode()),
        (f"{info}/entry_points.txt", entry_points.encode()),
    ]


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_plugin_wheel(package_dir: Path = PACKAGE_DIR, version: str = __version__) -> PluginWheel:
    """The running deploykit as a reproducible pure-Python wheel."""
    members = [*_package_files(package_dir), *_dist_info_files(version)]
    info = members[-1][0].split("/", 1)[0]
    record = "\n".join([*(_record_line(name, data) for name, data in members), f"{info}/RECORD,,"]) + "\n"
    members.append((f"{info}/RECORD", record.encode()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members:
            member = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
            member.external_attr = 0o644 << 16
            member.create_system = _UNIX
            member.compress_type = zipfile.ZIP_STORED
            archive.writestr(member, data)
    data = buffer.getvalue()
    if len(data) > MAX_WHEEL_BYTES:
        raise RenderError(
            f"the plugin wheel is {len(data) // 1024} KiB, over the {MAX_WHEEL_BYTES // 1024} KiB a "
            "Helm release can carry; use plugin.source image (docker/Dockerfile.vllm) instead"
        )
    return PluginWheel(filename=wheel_filename(version), data=data, sha256=hashlib.sha256(data).hexdigest())
