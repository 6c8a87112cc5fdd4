"""Routing ``aten::_grouped_mm`` (mixture-of-experts' experts) through unimatmul.

Hugging Face transformers 5 runs the experts of MoE models through
``torch.nn.functional.grouped_mm`` / ``torch._grouped_mm`` (``experts_implementation``
"grouped_mm", its default); both reach ``aten::_grouped_mm``. The kernel here is
registered at the ``ADInplaceOrView`` dispatch key: below autograd, which records the
op and its backward (whose products, ``grad @ b^T`` and ``a^T @ grad`` with ``offs`` over
K, are ``_grouped_mm`` calls too, so they are routed as well), and above the backend's
own kernel (torch's grouped GEMM on CUDA, its composite loop on the CPU), which it
reaches by redispatching below itself for every call it passes through: routing cannot
recurse. Runners run under ``AutoDispatchBelowADInplaceOrView`` (what their torch calls
compute is not recorded, and never comes back here).

Like the other routed products it keeps one plan per operand key (shapes, strides,
dtypes, devices and alignment of ``a``, ``b``, ``offs`` and ``bias``, the output dtype, the
mode; ``offs``' values are never read: a serving process's token distribution changes
every call, and the Problem buckets it, ``docs/grouped.md``) in a
:class:`~unimatmul.calls.CallTable`.

Where the native (C++) kernels build (``native.py``), the native ``_grouped_mm`` kernel
takes this key instead, for the devices it serves, and this Python kernel serves behind
it (the ``unimatmul_native::slow_grouped_mm`` op) the keys it does not know yet, the calls
of other devices and every call with a bias: once a plan is resolved here, the key's
entry goes into the native GROUPED table (PyTorch's kernel, a grouped kernel's launch, or
this kernel), so the cached call costs no Python host time.

Tensors that are not plain (fake and functional tensors, subclasses and modes with
``__torch_dispatch__``: what ``torch.compile``, ``make_fx`` and ``torch.export`` trace with)
pass through untouched: their keys are below this one, and tracing must see the aten op.
Under Inductor, ``compiled.py`` rewrites the graph's ``_grouped_mm`` nodes into
``unimatmul::grouped_mm``, which calls this door through :func:`call` at run time.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.autograd.profiler as _profiler

from unimatmul.calls import PASSING, Plan, decide_into, routed_decision
from unimatmul.core import modes as _config
from unimatmul.core._backend import DEFAULT, Target
from unimatmul.core.arrays import adapter_for_kind, adapter_of, hold_for_graphs
from unimatmul.core.grouped import call_lending, grouped_problem_of, grouped_shapes, serve_default
from unimatmul.core.problem import EmptyProduct
from unimatmul.torch import hf_decode, native
from unimatmul.torch.router import Router
from unimatmul.tuning.confirm import clock_for
from unimatmul.tuning.selector import Decision

DISPATCH_KEY = "ADInplaceOrView"
MAX_PLANS = 4096
DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}  # what this door serves
DEVICES = ("cpu", "cuda")  # device types it serves (CUDA also serves ROCm builds)
_OP = torch.ops.aten._grouped_mm.default
_BELOW = torch._C._after_ADInplaceOrView_keyset
_Below = torch._C._AutoDispatchBelowADInplaceOrView
# Keys of tensors and modes that trace or wrap (fake, functional, __torch_dispatch__):
# below this key, so the door sees them first and passes them through.
_PYTHON, _FUNCTIONAL = torch._C.DispatchKey.Python, torch._C.DispatchKey.Functionalize

_router = Router("grouped_mm", MAX_PLANS, native.GROUPED)
TABLE = _router.table
_plans = TABLE.plans  # read per call; emptied in place, never replaced
_mode_var = _config._mode
_signature = adapter_for_kind("torch").signature


def _grouped_mm(
    keyset: Any,
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The routed ``aten::_grouped_mm``: a plan per operand key (module docstring)."""
    mode = _mode_var.get() or _router.env_mode
    if mode == "off" or PASSING.on or keyset.has(_PYTHON) or keyset.has(_FUNCTIONAL):
        return _OP.redispatch(keyset & _BELOW, a, b, offs, bias, out_dtype)
    signature = _signature
    key = (
        mode,
        signature(a),
        signature(b),
        None if offs is None else signature(offs),
        None if bias is None else signature(bias),
        out_dtype,
    )
    plan = _plans.get(key)
    if plan is None:
        plan = _resolve(key, a, b, offs, bias, out_dtype, mode)
    plan.calls += 1
    runner: Any = plan.runner
    if runner is None:
        return _OP.redispatch(keyset & _BELOW, a, b, offs, bias, out_dtype)
    out = torch.empty(plan.out_shape, dtype=plan.out_dtype, device=a.device)
    try:
        # Lent: PyTorch's kernel, where a wrapper runs it, returns its own output instead.
        with _Below():
            if _profiler._is_profiler_enabled:
                with torch.profiler.record_function(plan.label):
                    out = call_lending(runner, a, b, out, offs)
            else:
                out = call_lending(runner, a, b, out, offs)
        if plan.capturing():
            hold_for_graphs(runner)  # a graph now holds its buffers: never freed
    except Exception as exc:

        def put(plan: Plan) -> None:  # the native entry too: PyTorch's kernel
            if _plans.get(key) is plan:
                _native_put(plan, a, b, offs, out_dtype)

        TABLE.fall_back(plan, exc, adapter_of(a), put)  # PyTorch's own kernel from now on
        return _OP.redispatch(keyset & _BELOW, a, b, offs, bias, out_dtype)
    return out


def _slow_grouped_mm(*args: Any) -> torch.Tensor:
    """This kernel behind the native one (``unimatmul_native::slow_grouped_mm``: the aten
    op's arguments, a first), which passed tracing tensors below itself already: PyTorch's
    kernel is below the door's key in the operands' own keys."""
    return _grouped_mm(torch._C._dispatch_keys(args[0]), *args)


_DOOR = torch._C.DispatchKey.ADInplaceOrView


def call(
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``torch._grouped_mm`` through this door (routed while routing is on), also where the
    calling thread excludes the door's key: a custom op's kernel (``unimatmul::grouped_mm``,
    ``compiled.py``) runs below ``ADInplaceOrView``, where the aten op would skip it."""
    excluded = torch._C._dispatch_tls_local_exclude_set()
    if not excluded.has(_DOOR):
        return _OP(a, b, offs, bias, out_dtype)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded.remove(_DOOR)):
        return _OP(a, b, offs, bias, out_dtype)


class _TorchGrouped:
    """PyTorch's own grouped GEMM in the runner convention (the Default of a window or a
    first-call check here), below this kernel: never routed again. Into the door's lent
    output it returns its own instead (``unimatmul.core.grouped.serve_default``)."""

    candidate = DEFAULT

    def __call__(self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, offs: Any) -> Any:
        with _Below():
            return serve_default(_OP(a, b, offs, None, out.dtype), out)


_TORCH: Any = _TorchGrouped()


def _resolve(
    key: tuple[Any, ...],
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype | None,
    mode: str,
) -> Plan:
    hf_decode.install(routes)  # transformers' decode switch, where transformers is imported by now
    plan = Plan("grouped_mm")
    decision = routed_decision(plan, _fill, a, b, offs, bias, out_dtype, mode)
    put = None
    if bias is None and a.device.type.upper() in _router.native_keys and _mode_var.get() is None:

        def put(plan: Plan) -> None:
            _native_put(plan, a, b, offs, out_dtype)

    return TABLE.insert(key, plan, decision, put)


def _native_put(
    plan: Plan, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None, out_dtype: torch.dtype | None
) -> None:
    """Give the native kernel this key's entry (it calls this module's kernel for keys it
    lacks); a choice in its confirmation window as :func:`native.put_plan` says.
    ``out_dtype``: the call's (None where it gave none), part of the key."""
    try:
        native.put_plan(native.GROUPED, plan, _router.kept, a, b, offs, out_dtype)
    except Exception as exc:
        plan.reason = plan.reason or f"native table: {type(exc).__name__}: {exc}"


def _fill(
    plan: Plan,
    a: torch.Tensor,
    b: torch.Tensor,
    offs: torch.Tensor | None,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype | None,
    mode: str,
) -> Decision | None:
    """Describe the call in ``plan`` and decide; None where routing does not take it
    (``plan.reason`` says why: PyTorch's kernel runs it, or raises its own error)."""
    if bias is not None:
        plan.reason = "a bias (torch's own kernel takes or refuses it)"
        return None
    if a.dtype not in DTYPES or a.device.type not in DEVICES or a.device != b.device:
        plan.reason = f"dtype {a.dtype} on {a.device}"
        return None
    adapter = adapter_of(a)
    try:
        problem = grouped_problem_of(adapter, a, b, offs, out_dtype=out_dtype)
    except (TypeError, ValueError, RuntimeError, EmptyProduct) as exc:
        # What torch refuses (its kernel raises its own error), or nothing to compute.
        plan.reason = str(exc) or type(exc).__name__
        return None
    target = Target(adapter, adapter.device(a))
    groups = adapter.shape(offs)[0] if offs is not None else 0
    plan.problem, plan.target = problem, target
    plan.out_shape = tuple(grouped_shapes(adapter.shape(a), adapter.shape(b), groups)[1])
    plan.out_dtype = out_dtype if out_dtype is not None else a.dtype
    if target.device.kind != "cpu":
        plan.capturing = clock_for(target, 0).capturing
    return decide_into(plan, problem, target, mode, _TORCH)


def routes(device: Any, dtype: Any) -> bool:
    """Whether a call on ``device`` in ``dtype`` comes to this door now: installed, the
    mode not ``off``, a device and dtype it serves (what ``_fill`` turns away otherwise)."""
    if _router.library is None or (_mode_var.get() or _router.env_mode) == "off":
        return False
    return getattr(device, "type", None) in DEVICES and dtype in DTYPES


def clear_plans() -> None:
    """Forget every plan (after tuning elsewhere, a new Selector, a new cache)."""
    TABLE.clear()


def install() -> None:
    """Register the kernel at the ADInplaceOrView key (idempotent); :func:`uninstall` undoes it.

    Where the native build serves a device (``native.wanted_keys``), the native kernel is
    registered there instead, with this one behind it.
    """

    def register(library: Any, native_keys: tuple[str, ...]) -> None:
        if not native_keys:
            library.impl("_grouped_mm", _grouped_mm, DISPATCH_KEY, with_keyset=True)

    _router.install(register, _native_keys, _native_install)
    hf_decode.install(routes)


def _native_install(keys: tuple[str, ...], mode: str, overrides: int) -> None:
    native.install_door("grouped", keys, mode, overrides, _slow_grouped_mm)


def _native_keys() -> tuple[str, ...]:
    """The devices (as their dispatch keys) the native kernel serves: those the native
    build serves (routing.py warns once when it does not build)."""
    return _router.load_native(_native_install)


def uninstall() -> None:
    _router.uninstall(lambda: native.uninstall_door("grouped"))
    hf_decode.uninstall()


def stats() -> dict[str, Any]:
    """Calls of ``aten::_grouped_mm`` seen since the last :func:`reset_stats`, in the call
    table's shape (:meth:`unimatmul.calls.CallTable.stats`)."""
    return TABLE.stats()


def reset_stats() -> None:
    TABLE.reset_stats()


def plans() -> list[Plan]:
    """The live plans (for inspection and tests)."""
    return TABLE.live()
