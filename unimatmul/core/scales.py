"""Scaled (fp8) GEMMs in the vocabulary: their Problems, scales, operands and reference.

A scaled GEMM is ``D[m, n] = (scale_a * A[m, k]) @ (scale_b * B[k, n]) (+ bias[n])``
with fp8 A and B, f32 scales and a bf16, f16 or f32 D: what ``torch._scaled_mm`` computes
and what fp8 inference runs for each linear layer. Its Problem is a ``scaled_gemm``
(:class:`~unimatmul.core.problem.Problem` with ``scale_a``, ``scale_b`` and
``fast_accum``). Scales are ``tensor`` (one value, any shape of one element),
``rowwise`` (``scale_a`` of shape ``[m, 1]``, ``scale_b`` of shape ``[1, n]``, both
contiguous): the two modes torch's ``_scaled_mm``, cuBLASLt (``SCALAR_32F`` and
``OUTER_VEC_32F``) and hipBLASLt share, always both of one mode; or block-scaled, the
layout of DeepSeek-V3 and Qwen3-FP8 checkpoints and torch's (BlockWise1x128,
BlockWise128x128) pair: ``scale_a`` ``[m, ceil(k/128)]``, one value per row and 128
elements of K, stored outer-dim-major (strides ``(1, m)``: ``s.t().contiguous().t()``),
and ``scale_b`` ``[ceil(k/128), ceil(n/128)]``, one value per 128x128 block of B, the
transpose of a contiguous ``[ceil(n/128), ceil(k/128)]`` weight scale (``w_scale.t()``,
as ``b`` is ``w.t()``). torch computes block-scaled products on sm90 only (cuBLASLt >=
12.9); elsewhere the Default cannot run and a call says so (``docs/fp8.md``).

A scaled runner is a Runner called with two more arguments,
``runner(a, b, out, alpha, beta, bias, scale_a, scale_b)``; its Default,
:class:`~unimatmul.core.runners.ScaledDefaultRunner`, is ``torch._scaled_mm`` through its ``out=`` form (which
PyTorch routing never takes over, so it cannot recurse). The harness checks every
candidate against :func:`scaled_reference`: the float64 product of the dequantised
operands, which the fp8 values and f32 scales give exactly.

Only torch tensors take part: NumPy (and so CuPy, whose dtypes are NumPy's) has no fp8
dtype. torch is imported through the array adapter, never at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from unimatmul.core.arrays import ArrayAdapter, Device, Operands
from unimatmul.core.dtypes import FP8, ErrorModel, canonical
from unimatmul.core.problem import (
    BLOCK_SCALES,
    SCALE_BLOCK,
    SCALE_MODES,
    SCALE_PAIRS,
    SCALED_OUTPUTS,
    Problem,
    matrix_layout,
    pointer_alignment,
    product_dims,
)

# torch's name of each fp8 dtype (ours -> torch.<name>).
_TORCH_FP8 = {
    "f8e4m3": "float8_e4m3fn",
    "f8e5m2": "float8_e5m2",
    "f8e4m3fnuz": "float8_e4m3fnuz",
    "f8e5m2fnuz": "float8_e5m2fnuz",
}


def scaled_problem(
    m: int,
    n: int,
    k: int,
    *,
    dtype_a: str = "f8e4m3",
    dtype_b: str | None = None,
    dtype_c: str = "bf16",
    scales: str = "tensor",
    bias: bool = False,
    fast_accum: bool = False,
) -> Problem:
    """The scaled GEMM of an fp8 linear layer: ``x[m, k] @ w[n, k].t()``.

    A row-major, B column-major (``w.t()``), a contiguous output: the layout
    ``torch._scaled_mm`` takes on every GPU (cuBLASLt's "TN"). ``scales``: ``tensor``,
    ``rowwise`` or ``block`` (1x128 groups of A, 128x128 blocks of B).
    """
    dtype_b = dtype_b or dtype_a
    scale_a, scale_b = BLOCK_SCALES if scales == "block" else (scales, scales)
    return Problem(
        m=m,
        n=n,
        k=k,
        dtype_a=canonical(dtype_a),
        dtype_b=canonical(dtype_b),
        dtype_c=canonical(dtype_c),
        compute="f32",
        trans_b=True,
        op="scaled_gemm",
        scale_a=scale_a,
        scale_b=scale_b,
        fast_accum=fast_accum,
        epilogue="bias" if bias else "none",
        dtype_bias=canonical(dtype_c) if bias else None,
    )


# --- a Problem from the caller's tensors ---------------------------------------------------


def _check_scale(scale: Any, adapter: ArrayAdapter, what: str) -> tuple[int, ...]:
    if not adapter.same_library(scale):
        msg = f"scaled_matmul: {what} is a {type(scale).__name__}; scales are float32 torch tensors"
        raise TypeError(msg)
    if adapter.dtype(scale) != "f32":
        msg = f"scaled_matmul: {what} is {adapter.dtype(scale)}; scales are float32"
        raise TypeError(msg)
    return adapter.shape(scale)


def _is_vector(scale: Any, adapter: ArrayAdapter, shape: tuple[int, int]) -> bool:
    """Whether ``scale`` is a row-wise scale of exactly ``shape``, its values adjacent."""
    if adapter.shape(scale) != shape:
        return False
    strides = adapter.strides(scale)
    return max(shape) == 1 or strides[0 if shape[1] == 1 else 1] == 1


def block_scale_shapes(m: int, n: int, k: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The shapes of a block-scaled GEMM's scales: ``[m, ceil(k/128)]`` and ``[ceil(k/128), ceil(n/128)]``."""
    kb, nb = -(-k // SCALE_BLOCK), -(-n // SCALE_BLOCK)
    return (m, kb), (kb, nb)


def _block_layout_error(scale: Any, adapter: ArrayAdapter, what: str, shape: tuple[int, int]) -> str:
    """Why ``scale`` is not a block scale of ``shape`` in torch's layout, or ""."""
    if adapter.shape(scale) != shape:
        return f"{what} has shape {adapter.shape(scale)}, expected {shape}"
    strides = adapter.strides(scale)
    # scale_a: outer-dim-major, strides (1, m); scale_b: w_scale.t(), strides (1, ceil(k/128)).
    want = (1, shape[0])
    for dim in (0, 1):
        if shape[dim] > 1 and strides[dim] != want[dim]:
            return f"{what} has strides {strides}, expected {want}"
    return ""


def scale_modes(
    scale_a: Any, scale_b: Any, adapter: ArrayAdapter, m: int, n: int, k: int = 0
) -> tuple[str, str]:
    """The (scale_a, scale_b) modes of a call, decided as ``torch._scaled_mm`` decides them.

    Both one value: per-tensor. Else ``scale_a`` of shape ``[m, 1]`` and ``scale_b`` of
    shape ``[1, n]``: row-wise (so a ``[1, 1]`` scale_a at m = 1 is row-wise next to a
    ``[1, n]`` scale_b, as in torch's ``get_joint_scaling``). Else, given ``k``, the
    block-scaled pair (module docstring: shapes and strides). Anything else is an error
    naming what was given and the shapes expected.
    """
    shape_a = _check_scale(scale_a, adapter, "scale_a")
    shape_b = _check_scale(scale_b, adapter, "scale_b")
    ones = [int(np.prod(s, dtype=np.int64)) == 1 for s in (shape_a, shape_b)]
    if all(ones):
        return "tensor", "tensor"
    if _is_vector(scale_a, adapter, (m, 1)) and _is_vector(scale_b, adapter, (1, n)):
        return "rowwise", "rowwise"
    block_a, block_b = block_scale_shapes(m, n, k)
    if k and (shape_a, shape_b) == (block_a, block_b):
        why = _block_layout_error(scale_a, adapter, "scale_a", block_a) or _block_layout_error(
            scale_b, adapter, "scale_b", block_b
        )
        if not why:
            return BLOCK_SCALES
        msg = (
            f"scaled_matmul: block-scaled call: {why}: scale_a must be stored outer-dim-major "
            "(s.t().contiguous().t() of a [m, k/128] scale) and scale_b must be w_scale.t() of a "
            "contiguous [n/128, k/128] weight scale, the layouts torch._scaled_mm takes"
        )
        raise ValueError(msg)
    msg = (
        f"scaled_matmul: scale_a has shape {shape_a} and scale_b {shape_b}: both scales must be one value "
        f"(per-tensor), contiguous float32 vectors of shapes {(m, 1)} and {(1, n)} (row-wise), "
        f"or block scales of shapes {block_a} (1x128 groups of a) and {block_b} (128x128 blocks of b); "
        "mixed, other block-wise and MX scales are not supported"
    )
    raise ValueError(msg)


def scaled_problem_of(
    adapter: ArrayAdapter,
    a: Any,
    b: Any,
    scale_a: Any,
    scale_b: Any,
    *,
    out_dtype: str,
    bias: Any = None,
    out: Any = None,
    fast_accum: bool = False,
) -> Problem:
    """The scaled-GEMM Problem of a call on the caller's own tensors.

    The one place a scaled Problem is made from tensors (``unimatmul.scaled_matmul``,
    PyTorch routing of ``torch._scaled_mm``). Bad input raises ``ValueError`` or
    ``TypeError`` with a message that names the operand.
    """
    if adapter.kind != "torch":
        msg = (
            f"scaled_matmul takes torch tensors, not {type(a).__module__}.{type(a).__name__}: "
            "NumPy (and CuPy, whose dtypes are NumPy's) has no fp8 dtype"
        )
        raise TypeError(msg)
    for name, x in (("b", b), ("scale_a", scale_a), ("scale_b", scale_b), ("bias", bias), ("out", out)):
        if x is not None and not adapter.same_library(x):
            msg = f"scaled_matmul: {name} is a {type(x).__name__}, but a is a {type(a).__name__}"
            raise TypeError(msg)
    device = adapter.device(a)
    for name, x in (("b", b), ("scale_a", scale_a), ("scale_b", scale_b), ("bias", bias), ("out", out)):
        if x is not None and adapter.device(x) != device:
            msg = f"scaled_matmul: a is on {device} but {name} is on {adapter.device(x)}"
            raise ValueError(msg)
    a_shape, b_shape = adapter.shape(a), adapter.shape(b)
    for name, shape in (("a", a_shape), ("b", b_shape)):
        if len(shape) != 2:
            msg = f"scaled_matmul: {name} must be 2-D, got shape {shape}"
            raise ValueError(msg)
    dtype_a, dtype_b = adapter.dtype(a), adapter.dtype(b)
    for name, dtype in (("a", dtype_a), ("b", dtype_b)):
        if dtype not in FP8:
            msg = f"scaled_matmul: {name} is {dtype}; a and b must be fp8 ({', '.join(sorted(FP8))})"
            raise TypeError(msg)
    m, n, k = product_dims(a_shape, b_shape, "scaled_matmul")
    out_dtype = canonical(out_dtype)
    if out_dtype not in SCALED_OUTPUTS:
        msg = f"scaled_matmul: out_dtype {out_dtype} is not one of {', '.join(SCALED_OUTPUTS)}"
        raise TypeError(msg)
    modes = scale_modes(scale_a, scale_b, adapter, m, n, k)
    if bias is not None:
        if adapter.shape(bias) != (n,):
            msg = f"scaled_matmul: bias must have shape ({n},), got {adapter.shape(bias)}"
            raise ValueError(msg)
        # torch._scaled_mm's rule (ScaledBlas.cpp): a bf16 or f16 bias, of the output's dtype.
        if out_dtype == "f32" or adapter.dtype(bias) != out_dtype:
            msg = (
                f"scaled_matmul: a bias of {adapter.dtype(bias)} with a {out_dtype} output is not "
                "supported: the bias must be bf16 or f16, the output's dtype"
            )
            raise TypeError(msg)
        if n > 1 and adapter.strides(bias)[0] != 1:
            msg = "scaled_matmul: bias must be contiguous; pass a contiguous copy"
            raise ValueError(msg)
    if out is not None:
        if adapter.shape(out) != (m, n):
            msg = f"scaled_matmul: out has shape {adapter.shape(out)}, expected {(m, n)}"
            raise ValueError(msg)
        if adapter.dtype(out) != out_dtype:
            msg = f"scaled_matmul: out is {adapter.dtype(out)}, expected out_dtype {out_dtype}"
            raise TypeError(msg)
    trans_a, lda = matrix_layout(a_shape, adapter.strides(a), "a")
    trans_b, ldb = matrix_layout(b_shape, adapter.strides(b), "b")
    ldc = n
    ptrs = [adapter.ptr(a), adapter.ptr(b)]
    if out is not None:
        o_trans, ldc = matrix_layout((m, n), adapter.strides(out), "out")
        if o_trans and m > 1 and n > 1:
            msg = f"scaled_matmul: out must be row-major, got strides {adapter.strides(out)}"
            raise ValueError(msg)
        ptrs.append(adapter.ptr(out))
    if bias is not None:
        ptrs.append(adapter.ptr(bias))
    # The scales' addresses too: a kernel reads row-wise scales as vectors.
    ptrs += [adapter.ptr(scale_a), adapter.ptr(scale_b)]
    if device.kind == "cuda" and (trans_a or not trans_b):
        # torch._scaled_mm on Ada and Hopper (ScaledBlas.cpp): "Only multiplication of
        # row-major and column-major matrices is supported by cuBLASLt".
        msg = (
            "scaled_matmul: on a CUDA device a must be row-major and b column-major (b = w.t() of a "
            "row-major w[n, k]), the only layout torch._scaled_mm and cuBLASLt's fp8 kernels take "
            "on Ada and Hopper; pass a.contiguous() and w.t()"
        )
        raise ValueError(msg)
    if device.kind != "cpu" and (k % 16 or n % 16):
        msg = f"scaled_matmul: on a GPU k and n must be multiples of 16 (torch._scaled_mm), got k={k}, n={n}"
        raise ValueError(msg)
    return Problem(
        m=m,
        n=n,
        k=k,
        dtype_a=dtype_a,
        dtype_b=dtype_b,
        dtype_c=out_dtype,
        compute="f32",
        trans_a=trans_a,
        trans_b=trans_b,
        lda=lda,
        ldb=ldb,
        ldc=ldc,
        epilogue="bias" if bias is not None else "none",
        dtype_bias=out_dtype if bias is not None else None,
        align=pointer_alignment(*ptrs),
        op="scaled_gemm",
        scale_a=modes[0],
        scale_b=modes[1],
        fast_accum=bool(fast_accum),
    )


# --- operands and reference ------------------------------------------------------------


@dataclass
class ScaledOperands(Operands):
    """Operands of a scaled GEMM: fp8 ``a`` and ``b``, their f32 scales, ``out``, ``bias``."""

    scale_a: Any = field(default=None)
    scale_b: Any = field(default=None)


def torch_of(adapter: ArrayAdapter) -> Any:
    """The torch module of a torch adapter; TypeError for any other array library."""
    torch = getattr(adapter, "torch", None)
    if adapter.kind != "torch" or torch is None:
        msg = f"scaled GEMMs run on torch tensors only, not {adapter.kind} arrays (no fp8 dtype there)"
        raise TypeError(msg)
    return torch


def torch_fp8(torch: Any, dtype: str) -> Any:
    """torch's dtype object of one of our fp8 names; TypeError if this torch lacks it."""
    found = getattr(torch, _TORCH_FP8.get(dtype, ""), None)
    if found is None:
        msg = f"this torch has no {dtype} dtype ({_TORCH_FP8.get(dtype, 'not an fp8 name')})"
        raise TypeError(msg)
    return found


def make_scaled_operands(
    problem: Problem, adapter: ArrayAdapter, device: Device, rng: np.random.Generator
) -> ScaledOperands:
    """Random, never-zero operands of a scaled problem, in its exact layout and alignment.

    Data are standard normal values rounded to the fp8 dtype; scales are positive,
    spread over a factor of four (a row-wise scale differs from row to row, so that a
    kernel that applied one scale to all rows would fail the check).
    """
    torch = torch_of(adapter)
    tdevice = adapter.torch_device(device)  # type: ignore[attr-defined]
    gen = torch.Generator(device=tdevice)
    gen.manual_seed(int(rng.integers(0, 2**62)))
    m, n, k = problem.m, problem.n, problem.k

    def fp8(rows: int, cols: int, trans: bool, ld: int, dtype: str) -> Any:
        # The matrix as stored: row-major [rows, ld] or, transposed, column-major [ld, cols].
        offset = problem.align if problem.align < 16 else 0  # one byte per element
        stored = (cols, ld) if trans else (rows, ld)
        size = offset + stored[0] * stored[1]
        flat = torch.randn(size, generator=gen, device=tdevice).to(torch_fp8(torch, dtype))
        strides = (1, ld) if trans else (ld, 1)
        return flat.as_strided((rows, cols), strides, offset)

    def scales(shape: tuple[int, ...]) -> Any:
        return torch.rand(shape, generator=gen, device=tdevice).mul_(3.0).add_(1.0).div_(16.0)

    a = fp8(m, k, problem.trans_a, problem.lda, problem.dtype_a)
    b = fp8(k, n, problem.trans_b, problem.ldb, problem.dtype_b)
    out = adapter.random_strided((m, n), (problem.ldc, 1), problem.dtype_c, device, rng)
    bias = None
    if problem.has_bias:
        bias = adapter.random_strided((n,), (1,), problem.dtype_bias or problem.dtype_c, device, rng)
    if problem.is_block_scaled:
        # torch's layouts (module docstring): scale_a outer-dim-major, scale_b = w_scale.t().
        shape_a, shape_b = block_scale_shapes(m, n, k)
        scale_a = scales(shape_a[::-1]).t()
        scale_b = scales(shape_b[::-1]).t()
    else:
        scale_a = scales((m, 1) if problem.scale_a == "rowwise" else ())
        scale_b = scales((1, n) if problem.scale_b == "rowwise" else ())
    return ScaledOperands(a, b, out, bias, scale_a, scale_b)


def scaled_error_model(problem: Problem) -> ErrorModel:
    """The element-wise error bound of a scaled product, stated for its dequantised inputs
    ``scale_a * A`` and ``scale_b * B`` (exact in float64): fp8 tensor cores sum with
    about 14 bits (``dtypes.scaled_tolerance``), fast accumulation or not: bounded as
    tf32's accumulator."""
    return ErrorModel.for_problem(
        k=problem.k,
        dtype_in="f32",
        dtype_out=problem.dtype_c,
        compute="tf32",
        activation=None,
        ref_dtype="f32",  # the reference is kept as the harness keeps it (scaled outputs are never f64)
    )


def dequantised(
    adapter: ArrayAdapter, ops: ScaledOperands
) -> tuple[Operands, Callable[[slice, slice], Any], Callable[[slice, slice], Any]]:
    """The scaled operands as the numeric check's reference takes them (it is the plain
    product of ``scale_a * A`` and ``scale_b * B``): the operands themselves, for their
    shapes, then A's rows and B's columns as float64 ``scale_a * A`` and ``scale_b * B``
    on demand, a range at a time (``numeric_check.RowSource`` and ``ColumnSource``: a large
    input is never dequantised whole)."""
    torch_of(adapter)

    def rows(bs: slice, rs: slice) -> Any:
        return dequantised_rows(ops.a, ops.scale_a, rs)[None]

    def columns(bs: slice, cs: slice) -> Any:
        return dequantised_columns(ops.b, ops.scale_b, cs)[None]

    return ops, rows, columns


def dequantised_rows(a: Any, scale_a: Any, rs: slice) -> Any:
    """Rows ``rs`` of ``scale_a * a`` in float64 (a torch tensor): a row-wise scale's rows,
    or a block scale's groups along them, repeated as :func:`expanded_scale` does."""
    rows = a[rs].double()
    scale = scale_a.double()
    if len(scale.shape) == 2 and scale.shape[0] != 1:
        scale = scale[rs]
    return rows * expanded_scale(scale, rows.shape)


def dequantised_columns(b: Any, scale_b: Any, cs: slice) -> Any:
    """Columns ``cs`` of ``scale_b * b`` in float64 (a torch tensor): a row-wise scale's
    columns, or a block scale's blocks over them, repeated as :func:`expanded_scale` does."""
    cols = b[:, cs].double()
    scale = scale_b.double()
    if len(scale.shape) == 2 and scale.shape[1] != 1:
        n = b.shape[1]
        if scale.shape[1] == n:
            scale = scale[:, cs]
        else:  # one per SCALE_BLOCK columns
            start, stop, _ = cs.indices(n)
            scale = scale[:, np.arange(start, stop) // SCALE_BLOCK]
    return cols * expanded_scale(scale, cols.shape)


def expanded_scale(scale: Any, shape: tuple[int, ...]) -> Any:
    """A scale (a torch tensor or a NumPy array) as it multiplies a ``shape`` operand
    element by element: per-tensor and row-wise scales broadcast as they are, block
    scales have each value repeated over its block (1x128 of A, 128x128 of B: a dimension
    of the scale shorter than the operand's, and not 1, is one value per 128)."""
    if len(scale.shape) != 2:
        return scale
    for dim in (0, 1):
        if scale.shape[dim] not in (1, shape[dim]):
            index = np.arange(shape[dim]) // SCALE_BLOCK
            scale = scale[index] if dim == 0 else scale[:, index]
    return scale


def scaled_reference(adapter: ArrayAdapter, a: Any, b: Any, scale_a: Any, scale_b: Any, bias: Any) -> Any:
    """``(scale_a * a) @ (scale_b * b) + bias`` in float64 on the operands' device (block
    scales applied over their blocks: :func:`expanded_scale`)."""
    torch = torch_of(adapter)
    f64 = torch.float64
    ref = (a.to(f64) * expanded_scale(scale_a.to(f64), a.shape)) @ (
        b.to(f64) * expanded_scale(scale_b.to(f64), b.shape)
    )
    if bias is not None:
        ref = ref + bias.to(f64)
    return ref


__all__ = [
    "SCALE_MODES",
    "SCALE_PAIRS",
    "ScaledOperands",
    "block_scale_shapes",
    "expanded_scale",
    "make_scaled_operands",
    "scale_modes",
    "scaled_problem",
    "scaled_problem_of",
    "scaled_reference",
    "torch_fp8",
    "torch_of",
]
