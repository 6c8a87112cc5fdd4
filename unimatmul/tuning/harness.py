"""The Harness: measures candidates fairly and never lets a wrong kernel win.

For each Candidate of a Problem it prepares a Runner, checks its output against a
float64 reference on poisoned memory, then times it on inputs rotated through more
memory than the last-level cache, in interleaved rounds, pruning clear losers early,
within a time budget, and keeps the median. Device timing lives behind the
:class:`Timer` protocol (a CPU clock here; CUDA/HIP events in ``unimatmul.tuning.timers``).
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from unimatmul._version import __version__
from unimatmul.cache.record import FAILED, OK, PRUNED, REJECTED, CandidateResult, TuningRecord
from unimatmul.core.arrays import Operands, make_operands
from unimatmul.core.backend import DEFAULT, Candidate, Runner, Target
from unimatmul.core.dtypes import scaled_tolerance, tolerance
from unimatmul.core.errors import UnsupportedProblem
from unimatmul.core.problem import Problem
from unimatmul.core.scaled import ScaledOperands, make_scaled_operands, scaled_reference
from unimatmul.tuning.conditions import read_device_state


class Timer(Protocol):
    """Times back-to-back calls on one device's own clock.

    ``prepare`` receives one call per rotated input set, already bound to its inputs,
    and returns a function that takes one sample: it runs calls (cycling through the
    sets) and returns the seconds per call, measured on the device's clock.
    """

    name: str

    def prepare(self, calls: Sequence[Callable[[], None]]) -> Callable[[], float]: ...


class CpuTimer:
    """A monotonic host clock: right for CPU kernels, which run synchronously."""

    name = "cpu-perf-counter"

    def __init__(self, min_sample_s: float = 2e-3) -> None:
        self.min_sample_s = min_sample_s

    def prepare(self, calls: Sequence[Callable[[], None]]) -> Callable[[], float]:
        # One call calibrates how many calls a sample needs to outlast clock noise;
        # successive samples continue through the rotated sets where the last stopped.
        t0 = time.perf_counter()
        calls[0]()
        once = max(time.perf_counter() - t0, 1e-9)
        per_sample = max(1, math.ceil(self.min_sample_s / once))
        count = len(calls)
        position = [1 % count]

        def sample() -> float:
            start = position[0]
            t0 = time.perf_counter()
            for i in range(start, start + per_sample):
                calls[i % count]()
            elapsed = time.perf_counter() - t0
            position[0] = (start + per_sample) % count
            return elapsed / per_sample

        return sample


@dataclass
class HarnessSettings:
    """How hard to measure. Defaults suit the CPU; GPU callers pass their own."""

    warmup: int = 2
    min_samples: int = 5
    max_samples: int = 100
    budget_s: float = 0.25  # measuring time per candidate, after the numeric check
    prune_ratio: float = 1.3  # a candidate this much slower than the best stops early
    first_prune_ratio: float = 5.0  # ... and this much slower on its first timed call, at once
    interleave: bool = False  # GPU: rounds across candidates; CPU: one block each (see _time)
    settle_s: float = 0.2  # CPU: pause before each block so other pools' threads stop spinning
    min_gain: float = 0.01  # a winner must beat Default by this fraction, else Default
    rotate_bytes: int | None = None  # inputs rotated through this much memory
    max_rotation_bytes: int = 1 << 30
    max_sets: int = 16
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

    def median(self) -> float:
        return statistics.median(self.times) if self.times else math.inf


class Harness:
    """Measures Candidates of one Problem on one Target and returns a TuningRecord."""

    def __init__(self, timer: Timer, settings: HarnessSettings | None = None) -> None:
        self.timer = timer
        self.settings = settings or HarnessSettings()

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
    ) -> TuningRecord:
        """Check and time each (candidate, prepare) pair; Default must be among them."""
        started = time.perf_counter()
        settings = self.settings
        adapter = target.adapter
        rng = np.random.default_rng(settings.seed)
        if beta == 0.0 and not problem.beta_zero:
            beta = 1.0
        sets = self._operand_sets(problem, target, rng)
        first = sets[0]
        c_input = adapter.empty(tuple(adapter.shape(first.out)), problem.dtype_c, target.device)
        adapter.copy_(c_input, first.out)
        if isinstance(first, ScaledOperands):
            # The float64 product of the dequantised inputs (core/scaled.py).
            reference = scaled_reference(adapter, first.a, first.b, first.scale_a, first.scale_b, first.bias)
            tol = scaled_tolerance(problem.dtype_c, problem.fast_accum)
        else:
            reference = adapter.reference(
                first.a, first.b, c_input, alpha, beta, first.bias, problem.activation
            )
            tol = tolerance(problem.dtype_c, problem.compute)

        measured: list[_Entry] = []
        results: list[CandidateResult] = []
        default_error: float | None = None
        for candidate, prepare in entries:
            entry = _Entry(candidate)
            entry.result = CandidateResult(candidate.identity, OK)
            results.append(entry.result)
            if progress is not None:
                progress(candidate.identity)
            try:
                entry.runner = prepare()
                # Poison the output (C copied in when beta != 0), run once, compare.
                if beta != 0.0:
                    adapter.copy_(first.out, c_input)
                else:
                    adapter.fill_nan(first.out)
                _bind(entry.runner, first, alpha, beta)()
                adapter.synchronize(target.device)
                error = adapter.rel_error(first.out, reference)
            except UnsupportedProblem as exc:
                entry.result.status, entry.result.note = FAILED, f"unsupported: {exc}"
                continue
            except Exception as exc:
                entry.result.status, entry.result.note = FAILED, f"{type(exc).__name__}: {exc}"
                continue
            entry.result.error = error
            if candidate == DEFAULT:
                default_error = error
            if not error <= tol:
                entry.result.status = REJECTED
                entry.result.note = f"relative error {error:.3g} > tolerance {tol:.3g}"
                continue
            measured.append(entry)

        self._time(measured, sets, target, alpha, beta)
        # Read right after the last sample, while clocks still reflect the load.
        device_state = read_device_state(target.device)

        ok = [e for e in measured if e.result.status == OK and e.times]
        default_entry = next((e for e in measured if e.candidate == DEFAULT), None)
        default_s = default_entry.median() if default_entry and default_entry.times else None
        if ok:
            best = min(ok, key=lambda e: e.median())
            if (
                default_s is not None
                and best.candidate != DEFAULT
                and best.median() > default_s * (1.0 - settings.min_gain)
            ):
                assert default_entry is not None
                best = default_entry  # not a clear win: keep what the user would have had
            winner, winner_s = best.candidate.identity, best.median()
        else:
            winner, winner_s = DEFAULT.identity, default_s if default_s is not None else math.inf
        record_settings = settings.to_dict()
        record_settings.update(timer=self.timer.name, sets=len(sets), tolerance=tol)
        if default_error is not None:
            record_settings["default_error"] = default_error
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

    def _operand_sets(self, problem: Problem, target: Target, rng: np.random.Generator) -> list[Operands]:
        settings = self.settings
        rotate = settings.rotate_bytes or 2 * last_level_cache_bytes()
        per_set = max(problem.min_bytes, 1)
        count = math.ceil(rotate / per_set)
        count = max(1, min(count, settings.max_sets, settings.max_rotation_bytes // per_set or 1))
        make = make_scaled_operands if problem.is_scaled else make_operands
        return [make(problem, target.adapter, target.device, rng) for _ in range(count)]

    def _time(
        self, entries: list[_Entry], sets: list[Operands], target: Target, alpha: float, beta: float
    ) -> None:
        """Take samples of every checked candidate; the median is kept.

        On a CPU each candidate is measured in one block after its own warm-up:
        another library's worker threads still spinning after their last call would
        otherwise slow whoever runs next. On a GPU (``interleave``) candidates take
        turns sample by sample, so that clock drift hits them all alike.
        """
        settings = self.settings
        best_first = math.inf
        for entry in entries:
            runner = entry.runner
            assert runner is not None
            calls = [_bind(runner, s, alpha, beta) for s in sets]
            if settings.settle_s > 0:
                # BLAS thread pools (OpenBLAS, OpenMP) spin for a while after their last
                # call; on a small machine they would steal the cores of the next kernel.
                time.sleep(settings.settle_s)
            try:
                entry.sample = self.timer.prepare(calls)
                first = math.inf
                for _ in range(max(1, settings.warmup)):
                    first = entry.sample()
            except Exception as exc:
                entry.result.status, entry.result.note = FAILED, f"{type(exc).__name__}: {exc}"
                continue
            if entry.candidate != DEFAULT and first > best_first * settings.first_prune_ratio:
                entry.result.status = PRUNED
                entry.result.note = f"{first / best_first:.1f}x the best on its first timed call"
                entry.times.append(first)
                continue
            best_first = min(best_first, first)
            if not settings.interleave:
                self._sample_block(entry, entries)
        if settings.interleave:
            self._sample_rounds([e for e in entries if e.result.status == OK])
        for entry in entries:
            entry.result.samples = len(entry.times)
            if entry.times:
                entry.result.median_s = entry.median()

    def _take(self, entry: _Entry) -> None:
        assert entry.sample is not None
        t0 = time.perf_counter()
        try:
            entry.times.append(entry.sample())
        except Exception as exc:
            entry.result.status, entry.result.note = FAILED, f"{type(exc).__name__}: {exc}"
        entry.spent_s += time.perf_counter() - t0

    def _prune(self, entry: _Entry, best: float) -> bool:
        if entry.candidate != DEFAULT and entry.median() > best * self.settings.prune_ratio:
            entry.result.status = PRUNED
            entry.result.note = f"{entry.median() / best:.2f}x the best after {len(entry.times)} samples"
            return True
        return False

    def _sample_block(self, entry: _Entry, entries: list[_Entry]) -> None:
        settings = self.settings
        while entry.result.status == OK and len(entry.times) < settings.max_samples:
            self._take(entry)
            if len(entry.times) == settings.min_samples:
                others = [e.median() for e in entries if e is not entry and e.times and e.result.status == OK]
                if others and self._prune(entry, min(others)):
                    return
            if len(entry.times) >= settings.min_samples and entry.spent_s >= settings.budget_s:
                return

    def _sample_rounds(self, live: list[_Entry]) -> None:
        settings = self.settings
        for _ in range(settings.min_samples):
            for entry in live:
                if entry.result.status == OK:
                    self._take(entry)
        live = [e for e in live if e.result.status == OK]
        if live:
            best = min(e.median() for e in live)
            live = [e for e in live if not self._prune(e, best)]
        while live:
            for entry in live:
                self._take(entry)
            live = [
                e
                for e in live
                if e.result.status == OK
                and e.spent_s < settings.budget_s
                and len(e.times) < settings.max_samples
            ]


def _bind(runner: Runner, ops: Operands, alpha: float, beta: float) -> Callable[[], None]:
    a, b, out, bias = ops.a, ops.b, ops.out, ops.bias
    if isinstance(ops, ScaledOperands):
        # A scaled runner takes the scales after the usual arguments (core/scaled.py).
        scaled: Any = runner
        scale_a, scale_b = ops.scale_a, ops.scale_b

        def scaled_call() -> None:
            scaled(a, b, out, alpha, beta, bias, scale_a, scale_b)

        return scaled_call

    def call() -> None:
        runner(a, b, out, alpha, beta, bias)

    return call
