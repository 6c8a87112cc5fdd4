"""Testing helpers for backends and plugins: fake backends, registration, fast settings.

unimatmul's own tests use these; a plugin author can test a backend the same way:

>>> from unimatmul.testing import FakeBackend, isolated_selector, registered
>>> with isolated_selector(tmp_path / "cache.msgpack") as selector:
...     with registered(selector.plugins, FakeBackend("fake", "wrong")):
...         ...  # tune, and see the harness reject the wrong kernel

The conformance suite (``unimatmul conformance --backend NAME``) is the other half:
it says whether a real backend keeps the protocol.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from unimatmul import settings
from unimatmul.cache.record import OK, PRUNED, TuningRecord
from unimatmul.core._backend import DEFAULT, Backend, Candidate, Target
from unimatmul.core.arrays import ArrayAdapter
from unimatmul.core.errors import UnsupportedProblem
from unimatmul.core.hookspecs import hookimpl
from unimatmul.core.plugins import PluginManager, reset_plugin_manager
from unimatmul.core.problem import Problem
from unimatmul.tuning.harness import HarnessConfig
from unimatmul.tuning.selector import Selector, set_selector


def fast_config() -> HarnessConfig:
    """A harness configuration that keeps a tuning run in the tens of milliseconds.

    They judge no measurement unstable (``noise_spread=inf``): a few short samples on a
    shared test machine often are, and the warning would bury the ones a test looks for.
    """
    return HarnessConfig(
        warmup=1,
        min_samples=3,
        max_samples=20,
        budget_s=0.01,
        settle_s=0.0,
        max_sets=2,
        noise_spread=math.inf,
    )


#: The former name of :func:`fast_config`, for plugins' tests written against it.
fast_settings = fast_config


@contextlib.contextmanager
def isolated_selector(cache_path: str | os.PathLike[str], *, confirm_calls: int = 0) -> Iterator[Selector]:
    """A process-wide Selector over its own cache file and plugin manager, with the fast
    harness configuration, for the duration of the block (the previous one comes back after).

    Confirmation windows (:mod:`unimatmul.tuning.confirm`) are off unless
    ``confirm_calls`` asks for them: a backend's tests count its calls and watch them
    fail one by one, and a window would send half of the first ones to Default.
    """
    saved = settings.CACHE.raw()
    os.environ[settings.CACHE.name] = str(Path(cache_path))
    plugins = PluginManager()
    selector = Selector(plugins=plugins, settings=fast_config())
    selector.confirm_calls = confirm_calls
    old = set_selector(selector)
    # A Selector made inside the block without plugins loads the process-wide manager:
    # let it see the block's environment, not whatever came before.
    reset_plugin_manager(None)
    try:
        yield selector
    finally:
        set_selector(old)
        reset_plugin_manager(None)
        if saved is None:
            os.environ.pop(settings.CACHE.name, None)
        else:
            os.environ[settings.CACHE.name] = saved


def prefer_kernel(
    selector: Selector,
    problem: Problem,
    target: Target,
    backend: str | None = None,
    names: Sequence[str] | None = None,
) -> TuningRecord:
    """Tune ``problem`` for real; where Default (or, with ``backend``, another backend's
    kernel; with ``names``, a kernel of another name) won, store the fastest checked kernel
    (of ``backend``, of one of ``names``) as the winner instead, so that a test or benchmark
    sees such a kernel run whichever wins on this machine. Pruned kernels passed the
    numeric check too; they were only slower. The stored times are the measured ones; only
    the winner is overridden (and the record says so). Returns the stored record: its
    winner is not such a kernel when none passed the check."""

    def preferred(identity: str) -> bool:
        if identity == DEFAULT.identity:
            return False
        candidate = Candidate.from_identity(identity)
        return (backend is None or candidate.backend == backend) and (
            names is None or candidate.name in names
        )

    record = selector.tune(problem, target, force=True)
    if preferred(record.winner):
        return record
    kernels = [r for r in record.results if r.status in (OK, PRUNED) and preferred(r.identity)]
    if not kernels:
        return record
    best = min(kernels, key=lambda r: r.median_s or math.inf)
    # A new record, not the stored one changed in place (the store holds that one).
    record = replace(
        record,
        winner=best.identity,
        winner_s=best.median_s or math.inf,
        settings={**record.settings, "test_override": "winner forced to a kernel"},
    )
    selector.store.put(selector.platform(target).namespace, problem.key, record)
    return record


class ScriptedTimer:
    """A harness timer that plays one script per prepared candidate, in the order they are
    prepared: ``script(i)`` is the seconds per call of that candidate's sample ``i`` (0: the
    first). The candidate's call still runs once per sample. For deterministic harness
    tests and scenarios (a busy moment, a noisy Default) whatever this machine's load."""

    name = "scripted"

    def __init__(self, scripts: Sequence[Callable[[int], float]]) -> None:
        self.scripts = list(scripts)
        self.prepared = 0

    def prepare(self, calls: Sequence[Callable[[], None]]) -> Callable[[], float]:
        script = self.scripts[self.prepared]
        self.prepared += 1
        taken = [0]

        def sample() -> float:
            calls[0]()
            taken[0] += 1
            return script(taken[0] - 1)

        return sample


BEHAVIOURS = (
    "correct",
    "slow",
    "wrong",
    "almost",
    "raise_prepare",
    "raise_run",
    "raise_candidates",
    "hangover",
)


class _Pool:
    """What fake kernels share, as the kernels of one thread pool do: a "hangover" kernel
    returns at once but leaves the pool busy for its ``delay_s`` (workers still spinning),
    and the next fake kernel call waits for it first."""

    busy_until = 0.0


POOL = _Pool()


class FakeRunner:
    """Runs the array library's own matmul, then misbehaves as its backend was told to."""

    def __init__(
        self, backend: FakeBackend, candidate: Candidate, adapter: ArrayAdapter, activation: str | None
    ) -> None:
        self.backend = backend
        self.candidate = candidate
        self.adapter = adapter
        self.activation = activation

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        behaviour = self.backend.behaviour
        with self.backend.lock:
            self.backend.calls += 1
        while time.perf_counter() < POOL.busy_until:  # a hangover's pool still busy
            time.sleep(1e-4)
        if behaviour == "raise_run":
            msg = f"{self.candidate.identity} crashed on purpose"
            raise RuntimeError(msg)
        if behaviour == "wrong":
            # Fast and finite, but not the product: the numeric check must catch it.
            out[...] = 0.5
            return
        self.adapter.matmul(a, b, out, alpha, beta, bias, self.activation)
        if behaviour == "almost":
            # Off by 1 %: far above the f32 tolerance, yet it looks plausible.
            self.adapter.copy_(out, out * 1.01)
        elif behaviour == "slow":
            time.sleep(self.backend.delay_s)
        elif behaviour == "hangover":
            POOL.busy_until = time.perf_counter() + self.backend.delay_s


class FakeBackend(Backend):
    """A Backend for tests that computes with the array library and misbehaves on request."""

    device_kinds = frozenset({"cpu"})
    array_kinds = frozenset({"numpy", "torch"})

    def __init__(
        self,
        name: str,
        behaviour: str = "correct",
        *,
        delay_s: float = 2e-3,
        version: str = "1.0",
        kernels: tuple[str, ...] = ("k0",),
    ) -> None:
        if behaviour not in BEHAVIOURS:
            msg = f"unknown fake behaviour {behaviour!r}; valid: {BEHAVIOURS}"
            raise ValueError(msg)
        self.name = name  # type: ignore[misc]
        self.behaviour = behaviour
        self.delay_s = delay_s
        self.version = version
        self.kernels = kernels
        self.calls = 0
        self.candidate_calls = 0
        self.prepared = 0
        self.lock = threading.Lock()

    def availability(self) -> str | None:
        return None

    def versions(self) -> dict[str, str]:
        return {self.name: self.version}

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        with self.lock:
            self.candidate_calls += 1
        if self.behaviour == "raise_candidates":
            msg = f"{self.name} cannot list candidates (on purpose)"
            raise RuntimeError(msg)
        return [Candidate.make(self.name, kernel) for kernel in self.kernels]

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> FakeRunner:
        with self.lock:
            self.prepared += 1
        if self.behaviour == "raise_prepare":
            msg = f"{candidate.identity} failed to prepare (on purpose)"
            raise RuntimeError(msg)
        if candidate.backend != self.name or candidate.name not in self.kernels:
            raise UnsupportedProblem(f"{self.name} has no kernel {candidate.name!r}")
        return FakeRunner(self, candidate, target.adapter, problem.activation)


class _Registration:
    """A plugin object whose one hook registers the given backends."""

    def __init__(self, backends: tuple[Backend, ...]) -> None:
        self.backends = backends

    @hookimpl
    def unimatmul_register_backends(self, register: Callable[[Any], None]) -> None:
        for backend in self.backends:
            register(backend)


@contextlib.contextmanager
def registered(plugins: PluginManager, *backends: Backend, name: str | None = None) -> Iterator[None]:
    """Register ``backends`` on a PluginManager as one plugin; unregister it in ``finally``."""
    plugin = _Registration(backends)
    plugin_name = name or "test-" + "-".join(b.name for b in backends)
    plugins.register(plugin, plugin_name)
    try:
        yield
    finally:
        plugins.unregister(plugin_name)
