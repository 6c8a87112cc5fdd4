"""The NVIDIA cuBLASLt backend, on the shared Lt driver (nvmath-python bindings or ctypes).

Registered through the ``unimatmul`` entry-point group like any third-party plugin.
The library is loaded on first use, never at import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unimatmul.backend import hookimpl
from unimatmul_backends.cuda.backend import CublasLtBackend

__all__ = ["CublasLtBackend", "unimatmul_register_backends"]


@hookimpl
def unimatmul_register_backends(register: Callable[[Any], None]) -> None:
    register(CublasLtBackend())
