"""Buckets: one tuned choice for every m near a representative (dynamic shapes).

A serving workload meets a new m (batch size x tokens) at every step; tuning each one
is too slow and caching each one too big. A bucket is a range of m served by the
choice tuned at its representative m. The representatives are configurable
(``UNIMATMUL_BUCKETS``: ``pow2`` (the default: 1, 2, 4, ... 65536), ``pow2:MAX``, a
comma-separated list, or ``off``); an m belongs to the nearest representative (ties
to the larger), and no bucket reaches above the largest representative.

This module holds the pure parts (which bucket holds an m, where a bucket's choice is
checked, which candidate qualifies). A bucket's choice is made by
:meth:`unimatmul.tuning.tuner.Tuner.tune_bucket`: it tunes the representative, then
times the best candidates against Default at the bucket's two edges and at the middle
of each half (a kernel can lose inside a bucket while winning at both ends: seen on
the CPU at m = 80 in the bucket 48..95), and keeps the best candidate that beats
Default by the harness's ``min_gain`` (1%) at all five points (else Default). The
record is stored under the representative's key with the bucket's range in
``settings["bucket"]``; :meth:`unimatmul.tuning.selector.Selector.lookup_bucket` serves
only such records, and only for an m inside their own range, so changing the
representatives later never applies a choice outside the range it was checked on.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from unimatmul import settings
from unimatmul.cache.record import TuningRecord
from unimatmul.core._backend import DEFAULT

ENV = settings.BUCKETS.name
DEFAULT_SPEC = settings.BUCKETS.default
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
        """The buckets ``UNIMATMUL_BUCKETS`` names; SettingError (naming it) for a bad spec."""
        text = settings.BUCKETS.get()
        try:
            return cls.parse(text)
        except ValueError as exc:
            raise settings.SettingError(f"{ENV}={text!r}: {exc}", name=ENV) from None

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
