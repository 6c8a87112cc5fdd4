"""Reading the files of older schemas: 1 (every record a msgpack map) and 2 (one CRC-32 over
the whole body). They are read, never written: the next write makes them schema 3.
"""

from __future__ import annotations

import zlib
from typing import Any

from unimatmul.cache.columns import Column, Strings, Tables
from unimatmul.cache.errors import CacheFileError
from unimatmul.cache.fields import clean_platform, is_date, is_name
from unimatmul.cache.record import TuningRecord, check_settings
from unimatmul.cache.safe_msgpack import Budget, inflate, unpack
from unimatmul.cache.snapshot import Namespace, Snapshot

MAX_ENTRIES = 4_000_000  # all namespaces together


MIN_ENTRY_BYTES = 4  # on disk; identical records with sequential keys take 6


ENTRIES_FLOOR = 1 << 17


def max_entries(file_bytes: int) -> int:
    """The most entries a file of this size may claim: a count beyond it is a lie, refused
    before a key is split (every key is a Python object: a bomb of short keys would cost
    far more memory than its inflated bytes)."""
    return min(MAX_ENTRIES, max(ENTRIES_FLOOR, file_bytes // MIN_ENTRY_BYTES))


def decode_v2(doc: dict[str, Any], budget: Budget, file_bytes: int, *, verify: bool = True) -> Snapshot:
    """Schema 2: a CRC-32 over one msgpack body of namespaces with zlib columns.

    ``verify=False`` reads a body whose CRC fails (``cache recover --unverified``): what
    decodes may still be wrong, which is why nothing else ever asks for it.
    """
    body = doc.get("body")
    crc = doc.get("crc32")
    if not isinstance(body, bytes) or not isinstance(crc, int):
        msg = "no 'body' and 'crc32' fields"
        raise CacheFileError(msg)
    snapshot = Snapshot(schema=2)
    if zlib.crc32(body) != crc:
        if verify:
            msg = "the body's CRC-32 does not match (the file was damaged)"
            raise CacheFileError(msg)
        snapshot.damage.append("the body's CRC-32 does not match: the entries read could not be verified")
    namespaces = unpack(body)
    if not isinstance(namespaces, dict):
        msg = "the body is not a map of namespaces"
        raise CacheFileError(msg)
    room = [max_entries(file_bytes)]
    for name, raw in namespaces.items():
        if not is_name(name):
            snapshot.damage.append(f"a namespace named {name!r} (not a text) was skipped")
            continue
        snapshot.namespaces[name] = _decode_namespace(name, raw, budget, room, snapshot.problems)
    return snapshot


def _decode_namespace(name: str, raw: Any, budget: Budget, room: list[int], problems: list[str]) -> Namespace:
    where = f"namespace {name!r}"
    if not isinstance(raw, dict):
        msg = f"{where} is not a map"
        raise CacheFileError(msg)
    strings, lists, count = (_count(raw, k, where) for k in ("string_count", "list_count", "count"))
    maps = raw.get("maps")
    if count > room[0]:
        msg = f"{where}: {count} entries are more than a file of this size can hold"
        raise CacheFileError(msg)
    room[0] -= count
    if not isinstance(maps, list):
        msg = f"{where}: 'maps' is not a list"
        raise CacheFileError(msg)
    try:
        checked_maps = [check_settings(m) for m in maps]
    except TypeError as exc:
        msg = f"{where}: {exc}"
        raise CacheFileError(msg) from exc
    platform, dropped = clean_platform(raw.get("platform", {}), where)
    problems.extend(dropped)
    rows_blob = inflate(raw.get("rows"), budget, f"{where} rows")
    keys_blob = inflate(raw.get("keys"), budget, f"{where} keys")
    keys = split_keys(keys_blob, count, where)
    index = dict(zip(keys, range(count), strict=True))
    if len(index) != count:
        msg = f"{where}: a key appears twice"
        raise CacheFileError(msg)
    # Items of the lists column are checked when a row uses them (see rows.py): checking
    # them all here would cost every load what only a crafted file needs.
    lists_column = Column.parse(inflate(raw.get("lists"), budget, f"{where} lists"), lists, f"{where} lists")
    strings_column = Column.parse(
        inflate(raw.get("strings"), budget, f"{where} strings"), strings, f"{where} strings"
    )
    rows = Column.parse(rows_blob, count, f"{where} rows")
    return Namespace(
        platform=platform,
        tables=Tables(Strings(strings_column), checked_maps, lists_column),
        index=index,
        rows=rows,
    )


def _count(raw: dict[str, Any], field: str, where: str) -> int:
    value: Any = raw.get(field)
    if not is_count(value):
        what = {"string_count": "string", "list_count": "list", "count": "entry"}[field]
        msg = f"{where}: bad {what} count {value!r}"
        raise CacheFileError(msg)
    return int(value)


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ENTRIES


def split_keys(blob: bytes, count: int, where: str) -> list[str]:
    """The problem keys of a NUL-joined UTF-8 blob, exactly ``count`` of them (counted
    before any is made)."""
    found = blob.count(b"\0") + 1 if blob else 0
    if found != count:
        msg = f"{where}: {found} keys for {count} entries"
        raise CacheFileError(msg)
    try:
        return blob.decode("utf-8").split("\0") if count else []
    except UnicodeDecodeError as exc:
        msg = f"{where}: keys are not UTF-8"
        raise CacheFileError(msg) from exc


def decode_v1(doc: dict[str, Any]) -> Snapshot:
    """Schema 1 (the first development format): every record a msgpack map."""
    namespaces = doc.get("namespaces")
    if not isinstance(namespaces, dict):
        msg = "'namespaces' is missing or not a map"
        raise CacheFileError(msg)
    snapshot = Snapshot(schema=1)
    for name, items in namespaces.items():
        if not is_name(name):
            snapshot.damage.append(f"a namespace named {name!r} (not a text) was skipped")
            continue
        if not isinstance(items, dict):
            snapshot.bad.append((name, "", "the namespace is not a map"))
            continue
        ns = snapshot.namespace(name)
        for key, raw in items.items():
            if not is_name(key):
                snapshot.bad.append((name, repr(key), "the key is not a text"))
                continue
            try:
                record = TuningRecord.from_dict(raw)
            except (TypeError, KeyError, ValueError) as exc:
                snapshot.bad.append((name, key, f"{type(exc).__name__}: {exc}"))
                continue
            if not is_date(record.tuned_at):
                snapshot.bad.append((name, key, f"tuned_at {record.tuned_at!r} is not a date"))
                continue
            ns.fresh[key] = record
    return snapshot
