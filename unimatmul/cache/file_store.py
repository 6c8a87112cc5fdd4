"""The default cache store: one msgpack file, shared by processes and sessions for years.

Writes take an advisory lock on a file beside the cache (``<name>.lock``), re-read the
file, merge, and replace it atomically (temp file, fsync, rename, fsync of the
folder): concurrent writers never lose each other's entries, and a process killed
at any moment leaves either the old or the new file. When two processes tuned the
same key, the faster record wins, decided the same way everywhere. Temp files of
killed writers are removed by the next writer.

A file that cannot be read is moved aside (``<name>.corrupt-<timestamp>``) with a
warning that says what and where, and the program carries on with an empty cache;
a file of a newer schema is never overwritten. ``UNIMATMUL_CACHE_READONLY=1`` (or a
file that cannot be written) means never write; the first refused write says so
once. The format is in :mod:`unimatmul.cache.codec` and docs/cache-format.md.

Durability: by default ``put`` returns once the record is on disk. With
``autoflush=N`` a store writes every N puts, and ``batch()`` defers writing to the
end of a block; :meth:`flush` writes now, and pending records are also written at
interpreter exit. A process killed before then loses only its own pending records.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import math
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from unimatmul import settings
from unimatmul._version import __version__
from unimatmul.cache.codec import (
    MAX_FILE_BYTES,
    BadEntry,
    CacheFileError,
    NewerSchemaError,
    Snapshot,
    decode_file,
    encode_file,
    iter_records,
)
from unimatmul.cache.lock import FileLock, LockTimeout
from unimatmul.cache.record import TuningRecord, check_device_state, check_settings
from unimatmul.core import notices

KEEP_CORRUPT = 3  # copies of broken files kept beside the cache; older ones are removed
STALE_TEMP_S = 600.0  # without a real lock, a temp file this old belongs to a dead writer


def warn_once(path: Path | str, what: str, message: str) -> None:
    """One warning per (file, kind of problem) per process: never per call."""
    notices.warn_once(("cache", str(path), what), f"unimatmul cache {path}: {message}", stacklevel=3)


def read_only_requested() -> bool:
    return settings.CACHE_READONLY.get()


def record_signature(record: TuningRecord | None) -> tuple[Any, ...] | None:
    """What identifies one tuning result across processes (exact in the file)."""
    if record is None:
        return None
    return (record.winner, record.winner_s, record.tuned_at, record.writer)


def faster(a: TuningRecord, b: TuningRecord) -> TuningRecord:
    """The record to keep when two processes tuned the same key.

    A total order (time, then identity, then the newer, then the writer), so every
    process that merges the same records keeps the same one, in any order.
    """

    def rank(r: TuningRecord) -> tuple[Any, ...]:
        t = r.winner_s if not math.isnan(r.winner_s) else math.inf
        return (t, r.winner, -r.tuned_at, r.writer)

    return a if rank(a) <= rank(b) else b


def check_record(record: TuningRecord) -> None:
    """Refuse at ``put`` what could not be written, with a clear message."""
    if not isinstance(record, TuningRecord):
        msg = f"a cache store holds TuningRecords, got {type(record).__name__}"
        raise TypeError(msg)
    check_settings(record.settings)
    check_device_state(record.device_state)
    for r in record.results:
        if r.samples < 0:
            msg = f"candidate {r.identity!r} has a negative sample count"
            raise ValueError(msg)


# --- reading and writing whole files ----------------------------------------------------


def read_file(path: Path) -> Snapshot:
    """The snapshot in ``path`` (empty when missing); CacheFileError when unusable."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        return Snapshot()
    return decode_file(data, version=__version__)


def write_file(path: Path, snapshot: Snapshot, *, level: int = 6, created: float | None = None) -> None:
    """Write ``snapshot`` to ``path`` atomically (the caller holds the lock)."""
    now = time.time()
    header = {
        "writer": f"unimatmul {__version__}",
        "created": created if created is not None else now,
        "updated": now,
        "entries": snapshot.count(),
    }
    data = encode_file(snapshot, header, level=level)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(OSError):
            # Keep the permissions of the file being replaced (a shared cache stays shared).
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    snapshot.header = header
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    # The rename is durable only once the folder is; some systems refuse this: fine.
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_stale_temps(path: Path, *, min_age_s: float) -> int:
    """Remove temp files of writers that died mid-write; returns how many."""
    removed = 0
    prefix = f".{path.name}."
    now = time.time()
    try:
        names = os.listdir(path.parent)
    except OSError:
        return 0
    for name in names:
        if name.startswith(prefix) and name.endswith(".tmp"):
            full = path.parent / name
            with contextlib.suppress(OSError):
                if now - full.stat().st_mtime >= min_age_s:
                    full.unlink()
                    removed += 1
    return removed


def quarantine(path: Path, why: str) -> str:
    """Move a broken cache file aside; returns a sentence saying where it went."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    try:
        os.replace(path, aside)
    except OSError as exc:
        return f"could not be moved aside ({exc}); it is left in place"
    # Keep the newest few: a file broken again and again must not fill the disk.
    copies = sorted(path.parent.glob(f"{path.name}.corrupt-*"), key=lambda p: p.stat().st_mtime)
    for old in copies[:-KEEP_CORRUPT]:
        with contextlib.suppress(OSError):
            old.unlink()
    return f"moved aside to {aside}"


# --- the store ---------------------------------------------------------------------------

_dirty: weakref.WeakSet[MsgpackFileStore] = weakref.WeakSet()
_atexit_registered = False


def _flush_all() -> None:
    for store in list(_dirty):
        with contextlib.suppress(Exception):
            store.flush()


class MsgpackFileStore:
    """A CacheStore backed by one msgpack file; see the module docstring.

    ``autoflush``: write once this many puts/deletes are pending (1: every put is on
    disk when it returns; 0: only on :meth:`flush`, at the end of :meth:`batch` or
    at exit). ``quarantine``: move a broken file aside (tools reading a file they
    were given say so and leave it). ``refresh_s``: on a miss, look whether another
    process wrote the file at most this often.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        read_only: bool | None = None,
        autoflush: int = 1,
        quarantine: bool = True,
        refresh_s: float | None = 1.0,
        compression: int = 6,
        lock_timeout_s: float | None = None,
    ) -> None:
        self.path = Path(path)
        self.read_only = read_only_requested() if read_only is None else read_only
        self.read_only_reason = "UNIMATMUL_CACHE_READONLY is set" if self.read_only else ""
        self.autoflush = autoflush
        self.quarantine = quarantine
        self.refresh_s = refresh_s
        self.compression = compression
        self.lock_timeout_s = lock_timeout_s
        self._lock = threading.RLock()
        self._snap: Snapshot | None = None
        self._stat: tuple[int, int, int] | None = None
        self._checked_at = 0.0
        self._batch_depth = 0
        # (namespace, key) -> (record, signature of the record it replaces as we saw it)
        self._puts: dict[tuple[str, str], tuple[TuningRecord, Any]] = {}
        self._deletes: dict[tuple[str, str], Any] = {}
        self._platforms: dict[str, dict[str, Any]] = {}
        self.problems: list[str] = []  # what went wrong with the file, for tools

    @property
    def location(self) -> str:
        return str(self.path)

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    # --- reading ------------------------------------------------------------------
    def _file_stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _read(self, *, locked: bool) -> Snapshot:
        """The file as it is now; a broken one is reported, moved aside, and reads as empty."""
        try:
            return self._decode_disk()
        except NewerSchemaError as exc:
            self._refuse_writes(str(exc))
            return Snapshot()
        except CacheFileError as exc:
            return self._broken(str(exc), locked=locked)
        except OSError as exc:
            self.problems.append(f"unreadable: {exc}")
            warn_once(self.path, "unreadable", f"cannot be read ({exc}); using no cached entries")
            return Snapshot()

    def _decode_disk(self) -> Snapshot:
        stat = self._file_stat()
        snap = read_file(self.path)
        self._stat = stat
        if snap.schema > 2:
            self._refuse_writes(
                f"written by a newer unimatmul (schema {snap.schema}); read, never overwritten"
            )
        if snap.bad:
            self.problems.append(f"{len(snap.bad)} unreadable entries skipped")
            warn_once(
                self.path, "bad-entries", f"skipped {len(snap.bad)} unreadable entries; the others are kept"
            )
        return snap

    def _broken(self, why: str, *, locked: bool) -> Snapshot:
        self.problems.append(why)
        if not self.quarantine or self.read_only:
            warn_once(
                self.path, "corrupt", f"unreadable ({why}); left in place; continuing with an empty cache"
            )
            return Snapshot()
        if locked:
            where = quarantine(self.path, why)
        else:
            # Move it aside under the lock, and only if it is still the broken file:
            # another process may have replaced it with a good one meanwhile.
            try:
                with FileLock(self.lock_path, self.lock_timeout_s):
                    try:
                        return self._decode_disk()
                    except NewerSchemaError as exc:
                        self._refuse_writes(str(exc))
                        return Snapshot()
                    except CacheFileError as exc:
                        why = str(exc)
                        where = quarantine(self.path, why)
            except OSError as exc:
                where = f"not moved aside ({exc})"
        warn_once(self.path, "corrupt", f"unreadable ({why}); {where}; continuing with an empty cache")
        return Snapshot()

    def _refuse_writes(self, why: str) -> None:
        if not self.read_only:
            self.read_only = True
            self.read_only_reason = why
        self.problems.append(why)
        warn_once(self.path, "read-only", f"{why}")

    def snapshot(self) -> Snapshot:
        """Everything the store holds now (loaded on first use)."""
        snap = self._snap
        if snap is None:
            with self._lock:
                if self._snap is None:
                    self._snap = self._read(locked=False)
                    self._checked_at = time.monotonic()
                snap = self._snap
        return snap

    def reload(self) -> None:
        """Read the file again at the next access (pending writes are kept)."""
        with self._lock:
            self._snap = None
            if self._puts or self._deletes or self._platforms:
                self._apply_pending(self.snapshot())

    def _refresh_if_changed(self) -> bool:
        """After a miss: whether another process wrote the file since we read it."""
        if self.refresh_s is None:
            return False
        now = time.monotonic()
        if now - self._checked_at < self.refresh_s:
            return False
        with self._lock:
            self._checked_at = now
            if self._file_stat() == self._stat:
                return False
            self.reload()
            return True

    # --- the CacheStore protocol --------------------------------------------------
    def get(self, namespace: str, key: str) -> TuningRecord | None:
        for _ in range(2):
            try:
                found = self.snapshot().get(namespace, key)
            except BadEntry as exc:
                self.problems.append(str(exc))
                warn_once(
                    self.path, "bad-entry", f"{exc}; ignored (`unimatmul cache prune --bad` removes it)"
                )
                return None
            if found is not None or not self._refresh_if_changed():
                return found
        return None

    def items(self, namespace: str | None = None) -> Iterator[tuple[str, str, TuningRecord]]:
        for ns, key, record in iter_records(self.snapshot(), namespace):
            if isinstance(record, BadEntry):
                warn_once(self.path, "bad-entry", f"{record}; ignored")
                continue
            yield ns, key, record

    def count(self) -> int:
        return self.snapshot().count()

    def namespaces(self) -> dict[str, dict[str, Any]]:
        """Every namespace with its platform facts."""
        return {name: dict(ns.platform) for name, ns in sorted(self.snapshot().namespaces.items()) if len(ns)}

    def put(self, namespace: str, key: str, record: TuningRecord) -> None:
        self.put_many({(namespace, key): record})

    def put_many(self, records: dict[tuple[str, str], TuningRecord]) -> None:
        for (_, key), record in records.items():
            check_record(record)
            if "\0" in key:
                msg = f"a cache key may not contain NUL: {key!r}"
                raise ValueError(msg)
        with self._lock:
            snap = self.snapshot()
            for (namespace, key), record in records.items():
                if (namespace, key) not in self._puts:
                    self._puts[(namespace, key)] = (record, self._seen(snap, namespace, key))
                else:
                    self._puts[(namespace, key)] = (record, self._puts[(namespace, key)][1])
                self._deletes.pop((namespace, key), None)
                snap.namespace(namespace).put(key, record)
            self._after_change()

    def delete(self, namespace: str, key: str) -> bool:
        with self._lock:
            snap = self.snapshot()
            ns = snap.namespaces.get(namespace)
            if ns is None or key not in ns:
                return False
            seen = self._seen(snap, namespace, key)
            pending = self._puts.pop((namespace, key), None)
            self._deletes[(namespace, key)] = pending[1] if pending is not None else seen
            ns.delete(key)
            self._after_change()
            return True

    def note_platform(self, namespace: str, facts: dict[str, Any]) -> None:
        """Keep the platform facts of a namespace (written with its next entry)."""
        facts = check_settings(facts)
        with self._lock:
            ns = self.snapshot().namespace(namespace)
            if ns.platform != facts:
                ns.platform = dict(facts)
                self._platforms[namespace] = dict(facts)

    @staticmethod
    def _seen(snap: Snapshot, namespace: str, key: str) -> Any:
        try:
            return record_signature(snap.get(namespace, key))
        except BadEntry:
            return "bad"

    def _apply_pending(self, snap: Snapshot) -> None:
        for (namespace, key), (record, _) in self._puts.items():
            snap.namespace(namespace).put(key, record)
        for namespace, key in self._deletes:
            snap.namespace(namespace).delete(key)
        for namespace, facts in self._platforms.items():
            snap.namespace(namespace).platform = dict(facts)

    def _after_change(self) -> None:
        global _atexit_registered
        pending = len(self._puts) + len(self._deletes)
        if self.autoflush > 0 and self._batch_depth == 0 and pending >= self.autoflush:
            self.flush()
            return
        if pending:
            _dirty.add(self)
            if not _atexit_registered:
                atexit.register(_flush_all)
                _atexit_registered = True

    @contextlib.contextmanager
    def batch(self) -> Iterator[MsgpackFileStore]:
        """Defer writing to the end of the block: one locked read-merge-write for all."""
        with self._lock:
            self._batch_depth += 1
        try:
            yield self
        finally:
            with self._lock:
                self._batch_depth -= 1
                if self._batch_depth == 0:
                    self.flush()

    # --- writing ------------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self._puts) + len(self._deletes)

    def flush(self) -> None:
        """Write pending records now (no-op in read-only mode, which says so once)."""
        with self._lock:
            if not (self._puts or self._deletes):
                return
            if self.read_only:
                # Same kind as _refuse_writes: whichever comes first is the one message.
                warn_once(
                    self.path,
                    "read-only",
                    f"read-only ({self.read_only_reason}): new results are kept in this process only",
                )
                self._clear_pending()
                return
            try:
                self._write_merged()
            except LockTimeout as exc:
                # Keep them: the next flush (or exit) tries again.
                warn_once(self.path, "lock-timeout", f"{exc}; results not written yet")
            except OSError as exc:
                self._refuse_writes(f"cannot be written ({exc}); new results are kept in this process only")
                self._clear_pending()

    def _clear_pending(self) -> None:
        self._puts.clear()
        self._deletes.clear()
        self._platforms.clear()
        _dirty.discard(self)

    def _write_merged(self) -> None:
        if self._replace_file(self._merge_pending) is None:
            self.flush()  # the file turned out to be of a newer schema: say so, keep in memory
        else:
            self._clear_pending()

    def _merge_pending(self, disk: Snapshot) -> Snapshot:
        """Our pending changes applied to the file as another process may have left it."""
        for (namespace, key), (record, seen) in self._puts.items():
            try:
                theirs = disk.get(namespace, key)
            except BadEntry:
                theirs = None
            if theirs is not None and record_signature(theirs) != seen:
                # Someone else tuned this key since we looked: the faster one stays.
                record = faster(theirs, record)
            disk.namespace(namespace).put(key, record)
        for (namespace, key), seen in self._deletes.items():
            theirs_sig: Any
            try:
                theirs_sig = record_signature(disk.get(namespace, key))
            except BadEntry:
                theirs_sig = "bad"
            if theirs_sig == seen or seen == "bad":
                disk.namespace(namespace).delete(key)
            # else: someone stored a new record since we decided to drop the old one.
        for namespace, facts in self._platforms.items():
            disk.namespace(namespace).platform = dict(facts)
        return disk

    def _replace_file(self, change: Callable[[Snapshot], Snapshot]) -> Snapshot | None:
        """Under the lock, write ``change(the file as it is now)``; None if it must not be written."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and not os.access(self.path, os.W_OK):
            raise PermissionError(errno.EACCES, "the file is not writable", str(self.path))
        with FileLock(self.lock_path, self.lock_timeout_s) as lock:
            # Under a real lock no live writer has a temp file open: any there is a
            # dead writer's. Without one, only old ones are.
            real = lock.method in ("flock", "lockf")
            remove_stale_temps(self.path, min_age_s=0.0 if real else STALE_TEMP_S)
            disk = self._read(locked=True)
            if self.read_only:
                return None
            new = change(disk)
            created = disk.header.get("created")
            write_file(
                self.path,
                new,
                level=self.compression,
                created=created if isinstance(created, (int, float)) else None,
            )
            self._snap = new
            self._stat = self._file_stat()
            self._checked_at = time.monotonic()
            return new

    def rewrite(self, change: Callable[[Snapshot], Snapshot]) -> Snapshot:
        """Replace the file by ``change(file as it is now)``, under the lock (prune, merge).

        Pending records are written first; ``change`` sees every other process's
        entries and returns the snapshot to write (usually compacted).
        """
        with self._lock:
            self.flush()
            new = None if self.read_only else self._replace_file(change)
            if new is None:
                msg = f"the cache {self.path} is read-only ({self.read_only_reason})"
                raise PermissionError(errno.EROFS, msg)
            return new
