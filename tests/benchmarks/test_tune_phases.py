"""benchmarks/tune_phases.py: each phase counts its own time, nested phases taken out."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import tune_phases


class Ticks:
    """A clock that moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def ticks(monkeypatch: pytest.MonkeyPatch) -> Ticks:
    """The benchmark's clock, moved by the test."""
    found = Ticks()
    monkeypatch.setattr(tune_phases.time, "perf_counter", found)
    return found


def test_a_phase_inside_another_is_taken_out_of_the_outer_one(ticks: Ticks) -> None:
    clock = tune_phases.Clock()

    def inner() -> None:
        ticks.now += 4.0

    def outer() -> None:
        ticks.now += 1.0
        inner_timed()
        ticks.now += 2.0
        inner_timed()
        ticks.now += 3.0

    inner_timed = clock.timed(inner, "compare")
    outer_timed = clock.timed(outer, "check")
    outer_timed()
    assert clock.now == {"check": 6.0, "compare": 8.0}
    assert clock.stack == []
    assert clock.calls == {"outer": 1, "inner": 2}


def test_calls_on_other_threads_are_not_counted(ticks: Ticks) -> None:
    clock = tune_phases.Clock()

    def work() -> None:
        ticks.now += 5.0

    timed = clock.timed(work, "prepare")
    thread = threading.Thread(target=timed)
    thread.start()
    thread.join()
    assert dict(clock.now) == {} and dict(clock.calls) == {}
    timed()
    assert dict(clock.now) == {"prepare": 5.0} and dict(clock.calls) == {"work": 1}


def test_a_phase_that_raises_still_counts_and_leaves_the_stack_empty(ticks: Ticks) -> None:
    clock = tune_phases.Clock()

    def fails() -> Any:
        ticks.now += 2.0
        raise ValueError("a candidate's failure")

    with pytest.raises(ValueError, match="a candidate's failure"):
        clock.timed(fails, "check_first")()
    assert dict(clock.now) == {"check_first": 2.0} and clock.stack == []
