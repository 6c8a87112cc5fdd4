"""A tuning run under a budget: which problem next, how long it may take, what is covered.

Each job carries its **share** of the workload's GEMM time (a model's roofline estimate,
a record file's call counts, or each problem once). A :class:`TunePlan` hands out first
the jobs the cache answers already (they cost nothing), then the rest in order of
expected gain x share per expected second of tuning. The expected gain of a problem is
learnt from the fraction of time that tuning saved on the problems of the same weight (n,
k, dtype, layout; grouped ones of the same experts) and regime (decode-sized or not:
:attr:`PlannedJob.weight`) tuned so far in this run, starting from a prior
(:func:`prior_gain`): on a GPU, the share of a call's time that is fixed cost (launch,
ramp-up, tail: :data:`FIXED_CALL_S`) rather than its roofline time, which vendor
heuristics serve least well (a weight of a few MB read at decode sizes has the most to
gain, a compute-bound prefill product the least); on a CPU the same for all. The prior is
scaled by how the run's gains so far compare with their problems' priors, and each tuned
problem of the weight counts as much as the prior (:meth:`TunePlan.expected_gain`).
Replayed over measured budget-free tunes of Llama-3-8B on the H200
(``benchmarks/budget_replay.py``), the prior raised the gain a 10 s budget keeps from a
median of 6 % to about a third. Its expected tuning time is a fixed cost a problem plus a cost per second of
one call (:data:`TUNE_COST`: the harness's checks and samples run a problem some hundreds
of times), scaled by what the problems of its regime tuned so far took against it (the
run's first problem only lowers it: it pays the process's first compiles and library
loads; but the first problem of the other regime is expected to pay as much as it did, as
its kernels compile for the first time too: on the H200 a 512-token product expected at
0.16 s took 2.2-2.7 s, the third problem of a 10 s run). The gain of a model is mostly in many small problems that tune in a tenth of a second, not in the few
large ones that take seconds each (measured on Llama-3-8B on the H200:
``benchmarks/results/tune-model-h200``). With a budget, each job may take what is left of
it (and at most the per-problem cap); the run's first job always starts (it has only the
estimate to go by), a later one expected to take more than is left is passed over for
one that fits, and once none fits, the jobs not reached are left out. The budget
counts from :attr:`TunePlan.run_started` where it is given (the command's start), else
from the first job. Every record is stored as it is made, so what was tuned is usable
at once. :meth:`TunePlan.coverage` is the share of GEMM time whose problems have a record.

The roofline behind the shares is a simple one: ``max(flops / peak, bytes / bandwidth)``
on a nominal device of the target's kind (:data:`ROOFLINES`); only ratios matter.
"""

from __future__ import annotations

import bisect
import functools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from unimatmul.cache.record import TuningRecord
from unimatmul.core.problem import Problem
from unimatmul.tuning.jobs import TuneJob
from unimatmul.tuning.selector import Selector

#: (bytes per second, {dtype: multiply-add flops per second}) of a nominal device of each
#: kind: an H200 (dense tensor-core peaks; f32 without TF32) and a many-core AVX-512 CPU.
ROOFLINES: dict[str, tuple[float, dict[str, float]]] = {
    "gpu": (4.8e12, {"f64": 67e12, "f32": 67e12, "bf16": 989e12, "f16": 989e12, "fp8": 1979e12}),
    "cpu": (2e11, {"f64": 1.5e12, "f32": 3e12, "bf16": 6e12, "f16": 3e12, "fp8": 6e12}),
}


def roofline_s(flops: float, nbytes: float, dtype: str, device_kind: str = "cuda") -> float:
    """Seconds a product takes on the nominal device of ``device_kind`` (cpu or a GPU)."""
    bandwidth, peaks = ROOFLINES["cpu" if device_kind == "cpu" else "gpu"]
    peak = peaks.get("fp8" if dtype.startswith("f8") else dtype, peaks["f32"])
    return max(flops / peak, nbytes / bandwidth)


def problem_seconds(problem: Problem, device_kind: str) -> float:
    """:func:`roofline_s` of one call of ``problem``."""
    return roofline_s(problem.flops, problem.min_bytes, problem.dtype_a, device_kind)


#: The expected seconds of tuning one problem, before a run has measured any: (a fixed cost,
#: calls of the problem) per device kind, times :func:`problem_seconds`. On the H200, tuning
#: Llama-3-8B's products took about 0.1 s plus 1,000 calls each (0.12-0.22 s at 64 tokens,
#: 0.58 s at 4,096); on a 2-core AMD EPYC, a small Llama's f32 products (hidden 512, 1 to
#: 1,024 tokens, NumPy and oneDNN) took about 1 s plus 1,500 calls (0.7-1.5 s up to 64
#: tokens, 2.4-3.8 s at 1,024): the CPU's harness pauses before each block and times each
#: candidate longer.
TUNE_COST: dict[str, tuple[float, float]] = {"gpu": (0.1, 1000.0), "cpu": (1.0, 1500.0)}


def expected_tune_s(problem: Problem, device_kind: str) -> float:
    """:data:`TUNE_COST`'s estimate of the seconds tuning ``problem`` takes."""
    fixed, calls = TUNE_COST["cpu" if device_kind == "cpu" else "gpu"]
    return fixed + calls * problem_seconds(problem, device_kind)


#: The fixed cost of a kernel call on a GPU (launch, ramp-up and tail), seconds: what a
#: product's :func:`prior_gain` weighs its roofline time against.
FIXED_CALL_S = 5e-6


def prior_gain(problem: Problem, device_kind: str) -> float:
    """What tuning is expected to save of ``problem``'s time before anything is measured:
    on a GPU, the share of a call that is fixed cost rather than roofline time,
    ``FIXED_CALL_S / (FIXED_CALL_S + problem_seconds)``; 1.0 on a CPU (no prior there: its
    gains measured so far follow the library, not the size)."""
    if device_kind == "cpu":
        return 1.0
    return FIXED_CALL_S / (FIXED_CALL_S + problem_seconds(problem, device_kind))


#: How much a run's first gains move the priors: the scale of :meth:`TunePlan.expected_gain`
#: is ``(sum of gains + PRIOR_WEIGHT) / (sum of their priors + PRIOR_WEIGHT)``.
PRIOR_WEIGHT = 0.02


#: Products of at most this many rows a weight (an expert's, for grouped ones) learn their
#: expected gain apart from larger ones (decode against prefill).
DECODE_ROWS = 64


@dataclass
class PlannedJob:
    """A job and its share of the workload's GEMM time (0..1 once in a plan)."""

    job: TuneJob
    share: float
    what: str = ""  # what it serves, for tables (e.g. "q_proj @ 512 tokens")
    record: TuningRecord | None = None
    source: str = ""  # "tuned" or "cache" once run

    @functools.cached_property
    def prior(self) -> float:
        """:func:`prior_gain` of its problem on its target."""
        return prior_gain(self.job.problem, self.job.target.device.kind)

    @property
    def weight(self) -> tuple[str, int, int, int, str, bool, bool]:
        """What its gain is learnt from: the weight matrix (or an MoE layer's experts, whose
        grouped kernels are not the dense ones) in one regime: decode-sized products (at
        most :data:`DECODE_ROWS` rows a weight or an expert) apart from the larger ones,
        since weight-read-bound kernels gain where compute-bound ones do not."""
        p = self.job.problem
        groups = p.batch if p.is_grouped else 1
        decode = p.m <= DECODE_ROWS * groups
        return (p.op, groups, p.n, p.k, p.dtype_a, p.trans_b, decode)


@dataclass
class LeftOut:
    """Something of the workload not tuned, its share, and why."""

    what: str
    share: float
    why: str


@dataclass
class TunePlan:
    """Jobs in the order a budget is best spent on them (see the module docstring)."""

    items: list[PlannedJob]
    left_out: list[LeftOut] = field(default_factory=list)
    budget_s: float | None = None
    cap_s: float | None = None
    by_priority: bool = True
    clock: Callable[[], float] = time.perf_counter
    started: float | None = None  # when the first job was handed out
    #: When the run began, for the budget (``clock``'s scale; the command's start, its
    #: imports included); None: the budget counts from ``started``.
    run_started: float | None = None
    # What the jobs tuned so far taught, kept by done(): the gain of each weight's problems
    # and of all, and the sum of their priors; the first tuned problem's (regime, time over
    # its estimate), and the later ones' ratios by regime, sorted.
    _gains: dict[tuple[object, ...], list[float]] = field(default_factory=dict, init=False, repr=False)
    _all_gains: list[float] = field(default_factory=list, init=False, repr=False)
    _priors_sum: float = field(default=0.0, init=False, repr=False)
    _first_ratio: tuple[bool, float] | None = field(default=None, init=False, repr=False)
    _ratios: dict[bool, list[float]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        total = sum(i.share for i in self.items) + sum(x.share for x in self.left_out)
        if total > 0:
            for item in self.items:
                item.share /= total
            for out in self.left_out:
                out.share /= total

    # --- time -------------------------------------------------------------------
    def spent_s(self) -> float:
        """Seconds of the budget spent: since the run began (or since tuning did)."""
        begun = self.run_started if self.run_started is not None else self.started
        return 0.0 if begun is None else self.clock() - begun

    def tuning_s(self) -> float:
        """Seconds since the first job was handed out."""
        return 0.0 if self.started is None else self.clock() - self.started

    def left_s(self) -> float:
        return math.inf if self.budget_s is None else self.budget_s - self.spent_s()

    def cap_for_next(self) -> float | None:
        """The most seconds the next job may take (None: no limit)."""
        cap = min(self.left_s(), self.cap_s if self.cap_s is not None else math.inf)
        return None if math.isinf(cap) else max(cap, 0.0)

    # --- order --------------------------------------------------------------------
    def expected_gain(self, item: PlannedJob) -> float:
        """The fraction of time tuning is expected to save on ``item`` (see the module
        docstring): its prior, scaled by the run's gains over their problems' priors so far
        (``(gains + c) / (priors + c)``, ``c`` = :data:`PRIOR_WEIGHT`, 1 before any), averaged
        with the gains of its weight's tuned problems, the prior counting as one of them."""
        scale = (
            (sum(self._all_gains) + PRIOR_WEIGHT) / (self._priors_sum + PRIOR_WEIGHT)
            if self._all_gains
            else 1.0
        )
        own = self._gains.get(item.weight, [])
        expected = (sum(own) + item.prior * scale) / (len(own) + 1)
        return max(expected, 1e-6)  # never 0: the share still orders them

    def expected_cost_s(self, item: PlannedJob) -> float:
        """The seconds tuning ``item`` is expected to take (see the module docstring)."""
        return self._cost_scale(item) * _estimate(item)

    def _cost_scale(self, item: PlannedJob) -> float:
        """What the problems of ``item``'s regime (decode-sized or not) tuned so far took
        over their estimate: the median, the run's first tuned problem left out (it pays the
        process's first compiles and loads); with only that one, its ratio where it is below
        1 (what it took bounds the others from above); for a regime none of whose problems
        was tuned yet, the first one's ratio where it is above 1 (its kernels are not the
        first regime's: it pays their first compiles, as the run's first problem did); 1
        before any."""
        regime = item.weight[-1]
        ratios = self._ratios.get(regime)
        if ratios:
            return ratios[len(ratios) // 2]
        if self._first_ratio is not None:
            first_regime, ratio = self._first_ratio
            return min(ratio, 1.0) if first_regime == regime else max(ratio, 1.0)
        return 1.0

    def priority(self, item: PlannedJob) -> tuple[float, float]:
        """Expected gain x share per expected second (then the share): larger first."""
        return (item.share * self.expected_gain(item) / max(self.expected_cost_s(item), 1e-6), item.share)

    def order(
        self,
        selector: Selector,
        *,
        force: bool = False,
        before: Callable[[list[PlannedJob]], None] | None = None,
    ) -> Iterator[PlannedJob]:
        """The jobs to run, one at a time: call :meth:`done` after each. Those the cache
        answers come first; the others by priority (or as given) while the budget lasts.
        ``before`` is called once, ahead of the first job, with the jobs to tune (in the
        order of their priority before any is measured): what the backends may start
        compiling for."""
        self.started = self.clock()
        pending = list(self.items)
        stored = [] if force else [i for i in pending if i.job.stored(selector) is not None]
        if stored:
            answered = {id(i) for i in stored}
            pending = [i for i in pending if id(i) not in answered]
        if before is not None:
            before(sorted(pending, key=self.priority, reverse=True) if self.by_priority else list(pending))
        for item in stored:
            yield item
        while pending:
            left = self.left_s()
            first = not self._all_gains  # nothing tuned yet
            fits = [i for i in pending if first or self.expected_cost_s(i) <= left] if left > 0 else []
            if not fits:
                for item in pending:
                    self.left_out.append(LeftOut(item.what or item.job.label, item.share, "budget spent"))
                return
            item = max(fits, key=self.priority) if self.by_priority else fits[0]
            pending.remove(item)
            yield item

    def done(self, item: PlannedJob, record: TuningRecord, source: str) -> None:
        item.record, item.source = record, source
        if source != "tuned":
            return
        gain = max(0.0, 1.0 - 1.0 / record.speedup) if record.speedup > 0 else 0.0
        self._gains.setdefault(item.weight, []).append(gain)
        self._all_gains.append(gain)
        self._priors_sum += item.prior
        if record.tune_s > 0:
            ratio = record.tune_s / _estimate(item)
            if self._first_ratio is None:
                self._first_ratio = (item.weight[-1], ratio)
            else:
                bisect.insort(self._ratios.setdefault(item.weight[-1], []), ratio)

    # --- what was covered ------------------------------------------------------------
    def coverage(self) -> float:
        """The share of the workload's GEMM time whose problems now have a record."""
        return sum(i.share for i in self.items if i.record is not None)

    def summary(self) -> str:
        """One line: the coverage, how long it took, and what was left out (why)."""
        text = f"coverage: {self.coverage():.1%} of the GEMM time tuned in {self.tuning_s():.1f} s"
        if self.budget_s is not None:
            text += f" (budget {self.budget_s:g} s"
            if self.run_started is not None and self.started is not None:
                text += f" for the whole run, {self.started - self.run_started:.1f} s of it before tuning"
            text += ")"
        reasons: dict[str, list[LeftOut]] = {}
        for out in self.left_out:
            reasons.setdefault(out.why, []).append(out)
        parts = [
            f"{len(outs)} {'product' if len(outs) == 1 else 'products'} "
            f"({sum(o.share for o in outs):.1%}): {why}"
            for why, outs in reasons.items()
        ]
        if parts:
            text += "; left out: " + "; ".join(parts)
        return text


def _estimate(item: PlannedJob) -> float:
    return expected_tune_s(item.job.problem, item.job.target.device.kind)
