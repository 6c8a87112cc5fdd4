"""Kernels that misbehave in the ways the harness must catch, and a backend that offers them.

Each kernel computes with the array library's own matmul (so it is as fast as Default,
or faster where it skips work) and then does one wrong thing: one element off, a NaN,
nothing on later calls, a stale result, an exit. ``KernelBackend`` offers one kernel
per name; ``calls`` counts every call, so a test can tell checks from timing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from unimatmul.backend import DEFAULT, Backend, Candidate, Runner, Target
from unimatmul.cache.record import TuningRecord
from unimatmul.core.arrays import CPU, ArrayAdapter, adapter_for_kind
from unimatmul.core.errors import UnsupportedProblem
from unimatmul.core.problem import Problem
from unimatmul.core.runners import DefaultRunner
from unimatmul.testing import fast_config
from unimatmul.tuning.harness import CpuTimer, Harness

Kernel = Callable[["FakeKernel", Any, Any, Any, float, float, Any], None]


def _first(x: Any) -> tuple[int, ...]:
    return (0,) * len(x.shape)


class FakeKernel:
    """One candidate's Runner: ``behave(self, a, b, out, alpha, beta, bias)``."""

    def __init__(
        self, backend: KernelBackend, candidate: Candidate, adapter: ArrayAdapter, behave: Kernel
    ) -> None:
        self.backend = backend
        self.candidate = candidate
        self.adapter = adapter
        self.behave = behave
        self.calls = 0
        self.state: dict[str, Any] = {}

    def right(self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
        self.adapter.matmul(a, b, out, alpha, beta, bias, None)

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        self.calls += 1
        with self.backend.lock:
            self.backend.calls += 1
        self.behave(self, a, b, out, alpha, beta, bias)


class KernelBackend(Backend):
    """A backend whose kernels are the given behaviours (``{name: behave}``)."""

    device_kinds = frozenset({"cpu"})
    array_kinds = frozenset({"numpy", "torch"})

    def __init__(
        self, name: str, kernels: dict[str, Kernel], *, prepare_raises: BaseException | None = None
    ) -> None:
        self.name = name  # type: ignore[misc]
        self.kernels = kernels
        self.prepare_raises = prepare_raises
        self.calls = 0
        self.lock = threading.Lock()
        self.runners: list[FakeKernel] = []

    def availability(self) -> str | None:
        return None

    def versions(self) -> dict[str, str]:
        return {self.name: "1.0"}

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        return [Candidate.make(self.name, kernel) for kernel in self.kernels]

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> FakeKernel:
        if self.prepare_raises is not None:
            raise self.prepare_raises
        if candidate.name not in self.kernels:
            raise UnsupportedProblem(f"{self.name} has no kernel {candidate.name!r}")
        runner = FakeKernel(self, candidate, target.adapter, self.kernels[candidate.name])
        self.runners.append(runner)
        return runner


# --- behaviours -------------------------------------------------------------------------


def right(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    k.right(a, b, out, alpha, beta, bias)


def one_off(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    """Right everywhere but one element, which is off by +1.0."""
    k.right(a, b, out, alpha, beta, bias)
    out[_first(out)] += 1.0


def one_nan(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    k.right(a, b, out, alpha, beta, bias)
    out[_first(out)] = float("nan")


def one_inf(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    k.right(a, b, out, alpha, beta, bias)
    out[_first(out)] = float("inf")


def first_call_only(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    """Right on its first call; every later call returns at once, writing nothing."""
    if k.calls == 1:
        k.right(a, b, out, alpha, beta, bias)


def stale(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    """Computes once, then copies that first result out on every call, whatever the inputs."""
    if "result" not in k.state:
        k.right(a, b, out, alpha, beta, bias)
        k.state["result"] = out.copy() if isinstance(out, np.ndarray) else out.clone()
        return
    k.adapter.copy_(out, k.state["result"])


def memo_by_pointer(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    """Remembers each (A, B, out) address triple's result: wrong once inputs change in place."""
    key = (k.adapter.ptr(a), k.adapter.ptr(b), k.adapter.ptr(out))
    found = k.state.get(key)
    if found is None:
        k.right(a, b, out, alpha, beta, bias)
        k.state[key] = out.copy() if isinstance(out, np.ndarray) else out.clone()
        return
    k.adapter.copy_(out, found)


def exits_on_call(n: int, code: Any = 3) -> Kernel:
    """A kernel that raises SystemExit on its n-th call (right before that)."""

    def behave(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
        if k.calls >= n:
            raise SystemExit(code)
        k.right(a, b, out, alpha, beta, bias)

    return behave


def interrupted_on_call(n: int) -> Kernel:
    """A kernel during whose n-th call the user presses Ctrl-C."""

    def behave(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
        if k.calls == n:
            raise KeyboardInterrupt
        k.right(a, b, out, alpha, beta, bias)

    return behave


def whole_rows(out: Any) -> Any:
    """``out``'s rows at their full stride: the row padding after the last column included."""
    shape = (
        *out.shape[:-1],
        (out.strides[-2] // out.itemsize) if isinstance(out, np.ndarray) else out.stride(-2),
    )
    if isinstance(out, np.ndarray):
        return np.lib.stride_tricks.as_strided(out, shape=shape, strides=out.strides)
    return out.as_strided(shape, out.stride(), out.storage_offset())


def writes_row_padding(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    """Right, then stores zeros over each row's whole stride, as a kernel whose tile is
    wider than n and that stores the whole tile does: the row padding is overwritten."""
    k.right(a, b, out, alpha, beta, bias)
    whole_rows(out)[..., out.shape[-1] :] = 0.0


def writes_past_the_end(
    k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any
) -> None:
    """Right, then writes the element just after the output's last one (an off-by-one store)."""
    k.right(a, b, out, alpha, beta, bias)
    last = out[(slice(-1, None),) * len(out.shape)]  # the last element, as a view
    if isinstance(out, np.ndarray):
        np.lib.stride_tricks.as_strided(last, shape=(2,), strides=(out.itemsize,))[1] = 0.0
    else:
        last.as_strided((2,), (1,), last.storage_offset())[1] = 0.0


def sleeps(seconds: float, after: int = 0) -> Kernel:
    """Right, but each call from the ``after``-th on first sleeps ``seconds`` (to tuning,
    a kernel that hangs)."""

    def behave(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
        if k.calls > after:
            time.sleep(seconds)
        k.right(a, b, out, alpha, beta, bias)

    return behave


def row_scaled(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    """Divides each row of A by its largest magnitude and multiplies the product's row
    back, as a kernel that quantises rows does: right on random inputs, NaN on a row of
    zeros (0 / 0). Plain products only (alpha 1, beta 0, no bias)."""
    if isinstance(a, np.ndarray):
        with np.errstate(invalid="ignore", divide="ignore"):
            scale = np.abs(a).max(axis=-1, keepdims=True)
            k.right(a / scale, b, out, 1.0, 0.0, None)
            out *= scale
    else:
        scale = a.abs().amax(dim=-1, keepdim=True)
        k.right(a / scale, b, out, 1.0, 0.0, None)
        out *= scale


NUMPY = adapter_for_kind("numpy")


class CostClock:
    """The cost of whichever runner ran last (a runner sets ``current``): what
    :class:`CostTimer` reports as every sample, so that the harness's pruning and
    comparisons see exactly the costs a test gives its runners."""

    current = 0.0


class CostTimer:
    """A harness timer whose samples are ``clock.current`` after the candidate's call."""

    name = "scripted"

    def __init__(self, clock: CostClock) -> None:
        self.clock = clock

    def prepare(self, calls: Any) -> Callable[[], float]:
        def sample() -> float:
            calls[0]()
            return self.clock.current

        return sample


class LaunchCostTimer(CostTimer):
    """A :class:`CostTimer` whose samples can be launched and read later, as the GPU
    timer's are (``sample.launch``: the Harness's rounds launch every candidate's sample
    and read them after): the call runs at the launch, its cost is read later."""

    def prepare(self, calls: Any) -> Callable[[], float]:
        def launch() -> Callable[[], float]:
            calls[0]()
            cost = self.clock.current
            return lambda: cost

        def sample() -> float:
            return launch()()

        sample.launch = launch  # type: ignore[attr-defined]
        sample.calls = 1  # type: ignore[attr-defined]
        return sample


def fake_target(kind: str) -> Target:
    """The CPU target of one array library (torch skipped where it is not installed)."""
    if kind == "torch":
        pytest.importorskip("torch")
    return Target(adapter_for_kind(kind), CPU)


def measure_kernels(
    problem: Problem, kind: str, kernels: dict[str, Kernel], timer: Any = None, **overrides: Any
) -> TuningRecord:
    """Default and the given fake kernels (backend ``fake``), measured by the harness with
    fast settings and ``overrides`` of them."""
    target = fake_target(kind)
    backend = KernelBackend("fake", kernels)
    entries: list[tuple[Candidate, Callable[[], Runner]]] = [
        (DEFAULT, lambda: DefaultRunner(target.adapter, problem.activation))
    ]
    for name in kernels:
        candidate = Candidate.make("fake", name)
        entries.append((candidate, lambda c=candidate: backend.prepare(problem, c, target)))
    settings = fast_config()
    for key, value in overrides.items():
        setattr(settings, key, value)
    return Harness(timer or CpuTimer(), settings).measure(problem, target, entries)
