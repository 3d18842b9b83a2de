"""The wheel a chart carries: reproducible, complete, valid, and refused when too big for a release."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import zipfile
from pathlib import Path

import pytest

from deploykit import DISTRIBUTION, __version__
from deploykit.paths import PACKAGE_DIR
from deploykit.render import plugin_wheel
from deploykit.render.common import RenderError
from deploykit.render.plugin_wheel import build_plugin_wheel, wheel_filename
from deploykit.vllm_tables import SUPPORTED_VLLM_RELEASES


def test_the_same_code_gives_the_same_bytes() -> None:
    first, second = build_plugin_wheel(), build_plugin_wheel()
    assert first.data == second.data and first.sha256 == hashlib.sha256(first.data).hexdigest()
    assert first.filename == wheel_filename() == f"vllm_deploykit-{__version__}-py3-none-any.whl"


def test_the_wheel_holds_the_package_its_data_and_its_entry_point() -> None:
    with zipfile.ZipFile(io.BytesIO(build_plugin_wheel().data)) as archive:
        names = set(archive.namelist())
        info = f"vllm_deploykit-{__version__}.dist-info"
        package = {"deploykit/__init__.py", "deploykit/vllm_plugin/entry.py", "deploykit/render/pod_probe.py"}
        package.add("deploykit/render/pod_restarts.py")  # the liveness probe's restart cap (issue 34)
        package.add("deploykit/render/canary_keeper.py")  # the canary container's first process (issue 34)
        assert package <= names
        # Nothing in a pod renders, launches vLLM itself or reads a shipped profile (its own is a file).
        assert not any(n.startswith("deploykit/_data/") for n in names)
        left_out = {
            "deploykit/render/helm.py",
            "deploykit/render/systemd.py",
            "deploykit/trace/run.py",
            "deploykit/serve/attempt.py",
            "deploykit/serve/watch.py",
            # Commands nothing in a pod runs (deploykit.cli.app registers the modules that are there).
            "deploykit/cli/render.py",
            "deploykit/cli/trace.py",
            "deploykit/cli/addon.py",
            "deploykit/cli/advisories.py",
            "deploykit/cli/profiles.py",
        }
        assert "deploykit/serve/remote_smoke.py" in names  # `deploykit smoke --url`, the `helm test` pod's
        assert not names & left_out
        # Every release table rides along (the pod's smoke plans), without the argv parser it never uses.
        tables = sorted(n for n in names if n.startswith("deploykit/vllm_tables/vllm-"))
        assert tables == [f"deploykit/vllm_tables/vllm-{r}.json" for r in SUPPORTED_VLLM_RELEASES]
        for name in tables:
            table = json.loads(archive.read(name))
            assert "option_table" not in table and table["env_vars"] and "source_facts" in table
        # The wheels' FlashInfer pins that no table carries ride along, the pins alone (advisories read them).
        pod_pins = json.loads(archive.read("deploykit/vllm_tables/flashinfer-pins.json"))["pins"]
        shipped = json.loads((PACKAGE_DIR / "vllm_tables" / "flashinfer-pins.json").read_text())["pins"]
        assert pod_pins == {release: {"flashinfer": e["flashinfer"]} for release, e in shipped.items()}
        assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
        assert "deploykit.vllm_plugin.entry:register" in archive.read(f"{info}/entry_points.txt").decode()
        core = archive.read(f"{info}/METADATA").decode()
        assert f"Name: {DISTRIBUTION}" in core and "Requires-Dist:" in core
        assert "\n\n" not in core  # the headers, not the README after them
        # RECORD lists every other member with its digest and size, as pip checks on install.
        record = archive.read(f"{info}/RECORD").decode().splitlines()
        listed = {line.split(",")[0]: line.split(",")[1:] for line in record}
        assert set(listed) == names
        for name, (digest, size) in listed.items():
            if name.endswith("RECORD"):
                continue
            data = archive.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, size) == (f"sha256={expected}", str(len(data))), name


@pytest.mark.wheel_build
def test_pip_installs_the_wheel(tmp_path: Path) -> None:
    """The same bytes serve the `url` source and docker/Dockerfile.vllm: pip must accept them."""
    import subprocess
    import sys

    wheel = build_plugin_wheel()
    path = tmp_path / wheel.filename
    path.write_bytes(wheel.data)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
         "--disable-pip-version-check", "--target", str(tmp_path / "t"), str(path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "t" / "deploykit" / "vllm_plugin" / "entry.py").is_file()


def test_a_wheel_too_big_for_a_helm_release_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin_wheel, "MAX_WHEEL_BYTES", 1024)
    with pytest.raises(RenderError, match=r"KiB, over the 1 KiB .* plugin.source image"):
        build_plugin_wheel()


def test_an_egg_info_in_the_checkout_still_gives_a_named_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An editable install leaves `vllm_deploykit.egg-info` (PKG-INFO, no METADATA) in the checkout, first on
    sys.path when Python runs there: the wheel's METADATA must still carry the headers, or every
    importlib.metadata scan in the pod fails (it did in a fresh clone's CI run)."""
    from importlib import metadata

    installed = metadata.distribution(DISTRIBUTION)
    egg = tmp_path / "vllm_deploykit.egg-info"
    egg.mkdir()
    # In a fresh clone the installed metadata found first may itself be that egg-info (PKG-INFO).
    (egg / "PKG-INFO").write_text(installed.read_text("METADATA") or installed.read_text("PKG-INFO") or "")
    (egg / "entry_points.txt").write_text(installed.read_text("entry_points.txt") or "")
    monkeypatch.setattr(plugin_wheel.metadata, "distribution", lambda name: metadata.PathDistribution(egg))
    with zipfile.ZipFile(io.BytesIO(build_plugin_wheel().data)) as archive:
        text = archive.read(f"vllm_deploykit-{__version__}.dist-info/METADATA").decode()
    assert f"Name: {DISTRIBUTION}\n" in text
    (egg / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nVersion: {__version__}\n")
    with pytest.raises(RenderError, match="names no distribution"):
        build_plugin_wheel()


def test_no_zlib_decides_a_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    """Members are stored, not deflated: zlib and zlib-ng (64 of 140 members deflated differently) give the
    same wheel, so every machine renders the same chart and the digest-named ConfigMap never changes bytes
    under one name."""
    wheel = build_plugin_wheel()
    with zipfile.ZipFile(io.BytesIO(wheel.data)) as archive:
        assert {m.compress_type for m in archive.infolist()} == {zipfile.ZIP_STORED}
        assert {m.create_system for m in archive.infolist()} == {3}
        assert {m.date_time for m in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    monkeypatch.setattr(zipfile, "zlib", None)  # as on a Python built without zlib
    assert build_plugin_wheel().data == wheel.data


def test_the_build_tools_extra_headers_change_no_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another setuptools writes another Metadata-Version, Summary, License or README: the wheel keeps the
    headers the pod reads, so its digest (the ConfigMap's name, the pods' roll) stays."""
    from importlib import metadata

    installed = metadata.distribution(DISTRIBUTION)
    before = build_plugin_wheel()
    egg = tmp_path / "vllm_deploykit.egg-info"
    egg.mkdir()
    core = installed.read_text("METADATA") or installed.read_text("PKG-INFO") or ""
    headers, _, _ = core.partition("\n\n")
    changed = headers.replace("Metadata-Version: 2.4", "Metadata-Version: 2.2")
    changed += (
        "\nSummary: another summary\nLicense-File: LICENSE\nDynamic: license-file\n\nA changed README.\n"
    )
    (egg / "PKG-INFO").write_text(changed)
    (egg / "entry_points.txt").write_text(installed.read_text("entry_points.txt") or "")
    monkeypatch.setattr(plugin_wheel.metadata, "distribution", lambda name: metadata.PathDistribution(egg))
    assert build_plugin_wheel().sha256 == before.sha256


def test_the_digest_follows_the_code_the_pod_runs_and_nothing_else(tmp_path: Path) -> None:
    import shutil

    from deploykit.paths import PACKAGE_DIR

    copy = tmp_path / "deploykit"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    original = build_plugin_wheel()
    assert build_plugin_wheel(copy).sha256 == original.sha256
    # What the pod never runs: a launcher module, a renderer.
    (copy / "serve" / "attempt.py").write_text("# changed\n")
    (copy / "render" / "systemd.py").write_text("# changed\n")
    assert build_plugin_wheel(copy).sha256 == original.sha256
    # What it runs, reworded but not changed (a comment, the module docstring, on the same lines): the pod's
    # copy of the module is the same (render/pod_source.py), so nothing rolls.
    runner = copy / "canary" / "runner.py"
    source = runner.read_text()
    assert source.startswith('"""') and "  # " in source
    reworded = source.replace("  # ", "  # reworded: ", 1).replace('"""', '"""Reworded. ', 1)
    runner.write_text(reworded)
    assert build_plugin_wheel(copy).sha256 == original.sha256
    # What it runs, changed: the canary's code.
    runner.write_text(reworded + "CHANGED = True\n")
    assert build_plugin_wheel(copy).sha256 != original.sha256


def test_the_pods_catalog_judges_alike_without_the_prose_people_read() -> None:
    """The pod's catalog drops each range's evidence and each thread's note (a third of the file, which the
    Helm release cannot afford twice) and nothing a plan or the canary reads: every advisory, condition,
    action, title and thread is the shipped catalog's."""
    import yaml

    from deploykit.advisories.catalog import SAFE_LOADER, _fix_advisories
    from deploykit.advisories.schema import Catalog
    from deploykit.paths import PACKAGE_DIR

    with zipfile.ZipFile(io.BytesIO(build_plugin_wheel().data)) as archive:
        pod_text = archive.read("deploykit/advisories/catalog.yaml").decode()
    shipped_text = (PACKAGE_DIR / "advisories" / "catalog.yaml").read_text(encoding="utf-8")
    pod = Catalog.model_validate(yaml.load(pod_text, Loader=SAFE_LOADER))
    shipped = Catalog.model_validate(yaml.load(shipped_text, Loader=SAFE_LOADER))
    assert len(pod_text) < 0.8 * len(shipped_text)
    assert [a.id for a in pod.advisories] == [a.id for a in shipped.advisories]
    for mine, theirs in zip(pod.advisories, shipped.advisories, strict=True):
        assert mine.vllm.evidence == "" and all(r.note == "" for r in mine.references)
        people_only = {"vllm": {"evidence"}, "references": {"__all__": {"note"}}}
        assert mine.model_dump(exclude=people_only) == theirs.model_dump(exclude=people_only), mine.id
    assert _fix_advisories()  # the fixes' entries come from their modules, in the pod as anywhere
