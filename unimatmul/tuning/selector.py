"""The Selector and Tuner: the policy that turns a Problem into a Runner.

Order of lookup: in-process LRU of prepared runners -> the cache store (entries
validated one by one against current library versions) -> tune, when the mode
allows -> Default. A failure anywhere warns once and falls back to Default: the
user's program never crashes because of tuning. One tuning per key at a time.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from unimatmul.cache.lru import LRU
from unimatmul.cache.protocol import CacheStore, open_store
from unimatmul.cache.record import TuningRecord
from unimatmul.core.backend import DEFAULT, Backend, Candidate, DefaultRunner, Runner, Target
from unimatmul.core.errors import UnknownCandidate, UnsupportedProblem
from unimatmul.core.platform import Platform, detect_platform
from unimatmul.core.plugins import PluginManager, get_plugin_manager
from unimatmul.core.problem import Problem
from unimatmul.tuning.buckets import Buckets, lookup_bucket
from unimatmul.tuning.harness import CpuTimer, Harness, HarnessSettings, Timer
from unimatmul.tuning.recording import record_problem


@dataclass
class Decision:
    """What the selector chose for one problem, and why (for ``info``/profiling)."""

    runner: Runner
    source: str  # "tuned", "cache", "bucket", "default", "fallback"
    record: TuningRecord | None = None


@dataclass
class SelectorStats:
    lookups: int = 0
    tuned: int = 0
    cache_hits: int = 0  # matched + revalidated
    matched: int = 0  # stored under the library versions in use now
    revalidated: int = 0  # versions changed, and the backend says the winner still applies
    invalidated: int = 0  # versions changed and the winner is gone: dropped, retuned on demand
    fallbacks: int = 0
    recorded: set[str] = field(default_factory=set)

    def summary(self) -> str:
        """One line for logs: how the cache served this process."""
        return (
            f"cache: {self.matched} matched, {self.revalidated} revalidated, "
            f"{self.invalidated} invalidated, {self.tuned} tuned"
        )


@dataclass
class ValidationSummary:
    """Per-entry validation of one namespace against the libraries installed now."""

    namespace: str
    matched: int = 0
    revalidated: int = 0
    invalidated: list[str] = field(default_factory=list)
    deleted: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "matched": self.matched,
            "revalidated": self.revalidated,
            "invalidated": len(self.invalidated),
            "invalidated_keys": list(self.invalidated),
            "deleted": self.deleted,
        }


class Selector:
    """Chooses, tunes and remembers kernels; one per process is the usual case."""

    def __init__(
        self,
        *,
        plugins: PluginManager | None = None,
        store: CacheStore | None = None,
        settings: HarnessSettings | None = None,
        backends: Iterable[str] | None = None,
        runner_cache_size: int | None = None,  # None: $UNIMATMUL_LRU_SIZE or 4096
    ) -> None:
        self._plugins = plugins
        self._store = store
        self.settings = settings
        self.enabled = set(backends) if backends is not None else None
        self.runners: LRU[tuple[Any, ...], Decision] = LRU(runner_cache_size)
        self.stats = SelectorStats()
        self._platforms: dict[tuple[str, Any], Platform] = {}
        self._tune_locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._warned: set[str] = set()
        # Record mode hands every problem it resolves here (default: the record file).
        self.on_problem: Callable[[Problem, Target], None] | None = record_problem
        # Dynamic shapes: a problem differing from a bucket-tuned one only in m uses its choice.
        self.buckets: Buckets | None = Buckets.from_env()

    # --- wiring -------------------------------------------------------------------
    @property
    def plugins(self) -> PluginManager:
        if self._plugins is None:
            self._plugins = get_plugin_manager()
        return self._plugins

    @property
    def store(self) -> CacheStore:
        if self._store is None:
            self._store = open_store()
        return self._store

    def backends_for(self, target: Target) -> list[Backend]:
        """Enabled, available backends that serve this target, in name order."""
        found = []
        for name, backend in sorted(self.plugins.backends().items()):
            if self.enabled is not None and name not in self.enabled:
                continue
            if backend.serves(target) and backend.availability() is None:
                found.append(backend)
        return found

    def platform(self, target: Target) -> Platform:
        key = (target.array_kind, target.device)
        found = self._platforms.get(key)
        if found is None:
            found = detect_platform(target, self.backends_for(target))
            self._platforms[key] = found
        return found

    def timer_for(self, target: Target) -> Timer:
        if target.device.kind == "cpu":
            return CpuTimer()
        from unimatmul.tuning.timers import device_timer

        return device_timer(target)

    def settings_for(self, target: Target) -> HarnessSettings:
        if self.settings is not None:
            return self.settings
        if target.device.kind == "cpu":
            return HarnessSettings()
        from unimatmul.tuning.timers import device_settings

        return device_settings(target)

    def warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"unimatmul: {message}", RuntimeWarning, stacklevel=4)

    # --- choosing -----------------------------------------------------------------
    def decide(self, problem: Problem, target: Target, mode: str) -> Decision:
        """The Runner to use for ``problem`` in ``mode``; never raises for tuning failures."""
        self.stats.lookups += 1
        if mode == "off":
            return Decision(DefaultRunner(target.adapter, problem.activation), "default")
        if mode == "record" and self.on_problem is not None:
            try:
                self.on_problem(problem, target)
            except Exception as exc:  # recording must never break the workload
                self.warn_once("record", f"could not record {problem.shape_text}: {exc!r}")
        try:
            record = self.lookup(problem, target)
            source = "cache"
            if record is None and self.buckets is not None:
                record = lookup_bucket(self, problem, target)
                source = "bucket" if record is not None else source
            if record is None and mode == "tune":
                record, source = self.tune(problem, target), "tuned"
            if record is None:
                return Decision(DefaultRunner(target.adapter, problem.activation), "default")
            runner = self.prepare(problem, Candidate.from_identity(record.winner), target)
            return Decision(runner, source, record)
        except Exception as exc:
            self.stats.fallbacks += 1
            self.warn_once(
                problem.key,
                f"using Default for {problem.shape_text} {problem.dtype_a}: {type(exc).__name__}: {exc}",
            )
            return Decision(DefaultRunner(target.adapter, problem.activation), "fallback")

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> Runner:
        """A Runner for a Candidate on this target: Default or a backend's kernel."""
        if candidate == DEFAULT:
            return DefaultRunner(target.adapter, problem.activation)
        backend = self.plugins.backends().get(candidate.backend)
        if backend is None or not backend.serves(target):
            names = ", ".join(sorted(self.plugins.backends())) or "none"
            msg = f"no backend {candidate.backend!r} serves {target.device} (registered: {names})"
            raise UnknownCandidate(msg, identity=candidate.identity)
        reason = backend.availability()
        if reason is not None:
            msg = f"backend {backend.name!r} is unavailable: {reason}"
            raise UnknownCandidate(msg, identity=candidate.identity)
        return backend.prepare(problem, candidate, target)

    def lookup(self, problem: Problem, target: Target) -> TuningRecord | None:
        """The stored record for ``problem``, re-checked if a library version changed."""
        platform = self.platform(target)
        record = self.store.get(platform.namespace, problem.key)
        if record is None:
            return None
        if self._versions_match(record, platform):
            self.stats.cache_hits += 1
            self.stats.matched += 1
            return record
        candidate = Candidate.from_identity(record.winner)
        if candidate == DEFAULT or self.applies(problem, candidate, target):
            self.stats.cache_hits += 1
            self.stats.revalidated += 1
            return record
        # The winner no longer exists or no longer checks: forget it, retune on demand.
        self.stats.invalidated += 1
        self.store.delete(platform.namespace, problem.key)
        return None

    def validate(self, target: Target, *, delete: bool = False) -> ValidationSummary:
        """Check every stored entry of ``target``'s namespace against the libraries
        installed now, one by one (``unimatmul cache verify --validate``); with
        ``delete``, drop the entries whose winner no longer exists or checks."""
        platform = self.platform(target)
        summary = ValidationSummary(platform.namespace)
        for _, key, record in list(self.store.items(platform.namespace)):
            if self._versions_match(record, platform):
                summary.matched += 1
                continue
            try:
                problem = Problem.from_key(record.problem)
                candidate = Candidate.from_identity(record.winner)
                valid = candidate == DEFAULT or self.applies(problem, candidate, target)
            except ValueError:
                valid = False
            if valid:
                summary.revalidated += 1
            else:
                summary.invalidated.append(key)
        if delete:
            for key in summary.invalidated:
                self.store.delete(platform.namespace, key)
            self.store.flush()
            summary.deleted = True
        return summary

    def _versions_match(self, record: TuningRecord, platform: Platform) -> bool:
        current = platform.versions
        return all(current.get(lib) == version for lib, version in record.versions.items())

    def applies(self, problem: Problem, candidate: Candidate, target: Target) -> bool:
        """Whether a stored (non-Default) Candidate still exists and checks for ``problem`` here."""
        backend = self.plugins.backends().get(candidate.backend)
        if backend is None or not backend.serves(target) or backend.availability() is not None:
            return False
        try:
            return backend.check(problem, candidate, target)
        except Exception:
            return False

    # --- tuning -------------------------------------------------------------------
    def _tune_lock(self, namespace: str, key: str) -> threading.Lock:
        with self._locks_guard:
            return self._tune_locks.setdefault((namespace, key), threading.Lock())

    def tune(
        self,
        problem: Problem,
        target: Target,
        *,
        force: bool = False,
        store: bool = True,
        progress: Callable[[str], None] | None = None,
    ) -> TuningRecord:
        """Measure every candidate of ``problem`` and store the winner.

        When several threads ask for the same key at once, one tunes and the others
        wait for and reuse its record.
        """
        platform = self.platform(target)
        lock = self._tune_lock(platform.namespace, problem.key)
        with lock:
            if not force:
                existing = self.lookup(problem, target)
                if existing is not None:
                    return existing
            entries: list[tuple[Candidate, Callable[[], Runner]]] = [
                (DEFAULT, lambda: DefaultRunner(target.adapter, problem.activation))
            ]
            versions: dict[str, str] = dict(platform.versions)
            for backend in self.backends_for(target):
                try:
                    offered = backend.candidates(problem, target)
                except UnsupportedProblem:
                    continue
                except Exception as exc:
                    self.warn_once(
                        f"candidates:{backend.name}",
                        f"backend {backend.name!r} failed to list candidates: {exc!r}",
                    )
                    continue
                for candidate in offered:
                    entries.append((candidate, _preparer(backend, problem, candidate, target)))
            harness = Harness(self.timer_for(target), self.settings_for(target))
            started = time.perf_counter()
            record = harness.measure(problem, target, entries, versions=versions, progress=progress)
            record.tune_s = time.perf_counter() - started
            self.stats.tuned += 1
            if store:
                self.store.note_platform(platform.namespace, platform.to_dict())
                self.store.put(platform.namespace, problem.key, record)
            return record


def _preparer(
    backend: Backend, problem: Problem, candidate: Candidate, target: Target
) -> Callable[[], Runner]:
    return lambda: backend.prepare(problem, candidate, target)


_selector: Selector | None = None
_selector_lock = threading.Lock()


def get_selector() -> Selector:
    """The process-wide Selector."""
    global _selector
    if _selector is None:
        with _selector_lock:
            if _selector is None:
                _selector = Selector()
    return _selector


def set_selector(selector: Selector | None) -> Selector | None:
    """Install another process-wide Selector (tests, embedding); returns the old one."""
    global _selector
    with _selector_lock:
        old, _selector = _selector, selector
    from unimatmul import api

    api.clear_fast_path()
    return old
