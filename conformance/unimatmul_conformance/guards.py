"""Guarded outputs: the output placed inside a bigger buffer full of canaries.

A kernel that writes one element too many (past a row, into the padding between rows
when ``ldc > n``, between batches, before or after the matrix) changes a canary; a
kernel that skips an element leaves the poison it was given. Both are exact bit
patterns (NaNs with a payload of our own), so neither can be mistaken for a value
the kernel computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from unimatmul.core.arrays import ArrayAdapter, Device, operand_layouts
from unimatmul.core.dtypes import ITEMSIZE
from unimatmul.core.problem import Problem

# NaN bit patterns by dtype. The poison fills the output before a run, the canary
# fills everything around it. FP8 e4m3fn has only two NaNs (0x7F, 0xFF): one each.
POISON: dict[str, int] = {
    "f64": 0x7FF8DEAD0000BEEF,
    "f32": 0x7FC0DEAD,
    "f16": 0x7E5D,
    "bf16": 0x7FDE,
    "f8e4m3": 0x7F,
    "f8e5m2": 0x7E,
}
CANARY: dict[str, int] = {
    "f64": 0x7FF8CA7A00005AFE,
    "f32": 0x7FCA7A11,
    "f16": 0x7E3C,
    "bf16": 0x7FCA,
    "f8e4m3": 0xFF,
    "f8e5m2": 0xFE,
}
_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}

# Elements of canaries on each side of the output: at least 256 bytes, a multiple of
# 16 bytes so that the output keeps the alignment its Problem says.
_GUARD_BYTES = 256


def _torch_int_dtype(torch: Any, itemsize: int) -> Any:
    # Same-size integer views; the patterns above are all positive in the signed type
    # except the FP8 canaries, which is why one byte uses uint8.
    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[itemsize]


def fill_bits(adapter: ArrayAdapter, x: Any, dtype: str, pattern: int) -> None:
    """Set every element of ``x`` (any strides) to the bit pattern ``pattern``."""
    itemsize = ITEMSIZE[dtype]
    if adapter.kind == "numpy":
        x.view(_UNSIGNED[itemsize])[...] = pattern
    elif adapter.kind == "torch":
        x.view(_torch_int_dtype(adapter.torch, itemsize)).fill_(pattern)  # type: ignore[attr-defined]
    elif adapter.kind == "cupy":
        x.view(_UNSIGNED[itemsize]).fill(pattern)
    else:
        msg = f"no bit-level access to {adapter.kind} arrays"
        raise TypeError(msg)


def host_bits(adapter: ArrayAdapter, x: Any, dtype: str) -> np.ndarray:
    """A host copy of the raw bits of ``x`` as unsigned integers, same shape."""
    itemsize = ITEMSIZE[dtype]
    unsigned = _UNSIGNED[itemsize]
    if adapter.kind == "numpy":
        return np.array(x.view(unsigned))
    if adapter.kind == "torch":
        torch = adapter.torch  # type: ignore[attr-defined]
        ints = x.detach().view(_torch_int_dtype(torch, itemsize)).clone().cpu().numpy()
        return np.asarray(ints).view(unsigned)
    if adapter.kind == "cupy":
        import cupy

        return np.asarray(cupy.asnumpy(x.view(unsigned)))
    msg = f"no bit-level access to {adapter.kind} arrays"
    raise TypeError(msg)


def host64(adapter: ArrayAdapter, x: Any) -> np.ndarray:
    """A float64 host copy of ``x`` (always a copy, never a view of the caller's memory)."""
    return np.array(adapter.to_numpy(x), dtype=np.float64, copy=True)


def element_offsets(shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """Offsets (in elements) of every element of a strided layout, in C order."""
    offsets = np.zeros((), dtype=np.int64)
    for size, stride in zip(shape, strides, strict=True):
        offsets = offsets[..., None] + np.arange(size, dtype=np.int64) * stride
    return offsets


@dataclass
class GuardedOutput:
    """An output view inside a canary-filled buffer; see the module docstring."""

    problem: Problem
    adapter: ArrayAdapter
    buffer: Any
    view: Any
    offset: int
    inside: np.ndarray  # bool per buffer element: True where the view's elements live

    @property
    def dtype(self) -> str:
        return self.problem.dtype_c

    def arm(self, c_init: Any | None) -> None:
        """Canaries everywhere, then the poison (beta == 0) or C (beta != 0) in the view."""
        fill_bits(self.adapter, self.buffer, self.dtype, CANARY[self.dtype])
        if c_init is None:
            fill_bits(self.adapter, self.view, self.dtype, POISON[self.dtype])
        else:
            self.adapter.copy_(self.view, c_init)

    def damaged(self) -> list[str]:
        """Where a canary changed, described relative to the output; empty when intact."""
        bits = host_bits(self.adapter, self.buffer, self.dtype)
        changed = np.flatnonzero((bits != CANARY[self.dtype]) & ~self.inside)
        if changed.size == 0:
            return []
        return [self.describe(int(pos)) for pos in changed[:5]] + (
            [f"... {changed.size} elements in all"] if changed.size > 5 else []
        )

    def describe(self, position: int) -> str:
        """Where a buffer position lies relative to the output's layout."""
        p = self.problem
        rel = position - self.offset
        layout = operand_layouts(p)["c"]
        last = int(sum((d - 1) * s for d, s in zip(*layout, strict=True)))
        if rel < 0:
            return f"{-rel} elements before the output"
        if rel > last:
            return f"{rel - last} elements after the output's last element"
        batch, within = divmod(rel, p.stride_c) if p.batch > 1 and p.stride_c else (0, rel)
        row, col = divmod(within, p.ldc)
        if row >= p.m:
            return f"in the gap after batch {batch} (offset {within - p.m * p.ldc} past its last row)"
        return f"in the padding of row {row}, column {col} (n={p.n}, ldc={p.ldc}, batch {batch})"


def guarded_output(problem: Problem, adapter: ArrayAdapter, device: Device) -> GuardedOutput:
    """Allocate the output of ``problem`` inside a canary buffer (see GuardedOutput)."""
    dtype = problem.dtype_c
    itemsize = ITEMSIZE[dtype]
    shape, strides = operand_layouts(problem)["c"]
    guard = _GUARD_BYTES // itemsize
    # Reproduce the caller's pointer alignment when the problem says it is below 16 bytes.
    misalign = problem.align // itemsize if problem.align < 16 else 0
    span = 1 + int(sum((d - 1) * s for d, s in zip(shape, strides, strict=True)))
    size = guard + misalign + span + guard
    buffer = adapter.empty((size,), dtype, device)
    offset = guard + misalign
    view = adapter.strided_view(buffer, shape, strides, offset)
    inside = np.zeros(size, dtype=bool)
    inside[offset + element_offsets(shape, strides).ravel()] = True
    return GuardedOutput(problem, adapter, buffer, view, offset, inside)
