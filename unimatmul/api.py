"""``unimatmul.matmul``: one call for NumPy arrays, torch tensors and CuPy arrays.

The cached call is the hot path: a signature of the operands (shapes, strides,
dtypes, devices, pointer alignment) finds a prepared Runner in a bounded map, and
the runner runs. Only a new signature builds a Problem and asks the Selector.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unimatmul.cache.lru import LRU, lru_size
from unimatmul.core.arrays import ArrayAdapter, adapter_of, pointer_alignment
from unimatmul.core.backend import DEFAULT, DefaultRunner, Runner, Target
from unimatmul.core.modes import get_mode
from unimatmul.core.problem import ACTIVATIONS, Problem, matrix_layout

# signature -> (runner, output shape, Problem, output allocator). Bounded, so that a
# workload with ever-new shapes cannot grow memory without limit.
_Found = tuple[Runner, tuple[int, ...], Problem, Callable[[], Any]]
_fast: LRU[tuple[Any, ...], _Found] = LRU(lru_size(8192))


# Other fast paths (unimatmul.torch's routed kernels) that must forget with this one.
_clear_hooks: list[Callable[[], None]] = []


def clear_fast_path() -> None:
    """Forget prepared runners (after the selector, the cache or the mode changed)."""
    _fast.clear()
    for hook in _clear_hooks:
        hook()


def on_clear_fast_path(hook: Callable[[], None]) -> None:
    """Call ``hook`` whenever :func:`clear_fast_path` runs (once per distinct hook)."""
    if hook not in _clear_hooks:
        _clear_hooks.append(hook)


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
    adapter = adapter_of(a)
    signature = adapter.signature
    mode = get_mode()
    try:
        sig = (
            mode,
            adapter.kind,
            signature(a),
            signature(b),
            None if out is None else signature(out),
            None if bias is None else signature(bias),
            activation,
            beta == 0.0,
            c is None,
        )
    except AttributeError:
        # An operand from another array library (or not an array): describe() says which.
        describe(adapter, a, b, out=out, c=c, bias=bias, activation=activation, beta=beta)
        raise
    found = _fast.peek(sig)
    if found is None:
        found = _resolve(adapter, a, b, out, c, bias, activation, beta, mode)
        _fast.put(sig, found)
    runner = found[0]
    if out is None:
        out = found[3]()
    if c is not None and beta != 0.0:
        adapter.copy_(out, c)
    try:
        runner(a, b, out, alpha, beta, bias)
    except Exception as exc:
        if runner.candidate == DEFAULT:
            raise  # the array library's own error: the caller's to see
        runner = _fall_back(sig, found, adapter, exc)
        if c is not None and beta != 0.0:
            adapter.copy_(out, c)  # the failed kernel may have written part of out
        runner(a, b, out, alpha, beta, bias)
    return out


def _fall_back(sig: tuple[Any, ...], found: _Found, adapter: ArrayAdapter, exc: Exception) -> Runner:
    """Replace a kernel that failed on a call by Default and warn once: never crash the caller."""
    from unimatmul.tuning.selector import get_selector

    failed, out_shape, problem, allocate = found
    default = DefaultRunner(adapter, problem.activation)
    _fast.put(sig, (default, out_shape, problem, allocate))
    selector = get_selector()
    selector.stats.fallbacks += 1
    selector.warn_once(
        f"run:{problem.key}",
        f"{failed.candidate.identity} failed on {problem.shape_text} {problem.dtype_a} "
        f"({type(exc).__name__}: {exc}); using Default",
    )
    return default


def _resolve(
    adapter: ArrayAdapter,
    a: Any,
    b: Any,
    out: Any,
    c: Any,
    bias: Any,
    activation: str | None,
    beta: float,
    mode: str,
) -> _Found:
    from unimatmul.tuning.selector import get_selector

    problem, out_shape = describe(adapter, a, b, out=out, c=c, bias=bias, activation=activation, beta=beta)
    device = adapter.device(a)
    target = Target(adapter, device)
    decision = get_selector().decide(problem, target, mode)
    if decision.source == "tuned":
        # Signatures resolved earlier in another mode may hold Default for this problem.
        clear_fast_path()
    return decision.runner, out_shape, problem, adapter.allocator(out_shape, problem.dtype_c, device)


def _compute_type(adapter: ArrayAdapter, dtype: str, device_kind: str) -> str:
    if dtype == "f64":
        return "f64"
    if dtype == "f32" and adapter.kind == "torch" and device_kind != "cpu":
        import torch

        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "f32"
    return "f32"


def describe(
    adapter: ArrayAdapter,
    a: Any,
    b: Any,
    *,
    out: Any = None,
    c: Any = None,
    bias: Any = None,
    activation: str | None = None,
    beta: float = 0.0,
) -> tuple[Problem, tuple[int, ...]]:
    """The Problem for these operands and the output's shape; clear errors for bad input."""
    if adapter_of(b) is not adapter:
        msg = f"matmul: a and b must come from the same array library, got {type(a).__name__} and {type(b).__name__}"
        raise TypeError(msg)
    a_shape, b_shape = adapter.shape(a), adapter.shape(b)
    for name, shape in (("a", a_shape), ("b", b_shape)):
        if len(shape) not in (2, 3):
            msg = f"matmul: {name} must be 2-D or 3-D (batched), got a {len(shape)}-D array of shape {shape}"
            raise ValueError(msg)
    device = adapter.device(a)
    for name, x in (("b", b), ("out", out), ("c", c), ("bias", bias)):
        if x is not None:
            if adapter_of(x) is not adapter:
                msg = f"matmul: {name} is a {type(x).__name__}, but a is a {type(a).__name__}"
                raise TypeError(msg)
            if adapter.device(x) != device:
                msg = f"matmul: a is on {device} but {name} is on {adapter.device(x)}: all operands must be on one device"
                raise ValueError(msg)
    dtype = adapter.dtype(a)
    if adapter.dtype(b) != dtype:
        msg = f"matmul: a is {dtype} but b is {adapter.dtype(b)}; both operands must have one dtype"
        raise TypeError(msg)
    m, k = a_shape[-2], a_shape[-1]
    k2, n = b_shape[-2], b_shape[-1]
    if k != k2:
        msg = (
            f"matmul: mismatch in the contracted dimension: a has shape {a_shape} and b has shape "
            f"{b_shape} (size {k} is different from {k2})"
        )
        raise ValueError(msg)
    if min(m, n, k) < 1:
        msg = f"matmul: empty operands (m={m}, n={n}, k={k}) are not supported"
        raise ValueError(msg)
    batch_a = a_shape[0] if len(a_shape) == 3 else 1
    batch_b = b_shape[0] if len(b_shape) == 3 else 1
    if batch_a != batch_b and 1 not in (batch_a, batch_b):
        msg = f"matmul: batch sizes {batch_a} (a) and {batch_b} (b) differ and neither is 1"
        raise ValueError(msg)
    batch = max(batch_a, batch_b)
    batched = len(a_shape) == 3 or len(b_shape) == 3
    out_shape = (batch, m, n) if batched else (m, n)
    for name, x in (("out", out), ("c", c)):
        if x is not None:
            if adapter.shape(x) != out_shape:
                msg = f"matmul: {name} has shape {adapter.shape(x)}, expected {out_shape}"
                raise ValueError(msg)
            if adapter.dtype(x) != dtype:
                msg = f"matmul: {name} is {adapter.dtype(x)}, expected {dtype} like a and b"
                raise TypeError(msg)
    if bias is not None:
        if adapter.shape(bias) != (n,):
            msg = f"matmul: bias must have shape ({n},), got {adapter.shape(bias)}"
            raise ValueError(msg)
        if adapter.dtype(bias) != dtype:
            msg = f"matmul: bias is {adapter.dtype(bias)}, expected {dtype}"
            raise TypeError(msg)
        if n > 1 and adapter.strides(bias)[0] != 1:
            # Kernels read the bias as n consecutive values; the key has no stride for it.
            msg = f"matmul: bias must be contiguous, got stride {adapter.strides(bias)[0]}; pass a contiguous copy"
            raise ValueError(msg)
    if activation is not None and activation not in ACTIVATIONS:
        msg = f"matmul: unknown activation {activation!r}; valid: {', '.join(ACTIVATIONS)}"
        raise ValueError(msg)
    if beta != 0.0 and c is None and out is None:
        msg = "matmul: beta != 0 needs c, or out holding C"
        raise ValueError(msg)

    a_strides, b_strides = adapter.strides(a), adapter.strides(b)
    trans_a, lda = matrix_layout(a_shape, a_strides, "a")
    trans_b, ldb = matrix_layout(b_shape, b_strides, "b")
    ldc, stride_c = n, m * n
    if out is not None:
        o_strides = adapter.strides(out)
        o_trans, ldc = matrix_layout(out_shape, o_strides, "out")
        if o_trans and m > 1 and n > 1:
            msg = (
                f"matmul: out must be row-major (unit stride in its last dimension), got strides {o_strides}"
            )
            raise ValueError(msg)
        stride_c = o_strides[0] if batched else 0
    stride_a = a_strides[0] if len(a_shape) == 3 and batch_a > 1 else 0
    stride_b = b_strides[0] if len(b_shape) == 3 and batch_b > 1 else 0
    if batch == 1:
        stride_a = stride_b = stride_c = 0
    ptrs = [adapter.ptr(a), adapter.ptr(b)]
    if out is not None:
        ptrs.append(adapter.ptr(out))
    epilogue = "none"
    if bias is not None:
        epilogue = "bias" if activation is None else f"bias_{activation}"
        ptrs.append(adapter.ptr(bias))
    elif activation is not None:
        epilogue = activation
    problem = Problem(
        m=m,
        n=n,
        k=k,
        batch=batch,
        dtype_a=dtype,
        dtype_b=dtype,
        dtype_c=dtype,
        compute=_compute_type(adapter, dtype, device.kind),
        trans_a=trans_a,
        trans_b=trans_b,
        lda=lda,
        ldb=ldb,
        ldc=ldc,
        stride_a=stride_a,
        stride_b=stride_b,
        stride_c=stride_c if batch > 1 else 0,
        beta_zero=beta == 0.0,
        epilogue=epilogue,
        align=pointer_alignment(*ptrs),
    )
    return problem, out_shape
