"""The image case's PNG, made without an image library."""

from __future__ import annotations

import struct
import zlib

from deploykit.smoke import smoke_image_png


def test_test_image_is_a_valid_png() -> None:
    data = smoke_image_png(16)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, chunks = 8, {}
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        tag, payload = data[offset + 4 : offset + 8], data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert crc == zlib.crc32(tag + payload)
        chunks[tag] = payload
        offset += 12 + length
    width, height = struct.unpack(">II", chunks[b"IHDR"][:8])
    assert (width, height) == (16, 16)
    assert len(zlib.decompress(chunks[b"IDAT"])) == 16 * (1 + 3 * 16)
