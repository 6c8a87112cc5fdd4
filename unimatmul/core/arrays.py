"""Array adapters: one face over NumPy arrays, torch tensors and CuPy arrays.

Dispatch is by the array's type, cached per type, and each adapter imports its
library only when an array of that library reaches it (so ``import unimatmul`` never
imports torch or cupy). Backends use adapters for pointers and devices; the harness
uses them to make operands, references and checks in the caller's own array kind.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from unimatmul.core.dtypes import ITEMSIZE, canonical
from unimatmul.core.problem import Problem


@dataclass(frozen=True)
class Device:
    """Where arrays live: ``cpu``, ``cuda`` (NVIDIA) or ``hip`` (AMD), with an index."""

    kind: str
    index: int = 0

    def __str__(self) -> str:
        return self.kind if self.kind == "cpu" else f"{self.kind}:{self.index}"


CPU = Device("cpu")


@dataclass
class Operands:
    """One set of inputs and an output laid out exactly as a Problem describes."""

    a: Any
    b: Any
    out: Any
    bias: Any = None


def host_available_bytes() -> int | None:
    """Memory the host can still give without swapping (Linux ``MemAvailable``), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


_keeper: list[Any] = []  # [the thread that makes kept buffers, whether it may allocate during a capture]
_keeper_lock = threading.Lock()


def _relax_capture_mode() -> bool:
    """Let this thread allocate while another thread captures a CUDA/HIP graph (the driver's
    relaxed capture mode for the thread, as PyTorch's allocator sets for its event queries).
    False when the driver's function cannot be had."""
    import ctypes

    import torch

    hip = bool(getattr(torch.version, "hip", None))
    try:
        library = ctypes.CDLL("libamdhip64.so" if hip else "libcuda.so.1")
        exchange = getattr(
            library, "hipThreadExchangeStreamCaptureMode" if hip else "cuThreadExchangeStreamCaptureMode"
        )
    except (OSError, AttributeError):
        return False
    mode = ctypes.c_int(2)  # CU_STREAM_CAPTURE_MODE_RELAXED = hipStreamCaptureModeRelaxed = 2
    return bool(exchange(ctypes.byref(mode)) == 0)


def kept_torch_buffer(shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any, device: Any) -> Any:
    """A torch GPU buffer that a runner keeps across calls (a workspace, padded copies).

    Made by a thread of its own (in the relaxed capture mode) and recorded for the
    caller's current stream, so that it never comes from a CUDA-graph memory pool:
    torch.compile's CUDA graph trees send every allocation of the thread that runs them
    to a private pool while they warm up and record, and refuse any buffer there that
    outlives the run ("tensors in the cudagraph pool not tracked as outputs"); a runner
    first prepared during a capture would otherwise put its workspace there. Where the
    relaxed mode cannot be set, a buffer wanted during a capture is allocated as anything
    else is (the capture's pool). ``dtype`` and ``device`` are torch's; the native routing
    kernels make theirs the same way (``kept_buffer`` in ``_native.cpp``).
    """
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return torch.empty_strided(shape, strides, dtype=dtype, device=device)
    with _keeper_lock:
        if not _keeper:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="unimatmul-kept-buffers")
            _keeper.extend([pool, pool.submit(_relax_capture_mode).result()])
    if not _keeper[1] and torch.cuda.is_current_stream_capturing():
        return torch.empty_strided(shape, strides, dtype=dtype, device=device)

    def make() -> Any:
        with torch.cuda.device(device):
            return torch.empty_strided(shape, strides, dtype=dtype, device=device)

    made = _keeper[0].submit(make).result()
    made.record_stream(torch.cuda.current_stream(device))  # freed only once this stream is done with it
    return made


# Runners a CUDA graph may still use: one of their calls ran under capture, so a graph
# holds the addresses of their kept buffers (workspaces, padded copies) and writes there at
# every replay. Nothing says when that graph is gone, so they are kept for the process's
# life, whatever forgets them otherwise (a plan retired, a signature evicted). Freed, they
# let the compiled `generate` graphs of Hugging Face models, replayed later, write split-K
# sums and padded copies into memory that by then held other tensors.
_graph_held: dict[int, Any] = {}
_graph_held_lock = threading.Lock()


def hold_for_graphs(runner: Any) -> None:
    """Keep ``runner`` (and what it owns) for the process's life: a graph captured its call."""
    with _graph_held_lock:
        _graph_held.setdefault(id(runner), runner)


def held_for_graphs() -> int:
    """How many runners are kept for CUDA graphs (``unimatmul.torch.stats()`` shows it)."""
    return len(_graph_held)


class ArrayAdapter:
    """What unimatmul needs to know about, and do with, one library's arrays."""

    kind = "abstract"

    def shape(self, x: Any) -> tuple[int, ...]:
        return tuple(x.shape)

    def strides(self, x: Any) -> tuple[int, ...]:
        raise NotImplementedError

    def dtype(self, x: Any) -> str:
        return canonical(str(x.dtype))

    def device(self, x: Any) -> Device:
        raise NotImplementedError

    def ptr(self, x: Any) -> int:
        raise NotImplementedError

    def same_library(self, x: Any) -> bool:
        """Whether ``x`` is an array of this adapter's library (TypeError if no array at all)."""
        return adapter_of(x) is self

    def compute_type(self, dtype: str, device: Device) -> str:
        """The precision the library's own matmul computes ``dtype`` in on ``device``."""
        return "f64" if dtype == "f64" else "f32"

    @staticmethod
    def signature(x: Any) -> tuple[Any, ...]:
        """What must not change between two calls for one prepared kernel to serve both:
        shape, strides, dtype, device and pointer alignment. Costs ~0.3 us: hot path."""
        raise NotImplementedError

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        raise NotImplementedError

    def allocator(self, shape: tuple[int, ...], dtype: str, device: Device) -> Callable[[], Any]:
        """A function that allocates an output of this shape: resolved once, called per call."""
        return functools.partial(self.empty, shape, dtype, device)

    def random_strided(
        self,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        dtype: str,
        device: Device,
        rng: np.random.Generator,
        offset: int = 0,
        *,
        fill: bool = True,
    ) -> Any:
        """Standard-normal values (``fill=False``: uninitialised) at the given strides."""
        raise NotImplementedError

    def strided_view(self, base: Any, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Any:
        """A view of the flat array ``base`` at ``offset`` with these strides (in elements)."""
        raise NotImplementedError

    def host_indices(self, indices: np.ndarray, device: Device) -> Any:
        """Integer indices made on the host, as this library's array on ``device``."""
        raise NotImplementedError

    def to_float64(self, x: Any) -> Any:
        """A float64 copy on the array's own device (the reference is computed there)."""
        raise NotImplementedError

    def to_numpy(self, x: Any) -> np.ndarray:
        raise NotImplementedError

    def fill_nan(self, x: Any) -> None:
        raise NotImplementedError

    def copy_(self, dst: Any, src: Any) -> None:
        raise NotImplementedError

    def matmul(
        self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, activation: str | None
    ) -> None:
        """The Default: what the caller's library itself does for this product."""
        raise NotImplementedError

    def reference(
        self, a: Any, b: Any, c: Any, alpha: float, beta: float, bias: Any, activation: str | None
    ) -> Any:
        """``alpha * a @ b + beta * c (+ bias, activation)`` in float64 on the arrays' device."""
        a64, b64 = self.to_float64(a), self.to_float64(b)
        ref = a64 @ b64
        if alpha != 1.0:
            ref = ref * alpha
        if beta != 0.0:
            ref = ref + beta * self.to_float64(c)
        if bias is not None:
            ref = ref + self.to_float64(bias)
        return self.activate64(ref, activation)

    def activate64(self, x: Any, activation: str | None) -> Any:
        raise NotImplementedError

    def rel_error(self, out: Any, ref: Any) -> float:
        """``||out - ref|| / ||ref||`` in float64; inf when out has a NaN or an inf."""
        raise NotImplementedError

    def synchronize(self, device: Device) -> None:
        """Wait for the device's queued work (a no-op on the CPU)."""

    def stream(self, device: Device) -> int:
        """The caller's current stream handle on ``device`` (0 on the CPU)."""
        return 0

    def available_bytes(self, device: Device) -> int | None:
        """Memory that arrays on ``device`` can still take (None: unknown)."""
        return host_available_bytes()

    # --- primitives of the numeric check (unimatmul.tuning.numeric_check) ---

    def block_elements(self, device: Device, *, reference: bool = False, total: int = 0) -> int:
        """Output elements per block of the check (``total``: the output's): its float64
        temporaries are a few of these, so that checking a 1 GB output never makes a
        1 GB float64 copy of it. On the host, comparisons run fastest on blocks that
        stay in the cache, and the reference's products on larger ones: up to 1/32 of a
        large output, since each BLAS call wakes a thread pool."""
        if reference:
            return min(max(1 << 20, total // 32), 1 << 23)
        return 1 << 15 if total <= SCREEN_ELEMENTS else 1 << 17

    def namespace(self) -> Any:
        """The array library's namespace for ``where``, ``isfinite`` and ``sqrt``."""
        raise NotImplementedError

    def reduce_sum(self, x: Any, axis: int) -> Any:
        return x.sum(axis=axis)

    def reduce_max(self, x: Any, axis: int) -> Any:
        """Largest element along ``axis``; NaN if there is one."""
        return x.max(axis=axis)

    def sum_squares(self, x: Any) -> Any:
        return (x * x).sum()

    def cast_like(self, x: Any, like: Any) -> Any:
        """``x`` in ``like``'s dtype (no copy if it is already)."""
        return x.astype(like.dtype, copy=False)

    def scalars(self, parts: list[Any]) -> list[float]:
        """Python floats of 0-d arrays of this library (NaN read as inf)."""
        values = [float(x) for x in parts]
        return [v if v == v else math.inf for v in values]


#: Outputs with more elements are screened before the whole bound is computed
#: (see unimatmul.tuning.numeric_check.compare).
SCREEN_ELEMENTS = 1 << 22


def _erf64(x: np.ndarray) -> np.ndarray:
    # NumPy has no erf; math.erf vectorised is exact and fast enough for references.
    return np.vectorize(math.erf, otypes=[np.float64])(x)


class NumpyAdapter(ArrayAdapter):
    kind = "numpy"

    @staticmethod
    def signature(x: Any) -> tuple[Any, ...]:
        return (x.shape, x.strides, x.dtype.num, x.__array_interface__["data"][0] & 15)

    def strides(self, x: Any) -> tuple[int, ...]:
        size = x.itemsize
        return tuple(s // size for s in x.strides)

    def device(self, x: Any) -> Device:
        return CPU

    def ptr(self, x: Any) -> int:
        return int(x.__array_interface__["data"][0])

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        return np.empty(shape, dtype=_numpy_dtype(dtype))

    def random_strided(
        self,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        dtype: str,
        device: Device,
        rng: np.random.Generator,
        offset: int = 0,
        *,
        fill: bool = True,
    ) -> Any:
        npdt = _numpy_dtype(dtype)
        size = offset + 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
        # Drawn in float32 (float64 only for float64): a float64 draw of a 1 GB float32
        # operand would need 2 GB more while it is converted.
        draw = np.float64 if npdt == np.float64 else np.float32
        if fill:
            base = rng.standard_normal(size, dtype=draw).astype(npdt, copy=False)
        else:
            base = np.empty(size, dtype=npdt)
        return np.lib.stride_tricks.as_strided(
            base[offset:], shape=shape, strides=tuple(s * npdt.itemsize for s in strides)
        )

    def strided_view(self, base: Any, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Any:
        return np.lib.stride_tricks.as_strided(
            base[offset:], shape=shape, strides=tuple(s * base.itemsize for s in strides)
        )

    def host_indices(self, indices: np.ndarray, device: Device) -> Any:
        return indices

    def to_float64(self, x: Any) -> Any:
        return np.asarray(x, dtype=np.float64)

    def to_numpy(self, x: Any) -> np.ndarray:
        return np.asarray(x)

    def fill_nan(self, x: Any) -> None:
        x[...] = np.nan

    def copy_(self, dst: Any, src: Any) -> None:
        dst[...] = src

    def matmul(
        self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, activation: str | None
    ) -> None:
        if alpha == 1.0 and beta == 0.0 and bias is None and activation is None:
            np.matmul(a, b, out=out)
            return
        result = np.matmul(a, b)
        if alpha != 1.0:
            result *= result.dtype.type(alpha)
        if beta != 0.0:
            result += result.dtype.type(beta) * out
        if bias is not None:
            result += bias
        out[...] = _activate_numpy(result, activation)

    def activate64(self, x: Any, activation: str | None) -> Any:
        return _activate_numpy(x, activation)

    def namespace(self) -> Any:
        return np

    def sum_squares(self, x: Any) -> Any:
        flat = np.ravel(x)
        return np.dot(flat, flat)

    def rel_error(self, out: Any, ref: Any) -> float:
        diff = np.asarray(out, dtype=np.float64) - ref
        num = float(np.linalg.norm(diff.ravel()))
        den = float(np.linalg.norm(np.asarray(ref).ravel()))
        if not math.isfinite(num):
            return math.inf
        return num / den if den > 0 else num


def _activate_numpy(x: np.ndarray, activation: str | None) -> np.ndarray:
    if activation is None:
        return x
    if activation == "relu":
        return np.maximum(x, 0)
    x64 = x.astype(np.float64)
    if activation == "gelu":
        y = 0.5 * x64 * (1.0 + _erf64(x64 / math.sqrt(2.0)))
    elif activation == "gelu_tanh":
        y = 0.5 * x64 * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)))
    else:
        msg = f"unknown activation {activation!r}"
        raise ValueError(msg)
    return y.astype(x.dtype)


def _numpy_dtype(dtype: str) -> np.dtype[Any]:
    try:
        return np.dtype({"f64": np.float64, "f32": np.float32, "f16": np.float16}[dtype])
    except KeyError:
        msg = f"NumPy has no {dtype} arrays; use torch tensors for {dtype}"
        raise TypeError(msg) from None


class TorchAdapter(ArrayAdapter):
    kind = "torch"

    @staticmethod
    def signature(x: Any) -> tuple[Any, ...]:
        return (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() & 15)

    def __init__(self) -> None:
        import torch  # only reached when a torch tensor is passed in

        self.torch = torch
        self._hip = bool(getattr(torch.version, "hip", None))
        self._torch_devices: dict[Device, Any] = {}
        self._dtypes = {
            "f64": torch.float64,
            "f32": torch.float32,
            "f16": torch.float16,
            "bf16": torch.bfloat16,
        }
        for name, attr in (("f8e4m3", "float8_e4m3fn"), ("f8e5m2", "float8_e5m2")):
            if hasattr(torch, attr):
                self._dtypes[name] = getattr(torch, attr)

    def strides(self, x: Any) -> tuple[int, ...]:
        return tuple(x.stride())

    def device(self, x: Any) -> Device:
        dev = x.device
        if dev.type == "cpu":
            return CPU
        if dev.type == "cuda":
            return Device("hip" if self._hip else "cuda", dev.index or 0)
        return Device(dev.type, dev.index or 0)

    def torch_device(self, device: Device) -> Any:
        # A torch.device object, made once per Device: torch parses a device string
        # on every allocation, which the cached call's output allocation would pay.
        found = self._torch_devices.get(device)
        if found is None:
            text = "cpu" if device.kind == "cpu" else f"cuda:{device.index}"
            found = self._torch_devices[device] = self.torch.device(text)
        return found

    def compute_type(self, dtype: str, device: Device) -> str:
        if dtype == "f32" and device.kind != "cpu" and self.torch.backends.cuda.matmul.allow_tf32:
            return "tf32"
        return super().compute_type(dtype, device)

    def torch_dtype(self, dtype: str) -> Any:
        try:
            return self._dtypes[dtype]
        except KeyError:
            msg = f"this torch has no {dtype} dtype"
            raise TypeError(msg) from None

    def ptr(self, x: Any) -> int:
        return int(x.data_ptr())

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        return self.torch.empty(shape, dtype=self.torch_dtype(dtype), device=self.torch_device(device))

    def allocator(self, shape: tuple[int, ...], dtype: str, device: Device) -> Callable[[], Any]:
        # torch.empty with its dtype and device objects bound: no lookups per call.
        return functools.partial(
            self.torch.empty, shape, dtype=self.torch_dtype(dtype), device=self.torch_device(device)
        )

    def random_strided(
        self,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        dtype: str,
        device: Device,
        rng: np.random.Generator,
        offset: int = 0,
        *,
        fill: bool = True,
    ) -> Any:
        torch = self.torch
        size = offset + 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
        if not fill:
            base = torch.empty(size, dtype=self.torch_dtype(dtype), device=self.torch_device(device))
            return base.as_strided(shape, strides, offset)
        gen = torch.Generator(device=self.torch_device(device))
        gen.manual_seed(int(rng.integers(0, 2**62)))
        base = torch.randn(size, generator=gen, dtype=torch.float32, device=self.torch_device(device))
        base = base.to(self.torch_dtype(dtype))
        return base.as_strided(shape, strides, offset)

    def strided_view(self, base: Any, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Any:
        return base.as_strided(shape, strides, base.storage_offset() + offset)

    def host_indices(self, indices: np.ndarray, device: Device) -> Any:
        return self.torch.from_numpy(indices).to(self.torch_device(device))

    def to_float64(self, x: Any) -> Any:
        return x.to(self.torch.float64)

    def to_numpy(self, x: Any) -> np.ndarray:
        return x.detach().to("cpu", self.torch.float64).numpy()

    def fill_nan(self, x: Any) -> None:
        x.fill_(float("nan"))

    def copy_(self, dst: Any, src: Any) -> None:
        dst.copy_(src)

    def matmul(
        self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, activation: str | None
    ) -> None:
        torch = self.torch
        if alpha == 1.0 and beta == 0.0 and bias is None:
            torch.matmul(a, b, out=out)
        elif out.dim() == 2 and beta == 0.0 and bias is not None and alpha == 1.0:
            torch.addmm(bias, a, b, out=out)
        elif out.dim() == 2:
            if beta == 0.0:
                torch.matmul(a, b, out=out)
                if alpha != 1.0:
                    out.mul_(alpha)
            else:
                out.addmm_(a, b, beta=beta, alpha=alpha)
            if bias is not None:
                out.add_(bias)
        else:
            a3 = a if a.dim() == 3 else a.expand(out.shape[0], *a.shape)
            b3 = b if b.dim() == 3 else b.expand(out.shape[0], *b.shape)
            if beta == 0.0:
                torch.bmm(a3, b3, out=out)
                if alpha != 1.0:
                    out.mul_(alpha)
            else:
                out.baddbmm_(a3, b3, beta=beta, alpha=alpha)
            if bias is not None:
                out.add_(bias)
        if activation is not None:
            self._activate_(out, activation)

    def _activate_(self, x: Any, activation: str) -> None:
        functional = self.torch.nn.functional
        if activation == "relu":
            x.relu_()
        elif activation == "gelu":
            x.copy_(functional.gelu(x))
        elif activation == "gelu_tanh":
            x.copy_(functional.gelu(x, approximate="tanh"))
        else:
            msg = f"unknown activation {activation!r}"
            raise ValueError(msg)

    def activate64(self, x: Any, activation: str | None) -> Any:
        if activation is not None:
            self._activate_(x, activation)
        return x

    def namespace(self) -> Any:
        return self.torch

    def reduce_max(self, x: Any, axis: int) -> Any:
        if axis == -1 and x.dim() > 2:
            # On the CPU, torch reduces [1, r, n] over its last dimension some 2000x slower
            # than the same [r, n] (torch 2.13): flatten the leading dimensions first.
            return x.reshape(-1, x.shape[-1]).amax(dim=-1).reshape(x.shape[:-1])
        return x.amax(dim=axis)

    def cast_like(self, x: Any, like: Any) -> Any:
        return x.to(like.dtype)

    def block_elements(self, device: Device, *, reference: bool = False, total: int = 0) -> int:
        # A GPU wants few, large launches; on the host, torch's comparisons stay below its
        # parallel grain (32768 elements): on a busy machine each parallel region waits
        # milliseconds for a descheduled thread.
        if device.kind == "cpu":
            return super().block_elements(device, reference=True, total=total) if reference else 1 << 14
        return 1 << 22

    def scalars(self, parts: list[Any]) -> list[float]:
        if not parts:
            return []
        values = self.torch.stack([x.to(self.torch.float64) for x in parts]).tolist()
        return [v if v == v else math.inf for v in values]

    def available_bytes(self, device: Device) -> int | None:
        if device.kind == "cpu":
            return host_available_bytes()
        cuda = self.torch.cuda
        try:
            free, _ = cuda.mem_get_info(device.index)
            # Memory torch's caching allocator holds but no tensor uses is ours to take too.
            cached = cuda.memory_reserved(device.index) - cuda.memory_allocated(device.index)
        except Exception:
            return None
        return int(free) + max(0, int(cached))

    def rel_error(self, out: Any, ref: Any) -> float:
        diff = out.to(self.torch.float64) - ref
        num = float(self.torch.linalg.vector_norm(diff))
        den = float(self.torch.linalg.vector_norm(ref))
        if not math.isfinite(num):
            return math.inf
        return num / den if den > 0 else num

    def synchronize(self, device: Device) -> None:
        if device.kind != "cpu":
            self.torch.cuda.synchronize(device.index)

    def stream(self, device: Device) -> int:
        if device.kind == "cpu":
            return 0
        return int(self.torch.cuda.current_stream(device.index).cuda_stream)


class CupyAdapter(ArrayAdapter):
    kind = "cupy"

    @staticmethod
    def signature(x: Any) -> tuple[Any, ...]:
        return (x.shape, x.strides, x.dtype.num, x.device.id, x.data.ptr & 15)

    def __init__(self) -> None:
        import cupy  # only reached when a CuPy array is passed in

        self.cupy = cupy

    def strides(self, x: Any) -> tuple[int, ...]:
        size = x.itemsize
        return tuple(s // size for s in x.strides)

    def device(self, x: Any) -> Device:
        return Device("cuda", int(x.device.id))

    def ptr(self, x: Any) -> int:
        return int(x.data.ptr)

    def empty(self, shape: tuple[int, ...], dtype: str, device: Device) -> Any:
        with self.cupy.cuda.Device(device.index):
            return self.cupy.empty(shape, dtype=_numpy_dtype(dtype))

    def random_strided(
        self,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        dtype: str,
        device: Device,
        rng: np.random.Generator,
        offset: int = 0,
        *,
        fill: bool = True,
    ) -> Any:
        cupy = self.cupy
        npdt = _numpy_dtype(dtype)
        size = offset + 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
        with cupy.cuda.Device(device.index):
            if fill:
                gen = cupy.random.default_rng(int(rng.integers(0, 2**62)))
                base = gen.standard_normal(size, dtype=np.float32).astype(npdt, copy=False)
            else:
                base = cupy.empty(size, dtype=npdt)
            return cupy.lib.stride_tricks.as_strided(
                base[offset:], shape=shape, strides=tuple(s * npdt.itemsize for s in strides)
            )

    def strided_view(self, base: Any, shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> Any:
        return self.cupy.lib.stride_tricks.as_strided(
            base[offset:], shape=shape, strides=tuple(s * base.itemsize for s in strides)
        )

    def host_indices(self, indices: np.ndarray, device: Device) -> Any:
        with self.cupy.cuda.Device(device.index):
            return self.cupy.asarray(indices)

    def to_float64(self, x: Any) -> Any:
        return x.astype(self.cupy.float64)

    def to_numpy(self, x: Any) -> np.ndarray:
        return self.cupy.asnumpy(x).astype(np.float64)

    def fill_nan(self, x: Any) -> None:
        x.fill(np.nan)

    def copy_(self, dst: Any, src: Any) -> None:
        dst[...] = src

    def matmul(
        self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, activation: str | None
    ) -> None:
        cupy = self.cupy
        if alpha == 1.0 and beta == 0.0 and bias is None and activation is None:
            cupy.matmul(a, b, out=out)
            return
        result = cupy.matmul(a, b)
        if alpha != 1.0:
            result *= alpha
        if beta != 0.0:
            result += beta * out
        if bias is not None:
            result += bias
        out[...] = self.activate64(result, activation)

    def activate64(self, x: Any, activation: str | None) -> Any:
        cupy = self.cupy
        if activation is None:
            return x
        if activation == "relu":
            return cupy.maximum(x, 0)
        x64 = x.astype(cupy.float64)
        if activation == "gelu":
            import cupyx.scipy.special as special

            y = 0.5 * x64 * (1.0 + special.erf(x64 / math.sqrt(2.0)))
        elif activation == "gelu_tanh":
            y = 0.5 * x64 * (1.0 + cupy.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3)))
        else:
            msg = f"unknown activation {activation!r}"
            raise ValueError(msg)
        return y.astype(x.dtype)

    def namespace(self) -> Any:
        return self.cupy

    def block_elements(self, device: Device, *, reference: bool = False, total: int = 0) -> int:
        return 1 << 22

    def available_bytes(self, device: Device) -> int | None:
        cupy = self.cupy
        try:
            with cupy.cuda.Device(device.index):
                free, _ = cupy.cuda.runtime.memGetInfo()
                pooled = cupy.get_default_memory_pool().free_bytes()
        except Exception:
            return None
        return int(free) + int(pooled)

    def rel_error(self, out: Any, ref: Any) -> float:
        cupy = self.cupy
        num = float(cupy.linalg.norm((out.astype(cupy.float64) - ref).ravel()))
        den = float(cupy.linalg.norm(ref.ravel()))
        if not math.isfinite(num):
            return math.inf
        return num / den if den > 0 else num

    def synchronize(self, device: Device) -> None:
        with self.cupy.cuda.Device(device.index):
            self.cupy.cuda.get_current_stream().synchronize()

    def stream(self, device: Device) -> int:
        with self.cupy.cuda.Device(device.index):
            return int(self.cupy.cuda.get_current_stream().ptr)


_FACTORIES: dict[str, type[ArrayAdapter]] = {
    "numpy": NumpyAdapter,
    "torch": TorchAdapter,
    "cupy": CupyAdapter,
}
_BY_TYPE: dict[type, ArrayAdapter] = {}
_BY_KIND: dict[str, ArrayAdapter] = {}


def adapter_for_kind(kind: str) -> ArrayAdapter:
    """The adapter of one array library by name (``numpy``, ``torch``, ``cupy``)."""
    found = _BY_KIND.get(kind)
    if found is None:
        try:
            factory = _FACTORIES[kind]
        except KeyError:
            msg = f"unknown array kind {kind!r}; valid: {', '.join(_FACTORIES)}"
            raise ValueError(msg) from None
        found = _BY_KIND[kind] = factory()
    return found


def adapter_of(x: Any) -> ArrayAdapter:
    """The adapter for an array, found by its type and cached."""
    cls = type(x)
    found = _BY_TYPE.get(cls)
    if found is not None:
        return found
    root = cls.__module__.split(".", 1)[0]
    if issubclass(cls, np.ndarray):
        _check_ndarray_subclass(cls)
        root = "numpy"
    if root not in _FACTORIES:
        msg = (
            f"unimatmul.matmul takes NumPy arrays, torch tensors or CuPy arrays, "
            f"not {cls.__module__}.{cls.__qualname__}"
        )
        raise TypeError(msg)
    found = _BY_TYPE[cls] = adapter_for_kind(root)
    return found


def _check_ndarray_subclass(cls: type) -> None:
    """Refuse the ndarray subclasses whose ``numpy.matmul`` result their own code decides
    (so that unimatmul cannot give the same); others (np.matrix, plain subclasses) are taken
    as NumPy arrays, and the API returns the type numpy.matmul returns."""
    if cls is np.ndarray:
        return
    name = f"{cls.__module__}.{cls.__qualname__}"
    if issubclass(cls, np.ma.MaskedArray):
        msg = (
            f"unimatmul.matmul takes no masked arrays ({name}): numpy.matmul does not carry "
            "their mask through a product either (it fails, or masks element by element); "
            "use numpy.ma.dot for a masked product, or pass x.filled(0) for the data"
        )
        raise TypeError(msg)
    for hook in ("__array_ufunc__", "__array_function__", "__array_wrap__"):
        if getattr(cls, hook, None) is not getattr(np.ndarray, hook):
            msg = (
                f"unimatmul.matmul cannot follow numpy.matmul for {name}: its own {hook} "
                "decides what numpy.matmul returns; call numpy.matmul, or pass numpy.asarray(x)"
            )
            raise TypeError(msg)


def operand_layouts(problem: Problem) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """(shape, strides) in elements of A, B and C exactly as ``problem`` describes them."""
    m, n, k = problem.m, problem.n, problem.k
    a_stride = (1, problem.lda) if problem.trans_a else (problem.lda, 1)
    b_stride = (1, problem.ldb) if problem.trans_b else (problem.ldb, 1)
    c_stride = (problem.ldc, 1)
    if problem.batch == 1:
        return {"a": ((m, k), a_stride), "b": ((k, n), b_stride), "c": ((m, n), c_stride)}
    bt = problem.batch
    return {
        "a": ((bt, m, k), (problem.stride_a, *a_stride)),
        "b": ((bt, k, n), (problem.stride_b, *b_stride)),
        "c": ((bt, m, n), (problem.stride_c, *c_stride)),
    }


def operand_bytes(problem: Problem) -> int:
    """Bytes one set of operands of ``problem`` takes as :func:`make_operands` allocates
    it (A, B and C at their strides, their alignment offsets, and the bias)."""
    total = 0
    for name, dtype in (("a", problem.dtype_a), ("b", problem.dtype_b), ("c", problem.dtype_c)):
        shape, strides = operand_layouts(problem)[name]
        offset = problem.align // ITEMSIZE[dtype] if problem.align < 16 else 0
        elements = offset + 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
        total += elements * ITEMSIZE[dtype]
    if problem.has_bias:
        total += problem.n * ITEMSIZE[problem.dtype_bias or problem.dtype_c]
    return total


def make_operands(
    problem: Problem,
    adapter: ArrayAdapter,
    device: Device,
    rng: np.random.Generator,
    *,
    fill_out: bool = True,
    with_out: bool = True,
) -> Operands:
    """Random (never zero) operands in the problem's exact layout and pointer alignment.

    ``fill_out=False`` leaves the output uninitialised: when beta is 0 it is never
    read, and drawing random numbers for a large output costs seconds.
    ``with_out=False`` makes no output at all (``out`` is None): new values for inputs
    that already have one.
    """
    layouts = operand_layouts(problem)
    out: dict[str, Any] = {"c": None}
    for name, dtype in (("a", problem.dtype_a), ("b", problem.dtype_b), ("c", problem.dtype_c)):
        if name == "c" and not with_out:
            continue
        shape, strides = layouts[name]
        # Reproduce a misaligned caller (e.g. a view at an odd offset) where the problem says so.
        offset = problem.align // ITEMSIZE[dtype] if problem.align < 16 else 0
        fill = fill_out or name != "c"
        out[name] = adapter.random_strided(shape, strides, dtype, device, rng, offset, fill=fill)
    bias = None
    if problem.has_bias:
        bias = adapter.random_strided((problem.n,), (1,), problem.dtype_bias or problem.dtype_c, device, rng)
    return Operands(out["a"], out["b"], out["c"], bias)


# --- what the harness checks a candidate on, besides its reference ---------------------
