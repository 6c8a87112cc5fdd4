"""Routing ``torch._scaled_mm`` (fp8 with scales) through unimatmul, at the dispatcher.

A Python kernel for ``aten::_scaled_mm`` at the CPU and CUDA dispatch keys (CUDA also
serves ROCm builds), installed and removed with the other routed products by
:func:`unimatmul.torch.enable` / :func:`~unimatmul.torch.disable`. Like the kernels
of ``routing.py`` it keeps one plan per operand key (shapes, strides, dtypes and
pointer alignment of the fp8 operands, scales and bias, the output dtype, the fast
accumulation flag, the device, the mode); a plan holds the prepared scaled runner, or
None for PyTorch's own kernel (Default was chosen, or the call is not a scaled GEMM
unimatmul describes: an fp8 output, MX or other block-wise scales, ``scale_result``, a
block-scaled call where torch has no block-scaled product, ...). Block-scaled calls
(1x128 groups of A, 128x128 blocks of B) reach ``aten::_scaled_mm`` in torch 2.11 and
2.13 alike (``torch._scaled_mm`` takes them on sm90) and are routed as the others;
``torch.nn.functional.scaled_mm`` (where the version has it) calls
``aten::_scaled_mm_v2``, which is not routed.

PyTorch's own kernel is reached through the ``out=`` form, ``aten::_scaled_mm.out``,
which is never taken over: routing cannot recurse, not even through the Default
candidate (``core/scaled.py``, the same call). While the Selector decides or tunes, the
call runs inside ``unimatmul.mode("off")``, so the harness's own products (its float64
reference goes through ``aten::mm``) pass through every routed kernel, native ones too.

Where the native (C++) kernels build (``native.py``, ``UNIMATMUL_TORCH_NATIVE``), the CUDA
key (and the CPU key, where ``UNIMATMUL_TORCH_NATIVE=auto`` lets them serve it) is served by
the native ``_scaled_mm`` kernel instead, and this Python kernel
by way of it (the ``unimatmul_native::slow_scaled_mm`` op) for keys it does not know
yet: once a plan is resolved here, the key's entry goes into the native SCALED table
(PyTorch's kernel, the scaled runner's cuBLASLt/hipBLASLt call, or this kernel), so the
cached call costs no Python host time. A call with ``scale_result`` always comes here.
Without a native build every routed call runs this kernel (a dict lookup and the runner,
a few microseconds of host time), which CUDA graphs remove.
``torch.compile`` keeps the calls routed through ``unimatmul::scaled_mm``
(``compiled.py``).

A choice from a record starts in a confirmation window (:mod:`unimatmul.tuning.confirm`),
as a routed mm does: its first real calls alternate it with PyTorch's kernel, timed where
they run (in the native entry, or in the plan's window here), and the verdict keeps it
(source ``confirmed``) or turns the plan and its entry into PyTorch's kernel (``reverted``).
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter
from typing import Any

import torch
import torch.autograd.profiler as _profiler

from unimatmul.core import modes as _config
from unimatmul.core._backend import DEFAULT, Runner, Target
from unimatmul.core.arrays import adapter_of, hold_for_graphs
from unimatmul.core.problem import Problem
from unimatmul.core.runners import torch_has_block_scaled
from unimatmul.core.scales import scaled_problem_of
from unimatmul.torch import native
from unimatmul.tuning.confirm import UNJUDGED, Confirmation, ConfirmingRunner, Outcome
from unimatmul.tuning.selector import get_selector
from unimatmul.tuning.trust import CheckingRunner, unwrapped

DISPATCH_KEYS = ("CPU", "CUDA")
# The keys the native kernel may serve (where the native build does): both. On a CPU no
# backend has an fp8 kernel, so every call ends in PyTorch's; the Python kernel's key and
# plan lookup cost ~15 us a call there (16x256x256 per-tensor, gpu_fp8.py --device cpu),
# the native table's a fraction of a microsecond.
NATIVE_KEYS = ("CPU", "CUDA")
# Plans for this many distinct operand keys; a workload with ever-new shapes starts over.
MAX_PLANS = 4096
_OUT_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
_DEVICES = frozenset({"cpu", "cuda"})


class ScaledPlan:
    """What to do with one operand key: a scaled runner, or None for PyTorch's kernel."""

    __slots__ = (
        "calls",
        "confirmation",
        "ident",
        "label",
        "native",
        "out_dtype",
        "out_shape",
        "problem",
        "reason",
        "runner",
        "source",
    )

    def __init__(self) -> None:
        self.ident = native.new_id()
        self.native = -1  # the kind of its entry in the native SCALED table; -1: none
        self.runner: Runner | None = None
        self.problem: Problem | None = None
        self.source = "passthrough"  # or the Selector's Decision.source
        self.label = ""
        self.reason = ""
        self.out_shape: tuple[int, int] = (0, 0)
        self.out_dtype: Any = None
        self.calls = 0
        self.confirmation: Confirmation | None = None  # the choice's window, while one judges it


class _State:
    def __init__(self) -> None:
        self.library: Any = None
        self.env_mode = "cached"
        self.plans: dict[tuple[Any, ...], ScaledPlan] = {}
        self.retired: Counter[tuple[str, str]] = Counter()
        self.verdicts: Counter[str] = Counter()  # windows judged: confirmed, reverted, unjudged
        self.lock = threading.RLock()
        # Keys served by the native kernel, and the runners its table points into
        # (native.Kept, as routing.py keeps them).
        self.native_keys: tuple[str, ...] = ()
        self.kept = native.Kept(native.SCALED)


_state = _State()
_mode_var = _config._mode  # the context variable behind unimatmul.mode(): read per call


def _passthrough(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    scale_result: torch.Tensor | None,
    out_dtype: torch.dtype | None,
    use_fast_accum: bool,
) -> torch.Tensor:
    out = a.new_empty(0, dtype=out_dtype if out_dtype is not None else a.dtype)
    return torch._scaled_mm(
        a,
        b,
        scale_a,
        scale_b,
        bias=bias,
        scale_result=scale_result,
        out_dtype=out_dtype,
        use_fast_accum=use_fast_accum,
        out=out,
    )


def _scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None = None,
    scale_result: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """The routed ``aten::_scaled_mm``: a plan per operand key (module docstring)."""
    mode = _mode_var.get() or _state.env_mode
    if mode == "off":
        return _passthrough(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
    key = (
        mode,
        a.shape,
        a.stride(),
        a.dtype,
        a.data_ptr() & 15,
        b.shape,
        b.stride(),
        b.dtype,
        b.data_ptr() & 15,
        scale_a.shape,
        scale_a.stride(),
        scale_a.dtype,
        scale_a.data_ptr() & 15,
        scale_b.shape,
        scale_b.stride(),
        scale_b.dtype,
        scale_b.data_ptr() & 15,
        None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.data_ptr() & 15),
        scale_result is None,
        out_dtype,
        use_fast_accum,
        a.device,
        b.device,
    )
    plan = _state.plans.get(key)
    if plan is None:
        plan = _resolve(key, a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum, mode)
    plan.calls += 1
    runner: Any = plan.runner
    if runner is None:
        return _passthrough(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
    out = torch.empty(plan.out_shape, dtype=plan.out_dtype, device=a.device)
    try:
        if _profiler._is_profiler_enabled:
            with torch.profiler.record_function(plan.label):
                runner(a, b, out, 1.0, 0.0, bias, scale_a, scale_b)
        else:
            runner(a, b, out, 1.0, 0.0, bias, scale_a, scale_b)
        if a.is_cuda and torch.cuda.is_current_stream_capturing():
            hold_for_graphs(runner)  # a graph now holds its buffers: never freed
    except Exception as exc:
        plan.runner = None  # PyTorch's own kernel from now on
        plan.source = "fallback"
        plan.label = "unimatmul::scaled_mm [default]"
        get_selector().fall_back(plan.problem, runner.candidate, exc, adapter_of(a))
        if plan.native != -1:
            with _state.lock:
                if _state.plans.get(key) is plan:  # the native entry too: PyTorch's kernel
                    _native_put(plan, a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum)
        return _passthrough(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
    return out


def _resolve(
    key: tuple[Any, ...],
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    scale_result: torch.Tensor | None,
    out_dtype: torch.dtype | None,
    use_fast_accum: bool,
    mode: str,
) -> ScaledPlan:
    plan = ScaledPlan()
    try:
        _fill(plan, a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum, mode)
    except Exception as exc:  # never break the caller's program over a routing decision
        plan.runner, plan.source = None, "passthrough"
        plan.reason = f"{type(exc).__name__}: {exc}"
    with _state.lock:
        found = _state.plans.get(key)
        if found is not None and plan.source != "tuned":  # another thread resolved it meanwhile
            return found
        if plan.source == "tuned" or len(_state.plans) >= MAX_PLANS:
            # Keys resolved before may hold Default for the problem just tuned: start over.
            _retire()
        _state.plans[key] = plan
        if scale_result is None and a.device.type.upper() in _state.native_keys and _mode_var.get() is None:
            _native_put(plan, a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum)
    if isinstance(plan.runner, CheckingRunner):  # judged on this very call (tuning/trust.py)

        def checked(final: Runner) -> None:
            def put_again() -> None:
                if _state.plans.get(key) is plan:
                    _native_put(plan, a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum)

            with _state.lock:
                native.take_checked(plan, final, _to_default, put_again)

        plan.runner.on_final.append(checked)
    return plan


def _native_put(
    plan: ScaledPlan,
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype | None,
    use_fast_accum: bool,
) -> None:
    """Give the native kernel this key's entry (it calls this module's kernel for keys it lacks).

    A choice in its confirmation window: the entry runs the window itself when it can make
    the kernel's call (the plan then holds the bare kernel, for calls that still come
    through Python); else the entry sends calls here, where the plan's window runs.
    """
    entry = native.entry_for(plan.runner)
    try:
        native.put_scaled(
            a, b, scale_a, scale_b, bias, out_dtype, use_fast_accum, entry.kind, plan.ident, plan.label,
            plan.out_shape, entry.call, entry.confirm, entry.tie,
        )  # fmt: skip
    except Exception as exc:
        plan.reason = plan.reason or f"native table: {type(exc).__name__}: {exc}"
        return
    native.entered(entry, plan, _state.kept)


def _fill(
    plan: ScaledPlan,
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    scale_result: torch.Tensor | None,
    out_dtype: torch.dtype | None,
    use_fast_accum: bool,
    mode: str,
) -> None:
    if out_dtype not in _OUT_DTYPES:
        plan.reason = f"output dtype {out_dtype or a.dtype} (unimatmul writes bf16, f16 or f32)"
        return
    if scale_result is not None:
        plan.reason = "scale_result given"
        return
    if a.device.type not in _DEVICES or a.device != b.device:
        plan.reason = f"devices {a.device} and {b.device}"
        return
    adapter = adapter_of(a)
    try:
        problem = scaled_problem_of(
            adapter,
            a,
            b,
            scale_a,
            scale_b,
            out_dtype=_OUT_DTYPES[out_dtype],
            bias=bias,
            fast_accum=use_fast_accum,
        )
    except (TypeError, ValueError) as exc:
        # Block-wise or MX scales, a layout torch itself refuses, ...: PyTorch's kernel
        # runs it (or raises its own error).
        plan.reason = str(exc)
        return
    target = Target(adapter, adapter.device(a))
    if problem.is_block_scaled and not torch_has_block_scaled(adapter, target.device):
        # Nothing to measure against: PyTorch's kernel raises its own error, as unrouted.
        plan.reason = f"torch has no block-scaled product on {target.device}"
        return
    if mode == "tune" and a.is_cuda and torch.cuda.is_current_stream_capturing():
        mode = "cached"  # never measure inside a CUDA graph capture
    with _config.mode("off"):  # the harness's own products pass through every routed kernel
        decision = get_selector().decide(problem, target, mode)
    plan.problem = problem
    plan.out_shape = (problem.m, problem.n)
    plan.out_dtype = out_dtype
    plan.source = decision.source
    candidate = decision.runner.candidate
    if candidate == DEFAULT:
        plan.label = "unimatmul::scaled_mm [default]"
    else:
        plan.runner = decision.runner
        plan.label = f"unimatmul::scaled_mm [{candidate.identity}]"
    if decision.confirmation is not None:
        # A window's Default is torch._scaled_mm's out= form (core/scaled.py), which this
        # kernel never takes over: no recursion.
        plan.confirmation = decision.confirmation
        decision.confirmation.listen(lambda outcome: _judged(plan, outcome))


def _judged(plan: ScaledPlan, outcome: Outcome) -> None:
    """A window's verdict: the plan keeps its kernel or becomes PyTorch's kernel (the native
    entry has switched itself). The calls made so far stay counted under the plan's old
    source; later ones count under ``confirmed`` or ``reverted``."""
    runner = unwrapped(plan.runner)
    kernel = runner.kept() if isinstance(runner, ConfirmingRunner) else runner
    with _state.lock:
        _state.verdicts[outcome.verdict] += 1
        plan.confirmation = None
        if outcome.verdict == UNJUDGED:
            plan.runner = kernel  # nothing measured: the choice stays, under its old source
            return
        if not outcome.keep:
            _to_default(plan, outcome.verdict)
            return
        _sync_native_counts()
        if plan.calls:
            _state.retired[(plan.source, plan.label)] += plan.calls
            plan.calls = 0
        plan.source = outcome.verdict
        plan.runner = kernel


def _to_default(plan: ScaledPlan, source: str) -> None:
    """The plan becomes PyTorch's kernel under ``source``; the calls made so far stay
    counted under its old one. The caller holds the state's lock."""
    _sync_native_counts()
    if plan.calls:
        _state.retired[(plan.source, plan.label)] += plan.calls
        plan.calls = 0
    plan.source = source
    plan.runner = None
    plan.label = "unimatmul::scaled_mm [default]"


def _sync_native_counts(clear: bool = False) -> None:
    """Add the calls the native kernel counted to their plans (lock held)."""
    if not _state.native_keys:
        return
    counted = _state.kept.clear() if clear else native.counts(reset=True, table=native.SCALED)
    for plan in _state.plans.values():
        plan.calls += counted.get(plan.ident, 0)


def _retire() -> None:
    _sync_native_counts(clear=True)
    for plan in _state.plans.values():
        if plan.calls:
            _state.retired[(plan.source, plan.label)] += plan.calls
    _state.plans.clear()


def clear_plans() -> None:
    """Forget every plan (after tuning elsewhere, a new Selector, a new cache)."""
    with _state.lock:
        _retire()


# --- installing ---------------------------------------------------------------------------


def install() -> None:
    """Register the kernel at the CPU and CUDA keys (idempotent); :func:`uninstall` undoes it.

    Where the native build serves a key (:data:`NATIVE_KEYS`), its kernel is registered
    there instead, with this one behind it.
    """
    with _state.lock:
        if _state.library is not None:
            return
        _state.env_mode = _config.env_mode()
        native_keys = _native_keys()
        library = torch.library.Library("aten", "IMPL")
        try:
            with warnings.catch_warnings():
                # PyTorch warns that a kernel is overridden: that is the point here.
                warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
                for key in DISPATCH_KEYS:
                    if key not in native_keys:
                        library.impl("_scaled_mm", _scaled_mm, key)
                if native_keys:
                    native.install_scaled(native_keys, _state.env_mode, _config.overrides(), _scaled_mm)
        except Exception:
            library._destroy()
            raise
        _state.library = library
        _state.native_keys = native_keys
        if native_keys:
            _config.on_overrides(_native_overrides)


def _native_keys() -> tuple[str, ...]:
    """The keys the native kernel takes: those of :data:`NATIVE_KEYS` that the native
    build serves (routing.py warns once when it does not build)."""
    keys = tuple(key for key in native.wanted_keys() if key in NATIVE_KEYS)
    if not keys or not native.load("CUDA" in keys):
        return ()
    return keys


def _native_overrides(count: int) -> None:
    native.configure(_state.env_mode, count)


def uninstall() -> None:
    with _state.lock:
        if _state.native_keys:
            native.uninstall_scaled()
            _config.on_overrides(_native_overrides, remove=True)
        if _state.library is not None:
            _state.library._destroy()
            _state.library = None
        _retire()
        _state.native_keys = ()


# --- what happened ------------------------------------------------------------------------


def stats() -> dict[str, Any]:
    """Calls of ``torch._scaled_mm`` seen since the last :func:`reset_stats`.

    ``routed`` (unimatmul decided: a kernel or Default), ``kernel`` (a backend's kernel
    ran), ``default``, ``passthrough`` (not a scaled GEMM unimatmul describes), and
    ``by_label`` / ``by_source`` as in :func:`unimatmul.torch.routing.stats`; ``confirm``:
    confirmation windows ``open`` now, and those ``confirmed``, ``reverted`` or ``unjudged``
    since the last reset.
    """
    with _state.lock:
        _sync_native_counts()
        counts: Counter[tuple[str, str]] = Counter(_state.retired)
        for plan in _state.plans.values():
            if plan.calls:
                counts[(plan.source, plan.label)] += plan.calls
        open_windows = sum(1 for plan in _state.plans.values() if plan.confirmation is not None)
        verdicts = dict(_state.verdicts)
    out: dict[str, Any] = {
        "routed": 0,
        "kernel": 0,
        "default": 0,
        "passthrough": 0,
        "by_label": {},
        "by_source": {},
        "confirm": {"open": open_windows, "confirmed": 0, "reverted": 0, "unjudged": 0, **verdicts},
    }
    for (source, label), calls in counts.items():
        routed = source != "passthrough"
        kind = "passthrough" if not routed else ("default" if label.endswith("[default]") else "kernel")
        out[kind] += calls
        if routed:
            out["routed"] += calls
            out["by_label"][label] = out["by_label"].get(label, 0) + calls
        out["by_source"][source] = out["by_source"].get(source, 0) + calls
    return out


def reset_stats() -> None:
    with _state.lock:
        _sync_native_counts()
        _state.retired.clear()
        _state.verdicts.clear()
        for plan in _state.plans.values():
            plan.calls = 0


def plans() -> list[ScaledPlan]:
    """The live plans (for inspection and tests)."""
    with _state.lock:
        _sync_native_counts()
        return list(_state.plans.values())
