"""Noise is never stored as fact: a win is measured again against Default, sample by sample.

Tuning on a busy machine once stored noise (``1x1024x1024 ... 24.26x``;
Default recorded at 24 ms for a 97x509x31 product). A scripted timer plays the busy
moment exactly, so that these verdicts do not depend on this machine's own load.
"""

from __future__ import annotations

import io
import json
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness_fakes import KernelBackend, right

from unimatmul.backend import DEFAULT, Candidate, Runner, Target
from unimatmul.cache.protocol import open_store
from unimatmul.cache.record import OK, PRUNED, TuningRecord
from unimatmul.cli import main as cli_main
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.core.plugins import PluginManager
from unimatmul.core.problem import Problem
from unimatmul.core.runners import DefaultRunner
from unimatmul.testing import ScriptedTimer, registered
from unimatmul.tuning import harness as harness_module
from unimatmul.tuning.harness import HIGH, LOW, Harness, HarnessConfig, spread
from unimatmul.tuning.selector import Selector

NUMPY = Target(adapter_for_kind("numpy"), CPU)
PROBLEM = Problem.from_shape(97, 509, 31)

Script = Callable[[int], float]  # sample number (0: the first) -> seconds per call


def settings(**overrides: Any) -> HarnessConfig:
    # The scripted timer is the only source of noise here: this machine's load is not.
    base = HarnessConfig(
        warmup=1, min_samples=3, max_samples=6, budget_s=10.0, settle_s=0.0, max_sets=1, busy_load=math.inf
    )
    for key, value in overrides.items():
        setattr(base, key, value)
    return base


def measure(scripts: Sequence[Script], harness_settings: HarnessConfig) -> TuningRecord:
    fast = Candidate.make("t", "fast")
    entries: list[tuple[Candidate, Callable[[], Runner]]] = [
        (DEFAULT, lambda: DefaultRunner(NUMPY.adapter)),
        (fast, lambda: DefaultRunner(NUMPY.adapter)),  # right: its numbers are numpy's own
    ]
    return Harness(ScriptedTimer(scripts), harness_settings).measure(PROBLEM, NUMPY, entries)


def busy_then_quiet(busy: float, quiet: float, busy_samples: int) -> Script:
    return lambda i: busy if i < busy_samples else quiet


def test_a_busy_moment_during_defaults_block_is_not_stored_as_a_win() -> None:
    # Default's whole block (warm-up and 6 samples) ran while the machine was busy: 24x
    # slower. Measured again, sample against sample, the "win" is a tie: Default stays,
    # with the time of the repeat, and the record says what happened.
    s = settings()
    record = measure([busy_then_quiet(24e-3, 1e-3, 1 + s.max_samples), lambda i: 1e-3], s)
    assert record.winner == DEFAULT.identity
    assert record.default_s == pytest.approx(1e-3)  # not the 24 ms of the busy block
    assert record.speedup == 1.0
    confirm = record.settings["repeat"]
    assert confirm["verdict"] == "within noise" and confirm["main_speedup"] == pytest.approx(24.0)
    assert confirm["speedup"] == pytest.approx(1.0) and confirm["rounds"] == s.confirm_rounds
    assert record.settings["confidence"] == LOW
    fast = record.result("t/fast")
    assert fast is not None and fast.status == OK and "did not hold" in fast.note


def test_a_real_win_is_confirmed_and_kept_with_high_confidence() -> None:
    record = measure([lambda i: 1e-3, lambda i: 0.5e-3], settings())
    assert record.winner == "t/fast"
    assert record.speedup == pytest.approx(2.0)
    # A high-confidence record keeps the short form (the cache file shares one copy).
    assert record.settings["repeat"] == {"verdict": "confirmed"}
    assert record.settings["confidence"] == HIGH
    assert "noise" not in record.settings and "low_because" not in record.settings


def test_a_win_smaller_than_the_spread_of_the_pairs_is_noise() -> None:
    # 10 % faster in its block; measured again, pair by pair anywhere between 30 % faster
    # and 30 % slower than Default.
    jitter = [1.0, 1.3, 0.75, 1.25, 0.8, 1.2, 0.85, 1.3, 0.7, 1.2]
    main = 1 + settings().max_samples

    def fast(i: int) -> float:
        return 0.9e-3 if i < main else 0.97e-3 * jitter[(i - main) % len(jitter)]

    record = measure([lambda i: 1e-3, fast], settings(min_gain=0.01))
    assert record.winner == DEFAULT.identity
    assert record.settings["repeat"]["verdict"] == "within noise"
    assert record.result("t/fast").note.startswith("its 1.11x over Default did not hold")


def test_a_wide_spread_of_defaults_samples_marks_the_record_low_confidence() -> None:
    wobbly = [1e-3, 2e-3, 1e-3, 3e-3, 1e-3, 2.5e-3, 1e-3]
    record = measure([lambda i: wobbly[i % len(wobbly)], lambda i: 5e-3], settings())
    assert record.winner == DEFAULT.identity
    assert record.settings["noise"][DEFAULT.identity] > 0.25
    assert record.settings["confidence"] == LOW


def test_large_cpu_products_are_measured_and_confirmed_after_a_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    # Products big enough to run on several threads: each backend's samples, and each block
    # of the repeat, come after the settling pause (a pool spinning after Default would slow
    # the next).
    pauses: list[float] = []
    monkeypatch.setattr(harness_module, "wait_quiet", lambda most: pauses.append(most) or 0.0)
    cfg = settings(settle_s=1e-3, settle_min_macs=1)
    record = measure([lambda i: 1e-3, lambda i: 0.5e-3], cfg)
    assert record.winner == "t/fast"
    assert record.settings["settled"] is True
    # before each backend (Default's, t's), then each block of the repeat's rounds (at least
    # confirm_rounds of them: a slow moment outlasts a block)
    assert pauses == [1e-3] * (2 + 2 * cfg.confirm_rounds)


class SlowMoment:
    """A slow moment of the whole machine (a virtual CPU descheduled): every sample that
    any candidate takes while it lasts (``during``: the machine's sample numbers, from 0)
    is ``factor`` times slower."""

    def __init__(self, during: range, factor: float) -> None:
        self.during, self.factor, self.taken = during, factor, 0

    def script(self, seconds: float) -> Script:
        def sample(i: int) -> float:
            slow = self.taken in self.during
            self.taken += 1
            return seconds * (self.factor if slow else 1.0)

        return sample


def test_a_slow_moment_lands_on_the_kernels_of_one_backend_alike() -> None:
    # Two kernels of one backend, equally fast; the machine is twice as slow for as long
    # as their first three turns last (samples 9-14: after Default's warm-up and six
    # samples, and the kernels' two warm-ups). In one block each, that moment would be
    # the first kernel's alone and prune it; in turns it is both kernels', who stay tied:
    # the canonical pick wins.
    cfg = settings()
    moment = SlowMoment(range(9, 15), 2.0)
    record = measure_kernels(
        moment.script(2e-3), [("a", moment.script(1e-3)), ("b", moment.script(1e-3))], cfg
    )
    a, b = record.result("t/a"), record.result("t/b")
    assert a is not None and b is not None
    assert a.status == OK and b.status == OK
    assert record.settings["win"]["tied"] == 2
    assert record.winner == "t/a"


def test_a_busy_cpu_marks_a_confirmed_win_low_confidence(monkeypatch: pytest.MonkeyPatch) -> None:
    # Eight runnable threads on two CPUs: whatever the samples say, they say it of the load.
    monkeypatch.setattr(harness_module, "_cpu_load", lambda: (8.0, 2))
    record = measure([lambda i: 1e-3, lambda i: 0.5e-3], settings(busy_load=1.0))
    assert record.winner == "t/fast"
    assert record.settings["load"] == {"avg1": 8.0, "cpus": 2, "busy": True}
    assert record.settings["confidence"] == LOW


def test_when_the_repeat_claims_more_than_the_first_measurement_the_smaller_claim_is_kept() -> None:
    # Default was slow only during the repeat (a busy moment then): the record must not
    # turn that moment into a 24x speedup; it keeps the first measurement's 2x, low.
    main = 1 + settings().max_samples
    record = measure([lambda i: 1e-3 if i < main else 24e-3, lambda i: 0.5e-3], settings())
    assert record.winner == "t/fast"
    assert record.speedup == pytest.approx(2.0)
    assert record.settings["repeat"]["speedup"] == pytest.approx(48.0)
    assert record.settings["confidence"] == LOW


def test_spread_is_the_interquartile_range_over_the_median() -> None:
    assert spread([1.0, 1.0, 1.0, 1.0]) == 0.0
    assert spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((4.0 - 2.0) / 3.0)
    assert spread([1.0, 2.0]) == 0.0  # too few samples to say
    assert math.isfinite(spread([1.0, 2.0, math.inf, 3.0, 4.0]))


def test_a_low_confidence_entry_warns_and_shows_in_cache_show_json(tmp_path: Path) -> None:
    plugins = PluginManager(load_entry_points=False)
    backend = KernelBackend("t", {"fast": right})
    cache = tmp_path / "cache.msgpack"
    s = settings()
    selector = Selector(plugins=plugins, store=open_store(cache), settings=s)
    timer = ScriptedTimer([busy_then_quiet(24e-3, 1e-3, 1 + s.max_samples), lambda i: 1e-3])
    selector.tuner.timer_for = lambda target: timer  # type: ignore[method-assign]
    with registered(plugins, backend), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        record = selector.tune(PROBLEM, NUMPY)
    selector.store.flush()
    messages = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert "unstable" in messages[0] and "97x509x31" in messages[0] and "24" in messages[0]
    assert record.winner == DEFAULT.identity
    out = io.StringIO()
    assert cli_main(["cache", "show", "--json", "--cache", str(cache)], out) == 0
    (shown,) = json.loads(out.getvalue())
    assert shown["settings"]["confidence"] == LOW
    assert shown["settings"]["repeat"]["verdict"] == "within noise"


def test_a_busy_cpu_alone_warns_once_not_per_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(harness_module, "_cpu_load", lambda: (8.0, 2))
    plugins = PluginManager(load_entry_points=False)
    s = settings(busy_load=1.0)
    selector = Selector(plugins=plugins, store=open_store(tmp_path / "c.msgpack"), settings=s)
    selector.tuner.timer_for = lambda target: ScriptedTimer([lambda i: 1e-3] * 8)  # type: ignore[method-assign]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        records = [selector.tune(Problem.from_shape(m, 16, 8), NUMPY) for m in (8, 9, 10)]
    # (No backend is registered: that gets a warning of its own, once; not counted here.)
    messages = [
        str(w.message)
        for w in seen
        if issubclass(w.category, RuntimeWarning) and "no backend serves" not in str(w.message)
    ]
    assert len(messages) == 1 and "busy" in messages[0] and "8.0 on 2 CPUs" in messages[0], messages
    assert all(r.settings["low_because"] == ["busy"] for r in records)


# --- a win must be clear from its samples; ties go to a fixed order --------------------


def measure_kernels(
    default: Script, kernels: Sequence[tuple[str, Script]], harness_settings: HarnessConfig
) -> TuningRecord:
    """Default and the named kernels (all right: numpy's own numbers), scripted in that order."""
    entries: list[tuple[Candidate, Callable[[], Runner]]] = [(DEFAULT, lambda: DefaultRunner(NUMPY.adapter))]
    entries += [(Candidate.make("t", name), lambda: DefaultRunner(NUMPY.adapter)) for name, _ in kernels]
    timer = ScriptedTimer([default, *(script for _, script in kernels)])
    return Harness(timer, harness_settings).measure(PROBLEM, NUMPY, entries)


def jittered(median_s: float, jitter: Sequence[float]) -> Script:
    return lambda i: median_s * jitter[i % len(jitter)]


WIDE = [1.0, 1.3, 0.8, 1.25, 0.85, 1.2, 0.9]  # samples of a loaded CPU: +-30 %


def in_repeat(main: Script, pattern: Sequence[float], base_s: float) -> Script:
    """``main`` for the first measurement's calls, then ``base_s`` over the pattern's
    ratios, in turn: the kernel's times in the repeat, where Default takes 1 ms."""
    first = 1 + settings().max_samples
    return lambda i: main(i) if i < first else base_s / pattern[(i - first) % len(pattern)]


def test_a_win_that_holds_by_median_but_not_by_its_bound_keeps_default() -> None:
    # In the repeat 3 pairs in 5 show a 1.2x win and 2 a loss (0.9x): the median ratio
    # beats Default by more than the spread, but at 95 % the samples cannot say that the
    # kernel is faster, however many rounds are added.
    pattern = [1.2, 0.9, 1.2, 0.9, 1.2]
    record = measure_kernels(
        lambda i: 1e-3, [("fast", in_repeat(lambda i: 0.8e-3, pattern, 1e-3))], settings()
    )
    assert record.winner == DEFAULT.identity and record.speedup == 1.0
    win = record.settings["win"]
    assert win["candidate"] == "t/fast" and win["low"] < 1.01 < win["high"]
    assert record.settings["repeat"]["verdict"] == "within noise"
    fast = record.result("t/fast")
    assert fast is not None and "1.2x over Default is not clear from its samples" in fast.note
    s = settings()
    assert fast.samples == s.max_confirm_rounds * s.confirm_pairs  # the record keeps the repeat's


def test_a_win_not_yet_clear_gets_more_rounds_and_stands_once_it_is() -> None:
    # One pair in 5 is a loss: 5 pairs bound nothing above 0.9x, 30 do (the 11th smallest).
    pattern = [1.2, 1.2, 1.2, 1.2, 0.9]
    record = measure_kernels(
        lambda i: 1e-3, [("fast", in_repeat(lambda i: 0.8e-3, pattern, 1e-3))], settings()
    )
    assert record.winner == "t/fast"
    s = settings()
    fast = record.result("t/fast")
    assert fast is not None and s.confirm_rounds * s.confirm_pairs < fast.samples
    assert fast.samples <= s.max_confirm_rounds * s.confirm_pairs
    assert record.settings["repeat"] == {"verdict": "confirmed"}
    assert record.settings["win"]["low"] == pytest.approx(1.2)


def test_paired_samples_bound_the_win_through_a_drift_both_share() -> None:
    # The machine's speed drifts 3x from pair to pair, for both alike: every pair says 1.25x.
    drift = [1.0, 3.0, 1.5, 2.5, 2.0, 1.2, 2.8]
    record = measure_kernels(jittered(1e-3, drift), [("fast", jittered(0.8e-3, drift))], settings())
    assert record.winner == "t/fast"
    assert record.settings["win"]["low"] == pytest.approx(1.25)


def test_a_clear_win_records_its_lower_bound() -> None:
    record = measure_kernels(jittered(1e-3, WIDE), [("fast", jittered(0.4e-3, WIDE))], settings())
    assert record.winner == "t/fast"
    win = record.settings["win"]
    # Paired in the repeat, Default's samples and the kernel's wobble alike: 2.5x each time.
    assert 1.5 <= win["low"] <= record.speedup <= win["high"]
    assert record.settings["repeat"]["verdict"] == "confirmed"


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_kernels_within_noise_of_each_other_go_to_the_first_identity(order: tuple[str, str]) -> None:
    # b is a hair faster than a by median (0.5 %), well within their samples' spread;
    # in whatever order they are listed and measured, a wins, and the record says so.
    jitter = [1.0, 1.04, 0.97, 1.03, 0.98, 1.02, 0.99]
    medians = {"a": 0.5025e-3, "b": 0.5e-3}
    kernels = [(name, jittered(medians[name], jitter)) for name in order]
    record = measure_kernels(lambda i: 1e-3, kernels, settings())
    assert record.winner == "t/a"
    win = record.settings["win"]
    assert win["candidate"] == "t/a" and win["tied"] == 2 and win["fastest"] == "t/b"
    assert win["low"] >= 1.01


def test_a_kernel_clearly_faster_than_the_others_wins_whatever_its_identity() -> None:
    jitter = [1.0, 1.01, 0.99, 1.0, 1.01, 0.99, 1.0]
    record = measure_kernels(
        lambda i: 1e-3, [("a", jittered(0.6e-3, jitter)), ("z", jittered(0.5e-3, jitter))], settings()
    )
    assert record.winner == "t/z"
    assert record.settings["win"]["tied"] == 1 and "fastest" not in record.settings["win"]


def test_tuning_a_call_in_tune_mode_stores_the_bound_and_cache_show_prints_it(tmp_path: Path) -> None:
    # Real tune mode, real oneDNN candidates, the real cache file.
    import unimatmul
    from unimatmul.cli import output
    from unimatmul.testing import fast_config, isolated_selector

    cache = tmp_path / "cache.msgpack"
    rng = np.random.default_rng(3)
    a = rng.standard_normal((64, 96), dtype=np.float32)
    b = rng.standard_normal((96, 80), dtype=np.float32)
    with isolated_selector(cache) as selector, unimatmul.mode("tune"):
        # Nothing pruned: oneDNN's first call on a loaded machine can take 1000x its time.
        selector.settings = replace(fast_config(), prune_ratio=math.inf, first_prune_ratio=math.inf)
        got = unimatmul.matmul(a, b)
        selector.store.flush()
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4)
    (_, key, record), *_ = list(open_store(cache).items())
    win = record.settings["win"]
    assert win["candidate"].startswith("onednn/")
    level = record.settings["confidence_level"]
    min_gain = record.settings["min_gain"]
    if record.winner == DEFAULT.identity:
        assert (win["low"] or 0.0) < 1 + min_gain or record.settings["repeat"]["verdict"] != "confirmed"
        shown = f"<={win['high']:.2f}x" if win["high"] is not None else "-"
    else:
        assert record.winner == win["candidate"] and win["low"] >= 1 + min_gain
        shown = f">={win['low']:.2f}x"
    assert level == 0.95 and output.bound(record) == shown
    out = io.StringIO()
    assert cli_main(["cache", "show", "--cache", str(cache)], out) == 0
    [line] = [line for line in out.getvalue().splitlines() if line.startswith(key)]
    assert shown in line.split()


def settled(monkeypatch: pytest.MonkeyPatch, **overrides: Any) -> HarnessConfig:
    """Settings of a product large enough for the settling pause (which takes no time here)."""
    monkeypatch.setattr(harness_module, "wait_quiet", lambda most: 0.0)
    return settings(settle_s=1e-3, settle_min_macs=1, **overrides)


def test_a_slow_moment_in_the_kernels_turns_after_a_pause_neither_prunes_them_nor_keeps_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two kernels twice as fast as Default, but their whole first measurement (warm-ups
    # and turns) fell in a slow moment of the machine: 1.6x Default's time. Against
    # Default's block, taken at another moment, that pruned both and kept Default; their
    # own turns prune neither, and the repeat, block by block, finds the 2x.
    cfg = settled(monkeypatch)
    first = 1 + cfg.max_samples
    record = measure_kernels(
        lambda i: 1e-3,
        [("a", busy_then_quiet(1.6e-3, 0.5e-3, first)), ("b", busy_then_quiet(1.6e-3, 0.5e-3, first))],
        cfg,
    )
    assert record.winner == "t/a"
    assert record.speedup == pytest.approx(2.0)
    repeat = record.settings["repeat"]
    assert repeat["verdict"] == "confirmed" and repeat["main_speedup"] == pytest.approx(1 / 1.6)
    assert record.settings["confidence"] == LOW  # the two measurements disagree: the machine moved
    assert record.result("t/b").status == OK  # not pruned against Default's block


def test_a_slow_block_in_the_repeat_does_not_undo_a_win(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel is 1.5x faster, but the repeat's first block of it fell in a slow moment
    # (2x: a vCPU descheduled): pooled, its samples spread too wide for a win; the faster
    # half of each side's samples is its speed.
    cfg = settled(monkeypatch)
    first = 1 + cfg.max_samples
    slow = range(first + 1, first + 1 + cfg.confirm_pairs)  # after the block's warm-up

    def kernel(i: int) -> float:
        return 2 / 1.5e3 if i in slow else 1 / 1.5e3

    record = measure_kernels(lambda i: 1e-3, [("fast", kernel)], cfg)
    assert record.winner == "t/fast"
    assert record.speedup == pytest.approx(1.5)
    assert record.settings["win"]["low"] == pytest.approx(1.5)


def test_a_kernel_slower_than_default_in_every_block_stays_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    # Behind Default in its turns (within what a slow moment could explain), so measured
    # again: behind in the repeat too, Default stays and the record says why.
    cfg = settled(monkeypatch)
    record = measure_kernels(lambda i: 1e-3, [("slow", lambda i: 1.2e-3)], cfg)
    assert record.winner == DEFAULT.identity
    assert record.settings["repeat"]["verdict"] == "within noise"
    assert "Default kept" in record.result("t/slow").note


def test_the_faster_half_of_blocks_drops_a_slow_moment() -> None:
    blocks = [[1.0, 1.1, 0.9], [2.0, 2.1, 1.9], [1.0, 1.05, 0.95]]
    assert harness_module._faster_half(blocks) == [0.9, 0.95, 1.0, 1.0]
    assert harness_module._faster_half([[3.0, 1.0]]) == [1.0, 3.0]  # one block: all of it


def test_a_kernel_slow_in_its_first_turns_is_not_pruned_before_it_settles() -> None:
    # b's first three samples (after its warm-up) take 1.6x a's; then it is the faster.
    # Pruned after min_samples, it lost to a in a run where it was slow to start and won
    # in the next; judged after twice min_samples, it wins both.
    cfg = settings(max_samples=12)
    record = measure_kernels(
        lambda i: 2e-3, [("a", lambda i: 1e-3), ("b", busy_then_quiet(1.6e-3, 0.8e-3, 4))], cfg
    )
    b = record.result("t/b")
    assert b is not None and b.status == OK
    assert record.winner == "t/b"


def test_a_stall_through_a_kernels_warm_up_is_sampled_again_before_it_prunes() -> None:
    # Its warm-up samples fell in a stall (8x Default's call; on a 2-vCPU VM 3-9 ms where
    # the kernel takes 0.4, and the calls right after as slow), which pruned it on its first
    # call. One more sample after a pause longer than the stall is its speed; a kernel
    # slow in that one too is still pruned at once.
    cfg = settings()
    record = measure_kernels(
        lambda i: 1e-3,
        [("stalled", busy_then_quiet(8e-3, 0.5e-3, cfg.warmup)), ("slow", lambda i: 8e-3)],
        cfg,
    )
    assert record.winner == "t/stalled"
    assert record.speedup == pytest.approx(2.0)
    slow = record.result("t/slow")
    assert slow is not None and slow.status == PRUNED and "on its first timed call" in slow.note
    assert slow.samples == 1  # no turns: judged on its first calls
