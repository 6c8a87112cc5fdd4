"""RocblasBackend: Candidates are rocBLAS (Tensile) solution indices, run through ctypes.

For a Problem the backend asks ``rocblas_gemm_ex_get_solutions`` (or the strided
batched variant) for every solution that can solve it, in the two-call pattern (a
NULL list to learn the count, then the list), and keeps each index that
``rocblas_gemm_ex`` with ``rocblas_gemm_flags_check_solution_index`` accepts (that
flag makes rocBLAS validate the index without launching anything). A runner calls
``rocblas_gemm_ex`` with ``rocblas_gemm_algo_solution_index`` and that index.

Identity: ``rocblas/solution?index=<i>&source=s:<tensile|hipblaslt>``; the rocBLAS
version string (the same text ``rocblas_get_version_string`` gives and PyTorch TunableOp
>= 2.7 writes as its ``ROCBLAS_VERSION`` validator) goes into every record's versions.
The index is the one TunableOp writes as ``Gemm_Rocblas_<i>``. What it names depends on
the rocBLAS version (:mod:`unimatmul.core.rocblas_indices`): up to 4.x every index is a
Tensile solution numbered from 1; from 5.0 an index > 0 is a hipBLASLt solution and one
below -10 a Tensile solution. So the identity names the source too, and an index whose
source differs under the rocBLAS now loaded is refused (``check``, ``prepare``), never run
as another kernel. An identity without a source (stored before it was recorded) means
the unbiased numbering, the only one there was.

Row-major ``C[m, n] = A[m, k] @ B[k, n]`` is the column-major ``C^T = B^T A^T``:
rocBLAS's "A" is our B, its "B" our A, m and n swap, and so do lda/ldb and the batch
strides. Nothing is copied.

No AMD GPU was available: the calls above have run only against a fake library in CI.
Against Debian's real librocblas (``tests/amd_real``, no GPU) every bound symbol, the
version string and the signatures in the headers are checked, and no handle is made
without a device (``hip_runtime_device_reason``).
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from unimatmul.backend import Backend, Candidate, Problem, Target, UnsupportedProblem, make_operands
from unimatmul.core.rocblas_indices import SOURCES, biased_listing, index_source, legacy_source
from unimatmul_backends.rocm.libraries import (
    ENV_ROCBLAS,
    LibraryChoice,
    hip_device_reason,
    hip_runtime_device_reason,
    load_library,
)
from unimatmul_backends.rocm.rocblas_abi import (
    ROCBLAS_DATATYPE,
    ROCBLAS_GEMM_ALGO,
    ROCBLAS_GEMM_FLAGS,
    ROCBLAS_LIBRARY_NAMES,
    ROCBLAS_OPERATION,
    ROCBLAS_SIGNATURES,
    ROCBLAS_STATUS,
    rocblas_status_name,
)

NAME = "rocblas"
SOLUTION = "solution"
_SUCCESS = ROCBLAS_STATUS["success"]
_N, _T = ROCBLAS_OPERATION["none"], ROCBLAS_OPERATION["transpose"]
_ALGO_INDEX = ROCBLAS_GEMM_ALGO["solution_index"]
_CHECK_INDEX = ROCBLAS_GEMM_FLAGS["check_solution_index"]
_NO_FLAGS = ROCBLAS_GEMM_FLAGS["none"]
# rocblas_int is int32 in the LP64 build every ROCm release ships.
_INT_MAX = 2**31 - 1

# (operand dtype, compute) -> (rocblas_datatype of A/B/C/D, of compute, scalar ctype).
# f16/bf16 accumulate in f32 ("HPA"); alpha/beta then are floats (rocblas-functions.h,
# rocblas_gemm_ex: "alpha ... same datatype as compute_type").
_TYPES: dict[tuple[str, str], tuple[int, int, type[ctypes._SimpleCData[Any]]]] = {
    ("f32", "f32"): (ROCBLAS_DATATYPE["f32_r"], ROCBLAS_DATATYPE["f32_r"], ctypes.c_float),
    ("f64", "f64"): (ROCBLAS_DATATYPE["f64_r"], ROCBLAS_DATATYPE["f64_r"], ctypes.c_double),
    ("f16", "f32"): (ROCBLAS_DATATYPE["f16_r"], ROCBLAS_DATATYPE["f32_r"], ctypes.c_float),
    ("bf16", "f32"): (ROCBLAS_DATATYPE["bf16_r"], ROCBLAS_DATATYPE["f32_r"], ctypes.c_float),
}


def solution_candidate(index: int, source: str | None = None) -> Candidate:
    """The Candidate of one rocBLAS solution (TunableOp's ``Gemm_Rocblas_<index>``).

    ``source``: ``tensile`` or ``hipblaslt``, what the index named where it was listed.
    """
    if source is None:
        return Candidate.make(NAME, SOLUTION, index=int(index))
    if source not in SOURCES:
        msg = f"a rocBLAS solution's source is one of {', '.join(SOURCES)}, not {source!r}"
        raise ValueError(msg)
    return Candidate.make(NAME, SOLUTION, index=int(index), source=source)


def stored_source(candidate: Candidate) -> str | None:
    """The source an identity names (recorded, or the unbiased meaning of an older one)."""
    index = candidate.param("index")
    source = candidate.param("source")
    if isinstance(source, str):
        return source
    return legacy_source(index) if isinstance(index, int) else None


class RocblasError(RuntimeError):
    """A rocBLAS call returned a status other than success."""

    def __init__(self, function: str, status: int) -> None:
        super().__init__(f"{function} returned {rocblas_status_name(status)} ({status})")
        self.function = function
        self.status = status


@dataclass(frozen=True)
class RocblasGemm:
    """One Problem in rocBLAS's column-major view (operands already swapped)."""

    trans_a: int
    trans_b: int
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    stride_a: int
    stride_b: int
    stride_c: int
    batch: int
    data_type: int
    compute_type: int
    scalar: type[ctypes._SimpleCData[Any]]

    @property
    def batched(self) -> bool:
        return self.batch > 1


def blas_view(problem: Problem) -> RocblasGemm:
    """The rocBLAS call for a row-major Problem (``C^T = B^T A^T``), or UnsupportedProblem."""
    if problem.op != "gemm":
        raise UnsupportedProblem(
            f"rocBLAS backend runs gemm, not {problem.op}", problem=problem, backend=NAME
        )
    if not problem.dtype_a == problem.dtype_b == problem.dtype_c:
        raise UnsupportedProblem(
            f"rocblas_gemm_ex here takes one dtype for A, B and C, got "
            f"{problem.dtype_a}/{problem.dtype_b}/{problem.dtype_c}",
            problem=problem,
            backend=NAME,
        )
    types = _TYPES.get((problem.dtype_a, problem.compute))
    if types is None:
        valid = ", ".join(f"{d} with compute {c}" for d, c in _TYPES)
        raise UnsupportedProblem(
            f"rocBLAS backend runs {valid}; not {problem.dtype_a} with compute {problem.compute}",
            problem=problem,
            backend=NAME,
        )
    if problem.epilogue != "none":
        raise UnsupportedProblem(
            f"rocblas_gemm_ex has no epilogue ({problem.epilogue})", problem=problem, backend=NAME
        )
    if max(problem.m, problem.n, problem.k, problem.lda, problem.ldb, problem.ldc, problem.batch) > _INT_MAX:
        raise UnsupportedProblem("a size exceeds rocblas_int (int32)", problem=problem, backend=NAME)
    data_type, compute_type, scalar = types
    return RocblasGemm(
        trans_a=_T if problem.trans_b else _N,
        trans_b=_T if problem.trans_a else _N,
        m=problem.n,
        n=problem.m,
        k=problem.k,
        lda=problem.ldb,
        ldb=problem.lda,
        ldc=problem.ldc,
        stride_a=problem.stride_b,
        stride_b=problem.stride_a,
        stride_c=problem.stride_c,
        batch=problem.batch,
        data_type=data_type,
        compute_type=compute_type,
        scalar=scalar,
    )


class RocblasAPI:
    """librocblas through ctypes: signatures bound once, two-call helpers, status checks.

    ``lib`` is a ``ctypes.CDLL`` or any object with the same function names (the
    contract tests pass a fake one, since no AMD GPU runs CI).
    """

    def __init__(self, lib: Any, where: str = "") -> None:
        self.lib = lib
        self.where = where
        self.fn: dict[str, Any] = {}
        missing = []
        for name, (restype, argtypes) in ROCBLAS_SIGNATURES.items():
            fn = getattr(lib, name, None)
            if fn is None:
                missing.append(name)
                continue
            if hasattr(fn, "argtypes"):  # a ctypes function; a fake takes Python values as they are
                fn.restype = restype
                fn.argtypes = list(argtypes)
            self.fn[name] = fn
        if missing:
            msg = f"librocblas {where} lacks {', '.join(missing)} (rocBLAS older than ROCm 5.5?)"
            raise OSError(msg)

    def call(self, name: str, *args: Any) -> None:
        status = self.fn[name](*args)
        if status != _SUCCESS:
            raise RocblasError(name, status)

    def version(self) -> str:
        size = ctypes.c_size_t(0)
        self.call("rocblas_get_version_string_size", ctypes.pointer(size))
        buf = ctypes.create_string_buffer(max(int(size.value), 1))
        self.call("rocblas_get_version_string", buf, ctypes.c_size_t(len(buf)))
        return buf.value.decode("ascii", "replace")

    def create_handle(self) -> int:
        handle = ctypes.c_void_p()
        self.call("rocblas_create_handle", ctypes.pointer(handle))
        if not handle.value:
            raise RocblasError("rocblas_create_handle", ROCBLAS_STATUS["invalid_handle"])
        return int(handle.value)

    def destroy_handle(self, handle: int) -> None:
        self.call("rocblas_destroy_handle", handle)

    def set_stream(self, handle: int, stream: int) -> None:
        self.call("rocblas_set_stream", handle, stream)

    def _args(self, handle: int, g: RocblasGemm, alpha: int, beta: int, a: int, b: int, c: int) -> tuple:
        """Arguments up to ``compute_type``, in the order of the (batched) signature."""
        if g.batched:
            return (
                handle, g.trans_a, g.trans_b, g.m, g.n, g.k, alpha,
                a, g.data_type, g.lda, g.stride_a,
                b, g.data_type, g.ldb, g.stride_b,
                beta,
                c, g.data_type, g.ldc, g.stride_c,
                c, g.data_type, g.ldc, g.stride_c,
                g.batch, g.compute_type,
            )  # fmt: skip
        return (
            handle, g.trans_a, g.trans_b, g.m, g.n, g.k, alpha,
            a, g.data_type, g.lda,
            b, g.data_type, g.ldb,
            beta,
            c, g.data_type, g.ldc,
            c, g.data_type, g.ldc,
            g.compute_type,
        )  # fmt: skip

    def solutions(
        self, handle: int, g: RocblasGemm, alpha: int, beta: int, a: int, b: int, c: int
    ) -> list[int]:
        """Every solution index rocBLAS says can solve ``g`` (two calls: count, then list)."""
        name = (
            "rocblas_gemm_strided_batched_ex_get_solutions" if g.batched else "rocblas_gemm_ex_get_solutions"
        )
        head = (*self._args(handle, g, alpha, beta, a, b, c), _ALGO_INDEX, _NO_FLAGS)
        size = ctypes.c_int32(0)
        self.call(name, *head, None, ctypes.pointer(size))
        if size.value <= 0:
            return []
        found = (ctypes.c_int32 * size.value)()
        self.call(name, *head, found, ctypes.pointer(size))
        # rocBLAS fills them in shared_ptr order; sorted, the list is the same every run.
        return sorted(set(found[: size.value]))

    def gemm_function(self, g: RocblasGemm) -> Any:
        return self.fn["rocblas_gemm_strided_batched_ex" if g.batched else "rocblas_gemm_ex"]

    def check_index(
        self, handle: int, g: RocblasGemm, index: int, alpha: int, beta: int, a: int, b: int, c: int
    ) -> bool:
        """Whether rocBLAS accepts ``index`` for ``g`` (validated, not launched)."""
        args = self._args(handle, g, alpha, beta, a, b, c)
        status = self.gemm_function(g)(*args, _ALGO_INDEX, index, _CHECK_INDEX)
        return bool(status == _SUCCESS)


@dataclass
class _Handle:
    """One rocBLAS handle (per device), the stream last set on it, and its lock.

    A handle carries one stream at a time: setting it and launching happen under
    the lock, so that two threads never launch on each other's streams.
    """

    value: int
    stream: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


Loader = Callable[[], tuple[Any, LibraryChoice]]


def _load_rocblas() -> tuple[Any, LibraryChoice]:
    return load_library(ROCBLAS_LIBRARY_NAMES, ENV_ROCBLAS, "librocblas")


class RocblasBackend(Backend):
    """Offers every rocBLAS solution index that can solve a Problem on a HIP device."""

    name = NAME
    device_kinds = frozenset({"hip"})
    array_kinds = frozenset({"torch"})

    def __init__(
        self,
        *,
        loader: Loader | None = None,
        device_check: Callable[[], str | None] = hip_device_reason,
        runtime_check: Callable[[], str | None] = hip_runtime_device_reason,
    ) -> None:
        self._loader = loader or _load_rocblas
        self._device_check = device_check
        # After loading, before any handle (as for hipBLASLt): without a device
        # rocblas_create_handle only fails, but nothing else could run either.
        self._runtime_check = runtime_check
        self._api: RocblasAPI | None = None
        self._where: LibraryChoice | None = None
        self._error: str | None = None
        self._version: str | None = None
        self._handles: dict[int, _Handle] = {}
        self._solutions: dict[tuple[str, int], list[int]] = {}
        #: Whether the loaded rocBLAS numbers solutions the biased way (from its version,
        #: or from a listing with an index below -10).
        self.biased = False
        self._lock = threading.Lock()

    # --- the library --------------------------------------------------------------
    def library(self) -> RocblasAPI:
        if self._api is None and self._error is None:
            with self._lock:
                if self._api is None and self._error is None:
                    try:
                        lib, where = self._loader()
                        api = RocblasAPI(lib, where.path)
                        no_device = self._runtime_check()
                        if no_device is not None:
                            raise OSError(no_device)
                        self._version = api.version()
                        self.biased = biased_listing(self._version, ())
                        self._api, self._where = api, where
                    except Exception as exc:  # not found, too old, broken install
                        self._error = f"{type(exc).__name__}: {exc}"
        if self._api is None:
            raise UnsupportedProblem(f"rocBLAS is unavailable: {self._error}", backend=NAME)
        return self._api

    @property
    def location(self) -> LibraryChoice | None:
        """Where librocblas was loaded from (None before loading or when it failed)."""
        return self._where

    def availability(self) -> str | None:
        reasons = []
        device = self._device_check()
        if device is not None:
            reasons.append(device)
        try:
            self.library()
        except UnsupportedProblem:
            reasons.append(f"librocblas: {self._error}")
        return "; ".join(reasons) or None

    def versions(self) -> dict[str, str]:
        self.library()
        assert self._version is not None
        return {"rocblas": self._version}

    # --- handles ------------------------------------------------------------------
    def _handle(self, target: Target) -> _Handle:
        index = target.device.index
        found = self._handles.get(index)
        if found is None:
            api = self.library()
            with self._lock:
                found = self._handles.get(index)
                if found is None:
                    # A rocBLAS handle belongs to the device current when it is created.
                    with _on_device(target):
                        found = _Handle(api.create_handle())
                    self._handles[index] = found
        return found

    def close(self) -> None:
        with self._lock:
            if self._api is not None:
                for handle in self._handles.values():
                    with contextlib.suppress(RocblasError):
                        self._api.destroy_handle(handle.value)
            self._handles.clear()
            self._solutions.clear()

    # --- candidates ---------------------------------------------------------------
    def solution_indices(self, problem: Problem, target: Target) -> list[int]:
        """Indices rocBLAS lists for ``problem`` and accepts under check_solution_index."""
        key = (problem.key, target.device.index)
        found = self._solutions.get(key)
        if found is not None:
            return found
        g = blas_view(problem)
        api = self.library()
        handle = self._handle(target)
        # rocBLAS rejects NULL operands before it looks for solutions; it reads none of
        # them. Real buffers in the problem's exact layout are the honest way to ask.
        ops = make_operands(problem, target.adapter, target.device, np.random.default_rng(0))
        ptr = target.adapter.ptr
        alpha = g.scalar(1.0)
        beta = g.scalar(0.0 if problem.beta_zero else 1.0)
        pa, pb, pc = ptr(ops.b), ptr(ops.a), ptr(ops.out)  # rocBLAS's A is our B (C^T = B^T A^T)
        refs = (ctypes.addressof(alpha), ctypes.addressof(beta), pa, pb, pc)
        with handle.lock, _on_device(target):
            listed = api.solutions(handle.value, g, *refs)
            found = [i for i in listed if api.check_index(handle.value, g, i, *refs)]
        self.biased = self.biased or biased_listing(None, listed)
        self._solutions[key] = found
        return found

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        found = []
        for index in self.solution_indices(problem, target):
            source = index_source(index, self.biased)
            if source is not None:  # a reserved index (-9..0) names no solution
                found.append(solution_candidate(index, source))
        return found

    def _refusal(self, problem: Problem, candidate: Candidate, target: Target) -> str | None:
        """Why this rocBLAS cannot run ``candidate`` for ``problem`` (None: it can)."""
        index = candidate.param("index")
        if candidate.backend != NAME or candidate.name != SOLUTION or not isinstance(index, int):
            return f"{candidate.identity} is not a rocBLAS candidate"
        valid = self.solution_indices(problem, target)
        if index not in valid:
            return f"rocBLAS {self._version} has no solution {index} for {problem.key} ({len(valid)} solutions apply)"
        now, stored = index_source(index, self.biased), stored_source(candidate)
        if now != stored:
            return (
                f"rocBLAS {self._version} numbers index {index} as a {now or 'reserved'} solution; "
                f"it was measured as a {stored or 'reserved'} one (another kernel)"
            )
        return None

    def check(self, problem: Problem, candidate: Candidate, target: Target) -> bool:
        try:
            return self._refusal(problem, candidate, target) is None
        except UnsupportedProblem:
            return False

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> RocblasRunner:
        if candidate.backend != NAME or candidate.name != SOLUTION:
            raise UnsupportedProblem(f"{candidate.identity} is not a rocBLAS candidate", problem=problem)
        refusal = self._refusal(problem, candidate, target)
        if refusal is not None:
            raise UnsupportedProblem(refusal, problem=problem, backend=NAME)
        return RocblasRunner(self.library(), self._handle(target), blas_view(problem), candidate, target)


@contextlib.contextmanager
def _on_device(target: Target) -> Iterator[None]:
    """Make the target's device current (torch), so handles and calls land on it."""
    if target.adapter.kind != "torch":
        yield
        return
    import torch

    with torch.cuda.device(target.device.index):
        yield


class RocblasRunner:
    """One rocBLAS solution on the caller's memory and current stream; no copies.

    Per call: the stream is set on the handle only when it changed, alpha and beta
    are written into two scalars held by the runner, and one C call runs.
    """

    def __init__(
        self, api: RocblasAPI, handle: _Handle, gemm: RocblasGemm, candidate: Candidate, target: Target
    ) -> None:
        self.candidate = candidate
        self.api = api
        self.gemm = gemm
        self.index = int(candidate.param("index"))
        self._handle = handle
        self._fn = api.gemm_function(gemm)
        self._fn_name = "rocblas_gemm_strided_batched_ex" if gemm.batched else "rocblas_gemm_ex"
        self._ptr = target.adapter.ptr
        self._stream = target.adapter.stream
        self._device = target.device
        self._alpha = gemm.scalar(1.0)
        self._beta = gemm.scalar(0.0)
        self._alpha_p = ctypes.addressof(self._alpha)
        self._beta_p = ctypes.addressof(self._beta)

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        if bias is not None:
            msg = "the rocBLAS backend has no bias epilogue; this runner was prepared without one"
            raise ValueError(msg)
        g = self.gemm
        ptr = self._ptr
        handle = self._handle
        stream = self._stream(self._device)
        with handle.lock:
            if stream != handle.stream:
                self.api.set_stream(handle.value, stream)
                handle.stream = stream
            self._alpha.value = alpha
            self._beta.value = beta
            pc = ptr(out)
            if g.batched:
                status = self._fn(
                    handle.value, g.trans_a, g.trans_b, g.m, g.n, g.k, self._alpha_p,
                    ptr(b), g.data_type, g.lda, g.stride_a,
                    ptr(a), g.data_type, g.ldb, g.stride_b,
                    self._beta_p,
                    pc, g.data_type, g.ldc, g.stride_c,
                    pc, g.data_type, g.ldc, g.stride_c,
                    g.batch, g.compute_type, _ALGO_INDEX, self.index, _NO_FLAGS,
                )  # fmt: skip
            else:
                status = self._fn(
                    handle.value, g.trans_a, g.trans_b, g.m, g.n, g.k, self._alpha_p,
                    ptr(b), g.data_type, g.lda,
                    ptr(a), g.data_type, g.ldb,
                    self._beta_p,
                    pc, g.data_type, g.ldc,
                    pc, g.data_type, g.ldc,
                    g.compute_type, _ALGO_INDEX, self.index, _NO_FLAGS,
                )  # fmt: skip
        if status != _SUCCESS:
            raise RocblasError(self._fn_name, status)
