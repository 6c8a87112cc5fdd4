"""Problem -> column-major Lt GEMM mapping and the alignment padding (pure functions).

The mapping is checked two ways: field by field for the documented cases, and by
executing the Lt GEMM's column-major semantics in NumPy on the caller's raw buffers
for random shapes, transposes, leading dimensions and batch strides, which must give
the caller's row-major product.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from unimatmul.core.arrays import operand_layouts
from unimatmul.core.errors import UnsupportedProblem
from unimatmul.core.problem import Problem
from unimatmul_backends.lt.layout import LtGemm, LtMatrix, lt_gemm, misaligned_operands, padded_problem


def test_row_major_nn_is_swapped_column_major() -> None:
    gemm = lt_gemm(Problem(m=64, n=48, k=32, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16"))
    assert (gemm.trans_a, gemm.trans_b) == (False, False)
    assert gemm.a == LtMatrix("bf16", 48, 32, 48)  # caller's B: n x k, ld = ldb
    assert gemm.b == LtMatrix("bf16", 32, 64, 32)  # caller's A: k x m, ld = lda
    assert gemm.c == LtMatrix("bf16", 48, 64, 48)  # C^T: n x m, ld = ldc
    assert (gemm.m, gemm.n, gemm.compute, gemm.scale, gemm.epilogue) == (48, 64, "32F", "f32", "DEFAULT")


def test_transposed_views_become_transpose_ops() -> None:
    gemm = lt_gemm(Problem(m=64, n=48, k=32, trans_a=True, trans_b=True, lda=72, ldb=40))
    assert (gemm.trans_a, gemm.trans_b) == (True, True)
    assert gemm.a == LtMatrix("f32", 32, 48, 40)  # B stored column-major k x n
    assert gemm.b == LtMatrix("f32", 64, 32, 72)  # A stored column-major m x k


@pytest.mark.parametrize(
    ("dtype", "compute", "expect"),
    [("f32", "f32", "32F"), ("f32", "tf32", "32F_FAST_TF32"), ("f16", "f32", "32F"), ("bf16", "f32", "32F")],
)
def test_compute_types(dtype: str, compute: str, expect: str) -> None:
    problem = Problem(m=4, n=4, k=4, dtype_a=dtype, dtype_b=dtype, dtype_c=dtype, compute=compute)
    assert lt_gemm(problem).compute == expect


@pytest.mark.parametrize(
    ("epilogue", "expect"),
    [
        ("none", "DEFAULT"),
        ("relu", "RELU"),
        ("gelu_tanh", "GELU"),
        ("bias", "BIAS"),
        ("bias_relu", "RELU_BIAS"),
        ("bias_gelu_tanh", "GELU_BIAS"),
    ],
)
def test_epilogues(epilogue: str, expect: str) -> None:
    gemm = lt_gemm(Problem(m=4, n=4, k=4, epilogue=epilogue))
    assert gemm.epilogue == expect
    assert gemm.bias_dtype == ("f32" if epilogue.startswith("bias") else None)


@pytest.mark.parametrize(
    ("problem", "match"),
    [
        (Problem(m=4, n=4, k=4, epilogue="gelu"), "tanh form"),
        (Problem(m=4, n=4, k=4, epilogue="bias_gelu"), "tanh form"),
        (Problem.from_shape(4, 4, 4, "f64"), "f64 data"),
        (Problem(m=4, n=4, k=4, dtype_a="f16", dtype_b="f16", dtype_c="f32"), "one dtype"),
        (Problem(m=4, n=4, k=4, compute="f16"), "f32 data with f16 compute"),
        (Problem(m=4, n=4, k=4, epilogue="bias", dtype_bias="f16"), "bias of f16"),
        (Problem(m=4, n=4, k=4, batch=2, stride_a=16, stride_b=16, stride_c=0), "non-zero batch stride"),
    ],
)
def test_unsupported_problems_say_why(problem: Problem, match: str) -> None:
    with pytest.raises(UnsupportedProblem, match=match):
        lt_gemm(problem)


# --- executing the Lt semantics -------------------------------------------------------


def _read(flat: np.ndarray, mat: LtMatrix, batch: int) -> np.ndarray:
    """A column-major matrix of ``mat`` from a flat buffer, as the library reads it."""
    i, j = np.meshgrid(np.arange(mat.rows), np.arange(mat.cols), indexing="ij")
    return flat[batch * mat.stride + i + j * mat.ld]


def _run_lt(gemm: LtGemm, a_flat: np.ndarray, b_flat: np.ndarray, c_flat: np.ndarray) -> None:
    for batch in range(gemm.c.batch):
        op_a = _read(a_flat, gemm.a, batch)
        op_b = _read(b_flat, gemm.b, batch)
        op_a = op_a.T if gemm.trans_a else op_a
        op_b = op_b.T if gemm.trans_b else op_b
        d = op_a @ op_b
        i, j = np.meshgrid(np.arange(gemm.c.rows), np.arange(gemm.c.cols), indexing="ij")
        c_flat[batch * gemm.c.stride + i + j * gemm.c.ld] = d


def _caller_views(problem: Problem, flats: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    views = {}
    for name, (shape, strides) in operand_layouts(problem).items():
        flat = flats[name]
        views[name] = np.lib.stride_tricks.as_strided(flat, shape, tuple(s * flat.itemsize for s in strides))
    return views


def _flat_size(problem: Problem, name: str) -> int:
    shape, strides = operand_layouts(problem)[name]
    return 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))


CASES = [
    Problem(
        m=m,
        n=n,
        k=k,
        trans_a=ta,
        trans_b=tb,
        lda=(m if ta else k) + pa,
        ldb=(k if tb else n) + pb,
        ldc=n + pc,
    )
    for (m, n, k), ta, tb, (pa, pb, pc) in itertools.product(
        [(1, 5, 3), (7, 1, 4), (6, 5, 9)], [False, True], [False, True], [(0, 0, 0), (3, 1, 2)]
    )
] + [
    Problem(m=3, n=4, k=5, batch=3, stride_a=17, stride_b=23, stride_c=14),
    Problem(m=3, n=4, k=5, batch=2, trans_b=True, stride_a=15, stride_b=0, stride_c=12),
    Problem(m=3, n=4, k=5, batch=2, trans_a=True, stride_a=0, stride_b=20, stride_c=19, ldc=6),
]


@pytest.mark.parametrize("problem", CASES, ids=lambda p: p.key)
def test_lt_semantics_compute_the_callers_product(problem: Problem) -> None:
    rng = np.random.default_rng(0)
    flats = {name: rng.standard_normal(_flat_size(problem, name)) for name in ("a", "b", "c")}
    views = _caller_views(problem, flats)
    expected = np.matmul(views["a"], views["b"])
    gemm = lt_gemm(problem)
    # The library's A is the caller's B and its B the caller's A.
    _run_lt(gemm, flats["b"], flats["a"], flats["c"])
    np.testing.assert_allclose(_caller_views(problem, flats)["c"], expected, rtol=1e-12, atol=1e-12)


# --- alignment ------------------------------------------------------------------------


def test_misaligned_operands() -> None:
    assert misaligned_operands(Problem.from_shape(1024, 1024, 1024, "bf16")) == ()
    assert misaligned_operands(Problem.from_shape(1024, 1025, 1024, "bf16")) == ("b", "c")
    assert misaligned_operands(Problem.from_shape(2047, 4095, 1023, "bf16")) == ("a", "b", "c")
    assert misaligned_operands(
        Problem.from_shape(64, 64, 64, "f16").__class__(m=64, n=64, k=64, align=8)
    ) == (
        "a",
        "b",
        "c",
    )
    # ld aligned but a batch stride that is not: 3 x 8 bf16 = 48 bytes, fine; 3 x 5 f32 = 60 is not.
    batched = Problem(m=3, n=8, k=8, batch=2, stride_a=3 * 8 + 1, stride_b=64, stride_c=24)
    assert misaligned_operands(batched) == ("a",)


def test_padded_problem_rounds_leading_dimensions_only() -> None:
    problem = Problem.from_shape(1024, 1025, 1024, "bf16")
    padded, pads = padded_problem(problem)
    assert pads == ("b", "c")
    assert (padded.m, padded.n, padded.k) == (1024, 1025, 1024)
    assert (padded.lda, padded.ldb, padded.ldc, padded.align) == (1024, 1032, 1032, 16)
    assert misaligned_operands(padded) == ()
    assert padded_problem(padded) == (padded, ())


def test_padded_problem_transposed_and_batched() -> None:
    problem = Problem(
        m=5, n=6, k=7, batch=2, trans_a=True, trans_b=True, stride_a=40, stride_b=0, stride_c=35, ldc=7
    )
    padded, pads = padded_problem(problem)
    assert pads == ("a", "b", "c")
    # trans A is stored k x m with ld >= m: ld 5 -> 8 and a batch stride of k * 8.
    assert (padded.lda, padded.stride_a) == (8, 7 * 8)
    # trans B is broadcast (stride 0) and stays so.
    assert (padded.ldb, padded.stride_b) == (8, 0)
    assert (padded.ldc, padded.stride_c) == (8, 5 * 8)
    assert lt_gemm(padded).b == LtMatrix("f32", 5, 7, 8, 2, 56)


@pytest.mark.parametrize(
    ("problem", "dims", "copied"),
    [
        (Problem.from_shape(1024, 1025, 1024, "bf16"), (1024, 1032, 1024), ("b", "c")),
        (Problem.from_shape(2047, 4095, 1023, "bf16"), (2047, 4096, 1024), ("a", "b", "c")),
        # k rounded up for a transposed B: A must be copied too (its k grows).
        (Problem(m=8, n=8, k=7, trans_b=True), (8, 8, 8), ("a", "b")),
        (Problem(m=5, n=4, k=4, trans_a=True), (8, 4, 4), ("a", "c")),
    ],
)
def test_padded_dims(problem: Problem, dims: tuple[int, int, int], copied: tuple[str, ...]) -> None:
    padded, got = padded_problem(problem, dims=True)
    assert (padded.m, padded.n, padded.k) == dims
    assert got == copied
    assert misaligned_operands(padded) == ()
    # Copied operands are compact; the others keep the caller's layout.
    if "a" not in copied:
        assert padded.lda == problem.lda
    assert padded.ldc == (dims[1] if "c" in copied else problem.ldc)
