"""Test helper: damage a ``torch.save`` file the way a bad disk or a bad copy would."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path


def flip_tensor_byte(path) -> None:
    """Flip one bit in the middle of the largest tensor stored in a ``torch.save`` zip file.

    The zip's local header gives where the (uncompressed) tensor bytes start; ``torch.load`` does
    not check the zip's CRC, so without a digest of its own the flip loads silently.
    """
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    blob = bytearray(Path(path).read_bytes())
    off = info.header_offset
    name_len, extra_len = struct.unpack("<HH", blob[off + 26 : off + 30])
    blob[off + 30 + name_len + extra_len + info.file_size // 2] ^= 0x01
    Path(path).write_bytes(bytes(blob))
