"""Finding cuBLASLt: the nvmath-python bindings or ``libcublasLt`` through ctypes.

Both give an :class:`~unimatmul_backends.lt.driver.LtLibrary`. ``UNIMATMUL_LT_LIBRARY``
picks one (``nvmath``, ``ctypes``); the default, ``auto``, takes nvmath-python's
bindings when they import (their Cython calls cost less host time per call than
ctypes, measured on the H200: see benchmarks/results) and ctypes otherwise.
``UNIMATMUL_CUBLASLT_PATH`` names a library file for the ctypes path.

nvmath-python's package ``__init__`` imports all of nvmath (its FFT and sparse APIs, every
library's bindings, CuPy's preloads): 0.68 s on the H200 machine, paid by a process's
first call of any door. Only the ``cublasLt`` binding is needed, so where nvmath is not
imported yet, :func:`import_binding` imports that one module with its package's
``__init__`` held back, and a later ``import nvmath`` runs the real one (and finds the
binding already loaded).
"""

from __future__ import annotations

import ctypes
import glob
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any

from unimatmul import settings
from unimatmul_backends.lt.abi import LtABI, select_cublaslt_abi
from unimatmul_backends.lt.driver import CtypesLtLibrary, LtDriver, LtLibrary, load_ctypes_library

LIBRARY_KINDS = ("auto", "nvmath", "ctypes")
SONAMES = ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so")


def library_kind() -> str:
    return settings.LT_LIBRARY.get()


def _wheel_paths() -> list[str]:
    """libcublasLt files of the nvidia-cublas wheels (CUDA 13: nvidia/cu13/lib, 12: nvidia/cublas/lib)."""
    found: list[str] = []
    spec = importlib.util.find_spec("nvidia")
    for root in list(spec.submodule_search_locations or []) if spec else []:
        for pattern in ("cu13/lib/libcublasLt.so*", "cublas/lib/libcublasLt.so*", "cu12/lib/libcublasLt.so*"):
            found += sorted(glob.glob(os.path.join(root, pattern)), reverse=True)
    return found


def _pathfinder_path() -> list[str]:
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
    except ImportError:
        return []
    try:
        loaded = load_nvidia_dynamic_lib("cublasLt")
    except Exception:
        return []
    path = getattr(loaded, "abs_path", None)
    return [str(path)] if path else []


def cublaslt_paths() -> list[str]:
    """Where to look for libcublasLt, in order: the explicit path, loaded sonames, wheels, loader."""
    explicit = settings.CUBLASLT_PATH.get()
    paths = [explicit] if explicit else []
    return [*paths, *SONAMES[:2], *_pathfinder_path(), *_wheel_paths(), *SONAMES]


def _select_abi(cdll: ctypes.CDLL) -> LtABI:
    get_version = cdll.cublasLtGetVersion
    get_version.restype = ctypes.c_size_t
    get_version.argtypes = []
    return select_cublaslt_abi(int(get_version()))


def load_ctypes() -> CtypesLtLibrary:
    """libcublasLt through ctypes, bound with the ABI table of its version."""
    return load_ctypes_library(cublaslt_paths(), _select_abi)


def load_nvmath() -> Any:
    """The ``nvmath.bindings.cublasLt`` module (it already has the LtLibrary shape)."""
    found = sys.modules.get("nvmath.bindings.cublasLt") or import_binding("nvmath", "bindings", "cublasLt")
    if found is not None:
        return found
    from nvmath.bindings import cublasLt

    return cublasLt


def import_binding(package: str, *path: str) -> Any:
    """Import ``package.path...`` without running the ``__init__`` of ``package`` or of the
    packages between, which stand as empty packages while it loads (their module locks
    held, so another thread's import of them waits, then runs the real ``__init__``).
    The module, or None where that cannot be done here (``package`` imported already, not
    installed, or the module failed: the caller imports it the plain way)."""
    if package in sys.modules:
        return None
    try:
        from importlib._bootstrap import _ModuleLockManager  # type: ignore[attr-defined]

        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    names = [".".join((package, *path[:i])) for i in range(len(path))]
    locations = [list(spec.submodule_search_locations)]
    for part in path[:-1]:
        locations.append([os.path.join(where, part) for where in locations[-1]])
    locks = [_ModuleLockManager(name) for name in names]
    for lock in locks:
        lock.__enter__()
    stubs: dict[str, types.ModuleType] = {}
    try:
        if any(name in sys.modules for name in names):
            return None  # imported while this waited for the locks
        for name, where in zip(names, locations, strict=True):
            stub = types.ModuleType(name)
            stub.__path__ = where
            stub.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            stub.__spec__.submodule_search_locations = where
            stub.__spec__._initializing = True  # type: ignore[attr-defined]  # others wait on the lock
            stubs[name] = stub
        sys.modules.update(stubs)
        return importlib.import_module(".".join((package, *path)))
    except Exception:
        return None
    finally:
        for name, stub in stubs.items():
            if sys.modules.get(name) is stub:
                del sys.modules[name]
        for lock in reversed(locks):
            lock.__exit__(None, None, None)


def load_driver(kind: str | None = None) -> tuple[LtDriver, str]:
    """A cuBLASLt driver and the name of the library object under it."""
    kind = kind or library_kind()
    errors = []
    order = ("nvmath", "ctypes") if kind == "auto" else (kind,)
    for name in order:
        try:
            lib: LtLibrary = load_nvmath() if name == "nvmath" else load_ctypes()
            abi = select_cublaslt_abi(int(lib.get_version()))
            return LtDriver(abi, lib), name
        except Exception as exc:
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    raise OSError("cuBLASLt could not be loaded (" + "; ".join(errors) + ")")
