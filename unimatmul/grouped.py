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

from collections.abc import Callable
from typing import Any

from unimatmul.cache.lru import LRU, lru_size
from unimatmul.core._backend import DEFAULT, Runner, Target
from unimatmul.core.arrays import ArrayAdapter, adapter_of, hold_for_graphs
from unimatmul.core.grouped import default_failed, grouped_problem_of, grouped_shapes
from unimatmul.core.modes import get_mode
from unimatmul.core.overlap import OutGuard, run_overlapping
from unimatmul.core.problem import EmptyProduct, Problem
from unimatmul.core.runners import default_runner
from unimatmul.tuning.confirm import clock_for
from unimatmul.tuning.selector import get_selector, on_forget
from unimatmul.tuning.trust import CheckingRunner

# signature -> (runner, Problem, output allocator, whether the stream is being captured,
# and with an out=: whether a call's out overlaps its inputs); bounded like the API's map.
_Found = tuple[Runner, Problem, Callable[[], Any], Callable[[], bool], Callable[..., bool] | None]
_fast: LRU[tuple[Any, ...], _Found] = LRU(lru_size(8192))
on_forget(_fast.clear)


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
    signature = adapter.signature
    mode = get_mode()
    try:
        sig = (
            mode,
            adapter.kind,
            signature(a),
            signature(b),
            None if offs is None else signature(offs),
            None if bias is None else signature(bias),
            None if out is None else signature(out),
            out_dtype,
        )
    except AttributeError:
        # An operand that is no tensor at all: the full check says which one.
        grouped_problem_of(adapter, a, b, offs, bias=bias, out_dtype=out_dtype, out=out)
        raise
    found = _fast.peek(sig)
    if found is None:
        try:
            found = _resolve(adapter, a, b, offs, bias, out_dtype, out, mode)
        except EmptyProduct:
            return _torch_own(adapter, a, b, offs, out)  # no kernel to choose: torch's result
        _fast.put(sig, found)
        if isinstance(found[0], CheckingRunner):  # its first call checks it; then what it settles on
            found[0].on_final.append(lambda final: _fast.put(sig, (final, *found[1:])))
    runner = found[0]
    if out is None:
        if runner.candidate is DEFAULT:
            return _torch_own(adapter, a, b, offs, None)  # torch's own output: no copy of it
        out = found[2]()
    elif found[4](out, a, b, offs):  # type: ignore[misc]
        own: Any = default_runner(found[1], adapter)

        def call(dst: Any) -> None:
            own(a, b, dst, 1.0, 0.0, None, offs)

        return run_overlapping(adapter, out, call, call, found[2])
    grouped: Any = runner  # a grouped runner takes offs last (core/grouped.py)
    try:
        grouped(a, b, out, 1.0, 0.0, None, offs)
        if found[3]():
            hold_for_graphs(runner)  # a graph now holds its buffers: never evicted with its signature
    except Exception as exc:
        if runner.candidate == DEFAULT:
            if type(exc) is RuntimeError:  # not its subclasses (out of memory, ...): those are torch's
                raise default_failed(exc, adapter.device(a)) from exc
            raise
        default: Any = get_selector().fall_back(found[1], runner.candidate, exc, adapter)
        _fast.put(sig, (default, *found[1:]))
        default(a, b, out, 1.0, 0.0, None, offs)
    return out


def _torch_own(adapter: ArrayAdapter, a: Any, b: Any, offs: Any, out: Any) -> Any:
    result = adapter.torch._grouped_mm(a, b, offs)  # type: ignore[attr-defined]
    if out is None:
        return result
    out.copy_(result)
    return out


def _resolve(
    adapter: ArrayAdapter, a: Any, b: Any, offs: Any, bias: Any, out_dtype: Any, out: Any, mode: str
) -> _Found:
    problem = grouped_problem_of(adapter, a, b, offs, bias=bias, out_dtype=out_dtype, out=out)
    device = adapter.device(a)
    target = Target(adapter, device)
    groups = adapter.shape(offs)[0] if offs is not None else 0
    _, out_shape = grouped_shapes(adapter.shape(a), adapter.shape(b), groups)
    allocate = adapter.allocator(out_shape, problem.dtype_c, device)
    if mode in ("tune", "record"):
        # These modes write: a call whose Default fails must fail before anything is tuned
        # or recorded for it (as unimatmul.matmul's first calls do).
        try:
            _torch_own(adapter, a, b, offs, None)
        except RuntimeError as exc:
            if type(exc) is not RuntimeError:
                raise
            raise default_failed(exc, device) from exc
    decision = get_selector().decide(problem, target, mode)
    if decision.source == "tuned":
        _fast.clear()  # signatures resolved earlier in another mode may hold Default for it
    guard = None if out is None else OutGuard(adapter, out, a, b, offs).check
    return decision.runner, problem, allocate, clock_for(target, 0).capturing, guard
