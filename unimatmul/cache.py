"""The Cache: a bounded in-process LRU in front of a store shared by processes.

The store is anything that follows :class:`CacheStore`; the default is one msgpack
file per user (:mod:`unimatmul.store`). Callers only see this protocol, so the
store can be hardened or replaced without touching them.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from unimatmul.record import TuningRecord

K = TypeVar("K")
V = TypeVar("V")


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

    def flush(self) -> None:
        """Make pending writes durable (stores that write at once do nothing)."""


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

    def flush(self) -> None:
        return None


DEFAULT_LRU_SIZE = 4096


def lru_size(default: int = DEFAULT_LRU_SIZE) -> int:
    """``$UNIMATMUL_LRU_SIZE`` (entries of each in-process map), else ``default``."""
    text = os.environ.get("UNIMATMUL_LRU_SIZE", "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"UNIMATMUL_LRU_SIZE={text!r} is not a positive integer"
        raise ValueError(msg)
    return value


class LRU(Generic[K, V]):
    """A bounded map that forgets the least recently used entry first; thread-safe.

    The bound keeps memory flat however many distinct shapes a process meets; a
    forgotten entry is found again in the store (or tuned again) when it returns.
    """

    def __init__(self, maxsize: int | None = None) -> None:
        if maxsize is None:
            maxsize = lru_size()
        if maxsize < 1:
            msg = f"LRU maxsize must be >= 1, got {maxsize}"
            raise ValueError(msg)
        self.maxsize = maxsize
        self._data: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        # The hot path: one dict lookup plus a move, under a lock held for nanoseconds.
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def peek(self, key: K) -> V | None:
        """A lookup that leaves recency alone and takes no lock (one dict read).

        For the per-call hot path: an entry in use is refreshed only when it is put
        again, so under more distinct keys than the bound, eviction is first-in
        first-out there. Reads are safe against concurrent puts (the GIL makes a
        dict read atomic).
        """
        return self._data.get(key)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


def default_cache_path() -> Path:
    """``$UNIMATMUL_CACHE``, else ``$XDG_CACHE_HOME/unimatmul/cache.msgpack``."""
    explicit = os.environ.get("UNIMATMUL_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "unimatmul" / "cache.msgpack"


def open_store(path: str | os.PathLike[str] | None = None) -> CacheStore:
    """The store at ``path`` (default: :func:`default_cache_path`); ``:memory:`` for none."""
    from unimatmul.store import MsgpackFileStore

    if path is None and os.environ.get("UNIMATMUL_CACHE") == ":memory:":
        return MemoryStore()
    if path is not None and str(path) == ":memory:":
        return MemoryStore()
    return MsgpackFileStore(Path(path) if path is not None else default_cache_path())
