"""The columns of a namespace: length-prefixed item lists, and the interning tables
(strings, maps, lists of strings) that rows refer to by index."""

from __future__ import annotations

import builtins
import contextlib
import sys
from array import array
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from unimatmul.cache.errors import BadEntry, CacheFileError
from unimatmul.cache.safe_msgpack import canonical


class Column:
    """A sequence of byte strings kept as one blob plus offsets, sliced only when read.

    On disk (inflated): ``count`` little-endian uint32 lengths, then the items.
    Items appended after loading live in a list beside the blob.
    """

    def __init__(self, blob: bytes = b"", offsets: Any = None) -> None:
        self.blob = blob
        self.offsets = offsets if offsets is not None else array("q", [0])
        self.extra: list[bytes] = []

    @classmethod
    def parse(cls, data: bytes, count: int, where: str) -> Column:
        head = 4 * count
        if len(data) < head:
            msg = f"{where}: the column is shorter than its length table"
            raise CacheFileError(msg)
        lengths = array("I")
        if lengths.itemsize != 4:  # pragma: no cover - every platform CPython runs on
            lengths = array("L")
        lengths.frombytes(data[:head])
        if sys.byteorder == "big":  # pragma: no cover
            lengths.byteswap()
        offsets = array("q", accumulate(lengths, initial=head))
        if offsets[-1] != len(data):
            msg = f"{where}: item lengths add up to {offsets[-1]}, the column has {len(data)} bytes"
            raise CacheFileError(msg)
        return cls(data, offsets)

    damaged = False  # one Column is read whole or not at all

    def __len__(self) -> int:
        return len(self.offsets) - 1 + len(self.extra)

    def __getitem__(self, i: int) -> bytes:
        stored = len(self.offsets) - 1
        if 0 <= i < stored:
            return self.blob[self.offsets[i] : self.offsets[i + 1]]
        if stored <= i < stored + len(self.extra):
            return self.extra[i - stored]
        msg = f"column index {i} outside 0..{len(self) - 1}"
        raise BadEntry(msg)

    def append(self, item: bytes) -> int:
        self.extra.append(item)
        return len(self) - 1

    @staticmethod
    def pack(items: list[bytes]) -> bytes:
        lengths = array("I", [len(item) for item in items])
        if sys.byteorder == "big":  # pragma: no cover
            lengths.byteswap()
        return lengths.tobytes() + b"".join(items)


class Blocks:
    """A column stored in blocks of ``size`` items (schema 3), each block checked and parsed
    on its own: a damaged block is ``None`` and reading one of its items raises BadEntry, so
    damage costs only the entries that use it. Items appended after loading follow."""

    def __init__(self, size: int, parts: list[Column | None], stored: int) -> None:
        self.size = size
        self.parts = parts
        self.stored = stored
        self.extra: list[bytes] = []

    @property
    def damaged(self) -> bool:
        return any(part is None for part in self.parts)

    def __len__(self) -> int:
        return self.stored + len(self.extra)

    def __getitem__(self, i: int) -> bytes:
        if 0 <= i < self.stored:
            part = self.parts[i // self.size]
            if part is None:
                msg = f"item {i} is in a damaged block"
                raise BadEntry(msg)
            return part[i % self.size]
        if self.stored <= i < len(self):
            return self.extra[i - self.stored]
        msg = f"column index {i} outside 0..{len(self) - 1}"
        raise BadEntry(msg)

    def append(self, item: bytes) -> int:
        self.extra.append(item)
        return len(self) - 1


class Strings:
    """The strings table: a Column of UTF-8 items, each decoded when first used."""

    def __init__(self, column: Column | Blocks | None = None) -> None:
        self.column: Column | Blocks = column if column is not None else Column()
        self._memo: dict[int, str] = {}

    @classmethod
    def of(cls, texts: list[str]) -> Strings:
        table = cls()
        for text in texts:
            table.append(text)
        return table

    def __len__(self) -> int:
        return len(self.column)

    def __getitem__(self, i: int) -> str:
        found = self._memo.get(i)
        if found is None:
            try:
                found = self.column[i].decode("utf-8")
            except UnicodeDecodeError as exc:
                msg = f"string {i} of the table is not UTF-8"
                raise BadEntry(msg) from exc
            self._memo[i] = found
        return found

    def append(self, text: str) -> int:
        index = self.column.append(text.encode("utf-8", "surrogatepass"))
        self._memo[index] = text
        return index

    def raw(self) -> list[bytes]:
        return [self.column[i] for i in range(len(self.column))]


@dataclass
class Tables:
    """One namespace's interned strings, maps and string lists; append-only between compactions."""

    strings: Strings = field(default_factory=Strings)
    maps: list[dict[str, Any]] = field(default_factory=list)
    lists: Column | Blocks = field(default_factory=Column)  # each item: varint string indices
    _string_index: dict[str, int] | None = None
    _map_index: dict[bytes, int] | None = None
    _list_index: dict[bytes, int] | None = None
    _list_memo: dict[int, list[str]] = field(default_factory=dict)

    @property
    def damaged(self) -> bool:
        """Whether a block of a table was lost: rows read from disk cannot be copied as
        they are (an index could point into the hole), only re-encoded."""
        return self.strings.column.damaged or self.lists.damaged

    def string(self, text: str) -> int:
        if self._string_index is None:
            self._string_index = {}
            for i in range(len(self.strings)):
                with contextlib.suppress(BadEntry):  # an undecodable string is never reused
                    self._string_index.setdefault(self.strings[i], i)
        found = self._string_index.get(text)
        if found is None:
            found = self._string_index[text] = self.strings.append(text)
        return found

    def map(self, value: dict[str, Any]) -> int:
        if self._map_index is None:
            self._map_index = {canonical(m): i for i, m in enumerate(self.maps)}
        key = canonical(value)
        found = self._map_index.get(key)
        if found is None:
            found = self._map_index[key] = len(self.maps)
            self.maps.append(dict(value))
        return found

    def list_of(self, texts: list[str]) -> int:
        """The index of a list of strings (a record's candidate identities, in order)."""
        if self._list_index is None:
            self._list_index = {}
            for i in range(len(self.lists)):
                with contextlib.suppress(BadEntry):  # an item of a damaged block is never reused
                    self._list_index.setdefault(self.lists[i], i)
        out = bytearray()
        for text in texts:
            put_varint(out, self.string(text))
        key = bytes(out)
        found = self._list_index.get(key)
        if found is None:
            found = self._list_index[key] = self.lists.append(key)
        return found

    def listtable_item(self, index: int) -> builtins.list[str]:
        found = self._list_memo.get(index)
        if found is None:
            item = self.lists[index]
            found = []
            pos = 0
            while pos < len(item):
                i, pos = read_varint(item, pos)
                found.append(table_item(self.strings, i))
            self._list_memo[index] = found
        return found


def put_varint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            msg = "varint longer than 64 bits"
            raise BadEntry(msg)


def table_item(table: Any, index: int) -> Any:
    # Python would read a negative index from the end: a crafted row must not.
    if not 0 <= index < len(table):
        msg = f"table index {index} outside 0..{len(table) - 1}"
        raise BadEntry(msg)
    return table[index]
