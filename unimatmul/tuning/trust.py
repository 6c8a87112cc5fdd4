"""Trust: a cached choice serves unchecked only where this machine checked it.

A cache entry is data that chooses which code runs on which inputs. One tuned here passed
the harness's numeric check on this machine; one that came from elsewhere (a file
imported or merged, an entry whose mark names other hosts, or one written before entries
had a mark) did not, and one that passed the check's inputs may still be wrong on the
program's own. So such a choice reaches its caller wrapped in a :class:`CheckingRunner`:
its first call runs the choice, runs Default on the same inputs into a buffer of its own,
and holds both to the element-wise bound of the problem's dtype against a float64
reference of those inputs (:func:`~unimatmul.tuning.numeric_check.compare`, the
harness's own check). A choice whose output is over the bound where Default's is not is
wrong: the call returns Default's result, the key goes back to Default, a warning says so
once, and the store records why (``settings["confirm"]``, verdict ``reverted`` with a
``reason``), so that no later process tries it again. A choice that passes serves as
before, and the entry is marked as checked on this host (``settings["trust"]``,
:func:`~unimatmul.cache.record.mark_checked`).

Every choice in a confirmation window is checked this way too (its window's first call),
whatever its origin: that is the in-situ half of the data-dependent check.

The wrapper is one call long: once it has judged, the callers (the API's fast path, the
routing plans, the native tables) replace it by what it settled on (``on_final``), so a
cached call after the first pays nothing for it. docs/trust.md has the whole model.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

from unimatmul.core._backend import Runner, Target
from unimatmul.core.arrays import Operands
from unimatmul.core.grouped import GroupedOperands
from unimatmul.core.modes import mode
from unimatmul.core.problem import Problem
from unimatmul.core.scales import ScaledOperands
from unimatmul.tuning.harness import compare_output, reference_of
from unimatmul.tuning.numeric_check import Check


def check_outputs(
    problem: Problem,
    target: Target,
    a: Any,
    b: Any,
    got: Any,
    want: Any,
    c0: Any,
    alpha: float,
    beta: float,
    bias: Any,
    extra: tuple[Any, ...],
) -> str:
    """Why ``got`` (the choice's output) is wrong where ``want`` (Default's, on the same
    inputs) is not, or "" when it is right: each is compared with a float64 reference of
    the inputs, element by element; the choice may be as far off as Default is."""
    ops: Operands
    if problem.is_grouped:
        ops = GroupedOperands(a, b, got, bias, offs=extra[0] if extra else None, jagged=problem.jagged)
    elif extra:
        ops = ScaledOperands(a, b, got, bias, scale_a=extra[0], scale_b=extra[1])
    else:
        ops = Operands(a, b, got, bias)
    reference = reference_of(problem, target, ops, c0, alpha, beta)  # the harness's own check
    mine = compare_output(target, ops, got, reference)
    if mine.ok():
        return ""
    theirs = compare_output(target, ops, want, reference)
    widen = _widen(theirs)
    if mine.ok(widen) or (mine.nonfinite and theirs.nonfinite >= mine.nonfinite):
        return ""  # Default is as far off on these inputs (their own range, not the kernel)
    return mine.describe(widen)


def _widen(default: Check) -> float:
    ratio = default.worst_ratio
    return max(1.0, ratio) if math.isfinite(ratio) else math.inf


class CheckingRunner:
    """A choice on its first call: runs it, then Default on the same inputs, and compares.

    ``inner`` is what serves once the check passes (the kernel, a tie's runner, or a
    confirmation window); ``default`` what serves when it fails (the caller's Default:
    routing sets PyTorch's kernel). ``judged(reason)`` is told the verdict once ("" when
    right, None when Default could not run to compare). Callers register ``on_final`` to replace this wrapper by ``final``; until they
    do, a judged wrapper forwards to it. A call that finds another thread checking runs
    Default (right, and nothing to undo); so does one under CUDA-graph capture, unless
    ``trusted`` (tuned here: it runs as the harness measured it in graphs).
    """

    def __init__(
        self,
        inner: Runner,
        default: Runner,
        problem: Problem,
        target: Target,
        judged: Callable[[str | None], None],
        capturing: Callable[[], bool],
        *,
        trusted: bool = False,
    ) -> None:
        self.candidate = inner.candidate
        self.inner = inner
        self.default = default
        self.final: Runner | None = None
        self.on_final: list[Callable[[Runner], None]] = []
        self._problem = problem
        self._target = target
        self._judged = judged
        self._capturing = capturing
        # Checked here before (by tuning): under graph capture, where nothing can be
        # compared, it runs as it was measured; a choice from elsewhere runs Default there.
        self._trusted = trusted
        self._lock = threading.Lock()

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None, *extra: Any
    ) -> Any:
        # What a runner returns is passed on (a grouped Default's own output: core/grouped.py).
        final = self.final
        if final is not None:
            return final(a, b, out, alpha, beta, bias, *extra)
        if self._capturing():
            return (self.inner if self._trusted else self.default)(a, b, out, alpha, beta, bias, *extra)
        if not self._lock.acquire(blocking=False):
            return self.default(a, b, out, alpha, beta, bias, *extra)
        try:
            final = self.final
            if final is not None:
                return final(a, b, out, alpha, beta, bias, *extra)
            return self._check(a, b, out, alpha, beta, bias, extra)
        finally:
            self._lock.release()

    def _check(
        self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, extra: tuple[Any, ...]
    ) -> Any:
        adapter, device = self._target.adapter, self._target.device
        shape, dtype = adapter.shape(out), adapter.dtype(out)
        c0 = None
        if beta != 0.0:  # out holds C: keep it for Default's run and the reference
            c0 = adapter.empty(shape, dtype, device)
            adapter.copy_(c0, out)
        got = self.inner(a, b, out, alpha, beta, bias, *extra)
        if got is not None:
            return got  # Default served this call with its own output: the choice is checked on a later one
        theirs = adapter.empty(shape, dtype, device)
        if c0 is not None:
            adapter.copy_(theirs, c0)
        try:
            self.default(a, b, theirs, alpha, beta, bias, *extra)
        except Exception:
            # Default refuses these operands (torch.matmul(out=...) and grad): nothing to
            # compare with; the choice serves as it did before checks, and nothing is stored.
            self._settle(self.inner, None)
            return None
        # The check's own products (the float64 reference, on the device) are not the
        # program's: routing passes them through, as it does the harness's.
        with mode("off"):
            reason = check_outputs(
                self._problem, self._target, a, b, out, theirs, c0, alpha, beta, bias, extra
            )
        if reason:
            adapter.copy_(out, theirs)  # the caller gets the right result
        self._settle(self.default if reason else self.inner, reason)
        return None

    def _settle(self, final: Runner, reason: str | None) -> None:
        self.final = final
        self._judged(reason)
        hooks, self.on_final = self.on_final, []
        for hook in hooks:
            hook(final)


def unwrapped(runner: Any) -> Any:
    """What a :class:`CheckingRunner` settled on (itself while it has not), else ``runner``."""
    if isinstance(runner, CheckingRunner) and runner.final is not None:
        return runner.final
    return runner
