"""``unimatmul.grouped_matmul``: grouped GEMMs (mixture-of-experts) on a measured kernel.

``grouped_matmul(a, b, offs)`` computes what ``torch._grouped_mm(a, b, offs)`` computes,
in each of its forms (``docs/grouped.md``), with the kernel measured fastest for that
problem here. Like :func:`unimatmul.scaled_matmul`, a cached call finds its prepared
runner through a signature of the operands (``offs``' values are not part of it: calls
whose token distribution differs share one runner); only a new signature builds a
Problem, whose jagged dimension is bucketed, and asks the Selector, which keeps
``torch._grouped_mm`` (Default) unless a candidate beat it and passed the check
against the float64 product of every group.
"""

from __future__ import annotations

from typing import Any

from unimatmul.cache.lru import lru_size
from unimatmul.calls import CallTable, Plan, decide_into, mode_now, signatures
from unimatmul.core._backend import DEFAULT, Target
from unimatmul.core.arrays import ArrayAdapter, adapter_of, hold_for_graphs
from unimatmul.core.grouped import call_lending, default_failed, grouped_problem_of, grouped_shapes
from unimatmul.core.overlap import OutGuard, run_overlapping
from unimatmul.core.problem import EmptyProduct
from unimatmul.core.runners import default_runner
from unimatmul.tuning.confirm import clock_for

TABLE = CallTable("grouped_matmul", lru_size(8192))


def grouped_matmul(
    a: Any,
    b: Any,
    offs: Any = None,
    *,
    bias: Any = None,
    out_dtype: Any = None,
    out: Any = None,
) -> Any:
    """One matrix product per group, as ``torch._grouped_mm(a, b, offs)``.

    ``a [M, K]`` x ``b [G, K, N]`` with ``offs`` cutting a's rows (the MoE forward);
    ``a [M, K]`` x ``b [K, N]`` with ``offs`` cutting K (the weight gradient, out
    ``[G, M, N]``); ``a [G, M, K]`` x ``b [K, N]`` with ``offs`` cutting N; ``a [G, M, K]``
    x ``b [G, K, N]`` without ``offs``. ``offs``: int32 ends of the groups. bf16, f16 or
    f32, the output of a's dtype (``out_dtype``, if given, must be it); ``bias`` is refused
    as torch refuses it. ``out`` (row-major) is written in place. Returns the output.
    """
    adapter = adapter_of(a)
    mode = mode_now()
    try:
        key = (mode, adapter.kind, signatures(adapter, a, b, offs, bias, out), out_dtype)
    except AttributeError:
        # An operand that is no tensor at all: the full check says which one.
        grouped_problem_of(adapter, a, b, offs, bias=bias, out_dtype=out_dtype, out=out)
        raise
    plan = TABLE.plans.get(key)
    if plan is None:
        try:
            plan = _resolve(key, adapter, a, b, offs, bias, out_dtype, out, mode)
        except EmptyProduct:
            return _torch_own(adapter, a, b, offs, out)  # no kernel to choose: torch's result
    plan.calls += 1
    runner: Any = plan.runner  # a grouped runner takes offs last (core/grouped.py)
    lent = out is None
    if lent:
        if runner.candidate is DEFAULT:
            return _torch_own(adapter, a, b, offs, None)  # torch's own output: no copy of it
        out = plan.allocate()  # type: ignore[misc]
    elif plan.guard(out, a, b, offs):  # type: ignore[misc]
        own: Any = plan.default

        def call(dst: Any) -> None:
            own(a, b, dst, 1.0, 0.0, None, offs)

        return run_overlapping(adapter, out, call, call, plan.allocate)  # type: ignore[arg-type]
    try:
        # Lent, Default where a wrapper runs it returns its own output instead of a copy.
        got = call_lending(runner, a, b, out, offs) if lent else runner(a, b, out, 1.0, 0.0, None, offs)
        if plan.capturing():
            hold_for_graphs(runner)  # a graph now holds its buffers: never evicted with its key
    except Exception as exc:
        if runner.candidate == DEFAULT:
            if type(exc) is RuntimeError:  # not its subclasses (out of memory, ...): those are torch's
                raise default_failed(exc, adapter.device(a)) from exc
            raise
        default: Any = TABLE.fall_back(plan, exc, adapter)
        default(a, b, out, 1.0, 0.0, None, offs)
        return out
    return got if lent else out


def _torch_own(adapter: ArrayAdapter, a: Any, b: Any, offs: Any, out: Any) -> Any:
    result = adapter.torch._grouped_mm(a, b, offs)  # type: ignore[attr-defined]
    if out is None:
        return result
    out.copy_(result)
    return out


def _resolve(
    key: tuple[Any, ...],
    adapter: ArrayAdapter,
    a: Any,
    b: Any,
    offs: Any,
    bias: Any,
    out_dtype: Any,
    out: Any,
    mode: str,
) -> Plan:
    problem = grouped_problem_of(adapter, a, b, offs, bias=bias, out_dtype=out_dtype, out=out)
    device = adapter.device(a)
    target = Target(adapter, device)
    groups = adapter.shape(offs)[0] if offs is not None else 0
    _, out_shape = grouped_shapes(adapter.shape(a), adapter.shape(b), groups)
    if mode in ("tune", "record"):
        # These modes write: a call whose Default fails must fail before anything is tuned
        # or recorded for it (as unimatmul.matmul's first calls do).
        try:
            _torch_own(adapter, a, b, offs, None)
        except RuntimeError as exc:
            if type(exc) is not RuntimeError:
                raise
            raise default_failed(exc, device) from exc
    default = default_runner(problem, adapter)
    plan = Plan("grouped_matmul", runner=default, default=default, problem=problem, target=target)
    plan.out_shape, plan.allocate = tuple(out_shape), adapter.allocator(out_shape, problem.dtype_c, device)
    if device.kind != "cpu":
        plan.capturing = clock_for(target, 0).capturing
    if out is not None:
        plan.guard = OutGuard(adapter, out, a, b, offs).check
    decision = decide_into(plan, problem, target, mode)
    return TABLE.insert(key, plan, decision)
