"""The default cache store: one msgpack file, shared by processes and sessions.

Writes take an advisory lock, re-read the file, merge, and replace it atomically
(temp file, fsync, rename), so that concurrent writers never lose each other's
entries and a crash leaves either the old or the new file. A file that cannot be read
is moved aside (``.corrupt-<timestamp>``) with a warning; the program carries on.
The format is described in docs/cache-format.md.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack

from unimatmul._version import __version__
from unimatmul.record import TuningRecord

FORMAT = "unimatmul-cache"
SCHEMA = 1
MAX_FILE_BYTES = 512 << 20
_UNPACK_LIMITS = {
    "max_str_len": 1 << 20,
    "max_bin_len": 1 << 20,
    "max_array_len": 1 << 22,
    "max_map_len": 1 << 22,
    "max_ext_len": 0,
}

Entries = dict[str, dict[str, TuningRecord]]


class CacheFileError(ValueError):
    """The cache file is not a unimatmul cache this version can read."""


def _refuse_ext(code: int, data: bytes) -> Any:
    msg = f"msgpack extension type {code} is not allowed in a cache file"
    raise CacheFileError(msg)


def decode(data: bytes) -> tuple[dict[str, Any], Entries, int]:
    """Parse a cache file's bytes: (header, entries, bad entry count). Strict types."""
    if len(data) > MAX_FILE_BYTES:
        msg = f"cache file of {len(data)} bytes exceeds the {MAX_FILE_BYTES} byte limit"
        raise CacheFileError(msg)
    try:
        doc = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            ext_hook=_refuse_ext,
            use_list=True,
            **_UNPACK_LIMITS,
        )
    except CacheFileError:
        raise
    except Exception as exc:
        msg = f"not a valid msgpack document: {exc}"
        raise CacheFileError(msg) from exc
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        msg = "not a unimatmul cache file (no 'format' marker)"
        raise CacheFileError(msg)
    schema = doc.get("schema")
    if not isinstance(schema, int) or schema < 1:
        msg = f"bad schema version {schema!r}"
        raise CacheFileError(msg)
    if schema > SCHEMA:
        raise NewerSchemaError(schema)
    header = doc.get("header", {})
    namespaces = doc.get("namespaces", {})
    if not isinstance(header, dict) or not isinstance(namespaces, dict):
        msg = "cache file header or namespaces is not a map"
        raise CacheFileError(msg)
    entries: Entries = {}
    bad = 0
    for ns, items in namespaces.items():
        if not isinstance(items, dict):
            bad += 1
            continue
        target = entries.setdefault(ns, {})
        for key, raw in items.items():
            try:
                target[key] = TuningRecord.from_dict(raw)
            except (TypeError, KeyError, ValueError):
                bad += 1
    return header, entries, bad


def encode(entries: Entries, header: dict[str, Any]) -> bytes:
    doc = {
        "format": FORMAT,
        "schema": SCHEMA,
        "header": header,
        "namespaces": {
            ns: {key: record.to_dict() for key, record in sorted(items.items())}
            for ns, items in sorted(entries.items())
            if items
        },
    }
    return msgpack.packb(doc, use_bin_type=True)


class NewerSchemaError(CacheFileError):
    def __init__(self, schema: int) -> None:
        super().__init__(
            f"cache file schema {schema} is newer than this unimatmul ({__version__}) "
            f"understands ({SCHEMA}); it is used read-only and never overwritten"
        )
        self.schema = schema


def _faster(a: TuningRecord, b: TuningRecord) -> TuningRecord:
    """The record to keep when two processes tuned the same key: deterministic."""
    return min((a, b), key=lambda r: (r.winner_s, r.winner, -r.tuned_at))


def read_only_requested() -> bool:
    return os.environ.get("UNIMATMUL_CACHE_READONLY", "").strip().lower() in ("1", "true", "yes")


class MsgpackFileStore:
    """A CacheStore backed by one msgpack file; see the module docstring."""

    def __init__(self, path: Path, *, read_only: bool | None = None) -> None:
        self.path = Path(path)
        self.read_only = read_only_requested() if read_only is None else read_only
        self._lock = threading.RLock()
        self._entries: Entries | None = None
        self._header: dict[str, Any] = {}
        self._stat: tuple[int, int, int] | None = None
        self._warned: set[str] = set()

    @property
    def location(self) -> str:
        return str(self.path)

    # --- reading ------------------------------------------------------------------
    def _warn_once(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            warnings.warn(f"unimatmul cache {self.path}: {message}", RuntimeWarning, stacklevel=4)

    def _file_stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _read_disk(self) -> Entries:
        """Entries on disk now; a broken file is moved aside and reads as empty."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            self._warn_once("unreadable", f"cannot be read ({exc}); using no cached entries")
            return {}
        try:
            header, entries, bad = decode(data)
        except NewerSchemaError as exc:
            self.read_only = True
            self._warn_once("newer", str(exc))
            return {}
        except CacheFileError as exc:
            self._quarantine(str(exc))
            return {}
        if bad:
            self._warn_once("bad-entries", f"skipped {bad} unreadable entries; the others are kept")
        self._header = header
        return entries

    def _quarantine(self, why: str) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.replace(self.path, aside)
            where = f"moved aside to {aside.name}"
        except OSError as exc:
            where = f"could not be moved aside ({exc})"
        self._warn_once("corrupt", f"{why}; {where}; continuing with an empty cache")

    def _load(self) -> Entries:
        if self._entries is None:
            with self._lock:
                if self._entries is None:
                    self._stat = self._file_stat()
                    self._entries = self._read_disk()
        return self._entries

    def reload(self) -> None:
        """Forget what was read, so the next access reads the file again."""
        with self._lock:
            self._entries = None

    # --- the CacheStore protocol --------------------------------------------------
    def get(self, namespace: str, key: str) -> TuningRecord | None:
        return self._load().get(namespace, {}).get(key)

    def items(self, namespace: str | None = None) -> Iterator[tuple[str, str, TuningRecord]]:
        entries = self._load()
        for ns in sorted(entries):
            if namespace is None or ns == namespace:
                for key, record in sorted(entries[ns].items()):
                    yield ns, key, record

    def count(self) -> int:
        return sum(len(items) for items in self._load().values())

    def put(self, namespace: str, key: str, record: TuningRecord) -> None:
        self._update({(namespace, key): record}, set())

    def put_many(self, records: dict[tuple[str, str], TuningRecord]) -> None:
        self._update(dict(records), set())

    def delete(self, namespace: str, key: str) -> bool:
        present = self.get(namespace, key) is not None
        if present:
            self._update({}, {(namespace, key)})
        return present

    # --- writing ------------------------------------------------------------------
    def _update(self, puts: dict[tuple[str, str], TuningRecord], deletes: set[tuple[str, str]]) -> None:
        with self._lock:
            entries = self._load()
            seen = {k: entries.get(k[0], {}).get(k[1]) for k in puts}
            for (ns, key), record in puts.items():
                entries.setdefault(ns, {})[key] = record
            for ns, key in deletes:
                entries.get(ns, {}).pop(key, None)
            if self.read_only:
                return
            try:
                self._write_merged(puts, deletes, seen)
            except OSError as exc:
                self.read_only = True
                self._warn_once("unwritable", f"cannot be written ({exc}); results stay in this process only")

    def _write_merged(
        self,
        puts: dict[tuple[str, str], TuningRecord],
        deletes: set[tuple[str, str]],
        seen: dict[tuple[str, str], TuningRecord | None],
    ) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(self.path.with_name(self.path.name + ".lock")):
            disk = self._read_disk() if self._file_stat() != self._stat else None
            merged: Entries = self._entries if self._entries is not None else {}
            if disk is not None:
                # Someone else wrote since we read: start from the file, re-apply ours.
                for (ns, key), record in puts.items():
                    theirs = disk.get(ns, {}).get(key)
                    if (
                        theirs is not None
                        and seen.get((ns, key)) is not theirs
                        and not _same(theirs, seen.get((ns, key)))
                    ):
                        record = _faster(theirs, record)
                    disk.setdefault(ns, {})[key] = record
                for ns, key in deletes:
                    disk.get(ns, {}).pop(key, None)
                merged = disk
            now = time.time()
            header = {
                "writer": f"unimatmul {__version__}",
                "created": self._header.get("created", now),
                "updated": now,
            }
            data = encode(merged, header)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            _fsync_dir(self.path.parent)
            self._entries = merged
            self._header = header
            self._stat = self._file_stat()


def _same(a: TuningRecord | None, b: TuningRecord | None) -> bool:
    if a is None or b is None:
        return a is b
    return (a.winner, a.winner_s, a.tuned_at) == (b.winner, b.winner_s, b.tuned_at)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An advisory exclusive lock (fcntl where it exists; none on other systems)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
