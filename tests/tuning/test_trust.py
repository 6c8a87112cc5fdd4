"""Trust (unimatmul.tuning.trust) through unimatmul.matmul, on NumPy arrays and CPU torch tensors.

An entry this machine never checked (it came by import or merge, or its mark names another
host) names a registered kernel that computes the wrong product (B taken transposed); its
first call must return the right result, warn once and store why, and no later call or
process may use the kernel. A kernel that is right on tuning's inputs but wrong on the
program's own (data-dependent) is chosen by real tuning and caught by its confirmation
window's first call. Every result is held to a float64 reference.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from harness_fakes import FakeKernel, KernelBackend, right

import unimatmul
from unimatmul import api
from unimatmul.backend import DEFAULT, Target
from unimatmul.cache.record import (
    TuningRecord,
    checked_here,
    checked_hosts,
    local_host,
    mark_checked,
    mark_from_elsewhere,
)
from unimatmul.core.arrays import CPU, adapter_of
from unimatmul.core.problem import Problem
from unimatmul.testing import fast_config, prefer_kernel, registered
from unimatmul.tuning import confirm, trust
from unimatmul.tuning.selector import Selector, set_selector

N = 32  # square, so that B taken transposed has the right shape
SENTINEL = 7.125  # the data-dependent kernel is wrong when A starts with this value


def transposes_b(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    """A real kernel with a real bug: it reads B transposed."""
    k.right(a, b.T, out, alpha, beta, bias)


def wrong_on_sentinel(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    """Right (in float32, so far faster than NumPy's float16 loops) unless A's first element
    is SENTINEL, which no tuning input holds; then one element is far off."""
    out[...] = (np.asarray(a, np.float32) @ np.asarray(b, np.float32)).astype(out.dtype)
    if float(a[(0,) * a.ndim]) == SENTINEL:
        out[(0,) * out.ndim] += 1000.0


@pytest.fixture(params=["numpy", "torch"])
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "torch":
        pytest.importorskip("torch")
    return str(request.param)


def _arrays(kind: str, dtype: Any = np.float32, seed: int = 7) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((N, N)).astype(dtype), rng.standard_normal((N, N)).astype(dtype)
    if kind == "torch":
        import torch

        return torch.from_numpy(a), torch.from_numpy(b)
    return a, b


def _right(out: Any, a: Any, b: Any, rtol: float = 1e-5) -> None:
    out, a, b = (np.asarray(x, np.float64) for x in (out, a, b))
    ref = a @ b
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < rtol


def _target(a: Any) -> Target:
    return Target(adapter_of(a), CPU)


@pytest.fixture
def wrong(isolated: Any) -> Iterator[KernelBackend]:
    backend = KernelBackend("buggy", {"transposed": transposes_b, "right": right})
    with registered(isolated.plugins, backend):
        yield backend


def _store(selector: Selector, a: Any, b: Any, winner: str, mark: Any) -> tuple[Problem, str]:
    """A record of ``winner`` for the product of ``a`` and ``b``, confirmed by a window (so no
    window runs again), with the provenance mark ``mark`` gives it."""
    problem = Problem.from_operands(adapter_of(a), a, b)[0]
    platform = selector.platform(_target(a))
    verdict = {"verdict": "confirmed", "kernel": winner, "kernel_s": 1e-6, "default_s": 2e-6}
    record = TuningRecord(
        problem.key, winner, 1e-6, 2e-6, versions=dict(platform.versions), settings={confirm.KEY: verdict}
    )
    selector.store.put(platform.namespace, problem.key, mark(record))
    return problem, platform.namespace


FOREIGN = {
    "tunableop import": lambda r: mark_from_elsewhere(r, "import:tunableop"),
    "merge": lambda r: mark_from_elsewhere(r, "merge"),
    "another host": lambda r: mark_checked(r, "some-other-machine"),
    "no mark (an older file)": lambda r: r,
}


@pytest.mark.parametrize("origin", list(FOREIGN))
def test_a_foreign_entry_naming_a_wrong_kernel_is_caught_at_its_first_call(
    isolated: Any, wrong: KernelBackend, kind: str, origin: str
) -> None:
    a, b = _arrays(kind)
    problem, namespace = _store(isolated.selector, a, b, "buggy/transposed", FOREIGN[origin])
    with pytest.warns(RuntimeWarning, match="buggy/transposed returned a wrong result") as caught:
        _right(unimatmul.matmul(a, b), a, b)
    assert len([w for w in caught if "wrong result" in str(w.message)]) == 1
    assert wrong.calls == 1  # run once, on the first call, and never again
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: not again
        for _ in range(3):
            _right(unimatmul.matmul(a, b), a, b)
    assert wrong.calls == 1
    assert isolated.selector.stats.reverted == 1
    # The store says why, so another process goes to Default without trying it.
    assert isolated.selector.settle(timeout=10)
    stored = isolated.selector.store.get(namespace, problem.key)
    found = stored.settings[confirm.KEY]
    assert found["verdict"] == confirm.REVERTED and found["kernel"] == "buggy/transposed"
    assert "wrong on a real call" in found["reason"] and "over the error bound" in found["reason"]
    other = Selector(plugins=isolated.plugins, settings=fast_config())
    decision = other.decide(problem, _target(a), "cached")
    assert decision.source == confirm.REVERTED and decision.runner.candidate == DEFAULT


def test_a_wrong_kernel_with_the_user_out_and_accumulation_returns_the_right_result(
    isolated: Any, wrong: KernelBackend
) -> None:
    """``out`` given, with ``beta != 0``: the check keeps C for Default's run."""
    a, b = _arrays("numpy")
    c = np.random.default_rng(3).standard_normal((N, N)).astype(np.float32)
    problem = Problem.from_operands(adapter_of(a), a, b, c=c, beta=0.5)[0]
    platform = isolated.selector.platform(_target(a))
    record = TuningRecord(problem.key, "buggy/transposed", 1e-6, 2e-6, versions=dict(platform.versions))
    isolated.selector.store.put(platform.namespace, problem.key, mark_from_elsewhere(record, "merge"))
    out = np.full((N, N), np.nan, np.float32)
    with pytest.warns(RuntimeWarning, match="wrong result"):
        got = unimatmul.matmul(a, b, out=out, c=c, beta=0.5, alpha=2.0)
    assert got is out
    ref = 2.0 * (a.astype(np.float64) @ b.astype(np.float64)) + 0.5 * c
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


def test_a_right_foreign_entry_is_checked_once_then_served_as_it_is(
    isolated: Any, wrong: KernelBackend, kind: str
) -> None:
    a, b = _arrays(kind)
    problem, namespace = _store(isolated.selector, a, b, "buggy/right", FOREIGN["another host"])
    decision = isolated.selector.decide(problem, _target(a), "cached")
    assert isinstance(decision.runner, trust.CheckingRunner)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(4):
            _right(unimatmul.matmul(a, b), a, b)
    assert wrong.calls == 4  # the choice served every call, the first one included
    # After the first call the fast path holds the bare kernel: nothing more per call.
    (found,) = [plan for plan in api.TABLE.live() if plan.problem == problem]
    assert isinstance(found.runner, FakeKernel)
    # Marked as checked here (beside the host that checked it before), so that the next
    # process serves it without a check.
    assert isolated.selector.settle(timeout=10)
    stored = isolated.selector.store.get(namespace, problem.key)
    assert checked_here(stored) and checked_hosts(stored) == ["some-other-machine", local_host()]
    other = Selector(plugins=isolated.plugins, settings=fast_config())
    assert isinstance(other.decide(problem, _target(a), "cached").runner, FakeKernel)
    # The same process decides again (its prepared runners forgotten): no second check.
    isolated.selector.store.put(namespace, problem.key, mark_from_elsewhere(stored, "merge"))
    assert isinstance(isolated.selector.decide(problem, _target(a), "cached").runner, FakeKernel)


def test_an_entry_checked_here_serves_without_a_check(isolated: Any, wrong: KernelBackend, kind: str) -> None:
    a, b = _arrays(kind)
    problem, _ = _store(isolated.selector, a, b, "buggy/right", mark_checked)
    assert isinstance(isolated.selector.decide(problem, _target(a), "cached").runner, FakeKernel)


def test_real_tuning_marks_its_records_as_checked_here(isolated: Any, wrong: KernelBackend) -> None:
    a, b = _arrays("numpy")
    with unimatmul.mode("tune"):
        _right(unimatmul.matmul(a, b), a, b)
    (record,) = [r for _, _, r in isolated.selector.store.items()]
    assert checked_hosts(record) == [local_host()]
    assert record.result("buggy/transposed").status == "rejected"  # the harness caught it too


def test_a_choice_wrong_only_on_the_programs_inputs_is_caught_by_its_window(isolated: Any) -> None:
    """Real tuning chooses the data-dependent kernel (float16: NumPy's own loops are far
    slower); the window's first call, on the program's inputs, catches it."""
    backend = KernelBackend("sly", {"f32": wrong_on_sentinel})
    isolated.selector.confirm_calls = 4
    isolated.selector.settings = replace(fast_config(), min_gain=0.0)
    a, b = _arrays("numpy", np.float16)
    problem = Problem.from_operands(adapter_of(a), a, b)[0]
    with registered(isolated.plugins, backend), unimatmul.mode("tune"):
        isolated.selector.tune(problem, _target(a))
        namespace = isolated.selector.platform(_target(a)).namespace
        record = isolated.selector.store.get(namespace, problem.key)
        assert record.winner == "sly/f32", record.results  # right on every tuning input
        assert checked_here(record)
        a[0, 0] = SENTINEL
        with pytest.warns(RuntimeWarning, match="sly/f32 returned a wrong result"):
            out = unimatmul.matmul(a, b)
        _right(out, a, b, rtol=2e-3)
        for _ in range(6):
            _right(unimatmul.matmul(a, b), a, b, rtol=2e-3)
        assert isolated.selector.settle(timeout=10)
    assert backend.calls > 0
    found = isolated.selector.store.get(namespace, problem.key).settings[confirm.KEY]
    assert found["verdict"] == confirm.REVERTED and "wrong on a real call" in found["reason"]
    assert isolated.selector.stats.reverted == 1 and isolated.selector.stats.confirmed == 0


def sly(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    """Right, unless A's first element is SENTINEL (no tuning input holds it)."""
    k.right(a, b, out, alpha, beta, bias)
    if float(a[(0,) * len(a.shape)]) == SENTINEL:
        out[(0,) * len(out.shape)] += 1000.0


def test_a_tuned_choice_wrong_on_the_programs_inputs_is_reverted_by_its_window(
    isolated: Any, kind: str
) -> None:
    """Real tuning (its kernel stored as the choice whichever won here, as
    ``prefer_kernel`` does), then the program's own inputs: the window's first call
    compares the choice with Default on them."""
    backend = KernelBackend("sly", {"k": sly})
    isolated.selector.confirm_calls = 4
    a, b = _arrays(kind)
    problem = Problem.from_operands(adapter_of(a), a, b)[0]
    with registered(isolated.plugins, backend):
        record = prefer_kernel(isolated.selector, problem, _target(a), "sly")
        assert record.winner == "sly/k" and checked_here(record)
        api.clear_fast_path()
        calls = backend.calls
        a[0, 0] = SENTINEL
        with pytest.warns(RuntimeWarning, match="sly/k returned a wrong result"):
            _right(unimatmul.matmul(a, b), a, b)
        for _ in range(12):
            _right(unimatmul.matmul(a, b), a, b)
        assert backend.calls == calls + 1  # the window's first call only
        assert isolated.selector.settle(timeout=10)
    namespace = isolated.selector.platform(_target(a)).namespace
    found = isolated.selector.store.get(namespace, problem.key).settings[confirm.KEY]
    assert found["verdict"] == confirm.REVERTED and "wrong on a real call" in found["reason"]


def test_an_entry_merged_into_the_live_file_is_checked_even_if_it_claims_this_host(
    isolated: Any, wrong: KernelBackend, tmp_path: Any
) -> None:
    """``cache merge OTHER LIVE -o LIVE``: the other file's entries come by merge, whatever
    their mark says; the live file's own entries keep theirs."""
    from unimatmul.cache.file_store import MsgpackFileStore
    from unimatmul.cli import main

    a, b = _arrays("numpy")
    c, d = _arrays("numpy", seed=8)
    c, d = c[:, :16].copy(), d[:16].copy()  # another problem, tuned here for real
    with unimatmul.mode("tune"):
        unimatmul.matmul(c, d)
    isolated.selector.store.flush()
    other = MsgpackFileStore(tmp_path / "other.msgpack")
    problem = Problem.from_operands(adapter_of(a), a, b)[0]
    platform = isolated.selector.platform(_target(a))
    crafted = TuningRecord(problem.key, "buggy/transposed", 1e-6, 2e-6, versions=dict(platform.versions))
    other.put(platform.namespace, problem.key, mark_checked(crafted))  # it claims this host
    other.flush()
    live = str(isolated.cache_path)
    assert main(["cache", "merge", str(tmp_path / "other.msgpack"), live, "-o", live]) == 0
    merged = {key: r for _, key, r in MsgpackFileStore(isolated.cache_path).items()}
    assert merged[problem.key].settings["trust"] == {"checked": [], "origin": "merge"}
    own = Problem.from_operands(adapter_of(c), c, d)[0].key
    assert checked_hosts(merged[own]) == [local_host()]
    fresh = Selector(plugins=isolated.plugins, settings=fast_config())
    set_selector(fresh)  # a new process on the merged file
    calls = wrong.calls
    with pytest.warns(RuntimeWarning, match="buggy/transposed returned a wrong result"):
        _right(unimatmul.matmul(a, b), a, b)
    _right(unimatmul.matmul(a, b), a, b)
    assert wrong.calls == calls + 1
