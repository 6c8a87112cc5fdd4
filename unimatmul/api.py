"""``unimatmul.matmul``: one call for NumPy arrays, torch tensors and CuPy arrays.

The cached call is the hot path: a signature of the operands (shapes, strides,
dtypes, devices, pointer alignment) finds a prepared Runner in a bounded map, and
the runner runs. Only a new signature builds a Problem and asks the Selector.

For torch tensors in the plain form (no ``c``, ``bias`` or ``activation``, alpha 1,
beta 0) there is a faster path still, where the native routing kernels are built
(``unimatmul.torch``: by ``enable()`` or ``python -m unimatmul.torch --build-native``;
the API never waits for a compiler itself): the signature's entry also goes into the
native library's API table, and the next calls reach it through one C function that
reads the tensors, finds the entry and runs it (cuBLASLt, oneDNN or PyTorch's own
kernel) without the interpreter on the way, in less host time than ``torch.matmul``.

A tuned choice starts in a confirmation window (:mod:`unimatmul.tuning.confirm`): its
first calls alternate it with Default; the winner then replaces it here.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

from unimatmul.cache.lru import lru_size
from unimatmul.calls import PASSING, CallTable, Plan, decide_into
from unimatmul.core._backend import DEFAULT, Target
from unimatmul.core.arrays import BY_TYPE, ArrayAdapter, adapter_of, hold_for_graphs
from unimatmul.core.modes import _mode as _mode_var
from unimatmul.core.modes import env_mode
from unimatmul.core.overlap import OutGuard, run_overlapping
from unimatmul.core.problem import EmptyProduct, Problem
from unimatmul.core.runners import DefaultRunner
from unimatmul.tuning.confirm import clock_for
from unimatmul.tuning.selector import forget_prepared


class _Door:
    """The API's call table, and the native fast path for torch tensors: the C function
    and the tensor types it reads (empty until a torch call finds the native kernels built)."""

    def __init__(self) -> None:
        self.table = CallTable("matmul", lru_size(8192))
        self.native_call: Callable[..., Any] | None = None
        self.native_types: frozenset[type] = frozenset()


_door = _Door()
TABLE = _door.table


def clear_fast_path() -> None:
    """Forget prepared runners, here and in every other door (after the selector, the
    cache or the mode changed)."""
    forget_prepared()


def matmul(
    a: Any,
    b: Any,
    *,
    out: Any = None,
    alpha: float = 1.0,
    beta: float = 0.0,
    c: Any = None,
    bias: Any = None,
    activation: str | None = None,
) -> Any:
    """``out = activation(alpha * a @ b + beta * c + bias)`` with a measured kernel.

    ``a`` is ``[m, k]`` or ``[batch, m, k]``, ``b`` is ``[k, n]`` or ``[batch, k, n]``
    (a 2-D operand is broadcast over the batch); transposed views are taken as they
    are, without copies. ``c`` defaults to ``out`` when ``beta != 0``. ``bias`` has
    shape ``[n]``; ``activation`` is ``relu``, ``gelu`` or ``gelu_tanh``. Returns
    ``out`` (allocated when not given).

    How a kernel is chosen depends on the mode (``UNIMATMUL_MODE`` or
    :func:`unimatmul.mode`): ``off`` always uses what the array library itself would,
    ``cached`` uses tuned answers, ``tune`` tunes unknown problems on first call.
    """
    door = _door
    if type(a) in door.native_types:
        # The whole cached call in C (it checks the form and the mode itself).
        done = door.native_call(a, b, out, alpha, beta, c, bias, activation)  # type: ignore[misc]
        if done is not NotImplemented:
            return done
    if alpha.__class__ is not float or beta.__class__ is not float:
        alpha, beta = _real(alpha, "alpha"), _real(beta, "beta")
    try:
        adapter = BY_TYPE.get(type(a)) or adapter_of(a)
        operands = adapter.operands_key(a, b, out, bias)
    except AttributeError:
        # An operand from another array library (or not an array): Problem.from_operands() says which.
        Problem.from_operands(adapter_of(a), a, b, out=out, c=c, bias=bias, activation=activation, beta=beta)
        raise
    mode = "off" if PASSING.on else _mode_var.get() or env_mode()
    key = (mode, operands, activation, beta == 0.0, c is None)
    plan = door.table.plans.get(key)
    if plan is None:
        plan = _resolve(key, adapter, a, b, out, c, bias, activation, alpha, beta, mode)
    plan.calls += 1
    runner = plan.runner
    if out is None:
        out = plan.allocate()  # type: ignore[misc]
    elif plan.guard(out, a, b, bias):  # type: ignore[misc]
        return _overlapping(plan, adapter, a, b, out, alpha, beta, c, bias, activation)
    if c is not None and beta != 0.0:
        adapter.copy_(out, c)
    try:
        runner(a, b, out, alpha, beta, bias)
        if plan.capturing():
            hold_for_graphs(runner)  # a graph now holds its buffers: never evicted with its key
    except Exception as exc:
        if runner.candidate == DEFAULT:
            raise  # the array library's own error: the caller's to see
        runner = door.table.fall_back(
            plan, exc, adapter, _native_putter(adapter, a, b, out, c, bias, activation, alpha, beta, mode)
        )
        if c is not None and beta != 0.0:
            adapter.copy_(out, c)  # the failed kernel may have written part of out
        runner(a, b, out, alpha, beta, bias)
    return out


def _overlapping(
    plan: Plan,
    adapter: ArrayAdapter,
    a: Any,
    b: Any,
    out: Any,
    alpha: float,
    beta: float,
    c: Any,
    bias: Any,
    activation: str | None,
) -> Any:
    """A call whose ``out`` overlaps an input, made as its array library makes it
    (:mod:`unimatmul.core.overlap`): into a temporary (the same signature's kernel) and
    copied, or (torch) by the library's own kernel."""
    if beta != 0.0 and c is None:
        c = out  # out holds C: the temporary starts as a copy of it

    def run(dst: Any) -> None:
        matmul(a, b, out=dst, alpha=alpha, beta=beta, c=c, bias=bias, activation=activation)

    def own(dst: Any) -> None:
        if c is not None and beta != 0.0 and c is not dst:
            adapter.copy_(dst, c)
        DefaultRunner(adapter, activation)(a, b, dst, alpha, beta, bias)

    return run_overlapping(adapter, out, run, own, plan.allocate)  # type: ignore[arg-type]


def _native_putter(
    adapter: ArrayAdapter,
    a: Any,
    b: Any,
    out: Any,
    c: Any,
    bias: Any,
    activation: str | None,
    alpha: float,
    beta: float,
    mode: str,
) -> Callable[[Plan], None] | None:
    """For torch tensors' plain calls: what gives a plan an entry in the native API table
    (None for other calls, which the table cannot make)."""
    if not (
        adapter.kind == "torch"
        and c is None
        and bias is None
        and activation is None
        and alpha == 1.0
        and beta == 0.0
        and a.dim() == b.dim()
        and (a.dim() == 2 or a.shape[0] == b.shape[0])
    ):
        return None

    def put(plan: Plan) -> None:
        try:
            _native_put(plan, a, b, out, mode)
        except Exception:  # the Python path keeps serving the key
            pass

    return put


def _native_put(plan: Plan, a: Any, b: Any, out: Any, mode: str) -> None:
    """Put the plan's entry into the native API table, when the kernels are built."""
    if "unimatmul.torch.native" not in sys.modules and not _native_wanted():
        return
    from unimatmul.torch import native  # torch is imported already: a torch tensor is here

    gpu = bool(a.is_cuda)
    if not native.loaded() and not native.load(gpu, build=False):
        return
    if gpu and not native.has_lt():
        return  # a CPU build cannot make a GPU call
    call = native.fast_matmul()
    if call is None:
        return
    door = _door
    if door.table.native is None:
        door.table.native = native.Kept(native.API)
    if native.put_plan(native.API, plan, door.table.native, a, b, out, mode=mode):
        door.native_call = call
        door.native_types = frozenset({type(a)} | set(door.native_types))


def _native_wanted() -> bool:
    """Whether to look for a native build at all (not with UNIMATMUL_TORCH_NATIVE=0)."""
    from unimatmul.settings import TORCH_NATIVE

    return TORCH_NATIVE.get() != "0"


def _resolve(
    key: tuple[Any, ...],
    adapter: ArrayAdapter,
    a: Any,
    b: Any,
    out: Any,
    c: Any,
    bias: Any,
    activation: str | None,
    alpha: float,
    beta: float,
    mode: str,
) -> Plan:
    """The plan of a key met for the first time: describe, check, decide."""
    plan = Plan("matmul")
    problem: Problem | None
    try:
        problem, out_shape = Problem.from_operands(
            adapter, a, b, out=out, c=c, bias=bias, activation=activation, beta=beta
        )
    except EmptyProduct as empty:
        # NumPy's answer (an empty array; zeros plus any C or bias when k is 0), as the
        # array library gives it: no kernel to choose, nothing to tune or record.
        problem, out_shape = None, empty.out_shape
    _check_autograd(adapter, a=a, b=b, out=out, c=c, bias=bias)
    device = adapter.device(a)
    target = Target(adapter, device)
    allocate = adapter.allocator(out_shape, adapter.dtype(a), device)
    if adapter.kind == "numpy":
        allocate = _numpy_result(allocate, a, b)
    if mode in ("tune", "record"):
        # These modes write (the cache, the record file): a call that is going to fail
        # must fail before, so that nothing is written for it (the README promises it).
        _rehearse(adapter, a, b, out, c, bias, activation, alpha, beta, allocate)
    plan.default = plan.runner = DefaultRunner(adapter, activation)
    plan.problem, plan.target, plan.out_shape, plan.allocate = problem, target, tuple(out_shape), allocate
    if device.kind != "cpu":
        plan.capturing = clock_for(target, 0).capturing
    if out is not None:
        plan.guard = OutGuard(adapter, out, a, b, bias).check
    plan.source, plan.label = "default", "unimatmul::matmul [default]"
    decision = None
    if problem is not None:
        decision = decide_into(plan, problem, target, mode)
    put = _native_putter(adapter, a, b, out, c, bias, activation, alpha, beta, mode)
    return _door.table.insert(key, plan, decision, put)


def _numpy_result(allocate: Callable[[], Any], a: Any, b: Any) -> Callable[[], Any]:
    """The output allocator of a NumPy call: an array of the type ``numpy.matmul`` returns,
    which for ndarray subclasses is that of the operand with the highest
    ``__array_priority__`` among those that are not plain ndarrays (the first on a tie)."""
    import numpy as np

    chosen: Any = None
    for x in (a, b):
        if type(x) is not np.ndarray and (chosen is None or x.__array_priority__ > chosen.__array_priority__):
            chosen = x
    if chosen is None:
        return allocate
    kind = type(chosen)
    return lambda: allocate().view(kind)


def _real(value: Any, name: str) -> float:
    """``alpha`` or ``beta`` as a float; TypeError for what NumPy would not multiply by (a
    string, None, a complex number)."""
    if isinstance(value, (str, bytes)) or not hasattr(type(value), "__float__"):
        msg = f"matmul: {name} must be a real number, not {type(value).__name__} ({value!r})"
        raise TypeError(msg)
    return float(value)


def _check_autograd(adapter: ArrayAdapter, **operands: Any) -> None:
    """Refuse tensors that need a gradient: the kernels write ``out`` outside autograd, so
    a tuned kernel would silently cut the graph (and Default raises)."""
    torch = getattr(adapter, "torch", None)
    if torch is None or not torch.is_grad_enabled():
        return
    for name, x in operands.items():
        if x is not None and x.requires_grad:
            msg = (
                f"matmul: {name} requires grad, but unimatmul.matmul computes outside autograd; "
                f"call it under torch.no_grad(), pass {name}.detach(), or route torch's own "
                f"matmuls with unimatmul.torch.enable(), which keeps autograd"
            )
            raise ValueError(msg)


def _rehearse(
    adapter: ArrayAdapter,
    a: Any,
    b: Any,
    out: Any,
    c: Any,
    bias: Any,
    activation: str | None,
    alpha: float,
    beta: float,
    allocate: Callable[[], Any],
) -> None:
    """Make the call once with Default, as :func:`matmul` will make it, and raise what it
    raises; ``out`` is left as it was. Whatever the array library refuses (an operand it
    cannot take, an ``out`` it cannot write) fails here, before the Selector tunes or
    records. Costs one product and two copies of ``out``, on a signature's first call."""
    runner = DefaultRunner(adapter, activation)
    if out is None:
        scratch = allocate()
        if c is not None and beta != 0.0:
            adapter.copy_(scratch, c)
        runner(a, b, scratch, alpha, beta, bias)
        return
    saved = allocate()
    adapter.copy_(saved, out)
    try:
        if c is not None and beta != 0.0:
            adapter.copy_(out, c)
        runner(a, b, out, alpha, beta, bias)
    except BaseException:
        with contextlib.suppress(Exception):  # what failed may not have written, nor let us
            adapter.copy_(out, saved)
        raise
    adapter.copy_(out, saved)
