"""Buckets for dynamic shapes: the m ranges, Problem.with_m, and bucket tuning on oneDNN."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from unimatmul.backend import DEFAULT, Backend, Candidate, Target
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.core.hookspecs import hookimpl
from unimatmul.core.plugins import PluginManager
from unimatmul.core.problem import Problem
from unimatmul.tuning.buckets import Buckets, bucket_range, check_points, choose
from unimatmul.tuning.harness import HarnessConfig
from unimatmul.tuning.selector import Selector, set_selector

FAST = HarnessConfig(warmup=1, min_samples=3, max_samples=10, budget_s=0.01, settle_s=0.0, max_sets=2)


# --- the ranges -------------------------------------------------------------------------


def test_pow2_ranges_cover_every_m_once() -> None:
    buckets = Buckets.parse("pow2:1024")
    assert buckets is not None
    assert buckets.reps == tuple(1 << i for i in range(11))
    assert [buckets.bounds(r) for r in (1, 2, 4, 8, 128, 1024)] == [
        (1, 1),
        (2, 2),
        (3, 5),
        (6, 11),
        (96, 191),
        (768, 1024),
    ]
    seen = [buckets.representative(m) for m in range(1, 1025)]
    for m, rep in zip(range(1, 1025), seen, strict=True):
        assert rep is not None
        lo, hi = buckets.bounds(rep)
        assert lo <= m <= hi
    assert buckets.representative(1025) is None  # nothing above the largest representative


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=12), st.integers(1, 5000))
def test_representative_is_the_nearest(reps: list[int], m: int) -> None:
    buckets = Buckets(tuple(reps))
    rep = buckets.representative(m)
    if m > max(reps):
        assert rep is None
        return
    assert rep is not None
    best = min(abs(r - m) for r in reps)
    assert abs(rep - m) == best
    # Ties go to the larger representative.
    assert rep == max(r for r in reps if abs(r - m) == best)
    lo, hi = buckets.bounds(rep)
    assert lo <= m <= hi


@pytest.mark.parametrize("text", ["off", "none", "0", ""])
def test_off(text: str) -> None:
    assert Buckets.parse(text) is None


@pytest.mark.parametrize("text", ["pow2:x", "pow2:0", "1,a", "-4,8", "fib"])
def test_bad_spec_is_a_clear_error(text: str) -> None:
    with pytest.raises(ValueError, match="bucket spec"):
        Buckets.parse(text)


def test_list_spec_and_sweep() -> None:
    buckets = Buckets.parse("512, 8,64")
    assert buckets is not None and buckets.reps == (8, 64, 512)
    assert buckets.bounds(8) == (1, 35)
    assert buckets.up_to(36) == [8, 64]
    assert buckets.up_to(35) == [8]


# --- Problem.with_m -------------------------------------------------------------------


@pytest.mark.parametrize(
    "problem",
    [
        Problem(m=100, n=64, k=32),
        Problem(m=100, n=64, k=32, trans_a=True),
        Problem(m=100, n=64, k=32, trans_b=True, epilogue="bias"),
        Problem(m=100, n=64, k=32, batch=4),
        Problem(m=100, n=64, k=32, batch=4, trans_a=True),
    ],
    ids=["NN", "TN", "NT-bias", "batched", "batched-TN"],
)
def test_with_m_keeps_a_tight_layout_tight(problem: Problem) -> None:
    moved = problem.with_m(128)
    assert moved.m == 128
    tight = Problem(
        m=128,
        n=problem.n,
        k=problem.k,
        trans_a=problem.trans_a,
        trans_b=problem.trans_b,
        batch=problem.batch,
        epilogue=problem.epilogue,
    )
    assert moved.key == tight.key
    assert moved.with_m(100).key == problem.key


def test_with_m_keeps_a_wide_leading_dimension() -> None:
    view = Problem(m=100, n=64, k=32, trans_a=True, lda=4096)
    assert view.with_m(128).lda == 4096
    assert view.with_m(128).with_m(100) == view


# --- the choice -----------------------------------------------------------------------


def test_choose_never_takes_a_candidate_slower_than_default_anywhere() -> None:
    ratios = {
        "x/fast-at-rep": [0.5, 0.6, 1.02],  # loses to Default at one edge
        "x/steady": [0.9, 0.92, 0.95],
        "x/noise": [0.999, 0.998, 1.0],  # never slower, but no real gain
        "x/level-at-one": [0.7, 0.995, 0.8],  # a big gain, but only level with Default at one point
    }
    assert choose(ratios, 0.01) == "x/steady"
    assert choose({"x/level-at-one": ratios["x/level-at-one"]}, 0.01) == DEFAULT.identity
    assert choose({"x/level-at-one": ratios["x/level-at-one"]}, 0.0) == "x/level-at-one"
    assert choose({k: v for k, v in ratios.items() if k != "x/steady"}, 0.01) == DEFAULT.identity
    assert choose({}, 0.01) == DEFAULT.identity


# --- bucket tuning on the real oneDNN backend ---------------------------------------------


@pytest.fixture
def selector(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Selector]:
    monkeypatch.setenv("UNIMATMUL_CACHE", str(tmp_path / "cache.msgpack"))
    monkeypatch.setenv("UNIMATMUL_BUCKETS", "pow2:256")
    selector = Selector(plugins=PluginManager(), settings=FAST)
    old = set_selector(selector)
    try:
        yield selector
    finally:
        set_selector(old)


def _numpy_target() -> Target:
    return Target(adapter_for_kind("numpy"), CPU)


def test_tune_bucket_on_onednn_serves_the_range_and_nothing_else(selector: Selector) -> None:
    target = _numpy_target()
    if not any(b.name == "onednn" for b in selector.backends_for(target)):
        pytest.skip("oneDNN is not available here")
    problem = Problem.from_shape(100, 96, 64)
    record = selector.tune_bucket(problem, target, selector.buckets or Buckets.parse("pow2"))
    assert record.problem == problem.with_m(128).key
    assert bucket_range(record) == (96, 191)
    info = record.settings["bucket"]
    assert info["points"] == [96, 112, 160, 191]
    # The winner is Default or a candidate never slower than Default at any point measured.
    if record.winner != DEFAULT.identity:
        ratios = [float(x) for x in info["ratios"][record.winner].split(",")]
        assert len(ratios) == 5 and max(ratios) <= 1.0
    # The stored bucket record now answers every m of the range, as the bucket's choice ...
    inside = selector.decide(problem.with_m(150), target, "cached")
    assert inside.source == "bucket"
    assert inside.record is not None and inside.record.winner == record.winner
    assert inside.runner.candidate.identity == record.winner
    # ... and runs correctly there.
    rng = np.random.default_rng(1)
    a = rng.standard_normal((150, 64)).astype(np.float32)
    b = rng.standard_normal((64, 96)).astype(np.float32)
    out = np.full((150, 96), np.nan, dtype=np.float32)
    inside.runner(a, b, out)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-5
    # Outside the range (another bucket, never tuned) and above every bucket: no answer.
    assert selector.lookup_bucket(problem.with_m(60), target) is None
    assert selector.lookup_bucket(problem.with_m(300), target) is None
    assert selector.decide(problem.with_m(60), target, "cached").source == "default"


def test_an_exact_record_is_not_a_bucket_record(selector: Selector) -> None:
    target = _numpy_target()
    problem = Problem.from_shape(128, 32, 32)
    selector.tune(problem, target)  # exact tuning at the representative: no edges checked
    assert selector.lookup_bucket(problem.with_m(120), target) is None
    assert selector.decide(problem.with_m(120), target, "cached").source == "default"


def test_bucketing_off_ignores_bucket_records(selector: Selector) -> None:
    target = _numpy_target()
    problem = Problem.from_shape(8, 32, 32)
    selector.tune_bucket(problem, target, Buckets.parse("pow2") or Buckets((8,)))
    selector.buckets = None
    assert selector.decide(problem.with_m(9), target, "cached").source == "default"


class _EdgeSlowRunner:
    """Correct everywhere; sleeps at every m but the representative's (or only at ``slow_m``)."""

    def __init__(self, candidate: Candidate, problem: Problem, rep: int, slow_m: int | None = None) -> None:
        self.candidate = candidate
        self.slow = problem.m != rep if slow_m is None else problem.m == slow_m

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        np.matmul(a, b, out=out)
        if self.slow:
            import time

            time.sleep(2e-3)


class _EdgeSlowBackend(Backend):
    name = "edgeslow"
    device_kinds = frozenset({"cpu"})
    array_kinds = frozenset({"numpy"})

    def __init__(self, rep: int, slow_m: int | None = None) -> None:
        self.rep = rep
        self.slow_m = slow_m

    def availability(self) -> str | None:
        return None

    def versions(self) -> dict[str, str]:
        return {"edgeslow": "1"}

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        return [Candidate.make(self.name, "k")]

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> _EdgeSlowRunner:
        return _EdgeSlowRunner(candidate, problem, self.rep, self.slow_m)


class _Plugin:
    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    @hookimpl
    def unimatmul_register_backends(self, register: Any) -> None:
        register(self.backend)


def test_a_kernel_slower_at_an_edge_is_not_the_buckets_choice(tmp_path: Path) -> None:
    plugins = PluginManager(load_entry_points=False)
    plugins.register(_Plugin(_EdgeSlowBackend(rep=64)), "edgeslow")
    from unimatmul.cache.protocol import open_store

    selector = Selector(plugins=plugins, store=open_store(tmp_path / "c.msgpack"), settings=FAST)
    buckets = Buckets.parse("pow2")
    assert buckets is not None
    record = selector.tune_bucket(Problem.from_shape(64, 48, 48), _numpy_target(), buckets)
    assert record.winner == DEFAULT.identity
    ratios_text = record.settings["bucket"]["ratios"].get("edgeslow/k")
    if ratios_text is not None:  # it tied Default at the representative (else it was pruned there)
        ratios = [float(x) for x in ratios_text.split(",")]
        assert len(ratios) == 5 and min(ratios[1:]) > 1.0  # 2 ms of sleep at every check point
    assert math.isfinite(record.winner_s)


def test_check_points_are_the_edges_and_the_middle_of_each_half() -> None:
    assert check_points(64, 48, 95) == [48, 56, 80, 95]
    assert check_points(1, 1, 1) == []
    assert check_points(2, 2, 2) == []
    assert check_points(4, 3, 5) == [3, 5]


def test_a_kernel_slower_only_inside_the_bucket_is_not_the_buckets_choice(tmp_path: Path) -> None:
    # Faster than Default at the representative and both edges, slow at m = 80 only: the
    # interior check must catch it (as seen on the CPU for one oneDNN kernel).
    plugins = PluginManager(load_entry_points=False)
    plugins.register(_Plugin(_EdgeSlowBackend(rep=64, slow_m=80)), "edgeslow")
    from unimatmul.cache.protocol import open_store

    # No pruning: at the representative it only ties Default, and noise past the prune ratio
    # there would drop it before the check points (the flake this test had, 1 run in 6).
    no_pruning = replace(FAST, prune_ratio=math.inf, first_prune_ratio=math.inf)
    selector = Selector(plugins=plugins, store=open_store(tmp_path / "c.msgpack"), settings=no_pruning)
    buckets = Buckets.parse("pow2")
    assert buckets is not None
    record = selector.tune_bucket(Problem.from_shape(64, 48, 48), _numpy_target(), buckets)
    assert record.winner == DEFAULT.identity
    # It ties Default at the representative (the same numpy product), so it is ranked and
    # measured at every check point: the slow interior point is seen.
    ratios_text = record.settings["bucket"]["ratios"]["edgeslow/k"]
    points = [64, *record.settings["bucket"]["points"]]
    ratios = dict(zip(points, map(float, ratios_text.split(",")), strict=True))
    assert ratios[80] > 1.0  # 2 ms of sleep there
    # Elsewhere the same product as Default: a finite time at every point (no check point
    # is left unmeasured by pruning), near 1 but for the noise of a loaded 2-core machine.
    assert all(math.isfinite(ratios[m]) for m in points)
    assert max(ratios[m] for m in (48, 56, 64, 95)) < 10.0


def test_cli_tune_buckets_sweeps_every_bucket_up_to_m(selector: Selector) -> None:
    import io

    from unimatmul.cli import main

    out = io.StringIO()
    code = main(["tune", "--shape", "20x24x16", "--buckets", "pow2:64", "--quiet"], out=out)
    assert code == 0, out.getvalue()
    text = out.getvalue()
    # Buckets 1, 2, 4, 8 and 16 (whose range 12-23 holds m=20); bucket 32 starts at m=24.
    for label in ("1x24x16 [m 1-1]", "4x24x16 [m 3-5]", "16x24x16 [m 12-23]"):
        assert label in text
    assert "32x24x16" not in text
    target = _numpy_target()
    for rep in (1, 2, 4, 8, 16):
        record = selector.lookup(Problem.from_shape(rep, 24, 16), target)
        assert record is not None and bucket_range(record) == (
            Buckets.parse("pow2:64") or Buckets((1,))
        ).bounds(rep)
    # A second run finds them all in the cache.
    out = io.StringIO()
    assert main(["tune", "--shape", "20x24x16", "--buckets", "pow2:64", "--quiet"], out=out) == 0
    assert out.getvalue().count("cached") == 5
