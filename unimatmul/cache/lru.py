"""LRU: the bounded in-process map in front of the store (and of every per-call table).

The bound keeps memory flat however many distinct shapes a process meets; a
forgotten entry is found again in the store (or tuned again) when it returns.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, TypeVar

from unimatmul import settings

K = TypeVar("K")
V = TypeVar("V")


DEFAULT_LRU_SIZE = 4096


def lru_size(default: int = DEFAULT_LRU_SIZE) -> int:
    """``$UNIMATMUL_LRU_SIZE`` (entries of each in-process map), else ``default``."""
    value = settings.LRU_SIZE.get()
    return default if value is None else value


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
