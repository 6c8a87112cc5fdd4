"""The one call path (``unimatmul/calls.py``): a Plan's life in a CallTable, the same for
every door, and the one recursion guard."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import unimatmul
from unimatmul import api, calls, scaled
from unimatmul.calls import PASSING, CallTable, Plan, passing
from unimatmul.core._backend import DEFAULT, Candidate
from unimatmul.tuning.confirm import Confirmation
from unimatmul.tuning.selector import Decision, forget_prepared
from unimatmul.tuning.time_limit import run_within


class Kernel:
    """A runner that multiplies with NumPy and counts its calls."""

    def __init__(self, name: str = "k") -> None:
        self.candidate = Candidate.make("fake", name)
        self.calls = 0

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        self.calls += 1
        np.matmul(a, b, out=out)


class Default(Kernel):
    def __init__(self) -> None:
        super().__init__()
        self.candidate = DEFAULT


@pytest.fixture
def table() -> Iterator[CallTable]:
    made = CallTable("fake_op", 4)
    yield made
    made.clear()


def _decided(runner: Any, source: str = "cache", confirmation: Confirmation | None = None) -> Decision:
    return Decision(runner, source, None, confirmation)


def test_a_decision_becomes_the_plan_s_runner_label_and_source(table: CallTable) -> None:
    kernel = Kernel()
    plan = Plan("fake_op", default=Default())
    plan.take(_decided(kernel))
    assert table.insert("key", plan, None) is plan
    assert table.plans.get("key") is plan
    assert (plan.runner, plan.source, plan.label) == (kernel, "cache", "unimatmul::fake_op [fake/k]")
    assert not plan.is_default


def test_default_without_a_runner_is_none_for_a_routed_door(table: CallTable) -> None:
    plan = Plan("fake_op")  # no default runner: the door passes the call to its library
    plan.take(_decided(Default(), "default"))
    assert plan.runner is None and plan.is_default and plan.label == "unimatmul::fake_op [default]"


def test_another_thread_s_plan_wins_unless_this_one_was_tuned(table: CallTable) -> None:
    first = Plan("fake_op")
    table.insert("key", first, None)
    assert table.insert("key", Plan("fake_op"), None) is first
    tuned = Plan("fake_op")
    tuned.take(_decided(Kernel(), "tuned"))
    assert table.insert("key", tuned, _decided(tuned.runner, "tuned")) is tuned


def test_a_tuned_decision_makes_every_door_forget_its_plans(table: CallTable) -> None:
    a = np.random.default_rng(1).standard_normal((8, 6)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((6, 4)).astype(np.float32)
    with unimatmul.mode("off"):
        unimatmul.matmul(a, b)
    assert api.TABLE.plans
    table.insert("old", Plan("fake_op"), None)
    tuned = Plan("fake_op")
    tuned.take(_decided(Kernel(), "tuned"))
    table.insert("new", tuned, _decided(tuned.runner, "tuned"))
    assert not api.TABLE.plans and not scaled.TABLE.plans
    assert list(table.plans) == ["new"]


def test_a_full_table_starts_over_and_keeps_the_counts(table: CallTable) -> None:
    for i in range(4):
        plan = Plan("fake_op")
        plan.take(_decided(Default(), "default"))
        plan.calls = 2
        table.insert(i, plan, None)
    table.insert("fifth", Plan("fake_op"), None)
    assert list(table.plans) == ["fifth"]
    assert table.stats()["by_source"] == {"default": 8}


def test_a_window_that_keeps_its_choice_counts_later_calls_as_confirmed(table: CallTable) -> None:
    kernel = Kernel()
    window = Confirmation("fake/k", calls=2, min_gain=0.0)
    plan = Plan("fake_op", default=Default())
    plan.take(_decided(kernel, "cache", window))
    table.insert("key", plan, None)
    plan.calls = 3
    assert table.stats()["confirm"]["open"] == 1
    assert window.conclude([1.0, 1.0], [2.0, 2.0], "host")
    assert plan.source == "confirmed" and plan.runner is kernel and plan.saved_s == pytest.approx(1.0)
    plan.calls = 5
    stats = table.stats()
    assert stats["by_source"] == {"cache": 3, "confirmed": 5}
    assert stats["confirm"]["confirmed"] == 1 and stats["confirm"]["open"] == 0
    assert stats["confirm"]["saved_s"] == pytest.approx(5.0)


def test_a_window_that_reverts_sends_the_key_to_default(table: CallTable) -> None:
    default = Default()
    window = Confirmation("fake/k", calls=2, min_gain=0.0)
    plan = Plan("fake_op", default=default)
    plan.take(_decided(Kernel(), "cache", window))
    table.insert("key", plan, None)
    assert not window.conclude([3.0, 3.0], [1.0, 1.0], "host")
    assert plan.runner is default and plan.source == "reverted" and plan.label.endswith("[default]")


def test_a_window_without_samples_leaves_the_choice(table: CallTable) -> None:
    kernel = Kernel()
    window = Confirmation("fake/k", calls=2, min_gain=0.0)
    plan = Plan("fake_op", default=Default())
    plan.take(_decided(kernel, "cache", window))
    table.insert("key", plan, None)
    window.abandon()
    assert plan.runner is kernel and plan.source == "cache"
    assert table.stats()["confirm"]["unjudged"] == 1


def test_a_failing_kernel_falls_back_to_default_and_warns(table: CallTable) -> None:
    default = Default()
    plan = Plan("fake_op", default=default)
    plan.take(_decided(Kernel(), "cache"))
    table.insert("key", plan, None)
    put: list[Plan] = []
    plan.native = 1
    with pytest.warns(RuntimeWarning, match="failed"):
        now = table.fall_back(plan, RuntimeError("boom"), None, put.append)
    assert now is default and plan.runner is default and plan.source == "fallback"
    assert put == [plan]  # its native entry is put again


def test_stats_totals_and_reset_have_one_shape(table: CallTable) -> None:
    plan = Plan("fake_op", default=Default())
    plan.take(_decided(Kernel(), "cache"))
    table.insert("key", plan, None)
    plan.calls = 4
    before = table.stats()
    assert {"routed", "kernel", "default", "passthrough", "by_op", "by_label", "by_source", "confirm"} <= set(
        before
    )
    assert before["kernel"] == before["routed"] == 4 and before["by_op"]["fake_op"]["kernel"] == 4
    table.reset_stats()
    plan.calls = 1
    assert table.stats()["kernel"] == 1
    totals = table.totals()
    assert totals["kernel"] == 5 and totals["calls"] == [("fake_op", "cache", "kernel", 5)]


def test_passing_turns_every_door_off_on_this_thread_and_its_worker() -> None:
    assert calls.mode_now() != "off" or unimatmul.get_mode() == "off"
    seen: list[str] = []
    with passing():
        assert PASSING.on and calls.mode_now() == "off"
        with passing():  # nested: still on after the inner block
            pass
        assert PASSING.on
        run_within(lambda: seen.append(calls.mode_now()), 30.0)  # the harness's worker thread
        other: list[bool] = []
        thread = threading.Thread(target=lambda: other.append(PASSING.on))
        thread.start()
        thread.join()
    assert seen == ["off"] and other == [False] and not PASSING.on


def test_the_api_passes_through_while_the_selector_decides() -> None:
    a = np.random.default_rng(3).standard_normal((5, 7))
    b = np.random.default_rng(4).standard_normal((7, 3))
    forget_prepared()
    with passing():
        got = unimatmul.matmul(a, b)
    np.testing.assert_allclose(got, a @ b, rtol=1e-12)
    (plan,) = api.TABLE.live()
    assert plan.source == "default" and plan.runner.candidate == DEFAULT
