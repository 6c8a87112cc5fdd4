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

from unimatmul.cache.lru import LRU, lru_size
from unimatmul.core._backend import DEFAULT, Runner, Target
from unimatmul.core.arrays import ArrayAdapter, adapter_of, hold_for_graphs
from unimatmul.core.modes import get_mode
from unimatmul.core.overlap import OutGuard, run_overlapping
from unimatmul.core.problem import EmptyProduct, Problem
from unimatmul.core.runners import DefaultRunner
from unimatmul.tuning.confirm import ConfirmingRunner, clock_for
from unimatmul.tuning.selector import forget_prepared, get_selector, on_forget
from unimatmul.tuning.trust import CheckingRunner

# signature -> (runner, output shape, Problem, output allocator, whether the caller's stream
# is being captured into a graph now: confirm.Clock.capturing of its target, and with an
# out=: whether a call's out overlaps its inputs: OutGuard.check). Bounded, so that a
# workload with ever-new shapes cannot grow memory without limit.
# The Problem is None for an empty product (served by Default alone).
_Found = tuple[
    Runner, tuple[int, ...], Problem | None, Callable[[], Any], Callable[[], bool], Callable[..., bool] | None
]
_fast: LRU[tuple[Any, ...], _Found] = LRU(lru_size(8192))

# The native fast path (torch tensors): the C function, and the tensor types it reads.
# Empty until a torch call finds the native kernels built.
_native_call: Callable[..., Any] | None = None
_native_types: frozenset[type] = frozenset()
_native_kept: Any = None  # native.Kept: the runners the table points into (made with the table's first entry)


def clear_fast_path() -> None:
    """Forget prepared runners, here and in every other caller of the Selector (after the
    selector, the cache or the mode changed)."""
    forget_prepared()


def _forget() -> None:
    _fast.clear()
    if _native_call is not None:
        from unimatmul.torch import native  # loaded already: this imports nothing new

        _kept(native).clear()


on_forget(_forget)


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
    if type(a) in _native_types:
        # The whole cached call in C (it checks the form and the mode itself).
        done = _native_call(a, b, out, alpha, beta, c, bias, activation)  # type: ignore[misc]
        if done is not NotImplemented:
            return done
    if alpha.__class__ is not float or beta.__class__ is not float:
        alpha, beta = _real(alpha, "alpha"), _real(beta, "beta")
    adapter = adapter_of(a)
    signature = adapter.signature
    mode = get_mode()
    try:
        sig = (
            mode,
            type(a),  # the array library, and for NumPy the array type matmul returns
            type(b),
            signature(a),
            signature(b),
            None if out is None else signature(out),
            None if bias is None else signature(bias),
            activation,
            beta == 0.0,
            c is None,
        )
    except AttributeError:
        # An operand from another array library (or not an array): Problem.from_operands() says which.
        Problem.from_operands(adapter, a, b, out=out, c=c, bias=bias, activation=activation, beta=beta)
        raise
    found = _fast.peek(sig)
    if found is None:
        found = _resolve(adapter, a, b, out, c, bias, activation, alpha, beta, mode)
        _fast.put(sig, found)
        _prepared(sig, found, adapter, a, b, out, c, bias, activation, alpha, beta, mode)
    runner = found[0]
    if out is None:
        out = found[3]()
    elif found[5](out, a, b, bias):  # type: ignore[misc]
        return _overlapping(found, adapter, a, b, out, alpha, beta, c, bias, activation)
    if c is not None and beta != 0.0:
        adapter.copy_(out, c)
    try:
        runner(a, b, out, alpha, beta, bias)
        if found[4]():
            hold_for_graphs(runner)  # a graph now holds its buffers: never evicted with its signature
    except Exception as exc:
        if runner.candidate == DEFAULT:
            raise  # the array library's own error: the caller's to see
        runner = _fall_back(sig, found, adapter, exc)
        if c is not None and beta != 0.0:
            adapter.copy_(out, c)  # the failed kernel may have written part of out
        runner(a, b, out, alpha, beta, bias)
    return out


def _overlapping(
    found: _Found,
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

    return run_overlapping(adapter, out, run, own, found[3])


def _prepared(
    sig: tuple[Any, ...],
    found: _Found,
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
) -> None:
    """After a new signature's first resolution: let a window's winner replace it here,
    and give torch tensors' plain calls an entry in the native table. A choice behind its
    first-call check (tuning/trust.py) has no native entry until it is judged; then what
    it settled on is prepared the same way."""
    runner = found[0]
    if isinstance(runner, CheckingRunner):

        def settled(final: Runner) -> None:
            now = (final, *found[1:])
            _fast.put(sig, now)
            _prepared(sig, now, adapter, a, b, out, c, bias, activation, alpha, beta, mode)

        runner.on_final.append(settled)
        return
    if isinstance(runner, ConfirmingRunner):
        runner.on_final.append(lambda final: _fast.put(sig, (final, *found[1:])))
    if (
        adapter.kind == "torch"
        and c is None
        and bias is None
        and activation is None
        and alpha == 1.0
        and beta == 0.0
        and a.dim() == b.dim()
        and (a.dim() == 2 or a.shape[0] == b.shape[0])
    ):
        try:
            _native_put(runner, found[1], a, b, out, mode)
        except Exception:  # the Python path keeps serving the signature
            pass


def _native_put(runner: Runner, out_shape: tuple[int, ...], a: Any, b: Any, out: Any, mode: str) -> None:
    """Put the signature's entry into the native API table, when the kernels are built."""
    global _native_call, _native_types
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
    entry = native.entry_for(None if runner.candidate == DEFAULT else runner)
    if entry.kind == native.PYTHON:
        return  # no entry: such calls stay on the Python path
    kept = _kept(native)
    if native.size(native.API) >= _fast.maxsize:
        kept.clear()
    ident = native.new_id()
    native.put_api(mode, a, b, out, entry.kind, ident, out_shape, entry.call, entry.confirm, entry.tie)
    if entry.window is not None:
        native.watch(ident, entry.window.confirmation.conclude)
    kept.add(ident, entry.kernel)
    _native_call = call
    _native_types = frozenset({type(a)} | set(_native_types))


def _kept(native: Any) -> Any:
    """The API table's ``native.Kept`` (one per process)."""
    global _native_kept
    if _native_kept is None:
        _native_kept = native.Kept(native.API)
    return _native_kept


def _native_wanted() -> bool:
    """Whether to look for a native build at all (not with UNIMATMUL_TORCH_NATIVE=0)."""
    from unimatmul.settings import TORCH_NATIVE

    return TORCH_NATIVE.get() != "0"


def _fall_back(sig: tuple[Any, ...], found: _Found, adapter: ArrayAdapter, exc: Exception) -> Runner:
    """Replace a kernel that failed on a call by Default (the Selector's policy): never
    crash the caller."""
    default = get_selector().fall_back(found[2], found[0].candidate, exc, adapter)
    _fast.put(sig, (default, *found[1:]))
    return default


def _resolve(
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
) -> _Found:
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
    guard = None if out is None else OutGuard(adapter, out, a, b, bias).check
    capturing = clock_for(target, 0).capturing
    if problem is None:
        return DefaultRunner(adapter, activation), out_shape, problem, allocate, capturing, guard
    decision = get_selector().decide(problem, target, mode)
    if decision.source == "tuned":
        # Signatures resolved earlier in another mode may hold Default for this problem.
        clear_fast_path()
    return decision.runner, out_shape, problem, allocate, capturing, guard


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
