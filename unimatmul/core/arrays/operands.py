"""Operands laid out exactly as a Problem describes them, and what they take."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from unimatmul.core.arrays.adapter import ArrayAdapter, Device
from unimatmul.core.dtypes import ITEMSIZE
from unimatmul.core.problem import Problem


@dataclass
class Operands:
    """One set of inputs and an output laid out exactly as a Problem describes."""

    a: Any
    b: Any
    out: Any
    bias: Any = None


def operand_layouts(problem: Problem) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """(shape, strides) in elements of A, B and C exactly as ``problem`` describes them."""
    m, n, k = problem.m, problem.n, problem.k
    a_stride = (1, problem.lda) if problem.trans_a else (problem.lda, 1)
    b_stride = (1, problem.ldb) if problem.trans_b else (problem.ldb, 1)
    c_stride = (problem.ldc, 1)
    if problem.batch == 1:
        return {"a": ((m, k), a_stride), "b": ((k, n), b_stride), "c": ((m, n), c_stride)}
    bt = problem.batch
    return {
        "a": ((bt, m, k), (problem.stride_a, *a_stride)),
        "b": ((bt, k, n), (problem.stride_b, *b_stride)),
        "c": ((bt, m, n), (problem.stride_c, *c_stride)),
    }


def operand_bytes(problem: Problem) -> int:
    """Bytes one set of operands of ``problem`` takes as :func:`make_operands` allocates
    it (A, B and C at their strides, their alignment offsets, and the bias)."""
    total = 0
    for name, dtype in (("a", problem.dtype_a), ("b", problem.dtype_b), ("c", problem.dtype_c)):
        shape, strides = operand_layouts(problem)[name]
        offset = problem.align // ITEMSIZE[dtype] if problem.align < 16 else 0
        elements = offset + 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
        total += elements * ITEMSIZE[dtype]
    if problem.has_bias:
        total += problem.n * ITEMSIZE[problem.dtype_bias or problem.dtype_c]
    return total


def make_operands(
    problem: Problem,
    adapter: ArrayAdapter,
    device: Device,
    rng: np.random.Generator,
    *,
    fill_out: bool = True,
    with_out: bool = True,
) -> Operands:
    """Random (never zero) operands in the problem's exact layout and pointer alignment.

    ``fill_out=False`` leaves the output uninitialised: when beta is 0 it is never
    read, and drawing random numbers for a large output costs seconds.
    ``with_out=False`` makes no output at all (``out`` is None): new values for inputs
    that already have one.
    """
    layouts = operand_layouts(problem)
    out: dict[str, Any] = {"c": None}
    for name, dtype in (("a", problem.dtype_a), ("b", problem.dtype_b), ("c", problem.dtype_c)):
        if name == "c" and not with_out:
            continue
        shape, strides = layouts[name]
        # Reproduce a misaligned caller (e.g. a view at an odd offset) where the problem says so.
        offset = problem.align // ITEMSIZE[dtype] if problem.align < 16 else 0
        fill = fill_out or name != "c"
        out[name] = adapter.random_strided(shape, strides, dtype, device, rng, offset, fill=fill)
    bias = None
    if problem.has_bias:
        bias = adapter.random_strided((problem.n,), (1,), problem.dtype_bias or problem.dtype_c, device, rng)
    return Operands(out["a"], out["b"], out["c"], bias)
