"""The AMD ROCm backends: hipBLASLt (on the shared Lt driver) and rocBLAS.

Registered through the ``unimatmul`` entry-point group like any third-party plugin
(``rocm = "unimatmul_backends.rocm"``). Both serve torch tensors of a ROCm build of
torch on a HIP device; their libraries (``libhipblaslt.so``, ``librocblas.so``) are
found and loaded on first use, never at import (:mod:`.libraries` has the search
order, ``UNIMATMUL_HIPBLASLT_LIB`` / ``UNIMATMUL_ROCBLAS_LIB`` override it). Without a
HIP device they register anyway and say why through ``availability()``.

Neither backend has run on AMD hardware yet. CI checks them against fake libraries
(``tests/backends/rocm/``) and, without a GPU, against Debian's real
libraries and headers (``tests/amd_real``); ``docs/rocm.md`` says how to verify them
on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unimatmul.backend import hookimpl
from unimatmul_backends.rocm.hipblaslt import HipblasltBackend
from unimatmul_backends.rocm.rocblas import RocblasBackend

__all__ = ["HipblasltBackend", "RocblasBackend", "unimatmul_register_backends"]


@hookimpl
def unimatmul_register_backends(register: Callable[[Any], None]) -> None:
    register(HipblasltBackend())
    register(RocblasBackend())
