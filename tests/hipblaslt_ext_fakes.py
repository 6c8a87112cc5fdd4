"""A fake hipBLASLt extension shim: the shim's C exports as real C function pointers.

``FakeShim`` answers the listing, support and name functions over a list of solution
indices, and its GroupedGemm computes the grouped product it is handed (column-major, on
host memory standing in for the GPU's), from the host problem or from the UserArguments its
caller wrote; used by the binder's and the grouped candidate's contract tests.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from unimatmul_backends.lt.abi import HIPBLASLT_1_1
from unimatmul_backends.rocm import hipblaslt_ext
from unimatmul_backends.rocm.hipblaslt_ext import UserArguments

ABI = HIPBLASLT_1_1
VERSION = 100100


class FakeShim:
    """The shim's exports over a list of solution indices (what getAllAlgos would list)."""

    def __init__(
        self,
        indices: list[int],
        *,
        header_version: int = VERSION,
        grouped: int = hipblaslt_ext.GROUPED_USER_ARGS,
        layout: list[int] | None = None,
        solution_names: dict[int, str] | None = None,
    ) -> None:
        self.indices = indices
        self.header_version = header_version
        self.capacities: list[int] = []
        self.listed_types: list[tuple[int, ...]] = []
        self._keep: list[Any] = []
        self.grouped = grouped
        self.layout = hipblaslt_ext.user_args_layout() if layout is None else layout
        self.instances: dict[int, dict[str, Any]] = {}
        self.destroyed: list[int] = []
        self.refuse_problem = False
        self.solution_names = solution_names or {}
        impls = {
            "unimatmul_hipblaslt_ext_abi": lambda: hipblaslt_ext.EXT_ABI,
            "unimatmul_hipblaslt_ext_header_version": lambda: self.header_version,
            "unimatmul_hipblaslt_ext_has_kernel_name": lambda: 1,
            "unimatmul_hipblaslt_get_all_algos": self._all,
            "unimatmul_hipblaslt_algos_from_index": self._from_index,
            "unimatmul_hipblaslt_is_algo_supported": self._supported,
            "unimatmul_hipblaslt_kernel_name": self._kernel,
            "unimatmul_hipblaslt_solution_name": self._solution,
            "unimatmul_hipblaslt_ext_grouped": lambda: self.grouped,
            "unimatmul_hipblaslt_grouped_user_args_layout": self._layout,
            "unimatmul_hipblaslt_grouped_create": self._create,
            "unimatmul_hipblaslt_grouped_destroy": self._destroy,
            "unimatmul_hipblaslt_grouped_is_algo_supported": self._grouped_supported,
            "unimatmul_hipblaslt_grouped_initialize": self._initialize,
            "unimatmul_hipblaslt_grouped_run": self._run,
            "unimatmul_hipblaslt_grouped_default_user_args": self._default_args,
            "unimatmul_hipblaslt_grouped_run_user_args": self._run_args,
        }
        signatures = {**hipblaslt_ext._SIGNATURES, **hipblaslt_ext._GROUPED_SIGNATURES}
        for name, (restype, argtypes) in signatures.items():
            argtypes = [ctypes.c_void_p if t is ctypes.c_char_p else t for t in argtypes]
            fn = ctypes.CFUNCTYPE(restype, *argtypes)(impls[name])
            self._keep.append(fn)
            setattr(self, name, fn)

    def _fill(self, indices: list[int], results: int, capacity: int, total: Any) -> int:
        self.capacities.append(capacity)
        struct = ABI.heuristic_result_struct()
        array = (struct * capacity).from_address(results)
        for slot, index in zip(array, indices[:capacity], strict=False):
            ctypes.memmove(ctypes.addressof(slot.algo), int(index).to_bytes(4, "little", signed=True), 4)
            slot.workspaceSize = 1000 + index
            slot.state = 0
        total[0] = len(indices)
        return 0

    def _all(self, handle: int, gemm_type: int, *rest: Any) -> int:
        *types, results, capacity, total = rest
        self.listed_types.append((gemm_type, *types))
        return self._fill(self.indices, results, capacity, total)

    def _from_index(
        self, handle: int, wanted: int, count: int, results: int, capacity: int, total: Any
    ) -> int:
        asked = list((ctypes.c_int * count).from_address(wanted))
        found = [i for i in asked if i in self.indices]
        status = self._fill(found, results, capacity, total)
        return status if found else 7  # HIPBLAS_STATUS_INVALID_VALUE: all out of range

    def _supported(self, handle: int, desc: int, *rest: Any) -> int:
        algo, workspace = rest[-2], rest[-1]
        index = int.from_bytes(ctypes.string_at(algo, 4), "little", signed=True)
        if index % 2:
            return 7  # odd solutions do not support the problem
        ctypes.memmove(algo + 4, b"\x07" * 4, 4)  # the library writes the problem in
        workspace[0] = 4096
        return 0

    def _name(self, text: str, buf: int, size: int, needed: Any) -> int:
        raw = text.encode()
        needed[0] = len(raw) + 1
        if buf and size:
            ctypes.memmove(buf, raw[: size - 1] + b"\0", min(len(raw), size - 1) + 1)
        return 0

    def _kernel(self, handle: int, algo: int, buf: int, size: int, needed: Any) -> int:
        index = int.from_bytes(ctypes.string_at(algo, 4), "little", signed=True)
        return self._name(f"Cijk_kernel_{index % 3}", buf, size, needed)

    def _solution(self, handle: int, algo: int, buf: int, size: int, needed: Any) -> int:
        index = int.from_bytes(ctypes.string_at(algo, 4), "little", signed=True)
        name = self.solution_names.get(index, f"Cijk_solution_{index}_" + "x" * 700)  # over 512
        return self._name(name, buf, size, needed)

    # --- the grouped GEMM ---------------------------------------------------------------
    def _layout(self, address: int, capacity: int) -> int:
        if self.grouped < hipblaslt_ext.GROUPED_USER_ARGS:
            return 0
        out = (ctypes.c_int * capacity).from_address(address)
        for i, value in enumerate(self.layout[:capacity]):
            out[i] = value
        return len(self.layout)

    def _create(self, handle: int, *rest: Any) -> int:
        op_a, op_b, type_a, type_b, type_c, type_d, compute, groups = rest[:8]
        m, n, k, lda, ldb, ldc, ldd = ([arr[i] for i in range(groups)] for arr in rest[8:15])
        a, b, c, d = ([arr[i] or 0 for i in range(groups)] for arr in rest[15:19])
        alpha, beta, scale_bytes, max_workspace, out = rest[19:]
        out[0] = None
        if self.refuse_problem:
            return 3  # HIPBLAS_STATUS_INVALID_VALUE
        assert scale_bytes == 4  # f32 compute: float scalars
        ptr = 0x5000 + 16 * len(self.instances)
        self.instances[ptr] = {
            "handle": handle, "ops": (op_a, op_b), "types": (type_a, type_b, type_c, type_d),
            "compute": compute, "m": m, "n": n, "k": k, "lda": lda, "ldb": ldb, "ldc": ldc, "ldd": ldd,
            "a": a, "b": b, "c": c, "d": d, "max_workspace": max_workspace,
            "alpha": list((ctypes.c_float * groups).from_address(alpha)),
            "beta": list((ctypes.c_float * groups).from_address(beta)),
            "initialized": [],
        }  # fmt: skip
        out[0] = ptr
        return 0

    def _destroy(self, ptr: int) -> int:
        self.destroyed.append(ptr)
        return 0

    def _grouped_supported(self, ptr: int, algo: int, workspace: Any) -> int:
        index = int.from_bytes(ctypes.string_at(algo, 4), "little", signed=True)
        if index % 2:
            return 3  # odd solutions do not support a grouped problem
        ctypes.memmove(algo + 4, b"\x09" * 4, 4)
        workspace[0] = 1024 * index
        return 0

    def _initialize(
        self, ptr: int, algo: int, workspace: int | None, user_args: int, stream: int | None
    ) -> int:
        index = int.from_bytes(ctypes.string_at(algo, 4), "little", signed=True)
        self.instances[ptr]["initialized"].append((index, workspace or 0, user_args, stream or 0))
        return 0

    def _run(self, ptr: int, stream: int | None) -> int:
        p = self.instances[ptr]
        if not p["initialized"]:
            return 1  # HIPBLAS_STATUS_NOT_INITIALIZED
        op_a, op_b = p["ops"]
        for g in range(len(p["m"])):
            gemm_col_major(
                op_a == ABI.operation["T"], op_b == ABI.operation["T"], p["m"][g], p["n"][g], p["k"][g],
                p["a"][g], p["lda"][g], p["b"][g], p["ldb"][g], p["c"][g], p["ldc"][g], p["d"][g], p["ldd"][g],
                p["alpha"][g], p["beta"][g],
            )  # fmt: skip
        return 0

    def _default_args(self, ptr: int, host: int) -> int:
        p = self.instances[ptr]
        groups = len(p["m"])
        args = (UserArguments * groups).from_address(host)
        for g, arg in enumerate(args):
            arg.m, arg.n, arg.batch, arg.k = p["m"][g], p["n"][g], 1, p["k"][g]
            arg.a, arg.b, arg.c, arg.d = p["a"][g], p["b"][g], p["c"][g], p["d"][g]
            arg.strideA1, arg.strideB1, arg.strideC1, arg.strideD1 = (
                p["lda"][g],
                p["ldb"][g],
                p["ldc"][g],
                p["ldd"][g],
            )
            ctypes.memmove(arg.alpha, ctypes.byref(ctypes.c_float(p["alpha"][g])), 4)
            ctypes.memmove(arg.beta, ctypes.byref(ctypes.c_float(p["beta"][g])), 4)
        return 0

    def _run_args(self, ptr: int, device_args: int, stream: int | None) -> int:
        p = self.instances[ptr]
        if not p["initialized"] or not p["initialized"][-1][2]:
            return 3  # initialized without user args
        op_a, op_b = p["ops"]
        for arg in (UserArguments * len(p["m"])).from_address(device_args):
            alpha = ctypes.c_float.from_buffer_copy(bytes(arg.alpha[:4])).value
            beta = ctypes.c_float.from_buffer_copy(bytes(arg.beta[:4])).value
            gemm_col_major(
                op_a == ABI.operation["T"], op_b == ABI.operation["T"], arg.m, arg.n, arg.k,
                arg.a, arg.strideA1, arg.b, arg.strideB1, arg.c, arg.strideC1, arg.d, arg.strideD1, alpha, beta,
            )  # fmt: skip
        return 0


def col_major(address: int, rows: int, cols: int, ld: int) -> np.ndarray[Any, Any]:
    """The float32 column-major ``rows x cols`` matrix (leading dimension ``ld``) at ``address``."""
    if rows == 0 or cols == 0:
        return np.zeros((rows, cols), np.float32)
    flat = np.ctypeslib.as_array((ctypes.c_float * (ld * (cols - 1) + rows)).from_address(address))
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (4, 4 * ld))


def gemm_col_major(
    trans_a: bool, trans_b: bool, m: int, n: int, k: int, a: int, lda: int, b: int, ldb: int,
    c: int, ldc: int, d: int, ldd: int, alpha: float, beta: float,
) -> None:  # fmt: skip
    """What a GEMM kernel does: D = alpha op(A) op(B) + beta C, in float32 memory."""
    if m == 0 or n == 0:
        return
    op_a = col_major(a, k, m, lda).T if trans_a else col_major(a, m, k, lda)
    op_b = col_major(b, n, k, ldb).T if trans_b else col_major(b, k, n, ldb)
    out = alpha * (op_a.astype(np.float64) @ op_b.astype(np.float64))
    if beta != 0:
        out += beta * col_major(c, m, n, ldc)
    col_major(d, m, n, ldd)[...] = out
