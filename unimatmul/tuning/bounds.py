"""Confidence bounds on a speedup from samples, and the canonical choice among ties.

A tuned choice replaces Default only when its advantage is clear from the samples, and
among kernels the samples cannot tell apart a fixed rule picks, so that two runs (or two
ranks) that measured the same machine choose alike without talking to each other.

The bound is distribution-free: samples are compared on a log scale, and the shift
between two sets of samples (the log of the ratio of their medians, under the usual
shift model) gets the Hodges-Lehmann confidence interval of the Mann-Whitney test: the
``k``-th smallest of the ``m x n`` pairwise differences, ``k`` from the exact null
distribution of the rank-sum statistic (a normal approximation for large sets). It makes
no assumption about the shape of the noise, and one outlying sample moves it by one rank.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: Sets of at most this many samples together use the exact null distribution (its
#: counts fit an int64 up to C(62, 31)); larger ones the normal approximation.
EXACT_TOTAL = 60


@functools.cache
def _null_counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the C(m+n, m) orderings of two sets of sizes m and n give each value
    0..m*n of the Mann-Whitney statistic: the coefficients of the Gaussian binomial
    [m+n choose m]_q = prod_{i=1..m} (1 - q^(n+i)) / (1 - q^i)."""
    size = m * n + 1
    counts = [0] * size
    counts[0] = 1
    for i in range(1, m + 1):
        shift = n + i
        for j in range(size - 1, shift - 1, -1):  # times (1 - q^(n+i))
            counts[j] -= counts[j - shift]
        for j in range(i, size):  # divided by (1 - q^i): a running sum with stride i
            counts[j] += counts[j - i]
    return tuple(counts)


@functools.cache
def rank_of_bound(m: int, n: int, level: float) -> int:
    """The rank ``k`` (1-based) of the pairwise difference that is a one-sided lower
    bound on the shift at ``level``: the largest ``k`` with P(U <= k - 1) <= 1 - level
    under the null; 0 when the sets are too small for any bound at that level."""
    if m < 1 or n < 1:
        return 0
    alpha = 1.0 - level
    if m + n <= EXACT_TOTAL:
        counts = _null_counts(m, n)
        allowed = alpha * math.comb(m + n, m) * (1 + 1e-12)
        below = 0
        k = 0
        for u, count in enumerate(counts):
            below += count
            if below > allowed:
                break
            k = u + 1
        return k
    mean = m * n / 2
    sd = math.sqrt(m * n * (m + n + 1) / 12)
    z = statistics.NormalDist().inv_cdf(level)
    return max(0, math.floor(mean - z * sd + 0.5))


def shift_bounds(slow: Sequence[float], fast: Sequence[float], level: float) -> tuple[float, float]:
    """A ``level`` one-sided lower and upper bound on median(slow) / median(fast) (each
    holds at ``level`` on its own); (0, inf) when there are too few samples to say."""
    x = [math.log(v) for v in slow if v > 0 and math.isfinite(v)]
    y = [math.log(v) for v in fast if v > 0 and math.isfinite(v)]
    k = rank_of_bound(len(x), len(y), level)
    if k == 0:
        return 0.0, math.inf
    differences = sorted(a - b for a in x for b in y)
    return math.exp(differences[k - 1]), math.exp(differences[-k])


@functools.cache
def _sign_rank(n: int, level: float) -> int:
    """The rank ``k`` (1-based) of the sorted paired ratio that is a one-sided lower bound
    on their median at ``level`` (the sign test: P(Binomial(n, 1/2) <= k - 1) <= 1 - level);
    0 when ``n`` is too small."""
    allowed = (1.0 - level) * 2**n * (1 + 1e-12)
    below, k = 0, 0
    for j in range(n + 1):
        below += math.comb(n, j)
        if below > allowed:
            break
        k = j + 1
    return k


def ratio_bounds(ratios: Sequence[float], level: float) -> tuple[float, float]:
    """A ``level`` one-sided lower and upper bound on the median of paired ratios (each a
    Default sample over the kernel's sample taken next to it: what drifts, drifts for
    both); (0, inf) when there are too few to say."""
    found = sorted(r for r in ratios if r > 0 and math.isfinite(r))
    k = _sign_rank(len(found), level)
    if k == 0:
        return 0.0, math.inf
    return found[k - 1], found[-k]


def speedup_bounds(
    default_s: Sequence[float], kernel_s: Sequence[float], level: float
) -> tuple[float, float]:
    """Bounds on a kernel's speedup over Default (median(Default) / median(kernel)) from
    their samples, at confidence ``level`` each: (at least, at most)."""
    return shift_bounds(default_s, kernel_s, level)


def clearly_faster(
    default_s: Sequence[float], kernel_s: Sequence[float], level: float, min_gain: float
) -> bool:
    """Whether the samples say, at ``level``, that the kernel beats Default by ``min_gain``."""
    return speedup_bounds(default_s, kernel_s, level)[0] >= 1.0 + min_gain


def canonical_order(identity: str) -> str:
    """The key of the fixed order in which ties are broken: the candidate's identity, as
    text (the same on every machine and in every run, whatever order the candidates were
    listed or measured in)."""
    return identity


@dataclass(frozen=True)
class Ties:
    """The candidates within noise of the fastest, and the one the canonical rule picks."""

    fastest: str
    tied: tuple[str, ...]  # in canonical order, the pick first

    @property
    def pick(self) -> str:
        return self.tied[0]


def within_noise(
    samples: Mapping[str, Sequence[float]], level: float, min_gain: float, max_ratio: float
) -> Ties:
    """Which of ``samples`` (identity -> seconds per call, every one measured ok) cannot be
    told apart from the fastest by median: those not clearly slower than it by more than
    ``min_gain`` at ``level``, and at most ``max_ratio`` times its median. The pick is the
    first of them in :func:`canonical_order`."""
    medians = {identity: statistics.median(times) for identity, times in samples.items() if times}
    fastest = min(medians, key=lambda identity: (medians[identity], canonical_order(identity)))
    best = samples[fastest]
    tied = [
        identity
        for identity in medians
        if identity == fastest
        or (
            medians[identity] <= medians[fastest] * max_ratio
            and shift_bounds(samples[identity], best, level)[0] < 1.0 + min_gain
        )
    ]
    return Ties(fastest, tuple(sorted(tied, key=canonical_order)))
