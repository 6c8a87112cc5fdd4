"""Modes: what a call with an unseen problem does (off, cached, tune, record).

The mode comes from ``UNIMATMUL_MODE`` (declared in :mod:`unimatmul.settings`) and is
overridden in code by ``with mode(...)`` blocks (this thread or task only).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from unimatmul import settings
from unimatmul.settings import MODES, SettingError

DEFAULT_MODE = settings.MODE.default

_mode: contextvars.ContextVar[str | None] = contextvars.ContextVar("unimatmul_mode", default=None)


def check_mode(name: str) -> str:
    if name not in MODES:
        msg = f"unknown unimatmul mode {name!r}; valid modes: {', '.join(MODES)}"
        raise ValueError(msg)
    return name


def _env_value(text: str) -> str:
    try:
        return check_mode(text)
    except ValueError:
        msg = f"unknown unimatmul mode {text!r} in {settings.MODE.name}; valid modes: {', '.join(MODES)}"
        raise SettingError(msg, name=settings.MODE.name) from None


# Raw UNIMATMUL_MODE text -> mode: every cached matmul call reads the variable, and
# parsing it each time cost as much as the rest of the lookup.
_env_modes: dict[str, str] = {}


# os.environ.get encodes the key and decodes the value on every call (~0.3 us); the
# mapping underneath it is a plain dict that setenv/putenv through os.environ keep
# current, so reading it directly sees every change at a tenth of the cost.
try:
    _environ: Any = os.environ
    _env_data: Any = _environ._data
    _mode_key: Any = _environ.encodekey(settings.MODE.name)
    _decode: Any = _environ.decodevalue
except AttributeError:  # pragma: no cover - another Python
    _env_data, _mode_key, _decode = os.environ, settings.MODE.name, str


def env_mode() -> str:
    """``UNIMATMUL_MODE`` (off, cached, tune, record), default ``cached``."""
    raw = _env_data.get(_mode_key, "")
    found = _env_modes.get(raw)
    if found is None:
        text = (_decode(raw) if raw else "").strip().lower()
        found = _env_value(text) if text else DEFAULT_MODE
        _env_modes[raw] = found
    return found


def get_mode() -> str:
    """The mode in force here: the innermost ``mode()`` block, else the environment."""
    value = _mode.get()
    return value if value is not None else env_mode()


@contextlib.contextmanager
def mode(name: str) -> Iterator[None]:
    """Use another mode inside a ``with`` block (this thread or task only).

    ``off``: always Default. ``cached``: use tuned answers, never tune. ``tune``: tune
    unknown problems on first call. ``record``: like cached, and remember every problem
    met so that ``unimatmul tune --from FILE`` can tune them later.
    """
    token = _mode.set(check_mode(name))
    _count_override(1)
    try:
        yield
    finally:
        _mode.reset(token)
        _count_override(-1)


# How many mode() blocks are open, in any thread: the native torch kernels cannot read a
# context variable, so while one is open they hand every call to the Python kernels.
class _OpenBlocks:
    """The count of open mode() blocks and the listeners told when it changes."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()
        self.listeners: list[Callable[[int], None]] = []


_open = _OpenBlocks()


def overrides() -> int:
    return _open.count


def on_overrides(listener: Callable[[int], None], remove: bool = False) -> None:
    """Call ``listener(count)`` whenever the number of open mode() blocks changes."""
    with _open.lock:
        if remove:
            if listener in _open.listeners:
                _open.listeners.remove(listener)
        elif listener not in _open.listeners:
            _open.listeners.append(listener)


def _count_override(step: int) -> None:
    with _open.lock:  # listeners called under the lock: they see the counts in order
        _open.count += step
        for listener in _open.listeners:
            listener(_open.count)
