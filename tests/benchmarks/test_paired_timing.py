"""benchmarks/paired_timing.py: input sets, graph sizes, round counts, the A B / B A order, the statistics."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import paired_timing as pt

MB = 1 << 20


def test_rotation_sets_cover_more_than_three_l2_sizes() -> None:
    l2 = 50 * MB
    for touched in (3 * MB, 7 * MB, 50 * MB, 60 * MB):
        sets = pt.rotation_sets(touched, l2)
        assert sets * touched > 3 * l2
        assert (sets - 1) * touched < pt.L2_FACTOR * l2 or sets == 2  # no more than needed
    # A call that touches more than 3.2x L2 alone: two sets, the least.
    assert pt.rotation_sets(500 * MB, l2) == 2
    # Products under 3.2x L2 / MAX_SETS (~2.6 MB here): the set count is capped.
    assert pt.rotation_sets(1 * MB, l2) == pt.rotation_sets(1000, l2) == pt.MAX_SETS


def test_rotation_sets_of_a_decode_expert_product_copy_the_whole_weight() -> None:
    # Qwen3-30B-A3B gate_up at 1 token: 8 of 128 experts touched (8 x 1536 x 2048 bf16, ~48 MiB),
    # a copy allocates all 128 experts (768 MiB): 4 sets, under the 8 GiB cap.
    touched = 2 * 8 * 1536 * 2048
    whole = 2 * 128 * 1536 * 2048
    sets = pt.rotation_sets(touched, 50 * MB, set_bytes=whole)
    assert sets == 4 and sets * touched > 3 * 50 * MB and sets * whole <= pt.MAX_ROTATION_BYTES
    # The memory cap wins over the L2 target, and one set is always allowed.
    assert pt.rotation_sets(touched, 50 * MB, set_bytes=whole, max_bytes=2 * whole + 1) == 2
    assert pt.rotation_sets(touched, 50 * MB, set_bytes=whole, max_bytes=whole // 2) == 1


@pytest.mark.parametrize(
    ("touched", "l2", "set_bytes", "word"),
    [(0, 50 * MB, None, "touched_bytes"), (MB, 0, None, "l2_bytes"), (MB, 50 * MB, -1, "set_bytes")],
)
def test_rotation_sets_reject_sizes_that_are_not_positive(
    touched: int, l2: int, set_bytes: int | None, word: str
) -> None:
    with pytest.raises(ValueError, match=word):
        pt.rotation_sets(touched, l2, set_bytes=set_bytes)


def test_calls_per_graph_stays_short_and_calls_every_set() -> None:
    assert pt.calls_per_graph(20e-6, 4) == 20  # short calls: MIN_CALLS, a multiple of the sets
    assert pt.calls_per_graph(20e-6, 3) == 21
    assert pt.calls_per_graph(1e-3, 2) == 6  # 5 ms a replay, rounded up to whole passes
    assert pt.calls_per_graph(6e-3, 2) == 2  # one call past the replay target: each set once
    assert pt.calls_per_graph(20e-6, 64) == 64
    with pytest.raises(ValueError, match="sets"):
        pt.calls_per_graph(1e-3, 0)


def test_round_count_fits_the_budget_within_bounds() -> None:
    assert pt.round_count(0.04, 2.0) == 50
    assert pt.round_count(1e-4, 2.0) == pt.MAX_ROUNDS
    assert pt.round_count(1.0, 2.0) == pt.MIN_ROUNDS
    assert pt.round_count(0.0, 2.0) == pt.MAX_ROUNDS
    assert pt.round_count(0.5, 2.0, min_rounds=1, max_rounds=3) == 3
    with pytest.raises(ValueError, match="min_rounds"):
        pt.round_count(0.1, 2.0, min_rounds=9, max_rounds=3)


def test_the_whole_moe_run_times_in_about_four_minutes() -> None:
    # 72 products; the slowest (8192 tokens) take up to 6 ms a call, two sets of inputs.
    def product_s(call_s: float) -> float:
        replay = pt.calls_per_graph(call_s, 2) * call_s
        round_s = 2 * replay
        return (1 + pt.round_count(round_s)) * round_s

    worst = 72 * product_s(6e-3)
    assert worst < 240 * 1.1  # even if every product were the slowest


def test_round_orders_flip_each_round() -> None:
    assert pt.round_orders(["a", "b"], 4) == [("a", "b"), ("b", "a"), ("a", "b"), ("b", "a")]
    assert pt.round_orders(["a", "b", "c"], 2) == [("a", "b", "c"), ("c", "b", "a")]
    with pytest.raises(ValueError, match="two or more"):
        pt.round_orders(["a"], 2)
    with pytest.raises(ValueError, match="distinct"):
        pt.round_orders(["a", "a"], 2)


class DriftingDevice:
    """A device whose speed drifts between calls: every call costs its work times a factor
    that grows by ``drift`` per call (the GPU's clocks falling as it heats up)."""

    def __init__(self, drift: float) -> None:
        self.drift = drift
        self.calls = 0
        self.log: list[str] = []

    def sampler(self, name: str, work: float) -> pt.Sampler:
        def sample() -> float:
            self.log.append(name)
            self.calls += 1
            return work * (1 + self.drift * self.calls)

        return sample


def test_run_rounds_alternates_and_drops_the_warm_up() -> None:
    device = DriftingDevice(0.0)
    times = pt.run_rounds({"a": device.sampler("a", 1.0), "b": device.sampler("b", 2.0)}, 3, warmup=1)
    assert device.log == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert times == {"a": [1.0, 1.0, 1.0], "b": [2.0, 2.0, 2.0]}


def test_the_median_of_round_ratios_cancels_drift_that_the_medians_do_not() -> None:
    # The same kernel on both sides, the device slowing 15 % over the run. Timed the old
    # way (all of one side's rounds, then the other's), the ratio of medians is off by
    # ~7 %; alternating A B, B A, the median of per-round ratios is 1 within 0.5 %.
    rounds = 61
    blocked = DriftingDevice(0.15 / (2 * rounds))
    a = [blocked.sampler("a", 1.0)() for _ in range(rounds)]
    b = [blocked.sampler("b", 1.0)() for _ in range(rounds)]
    assert abs(statistics.median(a) / statistics.median(b) - 1) > 0.05
    device = DriftingDevice(0.15 / (2 * rounds))
    times = pt.run_rounds({"a": device.sampler("a", 1.0), "b": device.sampler("b", 1.0)}, rounds, warmup=0)
    got = pt.paired_stats(times["a"], times["b"])
    assert got["speedup"] == pytest.approx(1.0, abs=5e-3)
    assert got["round_ratios"]["rounds"] == rounds
    assert got["round_ratios"]["min"] < 1 < got["round_ratios"]["max"]
    # A real difference survives: b 10 % faster.
    device = DriftingDevice(0.15 / (2 * rounds))
    times = pt.run_rounds({"a": device.sampler("a", 1.1), "b": device.sampler("b", 1.0)}, rounds, warmup=0)
    assert pt.paired_stats(times["a"], times["b"])["speedup"] == pytest.approx(1.1, rel=5e-3)


def test_paired_stats_reports_both_sides_and_the_spread() -> None:
    got = pt.paired_stats([2.0, 4.0, 3.0], [1.0, 2.0, 3.0])
    assert got["numerator_s"] == 3.0 and got["denominator_s"] == 2.0
    assert got["ratio_of_medians"] == 1.5
    assert got["speedup"] == 2.0  # ratios 2, 2, 1
    assert got["round_ratios"] == {"min": 1.0, "max": 2.0, "rounds": 3}


@pytest.mark.parametrize(
    ("num", "den", "word"),
    [
        ([1.0], [1.0, 2.0], "same number"),
        ([], [], "same number"),
        ([1.0], [0.0], "positive"),
        ([float("nan")], [1.0], "positive"),
    ],
)
def test_paired_stats_rejects_unpaired_or_bad_times(num: list[float], den: list[float], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        pt.paired_stats(num, den)


def test_time_candidates_on_the_host_clock_times_real_products() -> None:
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    sets = [(torch.randn(16, 16, generator=gen), torch.randn(16, 16, generator=gen)) for _ in range(3)]
    small = [lambda s=s: torch.mm(s[0], s[1]) for s in sets]
    big_sets = [
        (torch.randn(384, 384, generator=gen), torch.randn(384, 384, generator=gen)) for _ in range(3)
    ]
    big = [lambda s=s: torch.mm(s[0], s[1]) for s in big_sets]
    timing = pt.time_candidates({"big": big, "small": small}, budget_s=0.2, min_rounds=9, max_rounds=15)
    assert 9 <= timing.rounds <= 15
    assert all(len(v) == timing.rounds for v in timing.times.values())
    assert timing.calls == {"big": 3, "small": 3}  # the sets; a host sample runs >= 0.1 ms of them
    assert timing.modes == {"big": "host clock", "small": "host clock"}
    stats = timing.stats("big", "small")
    # 13824x the flops: the small product is far faster even on a busy CPU.
    assert stats["speedup"] > 10
    assert "median of" in stats["speedup_method"] and "host clock" in stats["speedup_method"]
    with pytest.raises(ValueError, match="no calls for small"):
        pt.time_candidates({"big": big, "small": []})


def test_method_text_names_graphs_only_when_both_sides_were_graphs() -> None:
    assert "one CUDA graph" in pt.method_text(41, ["graph", "graph"])
    assert "eager (RuntimeError: x)" in pt.method_text(41, ["graph", "eager (RuntimeError: x)"])
