"""The cache file's encoding (schema 2): compact, strict, and safe to read when hostile.

A file is one msgpack map (see docs/cache-format.md): a header, and a CRC-protected
body that keeps, per namespace, the platform facts once, a table of settings and
version maps, and zlib-compressed columns: interned strings, interned candidate
lists, the problem keys, and one binary row per entry. Rows refer to the tables by
index, so a candidate identity, a settings map or a library version map is written
once per namespace instead of once per entry.

Reading never trusts the file: the msgpack structure is pre-scanned without building
objects (bounded depth and object count, no extension types), lengths are checked
before anything is allocated, inflation is bounded, and a row is decoded only when
its entry is asked for, with every index checked.
"""

from __future__ import annotations

import builtins
import contextlib
import gc
import hashlib
import math
import struct
import sys
import threading
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import msgpack

from unimatmul.cache.record import (
    FAILED,
    OK,
    PRUNED,
    REJECTED,
    CandidateResult,
    TuningRecord,
    check_settings,
)

FORMAT = "unimatmul-cache"
SCHEMA = 2
# A writer of a later schema sets "compat" to the oldest schema whose readers can
# still read its files (ignoring what they do not know); such readers never write.
COMPAT = 2

MAX_FILE_BYTES = 256 << 20
MAX_INFLATED_BYTES = 512 << 20  # all columns of a file together, once inflated
_THREAD_MIN_BYTES = 256 << 10
MAX_ENTRIES = 4_000_000  # all namespaces together
MAX_DEPTH = 12  # legitimate files nest 6 deep
MAX_OBJECTS = 100_000  # msgpack objects outside the columns (header, maps: a few hundred)
MAX_TEXT = 1 << 20  # one string or table map element

# Candidate times are kept as their ratio to the winner's (exact) time, on a log
# scale of 1/4096 (0.024% steps, far below timing noise), in 16 bits centred so that
# ratios from 1/54 to 162,000 fit; any other time is written exactly.
_TIME_STEPS = 4096.0
_TIME_ZERO = 16384
_TIME_EXACT = 0xFFFF

DEFAULT_IDENTITY = "default/default"  # unimatmul.core.backend.DEFAULT.identity

_STATUS_CODES = {OK: 0, REJECTED: 1, FAILED: 2, PRUNED: 3}
_STATUS_NAMES = {code: name for name, code in _STATUS_CODES.items()}
_STATUS_OTHER = 7

# Row flags.
_F_DEFAULT_EXACT = 0x01  # default_s follows as a float64
_F_DEFAULT_FROM_RESULT = 0x02  # default_s is the Default candidate's time
_F_ERROR_EXACT = 0x04  # settings["default_error"] follows as a float64
_F_ERROR_FROM_RESULT = 0x08  # settings["default_error"] is the Default candidate's error
_F_DEVICE = 0x10  # device state follows
_F_PROBLEM = 0x20  # record.problem differs from the key: a string index follows
_F_WINNER_OUTSIDE = 0x40  # the winner is not among the results: a string index, not a position
_ROW_FLAGS = 0x7F

# Result head: low 3 bits the status code, then what follows.
_R_SAMPLES = 0x08
_R_TIME = 0x10
_R_ERROR = 0x20
_R_NOTE = 0x40

# Device-state value tags.
_V_NONE, _V_FALSE, _V_TRUE, _V_INT, _V_NEG, _V_FLOAT, _V_STR = range(7)

_HEAD = struct.Struct("<Bddf")  # flags, winner_s, tuned_at, tune_s
_F64 = struct.Struct("<d")
_U16 = struct.Struct("<H")
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")


class CacheFileError(ValueError):
    """The cache file is not a unimatmul cache this version can read."""


class NewerSchemaError(CacheFileError):
    """The file was written by a newer unimatmul whose format this one cannot read."""

    def __init__(self, schema: int, version: str) -> None:
        super().__init__(
            f"cache file schema {schema} is newer than this unimatmul ({version}) understands "
            f"({SCHEMA}); it is left untouched and never overwritten"
        )
        self.schema = schema


class BadEntry(ValueError):
    """One entry's row cannot be decoded (the rest of the file is fine)."""


# --- the msgpack pre-scan ------------------------------------------------------------------


def scan(data: bytes | memoryview, *, max_depth: int = MAX_DEPTH, max_objects: int = MAX_OBJECTS) -> None:
    """Check that ``data`` is exactly one msgpack object within the limits, building nothing.

    msgpack's own unpacker builds every object before a caller can look at it: a few
    megabytes of empty arrays become gigabytes of lists, and its depth guard differs
    between its C and pure-Python versions. This walk is iterative and allocates only
    a stack as deep as ``max_depth``.
    """
    buf = memoryview(data).cast("B") if not isinstance(data, memoryview) else data
    end = len(buf)
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
            if len(stack) + 1 >= max_depth:
                msg = f"msgpack nesting deeper than {max_depth}"
                raise CacheFileError(msg)
            stack.append(remaining)
            remaining = count


def unpack(data: bytes, *, max_objects: int = MAX_OBJECTS) -> Any:
    """Pre-scan, then unpack with strict options: str keys, no extension types."""
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
            max_array_len=MAX_OBJECTS,
            max_map_len=MAX_OBJECTS,
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


def _inflate(data: Any, budget: list[int], what: str) -> bytes:
    """zlib-inflate ``data`` within the remaining byte budget (a one-element list)."""
    out = _inflate_within(data, budget[0], what)
    budget[0] -= len(out)
    return out


def _inflate_within(data: Any, limit: int, what: str) -> bytes:
    if not isinstance(data, bytes):
        msg = f"{what} is not binary data"
        raise CacheFileError(msg)
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        msg = f"{what} does not inflate: {exc}"
        raise CacheFileError(msg) from exc
    if len(out) > limit or inflater.unconsumed_tail:
        msg = f"{what} inflates past the {MAX_INFLATED_BYTES} byte limit"
        raise CacheFileError(msg)
    if not inflater.eof or inflater.unused_data:
        msg = f"{what} is a truncated or padded zlib stream"
        raise CacheFileError(msg)
    return out


def _inflate_beside(data: Any, budget: list[int], what: str) -> Callable[[], bytes]:
    """Inflate a large column in another thread (zlib lets go of the GIL) while the
    caller indexes the keys; the returned function waits for it."""
    if not isinstance(data, bytes) or len(data) < _THREAD_MIN_BYTES:
        out = _inflate(data, budget, what)
        return lambda: out
    box: dict[str, Any] = {}
    limit = budget[0]

    def work() -> None:
        try:
            box["out"] = _inflate_within(data, limit, what)
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=work, name="unimatmul-cache-inflate", daemon=True)
    thread.start()

    def wait() -> bytes:
        thread.join()
        if "error" in box:
            raise box["error"]
        out: bytes = box["out"]
        budget[0] -= len(out)
        if budget[0] < 0:
            msg = f"{what} inflates past the {MAX_INFLATED_BYTES} byte limit"
            raise CacheFileError(msg)
        return out

    return wait


# --- interning tables ------------------------------------------------------------------


def canonical(value: Any) -> bytes:
    """A byte string equal for equal plain values, whatever the order of map keys."""
    return msgpack.packb(_sorted(value), use_bin_type=True)


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return [[k, _sorted(v)] for k, v in sorted(value.items())]
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


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


class Strings:
    """The strings table: a Column of UTF-8 items, each decoded when first used."""

    def __init__(self, column: Column | None = None) -> None:
        self.column = column if column is not None else Column()
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
    lists: Column = field(default_factory=Column)  # each item: varint string indices
    _string_index: dict[str, int] | None = None
    _map_index: dict[bytes, int] | None = None
    _list_index: dict[bytes, int] | None = None
    _list_memo: dict[int, list[str]] = field(default_factory=dict)

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
            self._list_index = {self.lists[i]: i for i in range(len(self.lists))}
        out = bytearray()
        for text in texts:
            _put_varint(out, self.string(text))
        key = bytes(out)
        found = self._list_index.get(key)
        if found is None:
            found = self._list_index[key] = self.lists.append(key)
        return found

    def list_at(self, index: int) -> builtins.list[str]:
        found = self._list_memo.get(index)
        if found is None:
            item = self.lists[index]
            found = []
            pos = 0
            while pos < len(item):
                i, pos = _varint(item, pos)
                found.append(_at(self.strings, i))
            self._list_memo[index] = found
        return found


# --- rows ------------------------------------------------------------------------------


def _put_varint(out: bytearray, value: int) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
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


def _bf16(value: float) -> int:
    """The upper 16 bits of the float32 nearest ``value`` (3 significant digits)."""
    if math.isnan(value):
        return 0x7FC0
    if abs(value) > 3.4e38:
        return 0x7F80 if value > 0 else 0xFF80
    bits: int = _U32.unpack(_F32.pack(value))[0]
    bits += 0x7FFF + ((bits >> 16) & 1)  # round to nearest even
    return (bits >> 16) & 0xFFFF


def _from_bf16(code: int) -> float:
    value: float = _F32.unpack(_U32.pack(code << 16))[0]
    return value


def encode_row(key: str, record: TuningRecord, tables: Tables) -> bytes:
    """One entry's binary row (layout in docs/cache-format.md)."""
    results = record.results
    identities = [r.identity for r in results]
    settings = dict(record.settings)
    default = next((r for r in results if r.identity == DEFAULT_IDENTITY), None)
    flags = 0
    if record.default_s is not None:
        if default is not None and default.median_s == record.default_s:
            flags |= _F_DEFAULT_FROM_RESULT
        else:
            flags |= _F_DEFAULT_EXACT
    default_error = settings.get("default_error")
    if isinstance(default_error, float):
        del settings["default_error"]
        if default is not None and default.error == default_error:
            flags |= _F_ERROR_FROM_RESULT
        else:
            flags |= _F_ERROR_EXACT
    if record.device_state:
        flags |= _F_DEVICE
    if record.problem != key:
        flags |= _F_PROBLEM
    if record.winner not in identities:
        flags |= _F_WINNER_OUTSIDE
    out = bytearray(_HEAD.pack(flags, record.winner_s, record.tuned_at, _f32(record.tune_s)))
    _put_varint(out, tables.list_of(identities))
    if flags & _F_WINNER_OUTSIDE:
        _put_varint(out, tables.string(record.winner))
    else:
        _put_varint(out, identities.index(record.winner))
    _put_varint(out, tables.map(record.versions))
    _put_varint(out, tables.map(settings))
    _put_varint(out, tables.string(record.writer))
    if flags & _F_DEFAULT_EXACT:
        out += _F64.pack(record.default_s)
    if flags & _F_ERROR_EXACT:
        out += _F64.pack(default_error)
    if flags & _F_DEVICE:
        _put_device(out, record.device_state, tables)
    if flags & _F_PROBLEM:
        _put_varint(out, tables.string(record.problem))
    base = record.winner_s if 0.0 < record.winner_s < math.inf else 0.0
    for r in results:
        status = _STATUS_CODES.get(r.status, _STATUS_OTHER)
        head = status
        tail = bytearray()
        if status == _STATUS_OTHER:
            _put_varint(tail, tables.string(r.status))
        if r.samples:
            head |= _R_SAMPLES
            _put_varint(tail, r.samples)
        t = r.median_s
        if t is not None:
            head |= _R_TIME
            code = _TIME_EXACT
            if base and 0.0 < t < math.inf:
                code = round(math.log(t / base) * _TIME_STEPS) + _TIME_ZERO
                code = code if 0 <= code < _TIME_EXACT else _TIME_EXACT
            tail += _U16.pack(code)
            if code == _TIME_EXACT:
                tail += _F64.pack(t)
        if r.error is not None:
            head |= _R_ERROR
            tail += _U16.pack(_bf16(r.error))
        if r.note:
            head |= _R_NOTE
            _put_varint(tail, tables.string(r.note))
        out.append(head)
        out += tail
    return bytes(out)


def _put_device(out: bytearray, state: dict[str, Any], tables: Tables) -> None:
    # Readings (clocks, temperatures) differ from one tuning to the next, so the
    # values are written in the row; only the set of names is interned.
    names = sorted(state)
    _put_varint(out, tables.list_of(names))
    for name in names:
        value = state[name]
        if value is None:
            out.append(_V_NONE)
        elif isinstance(value, bool):
            out.append(_V_TRUE if value else _V_FALSE)
        elif isinstance(value, int):
            out.append(_V_INT if value >= 0 else _V_NEG)
            _put_varint(out, abs(value))
        elif isinstance(value, float):
            out.append(_V_FLOAT)
            out += _F64.pack(value)
        else:
            out.append(_V_STR)
            _put_varint(out, tables.string(str(value)))


def _f32(value: float) -> float:
    return value if abs(value) <= 3.4e38 or math.isnan(value) else math.copysign(math.inf, value)


def decode_row(key: str, row: bytes, tables: Tables) -> TuningRecord:
    """The record of one row; BadEntry when it is malformed or points outside the tables."""
    try:
        return _decode_row(key, row, tables)
    except BadEntry:
        raise
    except (IndexError, struct.error, TypeError, ValueError, KeyError, OverflowError) as exc:
        msg = f"entry {key!r} is malformed ({type(exc).__name__}: {exc})"
        raise BadEntry(msg) from exc


def _at(table: Any, index: int) -> Any:
    # Python would read a negative index from the end: a crafted row must not.
    if not 0 <= index < len(table):
        msg = f"table index {index} outside 0..{len(table) - 1}"
        raise BadEntry(msg)
    return table[index]


def _decode_row(key: str, row: bytes, tables: Tables) -> TuningRecord:
    strings, maps = tables.strings, tables.maps
    flags, winner_s, tuned_at, tune_s = _HEAD.unpack_from(row, 0)
    if flags & ~_ROW_FLAGS or (flags & 0x03) == 0x03 or (flags & 0x0C) == 0x0C:
        msg = f"entry {key!r} has bad flags 0x{flags:02x}"
        raise BadEntry(msg)
    pos = _HEAD.size
    index, pos = _varint(row, pos)
    identities = tables.list_at(index)
    index, pos = _varint(row, pos)
    winner = _at(strings, index) if flags & _F_WINNER_OUTSIDE else _at(identities, index)
    index, pos = _varint(row, pos)
    versions = _at(maps, index)
    index, pos = _varint(row, pos)
    settings = dict(_at(maps, index))
    index, pos = _varint(row, pos)
    writer = _at(strings, index)
    default_s = None
    if flags & _F_DEFAULT_EXACT:
        (default_s,) = _F64.unpack_from(row, pos)
        pos += 8
    if flags & _F_ERROR_EXACT:
        (settings["default_error"],) = _F64.unpack_from(row, pos)
        pos += 8
    device_state: dict[str, Any] = {}
    if flags & _F_DEVICE:
        pos = _read_device(row, pos, tables, device_state)
    problem = key
    if flags & _F_PROBLEM:
        index, pos = _varint(row, pos)
        problem = _at(strings, index)
    base = winner_s if 0.0 < winner_s < math.inf else 0.0
    results: list[CandidateResult] = []
    for identity in identities:
        head = row[pos]
        pos += 1
        code = head & 0x07
        if code == _STATUS_OTHER:
            index, pos = _varint(row, pos)
            status = _at(strings, index)
        else:
            status = _STATUS_NAMES[code]
        samples = 0
        if head & _R_SAMPLES:
            samples, pos = _varint(row, pos)
        median_s = None
        if head & _R_TIME:
            (time_code,) = _U16.unpack_from(row, pos)
            pos += 2
            if time_code == _TIME_EXACT:
                (median_s,) = _F64.unpack_from(row, pos)
                pos += 8
            elif base:
                median_s = base * math.exp((time_code - _TIME_ZERO) / _TIME_STEPS)
            else:
                msg = f"entry {key!r} has a coded time but no winner time to scale it"
                raise BadEntry(msg)
        error = None
        if head & _R_ERROR:
            error = _from_bf16(_U16.unpack_from(row, pos)[0])
            pos += 2
        note = ""
        if head & _R_NOTE:
            index, pos = _varint(row, pos)
            note = _at(strings, index)
        if head & 0x80:
            msg = f"entry {key!r} has a result with unknown bits"
            raise BadEntry(msg)
        results.append(CandidateResult(identity, status, median_s, samples, error, note))
    if pos != len(row):
        msg = f"entry {key!r} has {len(row) - pos} bytes after its last result"
        raise BadEntry(msg)
    if flags & (_F_DEFAULT_FROM_RESULT | _F_ERROR_FROM_RESULT):
        default = next((r for r in results if r.identity == DEFAULT_IDENTITY), None)
        if default is None:
            msg = f"entry {key!r} refers to a Default result it does not have"
            raise BadEntry(msg)
        if flags & _F_DEFAULT_FROM_RESULT:
            default_s = default.median_s
        if flags & _F_ERROR_FROM_RESULT:
            settings["default_error"] = default.error
    return TuningRecord(
        problem=problem,
        winner=winner,
        winner_s=winner_s,
        default_s=default_s,
        results=results,
        versions=_str_map(versions),
        tuned_at=tuned_at,
        tune_s=tune_s,
        settings=settings,
        writer=writer,
        device_state=device_state,
    )


def _read_device(row: bytes, pos: int, tables: Tables, out: dict[str, Any]) -> int:
    index, pos = _varint(row, pos)
    for name in tables.list_at(index):
        tag = row[pos]
        pos += 1
        value: Any
        if tag == _V_NONE:
            value = None
        elif tag in (_V_FALSE, _V_TRUE):
            value = tag == _V_TRUE
        elif tag in (_V_INT, _V_NEG):
            value, pos = _varint(row, pos)
            value = -value if tag == _V_NEG else value
        elif tag == _V_FLOAT:
            (value,) = _F64.unpack_from(row, pos)
            pos += 8
        elif tag == _V_STR:
            index, pos = _varint(row, pos)
            value = _at(tables.strings, index)
        else:
            msg = f"device state value tag {tag}"
            raise BadEntry(msg)
        out[name] = value
    return pos


def _str_map(value: dict[str, Any]) -> dict[str, str]:
    for v in value.values():
        if not isinstance(v, str):
            msg = f"a library version is a {type(v).__name__}, not a string"
            raise BadEntry(msg)
    return dict(value)


# --- namespaces and files ----------------------------------------------------------------


@dataclass
class Namespace:
    """The entries of one Platform: rows read from a file, plus records added since.

    Rows stay encoded until an entry is asked for; ``fresh`` holds records that no
    row on disk backs yet (put in this process, or merged from another file).
    """

    platform: dict[str, Any] = field(default_factory=dict)
    tables: Tables = field(default_factory=Tables)
    index: dict[str, int] = field(default_factory=dict)
    rows: Column = field(default_factory=Column)
    fresh: dict[str, TuningRecord] = field(default_factory=dict)
    memo: dict[str, TuningRecord] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.index) + len(self.fresh)

    def __contains__(self, key: str) -> bool:
        return key in self.fresh or key in self.index

    def sorted_keys(self) -> list[str]:
        return sorted([*self.index, *self.fresh])

    def row(self, key: str) -> bytes | None:
        i = self.index.get(key)
        return None if i is None else self.rows[i]

    def get(self, key: str, *, memo: bool = True) -> TuningRecord | None:
        """The record for ``key``; BadEntry if its row is malformed."""
        found = self.fresh.get(key) or self.memo.get(key)
        if found is not None:
            return found
        row = self.row(key)
        if row is None:
            return None
        record = decode_row(key, row, self.tables)
        if memo:
            self.memo[key] = record
        return record

    def put(self, key: str, record: TuningRecord) -> None:
        self.index.pop(key, None)
        self.memo.pop(key, None)
        self.fresh[key] = record

    def delete(self, key: str) -> bool:
        self.memo.pop(key, None)
        gone = self.fresh.pop(key, None) is not None
        return self.index.pop(key, None) is not None or gone


@dataclass
class Snapshot:
    """What one cache file holds: its header and its namespaces."""

    header: dict[str, Any] = field(default_factory=dict)
    namespaces: dict[str, Namespace] = field(default_factory=dict)
    schema: int = SCHEMA
    # Entries that could not be read while loading (schema 1 files), as (ns, key, why).
    bad: list[tuple[str, str, str]] = field(default_factory=list)

    def count(self) -> int:
        return sum(len(ns) for ns in self.namespaces.values())

    def namespace(self, name: str) -> Namespace:
        found = self.namespaces.get(name)
        if found is None:
            found = self.namespaces[name] = Namespace()
        return found

    def get(self, namespace: str, key: str) -> TuningRecord | None:
        found = self.namespaces.get(namespace)
        return found.get(key) if found is not None else None


def decode_file(data: bytes, *, version: str = "") -> Snapshot:
    """Parse a cache file's bytes; CacheFileError (or NewerSchemaError) when unusable."""
    # Loading makes one string per key and one dict, none of them in a cycle: a
    # collection pass over the host program's objects in the middle of it (a
    # process with torch holds millions) would only cost time.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _decode_file(data, version)
    finally:
        if enabled:
            gc.enable()


def _decode_file(data: bytes, version: str) -> Snapshot:
    if len(data) > MAX_FILE_BYTES:
        msg = f"{len(data)} bytes exceed the {MAX_FILE_BYTES} byte limit"
        raise CacheFileError(msg)
    if not data:
        msg = "the file is empty"
        raise CacheFileError(msg)
    # The top level is small in a file of any schema this reader knows, except a
    # schema 1 file, which held every entry as msgpack maps.
    doc = unpack(data)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        msg = f"not a unimatmul cache file (no 'format': {FORMAT!r} marker)"
        raise CacheFileError(msg)
    schema = doc.get("schema")
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        msg = f"bad schema version {schema!r}"
        raise CacheFileError(msg)
    header = doc.get("header", {})
    if not isinstance(header, dict):
        msg = "the header is not a map"
        raise CacheFileError(msg)
    if schema == 1:
        return _decode_v1(doc, header)
    compat = doc.get("compat", schema)
    if schema > SCHEMA and (not isinstance(compat, int) or compat > SCHEMA):
        raise NewerSchemaError(schema, version)
    body = doc.get("body")
    crc = doc.get("crc32")
    if not isinstance(body, bytes) or not isinstance(crc, int):
        msg = "no 'body' and 'crc32' fields"
        raise CacheFileError(msg)
    if zlib.crc32(body) != crc:
        msg = "the body's CRC-32 does not match (the file was damaged)"
        raise CacheFileError(msg)
    namespaces = unpack(body)
    if not isinstance(namespaces, dict):
        msg = "the body is not a map of namespaces"
        raise CacheFileError(msg)
    snapshot = Snapshot(header=header, schema=schema)
    budget = [MAX_INFLATED_BYTES]
    total = 0
    for name, raw in namespaces.items():
        ns = _decode_namespace(name, raw, budget)
        total += len(ns)
        if total > MAX_ENTRIES:
            msg = f"more than {MAX_ENTRIES} entries"
            raise CacheFileError(msg)
        snapshot.namespaces[name] = ns
    return snapshot


def _decode_namespace(name: str, raw: Any, budget: list[int]) -> Namespace:
    where = f"namespace {name!r}"
    if not isinstance(raw, dict):
        msg = f"{where} is not a map"
        raise CacheFileError(msg)
    platform, strings, maps, lists, count = (
        raw.get(k) for k in ("platform", "string_count", "maps", "list_count", "count")
    )
    if isinstance(strings, bool) or not isinstance(strings, int) or not 0 <= strings <= MAX_ENTRIES:
        msg = f"{where}: bad string count {strings!r}"
        raise CacheFileError(msg)
    if not isinstance(maps, list):
        msg = f"{where}: 'maps' is not a list"
        raise CacheFileError(msg)
    if isinstance(lists, bool) or not isinstance(lists, int) or not 0 <= lists <= MAX_ENTRIES:
        msg = f"{where}: bad list count {lists!r}"
        raise CacheFileError(msg)
    try:
        checked_maps = [check_settings(m) for m in maps]
        platform = check_settings(platform if platform is not None else {})
    except TypeError as exc:
        msg = f"{where}: {exc}"
        raise CacheFileError(msg) from exc
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_ENTRIES:
        msg = f"{where}: bad entry count {count!r}"
        raise CacheFileError(msg)
    rows_blob = _inflate_beside(raw.get("rows"), budget, f"{where} rows")
    keys_blob = _inflate(raw.get("keys"), budget, f"{where} keys")
    try:
        keys = keys_blob.decode("utf-8").split("\0") if count else []
    except UnicodeDecodeError as exc:
        msg = f"{where}: keys are not UTF-8"
        raise CacheFileError(msg) from exc
    if len(keys) != count or (count and not keys_blob):
        msg = f"{where}: {len(keys)} keys for {count} entries"
        raise CacheFileError(msg)
    index = dict(zip(keys, range(count), strict=True))
    if len(index) != count:
        msg = f"{where}: a key appears twice"
        raise CacheFileError(msg)
    # Items of the lists column are checked when a row uses them (see _at): checking
    # them all here would cost every load what only a crafted file needs.
    lists_column = Column.parse(_inflate(raw.get("lists"), budget, f"{where} lists"), lists, f"{where} lists")
    strings_column = Column.parse(
        _inflate(raw.get("strings"), budget, f"{where} strings"), strings, f"{where} strings"
    )
    rows = Column.parse(rows_blob(), count, f"{where} rows")
    return Namespace(
        platform=platform,
        tables=Tables(Strings(strings_column), checked_maps, lists_column),
        index=index,
        rows=rows,
    )


def _decode_v1(doc: dict[str, Any], header: dict[str, Any]) -> Snapshot:
    """Schema 1 (the first development format): every record a msgpack map."""
    namespaces = doc.get("namespaces", {})
    if not isinstance(namespaces, dict):
        msg = "'namespaces' is not a map"
        raise CacheFileError(msg)
    snapshot = Snapshot(header=header, schema=1)
    for name, items in namespaces.items():
        if not isinstance(items, dict):
            snapshot.bad.append((name, "", "the namespace is not a map"))
            continue
        ns = snapshot.namespace(name)
        for key, raw in items.items():
            try:
                ns.fresh[key] = TuningRecord.from_dict(raw)
            except (TypeError, KeyError, ValueError) as exc:
                snapshot.bad.append((name, key, f"{type(exc).__name__}: {exc}"))
    return snapshot


def encode_file(snapshot: Snapshot, header: dict[str, Any], *, level: int = 6) -> bytes:
    """The bytes of a cache file holding ``snapshot`` (fresh records are encoded here)."""
    body: dict[str, Any] = {}
    for name in sorted(snapshot.namespaces):
        ns = snapshot.namespaces[name]
        if not len(ns):
            continue
        body[name] = encode_namespace(name, ns, level=level)
    body_bytes = msgpack.packb(body, use_bin_type=True)
    doc = {
        "format": FORMAT,
        "schema": SCHEMA,
        "compat": COMPAT,
        "header": header,
        "crc32": zlib.crc32(body_bytes),
        "body": body_bytes,
    }
    data: bytes = msgpack.packb(doc, use_bin_type=True)
    return data


def encode_namespace(name: str, ns: Namespace, *, level: int = 6) -> dict[str, Any]:
    keys = ns.sorted_keys()
    rows: list[bytes] = []
    for key in keys:
        if "\0" in key:
            msg = f"a cache key may not contain NUL: {key!r}"
            raise ValueError(msg)
        fresh = ns.fresh.get(key)
        if fresh is not None:
            rows.append(encode_row(key, fresh, ns.tables))
        else:
            # A row read from disk refers to tables that only ever grow: copied as is.
            row = ns.row(key)
            assert row is not None
            rows.append(row)
    lists = ns.tables.lists
    return {
        "platform": ns.platform,
        "string_count": len(ns.tables.strings),
        "strings": zlib.compress(Column.pack(ns.tables.strings.raw()), level),
        "maps": ns.tables.maps,
        "list_count": len(lists),
        "count": len(keys),
        "keys": zlib.compress("\0".join(keys).encode("utf-8"), level),
        "lists": zlib.compress(Column.pack([lists[i] for i in range(len(lists))]), level),
        "rows": zlib.compress(Column.pack(rows), level),
    }


def compact(snapshot: Snapshot) -> tuple[Snapshot, list[tuple[str, str, str]]]:
    """A copy whose tables hold only what its entries use; entries that fail to decode are dropped."""
    out = Snapshot(header=dict(snapshot.header), schema=SCHEMA)
    dropped: list[tuple[str, str, str]] = []
    for name, ns in snapshot.namespaces.items():
        target = out.namespace(name)
        target.platform = dict(ns.platform)
        for key in ns.sorted_keys():
            try:
                record = ns.get(key, memo=False)
            except BadEntry as exc:
                dropped.append((name, key, str(exc)))
                continue
            if record is not None:
                target.fresh[key] = record
    return out, dropped


def iter_records(
    snapshot: Snapshot, namespace: str | None = None
) -> Iterator[tuple[str, str, TuningRecord | BadEntry]]:
    """Every (namespace, key, record or the BadEntry error), sorted, without memoising."""
    for name in sorted(snapshot.namespaces):
        if namespace is not None and name != namespace:
            continue
        ns = snapshot.namespaces[name]
        for key in ns.sorted_keys():
            try:
                record = ns.get(key, memo=False)
            except BadEntry as exc:
                yield name, key, exc
                continue
            if record is not None:
                yield name, key, record


def content_digest(snapshot: Snapshot) -> str:
    """SHA-256 of the entries in a canonical form: equal entries, equal digest.

    Independent of table order, compression and header times, so that a deployed
    cache can be pinned by what it says rather than by its bytes.
    """
    digest = hashlib.sha256()
    digest.update(f"{FORMAT}/{SCHEMA}\n".encode())
    for name in sorted(snapshot.namespaces):
        ns = snapshot.namespaces[name]
        if not len(ns):
            continue
        digest.update(canonical(["namespace", name, ns.platform]))
        for _, key, record in iter_records(snapshot, name):
            if isinstance(record, BadEntry):
                digest.update(canonical(["bad", key, ns.row(key) or b""]))
            else:
                digest.update(canonical(["entry", key, record.to_dict()]))
    return digest.hexdigest()
