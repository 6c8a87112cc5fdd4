"""Confirmation: a tuned choice is kept only if it also wins where it runs.

The harness measures a candidate in isolation: inputs rotated through more memory than
the last-level cache, CUDA-graph replays, no neighbours. Inside a program the caches,
the neighbouring kernels, the launch stream and the host's own cost per call differ,
and a choice that won in isolation can lose there (every choice of a model on the H200
won in the harness, and the model ran 0.95-0.98x; ``docs/torch.md``). So when a choice comes from a
record (tuned now, found in the cache, or a bucket's), its first real calls are a
*window*: they run the choice and Default alternately, each call timed where it runs
(CUDA/HIP events on the caller's stream on a GPU, a monotonic clock on the CPU), and
when the window is full the choice is kept only if it beat Default there by the
harness's ``min_gain``; otherwise the key goes back to Default. The verdict and both
in-situ medians are written into the cache record (``settings["confirm"]``), so other
processes use it without a window of their own. Both candidates passed the numeric
check, so every call in the window returns a valid result.

What a window is, and why:

- 2 warm-up calls (the choice, then Default), untimed: a first call may initialise
  something (a workspace on a new stream, cuBLAS's heuristic cache for Default).
- then ``2 * N`` timed calls (``N`` = ``UNIMATMUL_CONFIRM_CALLS``, default 16) in the
  order K D D K, K D D K, ...: each candidate is as often first as second of a pair,
  so a slow drift (clocks, a neighbour starting) and the position in a pair weigh on
  both alike.
- verdict: ``median(K) <= (1 - min_gain) * median(D)``. The median, because single
  calls of a real program have outliers (a preempted host thread, an allocator
  refill) that a mean would take in; 16 per candidate, because the median of n
  samples moves by about 1.25 s / sqrt(n) for a spread s of single calls: with 16, a
  third of s, so single calls spread by up to ~3 % still leave the 1 % of ``min_gain``
  resolvable, while a window stays 34 calls long (a 64-token decode of a 12-layer model
  makes 768 calls of each decode product). The rule is one-sided on purpose: when the
  two are level within the noise, Default stays, which can never be a loss.

On a GPU an event pair around one call measures what that call adds to the program's
critical path: when the GPU is busy (bound by the device) the start event waits behind
earlier work and the pair measures the kernel; when the GPU is idle (bound by the
host) the pair also measures the host's own time between the two records, which is
where a routed call's host overhead shows. The events are read only when the window
is full, from a later call (an event query, never a synchronisation), and no event is
recorded while the stream is being captured into a CUDA graph: a call under capture
runs the choice (the harness measured it in CUDA graphs) and is not timed. A tie
(:func:`tie_of`) is the exception: its gain is the host's time per call, which a graph
replay does not have, so under capture it runs Default, in its window and after a
verdict that kept it (:class:`TieRunner`; the native entries do the same): a captured
graph holds what it would hold unrouted. A scaled choice with a slim tuning margin is
treated the same way (:func:`default_in_graphs`).

On a CPU (a host clock) a call's cost can also land on the calls after it: NumPy's
Default runs on OpenBLAS's worker threads and a oneDNN kernel on GNU OpenMP's, and each
pool's threads spin for a while after a call. The other pool's calls after it share
their cores with them and now and then wait for a scheduler tick (4 ms). On the 2-core CI
machine a BERT layer's products in NumPy ran 0.72-0.74x as fast as NumPy's own in 3 of 14
runs, with kernels that had won their windows call by call by 1.06-1.14x
(``benchmarks/results/cpu-mixed/``). So a host clock's window differs in three ways:

- each timed call also has a *span*, from its start to the start of the key's next
  call (everything the program did in between), and the choice is kept only if it also
  saves ``min_gain`` of Default's call on the spans, by their *mean*: the ticks that
  the calls after it wait are a few large samples, which a median would leave out (with
  medians, kept choices still ran their layers at 0.88-0.93x);
- the two sides alternate in blocks of ``HOST_BLOCK`` calls (K D D K by block), so
  that each runs as the program would, its pool's threads in the state its own calls
  leave them;
- one window times at a time in a process (:class:`_Turn`): windows that open together
  (a model's products, met in one step) would judge each other's choices along with
  their own; the keys waiting run Default, what they ran before tuning.

A host window's verdict comes with the key's call after it, which ends its last span.

Outside the window a call costs nothing more: the caller swaps the wrapper for the
winner (``ConfirmingRunner.on_final``), and the native torch kernels switch their
table entry (``_native.cpp`` keeps its own window with the same order and hands the
samples to :meth:`Confirmation.conclude`).
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from unimatmul import settings
from unimatmul.cache.record import OK, TuningRecord
from unimatmul.core._backend import DEFAULT, Runner, Target
from unimatmul.core.problem import Problem

#: Untimed calls at the start of a window: the choice once, then Default once.
WARMUP = 2
CONFIRMED = "confirmed"
REVERTED = "reverted"
UNJUDGED = "unjudged"  # nothing could be measured: the choice stays, nothing is stored
#: The key of a record's settings that holds the verdict.
KEY = "confirm"


def calls_per_candidate() -> int:
    """Timed calls per candidate in a window; 0 when confirmation is off (``UNIMATMUL_CONFIRM=0``)."""
    if not settings.CONFIRM.get():
        return 0
    return settings.CONFIRM_CALLS.get()


#: Calls in a row of one side in a host clock's window (a CPU's): a thread pool's state
#: (its workers spinning or asleep) depends on the calls before, so each side runs as the
#: program would run it, for this many calls, before the other.
HOST_BLOCK = 4


def uses_kernel(index: int, block: int = 1) -> bool:
    """Whether timed call ``index`` of a window runs the choice (K D D K order, in blocks
    of ``block`` calls)."""
    return (index // block) % 4 in (0, 3)


def split(samples: Sequence[float], block: int = 1) -> tuple[list[float], list[float]]:
    """Timed samples in call order -> (the choice's, Default's)."""
    kernel = [s for i, s in enumerate(samples) if uses_kernel(i, block)]
    default = [s for i, s in enumerate(samples) if not uses_kernel(i, block)]
    return kernel, default


def tie_of(record: TuningRecord) -> str | None:
    """The kernel a Default record offers for confirmation where it runs, or None.

    Default wins a tuning unless a kernel beats it by ``min_gain``. The fastest kernel
    that was measured no slower than Default (in the harness: CUDA-graph replays on a GPU,
    so without the host's own time per call) is a *tie*: on the device it costs nothing,
    and where a program is bound by the host, a kernel whose call costs less host time
    than Default's makes the program faster (H200: a routed Triton launch 6.2 us against
    ``torch.mm``'s 11.7 us, a cuBLASLt fp8 call 12.2 us against ``torch._scaled_mm``'s
    18.1 us). Only a window can tell which case a program is in, so a tie is used only
    through one (:meth:`Selector._decided`): kept where it wins by ``min_gain`` in situ,
    Default elsewhere. Read from the record's
    results (every candidate's median is stored), so older records offer theirs too.
    """
    if record.winner != DEFAULT.identity or record.default_s is None or not math.isfinite(record.default_s):
        return None
    best: tuple[float, str] | None = None
    for result in record.results:
        if result.identity == DEFAULT.identity or result.status != OK or result.median_s is None:
            continue
        if result.median_s <= record.default_s and (best is None or result.median_s < best[0]):
            best = (result.median_s, result.identity)
    return None if best is None else best[1]


def default_in_graphs(problem: Problem, record: TuningRecord, tie: str | None) -> bool:
    """Whether the choice of ``record`` runs Default while its stream is captured into a
    CUDA graph (:class:`TieRunner`, and the native entries' ``tie`` flag).

    A tie does (its gain is host time, which a replay has not). So does a scaled (fp8)
    winner whose tuning margin over Default is under ``UNIMATMUL_SCALED_GRAPH_MIN_GAIN``
    (5 %). On the H200 such per-tensor choices, 1-3 % ahead in the harness, made the fp8
    stack's CUDA graphs 1.1-1.6 % slower (a routed 128x32 kernel ran about 14 % slower
    inside the graph than PyTorch's), while graphs of the same kernels differ by up to
    1.6 % from one capture to the next: a margin that small cannot be told from that, and
    a graph keeps what it captured. Eager calls keep such a choice (their windows judge it
    where it runs).
    """
    if tie is not None:
        return True
    if not problem.is_scaled or record.winner == DEFAULT.identity:
        return False
    default_s, winner_s = record.default_s, record.winner_s
    if default_s is None or not (math.isfinite(default_s) and math.isfinite(winner_s)) or winner_s <= 0:
        return False
    return default_s / winner_s < 1.0 + settings.SCALED_GRAPH_MIN_GAIN.get()


def verdict_of(record: TuningRecord | None, choice: str | None = None) -> str | None:
    """``confirmed`` or ``reverted`` when a window has judged ``choice`` (default: this
    record's winner; a Default record's tie, see :func:`tie_of`), else None."""
    if record is None:
        return None
    found = record.settings.get(KEY)
    if not isinstance(found, dict):
        return None
    verdict = found.get("verdict")
    if found.get("kernel") == (choice or record.winner) and verdict in (CONFIRMED, REVERTED):
        return str(verdict)
    if verdict == REVERTED and record.winner == DEFAULT.identity:
        return REVERTED  # a bucket's choice (or a tie) that lost at this m: Default stays
    return None


def describe(record: TuningRecord) -> str:
    """A record's verdict in a few words (``cache show``): ``confirmed 1.08x``, ``reverted
    0.97x`` (Default's in-situ time over the choice's), ``tie triton/... confirmed 1.03x``
    for a Default record's tie, or empty when never judged."""
    found = record.settings.get(KEY)
    if not isinstance(found, dict):
        return ""
    kernel = found.get("kernel")
    tie = record.winner == DEFAULT.identity and isinstance(kernel, str) and kernel != DEFAULT.identity
    verdict = verdict_of(record, kernel if tie else None)
    if verdict is None:
        return ""
    prefix = f"tie {kernel} " if tie else ""
    if found.get("reason"):
        return prefix + verdict + " (wrong result)"  # the first-call check (tuning/trust.py)
    ratio, span = _ratio(found, "default_s", "kernel_s"), _ratio(found, "default_span_s", "kernel_span_s")
    if ratio is None:
        return prefix + verdict
    # A host clock's spans (each call to the key's next call): "spans 0.52x".
    return prefix + f"{verdict} {ratio:.2f}x" + (f", spans {span:.2f}x" if span is not None else "")


def _ratio(found: dict[str, Any], default: str, kernel: str) -> float | None:
    try:
        ratio = float(found[default]) / float(found[kernel])
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    return ratio if math.isfinite(ratio) else None


@dataclass(frozen=True)
class Outcome:
    """What one window found: the verdict and both in-situ medians (seconds per call)."""

    keep: bool
    kernel: str  # the choice's identity
    kernel_s: float
    default_s: float
    calls: int  # timed calls per candidate
    clock: str  # "host", "cuda-events", ...
    at: float
    # Set when the choice's output was wrong on a real call (unimatmul.tuning.trust): why.
    reason: str = ""
    # A host clock's means of each call's span, to the key's next call (NaN: none).
    kernel_span_s: float = math.nan
    default_span_s: float = math.nan

    @property
    def verdict(self) -> str:
        if self.reason:
            return REVERTED
        if self.calls == 0:
            return UNJUDGED
        return CONFIRMED if self.keep else REVERTED

    @property
    def saved_s(self) -> float:
        """Time a call of the choice saves over Default, by the in-situ medians (0 if reverted)."""
        return max(self.default_s - self.kernel_s, 0.0) if self.keep else 0.0

    def as_settings(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "kernel": self.kernel,
            "kernel_s": self.kernel_s,
            "default_s": self.default_s,
            "calls": self.calls,
            "clock": self.clock,
            "statistic": "median",
            "at": self.at,
            **({"reason": self.reason} if self.reason else {}),
            **(
                {
                    "kernel_span_s": self.kernel_span_s,
                    "default_span_s": self.default_span_s,
                    "span_statistic": "mean",
                }
                if math.isfinite(self.kernel_span_s) and math.isfinite(self.default_span_s)
                else {}
            ),
        }


def _usable(samples: Sequence[float]) -> list[float]:
    return [s for s in samples if math.isfinite(s) and s >= 0]


def judge(
    kernel: str,
    kernel_s: Sequence[float],
    default_s: Sequence[float],
    min_gain: float,
    clock: str,
    spans: tuple[Sequence[float], Sequence[float]] | None = None,
) -> Outcome:
    """The verdict on a full window (see the module docstring). ``spans``: the choice's
    and Default's spans (a host clock's), each call to the key's next call; where
    given, the choice must save ``min_gain`` of Default's call on them too, by their mean."""
    k, d = _usable(kernel_s), _usable(default_s)
    if not k or not d:  # nothing usable was measured: keep what the harness chose
        return Outcome(True, kernel, math.nan, math.nan, 0, clock, time.time())
    km, dm = statistics.median(k), statistics.median(d)
    keep = km <= (1.0 - min_gain) * dm
    ks = ds = math.nan
    if spans is not None:
        k_span, d_span = _usable(spans[0]), _usable(spans[1])
        if k_span and d_span:
            ks, ds = statistics.fmean(k_span), statistics.fmean(d_span)
            keep = keep and ks <= ds - min_gain * dm
    return Outcome(
        keep, kernel, km, dm, min(len(k), len(d)), clock, time.time(), kernel_span_s=ks, default_span_s=ds
    )


class Confirmation:
    """The pending judgement of one choice: concluded once, by whichever window fills first.

    ``report`` (the Selector's) stores the outcome; listeners (the callers' plans) learn it.
    """

    def __init__(
        self, kernel: str, calls: int, min_gain: float, report: Callable[[Outcome], None] | None = None
    ) -> None:
        self.kernel = kernel
        self.calls = calls
        self.min_gain = min_gain
        self.outcome: Outcome | None = None
        self._report = report
        self._listeners: list[Callable[[Outcome], None]] = []
        self._lock = threading.Lock()

    def listen(self, listener: Callable[[Outcome], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def conclude(
        self,
        kernel_s: Sequence[float],
        default_s: Sequence[float],
        clock: str,
        spans: tuple[Sequence[float], Sequence[float]] | None = None,
    ) -> bool:
        """Judge the samples (the first window to finish decides); True: keep the choice."""
        with self._lock:
            if self.outcome is not None:
                return self.outcome.keep
            outcome = judge(self.kernel, kernel_s, default_s, self.min_gain, clock, spans)
            self.outcome = outcome
            listeners = list(self._listeners)
        if self._report is not None and outcome.verdict != UNJUDGED:
            self._report(outcome)
        for listener in listeners:
            listener(outcome)
        return outcome.keep

    def reject(self, reason: str) -> bool:
        """End the judgement: the choice's output was wrong on a real call (``reason``), and
        the key goes back to Default whatever the timings say. False: it was judged before
        and kept (the caller's own Default serves anyway)."""
        with self._lock:
            if self.outcome is not None:
                return False
            outcome = Outcome(False, self.kernel, math.nan, math.nan, 0, "none", time.time(), reason)
            self.outcome = outcome
            listeners = list(self._listeners)
        if self._report is not None:
            self._report(outcome)
        for listener in listeners:
            listener(outcome)
        return True

    def abandon(self) -> None:
        """End the window without a verdict (Default cannot run where the choice does):
        the choice stays, and nothing is stored."""
        self.conclude([], [], "none")


class Clock(Protocol):
    """Times the calls of one window where they run."""

    name: str

    def capturing(self) -> bool:
        """Whether the caller's stream is being captured (then nothing may be recorded)."""

    def begin(self, index: int) -> None: ...

    def end(self, index: int) -> None: ...

    def ready(self) -> bool:
        """Whether every sample can be read without waiting."""

    def seconds(self) -> list[float]: ...

    def between(self) -> None:
        """The start of a call of the window's key (every one, timed or not): it ends the
        span of the timed call before it."""

    def spans(self) -> list[float] | None:
        """Each timed call's span, its start to the key's next call (a host clock's), or None."""


class HostClock:
    """A monotonic clock around each call: CPU kernels return when their work is done.

    Each timed call also has a *span*: from its start to the start of the key's next call
    (module docstring), so that what a call leaves to the calls after it (another thread
    pool's workers still spinning on the cores they need) is in its span."""

    name = "host"

    def __init__(self, samples: int) -> None:
        self._t = [0.0] * samples
        self._span = [math.nan] * samples
        self._start = 0.0
        self._open = -1  # the sample whose span runs until the key's next call

    def capturing(self) -> bool:
        return False

    def begin(self, index: int) -> None:
        self.between()
        self._start = time.perf_counter()

    def end(self, index: int) -> None:
        self._t[index] = time.perf_counter() - self._start
        self._open = index

    def between(self) -> None:
        if self._open >= 0:
            self._span[self._open] = time.perf_counter() - self._start
            self._open = -1

    def ready(self) -> bool:
        return self._open < 0

    def seconds(self) -> list[float]:
        return list(self._t)

    def spans(self) -> list[float] | None:
        return list(self._span)


class TorchEventClock:
    """CUDA/HIP events recorded on the caller's current stream around each call."""

    name = "cuda-events"

    def __init__(self, index: int, samples: int) -> None:
        import torch  # only for a torch GPU target

        self._torch = torch
        self._index = index
        self._samples = samples
        self._events: list[Any] = []
        self._stream: Any = None

    def capturing(self) -> bool:
        return bool(self._torch.cuda.is_current_stream_capturing())

    def begin(self, index: int) -> None:
        torch = self._torch
        if not self._events:
            with torch.cuda.device(self._index):
                self._events = [torch.cuda.Event(enable_timing=True) for _ in range(2 * self._samples)]
        # Looked up before the start event, not between the two: on an idle GPU the pair
        # also times the host, and the lookup is no part of the call.
        self._stream = torch.cuda.current_stream(self._index)
        self._events[2 * index].record(self._stream)

    def end(self, index: int) -> None:
        self._events[2 * index + 1].record(self._stream)

    def ready(self) -> bool:
        return bool(self._events) and bool(self._events[-1].query())

    def seconds(self) -> list[float]:
        ev = self._events
        return [ev[2 * i].elapsed_time(ev[2 * i + 1]) * 1e-3 for i in range(self._samples)]

    def between(self) -> None:
        pass

    def spans(self) -> list[float] | None:
        return None


class CupyEventClock:
    """CUDA/HIP events on CuPy's current stream around each call."""

    name = "cuda-events"

    def __init__(self, index: int, samples: int) -> None:
        import cupy  # only for a CuPy target

        self._cupy = cupy
        self._index = index
        self._samples = samples
        self._events: list[Any] = []

    def capturing(self) -> bool:
        stream = self._cupy.cuda.get_current_stream(self._index)
        return bool(getattr(stream, "is_capturing", lambda: False)())

    def begin(self, index: int) -> None:
        cupy = self._cupy
        if not self._events:
            with cupy.cuda.Device(self._index):
                self._events = [cupy.cuda.Event() for _ in range(2 * self._samples)]
        self._events[2 * index].record()

    def end(self, index: int) -> None:
        self._events[2 * index + 1].record()

    def ready(self) -> bool:
        return bool(self._events) and bool(self._events[-1].done)

    def seconds(self) -> list[float]:
        ev, elapsed = self._events, self._cupy.cuda.get_elapsed_time
        return [float(elapsed(ev[2 * i], ev[2 * i + 1])) * 1e-3 for i in range(self._samples)]

    def between(self) -> None:
        pass

    def spans(self) -> list[float] | None:
        return None


def clock_for(target: Target, samples: int) -> Clock:
    """The clock that times calls on ``target`` where they run."""
    if target.device.kind == "cpu":
        return HostClock(samples)
    if target.array_kind == "torch":
        return TorchEventClock(target.device.index, samples)
    if target.array_kind == "cupy":
        return CupyEventClock(target.device.index, samples)
    return HostClock(samples)


class _Turn:
    """The host-clock window whose turn it is to time its calls (one at a time in a process).

    Windows that open together (a model's products, met in one step) would each be judged
    with the others alternating as well: in the choice's arm its neighbours often ran
    their choices too, so the spans compared "all choices" against "all Default", not the
    program each verdict leaves (three kernels kept that way ran a NumPy layer at 0.93x,
    ``benchmarks/results/cpu-mixed/README.md``). So on a host clock one window times at a
    time; the keys waiting run Default meanwhile (what they ran before tuning) and take
    their turn after it."""

    def __init__(self) -> None:
        self.holder: ConfirmingRunner | None = None
        self.last = 0.0  # the holder's last call
        self.lock = threading.Lock()


TURN = _Turn()
#: A window whose key made no call for this long gives up its turn (its samples are void).
TURN_IDLE_S = 1.0


def drop_turn(confirmations: set[Confirmation]) -> None:
    """Give the turn up if its window judges one of ``confirmations`` (their plans are
    forgotten: the window's key may never be called again)."""
    holder = TURN.holder
    if holder is not None and holder.confirmation in confirmations:
        TURN.holder = None


class ConfirmingRunner:
    """A choice in its window: runs it and Default alternately, timed, then the winner.

    Callers that hold runners (the API's fast path, routing's plans) register
    ``on_final`` to replace this wrapper by the winner, so that later calls pay nothing
    for it; until they do, a concluded wrapper forwards to the winner. A call that
    finds another thread inside the window, or its stream under CUDA-graph capture,
    runs the choice untimed. A caller whose Default differs from the Selector's (torch
    routing, inside a dispatcher kernel) sets ``default`` before the first call. If
    Default raises where the choice ran (e.g. ``torch.matmul(out=...)`` refuses
    operands that require grad), the window ends without a verdict and the choice
    stays: it is what the caller got before windows existed.
    """

    def __init__(
        self, kernel: Runner, default: Runner, confirmation: Confirmation, clock: Clock, *, tie: bool = False
    ) -> None:
        self.candidate = kernel.candidate
        self.kernel = kernel
        self.default = default
        self.confirmation = confirmation
        # Default runs under graph capture (TieRunner): a tie, or a slim scaled choice
        # (default_in_graphs).
        self.tie = tie
        self.final: Runner | None = None
        self.on_final: list[Callable[[Runner], None]] = []
        self._clock = clock
        # Host clocks time one window at a time (_Turn); events on a device, all at once.
        self._sequential = isinstance(clock, HostClock)
        self._block = HOST_BLOCK if self._sequential else 1
        self._timed = 2 * confirmation.calls
        self._next = 0
        self._lock = threading.Lock()
        confirmation.listen(self._settle)

    def kept(self) -> Runner:
        """What serves the key once the choice is kept: the kernel, or for a tie the kernel
        outside graph capture and Default under it (:class:`TieRunner`)."""
        if self.tie:
            return TieRunner(self.kernel, self.default, self._clock.capturing)
        return self.kernel

    def _settle(self, outcome: Outcome) -> None:
        final = self.kept() if outcome.keep else self.default
        self.final = final
        if TURN.holder is self:
            TURN.holder = None
        for hook in self.on_final:
            hook(final)

    def _my_turn(self) -> bool:
        """Whether this (host-clock) window may time its calls now (:class:`_Turn`)."""
        turn, now = TURN, time.perf_counter()
        if turn.holder is self:
            turn.last = now
            return True
        with turn.lock:
            holder = turn.holder
            if holder is not None and holder.final is None and now - turn.last <= TURN_IDLE_S:
                return False
            if holder is not None and holder.final is None:
                holder._next = 0  # its key went quiet: its window starts again on its turn
            turn.holder, turn.last = self, now
            return True

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None, *extra: Any
    ) -> Any:
        # ``extra``: a scaled runner's scales (``scale_a, scale_b``), passed on as they are.
        # What a runner returns is passed on (a grouped Default's own output: core/grouped.py).
        final = self.final
        if final is not None:
            return final(a, b, out, alpha, beta, bias, *extra)
        if self.tie and self._clock.capturing():
            return self.default(a, b, out, alpha, beta, bias, *extra)  # a tie never enters a graph
        if not self._lock.acquire(blocking=False):
            return self.kernel(a, b, out, alpha, beta, bias, *extra)
        try:
            # The window's first call runs the choice whoever's turn it is (a first-call
            # check around the window compares that call); the rest wait for its turn.
            if self._sequential and self._next > 0 and not self._my_turn():
                return self._default(a, b, out, alpha, beta, bias, extra)  # another window times
            return self._window_call(a, b, out, alpha, beta, bias, extra)
        finally:
            self._lock.release()

    def _default(
        self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, extra: tuple[Any, ...]
    ) -> Any:
        try:
            return self.default(a, b, out, alpha, beta, bias, *extra)
        except Exception:
            self._next = WARMUP + self._timed  # no more window calls
            self.confirmation.abandon()  # settles this wrapper on the choice
            return self.kernel(a, b, out, alpha, beta, bias, *extra)

    def _window_call(
        self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, extra: tuple[Any, ...]
    ) -> Any:
        clock = self._clock
        i = self._next
        capturing = clock.capturing()
        if i >= WARMUP + self._timed or capturing:
            # The window is full and its last events may still be running, or its last span
            # open (or the stream is being captured): the verdict once the clock can be read
            # (never during a capture, where an event may not even be queried), and what it
            # keeps serves this call; until then the choice, untimed.
            clock.between()
            if i >= WARMUP + self._timed and not capturing and clock.ready():
                self._conclude()
                final = self.final
                if final is not None:
                    return final(a, b, out, alpha, beta, bias, *extra)
            return self.kernel(a, b, out, alpha, beta, bias, *extra)
        self._next = i + 1
        if i < WARMUP:
            clock.between()
            if i == 0:
                return self.kernel(a, b, out, alpha, beta, bias, *extra)
            return self._default(a, b, out, alpha, beta, bias, extra)
        j = i - WARMUP
        clock.begin(j)
        if uses_kernel(j, self._block):
            got = self.kernel(a, b, out, alpha, beta, bias, *extra)
        else:
            got = self._default(a, b, out, alpha, beta, bias, extra)
        clock.end(j)
        if j + 1 == self._timed and clock.ready():
            self._conclude()
        return got

    def _conclude(self) -> None:
        clock = self._clock
        spans = clock.spans()
        self.confirmation.conclude(
            *split(clock.seconds(), self._block),
            clock.name,
            None if spans is None else split(spans, self._block),
        )


class TieRunner:
    """A tie (:func:`tie_of`) that its window kept, or a slim scaled choice
    (:func:`default_in_graphs`): the kernel, except while the caller's stream is being
    captured into a CUDA graph, where Default runs.

    A tie wins in situ by its host time per call; a graph replay has none, and on the
    device the tie only matches Default (H200, fp8 stack at m=1 in CUDA graphs: 0.997x
    with ties captured). So a graph holds Default, as it would unrouted. ``capturing``:
    the target's check (its clock's), called once per call.
    """

    def __init__(self, kernel: Runner, default: Runner, capturing: Callable[[], bool]) -> None:
        self.candidate = kernel.candidate
        self.kernel = kernel
        self.default = default
        self.capturing = capturing

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None, *extra: Any
    ) -> Any:
        if self.capturing():
            return self.default(a, b, out, alpha, beta, bias, *extra)
        return self.kernel(a, b, out, alpha, beta, bias, *extra)
