"""Timing two or more GPU candidates against each other: the MoE and fp8 benchmarks' one timing.

A speedup is the ratio of two times taken on a GPU whose speed drifts between rounds (up to
15 % on long compute-bound products on the H200), so two medians taken apart can differ by
more than the kernels do. Here:

1. Each candidate's calls cycle through input sets that touch more than 3.2x the L2 cache in
   all (``rotation_sets``, from the bytes one call touches; the copies' memory is capped), so
   no call finds its operands in L2.
2. Each candidate is captured **once** as a CUDA graph of N back-to-back calls
   (``calls_per_graph``), every capture in one shared memory pool, so the candidates' outputs
   lie at the same addresses.
3. The graphs are replayed alternately in many short rounds, the order flipping each round
   (A B, B A, A B, ...: ``round_orders``); the round count comes from a time budget
   (``round_count``) after a warm-up round that is not kept.
4. The speedup is the median of the rounds' own ratios (``paired_stats``), each ratio taken
   between replays a few milliseconds apart; the per-side medians, their ratio and the
   spread of the round ratios are reported beside it.

The scheduling and statistics are plain Python; ``graph_sampler`` is the CUDA part. Without
a GPU the same rounds time the tuning harness's host clock (``CpuTimer``): a smoke test of a
benchmark, not a result.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from unimatmul.tuning.harness import CpuTimer
from unimatmul.tuning.timers import TorchGraphTimer, batch_size, l2_cache_bytes

#: The input sets of a candidate together touch more than this many times the L2.
L2_FACTOR = 3.2
#: Input sets at most (a product touching under 3.2x L2 / 64, ~2.6 MB on the H200, stays
#: partly in L2), and the memory their copies may take in all.
MAX_SETS = 64
MAX_ROTATION_BYTES = 8 << 30
#: Calls in a candidate's graph: this many, fewer where a replay would pass ``REPLAY_S``
#: (never fewer than the input sets: every set is called).
MIN_CALLS = 20
REPLAY_S = 5e-3
#: Timed rounds (each replays every candidate once) fitted into ``BUDGET_S``.
BUDGET_S = 2.0
MIN_ROUNDS = 15
MAX_ROUNDS = 61

Sampler = Callable[[], float]


# --- scheduling and statistics (no GPU) ----------------------------------------------------------
def rotation_sets(
    touched_bytes: int,
    l2_bytes: int,
    *,
    set_bytes: int | None = None,
    factor: float = L2_FACTOR,
    max_sets: int = MAX_SETS,
    max_bytes: int = MAX_ROTATION_BYTES,
) -> int:
    """Input sets to rotate through: together more than ``factor`` x L2 of touched bytes
    (2 to ``max_sets``), while the sets (``set_bytes`` each: what a copy allocates, by
    default what a call touches) take at most ``max_bytes`` (1 set at least).

    ``touched_bytes`` is what one call reads and writes (for a grouped product only the
    experts that have rows), ``set_bytes`` what one copy of its inputs allocates.
    """
    allocated = touched_bytes if set_bytes is None else set_bytes
    for name, value in (("touched_bytes", touched_bytes), ("l2_bytes", l2_bytes), ("set_bytes", allocated)):
        if value <= 0:
            msg = f"rotation_sets: {name} must be positive, got {value}"
            raise ValueError(msg)
    if max_sets < 1 or max_bytes < 1:
        msg = f"rotation_sets: max_sets ({max_sets}) and max_bytes ({max_bytes}) must be positive"
        raise ValueError(msg)
    wanted = max(2, min(max_sets, math.ceil(factor * l2_bytes / touched_bytes)))
    return max(1, min(wanted, max_bytes // allocated))


def calls_per_graph(
    call_s: float, sets: int, *, min_calls: int = MIN_CALLS, replay_s: float = REPLAY_S
) -> int:
    """Calls captured in a candidate's graph: ``min_calls``, fewer where a replay would
    run past ``replay_s``, rounded up to a whole number of passes over the ``sets``."""
    if sets < 1:
        msg = f"calls_per_graph: sets must be at least 1, got {sets}"
        raise ValueError(msg)
    count = batch_size(sets, call_s, min_calls, replay_s)
    return -(-count // sets) * sets


def round_count(
    round_s: float, budget_s: float = BUDGET_S, *, min_rounds: int = MIN_ROUNDS, max_rounds: int = MAX_ROUNDS
) -> int:
    """Timed rounds: as many rounds of ``round_s`` as fit in ``budget_s``, within
    ``min_rounds`` to ``max_rounds``."""
    if not 1 <= min_rounds <= max_rounds:
        msg = f"round_count: need 1 <= min_rounds ({min_rounds}) <= max_rounds ({max_rounds})"
        raise ValueError(msg)
    fit = int(budget_s / round_s) if round_s > 0 and math.isfinite(round_s) else max_rounds
    return max(min_rounds, min(max_rounds, fit))


def round_orders(names: Sequence[str], rounds: int) -> list[tuple[str, ...]]:
    """The replay order of each round: as given, then reversed, in turn (A B, B A, A B, ...)."""
    if len(set(names)) != len(names) or len(names) < 2:
        msg = f"round_orders: needs two or more distinct candidates, got {list(names)}"
        raise ValueError(msg)
    forward, backward = tuple(names), tuple(reversed(names))
    return [forward if i % 2 == 0 else backward for i in range(rounds)]


def run_rounds(samplers: Mapping[str, Sampler], rounds: int, *, warmup: int = 1) -> dict[str, list[float]]:
    """Each sampler once a round in ``round_orders``; ``warmup`` rounds first, not kept.
    Returns every candidate's samples (seconds per call), one a round."""
    times: dict[str, list[float]] = {name: [] for name in samplers}
    for i, order in enumerate(round_orders(list(samplers), warmup + rounds)):
        for name in order:
            got = samplers[name]()
            if i >= warmup:
                times[name].append(got)
    return times


def paired_stats(numerator: Sequence[float], denominator: Sequence[float]) -> dict[str, Any]:
    """The speedup of ``denominator``'s candidate over ``numerator``'s (``numerator / denominator``
    per round, the median of those ratios), each side's median and the round ratios' spread."""
    if len(numerator) != len(denominator) or not numerator:
        msg = f"paired_stats: needs the same number of rounds on both sides, got {len(numerator)} and {len(denominator)}"
        raise ValueError(msg)
    bad = [t for t in (*numerator, *denominator) if not (t > 0 and math.isfinite(t))]
    if bad:
        msg = f"paired_stats: a time is not a positive finite number: {bad[0]!r}"
        raise ValueError(msg)
    ratios = [a / b for a, b in zip(numerator, denominator, strict=True)]
    num_s, den_s = statistics.median(numerator), statistics.median(denominator)
    return {
        "numerator_s": num_s,
        "denominator_s": den_s,
        "speedup": statistics.median(ratios),
        "ratio_of_medians": num_s / den_s,
        "round_ratios": {"min": min(ratios), "max": max(ratios), "rounds": len(ratios)},
    }


def method_text(rounds: int, modes: Sequence[str] = ("graph",)) -> str:
    """What a row's ``speedup_method`` says, given how its candidates were timed."""
    how = "one CUDA graph" if all(m == "graph" for m in modes) else "timed " + " / ".join(sorted(set(modes)))
    return (
        f"median of {rounds} per-round ratios: each candidate {how} over inputs rotated through "
        f"> {L2_FACTOR:g}x L2, replayed alternating A B, B A"
    )


def cuda_l2_bytes(index: int = 0) -> int:
    """The L2 size of CUDA device ``index`` (``l2_cache_bytes``)."""
    from unimatmul.backend import Target
    from unimatmul.core.arrays import Device, adapter_for_kind

    return l2_cache_bytes(Target(adapter_for_kind("torch"), Device("cuda", index)))


# --- samplers -------------------------------------------------------------------------------------
def graph_sampler(
    calls: Sequence[Callable[[], Any]],
    timer: TorchGraphTimer,
    pool: Any,
    *,
    min_calls: int = MIN_CALLS,
    replay_s: float = REPLAY_S,
) -> tuple[Sampler, int, str]:
    """One CUDA graph of back-to-back calls cycling through ``calls`` (one per input set),
    captured once by ``timer`` (the tuning harness's own, one side stream for every
    capture) into the comparison's shared memory pool ``pool``; returns its sampler (seconds per call of a replay), its call count and
    ``"graph"``, or an eager sampler of the same calls and why where it cannot be captured.
    """
    torch, stream = timer.torch, timer.stream
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        # Every set once untimed (lazy set-up, workspaces on this stream), once timed.
        for call in calls:
            call()
        start.record()
        for call in calls:
            call()
        end.record()
    end.synchronize()
    count = calls_per_graph(
        start.elapsed_time(end) * 1e-3 / len(calls), len(calls), min_calls=min_calls, replay_s=replay_s
    )
    sample = timer.capture(list(calls), count, pool)
    return sample, count, timer.last_mode


@dataclass
class Timing:
    """What ``time_candidates`` measured: every candidate's samples, one a round."""

    times: dict[str, list[float]]
    calls: dict[str, int]
    modes: dict[str, str]
    rounds: int

    def median_s(self, name: str) -> float:
        return statistics.median(self.times[name])

    def stats(self, numerator: str, denominator: str) -> dict[str, Any]:
        """``paired_stats`` of two candidates, with ``speedup_method``."""
        found = paired_stats(self.times[numerator], self.times[denominator])
        found["speedup_method"] = method_text(self.rounds, [self.modes[numerator], self.modes[denominator]])
        return found


def past_confirmation(calls: Sequence[Callable[[], Any]], torch: Any = None) -> None:
    """Run a door's calls (cycling through them) until its confirmation window has judged
    its choice, as a program's first real calls do; then the steady state can be timed.
    Waits for the verdict's store (``Selector.settle``)."""
    from unimatmul.settings import CONFIRM_CALLS
    from unimatmul.tuning.selector import get_selector

    for i in range(4 * CONFIRM_CALLS.get() + 8):
        calls[i % len(calls)]()
    if torch is not None:
        torch.cuda.synchronize()
    get_selector().settle(30.0)


def time_candidates(
    candidates: Mapping[str, Sequence[Callable[[], Any]]],
    *,
    torch: Any = None,
    budget_s: float = BUDGET_S,
    max_rounds: int = MAX_ROUNDS,
    min_rounds: int = MIN_ROUNDS,
    min_calls: int = MIN_CALLS,
    replay_s: float = REPLAY_S,
) -> Timing:
    """Each candidate's calls (one per input set) captured once and replayed in alternating
    rounds (module docstring); with ``torch`` None, host-clock batches of the same calls."""
    empty = [name for name, calls in candidates.items() if not calls]
    if empty:
        msg = f"time_candidates: no calls for {', '.join(empty)}"
        raise ValueError(msg)
    samplers: dict[str, Sampler] = {}
    calls: dict[str, int] = {}
    modes: dict[str, str] = {}
    if torch is None:
        # The tuning harness's host clock: a sample runs calls, cycling through the sets,
        # for at least 0.1 ms (one call at least).
        timer = CpuTimer()
        for name, fns in candidates.items():
            samplers[name], calls[name], modes[name] = timer.prepare(list(fns)), len(fns), "host clock"
    else:
        graphs, pool = TorchGraphTimer(torch.cuda.current_device()), torch.cuda.graph_pool_handle()
        for name, fns in candidates.items():
            samplers[name], calls[name], modes[name] = graph_sampler(
                fns, graphs, pool, min_calls=min_calls, replay_s=replay_s
            )
    t0 = time.perf_counter()
    run_rounds(samplers, 1, warmup=0)  # the warm-up round, which also sizes the rest
    rounds = round_count(
        time.perf_counter() - t0, budget_s, min_rounds=min(min_rounds, max_rounds), max_rounds=max_rounds
    )
    return Timing(run_rounds(samplers, rounds, warmup=0), calls, modes, rounds)
