"""Tuning within a budget: UNIMATMUL_TUNE_BUDGET_S in a program, the per-problem cap,
and the order a plan spends a run's budget in (real tune mode, oneDNN and NumPy)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import unimatmul
from unimatmul.backend import DEFAULT, Target
from unimatmul.cache.record import PRUNED
from unimatmul.core.arrays import CPU, Device, adapter_for_kind
from unimatmul.core.problem import Problem
from unimatmul.tuning.harness import CAPPED
from unimatmul.tuning.jobs import TuneJob
from unimatmul.tuning.plan import PlannedJob, TunePlan, expected_tune_s

NUMPY = Target(adapter_for_kind("numpy"), CPU)


def _shapes(count: int) -> list[tuple[int, int, int]]:
    return [(8 + i, 16 + 8 * (i % 3), 24 + 8 * (i % 4)) for i in range(count)]


def _matmul_checked(m: int, n: int, k: int, rng: np.random.Generator) -> None:
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    out = unimatmul.matmul(a, b)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)


def test_a_program_stops_tuning_once_its_budget_is_spent(
    isolated: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget = 0.25
    monkeypatch.setenv("UNIMATMUL_TUNE_BUDGET_S", str(budget))
    rng = np.random.default_rng(3)
    shapes = _shapes(60)
    stats = isolated.selector.stats
    with warnings.catch_warnings(record=True) as caught, unimatmul.mode("tune"):
        warnings.simplefilter("always")
        for shape in shapes:
            _matmul_checked(*shape, rng)
        tuned = stats.tuned
        assert 0 < tuned < len(shapes)
        # The problems met after the budget ran out run Default, and are not tuned later.
        for shape in shapes:
            _matmul_checked(*shape, rng)
    assert stats.tuned == tuned
    assert isolated.store_count() == tuned  # what was tuned is stored
    # The last problem started with what was left and stopped at it (its Default
    # measurement and numeric checks may run past it, by milliseconds here).
    assert stats.tune_s < budget + 0.4
    said = [str(w.message) for w in caught if "tuning budget" in str(w.message)]
    assert len(said) == 1
    assert "UNIMATMUL_TUNE_BUDGET_S=0.25" in said[0] and "run Default" in said[0]


def test_without_a_budget_a_program_tunes_everything(isolated: Any) -> None:
    rng = np.random.default_rng(4)
    with unimatmul.mode("tune"):
        for shape in _shapes(4):
            _matmul_checked(*shape, rng)
    assert isolated.selector.stats.tuned == 4
    assert isolated.selector.tuning_allowance() is None


def test_a_cap_measures_default_and_leaves_the_other_candidates_out(isolated: Any) -> None:
    problem = Problem.from_shape(64, 64, 64, "f32")
    full = isolated.selector.tune(problem, NUMPY, force=True)
    assert len(full.results) > 1, "oneDNN offers candidates on this CPU"
    capped = isolated.selector.tune(problem, NUMPY, force=True, cap_s=0.0)
    default = capped.result(DEFAULT.identity)
    assert default is not None and default.median_s and capped.winner == DEFAULT.identity
    assert default.samples == 2  # past the cap, two samples give a median, and no more are taken
    others = [r for r in capped.results if r.identity != DEFAULT.identity]
    assert others and all(r.status == PRUNED and r.note == CAPPED and r.median_s is None for r in others)
    assert capped.settings["capped"] == {"cap_s": 0.0, "left_out": len(others)}
    assert "capped" not in full.settings


def test_the_cap_setting_applies_where_no_cap_is_given(
    isolated: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNIMATMUL_TUNE_CAP_S", "0")
    record = isolated.selector.tune(Problem.from_shape(32, 48, 40, "f32"), NUMPY)
    assert record.settings["capped"]["left_out"] >= 1
    monkeypatch.setenv("UNIMATMUL_TUNE_BUDGET_S", "10")
    assert isolated.selector.tuning_allowance() == 0.0  # min(what is left of the budget, the cap)


def test_a_plan_tunes_the_largest_expected_gain_first_and_reports_coverage(isolated: Any) -> None:
    problems = [Problem.from_shape(16, 16 * (i + 1), 32, "f32") for i in range(4)]
    shares = [0.1, 0.4, 0.2, 0.3]
    items = [
        PlannedJob(TuneJob(p, NUMPY), s, f"p{i}")
        for i, (p, s) in enumerate(zip(problems, shares, strict=True))
    ]
    cached = Problem.from_shape(8, 8, 8, "f32")
    isolated.selector.tune(cached, NUMPY)
    items.append(PlannedJob(TuneJob(cached, NUMPY), 0.01, "cached"))
    plan = TunePlan(items, by_priority=True)
    order = []
    for item in plan.order(isolated.selector):
        record, source = item.job.run(isolated.selector, cap_s=plan.cap_for_next())
        plan.done(item, record, source)
        order.append((item.what, source))
    assert order[0] == ("cached", "cache")  # free: first, whatever its share
    assert order[1] == ("p1", "tuned")  # then the largest share (no gain known yet)
    assert {what for what, _ in order} == {"p0", "p1", "p2", "p3", "cached"}
    assert plan.coverage() == pytest.approx(1.0)
    assert plan.summary().startswith("coverage: 100.0% of the GEMM time tuned in ")


def test_a_spent_plan_leaves_the_rest_out_with_its_share(isolated: Any) -> None:
    now = [0.0]
    items = [PlannedJob(TuneJob(Problem.from_shape(4, 8 * (i + 1), 8, "f32"), NUMPY), 1.0) for i in range(3)]
    plan = TunePlan(items, budget_s=1.0, clock=lambda: now[0])
    ran = []
    for item in plan.order(isolated.selector):
        assert plan.cap_for_next() == pytest.approx(1.0 - now[0])
        record, source = item.job.run(isolated.selector, cap_s=plan.cap_for_next())
        plan.done(item, record, source)
        ran.append(item)
        now[0] += 0.6  # each job "takes" 0.6 s on this clock
    assert len(ran) == 2
    assert plan.coverage() == pytest.approx(2 / 3)
    assert [(round(x.share, 3), x.why) for x in plan.left_out] == [(0.333, "budget spent")]
    assert "left out: 1 product (33.3%): budget spent" in plan.summary()


def test_a_budget_goes_to_the_most_gain_a_second_and_passes_over_what_does_not_fit(isolated: Any) -> None:
    """A problem expected to take longer than the budget has left is passed over for ones
    that fit; of those, the most expected gain x share per expected second goes first:
    with no gain known yet, a small problem of a fair share before a large one of a larger
    share that costs far more to tune."""
    now = [0.0]
    large = Problem.from_shape(4096, 4096, 4096, "f32")  # over a minute expected here: never run
    smalls = [Problem.from_shape(8, 16 * (i + 1), 32, "f32") for i in range(3)]
    items = [PlannedJob(TuneJob(large, NUMPY), 0.7, "large")]
    items += [PlannedJob(TuneJob(p, NUMPY), 0.1, f"small{i}") for i, p in enumerate(smalls)]
    each = max(expected_tune_s(p, "cpu") for p in smalls)
    plan = TunePlan(items, budget_s=4 * each, clock=lambda: now[0])
    assert plan.expected_cost_s(items[0]) > 4 * each
    assert plan.priority(items[1]) > plan.priority(items[0])
    ran = []
    for item in plan.order(isolated.selector):
        record, source = item.job.run(isolated.selector, cap_s=plan.cap_for_next())
        plan.done(item, record, source)
        ran.append(item.what)
        now[0] += each
    assert sorted(ran) == ["small0", "small1", "small2"]
    assert [(x.what, x.why) for x in plan.left_out] == [("large", "budget spent")]
    assert plan.coverage() == pytest.approx(0.3)


def _tuned(plan: TunePlan, item: PlannedJob, ratio: float, when: float) -> None:
    """Mark ``item`` tuned in ``ratio`` times its estimate."""
    from unimatmul.cache.record import TuningRecord

    record = TuningRecord(item.job.problem.key, "default/default", 1e-3, 1e-3, tuned_at=when)
    record.tune_s = ratio * expected_tune_s(item.job.problem, "cpu")
    plan.done(item, record, "tuned")


def test_the_expected_cost_learns_from_the_problems_tuned_after_the_first() -> None:
    """The estimate is scaled by what the problems of its regime tuned so far took against
    it (median); the run's first one (which pays the process's first compiles and loads)
    only lowers it; a regime none of whose problems was tuned expects what the first one
    took (its kernels' first compiles), never less than the estimate."""
    items = [
        PlannedJob(TuneJob(Problem.from_shape(8, 16 * (i + 1), 32, "f32"), NUMPY), 0.25) for i in range(4)
    ]
    plan = TunePlan(items)
    estimate = plan.expected_cost_s(items[3])
    _tuned(plan, items[0], 50.0, 0.0)  # the first took far more: the estimate stands
    assert plan.expected_cost_s(items[3]) == pytest.approx(estimate)
    _tuned(plan, items[1], 3.0, 1.0)
    _tuned(plan, items[2], 5.0, 2.0)
    assert plan.expected_cost_s(items[3]) == pytest.approx(5.0 * estimate)  # median of 3 and 5: the upper
    prefill = PlannedJob(TuneJob(Problem.from_shape(512, 64, 32, "f32"), NUMPY), 0.1)
    assert plan.expected_cost_s(prefill) == pytest.approx(50.0 * expected_tune_s(prefill.job.problem, "cpu"))
    quick = TunePlan([PlannedJob(TuneJob(p.job.problem, NUMPY), 0.25) for p in items])
    _tuned(quick, quick.items[0], 0.2, 0.0)  # a first one quicker than estimated: the rest too
    assert quick.expected_cost_s(quick.items[3]) == pytest.approx(0.2 * estimate)
    assert quick.expected_cost_s(prefill) == pytest.approx(expected_tune_s(prefill.job.problem, "cpu"))


def test_the_first_job_starts_whatever_its_estimate() -> None:
    """With a budget shorter than every estimate, the run's first job still starts (its
    cap stops it at the budget); after it, one that does not fit does not."""
    items = [
        PlannedJob(TuneJob(Problem.from_shape(8, 16 * (i + 1), 32, "f32"), NUMPY), 0.5) for i in range(2)
    ]
    now = [0.0]
    plan = TunePlan(items, budget_s=0.01, clock=lambda: now[0])
    order = plan.order(selector=None, force=True)  # type: ignore[arg-type]  # force: no cache lookups
    first = next(order)
    _tuned(plan, first, 2.0, 0.0)
    assert list(order) == []
    assert len(plan.left_out) == 1


def test_grouped_jobs_learn_their_expected_gain_from_the_same_experts_only() -> None:
    from unimatmul.core.grouped import grouped_problem

    def job(problem: Problem) -> PlannedJob:
        return PlannedJob(TuneJob(problem, NUMPY), 0.1)

    decode, more_decode, prefill = (
        job(grouped_problem(8, 16, 96, 64, "bf16")),
        job(grouped_problem(8, 128, 96, 64, "bf16")),
        job(grouped_problem(8, 1024, 96, 64, "bf16")),
    )
    assert decode.weight == more_decode.weight  # two decode buckets of one MoE layer's experts
    assert decode.weight != prefill.weight  # a regime of its own
    dense = job(Problem.from_shape(16, 96, 64, "bf16"))
    more_experts = job(grouped_problem(16, 16, 96, 64, "bf16"))
    assert len({decode.weight, dense.weight, more_experts.weight}) == 3


def test_dense_products_learn_their_gain_per_weight_and_regime() -> None:
    def weight(m: int, n: int = 96) -> tuple[object, ...]:
        return PlannedJob(TuneJob(Problem.from_shape(m, n, 64, "bf16"), NUMPY), 0.1).weight

    assert weight(1) == weight(64)  # decode sizes of one weight
    assert weight(64) != weight(65) == weight(8192)  # the larger ones apart
    assert weight(1) != weight(1, n=128)  # another weight


def test_backends_hear_of_every_problem_to_tune_before_the_first_is_measured(
    isolated: Any, backends: Any
) -> None:
    """``Tuner.ahead`` with a plan's upcoming jobs (what ``unimatmul tune`` does first): each
    backend that serves the target is told of every problem the cache does not answer,
    largest share first; one that fails there is passed over and the tuning goes on."""
    from harness_fakes import KernelBackend, right

    class Ahead(KernelBackend):
        def __init__(self) -> None:
            super().__init__("ahead", {"k": right})
            self.told: list[tuple[int, int, int]] = []

        def ahead(self, problem: Problem, target: Target) -> None:
            self.told.append((problem.m, problem.n, problem.k))
            if problem.m == 9:
                raise RuntimeError("this backend cannot look ahead at m = 9")

    told = Ahead()
    backends(told)
    cached = Problem.from_shape(8, 8, 8, "f32")
    isolated.selector.tune(cached, NUMPY)
    shapes = [(9, 16, 24), (10, 24, 32), (11, 32, 40)]
    items = [
        PlannedJob(TuneJob(Problem.from_shape(*s, "f32"), NUMPY), share)
        for s, share in zip(shapes, [0.2, 0.5, 0.3], strict=True)
    ]
    items.append(PlannedJob(TuneJob(cached, NUMPY), 0.9))
    plan = TunePlan(items)

    def ahead(upcoming: list[PlannedJob]) -> None:
        isolated.selector.tuner.ahead((i.job.problem, i.job.target) for i in upcoming)

    told_first = []
    for item in plan.order(isolated.selector, before=ahead):
        told_first.append(list(told.told))
        record, source = item.job.run(isolated.selector)
        plan.done(item, record, source)
    assert told.told == [(10, 24, 32), (11, 32, 40), (9, 16, 24)]  # by share; the cached one left out
    assert told_first[0] == told.told  # all of them before the first job
    assert plan.coverage() == pytest.approx(1.0)


def test_a_budget_given_the_runs_start_counts_from_it(isolated: Any) -> None:
    """``run_started`` (the command's start, its imports included): the budget counts from
    there, so what the start-up took is not left to tuning; the summary says how long it was."""
    now = [0.7]  # the run began at 0; the first job is handed out at 0.7 s
    items = [PlannedJob(TuneJob(Problem.from_shape(4, 8 * (i + 1), 8, "f32"), NUMPY), 1.0) for i in range(3)]
    each = max(expected_tune_s(item.job.problem, "cpu") for item in items)
    budget = round(0.7 + 1.5 * each, 3)
    plan = TunePlan(items, budget_s=budget, clock=lambda: now[0], run_started=0.0)
    caps = []
    for item in plan.order(isolated.selector):
        caps.append(plan.cap_for_next())
        record, source = item.job.run(isolated.selector, cap_s=caps[-1])
        plan.done(item, record, source)
        now[0] += 1.5 * each  # the first job "takes" all that was left
    assert caps == [pytest.approx(budget - 0.7)]  # the budget less the 0.7 s before tuning
    assert [x.why for x in plan.left_out] == ["budget spent", "budget spent"]
    assert f"(budget {budget:g} s for the whole run, 0.7 s of it before tuning)" in plan.summary()


def test_the_command_line_counts_from_the_processs_start() -> None:
    """``unimatmul.cli.run_started``: from the process's start where the command is the
    process (Linux's /proc gives its age), else from the call."""
    import sys
    import time

    from unimatmul.cli import run_started

    now = time.perf_counter()
    call, process = run_started(False), run_started(True)
    assert call >= now
    if sys.platform.startswith("linux"):
        assert process < now - 0.1  # this test process has run for a while already
    else:
        assert process >= now


GPU_TORCH = Target(adapter_for_kind("torch"), Device("cuda"))


def test_on_a_gpu_the_prior_expects_more_of_small_products_than_of_large_ones() -> None:
    """Before anything is measured on a GPU, the expected gain is the share of a call that
    is fixed cost rather than roofline time: a weight of a few MB at a decode size before a
    compute-bound prefill product of the same share; on a CPU the prior is the same for all."""
    from unimatmul.tuning.plan import FIXED_CALL_S, prior_gain, problem_seconds

    small = Problem.from_shape(1, 1024, 4096, "bf16")  # 8 MB of weight: ~2 us of roofline
    large = Problem.from_shape(8192, 14336, 4096, "bf16")  # ~1 ms of tensor-core time
    for problem in (small, large):
        t = problem_seconds(problem, "cuda")
        assert prior_gain(problem, "cuda") == pytest.approx(FIXED_CALL_S / (FIXED_CALL_S + t))
        assert prior_gain(problem, "cpu") == 1.0
    assert prior_gain(small, "cuda") > 0.5 > 0.01 > prior_gain(large, "cuda")
    items = [PlannedJob(TuneJob(p, GPU_TORCH), 0.5) for p in (large, small)]
    plan = TunePlan(items)
    assert plan.expected_gain(items[1]) > plan.expected_gain(items[0])
    assert [i.job.problem for i in sorted(items, key=plan.priority, reverse=True)] == [small, large]


def test_the_expected_gain_learns_from_the_weight_and_scales_the_prior_by_the_run() -> None:
    """A tuned problem of a weight counts as much as the prior in that weight's expected
    gain; the run's gains over their problems' priors scale every prior (a run whose
    gains fall short of the priors expects less of the weights not tried yet)."""
    from unimatmul.cache.record import TuningRecord
    from unimatmul.tuning.plan import PRIOR_WEIGHT

    def job(m: int, n: int) -> PlannedJob:
        return PlannedJob(TuneJob(Problem.from_shape(m, n, 4096, "bf16"), GPU_TORCH), 0.25)

    tried, same_weight, other = job(1, 4096), job(2, 4096), job(1, 1024)
    plan = TunePlan([tried, same_weight, other])
    before = plan.expected_gain(other)
    assert before == pytest.approx(other.prior)
    record = TuningRecord(tried.job.problem.key, "default/default", 1e-3, 1e-3)  # Default kept: no gain
    record.tune_s = 0.1
    plan.done(tried, record, "tuned")
    scale = PRIOR_WEIGHT / (tried.prior + PRIOR_WEIGHT)
    assert plan.expected_gain(other) == pytest.approx(other.prior * scale)
    assert plan.expected_gain(same_weight) == pytest.approx(same_weight.prior * scale / 2)
    assert plan.expected_gain(other) < before
