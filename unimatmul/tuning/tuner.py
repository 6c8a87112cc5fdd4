"""The Tuner: which candidates a Problem has here, and what measuring them found.

It asks every enabled, available backend that serves a Target for its Candidates
(Default always first), builds the one list of (candidate, prepare) entries that
every kind of tuning measures, and hands it to the :class:`Harness`. It stores
nothing and decides nothing about modes or caching: that is the Selector's policy.

* :meth:`Tuner.tune` measures every candidate of one problem.
* :meth:`Tuner.time_at` times a few named candidates (and Default) on one problem.
* :meth:`Tuner.tune_bucket` makes a bucket's choice for dynamic shapes: tune the
  representative, time its best candidates at the bucket's check points
  (:func:`unimatmul.tuning.buckets.check_points`) and keep one that wins at all of
  them (:func:`unimatmul.tuning.buckets.choose`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from unimatmul.cache.record import OK, TuningRecord
from unimatmul.core import notices
from unimatmul.core._backend import DEFAULT, Backend, Candidate, Runner, Target
from unimatmul.core.errors import UnimatmulError, UnknownCandidate, UnsupportedProblem
from unimatmul.core.plugins import PluginManager, get_plugin_manager
from unimatmul.core.problem import Problem
from unimatmul.core.runners import default_runner
from unimatmul.tuning.buckets import EDGE_CANDIDATES, Buckets, check_points, choose
from unimatmul.tuning.harness import LOW, CpuTimer, Harness, HarnessConfig, Timer
from unimatmul.tuning.retire import Retirement, family
from unimatmul.tuning.timers import device_settings, device_timer

Entry = tuple[Candidate, Callable[[], Runner]]
Progress = Callable[[str], None] | None


class PluginExit(UnimatmulError):
    """A backend's code raised ``SystemExit``: a failure of that backend, which every
    ``except Exception`` on the way treats as one, not the end of the user's program."""

    def __init__(self, backend: str, exc: SystemExit) -> None:
        super().__init__(f"backend {backend!r} raised SystemExit({exc.code!r})")
        self.backend = backend
        self.code = exc.code


class Tuner:
    """Lists, prepares and measures the candidates of Problems on Targets."""

    def __init__(
        self,
        *,
        plugins: PluginManager | None = None,
        settings: HarnessConfig | None = None,
        backends: Iterable[str] | None = None,
        warn: Callable[[str, str], None] | None = None,
    ) -> None:
        self._plugins = plugins
        #: Harness settings for every target (None: each target's own, see settings_for).
        self.settings = settings
        #: Names of the backends that may offer candidates (None: all).
        self.enabled = set(backends) if backends is not None else None
        self._warn = warn
        #: Kernel families that lost everywhere so far in a run are not measured again in
        #: it (:mod:`unimatmul.tuning.retire`); None (the default): every candidate is.
        self.retirement: Retirement | None = None

    @property
    def plugins(self) -> PluginManager:
        if self._plugins is None:
            self._plugins = get_plugin_manager()
        return self._plugins

    # --- backends -----------------------------------------------------------------
    def backends_for(self, target: Target) -> list[Backend]:
        """Enabled, available backends that serve this target, in name order."""
        found = []
        for name, backend in sorted(self.plugins.backends().items()):
            if self.enabled is not None and name not in self.enabled:
                continue
            if backend.serves(target) and backend.availability() is None:
                found.append(backend)
        return found

    def why_no_backend(self, target: Target) -> str:
        """Why no backend serves ``target``: each registered backend's reason, or why none
        is registered at all."""
        registered = self.plugins.backends()
        if not registered:
            return self.plugins.why_no_backends()
        reasons = []
        for name, backend in sorted(registered.items()):
            if self.enabled is not None and name not in self.enabled:
                reasons.append(f"{name}: not enabled for this selector")
            elif not backend.serves(target):
                arrays, devices = sorted(backend.array_kinds), sorted(backend.device_kinds)
                reasons.append(f"{name}: serves {', '.join(arrays)} on {', '.join(devices)} only")
            else:
                reasons.append(f"{name}: {backend.availability()}")
        return "; ".join(reasons + self.plugins.load_notes())

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> Runner:
        """A Runner for a Candidate on this target: Default or a backend's kernel."""
        if candidate == DEFAULT:
            return default_runner(problem, target.adapter)
        backend = self.plugins.backends().get(candidate.backend)
        if backend is None or not backend.serves(target):
            names = ", ".join(sorted(self.plugins.backends())) or "none"
            msg = f"no backend {candidate.backend!r} serves {target.device} (registered: {names})"
            raise UnknownCandidate(msg, identity=candidate.identity)
        reason = backend.availability()
        if reason is not None:
            msg = f"backend {backend.name!r} is unavailable: {reason}"
            raise UnknownCandidate(msg, identity=candidate.identity)
        try:
            return backend.prepare(problem, candidate, target)
        except SystemExit as exc:
            raise PluginExit(backend.name, exc) from exc

    def applies(self, problem: Problem, candidate: Candidate, target: Target) -> bool:
        """Whether a stored (non-Default) Candidate still exists and checks for ``problem`` here."""
        backend = self.plugins.backends().get(candidate.backend)
        if backend is None or not backend.serves(target) or backend.availability() is not None:
            return False
        if problem.op not in backend.ops:
            return False
        try:
            return backend.check(problem, candidate, target)
        except (Exception, SystemExit):  # a backend's SystemExit is its failure (see PluginExit)
            return False

    # --- how to measure -------------------------------------------------------------
    def timer_for(self, target: Target) -> Timer:
        if target.device.kind == "cpu":
            return CpuTimer()
        return device_timer(target)

    def settings_for(self, target: Target) -> HarnessConfig:
        if self.settings is not None:
            return self.settings
        if target.device.kind == "cpu":
            return HarnessConfig()
        return device_settings(target)

    # --- what to measure ------------------------------------------------------------
    def entries(
        self, problem: Problem, target: Target, identities: Sequence[str] | None = None
    ) -> list[Entry]:
        """Default, then every candidate the backends offer (or only ``identities``)."""
        entries: list[Entry] = [(DEFAULT, _preparer(self, problem, DEFAULT, target))]
        if identities is not None:
            for identity in identities:
                candidate = Candidate.from_identity(identity)
                if candidate != DEFAULT:
                    entries.append((candidate, _preparer(self, problem, candidate, target)))
            return entries
        backends = self.backends_for(target)
        if not backends and self._warn is not None:
            # Otherwise a broken install looks like a machine where Default always wins.
            self._warn(
                f"no-backend:{target.array_kind}:{target.device}",
                f"no backend serves {target.array_kind} on {target.device}, so tuning measures "
                f"only Default ({self.why_no_backend(target)})",
            )
        for backend in backends:
            if problem.op not in backend.ops:
                continue
            try:
                offered = backend.candidates(problem, target)
            except UnsupportedProblem:
                continue
            except (Exception, SystemExit) as exc:  # a backend's SystemExit is its failure
                if self._warn is not None:
                    self._warn(
                        f"candidates:{backend.name}",
                        f"backend {backend.name!r} failed to list candidates: {exc!r}",
                    )
                continue
            entries.extend((candidate, _preparer(self, problem, candidate, target)) for candidate in offered)
        return entries

    def ahead(self, jobs: Iterable[tuple[Problem, Target]]) -> None:
        """Tell the backends which problems are to be tuned, in order (``Backend.ahead``):
        those that compile kernels start on them now, for all the problems at once, while
        the first are measured. A backend's failure here is not a tuning's: it is ignored
        (that problem's tuning meets it again and reports it)."""
        for problem, target in jobs:
            for backend in self.backends_for(target):
                if problem.op not in backend.ops:
                    continue
                try:
                    backend.ahead(problem, target)
                except (Exception, SystemExit):
                    continue

    def ahead_started(self, jobs: Sequence[tuple[Problem, Target]]) -> Callable[[], None]:
        """:meth:`ahead` for ``jobs`` from a thread of its own, so that the first of them
        can be measured at once; returns what ends it: no more jobs handed out, the thread
        joined, then :meth:`ahead_over`. What goes wrong in the thread is ignored (a hint:
        each problem's own tuning meets it)."""
        over = threading.Event()

        def upcoming() -> Iterator[tuple[Problem, Target]]:
            for job in jobs:
                if over.is_set():
                    return
                yield job

        def hand_out() -> None:
            try:
                self.ahead(upcoming())
            except Exception:
                return

        thread = threading.Thread(target=hand_out, name="unimatmul-ahead", daemon=True)
        thread.start()

        def stop() -> None:
            over.set()
            thread.join()
            self.ahead_over()

        return stop

    def ahead_over(self) -> None:
        """The tuning :meth:`ahead` announced is over, or ended early (a budget): every
        backend drops what it started for it and nothing waits for (``Backend.ahead_over``)."""
        for backend in self.plugins.backends().values():
            try:
                backend.ahead_over()
            except Exception:
                continue  # best effort: what is not dropped only costs time at exit

    def measure(
        self,
        problem: Problem,
        target: Target,
        entries: Sequence[Entry],
        *,
        versions: dict[str, str] | None = None,
        progress: Progress = None,
        cap_s: float | None = None,
    ) -> TuningRecord:
        harness = Harness(self.timer_for(target), self.settings_for(target))
        record = harness.measure(problem, target, entries, versions=versions, progress=progress, cap_s=cap_s)
        if record.settings.get("confidence") == LOW:
            self._warn_unstable(problem, record)
        return record

    def _warn_unstable(self, problem: Problem, record: TuningRecord) -> None:
        """One warning per problem whose measurements were unstable; a busy CPU alone
        (the machine's state, not the problem's) warns once."""
        why = record.settings.get("low_because") or []
        load = record.settings.get("load") or {}
        if why == ["busy"]:
            key = "unstable:busy-cpu"
            message = (
                f"the CPU was busy while tuning (load average {load.get('avg1')} on {load.get('cpus')} "
                f"CPUs): records tuned now are marked low-confidence, first {problem.shape_text} "
                f"{problem.dtype_a}. Tune them again on a quieter machine: unimatmul tune --force"
            )
        else:
            noise = record.settings.get("noise") or {}
            confirm = record.settings.get("repeat") or {}
            what = "spread of samples: " + ", ".join(f"{k} {v:.0%}" for k, v in noise.items())
            if confirm:
                what += (
                    f"; {confirm.get('candidate')} measured {confirm.get('main_speedup')}x Default, "
                    f"then {confirm.get('speedup')}x when repeated ({confirm.get('verdict')})"
                )
            if load.get("busy"):
                what = f"load average {load['avg1']} on {load['cpus']} CPUs; {what}"
            key = f"unstable:{problem.key}"
            message = (
                f"measurements of {problem.shape_text} {problem.dtype_a} were unstable ({what}); "
                f"kept {record.winner}, marked low-confidence in its record. Tune it again on a "
                f"quieter machine: unimatmul tune --force"
            )
        if self._warn is not None:
            self._warn(key, message)
        else:
            notices.warn_once(key, f"unimatmul: {message}")

    # --- kinds of tuning ----------------------------------------------------------------
    def tune(
        self,
        problem: Problem,
        target: Target,
        *,
        versions: dict[str, str] | None = None,
        progress: Progress = None,
        cap_s: float | None = None,
    ) -> TuningRecord:
        """Measure every candidate of ``problem`` (stores nothing); ``cap_s``: the most
        seconds it may take (:meth:`Harness.measure`)."""
        started = time.perf_counter()
        entries = self.entries(problem, target)
        retired: list[Candidate] = []
        if self.retirement is not None:
            _, retired = self.retirement.split(problem, target, [c for c, _ in entries])
            entries = [e for e in entries if e[0] not in retired]
        record = self.measure(
            problem,
            target,
            entries,
            versions=versions,
            progress=progress,
            cap_s=cap_s,
        )
        if self.retirement is not None:
            if retired:
                record.settings["retired"] = {
                    "left_out": len(retired),
                    "families": sorted({family(c.identity) for c in retired}),
                    "after": self.retirement.after,
                    "ratio": self.retirement.ratio,
                }
            self.retirement.learn(problem, target, record)
        record.tune_s = time.perf_counter() - started
        return record

    def time_at(
        self, problem: Problem, target: Target, identities: Sequence[str], *, progress: Progress = None
    ) -> dict[str, float]:
        """Median seconds of Default and of the given candidates on one problem.

        Nothing is pruned: each named candidate is measured in full (a check point
        needs its time even when one noisy first sample looked slow).
        """
        settings = replace(self.settings_for(target), prune_ratio=math.inf, first_prune_ratio=math.inf)
        harness = Harness(self.timer_for(target), settings)
        record = harness.measure(
            problem, target, self.entries(problem, target, identities), progress=progress
        )
        return {r.identity: r.median_s for r in record.results if r.status == OK and r.median_s}

    def tune_bucket(
        self,
        problem: Problem,
        target: Target,
        buckets: Buckets,
        *,
        versions: dict[str, str] | None = None,
        progress: Progress = None,
        cap_s: float | None = None,
    ) -> TuningRecord:
        """The record of the bucket that holds ``problem.m`` (stores nothing); ``cap_s``
        bounds the tuning of the representative (the check points time a few candidates).

        Its winner beats Default by ``min_gain`` at the representative, at either edge
        of the bucket and halfway between the representative and each edge, as
        measured here (else the winner is Default).
        """
        rep = buckets.representative(problem.m)
        if rep is None:
            msg = f"m={problem.m} is above the largest bucket ({buckets.reps[-1]}); tune it exactly"
            raise ValueError(msg)
        lo, hi = buckets.bounds(rep)
        started = time.perf_counter()
        record = self.tune(problem.with_m(rep), target, versions=versions, progress=progress, cap_s=cap_s)
        ranked = sorted(
            (r for r in record.results if r.status == OK and r.median_s and r.identity != DEFAULT.identity),
            key=lambda r: r.median_s or math.inf,
        )[:EDGE_CANDIDATES]
        default_s = record.default_s
        ratios: dict[str, list[float]] = {
            r.identity: [(r.median_s or math.inf) / default_s if default_s else math.inf] for r in ranked
        }
        points = check_points(rep, lo, hi)
        for m in points:
            times = self.time_at(problem.with_m(m), target, [r.identity for r in ranked], progress=progress)
            base = times.get(DEFAULT.identity)
            for identity, found in ratios.items():
                t = times.get(identity)
                found.append(t / base if t and base else math.inf)
        best = choose(ratios, self.settings_for(target).min_gain)
        if best != record.winner:
            chosen = record.result(best)
            record.winner = best
            record.winner_s = (chosen.median_s if chosen else None) or default_s or math.inf
        record.settings["bucket"] = {
            "rep": rep,
            "lo": lo,
            "hi": hi,
            "spec": buckets.spec,
            "points": points,
            # identity -> time / Default time at [rep, *points]; a comma list keeps nesting shallow
            "ratios": {k: ",".join(f"{x:.4g}" for x in v) for k, v in ratios.items()},
        }
        record.tune_s = time.perf_counter() - started
        return record


def _preparer(tuner: Tuner, problem: Problem, candidate: Candidate, target: Target) -> Callable[[], Any]:
    return lambda: tuner.prepare(problem, candidate, target)
