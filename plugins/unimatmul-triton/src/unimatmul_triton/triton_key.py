"""Triton's key, kept between processes.

Every Triton compile's cache key starts with ``triton_key()``: Triton's version and the
SHA-256 of its front end, its compiler and backend modules, its language modules and its
400 MB ``libtriton``. Triton computes it once per process, on the first compile, warm
cache or not: about half a second of hashing in every process that compiles (each compile
worker included), most of a first tuning's wait where the kernels are already cached.

:func:`install` replaces ``triton.runtime.cache.triton_key`` (the name Triton's compile
looks up when it builds a key) by one that returns the same string, read from a small
file kept under unimatmul's folder (``$XDG_CACHE_HOME/unimatmul/triton-key``). The file's
name is a fingerprint of every file the key hashes: its path, size, inode, modification
and change times (a change time cannot be set back, so a rewritten file, a reinstall or
an upgrade gives a new name). Where the file is missing, the real ``triton_key()`` runs
once and its result is written (atomically: a temporary file renamed into place) for the
next process. The value is Triton's own, so the keys, and Triton's cache, are the same
as without it.

``UNIMATMUL_TRITON_KEY_MEMO=0`` leaves Triton's function alone. A key file that cannot be
read or written only costs the hashing.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from unimatmul_triton.settings import KEY_MEMO

#: The folders of the Triton package whose files ``triton_key()`` hashes (with
#: ``runtime/cache.py``): every file in them goes into the fingerprint.
HASHED_FOLDERS = ("compiler", "backends", "language", "_C")

_lock = threading.Lock()
_installed: list[Callable[[], str]] = []


def fingerprint(triton_root: Path) -> str:
    """A hex digest of the path, size, inode, modification and change time of every file
    ``triton_key()`` reads under ``triton_root`` (the ``triton`` package's folder); a stat
    walk of a few hundred files, about 2 ms."""
    h = hashlib.sha256(str(triton_root).encode())
    paths = [triton_root / "runtime" / "cache.py"]
    for folder in HASHED_FOLDERS:
        for root, dirs, files in os.walk(triton_root / folder):
            dirs.sort()
            paths.extend(Path(root) / f for f in sorted(files))
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            continue
        h.update(
            f"\0{path.relative_to(triton_root)}\0{st.st_size}\0{st.st_ino}\0{st.st_mtime_ns}\0{st.st_ctime_ns}".encode()
        )
    return h.hexdigest()


def key_file(triton_root: Path, version: str) -> Path:
    """Where the key of the Triton installed at ``triton_root`` is kept."""
    from unimatmul.backend import default_cache_folder

    return default_cache_folder() / "triton-key" / f"{version}-{fingerprint(triton_root)[:40]}.key"


def kept_key(compute: Callable[[], str], path: Path, version: str) -> str:
    """The key kept at ``path`` (a file written by this function), else ``compute()``'s,
    written there for later processes. A file that does not hold a key of ``version``
    is not used."""
    try:
        kept = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        kept = ""
    if kept.startswith(version) and kept.endswith("\n"):
        return kept[:-1]
    key = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".key")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(key + "\n")
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass  # the next process hashes again
    return key


def install() -> bool:
    """Make Triton's compile read its key from the kept file (once per process; see the
    module docstring). False where ``UNIMATMUL_TRITON_KEY_MEMO=0``, or where this Triton
    has no ``triton.runtime.cache.triton_key`` to replace (its own function then runs)."""
    if not KEY_MEMO.get():
        return False
    with _lock:
        if _installed:
            return True
        try:
            import triton
            from triton.runtime import cache
        except ImportError:
            return False
        original = getattr(cache, "triton_key", None)
        if original is None or not callable(original):
            return False
        root = Path(triton.__file__).resolve().parent
        version = str(triton.__version__)

        @functools.cache
        def triton_key() -> str:
            return kept_key(original, key_file(root, version), version)

        cache.triton_key = triton_key
        _installed.append(original)
        return True
