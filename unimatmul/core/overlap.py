"""Whether a call's ``out`` shares memory with one of its inputs, and how the call is made then.

A kernel reads its inputs while it writes ``out``: where the two meet, what it reads
depends on the order it writes in, and the result is wrong without a word. Every door
(``unimatmul.matmul``, ``unimatmul.scaled_matmul``) asks :class:`OutGuard` on each call
that passes ``out``, and an overlapping call follows the array library's own rule
(:func:`run_overlapping`): NumPy's ``matmul`` computes into a temporary and copies it into
``out`` (the right answer), and so does unimatmul, with the chosen kernel; torch's
``out=`` kernels take the overlap as it comes, so the call runs torch's own kernel (its
result bit for bit, or its error). docs/api.md says more.

The test compares byte ranges: from the lowest to the highest byte an array's elements
occupy. The extents follow from shape, strides and item size, which a door's signature
fixes, so they are computed once per signature and a call reads only pointers (NumPy:
``numpy.may_share_memory``, the same test in C). Ranges that meet while the elements
interleave (``x[:, ::2]`` and ``x[:, 1::2]``) count as overlapping: the cautious answer
costs a copy, never a wrong result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from unimatmul.core.arrays import ArrayAdapter

# The C function itself: NumPy's public name dispatches through __array_function__ first,
# which costs more than the test (the cached call pays it per operand).
_may_share = getattr(np.may_share_memory, "_implementation", np.may_share_memory)


def extent(adapter: ArrayAdapter, x: Any) -> tuple[int, int]:
    """``[low, high)``: the bytes ``x``'s elements occupy, as offsets from its data pointer
    (``(0, 0)``: no element, no memory)."""
    shape = adapter.shape(x)
    if 0 in shape:
        return (0, 0)
    size = int(x.itemsize)
    low = high = 0
    for dim, stride in zip(shape, adapter.strides(x), strict=True):
        step = (dim - 1) * stride * size
        if step < 0:
            low += step
        else:
            high += step
    return (low, high + size)


class OutGuard:
    """For one signature of a call with ``out``: whether ``out`` meets ``a``, ``b`` or
    ``bias`` (``extra``: further inputs, a scaled call's scales) on a call.

    Made from the call that resolved the signature, whose extents are every call's.
    ``c`` is not looked at: the array library itself copies it into ``out`` before the
    kernel runs (NumPy right whatever the overlap, torch with its own error for a partial
    one), and the kernel then reads C from ``out``.
    """

    __slots__ = ("_out", "_ptr", "_spans", "check")

    def __init__(
        self, adapter: ArrayAdapter, out: Any, a: Any, b: Any, bias: Any = None, *extra: Any
    ) -> None:
        # torch: Tensor.data_ptr itself, a C call (the adapter's ptr wraps it in Python).
        self._ptr = type(out).data_ptr if adapter.kind == "torch" else adapter.ptr
        self._out = extent(adapter, out)
        # None: no such input, or one without elements (it occupies no memory).
        spans = [None if x is None else extent(adapter, x) for x in (a, b, bias, *extra)]
        self._spans = tuple(None if s is None or s[0] == s[1] else s for s in spans)
        #: ``check(out, a, b, bias, *extra) -> bool``: the test for this signature's calls.
        self.check: Callable[..., bool] = self._ranges
        if adapter.kind == "numpy":
            self.check = _numpy_pair if bias is None and not extra else _numpy_all

    def _ranges(self, out: Any, *inputs: Any) -> bool:
        low, high = self._out
        if low == high:
            return False
        ptr = self._ptr
        base = ptr(out)
        for x, span in zip(inputs, self._spans, strict=False):
            if span is not None and x is not None:
                at = ptr(x) - base  # where x starts, from out's pointer
                if at + span[0] < high and low < at + span[1]:
                    return True
        return False


def _numpy_pair(out: Any, a: Any, b: Any, *unused: Any) -> bool:
    return bool(_may_share(out, a) or _may_share(out, b))


def _numpy_all(out: Any, *inputs: Any) -> bool:
    return any(x is not None and _may_share(out, x) for x in inputs)


def run_overlapping(
    adapter: ArrayAdapter,
    out: Any,
    run: Callable[[Any], None],
    own: Callable[[Any], None],
    allocate: Callable[[], Any],
) -> Any:
    """Make a call whose ``out`` overlaps an input, as the array library makes it.

    ``run(dst)`` makes the call into ``dst`` with the chosen kernel (``c`` copied in first
    where the call has one); ``own(dst)`` makes it with the library's own kernel (Default);
    ``allocate()`` gives a fresh output. torch: ``own(out)``, torch's result or its error.
    Any other library: ``run`` into a temporary, then a copy into ``out`` (NumPy's rule).
    Returns ``out``.
    """
    if adapter.kind == "torch":
        own(out)
        return out
    temporary = allocate()
    run(temporary)
    adapter.copy_(out, temporary)
    return out
