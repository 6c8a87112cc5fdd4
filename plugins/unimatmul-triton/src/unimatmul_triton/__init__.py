"""unimatmul-triton: Triton GEMM kernels as unimatmul candidates.

One hook registers the backend (``triton``); see ``backend.py`` for what it serves
and the README for the kernels, the tuning cost and the native-launch format.
Neither torch nor Triton is imported here: the backend loads them on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unimatmul import hookimpl
from unimatmul_triton.backend import TritonBackend, TritonInterpreterBackend, __version__, make_backend

__all__ = [
    "TritonBackend",
    "TritonInterpreterBackend",
    "__version__",
    "make_backend",
    "unimatmul_register_backends",
]


@hookimpl
def unimatmul_register_backends(register: Callable[[Any], None]) -> None:
    register(make_backend())
