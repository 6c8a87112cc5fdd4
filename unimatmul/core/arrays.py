"""Array adapters: one face over NumPy arrays, torch tensors and CuPy arrays.

Dispatch is by the array's type, cached per type, and each adapter imports its
library only when an array of that library reaches it (so ``import unimatmul`` never
imports torch or cupy). Backends use adapters for pointers and devices; the harness
uses them to make operands, references and checks in the caller's own array kind.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from unimatmul.core.dtypes import ITEMSIZE, ErrorModel, canonical
from unimatmul.core.problem import Problem


@dataclass(frozen=True)
class Device:
    """Where arrays live: ``cpu``, ``cuda`` (NVIDIA) or ``hip`` (AMD), with an index."""

    kind: str
    index: int = 0

    def __str__(self) -> str:
        return self.kind if self.kind == "cpu" else f"{self.kind}:{self.index}"


CPU = Device("cpu")


@dataclass
class Operands:
    """One set of inputs and an output laid out exactly as a Problem describes."""

    a: Any
    b: Any
    out: Any
    bias: Any = None


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
    # its memory plan counts them (see ArrayAdapter._within).
    keep_bounds: bool = False
    bounds: list[Any] | None = None


@dataclass
class Check:
    """How one output compares with a :class:`Reference`, element by element."""

    rel_error: float  # ||out - ref|| / ||ref|| (inf with a NaN or an inf)
    # The largest error / bound over the elements (inf: a NaN or an inf). Where a large
    # output passed the cheap screen (see ArrayAdapter.compare), only "<= 1" is known
    # of those elements, and they count as 1.0 (``exact`` is then False).
    worst_ratio: float
    bad: int  # elements over their bound (NaN and inf included)
    nonfinite: int  # NaN or inf where the reference is finite
    worst: str = ""  # the worst element, when one is over its bound
    exact: bool = True
    outside: int = 0  # elements written outside the output (its guard bands, its rows' padding)
    outside_where: str = ""  # the first of them, as text

    def ok(self, widen: float = 1.0) -> bool:
        """Whether every element is within ``widen`` times its bound, and nothing else was written."""
        return self.nonfinite == 0 and self.outside == 0 and self.worst_ratio <= widen

    def describe(self, widen: float = 1.0) -> str:
        """One line for a rejected candidate's note."""
        wrote = f"wrote {self.outside} element(s) outside the output ({self.outside_where})"
        if self.outside and self.nonfinite == 0 and self.worst_ratio <= widen:
            return wrote
        what = f"{self.bad} element(s) over the error bound"
        if widen != 1.0:
            what += f" (widened {widen:.3g}x to Default's own error)"
        if self.nonfinite:
            what += f", {self.nonfinite} NaN/inf where the reference is finite"
        if self.outside:
            what = f"{wrote}; {what}"
        return f"{what}; {self.worst}; relative error {self.rel_error:.3g}"


def host_available_bytes() -> int | None:
    """Memory the host can still give without swapping (Linux ``MemAvailable``), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


_keeper: list[Any] = []  # [the thread that makes kept buffers, whether it may allocate during a capture]
_keeper_lock = threading.Lock()


def _relax_capture_mode() -> bool:
    """Let this thread allocate while another thread captures a CUDA/HIP graph (the driver's
    relaxed capture mode for the thread, as PyTorch's allocator sets for its event queries).
    False when the driver's function cannot be had."""
    import ctypes

    import torch

    hip = bool(getattr(torch.version, "hip", None))
    try:
        library = ctypes.CDLL("libamdhip64.so" if hip else "libcuda.so.1")
        exchange = getattr(
            library, "hipThreadExchangeStreamCaptureMode" if hip else "cuThreadExchangeStreamCaptureMode"
        )
    except (OSError, AttributeError):
        return False
    mode = ctypes.c_int(2)  # CU_STREAM_CAPTURE_MODE_RELAXED = hipStreamCaptureModeRelaxed = 2
    return bool(exchange(ctypes.byref(mode)) == 0)


def kept_torch_buffer(shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any, device: Any) -> Any:
    """A torch GPU buffer that a runner keeps across calls (a workspace, padded copies).

    Made by a thread of its own (in the relaxed capture mode) and recorded for the
    caller's current stream, so that it never comes from a CUDA-graph memory pool:
    torch.compile's CUDA graph trees send every allocation of the thread that runs them
    to a private pool while they warm up and record, and refuse any buffer there that
    outlives the run ("tensors in the cudagraph pool not tracked as outputs"); a runner
    first prepared during a capture would otherwise put its workspace there. Where the
    relaxed mode cannot be set, a buffer wanted during a capture is allocated as anything
    else is (the capture's pool). ``dtype`` and ``device`` are torch's; the native routing
    kernels make theirs the same way (``kept_buffer`` in ``_native.cpp``).
    """
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return torch.empty_strided(shape, strides, dtype=dtype, device=device)
    with _keeper_lock:
        if not _keeper:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="unimatmul-kept-buffers")
            _keeper.extend([pool, pool.submit(_relax_capture_mode).result()])
    if not _keeper[1] and torch.cuda.is_current_stream_capturing():
        return torch.empty_strided(shape, strides, dtype=dtype, device=device)

    def make() -> Any:
        with torch.cuda.device(device):
            return torch.empty_strided(shape, strides, dtype=dtype, device=device)

    made = _keeper[0].submit(make).result()
    made.record_stream(torch.cuda.current_stream(device))  # freed only once this stream is done with it
    return made


# Runners a CUDA graph may still use: one of their calls ran under capture, so a graph
# holds the addresses of their kept buffers (workspaces, padded copies) and writes there at
# every replay. Nothing says when that graph is gone, so they are kept for the process's
# life, whatever forgets them otherwise (a plan retired, a signature evicted). Freed, they
# let the compiled `generate` graphs of Hugging Face models, replayed later, write split-K
# sums and padded copies into memory that by then held other tensors.
_graph_held: dict[int, Any] = {}
_graph_held_lock = threading.Lock()


def hold_for_graphs(runner: Any) -> None:
    """Keep ``runner`` (and what it owns) for the process's life: a graph captured its call."""
    with _graph_held_lock:
        _graph_held.setdefault(id(runner), runner)


def held_for_graphs() -> int:
    """How many runners are kept for CUDA graphs (``unimatmul.torch.stats()`` shows it)."""
    return len(_graph_held)


class ArrayAdapter:
    """What unimatmul needs to know about, and do with, one library's arrays."""

    kind = "abstract"

    def shape(self, x: Any) -> tuple[int, ...]:
        return tuple(x.shape)

    def strides(self, x: Any) -> tuple[int, ...]:
        raise NotImplementedError

    def dtype(self, x: Any) -> str:
        return canonical(str(x.dtype))

    def device(self, x: Any) -> Device:
        raise NotImplementedError

    def ptr(self, x: Any) -> int:
        raise NotImplementedError

    def pointers(self, a: Any, b: Any, out: Any, bias: Any) -> tuple[int, int, int, int | None]:
        """The addresses of a product's arrays in one call (a runner's hot path); None for
        no bias."""
        ptr = self.ptr
        return ptr(a), ptr(b), ptr(out), None if bias is None else ptr(bias)

    def same_library(self, x: Any) -> bool:
        """Whether ``x`` is an array of this adapter's library (TypeError if no array at all)."""
        return adapter_of(x) is self

    def compute_type(self, dtype: str, device: Device) -> str:
        """The precision the library's own matmul computes ``dtype`` in on ``device``."""
        return "f64" if dtype == "f64" else "f32"

    @staticmethod
    def signature(x: Any) -> tuple[Any, ...]:
        """What must not change between two calls for one prepared kernel to serve both:
        shape, strides, dtype, device and pointer alignment. Costs ~0.3 us: hot path."""
        raise NotImplementedError

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        raise NotImplementedError

    def allocator(self, shape: tuple[int, ...], dtype: str, device: Device) -> Callable[[], Any]:
        """A function that allocates an output of this shape: resolved once, called per call."""
        return functools.partial(self.empty, shape, dtype, device)

    def random_strided(
        self,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        dtype: str,
        device: Device,
        rng: np.random.Generator,
        offset: int = 0,
        *,
        fill: bool = True,
    ) -> Any:
        """Standard-normal values (``fill=False``: uninitialised) at the given strides."""
        raise NotImplementedError

    def strided_view(self, base: Any, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Any:
        """A view of the flat array ``base`` at ``offset`` with these strides (in elements)."""
        raise NotImplementedError

    def host_indices(self, indices: np.ndarray, device: Device) -> Any:
        """Integer indices made on the host, as this library's array on ``device``."""
        raise NotImplementedError

    def to_float64(self, x: Any) -> Any:
        """A float64 copy on the array's own device (the reference is computed there)."""
        raise NotImplementedError

    def to_numpy(self, x: Any) -> np.ndarray:
        raise NotImplementedError

    def fill_nan(self, x: Any) -> None:
        raise NotImplementedError

    def copy_(self, dst: Any, src: Any) -> None:
        raise NotImplementedError

    def matmul(
        self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, activation: str | None
    ) -> None:
        """The Default: what the caller's library itself does for this product."""
        raise NotImplementedError

    def reference(
        self, a: Any, b: Any, c: Any, alpha: float, beta: float, bias: Any, activation: str | None
    ) -> Any:
        """``alpha * a @ b + beta * c (+ bias, activation)`` in float64 on the arrays' device."""
        a64, b64 = self.to_float64(a), self.to_float64(b)
        ref = a64 @ b64
        if alpha != 1.0:
            ref = ref * alpha
        if beta != 0.0:
            ref = ref + beta * self.to_float64(c)
        if bias is not None:
            ref = ref + self.to_float64(bias)
        return self._activate64(ref, activation)

    def _activate64(self, x: Any, activation: str | None) -> Any:
        raise NotImplementedError

    def rel_error(self, out: Any, ref: Any) -> float:
        """``||out - ref|| / ||ref||`` in float64; inf when out has a NaN or an inf."""
        raise NotImplementedError

    def synchronize(self, device: Device) -> None:
        """Wait for the device's queued work (a no-op on the CPU)."""

    def stream(self, device: Device) -> int:
        """The caller's current stream handle on ``device`` (0 on the CPU)."""
        return 0

    def available_bytes(self, device: Device) -> int | None:
        """Memory that arrays on ``device`` can still take (None: unknown)."""
        return host_available_bytes()

    # --- the numeric check: reference and comparison, block by block on the device ---

    def block_elements(self, device: Device, *, reference: bool = False, total: int = 0) -> int:
        """Output elements per block of the check (``total``: the output's): its float64
        temporaries are a few of these, so that checking a 1 GB output never makes a
        1 GB float64 copy of it. On the host, comparisons run fastest on blocks that
        stay in the cache, and the reference's products on larger ones: up to 1/32 of a
        large output, since each BLAS call wakes a thread pool."""
        if reference:
            return min(max(1 << 20, total // 32), 1 << 23)
        return 1 << 15 if total <= SCREEN_ELEMENTS else 1 << 17

    def _math(self) -> Any:
        """The array library's namespace for ``where``, ``isfinite`` and ``sqrt``."""
        raise NotImplementedError

    def _sum(self, x: Any, axis: int) -> Any:
        return x.sum(axis=axis)

    def _amax(self, x: Any, axis: int) -> Any:
        """Largest element along ``axis``; NaN if there is one."""
        return x.max(axis=axis)

    def _sumsq(self, x: Any) -> Any:
        return (x * x).sum()

    def _like(self, x: Any, like: Any) -> Any:
        """``x`` in ``like``'s dtype (no copy if it is already)."""
        return x.astype(like.dtype, copy=False)

    def _blocks(self, shape: tuple[int, ...], elements: int) -> Iterator[tuple[slice, slice]]:
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

    def make_reference(
        self,
        ops: Operands,
        c0: Any,
        alpha: float,
        beta: float,
        activation: str | None,
        model: ErrorModel,
        device: Device,
    ) -> Reference:
        """The float64 reference of ``ops`` (C from ``c0`` when beta != 0), kept for
        :meth:`compare`; computed block by block on the operands' device.

        A small product's is computed and kept on the host instead: a few dozen tiny
        launches and their synchronisations would cost more than copying it there.
        """
        out_shape = self.shape(ops.out)
        shape3 = (1, *out_shape) if len(out_shape) == 2 else out_shape
        ref_dtype = "f64" if self.dtype(ops.out) == "f64" else "f32"
        if self.kind != "numpy" and _operand_elements(ops, self) <= HOST_CHECK_ELEMENTS:
            host = adapter_for_kind("numpy")
            moved = Operands(
                self.to_numpy(ops.a),
                self.to_numpy(ops.b),
                host.empty(out_shape, ref_dtype, CPU),
                self.to_numpy(ops.bias) if ops.bias is not None else None,
            )
            c0_host = self.to_numpy(c0) if beta != 0.0 else None
            found = host.make_reference(moved, c0_host, alpha, beta, activation, model, CPU)
            found.host = True
            return found
        a3, b3 = _as3(ops.a), _as3(ops.b)
        batch, m, n = shape3
        ref = self.empty(shape3, ref_dtype, device)
        xp = self._math()
        r2 = self.empty((batch, m), "f64", device)
        r4 = self.empty((batch, m), "f64", device) if model.inputs else None
        c2 = self.empty((batch, n), "f64", device)
        c4 = self.empty((batch, n), "f64", device) if model.inputs else None
        c3 = _as3(c0) if beta != 0.0 else None
        bias64 = self.to_float64(ops.bias) if ops.bias is not None else None
        b_done, b64 = slice(-1, -1), None  # B in float64 and its norms: once per batch range
        sumsq: list[Any] = []
        block = self.block_elements(device, reference=True, total=math.prod(shape3))
        for bs, rs in self._blocks(shape3, block):
            a64 = self.to_float64(_pick(a3, bs, batch)[:, rs])
            if bs != b_done:
                b64 = self.to_float64(_pick(b3, bs, batch))
                c2[bs] = xp.sqrt(self._sum(b64 * b64, -2))
                if c4 is not None:
                    c4[bs] = xp.sqrt(xp.sqrt(self._sum((b64 * b64) ** 2, -2)))
                b_done = bs
            pre = a64 @ b64
            if alpha != 1.0:
                pre = pre * alpha
            if c3 is not None:
                pre = pre + self.to_float64(c3[bs, rs]) * beta
            if bias64 is not None:
                pre = pre + bias64
            done = self._activate64(pre, activation)
            ref[bs, rs] = done
            sumsq.append(self._sumsq(done))
            r2[bs, rs] = xp.sqrt(self._sum(a64 * a64, -1))
            if r4 is not None:
                r4[bs, rs] = xp.sqrt(xp.sqrt(self._sum((a64 * a64) ** 2, -1)))
            del pre, done  # before the next block's: one block of float64 at a time
        found = Reference(ref, r2, c2, r4, c4, c3, bias64, alpha, beta, model)
        found.sumsq = sum(self._scalars(sumsq))
        return found

    def compare(self, out: Any, reference: Reference, device: Device, *, exact: bool | None = None) -> Check:
        """Compare ``out`` with ``reference`` element by element, on the device.

        Only a handful of scalars come back to the host; NaN and inf where the
        reference is finite count as over the bound. A large output (over
        ``SCREEN_ELEMENTS``, unless ``exact``) is first screened in the reference's own
        precision against a part of the bound that costs two passes (the output
        rounding and the summation term with the block's smallest column norm); only
        blocks where some element is not clearly within it get the whole bound. An
        output checked exactly first gets one pass against the reference's kept bounds
        (:meth:`_within`): where every element is within them, that is the whole answer;
        otherwise the elements over them are counted in a second pass.
        """
        if reference.host and self.kind != "numpy":
            return adapter_for_kind("numpy").compare(self.to_numpy(out), reference, CPU, exact=exact)
        out3 = _as3(out)
        ref3 = reference.ref
        blocks = list(
            self._blocks(tuple(ref3.shape), self.block_elements(device, total=math.prod(ref3.shape)))
        )
        if exact is None:
            exact = math.prod(ref3.shape) <= SCREEN_ELEMENTS
        if exact:
            found = self._within(out3, reference, blocks)
            if found is not None:
                return found
            full = list(range(len(blocks)))
            sq_err: list[float] = []
            screened: list[int] = []
        else:
            full, sq_err = self._screen(out3, reference, blocks)
            screened = [i for i in range(len(blocks)) if i not in set(full)]
        totals = self._full(out3, reference, [blocks[i] for i in full])
        err = math.sqrt(sum(totals[0]) + sum(sq_err))
        den = math.sqrt(reference.sumsq)
        rel = (err / den if den > 0 else err) if math.isfinite(err) else math.inf
        worst_ratio = max(totals[3] + ([1.0] if screened else []), default=0.0)
        check = Check(rel, worst_ratio, int(sum(totals[1])), int(sum(totals[2])), exact=not screened)
        if check.bad:
            index = max(range(len(full)), key=lambda i: totals[3][i])
            check.worst = self._worst(out3, reference, *blocks[full[index]])
        return check

    def _within(self, out3: Any, reference: Reference, blocks: list[tuple[slice, slice]]) -> Check | None:
        """The check of an output whose every element is within its bound, in one pass; None
        if some element is not (or is NaN or inf), for the pass that counts them.

        The difference is taken in the reference's precision (as the screen's is), and two
        scalars a block come back: the largest error/bound (NaN, read as inf, where an
        element is NaN or inf) and the squared error. Where the reference says so
        (``keep_bounds``: the tuning's memory plan counted them), each block's bound is
        made once, in the reference's dtype, and kept: a candidate's check is then a few
        launches, not dozens. A bound of 0 gives NaN: that block is counted exactly.
        """
        kept = reference.bounds
        if kept is not None and len(kept) != len(blocks):  # blocks of another size than the kept ones
            return None
        made: list[Any] = []
        worst, squares = [], []
        for i, (bs, rs) in enumerate(blocks):
            ref = reference.ref[bs, rs]
            if kept is not None:
                bound = kept[i]
            else:
                bound = self._like(self._bound(reference, self.to_float64(ref), bs, rs), ref)
                if reference.keep_bounds:
                    made.append(bound)
            diff = abs(self._like(out3[bs, rs], ref) - ref)
            with np.errstate(invalid="ignore", divide="ignore"):  # a bound of 0 (a row of zeros in A)
                worst.append((diff / bound).max())  # NaN where an element is NaN
            squares.append(self._sumsq(diff))
            del bound, diff  # one block's temporaries at a time
        if made:
            reference.bounds = made
        values = self._scalars(worst + squares)
        worst_ratio = max(values[: len(blocks)], default=0.0)
        if not worst_ratio <= 1.0:
            return None
        err = math.sqrt(sum(values[len(blocks) :]))
        den = math.sqrt(reference.sumsq)
        return Check(err / den if den > 0 else err, worst_ratio, 0, 0, exact=True)

    def _screen(
        self, out3: Any, reference: Reference, blocks: list[tuple[slice, slice]]
    ) -> tuple[list[int], list[float]]:
        """The blocks not clearly within their bound, and every block's squared error."""
        model = reference.model
        a_out = model.c_out * model.u_out * model.slope * model.weight_ref + model.u_ref
        kappa = abs(reference.alpha) * model.slope * model.sqrt_k_acc
        c2min = self._amax(-reference.c2, -1)  # minus the smallest column norm of each matrix
        screen, sq = [], []
        for bs, rs in blocks:
            ref = reference.ref[bs, rs]
            diff = abs(self._like(out3[bs, rs], ref) - ref)
            sq.append(self._sumsq(diff))
            excess = self._amax(diff - abs(ref) * a_out, -1)
            low = reference.r2[bs, rs] * (-c2min[bs])[:, None] * kappa + 1e-300
            screen.append((excess / low).max())
        # One transfer for both lists; NaN reads as inf: such a block is looked at fully.
        values = self._scalars(screen + sq)
        values, squares = values[: len(screen)], values[len(screen) :]
        return [i for i, v in enumerate(values) if not v <= 1.0], squares

    def _full(self, out3: Any, reference: Reference, blocks: list[tuple[slice, slice]]) -> list[list[float]]:
        """Squared errors, elements over the bound, NaN/inf, worst ratio: per block."""
        xp = self._math()
        sq_err, bad, nonfinite, worst = [], [], [], []
        for bs, rs in blocks:
            ref = self.to_float64(reference.ref[bs, rs])
            diff = abs(self.to_float64(out3[bs, rs]) - ref)
            bound = self._bound(reference, ref, bs, rs)
            finite = xp.isfinite(diff)
            ratio = xp.where(finite, diff / (bound + 1e-300), math.inf)
            sq_err.append(self._sumsq(xp.where(finite, diff, math.inf)))
            bad.append((~(diff <= bound)).sum())
            nonfinite.append((~finite & xp.isfinite(ref)).sum())
            worst.append(ratio.max())
        # One transfer of a few scalars per block, at the end (one sync on a GPU).
        values = self._scalars(sq_err + bad + nonfinite + worst)
        count = len(blocks)
        return [values[i * count : (i + 1) * count] for i in range(4)]

    def _bound(self, reference: Reference, ref: Any, bs: slice, rs: slice) -> Any:
        beta_c = None
        if reference.c0 is not None:
            beta_c = abs(self.to_float64(reference.c0[bs, rs])) * abs(reference.beta)
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

    def poison_guard(self, guard: Guard, value: float) -> None:
        """Fill every element of ``guard``'s buffer that is not the output's with ``value``."""
        guard.base[guard.outside] = value

    def guard_writes(self, guard: Guard, value: float) -> tuple[int, str]:
        """How many elements outside the output no longer hold ``value`` (poisoned by
        :meth:`poison_guard`), and where the first of them is, as text ("" if none)."""
        got = self.to_float64(guard.base[guard.outside])
        changed = ~self._math().isnan(got) if math.isnan(value) else got != value
        (count,) = self._scalars([changed.sum()])
        if count == 0:
            return 0, ""
        first = int(np.flatnonzero(self.to_numpy(changed))[0])
        return int(count), guard.where(int(guard.host[first]))

    def _scalars(self, parts: list[Any]) -> list[float]:
        """Python floats of 0-d arrays of this library (NaN read as inf)."""
        values = [float(x) for x in parts]
        return [v if v == v else math.inf for v in values]

    def _worst(self, out3: Any, reference: Reference, bs: slice, rs: slice) -> str:
        """The element furthest over its bound in one block, as text."""
        ref = self.to_numpy(reference.ref[bs, rs]).astype(np.float64)
        got = self.to_numpy(out3[bs, rs]).astype(np.float64)
        bound = self.to_numpy(self._bound(reference, self.to_float64(reference.ref[bs, rs]), bs, rs))
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


#: Products with at most this many elements of A, B and C together are checked on the
#: host (see ArrayAdapter.make_reference).
HOST_CHECK_ELEMENTS = 1 << 16
#: Outputs with more elements are screened before the whole bound is computed
#: (see ArrayAdapter.compare).
SCREEN_ELEMENTS = 1 << 22


def _operand_elements(ops: Operands, adapter: ArrayAdapter) -> int:
    return sum(math.prod(adapter.shape(x)) for x in (ops.a, ops.b, ops.out))


def _as3(x: Any) -> Any:
    """A ``[batch, rows, cols]`` view of a 2-D or 3-D array (a 2-D one is a batch of one)."""
    return x[None] if len(x.shape) == 2 else x


def _pick(x3: Any, bs: slice, batch: int) -> Any:
    """Batch range ``bs`` of an operand that may be broadcast (one matrix for all)."""
    return x3 if x3.shape[0] == 1 and batch > 1 else x3[bs]


def _erf64(x: np.ndarray) -> np.ndarray:
    # NumPy has no erf; math.erf vectorised is exact and fast enough for references.
    return np.vectorize(math.erf, otypes=[np.float64])(x)


class NumpyAdapter(ArrayAdapter):
    kind = "numpy"

    @staticmethod
    def signature(x: Any) -> tuple[Any, ...]:
        return (x.shape, x.strides, x.dtype.num, x.__array_interface__["data"][0] & 15)

    def strides(self, x: Any) -> tuple[int, ...]:
        size = x.itemsize
        return tuple(s // size for s in x.strides)

    def device(self, x: Any) -> Device:
        return CPU

    def ptr(self, x: Any) -> int:
        return int(x.__array_interface__["data"][0])

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        return np.empty(shape, dtype=_numpy_dtype(dtype))

    def allocator(self, shape: tuple[int, ...], dtype: str, device: Device) -> Callable[[], Any]:
        return functools.partial(np.empty, shape, dtype=_numpy_dtype(dtype))  # no Python frame per call

    def random_strided(
        self,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        dtype: str,
        device: Device,
        rng: np.random.Generator,
        offset: int = 0,
        *,
        fill: bool = True,
    ) -> Any:
        npdt = _numpy_dtype(dtype)
        size = offset + 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
        # Drawn in float32 (float64 only for float64): a float64 draw of a 1 GB float32
        # operand would need 2 GB more while it is converted.
        draw = np.float64 if npdt == np.float64 else np.float32
        if fill:
            base = rng.standard_normal(size, dtype=draw).astype(npdt, copy=False)
        else:
            base = np.empty(size, dtype=npdt)
        return np.lib.stride_tricks.as_strided(
            base[offset:], shape=shape, strides=tuple(s * npdt.itemsize for s in strides)
        )

    def strided_view(self, base: Any, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Any:
        return np.lib.stride_tricks.as_strided(
            base[offset:], shape=shape, strides=tuple(s * base.itemsize for s in strides)
        )

    def host_indices(self, indices: np.ndarray, device: Device) -> Any:
        return indices

    def to_float64(self, x: Any) -> Any:
        return np.asarray(x, dtype=np.float64)

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def fill_nan(self, x: Any) -> None:
        x[...] = np.nan

    def copy_(self, dst: Any, src: Any) -> None:
        dst[...] = src

    def matmul(
        self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, activation: str | None
    ) -> None:
        if alpha == 1.0 and beta == 0.0 and bias is None and activation is None:
            np.matmul(a, b, out=out)
            return
        result = np.matmul(a, b)
        if alpha != 1.0:
            result *= result.dtype.type(alpha)
        if beta != 0.0:
            result += result.dtype.type(beta) * out
        if bias is not None:
            result += bias
        out[...] = _activate_numpy(result, activation)

    def _activate64(self, x: Any, activation: str | None) -> Any:
        return _activate_numpy(x, activation)

    def _math(self) -> Any:
        return np

    def _sumsq(self, x: Any) -> Any:
        flat = np.ravel(x)
        return np.dot(flat, flat)

    def rel_error(self, out: Any, ref: Any) -> float:
        diff = np.asarray(out, dtype=np.float64) - ref
        num = float(np.linalg.norm(diff.ravel()))
        den = float(np.linalg.norm(np.asarray(ref).ravel()))
        if not math.isfinite(num):
            return math.inf
        return num / den if den > 0 else num


def _activate_numpy(x: np.ndarray, activation: str | None) -> np.ndarray:
    if activation is None:
        return x
    if activation == "relu":
        return np.maximum(x, 0)
    x64 = x.astype(np.float64)
    if activation == "gelu":
        y = 0.5 * x64 * (1.0 + _erf64(x64 / math.sqrt(2.0)))
    elif activation == "gelu_tanh":
        y = 0.5 * x64 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)))
    else:
        msg = f"unknown activation {activation!r}"
        raise ValueError(msg)
    return y.astype(x.dtype)


def _numpy_dtype(dtype: str) -> np.dtype[Any]:
    try:
        return np.dtype({"f64": np.float64, "f32": np.float32, "f16": np.float16}[dtype])
    except KeyError:
        msg = f"NumPy has no {dtype} arrays; use torch tensors for {dtype}"
        raise TypeError(msg) from None


class TorchAdapter(ArrayAdapter):
    kind = "torch"

    @staticmethod
    def signature(x: Any) -> tuple[Any, ...]:
        return (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15)

    def __init__(self) -> None:
        import torch  # only reached when a torch tensor is passed in

        self.torch = torch
        self._hip = bool(getattr(torch.version, "hip", None))
        self._torch_devices: dict[Device, Any] = {}
        self._dtypes = {
            "f64": torch.float64,
            "f32": torch.float32,
            "f16": torch.float16,
            "bf16": torch.bfloat16,
        }
        for name, attr in (("f8e4m3", "float8_e4m3fn"), ("f8e5m2", "float8_e5m2")):
            if hasattr(torch, attr):
                self._dtypes[name] = getattr(torch, attr)

    def strides(self, x: Any) -> tuple[int, ...]:
        return tuple(x.stride())

    def device(self, x: Any) -> Device:
        dev = x.device
        if dev.type == "cpu":
            return CPU
        if dev.type == "cuda":
            return Device("hip" if self._hip else "cuda", dev.index or 0)
        return Device(dev.type, dev.index or 0)

    def torch_device(self, device: Device) -> Any:
        # A torch.device object, made once per Device: torch parses a device string
        # on every allocation, which the cached call's output allocation would pay.
        found = self._torch_devices.get(device)
        if found is None:
            text = "cpu" if device.kind == "cpu" else f"cuda:{device.index}"
            found = self._torch_devices[device] = self.torch.device(text)
        return found

    def compute_type(self, dtype: str, device: Device) -> str:
        if dtype == "f32" and device.kind != "cpu" and self.torch.backends.cuda.matmul.allow_tf32:
            return "tf32"
        return super().compute_type(dtype, device)

    def torch_dtype(self, dtype: str) -> Any:
        try:
            return self._dtypes[dtype]
        except KeyError:
            msg = f"this torch has no {dtype} dtype"
            raise TypeError(msg) from None

    def ptr(self, x: Any) -> int:
        return int(x.data_ptr())

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        return self.torch.empty(shape, dtype=self.torch_dtype(dtype), device=self.torch_device(device))

    def allocator(self, shape: tuple[int, ...], dtype: str, device: Device) -> Callable[[], Any]:
        # torch.empty with its dtype and device objects bound: no lookups per call.
        return functools.partial(
            self.torch.empty, shape, dtype=self.torch_dtype(dtype), device=self.torch_device(device)
        )

    def random_strided(
        self,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        dtype: str,
        device: Device,
        rng: np.random.Generator,
        offset: int = 0,
        *,
        fill: bool = True,
    ) -> Any:
        torch = self.torch
        size = offset + 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
        if not fill:
            base = torch.empty(size, dtype=self.torch_dtype(dtype), device=self.torch_device(device))
            return base.as_strided(shape, strides, offset)
        gen = torch.Generator(device=self.torch_device(device))
        gen.manual_seed(int(rng.integers(0, 2**62)))
        base = torch.randn(size, generator=gen, dtype=torch.float32, device=self.torch_device(device))
        base = base.to(self.torch_dtype(dtype))
        return base.as_strided(shape, strides, offset)

    def strided_view(self, base: Any, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Any:
        return base.as_strided(shape, strides, base.storage_offset() + offset)

    def host_indices(self, indices: np.ndarray, device: Device) -> Any:
        return self.torch.from_numpy(indices).to(self.torch_device(device))

    def to_float64(self, x: Any) -> Any:
        return x.to(self.torch.float64)

    def to_numpy(self, x: Any) -> np.ndarray:
        return x.detach().to("cpu", self.torch.float64).numpy()

    def fill_nan(self, x: Any) -> None:
        x.fill_(float("nan"))

    def copy_(self, dst: Any, src: Any) -> None:
        dst.copy_(src)

    def matmul(
        self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, activation: str | None
    ) -> None:
        torch = self.torch
        if alpha == 1.0 and beta == 0.0 and bias is None:
            torch.matmul(a, b, out=out)
        elif out.dim() == 2 and beta == 0.0 and bias is not None and alpha == 1.0:
            torch.addmm(bias, a, b, out=out)
        elif out.dim() == 2:
            if beta == 0.0:
                torch.matmul(a, b, out=out)
                if alpha != 1.0:
                    out.mul_(alpha)
            else:
                out.addmm_(a, b, beta=beta, alpha=alpha)
            if bias is not None:
                out.add_(bias)
        else:
            a3 = a if a.dim() == 3 else a.expand(out.shape[0], *a.shape)
            b3 = b if b.dim() == 3 else b.expand(out.shape[0], *b.shape)
            if beta == 0.0:
                torch.bmm(a3, b3, out=out)
                if alpha != 1.0:
                    out.mul_(alpha)
            else:
                out.baddbmm_(a3, b3, beta=beta, alpha=alpha)
            if bias is not None:
                out.add_(bias)
        if activation is not None:
            self._activate_(out, activation)

    def _activate_(self, x: Any, activation: str) -> None:
        functional = self.torch.nn.functional
        if activation == "relu":
            x.relu_()
        elif activation == "gelu":
            x.copy_(functional.gelu(x))
        elif activation == "gelu_tanh":
            x.copy_(functional.gelu(x, approximate="tanh"))
        else:
            msg = f"unknown activation {activation!r}"
            raise ValueError(msg)

    def _activate64(self, x: Any, activation: str | None) -> Any:
        if activation is not None:
            self._activate_(x, activation)
        return x

    def _math(self) -> Any:
        return self.torch

    def _amax(self, x: Any, axis: int) -> Any:
        if axis == -1 and x.dim() > 2:
            # On the CPU, torch reduces [1, r, n] over its last dimension some 2000x slower
            # than the same [r, n] (torch 2.13): flatten the leading dimensions first.
            return x.reshape(-1, x.shape[-1]).amax(dim=-1).reshape(x.shape[:-1])
        return x.amax(dim=axis)

    def _like(self, x: Any, like: Any) -> Any:
        return x.to(like.dtype)

    def block_elements(self, device: Device, *, reference: bool = False, total: int = 0) -> int:
        # A GPU wants few, large launches; on the host, torch's comparisons stay below its
        # parallel grain (32768 elements): on a busy machine each parallel region waits
        # milliseconds for a descheduled thread.
        if device.kind == "cpu":
            return super().block_elements(device, reference=True, total=total) if reference else 1 << 14
        return 1 << 22

    def _scalars(self, parts: list[Any]) -> list[float]:
        if not parts:
            return []
        values = self.torch.stack([x.to(self.torch.float64) for x in parts]).tolist()
        return [v if v == v else math.inf for v in values]

    def available_bytes(self, device: Device) -> int | None:
        if device.kind == "cpu":
            return host_available_bytes()
        cuda = self.torch.cuda
        try:
            free, _ = cuda.mem_get_info(device.index)
            # Memory torch's caching allocator holds but no tensor uses is ours to take too.
            cached = cuda.memory_reserved(device.index) - cuda.memory_allocated(device.index)
        except Exception:
            return None
        return int(free) + max(0, int(cached))

    def rel_error(self, out: Any, ref: Any) -> float:
        diff = out.to(self.torch.float64) - ref
        num = float(self.torch.linalg.vector_norm(diff))
        den = float(self.torch.linalg.vector_norm(ref))
        if not math.isfinite(num):
            return math.inf
        return num / den if den > 0 else num

    def synchronize(self, device: Device) -> None:
        if device.kind != "cpu":
            self.torch.cuda.synchronize(device.index)

    def stream(self, device: Device) -> int:
        if device.kind == "cpu":
            return 0
        return int(self.torch.cuda.current_stream(device.index).cuda_stream)


class CupyAdapter(ArrayAdapter):
    kind = "cupy"

    @staticmethod
    def signature(x: Any) -> tuple[Any, ...]:
        return (x.shape, x.strides, x.dtype.num, x.device.id, x.data.ptr & 15)

    def __init__(self) -> None:
        import cupy  # only reached when a CuPy array is passed in

        self.cupy = cupy

    def strides(self, x: Any) -> tuple[int, ...]:
        size = x.itemsize
        return tuple(s // size for s in x.strides)

    def device(self, x: Any) -> Device:
        return Device("cuda", int(x.device.id))

    def ptr(self, x: Any) -> int:
        return int(x.data.ptr)

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        with self.cupy.cuda.Device(device.index):
            return self.cupy.empty(shape, dtype=_numpy_dtype(dtype))

    def random_strided(
        self,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        dtype: str,
        device: Device,
        rng: np.random.Generator,
        offset: int = 0,
        *,
        fill: bool = True,
    ) -> Any:
        cupy = self.cupy
        npdt = _numpy_dtype(dtype)
        size = offset + 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
        with cupy.cuda.Device(device.index):
            if fill:
                gen = cupy.random.default_rng(int(rng.integers(0, 2**62)))
                base = gen.standard_normal(size, dtype=np.float32).astype(npdt, copy=False)
            else:
                base = cupy.empty(size, dtype=npdt)
            return cupy.lib.stride_tricks.as_strided(
                base[offset:], shape=shape, strides=tuple(s * npdt.itemsize for s in strides)
            )

    def strided_view(self, base: Any, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Any:
        return self.cupy.lib.stride_tricks.as_strided(
            base[offset:], shape=shape, strides=tuple(s * base.itemsize for s in strides)
        )

    def host_indices(self, indices: np.ndarray, device: Device) -> Any:
        with self.cupy.cuda.Device(device.index):
            return self.cupy.asarray(indices)

    def to_float64(self, x: Any) -> Any:
        return x.astype(self.cupy.float64)

    def to_numpy(self, x: Any) -> np.ndarray:
        return self.cupy.asnumpy(x).astype(np.float64)

    def fill_nan(self, x: Any) -> None:
        x.fill(np.nan)

    def copy_(self, dst: Any, src: Any) -> None:
        dst[...] = src

    def matmul(
        self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, activation: str | None
    ) -> None:
        cupy = self.cupy
        if alpha == 1.0 and beta == 0.0 and bias is None and activation is None:
            cupy.matmul(a, b, out=out)
            return
        result = cupy.matmul(a, b)
        if alpha != 1.0:
            result *= alpha
        if beta != 0.0:
            result += beta * out
        if bias is not None:
            result += bias
        out[...] = self._activate64(result, activation)

    def _activate64(self, x: Any, activation: str | None) -> Any:
        cupy = self.cupy
        if activation is None:
            return x
        if activation == "relu":
            return cupy.maximum(x, 0)
        x64 = x.astype(cupy.float64)
        if activation == "gelu":
            import cupyx.scipy.special as special

            y = 0.5 * x64 * (1.0 + special.erf(x64 / math.sqrt(2.0)))
        elif activation == "gelu_tanh":
            y = 0.5 * x64 * (1.0 + cupy.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)))
        else:
            msg = f"unknown activation {activation!r}"
            raise ValueError(msg)
        return y.astype(x.dtype)

    def _math(self) -> Any:
        return self.cupy

    def block_elements(self, device: Device, *, reference: bool = False, total: int = 0) -> int:
        return 1 << 22

    def available_bytes(self, device: Device) -> int | None:
        cupy = self.cupy
        try:
            with cupy.cuda.Device(device.index):
                free, _ = cupy.cuda.runtime.memGetInfo()
                pooled = cupy.get_default_memory_pool().free_bytes()
        except Exception:
            return None
        return int(free) + int(pooled)

    def rel_error(self, out: Any, ref: Any) -> float:
        cupy = self.cupy
        num = float(cupy.linalg.norm((out.astype(cupy.float64) - ref).ravel()))
        den = float(cupy.linalg.norm(ref.ravel()))
        if not math.isfinite(num):
            return math.inf
        return num / den if den > 0 else num

    def synchronize(self, device: Device) -> None:
        with self.cupy.cuda.Device(device.index):
            self.cupy.cuda.get_current_stream().synchronize()

    def stream(self, device: Device) -> int:
        with self.cupy.cuda.Device(device.index):
            return int(self.cupy.cuda.get_current_stream().ptr)


_FACTORIES: dict[str, type[ArrayAdapter]] = {
    "numpy": NumpyAdapter,
    "torch": TorchAdapter,
    "cupy": CupyAdapter,
}
_BY_TYPE: dict[type, ArrayAdapter] = {}
_BY_KIND: dict[str, ArrayAdapter] = {}


def adapter_for_kind(kind: str) -> ArrayAdapter:
    """The adapter of one array library by name (``numpy``, ``torch``, ``cupy``)."""
    found = _BY_KIND.get(kind)
    if found is None:
        try:
            factory = _FACTORIES[kind]
        except KeyError:
            msg = f"unknown array kind {kind!r}; valid: {', '.join(_FACTORIES)}"
            raise ValueError(msg) from None
        found = _BY_KIND[kind] = factory()
    return found


def adapter_of(x: Any) -> ArrayAdapter:
    """The adapter for an array, found by its type and cached."""
    cls = type(x)
    found = _BY_TYPE.get(cls)
    if found is not None:
        return found
    root = cls.__module__.split(".", 1)[0]
    if issubclass(cls, np.ndarray):
        _check_ndarray_subclass(cls)
        root = "numpy"
    if root not in _FACTORIES:
        msg = (
            f"unimatmul.matmul takes NumPy arrays, torch tensors or CuPy arrays, "
            f"not {cls.__module__}.{cls.__qualname__}"
        )
        raise TypeError(msg)
    found = _BY_TYPE[cls] = adapter_for_kind(root)
    return found


def operands_key(a: Any, b: Any, out: Any, bias: Any) -> tuple[ArrayAdapter, tuple[Any, ...]]:
    """The adapter of ``a``, and the signatures of a call's arrays (with their types: the
    array library, and for NumPy the array type matmul returns), in one call: hot path.
    AttributeError for an operand that is not an array of ``a``'s library."""
    adapter = _BY_TYPE.get(type(a)) or adapter_of(a)
    signature = adapter.signature
    return adapter, (
        type(a),
        type(b),
        signature(a),
        signature(b),
        None if out is None else signature(out),
        None if bias is None else signature(bias),
    )


def _check_ndarray_subclass(cls: type) -> None:
    """Refuse the ndarray subclasses whose ``numpy.matmul`` result their own code decides
    (so that unimatmul cannot give the same); others (np.matrix, plain subclasses) are taken
    as NumPy arrays, and the API returns the type numpy.matmul returns."""
    if cls is np.ndarray:
        return
    name = f"{cls.__module__}.{cls.__qualname__}"
    if issubclass(cls, np.ma.MaskedArray):
        msg = (
            f"unimatmul.matmul takes no masked arrays ({name}): numpy.matmul does not carry "
            "their mask through a product either (it fails, or masks element by element); "
            "use numpy.ma.dot for a masked product, or pass x.filled(0) for the data"
        )
        raise TypeError(msg)
    for hook in ("__array_ufunc__", "__array_function__", "__array_wrap__"):
        if getattr(cls, hook, None) is not getattr(np.ndarray, hook):
            msg = (
                f"unimatmul.matmul cannot follow numpy.matmul for {name}: its own {hook} "
                "decides what numpy.matmul returns; call numpy.matmul, or pass numpy.asarray(x)"
            )
            raise TypeError(msg)


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


# --- what the harness checks a candidate on, besides its reference ---------------------

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


#: Characters of the inputs' bands in the checks after timing (see structure_inputs): A's
#: rows (or, with fewer than five rows, its columns) and B's columns.
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
    xp = adapter._math()
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
        elif character == "integers":
            v[...] = xp.clip(xp.round(v * 2.0), -4.0, 4.0)
        elif character == "magnitudes":
            v[..., ::2] *= big
            v[..., 1::2] *= small

    rows = a.shape[-2] >= len(A_CHARACTERS)
    for i, v in enumerate(bands(a, len(A_CHARACTERS), -2 if rows else -1)):
        give(v, A_CHARACTERS[(i + variant) % len(A_CHARACTERS)])
    for i, v in enumerate(bands(b, len(B_CHARACTERS), -1)):
        give(v, B_CHARACTERS[(i + variant) % len(B_CHARACTERS)])
