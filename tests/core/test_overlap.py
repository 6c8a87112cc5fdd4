"""An ``out`` that overlaps an input of ``unimatmul.matmul`` on NumPy arrays: NumPy's answer.

``numpy.matmul`` gives the right answer when ``out`` is ``a``, ``b`` or shares rows with
them (it computes into a temporary and copies). ``unimatmul.matmul`` does the same, with the
oneDNN kernel tuned for the problem (in tune mode, for real) serving the temporary. Each
case is compared with a float64 reference of the values before the call and with
``numpy.matmul`` on a copy of the same operands. torch's cases: tests/torch/test_overlap.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from onednn_caps import skip_unless_offered

import unimatmul
from unimatmul import api
from unimatmul.core.arrays import CPU, adapter_of
from unimatmul.core.backend import Target
from unimatmul.core.dtypes import tolerance
from unimatmul.core.overlap import OutGuard, extent
from unimatmul.core.problem import Problem
from unimatmul.testing import prefer_kernel

pytestmark = pytest.mark.filterwarnings("error:unimatmul:RuntimeWarning")

N = 256  # 256x256x256 f32: oneDNN's blocked kernels read a while they write out


def _randn(rows: int, cols: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


def tune_onednn(selector: Any, a: Any, b: Any, **kwargs: Any) -> str:
    """Tune the problem of ``a @ b`` (``kwargs``: out, bias, ...) in tune mode, through the
    API; where Default won, make the fastest checked oneDNN kernel the winner (the
    tuning is real, only the winner is overridden). Returns the winner."""
    skip_unless_offered("f32")
    with unimatmul.mode("tune"):
        unimatmul.matmul(a, b, **kwargs)
    adapter = adapter_of(a)
    problem = Problem.from_operands(adapter, a, b, **kwargs)[0]
    record = prefer_kernel(selector, problem, Target(adapter, CPU), backend="onednn")
    assert record.winner.startswith("onednn/"), f"no oneDNN kernel passed the check: {record.winner}"
    api.clear_fast_path()
    return record.winner


def served(winner: str) -> bool:
    """Whether a signature resolved since the last clear is served by ``winner``."""
    return winner in {found[0].candidate.identity for found in api._fast._data.values()}


# Each case makes fresh operands: (a, b, out, keywords), where out overlaps an input.
def _out_is_a() -> tuple[Any, ...]:
    a = _randn(N, N, 1)
    return a, _randn(N, N, 2), a, {}


def _out_is_b() -> tuple[Any, ...]:
    b = _randn(N, N, 2)
    return _randn(N, N, 1), b, b, {}


def _out_one_row_below_a() -> tuple[Any, ...]:
    buf = _randn(N + 1, N, 1)
    return buf[:N], _randn(N, N, 2), buf[1:], {}


def _out_is_the_storage_of_a_transposed() -> tuple[Any, ...]:
    buf = _randn(N, N, 1)
    return buf.T, _randn(N, N, 2), buf, {}


def _out_columns_overlap_b() -> tuple[Any, ...]:
    buf = _randn(N, 2 * N, 2)  # b: the left half, out: the middle of a padded buffer
    return _randn(N, N, 1), buf[:, :N], buf[:, N // 2 : N // 2 + N], {}


def _out_overlaps_bias() -> tuple[Any, ...]:
    out = _randn(N, N, 3)
    return _randn(N, N, 1), _randn(N, N, 2), out, {"bias": out[5]}


CASES: dict[str, Callable[[], tuple[Any, ...]]] = {
    "out=a": _out_is_a,
    "out=b": _out_is_b,
    "out one row below a": _out_one_row_below_a,
    "out=a.T's storage (view)": _out_is_the_storage_of_a_transposed,
    "out columns overlap b (views)": _out_columns_overlap_b,
    "out overlaps bias": _out_overlaps_bias,
}


def _reference(a: Any, b: Any, kwargs: dict[str, Any]) -> np.ndarray:
    ref = a.astype(np.float64) @ b.astype(np.float64)
    if "bias" in kwargs:
        ref = ref + kwargs["bias"].astype(np.float64)
    return ref


def _assert_close(got: np.ndarray, ref: np.ndarray) -> None:
    got = got.astype(np.float64)
    assert np.isfinite(got).all()
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    worst = np.abs(got - ref).max() / np.abs(ref).max()
    tol = tolerance("f32", "f32")
    assert err <= tol and worst <= 10 * tol, f"relative error {err:.3g}, worst element {worst:.3g}"


@pytest.mark.parametrize("case", list(CASES))
def test_an_out_overlapping_an_input_gets_numpys_answer(isolated: Any, case: str) -> None:
    a, b, out, kwargs = CASES[case]()
    winner = tune_onednn(isolated.selector, a, b, out=np.empty_like(out), **kwargs)
    ref = _reference(a, b, kwargs)
    with unimatmul.mode("tune"):
        for _ in range(3):  # one resolves the signature; the others are cached calls
            a, b, out, kwargs = CASES[case]()
            assert unimatmul.matmul(a, b, out=out, **kwargs) is out
            _assert_close(out, ref)
    assert served(winner)  # the tuned kernel served (into the temporary), not Default
    # numpy.matmul's own answer to the same call (with the bias added as numpy adds it).
    a, b, out, kwargs = CASES[case]()
    if "bias" in kwargs:
        np.add(np.matmul(a, b), kwargs["bias"], out=out)
    else:
        np.matmul(a, b, out=out)
    _assert_close(out, ref)
    # Without the overlap the same kernel writes straight into out.
    a, b, _, kwargs = CASES[case]()
    fresh = np.full((N, N), np.nan, np.float32)
    unimatmul.matmul(a, b, out=fresh, **{k: v.copy() for k, v in kwargs.items()})
    _assert_close(fresh, ref)


def test_a_failing_overlapping_call_tunes_nothing(isolated: Any) -> None:
    a = _randn(8, 8, 1)
    with unimatmul.mode("tune"), pytest.raises(ValueError):
        unimatmul.matmul(a, _randn(8, 9, 2), out=a)  # out has the wrong shape
    assert isolated.store_count() == 0


def test_extents_and_the_guard() -> None:
    adapter = adapter_of(np.empty(1))
    buf = np.zeros((4, 8), np.float32)
    assert extent(adapter, buf) == (0, 128)
    assert extent(adapter, buf[:, ::-1]) == (-28, 100)
    assert extent(adapter, buf[:0]) == (0, 0)
    guard = OutGuard(adapter, buf[:2], buf[2:], buf[2:]).check
    assert not guard(buf[:2], buf[2:], buf[2:])  # adjacent rows: no byte in common
    assert guard(buf[:2], buf[1:3], buf[2:])  # one row in common
    with_bias = OutGuard(adapter, buf[:2], buf[2:], buf[2:], buf[3]).check
    assert not with_bias(buf[:2], buf[2:], buf[2:], buf[3])
    assert with_bias(buf[:2], buf[2:], buf[2:], buf[1])  # the bias is out's second row
    torch = pytest.importorskip("torch")
    t = torch.zeros(4, 8)
    guard = OutGuard(adapter_of(t), t[:2], t[2:], t[2:]).check
    assert not guard(t[:2], t[2:], t[2:])
    assert guard(t[:2], t[1:3], t[2:])
    seen = t.t()[:, 2:]  # a transposed view of the rows out holds
    assert OutGuard(adapter_of(t), t[2:], t[:2], seen).check(t[2:], t[:2], seen)
