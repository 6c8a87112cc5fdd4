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

from collections.abc import Callable
from typing import Any

from unimatmul.cache.lru import LRU, lru_size
from unimatmul.core._backend import DEFAULT, Runner, Target
from unimatmul.core.arrays import ArrayAdapter, adapter_of, hold_for_graphs
from unimatmul.core.modes import get_mode
from unimatmul.core.overlap import OutGuard, run_overlapping
from unimatmul.core.problem import Problem
from unimatmul.core.runners import default_failed, default_runner
from unimatmul.core.scales import scaled_problem_of
from unimatmul.tuning.confirm import clock_for
from unimatmul.tuning.selector import get_selector, on_forget
from unimatmul.tuning.trust import CheckingRunner

# signature -> (runner, Problem, output allocator, whether the stream is being captured:
# confirm.Clock.capturing of the target, and with an out=: whether a call's out overlaps
# its inputs: OutGuard.check); bounded like the API's own map.
_Found = tuple[Runner, Problem, Callable[[], Any], Callable[[], bool], Callable[..., bool] | None]
_fast: LRU[tuple[Any, ...], _Found] = LRU(lru_size(8192))
on_forget(_fast.clear)


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
    signature = adapter.signature
    mode = get_mode()
    try:
        sig = (
            mode,
            adapter.kind,
            signature(a),
            signature(b),
            signature(scale_a),
            signature(scale_b),
            None if bias is None else signature(bias),
            None if out is None else signature(out),
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
    found = _fast.peek(sig)
    if found is None:
        found = _resolve(adapter, a, b, scale_a, scale_b, out_dtype, bias, out, bool(use_fast_accum), mode)
        _fast.put(sig, found)
        if isinstance(found[0], CheckingRunner):  # its first call checks it; then what it settles on
            found[0].on_final.append(lambda final: _fast.put(sig, (final, *found[1:])))
    runner = found[0]
    if out is None:
        out = found[2]()
    elif found[4](out, a, b, bias, scale_a, scale_b):  # type: ignore[misc]
        # torch's own kernel, as torch makes the call (core/overlap.py).
        own: Any = default_runner(found[1], adapter)

        def call(dst: Any) -> None:
            own(a, b, dst, 1.0, 0.0, bias, scale_a, scale_b)

        return run_overlapping(adapter, out, call, call, found[2])
    scaled: Any = runner  # a scaled runner takes the scales last (core/scaled.py)
    try:
        scaled(a, b, out, 1.0, 0.0, bias, scale_a, scale_b)
        if found[3]():
            hold_for_graphs(runner)  # a graph now holds its buffers: never evicted with its signature
    except Exception as exc:
        if runner.candidate == DEFAULT:
            if type(exc) is RuntimeError:  # not its subclasses (out of memory, ...): those are torch's
                raise default_failed(exc, adapter.device(a)) from exc
            raise  # torch's own error: the caller's to see
        default: Any = get_selector().fall_back(found[1], runner.candidate, exc, adapter)
        _fast.put(sig, (default, *found[1:]))
        default(a, b, out, 1.0, 0.0, bias, scale_a, scale_b)
    return out


def _resolve(
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
) -> _Found:
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
    if mode in ("tune", "record"):
        # These modes write: a call whose Default fails must fail before anything is tuned
        # or recorded for it (as unimatmul.matmul's first calls do).
        default: Any = default_runner(problem, adapter)  # a scaled runner takes the scales last
        try:
            default(a, b, allocate(), 1.0, 0.0, bias, scale_a, scale_b)
        except RuntimeError as exc:
            if type(exc) is not RuntimeError:
                raise
            raise default_failed(exc, device) from exc
    decision = get_selector().decide(problem, target, mode)
    if decision.source == "tuned":
        # Signatures resolved earlier in another mode may hold Default for this problem.
        _fast.clear()
    guard = None if out is None else OutGuard(adapter, out, a, b, bias, scale_a, scale_b).check
    return decision.runner, problem, allocate, clock_for(target, 0).capturing, guard
