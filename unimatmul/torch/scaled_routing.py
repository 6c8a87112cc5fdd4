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
candidate (``core/runners.py``, the same call). While the Selector decides or tunes, the
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

from typing import Any

import torch
import torch.autograd.profiler as _profiler

from unimatmul.calls import PASSING, Plan, decide_into, routed_decision
from unimatmul.core import modes as _config
from unimatmul.core._backend import Target
from unimatmul.core.arrays import adapter_for_kind, adapter_of, hold_for_graphs
from unimatmul.core.runners import torch_has_block_scaled
from unimatmul.core.scales import scaled_problem_of
from unimatmul.torch import native
from unimatmul.torch.router import Router
from unimatmul.tuning.selector import Decision

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


_router = Router("scaled_mm", MAX_PLANS, native.SCALED)
TABLE = _router.table
_plans = TABLE.plans  # read per call; emptied in place, never replaced
_mode_var = _config._mode  # the context variable behind unimatmul.mode(): read per call
_signature = adapter_for_kind("torch").signature  # shape, strides, dtype, device, alignment


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
    mode = _mode_var.get() or _router.env_mode
    if mode == "off" or PASSING.on:
        return _passthrough(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
    signature = _signature  # the adapter's: this Python kernel serves what the native one does not know
    key = (
        mode,
        signature(a),
        signature(b),
        signature(scale_a),
        signature(scale_b),
        None if bias is None else signature(bias),
        scale_result is None,
        out_dtype,
        use_fast_accum,
    )
    plan = _plans.get(key)
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

        def put(plan: Plan) -> None:  # the native entry too: PyTorch's kernel
            if _plans.get(key) is plan:
                _native_put(plan, a, b, scale_a, scale_b, bias, use_fast_accum)

        TABLE.fall_back(plan, exc, adapter_of(a), put)  # PyTorch's own kernel from now on
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
) -> Plan:
    plan = Plan("scaled_mm")
    decision = routed_decision(
        plan, _fill, a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum, mode
    )
    put = None
    if scale_result is None and a.device.type.upper() in _router.native_keys and _mode_var.get() is None:

        def put(plan: Plan) -> None:
            _native_put(plan, a, b, scale_a, scale_b, bias, use_fast_accum)

    return TABLE.insert(key, plan, decision, put)


def _native_put(
    plan: Plan,
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    use_fast_accum: bool,
) -> None:
    """Give the native kernel this key's entry (it calls this module's kernel for keys it lacks).

    A choice in its confirmation window: the entry runs the window itself when it can make
    the kernel's call (the plan then holds the bare kernel, for calls that still come
    through Python); else the entry sends calls here, where the plan's window runs.
    """
    try:
        native.put_plan(
            native.SCALED, plan, _router.kept, a, b, scale_a, scale_b, bias, fast_accum=use_fast_accum
        )
    except Exception as exc:
        plan.reason = plan.reason or f"native table: {type(exc).__name__}: {exc}"


def _fill(
    plan: Plan,
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    scale_result: torch.Tensor | None,
    out_dtype: torch.dtype | None,
    use_fast_accum: bool,
    mode: str,
) -> Decision | None:
    """Describe the call in ``plan`` and decide; None where routing does not take it
    (``plan.reason`` says why)."""
    plan.out_dtype = out_dtype  # part of the native entry's key, whatever routing decides
    if out_dtype not in _OUT_DTYPES:
        plan.reason = f"output dtype {out_dtype or a.dtype} (unimatmul writes bf16, f16 or f32)"
        return None
    if scale_result is not None:
        plan.reason = "scale_result given"
        return None
    if a.device.type not in _DEVICES or a.device != b.device:
        plan.reason = f"devices {a.device} and {b.device}"
        return None
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
        return None
    target = Target(adapter, adapter.device(a))
    if problem.is_block_scaled and not torch_has_block_scaled(adapter, target.device):
        # Nothing to measure against: PyTorch's kernel raises its own error, as unrouted.
        plan.reason = f"torch has no block-scaled product on {target.device}"
        return None
    plan.problem, plan.target = problem, target
    plan.out_shape = (problem.m, problem.n)
    plan.out_dtype = out_dtype
    # A window's Default is torch._scaled_mm's out= form (core/runners.py), which this
    # kernel never takes over: no recursion.
    decision = decide_into(plan, problem, target, mode)
    return decision


def clear_plans() -> None:
    """Forget every plan (after tuning elsewhere, a new Selector, a new cache)."""
    TABLE.clear()


# --- installing ---------------------------------------------------------------------------


def install() -> None:
    """Register the kernel at the CPU and CUDA keys (idempotent); :func:`uninstall` undoes it.

    Where the native build serves a key (:data:`NATIVE_KEYS`), its kernel is registered
    there instead, with this one behind it.
    """

    def register(library: Any, native_keys: tuple[str, ...]) -> None:
        for key in DISPATCH_KEYS:
            if key not in native_keys:
                library.impl("_scaled_mm", _scaled_mm, key)

    _router.install(register, _native_keys, _native_install)


def _native_install(keys: tuple[str, ...], mode: str, overrides: int) -> None:
    native.install_door("scaled", keys, mode, overrides, _scaled_mm)


def _native_keys() -> tuple[str, ...]:
    """The keys the native kernel takes: those of :data:`NATIVE_KEYS` that the native
    build serves (routing.py warns once when it does not build)."""
    return _router.load_native(_native_install, NATIVE_KEYS)


def uninstall() -> None:
    _router.uninstall(lambda: native.uninstall_door("scaled"))


# --- what happened ------------------------------------------------------------------------


def stats() -> dict[str, Any]:
    """Calls of ``torch._scaled_mm`` seen since the last :func:`reset_stats`, in the call
    table's shape (:meth:`unimatmul.calls.CallTable.stats`): ``passthrough`` counts calls
    that are not a scaled GEMM unimatmul describes."""
    return TABLE.stats()


def reset_stats() -> None:
    TABLE.reset_stats()


def plans() -> list[Plan]:
    """The live plans (for inspection and tests)."""
    return TABLE.live()
