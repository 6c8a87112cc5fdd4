"""unimatmul-triton: Triton GEMM kernels as unimatmul candidates.

One hook registers the backends (``triton``, and ``triton_grouped`` for grouped GEMMs:
``grouped.py``); see ``backend.py`` for what they serve and the README for the kernels,
the tuning cost and the native-launch format.
Neither torch nor Triton is imported here: the backend loads them on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unimatmul import hookimpl
from unimatmul_triton.backend import TritonBackend, TritonInterpreterBackend, __version__, make_backend
from unimatmul_triton.grouped import TritonGroupedBackend, TritonGroupedInterpreterBackend

__all__ = [
    "TritonBackend",
    "TritonGroupedBackend",
    "TritonGroupedInterpreterBackend",
    "TritonInterpreterBackend",
    "__version__",
    "make_backend",
    "unimatmul_register_backends",
]


@hookimpl
def unimatmul_register_backends(register: Callable[[Any], None]) -> None:
    dense = make_backend()
    register(dense)
    kind = (
        TritonGroupedInterpreterBackend
        if isinstance(dense, TritonInterpreterBackend)
        else TritonGroupedBackend
    )
    register(kind(dense))
    if not isinstance(dense, TritonInterpreterBackend):
        dense.check_soon()
