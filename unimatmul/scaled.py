"""``unimatmul.scaled_matmul``: fp8 matrix products with scales, on a measured kernel.

``scaled_matmul(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)`` computes what
``torch._scaled_mm`` computes, ``(scale_a * a) @ (scale_b * b) (+ bias)``, with the
kernel measured fastest for that exact problem here (``docs/fp8.md``). Like
:func:`unimatmul.matmul`, a cached call finds its prepared runner through a signature
of the operands; only a new signature builds a Problem and asks the Selector, which
keeps ``torch._scaled_mm`` (Default) unless a candidate beat it and passed the check
against the float64 product of the dequantised inputs.
"""

from __future__ import annotations

from typing import Any

from unimatmul.cache.lru import lru_size
from unimatmul.calls import CallTable, Plan, decide_into, mode_now, signatures
from unimatmul.core._backend import DEFAULT, Target
from unimatmul.core.arrays import ArrayAdapter, adapter_of, hold_for_graphs
from unimatmul.core.overlap import OutGuard, run_overlapping
from unimatmul.core.runners import default_failed, default_runner
from unimatmul.core.scales import scaled_problem_of
from unimatmul.tuning.confirm import clock_for

TABLE = CallTable("scaled_matmul", lru_size(8192))


def scaled_matmul(
    a: Any,
    b: Any,
    scale_a: Any,
    scale_b: Any,
    *,
    out_dtype: Any,
    bias: Any = None,
    out: Any = None,
    use_fast_accum: bool = False,
) -> Any:
    """``out = (scale_a * a) @ (scale_b * b) + bias`` for fp8 ``a`` ``[m, k]`` and ``b`` ``[k, n]``.

    ``scale_a`` and ``scale_b`` are float32: one value each (per-tensor), or ``[m, 1]``
    and ``[1, n]`` (row-wise, both contiguous). ``out_dtype`` is ``torch.bfloat16``,
    ``torch.float16`` or ``torch.float32``; ``bias`` (``[n]``, the output's dtype, not with
    float32) is added; ``out`` (``[m, n]``, row-major) is written in place.
    ``use_fast_accum`` allows Hopper's fast fp8 accumulation (as torch's flag: faster,
    less exact; it is part of the problem). Torch tensors only; on a CUDA device ``a``
    must be row-major and ``b`` column-major (``w.t()``), as ``torch._scaled_mm`` wants.
    Returns ``out``.
    """
    adapter = adapter_of(a)
    mode = mode_now()
    try:
        key = (
            mode,
            adapter.kind,
            signatures(adapter, a, b, scale_a, scale_b, bias, out),
            out_dtype,
            bool(use_fast_accum),
        )
    except AttributeError:
        # An operand that is no tensor at all: the full check says which one.
        scaled_problem_of(
            adapter,
            a,
            b,
            scale_a,
            scale_b,
            out_dtype=str(out_dtype),
            bias=bias,
            out=out,
            fast_accum=use_fast_accum,
        )
        raise
    plan = TABLE.plans.get(key)
    if plan is None:
        plan = _resolve(
            key, adapter, a, b, scale_a, scale_b, out_dtype, bias, out, bool(use_fast_accum), mode
        )
    plan.calls += 1
    runner: Any = plan.runner  # a scaled runner takes the scales last (core/runners.py)
    if out is None:
        if runner is plan.default:
            # Default with no out=: torch's own call, exactly as the caller would make it,
            # and the output torch allocates.
            try:
                return runner.own(a, b, scale_a, scale_b, bias, out_dtype)
            except RuntimeError as exc:
                if type(exc) is RuntimeError:  # not its subclasses (out of memory, ...): those are torch's
                    raise default_failed(exc, adapter.device(a)) from exc
                raise
        out = plan.allocate()  # type: ignore[misc]
    elif plan.guard(out, a, b, bias, scale_a, scale_b):  # type: ignore[misc]
        # torch's own kernel, as torch makes the call (core/overlap.py).
        own: Any = plan.default

        def call(dst: Any) -> None:
            own(a, b, dst, 1.0, 0.0, bias, scale_a, scale_b)

        return run_overlapping(adapter, out, call, call, plan.allocate)  # type: ignore[arg-type]
    try:
        runner(a, b, out, 1.0, 0.0, bias, scale_a, scale_b)
        if plan.capturing():
            hold_for_graphs(runner)  # a graph now holds its buffers: never evicted with its key
    except Exception as exc:
        if runner.candidate == DEFAULT:
            if type(exc) is RuntimeError:  # not its subclasses (out of memory, ...): those are torch's
                raise default_failed(exc, adapter.device(a)) from exc
            raise  # torch's own error: the caller's to see
        default: Any = TABLE.fall_back(plan, exc, adapter)
        default(a, b, out, 1.0, 0.0, bias, scale_a, scale_b)
    return out


def _resolve(
    key: tuple[Any, ...],
    adapter: ArrayAdapter,
    a: Any,
    b: Any,
    scale_a: Any,
    scale_b: Any,
    out_dtype: Any,
    bias: Any,
    out: Any,
    fast_accum: bool,
    mode: str,
) -> Plan:
    problem = scaled_problem_of(
        adapter,
        a,
        b,
        scale_a,
        scale_b,
        out_dtype=str(out_dtype),
        bias=bias,
        out=out,
        fast_accum=fast_accum,
    )
    device = adapter.device(a)
    target = Target(adapter, device)
    allocate = adapter.allocator((problem.m, problem.n), problem.dtype_c, device)
    default: Any = default_runner(problem, adapter)  # a scaled runner takes the scales last
    if mode in ("tune", "record"):
        # These modes write: a call whose Default fails must fail before anything is tuned
        # or recorded for it (as unimatmul.matmul's first calls do).
        try:
            default(a, b, allocate(), 1.0, 0.0, bias, scale_a, scale_b)
        except RuntimeError as exc:
            if type(exc) is not RuntimeError:
                raise
            raise default_failed(exc, device) from exc
    plan = Plan("scaled_matmul", runner=default, default=default, problem=problem, target=target)
    plan.out_shape, plan.allocate = (problem.m, problem.n), allocate
    if device.kind != "cpu":
        plan.capturing = clock_for(target, 0).capturing
    if out is not None:
        plan.guard = OutGuard(adapter, out, a, b, bias, scale_a, scale_b).check
    decision = decide_into(plan, problem, target, mode)
    return TABLE.insert(key, plan, decision)
