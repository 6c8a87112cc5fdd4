"""Buckets: one tuned choice for every m near a representative (dynamic shapes).

A serving workload meets a new m (batch size x tokens) at every step; tuning each one
is too slow and caching each one too big. A bucket is a range of m served by the
choice tuned at its representative m. The representatives are configurable
(``UNIMATMUL_BUCKETS``: ``pow2`` (the default: 1, 2, 4, ... 65536), ``pow2:MAX``, a
comma-separated list, or ``off``); an m belongs to the nearest representative (ties
to the larger), and no bucket reaches above the largest representative.

A bucket's choice is made by :func:`tune_bucket`: it tunes the representative, then
times the best candidates against Default at the bucket's two edges and at the middle
of each half (a kernel can lose inside a bucket while winning at both ends: seen on
the CPU at m = 80 in the bucket 48..95), and keeps the best candidate that beats
Default by the harness's ``min_gain`` (1%) at all five points (else Default). The record is stored under the representative's key with the bucket's
range in ``settings["bucket"]``; :func:`lookup_bucket` serves only such records, and
only for an m inside their own range, so changing the representatives later never
applies a choice outside the range it was checked on.
"""

from __future__ import annotations

import bisect
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from unimatmul.cache.record import OK, TuningRecord
from unimatmul.core.backend import DEFAULT, Candidate, DefaultRunner, Runner, Target
from unimatmul.core.problem import Problem
from unimatmul.tuning.harness import Harness

if TYPE_CHECKING:
    from unimatmul.tuning.selector import Selector

ENV = "UNIMATMUL_BUCKETS"
DEFAULT_SPEC = "pow2"
POW2_MAX = 1 << 16
#: How many of the representative's best candidates are timed again at the edges.
EDGE_CANDIDATES = 3


@dataclass(frozen=True)
class Buckets:
    """Sorted, distinct representative values of m; each one's bucket is an m range."""

    reps: tuple[int, ...]
    spec: str = ""

    def __post_init__(self) -> None:
        if not self.reps or any(not isinstance(r, int) or r < 1 for r in self.reps):
            msg = f"bucket representatives must be positive ints, got {self.reps!r}"
            raise ValueError(msg)
        if list(self.reps) != sorted(set(self.reps)):
            object.__setattr__(self, "reps", tuple(sorted(set(self.reps))))

    @classmethod
    def parse(cls, text: str) -> Buckets | None:
        """``pow2``, ``pow2:MAX``, ``off``/``none``, or ``M1,M2,...``; None means off."""
        spec = text.strip().lower()
        if spec in ("off", "none", "0", ""):
            return None
        if spec == "pow2" or spec.startswith("pow2:"):
            top = POW2_MAX
            if spec != "pow2":
                try:
                    top = int(spec[5:])
                except ValueError:
                    top = 0
                if top < 1:
                    msg = f"bad bucket spec {text!r}: pow2:MAX needs a positive MAX"
                    raise ValueError(msg)
            reps = tuple(1 << i for i in range(top.bit_length()) if 1 << i <= top)
            return cls(reps, spec)
        try:
            reps = tuple(int(part) for part in spec.split(",") if part.strip())
        except ValueError:
            reps = ()
        if not reps or min(reps) < 1:
            msg = f"bad bucket spec {text!r}: expected pow2, pow2:MAX, off or a list like 1,8,64,512"
            raise ValueError(msg)
        return cls(reps, spec)

    @classmethod
    def from_env(cls) -> Buckets | None:
        return cls.parse(os.environ.get(ENV, DEFAULT_SPEC))

    def representative(self, m: int) -> int | None:
        """The representative whose bucket holds ``m``; None above the largest one."""
        reps = self.reps
        if m > reps[-1]:
            return None
        i = bisect.bisect_left(reps, m)
        if reps[i] == m or i == 0:
            return reps[i]
        below, above = reps[i - 1], reps[i]
        return above if above - m <= m - below else below

    def bounds(self, rep: int) -> tuple[int, int]:
        """(lowest, highest) m in the bucket of the representative ``rep``."""
        i = self.reps.index(rep)
        lo = 1 if i == 0 else math.ceil((self.reps[i - 1] + rep) / 2)
        hi = rep if i == len(self.reps) - 1 else math.ceil((rep + self.reps[i + 1]) / 2) - 1
        return lo, hi

    def up_to(self, m: int) -> list[int]:
        """Every representative whose bucket starts at or below ``m`` (a sweep up to m)."""
        return [r for r in self.reps if self.bounds(r)[0] <= m]


def bucket_range(record: TuningRecord) -> tuple[int, int] | None:
    """The m range a record was checked on, when it is a bucket record."""
    info = record.settings.get("bucket")
    if not isinstance(info, dict):
        return None
    lo, hi = info.get("lo"), info.get("hi")
    if isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi:
        return lo, hi
    return None


def lookup_bucket(selector: Selector, problem: Problem, target: Target) -> TuningRecord | None:
    """The bucket record that covers ``problem`` (same problem but for m), if any."""
    buckets = selector.buckets
    if buckets is None:
        return None
    rep = buckets.representative(problem.m)
    if rep is None or rep == problem.m:
        return None  # m itself is a representative: its exact record was already looked up
    record = selector.lookup(problem.with_m(rep), target)
    if record is None:
        return None
    covered = bucket_range(record)
    if covered is None or not covered[0] <= problem.m <= covered[1]:
        return None
    candidate = Candidate.from_identity(record.winner)
    if candidate != DEFAULT and not selector.applies(problem, candidate, target):
        return None  # the bucket's kernel does not take this m: Default, quietly
    return record


def tune_bucket(
    selector: Selector,
    problem: Problem,
    target: Target,
    buckets: Buckets,
    *,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> TuningRecord:
    """Tune the bucket that holds ``problem.m``; store and return its record.

    The record's winner beats Default by ``min_gain`` at the representative, at either
    edge of the bucket, and halfway between the representative and each edge, as
    measured here (else the winner is Default).
    """
    rep = buckets.representative(problem.m)
    if rep is None:
        msg = f"m={problem.m} is above the largest bucket ({buckets.reps[-1]}); tune it exactly"
        raise ValueError(msg)
    lo, hi = buckets.bounds(rep)
    rep_problem = problem.with_m(rep)
    if not force:
        existing = selector.lookup(rep_problem, target)
        if existing is not None and bucket_range(existing) == (lo, hi):
            return existing
    started = time.perf_counter()
    record = selector.tune(rep_problem, target, force=True, store=False, progress=progress)
    ranked = sorted(
        (r for r in record.results if r.status == OK and r.median_s and r.identity != DEFAULT.identity),
        key=lambda r: r.median_s or math.inf,
    )[:EDGE_CANDIDATES]
    default_s = record.default_s
    ratios: dict[str, list[float]] = {
        r.identity: [(r.median_s or math.inf) / default_s if default_s else math.inf] for r in ranked
    }
    points = check_points(rep, lo, hi)
    for m in points:
        times = _time_at(selector, problem.with_m(m), target, [r.identity for r in ranked], progress)
        base = times.get(DEFAULT.identity)
        for identity, found in ratios.items():
            t = times.get(identity)
            found.append(t / base if t and base else math.inf)
    best = choose(ratios, selector.settings_for(target).min_gain)
    if best != record.winner:
        chosen = next((r for r in record.results if r.identity == best), None)
        record.winner = best
        record.winner_s = (chosen.median_s if chosen else None) or default_s or math.inf
    record.settings["bucket"] = {
        "rep": rep,
        "lo": lo,
        "hi": hi,
        "spec": buckets.spec,
        "points": points,
        # identity -> time / Default time at [rep, *points]; a comma list keeps nesting shallow
        "ratios": {k: ",".join(f"{x:.4g}" for x in v) for k, v in ratios.items()},
    }
    record.tune_s = time.perf_counter() - started
    platform = selector.platform(target)
    selector.store.put(platform.namespace, rep_problem.key, record)
    return record


def check_points(rep: int, lo: int, hi: int) -> list[int]:
    """Where a bucket's choice is checked besides its representative: the edges and
    the middle of each half, in increasing order, each once."""
    points = dict.fromkeys((lo, (lo + rep) // 2, (rep + hi + 1) // 2, hi))
    return [m for m in points if m != rep]


def choose(ratios: dict[str, list[float]], min_gain: float) -> str:
    """The bucket's choice from each candidate's time / Default's time at each point.

    A candidate qualifies when it beats Default by ``min_gain`` at every point (the
    rule the harness applies to a winner at its own problem): a candidate only level
    with Default at a checked point may lose between the points, by as much as the
    timings' noise (seen on the H200: a choice level at its checks measured 1.017x
    Default at an m between them). The qualifying one with the best geometric mean wins.
    """
    best, best_score = DEFAULT.identity, 1.0 - min_gain
    for identity, found in ratios.items():
        if not found or max(found) > 1.0 - min_gain:
            continue
        score = math.exp(sum(math.log(max(x, 1e-12)) for x in found) / len(found))
        if score <= best_score:
            best, best_score = identity, score
    return best


def _time_at(
    selector: Selector,
    problem: Problem,
    target: Target,
    identities: list[str],
    progress: Callable[[str], None] | None,
) -> dict[str, float]:
    """Median seconds of Default and of the given candidates on one problem."""
    entries: list[tuple[Candidate, Callable[[], Runner]]] = [
        (DEFAULT, lambda: DefaultRunner(target.adapter, problem.activation))
    ]
    for identity in identities:
        entries.append((Candidate.from_identity(identity), _preparer(selector, problem, identity, target)))
    harness = Harness(selector.timer_for(target), selector.settings_for(target))
    record = harness.measure(problem, target, entries, progress=progress)
    return {r.identity: r.median_s for r in record.results if r.status == OK and r.median_s}


def _preparer(selector: Selector, problem: Problem, identity: str, target: Target) -> Callable[[], Any]:
    return lambda: selector.prepare(problem, Candidate.from_identity(identity), target)
