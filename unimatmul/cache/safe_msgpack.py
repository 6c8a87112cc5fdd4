"""Reading msgpack that may be hostile: a pre-scan that builds nothing, strict unpacking,
and zlib inflation within a byte budget (docs/cache-format.md, "Reading a file that may
be hostile").
"""

from __future__ import annotations

import zlib
from typing import Any

import msgpack

from unimatmul.cache.errors import CacheFileError

MAX_FILE_BYTES = 256 << 20


MAX_INFLATED_BYTES = 512 << 20  # all columns of a file together, once inflated: the ceiling


MAX_DEPTH = 12  # legitimate files nest 6 deep


# What building one msgpack object costs at least once it is a Python object (an empty
# list is 56 bytes, a float 24 plus its slot, a dict over 200), and the memory one
# document may make of them.
OBJECT_BYTES = 64


OBJECTS_MEMORY = 64 << 20


MAX_OBJECTS = OBJECTS_MEMORY // OBJECT_BYTES  # one document: 1 Mi objects, a memory budget


def object_limit(nbytes: int) -> int:
    """The most msgpack objects a document of ``nbytes`` may hold: every object takes at
    least one byte, so the document's own size bounds them, and the memory budget bounds
    what any document may build. Never a count that honest growth reaches: what grows with
    the entries lives in the columns, outside every msgpack document."""
    return max(1, min(nbytes, MAX_OBJECTS))


MAX_TEXT = 1 << 20  # one string or table map element


def scan(data: bytes | memoryview, *, max_depth: int = MAX_DEPTH, max_objects: int | None = None) -> None:
    """Check that ``data`` is exactly one msgpack object within the limits, building nothing.

    msgpack's own unpacker builds every object before a caller can look at it: a few
    megabytes of empty arrays become gigabytes of lists, and its depth guard differs
    between its C and pure-Python versions. This walk is iterative and allocates only
    a stack as deep as ``max_depth``.
    """
    buf = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
    end = len(buf)
    if max_objects is None:
        max_objects = object_limit(end)
    pos = 0
    objects = 0
    stack: list[int] = []  # objects still expected in each open container
    remaining = 1
    while True:
        while remaining == 0:
            if not stack:
                if pos != end:
                    msg = f"{end - pos} bytes after the end of the msgpack document"
                    raise CacheFileError(msg)
                return
            remaining = stack.pop()
        if pos >= end:
            msg = "truncated msgpack document"
            raise CacheFileError(msg)
        remaining -= 1
        objects += 1
        if objects > max_objects:
            msg = f"more than {max_objects} msgpack objects"
            raise CacheFileError(msg)
        b = buf[pos]
        pos += 1
        count = -1  # elements of a container that opens here
        if b <= 0x7F or b >= 0xE0 or b in (0xC0, 0xC2, 0xC3):
            continue
        if 0x80 <= b <= 0x8F:
            count = 2 * (b & 0x0F)
        elif 0x90 <= b <= 0x9F:
            count = b & 0x0F
        elif 0xA0 <= b <= 0xBF:
            pos += b & 0x1F
        elif b in (0xC4, 0xD9):
            pos += 1 + (buf[pos] if pos < end else 0)
        elif b in (0xC5, 0xDA):
            pos += 2 + (int.from_bytes(buf[pos : pos + 2], "big") if pos + 2 <= end else 0)
        elif b in (0xC6, 0xDB):
            pos += 4 + (int.from_bytes(buf[pos : pos + 4], "big") if pos + 4 <= end else 0)
        elif b in (0xCA, 0xCE, 0xD2):
            pos += 4
        elif b in (0xCB, 0xCF, 0xD3):
            pos += 8
        elif b in (0xCC, 0xD0):
            pos += 1
        elif b in (0xCD, 0xD1):
            pos += 2
        elif b in (0xDC, 0xDE):
            if pos + 2 > end:
                msg = "truncated msgpack document"
                raise CacheFileError(msg)
            count = int.from_bytes(buf[pos : pos + 2], "big") * (2 if b == 0xDE else 1)
            pos += 2
        elif b in (0xDD, 0xDF):
            if pos + 4 > end:
                msg = "truncated msgpack document"
                raise CacheFileError(msg)
            count = int.from_bytes(buf[pos : pos + 4], "big") * (2 if b == 0xDF else 1)
            pos += 4
        else:
            # 0xC1 is never used; 0xC7-0xC9 and 0xD4-0xD8 are extension types.
            msg = f"msgpack type byte 0x{b:02x} (an extension type or reserved) at offset {pos - 1}"
            raise CacheFileError(msg)
        if pos > end:
            msg = "truncated msgpack document"
            raise CacheFileError(msg)
        if count > 0:
            if count > end - pos:
                # Every element takes at least one byte: a count beyond the bytes left
                # is a lie, caught before anyone trusts it.
                msg = f"a container claims {count} elements with {end - pos} bytes left"
                raise CacheFileError(msg)
            if objects + count > max_objects:
                # Each element is an object: refused at the container, before the walk.
                msg = f"more than {max_objects} msgpack objects"
                raise CacheFileError(msg)
            if len(stack) + 1 >= max_depth:
                msg = f"msgpack nesting deeper than {max_depth}"
                raise CacheFileError(msg)
            stack.append(remaining)
            remaining = count


def unpack(data: bytes, *, max_objects: int | None = None) -> Any:
    """Pre-scan, then unpack with strict options: str keys, no extension types. At most
    ``max_objects`` objects (default: :func:`object_limit` of the document's size)."""
    if max_objects is None:
        max_objects = object_limit(len(data))
    scan(data, max_objects=max_objects)
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=True,
            ext_hook=_refuse_ext,
            max_str_len=MAX_FILE_BYTES,
            max_bin_len=MAX_FILE_BYTES,
            max_array_len=max_objects,
            max_map_len=max_objects,
            max_ext_len=0,
        )
    except CacheFileError:
        raise
    except Exception as exc:  # UnicodeDecodeError, ValueError, ... : all mean "bad file"
        msg = f"not a valid msgpack document: {type(exc).__name__}: {exc}"
        raise CacheFileError(msg) from exc


def _refuse_ext(code: int, data: bytes) -> Any:
    msg = f"msgpack extension type {code} is not allowed in a cache file"
    raise CacheFileError(msg)


class Budget:
    """The bytes that inflating the columns of one file read may still produce.

    One budget per read of a file, shared by every column and block of it, so that a
    file of many small bombs costs no more than one big one. The bound grows with the
    file (a legitimate file inflates to a few times its size) and has a floor for small
    files and a ceiling for all: :func:`inflate_budget`.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit

    def take(self, n: int, what: str) -> None:
        if n > self.left:
            msg = f"{what} inflates past the {self.limit} byte limit of this file"
            raise CacheFileError(msg)
        self.left -= n


MIN_INFLATE_BUDGET = 16 << 20


INFLATE_RATIO = 64  # legitimate files inflate to 2-5 times their size


def inflate_budget(file_bytes: int) -> Budget:
    """The budget of one read of a file of ``file_bytes`` bytes (docs/cache-format.md)."""
    return Budget(min(MAX_INFLATED_BYTES, max(MIN_INFLATE_BUDGET, INFLATE_RATIO * file_bytes)))


def inflate(data: Any, budget: Budget, what: str) -> bytes:
    """zlib-inflate ``data`` (bytes or a memoryview) within what is left of ``budget``.

    The output grows as it inflates (zlib does not allocate the limit up front), so a
    bomb costs at most the budget before it is refused.
    """
    if not isinstance(data, (bytes, memoryview)):
        msg = f"{what} is not binary data"
        raise CacheFileError(msg)
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, budget.left + 1)
    except zlib.error as exc:
        msg = f"{what} does not inflate: {exc}"
        raise CacheFileError(msg) from exc
    if inflater.unconsumed_tail or len(out) > budget.left:
        budget.left = 0  # the work is spent: a file of many bombs costs no more than one
        msg = f"{what} inflates past the {budget.limit} byte limit of this file"
        raise CacheFileError(msg)
    if not inflater.eof or inflater.unused_data:
        msg = f"{what} is a truncated or padded zlib stream"
        raise CacheFileError(msg)
    budget.take(len(out), what)
    return out


def canonical(value: Any) -> bytes:
    """A byte string equal for equal plain values, whatever the order of map keys."""
    return msgpack.packb(_sorted(value), use_bin_type=True)


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return [[k, _sorted(v)] for k, v in sorted(value.items())]
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value
