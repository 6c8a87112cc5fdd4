"""unimatmul.matmul against a float64 reference, in every mode, with real oneDNN kernels.

Besides the modes ``off``, ``cached`` and ``tune``, the ``forced`` cases store a record
naming each oneDNN candidate in turn and call in ``cached`` mode, so that every
kernel oneDNN offers runs through the public API (tuning alone might pick Default).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from onednn_caps import skip_unless_offered

import unimatmul
from unimatmul.api import clear_fast_path
from unimatmul.backend import Target
from unimatmul.cache.record import TuningRecord
from unimatmul.core.arrays import CPU, adapter_of
from unimatmul.core.dtypes import tolerance
from unimatmul.core.problem import Problem

# A fallback to Default warns; here that would hide a broken kernel behind a right answer.
pytestmark = pytest.mark.filterwarnings("error:unimatmul:RuntimeWarning")

RNG = np.random.default_rng(20240607)

# (batch of a or None for 2-D, batch of b or None, m, n, k)
SHAPES = [
    (None, None, 1, 1, 1),
    (None, None, 1, 7, 1),
    (None, None, 7, 1, 13),
    (None, None, 1, 1, 300),
    (None, None, 17, 19, 23),
    (None, None, 64, 48, 32),
    (None, None, 257, 263, 269),
    (None, None, 384, 512, 640),
    (3, 3, 17, 19, 23),
    (4, None, 5, 11, 7),  # B broadcast over the batch
    (None, 4, 5, 11, 7),  # A broadcast over the batch
    (1, 1, 9, 10, 11),  # a batch of one
    (2, 2, 1, 1, 1),
]
LAYOUTS = ["NN", "TN", "NT", "TT"]


def _ids(shape: tuple[int | None, int | None, int, int, int]) -> str:
    ba, bb, m, n, k = shape
    return f"{ba or '-'}.{bb or '-'}:{m}x{n}x{k}"


# --- operands and the reference -----------------------------------------------------


def _randn(shape: tuple[int, ...], dtype: str, lib: str) -> Any:
    values = RNG.standard_normal(shape).astype(np.float32)
    if lib == "numpy":
        return values.astype({"f32": np.float32, "f64": np.float64, "f16": np.float16}[dtype])
    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    return torch.from_numpy(values).to(torch_dtype)


def _operand(batch: int | None, rows: int, cols: int, trans: bool, dtype: str, lib: str) -> Any:
    """A [batch,] rows x cols operand, as a transposed view of column-major storage if ``trans``."""
    lead = () if batch is None else (batch,)
    if not trans:
        return _randn((*lead, rows, cols), dtype, lib)
    stored = _randn((*lead, cols, rows), dtype, lib)
    return stored.swapaxes(-1, -2) if lib == "numpy" else stored.transpose(-1, -2)


def _f64(x: Any) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    return x.detach().to(torch.float64).numpy()


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def reference(
    a: Any,
    b: Any,
    *,
    alpha: float = 1.0,
    beta: float = 0.0,
    c: Any = None,
    bias: Any = None,
    activation: str | None = None,
) -> np.ndarray:
    ref = alpha * np.matmul(_f64(a), _f64(b))
    if beta != 0.0:
        ref = ref + beta * _f64(c)
    if bias is not None:
        ref = ref + _f64(bias)
    if activation == "relu":
        ref = np.maximum(ref, 0.0)
    elif activation == "gelu":
        ref = 0.5 * ref * (1.0 + _erf(ref / math.sqrt(2.0)))
    elif activation == "gelu_tanh":
        ref = 0.5 * ref * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (ref + 0.044715 * ref**3)))
    return ref


def assert_close(out: Any, ref: np.ndarray, dtype: str) -> None:
    got = _f64(out)
    assert got.shape == ref.shape
    assert np.isfinite(got).all(), "output has NaN or inf (a poisoned output was not written?)"
    err = np.linalg.norm((got - ref).ravel()) / max(np.linalg.norm(ref.ravel()), 1e-300)
    assert err <= tolerance(dtype, "f32"), f"relative error {err:.3g} > {tolerance(dtype, 'f32'):.3g}"


def _poisoned_like(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return np.full(x.shape, np.nan, dtype=x.dtype)
    return torch.full(tuple(x.shape), float("nan"), dtype=x.dtype)


def _onednn_identities(isolated: Any, a: Any, b: Any, **kwargs: Any) -> list[str]:
    adapter = adapter_of(a)
    problem, _ = Problem.from_operands(adapter, a, b, **kwargs)
    backend = isolated.plugins.backends()["onednn"]
    return [c.identity for c in backend.candidates(problem, Target(adapter, CPU))]


def _force(isolated: Any, identity: str, a: Any, b: Any, **kwargs: Any) -> None:
    """Store a record naming ``identity`` as the winner for these operands."""
    adapter = adapter_of(a)
    problem, _ = Problem.from_operands(adapter, a, b, **kwargs)
    platform = isolated.selector.platform(Target(adapter, CPU))
    record = TuningRecord(problem.key, identity, 1e-6, 2e-6, versions=platform.versions)
    isolated.selector.store.put(platform.namespace, problem.key, record)
    clear_fast_path()


def _run_modes(
    isolated: Any,
    mode: str,
    call: Callable[[], Any],
    check: Callable[[Any], None],
    a: Any,
    b: Any,
    **describe_kwargs: Any,
) -> None:
    """Run ``call`` in ``mode`` and check it; ``forced`` runs it once per oneDNN candidate."""
    if mode != "forced":
        adapter = adapter_of(a)
        problem, _ = Problem.from_operands(adapter, a, b, **describe_kwargs)
        namespace = isolated.selector.platform(Target(adapter, CPU)).namespace
        known = isolated.selector.store.get(namespace, problem.key) is not None
        before = isolated.selector.stats.tuned
        with unimatmul.mode(mode):
            check(call())
            check(call())  # the second call takes the fast path
        assert isolated.selector.stats.tuned - before == (1 if mode == "tune" and not known else 0)
        return
    skip_unless_offered(adapter_of(a).dtype(a))  # bf16 kernels need AVX-512-BF16 or AMX
    identities = _onednn_identities(isolated, a, b, **describe_kwargs)
    assert identities, "oneDNN offers no kernel for this problem"
    for identity in identities:
        _force(isolated, identity, a, b, **describe_kwargs)
        hits = isolated.selector.stats.cache_hits
        with unimatmul.mode("cached"):
            check(call())
        assert isolated.selector.stats.cache_hits == hits + 1, identity
    assert isolated.selector.stats.fallbacks == 0


MODES = ["off", "cached", "tune", "forced"]


# --- correctness --------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES, ids=_ids)
def test_numpy_f32(isolated: Any, mode: str, shape: tuple[int | None, int | None, int, int, int]) -> None:
    ba, bb, m, n, k = shape
    a = _operand(ba, m, k, False, "f32", "numpy")
    b = _operand(bb, k, n, False, "f32", "numpy")
    ref = reference(a, b)
    if mode == "forced" and ((ba is None) != (bb is None)):
        # oneDNN declines broadcast batches (stride 0): those problems stay with Default.
        adapter = adapter_of(a)
        problem, _ = Problem.from_operands(adapter, a, b)
        with pytest.raises(unimatmul.UnsupportedProblem, match="broadcast"):
            isolated.plugins.backends()["onednn"].candidates(problem, Target(adapter, CPU))
        return
    _run_modes(
        isolated, mode, lambda: unimatmul.matmul(a, b), lambda out: assert_close(out, ref, "f32"), a, b
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "shape", [(None, None, 17, 19, 23), (None, None, 1, 5, 3), (3, 3, 6, 7, 5)], ids=_ids
)
def test_transposed_views_are_used_without_copies(
    isolated: Any, mode: str, layout: str, shape: tuple[int | None, int | None, int, int, int]
) -> None:
    ba, bb, m, n, k = shape
    a = _operand(ba, m, k, layout[0] == "T", "f32", "numpy")
    b = _operand(bb, k, n, layout[1] == "T", "f32", "numpy")
    problem, _ = Problem.from_operands(adapter_of(a), a, b)
    assert (problem.trans_a, problem.trans_b) == (layout[0] == "T" and m > 1, layout[1] == "T" and k > 1)
    ref = reference(a, b)
    _run_modes(
        isolated, mode, lambda: unimatmul.matmul(a, b), lambda out: assert_close(out, ref, "f32"), a, b
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize(
    "shape",
    [(None, None, 1, 1, 1), (None, None, 31, 37, 41), (None, None, 200, 96, 160), (2, 2, 9, 8, 7)],
    ids=_ids,
)
@pytest.mark.parametrize("layout", ["NN", "TT"])
def test_torch_cpu(
    isolated: Any, mode: str, dtype: str, shape: tuple[int | None, int | None, int, int, int], layout: str
) -> None:
    ba, bb, m, n, k = shape
    a = _operand(ba, m, k, layout[0] == "T", dtype, "torch")
    b = _operand(bb, k, n, layout[1] == "T", dtype, "torch")
    ref = reference(a, b)

    def check(out: Any) -> None:
        assert isinstance(out, torch.Tensor) and out.dtype == a.dtype
        assert_close(out, ref, dtype)

    _run_modes(isolated, mode, lambda: unimatmul.matmul(a, b), check, a, b)


@pytest.mark.parametrize("mode", ["off", "cached", "tune"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("shape", [(3, None, 9, 8, 7), (None, 3, 9, 8, 7), (1, 4, 5, 6, 3)], ids=_ids)
def test_torch_broadcast_batches(
    isolated: Any, mode: str, dtype: str, shape: tuple[int | None, int | None, int, int, int]
) -> None:
    ba, bb, m, n, k = shape
    a = _operand(ba, m, k, False, dtype, "torch")
    b = _operand(bb, k, n, True, dtype, "torch")
    ref = reference(a, b)
    _run_modes(
        isolated, mode, lambda: unimatmul.matmul(a, b), lambda out: assert_close(out, ref, dtype), a, b
    )


@pytest.mark.parametrize("lib_dtype", [("numpy", "f64"), ("numpy", "f16"), ("torch", "f16")])
def test_dtypes_without_a_onednn_kernel_use_default(isolated: Any, lib_dtype: tuple[str, str]) -> None:
    lib, dtype = lib_dtype
    a, b = _operand(None, 13, 11, False, dtype, lib), _operand(None, 11, 9, True, dtype, lib)
    with unimatmul.mode("tune"):
        out = unimatmul.matmul(a, b)
    assert_close(out, reference(a, b), dtype)
    (_, _, record), *_ = list(isolated.selector.store.items())
    assert record.winner == "default/default"
    assert [r.identity for r in record.results] == ["default/default"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("batched", [False, True])
def test_out_alpha_beta(isolated: Any, mode: str, batched: bool) -> None:
    lead = (3,) if batched else ()
    a = _randn((*lead, 21, 13), "f32", "numpy")
    b = _randn((*lead, 13, 17), "f32", "numpy")
    c = _randn((*lead, 21, 17), "f32", "numpy")

    # out= given: written in place and returned.
    out = _poisoned_like(c)
    ref = reference(a, b, alpha=0.75)

    def check_out(result: Any) -> None:
        assert result is out
        assert_close(out, ref, "f32")

    _run_modes(isolated, mode, lambda: unimatmul.matmul(a, b, out=out, alpha=0.75), check_out, a, b, out=out)

    # c given with beta: a new output, c left alone.
    c_before = c.copy()
    ref_c = reference(a, b, alpha=1.5, beta=0.5, c=c)
    _run_modes(
        isolated,
        mode,
        lambda: unimatmul.matmul(a, b, c=c, alpha=1.5, beta=0.5),
        lambda result: assert_close(result, ref_c, "f32"),
        a,
        b,
        c=c,
        beta=0.5,
    )
    np.testing.assert_array_equal(c, c_before)

    # out holding C: C is read, then overwritten with the result. Betas change between calls.
    holder = np.empty_like(c)
    for beta in (1.0, -2.0):
        ref_h = reference(a, b, alpha=-1.0, beta=beta, c=c)

        def call(beta: float = beta) -> Any:
            holder[...] = c
            return unimatmul.matmul(a, b, out=holder, alpha=-1.0, beta=beta)

        _run_modes(
            isolated,
            mode,
            call,
            lambda result, r=ref_h: assert_close(result, r, "f32"),
            a,
            b,
            out=holder,
            beta=beta,
        )


def test_alpha_and_beta_are_not_baked_into_a_cached_kernel(isolated: Any) -> None:
    # alpha and beta are call arguments, not part of the signature: one runner serves all values.
    a, b, c = (
        _randn((33, 20), "f32", "numpy"),
        _randn((20, 18), "f32", "numpy"),
        _randn((33, 18), "f32", "numpy"),
    )
    for identity in _onednn_identities(isolated, a, b, c=c, beta=1.0):
        _force(isolated, identity, a, b, c=c, beta=1.0)
        with unimatmul.mode("cached"):
            for alpha, beta in [(1.0, 1.0), (2.0, 0.5), (-0.5, 3.0), (1.0, 1.0)]:
                got = unimatmul.matmul(a, b, c=c, alpha=alpha, beta=beta)
                assert_close(got, reference(a, b, alpha=alpha, beta=beta, c=c), "f32")
    assert isolated.selector.stats.fallbacks == 0


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("lib_dtype", [("numpy", "f32"), ("torch", "f32"), ("torch", "bf16")])
def test_bias_and_activation(
    isolated: Any, mode: str, activation: str | None, lib_dtype: tuple[str, str]
) -> None:
    lib, dtype = lib_dtype
    a, b = _operand(None, 29, 24, False, dtype, lib), _operand(None, 24, 40, True, dtype, lib)
    bias = _randn((40,), dtype, lib)
    ref = reference(a, b, bias=bias, activation=activation)
    _run_modes(
        isolated,
        mode,
        lambda: unimatmul.matmul(a, b, bias=bias, activation=activation),
        lambda out: assert_close(out, ref, dtype),
        a,
        b,
        bias=bias,
        activation=activation,
    )


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_activation_without_bias(isolated: Any, activation: str) -> None:
    a, b = _randn((12, 16), "f32", "numpy"), _randn((16, 10), "f32", "numpy")
    ref = reference(a, b, activation=activation)
    for mode in MODES:
        _run_modes(
            isolated,
            mode,
            lambda: unimatmul.matmul(a, b, activation=activation),
            lambda out: assert_close(out, ref, "f32"),
            a,
            b,
            activation=activation,
        )


def test_new_data_in_the_same_layout_reuses_the_kernel(isolated: Any) -> None:
    a0, b0 = _randn((40, 24), "f32", "numpy"), _randn((24, 56), "f32", "numpy")
    with unimatmul.mode("tune"):
        unimatmul.matmul(a0, b0)
        for _ in range(3):
            a, b = _randn((40, 24), "f32", "numpy"), _randn((24, 56), "f32", "numpy")
            assert_close(unimatmul.matmul(a, b), reference(a, b), "f32")
    assert isolated.selector.stats.tuned == 1
    assert isolated.selector.stats.lookups == 1  # every later call took the fast path


def test_cached_mode_sees_a_problem_tuned_later_in_the_process(isolated: Any) -> None:
    a, b = _randn((48, 40), "f32", "numpy"), _randn((40, 24), "f32", "numpy")
    with unimatmul.mode("cached"):
        unimatmul.matmul(a, b)  # no answer yet: Default
    with unimatmul.mode("tune"):
        unimatmul.matmul(a, b)
    hits = isolated.selector.stats.cache_hits
    with unimatmul.mode("cached"):
        assert_close(unimatmul.matmul(a, b), reference(a, b), "f32")
    assert isolated.selector.stats.cache_hits == hits + 1


# --- bad input ----------------------------------------------------------------------

_A = np.ones((4, 3), np.float32)
_B = np.ones((3, 5), np.float32)

BAD_INPUTS: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    ("shape", lambda: unimatmul.matmul(_A, _A), ValueError, r"contracted dimension: a has shape \(4, 3\)"),
    (
        "batch",
        lambda: unimatmul.matmul(np.ones((2, 4, 3), np.float32), np.ones((3, 3, 5), np.float32)),
        ValueError,
        "batch sizes 2 .* and 3",
    ),
    ("dtype", lambda: unimatmul.matmul(_A, _B.astype(np.float64)), TypeError, "a is f32 but b is f64"),
    (
        "int",
        lambda: unimatmul.matmul(_A.astype(np.int32), _B.astype(np.int32)),
        TypeError,
        "unsupported dtype int32",
    ),
    (
        "1-D",
        lambda: unimatmul.matmul(_A.ravel(), _B),
        ValueError,
        "a must be 2-D or 3-D .* 1-D array of shape",
    ),
    (
        "4-D",
        lambda: unimatmul.matmul(_A, np.ones((2, 2, 3, 5), np.float32)),
        ValueError,
        "b must be 2-D or 3-D .* 4-D",
    ),
    (
        "stride",
        lambda: unimatmul.matmul(np.ones((4, 6), np.float32)[:, ::2], _B),
        ValueError,
        "a has strides .* no GEMM kernel takes",
    ),
    (
        "out shape",
        lambda: unimatmul.matmul(_A, _B, out=np.empty((5, 4), np.float32)),
        ValueError,
        r"out has shape \(5, 4\), expected \(4, 5\)",
    ),
    (
        "out dtype",
        lambda: unimatmul.matmul(_A, _B, out=np.empty((4, 5), np.float64)),
        TypeError,
        "out is f64",
    ),
    (
        "out layout",
        lambda: unimatmul.matmul(_A, _B, out=np.empty((5, 4), np.float32).T),
        ValueError,
        "out must be row-major",
    ),
    (
        "mixed b",
        lambda: unimatmul.matmul(_A, torch.ones(3, 5)),
        TypeError,
        "same array library.*ndarray and Tensor",
    ),
    (
        "mixed a",
        lambda: unimatmul.matmul(torch.ones(4, 3), _B),
        TypeError,
        "same array library.*Tensor and ndarray",
    ),
    ("mixed out", lambda: unimatmul.matmul(_A, _B, out=torch.empty(4, 5)), TypeError, "out is a Tensor"),
    ("list", lambda: unimatmul.matmul([[1.0]], [[1.0]]), TypeError, "takes NumPy arrays, torch tensors"),
    ("beta", lambda: unimatmul.matmul(_A, _B, beta=1.0), ValueError, "beta != 0 needs c"),
    (
        "c shape",
        lambda: unimatmul.matmul(_A, _B, c=np.ones((4, 4), np.float32), beta=1.0),
        ValueError,
        "c has shape",
    ),
    (
        "bias",
        lambda: unimatmul.matmul(_A, _B, bias=np.ones(4, np.float32)),
        ValueError,
        r"bias must have shape \(5,\)",
    ),
    (
        "activation",
        lambda: unimatmul.matmul(_A, _B, activation="tanh"),
        ValueError,
        "unknown activation 'tanh'",
    ),
    (
        "bias stride",
        lambda: unimatmul.matmul(_A, _B, bias=np.ones(10, np.float32)[::2]),
        ValueError,
        "bias must be contiguous, got stride 2",
    ),
    (
        "torch dtype",
        lambda: unimatmul.matmul(torch.ones(4, 3), torch.ones(3, 5, dtype=torch.bfloat16)),
        TypeError,
        "a is f32 but b is bf16",
    ),
]


@pytest.mark.parametrize(("name", "call", "error", "match"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_is_a_clear_error_and_writes_nothing(
    isolated: Any, name: str, call: Callable[[], Any], error: type[Exception], match: str
) -> None:
    for mode in ("tune", "cached", "off"):
        with unimatmul.mode(mode), pytest.raises(error, match=match):
            call()
    assert isolated.selector.stats.tuned == 0
    assert isolated.store_count() == 0
    assert not isolated.cache_path.exists()


def test_unknown_mode_names_the_valid_ones(isolated: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="valid modes: off, cached, tune"), unimatmul.mode("fast"):
        pass
    monkeypatch.setenv("UNIMATMUL_MODE", "always")
    with pytest.raises(ValueError, match="unknown unimatmul mode 'always'"):
        unimatmul.matmul(_A, _B)


# --- NumPy's semantics: empty operands, alpha and beta, ndarray subclasses ---------------------

EMPTY = [((0, 3), (3, 4)), ((2, 0), (0, 4)), ((2, 3), (3, 0)), ((5, 0, 3), (3, 4)), ((2, 4, 0), (2, 0, 3))]


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize(("a_shape", "b_shape"), EMPTY, ids=[f"{a}@{b}" for a, b in EMPTY])
def test_empty_operands_give_what_the_library_gives(
    isolated: Any, lib: str, a_shape: tuple[int, ...], b_shape: tuple[int, ...]
) -> None:
    a, b = np.ones(a_shape, np.float32), np.ones(b_shape, np.float32)
    expected = np.matmul(a, b)  # an empty array, or zeros where k is 0
    if lib == "torch":
        a, b = torch.from_numpy(a), torch.from_numpy(b)
    with unimatmul.mode("tune"):
        for _ in range(2):  # resolved, then cached
            got = unimatmul.matmul(a, b)
            assert type(got) is type(a) and tuple(got.shape) == expected.shape
            np.testing.assert_array_equal(_f64(got), expected)
        out = _poisoned_like(got)
        assert unimatmul.matmul(a, b, out=out) is out
        np.testing.assert_array_equal(_f64(out), expected)
    assert isolated.store_count() == 0  # no kernel to choose: nothing tuned


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_k_zero_with_an_epilogue_is_the_epilogue_alone(isolated: Any, lib: str) -> None:
    a, b = np.ones((3, 0), np.float32), np.ones((0, 4), np.float32)
    bias = np.arange(4, dtype=np.float32) - 2
    c = np.full((3, 4), 3.0, np.float32)
    if lib == "torch":
        a, b, bias, c = (torch.from_numpy(x) for x in (a, b, bias, c))
    got = unimatmul.matmul(a, b, alpha=2.0, beta=0.5, c=c, bias=bias, activation="relu")
    np.testing.assert_array_equal(_f64(got), np.maximum(1.5 + (np.arange(4) - 2.0), 0)[None].repeat(3, 0))


@pytest.mark.parametrize("lib", ["numpy", "torch"])
@pytest.mark.parametrize("bad", ["2", b"2", None, 1j, [2.0]])
def test_alpha_and_beta_must_be_real_numbers(isolated: Any, lib: str, bad: Any) -> None:
    a, b = _randn((4, 5), "f32", lib), _randn((5, 6), "f32", lib)
    unimatmul.matmul(a, b, alpha=2.0)  # the signature is known: the cached call checks too
    with pytest.raises(TypeError, match="alpha must be a real number"):
        unimatmul.matmul(a, b, alpha=bad)
    c = _randn((4, 6), "f32", lib)
    with pytest.raises(TypeError, match="beta must be a real number"):
        unimatmul.matmul(a, b, c=c, beta=bad)
    with pytest.raises(TypeError):  # numpy refuses a string factor too
        np.multiply(np.ones(2, np.float32), "2")
    # Real numbers of any kind are taken, as numpy takes them.
    ref = _f64(a) @ _f64(b)
    for two in (2, np.float32(2.0), np.int64(2), np.array(2.0)):
        assert_close(unimatmul.matmul(a, b, alpha=two), 2 * ref, "f32")


class _Tagged(np.ndarray):
    """A plain ndarray subclass, as user code defines one."""


class _Preferred(np.ndarray):
    __array_priority__ = 5.0


SUBCLASSES: list[tuple[str, Callable[[np.ndarray], Any], Callable[[np.ndarray], Any]]] = [
    ("np.matrix @ ndarray", np.asmatrix, lambda b: b),
    ("subclass @ ndarray", lambda a: a.view(_Tagged), lambda b: b),
    ("ndarray @ subclass", lambda a: a, lambda b: b.view(_Tagged)),
    ("subclass @ higher priority", lambda a: a.view(_Tagged), lambda b: b.view(_Preferred)),
    ("higher priority @ subclass", lambda a: a.view(_Preferred), lambda b: b.view(_Tagged)),
]


@pytest.mark.parametrize(("name", "wrap_a", "wrap_b"), SUBCLASSES, ids=[s[0] for s in SUBCLASSES])
def test_ndarray_subclasses_return_what_numpy_matmul_returns(
    isolated: Any, name: str, wrap_a: Callable[[np.ndarray], Any], wrap_b: Callable[[np.ndarray], Any]
) -> None:
    a, b = wrap_a(_randn((6, 5), "f32", "numpy")), wrap_b(_randn((5, 7), "f32", "numpy"))
    expected = np.matmul(a, b)
    ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    with unimatmul.mode("tune"):
        for _ in range(2):
            got = unimatmul.matmul(a, b)
            assert type(got) is type(expected), name
            assert_close(np.asarray(got), ref, "f32")
    plain = unimatmul.matmul(np.asarray(a), np.asarray(b))  # the same signature, plain arrays
    assert type(plain) is np.ndarray
    out = np.empty((6, 7), np.float32).view(_Tagged)
    assert unimatmul.matmul(a, b, out=out) is out  # numpy.matmul returns out, whatever its type


def test_masked_arrays_are_refused_clearly(isolated: Any) -> None:
    a = np.ma.masked_array(_randn((4, 5), "f32", "numpy"), mask=np.eye(4, 5, dtype=bool))
    b = _randn((5, 6), "f32", "numpy")
    with pytest.raises(ValueError):
        np.matmul(a, b)  # numpy itself cannot carry the mask through a 4x5 @ 5x6 product
    for call in (lambda: unimatmul.matmul(a, b), lambda: unimatmul.matmul(b.T, a.T)):
        with pytest.raises(TypeError, match=r"no masked arrays.*numpy\.ma\.dot"):
            call()
    with unimatmul.mode("tune"), pytest.raises(TypeError, match="masked"):
        unimatmul.matmul(b.T.copy(), b, out=np.ma.masked_array(np.empty((6, 6), np.float32)))
    assert isolated.store_count() == 0


def test_a_subclass_with_its_own_ufunc_rules_is_refused() -> None:
    class Units(np.ndarray):
        def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
            return NotImplemented

    with pytest.raises(TypeError, match=r"__array_ufunc__ decides"):
        unimatmul.matmul(np.ones((2, 2), np.float32).view(Units), np.ones((2, 2), np.float32))
