"""An example unimatmul plugin: GEMM variants on NumPy arrays through NumPy's BLAS.

The whole plugin interface is one hook: ``unimatmul_register_backends`` hands the
backend to unimatmul. The entry point in pyproject.toml makes unimatmul find this
module; nothing else is needed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unimatmul import hookimpl
from unimatmul_numpy_variants.backend import NumpyVariantsBackend

__all__ = ["NumpyVariantsBackend", "unimatmul_register_backends"]


@hookimpl
def unimatmul_register_backends(register: Callable[[Any], None]) -> None:
    register(NumpyVariantsBackend())
