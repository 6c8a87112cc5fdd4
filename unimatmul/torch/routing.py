"""Routing PyTorch's matrix products through unimatmul, at the dispatcher.

The mechanism: kernels for ``aten::mm``, ``aten::addmm``, ``aten::bmm`` and
``aten::baddbmm`` at the CPU and CUDA dispatch keys (CUDA also serves ROCm builds):
the Python kernels here, registered with a ``torch.library.Library``, and where they
build, the native (C++) kernels of ``native.py``, which serve known keys without Python
and call these Python kernels for the rest. Everything above those keys keeps
working unchanged: autograd (the backward's products are ``aten::mm`` calls too, so
they are routed), autocast (inputs arrive already cast), ``torch.jit.trace``, vmap,
tensor subclasses, fake tensors (they never reach a CPU/CUDA kernel). ``torch.matmul``,
``@``, ``nn.Linear`` and ``F.linear`` are composite ops that reach these four, so
they are routed without being touched. docs/torch.md has the measurements behind
the choice.

Only the functional forms are taken over. The ``out=`` and in-place forms stay
PyTorch's, and they are how a call is passed through: ``torch.mm(a, b, out=...)``
runs PyTorch's own kernel, never ours, so routing cannot recurse, not even through
the Default candidate (which calls ``torch.matmul(..., out=out)``). While the
Selector decides or tunes, a thread-local flag passes every product through, so
the harness's own references (float64 ``@``) never re-enter it.

The hot path: a key of the operands (shapes, strides, dtypes, devices, pointer
alignment, mode) finds a :class:`Plan` in a dict; the plan holds the prepared
Runner (or None: PyTorch's own kernel, when Default was chosen or the operands are
not eligible). No Problem is built, nothing is logged, nothing synchronises.

A choice from a record starts in a confirmation window (:mod:`unimatmul.tuning.confirm`):
its first real calls alternate it with PyTorch's kernel, timed where they run, and the
verdict either keeps it or turns the plan into PyTorch's kernel (source ``confirmed`` or
``reverted``). The native kernels run the window of their entries themselves.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.autograd.profiler as _profiler

from unimatmul.core import modes as _config
from unimatmul.core._backend import DEFAULT, Runner, Target
from unimatmul.core.arrays import adapter_of, held_for_graphs, hold_for_graphs
from unimatmul.core.problem import Problem
from unimatmul.torch import native
from unimatmul.tuning.confirm import UNJUDGED, Confirmation, ConfirmingRunner, Outcome, TieRunner
from unimatmul.tuning.selector import get_selector
from unimatmul.tuning.time_limit import carry_thread_state
from unimatmul.tuning.trust import CheckingRunner, unwrapped

DISPATCH_KEYS = ("CPU", "CUDA")
# Dtypes a GEMM backend may take; anything else (ints, complex) is PyTorch's at once.
_FLOATS = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})
_DEVICES = frozenset({"cpu", "cuda"})
# Plans for this many distinct operand keys; a workload with ever-new shapes starts over.
MAX_PLANS = 8192

# How a plan feeds the runner. "plain": out = alpha * a @ b. "bias": + bias[n] (addmm's
# input as an epilogue). "c": out starts as a copy of the input and gets beta * C.
PLAIN, BIAS, C = 0, 1, 2


class Plan:
    """What to do with one operand key: a runner, or None for PyTorch's own kernel."""

    __slots__ = (
        "calls",
        "confirmation",
        "form",
        "ident",
        "label",
        "native",
        "op",
        "out_shape",
        "problem",
        "reason",
        "runner",
        "saved_s",
        "source",
    )

    def __init__(self, op: str) -> None:
        self.op = op
        self.ident = native.new_id()
        self.native = -1  # the kind of its entry in the native table; -1: none
        self.runner: Runner | None = None
        self.problem: Problem | None = None
        self.source = "passthrough"  # or the Selector's Decision.source
        self.label = ""  # the profiler's name for the call
        self.reason = ""  # why the operands were not eligible
        self.out_shape: tuple[int, ...] = ()
        self.form = PLAIN
        self.calls = 0
        # The choice's window while it is open (its outcome once it is judged).
        self.confirmation: Confirmation | None = None
        # Seconds a call saves over PyTorch's kernel, by the in-situ medians (confirmed only).
        self.saved_s = 0.0

    @property
    def confirming(self) -> bool:
        """Whether the plan's choice is still in its confirmation window."""
        return self.confirmation is not None and self.confirmation.outcome is None


class _Busy(threading.local):
    on = False


class _State:
    def __init__(self) -> None:
        self.libraries: list[Any] = []
        self.env_mode = "cached"
        self.plans: dict[tuple[Any, ...], Plan] = {}
        self.retired: Counter[tuple[str, str, str]] = Counter()
        self.retired_saved_s = 0.0  # in-situ time saved by calls of forgotten plans
        self.verdicts: Counter[str] = Counter()  # windows judged: confirmed, reverted, unjudged
        # What reset_stats() took out of the counts: the metrics' totals never go down.
        self.before_reset: Counter[tuple[str, str, str]] = Counter()
        self.saved_before_reset = 0.0
        self.verdicts_before_reset: Counter[str] = Counter()
        self.collector: list[tuple[Problem, Target]] | None = None
        self.lock = threading.RLock()
        # Dispatch keys served by the native kernels (native.py), and the runners their
        # table points into (native.Kept: one generation more after the table is emptied,
        # for the process's life where a CUDA graph captured their call).
        self.native_keys: tuple[str, ...] = ()
        self.kept = native.Kept(native.ROUTING)


_state = _State()
_busy = _Busy()


@contextlib.contextmanager
def _busy_here(native: bool) -> Iterator[None]:
    was = _busy.on
    _busy.on = True
    if native:
        _native_busy(True)
    try:
        yield
    finally:
        _busy.on = was
        if native:
            _native_busy(False)


def _carry_busy() -> contextlib.AbstractContextManager[None]:
    """The tuning thread's "busy" flag, re-created on the harness's worker thread: the
    candidates' own torch calls there must not be routed back into unimatmul."""
    if not _busy.on:
        return contextlib.nullcontext()
    return _busy_here(bool(_state.native_keys))


carry_thread_state(_carry_busy)
_mode_var = _config._mode  # the context variable behind unimatmul.mode(): read per call


def is_enabled() -> bool:
    return bool(_state.libraries)


# --- the kernels ------------------------------------------------------------------------
# Each reads the mode, builds the operand key inline (a helper call per operand would
# cost as much as the rest), finds the plan and runs it. PyTorch's own kernels are
# reached through the out= forms. One set of kernels per dispatch key: a CPU kernel
# only ever sees CPU tensors (a CUDA operand would have picked the CUDA key), so its
# key needs no device; the CUDA kernel's key holds the device indices and TF32.


# Whether float32 products may use TF32: part of the Problem (compute type) on CUDA, so
# part of a float32 key there too (a user may switch it between calls).
_F32 = torch.float32
_tf32: Callable[[], bool] = getattr(
    torch._C, "_get_cublas_allow_tf32", lambda: bool(torch.backends.cuda.matmul.allow_tf32)
)


def _kernels(cuda: bool) -> dict[str, Callable[..., torch.Tensor]]:
    # Factories, not one generic kernel: the op's name and PyTorch function are closure
    # cells, as cheap to read per call as the hand-written kernels they replace.
    def product(name: str, op: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def kernel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            mode = _mode_var.get() or _state.env_mode
            if mode == "off" or _busy.on:
                return op(a, b, out=a.new_empty(0))
            key = (
                name,
                mode,
                a.shape,
                a.stride(),
                a.dtype,
                a.data_ptr() & 15,
                b.shape,
                b.stride(),
                b.dtype,
                b.data_ptr() & 15,
                (a.get_device(), b.get_device(), a.dtype is _F32 and _tf32()) if cuda else None,
            )
            plan = _state.plans.get(key)
            if plan is None:
                plan = _resolve(key, name, a, b, None, 1.0, 0.0, mode)
            plan.calls += 1
            runner = plan.runner
            if runner is None:
                return op(a, b, out=a.new_empty(0))
            out = a.new_empty(plan.out_shape)
            if not _run(plan, runner, a, b, out, 1.0, 0.0, None):
                return op(a, b, out=out)
            return out

        return kernel

    def accumulate(
        name: str, default: Callable[..., torch.Tensor], op: Callable[..., torch.Tensor]
    ) -> Callable[..., torch.Tensor]:
        def kernel(
            c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
        ) -> torch.Tensor:
            mode = _mode_var.get() or _state.env_mode
            if mode == "off" or _busy.on or isinstance(alpha, complex) or isinstance(beta, complex):
                # A complex scalar is not part of the key: PyTorch takes (and refuses) it.
                return default(c, a, b, beta, alpha)
            key = (
                name,
                mode,
                a.shape,
                a.stride(),
                a.dtype,
                a.data_ptr() & 15,
                b.shape,
                b.stride(),
                b.dtype,
                b.data_ptr() & 15,
                c.shape,
                c.stride(),
                c.dtype,
                c.data_ptr() & 15,
                beta == 0,
                beta == 1,
                (a.get_device(), b.get_device(), c.get_device(), a.dtype is _F32 and _tf32())
                if cuda
                else None,
            )
            plan = _state.plans.get(key)
            if plan is None:
                plan = _resolve(key, name, a, b, c, alpha, beta, mode)
            plan.calls += 1
            runner = plan.runner
            if runner is None:
                return default(c, a, b, beta, alpha)
            return _run_with_input(plan, runner, c, a, b, alpha, beta, op)

        return kernel

    return {
        "mm": product("mm", torch.mm),
        "bmm": product("bmm", torch.bmm),
        "addmm": accumulate("addmm", _addmm_default, torch.addmm),
        "baddbmm": accumulate("baddbmm", _baddbmm_default, torch.baddbmm),
    }


# PyTorch's own addmm/baddbmm through the out= form; without keywords in the usual
# case (beta = alpha = 1), where parsing them would cost a tenth of the call.
def _addmm_default(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: Any, alpha: Any) -> torch.Tensor:
    if beta == 1 and alpha == 1:
        return torch.addmm(c, a, b, out=a.new_empty(0))
    return torch.addmm(c, a, b, beta=beta, alpha=alpha, out=a.new_empty(0))


def _baddbmm_default(
    c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: Any, alpha: Any
) -> torch.Tensor:
    if beta == 1 and alpha == 1:
        return torch.baddbmm(c, a, b, out=a.new_empty(0))
    return torch.baddbmm(c, a, b, beta=beta, alpha=alpha, out=a.new_empty(0))


def _run_with_input(
    plan: Plan,
    runner: Runner,
    c: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    alpha: Any,
    beta: Any,
    fallback: Callable[..., torch.Tensor],
) -> torch.Tensor:
    form = plan.form
    if form == C:
        out = c.clone(memory_format=torch.contiguous_format)
        ok = _run(plan, runner, a, b, out, float(alpha), float(beta), None)
    else:
        out = a.new_empty(plan.out_shape)
        ok = _run(plan, runner, a, b, out, float(alpha), 0.0, c if form == BIAS else None)
    if not ok:
        return fallback(c, a, b, beta=beta, alpha=alpha, out=out)
    return out


def _run(plan: Plan, runner: Runner, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> bool:
    """Run the plan's kernel; False (and Default from now on) if it fails on this call."""
    try:
        if _profiler._is_profiler_enabled:
            with torch.profiler.record_function(plan.label):
                runner(a, b, out, alpha, beta, bias)
        else:
            runner(a, b, out, alpha, beta, bias)
        if a.is_cuda and torch.cuda.is_current_stream_capturing():
            hold_for_graphs(runner)  # a graph now holds its buffers: never freed
        return True
    except Exception as exc:
        plan.runner = None  # PyTorch's own kernel from now on: routing's Default
        plan.source = "fallback"
        plan.label = f"unimatmul::{plan.op} [default]"
        get_selector().fall_back(plan.problem, runner.candidate, exc, adapter_of(a))
        return False


# --- the slow path ------------------------------------------------------------------------


def _resolve(
    key: tuple[Any, ...],
    op: str,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    alpha: Any,
    beta: Any,
    mode: str,
) -> Plan:
    """Build the plan for a key met for the first time: describe, decide, prepare."""
    plan = Plan(op)
    try:
        _fill_plan(plan, op, a, b, c, alpha, beta, mode)
    except Exception as exc:  # never break the caller's program over a routing decision
        plan.runner, plan.source, plan.reason = None, "passthrough", f"{type(exc).__name__}: {exc}"
    with _state.lock:
        plans = _state.plans
        found = plans.get(key)
        if found is not None and plan.source != "tuned":  # another thread resolved it meanwhile
            return found
        if plan.source == "tuned" and plans:
            # Keys resolved before may hold Default for problems tuned since; start over.
            _retire_plans()
        elif len(plans) >= MAX_PLANS:
            _retire_plans()
        plans[key] = plan
        if a.device.type.upper() in _state.native_keys and _mode_var.get() is None:
            _native_put(plan, op, a, b, c, beta)
    if isinstance(plan.runner, CheckingRunner):  # judged on this very call (tuning/trust.py)

        def checked(final: Runner) -> None:
            def put_again() -> None:
                if _state.plans.get(key) is plan:
                    _native_put(plan, op, a, b, c, beta)

            with _state.lock:
                native.take_checked(plan, final, _to_default, put_again)

        plan.runner.on_final.append(checked)
    return plan


def _native_put(
    plan: Plan, op: str, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, beta: Any
) -> None:
    """Give the native kernels this key's entry (they call Python for keys they lack).

    A choice in its window: the entry runs the window itself when it can make the
    kernel's call (the Python plan then holds the bare kernel, for calls that still
    come through Python); else the entry sends calls to the Python kernel, whose plan
    runs the window.
    """
    entry = native.entry_for(plan.runner, offered=plan.form in (PLAIN, BIAS))
    try:
        native.put(op, a, b, c, beta, entry.kind, plan.ident, plan.label, plan.out_shape, plan.form, entry.call,
                   entry.confirm, entry.tie)  # fmt: skip
    except Exception as exc:
        plan.reason = plan.reason or f"native table: {type(exc).__name__}: {exc}"
        return
    native.entered(entry, plan, _state.kept)


def _fill_plan(
    plan: Plan,
    op: str,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    alpha: Any,
    beta: Any,
    mode: str,
) -> None:
    reason = _ineligible(a, b)
    if not reason and c is not None and (c.dtype is not a.dtype or c.device != a.device):
        # PyTorch refuses an input of another dtype even when beta == 0 ("self and mat2
        # must have the same dtype"): its kernel must see the call to say so.
        reason = f"input of dtype {c.dtype} on {c.device}"
    if reason:
        plan.reason = reason
        return
    batched = op in ("bmm", "baddbmm")
    rank = 3 if batched else 2
    if a.dim() != rank or b.dim() != rank:
        plan.reason = f"{op} needs {rank}-D operands"  # PyTorch's kernel raises the error
        return
    out_shape = (a.shape[0], a.shape[1], b.shape[2]) if batched else (a.shape[0], b.shape[1])
    bias = None
    form = PLAIN
    if c is not None and beta != 0:
        form, bias, why = _input_form(c, out_shape, a.dtype, beta)
        if why:
            plan.reason = why
            return
    elif c is not None and not _broadcasts(tuple(c.shape), out_shape):
        plan.reason = f"input of shape {tuple(c.shape)} does not broadcast to {out_shape}"
        return
    if isinstance(alpha, complex) or isinstance(beta, complex):
        plan.reason = "complex alpha/beta"
        return
    adapter = adapter_of(a)
    problem, shape = Problem.from_operands(
        adapter,
        a,
        b,
        bias=bias,
        c=c if form == C else None,
        beta=float(beta) if form == C else 0.0,
    )
    target = Target(adapter, adapter.device(a))
    collector = _state.collector
    if collector is not None:
        collector.append((problem, target))
    if mode == "tune" and a.is_cuda and torch.cuda.is_current_stream_capturing():
        mode = "cached"  # never measure inside a CUDA graph capture
    native = bool(_state.native_keys)
    _busy.on = True
    if native:
        _native_busy(True)
    try:
        decision = get_selector().decide(problem, target, mode)
    finally:
        _busy.on = False
        if native:
            _native_busy(False)
    plan.problem = problem
    plan.out_shape = tuple(shape)
    plan.form = form
    plan.source = decision.source
    candidate = decision.runner.candidate
    if candidate == DEFAULT:
        plan.label = f"unimatmul::{op} [default]"
    else:
        plan.runner = decision.runner
        plan.label = f"unimatmul::{op} [{candidate.identity}]"
        if decision.source == "confirmed" and decision.record is not None:
            plan.saved_s = _saved_per_call(decision.record.settings)
    runner = plan.runner
    if isinstance(runner, CheckingRunner):
        runner.default = _PYTORCH
        runner = runner.inner
    if isinstance(runner, (ConfirmingRunner, TieRunner)):
        # Inside a dispatcher kernel, Default is PyTorch's kernel through its out= and
        # in-place forms (torch.matmul(out=...) would refuse operands that require grad).
        runner.default = _PYTORCH
    if decision.confirmation is not None:
        plan.confirmation = decision.confirmation
        decision.confirmation.listen(lambda outcome: _judged(plan, outcome))


class _PyTorchKernel:
    """PyTorch's own kernel in the runner convention (the Default of a window in the Python
    kernels), through the out= and in-place forms, which routing never takes over."""

    candidate = DEFAULT

    def __call__(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        out: torch.Tensor,
        alpha: float = 1.0,
        beta: float = 0.0,
        bias: Any = None,
    ) -> None:
        batched = out.dim() == 3
        if beta != 0.0:  # out holds C
            if batched:
                out.baddbmm_(a, b, beta=beta, alpha=alpha)
            else:
                out.addmm_(a, b, beta=beta, alpha=alpha)
        elif bias is not None:
            torch.addmm(bias, a, b, alpha=alpha, out=out)
        else:
            (torch.bmm if batched else torch.mm)(a, b, out=out)
            if alpha != 1.0:
                out.mul_(alpha)


_PYTORCH = _PyTorchKernel()


def _saved_per_call(settings: dict[str, Any]) -> float:
    found = settings.get("confirm")
    try:
        return max(float(found["default_s"]) - float(found["kernel_s"]), 0.0)  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return 0.0


def _judged(plan: Plan, outcome: Outcome) -> None:
    """A window's verdict: the plan keeps its kernel or becomes PyTorch's kernel.

    The calls made so far stay counted under the plan's old source; later ones count
    under ``confirmed`` or ``reverted``.
    """
    runner = unwrapped(plan.runner)
    kernel = runner.kept() if isinstance(runner, ConfirmingRunner) else runner
    with _state.lock:
        _state.verdicts[outcome.verdict] += 1
        if outcome.verdict == UNJUDGED:
            plan.runner = kernel  # nothing measured: the choice stays, under its old source
            return
        if not outcome.keep:
            _to_default(plan, outcome.verdict)
            return
        _sync_native_counts()
        if plan.calls:
            _state.retired[(plan.op, plan.source, plan.label)] += plan.calls
            plan.calls = 0
        plan.source = outcome.verdict
        plan.runner = kernel
        plan.saved_s = outcome.saved_s


def _to_default(plan: Plan, source: str) -> None:
    """The plan becomes PyTorch's kernel under ``source``; the calls made so far stay
    counted under its old one. The caller holds the state's lock."""
    _sync_native_counts()
    if plan.calls:
        _state.retired[(plan.op, plan.source, plan.label)] += plan.calls
        plan.calls = 0
    plan.source = source
    plan.runner = None
    plan.label = f"unimatmul::{plan.op} [default]"


def _ineligible(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.dtype not in _FLOATS:
        return f"dtype {a.dtype} is not a GEMM dtype unimatmul routes"
    if b.dtype is not a.dtype:
        return f"mixed dtypes {a.dtype} and {b.dtype}"
    if a.device != b.device or a.device.type not in _DEVICES:
        return f"devices {a.device} and {b.device}"
    if a.is_neg() or b.is_neg() or a.is_conj() or b.is_conj():
        return "a negative or conjugate view"
    return ""


def _input_form(
    c: torch.Tensor, out_shape: tuple[int, ...], dtype: torch.dtype, beta: Any
) -> tuple[int, torch.Tensor | None, str]:
    """How addmm/baddbmm's input enters the kernel: as a bias epilogue, or as C."""
    if c.dtype is not dtype or c.device.type not in _DEVICES:
        return PLAIN, None, f"input of dtype {c.dtype} on {c.device}"
    n = out_shape[-1]
    if len(out_shape) == 2 and tuple(c.shape) == (n,) and (c.stride(0) == 1 or n == 1):
        if beta != 1:
            return PLAIN, None, "a bias scaled by beta != 1"
        return BIAS, c, ""
    if tuple(c.shape) == out_shape:
        return C, None, ""
    return PLAIN, None, f"input of shape {tuple(c.shape)} broadcast to {out_shape}"


def _broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    if len(shape) > len(to):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(to), strict=False))


def _native_busy(on: bool) -> None:
    native.set_busy(on)


def _sync_native_counts(clear: bool = False) -> None:
    """Add the calls the native kernels counted to their plans (lock held)."""
    if not _state.native_keys:
        return
    counted = _state.kept.clear() if clear else native.counts(reset=True)
    if not counted:
        return
    for plan in _state.plans.values():
        plan.calls += counted.get(plan.ident, 0)


def _retire_plans() -> None:
    _sync_native_counts(clear=True)
    for plan in _state.plans.values():
        if plan.calls:
            _state.retired[(plan.op, plan.source, plan.label)] += plan.calls
            _state.retired_saved_s += plan.calls * plan.saved_s
            plan.calls = 0  # a verdict that reaches a forgotten plan must not count them again
    _state.plans.clear()


def clear_plans() -> None:
    """Forget every plan (after tuning elsewhere, a new Selector, a new cache)."""
    with _state.lock:
        _retire_plans()


# --- installing ---------------------------------------------------------------------------

_KERNELS: dict[str, dict[str, Callable[..., torch.Tensor]]] = {"CPU": _kernels(False), "CUDA": _kernels(True)}


def install() -> None:
    """Register the kernels (idempotent); the previous kernels come back on :func:`uninstall`.

    The native kernels (native.py) serve the keys ``UNIMATMUL_TORCH_NATIVE`` names when
    they build; the Python kernels serve the rest.
    """
    with _state.lock:
        if _state.libraries:
            return
        _state.env_mode = _config.env_mode()
        native_keys = _native_keys()
        library = torch.library.Library("aten", "IMPL")
        try:
            with warnings.catch_warnings():
                # PyTorch warns that a kernel is overridden: that is the point here.
                warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
                for key in DISPATCH_KEYS:
                    if key in native_keys:
                        continue
                    for name, kernel in _KERNELS[key].items():
                        library.impl(name, kernel, key)
                if native_keys:
                    native.install(native_keys, _state.env_mode, _config.overrides(), _KERNELS)
        except Exception:
            library._destroy()
            raise
        _state.libraries.append(library)
        _state.native_keys = native_keys
        if native_keys:
            _config.on_overrides(_native_overrides)


def _native_keys() -> tuple[str, ...]:
    """The keys the native kernels take, once they are built; () with a warning if they fail."""
    keys = native.wanted_keys()
    if not keys:
        return ()
    cuda = "CUDA" in keys
    if native.load(cuda):
        return keys
    get_selector().warn_once(
        "torch-native-build",
        f"unimatmul.torch: the native routing kernels did not build ({native.failure(cuda)}); "
        f"using the Python kernels, which cost ~6 us more host time per call (set {native.ENV}=0 "
        "to skip the build)",
    )
    return ()


def _native_overrides(count: int) -> None:
    native.configure(_state.env_mode, count)


def uninstall() -> None:
    with _state.lock:
        if _state.native_keys:
            native.uninstall()
            _config.on_overrides(_native_overrides, remove=True)
        for library in _state.libraries:
            library._destroy()
        _state.libraries.clear()
        _retire_plans()
        _state.native_keys = ()


# --- what happened ------------------------------------------------------------------------


def _counts() -> tuple[Counter[tuple[str, str, str]], float, dict[str, int]]:
    """(op, source, label) -> calls since the last reset; in-situ seconds saved; windows
    open now and judged since the last reset (lock held)."""
    _sync_native_counts()
    counts: Counter[tuple[str, str, str]] = Counter(_state.retired)
    saved = _state.retired_saved_s
    windows = {"open": 0, "confirmed": 0, "reverted": 0, "unjudged": 0, **_state.verdicts}
    for plan in _state.plans.values():
        if plan.calls:
            counts[(plan.op, plan.source, plan.label)] += plan.calls
            saved += plan.calls * plan.saved_s
        if plan.confirming:
            windows["open"] += 1
    return counts, saved, windows


def stats() -> dict[str, Any]:
    """Calls seen by the routed kernels since the last :func:`reset_stats`.

    ``routed``: calls unimatmul decided (a kernel or Default); ``kernel``: calls that
    ran a backend's kernel; ``default``: Default chosen; ``passthrough``: operands not
    eligible (PyTorch's kernel, untouched). ``by_op``, ``by_label`` (the profiler's
    names) and ``by_source`` (the Selector's: cache, bucket, tuned, default, ...;
    ``confirmed`` / ``reverted`` once a confirmation window judged the choice) break it
    down. ``confirm``: confirmation windows ``open`` now, and ``confirmed``,
    ``reverted`` and ``unjudged`` (nothing measurable) since the reset; ``saved_s``, the
    kernel time the confirmed choices saved, by their in-situ medians (calls x (Default
    - choice)). ``tuning_s``: seconds this process's Selector spent tuning.
    ``held_for_graphs``: kernels kept for the process's life because a CUDA graph
    captured their call (their workspaces and padded buffers are in the graph).
    """
    with _state.lock:
        counts, saved, windows = _counts()
    out = _summarise(counts)
    out["confirm"] = {**windows, "saved_s": saved}
    out["tuning_s"] = get_selector().stats.tune_s
    out["held_for_graphs"] = held_for_graphs()
    return out


def totals() -> dict[str, Any]:
    """Like :func:`stats`, but never reset (what a metrics exporter's counters need), with
    ``calls``: ``(op, source, kind, calls)`` rows (kind: kernel, default, passthrough)."""
    with _state.lock:
        counts, saved, windows = _counts()
        counts.update(_state.before_reset)
        saved += _state.saved_before_reset
        for verdict, judged in _state.verdicts_before_reset.items():
            windows[verdict] += judged
    out = _summarise(counts)
    out["confirm"] = {**windows, "saved_s": saved}
    out["tuning_s"] = get_selector().stats.tune_s
    rows: Counter[tuple[str, str, str]] = Counter()
    for (op, source, label), calls in counts.items():
        rows[(op, source, _kind(source, label))] += calls
    out["calls"] = [(op, source, kind, calls) for (op, source, kind), calls in sorted(rows.items())]
    return out


def _kind(source: str, label: str) -> str:
    if source == "passthrough":
        return "passthrough"
    return "default" if label.endswith("[default]") else "kernel"


def _summarise(counts: Counter[tuple[str, str, str]]) -> dict[str, Any]:
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
        if routed:
            out["routed"] += calls
        per_op = out["by_op"].setdefault(op, {"routed": 0, "kernel": 0, "default": 0, "passthrough": 0})
        per_op[kind] += calls
        if routed:
            per_op["routed"] += calls
            out["by_label"][label] = out["by_label"].get(label, 0) + calls
        out["by_source"][source] = out["by_source"].get(source, 0) + calls
    return out


def reset_stats() -> None:
    with _state.lock:
        counts, saved, _ = _counts()
        _state.before_reset.update(counts)
        _state.saved_before_reset += saved
        _state.verdicts_before_reset.update(_state.verdicts)
        _state.verdicts.clear()
        _state.retired.clear()
        _state.retired_saved_s = 0.0
        for plan in _state.plans.values():
            plan.calls = 0


def plans() -> list[Plan]:
    """The live plans (for inspection and tests)."""
    with _state.lock:
        _sync_native_counts()
        return list(_state.plans.values())
