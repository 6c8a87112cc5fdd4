"""An ``out`` that overlaps an input of ``unimatmul.matmul`` on NumPy arrays: NumPy's answer.

``numpy.matmul`` gives the right answer when ``out`` is ``a``, ``b`` or shares rows with
them (it computes into a temporary and copies). ``unimatmul.matmul`` does the same, with the
oneDNN kernel tuned for the problem (in tune mode, for real) serving the temporary. Each
case is compared with a float64 reference of the values before the call and with
``numpy.matmul`` on a copy of the same operands. torch's cases: tests/torch/test_torch_overlap.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onednn_caps import skip_unless_offered
from overlap_cases import CASES, N, randn

import unimatmul
from unimatmul import api
from unimatmul.backend import Target
from unimatmul.core.arrays import CPU, adapter_of
from unimatmul.core.dtypes import tolerance
from unimatmul.core.overlap import OutGuard, extent
from unimatmul.core.problem import Problem
from unimatmul.testing import prefer_kernel

pytestmark = pytest.mark.filterwarnings("error:unimatmul:RuntimeWarning")


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
    return winner in {plan.runner.candidate.identity for plan in api.TABLE.live()}


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
    a, b, out, kwargs = CASES[case]("numpy")
    winner = tune_onednn(isolated.selector, a, b, out=np.empty_like(out), **kwargs)
    ref = _reference(a, b, kwargs)
    with unimatmul.mode("tune"):
        for _ in range(3):  # one resolves the signature; the others are cached calls
            a, b, out, kwargs = CASES[case]("numpy")
            assert unimatmul.matmul(a, b, out=out, **kwargs) is out
            _assert_close(out, ref)
    assert served(winner)  # the tuned kernel served (into the temporary), not Default
    # numpy.matmul's own answer to the same call (with the bias added as numpy adds it).
    a, b, out, kwargs = CASES[case]("numpy")
    if "bias" in kwargs:
        np.add(np.matmul(a, b), kwargs["bias"], out=out)
    else:
        np.matmul(a, b, out=out)
    _assert_close(out, ref)
    # Without the overlap the same kernel writes straight into out.
    a, b, _, kwargs = CASES[case]("numpy")
    fresh = np.full((N, N), np.nan, np.float32)
    unimatmul.matmul(a, b, out=fresh, **{k: v.copy() for k, v in kwargs.items()})
    _assert_close(fresh, ref)


def test_a_failing_overlapping_call_tunes_nothing(isolated: Any) -> None:
    a = randn("numpy", 8, 8, 1)
    with unimatmul.mode("tune"), pytest.raises(ValueError):
        unimatmul.matmul(a, randn("numpy", 8, 9, 2), out=a)  # out has the wrong shape
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


def test_c_overlapping_out_is_copied_as_numpy_copies(isolated: Any) -> None:
    """C is copied into out first (by NumPy, which handles the overlap), then read from out."""
    a, b = randn("numpy", N, N, 1), randn("numpy", N, N, 2)
    winner = tune_onednn(isolated.selector, a, b, out=np.empty((N, N), np.float32), beta=1.0)
    for _ in range(2):
        buf = randn("numpy", N + 1, N, 3)
        ref = a.astype(np.float64) @ b.astype(np.float64) + buf[:N].astype(np.float64)
        with unimatmul.mode("tune"):
            unimatmul.matmul(a, b, c=buf[:N], beta=1.0, out=buf[1:])
        _assert_close(buf[1:], ref)
    assert served(winner)
