"""The FlashInfer each vLLM release older than the shipped tables pins, read from its CUDA wheel on PyPI.

    .venv/bin/python tools/flashinfer_pins.py 0.25.1 0.27.0     # or: make vllm-flashinfer-pins RELEASES="..."

A release with a table (deploykit/vllm_tables/vllm-X.json) carries its pin there (`make vllm-release`),
unless the table was written from the CPU build, which names none (0.32). The advisories judge older targets
too (a chart rendered for a vLLM 0.25 image), and a wheel of 200-400 MB is not downloaded for one line: this
reads the zip's directory and its `METADATA` member with HTTP range requests, takes `Requires-Dist:
flashinfer-python==X` exactly as tools/vllm_tables.py reads an unpacked wheel's, and writes
deploykit/vllm_tables/flashinfer-pins.json with the wheel's name and the sha256 PyPI lists for it. The
digest is recorded, not checked (checking it would mean the whole download); the member's bytes are the
zip's, whose own CRC zipfile checks. Running it again for a release writes the same entry."""

from __future__ import annotations

import io
import json
import re
import sys
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/, when run as a script or imported
from vllm_tables import flashinfer_pin_of

PYPI = "https://pypi.org/pypi"
PINS = Path(__file__).resolve().parents[1] / "deploykit" / "vllm_tables" / "flashinfer-pins.json"
ABOUT = (
    "The FlashInfer the CUDA wheel of each vLLM release older than the shipped tables pins (its METADATA: "
    "Requires-Dist flashinfer-python==X), written by tools/flashinfer_pins.py from PyPI; a release whose "
    "table pins one carries it there. deploykit.vllm_tables.flashinfer_pin reads both."
)
TIMEOUT_S = 60
RELEASE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+", re.ASCII)  # goes into a URL and the file's keys


class RangeFile(io.RawIOBase):
    """A remote file read by HTTP range requests: seekable, so zipfile reads only the parts it needs."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.position = 0
        self.size = self._size()

    def _get(self, first: int, last: int) -> tuple[bytes, str]:
        request = urllib.request.Request(self.url, headers={"Range": f"bytes={first}-{last}"})
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            if answer.status != 206:
                raise RuntimeError(f"{self.url}: the server ignored a range request (HTTP {answer.status})")
            return answer.read(last - first + 1), answer.headers.get("Content-Range", "")

    def _size(self) -> int:
        _, span = self._get(0, 0)
        total = span.rpartition("/")[2]
        if not total.isdigit():
            raise RuntimeError(f"{self.url}: no length in the range answer ({span!r})")
        return int(total)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        start = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = max(0, start + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        wanted = min(len(buffer), self.size - self.position)
        if wanted <= 0:
            return 0
        data, _ = self._get(self.position, self.position + wanted - 1)
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


def release_wheel(release: str, index: str = PYPI) -> dict[str, str]:
    """The release's x86-64 wheel on the index (its JSON API, whose file URLs may be relative to it): name,
    URL and the sha256 the index lists."""
    listing = f"{index}/vllm/json"
    with urllib.request.urlopen(listing, timeout=TIMEOUT_S) as answer:
        files = json.load(answer)["releases"].get(release, [])
    wheels = sorted(f["filename"] for f in files if f["filename"].endswith("x86_64.whl"))
    if not wheels:
        raise RuntimeError(f"vLLM {release}: the index lists no x86-64 wheel")
    chosen = next(f for f in files if f["filename"] == wheels[0])
    url = urllib.parse.urljoin(listing, chosen["url"])
    return {"wheel": chosen["filename"], "url": url, "sha256": chosen["digests"]["sha256"]}


def read_pin(release: str, index: str = PYPI) -> dict[str, str | None]:
    """One release's entry: the FlashInfer its wheel pins (None: none), the wheel and its listed sha256."""
    wheel = release_wheel(release, index)
    with zipfile.ZipFile(io.BufferedReader(RangeFile(wheel["url"]), buffer_size=1 << 16)) as archive:
        names = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        if len(names) != 1:
            raise RuntimeError(f"{wheel['wheel']}: expected one dist-info METADATA, found {names}")
        metadata = archive.read(names[0]).decode("utf-8")
    requires = [
        line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")
    ]
    return {"flashinfer": flashinfer_pin_of(requires), "wheel": wheel["wheel"], "sha256": wheel["sha256"]}


def written(pins: dict[str, dict[str, str | None]]) -> str:
    ordered = dict(sorted(pins.items(), key=lambda item: tuple(int(p) for p in item[0].split("."))))
    return json.dumps({"about": ABOUT, "pins": ordered}, indent=1) + "\n"


def main(argv: list[str], index: str = PYPI, path: Path = PINS) -> int:
    from deploykit import exit_codes
    from deploykit.vllm_tables import SUPPORTED_VLLM_RELEASES, shipped_release

    if not argv or any(not RELEASE.fullmatch(release) for release in argv):
        print("usage: tools/flashinfer_pins.py RELEASE... (releases like 0.25.1)", file=sys.stderr)
        return exit_codes.USAGE
    tabled = [
        release
        for release in argv
        if release in SUPPORTED_VLLM_RELEASES and (shipped_release(release) or {}).get("flashinfer_pin")
    ]
    if tabled:
        print(f"{', '.join(tabled)}: its table carries the pin (make vllm-release)", file=sys.stderr)
        return exit_codes.USAGE
    pins = json.loads(path.read_text(encoding="utf-8"))["pins"] if path.exists() else {}
    for release in argv:
        pins[release] = read_pin(release, index)
        print(f"vLLM {release}: FlashInfer {pins[release]['flashinfer']} ({pins[release]['wheel']})")
    path.write_text(written(pins), encoding="utf-8")
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
