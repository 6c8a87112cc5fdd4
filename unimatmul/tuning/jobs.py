"""Tuning jobs: a list of problems to tune (a preset, a record file, a model's products),
each exactly or as the buckets of m that serve it (dynamic shapes).

A :class:`TuneJob` is one problem on one target; :meth:`TuneJob.run` asks the Selector
for its stored record or tunes it. :func:`bucket_jobs` turns each problem into the
jobs of every bucket from m = 1 up to its own m (or a given ``max_m``). The CLI's
``unimatmul tune`` and ``unimatmul.torch.warmup`` build their work from these.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from unimatmul.cache.record import TuningRecord
from unimatmul.core._backend import Target
from unimatmul.core.problem import Problem
from unimatmul.tuning.buckets import Buckets, bucket_range
from unimatmul.tuning.selector import Selector
from unimatmul.tuning.tuner import Progress


@dataclass(frozen=True)
class TuneJob:
    problem: Problem
    target: Target
    buckets: Buckets | None = None

    @property
    def label(self) -> str:
        if self.buckets is None:
            return self.problem.shape_text
        rep = self.buckets.representative(self.problem.m)
        assert rep is not None
        lo, hi = self.buckets.bounds(rep)
        return f"{self.problem.shape_text} [m {lo}-{hi}]"

    def stored(self, selector: Selector) -> TuningRecord | None:
        """The record the cache already holds for this job (a bucket's only if it covers
        the same range), else None."""
        record = selector.lookup(self.problem, self.target)
        if record is None or self.buckets is None:
            return record
        rep = self.buckets.representative(self.problem.m)
        if rep is None or bucket_range(record) != self.buckets.bounds(rep):
            return None
        return record

    def run(
        self,
        selector: Selector,
        *,
        force: bool = False,
        progress: Progress = None,
        cap_s: float | None = None,
    ) -> tuple[TuningRecord, str]:
        """(record, ``"tuned"`` or ``"cache"``)."""
        before = None if force else self.stored(selector)
        if before is not None:
            return before, "cache"
        return self.tune(selector, progress=progress, cap_s=cap_s), "tuned"

    def tune(
        self,
        selector: Selector,
        *,
        store: bool = True,
        progress: Progress = None,
        cap_s: float | None = None,
    ) -> TuningRecord:
        """Tune this job now (whatever the cache holds); ``store=False`` keeps the
        record out of the cache (distributed tuning stores it once, elsewhere);
        ``cap_s``: the most seconds its measuring may take."""
        if self.buckets is not None:
            return selector.tune_bucket(
                self.problem,
                self.target,
                self.buckets,
                force=True,
                store=store,
                progress=progress,
                cap_s=cap_s,
            )
        return selector.tune(
            self.problem, self.target, force=True, store=store, progress=progress, cap_s=cap_s
        )


def bucket_jobs(jobs: Iterable[TuneJob], spec: Buckets, max_m: int | None, notes: list[str]) -> list[TuneJob]:
    """Each job's buckets from m = 1 up to its m (or ``max_m``); a problem above every
    bucket is also tuned exactly. What was left out is said in ``notes``."""
    out: list[TuneJob] = []
    for job in jobs:
        top = max_m or job.problem.m
        reps = spec.up_to(top)
        if not reps:
            notes.append(f"{job.problem.shape_text}: no bucket at or below m={top}")
        for rep in reps:
            out.append(TuneJob(job.problem.with_m(rep), job.target, spec))
        if job.problem.m > spec.reps[-1] and max_m is None:
            out.append(TuneJob(job.problem, job.target))  # above every bucket: tune it exactly
    return out


def distinct(jobs: Iterable[TuneJob]) -> list[TuneJob]:
    """Each (problem, target, exact or bucket) once, in order."""
    unique: dict[tuple[str, Target, bool], TuneJob] = {}
    for job in jobs:
        unique.setdefault((job.problem.key, job.target, job.buckets is not None), job)
    return list(unique.values())
