"""The adapter of NumPy arrays (on the host)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from unimatmul.core.arrays.adapter import CPU, RANDOM_PERIOD, ArrayAdapter, Device, repeat_into, repeated


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

    def pointers(self, a: Any, b: Any, out: Any, bias: Any) -> tuple[int, int, int, int | None]:
        return (
            a.__array_interface__["data"][0],
            b.__array_interface__["data"][0],
            out.__array_interface__["data"][0],
            None if bias is None else bias.__array_interface__["data"][0],
        )

    def allocator(self, shape: tuple[int, ...], dtype: str, device: Device) -> Callable[[], Any]:
        return functools.partial(np.empty, shape, dtype=numpy_dtype(dtype))  # no Python frame per call

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
        return np.empty(shape, dtype=numpy_dtype(dtype))

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
        npdt = numpy_dtype(dtype)
        size = offset + 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
        # Drawn in float32 (float64 only for float64): a float64 draw of a 1 GB float32
        # operand would need 2 GB more while it is converted.
        draw = np.float64 if npdt == np.float64 else np.float32
        if fill and repeated(size):
            base = np.empty(size, dtype=npdt)
            repeat_into(base, rng.standard_normal(RANDOM_PERIOD, dtype=draw).astype(npdt, copy=False))
        elif fill:
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


def numpy_dtype(dtype: str) -> np.dtype[Any]:
    try:
        return np.dtype({"f64": np.float64, "f32": np.float32, "f16": np.float16}[dtype])
    except KeyError:
        msg = f"NumPy has no {dtype} arrays; use torch tensors for {dtype}"
        raise TypeError(msg) from None
