"""``warn_once``: the one way unimatmul tells the user about something it handled.

A failure that unimatmul contains (a backend that fails, a broken cache file, a
kernel that fails on a call) is reported once per cause, never per call, as a
``RuntimeWarning`` that starts with ``unimatmul``. ``seen`` scopes "once": the
process (the default) or an object's own set (a Selector warns again after it is
replaced, e.g. in tests).
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Hashable

_seen: set[Hashable] = set()
_lock = threading.Lock()


def warn_once(key: Hashable, message: str, *, seen: set[Hashable] | None = None, stacklevel: int = 3) -> bool:
    """Warn ``message`` unless a warning with ``key`` was given before; True if warned."""
    scope = _seen if seen is None else seen
    with _lock:
        if key in scope:
            return False
        scope.add(key)
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)
    return True


def forget() -> None:
    """Forget every process-wide warning given (tests that expect one again)."""
    with _lock:
        _seen.clear()


def size_text(nbytes: float) -> str:
    """A byte count as people read it, in binary units: ``512 B``, ``1.5 MiB``, ``106.6 PiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024:
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} PiB"
