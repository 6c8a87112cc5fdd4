"""Trust (unimatmul.tuning.trust) in routed calls: the Python kernels and the native ones.

A routed ``torch.mm`` whose entry came from elsewhere and names a registered kernel that
reads B transposed must return the right result on its first call, warn once, record why,
and never run that kernel again (nor let the native table run it). A kernel that real
tuning found right but that is wrong on the program's own inputs is caught by its
window's first call.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_helpers import Env  # noqa: E402

import unimatmul  # noqa: E402
import unimatmul.torch as ut  # noqa: E402
from unimatmul.backend import DEFAULT, Backend, Candidate, Target  # noqa: E402
from unimatmul.cache.record import TuningRecord, checked_here, mark_checked, mark_from_elsewhere  # noqa: E402
from unimatmul.core.arrays import CPU, adapter_of  # noqa: E402
from unimatmul.core.problem import Problem  # noqa: E402
from unimatmul.testing import prefer_kernel, registered  # noqa: E402
from unimatmul.tuning import confirm  # noqa: E402
from unimatmul.tuning.selector import Selector  # noqa: E402
from unimatmul.tuning.trust import CheckingRunner  # noqa: E402

N = 32
SENTINEL = 7.125


class Kernel:
    """A registered kernel's runner: the product, done wrong in one way."""

    def __init__(self, backend: Backend, candidate: Any) -> None:
        self.backend = backend
        self.candidate = candidate

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        self.backend.calls += 1
        if self.candidate.name == "transposed":
            torch.mm(a, b.t(), out=out)  # reads B transposed
            return
        torch.mm(a, b, out=out)
        if self.candidate.name == "sly" and float(a[0, 0]) == SENTINEL:
            out[0, 0] += 1000.0  # wrong only on inputs no tuning set holds


class Buggy(Backend):
    name = "buggy"
    device_kinds = frozenset({"cpu"})
    array_kinds = frozenset({"torch"})

    def __init__(self) -> None:
        self.calls = 0

    def availability(self) -> str | None:
        return None

    def versions(self) -> dict[str, str]:
        return {"buggy": "1.0"}

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        return [Candidate.make("buggy", "transposed"), Candidate.make("buggy", "sly")]

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> Kernel:
        return Kernel(self, candidate)


@pytest.fixture
def buggy(env: Env) -> Iterator[Buggy]:
    backend = Buggy()
    with registered(env.selector.plugins, backend):
        yield backend


def _operands() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.randn(N, N, generator=g), torch.randn(N, N, generator=g)


def _right(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    with unimatmul.mode("off"):  # the test's own reference: not one of the program's products
        expected = (a.double() @ b.double()).float()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


def _problem(a: torch.Tensor, b: torch.Tensor) -> tuple[Problem, Target]:
    return Problem.from_operands(adapter_of(a), a, b)[0], Target(adapter_of(a), CPU)


@pytest.mark.parametrize("origin", ["import", "another host"])
def test_a_foreign_entry_naming_a_wrong_kernel_is_caught_at_its_first_routed_call(
    env: Env, buggy: Buggy, origin: str
) -> None:
    a, b = _operands()
    problem, target = _problem(a, b)
    platform = env.selector.platform(target)
    verdict = {"verdict": "confirmed", "kernel": "buggy/transposed", "kernel_s": 1e-6, "default_s": 2e-6}
    record = TuningRecord(
        problem.key,
        "buggy/transposed",
        1e-6,
        2e-6,
        versions=dict(platform.versions),
        settings={"confirm": verdict},
    )
    marked = (
        mark_from_elsewhere(record, "import:tunableop") if origin == "import" else mark_checked(record, "far")
    )
    env.selector.store.put(platform.namespace, problem.key, marked)
    with ut.enabled(), torch.no_grad():
        with pytest.warns(RuntimeWarning, match="buggy/transposed returned a wrong result"):
            _right(torch.mm(a, b), a, b)
        assert buggy.calls == 1
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(5):
                _right(torch.mm(a, b), a, b)
        (plan,) = [p for p in ut.plans() if p.problem == problem]
        assert plan.runner is None and plan.source == confirm.REVERTED
    assert buggy.calls == 1  # neither the Python kernels nor the native table ran it again
    assert env.selector.settle(timeout=10)
    found = env.selector.store.get(platform.namespace, problem.key).settings["confirm"]
    assert found["verdict"] == confirm.REVERTED and "wrong on a real call" in found["reason"]
    other = Selector(plugins=env.selector.plugins, settings=env.selector.settings)
    assert other.decide(problem, target, "cached").runner.candidate == DEFAULT


def test_a_right_foreign_entry_serves_its_kernel_after_the_check(env: Env, buggy: Buggy) -> None:
    a, b = _operands()
    problem, target = _problem(a, b)
    platform = env.selector.platform(target)
    verdict = {"verdict": "confirmed", "kernel": "buggy/sly", "kernel_s": 1e-6, "default_s": 2e-6}
    record = TuningRecord(
        problem.key, "buggy/sly", 1e-6, 2e-6, versions=dict(platform.versions), settings={"confirm": verdict}
    )
    env.selector.store.put(platform.namespace, problem.key, mark_from_elsewhere(record, "merge"))
    with ut.enabled(), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(4):
            _right(torch.mm(a, b), a, b)
        (plan,) = ut.plans()  # the check's own products (its float64 reference) were not routed
        assert plan.problem == problem
        assert isinstance(plan.runner, Kernel)  # the bare kernel: the check is gone from the path
    assert buggy.calls == 4
    assert env.selector.settle(timeout=10)
    assert checked_here(env.selector.store.get(platform.namespace, problem.key))


def test_a_choice_wrong_only_on_the_programs_inputs_is_caught_by_its_routed_window(
    env: Env, buggy: Buggy
) -> None:
    a, b = _operands()
    problem, target = _problem(a, b)
    # Real tuning rejects the transposing kernel and passes the sly one (right on every
    # tuning input); it is stored as the choice whichever won here.
    record = prefer_kernel(env.selector, problem, target, "buggy", names=["sly"])
    assert record.winner == "buggy/sly" and checked_here(record)
    assert record.result("buggy/transposed").status == "rejected"
    env.selector.confirm_calls = 4
    ut.clear_plans()
    calls = buggy.calls
    a[0, 0] = SENTINEL
    with ut.enabled(), torch.no_grad():
        with pytest.warns(RuntimeWarning, match="buggy/sly returned a wrong result"):
            _right(torch.mm(a, b), a, b)
        for _ in range(8):
            _right(torch.mm(a, b), a, b)
    assert buggy.calls == calls + 1  # its window's first call, and never again
    assert env.selector.settle(timeout=10)
    platform = env.selector.platform(target)
    found = env.selector.store.get(platform.namespace, problem.key).settings["confirm"]
    assert found["verdict"] == confirm.REVERTED and "wrong on a real call" in found["reason"]


def test_a_checked_onednn_choice_goes_back_to_the_native_table(env: Env) -> None:
    """After its first-call check, a right choice from elsewhere serves as one tuned here
    would: with the native kernels built, from their table (no Python on the call)."""
    from torch_helpers import onednn_available

    from unimatmul.torch import native

    if not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    a, b = _operands()
    problem, target = _problem(a, b)
    record = prefer_kernel(env.selector, problem, target, "onednn")
    assert record.winner.startswith("onednn/")
    platform = env.selector.platform(target)
    verdict = {"verdict": "confirmed", "kernel": record.winner, "kernel_s": 1e-6, "default_s": 2e-6}
    foreign = mark_from_elsewhere(record, "merge")
    foreign = replace(foreign, settings={**foreign.settings, "confirm": verdict})
    env.selector.store.put(platform.namespace, problem.key, foreign)
    ut.clear_plans()
    with ut.enabled(), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            _right(torch.mm(a, b), a, b)
        (plan,) = [p for p in ut.plans() if p.problem == problem]
        assert plan.runner is not None and plan.runner.candidate.identity == record.winner
        assert not isinstance(plan.runner, CheckingRunner)
        if ut.routing._router.native_keys:
            assert plan.native == native.ONEDNN
    assert env.selector.settle(timeout=10)
    assert checked_here(env.selector.store.get(platform.namespace, problem.key))
