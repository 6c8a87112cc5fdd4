"""The store protocol: where tuning records live between processes.

The store is anything that follows :class:`CacheStore`; the default is one msgpack
file per user (:mod:`unimatmul.cache.file_store`). Callers only see this protocol, so the
store can be hardened or replaced without touching them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from unimatmul import settings
from unimatmul.cache.file_store import MsgpackFileStore
from unimatmul.cache.record import TuningRecord


class CacheStore(Protocol):
    """Where tuning records live between processes, keyed by (namespace, problem key)."""

    @property
    def location(self) -> str: ...

    def get(self, namespace: str, key: str) -> TuningRecord | None: ...

    def put(self, namespace: str, key: str, record: TuningRecord) -> None: ...

    def delete(self, namespace: str, key: str) -> bool: ...

    def items(self, namespace: str | None = None) -> Iterator[tuple[str, str, TuningRecord]]: ...

    def count(self) -> int: ...

    def note_platform(self, namespace: str, facts: dict[str, Any]) -> None:
        """Keep a namespace's platform facts (vendor, arch, library versions) once."""

    def flush(self, *, strict: bool = False) -> bool:
        """Make pending writes durable; whether nothing is left unwritten. ``strict``:
        raise :class:`~unimatmul.cache.errors.CacheWriteError` instead of returning False."""


class MemoryStore:
    """A store that lives and dies with the process (tests, ``UNIMATMUL_CACHE=:memory:``)."""

    def __init__(self) -> None:
        self._data: dict[str, dict[str, TuningRecord]] = {}
        self.platforms: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    @property
    def location(self) -> str:
        return ":memory:"

    def get(self, namespace: str, key: str) -> TuningRecord | None:
        return self._data.get(namespace, {}).get(key)

    def put(self, namespace: str, key: str, record: TuningRecord) -> None:
        with self._lock:
            self._data.setdefault(namespace, {})[key] = record

    def delete(self, namespace: str, key: str) -> bool:
        with self._lock:
            return self._data.get(namespace, {}).pop(key, None) is not None

    def items(self, namespace: str | None = None) -> Iterator[tuple[str, str, TuningRecord]]:
        for ns, entries in list(self._data.items()):
            if namespace is None or ns == namespace:
                for key, record in list(entries.items()):
                    yield ns, key, record

    def count(self) -> int:
        return sum(len(entries) for entries in self._data.values())

    def note_platform(self, namespace: str, facts: dict[str, Any]) -> None:
        with self._lock:
            self.platforms[namespace] = dict(facts)

    def flush(self, *, strict: bool = False) -> bool:
        return True  # nothing outlives the process, and nothing was promised to


def default_cache_path() -> Path:
    """``$UNIMATMUL_CACHE``, else ``$XDG_CACHE_HOME/unimatmul/cache.msgpack``."""
    explicit = settings.CACHE.get()
    if explicit:
        return Path(explicit).expanduser()
    return default_cache_folder() / "cache.msgpack"


def default_cache_folder() -> Path:
    """``$XDG_CACHE_HOME/unimatmul`` (``~/.cache/unimatmul``): where unimatmul keeps its files."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "unimatmul"


def open_store(path: str | os.PathLike[str] | None = None) -> CacheStore:
    """The store at ``path`` (default: :func:`default_cache_path`); ``:memory:`` for none."""
    if path is None and settings.CACHE.get() == ":memory:":
        return MemoryStore()
    if path is not None and str(path) == ":memory:":
        return MemoryStore()
    return MsgpackFileStore(Path(path) if path is not None else default_cache_path())
