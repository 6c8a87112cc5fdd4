"""The Selector: the policy that turns a Problem into a Runner.

Order of lookup: the cache store (entries validated one by one against current
library versions) -> a bucket's record for dynamic shapes -> tune (the Tuner), when
the mode allows -> Default. The callers (``unimatmul.matmul``, PyTorch routing) keep
their own maps of prepared runners in front of it. A failure anywhere warns once and
falls back to Default (:meth:`Selector.fall_back` is the one fallback policy, also for
a kernel that fails on a call): the user's program never crashes because of tuning.
One tuning per key at a time. ``UNIMATMUL_TUNE_BUDGET_S`` bounds the tuning a process does
on its calls (:meth:`Selector.tuning_allowance`): once spent, untuned problems run Default.
"""

from __future__ import annotations

import atexit
import contextlib
import math
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from unimatmul import settings as env
from unimatmul.cache.protocol import CacheStore, open_store
from unimatmul.cache.record import TuningRecord, checked_here, mark_checked
from unimatmul.core import notices
from unimatmul.core._backend import DEFAULT, Backend, Candidate, Runner, Target
from unimatmul.core.platform import Platform, detect_platform
from unimatmul.core.plugins import PluginManager
from unimatmul.core.problem import Problem
from unimatmul.core.runners import DefaultRunner, default_runner
from unimatmul.tuning import confirm, trust
from unimatmul.tuning.buckets import Buckets, bucket_range
from unimatmul.tuning.harness import HarnessConfig
from unimatmul.tuning.record_mode import record_problem
from unimatmul.tuning.tuner import Progress, Tuner


@dataclass
class Decision:
    """What the selector chose for one problem, and why (for ``info``/profiling)."""

    runner: Runner
    # "tuned", "cache", "bucket", "default", "fallback", "deferred"; "confirmed" /
    # "reverted": a record whose choice a confirmation window judged (tuning/confirm.py).
    source: str
    record: TuningRecord | None = None
    # Set when ``runner`` is a ConfirmingRunner: the choice's first real calls judge it.
    confirmation: confirm.Confirmation | None = None


@dataclass
class SelectorStats:
    lookups: int = 0
    tuned: int = 0
    cache_hits: int = 0  # matched + revalidated
    matched: int = 0  # stored under the library versions in use now
    revalidated: int = 0  # versions changed, and the backend says the winner still applies
    invalidated: int = 0  # versions changed and the winner is gone: dropped, retuned on demand
    unavailable: int = 0  # the winner's backend is not loaded or not available here: skipped, kept
    fallbacks: int = 0
    tune_s: float = 0.0  # seconds spent tuning in this process
    confirmed: int = 0  # windows that kept their choice
    reverted: int = 0  # windows that sent their key back to Default
    recorded: set[str] = field(default_factory=set)

    def summary(self) -> str:
        """One line for logs: how the cache served this process."""
        return (
            f"cache: {self.matched} matched, {self.revalidated} revalidated, "
            f"{self.invalidated} invalidated, {self.tuned} tuned"
            + (f", {self.unavailable} skipped (backend not here)" if self.unavailable else "")
        )


@dataclass
class ValidationSummary:
    """Per-entry validation of one namespace against the libraries installed now."""

    namespace: str
    matched: int = 0
    revalidated: int = 0
    invalidated: list[str] = field(default_factory=list)
    # The winner's backend is not loaded or not available here: not invalid, only
    # unusable in this process; kept (another process, or a later one, has it).
    unavailable: list[str] = field(default_factory=list)
    deleted: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "matched": self.matched,
            "revalidated": self.revalidated,
            "invalidated": len(self.invalidated),
            "invalidated_keys": list(self.invalidated),
            "unavailable": len(self.unavailable),
            "unavailable_keys": list(self.unavailable),
            "deleted": self.deleted,
        }


class Selector:
    """Chooses, tunes and remembers kernels; one per process is the usual case."""

    def __init__(
        self,
        *,
        plugins: PluginManager | None = None,
        store: CacheStore | None = None,
        settings: HarnessConfig | None = None,
        backends: Iterable[str] | None = None,
    ) -> None:
        self._store = store
        self._warned: set[Hashable] = set()
        self.tuner = Tuner(plugins=plugins, settings=settings, backends=backends, warn=self.warn_once)
        self.stats = SelectorStats()
        self._platforms: dict[tuple[str, Any], Platform] = {}
        # key -> [its lock, threads holding or waiting for it]: gone when none is.
        self._tune_locks: dict[tuple[str, str], list[Any]] = {}
        # (problem key, choice) -> whether its first-call check passed in this process.
        self._checked: dict[tuple[str, str], bool] = {}
        self._locks_guard = threading.Lock()
        # Record mode hands every problem it resolves here (default: the record file).
        self.on_problem: Callable[[Problem, Target], None] | None = record_problem
        # Dynamic shapes: a problem differing from a bucket-tuned one only in m uses its choice.
        self.buckets: Buckets | None = Buckets.from_env()
        # Timed calls per candidate in a confirmation window; None: UNIMATMUL_CONFIRM[_CALLS].
        self.confirm_calls: int | None = None
        # Verdicts are written to the store by a thread of their own: a window ends inside
        # a user's call, and a cache file write (a locked read-merge-write) must not.
        self._jobs: deque[Callable[[], None]] = deque()
        self._jobs_done = threading.Condition()
        self._writer: threading.Thread | None = None
        self._busy_writing = False

    # --- wiring -------------------------------------------------------------------
    @property
    def plugins(self) -> PluginManager:
        return self.tuner.plugins

    @property
    def settings(self) -> HarnessConfig | None:
        """Harness settings for every target (None: each target's own)."""
        return self.tuner.settings

    @settings.setter
    def settings(self, value: HarnessConfig | None) -> None:
        self.tuner.settings = value

    @property
    def store(self) -> CacheStore:
        if self._store is None:
            self._store = open_store()
        return self._store

    def backends_for(self, target: Target) -> list[Backend]:
        """Enabled, available backends that serve this target, in name order."""
        return self.tuner.backends_for(target)

    def platform(self, target: Target) -> Platform:
        key = (target.array_kind, target.device)
        found = self._platforms.get(key)
        if found is None:
            found = detect_platform(target, self.backends_for(target))
            self._platforms[key] = found
        return found

    def warn_once(self, key: Hashable, message: str) -> None:
        """Warn once per key for this Selector (a new Selector warns again)."""
        notices.warn_once(key, f"unimatmul: {message}", seen=self._warned, stacklevel=4)

    def fall_back(
        self, problem: Problem | None, candidate: Candidate, exc: BaseException, target_adapter: Any
    ) -> Runner:
        """The one fallback policy for a kernel that failed on a call: count it, warn once
        (per problem), and hand back Default, which the caller keeps using from now on."""
        self.stats.fallbacks += 1
        what = f"{problem.shape_text} {problem.dtype_a}" if problem is not None else "a product"
        self.warn_once(
            f"run:{problem.key if problem is not None else candidate.identity}",
            f"{candidate.identity} failed on {what} ({type(exc).__name__}: {exc}); using Default",
        )
        if problem is None:
            return DefaultRunner(target_adapter, None)
        return default_runner(problem, target_adapter)

    # --- choosing -----------------------------------------------------------------
    def decide(self, problem: Problem, target: Target, mode: str) -> Decision:
        """The Runner to use for ``problem`` in ``mode``; never raises for tuning failures."""
        self.stats.lookups += 1
        if mode == "off":
            return Decision(default_runner(problem, target.adapter), "default")
        if mode == "record" and self.on_problem is not None:
            try:
                self.on_problem(problem, target)
            except Exception as exc:  # recording must never break the workload
                self.warn_once("record", f"could not record {problem.shape_text}: {exc!r}")
        try:
            record = self.lookup(problem, target)
            source = "cache"
            if record is None and self.buckets is not None:
                record = self.lookup_bucket(problem, target)
                source = "bucket" if record is not None else source
            if record is None and mode == "tune":
                gate = STATE.tuning_gate
                if gate is not None and gate(problem, target):
                    # Deferred (a distributed job decides at its next collective point).
                    return Decision(DefaultRunner(target.adapter, problem.activation), "deferred")
                cap = self.tuning_allowance()
                if cap is not None and cap <= 0.0:
                    return Decision(default_runner(problem, target.adapter), "default")
                record, source = self.tune(problem, target, cap_s=cap), "tuned"
            if record is None:
                return Decision(default_runner(problem, target.adapter), "default")
            return self._decided(problem, target, record, source)
        except Exception as exc:
            self.stats.fallbacks += 1
            self.warn_once(
                problem.key,
                f"using Default for {problem.shape_text} {problem.dtype_a}: {type(exc).__name__}: {exc}",
            )
            return Decision(default_runner(problem, target.adapter), "fallback")

    def tuning_allowance(self) -> float | None:
        """Seconds the next problem tuned on a call may take: what is left of
        ``UNIMATMUL_TUNE_BUDGET_S`` after this process's tuning so far (at most
        ``UNIMATMUL_TUNE_CAP_S``), 0 once spent (one warning); None without a budget."""
        budget = env.TUNE_BUDGET_S.get()
        if budget is None:
            return None
        left = budget - self.stats.tune_s
        if left <= 0.0:
            self.warn_once(
                "tune-budget",
                f"the tuning budget ({env.TUNE_BUDGET_S.name}={budget:g}) is spent: {self.stats.tuned} "
                f"problems tuned in {self.stats.tune_s:.2f} s; problems not tuned yet run Default and "
                "are not tuned in this process",
            )
            return 0.0
        cap = env.TUNE_CAP_S.get()
        return left if cap is None else min(left, cap)

    def _decided(self, problem: Problem, target: Target, record: TuningRecord, source: str) -> Decision:
        """The Decision for a record's winner: as a window's verdict says, else in a window.

        A Default record's tie (:func:`confirm.tie_of`: a kernel the harness measured no
        slower than Default) is the choice instead, but only through a window or its
        verdict: where windows are off, or in a distributed job deciding together, or when
        the tie's backend cannot prepare it here, Default serves. Under CUDA-graph capture a
        tie always runs Default (:class:`confirm.TieRunner`), and so does a scaled choice
        whose margin is slim (:func:`confirm.default_in_graphs`).
        """
        calls = self.confirm_calls if self.confirm_calls is not None else confirm.calls_per_candidate()
        collective = STATE.collective
        # In a distributed job deciding together every rank must run the same kernel,
        # which windows judged on each rank alone would not keep: such choices run
        # unconfirmed, and ties not at all.
        windows = calls > 0 and not (collective is not None and collective())
        choice = record.winner
        tie = confirm.tie_of(record) if source != "bucket" and windows else None
        if tie is not None:
            choice = tie
        candidate = Candidate.from_identity(choice)
        verdict = confirm.verdict_of(record, choice) if source != "bucket" else None
        checked = self._checked.get((problem.key, choice))
        if verdict == confirm.REVERTED or checked is False:
            return Decision(default_runner(problem, target.adapter), verdict or confirm.REVERTED, record)
        try:
            runner = self.prepare(problem, candidate, target)
        except Exception:
            if tie is None:
                raise
            # A tie is an option, never a failure: Default serves.
            return Decision(default_runner(problem, target.adapter), source, record)
        if candidate == DEFAULT:
            return Decision(runner, verdict or source, record)
        graph_default = confirm.default_in_graphs(problem, record, tie)
        # Checked on its first call (tuning/trust.py): a choice this machine never checked,
        # and every choice in a window (on the program's own inputs), once per process.
        check = checked is None and (
            not checked_here(record) or not (verdict == confirm.CONFIRMED or not windows)
        )
        min_gain = self.tuner.settings_for(target).min_gain

        def report(outcome: confirm.Outcome) -> None:
            self.confirmed(problem, target, record, source, outcome)

        confirmation = confirm.Confirmation(choice, calls, min_gain, report)
        capturing = confirm.clock_for(target, 0).capturing
        if verdict == confirm.CONFIRMED or not windows:
            if graph_default:  # Default under graph capture (confirm.TieRunner)
                runner = confirm.TieRunner(runner, default_runner(problem, target.adapter), capturing)
            if check:
                runner = self._checking(problem, target, record, source, runner, confirmation)
            return Decision(runner, verdict or source, record)
        default = default_runner(problem, target.adapter)
        clock = confirm.clock_for(target, 2 * calls)
        window: Runner = confirm.ConfirmingRunner(runner, default, confirmation, clock, tie=graph_default)
        if check:
            window = self._checking(problem, target, record, source, window, confirmation)
        return Decision(window, source, record, confirmation)

    def _checking(
        self,
        problem: Problem,
        target: Target,
        record: TuningRecord,
        source: str,
        runner: Runner,
        confirmation: confirm.Confirmation,
    ) -> trust.CheckingRunner:
        """``runner`` behind its first-call check (:class:`trust.CheckingRunner`): a wrong
        output sends the key back to Default through ``confirmation`` (warned once, stored
        with why); a right one marks an entry from elsewhere as checked on this host."""
        choice = confirmation.kernel

        def judged(reason: str | None) -> None:
            if reason is None:
                return  # nothing to compare with (Default refused the operands)
            self._checked[(problem.key, choice)] = not reason
            if reason:
                self.warn_once(
                    ("wrong", problem.key, choice),
                    f"{choice} returned a wrong result on {problem.shape_text} {problem.dtype_a} "
                    f"({reason}); the call got Default's result, and Default serves from now on",
                )
                confirmation.reject(f"wrong on a real call: {reason}")
            elif source != "bucket" and not checked_here(record):
                self._in_background(lambda: self._store_checked(problem, target, record))

        capturing = confirm.clock_for(target, 0).capturing
        return trust.CheckingRunner(
            runner,
            default_runner(problem, target.adapter),
            problem,
            target,
            judged,
            capturing,
            trusted=checked_here(record),
        )

    def _store_checked(self, problem: Problem, target: Target, record: TuningRecord) -> None:
        """Mark the stored entry as checked on this host (its choice passed a first-call check)."""
        try:
            namespace = self.platform(target).namespace
            current = self.store.get(namespace, problem.key)
            if current is None or current.winner != record.winner:
                return  # tuned again meanwhile
            self.store.put(namespace, problem.key, mark_checked(current))
        except Exception as exc:
            self.warn_once(
                ("checked", problem.key), f"could not mark {problem.shape_text} as checked: {exc!r}"
            )

    def confirmed(
        self, problem: Problem, target: Target, record: TuningRecord, source: str, outcome: confirm.Outcome
    ) -> None:
        """Keep a window's verdict in the cache, so that other processes use it at once.

        An exact record (found or tuned) gets ``settings["confirm"]``; a bucket's choice
        that lost at this m gets an exact record of Default for this m (the bucket's
        other m keep their choice); a bucket's choice that won is not stored (every
        process confirms it again, a bounded cost). Written by a thread of its own
        (:meth:`settle` waits for it); never raises: the verdict already holds in this
        process.
        """
        if outcome.keep:
            self.stats.confirmed += 1
        else:
            self.stats.reverted += 1
        self._in_background(lambda: self._store_verdict(problem, target, record, source, outcome))

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until every verdict handed over is in the store; False if ``timeout`` passed first."""
        with self._jobs_done:
            return self._jobs_done.wait_for(lambda: not self._jobs and not self._busy_writing, timeout)

    def _in_background(self, job: Callable[[], None]) -> None:
        with self._jobs_done:
            self._jobs.append(job)
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(
                    target=self._write_jobs, name="unimatmul-verdicts", daemon=True
                )
                self._writer.start()
                STATE.live.add(self)

    def _write_jobs(self) -> None:
        while True:
            with self._jobs_done:
                if not self._jobs:
                    self._writer = None
                    self._jobs_done.notify_all()
                    return
                job = self._jobs.popleft()
                self._busy_writing = True
            try:
                job()
            finally:
                with self._jobs_done:
                    self._busy_writing = False
                    self._jobs_done.notify_all()

    def _store_verdict(
        self, problem: Problem, target: Target, record: TuningRecord, source: str, outcome: confirm.Outcome
    ) -> None:
        try:
            platform = self.platform(target)
            if source == "bucket":
                if outcome.keep:
                    return
                entry = TuningRecord(
                    problem=problem.key,
                    winner=DEFAULT.identity,
                    winner_s=outcome.default_s if math.isfinite(outcome.default_s) else math.inf,
                    default_s=outcome.default_s if math.isfinite(outcome.default_s) else None,
                    versions=dict(record.versions),
                    tuned_at=time.time(),
                    settings={confirm.KEY: {**outcome.as_settings(), "bucket": record.problem}},
                    writer=record.writer,
                )
                self._store_record(platform, problem.key, entry, target)
                return
            current = self.store.get(platform.namespace, problem.key)
            if current is None or current.winner != record.winner:
                return  # tuned again meanwhile: that record has no verdict yet
            settings = {**current.settings, confirm.KEY: outcome.as_settings()}
            self.store.put(platform.namespace, problem.key, replace(current, settings=settings))
        except Exception as exc:
            self.warn_once(
                ("confirm", problem.key), f"could not store the verdict on {problem.shape_text}: {exc!r}"
            )

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> Runner:
        """A Runner for a Candidate on this target: Default or a backend's kernel."""
        return self.tuner.prepare(problem, candidate, target)

    def lookup(self, problem: Problem, target: Target) -> TuningRecord | None:
        """The stored record for ``problem``, re-checked if a library version changed.

        A record whose winner's backend is not loaded or not available in this process
        is skipped (Default serves here) and kept: it is not invalid, only unusable here.
        Only a present backend that says its winner is gone deletes a record.
        """
        platform = self.platform(target)
        record = self.store.get(platform.namespace, problem.key)
        if record is None:
            return None
        candidate = Candidate.from_identity(record.winner)
        if candidate != DEFAULT and not self._backend_here(candidate, target):
            self.stats.unavailable += 1
            self.warn_once(
                ("unavailable", candidate.backend),
                f"no backend {candidate.backend!r} serves {target.device} in this process: Default is "
                "used where the cache chose one of its kernels (those entries are kept)",
            )
            return None
        if self._versions_match(record, platform):
            self.stats.cache_hits += 1
            self.stats.matched += 1
            return record
        if candidate == DEFAULT or self.applies(problem, candidate, target):
            self.stats.cache_hits += 1
            self.stats.revalidated += 1
            return record
        # The winner no longer exists or no longer checks: forget it, retune on demand.
        self.stats.invalidated += 1
        self.store.delete(platform.namespace, problem.key)
        return None

    def _backend_here(self, candidate: Candidate, target: Target) -> bool:
        return any(b.name == candidate.backend for b in self.backends_for(target))

    def validate(self, target: Target, *, delete: bool = False) -> ValidationSummary:
        """Check every stored entry of ``target``'s namespace against the libraries
        installed now, one by one (``unimatmul cache verify --validate``); with
        ``delete``, drop the entries whose winner no longer exists or checks. Entries
        whose backend is not available here are counted apart and never deleted."""
        platform = self.platform(target)
        summary = ValidationSummary(platform.namespace)
        here = {b.name for b in self.backends_for(target)}
        for _, key, record in list(self.store.items(platform.namespace)):
            backend = record.winner.partition("/")[0]
            if record.winner != DEFAULT.identity and backend not in here:
                summary.unavailable.append(key)
                continue
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
        return self.tuner.applies(problem, candidate, target)

    def lookup_bucket(self, problem: Problem, target: Target) -> TuningRecord | None:
        """The bucket record that covers ``problem`` (same problem but for m), if any."""
        buckets = self.buckets
        if buckets is None:
            return None
        rep = buckets.representative(problem.m)
        if rep is None or rep == problem.m:
            return None  # m itself is a representative: its exact record was already looked up
        record = self.lookup(problem.with_m(rep), target)
        if record is None:
            return None
        covered = bucket_range(record)
        if covered is None or not covered[0] <= problem.m <= covered[1]:
            return None
        candidate = Candidate.from_identity(record.winner)
        if candidate != DEFAULT and not self.applies(problem, candidate, target):
            return None  # the bucket's kernel does not take this m: Default, quietly
        return record

    # --- tuning -------------------------------------------------------------------
    @contextlib.contextmanager
    def _tune_lock(self, namespace: str, key: str) -> Iterator[None]:
        """One tuning per key at a time; the lock lives only while a thread tunes or waits
        (a process that tunes 20,000 problems does not keep 20,000 locks)."""
        with self._locks_guard:
            entry = self._tune_locks.get((namespace, key))
            if entry is None:
                entry = self._tune_locks[(namespace, key)] = [threading.Lock(), 0]
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._locks_guard:
                entry[1] -= 1
                if not entry[1]:
                    del self._tune_locks[(namespace, key)]

    def tune(
        self,
        problem: Problem,
        target: Target,
        *,
        force: bool = False,
        store: bool = True,
        progress: Progress = None,
        cap_s: float | None = None,
    ) -> TuningRecord:
        """Measure every candidate of ``problem`` and store the winner; ``cap_s``: the most
        seconds measuring may take (candidates not reached by then are left out).

        When several threads ask for the same key at once, one tunes and the others
        wait for and reuse its record.
        """
        platform = self.platform(target)
        with self._tune_lock(platform.namespace, problem.key):
            if not force:
                existing = self.lookup(problem, target)
                if existing is not None:
                    return existing
            record = self.tuner.tune(
                problem, target, versions=dict(platform.versions), progress=progress, cap_s=cap_s
            )
            record = mark_checked(record)  # the harness's check ran here
            self.stats.tuned += 1
            self.stats.tune_s += record.tune_s
            if store:
                self._store_record(platform, problem.key, record, target)
            return record

    def tune_bucket(
        self,
        problem: Problem,
        target: Target,
        buckets: Buckets,
        *,
        force: bool = False,
        store: bool = True,
        progress: Progress = None,
        cap_s: float | None = None,
    ) -> TuningRecord:
        """Tune the bucket that holds ``problem.m``; store (unless ``store=False``) and
        return its record (``cap_s``: as for :meth:`tune`).

        An existing record of the same bucket (same range) is reused unless ``force``.
        """
        platform = self.platform(target)
        rep = buckets.representative(problem.m)
        if rep is not None and not force:
            existing = self.lookup(problem.with_m(rep), target)
            if existing is not None and bucket_range(existing) == buckets.bounds(rep):
                return existing
        record = self.tuner.tune_bucket(
            problem, target, buckets, versions=dict(platform.versions), progress=progress, cap_s=cap_s
        )
        record = mark_checked(record)
        self.stats.tuned += 1
        self.stats.tune_s += record.tune_s
        if store:
            self._store_record(platform, record.problem, record, target)
        return record

    def _store_record(self, platform: Platform, key: str, record: TuningRecord, target: Target) -> None:
        """Store a record, unless the entry it would replace names a kernel of a backend this
        process does not have: this tuning never saw that kernel, so it cannot judge it (the
        entry was tuned where that backend is, and stays for the processes that have it)."""
        stored = self.store.get(platform.namespace, key)
        if stored is not None:
            try:
                winner = Candidate.from_identity(stored.winner)
            except ValueError:
                winner = DEFAULT
            if winner != DEFAULT and not self._backend_here(winner, target):
                self.warn_once(
                    ("kept", winner.backend),
                    f"kept the cached choices of backend {winner.backend!r}, which this process does not "
                    "have: its own tuning results stay in this process only",
                )
                return
        self.store.note_platform(platform.namespace, platform.to_dict())
        self.store.put(platform.namespace, key, record)


class SelectionState:
    """What the process shares about selection, in one object: its Selector, the gate that
    may defer tuning, and the callers to tell when prepared runners must be forgotten.

    A gate, consulted before a call tunes a problem it meets (mode "tune"), says True when
    Default should serve the call and the gate's owner tune the problem later: distributed
    jobs use it so that no rank decides alone and no collective runs inside a call
    (unimatmul.tuning.distributed). It outlives :meth:`set_selector`. Callers that keep
    prepared runners in front of the Selector (the API's fast path, PyTorch routing's
    plans) register with :meth:`on_forget` to forget them when the answers may change.
    """

    def __init__(self) -> None:
        self.selector: Selector | None = None
        self.lock = threading.Lock()
        # Selectors with verdicts being written: given a few seconds to finish at exit.
        self.live: weakref.WeakSet[Selector] = weakref.WeakSet()
        self.tuning_gate: Callable[[Problem, Target], bool] | None = None
        # Whether the gate's owner decides collectively now (then no rank may judge a choice alone).
        self.collective: Callable[[], bool] | None = None
        self.forget_hooks: list[Callable[[], None]] = []

    def get_selector(self) -> Selector:
        """The process-wide Selector."""
        found = self.selector
        if found is None:
            with self.lock:
                if self.selector is None:
                    self.selector = Selector()
                found = self.selector
        return found

    def set_selector(self, selector: Selector | None) -> Selector | None:
        """Install another process-wide Selector (tests, embedding); returns the old one."""
        with self.lock:
            old, self.selector = self.selector, selector
        self.forget_prepared()
        return old

    def set_tuning_gate(
        self, gate: Callable[[Problem, Target], bool] | None, *, collective: Callable[[], bool] | None = None
    ) -> None:
        """Install (or with None remove) the gate that may defer tuning on a call;
        ``collective()`` says whether its owner's job decides together right now."""
        self.tuning_gate = gate
        self.collective = collective if gate is not None else None

    def on_forget(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` whenever :meth:`forget_prepared` runs (once per distinct hook)."""
        if hook not in self.forget_hooks:
            self.forget_hooks.append(hook)

    def forget_prepared(self) -> None:
        """Make every caller forget its prepared runners (the selector, cache or mode changed)."""
        for hook in list(self.forget_hooks):
            hook()

    def settle_at_exit(self) -> None:
        for selector in list(self.live):
            selector.settle(timeout=5.0)


#: The one per process.
STATE = SelectionState()
atexit.register(STATE.settle_at_exit)
get_selector = STATE.get_selector
set_selector = STATE.set_selector
set_tuning_gate = STATE.set_tuning_gate
on_forget = STATE.on_forget
forget_prepared = STATE.forget_prepared
