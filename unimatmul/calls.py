"""The one call path under every door: a :class:`Plan` per key, in a :class:`CallTable`.

A door (``unimatmul.matmul``, ``unimatmul.scaled_matmul``, the routed torch products and
``torch._scaled_mm``) builds a key from a call's operands and finds its Plan in its
table; only a key met for the first time asks the Selector, through
:meth:`CallTable.resolve`. What happens to a plan afterwards is the table's, the same for
every door: a confirmation window's verdict (:meth:`CallTable.judged`), a first-call
check's (:meth:`CallTable.checked`), a kernel that fails on a call
(:meth:`CallTable.fall_back`), retirement when the table is full or answers changed, and
one shape of statistics. While the Selector decides, :func:`passing` makes every door
pass its calls through to the array library's own kernel (the one recursion guard).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from unimatmul.core._backend import DEFAULT, Runner, Target
from unimatmul.core.modes import _mode as _mode_var
from unimatmul.core.modes import env_mode
from unimatmul.core.problem import Problem
from unimatmul.tuning.confirm import (
    UNJUDGED,
    Confirmation,
    ConfirmingRunner,
    Outcome,
    TieRunner,
    clock_for,
    drop_turn,
)
from unimatmul.tuning.selector import Decision, forget_prepared, get_selector, on_forget
from unimatmul.tuning.time_limit import carry_thread_state
from unimatmul.tuning.trust import CheckingRunner, unwrapped

# Entry ids, shared by every table (and the native tables): a verdict finds its plan by id.
_ids = itertools.count(1)


def new_id() -> int:
    """A fresh entry id (every table's plans, and the native tables' entries, draw from one count)."""
    return next(_ids)


@dataclass(slots=True, eq=False)
class Plan:
    """What a door does with one key.

    ``runner`` is called as ``runner(a, b, out, alpha, beta, bias, *extra)``; None means
    the door's own Default, reached without a runner (a routed product passed through to
    PyTorch's kernel). ``default`` is what the plan becomes when its choice is reverted or
    fails. ``allocate`` makes the output (where the door allocates it), ``capturing`` says
    whether the caller's stream is being captured into a CUDA graph now (a runner that ran
    under capture is held for the process's life), ``guard(out, *inputs)`` whether a
    given ``out`` overlaps an input.
    """

    op: str
    runner: Any = None
    default: Any = None
    problem: Problem | None = None
    target: Target | None = None
    out_shape: tuple[int, ...] = ()
    out_dtype: Any = None
    form: int = 0
    allocate: Callable[[], Any] | None = None
    capturing: Callable[[], bool] = bool  # bool() is False: no Python frame per call
    guard: Callable[..., bool] | None = None
    source: str = "passthrough"  # or the Selector's Decision.source
    label: str = ""  # the profiler's name for the call
    reason: str = ""  # why the call is passed through
    ident: int = field(default_factory=new_id)
    native: int = -1  # the kind of its entry in a native table; -1: none
    calls: int = 0
    # The choice's confirmation window while it is open (tuning/confirm.py).
    confirmation: Confirmation | None = None
    saved_s: float = 0.0  # seconds a call saves over Default, by the in-situ medians

    @property
    def confirming(self) -> bool:
        """Whether the plan's choice is still in its confirmation window."""
        return self.confirmation is not None and self.confirmation.outcome is None

    @property
    def is_default(self) -> bool:
        runner = self.runner
        return runner is None or runner is self.default or getattr(runner, "candidate", None) == DEFAULT

    def take(self, decision: Decision) -> None:
        """The Selector's decision: the plan's runner, source and label."""
        self.source = decision.source
        candidate = decision.runner.candidate
        if candidate == DEFAULT:
            # The door's own Default where it has one without a runner (routing: PyTorch's kernel).
            self.runner = decision.runner if self.default is not None else None
            self.label = f"unimatmul::{self.op} [default]"
        else:
            self.runner = decision.runner
            self.label = f"unimatmul::{self.op} [{candidate.identity}]"
        if decision.source == "confirmed" and decision.record is not None:
            self.saved_s = _saved_per_call(decision.record.settings)
        self.confirmation = decision.confirmation


class NativeSide(Protocol):
    """A native table that serves some of a CallTable's keys without Python
    (``unimatmul.torch.native.Kept``): the kernels its entries point into, by id."""

    def add(self, ident: int, kernel: Any) -> None: ...

    def clear(self) -> dict[int, int]: ...

    def counts(self) -> dict[int, int]: ...


# --- the one recursion guard -------------------------------------------------------------


class _Passing(threading.local):
    on = False


#: ``PASSING.on``: whether this thread is inside :func:`passing` (doors read it per call).
PASSING = _Passing()
# Native kernels that keep their own per-thread flag (unimatmul.torch.native): told too.
_native_guards: list[Callable[[bool], None]] = []


def on_passing(guard: Callable[[bool], None]) -> None:
    """Call ``guard(on)`` where :func:`passing` turns on and off on a thread."""
    if guard not in _native_guards:
        _native_guards.append(guard)


@contextlib.contextmanager
def passing() -> Iterator[None]:
    """Every door passes its calls through on this thread (and on the harness's worker
    thread for it): what the Selector and the harness compute (the float64 reference,
    Default's own calls) never re-enters unimatmul."""
    if PASSING.on:
        yield
        return
    PASSING.on = True
    for guard in _native_guards:
        guard(True)
    try:
        yield
    finally:
        PASSING.on = False
        for guard in _native_guards:
            guard(False)


def _carry_passing() -> contextlib.AbstractContextManager[None]:
    return passing() if PASSING.on else contextlib.nullcontext()


carry_thread_state(_carry_passing)


def mode_now() -> str:
    """The mode a door serves a call in: ``off`` while :func:`passing`, else the innermost
    ``unimatmul.mode()`` block, else ``UNIMATMUL_MODE``."""
    if PASSING.on:
        return "off"
    value = _mode_var.get()
    return value if value is not None else env_mode()


def decide(problem: Problem, target: Target, mode: str) -> Decision:
    """The Selector's decision for a door's new key, made while every door passes through;
    never measured inside a CUDA graph capture (tune mode serves it as cached)."""
    if mode == "tune" and target.device.kind != "cpu" and _capturing(target):
        mode = "cached"
    with passing():
        return get_selector().decide(problem, target, mode)


def decide_into(plan: Plan, problem: Problem, target: Target, mode: str, own_default: Any = None) -> Decision:
    """:func:`decide`, and the decision taken into ``plan`` (:meth:`Plan.take`).
    ``own_default``: the door's own Default where it is not the Selector's (a routed op's
    kernel, reached below the door): a first-call check's and a confirmation window's
    Default become it, so that they never call back into the door."""
    decision = decide(problem, target, mode)
    plan.take(decision)
    if own_default is not None:
        runner = plan.runner
        if isinstance(runner, CheckingRunner):
            runner.default = own_default
            runner = runner.inner
        if isinstance(runner, (ConfirmingRunner, TieRunner)):
            runner.default = own_default
    return decision


def routed_decision(plan: Plan, fill: Callable[..., Decision | None], *args: Any) -> Decision | None:
    """``fill(plan, *args)`` for a routed op's new key; an exception from it leaves the call
    passed through to the op's own kernel (``plan.reason`` says why): a routed product never
    breaks the caller's program over a routing decision."""
    try:
        return fill(plan, *args)
    except Exception as exc:
        plan.runner, plan.source, plan.reason = None, "passthrough", f"{type(exc).__name__}: {exc}"
        return None


def signatures(adapter: Any, *arrays: Any) -> tuple[Any, ...]:
    """The signatures of a call's arrays (None for an array not given): part of a door's key."""
    signature = adapter.signature
    return tuple(None if x is None else signature(x) for x in arrays)


def _capturing(target: Target) -> bool:
    return clock_for(target, 0).capturing()


def _saved_per_call(settings: dict[str, Any]) -> float:
    found = settings.get("confirm")
    try:
        return max(float(found["default_s"]) - float(found["kernel_s"]), 0.0)  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return 0.0


# --- the table ---------------------------------------------------------------------------


class CallTable:
    """One door's plans: a bounded map from key to :class:`Plan`, its lock, the native
    table that serves some keys without Python, and the counts of calls.

    The hot path reads ``table.plans.get(key)`` itself (a dict lookup, no call here).
    """

    def __init__(self, door: str, maxsize: int) -> None:
        self.door = door
        self.maxsize = maxsize
        self.plans: dict[Any, Plan] = {}
        self.lock = threading.RLock()
        self.native: NativeSide | None = None
        # Problems met by new keys, while a caller collects them (model warm-up).
        self.collector: list[tuple[Problem, Target]] | None = None
        self.retired: Counter[tuple[str, str, str]] = Counter()
        self.retired_saved_s = 0.0
        self.verdicts: Counter[str] = Counter()
        # What reset_stats() took out of the counts: totals() never go down.
        self.before_reset: Counter[tuple[str, str, str]] = Counter()
        self.saved_before_reset = 0.0
        self.verdicts_before_reset: Counter[str] = Counter()
        on_forget(self.clear)

    # --- new keys --------------------------------------------------------------------

    def insert(
        self,
        key: Any,
        plan: Plan,
        decision: Decision | None,
        put_native: Callable[[Plan], None] | None = None,
    ) -> Plan:
        """Make ``plan`` the plan of ``key``, met for the first time and decided
        (``decision``: None where the call is not one the door describes, ``plan.reason``
        saying why). Returns the plan to use: another thread's, where it resolved the key
        meanwhile. A tuned decision makes every door forget its plans first (they may hold
        Default for what was just tuned). ``put_native`` gives the plan an entry in the
        native table, when there is one; a window's verdict and a first-call check's
        reach the plan through this table."""
        if decision is not None and decision.source == "tuned":
            forget_prepared()
        with self.lock:
            found = self.plans.get(key)
            if found is not None and plan.source != "tuned":  # another thread resolved it meanwhile
                return found
            if len(self.plans) >= self.maxsize:
                self._retire()
            self.plans[key] = plan
            if self.collector is not None and plan.problem is not None and plan.target is not None:
                self.collector.append((plan.problem, plan.target))
            if put_native is not None:
                put_native(plan)
        if plan.confirmation is not None:
            plan.confirmation.listen(lambda outcome: self.judged(plan, outcome))
        if isinstance(plan.runner, CheckingRunner):  # judged on its first call (tuning/trust.py)
            plan.runner.on_final.append(lambda final: self.checked(key, plan, final, put_native))
        return plan

    # --- what happens to a plan -------------------------------------------------------

    def checked(self, key: Any, plan: Plan, final: Runner, put_native: Callable[[Plan], None] | None) -> None:
        """A first-call check judged the plan's choice and settled on ``final``: the plan
        takes it (Default, under ``reverted``, when the choice was wrong), and its native
        entry, which sent calls to Python until now, is put again."""
        with self.lock:
            if final.candidate == DEFAULT:
                if not plan.is_default:
                    self.to_default(plan, "reverted")
            else:
                plan.runner = final
            if put_native is not None and self.plans.get(key) is plan:
                put_native(plan)

    def judged(self, plan: Plan, outcome: Outcome) -> None:
        """A window's verdict: the plan keeps its kernel or becomes Default. The calls
        made so far stay counted under the plan's old source; later ones count under
        ``confirmed`` or ``reverted``."""
        runner = unwrapped(plan.runner)
        kernel = runner.kept() if isinstance(runner, ConfirmingRunner) else runner
        with self.lock:
            self.verdicts[outcome.verdict] += 1
            if outcome.verdict == UNJUDGED:
                plan.runner = kernel  # nothing measured: the choice stays, under its old source
                return
            if not outcome.keep:
                self.to_default(plan, outcome.verdict)
                return
            self._count_out(plan)
            plan.source = outcome.verdict
            plan.runner = kernel
            plan.saved_s = outcome.saved_s

    def to_default(self, plan: Plan, source: str) -> None:
        """The plan becomes Default under ``source``; the calls made so far stay counted
        under its old one."""
        with self.lock:
            self._count_out(plan)
            plan.source = source
            plan.runner = plan.default
            plan.label = f"unimatmul::{plan.op} [default]"

    def fall_back(
        self, plan: Plan, exc: Exception, adapter: Any, put_native: Callable[[Plan], None] | None = None
    ) -> Any:
        """The plan's kernel failed on a call: Default from now on (the Selector's policy,
        which warns once), in the native entry too. Returns the runner to use now (None:
        the door's own Default)."""
        get_selector().fall_back(plan.problem, plan.runner.candidate, exc, adapter)
        with self.lock:  # the calls made so far count as Default's too: the failing one did
            plan.source, plan.runner, plan.label = "fallback", plan.default, f"unimatmul::{plan.op} [default]"
            if put_native is not None and plan.native != -1:
                put_native(plan)
        return plan.default

    def _count_out(self, plan: Plan) -> None:
        self._sync_native()
        if plan.calls:
            self.retired[(plan.op, plan.source, plan.label)] += plan.calls
            plan.calls = 0

    # --- forgetting -------------------------------------------------------------------

    def _sync_native(self, clear: bool = False) -> None:
        """Add the calls the native table counted to their plans (lock held)."""
        native = self.native
        if native is None:
            return
        counted = native.clear() if clear else native.counts()
        if not counted:
            return
        for plan in self.plans.values():
            plan.calls += counted.get(plan.ident, 0)

    def _retire(self) -> None:
        self._sync_native(clear=True)
        drop_turn({plan.confirmation for plan in self.plans.values() if plan.confirmation is not None})
        for plan in self.plans.values():
            if plan.calls:
                self.retired[(plan.op, plan.source, plan.label)] += plan.calls
                self.retired_saved_s += plan.calls * plan.saved_s
                plan.calls = 0  # a verdict that reaches a forgotten plan must not count them again
        self.plans.clear()

    def clear(self) -> None:
        """Forget every plan (after tuning elsewhere, a new Selector, a new cache)."""
        with self.lock:
            self._retire()

    # --- what happened ----------------------------------------------------------------

    def _counts(self) -> tuple[Counter[tuple[str, str, str]], float, dict[str, int]]:
        self._sync_native()
        counts: Counter[tuple[str, str, str]] = Counter(self.retired)
        saved = self.retired_saved_s
        windows = {"open": 0, "confirmed": 0, "reverted": 0, "unjudged": 0, **self.verdicts}
        for plan in self.plans.values():
            if plan.calls:
                counts[(plan.op, plan.source, plan.label)] += plan.calls
                saved += plan.calls * plan.saved_s
            if plan.confirming:
                windows["open"] += 1
        return counts, saved, windows

    def stats(self) -> dict[str, Any]:
        """Calls since the last :meth:`reset_stats`: ``routed`` (decided here: a kernel or
        Default), ``kernel`` (a backend's kernel ran), ``default``, ``passthrough`` (not a
        call the door describes), by op, by label (the profiler's names) and by source
        (the Selector's: cache, bucket, tuned, default, ...; ``confirmed`` / ``reverted``
        once a window judged the choice); ``confirm``: windows ``open`` now and those
        judged since, and ``saved_s`` (calls x (Default - choice), by in-situ medians)."""
        with self.lock:
            counts, saved, windows = self._counts()
        out = summarise(counts)
        out["confirm"] = {**windows, "saved_s": saved}
        return out

    def totals(self) -> dict[str, Any]:
        """Like :meth:`stats`, but never reset, with ``calls``: ``(op, source, kind, calls)``
        rows (kind: kernel, default, passthrough)."""
        with self.lock:
            counts, saved, windows = self._counts()
            counts.update(self.before_reset)
            saved += self.saved_before_reset
            for verdict, judged in self.verdicts_before_reset.items():
                windows[verdict] = windows.get(verdict, 0) + judged
        out = summarise(counts)
        out["confirm"] = {**windows, "saved_s": saved}
        rows: Counter[tuple[str, str, str]] = Counter()
        for (op, source, label), calls in counts.items():
            rows[(op, source, _kind(source, label))] += calls
        out["calls"] = [(op, source, kind, calls) for (op, source, kind), calls in sorted(rows.items())]
        return out

    def reset_stats(self) -> None:
        with self.lock:
            counts, saved, _ = self._counts()
            self.before_reset.update(counts)
            self.saved_before_reset += saved
            self.verdicts_before_reset.update(self.verdicts)
            self.verdicts.clear()
            self.retired.clear()
            self.retired_saved_s = 0.0
            for plan in self.plans.values():
                plan.calls = 0

    def live(self) -> list[Plan]:
        """The live plans (for inspection and tests)."""
        with self.lock:
            self._sync_native()
            return list(self.plans.values())


def _kind(source: str, label: str) -> str:
    if source == "passthrough":
        return "passthrough"
    return "default" if label.endswith("[default]") else "kernel"


def summarise(counts: Counter[tuple[str, str, str]]) -> dict[str, Any]:
    """(op, source, label) -> calls, as the statistics' one shape."""
    out: dict[str, Any] = {
        "routed": 0,
        "kernel": 0,
        "default": 0,
        "passthrough": 0,
        "by_op": {},
        "by_label": {},
        "by_source": {},
    }
    for (op, source, label), calls in counts.items():
        routed = source != "passthrough"
        kind = _kind(source, label)
        out[kind] += calls
        per_op = out["by_op"].setdefault(op, {"routed": 0, "kernel": 0, "default": 0, "passthrough": 0})
        per_op[kind] += calls
        if routed:
            out["routed"] += calls
            per_op["routed"] += calls
            out["by_label"][label] = out["by_label"].get(label, 0) + calls
        out["by_source"][source] = out["by_source"].get(source, 0) + calls
    return out
