"""tools/flashinfer_pins.py reads a wheel's FlashInfer pin with HTTP range requests, never the whole file:
proven against a real loopback server that answers byte ranges the way PyPI's files host does, with a wheel
larger than everything the tool may read. And the advisories use what it wrote: a vLLM 0.25.1 target on the
recorded B200 (whose facts name no FlashInfer) meets the FlashInfer hangs of that release's pin."""

from __future__ import annotations

import io
import json
import re
import zipfile
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from tests.http_server import serving
from tools import flashinfer_pins

WHEEL = "vllm-0.25.1-cp38-abi3-manylinux_2_28_x86_64.whl"
METADATA = "Metadata-Version: 2.1\nName: vllm\nVersion: 0.25.1\nRequires-Dist: flashinfer-python==0.6.13\n"


def _wheel() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("vllm/_weights_stand_in.bin", bytes(range(256)) * 4096)  # 1 MiB nobody reads
        archive.writestr("vllm-0.25.1.dist-info/METADATA", METADATA)
    return buffer.getvalue()


class Index(BaseHTTPRequestHandler):
    """PyPI's JSON listing (relative file URLs, as this machine's mirror gives) and the files, by range."""

    def do_GET(self) -> None:
        server = self.server
        if self.path == "/pypi/vllm/json":
            files = [{"filename": WHEEL, "url": "../../files/w.whl", "digests": {"sha256": "ab" * 32}}]
            body = json.dumps({"releases": {"0.25.1": files}}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)
            return
        span = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        if self.path != "/files/w.whl" or span is None:
            self.send_response(404)
            self.end_headers()
            return
        first, last = int(span.group(1)), min(int(span.group(2)), len(server.wheel) - 1)  # type: ignore[attr-defined]
        server.served += last - first + 1  # type: ignore[attr-defined]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {first}-{last}/{len(server.wheel)}")  # type: ignore[attr-defined]
        self.end_headers()
        self.wfile.write(server.wheel[first : last + 1])  # type: ignore[attr-defined]

    def log_message(self, *_: object) -> None:
        pass


def test_the_pin_is_read_from_a_few_ranges_of_the_wheel(tmp_path: Path) -> None:
    wheel = _wheel()
    pins = tmp_path / "flashinfer-pins.json"
    with serving(Index, wheel=wheel, served=0) as url:
        assert flashinfer_pins.main(["0.25.1"], index=f"{url}/pypi", path=pins) == 0
        read = url.server.served
    entry = json.loads(pins.read_text())["pins"]["0.25.1"]
    assert entry == {"flashinfer": "0.6.13", "wheel": WHEEL, "sha256": "ab" * 32}
    assert read < len(wheel) // 4  # the directory and one member, not the 1 MiB beside them
    before = pins.read_bytes()
    with serving(Index, wheel=wheel, served=0) as url:
        assert flashinfer_pins.main(["0.25.1"], index=f"{url}/pypi", path=pins) == 0
    assert pins.read_bytes() == before  # run again: the same bytes


def test_a_release_whose_table_pins_it_and_a_malformed_release_are_refused(tmp_path: Path) -> None:
    pins = tmp_path / "flashinfer-pins.json"
    assert flashinfer_pins.main(["0.34.0"], path=pins) == 2  # its table carries the pin
    assert flashinfer_pins.main(["0.25"], path=pins) == 2
    assert flashinfer_pins.main(["0.２5.1"], path=pins) == 2  # a full-width digit goes into no URL
    assert not pins.exists()


def test_a_0_25_target_meets_its_flashinfers_hangs_without_a_stated_flashinfer(tmp_path: Path) -> None:
    import yaml

    from deploykit.plan import make_plan
    from deploykit.probe.load import load_facts
    from deploykit.profile.load import load_profile
    from tests.advisories.conftest import facts_path

    facts = load_facts(str(facts_path("b200")))
    assert facts.flashinfer_version is None  # the recorded B200 says nothing of FlashInfer
    statuses = {}
    for release in ("0.25.1", "0.26.0"):
        profile = tmp_path / f"p{release}.yaml"
        model = {"source": "org/m", "architecture": "Qwen3_5MoeForConditionalGeneration"}
        profile.write_text(yaml.safe_dump({"name": "p", "model": model, "vllm_version": release}))
        plan = make_plan(load_profile(str(profile)), facts)
        statuses[release] = {a.id: a.outcome for a in plan.advisories}
    assert statuses["0.25.1"]["flashinfer-topk-sampler-hang"] == "applied"  # its wheel pins 0.6.13
    assert statuses["0.25.1"]["flashinfer-gdn-prefill-hang-sm100"] == "warned"
    assert "flashinfer-topk-sampler-hang" not in statuses["0.26.0"]  # 0.26.0 pins 0.6.14
