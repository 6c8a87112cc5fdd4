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
Selector decides or tunes, ``unimatmul.calls.passing()`` passes every product through,
so the harness's own references (float64 ``@``) never re-enter it.

The hot path: a key of the operands (shapes, strides, dtypes, devices, pointer
alignment, mode) finds a :class:`~unimatmul.calls.Plan` in the call table
(:mod:`unimatmul.calls`); the plan holds the prepared Runner (or None: PyTorch's own
kernel, when Default was chosen or the operands are not eligible). No Problem is built, nothing is logged, nothing synchronises.

A choice from a record starts in a confirmation window (:mod:`unimatmul.tuning.confirm`):
its first real calls alternate it with PyTorch's kernel, timed where they run, and the
verdict either keeps it or turns the plan into PyTorch's kernel (source ``confirmed`` or
``reverted``). The native kernels run the window of their entries themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.autograd.profiler as _profiler

from unimatmul.calls import PASSING, Plan, decide_into, routed_decision
from unimatmul.core import modes as _config
from unimatmul.core._backend import DEFAULT, Runner, Target
from unimatmul.core.arrays import adapter_of, held_for_graphs, hold_for_graphs
from unimatmul.core.problem import Problem
from unimatmul.torch import native
from unimatmul.torch.router import Router
from unimatmul.tuning.selector import Decision, get_selector

DISPATCH_KEYS = ("CPU", "CUDA")
# Dtypes a GEMM backend may take; anything else (ints, complex) is PyTorch's at once.
_FLOATS = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.float64})
_DEVICES = frozenset({"cpu", "cuda"})
# Plans for this many distinct operand keys; a workload with ever-new shapes starts over.
MAX_PLANS = 8192

# How a plan feeds the runner. "plain": out = alpha * a @ b. "bias": + bias[n] (addmm's
# input as an epilogue). "c": out starts as a copy of the input and gets beta * C.
PLAIN, BIAS, C = 0, 1, 2


_router = Router("mm", MAX_PLANS, native.ROUTING)
TABLE = _router.table
_plans = TABLE.plans  # read per call; emptied in place, never replaced
_mode_var = _config._mode  # the context variable behind unimatmul.mode(): read per call


def is_enabled() -> bool:
    return _router.library is not None


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
            mode = _mode_var.get() or _router.env_mode
            if mode == "off" or PASSING.on:
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
            plan = _plans.get(key)
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
            mode = _mode_var.get() or _router.env_mode
            if mode == "off" or PASSING.on or isinstance(alpha, complex) or isinstance(beta, complex):
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
            plan = _plans.get(key)
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
        TABLE.fall_back(plan, exc, adapter_of(a))  # PyTorch's own kernel from now on: routing's Default
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
    decision = routed_decision(plan, _fill_plan, op, a, b, c, alpha, beta, mode)
    put = None
    if a.device.type.upper() in _router.native_keys and _mode_var.get() is None:

        def put(plan: Plan) -> None:
            _native_put(plan, a, b, c, beta)

    return TABLE.insert(key, plan, decision, put)


def _native_put(plan: Plan, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, beta: Any) -> None:
    """Give the native kernels this key's entry (they call Python for keys they lack).

    A choice in its window: the entry runs the window itself when it can make the
    kernel's call (the Python plan then holds the bare kernel, for calls that still
    come through Python); else the entry sends calls to the Python kernel, whose plan
    runs the window.
    """
    try:
        native.put_plan(native.ROUTING, plan, _router.kept, a, b, c, beta=beta)
    except Exception as exc:
        plan.reason = plan.reason or f"native table: {type(exc).__name__}: {exc}"


def _fill_plan(
    plan: Plan,
    op: str,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    alpha: Any,
    beta: Any,
    mode: str,
) -> Decision | None:
    """Describe the call in ``plan`` and decide; None where routing does not take it
    (``plan.reason`` says why: PyTorch's kernel runs it, or raises its error)."""
    reason = _ineligible(a, b)
    if not reason and c is not None and (c.dtype is not a.dtype or c.device != a.device):
        # PyTorch refuses an input of another dtype even when beta == 0 ("self and mat2
        # must have the same dtype"): its kernel must see the call to say so.
        reason = f"input of dtype {c.dtype} on {c.device}"
    if reason:
        plan.reason = reason
        return None
    batched = op in ("bmm", "baddbmm")
    rank = 3 if batched else 2
    if a.dim() != rank or b.dim() != rank:
        plan.reason = f"{op} needs {rank}-D operands"  # PyTorch's kernel raises the error
        return None
    out_shape = (a.shape[0], a.shape[1], b.shape[2]) if batched else (a.shape[0], b.shape[1])
    bias = None
    form = PLAIN
    if c is not None and beta != 0:
        form, bias, why = _input_form(c, out_shape, a.dtype, beta)
        if why:
            plan.reason = why
            return None
    elif c is not None and not _broadcasts(tuple(c.shape), out_shape):
        plan.reason = f"input of shape {tuple(c.shape)} does not broadcast to {out_shape}"
        return None
    if isinstance(alpha, complex) or isinstance(beta, complex):
        plan.reason = "complex alpha/beta"
        return None
    adapter = adapter_of(a)
    problem, shape = Problem.from_operands(
        adapter,
        a,
        b,
        bias=bias,
        c=c if form == C else None,
        beta=float(beta) if form == C else 0.0,
    )
    plan.problem, plan.target = problem, Target(adapter, adapter.device(a))
    plan.out_shape = tuple(shape)
    plan.form = form
    return decide_into(plan, problem, plan.target, mode, _PYTORCH)


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


def clear_plans() -> None:
    """Forget every plan (after tuning elsewhere, a new Selector, a new cache)."""
    TABLE.clear()


# --- installing ---------------------------------------------------------------------------

_KERNELS: dict[str, dict[str, Callable[..., torch.Tensor]]] = {"CPU": _kernels(False), "CUDA": _kernels(True)}


def install() -> None:
    """Register the kernels (idempotent); the previous kernels come back on :func:`uninstall`.

    The native kernels (native.py) serve the keys ``UNIMATMUL_TORCH_NATIVE`` names when
    they build; the Python kernels serve the rest.
    """

    def register(library: Any, native_keys: tuple[str, ...]) -> None:
        for key in DISPATCH_KEYS:
            if key not in native_keys:
                for name, kernel in _KERNELS[key].items():
                    library.impl(name, kernel, key)

    _router.install(register, _native_keys, _native_install)


def _native_install(keys: tuple[str, ...], mode: str, overrides: int) -> None:
    native.install(keys, mode, overrides, _KERNELS)


def _native_keys() -> tuple[str, ...]:
    """The keys the native kernels take now (``Router.load_native``; a failed build is said once)."""
    return _router.load_native(_native_install, warn=True)


def uninstall() -> None:
    _router.uninstall(native.uninstall)


# --- what happened ------------------------------------------------------------------------


def stats() -> dict[str, Any]:
    """Calls seen by the routed kernels since the last :func:`reset_stats`, in the call
    table's shape (:meth:`unimatmul.calls.CallTable.stats`: ``routed``, ``kernel``,
    ``default``, ``passthrough``, ``by_op``, ``by_label``, ``by_source``, ``confirm``),
    with ``tuning_s``: seconds this process's Selector spent tuning, and
    ``held_for_graphs``: kernels kept for the process's life because a CUDA graph
    captured their call (their workspaces and padded buffers are in the graph).
    """
    out = TABLE.stats()
    out["tuning_s"] = get_selector().stats.tune_s
    out["held_for_graphs"] = held_for_graphs()
    return out


def totals() -> dict[str, Any]:
    """Like :func:`stats`, but never reset (what a metrics exporter's counters need), with
    ``calls``: ``(op, source, kind, calls)`` rows (kind: kernel, default, passthrough)."""
    out = TABLE.totals()
    out["tuning_s"] = get_selector().stats.tune_s
    return out


def reset_stats() -> None:
    TABLE.reset_stats()


def plans() -> list[Plan]:
    """The live plans (for inspection and tests)."""
    return TABLE.live()
