"""The numeric check: a candidate's output against its float64 reference, element by element.

The reference (:func:`make_reference`) and the comparison (:func:`compare`) run block by
block on the operands' device, in the caller's own array library (through its
:class:`~unimatmul.core.arrays.ArrayAdapter`'s primitives), against the element-wise bound
of an :class:`~unimatmul.core.dtypes.ErrorModel`. An output made of several products'
outputs (a grouped GEMM's groups) has one reference per part (:class:`PartsReference`,
:func:`compare_parts`), never a padded batch of them. Checked outputs sit between poisoned
guard bands (:class:`Guard`), and the inputs of the checks after timing are of several
characters (:func:`structure_inputs`). The harness and the trust check use it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from unimatmul.core.arrays import CPU, SCREEN_ELEMENTS, ArrayAdapter, Device, Operands, adapter_for_kind
from unimatmul.core.dtypes import ITEMSIZE, ErrorModel


@dataclass
class Reference:
    """The float64 reference of one operand set, and what the error bound needs.

    ``ref`` has the output's shape (kept in float32 when the output is no wider: its
    rounding is part of the bound); ``r2``/``r4`` are ``[batch, m]`` norms of A's rows
    and ``c2``/``c4`` ``[batch, n]`` norms of B's columns (float64; r4/c4 are None when
    the model has no input-rounding term); ``c0`` is C's value before the call (beta
    != 0), in the output's layout. Everything lives on the operands' device.
    """

    ref: Any
    r2: Any
    c2: Any
    r4: Any
    c4: Any
    c0: Any
    bias: Any
    alpha: float
    beta: float
    model: ErrorModel
    host: bool = False  # kept in NumPy arrays on the host (a small product: see make_reference)
    sumsq: float = 0.0  # ||ref||^2, for the relative error
    # Whether an exact compare keeps each block's bound (in ``ref``'s dtype) for the next
    # ones: a tuning run compares every candidate with one reference, several times, and
    # its memory plan counts them (see _within).
    keep_bounds: bool = False
    bounds: list[Any] | None = None


@dataclass
class Check:
    """How one output compares with a :class:`Reference`, element by element."""

    rel_error: float  # ||out - ref|| / ||ref|| (inf with a NaN or an inf)
    # The largest error / bound over the elements (inf: a NaN or an inf). Where a large
    # output passed the cheap screen (see compare), only "<= 1" is known
    # of those elements, and they count as 1.0 (``exact`` is then False).
    worst_ratio: float
    bad: int  # elements over their bound (NaN and inf included)
    nonfinite: int  # NaN or inf where the reference is finite
    worst: str = ""  # the worst element, when one is over its bound
    exact: bool = True
    outside: int = 0  # elements written outside the output (its guard bands, its rows' padding)
    outside_where: str = ""  # the first of them, as text
    # Whether ``bad`` and ``worst`` are known: False where one pass found only the largest
    # ratio, over 1 (:class:`Launched`); :func:`compare` counts and finds them.
    counted: bool = True

    def ok(self, widen: float = 1.0) -> bool:
        """Whether every element is within ``widen`` times its bound, and nothing else was written."""
        return self.nonfinite == 0 and self.outside == 0 and self.worst_ratio <= widen

    def describe(self, widen: float = 1.0) -> str:
        """One line for a rejected candidate's note."""
        wrote = f"wrote {self.outside} element(s) outside the output ({self.outside_where})"
        if self.outside and self.nonfinite == 0 and self.worst_ratio <= widen:
            return wrote
        what = (
            f"{self.bad} element(s) over the error bound" if self.counted else "elements over the error bound"
        )
        if widen != 1.0:
            what += f" (widened {widen:.3g}x to Default's own error)"
        if self.nonfinite:
            what += f", {self.nonfinite} NaN/inf where the reference is finite"
        if self.outside:
            what = f"{wrote}; {what}"
        worst = self.worst if self.counted else f"the largest error {self.worst_ratio:.3g}x its bound"
        return f"{what}; {worst}; relative error {self.rel_error:.3g}"


#: Products with at most this many elements of A, B and C together are checked on the
#: host (see make_reference).
HOST_CHECK_ELEMENTS = 1 << 16


def _operand_elements(ops: Operands, adapter: ArrayAdapter) -> int:
    return sum(math.prod(adapter.shape(x)) for x in (ops.a, ops.b, ops.out))


def _as3(x: Any) -> Any:
    """A ``[batch, rows, cols]`` view of a 2-D or 3-D array (a 2-D one is a batch of one)."""
    return x[None] if len(x.shape) == 2 else x


def _pick(x3: Any, bs: slice, batch: int) -> Any:
    """Batch range ``bs`` of an operand that may be broadcast (one matrix for all)."""
    return x3 if x3.shape[0] == 1 and batch > 1 else x3[bs]


def _blocks(shape: tuple[int, ...], elements: int) -> Iterator[tuple[slice, slice]]:
    """(batch range, row range) blocks of about ``elements`` of a ``[batch, m, n]`` output."""
    batch, m, n = shape
    per_block = max(1, elements // max(n, 1))
    if per_block >= m:
        step = max(1, per_block // m)
        for i in range(0, batch, step):
            yield slice(i, min(i + step, batch)), slice(0, m)
    else:
        for i in range(batch):
            for r in range(0, m, per_block):
                yield slice(i, i + 1), slice(r, min(r + per_block, m))


#: Elements of B's columns, and of A's rows, the reference holds in float64 at one time, in
#: blocks of the reference (``ArrayAdapter.block_elements``): a larger B is taken a range of
#: its columns at a time, and a larger A a range of its rows, so that a large input (an fp8
#: one's float64 copy is 8x its bytes) never has a float64 copy of the whole of it.
INPUT_BLOCKS = 2

#: ``(batch range, column range)`` of B -> those columns in float64, ``[batch, k, columns]``,
#: and ``(batch range, row range)`` of A -> those rows in float64, ``[batch, rows, k]``
#: (the reference of a scaled product dequantises them on demand: scales.dequantised).
ColumnSource = Callable[[slice, slice], Any]
RowSource = Callable[[slice, slice], Any]


def b_columns(k: int, n: int, block: int) -> int:
    """Columns of B the reference converts to float64 at one time (:data:`INPUT_BLOCKS`)."""
    limit = INPUT_BLOCKS * block
    return n if k * n <= limit else max(1, limit // max(k, 1))


def a_rows(m: int, n: int, k: int, block: int) -> int:
    """Rows of A (and of the output) the reference takes at one time: a block of the
    output over :func:`b_columns`' columns, and no more of A than :data:`INPUT_BLOCKS` blocks."""
    cols = b_columns(k, n, block)
    return max(1, min(m, block // max(cols, 1), INPUT_BLOCKS * block // max(k, 1)))


def _reference_blocks(shape: tuple[int, ...], k: int, block: int) -> Iterator[tuple[slice, slice, slice]]:
    """(batch range, row range, column range) blocks of a ``[batch, m, n]`` reference:
    :func:`_blocks` where B and A's rows fit :data:`INPUT_BLOCKS` blocks (several batches at a
    time where whole matrices do), else a range of B's columns at a time (each converted
    once), each with its rows :func:`a_rows` at a time."""
    batch, m, n = shape
    cols = b_columns(k, n, block)
    rows = a_rows(m, n, k, block)
    if cols >= n:
        # Output blocks of at most ``rows`` rows: _blocks' rows are its elements / n.
        for bs, rs in _blocks(shape, min(block, rows * n) if rows < m else block):
            yield bs, rs, slice(0, n)
        return
    for i in range(batch):
        for c in range(0, n, cols):
            for r in range(0, m, rows):
                yield slice(i, i + 1), slice(r, min(r + rows, m)), slice(c, min(c + cols, n))


def make_reference(
    adapter: ArrayAdapter,
    ops: Operands,
    c0: Any,
    alpha: float,
    beta: float,
    activation: str | None,
    model: ErrorModel,
    device: Device,
    columns: ColumnSource | None = None,
    rows: RowSource | None = None,
) -> Reference:
    """The float64 reference of ``ops`` (C from ``c0`` when beta != 0), kept for
    :func:`compare`; computed block by block on the operands' device. ``columns`` and
    ``rows`` give B's columns and A's rows in float64 where they are not the operands'
    own values (a scaled product's dequantised inputs); ``ops.a`` and ``ops.b`` then
    only give their shapes.

    A small product's is computed and kept on the host instead: a few dozen tiny
    launches and their synchronisations would cost more than copying it there.
    """
    found, pending = _reference(adapter, ops, c0, alpha, beta, activation, model, device, columns, rows)
    found.sumsq += sum(adapter.scalars(pending))
    return found


def _reference(
    adapter: ArrayAdapter,
    ops: Operands,
    c0: Any,
    alpha: float,
    beta: float,
    activation: str | None,
    model: ErrorModel,
    device: Device,
    columns: ColumnSource | None = None,
    rows: RowSource | None = None,
) -> tuple[Reference, list[Any]]:
    """:func:`make_reference`, with the squares of its blocks left on the device (the
    reference's ``sumsq`` is their sum): the caller reads them back, with others."""
    out_shape = adapter.shape(ops.out)
    shape3 = (1, *out_shape) if len(out_shape) == 2 else out_shape
    ref_dtype = "f64" if adapter.dtype(ops.out) == "f64" else "f32"
    a3, b3 = _as3(ops.a), _as3(ops.b)
    if columns is None:

        def columns(bs: slice, cs: slice) -> Any:
            return adapter.to_float64(_pick(b3, bs, shape3[0])[:, :, cs])

    if rows is None:

        def rows(bs: slice, rs: slice) -> Any:
            return adapter.to_float64(_pick(a3, bs, shape3[0])[:, rs])

    if adapter.kind != "numpy" and _operand_elements(ops, adapter) <= HOST_CHECK_ELEMENTS:
        host = adapter_for_kind("numpy")
        moved = Operands(
            adapter.to_numpy(rows(slice(0, a3.shape[0]), slice(0, a3.shape[-2]))),
            adapter.to_numpy(columns(slice(0, b3.shape[0]), slice(0, b3.shape[-1]))),
            host.empty(out_shape, ref_dtype, CPU),
            adapter.to_numpy(ops.bias) if ops.bias is not None else None,
        )
        c0_host = adapter.to_numpy(c0) if beta != 0.0 else None
        found = make_reference(host, moved, c0_host, alpha, beta, activation, model, CPU)
        found.host = True
        return found, []
    batch, m, n = shape3
    ref = adapter.empty(shape3, ref_dtype, device)
    xp = adapter.namespace()
    r2 = adapter.empty((batch, m), "f64", device)
    r4 = adapter.empty((batch, m), "f64", device) if model.inputs else None
    c2 = adapter.empty((batch, n), "f64", device)
    c4 = adapter.empty((batch, n), "f64", device) if model.inputs else None
    c3 = _as3(c0) if beta != 0.0 else None
    bias64 = adapter.to_float64(ops.bias) if ops.bias is not None else None
    # B's columns in float64 and their norms: once per batch range and column range.
    b_done: tuple[slice, slice] | None = None
    b64: Any = None
    sumsq: list[Any] = []
    block = adapter.block_elements(device, reference=True, total=math.prod(shape3))
    for bs, rs, cs in _reference_blocks(shape3, b3.shape[-2], block):
        a64 = rows(bs, rs)
        if (bs, cs) != b_done:
            b64 = None  # the last range's before the next one's
            b64 = columns(bs, cs)
            squares = b64 * b64  # once, for both norms
            c2[bs, cs] = xp.sqrt(adapter.reduce_sum(squares, -2))
            if c4 is not None:
                squares *= squares
                c4[bs, cs] = xp.sqrt(xp.sqrt(adapter.reduce_sum(squares, -2)))
            del squares
            b_done = (bs, cs)
        pre = a64 @ b64
        if alpha != 1.0:
            pre = pre * alpha
        if c3 is not None:
            pre = pre + adapter.to_float64(c3[bs, rs, cs]) * beta
        if bias64 is not None:
            pre = pre + bias64[..., cs]
        done = adapter.activate64(pre, activation)
        ref[bs, rs, cs] = done
        sumsq.append(adapter.sum_squares(done))
        if cs.start == 0:  # A's row norms: once, with the first range of columns
            squares = a64 * a64
            r2[bs, rs] = xp.sqrt(adapter.reduce_sum(squares, -1))
            if r4 is not None:
                squares *= squares
                r4[bs, rs] = xp.sqrt(xp.sqrt(adapter.reduce_sum(squares, -1)))
            del squares
        del pre, done  # before the next block's: one block of float64 at a time
    return Reference(ref, r2, c2, r4, c4, c3, bias64, alpha, beta, model), sumsq


@dataclass
class PartsReference:
    """The reference of an output made of several plain products' outputs (a grouped
    GEMM's groups: :func:`unimatmul.core.grouped.group_products`): each part's
    :class:`Reference` with its label and the view of the output it is compared with.
    Together they take what the covered part of the output does, never a padded batch."""

    parts: list[tuple[str, Callable[[Any], Any], Reference]]

    @property
    def keep_bounds(self) -> bool:
        return any(ref.keep_bounds for _, _, ref in self.parts)

    @keep_bounds.setter
    def keep_bounds(self, keep: bool) -> None:
        for _, _, ref in self.parts:
            ref.keep_bounds = keep


def make_parts_reference(
    adapter: ArrayAdapter,
    parts: Sequence[tuple[str, Callable[[Any], Any], Operands]],
    model: ErrorModel,
    device: Device,
) -> PartsReference:
    """The float64 references of ``parts`` ((label, view of the output, the part's plain
    operands, their ``out`` that view of the output)), made one part after another: only
    one part's float64 temporaries are alive at a time, and their sums come back at once
    (one synchronisation on a GPU, not one a part)."""
    made, pending = [], []
    for label, view, ops in parts:
        ref, squares = _reference(adapter, ops, None, 1.0, 0.0, None, model, device)
        made.append((label, view, ref))
        pending.append(squares)
    values = adapter.scalars([x for squares in pending for x in squares])
    start = 0
    for (_, _, ref), squares in zip(made, pending, strict=True):
        ref.sumsq += sum(values[start : start + len(squares)])
        start += len(squares)
    return PartsReference(made)


def all_finite(
    adapter: ArrayAdapter, out: Any, reference: Reference | PartsReference, device: Device
) -> bool:
    """Whether every element of ``out`` (of each part a :class:`PartsReference` checks) is
    finite: after a call on an output poisoned with NaN, whether it wrote every element.
    One pass over the output, in :func:`compare`'s blocks, where a comparison takes several."""
    parts = (
        [(view(out), ref) for _, view, ref in reference.parts]
        if isinstance(reference, PartsReference)
        else [(out, reference)]
    )
    xp = adapter.namespace()
    found = []
    for part, ref in parts:
        out3 = _as3(part)
        blocks, _ = _compare_blocks(adapter, ref, CPU if ref.host else device, None)
        found += [xp.isfinite(out3[bs, rs]).all() for bs, rs in blocks]
    return all(v == 1.0 for v in adapter.scalars(found))


def compare_parts(
    adapter: ArrayAdapter, out: Any, reference: PartsReference, device: Device, *, exact: bool | None = None
) -> Check:
    """Compare each part of ``out`` with its reference (:func:`compare`), as one
    :class:`Check`: errors and counts summed over the parts, the worst element's part named."""
    # The one-pass check (_within) of every part compared exactly on the device is
    # launched for all of them and read back at once; a part not within its bounds (or on
    # the host, or screened) gets the whole compare.
    launched: list[tuple[int, int, int]] = []  # (part, its first value, its values)
    scalars: list[Any] = []
    for i, (_, view, ref) in enumerate(reference.parts):
        blocks, exactly = _compare_blocks(adapter, ref, device, exact)
        pending = _within_launch(adapter, _as3(view(out)), ref, blocks) if exactly and not ref.host else None
        if pending is not None:
            launched.append((i, len(scalars), len(pending)))
            scalars += pending
    values = adapter.scalars(scalars)
    quick = {
        i: _within_verdict(values[start : start + count], reference.parts[i][2])
        for i, start, count in launched
    }
    found = []
    for i, (label, view, ref) in enumerate(reference.parts):
        check = quick.get(i)
        if check is None:
            check = compare(adapter, view(out), ref, device, exact=exact)
        found.append((label, check, ref))
    return _combined(found)


def _combined(found: Sequence[tuple[str, Check, Reference]]) -> Check:
    """One :class:`Check` of several parts' (label, check, reference): errors and counts
    summed over the parts, the worst element's part named."""
    squares, sumsq = 0.0, 0.0
    for _, check, ref in found:
        den = math.sqrt(ref.sumsq)
        squares += (check.rel_error * den if den > 0 else check.rel_error) ** 2
        sumsq += ref.sumsq
    err = math.sqrt(squares)
    rel = (err / math.sqrt(sumsq) if sumsq > 0 else err) if math.isfinite(err) else math.inf
    checks = [check for _, check, _ in found]
    total = Check(
        rel,
        max((c.worst_ratio for c in checks), default=0.0),
        sum(c.bad for c in checks),
        sum(c.nonfinite for c in checks),
        exact=all(c.exact for c in checks),
    )
    bad = [(label, check) for label, check, _ in found if check.bad]
    if bad:
        label, worst = max(bad, key=lambda item: item[1].worst_ratio)
        total.worst = f"{label}: {worst.worst}" if label else worst.worst
    return total


@dataclass
class Launched:
    """A comparison's one pass (:func:`_within`) launched on the device and not read:
    ``scalars`` to read (with others, in one transfer), then ``verdict`` of their values."""

    scalars: list[Any]
    parts: list[tuple[str, Reference, int]]  # (label, reference, its values)

    def verdict(self, values: Sequence[float]) -> Check | None:
        """The :class:`Check` of the values read: exact where every element is within its
        bound; where some is not, its largest ratio and the relative error, not counted
        (``counted`` False: :func:`compare` counts them and finds the worst, for a
        rejection's note); None where an element is NaN or inf."""
        found: list[tuple[str, Check, Reference]] = []
        start = 0
        for label, ref, count in self.parts:
            part = list(values[start : start + count])
            blocks = count // 2
            worst = max(part[:blocks], default=0.0)
            if not math.isfinite(worst):
                return None
            err = math.sqrt(sum(part[blocks:]))
            den = math.sqrt(ref.sumsq)
            check = Check(err / den if den > 0 else err, worst, 0, 0, exact=True, counted=worst <= 1.0)
            found.append((label, check, ref))
            start += count
        if len(found) == 1 and not found[0][0]:
            return found[0][1]
        total = _combined(found)
        total.counted = all(check.counted for _, check, _ in found)
        return total


def compare_launch(
    adapter: ArrayAdapter, out: Any, reference: Reference | PartsReference, device: Device
) -> Launched | None:
    """The one-pass check of ``out`` against ``reference`` (each part of a
    :class:`PartsReference`) launched and not read, for a caller that reads several
    checks back at once (one wait on a GPU for all of them). None where that pass cannot
    decide alone (a reference on the host, an output large enough to be screened, kept
    bounds of other blocks): then :func:`compare` (or :func:`compare_parts`) it."""
    parts = (
        [(label, view(out), ref) for label, view, ref in reference.parts]
        if isinstance(reference, PartsReference)
        else [("", out, reference)]
    )
    launched = Launched([], [])
    for label, part, ref in parts:
        if ref.host:
            return None
        blocks, exactly = _compare_blocks(adapter, ref, device, None)
        pending = _within_launch(adapter, _as3(part), ref, blocks) if exactly else None
        if pending is None:
            return None
        launched.scalars += pending
        launched.parts.append((label, ref, len(pending)))
    return launched


def compare(
    adapter: ArrayAdapter, out: Any, reference: Reference, device: Device, *, exact: bool | None = None
) -> Check:
    """Compare ``out`` with ``reference`` element by element, on the device.

    Only a handful of scalars come back to the host; NaN and inf where the
    reference is finite count as over the bound. A large output (over
    ``SCREEN_ELEMENTS``, unless ``exact``) is first screened in the reference's own
    precision against a part of the bound that costs two passes (the output
    rounding and the summation term with the block's smallest column norm); only
    blocks where some element is not clearly within it get the whole bound. An
    output checked exactly first gets one pass against the reference's kept bounds
    (:func:`_within`): where every element is within them, that is the whole answer;
    otherwise the elements over them are counted in a second pass.
    """
    if reference.host and adapter.kind != "numpy":
        return compare(adapter_for_kind("numpy"), adapter.to_numpy(out), reference, CPU, exact=exact)
    out3 = _as3(out)
    blocks, exact = _compare_blocks(adapter, reference, device, exact)
    sq_err: list[float] = []
    screened = False
    if exact:
        found = _within(adapter, out3, reference, blocks)
        if found is not None:
            return found
        full = blocks
    else:
        # The screen in its own (larger, on a GPU) blocks; those it does not clear are
        # compared in full in the plain blocks, whose float64 temporaries the memory plan counts.
        shape = tuple(reference.ref.shape)
        total = math.prod(shape)
        wide = list(_blocks(shape, adapter.block_elements(device, screen=True, total=total)))
        unclear, sq_err = _screen(adapter, out3, reference, wide)
        screened = len(unclear) < len(wide)
        size = adapter.block_elements(device, total=total)
        full = [part for i in unclear for part in _split(wide[i], shape[-1], size)]
    totals = _full(adapter, out3, reference, full)
    err = math.sqrt(sum(totals[0]) + sum(sq_err))
    den = math.sqrt(reference.sumsq)
    rel = (err / den if den > 0 else err) if math.isfinite(err) else math.inf
    worst_ratio = max(totals[3] + ([1.0] if screened else []), default=0.0)
    check = Check(rel, worst_ratio, int(sum(totals[1])), int(sum(totals[2])), exact=not screened)
    if check.bad:
        index = max(range(len(full)), key=lambda i: totals[3][i])
        check.worst = _worst(adapter, out3, reference, *full[index])
    return check


def _split(block: tuple[slice, slice], n: int, elements: int) -> list[tuple[slice, slice]]:
    """``block`` (a batch range, a row range of an output of ``n`` columns) in blocks of
    at most ``elements`` (one row at least): one matrix, a range of its rows, at a time."""
    bs, rs = block
    rows = max(1, elements // max(n, 1))
    if (bs.stop - bs.start) * (rs.stop - rs.start) <= rows:
        return [block]
    return [
        (slice(i, i + 1), slice(r, min(r + rows, rs.stop)))
        for i in range(bs.start, bs.stop)
        for r in range(rs.start, rs.stop, rows)
    ]


def _compare_blocks(
    adapter: ArrayAdapter, reference: Reference, device: Device, exact: bool | None
) -> tuple[list[tuple[slice, slice]], bool]:
    """The blocks :func:`compare` takes of an output of ``reference``, and whether it is
    compared exactly (``exact``, or, when None, whether it is small enough)."""
    shape = tuple(reference.ref.shape)
    blocks = list(_blocks(shape, adapter.block_elements(device, total=math.prod(shape))))
    return blocks, (math.prod(shape) <= SCREEN_ELEMENTS if exact is None else exact)


def _within(
    adapter: ArrayAdapter, out3: Any, reference: Reference, blocks: list[tuple[slice, slice]]
) -> Check | None:
    """The check of an output whose every element is within its bound, in one pass; None
    if some element is not (or is NaN or inf), for the pass that counts them.

    The difference is taken in the reference's precision (as the screen's is), and two
    scalars a block come back: the largest error/bound (NaN, read as inf, where an
    element is NaN or inf) and the squared error. Where the reference says so
    (``keep_bounds``: the tuning's memory plan counted them), each block's bound is
    made once, in the reference's dtype, and kept: a candidate's check is then a few
    launches, not dozens. A bound of 0 (a row of zeros in A, as the checks after timing
    have) is the dtype's smallest normal number: an error of 0 is within it.
    """
    pending = _within_launch(adapter, out3, reference, blocks)
    return None if pending is None else _within_verdict(adapter.scalars(pending), reference)


#: The smallest normal number of the reference's dtype: the least bound of :func:`_within`.
_TINY = {"f32": float(np.finfo(np.float32).tiny), "f64": float(np.finfo(np.float64).tiny)}


def _within_launch(
    adapter: ArrayAdapter, out3: Any, reference: Reference, blocks: list[tuple[slice, slice]]
) -> list[Any] | None:
    """The work of :func:`_within`, not read back: each block's largest error/bound, then
    each block's squared error (None where the kept bounds are of other blocks)."""
    kept = reference.bounds
    if kept is not None and len(kept) != len(blocks):  # blocks of another size than the kept ones
        return None
    made: list[Any] = []
    worst, squares = [], []
    # The smallest normal number of the reference's dtype is added to each bound: where the
    # bound is 0 (a row of zeros in A), an exact 0 passes and any other value is far over it.
    tiny = _TINY[adapter.dtype(reference.ref)]
    for i, (bs, rs) in enumerate(blocks):
        ref = reference.ref[bs, rs]
        if kept is not None:
            bound = kept[i]
        else:
            bound = adapter.cast_like(_bound(adapter, reference, adapter.to_float64(ref), bs, rs) + tiny, ref)
            if reference.keep_bounds:
                made.append(bound)
        block_worst, block_squares = adapter.error_parts(out3[bs, rs], ref, bound)
        worst.append(block_worst)  # NaN where an element is NaN
        squares.append(block_squares)
        del bound  # one block's temporaries at a time
    if made:
        reference.bounds = made
    return worst + squares


def _within_verdict(values: list[float], reference: Reference) -> Check | None:
    """What :func:`_within` reads from its blocks' values (:func:`_within_launch`)."""
    count = len(values) // 2
    worst_ratio = max(values[:count], default=0.0)
    if not worst_ratio <= 1.0:
        return None
    err = math.sqrt(sum(values[count:]))
    den = math.sqrt(reference.sumsq)
    return Check(err / den if den > 0 else err, worst_ratio, 0, 0, exact=True)


def _screen(
    adapter: ArrayAdapter, out3: Any, reference: Reference, blocks: list[tuple[slice, slice]]
) -> tuple[list[int], list[float]]:
    """The blocks not clearly within their bound, and every block's squared error."""
    model = reference.model
    a_out = model.c_out * model.u_out * model.slope * model.weight_ref + model.u_ref
    kappa = abs(reference.alpha) * model.slope * model.sqrt_k_acc
    c2min = adapter.reduce_max(-reference.c2, -1)  # minus the smallest column norm of each matrix
    screen, sq = [], []
    for bs, rs in blocks:
        excess, squares = adapter.screen_parts(out3[bs, rs], reference.ref[bs, rs], a_out)
        sq.append(squares)
        low = reference.r2[bs, rs] * (-c2min[bs])[:, None] * kappa + 1e-300
        screen.append((excess / low).max())
    # One transfer for both lists; NaN reads as inf: such a block is looked at fully.
    values = adapter.scalars(screen + sq)
    values, squares = values[: len(screen)], values[len(screen) :]
    return [i for i, v in enumerate(values) if not v <= 1.0], squares


def _full(
    adapter: ArrayAdapter, out3: Any, reference: Reference, blocks: list[tuple[slice, slice]]
) -> list[list[float]]:
    """Squared errors, elements over the bound, NaN/inf, worst ratio: per block."""
    xp = adapter.namespace()
    sq_err, bad, nonfinite, worst = [], [], [], []
    for bs, rs in blocks:
        ref = adapter.to_float64(reference.ref[bs, rs])
        diff = abs(adapter.to_float64(out3[bs, rs]) - ref)
        bound = _bound(adapter, reference, ref, bs, rs)
        finite = xp.isfinite(diff)
        ratio = xp.where(finite, diff / (bound + 1e-300), math.inf)
        sq_err.append(adapter.sum_squares(xp.where(finite, diff, math.inf)))
        bad.append((~(diff <= bound)).sum())
        nonfinite.append((~finite & xp.isfinite(ref)).sum())
        worst.append(ratio.max())
    # One transfer of a few scalars per block, at the end (one sync on a GPU).
    values = adapter.scalars(sq_err + bad + nonfinite + worst)
    count = len(blocks)
    return [values[i * count : (i + 1) * count] for i in range(4)]


def _bound(adapter: ArrayAdapter, reference: Reference, ref: Any, bs: slice, rs: slice) -> Any:
    beta_c = None
    if reference.c0 is not None:
        beta_c = abs(adapter.to_float64(reference.c0[bs, rs])) * abs(reference.beta)
    r4 = reference.r4[bs, rs] if reference.r4 is not None else None
    c4 = reference.c4[bs] if reference.c4 is not None else None
    return reference.model.bound(
        ref,
        reference.r2[bs, rs],
        reference.c2[bs],
        r4,
        c4,
        alpha=reference.alpha,
        beta_c=beta_c,
        bias=reference.bias,
    )


def _worst(adapter: ArrayAdapter, out3: Any, reference: Reference, bs: slice, rs: slice) -> str:
    """The element furthest over its bound in one block, as text."""
    ref = adapter.to_numpy(reference.ref[bs, rs]).astype(np.float64)
    got = adapter.to_numpy(out3[bs, rs]).astype(np.float64)
    bound = adapter.to_numpy(_bound(adapter, reference, adapter.to_float64(reference.ref[bs, rs]), bs, rs))
    diff = np.abs(got - ref)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(np.isfinite(diff), diff / (bound + 1e-300), np.inf)
    i, r, j = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    where = (bs.start + int(i), rs.start + int(r), int(j))
    where_text = str(where[1:]) if reference.ref.shape[0] == 1 else str(where)
    return (
        f"worst element {where_text}: got {float(got[i, r, j])!r}, expected {float(ref[i, r, j])!r} "
        f"(error {diff[i, r, j]:.3g} > bound {bound[i, r, j]:.3g})"
    )


#: Bytes of poison before and after an output the harness checks (at least one of its rows).
GUARD_BYTES = 4096
#: What the guard bands hold, check call by check call: NaN, then a finite value, so that
#: a write of either one is seen the other time (-3.5 is exact in every output dtype).
GUARD_VALUES = (math.nan, -3.5)


@dataclass
class Guard:
    """Poisoned memory around one output: bands before and after it and its rows' padding.

    ``base`` is the flat buffer the output is a view of, and ``outside`` the indices (into
    ``base``, on its device) of every element that is not one of the output's; ``host``
    holds them on the host, to say where a write went. ``start`` and ``end`` are the
    output's first element and one past its last; ``rows`` its rows' starts, sorted.
    """

    base: Any
    outside: Any
    host: np.ndarray
    start: int
    end: int
    rows: np.ndarray
    width: int

    def where(self, index: int) -> str:
        """Where element ``index`` of ``base`` is, relative to the output."""
        if index < self.start:
            return f"the first at {self.start - index} element(s) before the output"
        if index >= self.end:
            return f"the first at {index - self.end + 1} element(s) after the output's last"
        row = int(np.searchsorted(self.rows, index, side="right")) - 1
        column = index - int(self.rows[row])
        return f"the first in the padding of row {row}, at column {column} of a row {self.width} wide"


def guarded_output(
    adapter: ArrayAdapter,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    dtype: str,
    device: Device,
    rng: np.random.Generator,
    offset: int = 0,
    *,
    fill: bool = True,
    like: Guard | None = None,
) -> tuple[Any, Guard]:
    """An output of this layout in a buffer with guard bands before and after it
    (``GUARD_BYTES`` or a row, whichever is more) and its :class:`Guard`; ``like``: a
    guard of the same layout whose indices are reused."""
    band = _band(strides, dtype)
    start = band + offset
    end = start + _span(shape, strides)
    base = adapter.random_strided((end + band,), (1,), dtype, device, rng, fill=fill)
    out = adapter.strided_view(base, shape, strides, start)
    if like is not None:
        return out, Guard(base, like.outside, like.host, start, end, like.rows, like.width)
    host, rows, width = _outside_indices(end + band, start, shape, strides)
    return out, Guard(base, adapter.host_indices(host, device), host, start, end, rows, width)


def guard_bytes(shape: tuple[int, ...], strides: tuple[int, ...], dtype: str) -> tuple[int, int]:
    """Bytes one guarded output takes beyond its own span (its bands), and bytes of the
    indices its guard keeps (shared by the outputs of one layout)."""
    band = _band(strides, dtype)
    padding = _span(shape, strides) - math.prod(shape)
    rows = math.prod(shape[:-1]) if strides[-1] == 1 else math.prod(shape)
    return 2 * band * ITEMSIZE[dtype], 8 * (2 * (padding + 2 * band) + rows)


def _band(strides: tuple[int, ...], dtype: str) -> int:
    """Elements of each guard band: GUARD_BYTES or a row, whichever is more, in whole
    256-byte units (the output keeps the alignment its Problem says)."""
    itemsize = ITEMSIZE[dtype]
    row = strides[-2] * itemsize if len(strides) > 1 else itemsize
    return -(-max(GUARD_BYTES, row) // 256) * 256 // itemsize


def _span(shape: tuple[int, ...], strides: tuple[int, ...]) -> int:
    """Elements from a strided layout's first element to its last, both included."""
    return 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))


def _outside_indices(
    size: int, start: int, shape: tuple[int, ...], strides: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, int]:
    """(flat indices of every element of ``size`` that is not the output's, the output's
    rows' starts sorted, a row's width): the gaps between rows, found without a mask."""
    width = shape[-1] if strides[-1] == 1 else 1
    dims = (
        list(zip(shape[:-1], strides[:-1], strict=True))
        if width > 1
        else list(zip(shape, strides, strict=True))
    )
    rows = np.array([start], dtype=np.int64)
    for extent, stride in dims:
        rows = (rows[:, None] + np.arange(extent, dtype=np.int64) * stride).ravel()
    rows.sort()
    low = np.concatenate(([0], rows + width))
    high = np.concatenate((rows, [size]))
    lengths = np.maximum(high - low, 0)
    firsts = np.cumsum(lengths) - lengths  # where each gap begins among the indices
    indices = np.repeat(low - firsts, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)
    return indices, rows, width


def poison_guard(guard: Guard, value: float) -> None:
    """Fill every element of ``guard``'s buffer that is not the output's with ``value``."""
    guard.base[guard.outside] = value


def guard_count(adapter: ArrayAdapter, guard: Guard, value: float) -> Any:
    """How many elements outside the output no longer hold ``value`` (poisoned by
    :func:`poison_guard`), launched and not read (a 0-d array): the check reads it with its
    comparison, one wait for both (:func:`guard_writes`)."""
    return _guard_changed(adapter, guard, value).sum()


def guard_writes(adapter: ArrayAdapter, guard: Guard, value: float, count: Any) -> tuple[int, str]:
    """``count`` (:func:`guard_count`) read, and where the first such element is, as text
    ("" if none)."""
    (found,) = adapter.scalars([count])
    if found == 0:
        return 0, ""
    changed = _guard_changed(adapter, guard, value)
    first = int(np.flatnonzero(adapter.to_numpy(changed))[0])
    return int(found), guard.where(int(guard.host[first]))


def _guard_changed(adapter: ArrayAdapter, guard: Guard, value: float) -> Any:
    """Which elements of ``guard``'s bands no longer hold ``value``."""
    got = adapter.to_float64(guard.base[guard.outside])
    return ~adapter.namespace().isnan(got) if math.isnan(value) else got != value


A_CHARACTERS = ("ones", "integers", "magnitudes", "zeros", "normal")
B_CHARACTERS = ("integers", "ones", "normal")


def structure_inputs(adapter: ArrayAdapter, a: Any, b: Any, variant: int, dtypes: tuple[str, ...]) -> None:
    """Turn standard-normal inputs into ones of several characters, in place, in bands:
    A's rows ones, small integers, mixed magnitudes (along k), zeros and normal; B's
    columns small integers, ones and normal (never zeros or magnitudes there: the check's
    screen bounds a block by its smallest column norm). ``variant`` rotates which band
    gets which character, so that two checks see different values in every band.
    ``a`` and ``b`` are 2-D or batched 3-D; ``dtypes`` those of A, B and C, which bound
    the magnitudes (no subnormals, no overflow)."""
    xp = adapter.namespace()
    power = 4 if "f16" in dtypes else 12
    big, small = float(2**power), float(2.0**-power)

    def bands(x: Any, count: int, axis: int) -> list[Any]:
        extent = x.shape[axis]
        step = -(-extent // count)
        pick = (lambda lo, hi: x[..., lo:hi, :]) if axis == -2 else (lambda lo, hi: x[..., lo:hi])
        return [pick(lo, min(lo + step, extent)) for lo in range(0, extent, step)]

    def give(v: Any, character: str) -> None:
        if character == "ones":
            v[...] = 1.0
        elif character == "zeros":
            v[...] = 0.0
        elif character == "integers":  # in place: no temporaries of a band of a large weight
            v *= 2.0
            xp.round(v, out=v)
            xp.clip(v, -4.0, 4.0, out=v)
        elif character == "magnitudes":
            v[..., ::2] *= big
            v[..., 1::2] *= small

    rows = a.shape[-2] >= len(A_CHARACTERS)
    for i, v in enumerate(bands(a, len(A_CHARACTERS), -2 if rows else -1)):
        give(v, A_CHARACTERS[(i + variant) % len(A_CHARACTERS)])
    for i, v in enumerate(bands(b, len(B_CHARACTERS), -1)):
        give(v, B_CHARACTERS[(i + variant) % len(B_CHARACTERS)])
