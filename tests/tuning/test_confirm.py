"""Confirmation windows (unimatmul.tuning.confirm) through unimatmul.matmul on NumPy arrays.

A fake backend's kernel is stored as the winner; its first real calls then alternate it
with Default. A "slow" fake (correct, with a 2 ms sleep) must lose where it runs; with
``min_gain`` set far below zero, any kernel is kept. Every result of the window is
checked against a float64 reference.
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

import unimatmul
from unimatmul import testing
from unimatmul.backend import DEFAULT, Candidate, Target
from unimatmul.cache.record import OK, PRUNED, CandidateResult, TuningRecord, mark_checked
from unimatmul.cli import main
from unimatmul.core.arrays import CPU, adapter_of
from unimatmul.core.problem import Problem
from unimatmul.testing import fast_config
from unimatmul.tuning import confirm, trust
from unimatmul.tuning.selector import Selector

CALLS = 4  # timed calls per candidate: the smallest window UNIMATMUL_CONFIRM_CALLS takes
WINDOW = confirm.WARMUP + 2 * CALLS
RNG = np.random.default_rng(1313)


def _operands() -> tuple[np.ndarray, np.ndarray]:
    return RNG.standard_normal((24, 40)).astype(np.float32), RNG.standard_normal((40, 16)).astype(np.float32)


def _target() -> Target:
    return Target(adapter_of(np.zeros(1, np.float32)), CPU)


def _problem(a: np.ndarray, b: np.ndarray) -> Problem:
    return Problem.from_operands(adapter_of(a), a, b)[0]


def _store_winner(
    selector: Selector,
    problem: Problem,
    winner: str,
    winner_s: float = 1e-6,
    results: list[CandidateResult] | None = None,
) -> str:
    """Store a record of ``winner`` (Default at 2 us) for ``problem``; its namespace."""
    namespace = selector.platform(_target()).namespace
    versions = dict(selector.platform(_target()).versions)
    record = TuningRecord(problem.key, winner, winner_s, 2e-6, results=results or [], versions=versions)
    selector.store.put(namespace, problem.key, record)
    return namespace


def _window(runner: Any) -> Any:
    """The window behind a choice's first-call check (tuning/trust.py)."""
    return runner.inner if isinstance(runner, trust.CheckingRunner) else runner


def _check(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5


def test_the_order_is_kddk_and_split_undoes_it() -> None:
    assert [confirm.uses_kernel(i) for i in range(8)] == [True, False, False, True] * 2
    kernel, default = confirm.split([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0])
    assert kernel == [1.0, 4.0, 5.0, 8.0] and default == [2.0, 3.0, 6.0, 7.0]


def test_judge_keeps_a_choice_only_when_it_wins_by_min_gain() -> None:
    k = [1.0, 1.0, 1.0, 50.0]  # one outlier: the median ignores it
    assert confirm.judge("x/k", k, [1.2, 1.2, 1.2, 1.2], 0.01, "host").keep
    level = confirm.judge("x/k", [1.0] * 4, [1.005] * 4, 0.01, "host")
    assert not level.keep and level.verdict == confirm.REVERTED  # level within the noise: Default
    assert level.kernel_s == 1.0 and level.default_s == 1.005 and level.calls == 4
    nothing = confirm.judge("x/k", [math.nan] * 4, [1.0] * 4, 0.01, "cuda-events")
    assert nothing.keep and nothing.verdict == confirm.UNJUDGED  # nothing measured: the choice stays


def test_a_slow_choice_is_reverted_where_it_runs_and_the_cache_learns_it(
    isolated: Any, fake_backend: Any
) -> None:
    fake = fake_backend("sleepy", "slow", delay_s=2e-3)
    isolated.selector.confirm_calls = CALLS
    a, b = _operands()
    problem = _problem(a, b)
    namespace = _store_winner(isolated.selector, problem, "sleepy/k0")
    for i in range(WINDOW):
        out = unimatmul.matmul(a, b)
        _check(out, a, b)
        if i == 0:
            assert fake.calls == 1  # the window starts with the choice
    # Warm-up once, then K D D K twice: the choice ran 1 + CALLS times, never more. The
    # key's call after the window ends its last span (each runs to the key's next call): the
    # verdict comes with it, and what it keeps serves it.
    _check(unimatmul.matmul(a, b), a, b)
    assert fake.calls == 1 + CALLS
    assert isolated.selector.settle(timeout=10)  # verdicts are written by a thread of their own
    record = isolated.selector.store.get(namespace, problem.key)
    found = record.settings["confirm"]
    assert found["verdict"] == "reverted" and found["kernel"] == "sleepy/k0"
    assert found["calls"] == CALLS and found["clock"] == "host"
    assert found["kernel_s"] >= 2e-3 > found["default_s"] > 0
    # A host clock's spans: each call to the key's next call (the time between them in).
    assert found["kernel_span_s"] > found["kernel_s"] and found["default_span_s"] > found["default_s"]
    assert isolated.selector.stats.reverted == 1
    for _ in range(3):
        _check(unimatmul.matmul(a, b), a, b)
    assert fake.calls == 1 + CALLS  # Default from now on
    # Another process (a new Selector on the same file) goes to Default without a window.
    other = Selector(plugins=isolated.plugins, settings=fast_config())
    decision = other.decide(problem, _target(), "cached")
    assert decision.source == "reverted" and decision.runner.candidate == DEFAULT
    assert decision.confirmation is None
    # `unimatmul cache show` says so, with Default's in-situ time over the choice's.
    isolated.selector.store.flush()
    text = io.StringIO()
    assert main(["cache", "show", "--cache", str(isolated.cache_path)], out=text) == 0
    (row,) = [line for line in text.getvalue().splitlines() if "sleepy/k0" in line]
    ratio = found["default_s"] / found["kernel_s"]
    span = found["default_span_s"] / found["kernel_span_s"]
    assert row.split()[-4:] == ["reverted", f"{ratio:.2f}x,", "spans", f"{span:.2f}x"]
    # The column is there because an entry has a verdict (an empty one would say nothing).
    header = next(line for line in text.getvalue().splitlines() if line.startswith("problem"))
    assert header.split()[-3:] == ["confidence", "in", "situ"]


def test_a_winning_choice_is_confirmed_and_kept(isolated: Any, fake_backend: Any) -> None:
    fake = fake_backend("quick", "correct")
    isolated.selector.confirm_calls = CALLS
    isolated.selector.settings = replace(fast_config(), min_gain=-100.0)  # any kernel wins
    a, b = _operands()
    problem = _problem(a, b)
    namespace = _store_winner(isolated.selector, problem, "quick/k0")
    for _ in range(WINDOW + 5):
        _check(unimatmul.matmul(a, b), a, b)
    assert fake.calls == 1 + CALLS + 5  # the choice alone after the window
    assert isolated.selector.settle(timeout=10)
    found = isolated.selector.store.get(namespace, problem.key).settings["confirm"]
    assert found["verdict"] == "confirmed" and found["kernel_s"] > 0 and found["default_s"] > 0
    other = Selector(plugins=isolated.plugins, settings=fast_config())
    decision = other.decide(problem, _target(), "cached")
    assert decision.source == "confirmed" and decision.runner.candidate.identity == "quick/k0"
    assert decision.confirmation is None


def _two_keys(selector: Selector, min_gain: float) -> list[tuple[np.ndarray, np.ndarray, Problem]]:
    """Two problems' operands (a program's two products), with windows of CALLS calls a side
    judged by ``min_gain``."""
    selector.confirm_calls = CALLS
    selector.settings = replace(fast_config(), min_gain=min_gain)
    a, b = _operands()
    c, d = RNG.standard_normal((8, 40)).astype(np.float32), RNG.standard_normal((40, 24)).astype(np.float32)
    return [(a, b, _problem(a, b)), (c, d, _problem(c, d))]


def test_a_choice_whose_cost_lands_on_the_next_call_is_reverted(isolated: Any, fake_backend: Any) -> None:
    # A "hangover" kernel returns at once and leaves its pool busy for 5 ms, as oneDNN's
    # spinning workers leave the cores to NumPy's next call; here the next call is another
    # product's kept choice on the same (fake) pool, which waits. Call by call the choice
    # wins (min_gain -20: anything within 21x of Default does); over its spans, each call to
    # the key's next call, it loses by the 5 ms the other call waits, and is reverted.
    fake_backend("spinner", "hangover", delay_s=5e-3)
    victim = fake_backend("victim", "correct")
    (a, b, first), (c, d, second) = _two_keys(isolated.selector, min_gain=-20.0)
    namespace = _store_winner(isolated.selector, first, "spinner/k0")
    kept = TuningRecord(
        second.key,
        "victim/k0",
        1e-6,
        2e-6,
        versions=dict(isolated.selector.platform(_target()).versions),
        settings={
            "confirm": {"verdict": "confirmed", "kernel": "victim/k0", "kernel_s": 1e-6, "default_s": 2e-6}
        },
    )
    isolated.selector.store.put(namespace, second.key, kept)
    for _ in range(WINDOW + 1):  # the call after the window ends its last span: the verdict
        _check(unimatmul.matmul(a, b), a, b)
        _check(unimatmul.matmul(c, d), c, d)
    assert isolated.selector.settle(timeout=10)
    found = isolated.selector.store.get(namespace, first.key).settings["confirm"]
    assert found["verdict"] == "reverted" and found["kernel"] == "spinner/k0"
    assert found["kernel_s"] <= 21 * found["default_s"]  # it won call by call
    assert found["kernel_span_s"] >= 5e-3  # its spans hold the next call's wait
    calls = victim.calls
    for _ in range(3):
        _check(unimatmul.matmul(a, b), a, b)  # Default now: the pool is left idle
        assert testing.POOL.busy_until < time.perf_counter()
        _check(unimatmul.matmul(c, d), c, d)
    assert victim.calls == calls + 3


def test_windows_opened_together_time_their_calls_one_after_another(isolated: Any, fake_backend: Any) -> None:
    # Two tuned choices met in one step: a quick one and a slow one (20 ms a call). Timed at
    # once, the quick one's spans would hold the slow one's calls in its own arm (both
    # windows alternate in step) and lose; one window at a time, the slow key runs Default
    # while the quick one is judged, then takes its turn and is reverted.
    quick = fake_backend("quick", "correct")
    slow = fake_backend("sleepy", "slow", delay_s=20e-3)
    # Anything within 101x of Default wins (the quick one, by a wide margin), not 20 ms.
    (a, b, first), (c, d, second) = _two_keys(isolated.selector, min_gain=-100.0)
    namespace = _store_winner(isolated.selector, first, "quick/k0")
    _store_winner(isolated.selector, second, "sleepy/k0")
    for step in range(WINDOW + 1):  # the first window, and the call that ends its last span
        _check(unimatmul.matmul(a, b), a, b)
        _check(unimatmul.matmul(c, d), c, d)
        if step == 0:
            assert slow.calls == 1  # each window's first call runs its choice (a first-call check's)
    # Default served the second key meanwhile; its window goes on after the first's verdict.
    assert slow.calls == 1
    assert quick.calls == 1 + CALLS + 1  # the window, then the kept choice
    for _ in range(WINDOW + 1):
        _check(unimatmul.matmul(a, b), a, b)
        _check(unimatmul.matmul(c, d), c, d)
    assert slow.calls == 1 + CALLS  # its own window, then Default
    assert isolated.selector.settle(timeout=10)
    verdicts = {
        problem.key: isolated.selector.store.get(namespace, problem.key).settings["confirm"]["verdict"]
        for problem in (first, second)
    }
    assert verdicts == {first.key: "confirmed", second.key: "reverted"}


def test_no_window_with_confirmation_off(isolated: Any, fake_backend: Any, monkeypatch: Any) -> None:
    fake = fake_backend("quick", "correct")
    monkeypatch.setenv("UNIMATMUL_CONFIRM", "0")
    isolated.selector.confirm_calls = None  # from the environment
    a, b = _operands()
    problem = _problem(a, b)
    namespace = _store_winner(isolated.selector, problem, "quick/k0")
    decision = isolated.selector.decide(problem, _target(), "cached")
    assert decision.confirmation is None and decision.source == "cache"
    for _ in range(WINDOW):
        _check(unimatmul.matmul(a, b), a, b)
    assert fake.calls == WINDOW
    assert "confirm" not in isolated.selector.store.get(namespace, problem.key).settings


def test_a_verdict_for_another_winner_does_not_apply() -> None:
    record = TuningRecord(
        "p", "x/k2", 1e-6, 2e-6, settings={"confirm": {"verdict": "reverted", "kernel": "x/k1"}}
    )
    assert confirm.verdict_of(record) is None  # tuned again since: the new winner is unjudged
    record.winner = "x/k1"
    assert confirm.verdict_of(record) == "reverted"


def test_a_bucket_choice_that_loses_stores_default_for_its_m_only(
    isolated: Any, fake_backend: Any, monkeypatch: Any
) -> None:
    fake_backend("sleepy", "slow", delay_s=2e-3)
    isolated.selector.confirm_calls = CALLS
    a, b = RNG.standard_normal((5, 40)).astype(np.float32), RNG.standard_normal((40, 16)).astype(np.float32)
    problem = _problem(a, b)  # m = 5: inside bucket 4 of pow2 (3..5)
    rep = problem.with_m(4)
    namespace = isolated.selector.platform(_target()).namespace
    versions = dict(isolated.selector.platform(_target()).versions)
    bucket = TuningRecord(
        rep.key, "sleepy/k0", 1e-6, 2e-6, versions=versions, settings={"bucket": {"lo": 3, "hi": 5}}
    )
    isolated.selector.store.put(namespace, rep.key, bucket)
    assert isolated.selector.decide(problem, _target(), "cached").source == "bucket"
    for _ in range(WINDOW + 1):  # the call after the window ends its last span: the verdict
        _check(unimatmul.matmul(a, b), a, b)
    assert isolated.selector.settle(timeout=10)
    exact = isolated.selector.store.get(namespace, problem.key)
    assert exact is not None and exact.winner == DEFAULT.identity
    assert exact.settings["confirm"]["verdict"] == "reverted"
    assert exact.settings["confirm"]["bucket"] == rep.key
    assert "confirm" not in isolated.selector.store.get(namespace, rep.key).settings  # m = 4 untouched
    other = Selector(plugins=isolated.plugins, settings=fast_config())
    assert other.decide(problem, _target(), "cached").source == "reverted"


def test_the_window_survives_default_failing_where_the_kernel_runs(isolated: Any, fake_backend: Any) -> None:
    """A Default that raises where the choice ran ends the window without a verdict."""
    fake = fake_backend("quick", "correct")

    class Refusing:
        candidate = DEFAULT

        def __call__(self, *args: Any, **kwargs: Any) -> None:
            msg = "Default refuses these operands (on purpose)"
            raise RuntimeError(msg)

    a, b = _operands()
    problem = _problem(a, b)
    isolated.selector.confirm_calls = CALLS
    _store_winner(isolated.selector, problem, "quick/k0")
    decision = isolated.selector.decide(problem, _target(), "cached")
    checking = decision.runner  # a window's first call is checked too (tuning/trust.py)
    assert isinstance(checking, trust.CheckingRunner)
    window = checking.inner
    assert isinstance(window, confirm.ConfirmingRunner)
    window.default = checking.default = Refusing()
    for _ in range(3):
        out = np.full((24, 16), np.nan, np.float32)
        checking(a, b, out)
        _check(out, a, b)
    assert decision.confirmation is not None and decision.confirmation.outcome is not None
    assert decision.confirmation.outcome.verdict == confirm.UNJUDGED
    assert fake.calls == 3 and isolated.selector.stats.confirmed == isolated.selector.stats.reverted == 0


def test_no_window_while_a_distributed_job_decides_together(isolated: Any, fake_backend: Any) -> None:
    """Every rank must run the same kernel there: a verdict judged on one rank would split them."""
    from unimatmul.tuning.selector import set_tuning_gate

    fake_backend("quick", "correct")
    isolated.selector.confirm_calls = CALLS
    a, b = _operands()
    problem = _problem(a, b)
    _store_winner(isolated.selector, problem, "quick/k0")
    try:
        set_tuning_gate(lambda problem, target: False, collective=lambda: True)
        assert isolated.selector.decide(problem, _target(), "cached").confirmation is None
        set_tuning_gate(lambda problem, target: False, collective=lambda: False)  # installed, inert
        assert isolated.selector.decide(problem, _target(), "cached").confirmation is not None
    finally:
        set_tuning_gate(None)


def _store_default_with_tie(selector: Selector, problem: Problem, tie: str, tie_s: float) -> str:
    """A Default record whose results hold ``tie`` at ``tie_s`` against Default's 2 us."""
    results = [
        CandidateResult(DEFAULT.identity, OK, median_s=2e-6, samples=5),
        CandidateResult(tie, OK, median_s=tie_s, samples=5),
        CandidateResult("quick/k9", PRUNED, median_s=1e-6, samples=4),  # pruned: never a tie
    ]
    return _store_winner(selector, problem, DEFAULT.identity, 2e-6, results)


def test_a_tie_is_the_fastest_kernel_measured_no_slower_than_default() -> None:
    def record(winner: str, *times: tuple[str, float]) -> TuningRecord:
        results = [CandidateResult(DEFAULT.identity, OK, median_s=2e-6)]
        results += [CandidateResult(identity, OK, median_s=t) for identity, t in times]
        return TuningRecord("p", winner, 2e-6, 2e-6, results=results)

    assert confirm.tie_of(record(DEFAULT.identity, ("x/a", 1.99e-6), ("x/b", 1.995e-6))) == "x/a"
    assert confirm.tie_of(record(DEFAULT.identity, ("x/a", 2e-6))) == "x/a"  # level counts
    assert confirm.tie_of(record(DEFAULT.identity, ("x/a", 2.01e-6))) is None  # slower: never
    assert confirm.tie_of(record("x/a", ("x/a", 1e-6))) is None  # a kernel won: no tie
    no_default = record(DEFAULT.identity, ("x/a", 1e-6))
    no_default.default_s = None
    assert confirm.tie_of(no_default) is None


def test_a_slim_scaled_choice_runs_default_in_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    from unimatmul.core.scales import scaled_problem

    scaled = scaled_problem(1, 4096, 4096)
    plain = Problem.from_shape(1, 4096, 4096, "bf16")

    def record(problem: Problem, winner: str, winner_s: float, default_s: float | None) -> TuningRecord:
        return TuningRecord(problem.key, winner, winner_s, default_s)

    # A scaled winner 3 % ahead of Default is not captured; 8 % ahead it is.
    assert confirm.default_in_graphs(scaled, record(scaled, "x/a", 1.0e-6, 1.03e-6), None)
    assert not confirm.default_in_graphs(scaled, record(scaled, "x/a", 1.0e-6, 1.08e-6), None)
    # Plain GEMMs are captured as tuned; so is Default itself, and a record without Default's time.
    assert not confirm.default_in_graphs(plain, record(plain, "x/a", 1.0e-6, 1.03e-6), None)
    assert not confirm.default_in_graphs(scaled, record(scaled, DEFAULT.identity, 1.0e-6, 1.0e-6), None)
    assert not confirm.default_in_graphs(scaled, record(scaled, "x/a", 1.0e-6, None), None)
    # A tie always runs Default under capture, scaled or not.
    assert confirm.default_in_graphs(plain, record(plain, DEFAULT.identity, 1e-6, 1e-6), "x/a")
    # The margin is a setting: 0 captures every scaled winner, 10 % the 8 % one too.
    monkeypatch.setenv("UNIMATMUL_SCALED_GRAPH_MIN_GAIN", "0")
    assert not confirm.default_in_graphs(scaled, record(scaled, "x/a", 1.0e-6, 1.03e-6), None)
    monkeypatch.setenv("UNIMATMUL_SCALED_GRAPH_MIN_GAIN", "0.1")
    assert confirm.default_in_graphs(scaled, record(scaled, "x/a", 1.0e-6, 1.08e-6), None)


def test_a_tie_runs_in_a_window_and_is_kept_where_it_wins(isolated: Any, fake_backend: Any) -> None:
    # Where the program runs the tie faster than Default (here any kernel "wins": min_gain
    # -100), the window keeps it and the record says so; another process uses it at once.
    fake = fake_backend("quick", "correct")
    isolated.selector.confirm_calls = CALLS
    isolated.selector.settings = replace(fast_config(), min_gain=-100.0)
    a, b = _operands()
    problem = _problem(a, b)
    namespace = _store_default_with_tie(isolated.selector, problem, "quick/k0", 1.99e-6)
    decision = isolated.selector.decide(problem, _target(), "cached")
    assert decision.confirmation is not None and decision.runner.candidate.identity == "quick/k0"
    for _ in range(WINDOW + 5):
        _check(unimatmul.matmul(a, b), a, b)
    assert fake.calls == 1 + CALLS + 5
    assert isolated.selector.settle(timeout=10)
    record = isolated.selector.store.get(namespace, problem.key)
    assert record.winner == DEFAULT.identity  # the tuning's verdict stays what it was
    found = record.settings["confirm"]
    assert found["verdict"] == "confirmed" and found["kernel"] == "quick/k0"
    assert confirm.describe(record).startswith("tie quick/k0 confirmed ")
    isolated.selector.store.flush()
    text = io.StringIO()
    assert main(["cache", "show", "--cache", str(isolated.cache_path)], out=text) == 0
    (row,) = [line for line in text.getvalue().splitlines() if "tie quick/k0" in line]
    assert row.split()[1] == DEFAULT.identity and row.split()[-5:-3] == ["quick/k0", "confirmed"]
    other = Selector(plugins=isolated.plugins, settings=fast_config())
    decision = other.decide(problem, _target(), "cached")
    assert decision.source == "confirmed" and decision.runner.candidate.identity == "quick/k0"
    assert decision.confirmation is None


def test_a_tie_that_loses_where_it_runs_leaves_default(isolated: Any, fake_backend: Any) -> None:
    fake = fake_backend("sleepy", "slow", delay_s=2e-3)
    isolated.selector.confirm_calls = CALLS
    a, b = _operands()
    problem = _problem(a, b)
    namespace = _store_default_with_tie(isolated.selector, problem, "sleepy/k0", 2e-6)
    for _ in range(WINDOW + 3):
        _check(unimatmul.matmul(a, b), a, b)
    assert fake.calls == 1 + CALLS  # Default once the window judged
    assert isolated.selector.settle(timeout=10)
    found = isolated.selector.store.get(namespace, problem.key).settings["confirm"]
    assert found["verdict"] == "reverted" and found["kernel"] == "sleepy/k0"
    other = Selector(plugins=isolated.plugins, settings=fast_config())
    decision = other.decide(problem, _target(), "cached")
    assert decision.source == "reverted" and decision.runner.candidate == DEFAULT


@pytest.mark.parametrize(
    ("tie", "windows"),
    [("quick/k0", 0), ("nosuch/k0", CALLS)],
    ids=["windows-off", "backend-gone"],
)
def test_a_tie_leaves_default_without_a_window_or_its_backend(
    isolated: Any, fake_backend: Any, tie: str, windows: int
) -> None:
    fake = fake_backend("quick", "correct")
    isolated.selector.confirm_calls = windows
    a, b = _operands()
    problem = _problem(a, b)
    _store_default_with_tie(isolated.selector, problem, tie, 1.5e-6)
    decision = isolated.selector.decide(problem, _target(), "cached")
    assert decision.runner.candidate == DEFAULT and decision.confirmation is None
    _check(unimatmul.matmul(a, b), a, b)
    assert fake.calls == 0


def test_a_tie_runs_default_while_the_stream_is_captured(
    isolated: Any, fake_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tie wins by host time, which a CUDA-graph replay does not have: under capture
    # (in its window, and after the window kept it) Default runs and the window does not
    # advance. A CPU has no graphs, so the clock's capture check says what a GPU's would.
    capturing = [True]
    monkeypatch.setattr(confirm.HostClock, "capturing", lambda self: capturing[0])
    fake = fake_backend("quick", "correct")
    isolated.selector.confirm_calls = CALLS
    isolated.selector.settings = replace(fast_config(), min_gain=-100.0)  # the window keeps it
    a, b = _operands()
    problem = _problem(a, b)
    _store_default_with_tie(isolated.selector, problem, "quick/k0", 1.99e-6)
    window = _window(isolated.selector.decide(problem, _target(), "cached").runner)
    assert isinstance(window, confirm.ConfirmingRunner) and window.tie
    for _ in range(3):
        _check(unimatmul.matmul(a, b), a, b)
    assert fake.calls == 0  # Default under capture; the window has not started
    capturing[0] = False
    for _ in range(WINDOW):
        _check(unimatmul.matmul(a, b), a, b)
    assert fake.calls == 1 + CALLS  # the whole window ran
    # The next call ends the last span: the verdict keeps the tie, which serves the call.
    for flag, expected in ((False, 2 + CALLS), (True, 2 + CALLS), (False, 3 + CALLS)):
        capturing[0] = flag
        _check(unimatmul.matmul(a, b), a, b)
        assert fake.calls == expected
    assert isolated.selector.settle(timeout=10)
    # Another process reads the verdict: the kept tie, again Default under capture.
    other = Selector(plugins=isolated.plugins, settings=fast_config())
    decision = other.decide(problem, _target(), "cached")
    assert decision.source == "confirmed" and isinstance(decision.runner, confirm.TieRunner)
    out = np.full((a.shape[0], b.shape[1]), np.nan, np.float32)
    capturing[0] = True
    decision.runner(a, b, out)
    _check(out, a, b)
    assert fake.calls == 3 + CALLS


def test_a_kernel_that_won_outright_is_captured_as_it_is(
    isolated: Any, fake_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only ties step aside under capture: a winner was measured in graphs, and wins there.
    monkeypatch.setattr(confirm.HostClock, "capturing", lambda self: True)
    fake = fake_backend("quick", "correct")
    isolated.selector.confirm_calls = CALLS
    a, b = _operands()
    problem = _problem(a, b)
    namespace = _store_winner(isolated.selector, problem, "quick/k0")
    # Tuned here (so trusted under capture, where its first-call check cannot run).
    stored = isolated.selector.store.get(namespace, problem.key)
    isolated.selector.store.put(namespace, problem.key, mark_checked(stored))
    window = _window(isolated.selector.decide(problem, _target(), "cached").runner)
    assert isinstance(window, confirm.ConfirmingRunner) and not window.tie
    _check(unimatmul.matmul(a, b), a, b)
    assert fake.calls == 1


class _CapturingClock:
    """A clock whose stream is being captured from a given call on: its events may then
    not be read (as CUDA's, which raise when queried during a capture)."""

    name = "fake-events"

    def __init__(self, samples: int) -> None:
        self.samples = samples
        self.capture = False
        self.finished = False  # whether the window's last events have run
        self.done = 0

    def capturing(self) -> bool:
        return self.capture

    def begin(self, index: int) -> None:
        pass

    def end(self, index: int) -> None:
        self.done += 1

    def ready(self) -> bool:
        if self.capture:
            raise RuntimeError("operation not permitted when stream is capturing")
        return self.finished

    def seconds(self) -> list[float]:
        return [1e-3] * self.samples

    def between(self) -> None:
        pass

    def spans(self) -> list[float] | None:
        return None  # an event clock's: no spans


def test_a_full_window_met_under_graph_capture_runs_the_choice_and_judges_later() -> None:
    from unimatmul.tuning.confirm import WARMUP, Confirmation, ConfirmingRunner

    calls: list[str] = []

    class Named:
        def __init__(self, name: str) -> None:
            self.name = name
            self.candidate = DEFAULT if name == "default" else Candidate.make("fake", name)

        def __call__(self, *args: Any) -> None:
            calls.append(self.name)

    confirmation = Confirmation("fake/k", calls=2, min_gain=0.0)
    clock = _CapturingClock(2 * confirmation.calls)
    window = ConfirmingRunner(Named("k"), Named("default"), confirmation, clock)  # type: ignore[arg-type]
    full = WARMUP + 2 * confirmation.calls
    for _ in range(full):
        window(None, None, None)
    clock.capture = True  # the window is full, its verdict not read yet: a graph captures the call
    calls.clear()
    window(None, None, None)
    assert calls == ["k"] and confirmation.outcome is None
    clock.capture, clock.finished = False, True
    window(None, None, None)  # after the capture: the verdict
    assert confirmation.outcome is not None
