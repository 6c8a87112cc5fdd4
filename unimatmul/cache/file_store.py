"""The default cache store: one msgpack file, shared by processes and sessions for years.

Writes take an advisory lock on a file beside the cache (``<name>.lock``), re-read the
file, merge, and replace it atomically (temp file, fsync, rename, fsync of the
folder): concurrent writers never lose each other's entries, and a process killed
at any moment leaves either the old or the new file. When two processes tuned the
same key, the faster record wins, decided the same way everywhere. Temp files of
killed writers are removed by the next writer. A cache path that is a symlink (to a
team's shared cache, say) is written through: the file it points to is replaced, with
the lock, the temp file and kept copies beside that file, and the link stays a link.

Reading never changes a file. A file that is damaged serves every entry that can still
be read (schema 3 checksums blocks of entries: one damaged byte costs at most one
block), with one warning that says what and where; a file that cannot be read at all
serves none. Either is kept aside, as ``<name>.corrupt-<time>``, by the first write
that replaces it (the newest few copies are kept; ``unimatmul cache recover`` reads them
back). Something that is not a regular file at the path (a FIFO, a folder) is never read
(a FIFO would block) nor replaced; a file of a newer schema is never overwritten.
``UNIMATMUL_CACHE_READONLY=1`` (or a file that cannot be written) means never write;
the first refused write says so once. The format: :mod:`unimatmul.cache.codec` and
docs/cache-format.md.

Durability: by default ``put`` returns once the record is on disk, unless another
process is writing the file at that moment: then the record stays pending (this process
uses it) and the next ``put``, a miss, :meth:`~MsgpackFileStore.flush` or the exit of
the interpreter writes it, so that no writer waits long for the others. With
``autoflush=N`` a store writes every N puts, ``autoflush_s=S`` at most once every S
seconds (what ``unimatmul tune`` sets for its run: each write re-reads, merges and
replaces the whole file, which takes a large cache a tenth of a second), and ``batch()``
defers writing to the end of a block. A process killed before its pending records are
written loses only those.

Whether a write happened: :meth:`~MsgpackFileStore.flush` returns True when nothing is
left unwritten, and False when changes stay in this process only (a read-only cache:
one warning) or are still pending (another process held the lock for longer than
``UNIMATMUL_CACHE_LOCK_TIMEOUT``). A caller whose job is to write (``unimatmul tune``,
``cache import``) calls ``flush(strict=True)``, which raises
:class:`~unimatmul.cache.errors.CacheWriteError` with the reason instead.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import math
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from unimatmul import settings
from unimatmul._version import __version__
from unimatmul.cache.codec import (
    MAX_FILE_BYTES,
    SCHEMA,
    BadEntry,
    CacheFileError,
    NewerSchemaError,
    Snapshot,
    decode_file,
    encode_file,
    iter_records,
)
from unimatmul.cache.errors import CacheWriteError, NotRegularFile
from unimatmul.cache.fields import is_date
from unimatmul.cache.lock import FileLock, LockTimeout
from unimatmul.cache.record import TuningRecord, check_device_state, check_settings
from unimatmul.core import notices
from unimatmul.core.text_input import not_regular_kind

KEEP_CORRUPT = 3  # copies of damaged files kept beside the cache; older ones are removed
STALE_TEMP_S = 600.0  # without a real lock, a temp file this old belongs to a dead writer
# How long a put waits for another process's write before it leaves its record pending
# (flush and exit wait up to UNIMATMUL_CACHE_LOCK_TIMEOUT).
PUT_LOCK_WAIT_S = 0.05

FileStat = tuple[int, int, int, int]


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
    if not is_date(record.tuned_at):
        msg = f"tuned_at {record.tuned_at!r} is not a Unix time in seconds"
        raise ValueError(msg)
    for r in record.results:
        if r.samples < 0:
            msg = f"candidate {r.identity!r} has a negative sample count"
            raise ValueError(msg)


# --- reading and writing whole files ----------------------------------------------------


def read_bytes(path: Path) -> tuple[bytes | None, FileStat | None]:
    """The bytes of the regular file at ``path`` and its identity (None, None when there
    is none). NotRegularFile for anything else: opened without blocking, so that a FIFO
    is refused instead of waiting for a writer that never comes."""
    flags = (
        os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        # Before any file object is made: a folder's would fail with a descriptor number.
        os.close(fd)
        msg = f"{not_regular_kind(st.st_mode)} is at the cache path, not a regular file; it is never read nor replaced"
        raise NotRegularFile(msg)
    with os.fdopen(fd, "rb") as fh:
        if st.st_size > MAX_FILE_BYTES:
            msg = f"{st.st_size} bytes exceed the {MAX_FILE_BYTES} byte limit"
            raise CacheFileError(msg)
        # What the size says (asking for the limit would allocate it on every read).
        data = fh.read(st.st_size + 1)
        if len(data) > MAX_FILE_BYTES:
            msg = f"more than {MAX_FILE_BYTES} bytes"
            raise CacheFileError(msg)
    return data, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def read_file(path: Path, *, verify: bool = True) -> Snapshot:
    """The snapshot in ``path`` (empty when missing); CacheFileError when nothing in it
    can be used (NotRegularFile: not a regular file). Damage that cost some entries is in
    ``Snapshot.damage``."""
    try:
        data, _ = read_bytes(path)
    except MemoryError:
        msg = "reading it ran out of memory"
        raise CacheFileError(msg) from None
    if data is None:
        return Snapshot()
    return decode_file(data, version=__version__, verify=verify)


def write_file(path: Path, snapshot: Snapshot, *, level: int = 6, created: float | None = None) -> None:
    """Write ``snapshot`` to ``path`` atomically (the caller holds the lock; ``path`` is the
    file itself, never a symlink: the temp file is renamed over it in its own folder)."""
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


def kept_copies(path: Path) -> list[Path]:
    """The copies of damaged files kept beside ``path``, oldest first (by the time in
    their name, when they were kept: the file's own mtime says when it was last written)."""

    def when(copy: Path) -> tuple[str, int]:
        stamp, _, n = copy.name.rpartition(".corrupt-")[2].partition("-")
        return (stamp, int(n) if n.isdigit() else 0)

    try:
        return sorted(path.parent.glob(f"{path.name}.corrupt-*"), key=when)
    except OSError:
        return []


def keep_copy(path: Path) -> Path:
    """Keep the file at ``path`` as ``<name>.corrupt-<time>`` before it is replaced (a hard
    link, else a copy); remove the oldest copies beyond KEEP_CORRUPT, never this one.
    OSError if no copy could be kept: then the file must not be replaced."""
    now = time.time()
    # To the microsecond, so that a later copy's name sorts after every earlier one's.
    stamp = time.strftime("%Y%m%dT%H%M%S", time.localtime(now)) + f".{int(now % 1 * 1e6):06d}"
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while aside.exists():
        aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        n += 1
    try:
        os.link(path, aside)
    except OSError:
        shutil.copy2(path, aside)
    for old in [p for p in kept_copies(path) if p != aside][: -(KEEP_CORRUPT - 1) or None]:
        with contextlib.suppress(OSError):
            old.unlink()
    return aside


# --- the store ---------------------------------------------------------------------------


# Stores with changes not written yet, held (not weakly) until they are: a store dropped
# while another process was writing still writes its records, at the latest at exit.
class _Unwritten:
    """The stores with changes not written yet, and whether their flush at exit is registered."""

    def __init__(self) -> None:
        self.stores: set[MsgpackFileStore] = set()
        self.at_exit = False

    def add(self, store: MsgpackFileStore) -> None:
        self.stores.add(store)
        if not self.at_exit:
            atexit.register(self.flush_all)
            self.at_exit = True

    def discard(self, store: MsgpackFileStore) -> None:
        self.stores.discard(store)

    def flush_all(self) -> None:
        for store in list(self.stores):
            with contextlib.suppress(Exception):
                store.flush()


_dirty = _Unwritten()


class MsgpackFileStore:
    """A CacheStore backed by one msgpack file; see the module docstring.

    ``autoflush``: write once this many puts/deletes are pending (1: every put is
    written when it returns, unless another process is writing; 0: only on
    :meth:`flush`, at the end of :meth:`batch` or at exit). ``autoflush_s`` (an
    attribute, None by default): besides, write no more often than once in this many
    seconds; the changes in between stay pending (this process uses them) and go with
    the next write, :meth:`flush` or the exit. ``refresh_s``: on a miss, look whether
    another process wrote the file at most this often.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        read_only: bool | None = None,
        autoflush: int = 1,
        refresh_s: float | None = 1.0,
        compression: int = 6,
        lock_timeout_s: float | None = None,
    ) -> None:
        self.path = Path(path)
        self.read_only = read_only_requested() if read_only is None else read_only
        # Why: the setting only when it is what made the store read-only (a reading
        # command opens its store so, and must not blame a setting that is not set).
        self._opened_read_only = read_only is True
        self.read_only_reason = (
            "opened for reading only"
            if self._opened_read_only
            else "UNIMATMUL_CACHE_READONLY is set"
            if self.read_only
            else ""
        )
        self.autoflush = autoflush
        self.autoflush_s: float | None = None
        self._written_at = -math.inf  # time.monotonic() of this store's last write
        self.refresh_s = refresh_s
        self.compression = compression
        self.lock_timeout_s = lock_timeout_s
        self._lock = threading.RLock()
        self._snap: Snapshot | None = None
        self._stat: FileStat | None = None
        self._checked_at = 0.0
        self._batch_depth = 0
        # (namespace, key) -> (record, signature of the record it replaces as we saw it)
        self._puts: dict[tuple[str, str], tuple[TuningRecord, Any]] = {}
        self._deletes: dict[tuple[str, str], Any] = {}
        self._platforms: dict[str, dict[str, Any]] = {}
        self.problems: list[str] = []  # what went wrong with the file, for tools
        # Changes this store could not write and keeps in this process only (read-only).
        self.unwritten = 0
        self.kept: list[Path] = []  # copies of damaged files this store kept before replacing them

    @property
    def location(self) -> str:
        return str(self.path)

    @property
    def target(self) -> Path:
        """The file itself: ``path``, or what the symlink at ``path`` points to."""
        return Path(os.path.realpath(self.path))

    @property
    def lock_path(self) -> Path:
        target = self.target
        return target.with_name(target.name + ".lock")

    # --- reading ------------------------------------------------------------------
    def _file_stat(self) -> FileStat | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def _read(self) -> Snapshot:
        """The file as it is now. Never changes it: damage is reported (once), and what can
        be read is used; a file that cannot be read at all reads as empty."""
        try:
            return self._decode_disk()
        except (NewerSchemaError, NotRegularFile) as exc:
            self._refuse_writes(str(exc))
            return Snapshot()
        except CacheFileError as exc:
            self.problems.append(f"unreadable: {exc}")
            warn_once(
                self.path, "corrupt", f"unreadable ({exc}); continuing without its entries; {self._fate()}"
            )
            return Snapshot(unreadable=str(exc))
        except OSError as exc:
            # A file that exists but cannot be read (permissions, I/O) must not be replaced.
            self._refuse_writes(f"it cannot be read ({exc}): no cached entries, and it is never replaced")
            return Snapshot()
        except MemoryError:
            why = "reading it ran out of memory"
            self.problems.append(f"unreadable: {why}")
            warn_once(
                self.path, "corrupt", f"unreadable ({why}); continuing without its entries; {self._fate()}"
            )
            return Snapshot(unreadable=why)

    def _fate(self) -> str:
        """What becomes of a damaged file: a sentence for the one warning."""
        if self.read_only:
            return "it is left in place"
        return f"the next write keeps it aside as {self.target.name}.corrupt-<time> before it replaces it"

    def _decode_disk(self) -> Snapshot:
        data, stat_now = read_bytes(self.path)
        # Remembered even if the file turns out to be broken: it is not read again
        # (a compression bomb costs once) until it changes.
        self._stat = stat_now
        if data is None:
            return Snapshot()
        snap = decode_file(data, version=__version__)
        if snap.schema > SCHEMA:
            self._refuse_writes(
                f"it was written by a newer unimatmul (schema {snap.schema}): never overwritten"
            )
        if snap.bad:
            self.problems.append(f"{len(snap.bad)} unreadable entries skipped")
            warn_once(
                self.path, "bad-entries", f"skipped {len(snap.bad)} unreadable entries; the others are kept"
            )
        if snap.damage:
            lost = f"{snap.lost} entries lost" if snap.lost else "some entries may be lost"
            more = f" (and {len(snap.damage) - 1} more)" if len(snap.damage) > 1 else ""
            self.problems.extend(snap.damage)
            warn_once(
                self.path,
                "damaged",
                f"damaged: {snap.damage[0]}{more}; {lost}, the {snap.count()} others are used; {self._fate()}",
            )
        if snap.unread:
            self.problems.extend(snap.unread)
            more = f" (and {len(snap.unread) - 1} more)" if len(snap.unread) > 1 else ""
            warn_once(
                self.path,
                "unread",
                f"{snap.unread[0]}{more}: its entries are not used here, and every write keeps them",
            )
        if snap.problems:
            self.problems.extend(snap.problems)
            warn_once(self.path, "fields", f"malformed fields ignored: {'; '.join(snap.problems[:3])}")
        return snap

    def _refuse_writes(self, why: str) -> None:
        if not self.read_only or self._opened_read_only:
            self.read_only = True
            self.read_only_reason = why
        self.problems.append(why)
        self._say_read_only()

    def _say_read_only(self) -> None:
        # One message per file, whichever comes first: the refusal or the first kept write.
        warn_once(
            self.path,
            "read-only",
            f"read-only ({self.read_only_reason}): new results are kept in this process only",
        )

    def snapshot(self) -> Snapshot:
        """Everything the store holds now (loaded on first use)."""
        snap = self._snap
        if snap is None:
            with self._lock:
                if self._snap is None:
                    self._snap = self._read()
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
        """After a miss: whether another process wrote the file since we read it (and a
        chance to write records left pending while another process was writing)."""
        if self.refresh_s is None:
            return False
        now = time.monotonic()
        if now - self._checked_at < self.refresh_s:
            return False
        with self._lock:
            self._checked_at = now
            if self.pending and not self._batch_depth and self._write_due():
                self._flush(wait_s=0.0, strict=False)
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
        pending = len(self._puts) + len(self._deletes)
        if self.autoflush > 0 and self._batch_depth == 0 and pending >= self.autoflush and self._write_due():
            # A short wait: while another process writes, the records stay pending.
            self._flush(wait_s=PUT_LOCK_WAIT_S, strict=False)
        if self.pending:
            _dirty.add(self)

    def _write_due(self) -> bool:
        """Whether a write on its own (a put's, a miss's) may be made now: ``autoflush_s``
        seconds or more since this store's last write, or no such interval."""
        return self.autoflush_s is None or time.monotonic() - self._written_at >= self.autoflush_s

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

    def flush(self, *, strict: bool = False) -> bool:
        """Write pending changes now, waiting up to the lock timeout for other writers.

        True when every change made through this store is on disk. False when changes
        stay in this process only (a read-only cache: one warning; ``unwritten`` counts
        them, also those of earlier puts) or are still pending (the lock was held too
        long: one warning; the next write or the exit tries again). ``strict=True``
        raises :class:`CacheWriteError` with the reason instead of returning False.
        """
        return self._flush(wait_s=None, strict=strict)

    def _flush(self, *, wait_s: float | None, strict: bool) -> bool:
        with self._lock:
            if self.pending and not self.read_only:
                try:
                    if self._replace_file(self._merge_pending, wait_s=wait_s) is not None:
                        self._clear_pending()
                        self._written_at = time.monotonic()
                except LockTimeout as exc:
                    if strict:
                        why = f"{exc}; {self.pending} changes are still pending"
                        raise CacheWriteError(str(self.path), why, errno.ETIMEDOUT) from exc
                    if wait_s is None:
                        # Kept: the next write (or the exit) tries again.
                        warn_once(self.path, "lock-timeout", f"{exc}; results not written yet")
                    return False
                except OSError as exc:
                    self._refuse_writes(f"it cannot be written ({exc})")
            if self.pending:
                # Read-only, or found to be so under the lock (a newer schema, a file that
                # cannot be written): the changes live in this process only.
                self.unwritten += self.pending
                self._clear_pending()
                if not strict:  # a strict caller hears it from the error
                    self._say_read_only()
            if self.unwritten and strict:
                why = f"{self.read_only_reason}; {self.unwritten} changes kept in this process only"
                raise CacheWriteError(str(self.path), why)
            return not self.unwritten

    def _clear_pending(self) -> None:
        self._puts.clear()
        self._deletes.clear()
        self._platforms.clear()
        _dirty.discard(self)

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

    def _replace_file(
        self, change: Callable[[Snapshot], Snapshot], *, wait_s: float | None = None
    ) -> Snapshot | None:
        """Under the lock, write ``change(the file as it is now)``; None if it must not be
        written. A damaged file is kept aside first (keep_copy): what it still holds that
        the new file will not (damaged blocks, unreadable entries) stays on disk."""
        target = self.target  # a symlink is written through, never replaced by a file
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() and not os.access(target, os.W_OK):
            raise PermissionError(errno.EACCES, "the file is not writable", str(target))
        if not os.access(target.parent, os.W_OK | os.X_OK):
            # Said here: the lock, the temp file and the new file all need the folder (the
            # lock's open would otherwise be what fails, blaming a missing lock file).
            raise PermissionError(errno.EACCES, "the folder is not writable", str(target.parent))
        timeout = self.lock_timeout_s if wait_s is None else wait_s
        with FileLock(self.lock_path, timeout) as lock:
            # Under a real lock no live writer has a temp file open: any there is a
            # dead writer's. Without one, only old ones are.
            real = lock.method in ("flock", "lockf")
            remove_stale_temps(target, min_age_s=0.0 if real else STALE_TEMP_S)
            disk = self._read()
            if self.read_only:
                return None
            new = change(disk)
            if disk.damaged and target.exists():
                try:
                    kept = keep_copy(target)
                except OSError as exc:
                    msg = f"a copy of the damaged file could not be kept ({exc}), so it is not replaced"
                    raise OSError(exc.errno, msg) from exc
                self.kept.append(kept)
                self.problems.append(f"the damaged file was kept as {kept}")
                warn_once(self.path, "kept", f"the damaged file was kept as {kept} before it was replaced")
            created = disk.header.get("created")
            write_file(
                target, new, level=self.compression, created=created if isinstance(created, float) else None
            )
            self._snap = new
            self._stat = self._file_stat()
            self._checked_at = time.monotonic()
            return new

    def rewrite(self, change: Callable[[Snapshot], Snapshot]) -> Snapshot:
        """Replace the file by ``change(file as it is now)``, under the lock (prune, merge,
        recover). Pending records are written first; ``change`` sees every other process's
        entries and returns the snapshot to write (usually compacted). CacheWriteError
        when the file must not or cannot be written."""
        with self._lock:
            self.flush(strict=True)
            try:
                new = None if self.read_only else self._replace_file(change)
            except LockTimeout as exc:
                raise CacheWriteError(str(self.path), str(exc), errno.ETIMEDOUT) from exc
            except OSError as exc:
                raise CacheWriteError(str(self.path), str(exc), exc.errno or errno.EIO) from exc
            if new is None:
                raise CacheWriteError(str(self.path), self.read_only_reason)
            return new
