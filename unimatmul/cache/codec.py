"""The cache file's encoding (schema 4): compact, strict, safe to read when hostile, and
damage-contained.

A file is one msgpack map (docs/cache-format.md): a header, and a body of checksummed
*frames* (:mod:`unimatmul.cache.frames`). Per namespace: a description (platform facts,
interned maps, counts), the interned strings and lists in blocks, and the entries in
blocks of :data:`ENTRY_BLOCK`, each block its own zlib stream with its own CRC-32. The
description and the tables are written twice (at the start and again at the end of the
body), so one damaged byte costs at most the entries of the one block it falls in; the
quarantined copy keeps the rest of the evidence. Rows refer to the tables by index, so a
candidate identity, a settings map or a version map is written once per namespace.

Reading never trusts the file: the msgpack structure is pre-scanned without building
objects, every field is type-checked (the header too: it is outside every checksum),
lengths and counts are bounded by the file's own size before anything is allocated,
inflation has one budget per read, and a row is decoded only when its entry is asked
for, with every index checked. Schema 1 and 2 files are read (:mod:`unimatmul.cache.legacy`).
"""

from __future__ import annotations

import gc
import hashlib
import struct
import zlib
from typing import Any

import msgpack

from unimatmul.cache import frames
from unimatmul.cache.columns import Blocks, Column, Strings, Tables
from unimatmul.cache.errors import BadEntry, CacheFileError, NewerSchemaError
from unimatmul.cache.fields import clean_header, clean_platform, is_name
from unimatmul.cache.legacy import MAX_ENTRIES, decode_v1, decode_v2, is_count, max_entries, split_keys
from unimatmul.cache.record import check_settings
from unimatmul.cache.rows import encode_row
from unimatmul.cache.safe_msgpack import MAX_FILE_BYTES, Budget, canonical, inflate, inflate_budget, unpack
from unimatmul.cache.snapshot import SCHEMA, Namespace, Snapshot, compact, compact_namespace, iter_records

__all__ = [
    "COMPAT",
    "ENTRY_BLOCK",
    "FORMAT",
    "MAX_ENTRIES",
    "MAX_FILE_BYTES",
    "SCHEMA",
    "TABLE_BLOCK",
    "BadEntry",
    "CacheFileError",
    "Namespace",
    "NewerSchemaError",
    "Snapshot",
    "compact",
    "content_digest",
    "decode_file",
    "encode_file",
    "iter_records",
]

FORMAT = "unimatmul-cache"


# A writer of a later schema sets "compat" to the oldest schema whose readers can still
# read its files (ignoring what they do not know); such readers never write. Schema 2
# readers cannot read frames: 3 makes them refuse the file, never move or overwrite it.
# Schema 4 differs from 3 only in rows (a row's settings values follow it): a schema 3
# reader reads the rows it knows, skips the others and never writes the file.
COMPAT = 3


ENTRY_BLOCK = 128  # entries per block: what one damaged byte can cost at most


TABLE_BLOCK = 1024  # strings or lists per table block (written twice)


MAX_BLOCK = 1 << 16  # items in one block, as a reader accepts it


# Interned maps a namespace may carry before a rewrite re-encodes it: records intern
# their kinds (versions, settings shapes), a few dozen; only an earlier writer's files,
# which interned a settings map per record, hold more.
MAX_KINDS = 4096


DIGEST_VERSION = 2  # of content_digest's canonical form (not the file's schema: pins survive)


_U32 = struct.Struct("<I")


def decode_file(data: bytes, *, version: str = "", verify: bool = True) -> Snapshot:
    """Parse a cache file's bytes; CacheFileError (or NewerSchemaError) when nothing in it
    can be used. Damage that costs some entries is described in ``Snapshot.damage``.

    ``verify=False`` also reads a schema 2 body whose checksum fails (``cache recover
    --unverified``). Running out of memory while reading is a broken file too.
    """
    # Loading makes one string per key and one dict, none of them in a cycle: a
    # collection pass over the host program's objects in the middle of it (a
    # process with torch holds millions) would only cost time.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _decode_file(data, version, verify)
    except MemoryError:
        msg = f"reading it ran out of memory ({len(data)} bytes: a compression bomb?)"
        raise CacheFileError(msg) from None
    finally:
        if enabled:
            gc.enable()


def _decode_file(data: bytes, version: str, verify: bool) -> Snapshot:
    if len(data) > MAX_FILE_BYTES:
        msg = f"{len(data)} bytes exceed the {MAX_FILE_BYTES} byte limit"
        raise CacheFileError(msg)
    if not data:
        msg = "the file is empty"
        raise CacheFileError(msg)
    budget = inflate_budget(len(data))
    try:
        # The top level is small in a file of any schema this reader knows, except a
        # schema 1 file, which held every entry as msgpack maps.
        doc = unpack(data)
    except CacheFileError as exc:
        return _salvage(data, budget, exc)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return _salvage(
            data, budget, CacheFileError(f"not a unimatmul cache file (no 'format': {FORMAT!r} marker)")
        )
    schema = doc.get("schema")
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        return _salvage(data, budget, CacheFileError(f"bad schema version {schema!r}"))
    compat = doc.get("compat", schema)
    if schema > SCHEMA and (not isinstance(compat, int) or compat > SCHEMA):
        raise NewerSchemaError(schema, version, SCHEMA)
    try:
        if schema == 1:
            snapshot = decode_v1(doc)
        elif schema == 2:
            snapshot = decode_v2(doc, budget, len(data), verify=verify)
        else:
            body = doc.get("body")
            if not isinstance(body, bytes):
                msg = "no 'body' field"
                raise CacheFileError(msg)
            snapshot = Snapshot(schema=schema)
            _decode_frames(body, budget, snapshot, len(data))
    except CacheFileError as exc:
        # A schema 3 file whose top level was damaged into something that parses (a
        # schema number changed by one bit) still has its frames.
        return _salvage(data, budget, exc)
    header, problems = clean_header(doc.get("header", {}))
    snapshot.header = header
    snapshot.problems[:0] = problems
    return snapshot


def _salvage(data: bytes, budget: Budget, error: CacheFileError) -> Snapshot:
    """What the frames of a file say when its top level cannot be trusted; ``error``
    if it holds none (then it is no schema 3 file, or nothing of one is left)."""
    snapshot = Snapshot()
    if not _decode_frames(data, budget, snapshot, len(data)):
        raise error
    snapshot.damage.insert(0, f"the file's outer structure is damaged ({error}); its intact blocks were read")
    return snapshot


# --- schema 3: frames ---------------------------------------------------------------------


def _decode_frames(body: bytes, budget: Budget, snapshot: Snapshot, file_bytes: int) -> int:
    """Fill ``snapshot`` from the frames of ``body``; the number of intact frames."""
    damage = snapshot.damage
    metas: dict[int, dict[str, Any]] = {}
    malformed: dict[int, str] = {}
    blocks: dict[tuple[int, int, int], memoryview] = {}
    intact: list[frames.Frame] = []
    for frame in frames.walk(body, damage):
        intact.append(frame)
        where = (frame.kind, frame.namespace, frame.index)
        if frame.kind == frames.META:
            if frame.namespace not in metas:
                try:
                    metas[frame.namespace] = _meta(frame.payload, file_bytes)
                except CacheFileError as exc:
                    malformed.setdefault(frame.namespace, str(exc))
        elif frame.kind in (frames.STRINGS, frames.LISTS, frames.ENTRIES):
            # Tables come twice: the first intact copy serves. Entries come once.
            if where in blocks and frame.kind == frames.ENTRIES:
                damage.append(f"entry block {frame.index} of namespace {frame.namespace} appears twice")
            blocks.setdefault(where, frame.payload)
    _carry(intact, metas, malformed, snapshot)
    room = max_entries(file_bytes)
    for number, meta in sorted(metas.items(), key=lambda item: item[1]["name"]):
        name = meta["name"]
        if name in snapshot.namespaces:
            damage.append(f"namespace {name!r} is described twice; the second was skipped")
            continue
        if meta["entries"] > room:
            damage.append(f"namespace {name!r} claims {meta['entries']} entries, more than the file can hold")
            continue
        room -= meta["entries"]
        snapshot.namespaces[name] = _namespace(number, meta, blocks, budget, snapshot)
    return len(intact)


def _carry(
    intact: list[frames.Frame], metas: dict[int, Any], malformed: dict[int, str], snapshot: Snapshot
) -> None:
    """Keep, byte for byte, the intact frames of every namespace this reader could not
    describe (a description it cannot parse, or one lost while its blocks are intact):
    a rewrite writes them again instead of dropping data it could not read."""
    known = (frames.META, frames.STRINGS, frames.LISTS, frames.ENTRIES)
    counts: dict[int, int] = {}
    for frame in intact:
        if frame.kind in known and frame.namespace not in metas:
            snapshot.carried.append(
                (frame.namespace, frames.pack(frame.kind, frame.namespace, frame.index, bytes(frame.payload)))
            )
            counts[frame.namespace] = counts.get(frame.namespace, 0) + 1
    for number, n in sorted(counts.items()):
        why = malformed.get(number)
        what = f"its description cannot be read ({why})" if why else "its description was lost (both copies)"
        snapshot.unread.append(f"namespace {number}: {what}; its {n} intact frames are kept as they are")


_META_COUNTS = ("strings", "lists", "entries", "table_block", "entry_block")


def _meta(payload: memoryview, file_bytes: int) -> dict[str, Any]:
    meta = unpack(bytes(payload))
    if not isinstance(meta, dict):
        msg = "not a map"
        raise CacheFileError(msg)
    if not is_name(meta.get("name")):
        msg = f"bad namespace name {meta.get('name')!r}"
        raise CacheFileError(msg)
    for field in _META_COUNTS:
        if not is_count(meta.get(field)):
            msg = f"bad {field} count {meta.get(field)!r}"
            raise CacheFileError(msg)
    if not meta["table_block"] or not meta["entry_block"]:
        msg = "a block size of 0"
        raise CacheFileError(msg)
    # No more blocks than the file has room for frames, no more entries than it has room
    # for rows: what a crafted count could make a reader allocate is bounded by the size.
    room = file_bytes // frames.HEAD_BYTES + 1
    for count, size in (("strings", "table_block"), ("lists", "table_block"), ("entries", "entry_block")):
        if -(-meta[count] // meta[size]) > room:
            msg = f"{meta[count]} {count} in blocks of {meta[size]} do not fit in {file_bytes} bytes"
            raise CacheFileError(msg)
    if meta["entry_block"] > MAX_BLOCK or meta["table_block"] > MAX_BLOCK:
        msg = f"blocks of more than {MAX_BLOCK} items"
        raise CacheFileError(msg)
    maps = meta.get("maps")
    if not isinstance(maps, list):
        msg = "'maps' is not a list"
        raise CacheFileError(msg)
    try:
        meta["maps"] = [check_settings(m) for m in maps]
    except TypeError as exc:
        raise CacheFileError(str(exc)) from exc
    return meta


def _namespace(
    number: int,
    meta: dict[str, Any],
    blocks: dict[tuple[int, int, int], memoryview],
    budget: Budget,
    snapshot: Snapshot,
) -> Namespace:
    name = meta["name"]
    where = f"namespace {name!r}"
    platform, dropped = clean_platform(meta.get("platform", {}), where)
    snapshot.problems.extend(dropped)
    strings = _table(
        number, frames.STRINGS, meta["strings"], meta["table_block"], blocks, budget, snapshot, where
    )
    lists = _table(number, frames.LISTS, meta["lists"], meta["table_block"], blocks, budget, snapshot, where)
    count, size = meta["entries"], meta["entry_block"]
    index: dict[str, int] = {}
    parts: list[Column | None] = []
    read = 0
    for k in range(-(-count // size)):
        n = min(size, count - k * size)
        what = f"{where} entry block {k} ({n} entries)"
        part = None
        payload = blocks.get((frames.ENTRIES, number, k))
        if payload is None:
            snapshot.damage.append(f"{what} is lost")
        else:
            try:
                blob = inflate(payload, budget, what)
                if len(blob) < 4:
                    raise CacheFileError(f"{what} is too short")
                (key_bytes,) = _U32.unpack_from(blob, 0)
                keys = split_keys(blob[4 : 4 + key_bytes], n, what)
                part = Column.parse(blob[4 + key_bytes :], n, what)
            except CacheFileError as exc:
                snapshot.damage.append(str(exc))
        if part is None:
            snapshot.lost += n
        else:
            index.update(zip(keys, range(k * size, k * size + n), strict=True))
            read += n
        parts.append(part)
    if len(index) != read:
        snapshot.damage.append(f"{where}: {read - len(index)} keys appear twice")
    return Namespace(
        platform=platform,
        tables=Tables(Strings(strings), meta["maps"], lists),
        index=index,
        rows=Blocks(size, parts, count),
    )


def _table(
    number: int,
    kind: int,
    count: int,
    size: int,
    blocks: dict[tuple[int, int, int], memoryview],
    budget: Budget,
    snapshot: Snapshot,
    where: str,
) -> Blocks:
    label = "strings" if kind == frames.STRINGS else "lists"
    parts: list[Column | None] = []
    for k in range(-(-count // size)):
        n = min(size, count - k * size)
        what = f"{where} {label} block {k}"
        payload = blocks.get((kind, number, k))
        part = None
        if payload is None:
            snapshot.damage.append(f"{what} is lost (both copies): entries that use it cannot be read")
        else:
            try:
                part = Column.parse(inflate(payload, budget, what), n, what)
            except CacheFileError as exc:
                snapshot.damage.append(str(exc))
        parts.append(part)
    return Blocks(size, parts, count)


# --- writing ------------------------------------------------------------------------------


def encode_file(snapshot: Snapshot, header: dict[str, Any], *, level: int = 6) -> bytes:
    """The bytes of a cache file holding ``snapshot`` (fresh records are encoded here).

    A namespace whose tables lost a block is re-encoded from its records (a row copied
    as it is could point into the hole); entries that cannot be decoded are dropped, so
    the caller keeps a copy of a damaged file before it replaces it.
    """
    first: list[bytes] = [frame for _, frame in snapshot.carried]
    again: list[bytes] = []
    names = [name for name in sorted(snapshot.namespaces) if len(snapshot.namespaces[name])]
    taken = {number for number, _ in snapshot.carried}
    numbers = (number for number in range(1 << 16) if number not in taken)
    for number, name in zip(numbers, names, strict=False):
        ns = snapshot.namespaces[name]
        if ns.tables.damaged:
            ns = Namespace(platform=ns.platform, fresh=compact_namespace(name, ns, []))
        elif len(ns.tables.maps) > MAX_KINDS:
            # An earlier writer's one settings map a record: re-encoded once into shapes,
            # unless an entry would not survive it (then its rows are copied as they are).
            dropped: list[tuple[str, str, str]] = []
            fresh = compact_namespace(name, ns, dropped)
            if not dropped:
                ns = Namespace(platform=ns.platform, fresh=fresh)
        described, tables, entries = encode_namespace(name, number, ns, level=level)
        first += [described, *tables, *entries]
        again += [described, *tables]
    doc = {
        "format": FORMAT,
        "schema": SCHEMA,
        "compat": COMPAT,
        "header": header,
        "body": b"".join(first + again),
    }
    data: bytes = msgpack.packb(doc, use_bin_type=True)
    return data


def encode_namespace(
    name: str, number: int, ns: Namespace, *, level: int = 6
) -> tuple[bytes, list[bytes], list[bytes]]:
    """The frames of one namespace: its description, its table blocks, its entry blocks."""
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
    strings = ns.tables.strings.raw()
    lists = [ns.tables.lists[i] for i in range(len(ns.tables.lists))]
    meta = {
        "name": name,
        "platform": ns.platform,
        "maps": ns.tables.maps,
        "strings": len(strings),
        "lists": len(lists),
        "entries": len(keys),
        "table_block": TABLE_BLOCK,
        "entry_block": ENTRY_BLOCK,
    }
    described = frames.pack(frames.META, number, 0, msgpack.packb(meta, use_bin_type=True))
    tables = [
        frames.pack(kind, number, k, zlib.compress(Column.pack(items[start : start + TABLE_BLOCK]), level))
        for kind, items in ((frames.STRINGS, strings), (frames.LISTS, lists))
        for k, start in enumerate(range(0, len(items), TABLE_BLOCK))
    ]
    entries = []
    for k, start in enumerate(range(0, len(keys), ENTRY_BLOCK)):
        key_bytes = "\0".join(keys[start : start + ENTRY_BLOCK]).encode("utf-8")
        blob = _U32.pack(len(key_bytes)) + key_bytes + Column.pack(rows[start : start + ENTRY_BLOCK])
        entries.append(frames.pack(frames.ENTRIES, number, k, zlib.compress(blob, level)))
    return described, tables, entries


def content_digest(snapshot: Snapshot) -> str:
    """SHA-256 of the entries in a canonical form: equal entries, equal digest.

    Independent of the schema, table order, compression and header times, so that a
    deployed cache can be pinned by what it says rather than by its bytes.
    """
    digest = hashlib.sha256()
    digest.update(f"{FORMAT}/{DIGEST_VERSION}\n".encode())
    for name in sorted(snapshot.namespaces):
        ns = snapshot.namespaces[name]
        if not len(ns):
            continue
        digest.update(canonical(["namespace", name, ns.platform]))
        for _, key, record in iter_records(snapshot, name):
            if isinstance(record, BadEntry):
                try:
                    row = ns.row(key) or b""
                except BadEntry:
                    row = b""
                digest.update(canonical(["bad", key, row]))
            else:
                digest.update(canonical(["entry", key, record.to_dict()]))
    return digest.hexdigest()
