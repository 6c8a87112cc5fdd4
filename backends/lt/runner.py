"""Runners on the Lt driver: the prepared call, and the alignment (padding) candidate.

Both are shared by the cuBLASLt and hipBLASLt backends. Array access goes through
:class:`ArrayHooks`, a few fast accessors per array library (torch on CUDA or ROCm,
CuPy), so that the call itself reads three pointers and the current stream and makes
one library call.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from unimatmul.backend import Candidate, NativeCall, Problem, Target, kept_torch_buffer, operand_layouts
from unimatmul_backends.lt.driver import LtAlgo, LtPlan, function_addresses


@dataclass(frozen=True)
class ArrayHooks:
    """Fast accessors for one array library on one device."""

    ptr: Callable[[Any], int]
    stream: Callable[[], int]  # the caller's current stream on the device
    empty_strided: Callable[[tuple[int, ...], tuple[int, ...], str], Any]
    copy_: Callable[[Any, Any], None]
    zero_: Callable[[Any], None]
    device: Callable[[], contextlib.AbstractContextManager[Any]]  # make the device current


def array_hooks(target: Target) -> ArrayHooks:
    """The hooks of the target's array library (torch or CuPy) on its device."""
    index = target.device.index
    if target.array_kind == "torch":
        import torch

        tdtypes = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64}
        tdevice = torch.device("cuda", index)

        def torch_empty(shape: tuple[int, ...], strides: tuple[int, ...], dtype: str) -> Any:
            # Workspaces and padded buffers outlive the call: never from a graph tree's pool.
            return kept_torch_buffer(shape, strides, tdtypes.get(dtype, torch.uint8), tdevice)

        # The raw-stream getter costs a fraction of torch.cuda.current_stream(); on ROCm
        # torch keeps the same name for its HIP stream.
        raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw_stream is not None:
            stream: Callable[[], int] = functools.partial(raw_stream, index)
        else:  # pragma: no cover - older torch

            def stream() -> int:
                return int(torch.cuda.current_stream(index).cuda_stream)

        def torch_copy(dst: Any, src: Any) -> None:
            dst.copy_(src)

        def torch_zero(x: Any) -> None:
            x.zero_()

        return ArrayHooks(
            ptr=torch.Tensor.data_ptr,
            stream=stream,
            empty_strided=torch_empty,
            copy_=torch_copy,
            zero_=torch_zero,
            device=lambda: torch.cuda.device(index),
        )
    if target.array_kind == "cupy":
        import cupy
        import numpy as np

        npdtypes = {"f32": np.float32, "f16": np.float16, "f64": np.float64}

        def cupy_empty(shape: tuple[int, ...], strides: tuple[int, ...], dtype: str) -> Any:
            npdt = np.dtype(npdtypes.get(dtype, np.uint8))
            size = 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
            with cupy.cuda.Device(index):
                base = cupy.empty(size, dtype=npdt)
            return cupy.lib.stride_tricks.as_strided(
                base, shape=shape, strides=tuple(s * npdt.itemsize for s in strides)
            )

        def cupy_copy(dst: Any, src: Any) -> None:
            dst[...] = src

        def cupy_zero(x: Any) -> None:
            x.fill(0)

        def cupy_stream() -> int:
            return int(cupy.cuda.get_current_stream(index).ptr)

        return ArrayHooks(
            ptr=lambda x: int(x.data.ptr),
            stream=cupy_stream,
            empty_strided=cupy_empty,
            copy_=cupy_copy,
            zero_=cupy_zero,
            device=lambda: cupy.cuda.Device(index),
        )
    msg = f"the Lt runners take torch tensors or CuPy arrays, not {target.array_kind}"
    raise TypeError(msg)


class LtRunner:
    """One Lt algo on one plan: the cached call of the hot path.

    Everything is built here, once: the plan's descriptors, the algo struct, the
    workspace (exactly what the algo needs) and the host scalars alpha and beta. A call
    writes the scalars, reads the pointers and the current stream and makes one library
    call: no allocation, no synchronisation, no logging, so it can be captured in a
    CUDA/HIP graph. The caller's B goes in as the library's A (``layout.py``).
    """

    def __init__(self, plan: LtPlan, algo: LtAlgo, candidate: Candidate, hooks: ArrayHooks) -> None:
        self.candidate = candidate
        self.plan = plan
        self.algo = algo
        abi = plan.driver.abi
        self._algo = abi.algo_struct().from_buffer_copy(algo.data)
        self._empty = hooks.empty_strided
        self._ws_size = algo.workspace
        # One workspace per stream: a split-K algo keeps partial sums there, and calls on
        # two streams may run at the same time. The caller's first stream gets one now;
        # another stream gets its own on its first call (never again after).
        self._workspaces: dict[int, tuple[Any, int]] = {}
        self._alpha = plan.scale_ctype(1.0)
        self._beta = plan.scale_ctype(0.0)
        self._bias_ptr = -1
        self._ptr = hooks.ptr
        self._stream = hooks.stream
        # The library reads alpha and beta from host memory during the call, and the call
        # releases the GIL: one thread writes the scalars and calls at a time.
        self._lock = threading.Lock()
        self._matmul, self._handle, self._desc = plan.call_prefix()
        self._alpha_ptr = ctypes.addressof(self._alpha)
        self._beta_ptr = ctypes.addressof(self._beta)
        self._algo_ptr = ctypes.addressof(self._algo)
        self._native_plan: LtPlan | None = None
        self._workspace(self._stream())

    def _workspace(self, stream: int) -> int:
        found = self._workspaces.get(stream)
        if found is None:
            if not self._ws_size:
                found = (None, 0)
            else:
                buf = self._empty((max(self._ws_size, 256),), (1,), "u8")
                found = (buf, self._ptr(buf))
            self._workspaces[stream] = found
        return found[1]

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        ptr = self._ptr
        stream = self._stream()
        found = self._workspaces.get(stream)
        ws_ptr = found[1] if found is not None else self._workspace(stream)
        plan = self.plan
        d = ptr(out)
        a_ptr, b_ptr = ptr(a), ptr(b)
        bias_ptr = ptr(bias) if bias is not None else -1
        with self._lock:
            self._alpha.value = alpha
            self._beta.value = beta
            if bias_ptr != -1 and bias_ptr != self._bias_ptr:
                # The bias address lives in the descriptor: set only when it changes.
                plan.set_bias(bias_ptr)
                self._bias_ptr = bias_ptr
            self._matmul(
                self._handle,
                self._desc,
                self._alpha_ptr,
                b_ptr,
                plan.adesc,
                a_ptr,
                plan.bdesc,
                self._beta_ptr,
                d,
                plan.cdesc,
                d,
                plan.cdesc,
                self._algo_ptr,
                ws_ptr,
                self._ws_size,
                stream,
            )

    def native_call(self) -> NativeCall | None:
        """What a native caller needs to make this runner's call itself, on the current stream.

        The words (all ints): the library's matmul and descriptor set-attribute function
        addresses, the bias-pointer attribute id, the handle, a matmul descriptor and the
        three layouts, the workspace for the current stream and its size, that stream, the
        byte size of alpha and beta, then the algo struct as little-endian 8-byte words.
        The descriptor is a copy of this runner's, made once and kept with it, because the
        bias address lives in it and the native caller sets it under its own lock. None
        when the library's function addresses are unknown.
        """
        plan = self.plan
        driver = plan.driver
        addresses = function_addresses(driver.lib, driver.abi, ("Matmul", "MatmulDescSetAttribute"))
        if addresses is None:
            return None
        with self._lock:
            if self._native_plan is None:
                self._native_plan = driver.plan(plan.gemm, plan.workspace_limit)
        native = self._native_plan
        try:
            bias_attr = driver.abi.desc_attr("BIAS_POINTER")[0]
        except KeyError:
            bias_attr = -1
        stream = self._stream()
        workspace = self._workspace(stream)
        raw = bytes(self._algo)
        raw += bytes(-len(raw) % 8)
        words = [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, len(raw), 8)]
        return NativeCall(
            "lt",
            [
                *addresses,
                bias_attr,
                driver.handle,
                native.desc,
                native.adesc,
                native.bdesc,
                native.cdesc,
                workspace,
                self._ws_size,
                stream,
                ctypes.sizeof(plan.scale_ctype),
                *words,
            ],
        )

    def close(self) -> None:
        if self._native_plan is not None:
            self._native_plan.close()
        self.plan.close()


class ScaledLtRunner(LtRunner):
    """An Lt algo on the plan of a scaled (fp8) GEMM: ``LtRunner`` plus the scales.

    Called as ``runner(a, b, out, alpha, beta, bias, scale_a, scale_b)`` (the scaled
    runner's form, ``unimatmul.core.scales``). The scale addresses live in the
    descriptor, like the bias address: they are set when they change (an activation's
    scale is often a fresh tensor per call; setting them costs a descriptor write, no
    allocation, so the call can still be captured in a graph). The library's A is the
    caller's B, so its A scale is ``scale_b``. C is never read (beta is 0); on cuBLASLt
    its pointer is the library's A, as torch passes it (torch: "cuBLAS can't use
    nullptr or result_ptr" there), on hipBLASLt the output, as torch passes it there.
    """

    def __init__(self, plan: LtPlan, algo: LtAlgo, candidate: Candidate, hooks: ArrayHooks) -> None:
        super().__init__(plan, algo, candidate, hooks)
        self._scale_ptrs = (-1, -1)
        self._c_is_d = plan.driver.abi.name != "cublaslt"

    def __call__(
        self,
        a: Any,
        b: Any,
        out: Any,
        alpha: float = 1.0,
        beta: float = 0.0,
        bias: Any = None,
        scale_a: Any = None,
        scale_b: Any = None,
    ) -> None:
        ptr = self._ptr
        stream = self._stream()
        found = self._workspaces.get(stream)
        ws_ptr = found[1] if found is not None else self._workspace(stream)
        plan = self.plan
        d = ptr(out)
        a_ptr, b_ptr = ptr(a), ptr(b)
        scales = (ptr(scale_b), ptr(scale_a))
        bias_ptr = ptr(bias) if bias is not None else -1
        with self._lock:
            self._alpha.value = alpha
            self._beta.value = beta
            if bias_ptr != -1 and bias_ptr != self._bias_ptr:
                plan.set_bias(bias_ptr)
                self._bias_ptr = bias_ptr
            if scales != self._scale_ptrs:
                plan.set_scales(*scales)
                self._scale_ptrs = scales
            self._matmul(
                self._handle,
                self._desc,
                self._alpha_ptr,
                b_ptr,
                plan.adesc,
                a_ptr,
                plan.bdesc,
                self._beta_ptr,
                d if self._c_is_d else b_ptr,
                plan.cdesc,
                d,
                plan.cdesc,
                self._algo_ptr,
                ws_ptr,
                self._ws_size,
                stream,
            )

    def native_call(self) -> NativeCall | None:
        """The call for a native caller, as :meth:`LtRunner.native_call` (its descriptor copy
        has this plan's scale modes), kind ``"scaled_lt"``: the words start with the
        descriptor attribute ids of the library's A and B scale pointers and whether C is D
        (hipBLASLt) rather than the library's A (cuBLASLt), then the LT words. None when
        the library's function addresses or scale-pointer attributes are unknown."""
        abi = self.plan.driver.abi
        try:
            scale_attrs = (abi.desc_attr("A_SCALE_POINTER")[0], abi.desc_attr("B_SCALE_POINTER")[0])
        except KeyError:
            return None
        inner = super().native_call()
        if inner is None:
            return None
        return NativeCall("scaled_lt", [*scale_attrs, int(self._c_is_d), *inner.words])


class PaddedRunner:
    """The alignment candidate: an Lt algo on padded, aligned copies of operands.

    The padded buffers are allocated once, laid out as ``padded`` (from
    ``layout.padded_problem``: rounded-up leading dimensions, and with ``dims`` also
    rounded-up dimensions) and zeroed once, so that a padded k adds nothing. A call
    copies the caller's inputs into the top-left corner of their buffers (and C, when
    beta != 0), runs the inner runner on the buffers, and copies the caller's part of
    the result back into ``out``: a few copy kernels on the caller's stream, paid on
    every call and measured with it.
    """

    def __init__(
        self,
        inner: LtRunner,
        problem: Problem,
        padded: Problem,
        copied: tuple[str, ...],
        candidate: Candidate,
        hooks: ArrayHooks,
    ) -> None:
        self.candidate = candidate
        self.inner = inner
        self.problem = problem
        self.padded = padded
        self._copy = hooks.copy_
        self._hooks = hooks
        self._copied = copied
        self._stream = hooks.stream
        strides_of = {"a": padded.stride_a, "b": padded.stride_b, "c": padded.stride_c}
        self._broadcast = {name: padded.batch > 1 and strides_of[name] == 0 for name in copied}
        self._a_first = self._broadcast.get("a", False)
        self._b_first = self._broadcast.get("b", False)
        # Padded buffers per stream, like the inner runner's workspace: calls on two
        # streams at once must not share them. And one thread at a time enqueues its
        # copy-in, product and copy-out: two threads on one stream would otherwise
        # interleave their copies into the same buffers.
        self._by_stream: dict[int, tuple[Any, ...]] = {}
        self._lock = threading.Lock()
        self._buffers(self._stream())

    def _buffers(self, stream: int) -> tuple[Any, ...]:
        found = self._by_stream.get(stream)
        if found is not None:
            return found
        padded, problem, hooks = self.padded, self.problem, self._hooks
        layouts = operand_layouts(padded)
        dtypes = {"a": padded.dtype_a, "b": padded.dtype_b, "c": padded.dtype_c}
        m, n, k = problem.m, problem.n, problem.k
        corner = {"a": (m, k), "b": (k, n), "c": (m, n)}
        bufs: dict[str, tuple[Any, Any]] = {}
        for name in self._copied:
            shape, strides = layouts[name]
            # A matrix broadcast over the batch (batch stride 0) is padded once.
            if self._broadcast[name]:
                shape, strides = shape[1:], strides[1:]
            buf = hooks.empty_strided(shape, strides, dtypes[name])
            hooks.zero_(buf)
            rows, cols = corner[name]
            bufs[name] = (buf, buf[..., :rows, :cols])
        found = (*bufs.get("a", (None, None)), *bufs.get("b", (None, None)), *bufs.get("c", (None, None)))
        self._by_stream[stream] = found
        return found

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        copy = self._copy
        stream = self._stream()
        bufs = self._by_stream.get(stream) or self._buffers(stream)
        a_buf, a_view, b_buf, b_view, c_buf, c_view = bufs
        with self._lock:
            if a_buf is not None:
                copy(a_view, a[0] if self._a_first and len(a.shape) == 3 else a)
                a = a_buf
            if b_buf is not None:
                copy(b_view, b[0] if self._b_first and len(b.shape) == 3 else b)
                b = b_buf
            d = out
            if c_buf is not None:
                d = c_buf
                if beta != 0.0:
                    copy(c_view, out)
            self.inner(a, b, d, alpha, beta, bias)
            if d is not out:
                copy(out, c_view)

    def native_call(self) -> NativeCall | None:
        """The inner runner's call, and this stream's padded buffers (see :class:`NativeCall`)."""
        inner = self.inner.native_call()
        if inner is None:
            return None
        with self._lock:
            buffers = self._buffers(self._stream())
        return NativeCall("lt", inner.words, tuple(buffers), (int(self._a_first), int(self._b_first)))

    def close(self) -> None:
        self.inner.close()


@contextlib.contextmanager
def no_device() -> Iterator[None]:
    """A do-nothing device context (tests with fake hooks)."""
    yield
