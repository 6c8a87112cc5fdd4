"""One binary row per entry: a TuningRecord in a few dozen bytes (docs/cache-format.md, "A row")."""

from __future__ import annotations

import math
import struct
from typing import Any

from unimatmul.cache.columns import Tables, put_varint, read_varint, table_item
from unimatmul.cache.errors import BadEntry
from unimatmul.cache.fields import is_date
from unimatmul.cache.record import (
    FAILED,
    OK,
    PRUNED,
    REJECTED,
    CandidateResult,
    TuningRecord,
)

# Candidate times are kept as their ratio to the winner's (exact) time, on a log
# scale of 1/4096 (0.024% steps, far below timing noise), in 16 bits centred so that
# ratios from 1/54 to 162,000 fit; any other time is written exactly.
_TIME_STEPS = 4096.0


_TIME_ZERO = 16384


_TIME_EXACT = 0xFFFF


DEFAULT_IDENTITY = "default/default"  # unimatmul.core._backend.DEFAULT.identity


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


_F_MORE = 0x80  # a varint of more flags follows the head


_ROW_FLAGS = 0xFF


# More flags (the varint after the head, with flag 0x80): room for fields to come.
_M_SETTINGS_VALUES = 0x01  # the settings index names a shape; the values follow it in the row


_MORE_FLAGS = 0x01


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
    more = _M_SETTINGS_VALUES if settings else 0
    if more:
        flags |= _F_MORE
    out = bytearray(_HEAD.pack(flags, record.winner_s, record.tuned_at, _f32(record.tune_s)))
    if more:
        put_varint(out, more)
    put_varint(out, tables.list_of(identities))
    if flags & _F_WINNER_OUTSIDE:
        put_varint(out, tables.string(record.winner))
    else:
        put_varint(out, identities.index(record.winner))
    put_varint(out, tables.map(record.versions))
    if more & _M_SETTINGS_VALUES:
        # Measurements (load, noise, speedups, ...) differ from one record to the next:
        # only the shape of the map (its keys and list lengths) is interned, the values
        # are the row's, so the tables grow with the kinds of records, never their number.
        put_varint(out, tables.map(settings_shape(settings)))
        _put_leaves(out, settings, tables)
    else:
        put_varint(out, tables.map(settings))
    put_varint(out, tables.string(record.writer))
    if flags & _F_DEFAULT_EXACT:
        out += _F64.pack(record.default_s)
    if flags & _F_ERROR_EXACT:
        out += _F64.pack(default_error)
    if flags & _F_DEVICE:
        _put_device(out, record.device_state, tables)
    if flags & _F_PROBLEM:
        put_varint(out, tables.string(record.problem))
    base = record.winner_s if 0.0 < record.winner_s < math.inf else 0.0
    for r in results:
        status = _STATUS_CODES.get(r.status, _STATUS_OTHER)
        head = status
        tail = bytearray()
        if status == _STATUS_OTHER:
            put_varint(tail, tables.string(r.status))
        if r.samples:
            head |= _R_SAMPLES
            put_varint(tail, r.samples)
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
            put_varint(tail, tables.string(r.note))
        out.append(head)
        out += tail
    return bytes(out)


def _put_device(out: bytearray, state: dict[str, Any], tables: Tables) -> None:
    # Readings (clocks, temperatures) differ from one tuning to the next, so the
    # values are written in the row; only the set of names is interned.
    names = sorted(state)
    put_varint(out, tables.list_of(names))
    for name in names:
        _put_value(out, state[name], tables)


def _put_value(out: bytearray, value: Any, tables: Tables) -> None:
    """One scalar with its value tag (``_V_NONE`` .. ``_V_STR``)."""
    if value is None:
        out.append(_V_NONE)
    elif isinstance(value, bool):
        out.append(_V_TRUE if value else _V_FALSE)
    elif isinstance(value, int):
        out.append(_V_INT if value >= 0 else _V_NEG)
        put_varint(out, abs(value))
    elif isinstance(value, float):
        out.append(_V_FLOAT)
        out += _F64.pack(value)
    else:
        out.append(_V_STR)
        put_varint(out, tables.string(str(value)))


def settings_shape(value: Any) -> Any:
    """A settings map with every scalar replaced by None: its keys and list lengths."""
    if isinstance(value, dict):
        return {k: settings_shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [settings_shape(v) for v in value]
    return None


def _put_leaves(out: bytearray, value: Any, tables: Tables) -> None:
    # In the order _read_leaves walks the shape: map keys sorted, lists in order.
    if isinstance(value, dict):
        for k in sorted(value):
            _put_leaves(out, value[k], tables)
    elif isinstance(value, list):
        for item in value:
            _put_leaves(out, item, tables)
    else:
        _put_value(out, value, tables)


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


def _decode_row(key: str, row: bytes, tables: Tables) -> TuningRecord:
    strings, maps = tables.strings, tables.maps
    flags, winner_s, tuned_at, tune_s = _HEAD.unpack_from(row, 0)
    if flags & ~_ROW_FLAGS or (flags & 0x03) == 0x03 or (flags & 0x0C) == 0x0C:
        msg = f"entry {key!r} has bad flags 0x{flags:02x}"
        raise BadEntry(msg)
    if not is_date(tuned_at):
        msg = f"entry {key!r} was tuned at {tuned_at!r}, which is not a date"
        raise BadEntry(msg)
    pos = _HEAD.size
    more = 0
    if flags & _F_MORE:
        more, pos = read_varint(row, pos)
        if more & ~_MORE_FLAGS:
            msg = f"entry {key!r} has flags 0x{more:x} of a newer writer"
            raise BadEntry(msg)
    index, pos = read_varint(row, pos)
    identities = tables.listtable_item(index)
    index, pos = read_varint(row, pos)
    winner = table_item(strings, index) if flags & _F_WINNER_OUTSIDE else table_item(identities, index)
    index, pos = read_varint(row, pos)
    versions = table_item(maps, index)
    index, pos = read_varint(row, pos)
    if more & _M_SETTINGS_VALUES:
        settings, pos = _read_leaves(table_item(maps, index), row, pos, tables)
    else:
        settings = dict(table_item(maps, index))
    index, pos = read_varint(row, pos)
    writer = table_item(strings, index)
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
        index, pos = read_varint(row, pos)
        problem = table_item(strings, index)
    base = winner_s if 0.0 < winner_s < math.inf else 0.0
    results: list[CandidateResult] = []
    for identity in identities:
        head = row[pos]
        pos += 1
        code = head & 0x07
        if code == _STATUS_OTHER:
            index, pos = read_varint(row, pos)
            status = table_item(strings, index)
        else:
            status = _STATUS_NAMES[code]
        samples = 0
        if head & _R_SAMPLES:
            samples, pos = read_varint(row, pos)
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
            index, pos = read_varint(row, pos)
            note = table_item(strings, index)
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
    index, pos = read_varint(row, pos)
    for name in tables.listtable_item(index):
        out[name], pos = _read_value(row, pos, tables)
    return pos


def _read_value(row: bytes, pos: int, tables: Tables) -> tuple[Any, int]:
    tag = row[pos]
    pos += 1
    value: Any
    if tag == _V_NONE:
        value = None
    elif tag in (_V_FALSE, _V_TRUE):
        value = tag == _V_TRUE
    elif tag in (_V_INT, _V_NEG):
        value, pos = read_varint(row, pos)
        value = -value if tag == _V_NEG else value
    elif tag == _V_FLOAT:
        (value,) = _F64.unpack_from(row, pos)
        pos += 8
    elif tag == _V_STR:
        index, pos = read_varint(row, pos)
        value = table_item(tables.strings, index)
    else:
        msg = f"value tag {tag}"
        raise BadEntry(msg)
    return value, pos


def _read_leaves(shape: Any, row: bytes, pos: int, tables: Tables) -> tuple[Any, int]:
    """The settings whose shape is ``shape`` (from the maps table, depth-checked when read)."""
    if isinstance(shape, dict):
        found: dict[str, Any] = {}
        for k in sorted(shape):
            found[k], pos = _read_leaves(shape[k], row, pos, tables)
        return found, pos
    if isinstance(shape, list):
        items = []
        for item in shape:
            value, pos = _read_leaves(item, row, pos, tables)
            items.append(value)
        return items, pos
    if shape is not None:
        msg = "a settings shape holds a value"
        raise BadEntry(msg)
    return _read_value(row, pos, tables)


def _str_map(value: dict[str, Any]) -> dict[str, str]:
    for v in value.values():
        if not isinstance(v, str):
            msg = f"a library version is a {type(v).__name__}, not a string"
            raise BadEntry(msg)
    return dict(value)
