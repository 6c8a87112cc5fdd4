"""Device timers and settings for GPU tuning (CUDA and ROCm).

:class:`TorchGraphTimer` captures a batch of back-to-back calls, cycling through the
rotated input sets, into one CUDA graph once, then times replays of it between two
events: launch gaps vanish and each sample is seconds per call on the device's clock.
It runs unchanged on ROCm builds of torch, whose ``torch.cuda`` events, streams and
graphs are HIP events, streams and graphs. A candidate that cannot be captured is
timed with events around the same batch launched eagerly. Either sampler can also queue
a sample without waiting for it (``launch``), so that the Harness's rounds launch every
candidate's sample back to back and read them after. :class:`CupyEventTimer`
times CuPy arrays with events around eager batches.

:func:`device_settings` sizes the Harness for a GPU: interleaved rounds, no settling
pause, inputs rotated through twice the L2 cache (read from the device), and a
budget per candidate that keeps a tuning run with the default candidate count
around a tenth of a second (``UNIMATMUL_GPU_BUDGET_S`` overrides it).

torch and CuPy are imported only when a GPU target asks for a timer.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from unimatmul import settings
from unimatmul.core._backend import Target
from unimatmul.tuning.harness import HarnessConfig, Timer

#: Calls per timed batch, replayed from one graph (the default of
#: ``UNIMATMUL_GPU_BATCH_CALLS``, which sets it for :func:`device_timer`). Ten rather than
#: twenty cut a warm tuning's sampling by a third on the H100 and the H200, with winners
#: agreeing between runs as often (``benchmarks/results/tune-agreement-h100``).
MIN_CALLS: int = settings.GPU_BATCH_CALLS.default
#: Calls of the eager warm-up before a capture (the first input sets).
WARM_CALLS = 3
#: A batch is cut shorter than MIN_CALLS where it would run longer than this. Long
#: enough that large GEMMs are measured back to back, at the clocks they sustain, and
#: not in short bursts (on the H200 a single 1.3 ms call ran ~10 % faster than 14 in a
#: row, which could rank kernels differently from how they run in a model).
MAX_BATCH_S = 6e-3


def batch_size(sets: int, call_s: float, min_calls: int = MIN_CALLS, max_batch_s: float = MAX_BATCH_S) -> int:
    """Calls per timed batch: every input set at least once, bounded by ``max_batch_s``."""
    count = max(min_calls, sets)
    if call_s > 0 and math.isfinite(call_s):
        count = min(count, max(1, int(max_batch_s / call_s)))
    return max(1, count)


def _named(name: str, min_calls: int) -> str:
    """A timer's name as records keep it: the batch size in it where it is not the default."""
    return name if min_calls == MIN_CALLS else f"{name} ({min_calls} calls a batch)"


class _OnStream:
    """``with torch.cuda.stream(stream)`` for a timer's samples, without torch's lookups:
    its context finds the current device through ``torch.cuda.is_available()`` as it is
    made and entered, and so does an event recorded without a stream (torch 2.11: four
    device counts a sample). Where the current device is not the
    stream's, torch's own context serves (it also switches the device). Not re-entrant:
    one per sampler, entered by one thread at a time."""

    __slots__ = ("_context", "_index", "_prev", "_stream", "_torch")

    def __init__(self, torch: Any, stream: Any, index: int) -> None:
        self._torch, self._stream, self._index = torch, stream, index
        self._prev: Any = None
        self._context: Any = None

    def __enter__(self) -> None:
        cuda = self._torch.cuda
        if cuda.current_device() != self._index:
            self._context = cuda.stream(self._stream)
            self._context.__enter__()
            return
        self._context = None
        self._prev = cuda.current_stream(self._index)
        cuda.set_stream(self._stream)

    def __exit__(self, *exc: object) -> None:
        if self._context is not None:
            self._context.__exit__(*exc)
            self._context = None
            return
        self._torch.cuda.set_stream(self._prev)
        self._prev = None


class TorchGraphTimer:
    """CUDA/HIP-graph replays of back-to-back calls, timed with torch events."""

    name = "torch-cuda-graph"

    def __init__(
        self,
        index: int,
        *,
        min_calls: int = MIN_CALLS,
        max_batch_s: float = MAX_BATCH_S,
        upload: bool = True,
    ) -> None:
        import torch

        self.torch = torch
        self.index = index
        self.min_calls = min_calls
        self.max_batch_s = max_batch_s
        self.name = _named(type(self).name, min_calls)
        #: Whether ``prepare`` launches the new graph once (its first launch uploads it)
        #: before returning. The Harness passes False: its first sample of every candidate
        #: is a warm-up that is never kept, so that launch is the upload.
        self.upload = upload
        # One side stream for every capture: library workspaces made on it during the
        # eager warm-up are reused, not allocated inside a capture.
        self.stream = torch.cuda.Stream(device=index)
        #: How the last ``prepare`` ended up timing: "graph" or "eager" (and why).
        self.last_mode = ""

    def _events(self) -> tuple[Any, Any]:
        event = self.torch.cuda.Event
        return event(enable_timing=True), event(enable_timing=True)

    def prepare(self, calls: Sequence[Callable[[], None]]) -> Callable[[], float]:
        torch = self.torch
        stream = self.stream
        start, end = self._events()
        stream.wait_stream(torch.cuda.current_stream(self.index))
        # Warm-up: the first few input sets once (lazy set-up, a library's workspace on this
        # stream), timed to size the batch: that only matters for calls long enough that
        # launches queue up behind them, where a few calls time them as well as many.
        warm = calls[:WARM_CALLS]
        with _OnStream(torch, stream, self.index):
            start.record(stream)
            for call in warm:
                call()
            end.record(stream)
        end.synchronize()
        per_call = start.elapsed_time(end) * 1e-3 / len(warm)
        return self.capture(calls, batch_size(len(calls), per_call, self.min_calls, self.max_batch_s))

    def prepare_within(
        self, calls: Sequence[Callable[[], None]], call_s: float
    ) -> Callable[[], float] | None:
        """:meth:`prepare`'s sampler for calls known to take at most ``call_s`` seconds
        each, without waiting for the device: where a batch of such calls fits
        ``max_batch_s``, its size does not depend on their own time (``batch_size``), so
        the warm-up calls are not timed and nothing is synchronised. None where it might
        (then :meth:`prepare`)."""
        count = max(self.min_calls, len(calls))
        if not 0.0 < call_s * count <= self.max_batch_s:
            return None
        self.stream.wait_stream(self.torch.cuda.current_stream(self.index))
        with _OnStream(self.torch, self.stream, self.index):
            for call in calls[:WARM_CALLS]:
                call()
        return self.capture(calls, count)

    def capture(
        self, calls: Sequence[Callable[[], None]], count: int, pool: Any = None
    ) -> Callable[[], float]:
        """A sampler of ``count`` back-to-back calls cycling through ``calls``: replays of
        one CUDA graph of them (captured into ``pool``, a graph memory pool, where given),
        or the calls themselves where they cannot be captured (``last_mode`` says which).
        The calls have run once on :attr:`stream` already."""
        torch = self.torch
        stream = self.stream
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(stream):
                graph.capture_begin(pool=pool, capture_error_mode="thread_local")
                try:
                    for i in range(count):
                        calls[i % len(calls)]()
                finally:
                    graph.capture_end()
        except Exception as exc:
            torch.cuda.synchronize(self.index)
            self.last_mode = f"eager ({type(exc).__name__}: {exc})"
            return self._eager(calls, count)
        self.last_mode = "graph"
        if self.upload:
            # The first launch of a graph also uploads it: replay once before any sample.
            with _OnStream(torch, stream, self.index):
                graph.replay()
            stream.synchronize()

        sample = self._sampler(graph.replay, count)
        sample.graph = graph  # type: ignore[attr-defined]  # kept alive with the sampler
        return sample

    def _eager(self, calls: Sequence[Callable[[], None]], count: int) -> Callable[[], float]:
        def run() -> None:
            for i in range(count):
                calls[i % len(calls)]()

        return self._sampler(run, count)

    def _sampler(self, run: Callable[[], None], count: int) -> Callable[[], float]:
        """Seconds per call of ``run`` (``count`` calls), timed by events on the timer's
        stream. Besides ``sample()``, what the Harness's rounds use (``Harness._round``):
        ``sample.launch()`` queues one sample and returns its read (which waits for it),
        and ``sample.calls`` is ``count``. A sampler's next launch reuses its events: read a
        sample before launching the same sampler again."""
        torch = self.torch
        stream = self.stream
        start, end = self._events()
        on_stream = _OnStream(torch, stream, self.index)

        def launch() -> Callable[[], float]:
            with on_stream:
                start.record(stream)
                run()
                end.record(stream)
            return read

        def read() -> float:
            end.synchronize()
            return start.elapsed_time(end) * 1e-3 / count

        def sample() -> float:
            return launch()()

        sample.launch = launch  # type: ignore[attr-defined]
        sample.calls = count  # type: ignore[attr-defined]
        return sample


class CupyEventTimer:
    """Events around eager batches of back-to-back calls on CuPy's current stream."""

    name = "cupy-events"

    def __init__(self, index: int, *, min_calls: int = MIN_CALLS, max_batch_s: float = MAX_BATCH_S) -> None:
        import cupy

        self.cupy = cupy
        self.index = index
        self.min_calls = min_calls
        self.name = _named(type(self).name, min_calls)
        self.max_batch_s = max_batch_s

    def prepare(self, calls: Sequence[Callable[[], None]]) -> Callable[[], float]:
        cupy = self.cupy
        with cupy.cuda.Device(self.index):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()

        def batch(count: int) -> float:
            with cupy.cuda.Device(self.index):
                start.record()
                for i in range(count):
                    calls[i % len(calls)]()
                end.record()
                end.synchronize()
                return float(cupy.cuda.get_elapsed_time(start, end)) * 1e-3 / count

        per_call = batch(len(calls))
        count = batch_size(len(calls), per_call, self.min_calls, self.max_batch_s)
        return lambda: batch(count)


_timers: dict[tuple[str, int, int], Timer] = {}
_timers_lock = threading.Lock()


def device_timer(target: Target) -> Timer:
    """The timer for a GPU target (one per array library, device and batch size, reused);
    its batches hold ``UNIMATMUL_GPU_BATCH_CALLS`` calls at least."""
    calls = settings.GPU_BATCH_CALLS.get()
    key = (target.array_kind, target.device.index, calls)
    with _timers_lock:
        found = _timers.get(key)
        if found is None:
            if target.array_kind == "torch":
                # The harness's own warm-up sample launches each graph first.
                found = TorchGraphTimer(target.device.index, min_calls=calls, upload=False)
            elif target.array_kind == "cupy":
                found = CupyEventTimer(target.device.index, min_calls=calls)
            else:
                msg = f"no device timer for {target.array_kind} arrays on {target.device}"
                raise TypeError(msg)
            _timers[key] = found
    return found


def l2_cache_bytes(target: Target) -> int:
    """The device's L2 size in bytes (50 MiB when the library does not say)."""
    index = target.device.index
    try:
        if target.array_kind == "cupy":
            import cupy

            return int(cupy.cuda.runtime.getDeviceProperties(index)["l2CacheSize"])
        import torch

        return int(torch.cuda.get_device_properties(index).L2_cache_size)
    except Exception:
        return 50 << 20


def device_settings(target: Target) -> HarnessConfig:
    """Harness settings for a GPU target (see the module docstring)."""
    return HarnessConfig(
        warmup=1,
        min_samples=3,
        max_samples=20,
        budget_s=settings.GPU_BUDGET_S.get(),
        # A candidate 10 % behind the best after 3 or more samples stops (checked every
        # round): graph-timed samples on rotated inputs spread 1-2 % here (H200), so it
        # could not have won; the winner is then measured again against Default.
        prune_ratio=1.10,
        first_prune_ratio=2.0,
        # ... and one 30 % behind after the first round, at once: its remaining samples,
        # and its checks after timing, cannot change the winner (the warm-up sample that
        # first_prune_ratio reads also uploads the graph, so it is judged more loosely).
        round_prune_ratio=1.3,
        # ... and, after min_samples, one whose every sample is over tie_ratio times the
        # best median: on the H100 a warm tune of Llama-3-8B kept 11 % of its samples for
        # candidates 1.05-1.10x behind, which could neither win nor tie.
        prune_untied=True,
        interleave=True,
        settle_s=0.0,
        min_gain=0.01,
        tie_gain=0.01,
        tie_ratio=1.05,
        rotate_bytes=2 * l2_cache_bytes(target),
        max_rotation_bytes=1 << 30,
        max_sets=32,
    )
