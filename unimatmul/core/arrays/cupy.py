"""The adapter of CuPy arrays (NVIDIA GPUs)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from unimatmul.core.arrays.adapter import ArrayAdapter, Device, gpu_block_elements
from unimatmul.core.arrays.numpy import numpy_dtype


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
        with self.cupy.cuda.Device(device.index):
            return self.cupy.empty(shape, dtype=numpy_dtype(dtype))

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
        npdt = numpy_dtype(dtype)
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

    def block_elements(
        self, device: Device, *, reference: bool = False, screen: bool = False, total: int = 0
    ) -> int:
        return gpu_block_elements(screen, total)

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
