"""The Harness: the fastest right candidate wins; slow ones lose, wrong ones never win.

Real oneDNN candidates are measured beside fake backends that are slow, wrong or
broken on purpose. Pruning is checked with a scripted timer, so that the verdicts do
not depend on how busy this machine is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from harness_fakes import CostClock, CostTimer

import unimatmul
from unimatmul.backend import DEFAULT, Candidate, Runner, Target
from unimatmul.cache.record import FAILED, OK, PRUNED, REJECTED, TuningRecord
from unimatmul.core.arrays import CPU, NumpyAdapter, adapter_for_kind
from unimatmul.core.problem import Problem
from unimatmul.core.runners import DefaultRunner
from unimatmul.tuning.harness import CpuTimer, Harness, HarnessConfig

NUMPY = Target(adapter_for_kind("numpy"), CPU)


def _by_identity(record: TuningRecord) -> dict[str, Any]:
    return {r.identity: r for r in record.results}


def assert_fastest_right_candidate_won(record: TuningRecord, settings: HarnessConfig) -> None:
    """The winner is a checked candidate whose samples beat Default clearly (its lower bound
    past min_gain, in ``settings["win"]``), or Default when none did."""
    results = _by_identity(record)
    ok = [r for r in record.results if r.status == OK]
    best = min(ok, key=lambda r: r.median_s or float("inf"))
    assert results[record.winner].status == OK
    win = record.settings.get("win")
    if record.winner != DEFAULT.identity:
        assert win is not None and win["candidate"] == record.winner
        assert win["low"] >= 1 + settings.min_gain
    elif best.identity != DEFAULT.identity and win is not None:
        default = results[DEFAULT.identity]
        clear = win["low"] is not None and win["low"] >= 1 + settings.min_gain
        repeated = record.settings.get("repeat", {}).get("verdict") == "confirmed"
        assert best.median_s > default.median_s * (1 - settings.min_gain) or not (clear and repeated)
    assert record.winner_s == results[record.winner].median_s


def assert_every_time_recorded(record: TuningRecord) -> None:
    for result in record.results:
        if result.status in (OK, PRUNED):
            assert result.median_s is not None and result.median_s > 0, result
            assert result.samples >= 1, result
        else:
            assert result.status in (REJECTED, FAILED) and result.note, result


def test_real_onednn_candidates_are_all_measured(isolated: Any) -> None:
    problem = Problem.from_shape(96, 80, 64)
    record = isolated.selector.tune(problem, NUMPY)
    identities = [r.identity for r in record.results]
    assert identities[0] == DEFAULT.identity
    onednn = [i for i in identities if i.startswith("onednn/")]
    assert onednn, identities
    assert not any(i.startswith("onednn/ref:") for i in onednn)  # reference kernels only on request
    assert all(r.status in (OK, PRUNED) for r in record.results), record.results
    assert all(r.error is not None and r.error < 1e-5 for r in record.results)
    assert_every_time_recorded(record)
    assert_fastest_right_candidate_won(record, isolated.selector.settings)
    assert record.default_s == _by_identity(record)[DEFAULT.identity].median_s
    assert record.versions["onednn"] and record.versions["numpy"] == np.__version__
    assert record.settings["timer"] == CpuTimer.name and record.settings["tolerance"] == 1e-4
    assert record.tune_s > 0


def test_a_slow_backend_loses(isolated: Any, fake_backend: Callable[..., Any]) -> None:
    slow = fake_backend("slow", "slow", delay_s=2e-3)
    record = isolated.selector.tune(Problem.from_shape(48, 40, 32), NUMPY)
    result = _by_identity(record)["slow/k0"]
    assert slow.calls > 0 and result.error is not None and result.error < 1e-5  # it was right ...
    assert record.winner != "slow/k0"  # ... but slow
    # A clear loser is pruned (unless a busy machine slowed everyone else as much).
    assert result.status in (PRUNED, OK)
    assert result.median_s is not None and result.median_s >= 2e-3
    assert_every_time_recorded(record)
    assert_fastest_right_candidate_won(record, isolated.selector.settings)


@pytest.mark.parametrize("behaviour", ["wrong", "almost"])
def test_a_fast_wrong_backend_is_rejected(
    isolated: Any, fake_backend: Callable[..., Any], behaviour: str
) -> None:
    wrong = fake_backend("wrong", behaviour)
    a = np.random.default_rng(1).standard_normal((40, 24)).astype(np.float32)
    b = np.random.default_rng(2).standard_normal((24, 56)).astype(np.float32)
    with unimatmul.mode("tune"):
        out = unimatmul.matmul(a, b)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    (_, _, record), *_ = list(isolated.selector.store.items())
    result = _by_identity(record)["wrong/k0"]
    assert wrong.calls == 2  # checked (two calls on poisoned memory), never timed
    assert result.status == REJECTED
    assert result.error is not None and result.error > 1e-3
    assert "over the error bound" in result.note and result.median_s is None
    assert record.winner != "wrong/k0"


@pytest.mark.parametrize("behaviour", ["raise_prepare", "raise_run"])
def test_a_broken_candidate_is_contained(
    isolated: Any, fake_backend: Callable[..., Any], behaviour: str
) -> None:
    fake_backend("broken", behaviour)
    record = isolated.selector.tune(Problem.from_shape(16, 24, 8), NUMPY)
    result = _by_identity(record)["broken/k0"]
    assert result.status == FAILED
    assert "RuntimeError" in result.note and "on purpose" in result.note
    assert record.winner != "broken/k0"
    assert_every_time_recorded(record)


def test_unsupported_candidates_are_failed_not_fatal(isolated: Any, fake_backend: Callable[..., Any]) -> None:
    # A kernel that prepare() refuses (say, gone since it was listed): the protocol's "no".
    fake = fake_backend("picky", "correct", kernels=("k0",))
    problem = Problem.from_shape(8, 8, 8)
    harness = Harness(CpuTimer(), isolated.selector.settings)
    entries = [
        (DEFAULT, lambda: DefaultRunner(NUMPY.adapter)),
        (
            Candidate.make("picky", "gone"),
            lambda: fake.prepare(problem, Candidate.make("picky", "gone"), NUMPY),
        ),
    ]
    record = harness.measure(problem, NUMPY, entries)
    assert _by_identity(record)["picky/gone"].status == FAILED
    assert _by_identity(record)["picky/gone"].note.startswith("unsupported:")
    assert record.winner == DEFAULT.identity


def test_a_prepare_waiting_past_the_cap_leaves_its_candidate_out_as_capped(isolated: Any) -> None:
    """While the harness prepares a candidate, ``prepare_deadline()`` is the problem's cap
    (a prepare that waits for a compile gives up there); its NotReady leaves the candidate
    out as capped, not failed. Outside the harness there is no deadline."""
    import math
    import time

    from unimatmul.backend import NotReady, prepare_deadline
    from unimatmul.cache.record import PRUNED
    from unimatmul.tuning.harness import CAPPED

    seen: list[float] = []

    def not_ready() -> Runner:
        seen.append(prepare_deadline())
        raise NotReady("its kernel is still compiling")

    problem = Problem.from_shape(8, 8, 8)
    harness = Harness(CpuTimer(), isolated.selector.settings)
    entries = [(DEFAULT, lambda: DefaultRunner(NUMPY.adapter)), (Candidate.make("slow", "k0"), not_ready)]
    started = time.perf_counter()
    record = harness.measure(problem, NUMPY, entries, cap_s=30.0)
    result = _by_identity(record)["slow/k0"]
    assert (result.status, result.note) == (PRUNED, CAPPED)
    assert record.winner == DEFAULT.identity
    assert len(seen) == 1 and started < seen[0] <= time.perf_counter() + 30.0
    assert math.isinf(prepare_deadline())
    uncapped: list[float] = []
    harness.measure(
        problem,
        NUMPY,
        [
            (DEFAULT, lambda: DefaultRunner(NUMPY.adapter)),
            (
                Candidate.make("slow", "k1"),
                lambda: uncapped.append(prepare_deadline()) or DefaultRunner(NUMPY.adapter),
            ),
        ],
    )
    assert uncapped and math.isinf(uncapped[0])


# --- pruning, deterministically -----------------------------------------------------


class _CostedRunner:
    """Seconds a call by the scripted clock: ``cost``, or ``cost(n)`` for its n-th call."""

    def __init__(self, candidate: Candidate, cost: float | Callable[[int], float], clock: CostClock) -> None:
        self.candidate = candidate
        self.cost = cost
        self.clock = clock
        self.adapter = NumpyAdapter()
        self.calls = 0

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        self.adapter.matmul(a, b, out, alpha, beta, bias, None)
        self.clock.current = self.cost(self.calls) if callable(self.cost) else self.cost
        self.calls += 1


def _scripted(costs: dict[Candidate, Any], settings: HarnessConfig) -> TuningRecord:
    clock = CostClock()
    entries: list[tuple[Candidate, Callable[[], Runner]]] = [
        (candidate, lambda c=candidate, t=cost: _CostedRunner(c, t, clock))
        for candidate, cost in costs.items()
    ]
    harness = Harness(CostTimer(clock), settings)
    return harness.measure(Problem.from_shape(8, 6, 4), NUMPY, entries)


def test_pruning_marks_clear_losers_and_keeps_their_times() -> None:
    fast, close, loser, hopeless = (Candidate.make("t", n) for n in ("fast", "close", "loser", "hopeless"))
    settings = HarnessConfig(warmup=1, min_samples=3, max_samples=10, budget_s=1.0, settle_s=0.0, max_sets=1)
    record = _scripted({DEFAULT: 1.0, fast: 0.5, close: 0.6, loser: 0.8, hopeless: 10.0}, settings)
    results = _by_identity(record)
    assert record.winner == fast.identity and record.winner_s == 0.5
    assert record.default_s == 1.0 and record.speedup == 2.0
    # 10x the best on its first timed call: dropped at once, after one sample.
    assert results[hopeless.identity].status == PRUNED and results[hopeless.identity].samples == 1
    # 1.6x the best after twice min_samples (in turns a kernel's first samples can be
    # slow): dropped then, not measured to the end.
    assert (
        results[loser.identity].status == PRUNED
        and results[loser.identity].samples == 2 * settings.min_samples
    )
    assert "1.60x the best" in results[loser.identity].note
    # Within the prune ratio: measured fully, not the winner.
    assert results[close.identity].status == OK and results[close.identity].samples == settings.max_samples
    # Default is never pruned: it is the baseline every speedup is quoted against.
    assert results[DEFAULT.identity].status == OK
    assert_every_time_recorded(record)


def test_a_small_gain_keeps_default() -> None:
    nearly = Candidate.make("t", "nearly")
    settings = HarnessConfig(warmup=1, min_samples=3, max_samples=5, settle_s=0.0, max_sets=1, min_gain=0.05)
    record = _scripted({DEFAULT: 1.0, nearly: 0.97}, settings)
    assert record.winner == DEFAULT.identity and record.speedup == 1.0
    assert _by_identity(record)[nearly.identity].median_s == 0.97


def test_interleaved_rounds_prune_too() -> None:
    fast, close, loser = (Candidate.make("t", n) for n in ("fast", "close", "loser"))
    settings = HarnessConfig(
        warmup=1, min_samples=3, max_samples=6, budget_s=1.0, settle_s=0.0, max_sets=1, interleave=True
    )
    record = _scripted({DEFAULT: 1.0, fast: 0.5, close: 0.6, loser: 0.9}, settings)
    results = _by_identity(record)
    assert record.winner == fast.identity
    assert results[loser.identity].status == PRUNED
    assert results[close.identity].samples == settings.max_samples
    # The winner's time is that of its repeat against Default, pair by pair (as many
    # pairs as fit the 1 s budget at these scripted 0.5-1 s samples: the least, 2).
    assert record.settings["repeat"]["verdict"] == "confirmed"
    assert results[fast.identity].samples == 2


def test_interleaved_rounds_prune_a_candidate_that_falls_behind_later() -> None:
    """On a GPU (rounds) a candidate is pruned in any round where its median falls behind
    the best by the ratio, not only after the first rounds: its further samples could not
    change the winner (this makes warm tuning cheaper)."""
    fast, fading = Candidate.make("t", "fast"), Candidate.make("t", "fading")
    settings = HarnessConfig(
        warmup=1, min_samples=3, max_samples=10, budget_s=60.0, settle_s=0.0, max_sets=1, interleave=True
    )
    # Level with the best up to its 7th call (checks, warm-up, the first rounds), then 1.8x.
    record = _scripted({DEFAULT: 1.0, fast: 0.5, fading: lambda n: 0.52 if n < 7 else 0.9}, settings)
    results = _by_identity(record)
    assert record.winner == fast.identity
    assert results[fading.identity].status == PRUNED
    assert settings.min_samples < results[fading.identity].samples < settings.max_samples
    assert "x the best after" in results[fading.identity].note
    # Default is never pruned, whatever the ratio.
    assert results[DEFAULT.identity].status == OK


def test_inputs_rotate_through_more_memory_than_the_cache() -> None:
    settings = HarnessConfig(rotate_bytes=4 << 20, max_sets=128)
    problem = Problem.from_shape(64, 64, 64)  # 48 KiB a set
    sets = Harness(CpuTimer(), settings)._operand_sets(problem, NUMPY, np.random.default_rng(0))
    assert len(sets) == -(-(4 << 20) // problem.min_bytes)
    assert len({s.a.ctypes.data for s in sets}) == len(sets)  # distinct memory, not one buffer again
    assert all(np.isfinite(s.a).all() and np.abs(s.a).sum() > 0 for s in sets)  # never zeros


def test_by_default_a_small_product_rotates_through_twice_the_last_level_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # bert-base's per-head product on a 32 MiB cache: 1.5 MiB a set, so 43 sets span 64 MiB
    # (16, the cap before, held the rotation at 24 MiB: inside the cache).
    from unimatmul.tuning import harness as harness_module

    monkeypatch.setattr(harness_module, "last_level_cache_bytes", lambda: 32 << 20)
    problem = Problem.parse_shape("12x128x64x128")
    sets = Harness(CpuTimer(), HarnessConfig())._operand_sets(problem, NUMPY, np.random.default_rng(0))
    assert len(sets) * problem.min_bytes >= 2 * (32 << 20)
    assert len(sets) == -(-(64 << 20) // problem.min_bytes)


def test_sets_that_all_fit_in_l2_are_not_rotated() -> None:
    # 16 sets of 6x4x3 take 2 KiB: cached whatever their order, so two serve as well.
    settings = HarnessConfig(rotate_bytes=64 << 20, max_sets=16)
    sets = Harness(CpuTimer(), settings)._operand_sets(
        Problem.from_shape(6, 4, 3), NUMPY, np.random.default_rng(0)
    )
    assert len(sets) == 2


def test_beta_problems_are_checked_with_c_in_the_output(isolated: Any) -> None:
    problem = Problem(m=24, n=16, k=8, beta_zero=False)
    record = isolated.selector.tune(problem, NUMPY)
    assert all(r.status in (OK, PRUNED) for r in record.results), record.results
    assert all(r.error is not None and r.error < 1e-5 for r in record.results)


def test_default_alone_is_timed_on_one_set_without_a_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    # No backend offers a candidate: nothing is chosen, so nothing is checked against a
    # float64 reference (its cost, and one operand set a timed part, were all of a
    # 128-expert grouped product's 30 s on a CPU).
    from unimatmul.tuning import harness as harness_module

    def no_reference(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a reference was made for Default alone")

    monkeypatch.setattr(harness_module, "reference_of", no_reference)
    settings = HarnessConfig(warmup=1, min_samples=3, max_samples=6, budget_s=1.0, settle_s=0.0, max_sets=8)
    harness = Harness(CpuTimer(), settings)
    problem = Problem.from_shape(64, 48, 32)
    assert harness.plan_memory(problem, NUMPY, 0.0).sets > 1  # what a choice would take
    record = harness.measure(problem, NUMPY, [(DEFAULT, lambda: DefaultRunner(NUMPY.adapter))])
    default = _by_identity(record)[DEFAULT.identity]
    assert record.winner == DEFAULT.identity and default.status == OK
    assert default.samples >= settings.min_samples and record.default_s and record.default_s > 0
    assert record.settings["sets"] == 1
    assert record.settings["check"] == {"model": "none", "why": "Default alone: nothing to choose"}
