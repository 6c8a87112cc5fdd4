"""The oneDNN backend: every matmul implementation oneDNN offers on this CPU.

Registered through the ``unimatmul`` entry-point group like any third-party plugin.
The library (``libdnnl`` from the ``onednn-cpu-gomp`` wheel -- oneDNN 3.2, the ``cpu``
extra -- or the ``onednn`` wheel -- oneDNN 3.13, the ``cpu-sycl`` extra -- or
``$UNIMATMUL_DNNL_LIB``) is loaded on first use, never at import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unimatmul.backend import hookimpl
from unimatmul_backends.onednn.backend import OneDNNBackend

__all__ = ["OneDNNBackend", "unimatmul_register_backends"]


@hookimpl
def unimatmul_register_backends(register: Callable[[Any], None]) -> None:
    register(OneDNNBackend())
