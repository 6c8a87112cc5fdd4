"""Shared fixtures: an isolated cache and Selector, fast harness settings, fake backends.

No test may read or write the user's real cache: ``pytest_configure`` points
``UNIMATMUL_CACHE`` at a temporary file for the whole session before anything is
imported, and clears the other ``UNIMATMUL_*`` variables so that the caller's
environment cannot change what the tests see.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from unimatmul.core.arrays import ArrayAdapter
from unimatmul.core.backend import Backend, Candidate, Target
from unimatmul.core.errors import UnsupportedProblem
from unimatmul.core.hookspecs import hookimpl
from unimatmul.core.plugins import PluginManager, reset_plugin_manager
from unimatmul.core.problem import Problem
from unimatmul.settings import REGISTRY
from unimatmul.tuning.harness import HarnessSettings
from unimatmul.tuning.selector import Selector, set_selector

# Importing unimatmul reads no environment variable: pytest_configure below still
# decides the cache path before any Selector or store exists.

_SESSION_DIR: str | None = None
_SAVED_ENV: dict[str, str] = {}
# Every variable unimatmul declares (unimatmul.settings): the caller's environment must
# not change what the tests see.
_VARIABLES = tuple(REGISTRY)


def pytest_configure(config: pytest.Config) -> None:
    global _SESSION_DIR
    _SESSION_DIR = tempfile.mkdtemp(prefix="unimatmul-tests-")
    for name in _VARIABLES:
        if name in os.environ:
            _SAVED_ENV[name] = os.environ.pop(name)
    os.environ["UNIMATMUL_CACHE"] = str(Path(_SESSION_DIR) / "session-cache.msgpack")


def pytest_unconfigure(config: pytest.Config) -> None:
    for name in _VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(_SAVED_ENV)
    if _SESSION_DIR is not None:
        shutil.rmtree(_SESSION_DIR, ignore_errors=True)


def fast_settings() -> HarnessSettings:
    """Harness settings that keep a tuning run in the tens of milliseconds."""
    return HarnessSettings(warmup=1, min_samples=3, max_samples=20, budget_s=0.01, settle_s=0.0, max_sets=2)


@dataclass
class Isolated:
    """What the ``isolated`` fixture installed: a Selector with its own plugins and cache file."""

    selector: Selector
    plugins: PluginManager
    cache_path: Path

    def store_count(self) -> int:
        return int(self.selector.store.count())


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Isolated]:
    """A fresh process-wide Selector over a cache file in ``tmp_path``, with fast settings."""
    cache = tmp_path / "cache.msgpack"
    monkeypatch.setenv("UNIMATMUL_CACHE", str(cache))
    monkeypatch.delenv("UNIMATMUL_MODE", raising=False)
    plugins = PluginManager()
    selector = Selector(plugins=plugins, settings=fast_settings())
    old = set_selector(selector)
    # A Selector made inside the test without plugins loads the process-wide manager:
    # let it see the test's environment, not whatever an earlier test left.
    reset_plugin_manager(None)
    try:
        yield Isolated(selector, plugins, cache)
    finally:
        set_selector(old)
        reset_plugin_manager(None)


# --- fake backends --------------------------------------------------------------------

BEHAVIOURS = ("correct", "slow", "wrong", "almost", "raise_prepare", "raise_run", "raise_candidates")


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


@pytest.fixture
def fake_backend(isolated: Isolated) -> Iterator[Callable[..., Any]]:
    """``fake_backend(name, behaviour, ...)``: a FakeBackend registered on the isolated selector."""
    with contextlib.ExitStack() as stack:

        def make(name: str, behaviour: str = "correct", **kwargs: Any) -> FakeBackend:
            backend = FakeBackend(name, behaviour, **kwargs)
            stack.enter_context(registered(isolated.plugins, backend))
            return backend

        yield make


@pytest.fixture
def unregistered_backend() -> type[FakeBackend]:
    """The FakeBackend class itself, for tests that register it their own way."""
    return FakeBackend


@pytest.fixture(name="registered")
def registered_fixture() -> Callable[..., contextlib.AbstractContextManager[None]]:
    """:func:`registered`: ``with registered(plugins, *backends, name=...)``."""
    return registered
