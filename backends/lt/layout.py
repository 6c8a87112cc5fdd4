"""A Problem restated as the column-major GEMM that cuBLASLt and hipBLASLt run.

Pure functions, no library: they are unit-tested on any machine and shared by the
cuBLASLt and hipBLASLt backends.

unimatmul's Problem is row-major ``C[m, n] = A[m, k] @ B[k, n]``. The Lt libraries are
column-major, and a row-major matrix read column-major is its transpose, so the Lt
call computes ``C^T[n, m] = B^T[n, k] @ A^T[k, m]``: the caller's B is passed as the
library's "A" and the caller's A as its "B". A caller's transposed view (``trans_a``)
is already column-major, so it becomes a transpose op of the library.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from unimatmul.backend import ITEMSIZE, Problem, UnsupportedProblem

# What the Lt kernels take here: one storage dtype for A, B, C and D, and the compute
# type per (storage dtype, Problem.compute). f16/bf16 accumulate in f32, as torch does.
COMPUTE_TYPES: dict[tuple[str, str], str] = {
    ("f32", "f32"): "32F",
    ("f32", "tf32"): "32F_FAST_TF32",
    ("f16", "f32"): "32F",
    ("bf16", "f32"): "32F",
}

# Problem epilogue -> the Lt epilogue key of the ABI table. cuBLASLt's and hipBLASLt's
# GELU is the tanh approximation, so only ``gelu_tanh`` maps to it; the exact (erf)
# GELU has no Lt epilogue and goes to other candidates (Default).
EPILOGUES: dict[str, str] = {
    "none": "DEFAULT",
    "relu": "RELU",
    "gelu_tanh": "GELU",
    "bias": "BIAS",
    "bias_relu": "RELU_BIAS",
    "bias_gelu_tanh": "GELU_BIAS",
}

#: The fast kernels want every leading dimension and pointer on 16 bytes.
ALIGN_BYTES = 16


@dataclass(frozen=True)
class LtMatrix:
    """One matrix layout as the library sees it: column-major ``rows x cols``, ``ld``."""

    dtype: str
    rows: int
    cols: int
    ld: int
    batch: int = 1
    stride: int = 0  # elements between batches; 0 broadcasts one matrix over the batch


@dataclass(frozen=True)
class LtGemm:
    """``D = act(alpha * op(A) @ op(B) + beta * C + bias)``, column-major, D laid out as C.

    ``a`` is the caller's B and ``b`` the caller's A (see the module docstring).
    """

    trans_a: bool
    trans_b: bool
    a: LtMatrix
    b: LtMatrix
    c: LtMatrix
    compute: str  # ABI compute-type key: "32F", "32F_FAST_TF32"
    scale: str  # canonical dtype of alpha and beta
    epilogue: str  # ABI epilogue key: "DEFAULT", "RELU", "BIAS", ...
    bias_dtype: str | None = None
    # A scaled (fp8) GEMM: how the library's A and B scales are read (ABI matrix-scale
    # keys, "SCALAR_32F" or "OUTER_VEC_32F"; the library's A is the caller's B, so
    # ``scale_a`` is the caller's ``scale_b`` mode), and fast fp8 accumulation. None for
    # a plain GEMM, which has no scales.
    scale_a: str | None = None
    scale_b: str | None = None
    fast_accum: bool = False

    @property
    def scaled(self) -> bool:
        return self.scale_a is not None

    @property
    def m(self) -> int:
        return self.c.rows

    @property
    def n(self) -> int:
        return self.c.cols


def lt_gemm(problem: Problem) -> LtGemm:
    """The column-major Lt GEMM of ``problem``; UnsupportedProblem if no Lt kernel takes it."""
    if problem.op != "gemm":
        raise UnsupportedProblem(f"the Lt backends run gemm, not {problem.op}", problem=problem)
    dtype = problem.dtype_a
    if problem.dtype_b != dtype or problem.dtype_c != dtype:
        raise UnsupportedProblem(
            f"the Lt backends take one dtype for A, B and C, not "
            f"{problem.dtype_a}/{problem.dtype_b}/{problem.dtype_c}",
            problem=problem,
        )
    compute = COMPUTE_TYPES.get((dtype, problem.compute))
    if compute is None:
        valid = ", ".join(f"{d}:{c}" for d, c in COMPUTE_TYPES)
        raise UnsupportedProblem(
            f"no Lt kernel for {dtype} data with {problem.compute} compute (valid: {valid})",
            problem=problem,
        )
    epilogue = EPILOGUES.get(problem.epilogue)
    if epilogue is None:
        raise UnsupportedProblem(
            f"epilogue {problem.epilogue!r} has no Lt equivalent (Lt's GELU is the tanh form: "
            f"use gelu_tanh); valid: {', '.join(EPILOGUES)}",
            problem=problem,
        )
    if problem.has_bias and problem.dtype_bias != dtype:
        raise UnsupportedProblem(
            f"bias of {problem.dtype_bias} with {dtype} data is not offered", problem=problem
        )
    if problem.batch > 1 and problem.stride_c == 0:
        raise UnsupportedProblem("a batched output needs a non-zero batch stride", problem=problem)
    lt_a, lt_b, lt_c = _swapped(problem)
    return LtGemm(
        trans_a=problem.trans_b,
        trans_b=problem.trans_a,
        a=lt_a,
        b=lt_b,
        c=lt_c,
        compute=compute,
        scale="f32",
        epilogue=epilogue,
        bias_dtype=problem.dtype_bias if problem.has_bias else None,
    )


def _swapped(problem: Problem) -> tuple[LtMatrix, LtMatrix, LtMatrix]:
    """The library's A (the caller's B), B (the caller's A) and C, column-major."""
    batch = problem.batch
    m, n, k = problem.m, problem.n, problem.k
    # Caller's B [k, n] row-major is column-major [n, k] = B^T: no op. A caller's
    # transposed B is column-major [k, n]: the library transposes it.
    if problem.trans_b:
        lt_a = LtMatrix(problem.dtype_b, k, n, problem.ldb, batch, problem.stride_b)
    else:
        lt_a = LtMatrix(problem.dtype_b, n, k, problem.ldb, batch, problem.stride_b)
    if problem.trans_a:
        lt_b = LtMatrix(problem.dtype_a, m, k, problem.lda, batch, problem.stride_a)
    else:
        lt_b = LtMatrix(problem.dtype_a, k, m, problem.lda, batch, problem.stride_a)
    lt_c = LtMatrix(problem.dtype_c, n, m, problem.ldc, batch, problem.stride_c)
    return lt_a, lt_b, lt_c


#: Problem scale mode -> the ABI matrix-scale key the library reads it with. The block
#: modes' scale layouts are the ones torch._scaled_mm hands cuBLASLt unchanged; a library
#: whose ABI table lacks a mode refuses it when the plan is made (driver._set_scaling).
SCALE_MODES: dict[str, str] = {
    "tensor": "SCALAR_32F",
    "rowwise": "OUTER_VEC_32F",
    "block1x128": "VEC128_32F",
    "block128x128": "BLK128x128_32F",
}


def lt_scaled_gemm(problem: Problem) -> LtGemm:
    """The column-major Lt GEMM of a scaled (fp8) problem; UnsupportedProblem if none.

    fp8 A and B, D (and C, never read: beta is 0) of the output's dtype, f32 compute
    and scale type, the bias epilogue with a bias of the output's dtype: the call
    ``torch._scaled_mm`` makes (CUDABlas.cpp ``scaled_gemm``). Hopper's fp8 kernels take
    only the "TN" form, the library's A transposed and B not (a row-major A and a
    column-major B of the caller): other layouts are left to the library's heuristic,
    which returns no algo for them there and may on later GPUs.
    """
    if not problem.is_scaled:
        raise UnsupportedProblem(f"not a scaled GEMM: {problem.key}", problem=problem)
    if problem.has_bias and problem.dtype_bias != problem.dtype_c:
        raise UnsupportedProblem(
            f"a bias of {problem.dtype_bias} with a {problem.dtype_c} output is not offered", problem=problem
        )
    if problem.align < ALIGN_BYTES:
        raise UnsupportedProblem(
            f"fp8 kernels need 16-byte aligned operands and scales, got {problem.align}-byte alignment",
            problem=problem,
        )
    lt_a, lt_b, lt_c = _swapped(problem)
    return LtGemm(
        trans_a=problem.trans_b,
        trans_b=problem.trans_a,
        a=lt_a,
        b=lt_b,
        c=lt_c,
        compute="32F",
        scale="f32",
        epilogue="BIAS" if problem.has_bias else "DEFAULT",
        bias_dtype=problem.dtype_bias if problem.has_bias else None,
        scale_a=SCALE_MODES[problem.scale_b],
        scale_b=SCALE_MODES[problem.scale_a],
        fast_accum=problem.fast_accum,
    )


def lt_problem(problem: Problem) -> LtGemm:
    """The Lt GEMM of any problem the Lt backends take: plain or scaled."""
    return lt_scaled_gemm(problem) if problem.is_scaled else lt_gemm(problem)


# --- the alignment candidate -----------------------------------------------------------


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def misaligned_operands(problem: Problem) -> tuple[str, ...]:
    """Which of ``a``, ``b``, ``c`` break 16-byte alignment (leading dimension or pointer).

    A misaligned pointer (``problem.align < 16``) cannot be told apart per operand from
    the Problem, so then every operand counts as misaligned.
    """
    if problem.align < ALIGN_BYTES:
        return ("a", "b", "c")
    found = []
    for name, ld, stride, dtype in (
        ("a", problem.lda, problem.stride_a, problem.dtype_a),
        ("b", problem.ldb, problem.stride_b, problem.dtype_b),
        ("c", problem.ldc, problem.stride_c, problem.dtype_c),
    ):
        size = ITEMSIZE[dtype]
        if (ld * size) % ALIGN_BYTES or (problem.batch > 1 and (stride * size) % ALIGN_BYTES):
            found.append(name)
    return tuple(found)


def padded_problem(problem: Problem, *, dims: bool = False) -> tuple[Problem, tuple[str, ...]]:
    """The Problem on padded, aligned copies of operands, and which operands are copied.

    ``dims=False``: only the leading dimensions (and batch strides) of the misaligned
    operands grow; m, n and k stay, so the padding is never read.

    ``dims=True``: the contiguous dimension of each misaligned operand is rounded up
    too (n for a row-major B or C, k for a row-major A or a transposed B, m for a
    transposed A), so the kernel sees whole 16-byte rows. Every operand whose shape
    changes is copied, into a compact buffer whose padding is zero (a padded k must
    add nothing); extra rows and columns of the output are computed and dropped.

    Returns ``(problem, ())`` when nothing is misaligned.
    """
    pads = misaligned_operands(problem)
    if not pads:
        return problem, ()
    if dims:
        return _padded_dims(problem, pads)
    changes: dict[str, int] = {"align": ALIGN_BYTES}
    batched = problem.batch > 1
    m, n, k = problem.m, problem.n, problem.k
    for name in pads:
        dtype = getattr(problem, f"dtype_{name}")
        per = ALIGN_BYTES // ITEMSIZE[dtype]
        if name == "a":
            ld = _round_up(problem.lda, per)
            outer = k if problem.trans_a else m
            changes["lda"] = ld
            if batched and problem.stride_a:
                changes["stride_a"] = outer * ld
        elif name == "b":
            ld = _round_up(problem.ldb, per)
            outer = n if problem.trans_b else k
            changes["ldb"] = ld
            if batched and problem.stride_b:
                changes["stride_b"] = outer * ld
        else:
            ld = _round_up(problem.ldc, per)
            changes["ldc"] = ld
            if batched:
                changes["stride_c"] = m * ld
    return replace(problem, **changes), pads  # type: ignore[arg-type]


def _padded_dims(problem: Problem, pads: tuple[str, ...]) -> tuple[Problem, tuple[str, ...]]:
    per = ALIGN_BYTES // ITEMSIZE[problem.dtype_a]
    m, n, k = problem.m, problem.n, problem.k
    m2, n2, k2 = m, n, k
    if "a" in pads:
        if problem.trans_a:
            m2 = _round_up(m, per)
        else:
            k2 = _round_up(k, per)
    if "b" in pads:
        if problem.trans_b:
            k2 = _round_up(k, per)
        else:
            n2 = _round_up(n, per)
    if "c" in pads:
        n2 = _round_up(n, per)
    copied = tuple(
        name
        for name, changed in (("a", m2 != m or k2 != k), ("b", k2 != k or n2 != n), ("c", m2 != m or n2 != n))
        if name in pads or changed
    )
    batched = problem.batch > 1
    changes: dict[str, int] = {"m": m2, "n": n2, "k": k2, "align": ALIGN_BYTES}
    if "a" in copied:
        changes["lda"] = m2 if problem.trans_a else k2
        if batched and problem.stride_a:
            changes["stride_a"] = m2 * k2
    if "b" in copied:
        changes["ldb"] = k2 if problem.trans_b else n2
        if batched and problem.stride_b:
            changes["stride_b"] = k2 * n2
    if "c" in copied:
        changes["ldc"] = n2
        if batched:
            changes["stride_c"] = m2 * n2
    return replace(problem, **changes), copied  # type: ignore[arg-type]
