"""Problem: the key and its round trip, shape parsing, validation, operand layouts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unimatmul.core.dtypes import ITEMSIZE
from unimatmul.core.problem import EPILOGUES, Problem, matrix_layout


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    m, n, k = (draw(st.integers(1, 5000)) for _ in range(3))
    batch = draw(st.sampled_from([1, 1, 2, 7, 64]))
    dtype = draw(st.sampled_from(sorted(ITEMSIZE)))
    dtype_c = draw(st.sampled_from([dtype, "f32"]))
    trans_a, trans_b = draw(st.booleans()), draw(st.booleans())
    lda = (m if trans_a else k) + draw(st.integers(0, 64))
    ldb = (k if trans_b else n) + draw(st.integers(0, 64))
    ldc = n + draw(st.integers(0, 64))
    strides = (0, 0, 0)
    if batch > 1 and draw(st.booleans()):
        # Explicit batch strides, a broadcast (stride 0) operand among them.
        strides = (
            draw(st.sampled_from([0, m * lda, m * lda + 3])),
            draw(st.sampled_from([0, k * ldb, k * ldb + 5])),
            m * ldc,
        )
    epilogue = draw(st.sampled_from(EPILOGUES))
    return Problem(
        m=m,
        n=n,
        k=k,
        batch=batch,
        dtype_a=dtype,
        dtype_b=dtype,
        dtype_c=dtype_c,
        compute=draw(st.sampled_from(["f32", "f64", "tf32", "f16", "bf16"])),
        trans_a=trans_a,
        trans_b=trans_b,
        lda=lda,
        ldb=ldb,
        ldc=ldc,
        stride_a=strides[0],
        stride_b=strides[1],
        stride_c=strides[2],
        beta_zero=draw(st.booleans()),
        epilogue=epilogue,
        dtype_bias=draw(st.sampled_from([None, "f32", dtype])),
        align=draw(st.sampled_from([1, 2, 4, 8, 16])),
    )


@settings(max_examples=300, deadline=None)
@given(problems())
def test_key_round_trip(problem: Problem) -> None:
    again = Problem.from_key(problem.key)
    assert again == problem
    assert again.key == problem.key
    assert hash(again) == hash(problem)


def test_key_format_is_pinned() -> None:
    # Cache files on users' disks depend on this exact text: change it only with a migration.
    assert Problem.from_shape(64, 48, 32).key == (
        "gemm:f32.f32.f32:f32:NN:m64n48k32b1:ld32,48,48:st0,0,0:beta0:none:al16"
    )
    batched = Problem.from_shape(128, 128, 64, batch=12, epilogue="bias_gelu")
    assert batched.key == (
        "gemm:f32.f32.f32:f32:NN:m128n128k64b12:ld64,128,128:st8192,8192,16384:beta0:bias_gelu:biasf32:al16"
    )


def test_equal_layouts_give_equal_keys() -> None:
    # A bias dtype without a bias, or batch strides of a single matrix, are not part of the problem.
    assert Problem(4, 5, 6, dtype_bias="f16") == Problem(4, 5, 6)
    assert Problem(4, 5, 6, stride_a=99, stride_b=7) == Problem(4, 5, 6)
    assert Problem(4, 5, 6, epilogue="bias").dtype_bias == "f32"


def test_derived_facts() -> None:
    p = Problem.from_shape(3, 5, 7, "bf16", batch=2, epilogue="bias_relu")
    assert p.has_bias and p.activation == "relu"
    assert p.flops == 2 * 3 * 5 * 7 * 2
    assert p.shape_text == "2x3x5x7"
    assert p.compute == "f32"
    assert Problem.from_shape(3, 5, 7, "f64").compute == "f64"
    assert Problem.from_shape(3, 5, 7, epilogue="gelu_tanh").activation == "gelu_tanh"
    assert Problem.from_shape(3, 5, 7, epilogue="bias").activation is None
    # A broadcast operand is read once, not once per batch.
    broadcast = Problem(3, 5, 7, batch=4, stride_a=21, stride_b=0, stride_c=15)
    assert broadcast.min_bytes == 4 * (21 * 4) + 35 * 4 + 4 * (15 * 4)  # A per batch, B once, C per batch


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("64x48x32", (1, 64, 48, 32, "f32")),
        ("64X48X32:bf16", (1, 64, 48, 32, "bf16")),
        ("12x128x128x64", (12, 128, 128, 64, "f32")),
        ("1x1x1:float16", (1, 1, 1, 1, "f16")),
        ("7x11x13:f64", (1, 7, 11, 13, "f64")),
    ],
)
def test_parse_shape(text: str, expected: tuple[int, int, int, int, str]) -> None:
    p = Problem.parse_shape(text)
    assert (p.batch, p.m, p.n, p.k, p.dtype_a) == expected
    assert p.dtype_b == p.dtype_c == expected[4]
    assert not p.trans_a and not p.trans_b and p.beta_zero and p.epilogue == "none"


@pytest.mark.parametrize("text", ["64x48", "0x4x4", "4x-1x4", "axbxc", "1x2x3x4x5", "", "64x48x32x"])
def test_parse_shape_rejects_bad_text(text: str) -> None:
    with pytest.raises(ValueError, match="bad shape"):
        Problem.parse_shape(text)


def test_parse_shape_rejects_unknown_dtype() -> None:
    with pytest.raises(TypeError, match="unsupported dtype int8"):
        Problem.parse_shape("4x4x4:int8")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"m": 0}, "Problem.m must be a positive int"),
        ({"k": -3}, "Problem.k must be a positive int"),
        ({"batch": 0}, "Problem.batch must be a positive int"),
        ({"dtype_a": "f12"}, "dtype_a='f12' is not one of"),
        ({"dtype_c": "int8"}, "dtype_c='int8' is not one of"),
        ({"epilogue": "tanh"}, "unknown epilogue 'tanh'"),
        ({"op": "conv"}, "unknown op 'conv'"),
        ({"lda": 3}, "leading dimensions"),
        ({"trans_b": True, "ldb": 2}, "leading dimensions"),
        ({"ldc": 4}, "leading dimensions"),
        ({"compute": "f 32"}, "Problem.compute"),
        ({"align": 3}, "Problem.align must be a power of two"),
        ({"epilogue": "bias", "dtype_bias": "i8"}, "dtype_bias='i8'"),
    ],
)
def test_validation_errors_name_the_field(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"m": 8, "n": 5, "k": 6} | kwargs
    with pytest.raises(ValueError, match=match):
        Problem(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["", "gemm", "gemm:f32.f32.f32:f32:NN:m1n1k1b1", "not a key at all"])
def test_from_key_rejects_garbage(key: str) -> None:
    with pytest.raises(ValueError, match="not a unimatmul problem key"):
        Problem.from_key(key)


# --- matrix_layout ------------------------------------------------------------------


def _elements(x: np.ndarray) -> tuple[int, ...]:
    return tuple(s // x.itemsize for s in x.strides)


def test_layout_of_contiguous_and_transposed_views() -> None:
    x = np.empty((6, 10), np.float32)
    assert matrix_layout(x.shape, _elements(x), "a") == (False, 10)
    assert matrix_layout(x.T.shape, _elements(x.T), "a") == (True, 10)
    # A column slice keeps the parent's leading dimension: no copy, just a wider ld.
    view = x[:, 2:7]
    assert matrix_layout(view.shape, _elements(view), "a") == (False, 10)
    assert matrix_layout(view.T.shape, _elements(view.T), "a") == (True, 10)


def test_layout_uses_the_last_two_dims_of_a_batch() -> None:
    x = np.empty((3, 4, 5), np.float32)
    assert matrix_layout(x.shape, _elements(x), "a") == (False, 5)
    t = x.transpose(0, 2, 1)
    assert matrix_layout(t.shape, _elements(t), "a") == (True, 5)


@pytest.mark.parametrize(
    ("shape", "strides", "expected"),
    [
        ((1, 7), (7, 1), (False, 7)),  # one row
        ((1, 7), (1, 1), (False, 7)),  # the transpose of a column: same layout
        ((1, 7), (123, 1), (False, 7)),  # a size-1 dim may carry any stride
        ((7, 1), (1, 7), (False, 1)),  # one column, stored contiguously
        ((7, 1), (1, 1), (False, 1)),
        ((7, 1), (3, 1), (False, 3)),  # a strided column: row-major with ld 3
        ((1, 1), (5, 9), (False, 1)),
    ],
)
def test_layout_normalises_size_one_dims(
    shape: tuple[int, int], strides: tuple[int, int], expected: tuple[bool, int]
) -> None:
    assert matrix_layout(shape, strides, "b") == expected


@pytest.mark.parametrize(
    ("shape", "strides"),
    [
        ((4, 5), (10, 2)),  # every other column
        ((4, 5), (2, 8)),  # every other row of a transposed matrix
        ((4, 5), (0, 1)),  # broadcast rows: overlapping, no leading dimension
        ((4, 5), (1, 1)),
        ((4, 5), (1, 3)),  # column-major with ld smaller than the rows
    ],
)
def test_layout_without_a_unit_stride_is_an_error(shape: tuple[int, int], strides: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match=r"b has strides .* no GEMM kernel takes") as info:
        matrix_layout(shape, strides, "b")
    assert "contiguous" in str(info.value)


def test_layout_error_on_a_real_numpy_view() -> None:
    x = np.empty((8, 8), np.float32)[:, ::2]
    with pytest.raises(ValueError, match=r"a has strides \(8, 2\) for shape \(8, 4\)"):
        matrix_layout(x.shape, _elements(x), "a")
