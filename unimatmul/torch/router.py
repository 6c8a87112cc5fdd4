"""A routed door's place at PyTorch's dispatcher: its call table, the ``torch.library``
that holds its kernels, the mode read at install, and the native table serving its keys.

``routing.py`` (mm, bmm, addmm, baddbmm) and ``scaled_routing.py`` (``_scaled_mm``) each
keep one :class:`Router`; installing and removing kernels is done here, once.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from unimatmul.calls import CallTable
from unimatmul.core import modes
from unimatmul.torch import native


class Router:
    """One routed door: ``table`` (its plans), ``library`` (None while not installed),
    ``env_mode`` (``UNIMATMUL_MODE`` at install), ``native_keys`` (the dispatch keys its
    native kernels serve) and ``kept`` (the kernels their table points into: one
    generation more after the table is emptied, for the process's life where a CUDA
    graph captured their call)."""

    def __init__(self, op: str, max_plans: int, native_table: int | None = None) -> None:
        self.table = CallTable(op, max_plans)
        self.native_table = native_table
        self.library: Any = None
        self.env_mode = "cached"
        self.native_keys: tuple[str, ...] = ()
        self.kept: native.Kept | None = None

    def install(
        self,
        register: Callable[[Any, tuple[str, ...]], None],
        native_keys: Callable[[], tuple[str, ...]] = tuple,
        native_install: Callable[[tuple[str, ...], str, int], None] | None = None,
    ) -> None:
        """Register the door's kernels (idempotent): ``register(library, native_keys)`` puts
        the Python kernels at the keys the native ones do not serve, ``native_install``
        the native kernels at theirs (a door without native kernels gives neither)."""
        with self.table.lock:
            if self.library is not None:
                return
            self.env_mode = modes.env_mode()
            keys = native_keys()
            library = torch.library.Library("aten", "IMPL")
            try:
                with warnings.catch_warnings():
                    # PyTorch warns that a kernel is overridden: that is the point here.
                    warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
                    register(library, keys)
                    if keys and native_install is not None:
                        native_install(keys, self.env_mode, modes.overrides())
            except Exception:
                library._destroy()
                raise
            self.library = library
            if keys and native_install is not None:
                self._serve_natively(keys)

    def load_native(
        self,
        native_install: Callable[[tuple[str, ...], str, int], None],
        allowed: tuple[str, ...] = ("CPU", "CUDA"),
        warn: bool = False,
    ) -> tuple[str, ...]:
        """The dispatch keys the door's native kernels take now: those of ``allowed`` that
        ``UNIMATMUL_TORCH_NATIVE`` wants; () while the build runs in the background (the
        kernels take the keys over once it is loaded: :meth:`take_native`), () where it
        failed (``warn``: say why, once)."""
        keys = tuple(key for key in native.wanted_keys() if key in allowed)
        if not keys:
            return ()
        cuda = "CUDA" in keys
        if native.load(cuda, later=lambda: self.take_native(keys, native_install)):
            return keys
        if warn and native.failure(cuda):
            native.warn_failed(cuda)
        return ()

    def take_native(
        self, keys: tuple[str, ...], native_install: Callable[[tuple[str, ...], str, int], None]
    ) -> None:
        """A build made in the background is loaded: its kernels take ``keys`` over from the
        Python kernels, which stay registered beneath them (a call in flight there finishes)
        until :meth:`uninstall`; the plans start over, so that each key's entry goes into
        the native table."""
        with self.table.lock:
            if self.library is None or self.native_keys:
                return
            native_install(keys, self.env_mode, modes.overrides())
            self._serve_natively(keys)
            self.table.clear()

    def _serve_natively(self, keys: tuple[str, ...]) -> None:
        """The native kernels serve ``keys`` now: their table's calls count in the door's
        (lock held)."""
        assert self.native_table is not None  # only a door with native kernels gets here
        self.native_keys = keys
        if self.kept is None:
            self.kept = native.Kept(self.native_table)
        self.table.native = self.kept
        modes.on_overrides(self._overrides)

    def _overrides(self, count: int) -> None:
        native.configure(self.env_mode, count)

    def uninstall(self, native_uninstall: Callable[[], None] | None = None) -> None:
        """Give the door's ops back to PyTorch and forget every plan."""
        with self.table.lock:
            if self.native_keys and native_uninstall is not None:
                native_uninstall()
                modes.on_overrides(self._overrides, remove=True)
            if self.library is not None:
                self.library._destroy()
                self.library = None
            self.table.clear()
            self.table.native = None
            self.native_keys = ()
