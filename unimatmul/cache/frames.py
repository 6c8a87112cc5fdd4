"""Frames: the checksummed units of a schema 3 file's body (docs/cache-format.md, "Frames").

A frame is a fixed 19-byte head (a magic, its kind, its namespace number, its index, the
payload's length, a CRC-32 of the head and the payload) and the payload. Each is checked
on its own, so damage costs only the frames it touches; and because every frame starts
with the magic, a reader that meets damage finds the next good frame by looking for the
magic again, even when the damage broke the lengths that would have led there.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

MAGIC = b"\xd3UMF"  # where a frame starts (and where a reader looks again after damage)


HEAD = struct.Struct("<4sBHII")  # magic, kind, namespace, index, length


CRC = struct.Struct("<I")


HEAD_BYTES = HEAD.size + CRC.size


# Kinds of frames.
META = 1  # a namespace's name, platform facts, maps and counts (msgpack)
STRINGS = 2  # a block of the strings table (zlib of a column)
LISTS = 3  # a block of the lists table (zlib of a column)
ENTRIES = 4  # a block of entries: keys and rows (zlib)
# A reader skips intact frames of kinds it does not know: a newer writer's additions.


@dataclass(frozen=True)
class Frame:
    kind: int
    namespace: int
    index: int
    payload: memoryview


def pack(kind: int, namespace: int, index: int, payload: bytes) -> bytes:
    head = HEAD.pack(MAGIC, kind, namespace, index, len(payload))
    return head + CRC.pack(zlib.crc32(payload, zlib.crc32(head[4:]))) + payload


def walk(data: bytes, damage: list[str]) -> Iterator[Frame]:
    """Every intact frame of ``data``, in order; each stretch of bytes that is not one is
    skipped up to the next magic and described in ``damage``."""
    view = memoryview(data)
    end = len(data)
    pos = 0
    while pos < end:
        frame = _frame_at(data, view, pos)
        if frame is not None:
            yield frame
            pos += HEAD_BYTES + len(frame.payload)
            continue
        following = data.find(MAGIC, pos + 1)
        stop = end if following < 0 else following
        damage.append(f"bytes {pos}..{stop - 1} are not an intact frame")
        pos = stop


def _frame_at(data: bytes, view: memoryview, pos: int) -> Frame | None:
    if len(data) - pos < HEAD_BYTES or data[pos : pos + 4] != MAGIC:
        return None
    _, kind, namespace, index, length = HEAD.unpack_from(data, pos)
    start = pos + HEAD_BYTES
    if length > len(data) - start:
        return None
    payload = view[start : start + length]
    (crc,) = CRC.unpack_from(data, pos + HEAD.size)
    if zlib.crc32(payload, zlib.crc32(view[pos + 4 : pos + HEAD.size])) != crc:
        return None
    return Frame(kind, namespace, index, payload)
