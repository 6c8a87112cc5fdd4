"""The adapter of torch tensors (CPU, CUDA and ROCm), and the GPU buffers a runner keeps."""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from unimatmul.core.arrays.adapter import (
    CPU,
    RANDOM_PERIOD,
    ArrayAdapter,
    Device,
    gpu_block_elements,
    host_available_bytes,
    repeat_into,
    repeated,
)


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

    def pointers(self, a: Any, b: Any, out: Any, bias: Any) -> tuple[int, int, int, int | None]:
        return a.data_ptr(), b.data_ptr(), out.data_ptr(), None if bias is None else bias.data_ptr()

    def operands_key(self, a: Any, b: Any, out: Any, bias: Any) -> tuple[Any, ...]:
        signature = self.signature
        return (
            type(a),
            type(b),
            signature(a),
            signature(b),
            None if out is None else signature(out),
            None if bias is None else signature(bias),
        )

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
        want = self.torch_dtype(dtype)
        if device.kind != "cpu" or not repeated(size):
            return self._draw(size, want, gen, device).as_strided(shape, strides, offset)
        base = torch.empty(size, dtype=want)  # on a CPU, one draw repeated
        repeat_into(base, self._draw(RANDOM_PERIOD, want, gen, device))
        return base.as_strided(shape, strides, offset)

    def _draw(self, size: int, want: Any, gen: Any, device: Device) -> Any:
        """``size`` standard-normal values of torch dtype ``want``."""
        torch = self.torch
        if want in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            # Drawn in its own dtype: no float32 copy of the whole operand beside it (the
            # memory plan counts the operand alone; 128 experts' weights: 1.6 GB more, and
            # 35 % of the time on a CPU).
            return torch.randn(size, generator=gen, dtype=want, device=self.torch_device(device))
        # float8 and the like: randn does not draw them
        return torch.randn(size, generator=gen, dtype=torch.float32, device=self.torch_device(device)).to(
            want
        )

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

    # The numeric check's passes over a block: the difference taken as one promoting
    # subtraction (no cast of the output first), updated in place, the norm read without
    # squaring into a new tensor, the largest ratio by its extremes (no absolute values):
    # four passes instead of seven (on a GPU the checks of a large product are bound by
    # memory). Same values as the generic ones, up to the rounding of the sum.
    def error_parts(self, out: Any, ref: Any, bound: Any) -> tuple[Any, Any]:
        torch = self.torch
        if ref.numel() == 0:
            return super().error_parts(out, ref, bound)
        diff = torch.sub(out, ref)
        squares = torch.linalg.vector_norm(diff).square()
        # The largest |error| / bound in one reduction (NaN if any element is NaN), as a
        # GPU check wants few launches.
        return diff.div_(bound).abs_().amax(), squares

    def screen_parts(self, out: Any, ref: Any, scale: float) -> tuple[Any, Any]:
        torch = self.torch
        diff = torch.sub(out, ref).abs_()
        squares = torch.linalg.vector_norm(diff).square()
        return self.reduce_max(diff.sub_(ref.abs(), alpha=scale), -1), squares

    def block_elements(
        self, device: Device, *, reference: bool = False, screen: bool = False, total: int = 0
    ) -> int:
        # A GPU wants few, large launches; on the host, torch's comparisons stay below its
        # parallel grain (32768 elements): on a busy machine each parallel region waits
        # milliseconds for a descheduled thread.
        if device.kind == "cpu":
            return super().block_elements(device, reference=True, total=total) if reference else 1 << 14
        return gpu_block_elements(screen, total)

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
