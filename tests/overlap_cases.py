"""Calls whose ``out`` overlaps an input, for NumPy arrays and torch tensors alike.

Each case makes fresh operands ``(a, b, out, keywords)`` of a 256x256x256 float32 product
(large enough that oneDNN's blocked kernels read an input while they write ``out``), the
same values for both libraries, so that a call and its library's own call can be compared
on copies. Used by tests/core/test_overlap.py (NumPy) and tests/torch/test_torch_overlap.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

N = 256


def randn(lib: str, rows: int, cols: int, seed: int) -> Any:
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    if lib == "numpy":
        return values
    import torch

    return torch.from_numpy(values)


def _transpose(x: Any) -> Any:
    return x.T if isinstance(x, np.ndarray) else x.t()


def _out_is_a(lib: str) -> tuple[Any, ...]:
    a = randn(lib, N, N, 1)
    return a, randn(lib, N, N, 2), a, {}


def _out_is_b(lib: str) -> tuple[Any, ...]:
    b = randn(lib, N, N, 2)
    return randn(lib, N, N, 1), b, b, {}


def _out_one_row_below_a(lib: str) -> tuple[Any, ...]:
    buf = randn(lib, N + 1, N, 1)
    return buf[:N], randn(lib, N, N, 2), buf[1:], {}


def _out_is_the_storage_of_a_transposed(lib: str) -> tuple[Any, ...]:
    buf = randn(lib, N, N, 1)
    return _transpose(buf), randn(lib, N, N, 2), buf, {}


def _out_columns_overlap_b(lib: str) -> tuple[Any, ...]:
    buf = randn(lib, N, 2 * N, 2)  # b: the left half, out: the middle of one padded buffer
    return randn(lib, N, N, 1), buf[:, :N], buf[:, N // 2 : N // 2 + N], {}


def _out_overlaps_bias(lib: str) -> tuple[Any, ...]:
    out = randn(lib, N, N, 3)
    return randn(lib, N, N, 1), randn(lib, N, N, 2), out, {"bias": out[5]}


CASES: dict[str, Callable[[str], tuple[Any, ...]]] = {
    "out=a": _out_is_a,
    "out=b": _out_is_b,
    "out one row below a": _out_one_row_below_a,
    "out=a.T's storage (view)": _out_is_the_storage_of_a_transposed,
    "out columns overlap b (views)": _out_columns_overlap_b,
    "out overlaps bias": _out_overlaps_bias,
}
