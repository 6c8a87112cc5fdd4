"""What ``unimatmul tune`` tunes: shapes, presets, a record file, and their buckets.

A :class:`TuneJob` is one problem on one target, tuned exactly or as a bucket.
``--from FILE`` reads a record file (``UNIMATMUL_MODE=record``) or PyTorch TunableOp's
untuned file; each recorded problem is tuned on the array library and device it was
met on, unless ``--array``/``--device`` say otherwise. ``--buckets [SPEC]`` tunes,
for each problem, every bucket from m=1 up to the bucket of its m (or of ``--max-m``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unimatmul.cache.record import TuningRecord
from unimatmul.core.backend import Target
from unimatmul.core.problem import Problem
from unimatmul.tuning.buckets import Buckets, tune_bucket


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

    def run(self, selector: Any, *, force: bool) -> tuple[TuningRecord, str]:
        """(record, "tuned" or "cache")."""
        if self.buckets is not None:
            before = None if force else _bucket_record(selector, self)
            if before is not None:
                return before, "cache"
            return tune_bucket(selector, self.problem, self.target, self.buckets, force=True), "tuned"
        before = None if force else selector.lookup(self.problem, self.target)
        if before is not None:
            return before, "cache"
        return selector.tune(self.problem, self.target, force=force), "tuned"


def _bucket_record(selector: Any, job: TuneJob) -> TuningRecord | None:
    from unimatmul.tuning.buckets import bucket_range

    assert job.buckets is not None
    record: TuningRecord | None = selector.lookup(job.problem, job.target)
    rep = job.buckets.representative(job.problem.m)
    if record is None or rep is None or bucket_range(record) != job.buckets.bounds(rep):
        return None
    return record


def build_jobs(
    args: argparse.Namespace,
    shapes: Callable[[argparse.Namespace], list[Problem]],
    target: Callable[[str | None, str | None], Target],
) -> tuple[list[TuneJob], list[str]]:
    """The distinct jobs the arguments ask for, and notes on what was skipped."""
    jobs: list[TuneJob] = []
    notes: list[str] = []
    if args.shape or args.preset or not args.from_file:
        default = target(args.array, args.device)
        jobs.extend(TuneJob(p, default) for p in shapes(args))
    if args.from_file:
        from unimatmul.tuning.recording import read_problems

        try:
            found = read_problems(args.from_file)
        except OSError as exc:
            raise FileNotFoundError(f"cannot read {args.from_file}: {exc}") from exc
        targets: dict[tuple[str, str], Target] = {}
        for item in found.problems:
            array = args.array or item.array
            device = args.device or item.device or "cuda"
            key = (array, device)
            if key not in targets:
                targets[key] = target(array, device)
            jobs.append(TuneJob(item.problem, targets[key]))
        for line_no, why in found.skipped:
            notes.append(f"{args.from_file}:{line_no}: skipped ({why})")
    if args.buckets:
        spec = Buckets.parse(args.buckets)
        if spec is None:
            raise ValueError(f"--buckets {args.buckets!r} turns bucketing off: nothing to tune")
        jobs = _bucket_jobs(jobs, spec, args.max_m, notes)
    unique: dict[tuple[str, Target, bool], TuneJob] = {}
    for job in jobs:
        unique.setdefault((job.problem.key, job.target, job.buckets is not None), job)
    return list(unique.values()), notes


def _bucket_jobs(jobs: list[TuneJob], spec: Buckets, max_m: int | None, notes: list[str]) -> list[TuneJob]:
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
