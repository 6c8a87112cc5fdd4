"""The Harness: measures candidates fairly and never lets a wrong kernel win.

For each Candidate of a Problem it prepares a Runner and checks its output, element by
element, against a float64 reference (:class:`unimatmul.core.dtypes.ErrorModel`): on
poisoned memory before it is timed (on a CPU twice), and again after its first timing and
after all timing on an input set whose values were replaced in place, so that a kernel
that is right only on its first call, or that returns a stale result for the same
pointers, is caught before its times can prune anyone. On a GPU the candidates' samples
of a round are launched back to back and read after, and their checks are read back
together (one wait for all). The values
written after timing are of several characters (``structure_inputs``: ones, small
integers, mixed magnitudes, zero rows), so that a kernel wrong only on some inputs is
caught too; every checked output sits between guard bands, poisoned with its rows'
padding before each check call (``Guard``), and a write there rejects the candidate.
Each candidate's steps run within its time limit (``unimatmul.tuning.time_limit``):
past it, it is abandoned and recorded so. Survivors are
timed on inputs rotated through more memory than the last-level cache, pruning clear
losers early, within a time budget, and the median is kept. A winner over Default is
then measured again against Default, sample against sample; a win that does not hold
there, that is within the spread of the samples, or whose 95 % confidence bound from the
samples does not clear ``min_gain`` (``unimatmul.tuning.bounds``), is not stored (Default
is); among candidates within noise of the fastest, the first identity is the one held
against Default, so that runs and ranks that cannot tell them apart agree. An
unstable measurement is marked ``confidence: low`` in the record's settings. A problem may
have a time cap (``cap_s``, ``UNIMATMUL_TUNE_CAP_S``): candidates not started when it is
spent are left out of the record (``settings["capped"]``), Default never.

Memory is bounded (``UNIMATMUL_TUNE_MEMORY``): a product larger than the rotation target
(twice the last-level cache) may take a multiple of its own operands plus that target,
a smaller one the sets it rotates through and the check; never more than 3/4 of the free
memory. A product that cannot be tuned within that raises :class:`TuningTooLarge` before
anything is allocated.

Device timing lives behind the :class:`Timer` protocol (a CPU clock here; CUDA/HIP
graphs and events in ``unimatmul.tuning.timers``).
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from unimatmul import settings as env
from unimatmul._version import __version__
from unimatmul.cache.record import ABANDONED, FAILED, OK, PRUNED, REJECTED, CandidateResult, TuningRecord
from unimatmul.core._backend import DEFAULT, Candidate, Runner, Target, preparing_until
from unimatmul.core.arrays import SCREEN_ELEMENTS, Operands, make_operands, operand_bytes, operand_layouts
from unimatmul.core.dtypes import ITEMSIZE, ErrorModel, scaled_tolerance, tolerance
from unimatmul.core.errors import NotReady, UnimatmulError, UnsupportedProblem
from unimatmul.core.grouped import (
    DISTRIBUTIONS,
    GroupedOperands,
    call_lending,
    group_products,
    grouped_layouts,
    grouped_operand_bytes,
    make_grouped_operands,
    plain_grouped_call,
    timed_parts,
)
from unimatmul.core.notices import size_text
from unimatmul.core.problem import Problem
from unimatmul.core.scales import ScaledOperands, dequantised, make_scaled_operands, scaled_error_model
from unimatmul.tuning import numeric_check
from unimatmul.tuning.bounds import ratio_bounds, speedup_bounds, within_noise
from unimatmul.tuning.conditions import read_device_state
from unimatmul.tuning.numeric_check import (
    GUARD_VALUES,
    Check,
    Guard,
    PartsReference,
    Reference,
    guard_bytes,
    guarded_output,
    structure_inputs,
)
from unimatmul.tuning.quiet import wait_quiet
from unimatmul.tuning.time_limit import OverLimit, run_inline, run_within

#: What a plugin's code may raise that makes its candidate FAILED. ``SystemExit`` from a
#: kernel is the plugin's failure, not a request to end the user's program;
#: ``KeyboardInterrupt`` is the user's, and stops tuning (nothing is stored).
PLUGIN_FAILURES: tuple[type[BaseException], ...] = (Exception, SystemExit)

#: The most the element-wise bound is widened to let Default's own error through.
MAX_WIDEN = 64.0
#: Rotated sets that together take less than this stay in a core's L2 whatever their order.
TINY_ROTATION_BYTES = 2 << 20

#: The note of a candidate left out because its problem's cap (``cap_s``) was spent.
CAPPED = "not measured: the problem's time cap was spent"

# Confidence of a record (settings["confidence"]).
HIGH, LOW = "high", "low"


class TuningTooLarge(UnimatmulError):
    """Tuning this Problem would take more memory than it may (see the module docstring)."""

    def __init__(self, msg: str, *, problem: Problem, needed: int, allowed: int) -> None:
        super().__init__(msg)
        self.problem = problem
        self.needed = needed
        self.allowed = allowed


class Timer(Protocol):
    """Times back-to-back calls on one device's own clock.

    ``prepare`` receives one call per rotated input set, already bound to its inputs,
    and returns a function that takes one sample: it runs calls (cycling through the
    sets) and returns the seconds per call, measured on the device's clock. A device
    timer's sample may also be launched and read later (``sample.launch()`` returns the
    read), and the timer may offer ``prepare_within(calls, call_s)``: a sampler made
    without waiting for the device, for calls of at most ``call_s`` seconds, or None
    (see ``Harness._warmed_up``).
    """

    name: str

    def prepare(self, calls: Sequence[Callable[[], None]]) -> Callable[[], float]: ...


class CpuTimer:
    """A monotonic host clock: right for CPU kernels, which run synchronously."""

    name = "cpu-perf-counter"

    def __init__(self, min_sample_s: float = 1e-4) -> None:
        # 0.1 ms is a thousand ticks of perf_counter (~0.1 us) and short enough that a
        # small product's 20 samples cost 2 ms; a sample is the median's unit, and the
        # median of 20 shrugs off the one a timer interrupt lands in.
        self.min_sample_s = min_sample_s
        # Calls of every sampler so far: the set a call uses follows the last call of any
        # candidate, never the set the candidate before it just used.
        self._calls = 1

    def prepare(self, calls: Sequence[Callable[[], None]]) -> Callable[[], float]:
        # The first call pays for first touches and lazy set-up: it is not timed. A
        # sample runs calls, cycling through the sets, until it has lasted min_sample_s
        # (one call at least). Reading the clock after every call costs ~0.1 us, the same
        # for every candidate; a count calibrated from one call instead overshoots badly
        # when that call happened to be quick (a thread pool on a busy machine: 5 us
        # once, 130 us after). The sets rotate across samplers (candidates taking turns):
        # with a position of its own, a candidate measured right after another ran on
        # the set that one had just brought into the caches whenever their positions
        # matched, which they did in some processes and not in others (oneDNN's brgemm
        # kernel for 12x128x64x128 on a 2-vCPU VM: 123-185 us, or 187-235 us).
        count = len(calls)
        calls[0]()
        min_sample_s = self.min_sample_s
        clock = time.perf_counter

        def sample() -> float:
            start = self._calls
            i = start % count
            done = 0
            t0 = clock()
            while True:
                calls[i]()
                i = i + 1 if i + 1 < count else 0
                done += 1
                elapsed = clock() - t0
                if elapsed >= min_sample_s:
                    break
            self._calls = start + done
            return elapsed / done

        return sample


@dataclass
class HarnessConfig:
    """How hard to measure: the harness's configuration (not the ``UNIMATMUL_*`` settings,
    nor a record's ``settings``; see docs/tuning.md). Defaults suit the CPU; GPU callers
    pass their own."""

    warmup: int = 2
    min_samples: int = 5
    max_samples: int = 40
    budget_s: float = 0.25  # measuring time per candidate, after the numeric check
    prune_ratio: float = 1.3  # a candidate this much slower than the best stops early
    first_prune_ratio: float = 5.0  # ... and this much slower on its first timed call, at once
    # GPU (interleave): ... and this much slower than the best in the first round of samples
    # (taken after every candidate's warm-up, and checked on new inputs before it prunes)
    round_prune_ratio: float = math.inf
    # GPU (interleave): ... and, once it has min_samples, a candidate none of whose samples
    # came within tie_ratio of the best median: it is not the fastest, and its median is
    # past the ties' bound (see tie_ratio), so more samples of it only cost time
    prune_untied: bool = False
    interleave: bool = False  # GPU: rounds across candidates; CPU: turns within a backend (see _time)
    settle_s: float = 0.2  # CPU: longest pause before a backend's samples (other pools spinning)
    stall_s: float = 0.01  # CPU: a pause outlasting a stall (a host's tick), before a prune is made sure of
    # ... only for products of at least this many multiply-adds: smaller ones run on one
    # thread in OpenBLAS, MKL and oneDNN alike, so no pool is left spinning.
    settle_min_macs: int = 1 << 18
    min_gain: float = 0.01  # a winner must beat Default by this fraction, else Default
    # ... and its samples must say so at this confidence (unimatmul.tuning.bounds); the
    # same level decides which candidates are within noise of the fastest.
    confidence_level: float = 0.95
    # Within noise of the fastest: not clearly slower than it by more than tie_gain (at
    # confidence_level), and a median at most tie_ratio times its.
    tie_gain: float = 0.01
    tie_ratio: float = 1.02
    confirm_pairs: int = 5  # samples of the winner and of Default, taken in turns, to confirm a win
    confirm_rounds: int = 2  # confirmations before an unconfirmed win is called noise
    max_confirm_rounds: int = 6  # ... and at most, while it holds but its bound is not clear yet
    noise_spread: float = 0.25  # a relative spread of samples above this is an unstable measurement
    busy_load: float = 1.0  # CPU: a load average above this many per CPU marks a record low-confidence
    rotate_bytes: int | None = None  # inputs rotated through this much memory
    max_rotation_bytes: int = 1 << 30
    # Enough sets that a small product's rotation reaches twice the last-level cache (a
    # 1.5 MB batched product on a 32 MB cache: 43; 16 held it at 24 MB, inside the cache).
    max_sets: int = 64
    memory_factor: float | None = None  # None: UNIMATMUL_TUNE_MEMORY
    memory_fraction: float = 0.75  # of the memory free when tuning starts
    limit_s: float | None = None  # a candidate's time limit, at least (None: UNIMATMUL_TUNE_LIMIT_S)
    limit_ratio: float | None = None  # ... or this multiple of Default's (None: UNIMATMUL_TUNE_LIMIT_RATIO)
    seed: int = 0x5EED

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@functools.cache  # the hardware does not change while the process runs
def last_level_cache_bytes() -> int:
    """The largest CPU cache this process sees (sysfs), or 32 MiB when unreadable."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    for index in range(8):
        try:
            with open(f"{base}/index{index}/size", encoding="ascii") as fh:
                text = fh.read().strip()
        except OSError:
            continue
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        value = int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)
        best = max(best, value)
    return best or (32 << 20)


@dataclass
class _Entry:
    candidate: Candidate
    runner: Runner | None = None
    result: CandidateResult = field(default_factory=lambda: CandidateResult("", OK))
    sample: Callable[[], float] | None = None
    times: list[float] = field(default_factory=list)
    spent_s: float = 0.0
    check: Check | None = None
    limit: _Limit | None = None
    used_s: float = 0.0  # wall time of its steps so far, for its time limit

    def median(self) -> float:
        return statistics.median(self.times) if self.times else math.inf


def spread(values: Sequence[float]) -> float:
    """Relative spread of samples: interquartile range over the median (0 for < 4 samples)."""
    finite = sorted(v for v in values if math.isfinite(v))
    if len(finite) < 4:
        return 0.0

    def quantile(q: float) -> float:  # linear between order statistics ("inclusive")
        at = q * (len(finite) - 1)
        low = int(at)
        high = min(low + 1, len(finite) - 1)
        return finite[low] + (finite[high] - finite[low]) * (at - low)

    mid = quantile(0.5)
    return (quantile(0.75) - quantile(0.25)) / mid if mid > 0 else math.inf


@dataclass
class _Pending:
    """A check call launched and not read (Harness._check_launch): its comparison's one
    pass and the guard bands' count of changed elements (None: no guard)."""

    launched: numeric_check.Launched
    guard_count: Any


@dataclass
class _GuardBatch:
    """The guard bands of checks launched one after another and read back at once
    (:meth:`Harness._read_checks`), all with one poison value: each guard is poisoned
    before the batch's first call on its output and counted once, after the batch's last
    call, instead of once a call. Where a count is not zero, every check of the batch is
    made again on its own (poisoned and counted for its call alone), which says whose
    write it was. A guard replaced during the batch (an output renewed after an abandoned
    call) is poisoned at its first use and counted too, as is the one it replaced."""

    poison: int
    guards: list[Guard] = field(default_factory=list)
    launched: int = 0  # checks launched since the guards were poisoned

    def poisoned(self, guard: Guard) -> None:
        if not any(g is guard for g in self.guards):
            numeric_check.poison_guard(guard, GUARD_VALUES[self.poison])
            self.guards.append(guard)

    def counts(self, adapter: Any) -> list[Any]:
        """Each guard's count of changed elements, launched and not read."""
        value = GUARD_VALUES[self.poison]
        return [numeric_check.guard_count(adapter, g, value) for g in self.guards] if self.launched else []


@dataclass
class _LateCheck:
    """The check made after timing: a rotated set whose inputs got new values in place."""

    ops: Operands
    c0: Any
    reference: Reference | PartsReference
    alpha: float
    beta: float
    widen: float
    target: Target
    guards: dict[int, Guard] | None = None  # by id(ops): looked up at each check (renewed outputs)
    # A grouped set's (checked, timed) offs: the check's distribution goes in for the check
    # only, so that the set is timed on the distribution it was made with.
    offs: tuple[Any, Any] | None = None


@dataclass
class _Limit:
    """The time limit of the candidates of one run (see ``unimatmul.tuning.time_limit``).

    A candidate may take ``ratio`` times Default's time over the same steps, and never
    less than ``absolute_s`` (first-call set-up, a busy machine); Default has none (it is
    what the caller runs anyway). On the CPU each step runs on a worker thread and is
    abandoned at the limit; on a GPU (``worker`` False) it is judged once it returns.
    """

    absolute_s: float
    ratio: float
    worker: bool
    default_s: float = 0.0  # Default's time over its steps so far

    def allowance(self, entry: _Entry) -> float:
        if entry.candidate == DEFAULT:
            return math.inf
        return max(self.absolute_s, self.ratio * self.default_s) - entry.used_s

    def run(self, entry: _Entry, step: Callable[[], Any], *, judged: bool = True) -> Any:
        """``step()`` within what is left of ``entry``'s limit; OverLimit past it. A step
        not ``judged`` (a GPU candidate's preparation, where the limit could only be
        applied once it is over) runs without one and counts for nothing."""
        if not judged:
            return step()
        allowed = self.allowance(entry)
        started = time.perf_counter()
        try:
            if self.worker:
                return run_within(step, allowed)
            return run_inline(step, allowed)
        finally:
            self.account(entry, time.perf_counter() - started)

    def account(self, entry: _Entry, seconds: float) -> None:
        entry.used_s += seconds
        if entry.candidate == DEFAULT:
            self.default_s += seconds

    def abandon(self, entry: _Entry, exc: OverLimit, when: str) -> None:
        entry.result.status = ABANDONED
        entry.result.note = (
            f"abandoned {when}: {exc} (its limit: {env.TUNE_LIMIT_S.name}={self.absolute_s:g} s "
            f"or {env.TUNE_LIMIT_RATIO.name}={self.ratio:g} x Default's time, whichever is more)"
        )


@dataclass
class MemoryPlan:
    """What one tuning run of a Problem may allocate, and how many input sets that allows."""

    per_set: int
    check: int
    allowed: int
    sets: int
    available: int | None
    factor: float
    keep_bounds: bool = False  # the check keeps each block's bound (numeric_check._within)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Harness:
    """Measures Candidates of one Problem on one Target and returns a TuningRecord."""

    def __init__(self, timer: Timer, settings: HarnessConfig | None = None) -> None:
        self.timer = timer
        self.settings = settings or HarnessConfig()
        # perf_counter() time after which no further candidate starts (measure's cap_s).
        self._deadline = math.inf

    # --- the whole run --------------------------------------------------------------------
    def measure(
        self,
        problem: Problem,
        target: Target,
        entries: Sequence[tuple[Candidate, Callable[[], Runner]]],
        *,
        alpha: float = 1.0,
        beta: float = 0.0,
        versions: dict[str, str] | None = None,
        progress: Callable[[str], None] | None = None,
        cap_s: float | None = None,
    ) -> TuningRecord:
        """Check and time each (candidate, prepare) pair; Default must be among them.

        ``cap_s``: once this many seconds have passed, candidates not started yet are not
        measured (Default always is); the record says how many were left out
        (``settings["capped"]``). None: ``UNIMATMUL_TUNE_CAP_S``, else no cap.

        Raises :class:`TuningTooLarge` (before allocating anything) when the product
        cannot be tuned within the memory bound.
        """
        started = time.perf_counter()
        if cap_s is None:
            cap_s = env.TUNE_CAP_S.get()
        self._deadline = started + cap_s if cap_s is not None else math.inf
        settings = self.settings
        adapter, device = target.adapter, target.device
        rng = np.random.default_rng(settings.seed)
        if beta == 0.0 and not problem.beta_zero:
            beta = 1.0
        plan = self.plan_memory(problem, target, beta)
        # Default alone (no backend offers a candidate): there is nothing to choose, so its
        # time is measured on one set, and nothing is checked against a reference (what a
        # check says of Default decides only how far others may be off). A grouped
        # product of 128 experts on a CPU took 30 s before, for the same record.
        alone = all(candidate == DEFAULT for candidate, _ in entries)
        sets = self._operand_sets(problem, target, rng, 1 if alone else plan.sets, beta)
        guards = self._guard(problem, target, sets, rng, beta, {})
        limit = _Limit(
            settings.limit_s if settings.limit_s is not None else env.TUNE_LIMIT_S.get(),
            settings.limit_ratio if settings.limit_ratio is not None else env.TUNE_LIMIT_RATIO.get(),
            worker=device.kind == "cpu",
        )

        def renew(used: Sequence[Operands]) -> None:
            # An abandoned call may still write into these outputs: the others get new ones.
            self._guard(problem, target, used, rng, beta, guards, renewing=True)

        first = sets[0]
        model = _error_model(problem)
        c0 = None
        if beta != 0.0:
            c0 = adapter.empty(tuple(adapter.shape(first.out)), problem.dtype_c, device)
            adapter.copy_(c0, first.out)
        reference: Any = (
            None if alone else reference_of(problem, target, first, c0, alpha, beta, model, plan.keep_bounds)
        )

        # 1. Prepare every candidate and check it on poisoned memory. Measured in blocks
        #    (a CPU), a second call must write every element too: a kernel that does
        #    nothing on its second call must not be timed (it would look fastest and prune
        #    the right ones). In rounds (a GPU) nothing is pruned before every candidate
        #    is checked again on new inputs after its first timed sample (_sample_rounds),
        #    so one call is checked here, and the checks are read back together (one wait
        #    for all of them, not one a candidate: _check_launch).
        batched = settings.interleave
        calls = 1 if batched else 2
        tried: list[_Entry] = []
        results: list[CandidateResult] = []
        pending: list[tuple[_Entry, _Pending]] = []
        batch = _GuardBatch(0)

        def checks(
            entry: _Entry, c0: Any = c0, reference: Reference | PartsReference = reference, *, launch: bool
        ) -> None:
            assert entry.runner is not None
            if launch:
                found = self._check_launch(
                    entry.runner, first, c0, reference, alpha, beta, target, guards[id(first)], 0, batch
                )
                if isinstance(found, _Pending):
                    pending.append((entry, found))
                    return
                entry.check = found
                return
            for poison in range(calls):
                # The second call (beta = 0: on an output poisoned with NaN) must write
                # every element and nothing outside; its values are compared in full on
                # new inputs once it is timed, before its timed samples can prune anyone,
                # and again after all timing. A full compare here would repeat the first
                # on the same inputs, at several passes over the output.
                found = self._check_call(
                    entry.runner, first, c0, reference, alpha, beta, target, guards[id(first)], poison,
                    full=poison == 0 or beta != 0.0,
                )  # fmt: skip
                entry.check = found if entry.check is None else _worse(entry.check, found)

        def checked_once(entry: _Entry, step: Callable[[], None], prepare: Callable[[], None] | None) -> None:
            """``step`` (with ``prepare`` first) within the entry's limit; the entry's result
            says what went wrong, if anything."""
            try:
                if prepare is not None and limit.worker:  # one step on the worker thread
                    limit.run(entry, functools.partial(_both, prepare, step))
                else:
                    if prepare is not None:  # a GPU's preparation (compiling) is not held against it
                        limit.run(entry, prepare, judged=False)
                    limit.run(entry, step)
            except NotReady:
                entry.result.status, entry.result.note = PRUNED, CAPPED
            except UnsupportedProblem as exc:
                entry.result.status, entry.result.note = FAILED, f"unsupported: {exc}"
            except OverLimit as exc:
                limit.abandon(entry, exc, "while prepared and checked")
                renew([first])
            except PLUGIN_FAILURES as exc:
                entry.result.status, entry.result.note = FAILED, _failure(exc)

        for candidate, prepare in entries:
            entry = _Entry(candidate, limit=limit)
            entry.result = CandidateResult(candidate.identity, OK)
            results.append(entry.result)
            if progress is not None:
                progress(candidate.identity)
            if self._past_deadline(entry):
                continue

            def prepared(entry: _Entry = entry, prepare: Callable[[], Runner] = prepare) -> None:
                # A prepare() waiting for a compile gives up at the cap (NotReady).
                with preparing_until(self._deadline):
                    entry.runner = prepare()

            tried.append(entry)
            checked_once(
                entry, _nothing if alone else functools.partial(checks, entry, launch=batched), prepared
            )

        # The launched checks read back at once; one that the quick pass cannot clear (an
        # element out of bounds, a write outside) is checked again whole, on its own.
        found_all = self._read_checks(target, [p for _, p in pending], batch)
        for (entry, _), found in zip(pending, found_all, strict=True):
            if found is None:
                checked_once(entry, functools.partial(checks, entry, launch=False), None)
            else:
                entry.check = found
        pending.clear()
        checked: list[_Entry] = []
        for entry in tried:
            if entry.result.status == OK and entry.check is not None:
                entry.result.error = entry.check.rel_error
                checked.append(entry)
        # Default is what the caller gets anyway: if it is further from the reference
        # than the model allows, the model is too strict here, and every candidate
        # gets Default's own margin (a wrong element is still orders of magnitude out),
        # up to MAX_WIDEN: a Default further out than that is wrong itself.
        default_check = next((e.check for e in checked if e.candidate == DEFAULT), None)
        widen = 1.0
        if default_check is not None and default_check.nonfinite == 0 and default_check.worst_ratio > 1.0:
            widen = min(2.0 * default_check.worst_ratio, MAX_WIDEN)
        # Default alone is not checked: it is measured as it is.
        measured: list[_Entry] = [e for e in tried if e.result.status == OK] if alone else []
        for entry in checked:
            assert entry.check is not None
            if not entry.check.ok(widen) and not entry.check.counted:
                # Out of bounds in one pass: checked again whole, for the note's count and
                # worst element (and nothing else decides it).
                entry.check = None
                checked_once(entry, functools.partial(checks, entry, launch=False), None)
                if entry.result.status != OK or entry.check is None:
                    continue
            if entry.check.ok(widen):
                measured.append(entry)
            else:
                entry.result.status = REJECTED
                entry.result.note = entry.check.describe(widen)
            entry.result.error = entry.check.rel_error
        del checks, checked_once  # they hold the reference, freed below

        # 2. Time the survivors; each is checked again right after its timing, on a set
        #    whose inputs got new values in place (before its times can prune anyone).
        del reference, c0
        late = (
            self._late_check_set(
                problem, target, sets, rng, alpha, beta, model, widen, plan.keep_bounds, guards=guards
            )
            if measured and not alone and not self._only_default_timed(measured)
            else None
        )
        settle = settings.settle_s if _macs(problem) >= settings.settle_min_macs else 0.0
        self._time(measured, sets, target, alpha, beta, settle, late, renew)
        # Read right after the last sample, while clocks still reflect the load.
        device_state = read_device_state(device)

        # 3. Once every candidate has been timed, new values in the same memory again:
        #    a kernel that remembers results by address has seen the last ones.
        del late
        survivors = [e for e in measured if e.result.status == OK]
        if survivors and not alone and not self._only_default_timed(measured):
            final = self._late_check_set(
                problem, target, sets, rng, alpha, beta, model, widen, plan.keep_bounds, 1, guards
            )
            if settings.interleave:
                self._late_checks(survivors, final, "after all timing", renew)
            else:
                for entry in survivors:
                    self._late_check(entry, final, "after all timing", renew)
            del final

        # 4. Choose: the canonical pick among the candidates within noise of the fastest;
        #    if its median beats Default's, the repeat and the bound decide (_confirm).
        default_entry = next((e for e in measured if e.candidate == DEFAULT and e.result.status == OK), None)
        verdict: dict[str, Any] = {}
        win: dict[str, Any] = {}
        winner, winner_s = DEFAULT.identity, math.inf
        ok = [e for e in measured if e.result.status == OK and e.times]
        if ok:
            best, win = self._pick(ok)
            if default_entry is not None and best is not default_entry:
                # After a settling pause Default's block and the kernels' turns were taken
                # at different moments of the machine: unless the pick is further behind
                # than a slow moment can explain, the repeat decides, in blocks of each.
                behind = settings.first_prune_ratio if settle > 0 else 1.0 - settings.min_gain
                if best.median() > default_entry.median() * behind:
                    low, high = speedup_bounds(default_entry.times, best.times, settings.confidence_level)
                    win.update(_win_bounds(low, high))
                    best = default_entry  # not a win: keep what the user would have had
                else:
                    try:
                        parts = self._parts_by_distribution(problem, sets, best, default_entry, alpha, beta)
                        best, verdict, bounds = limit.run(
                            best, lambda: self._confirm(best, default_entry, settle, parts)
                        )
                        win.update(_win_bounds(*bounds))
                    except OverLimit as exc:
                        limit.abandon(best, exc, "while its win was measured again")
                        renew(sets)
                        best, verdict = (
                            default_entry,
                            {"candidate": best.candidate.identity, "verdict": "abandoned"},
                        )
            winner, winner_s = best.candidate.identity, best.median()
        default_s = default_entry.median() if default_entry is not None else None
        for entry in measured:
            entry.result.samples = len(entry.times)
            if entry.times:
                entry.result.median_s = entry.median()
        if default_entry is None:
            # Default failed or was rejected: what it measured, if anything, is not a baseline.
            default_s = None

        noise = {
            e.candidate.identity: round(spread(e.times), 4)
            for e in (default_entry, next((e for e in ok if e.candidate.identity == winner), None))
            if e is not None
        }
        unstable = any(v > settings.noise_spread for v in noise.values())
        # A CPU shared with more runnable threads than it has cores times the load, not
        # the kernels (a thread pool waits a whole time slice for a descheduled worker).
        load = _cpu_load() if device.kind == "cpu" else None
        busy = (
            load is not None
            and load[0] > settings.busy_load * load[1]
            and not math.isinf(settings.noise_spread)
        )
        why = [
            reason
            for reason, present in (
                ("spread", unstable),
                ("disagree", verdict.get("agree") is False),
                ("busy", busy),
            )
            if present
        ]
        confidence = LOW if why else HIGH

        # Every record carries these. A cache file stores one copy of each distinct
        # settings map, so a high-confidence record keeps no numbers of its own here
        # (its times are the confirmation's already); what explains a low-confidence
        # one is kept in full.
        record_settings = settings.to_dict()
        record_settings.update(
            timer=self.timer.name,
            sets=len(sets),
            tolerance=(
                scaled_tolerance(problem.dtype_c, problem.fast_accum)
                if problem.is_scaled
                else tolerance(problem.dtype_c, problem.compute)
            ),
            check=(
                {"model": "none", "why": "Default alone: nothing to choose"}
                if alone
                else {
                    "model": "elementwise",
                    "calls": calls + 2,
                    "inputs": "normal, structured",
                    "guarded": True,
                }
            ),
            limit_s=limit.absolute_s,
            limit_ratio=limit.ratio,
            settled=settle > 0,
            confidence=confidence,
        )
        if widen != 1.0:
            record_settings["check"]["widen"] = round(widen, 3)
        if "low" in win:
            if win["candidate"] == winner and win["low"] is not None and default_s:
                # The record may keep the smaller of two claims (see _confirm): the bound
                # never says more than the record's own speedup.
                win["low"] = min(win["low"], round(default_s / winner_s, 4))
            record_settings["win"] = win
        if verdict:
            # "repeat", not "confirm": that key is the in-situ verdict (unimatmul.tuning.confirm).
            kept = {k: verdict[k] for k in ("verdict", "by_distribution") if k in verdict}
            record_settings["repeat"] = verdict if why else kept
        capped = sum(1 for r in results if r.note == CAPPED)
        if capped:
            record_settings["capped"] = {"cap_s": round(cap_s or 0.0, 3), "left_out": capped}
        if why:
            record_settings.update(low_because=why, noise=noise)
            if load is not None:
                record_settings["load"] = {"avg1": round(load[0], 2), "cpus": load[1], "busy": busy}
        if default_check is not None:
            record_settings["default_error"] = default_check.rel_error
        return TuningRecord(
            problem=problem.key,
            winner=winner,
            winner_s=winner_s,
            default_s=default_s,
            results=results,
            versions=dict(versions or {}),
            tuned_at=time.time(),
            tune_s=time.perf_counter() - started,
            settings=record_settings,
            writer=f"unimatmul {__version__}",
            device_state=device_state,
        )

    # --- memory ---------------------------------------------------------------------------
    def plan_memory(self, problem: Problem, target: Target, beta: float) -> MemoryPlan:
        """How many input sets fit the memory bound; TuningTooLarge if not even one does."""
        settings = self.settings
        adapter, device = target.adapter, target.device
        per_set = max(grouped_operand_bytes(problem) if problem.is_grouped else operand_bytes(problem), 1)
        out_elements = _out_elements(problem)
        block = adapter.block_elements(device, reference=True, total=out_elements)
        check = _check_bytes(problem, beta, block)
        if out_elements > SCREEN_ELEMENTS:  # a screened output: two temporaries a screen block
            screen = adapter.block_elements(device, screen=True, total=out_elements)
            check += 2 * screen * _ref_itemsize(problem)
        factor = settings.memory_factor if settings.memory_factor is not None else env.TUNE_MEMORY.get()
        rotate = min(settings.rotate_bytes or 2 * last_level_cache_bytes(), settings.max_rotation_bytes)
        wanted = max(1, min(math.ceil(rotate / per_set), settings.max_sets))
        if wanted * per_set < TINY_ROTATION_BYTES:
            # Sets that all fit in one core's L2 are cached whatever their order: more
            # of them only cost the time to fill them. Two still let the check after
            # timing use a set other than the first.
            wanted = min(wanted, 2)
        if problem.is_grouped:
            # One a part at least: the timed sets take turns of two distributions, in the
            # m form over all rows and fewer (_operand_sets), and a choice timed on one part
            # alone may lose on another.
            wanted = max(wanted, min(len(timed_parts(problem)), settings.max_sets))
        # The check may keep the output's bounds (numeric_check._within): a few launches a
        # check instead of dozens. Taken where they cost no rotated set.
        bounds = _bounds_bytes(problem)
        bands, indices = guard_bytes(*_layouts(problem)["c"], problem.dtype_c)
        check += indices + wanted * bands  # the outputs' guard bands (Harness._guard)
        if per_set < rotate:
            # A product smaller than the rotation target gets the sets it rotates through
            # and the check: its multiple would not even hold the check's blocks.
            allowed = max(int(factor * per_set), wanted * per_set + check + bounds)
        else:
            # A larger one (one set) its multiple, plus the rotation target as room for
            # the check's fixed-size blocks: the multiple is what bounds it.
            allowed = int(factor * per_set) + rotate
        available = adapter.available_bytes(device)
        if available is not None:
            allowed = min(allowed, int(settings.memory_fraction * available))
        sets_without = min(wanted, (allowed - check) // per_set)
        keep_bounds = bounds > 0 and (allowed - check - bounds) // per_set >= max(sets_without, 1)
        if keep_bounds:
            check += bounds
        room = (allowed - check) // per_set
        if room < 1:
            where = (
                f"{factor:g} x the product's {size_text(per_set)} ({env.TUNE_MEMORY.name}) "
                f"+ {size_text(rotate)} to rotate inputs through the cache"
            )
            if available is not None:
                where += f", and {settings.memory_fraction:.0%} of the {size_text(available)} free"
            msg = (
                f"tuning {problem.shape_text} {problem.dtype_a} needs {size_text(per_set + check)} "
                f"(one set of operands {size_text(per_set)}, the numeric check {size_text(check)}), "
                f"more than the {size_text(max(allowed, 0))} it may take: {where}"
            )
            raise TuningTooLarge(msg, problem=problem, needed=per_set + check, allowed=allowed)
        count = min(wanted, room)
        return MemoryPlan(per_set, check, allowed, count, available, factor, keep_bounds)

    def _operand_sets(
        self,
        problem: Problem,
        target: Target,
        rng: np.random.Generator,
        count: int | None = None,
        beta: float = 1.0,
    ) -> list[Operands]:
        if count is None:
            count = self.plan_memory(problem, target, beta).sets
        if problem.is_scaled:
            return [make_scaled_operands(problem, target.adapter, target.device, rng) for _ in range(count)]
        if problem.is_grouped:
            # The timed sets take turns of the parts: a choice is timed on each.
            parts = timed_parts(problem)
            turns = [parts[i % len(parts)] for i in range(count)]
            return [
                make_grouped_operands(problem, target.adapter, target.device, rng, name, fill=fill)
                for name, fill in turns
            ]
        # With beta = 0 the output is never read: no random numbers for it.
        return [
            make_operands(problem, target.adapter, target.device, rng, fill_out=beta != 0.0)
            for _ in range(count)
        ]

    def _guard(
        self,
        problem: Problem,
        target: Target,
        sets: Sequence[Operands],
        rng: np.random.Generator,
        beta: float,
        guards: dict[int, Guard],
        *,
        renewing: bool = False,
    ) -> dict[int, Guard]:
        """Give each set a new output with guard bands around it (``guards``, by id of the
        set, gets their guards): its values copied over when beta != 0, new random ones
        when ``renewing`` (the old output may still be written by an abandoned call)."""
        adapter, device = target.adapter, target.device
        shape, strides = _layouts(problem)["c"]
        offset = problem.align // ITEMSIZE[problem.dtype_c] if problem.align < 16 else 0
        like = next(iter(guards.values()), None)
        for ops in sets:
            fill = renewing and beta != 0.0
            out, like = guarded_output(
                adapter, shape, strides, problem.dtype_c, device, rng, offset, fill=fill, like=like
            )
            if beta != 0.0 and not renewing:
                adapter.copy_(out, ops.out)
            ops.out = out
            guards[id(ops)] = like
        return guards

    # --- the numeric check ------------------------------------------------------------------
    def _check_launch(
        self,
        runner: Runner,
        ops: Operands,
        c0: Any,
        reference: Reference | PartsReference,
        alpha: float,
        beta: float,
        target: Target,
        guard: Guard | None = None,
        poison: int = 0,
        batch: _GuardBatch | None = None,
    ) -> _Pending | Check:
        """The work of :meth:`_check_call` (``full``) launched, with the comparison's one
        pass and the guard bands' count left unread (:meth:`_read_checks` reads those of
        several calls at once, one wait for all); the :class:`Check` itself where that
        pass cannot decide alone (``numeric_check.compare_launch``: a screened output, a
        reference on the host). Later calls on the same output run after this one's
        comparison: the device's stream orders them. With a ``batch`` (of ``poison``'s
        value) the guard is poisoned and counted for the batch, not for this call alone."""
        if batch is not None and guard is not None:
            batch.poisoned(guard)
        else:
            batch = None  # no guard: nothing to count for a batch
        count = self._poisoned_call(
            runner, ops, c0, alpha, beta, target, guard if batch is None else None, poison
        )
        launched = numeric_check.compare_launch(target.adapter, ops.out, reference, target.device)
        if launched is not None:
            if batch is not None:
                batch.launched += 1
            return _Pending(launched, count)
        if batch is not None and guard is not None:
            if batch.launched:
                # Launched calls of the batch may have written these bands: this one again alone.
                return self._check_call(runner, ops, c0, reference, alpha, beta, target, guard, poison)
            # Compared now: the bands, poisoned just before this call, counted for it alone,
            # and poisoned again before the next.
            count = numeric_check.guard_count(target.adapter, guard, GUARD_VALUES[poison])
            batch.guards = [g for g in batch.guards if g is not guard]
        return self._with_writes(
            compare_output(target, ops, ops.out, reference), target, guard, poison, count
        )

    def _read_checks(
        self, target: Target, pending: Sequence[_Pending], batch: _GuardBatch | None = None
    ) -> list[Check | None]:
        """The checks of ``pending`` (:meth:`_check_launch`), read back in one transfer: a
        :class:`Check` for each whose every element is within its bound and that wrote
        nothing outside its output; None for the others (and for every one if the read
        fails: an error of one call surfaces there; or if the guards of their ``batch``
        count a write outside), which the caller checks again whole, one by one, to say
        how far off and where."""
        if not pending:
            return []
        scalars: list[Any] = []
        for p in pending:
            scalars += p.launched.scalars
            if p.guard_count is not None:
                scalars.append(p.guard_count)
        shared = batch.counts(target.adapter) if batch is not None else []
        try:
            values = target.adapter.scalars(scalars + shared)
        except PLUGIN_FAILURES:
            return [None] * len(pending)
        if any(v != 0 for v in values[len(scalars) :]):
            return [None] * len(pending)
        found: list[Check | None] = []
        start = 0
        for p in pending:
            count = len(p.launched.scalars)
            check = p.launched.verdict(values[start : start + count])
            start += count
            if p.guard_count is not None:
                if values[start] != 0:
                    check = None
                start += 1
            found.append(check)
        return found

    def _check_call(
        self,
        runner: Runner,
        ops: Operands,
        c0: Any,
        reference: Reference | PartsReference,
        alpha: float,
        beta: float,
        target: Target,
        guard: Guard | None = None,
        poison: int = 0,
        *,
        full: bool = True,
    ) -> Check:
        """Poison the output (C copied in when beta != 0) and, with a ``guard``, the memory
        around it (``GUARD_VALUES[poison]``); run once; compare, and look for writes outside.
        ``full=False`` (beta = 0 only): check only that every element was written (no NaN or
        inf is left), comparing in full only where one is."""
        count = self._poisoned_call(runner, ops, c0, alpha, beta, target, guard, poison)
        if full or not numeric_check.all_finite(target.adapter, ops.out, reference, target.device):
            found = compare_output(target, ops, ops.out, reference)
        else:
            found = Check(0.0, 0.0, 0, 0)  # no element over its bound that a NaN check can see
        return self._with_writes(found, target, guard, poison, count)

    def _poisoned_call(
        self,
        runner: Runner,
        ops: Operands,
        c0: Any,
        alpha: float,
        beta: float,
        target: Target,
        guard: Guard | None,
        poison: int,
    ) -> Any:
        """A check's call: the output poisoned (C copied in when beta != 0) and, with a
        ``guard``, the memory around it (``GUARD_VALUES[poison]``); one call; the guard
        bands' count of changed elements launched, not read (None without a guard)."""
        adapter = target.adapter
        if guard is not None:
            numeric_check.poison_guard(guard, GUARD_VALUES[poison])
        if beta != 0.0:
            adapter.copy_(ops.out, c0)
        else:
            adapter.fill_nan(ops.out)
        _bind(runner, ops, alpha, beta)()
        # No synchronisation of its own: the comparison runs on the same stream after the
        # call, and reading its scalars back waits for both (an error of the call surfaces
        # there, to the same handler). The guard bands' count is launched first, so that
        # the comparison's read waits for it too.
        return None if guard is None else numeric_check.guard_count(adapter, guard, GUARD_VALUES[poison])

    @staticmethod
    def _with_writes(found: Check, target: Target, guard: Guard | None, poison: int, count: Any) -> Check:
        """``found`` with the writes outside the output that the guard's ``count`` saw."""
        if guard is not None:
            found.outside, found.outside_where = numeric_check.guard_writes(
                target.adapter, guard, GUARD_VALUES[poison], count
            )
        return found

    def _late_check_set(
        self,
        problem: Problem,
        target: Target,
        sets: list[Operands],
        rng: np.random.Generator,
        alpha: float,
        beta: float,
        model: ErrorModel,
        widen: float,
        keep_bounds: bool = False,
        variant: int = 0,
        guards: dict[int, Guard] | None = None,
    ) -> _LateCheck:
        """A rotated set with new values written into its inputs, and their reference:
        the same pointers the kernels are timed on, new numbers, so that a kernel that
        returns a stale result (or one remembered by address) is caught. The new values
        are of several characters (``structure_inputs``, its ``variant``), so that a
        kernel wrong only on some inputs (zeros, integers, mixed magnitudes) is caught too;
        a scaled problem's stay normal (fp8 draws of their own)."""
        adapter, device = target.adapter, target.device
        # A grouped problem's first two sets route all the bucket's rows (timed_parts), as
        # the check's offs do.
        ops = sets[1 % len(sets)]
        fresh: Operands
        swap_offs: tuple[Any, Any] | None = None
        if problem.is_scaled:
            fresh = make_scaled_operands(problem, adapter, device, rng)
            assert isinstance(ops, ScaledOperands) and isinstance(fresh, ScaledOperands)
            adapter.copy_(ops.scale_a, fresh.scale_a)
            adapter.copy_(ops.scale_b, fresh.scale_b)
        elif problem.is_grouped:
            # New offs too, of the distributions the timed sets do not have: after timing
            # every candidate is checked with one group holding all rows, then on a tail.
            # The timed offs come back once the reference is made: the check's distributions
            # (one group holding every row, a tail) are no load to time a choice on.
            distribution = DISTRIBUTIONS[2 + variant % 2]
            fresh = make_grouped_operands(problem, adapter, device, rng, distribution, with_out=False)
            assert isinstance(ops, GroupedOperands) and isinstance(fresh, GroupedOperands)
            if ops.offs is not None:
                swap_offs = (fresh.offs, adapter.host_indices(adapter.to_numpy(ops.offs), device))
                adapter.copy_(ops.offs, fresh.offs)
        else:
            fresh = make_operands(problem, adapter, device, rng, with_out=beta != 0.0)
        # An operand broadcast over the batch (batch stride 0) is one matrix in memory.
        broadcast_a = problem.batch > 1 and problem.stride_a == 0
        broadcast_b = problem.batch > 1 and problem.stride_b == 0
        fresh_a = fresh.a[0] if broadcast_a else fresh.a
        fresh_b = fresh.b[0] if broadcast_b else fresh.b
        if not problem.is_scaled and not problem.is_grouped:
            structure_inputs(
                adapter, fresh_a, fresh_b, variant, (problem.dtype_a, problem.dtype_b, problem.dtype_c)
            )
        adapter.copy_(ops.a[0] if broadcast_a else ops.a, fresh_a)
        adapter.copy_(ops.b[0] if broadcast_b else ops.b, fresh_b)
        if ops.bias is not None:
            adapter.copy_(ops.bias, fresh.bias)
        c0 = fresh.out if beta != 0.0 else None
        del fresh
        adapter.synchronize(device)
        reference = reference_of(problem, target, ops, c0, alpha, beta, model, keep_bounds)
        if swap_offs is not None:
            assert isinstance(ops, GroupedOperands)
            adapter.copy_(ops.offs, swap_offs[1])
        return _LateCheck(ops, c0, reference, alpha, beta, widen, target, guards, swap_offs)

    def _late_check(
        self,
        entry: _Entry,
        late: _LateCheck,
        when: str = "after timing",
        renew: Callable[[Sequence[Operands]], None] | None = None,
    ) -> bool:
        """Check ``entry`` on the late set; False (and REJECTED, FAILED or ABANDONED) if it fails."""
        found = self._late_call(entry, late, when, renew)
        assert not isinstance(found, _Pending)
        return found is not None and self._late_verdict(entry, found, late, when)

    def _late_checks(
        self,
        entries: Sequence[_Entry],
        late: _LateCheck,
        when: str = "after timing",
        renew: Callable[[Sequence[Operands]], None] | None = None,
    ) -> None:
        """:meth:`_late_check` of each of ``entries``, launched one after another and read
        back at once (:meth:`_read_checks`); one the quick pass cannot clear is checked
        again whole, on its own."""
        pending: list[tuple[_Entry, _Pending]] = []
        batch = _GuardBatch(1)
        for entry in entries:
            found = self._late_call(entry, late, when, renew, batch=batch)
            if isinstance(found, _Pending):
                pending.append((entry, found))
            elif found is not None:
                self._late_verdict(entry, found, late, when)
        read = self._read_checks(late.target, [p for _, p in pending], batch)
        for (entry, _), check in zip(pending, read, strict=True):
            if check is None or not (check.ok(late.widen) or check.counted):
                # NaN, inf or a write outside; or out of bounds in one pass: checked again
                # whole, on its own, for the note's count and worst element.
                self._late_check(entry, late, when, renew)
            else:
                self._late_verdict(entry, check, late, when)

    def _late_call(
        self,
        entry: _Entry,
        late: _LateCheck,
        when: str,
        renew: Callable[[Sequence[Operands]], None] | None,
        *,
        batch: _GuardBatch | None = None,
    ) -> Check | _Pending | None:
        """``entry``'s call on the late set, checked (or only launched, its guard poisoned
        and counted for a ``batch`` of them) within its time limit; None (and ABANDONED or
        FAILED) where it did not finish."""
        runner = entry.runner
        assert runner is not None

        def check() -> Check | _Pending:
            guard = late.guards.get(id(late.ops)) if late.guards is not None else None
            swap, copy_ = late.offs, late.target.adapter.copy_
            if swap is not None:
                copy_(late.ops.offs, swap[0])  # type: ignore[attr-defined]  # a grouped set's
            args = (runner, late.ops, late.c0, late.reference, late.alpha, late.beta, late.target, guard, 1)
            try:
                return self._check_launch(*args, batch) if batch is not None else self._check_call(*args)
            finally:
                if swap is not None:
                    copy_(late.ops.offs, swap[1])  # type: ignore[attr-defined]

        try:
            return entry.limit.run(entry, check) if entry.limit is not None else check()
        except OverLimit as exc:
            assert entry.limit is not None
            entry.limit.abandon(entry, exc, when)
            if renew is not None:
                renew([late.ops])
            return None
        except PLUGIN_FAILURES as exc:
            entry.result.status, entry.result.note = FAILED, f"{when}: {_failure(exc)}"
            return None

    def _late_verdict(self, entry: _Entry, found: Check, late: _LateCheck, when: str) -> bool:
        """Record ``found`` (``entry``'s check on the late set); False (REJECTED) if it fails."""
        entry.check = _worse(entry.check, found) if entry.check is not None else found
        entry.result.error = entry.check.rel_error
        if not found.ok(late.widen):
            entry.result.status = REJECTED
            entry.result.note = f"wrong {when}, on new inputs: {found.describe(late.widen)}"
            return False
        return True

    # --- timing ---------------------------------------------------------------------------
    def _time(
        self,
        entries: list[_Entry],
        sets: list[Operands],
        target: Target,
        alpha: float,
        beta: float,
        settle: float = 0.0,
        late: _LateCheck | None = None,
        renew: Callable[[Sequence[Operands]], None] | None = None,
    ) -> None:
        """Take samples of every checked candidate; the median is kept.

        On a CPU the candidates of one backend (one thread pool) are measured together,
        after their own warm-ups, and those of the next backend after them; before each
        backend, a pause while another library's worker threads still spin (``settle``,
        at most: :func:`unimatmul.tuning.quiet.wait_quiet`; they would steal the cores of
        the next kernel). Within a backend the candidates take turns sample by sample
        (:meth:`_sample_turns`), so that a slow moment of the machine (a virtual CPU
        descheduled for a second: twice the time of a two-thread kernel) hits them all
        alike instead of one candidate's whole block; a backend of one candidate
        (Default) is measured in one block. On a GPU (``interleave``) every candidate
        takes turns sample by sample, so that clock drift hits them all alike.
        """
        settings = self.settings
        firsts: dict[int, float] = {}  # best warm-up sample of each entry, for early pruning
        if settings.interleave:
            launched: list[tuple[_Entry, Callable[[], float]]] = []
            for entry in entries:
                self._warmed_up(entry, entries, firsts, sets, alpha, beta, renew, launched)
            for entry, read in launched:  # the warm-up samples left running, read at once
                try:
                    firsts[id(entry)] = read()
                except PLUGIN_FAILURES as exc:
                    entry.result.status, entry.result.note = FAILED, _failure(exc)
            self._sample_rounds([e for e in entries if e.result.status == OK], late, renew, firsts)
        else:
            for _, group in itertools.groupby(entries, key=lambda e: e.candidate.backend):
                pool = list(group)
                if settle > 0:
                    wait_quiet(settle)
                warmed = [e for e in pool if self._warmed_up(e, entries, firsts, sets, alpha, beta, renew)]
                # After a pause, another backend's samples were taken at other moments of
                # the machine: a slow moment (twice a two-thread kernel's time) in one of
                # them would prune the other's candidates, so each backend's are pruned
                # against its own alone (the repeat against Default judges the rest).
                peers = warmed if settle > 0 else entries
                if len(warmed) > 1:
                    self._sample_turns(warmed, peers, sets, late, renew)
                    continue
                for entry in warmed:

                    def block(entry: _Entry = entry, peers: list[_Entry] = peers) -> None:
                        self._sample_block(entry, peers)

                    try:
                        self._step(entry, block, "while timed")
                    except OverLimit:
                        if renew is not None:
                            renew(sets)
                        continue
                    if late is not None and entry.result.status == OK:
                        self._late_check(entry, late, renew=renew)
        for entry in entries:
            entry.result.samples = len(entry.times)
            if entry.times:
                entry.result.median_s = entry.median()

    def _warmed_up(
        self,
        entry: _Entry,
        entries: list[_Entry],
        firsts: dict[int, float],
        sets: list[Operands],
        alpha: float,
        beta: float,
        renew: Callable[[Sequence[Operands]], None] | None,
        launched: list[tuple[_Entry, Callable[[], float]]] | None = None,
    ) -> bool:
        """Prepare ``entry``'s sampler and warm it up; False if it is out (the problem's
        cap, its time limit, a failure, or, outside rounds, its best warm-up call more
        than ``first_prune_ratio`` times the best first call so far). Its best warm-up
        sample goes into ``firsts``: the best, not the last, because one call that waited
        for a descheduled thread (4-6 ms on a virtual machine) says nothing of the kernel.

        In rounds (``launched`` given), once Default's warm-up sample is in, another
        candidate's waits for nothing: a timer that can size its batch without timing
        the calls first (``prepare_within``: calls up to ``first_prune_ratio`` times
        Default's) does so, and a sample that can be launched (``sample.launch``) is left
        running, its read put in ``launched`` for the caller (before the rounds), so that
        the device runs one candidate's warm-up while the host prepares the next."""
        settings = self.settings
        runner = entry.runner
        assert runner is not None
        best_first = min(
            (firsts[id(e)] for e in entries if id(e) in firsts and e.result.status == OK),
            default=math.inf,
        )
        if self._past_deadline(entry):
            return False
        calls = [_bind(runner, s, alpha, beta, timing=True) for s in sets]
        within = None
        if launched is not None and entry.candidate != DEFAULT and settings.warmup == 1:
            default_first = next(
                (firsts[id(e)] for e in entries if e.candidate == DEFAULT and id(e) in firsts), None
            )
            prepare_within = getattr(self.timer, "prepare_within", None)
            if default_first is not None and prepare_within is not None:
                within = functools.partial(prepare_within, call_s=default_first * settings.first_prune_ratio)

        def warm_up(entry: _Entry = entry, calls: list[Callable[[], None]] = calls) -> float | None:
            sample = within(calls) if within is not None else None
            entry.sample = sample if sample is not None else self.timer.prepare(calls)
            launch = getattr(entry.sample, "launch", None)
            if within is not None and launch is not None:
                assert launched is not None
                launched.append((entry, launch()))
                return None
            return min(entry.sample() for _ in range(max(1, settings.warmup)))

        try:
            first = self._step(entry, warm_up, "while warmed up")
            if first is None:  # left running: read with the others' (_time)
                return True
            if not settings.interleave and self._over_first_ratio(entry, first, best_first):
                # A stall of the machine (a vCPU taken for a host's tick or two: a
                # two-thread kernel's calls took 3-9 ms where they take 0.4, its calls
                # right after too) outlasts the warm-up's samples: once more after it.
                time.sleep(settings.stall_s)
                assert entry.sample is not None
                first = min(first, self._step(entry, entry.sample, "while warmed up"))
        except OverLimit:
            if renew is not None:
                renew(sets)
            return False
        except PLUGIN_FAILURES as exc:
            entry.result.status, entry.result.note = FAILED, _failure(exc)
            return False
        # In rounds nobody is pruned before the check after the first round (see measure):
        # _sample_rounds judges the first calls then.
        if not settings.interleave and self._first_pruned(entry, first, best_first):
            return False
        firsts[id(entry)] = first
        return True

    def _sample_turns(
        self,
        live: list[_Entry],
        entries: list[_Entry],
        sets: list[Operands],
        late: _LateCheck | None,
        renew: Callable[[Sequence[Operands]], None] | None,
    ) -> None:
        """CPU: samples of ``live`` (one backend's warmed-up candidates) taken in turns, each
        sample a step of its own on the worker thread (a candidate's time limit holds as
        in a block). After the first turn each is checked on new inputs (before its times
        can prune anyone); once every one has twice ``min_samples`` (on a 2-vCPU VM,
        oneDNN's brgemm kernel for 12x128x64x128 was pruned after 5 samples in 7 runs of
        18, and won 10 of the 11 where it was not), those further than
        ``prune_ratio`` from the best median of ``entries`` timed so far (every candidate,
        or after a settling pause this backend's alone) stop; each stops at its
        budget (once it has ``min_samples``) or at ``max_samples``, all at the problem's cap
        once each has two samples."""
        settings = self.settings
        turn = 0
        while live:
            start = turn % len(live)
            for entry in live[start:] + live[:start]:
                if entry.result.status != OK:
                    continue

                def sample(entry: _Entry = entry) -> None:
                    self._take(entry)

                try:
                    self._step(entry, sample, "while timed")
                except OverLimit:
                    if renew is not None:
                        renew(sets)
            turn += 1
            live = [e for e in live if e.result.status == OK]
            if turn == 1 and late is not None:
                for entry in live:
                    self._late_check(entry, late, renew=renew)
                live = [e for e in live if e.result.status == OK]
            if live and min(len(e.times) for e in live) >= 2 * settings.min_samples:
                live = self._unpruned(live, [e for e in entries if e.times])
            live = [e for e in live if self._wants_more(e)]
            if live and min(len(e.times) for e in live) >= 2 and time.perf_counter() > self._deadline:
                return  # the problem's cap: two samples give a median to compare

    def _wants_more(self, entry: _Entry) -> bool:
        """Whether a CPU candidate still takes samples: fewer than ``max_samples``, and its
        budget not spent once it has ``min_samples`` (in a block and in turns alike)."""
        settings = self.settings
        n = len(entry.times)
        return n < settings.max_samples and not (
            n >= settings.min_samples and entry.spent_s >= settings.budget_s
        )

    def _sample_block(self, entry: _Entry, entries: list[_Entry]) -> None:
        settings = self.settings
        while entry.result.status == OK and self._wants_more(entry):
            self._take(entry)
            if len(entry.times) == settings.min_samples:
                others = [e.median() for e in entries if e is not entry and e.times and e.result.status == OK]
                if others and self._prune(entry, min(others)):
                    return
            if len(entry.times) >= 2 and time.perf_counter() > self._deadline:
                return  # the problem's cap: two samples give a median to compare

    def _over_first_ratio(self, entry: _Entry, first: float, best_first: float) -> bool:
        """Whether ``entry`` (never Default) took more than ``first_prune_ratio`` times the
        best first call on its first timed call."""
        return entry.candidate != DEFAULT and first > best_first * self.settings.first_prune_ratio

    def _first_pruned(self, entry: _Entry, first: float, best_first: float) -> bool:
        """Prune ``entry`` (never Default) if its first timed call took more than
        ``first_prune_ratio`` times the best first call."""
        if not self._over_first_ratio(entry, first, best_first):
            return False
        entry.result.status = PRUNED
        entry.result.note = f"{first / best_first:.1f}x the best on its first timed call"
        if not entry.times:  # (in rounds it has its first round's sample already)
            entry.times.append(first)
        return True

    def _only_default_timed(self, entries: Sequence[_Entry]) -> bool:
        """Whether the problem's cap is spent with no candidate but Default timed (or to be):
        Default is then the winner whatever a check after timing finds, so none is made."""
        if time.perf_counter() <= self._deadline:
            return False
        return all(e.candidate == DEFAULT or not e.times for e in entries)

    def _past_deadline(self, entry: _Entry) -> bool:
        """Mark a candidate (never Default) left out because the problem's cap is spent."""
        if entry.candidate == DEFAULT or time.perf_counter() <= self._deadline:
            return False
        entry.result.status, entry.result.note = PRUNED, CAPPED
        return True

    def _step(self, entry: _Entry, step: Callable[[], Any], when: str) -> Any:
        """``step()`` within ``entry``'s time limit; OverLimit (and ABANDONED) past it."""
        if entry.limit is None:
            return step()
        try:
            return entry.limit.run(entry, step)
        except OverLimit as exc:
            entry.limit.abandon(entry, exc, when)
            raise

    def _take(self, entry: _Entry, *, rounds: bool = False) -> None:
        assert entry.sample is not None
        t0 = time.perf_counter()
        try:
            entry.times.append(entry.sample())
        except PLUGIN_FAILURES as exc:
            entry.result.status, entry.result.note = FAILED, _failure(exc)
        self._charge(entry, time.perf_counter() - t0, rounds=rounds)

    def _charge(self, entry: _Entry, spent: float, *, rounds: bool = False) -> None:
        """Count ``spent`` seconds of sampling to ``entry``'s budget (and, in rounds, to its
        time limit: abandoned past it)."""
        entry.spent_s += spent
        limit = entry.limit
        if rounds and limit is not None:
            # Rounds across candidates (a GPU) are not steps of one: judged sample by sample.
            left = limit.allowance(entry)
            limit.account(entry, spent)
            if spent > left and entry.result.status == OK:
                limit.abandon(
                    entry,
                    OverLimit(f"over its limit after {entry.used_s:.3g} s", limit_s=left),
                    "while timed",
                )

    def _prune(self, entry: _Entry, best: float, ratio: float | None = None, when: str = "") -> bool:
        """Whether ``entry`` (never Default) stops, marked pruned: its median over ``ratio``
        (else ``prune_ratio``) times ``best``; or, with ``prune_untied`` and ``min_samples``
        taken, none of its samples within ``tie_ratio`` of ``best``."""
        if entry.candidate == DEFAULT:
            return False
        settings = self.settings
        ratio = settings.prune_ratio if ratio is None else ratio
        if entry.median() > best * ratio:
            note = f"{entry.median() / best:.2f}x the best {when or f'after {len(entry.times)} samples'}"
        elif (
            settings.prune_untied
            and len(entry.times) >= settings.min_samples
            and 0.0 < best < math.inf
            and min(entry.times) > best * settings.tie_ratio
        ):
            note = (
                f"none of {len(entry.times)} samples within {settings.tie_ratio:g}x the best "
                f"(fastest {min(entry.times) / best:.3f}x)"
            )
        else:
            return False
        entry.result.status, entry.result.note = PRUNED, note
        return True

    def _round(self, live: Sequence[_Entry], turn: int = 0) -> None:
        """One sample of each entry of ``live`` still OK. Where every sampler can launch its
        sample without waiting for it (``sample.launch``: the graph timer), all are launched
        back to back and read after: the device runs them without a gap, and the host's
        work overlaps theirs. Each is charged the round's wall time in proportion to its
        device time (its budget and its time limit). The round starts at entry ``turn``
        (modulo their count): whoever runs first, after the device waited for the host,
        is a different entry each round."""
        live = [e for e in live if e.result.status == OK]
        if live:
            start = turn % len(live)
            live = live[start:] + live[:start]
        if not all(hasattr(e.sample, "launch") for e in live):
            for entry in live:
                self._take(entry, rounds=True)
            return
        t0 = time.perf_counter()
        reads: list[tuple[_Entry, Callable[[], float]]] = []
        for entry in live:
            try:
                reads.append((entry, entry.sample.launch()))  # type: ignore[union-attr]
            except PLUGIN_FAILURES as exc:
                entry.result.status, entry.result.note = FAILED, _failure(exc)
        taken: list[tuple[_Entry, float]] = []
        for entry, read in reads:
            try:
                value = read()
            except PLUGIN_FAILURES as exc:
                entry.result.status, entry.result.note = FAILED, _failure(exc)
                continue
            entry.times.append(value)
            taken.append((entry, value * getattr(entry.sample, "calls", 1)))
        wall = time.perf_counter() - t0
        device = sum(t for _, t in taken)
        for entry, t in taken:
            spent = wall * t / device if device > 0 else wall / len(taken)
            self._charge(entry, spent, rounds=True)

    def _sample_rounds(
        self,
        live: list[_Entry],
        late: _LateCheck | None = None,
        renew: Callable[[Sequence[Operands]], None] | None = None,
        firsts: dict[int, float] | None = None,
    ) -> None:
        settings = self.settings
        everyone = list(live)
        # One round, then the check on new inputs (a kernel that is right only on inputs it
        # has seen is out before its times can prune anyone), then the first calls' and
        # the first round's losers out (first_prune_ratio, round_prune_ratio), then the
        # rounds up to min_samples.
        turns = itertools.count()
        self._round(live, next(turns))
        if late is not None:
            self._late_checks([e for e in live if e.result.status == OK], late, renew=renew)
        if firsts:
            ok = [e for e in live if e.result.status == OK and id(e) in firsts]
            best_first = min((firsts[id(e)] for e in ok), default=math.inf)
            for entry in ok:
                self._first_pruned(entry, firsts[id(entry)], best_first)
        live = self._unpruned(live, everyone, settings.round_prune_ratio, "in the first round")
        for _ in range(settings.min_samples - 1):
            self._round(live, next(turns))
        live = self._unpruned(live, everyone)
        while live:
            self._round(live, next(turns))
            live = [
                e
                for e in self._unpruned(live, everyone)
                if e.spent_s < settings.budget_s and len(e.times) < settings.max_samples
            ]
            if time.perf_counter() > self._deadline:
                return  # the problem's cap: every live entry has min_samples already

    def _unpruned(
        self, live: list[_Entry], everyone: list[_Entry], ratio: float | None = None, when: str = ""
    ) -> list[_Entry]:
        """The entries of ``live`` still checked ok and within the prune ratio (``ratio``, else
        ``prune_ratio``) of the best median of ``everyone`` (pruned once the first rounds
        are in, and again after every round: a candidate that falls behind stops taking
        samples that cannot change the winner)."""
        best = min((e.median() for e in everyone if e.result.status == OK), default=math.inf)
        return [e for e in live if e.result.status == OK and not self._prune(e, best, ratio, when)]

    # --- the choice -------------------------------------------------------------------------
    def _pick(self, ok: list[_Entry]) -> tuple[_Entry, dict[str, Any]]:
        """The candidate to hold against Default (Default itself when no other was timed):
        among those within noise of the fastest (``unimatmul.tuning.bounds.within_noise``),
        the first in the canonical order, so that runs that cannot tell them apart agree;
        and what the record says of it (``settings["win"]``)."""
        settings = self.settings
        contenders = [e for e in ok if e.candidate != DEFAULT]
        if not contenders:
            return ok[0], {}
        ties = within_noise(
            {e.candidate.identity: e.times for e in contenders},
            settings.confidence_level,
            settings.tie_gain,
            settings.tie_ratio,
        )
        pick = next(e for e in contenders if e.candidate.identity == ties.pick)
        win: dict[str, Any] = {"candidate": ties.pick, "tied": len(ties.tied)}
        if ties.fastest != ties.pick:
            win["fastest"] = ties.fastest
        return pick, win

    # --- confirmation of a win --------------------------------------------------------------
    def _parts_by_distribution(
        self,
        problem: Problem,
        sets: list[Operands],
        best: _Entry,
        default: _Entry,
        alpha: float,
        beta: float,
    ) -> list[tuple[Callable[[], float], Callable[[], float]]] | None:
        """A grouped problem's (Default, best) samplers on each part's timed sets alone
        (``_operand_sets``: they take turns of the distributions and, in the m form, of
        the rows' share), for ``_confirm``; None otherwise.

        The main measurement times a choice on every set at once, so a kernel well ahead on
        one part can hide a loss on another; the repeat judges it on each."""
        if not problem.is_grouped or len(sets) < 2 or not self.settings.interleave:
            return None
        by_part: dict[str, list[Operands]] = {}
        for s in sets:
            by_part.setdefault(getattr(s, "part", ""), []).append(s)
        found = []
        try:
            for part in by_part.values():
                assert default.runner is not None and best.runner is not None
                d = self.timer.prepare([_bind(default.runner, s, alpha, beta, timing=True) for s in part])
                w = self.timer.prepare([_bind(best.runner, s, alpha, beta, timing=True) for s in part])
                d(), w()  # the first replay of a graph also uploads it
                found.append((d, w))
        except PLUGIN_FAILURES:
            return None  # the repeat over every set, as for other problems
        return found

    def _confirm(
        self,
        best: _Entry,
        default: _Entry,
        settle: float,
        parts: list[tuple[Callable[[], float], Callable[[], float]]] | None = None,
    ) -> tuple[_Entry, dict[str, Any], tuple[float, float]]:
        """Measure ``best`` against Default again; the entry that wins, and what was seen.

        Where no pool may be left spinning (small products, GPUs) the two take turns
        sample by sample and each pair gives one ratio; on a CPU product large enough
        to need the settling pause, each is measured again in one block after it, for
        at least ``confirm_rounds`` rounds, and each side counts as the faster half of
        all its samples (its first measurement's and the repeat's blocks: a slow moment
        of the machine only adds time). The win stands if the ratio beats Default by
        ``min_gain`` and by more than the noise (half the relative interquartile range),
        and if the lower confidence bound on the speedup beats Default by ``min_gain``
        too (``unimatmul.tuning.bounds``: of the paired ratios, of both measurements'
        samples together for fewer than 5 pairs, of the faster halves for blocks); else
        it is measured once more (``confirm_rounds``), with all samples pooled, and again
        while the ratio holds but the bound is not clear (up to ``max_confirm_rounds``);
        if it still does not stand, Default is kept. Both entries' times become those of
        the confirmation. Also returns the bounds (at least, at most) on the speedup
        that the samples give.

        With ``parts`` (a grouped problem: one sampler pair per part of its timed sets, a
        distribution over all rows or fewer) the pairs are taken on each part and the win
        must stand on every one: the speedup, noise and bound are those of the worst.
        """
        settings = self.settings
        main_ratio = default.median() / best.median()
        main_d, main_w = list(default.times), list(best.times)
        bounds = (0.0, math.inf)
        w_times: list[float] = []
        d_times: list[float] = []
        ratios: list[float] = []
        speedup, noise, rounds = 1.0, 0.0, 0
        paired = settle <= 0
        d_blocks, w_blocks = [main_d], [main_w]  # blocks: each side's measurements
        part_ratios: list[list[float]] = [[] for _ in parts or ()]
        # As many samples as fit the per-candidate budget, between 2 and confirm_pairs:
        # a product whose call takes a second gets 2, a small one confirm_pairs.
        slowest = max(default.median(), best.median())
        pairs = max(2, min(settings.confirm_pairs, math.ceil(settings.budget_s / max(slowest, 1e-9))))
        try:
            while True:
                rounds += 1
                if paired and parts:
                    for i in range(pairs):
                        for p, (d_sample, w_sample) in enumerate(parts):
                            if i % 2 == 0:
                                d, w = d_sample(), w_sample()
                            else:
                                w, d = w_sample(), d_sample()
                            d_times.append(d)
                            w_times.append(w)
                            part_ratios[p].append(d / w if w > 0 else math.inf)
                    worst = min(part_ratios, key=statistics.median)
                    ratios[:] = worst
                    speedup = statistics.median(worst)
                    noise = max(spread(r) for r in part_ratios) / 2
                elif paired:
                    for i in range(pairs):
                        order = (default, best) if i % 2 == 0 else (best, default)
                        pair = {}
                        for entry in order:
                            assert entry.sample is not None
                            pair[id(entry)] = entry.sample()
                        d, w = pair[id(default)], pair[id(best)]
                        d_times.append(d)
                        w_times.append(w)
                        ratios.append(d / w if w > 0 else math.inf)
                    speedup = statistics.median(ratios)
                    noise = spread(ratios) / 2
                else:
                    for entry, blocks in ((default, d_blocks), (best, w_blocks)):
                        assert entry.sample is not None
                        wait_quiet(settle)
                        entry.sample()  # warm-up after the pause
                        blocks.append([entry.sample() for _ in range(pairs)])
                    # A slow moment of the machine (a vCPU descheduled) only adds time, to
                    # a sample or to a whole block: each side is the faster half of its
                    # samples, of its first measurement and the repeat alike.
                    d_times[:] = _faster_half(d_blocks)
                    w_times[:] = _faster_half(w_blocks)
                    speedup = statistics.median(d_times) / statistics.median(w_times)
                    noise = (spread(d_times) + spread(w_times)) / 2
                # Paired samples: the bound of their ratios, once there are enough of them
                # for one; too few pairs: of both measurements' samples together; blocks:
                # of each side's faster half.
                if paired:
                    bounds = ratio_bounds(ratios, settings.confidence_level)
                    if bounds == (0.0, math.inf):
                        bounds = speedup_bounds(main_d + d_times, main_w + w_times, settings.confidence_level)
                else:
                    bounds = speedup_bounds(d_times, w_times, settings.confidence_level)
                holds = speedup - 1.0 >= max(settings.min_gain, noise)
                if (
                    holds
                    and bounds[0] >= 1.0 + settings.min_gain
                    and (paired or rounds >= settings.confirm_rounds)
                ):
                    break
                # A win that does not hold after confirm_rounds is noise; one that holds
                # but whose samples do not yet bound it clearly gets more of them (a busy
                # machine), up to max_confirm_rounds and within the problem's cap.
                if rounds >= max(1, settings.confirm_rounds) and (
                    not holds or rounds >= settings.max_confirm_rounds or time.perf_counter() > self._deadline
                ):
                    break
        except PLUGIN_FAILURES as exc:
            best.result.status, best.result.note = FAILED, f"while confirming: {_failure(exc)}"
            return default, {"candidate": best.candidate.identity, "verdict": "failed"}, bounds
        clear = bounds[0] >= 1.0 + settings.min_gain
        confirmed = speedup - 1.0 >= max(settings.min_gain, noise) and clear
        # The two measurements agree when neither speedup is off by more than the noise
        # allowance from the other (a busy moment during one block makes them disagree).
        agree = math.isinf(settings.noise_spread) or abs(math.log(main_ratio / speedup)) <= math.log1p(
            settings.noise_spread
        )
        # The confirmation measured both close together in time: its times are kept,
        # unless the two measurements disagree and the first claimed less; then the
        # record keeps the smaller claim (a busy moment must not become a speedup).
        if not paired or agree or speedup <= main_ratio or not confirmed:
            # (blocks: each side's faster half of both measurements already)
            best.times, default.times = w_times, d_times
        verdict = {
            "candidate": best.candidate.identity,
            "verdict": "confirmed" if confirmed else "within noise",
            "speedup": round(speedup, 4),
            "main_speedup": round(main_ratio, 4),
            "noise": round(noise, 4),
            "rounds": rounds,
            "samples": len(w_times),
            "paired": paired,
            **(
                {"by_distribution": [round(statistics.median(r), 4) for r in part_ratios]}
                if part_ratios and all(part_ratios)
                else {}
            ),
            "agree": agree,
        }
        if not confirmed and speedup - 1.0 >= max(settings.min_gain, noise):
            best.result.note = (
                f"its {speedup:.3g}x over Default is not clear from its samples (at least "
                f"{bounds[0]:.3g}x at {settings.confidence_level:.0%} confidence): Default kept"
            )
        elif not confirmed and main_ratio < 1.0 + settings.min_gain:
            best.result.note = (
                f"{main_ratio:.3g}x Default's speed, and {speedup:.3g}x measured again "
                f"(noise {noise:.1%}): Default kept"
            )
        elif not confirmed:
            best.result.note = (
                f"its {main_ratio:.3g}x over Default did not hold when measured again "
                f"({speedup:.3g}x, noise {noise:.1%}): Default kept"
            )
        return (best if confirmed else default), verdict, bounds


def _faster_half(blocks: Sequence[Sequence[float]]) -> list[float]:
    """The faster half of the samples of ``blocks``, and at least as many as the smallest
    block holds."""
    samples = sorted(t for block in blocks for t in block)
    return samples[: max(len(samples) // 2, min(len(b) for b in blocks))]


def _cpu_load() -> tuple[float, int] | None:
    """(1-minute load average, CPUs this process may use), where the OS says."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        return os.getloadavg()[0], cpus
    except (AttributeError, OSError):
        return None


def _win_bounds(low: float, high: float) -> dict[str, Any]:
    """The bounds on a speedup as a record keeps them (``settings["win"]``): None for a
    side the samples could not bound."""
    return {
        "low": round(low, 4) if low > 0 else None,
        "high": round(high, 4) if math.isfinite(high) else None,
    }


def _macs(problem: Problem) -> int:
    return problem.m * problem.n * problem.k * problem.batch


def _out_elements(problem: Problem) -> int:
    """Elements of the output the check compares: a grouped output's own (``[M, N]`` for
    the m and n forms), not a batch of its groups."""
    if problem.is_grouped and problem.jagged in ("m", "n"):
        return problem.m * problem.n
    return problem.m * problem.n * problem.batch


def _ref_itemsize(problem: Problem) -> int:
    """Bytes of an element of the float64 reference as kept: float64 for a float64 output,
    else float32 (numeric_check.make_reference)."""
    return 8 if problem.dtype_c == "f64" else 4


def _check_bytes(problem: Problem, beta: float, block: int) -> int:
    """Bytes the numeric check allocates at most at one time (see numeric_check.make_reference)."""
    if problem.is_grouped:
        return _grouped_check_bytes(problem, block)
    out_elements = problem.m * problem.n * problem.batch
    ref = out_elements * _ref_itemsize(problem)
    c0 = out_elements * ITEMSIZE[problem.dtype_c] if beta != 0.0 else 0
    # Float64 blocks of the reference (A's rows, the product and, with beta, bias or an
    # activation, a second one) and of B, the row and column norms, and the new inputs
    # written into a set after timing.
    # B's columns a range at a time where B is large (numeric_check.b_columns), with
    # their squares for the norms.
    cols = numeric_check.b_columns(problem.k, problem.n, block)
    rows = numeric_check.a_rows(problem.m, problem.n, problem.k, block)
    products = 1 if beta == 0.0 and not problem.has_bias and problem.activation is None else 3
    # A scaled product's rows and columns are dequantised a range at a time: the fp8
    # values in float64, their scales expanded, the product (scales.dequantised).
    a_temps, b_temps = (3, 3) if problem.is_scaled else (1, 2)
    temps = products * min(out_elements, block) * 8 + (a_temps * rows + b_temps * cols) * problem.k * 8
    norms = 4 * (problem.m + problem.n) * problem.batch * 8
    fresh = operand_bytes(problem) - problem.m * problem.n * problem.batch * ITEMSIZE[problem.dtype_c]
    return ref + c0 + temps + norms + max(fresh, 0)


def _grouped_check_bytes(problem: Problem, block: int) -> int:
    """Bytes the check of a grouped problem allocates at most at one time: one reference
    per group (``reference_of``), together as large as the output's covered part (float32,
    with the row norms of each group's A and column norms of its B), one group's float64
    temporaries at a time, and the new inputs written into a set after timing."""
    g, m, n, k = problem.batch, problem.m, problem.n, problem.k
    # (A's rows, B's columns) over all the groups' products, and the largest product as
    # (batch, rows, k, columns): an n group is its columns of out, transposed (group_products).
    rows_all, cols_all, part = {
        "m": (m, g * n, (1, m, k, n)),
        "n": (n, g * m, (1, n, k, m)),
        "k": (g * m, g * n, (1, m, k, n)),
    }.get(problem.jagged, (g * m, g * n, (g, m, k, n)))
    ref = _out_elements(problem) * _ref_itemsize(problem)
    norms = 2 * 8 * (rows_all + cols_all)  # r2 and r4, c2 and c4
    batch, rows, depth, cols = part
    per_block = max(1, block // max(cols, 1))
    if per_block >= rows:  # whole matrices of a batch range at a time (numeric_check._blocks)
        step = min(batch, max(1, per_block // rows))
        a_block, b_block = step * rows * depth, step * depth * cols
    else:
        a_block, b_block = per_block * depth, depth * cols
    # A's and B's blocks in float64 with their squares for the norms, and a few float64
    # blocks of the product and of the comparison's bound.
    temps = 8 * (3 * (a_block + b_block) + 6 * min(block, batch * rows * cols))
    host = 8 * 4 * numeric_check.HOST_CHECK_ELEMENTS  # a small group's copy on the host
    return ref + norms + temps + host + grouped_operand_bytes(problem, with_out=False)


def _bounds_bytes(problem: Problem) -> int:
    """Bytes of the bounds an exactly checked output keeps with its reference (in the
    reference's dtype; see numeric_check._within); 0 for a screened one. A grouped
    output's groups are checked one by one: any of them may be small enough."""
    out_elements = _out_elements(problem)
    if problem.is_grouped and problem.jagged != "none":
        return out_elements * _ref_itemsize(problem)
    return out_elements * _ref_itemsize(problem) if out_elements <= SCREEN_ELEMENTS else 0


def _nothing() -> None:
    """The check of Default alone (see :meth:`Harness.measure`)."""


def _both(first: Callable[[], None], then: Callable[[], None]) -> None:
    first()
    then()


def _worse(a: Check, b: Check) -> Check:
    """The less favourable of two checks of one candidate (what the record reports), with
    the writes outside the output that either saw (each check poisons with one value)."""
    worse = a if (a.worst_ratio, a.nonfinite) >= (b.worst_ratio, b.nonfinite) else b
    writer = a if a.outside >= b.outside else b
    if writer.outside > worse.outside:
        worse = replace(worse, outside=writer.outside, outside_where=writer.outside_where)
    return worse


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _bind(
    runner: Runner, ops: Operands, alpha: float, beta: float, *, timing: bool = False
) -> Callable[[], None]:
    """The call of ``runner`` on ``ops``. ``timing``: the call as it is timed, where that
    differs from the checked one: a grouped call lends ``out`` as the doors do for a call
    without ``out`` (every routed ``torch._grouped_mm``: ``core.grouped.call_lending``), so
    Default returns torch's own result, not copied into ``out`` (a copy of the whole
    output, which such calls never make)."""
    a, b, out, bias = ops.a, ops.b, ops.out, ops.bias
    if isinstance(ops, ScaledOperands):
        # A scaled runner takes the scales after the usual arguments (core/runners.py: ScaledDefaultRunner).
        scaled: Any = runner
        scale_a, scale_b = ops.scale_a, ops.scale_b

        def scaled_call() -> None:
            scaled(a, b, out, alpha, beta, bias, scale_a, scale_b)

        return scaled_call
    if isinstance(ops, GroupedOperands):
        # A grouped runner takes offs after the usual arguments (core/grouped.py).
        grouped: Any = runner
        offs = ops.offs
        if ops.rows is not None:  # a call of fewer rows than the bucket's (make_grouped_operands)
            a, out = a[: ops.rows], out[: ops.rows]
        if timing:
            plain_grouped_call(alpha, beta, bias)

            def lent_call() -> None:
                call_lending(grouped, a, b, out, offs, alpha, beta, bias)

            return lent_call

        def grouped_call() -> None:
            grouped(a, b, out, alpha, beta, bias, offs)

        return grouped_call

    def call() -> None:
        runner(a, b, out, alpha, beta, bias)

    return call


def _error_model(problem: Problem) -> ErrorModel:
    """The element-wise bound every candidate of ``problem`` is held to."""
    if problem.is_scaled:
        return scaled_error_model(problem)
    return ErrorModel.for_problem(
        k=problem.k,
        dtype_in=problem.dtype_a,
        dtype_out=problem.dtype_c,
        compute=problem.compute,
        activation=problem.activation,
        ref_dtype="f64" if problem.dtype_c == "f64" else "f32",
    )


def reference_of(
    problem: Problem,
    target: Target,
    ops: Operands,
    c0: Any,
    alpha: float,
    beta: float,
    model: ErrorModel | None = None,
    keep_bounds: bool = False,
) -> Reference | PartsReference:
    """The float64 reference of ``ops`` for the checks (``model``: the problem's own bound by
    default), keeping its bounds where the memory plan counted them (``MemoryPlan.keep_bounds``).
    A grouped problem's is one reference per group (``group_products``), each of the
    group's own part of the output: memory in proportion to the rows the groups cover."""
    adapter = target.adapter
    if model is None:
        model = _error_model(problem)
    found: Reference | PartsReference
    if isinstance(ops, GroupedOperands):
        parts = [(p.label, p.view, Operands(p.a, p.b, p.view(ops.out))) for p in group_products(ops)]
        found = numeric_check.make_parts_reference(adapter, parts, model, target.device)
    else:
        plain, rows, columns = (
            dequantised(adapter, ops) if isinstance(ops, ScaledOperands) else (ops, None, None)
        )
        found = numeric_check.make_reference(
            adapter, plain, c0, alpha, beta, problem.activation, model, target.device, columns, rows
        )
    found.keep_bounds = keep_bounds
    return found


def compare_output(target: Target, ops: Operands, out: Any, reference: Reference | PartsReference) -> Check:
    """``out``, a candidate's output on ``ops``, compared with ``ops``' reference
    (a grouped output group by group: :func:`reference_of`)."""
    if isinstance(reference, PartsReference):
        return numeric_check.compare_parts(target.adapter, out, reference, target.device)
    return numeric_check.compare(target.adapter, out, reference, target.device)


def _layouts(problem: Problem) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    return grouped_layouts(problem) if problem.is_grouped else operand_layouts(problem)
