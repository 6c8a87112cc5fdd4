"""The protocol every array library's adapter follows, and the registry that finds the
adapter of an array (by its type, cached) or of a library (by name).
"""

from __future__ import annotations

import functools
import importlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from unimatmul.core.dtypes import canonical


@dataclass(frozen=True)
class Device:
    """Where arrays live: ``cpu``, ``cuda`` (NVIDIA) or ``hip`` (AMD), with an index."""

    kind: str
    index: int = 0

    def __str__(self) -> str:
        return self.kind if self.kind == "cpu" else f"{self.kind}:{self.index}"


CPU = Device("cpu")


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

    def pointers(self, a: Any, b: Any, out: Any, bias: Any) -> tuple[int, int, int, int | None]:
        """The addresses of a product's arrays in one call (a runner's hot path); None for
        no bias."""
        ptr = self.ptr
        return ptr(a), ptr(b), ptr(out), None if bias is None else ptr(bias)

    def operands_key(self, a: Any, b: Any, out: Any, bias: Any) -> tuple[Any, ...]:
        """The signatures of a call's arrays, with their types (the array library, and for
        NumPy the array type matmul returns), in one call: the hot path's key. Each library's
        adapter has its own (no call back into this module per operand). AttributeError for
        an operand that is not an array of this library."""
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

    def block_elements(
        self, device: Device, *, reference: bool = False, screen: bool = False, total: int = 0
    ) -> int:
        """Output elements per block of the check (``total``: the output's): its float64
        temporaries are a few of these, so that checking a 1 GB output never makes a
        1 GB float64 copy of it. On the host, comparisons run fastest on blocks that
        stay in the cache, and the reference's products on larger ones: up to 1/32 of a
        large output, since each BLAS call wakes a thread pool. ``screen``: the blocks of
        a large output's screen (two temporaries a block, in the reference's dtype; the
        blocks it does not clear are compared in full in blocks of the plain size)."""
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

    def error_parts(self, out: Any, ref: Any, bound: Any) -> tuple[Any, Any]:
        """One block's largest ``|out - ref| / bound`` (NaN where an element is NaN) and
        its sum of squared errors, unread (0-d arrays), the difference taken in ``ref``'s
        dtype. An adapter may compute the same in fewer passes over the block (the numeric
        check's hot loop)."""
        diff = abs(self.cast_like(out, ref) - ref)
        with np.errstate(invalid="ignore", divide="ignore"):  # NaN or inf in out, a bound of 0
            worst = (diff / bound).max()
        return worst, self.sum_squares(diff)

    def screen_parts(self, out: Any, ref: Any, scale: float) -> tuple[Any, Any]:
        """One block's ``|out - ref| - scale * |ref|``, largest along the last axis, and its
        sum of squared errors, unread; the difference in ``ref``'s dtype (the numeric
        check's screen of a large output)."""
        diff = abs(self.cast_like(out, ref) - ref)
        return self.reduce_max(diff - abs(ref) * scale, -1), self.sum_squares(diff)

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


def gpu_block_elements(screen: bool, total: int) -> int:
    """A GPU's blocks of the check (:meth:`ArrayAdapter.block_elements`): 4 Mi elements,
    few launches each; a large output's screen an eighth of it, up to 32 Mi, as each block
    is a dozen launches whatever its size (a 1 Gi-element output: 32 blocks, not 256)."""
    return min(max(1 << 22, total // 8), 1 << 25) if screen else 1 << 22


#: On a CPU an operand of more elements than ``2 * RANDOM_PERIOD`` is filled by repeating
#: one draw of ``RANDOM_PERIOD`` values: drawing normal numbers runs at 100-200 M a second on
#: a core (a 128-expert weight of 400 M elements took 2.3 s a set, the most of its tuning),
#: repeating a block at memory speed. The period is a prime, so two elements are equal only
#: where their offsets differ by a multiple of it: never a row or column apart in any layout
#: (strides are far smaller, and a prime divides no product of smaller numbers).
RANDOM_PERIOD = 4_194_301


def repeated(size: int) -> bool:
    """Whether a CPU operand of ``size`` elements repeats one draw (:data:`RANDOM_PERIOD`)."""
    return size > 2 * RANDOM_PERIOD


def repeat_into(base: Any, block: Any) -> None:
    """Fill the flat array ``base`` (NumPy or torch) with ``block`` (:data:`RANDOM_PERIOD`
    values) over and over."""
    whole, rest = divmod(len(base), RANDOM_PERIOD)
    base[: whole * RANDOM_PERIOD].reshape(whole, RANDOM_PERIOD)[...] = block
    base[whole * RANDOM_PERIOD :] = block[:rest]


#: The adapter class of each array library, in the module of its own
#: (``unimatmul.core.arrays.<kind>``), loaded the first time an array of it comes.
_FACTORIES: dict[str, str] = {"numpy": "NumpyAdapter", "torch": "TorchAdapter", "cupy": "CupyAdapter"}
_BY_TYPE: dict[type, ArrayAdapter] = {}
#: Array type -> its adapter, for the types :func:`adapter_of` has met (a door's hot path
#: reads it directly, and calls adapter_of on a miss).
BY_TYPE = _BY_TYPE
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
        found = _BY_KIND[kind] = getattr(importlib.import_module(f"{__package__}.{kind}"), factory)()
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
