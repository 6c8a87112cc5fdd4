"""FileLock: one writer at a time on a cache file, across processes and threads.

``UNIMATMUL_CACHE_LOCK_TIMEOUT`` bounds the wait (default 30 s).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

from unimatmul import settings
from unimatmul.core import notices

STALE_LOCKDIR_S = 120.0  # a mkdir lock this old belongs to a dead writer
MAX_POLL_S = 0.005  # between two attempts to take a held lock


def lock_timeout_s() -> float:
    return settings.CACHE_LOCK_TIMEOUT.get()


# --- the lock --------------------------------------------------------------------------


class LockTimeout(OSError):
    """Another writer held the cache lock for longer than the timeout."""


class _Unsupported(Exception):
    pass


_process_locks: dict[str, threading.Lock] = {}
_process_locks_guard = threading.Lock()


def _process_lock(path: Path) -> threading.Lock:
    name = os.path.abspath(path)
    with _process_locks_guard:
        return _process_locks.setdefault(name, threading.Lock())


class FileLock:
    """An advisory exclusive lock on ``path`` that also works on shared file systems.

    ``flock`` first; where the file system refuses it (some NFS, SMB, FUSE mounts),
    POSIX ``lockf``; where that fails too, an atomic ``mkdir`` beside it (a lock
    left by a killed process is broken after a while); where even that fails, no
    lock and a warning. ``method`` says which one is held.

    A lock of this process is taken first: ``lockf`` locks belong to the process,
    not to the descriptor (two threads would both "hold" one, and closing any
    descriptor of the file drops it), so threads must be kept apart here.
    """

    def __init__(self, path: Path, timeout_s: float | None = None) -> None:
        self.path = path
        self.timeout_s = lock_timeout_s() if timeout_s is None else timeout_s
        self.method = ""
        self._fd: int | None = None
        self._inner: threading.Lock | None = None

    def __enter__(self) -> FileLock:
        deadline = time.monotonic() + self.timeout_s
        inner = _process_lock(self.path)
        if not inner.acquire(timeout=max(self.timeout_s, 0.001)):
            msg = f"the cache lock {self.path} was held for more than {self.timeout_s:g} s in this process"
            raise LockTimeout(errno.ETIMEDOUT, msg)
        self._inner = inner
        try:
            return self._enter_os(deadline)
        except BaseException:
            self._release_inner()
            raise

    def _release_inner(self) -> None:
        if self._inner is not None:
            self._inner.release()
            self._inner = None

    def _enter_os(self, deadline: float) -> FileLock:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows
            fcntl = None  # type: ignore[assignment]
        if fcntl is not None:
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except PermissionError:
                # A lock file another user made: flock works on a read-only descriptor.
                self._fd = os.open(self.path, os.O_RDONLY)
            for method, call in (("flock", fcntl.flock), ("lockf", fcntl.lockf)):
                try:
                    self._poll(lambda call=call: call(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB), deadline)
                except _Unsupported:
                    continue
                self.method = method
                return self
        self.method = self._mkdir_lock(deadline)
        return self

    def _poll(self, attempt: Any, deadline: float) -> None:
        delay = 0.001
        while True:
            try:
                attempt()
                return
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise _Unsupported from exc  # ENOLCK, EOPNOTSUPP, EBADF, ...
            if time.monotonic() >= deadline:
                msg = f"the cache lock {self.path} was held for more than {self.timeout_s:g} s"
                raise LockTimeout(errno.ETIMEDOUT, msg)
            time.sleep(delay * random.uniform(0.5, 1.0))
            # A short bound: a waiter that sleeps long misses the moment the holder lets
            # go, and a busier process takes the lock again and again (one waited 30 s).
            delay = min(delay * 2, MAX_POLL_S)

    def _mkdir_lock(self, deadline: float) -> str:
        lockdir = Path(f"{self.path}.d")

        def attempt() -> None:
            try:
                os.mkdir(lockdir)
            except FileExistsError:
                with contextlib.suppress(OSError):
                    if time.time() - lockdir.stat().st_mtime > STALE_LOCKDIR_S:
                        os.rmdir(lockdir)  # its owner died; the next attempt takes it
                raise OSError(errno.EAGAIN, "held") from None

        try:
            self._poll(attempt, deadline)
        except _Unsupported:
            notices.warn_once(
                ("cache", str(self.path), "nolock"),
                f"unimatmul cache {self.path}: no file locking works here; concurrent writers may lose entries",
            )
            return "none"
        return "mkdir"

    def __exit__(self, *exc: object) -> None:
        try:
            if self.method == "mkdir":
                with contextlib.suppress(OSError):
                    os.rmdir(f"{self.path}.d")
            if self._fd is not None:
                with contextlib.suppress(Exception):
                    import fcntl

                    if self.method == "flock":
                        fcntl.flock(self._fd, fcntl.LOCK_UN)
                    elif self.method == "lockf":
                        fcntl.lockf(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
                self._fd = None
        finally:
            self._release_inner()
