"""The image the `image` smoke case sends: a small PNG made here, so the check needs no file and no
download."""

from __future__ import annotations

import struct
import zlib
from base64 import b64encode


def smoke_image_png(size: int = 32) -> bytes:
    """A small RGB gradient PNG made here (zlib + the PNG chunk format): no image library, no download."""
    rows = b"".join(
        b"\x00" + bytes(channel for x in range(size) for channel in (x * 8 % 256, y * 8 % 256, 128))
        for y in range(size)
    )

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def smoke_image_data_url() -> str:
    return "data:image/png;base64," + b64encode(smoke_image_png()).decode()
