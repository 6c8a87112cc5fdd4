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

import gc
import hashlib
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack

from unimatmul.cache.columns import Column, Strings, Tables
from unimatmul.cache.errors import BadEntry, CacheFileError, NewerSchemaError
from unimatmul.cache.record import (
    TuningRecord,
    check_settings,
)
from unimatmul.cache.rows import decode_row, encode_row
from unimatmul.cache.safe_msgpack import (
    MAX_FILE_BYTES,
    MAX_INFLATED_BYTES,
    canonical,
    inflate,
    inflate_beside,
    unpack,
)

FORMAT = "unimatmul-cache"


SCHEMA = 2


# A writer of a later schema sets "compat" to the oldest schema whose readers can
# still read its files (ignoring what they do not know); such readers never write.
COMPAT = 2


MAX_ENTRIES = 4_000_000  # all namespaces together


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
        raise NewerSchemaError(schema, version, SCHEMA)
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
    rows_blob = inflate_beside(raw.get("rows"), budget, f"{where} rows")
    keys_blob = inflate(raw.get("keys"), budget, f"{where} keys")
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
    lists_column = Column.parse(inflate(raw.get("lists"), budget, f"{where} lists"), lists, f"{where} lists")
    strings_column = Column.parse(
        inflate(raw.get("strings"), budget, f"{where} strings"), strings, f"{where} strings"
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
