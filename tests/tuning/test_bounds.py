"""The confidence bounds a win must clear, and the canonical choice among ties."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest

from unimatmul.tuning.bounds import (
    EXACT_TOTAL,
    _null_counts,
    clearly_faster,
    rank_of_bound,
    ratio_bounds,
    shift_bounds,
    speedup_bounds,
    within_noise,
)


@pytest.mark.parametrize(("m", "n"), [(1, 1), (2, 3), (3, 3), (4, 2), (5, 5), (3, 7)])
def test_the_null_distribution_is_that_of_every_ordering(m: int, n: int) -> None:
    # Enumerate every way to place m samples among m + n and count, for each, the pairs
    # (one of the m, one of the n) in which the first is below the second.
    counts: Counter[int] = Counter()
    for positions in itertools.combinations(range(m + n), m):
        others = [p for p in range(m + n) if p not in positions]
        counts[sum(1 for p in positions for q in others if p < q)] += 1
    assert _null_counts(m, n) == tuple(counts[u] for u in range(m * n + 1))


def test_ranks_match_the_published_critical_values() -> None:
    # One-sided 5 % critical values of the Mann-Whitney U (reject when U <= c): the
    # bound is the (c + 1)-th smallest difference.
    assert rank_of_bound(3, 3, 0.95) == 1  # P(U = 0) = 1/20
    assert rank_of_bound(5, 5, 0.95) == 4 + 1
    assert rank_of_bound(10, 10, 0.95) == 27 + 1
    assert rank_of_bound(20, 20, 0.95) == 138 + 1
    assert rank_of_bound(2, 2, 0.95) == 0  # 1/6 of orderings put them apart: no bound at 95 %
    assert rank_of_bound(0, 5, 0.95) == 0


def test_the_normal_approximation_takes_over_close_to_the_exact_rank() -> None:
    m, n = EXACT_TOTAL // 2, EXACT_TOTAL // 2
    exact = rank_of_bound(m, n, 0.95)
    approx = rank_of_bound(m + 1, n, 0.95)  # past the exact limit
    assert exact > 0 and abs(approx - exact - n / 2) <= 3  # one more sample adds about n/2 pairs


def test_too_few_samples_bound_nothing() -> None:
    assert shift_bounds([2.0, 2.0], [1.0, 1.0], 0.95) == (0.0, math.inf)
    assert not clearly_faster([2.0, 2.0], [1.0, 1.0], 0.95, 0.01)


def test_equal_samples_bound_the_ratio_exactly() -> None:
    low, high = speedup_bounds([2e-3] * 5, [1e-3] * 5, 0.95)
    assert low == pytest.approx(2.0) and high == pytest.approx(2.0)


def test_the_lower_bound_covers_the_true_ratio_at_its_level() -> None:
    # Log-normal noise of 20 % on both (a loaded CPU), a true speedup of 1.3: the lower
    # bound is below 1.3 in at least 95 % of draws, and above 1 in most of them.
    rng = np.random.default_rng(7)
    trials, below, clear = 2000, 0, 0
    for _ in range(trials):
        default = 1.3e-3 * np.exp(rng.normal(0, 0.2, 8))
        kernel = 1.0e-3 * np.exp(rng.normal(0, 0.2, 8))
        low, high = speedup_bounds(list(default), list(kernel), 0.95)
        below += low <= 1.3
        clear += low > 1.0
        assert low <= high
    assert below / trials >= 0.94
    assert clear / trials >= 0.5


def test_one_outlying_sample_moves_the_bound_by_one_rank() -> None:
    default = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0]
    kernel = [0.5, 0.51, 0.49, 0.5, 0.52, 0.5]
    quiet = speedup_bounds(default, kernel, 0.95)[0]
    busy = speedup_bounds(default, [*kernel[:-1], 50.0], 0.95)[0]  # one sample 100x slow
    assert quiet > 1.8 and busy > 1.8


def test_ties_go_to_the_first_identity_whatever_the_order_or_the_fastest() -> None:
    a = [1.00, 1.02, 0.99, 1.01, 1.00]
    b = [0.98, 1.01, 0.99, 1.00, 0.99]  # a hair faster than a: within noise of it
    slow = [1.3, 1.31, 1.29, 1.3, 1.3]  # clearly slower
    for samples in ({"x/b": b, "x/a": a, "x/slow": slow}, {"x/slow": slow, "x/a": a, "x/b": b}):
        ties = within_noise(samples, 0.95, 0.01, 1.05)
        assert ties.fastest == "x/b"
        assert ties.tied == ("x/a", "x/b") and ties.pick == "x/a"


def test_a_clearly_faster_kernel_is_alone_and_a_far_one_is_never_tied() -> None:
    fast = [0.80, 0.81, 0.79, 0.80, 0.80]
    a = [1.00, 1.02, 0.99, 1.01, 1.00]
    assert within_noise({"x/a": a, "x/z": fast}, 0.95, 0.01, 1.05).tied == ("x/z",)
    # Two samples bound nothing, so they cannot be told apart from the fastest, but a
    # median beyond the tie ratio is never within noise of it.
    assert within_noise({"x/a": [1.1, 1.1], "x/z": [1.0, 1.0]}, 0.95, 0.01, 1.2).pick == "x/a"
    assert within_noise({"x/a": [1.1, 1.1], "x/z": [1.0, 1.0]}, 0.95, 0.01, 1.05).pick == "x/z"


def test_paired_ratios_are_bounded_by_the_sign_test() -> None:
    # One-sided 5 % sign test: n = 5 needs every ratio (P = 1/32), n = 10 allows one below
    # the bound's rank (P(X <= 1) = 11/1024), n = 20 five (P(X <= 5) = 0.021).
    assert ratio_bounds([1.3, 1.2, 1.25, 1.4, 1.1], 0.95) == (1.1, 1.4)
    ten = [0.9, 1.1, 1.2, 1.2, 1.3, 1.3, 1.3, 1.4, 1.5, 1.6]
    assert ratio_bounds(ten, 0.95) == (1.1, 1.5)
    assert ratio_bounds([1.0 + i / 100 for i in range(20)], 0.95)[0] == pytest.approx(1.05)
    assert ratio_bounds([1.2, 1.3, 1.1, 1.2], 0.95) == (0.0, math.inf)  # 1/16 > 5 %
