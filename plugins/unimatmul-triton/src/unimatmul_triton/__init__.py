"""unimatmul-triton: Triton GEMM kernels as unimatmul candidates.

One hook registers the backends (``triton``, and ``triton_grouped`` for grouped GEMMs:
``grouped.py``); see ``backend.py`` for what they serve and the README for the kernels,
the tuning cost and the native-launch format.
Neither torch nor Triton is imported here, nor the backends until they are registered or
named (PEP 562): a compile process (``compile_worker.py``) imports only what compiles.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from unimatmul import hookimpl

if TYPE_CHECKING:
    from unimatmul_triton.backend import TritonBackend, TritonInterpreterBackend, __version__, make_backend
    from unimatmul_triton.grouped import (
        TritonGroupedBackend,
        TritonGroupedInterpreterBackend,
        make_grouped_backend,
    )

_EXPORTS: dict[str, str] = {
    "TritonBackend": "unimatmul_triton.backend",
    "TritonInterpreterBackend": "unimatmul_triton.backend",
    "__version__": "unimatmul_triton.backend",
    "make_backend": "unimatmul_triton.backend",
    "TritonGroupedBackend": "unimatmul_triton.grouped",
    "TritonGroupedInterpreterBackend": "unimatmul_triton.grouped",
    "make_grouped_backend": "unimatmul_triton.grouped",
}

__all__ = [
    "TritonBackend",
    "TritonGroupedBackend",
    "TritonGroupedInterpreterBackend",
    "TritonInterpreterBackend",
    "__version__",
    "make_backend",
    "make_grouped_backend",
    "unimatmul_register_backends",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


@hookimpl
def unimatmul_register_backends(register: Callable[[Any], None]) -> None:
    from unimatmul_triton.backend import TritonInterpreterBackend, make_backend
    from unimatmul_triton.grouped import make_grouped_backend

    dense = make_backend()
    register(dense)
    register(make_grouped_backend(dense))
    if not isinstance(dense, TritonInterpreterBackend):
        dense.check_soon()
