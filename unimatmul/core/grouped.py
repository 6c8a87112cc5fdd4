"""Grouped GEMMs in the vocabulary: their Problems, operands, reference and Default.

A grouped GEMM is what ``torch._grouped_mm(a, b, offs)`` (``F.grouped_mm``) computes:
one product per group, the groups cut out of one operand dimension by ``offs`` (int32,
``offs[g]`` the end of group g, each group starting where the previous one ended):

* 2-D ``a [M, K]`` x 3-D ``b [G, K, N]`` (``jagged == "m"``, the MoE forward): the rows
  ``offs[g-1]:offs[g]`` of ``a`` times ``b[g]`` give those rows of ``out [M, N]``;
  rows past ``offs[-1]`` are not written (as torch, whose output there is undefined);
* 2-D ``a [M, K]`` x 2-D ``b [K, N]`` (``"k"``, the weight gradient): ``out [G, M, N]``,
  ``out[g] = a[:, offs[g-1]:offs[g]] @ b[offs[g-1]:offs[g]]`` (zero for an empty group);
* 3-D ``a [G, M, K]`` x 2-D ``b [K, N]`` (``"n"``): the columns ``offs[g-1]:offs[g]`` of
  ``out [M, N]`` are ``a[g] @ b[:, offs[g-1]:offs[g]]``;
* 3-D ``a [G, M, K]`` x 3-D ``b [G, K, N]`` (``"none"``, no offs): ``out = bmm(a, b)``.

Its Problem is a ``grouped_gemm``: ``batch`` is the group count G and the jagged
dimension's size is the *bucket* of the call's total (:func:`bucket_extent`, the next
power of two), so that a serving process, whose ``offs`` change every call, finds one
Problem for every call of a bucket. ``offs`` itself is never read to build the key: on a
GPU that is a device-to-host copy and a synchronisation on every call, and impossible
while a CUDA graph is captured. Every candidate must be right for every ``offs``; the
harness checks each on several distributions (:data:`DISTRIBUTIONS`) and times it on a
mix of them (``docs/grouped.md``).

A grouped runner is a Runner called with one more argument,
``runner(a, b, out, alpha, beta, bias, offs)`` (alpha 1, beta 0, bias None: torch has
neither); its Default, :class:`GroupedDefaultRunner`, is ``torch._grouped_mm``. Torch
tensors only; torch is imported through the array adapter, never at import time.

torch's grouped product has no ``out=``: it makes its own output. Where a door allocated
``out`` itself (no ``out`` from the caller), it *lends* it for the call (:func:`call_lending`):
Default then returns torch's output in its place instead of copying into it
(:func:`serve_default`), and the door returns what the runner returned, if anything. So
a call that runs Default through a wrapper (a confirmation window's Default turns, a tie
under CUDA-graph capture) costs what ``torch._grouped_mm`` costs, as the harness times
it. On the H200 the copy cost 15-23 us a call at 1024 tokens, 4-11 % of the product.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from unimatmul.core._backend import DEFAULT, Candidate
from unimatmul.core.arrays import ArrayAdapter, Device, Operands
from unimatmul.core.dtypes import ITEMSIZE
from unimatmul.core.errors import DefaultFailed
from unimatmul.core.problem import GROUPED_DTYPES, EmptyProduct, Problem, matrix_layout, pointer_alignment

#: The token distributions the harness draws ``offs`` from: its rotated input sets take
#: turns of ``skewed`` and ``uniform`` (what it times), and its checks after timing use
#: ``one`` and ``tail`` in place, so every candidate is checked on each of them.
#: ``skewed``: a few groups hold most rows (Zipf-like router load) and one group is
#: empty; ``uniform``: rows spread evenly at random; ``one``: one group holds every row,
#: the others are empty; ``tail``: empty groups, group starts at unaligned positions
#: (where the device allows them) and rows past ``offs[-1]`` that no group covers.
DISTRIBUTIONS = ("skewed", "uniform", "one", "tail")
#: The share of a bucket's rows that the timed sets' "low" parts route (the MoE forward):
#: a bucket holds totals from half its rows to all of them, and a tile that fits the upper
#: edge can lose in the lower part (a 128-row tile at 96 rows a group on the H200).
LOW_FILL = 0.625
#: And the middle of the bucket, with uniform routing: there every group holds about the
#: same rows, so a kernel's time steps with the rows a group as its row tiles fill, and a
#: step between the edges is missed at both (DeepSeek-V2-Lite's gate/up at 6144 of 8192
#: rows, 96 a group, lost 6 % to torch on the H200 with a choice that won at 80 and 128).
MID_FILL = 0.75
#: The timed sets' parts (distribution, share of the rows): sets take turns of them.
TIMED_PARTS = (("skewed", 1.0), ("uniform", 1.0))
TIMED_PARTS_M = (*TIMED_PARTS, ("skewed", LOW_FILL), ("uniform", LOW_FILL), ("uniform", MID_FILL))

_FORMS = {(2, 3): "m", (2, 2): "k", (3, 2): "n", (3, 3): "none"}


class GroupedInputError(RuntimeError, ValueError):
    """A grouped call torch would refuse: a RuntimeError, as torch's own, and a ValueError."""


def bucket_extent(total: int) -> int:
    """The bucket of a jagged dimension's total: the next power of two (``total`` itself
    when it is one). Calls up to twice apart share a choice: rows per group then differ by
    at most 2x within a bucket, the step between the tile sizes grouped kernels are built
    from (16, 32, 64, 128 rows), so one kernel stays right for the whole bucket."""
    return 1 << max(total - 1, 0).bit_length()


def _fail(msg: str) -> GroupedInputError:
    return GroupedInputError(f"grouped_matmul: {msg}")


def _check_strides(adapter: ArrayAdapter, x: Any, name: str) -> None:
    """torch's own rule (GroupedMMUtils.h): 16-byte aligned data, a unit stride in one of
    the last two dimensions and the other stride a multiple of 16 bytes."""
    shape, strides = adapter.shape(x), adapter.strides(x)
    align = 16 // ITEMSIZE[adapter.dtype(x)]
    if adapter.ptr(x) % 16:
        raise _fail(
            f"{name}'s data must be aligned to 16 bytes (torch._grouped_mm), got address {adapter.ptr(x):#x}"
        )
    if strides[-2] == 1 and strides[-1] >= max(1, shape[-2]):
        ld = strides[-1]
    elif strides[-1] == 1 and strides[-2] >= max(1, shape[-1]):
        ld = strides[-2]
    else:
        raise _fail(f"invalid strides/sizes of {name}: strides {strides} for sizes {shape}")
    if ld % align:
        raise _fail(f"{name}'s strides should be multiples of 16 bytes, got {strides} (torch._grouped_mm)")


def grouped_shapes(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], groups: int
) -> tuple[str, tuple[int, ...]]:
    """(jagged dimension, output shape) of a grouped call; ``groups``: offs' length (unused
    for 3-D x 3-D); :class:`GroupedInputError` for ranks of no form."""
    jagged = _FORMS.get((len(a_shape), len(b_shape)))
    if jagged is None:
        raise _fail(f"mat_a and mat_b have to be 2 or 3d, got shapes {tuple(a_shape)} and {tuple(b_shape)}")
    if jagged == "m":
        return jagged, (a_shape[0], b_shape[-1])
    if jagged == "k":
        return jagged, (groups, a_shape[0], b_shape[1])
    if jagged == "n":
        return jagged, (a_shape[1], b_shape[1])
    return jagged, (a_shape[0], a_shape[1], b_shape[-1])


def grouped_problem_of(
    adapter: ArrayAdapter,
    a: Any,
    b: Any,
    offs: Any,
    *,
    bias: Any = None,
    out_dtype: Any = None,
    out: Any = None,
) -> Problem:
    """The grouped-GEMM Problem of a call on the caller's own tensors.

    Checks the operands as ``torch._grouped_mm`` does and raises
    :class:`GroupedInputError` (a RuntimeError, as torch's) with torch's reason;
    :class:`~unimatmul.core.problem.EmptyProduct` for valid operands with an empty
    dimension (torch computes those). ``offs``' values are never read.
    """
    if adapter.kind != "torch":
        msg = f"grouped_matmul takes torch tensors, not {type(a).__module__}.{type(a).__name__}"
        raise TypeError(msg)
    device = adapter.device(a)
    for name, x in (("b", b), ("offs", offs), ("bias", bias), ("out", out)):
        if x is None:
            continue
        if not adapter.same_library(x):
            msg = f"grouped_matmul: {name} is a {type(x).__name__}, but a is a {type(a).__name__}"
            raise TypeError(msg)
        if adapter.device(x) != device:
            raise _fail(f"a is on {device} but {name} is on {adapter.device(x)}")
    dtype = adapter.dtype(a)
    for name, x in (("mat_a", a), ("mat_b", b)):
        if adapter.dtype(x) not in GROUPED_DTYPES:
            raise _fail(
                f"expected {name} to be a float32, bfloat16 or float16 matrix, got {adapter.dtype(x)}"
            )
    a_shape, b_shape = adapter.shape(a), adapter.shape(b)
    for name, shape in (("mat_a", a_shape), ("mat_b", b_shape)):
        if len(shape) not in (2, 3):
            raise _fail(f"{name} has to be 2 or 3d, got shape {shape}")
    jagged = _FORMS[(len(a_shape), len(b_shape))]
    if jagged != "k" and a_shape[-1] != b_shape[-2]:
        raise _fail(f"contraction dimension of mat_a {a_shape} and mat_b {b_shape} must match")
    _check_strides(adapter, a, "mat_a")
    _check_strides(adapter, b, "mat_b")
    if (offs is None) != (jagged == "none"):
        raise _fail(
            "have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d "
            f"(got mat_a {a_shape}, mat_b {b_shape}, offs {'None' if offs is None else 'given'})"
        )
    groups = 0
    if offs is not None:
        if len(adapter.shape(offs)) != 1:
            raise _fail(f"offs has to be 1D, got shape {adapter.shape(offs)}")
        if str(offs.dtype) != "torch.int32":
            raise _fail(f"offsets have to be int32, got {offs.dtype}")
        groups = adapter.shape(offs)[0]
    if bias is not None:
        raise _fail("bias not supported yet (torch._grouped_mm takes none)")
    if out_dtype is not None and adapter.torch_dtype(dtype) != out_dtype:  # type: ignore[attr-defined]
        raise _fail(f"grouped gemm output dtype must match mat_a's dtype {dtype}, got {out_dtype}")
    if adapter.dtype(b) != dtype:
        raise _fail(f"expected mat_a and mat_b to have the same dtype, but got {dtype} != {adapter.dtype(b)}")
    if jagged == "m" and groups != b_shape[0]:
        raise _fail(f"matrix batch sizes have to match: offs has {groups} groups and mat_b {b_shape[0]}")
    if jagged == "n" and groups != a_shape[0]:
        raise _fail(f"matrix batch sizes have to match: offs has {groups} groups and mat_a {a_shape[0]}")
    if jagged == "none" and a_shape[0] != b_shape[0]:
        raise _fail(f"batched dimension has to match: mat_a {a_shape} and mat_b {b_shape}")
    if jagged == "k" and a_shape[1] != b_shape[0]:
        # torch itself does not check this; a group past the shorter one then fails or
        # reads a different range of each: refused here, so no offs can mean two things.
        raise _fail(
            f"mat_a's columns ({a_shape[1]}) and mat_b's rows ({b_shape[0]}) must match: offs cuts both"
        )
    _, out_shape = grouped_shapes(a_shape, b_shape, groups)
    if out is not None:
        if adapter.shape(out) != out_shape:
            raise _fail(f"out has shape {adapter.shape(out)}, expected {out_shape}")
        if adapter.dtype(out) != dtype:
            msg = f"grouped_matmul: out is {adapter.dtype(out)}, expected {dtype} like mat_a"
            raise TypeError(msg)
    m = a_shape[-2]
    k = a_shape[-1]
    n = b_shape[-1]
    batch = groups if jagged != "none" else a_shape[0]
    if min(m, n, k, batch) < 1:
        raise EmptyProduct(f"grouped_matmul: empty operands (m={m}, n={n}, k={k}, groups={batch})", out_shape)
    trans_a, lda = matrix_layout(a_shape, adapter.strides(a), "mat_a")
    trans_b, ldb = matrix_layout(b_shape, adapter.strides(b), "mat_b")
    ldc, stride_c = out_shape[-1], (out_shape[-2] * out_shape[-1] if len(out_shape) == 3 else 0)
    if out is not None:
        o_trans, ldc = matrix_layout(out_shape, adapter.strides(out), "out")
        if o_trans and out_shape[-2] > 1 and out_shape[-1] > 1:
            raise _fail(f"out must be row-major, got strides {adapter.strides(out)}")
        stride_c = adapter.strides(out)[0] if len(out_shape) == 3 else 0
    # The jagged dimension's total is bucketed, and so is a leading dimension that is
    # exactly that total (a tight layout): one Problem for every call of the bucket.
    if jagged == "m":
        m = bucket_extent(m)
        lda = _bucketed_ld(lda, a_shape[0], m) if trans_a else lda
    elif jagged == "k":
        k = bucket_extent(k)
        lda = lda if trans_a else _bucketed_ld(lda, a_shape[1], k)
        ldb = _bucketed_ld(ldb, b_shape[0], k) if trans_b else ldb
    elif jagged == "n":
        n = bucket_extent(n)
        ldb = ldb if trans_b else _bucketed_ld(ldb, b_shape[1], n)
        ldc = _bucketed_ld(ldc, out_shape[1], n)
    strides_a, strides_b = adapter.strides(a), adapter.strides(b)
    ptrs = [adapter.ptr(a), adapter.ptr(b)] + ([adapter.ptr(out)] if out is not None else [])
    return Problem(
        m=m,
        n=n,
        k=k,
        batch=batch,
        dtype_a=dtype,
        dtype_b=dtype,
        dtype_c=dtype,
        compute=adapter.compute_type(dtype, device),
        trans_a=trans_a,
        trans_b=trans_b,
        lda=lda,
        ldb=ldb,
        ldc=ldc,
        stride_a=strides_a[0] if len(a_shape) == 3 else 0,
        stride_b=strides_b[0] if len(b_shape) == 3 else 0,
        stride_c=stride_c,
        align=pointer_alignment(*ptrs),
        op="grouped_gemm",
        jagged=jagged,
    )


def _bucketed_ld(ld: int, extent: int, bucket: int) -> int:
    return bucket if ld <= extent else max(ld, bucket)


def grouped_problem(
    groups: int, m: int, n: int, k: int, dtype: str = "bf16", *, jagged: str = "m", trans_b: bool = True
) -> Problem:
    """The grouped GEMM of an MoE layer's experts: ``x[m, k]`` (the rows of all groups,
    m bucketed) times ``w[g].t()`` for weights ``w [groups, n, k]`` (``trans_b``), as
    Hugging Face's ``grouped_mm`` experts call it; ``jagged`` picks another form."""
    extent = {"m": m, "k": k, "n": n}.get(jagged)
    if extent is not None:
        extent = bucket_extent(extent)
        m, k, n = (
            (extent if jagged == "m" else m),
            (extent if jagged == "k" else k),
            (extent if jagged == "n" else n),
        )
    shapes = {"m": ((m, k), (groups, k, n)), "k": ((m, k), (k, n)), "n": ((groups, m, k), (k, n))}
    a_shape, b_shape = shapes.get(jagged, ((groups, m, k), (groups, k, n)))
    tb = trans_b and len(b_shape) == 3
    return Problem(
        m=m,
        n=n,
        k=k,
        batch=groups,
        dtype_a=dtype,
        dtype_b=dtype,
        dtype_c=dtype,
        compute="f32",
        trans_b=tb,
        stride_a=m * k if len(a_shape) == 3 else 0,
        stride_b=k * n if len(b_shape) == 3 else 0,
        stride_c=m * n if jagged in ("k", "none") else 0,
        op="grouped_gemm",
        jagged=jagged,
    )


# --- operands, reference, Default ------------------------------------------------------------


def grouped_layouts(problem: Problem) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """(shape, strides) in elements of A, B and C of a grouped problem at its bucket's size."""
    m, n, k, g, jagged = problem.m, problem.n, problem.k, problem.batch, problem.jagged
    a2 = (1, problem.lda) if problem.trans_a else (problem.lda, 1)
    b2 = (1, problem.ldb) if problem.trans_b else (problem.ldb, 1)
    c2 = (problem.ldc, 1)
    a = ((m, k), a2) if jagged in ("m", "k") else ((g, m, k), (problem.stride_a, *a2))
    b = ((k, n), b2) if jagged in ("k", "n") else ((g, k, n), (problem.stride_b, *b2))
    c = ((m, n), c2) if jagged in ("m", "n") else ((g, m, n), (problem.stride_c, *c2))
    return {"a": a, "b": b, "c": c}


def grouped_operand_bytes(problem: Problem, *, with_out: bool = True) -> int:
    """Bytes one set of a grouped problem's operands takes (A, B, C and offs; without C
    with ``with_out``, as :func:`make_grouped_operands`)."""
    total = 4 * problem.batch
    for name, (shape, strides) in grouped_layouts(problem).items():
        if name == "c" and not with_out:
            continue
        dtype = {"a": problem.dtype_a, "b": problem.dtype_b, "c": problem.dtype_c}[name]
        elements = 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
        total += (elements + 16) * ITEMSIZE[dtype]
    return total


@dataclass
class GroupedOperands(Operands):
    """Operands of a grouped GEMM: ``a``, ``b``, ``out``, the int32 ``offs`` (None for 3-D x
    3-D) and the dimension ``offs`` cuts (``Problem.jagged``)."""

    offs: Any = field(default=None)
    jagged: str = "m"
    part: str = ""  # the distribution (and share of the rows) offs was drawn from
    # The rows of ``a`` and ``out`` a call passes (the first ones), where fewer than the
    # bucket's: a MoE layer's call routes every row of its ``a`` (tokens x top-k), so a
    # kernel is timed on an ``a`` of just those rows.
    rows: int | None = None


def timed_parts(problem: Problem) -> tuple[tuple[str, float], ...]:
    """The (distribution, share of the rows) parts a grouped problem's timed sets take
    turns of: both distributions over all rows; in the ``m`` form (the MoE forward) both
    again over :data:`LOW_FILL` of them, and uniform over :data:`MID_FILL`, so that a
    choice wins across its bucket."""
    return TIMED_PARTS_M if problem.jagged == "m" else TIMED_PARTS


def _extent(problem: Problem) -> int:
    return {"m": problem.m, "k": problem.k, "n": problem.n}.get(problem.jagged, 0)


def group_sizes(
    problem: Problem, distribution: str, rng: np.random.Generator, device: Device, fill: float = 1.0
) -> list[int]:
    """Sizes of the groups of one draw of ``distribution`` (:data:`DISTRIBUTIONS`) over the
    problem's jagged extent (``fill`` of it: the rows past are in no group). On a GPU a K or
    N group starts at a multiple of 16 bytes (torch's kernels need it); elsewhere, and for
    rows (M), anywhere."""
    groups, extent = problem.batch, _extent(problem)
    if fill < 1.0:
        extent = max(1, int(extent * fill))
    step = 1
    if device.kind != "cpu" and problem.jagged in ("k", "n"):
        step = max(1, 16 // ITEMSIZE[problem.dtype_a])
    if distribution == "tail":
        extent = max(0, extent - max(1, extent // 8))  # rows past offs[-1]: covered by no group
    units = extent // step
    if distribution == "one":
        counts = np.zeros(groups, dtype=np.int64)
        counts[int(rng.integers(0, groups))] = units
    elif distribution == "uniform":
        counts = rng.multinomial(units, np.full(groups, 1.0 / groups))
    else:  # skewed and tail: Zipf-like router load, in a random order of the groups
        weights = 1.0 / np.arange(1, groups + 1)
        counts = rng.multinomial(units, rng.permutation(weights / weights.sum()))
        if groups > 1:
            # one empty group at least: move the smallest group's rows to the largest
            low, high = int(np.argmin(counts)), int(np.argmax(counts))
            if low != high:
                counts[high] += counts[low]
                counts[low] = 0
    sizes = [int(c) * step for c in counts]
    if distribution == "tail" and step == 1 and groups > 1 and units > 2:
        # an odd group start: where the first group of two or more rows has an even size,
        # one of its rows moves to the next non-empty group (empty groups stay empty)
        first = next((i for i, s in enumerate(sizes) if s > 1), None)
        later = (
            next((j for j in range(first + 1, groups) if sizes[j] > 0), None) if first is not None else None
        )
        if first is not None and later is not None and sizes[first] % 2 == 0:
            sizes[first] -= 1
            sizes[later] += 1
    return sizes


def make_grouped_operands(
    problem: Problem,
    adapter: ArrayAdapter,
    device: Device,
    rng: np.random.Generator,
    distribution: str = "skewed",
    *,
    with_out: bool = True,
    fill: float = 1.0,
) -> GroupedOperands:
    """Random, never-zero operands of a grouped problem in its exact layout, with ``offs``
    drawn from ``distribution`` (:data:`DISTRIBUTIONS`) over ``fill`` of the jagged extent
    (in the m form, a call's ``a`` and ``out`` then have those rows alone: ``rows``)."""
    layouts = grouped_layouts(problem)
    made: dict[str, Any] = {}
    for name in ("a", "b", "c"):
        if name == "c" and not with_out:
            made[name] = None
            continue
        shape, strides = layouts[name]
        made[name] = adapter.random_strided(shape, strides, problem.dtype_a, device, rng, fill=name != "c")
    offs, rows = None, None
    if problem.jagged != "none":
        sizes = group_sizes(problem, distribution, rng, device, fill)
        ends = np.cumsum(np.asarray(sizes, dtype=np.int64)).astype(np.int32)
        offs = adapter.host_indices(ends, device)
        if problem.jagged == "m" and fill < 1.0:
            # The lower parts of an m-form bucket are timed as calls of that many rows make them.
            rows = int(ends[-1])
    part = distribution if fill >= 1.0 else f"{distribution}@{fill:g}"
    return GroupedOperands(made["a"], made["b"], made["c"], None, offs, problem.jagged, part, rows)


def plain_grouped_call(alpha: float, beta: float, bias: Any) -> None:
    """ValueError unless a grouped runner's call is a plain one (alpha 1, beta 0, no bias):
    ``torch._grouped_mm`` has neither, so no grouped runner computes them."""
    if alpha != 1.0 or beta != 0.0 or bias is not None:
        msg = f"a grouped GEMM has no alpha, beta or bias (got alpha={alpha}, beta={beta}, bias {bias is not None})"
        raise ValueError(msg)


def group_bounds(offs: Any, extent: int) -> list[tuple[int, int]]:
    """(start, end) of each group as torch's slices read ``offs`` (clamped to ``extent``)."""
    out, start = [], 0
    for end in (int(v) for v in offs.tolist()):
        lo, hi = min(max(start, 0), extent), min(max(end, 0), extent)
        out.append((lo, max(lo, hi)))
        start = end
    return out


@dataclass(frozen=True)
class GroupProduct:
    """One group of a grouped product as a plain one, whose float64 product is that
    group's reference: ``a @ b`` (2-D, or batched 3-D for the ``none`` form) equals
    :meth:`view` of the grouped output. ``label`` says which part of the output it is."""

    group: int | None  # None: every group at once (the batched ``none`` form)
    a: Any
    b: Any
    label: str
    rows: slice | None = None  # jagged m: the group's rows of out
    columns: slice | None = None  # jagged n: its columns (the product is out[:, cols]^T)
    index: int | None = None  # jagged k: out[index]

    def view(self, out: Any) -> Any:
        """The part of a grouped output ``out`` this product gives (a view, never a copy)."""
        if self.rows is not None:
            return out[self.rows]
        if self.columns is not None:
            return out[:, self.columns].transpose(0, 1)
        if self.index is not None:
            return out[self.index]
        return out


def group_products(ops: GroupedOperands) -> list[GroupProduct]:
    """The groups of a grouped call as plain products of views of its operands (no copy):
    the check compares each group's part of the output with its own float64 reference,
    so that it costs memory in proportion to the output's real rows, never a padded batch.

    ``m``: each non-empty group's rows ``a[s:e] @ b[g]``; ``n``: each non-empty group's
    columns, transposed (``b[:, s:e]^T @ a[g]^T`` is ``out[:, s:e]^T``, so that a group is
    rows again); ``k``: every group, an empty one too (its output must be zeros);
    ``none``: the batched product itself. Rows (columns) past ``offs[-1]`` belong to no
    group: torch leaves them undefined, and they are not compared.
    """
    a, b, jagged = ops.a, ops.b, ops.jagged
    if jagged == "none":
        return [GroupProduct(None, a, b, "")]
    extent = {"m": a.shape[0], "k": a.shape[1], "n": b.shape[1]}[jagged]
    found = []
    for g, (s, e) in enumerate(group_bounds(ops.offs, extent)):
        if jagged == "m" and e > s:
            found.append(GroupProduct(g, a[s:e], b[g], f"group {g} (rows {s}:{e})", rows=slice(s, e)))
        elif jagged == "n" and e > s:
            label = f"group {g} (columns {s}:{e}, as (column, row))"
            found.append(
                GroupProduct(g, b[:, s:e].transpose(0, 1), a[g].transpose(0, 1), label, columns=slice(s, e))
            )
        elif jagged == "k":
            found.append(GroupProduct(g, a[:, s:e], b[s:e], f"group {g} (k {s}:{e})", index=g))
    return found


class _Lent(threading.local):
    out: Any = None


#: ``LENT.out``: the output the grouped door in flight on this thread allocated itself and
#: lends to its runner (None outside such a call); see the module docstring.
LENT = _Lent()


def call_lending(
    runner: Any, a: Any, b: Any, out: Any, offs: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
) -> Any:
    """``runner`` on a call whose ``out`` its caller allocated itself, lent for the call
    (:data:`LENT`): the call's output, ``out`` or the one a Default run inside returned."""
    LENT.out = out
    try:
        got = runner(a, b, out, alpha, beta, bias, offs)
    finally:
        LENT.out = None
    return out if got is None else got


def serve_default(result: Any, out: Any) -> Any:
    """Default's ``result`` for a call writing ``out``: returned as it is where ``out`` is
    the lent output (the door returns it instead), else copied into ``out`` (None)."""
    if out is LENT.out:
        return result
    out.copy_(result)
    return None


@dataclass
class GroupedDefaultRunner:
    """The Default of a grouped GEMM: ``torch._grouped_mm``, its result copied into ``out``
    (returned instead where ``out`` is lent: :func:`serve_default`)."""

    adapter: ArrayAdapter
    candidate: Candidate = field(default=DEFAULT)

    def __post_init__(self) -> None:
        torch = getattr(self.adapter, "torch", None)
        if self.adapter.kind != "torch" or torch is None:
            msg = f"grouped GEMMs run on torch tensors only, not {self.adapter.kind} arrays"
            raise TypeError(msg)
        self.grouped_mm = torch._grouped_mm

    def __call__(
        self,
        a: Any,
        b: Any,
        out: Any,
        alpha: float = 1.0,
        beta: float = 0.0,
        bias: Any = None,
        offs: Any = None,
    ) -> Any:
        plain_grouped_call(alpha, beta, bias)
        return serve_default(self.grouped_mm(a, b, offs), out)


def default_failed(exc: BaseException, device: Device) -> DefaultFailed:
    """The error of a grouped call whose Default, ``torch._grouped_mm``, failed on ``device``."""
    said = str(exc).strip().splitlines()[0].rstrip(". ") if str(exc).strip() else type(exc).__name__
    msg = (
        f"grouped_matmul: torch._grouped_mm (Default: torch's own grouped product) failed on {device}: {said}"
    )
    return DefaultFailed(msg, call="torch._grouped_mm")


__all__ = [
    "DISTRIBUTIONS",
    "LENT",
    "GroupProduct",
    "GroupedDefaultRunner",
    "GroupedInputError",
    "GroupedOperands",
    "bucket_extent",
    "call_lending",
    "default_failed",
    "group_bounds",
    "group_products",
    "group_sizes",
    "grouped_layouts",
    "grouped_operand_bytes",
    "grouped_problem",
    "grouped_problem_of",
    "grouped_shapes",
    "make_grouped_operands",
    "plain_grouped_call",
    "serve_default",
]
