"""An ``out`` that overlaps an input, on torch tensors: torch's own result, bit for bit.

torch 2.13's ``out=`` kernels take an overlapping ``out`` as it comes: ``torch.mm(a, b,
out=a)`` returns (and repeats) a result that is not ``a @ b``, without an error. So
``unimatmul.matmul`` runs torch's own kernel for such a call (core/overlap.py), even where
a oneDNN kernel, tuned for real in tune mode, serves the signature; routed calls
(``unimatmul.torch.enable()``) leave every ``out=`` form to torch. Each case is compared
bit for bit with torch's call on fresh copies of the same operands, through the Python
path and the native one, on one thread: with more, torch's own result for some overlaps
(out's columns over b's, on 2 threads) changes from call to call (its threads race).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from overlap_cases import CASES, N  # noqa: E402
from torch_helpers import Env, onednn_available, tune_preferring_kernels  # noqa: E402

import unimatmul  # noqa: E402
import unimatmul.torch as ut  # noqa: E402
from unimatmul import api  # noqa: E402
from unimatmul.backend import Target  # noqa: E402
from unimatmul.core.arrays import CPU, adapter_of  # noqa: E402
from unimatmul.core.problem import Problem  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _tune(env: Env, a: torch.Tensor, b: torch.Tensor, **kwargs: Any) -> str:
    """Tune the problem in tune mode through the API; a oneDNN kernel is its winner."""
    if not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    with unimatmul.mode("tune"):
        unimatmul.matmul(a, b, **kwargs)
    adapter = adapter_of(a)
    problem = Problem.from_operands(adapter, a, b, **kwargs)[0]
    (record,) = tune_preferring_kernels(env.selector, [(problem, Target(adapter, CPU))], "onednn")
    assert record.winner.startswith("onednn/"), record.winner
    api.clear_fast_path()
    return record.winner


def _same(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


def _torch_itself(a: Any, b: Any, out: Any, kwargs: dict[str, Any]) -> None:
    """What torch does with the call (unimatmul's Default for it)."""
    if "bias" in kwargs:
        torch.addmm(kwargs["bias"], a, b, out=out)
    else:
        torch.matmul(a, b, out=out)


@pytest.mark.parametrize("case", list(CASES))
def test_unimatmul_matmul_gives_torchs_result(env: Env, case: str) -> None:
    a, b, out, kwargs = CASES[case]("torch")
    winner = _tune(env, a, b, out=torch.empty(N, N), **kwargs)
    a, b, _, kwargs = CASES[case]("torch")
    fresh = torch.full((N, N), float("nan"))
    with unimatmul.mode("tune"):
        unimatmul.matmul(a, b, out=fresh, **kwargs)  # no overlap: the tuned kernel
    assert winner in {plan.runner.candidate.identity for plan in api.TABLE.live()}
    ref = a.double() @ b.double() + (kwargs["bias"].double() if kwargs else 0)
    torch.testing.assert_close(fresh.double(), ref, rtol=1e-4, atol=1e-4)
    for mode in ("tune", "cached"):  # the first resolves the signature; the next are cached calls
        for _ in range(2):
            a, b, out, kwargs = CASES[case]("torch")
            with unimatmul.mode(mode):
                assert unimatmul.matmul(a, b, out=out, **kwargs) is out
            a2, b2, expected, kwargs2 = CASES[case]("torch")
            _torch_itself(a2, b2, expected, kwargs2)
            _same(out, expected)
    # Whether torch's own result is a @ b here depends on the CPU's kernel (on AVX2 it
    # differs, on an AMX CPU torch computes it right): either way unimatmul gave torch's.
    # The native path serves the same calls without an overlap the same way as before.
    a, b, _, kwargs = CASES[case]("torch")
    fresh.fill_(float("nan"))
    unimatmul.matmul(a, b, out=fresh, **kwargs)
    torch.testing.assert_close(fresh.double(), ref, rtol=1e-4, atol=1e-4)


def test_a_partially_overlapping_c_is_torchs_error(env: Env) -> None:
    buf = _randn(N + 1, N, seed=3)
    a, b = _randn(N, N, seed=1), _randn(N, N, seed=2)
    with pytest.raises(RuntimeError, match="single memory location"):
        buf[1:].copy_(buf[:N])  # torch itself
    with pytest.raises(RuntimeError, match="single memory location"):
        unimatmul.matmul(a, b, c=buf[:N], beta=1.0, out=buf[1:])
    c = _randn(N, N, seed=3)
    expected = torch.addmm(c.clone(), a, b)
    unimatmul.matmul(a, b, c=c, beta=1.0, out=c)  # out is c: the documented in-place form
    torch.testing.assert_close(c, expected, rtol=1e-5, atol=1e-4)


# Routed calls: torch's out= forms are torch's own, whichever kernel serves the functional call.
def _routed_cases() -> dict[str, Callable[[], tuple[torch.Tensor, Callable[[], Any]]]]:
    def mm_out_a() -> tuple[torch.Tensor, Callable[[], Any]]:
        a, b = _randn(N, N, seed=1), _randn(N, N, seed=2)
        return a, lambda: torch.mm(a, b, out=a)

    def matmul_out_shifted() -> tuple[torch.Tensor, Callable[[], Any]]:
        buf, b = _randn(N + 1, N, seed=1), _randn(N, N, seed=2)
        return buf, lambda: torch.matmul(buf[:N], b, out=buf[1:])

    def matmul_3d_out_x() -> tuple[torch.Tensor, Callable[[], Any]]:
        x, y = _randn(4, 64, N, seed=1), _randn(N, N, seed=2)
        return x, lambda: torch.matmul(x, y, out=x)

    def addmm_out_a() -> tuple[torch.Tensor, Callable[[], Any]]:
        c, a, b = _randn(N, N, seed=3), _randn(N, N, seed=1), _randn(N, N, seed=2)
        return a, lambda: torch.addmm(c, a, b, out=a)

    def addmm_out_c() -> tuple[torch.Tensor, Callable[[], Any]]:
        c, a, b = _randn(N, N, seed=3), _randn(N, N, seed=1), _randn(N, N, seed=2)
        return c, lambda: torch.addmm(c, a, b, out=c)

    return {
        "torch.mm(a, b, out=a)": mm_out_a,
        "torch.matmul(a, b, out=a one row down)": matmul_out_shifted,
        "torch.matmul(x3d, y, out=x)": matmul_3d_out_x,
        "torch.addmm(c, a, b, out=a)": addmm_out_a,
        "torch.addmm(c, a, b, out=c)": addmm_out_c,
    }


@pytest.mark.parametrize("case", list(_routed_cases()))
def test_routed_out_forms_are_torchs_own(env: Env, case: str) -> None:
    make = _routed_cases()[case]
    # The functional products of these shapes are tuned and served by a oneDNN kernel.
    if not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    ut.enable()
    a, b, c = _randn(N, N, seed=1), _randn(N, N, seed=2), _randn(N, N, seed=3)
    x = _randn(4, 64, N, seed=1)
    with ut.enabled(), unimatmul.mode("tune"):
        routed = [torch.mm(a, b), torch.addmm(c, a, b), torch.matmul(x, b)]
    adapter = adapter_of(a)
    problems = {p.problem for p in ut.plans() if p.problem is not None}
    tune_preferring_kernels(env.selector, [(p, Target(adapter, CPU)) for p in problems], "onednn")
    ut.clear_plans()
    with unimatmul.mode("tune"):
        again = [torch.mm(a, b), torch.addmm(c, a, b), torch.matmul(x, b)]
    assert {p.runner.candidate.backend for p in ut.plans() if p.runner is not None} == {"onednn"}
    for first, second in zip(routed, again, strict=True):
        torch.testing.assert_close(first, second, rtol=1e-4, atol=1e-4)
    for mode in ("tune", "cached"):
        with unimatmul.mode(mode):
            written, call = make()
            call()
        ut.disable()
        expected, own = make()
        own()
        _same(written, expected)
        ut.enable()
