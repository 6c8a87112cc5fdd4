"""A candidate's time limit: one slow or hanging kernel cannot hold tuning.

A kernel that slept 30 s a call was measured anyway: one tuning took 151 s. Now each
candidate's steps run within ``UNIMATMUL_TUNE_LIMIT_S`` (or ``UNIMATMUL_TUNE_LIMIT_RATIO``
times Default's time, if more): past it the candidate is abandoned, even in the middle of
a call, and recorded ``abandoned``; the others are measured on outputs of their own.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from harness_fakes import KernelBackend, right, sleeps

import unimatmul
from unimatmul.backend import DEFAULT, Candidate, Runner, Target
from unimatmul.cache.record import ABANDONED, OK, PRUNED
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.core.modes import get_mode
from unimatmul.core.problem import Problem
from unimatmul.core.runners import DefaultRunner
from unimatmul.testing import fast_config
from unimatmul.tuning.harness import CpuTimer, Harness
from unimatmul.tuning.time_limit import OverLimit, run_inline, run_within

NUMPY = Target(adapter_for_kind("numpy"), CPU)


def _operands(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((48, 40)).astype(np.float32), rng.standard_normal((40, 56)).astype(np.float32)


def _tune_with(
    isolated: Any, backends: Any, kernel: Any, limit_s: float, monkeypatch: Any
) -> tuple[Any, float]:
    monkeypatch.setenv("UNIMATMUL_TUNE_LIMIT_S", str(limit_s))
    backends(KernelBackend("slow", {"k": kernel}), KernelBackend("fine", {"k": right}))
    a, b = _operands()
    started = time.perf_counter()
    with unimatmul.mode("tune"):
        out = unimatmul.matmul(a, b)
    took = time.perf_counter() - started
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    (_, _, record), *_ = list(isolated.selector.store.items())
    return record, took


def test_a_kernel_that_sleeps_30_s_a_call_is_abandoned_within_the_limit(
    isolated: Any, backends: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    record, took = _tune_with(isolated, backends, sleeps(30.0), 1.0, monkeypatch)
    slow = record.result("slow/k")
    assert slow is not None and slow.status == ABANDONED, slow
    assert "abandoned while prepared and checked: still running after 1 s" in slow.note
    assert "UNIMATMUL_TUNE_LIMIT_S=1 s" in slow.note
    assert took < 1.0 + 3.0, took  # the limit, and the other candidates' own tuning
    assert record.winner != "slow/k"
    assert record.result("fine/k").status in (OK, PRUNED)
    assert record.settings["limit_s"] == 1.0


def test_a_kernel_that_hangs_only_once_timed_is_abandoned_and_the_others_measured(
    isolated: Any, backends: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Right and quick on its two checks; from its third call (the first timed one) on it
    # hangs. Its call goes on in the background, writing into the outputs it was given:
    # the candidates after it are measured and checked on new ones.
    record, took = _tune_with(isolated, backends, sleeps(30.0, after=2), 1.0, monkeypatch)
    slow = record.result("slow/k")
    assert slow is not None and slow.status == ABANDONED, slow
    assert "abandoned while warmed up" in slow.note
    assert took < 1.0 + 3.0, took
    fine = record.result("fine/k")
    assert fine is not None and fine.status in (OK, PRUNED) and fine.samples > 0
    assert record.winner != "slow/k"


def test_the_limit_follows_defaults_time_where_that_is_more() -> None:
    # No absolute floor: 10 x Default's own check time (well under a second here) is all
    # a candidate that sleeps half a second a call gets.
    problem = Problem.from_shape(32, 32, 32)
    backend = KernelBackend("fake", {"slow": sleeps(0.5), "good": right})
    entries: list[tuple[Candidate, Callable[[], Runner]]] = [
        (DEFAULT, lambda: DefaultRunner(NUMPY.adapter, None))
    ]
    entries += [
        (Candidate.make("fake", n), lambda n=n: backend.prepare(problem, Candidate.make("fake", n), NUMPY))
        for n in ("slow", "good")
    ]
    settings = fast_config()
    settings.limit_s, settings.limit_ratio = 0.0, 10.0
    started = time.perf_counter()
    record = Harness(CpuTimer(), settings).measure(problem, NUMPY, entries)
    took = time.perf_counter() - started
    slow = record.result("fake/slow")
    assert slow is not None and slow.status == ABANDONED and "UNIMATMUL_TUNE_LIMIT_RATIO=10" in slow.note
    assert took < 0.5, took
    assert record.result("fake/good").status in (OK, PRUNED)
    assert record.result(DEFAULT.identity).status == OK


def test_a_step_ends_with_its_result_or_its_exception_or_the_limit() -> None:
    caller = threading.get_ident()
    assert run_within(threading.get_ident, 5.0) != caller  # on the worker
    assert run_within(lambda: 7, 5.0) == 7
    with pytest.raises(ZeroDivisionError):
        run_within(lambda: 1 / 0, 5.0)
    with pytest.raises(KeyboardInterrupt):  # the user's Ctrl-C inside a kernel still stops tuning

        def interrupted() -> None:
            raise KeyboardInterrupt

        run_within(interrupted, 5.0)
    release = threading.Event()
    started = time.perf_counter()
    with pytest.raises(OverLimit, match=r"still running after 0\.2 s"):
        run_within(lambda: release.wait(30), 0.2)
    assert time.perf_counter() - started < 2.0
    release.set()
    assert run_within(lambda: 8, 5.0) == 8  # a new worker serves the next step
    with unimatmul.mode("off"):  # the caller's context travels with the step
        assert run_within(lambda: get_mode(), 5.0) == "off"


def test_default_has_no_limit() -> None:
    # Default is what the caller runs anyway: a slow one is measured, not abandoned.
    problem = Problem.from_shape(16, 16, 16)
    backend = KernelBackend("fake", {"default": sleeps(0.05)})
    entries: list[tuple[Candidate, Callable[[], Runner]]] = [
        (DEFAULT, lambda: backend.prepare(problem, Candidate.make("fake", "default"), NUMPY))
    ]
    settings = fast_config()
    settings.limit_s, settings.limit_ratio = 0.0, 1.0
    record = Harness(CpuTimer(), settings).measure(problem, NUMPY, entries)
    assert record.result(DEFAULT.identity).status == OK
    assert record.winner == DEFAULT.identity and math.isfinite(record.winner_s)


@pytest.mark.slow
def test_with_the_default_limit_a_30_s_kernel_ends_tuning_within_it(isolated: Any, backends: Any) -> None:
    backends(KernelBackend("slow", {"k": sleeps(30.0)}))
    a, b = _operands(1)
    started = time.perf_counter()
    with unimatmul.mode("tune"):
        unimatmul.matmul(a, b)
    assert time.perf_counter() - started < unimatmul.settings.TUNE_LIMIT_S.default + 3.0
    (_, _, record), *_ = list(isolated.selector.store.items())
    assert record.result("slow/k").status == ABANDONED


def _step_in_a_child(results: Any) -> None:
    results.put(run_within(lambda: 9, 5.0))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_a_worker_of_its_own() -> None:
    # The parent's worker thread does not exist in a child forked after it started.
    assert run_within(lambda: 1, 5.0) == 1
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_step_in_a_child, args=(results,))
    child.start()
    child.join(30)
    assert child.exitcode == 0 and results.get(timeout=5) == 9


def test_inline_steps_are_judged_once_they_return() -> None:
    # Where calls must stay on the tuning thread (a GPU's stream), a step over its limit
    # is abandoned after it returns: its result is not used.
    assert run_inline(lambda: 3, 1.0) == 3
    assert run_inline(threading.get_ident, 1.0) == threading.get_ident()
    with pytest.raises(OverLimit, match=r"took 0\.\d+ s, over its 0\.01 s"):
        run_inline(lambda: time.sleep(0.05), 0.01)
