"""The Lt driver: one code path that runs cuBLASLt and hipBLASLt.

cuBLASLt and hipBLASLt have the same C functions under two prefixes, with different
enum numbers and struct sizes. The driver is written once against two inputs:

**An ABI table** (:class:`unimatmul_backends.lt.abi.LtABI`): per library and version,
the enum values (data types, compute types, operations, epilogues), the attribute
ids with their value types, the algo / heuristic-result struct layouts and the C
signatures. The driver never writes a vendor number itself; it looks up a
library-neutral key (``abi.datatype["R_16BF"]``, ``abi.desc_attr("TRANSA")``) and
skips what the table marks absent (``None``).

**A library object** that exposes the Lt C functions in the Python shapes of
``nvmath.bindings.cublasLt`` (:class:`LtLibrary`): handles, descriptors and buffers
are ``int`` addresses; a create function returns the new handle; out-parameters are
addresses the caller owns; a failing status raises. Two implementations exist:

* :class:`CtypesLtLibrary` binds the exported symbols of a loaded shared library with
  ctypes, using the table's signatures. It serves cuBLASLt (``libcublasLt.so``) and
  hipBLASLt (``libhipblaslt.so``) alike.
* the module ``nvmath.bindings.cublasLt`` itself (cuBLASLt only), whose Cython calls
  cost less host time per call than ctypes.

The pieces, in the order a backend uses them:

``LtDriver(abi, lib)``
    one library handle; ``version()``; ``plan(gemm, workspace_limit)``.
``LtPlan``
    the descriptors of one :class:`~unimatmul_backends.lt.layout.LtGemm` (matmul
    descriptor, A/B/C layouts, D laid out as C, a preference): ``heuristics(count)``
    lists :class:`LtAlgo` s, ``check(algo)`` validates one and returns its workspace
    size, ``set_bias(ptr)`` points the bias epilogue at a vector, ``set_scales(a, b)``
    a scaled (fp8) GEMM at its device scales (its scale modes and fast accumulation are
    set when the plan is made), and ``matmul(...)`` runs. A plan belongs to one runner:
    ``set_bias`` and ``set_scales`` change its descriptor.
``LtAlgo``
    an algo as the library stores it: the raw struct bytes (``abi.algo_size``), the
    workspace it needs and the heuristic's waves count. Its *identity* is not the bytes
    but a small dict of ints from an **algo codec**: for cuBLASLt :class:`CublasLtConfig`
    reads and writes the algo-config attributes (algo id, tile, stages, split-K,
    reduction scheme, swizzle, custom option, inner shape, cluster shape), so a stored
    identity is rebuilt with ``algo_init`` + config attributes + ``algo_check``. A
    hipBLASLt codec keys on the solution index (``abi.solution_index(algo.data)``).

The hot path (``LtRunner`` in ``runner.py``, through ``LtPlan.call_prefix``) is one
library call with pre-built descriptors, a pre-built algo struct and host scalars in
pre-allocated buffers: no allocation, no synchronisation, nothing logged, so it can
be captured in a CUDA/HIP graph.

Around the driver, shared by both vendors: ``layout.py`` (a Problem as the
column-major ``LtGemm``, the alignment padding; pure functions), ``runner.py``
(``LtRunner``, ``PaddedRunner`` and ``ArrayHooks`` for torch on CUDA or ROCm and
CuPy) and ``backend.py`` (``LtBackend``: a vendor backend subclasses it and provides
``load_driver``, ``algo_params`` and ``algo_from_params``). The tests in
``tests/backends/lt/test_driver.py`` run all of it against a recording fake library
that takes any ABI table.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from unimatmul.backend import UnsupportedProblem
from unimatmul_backends.lt.abi import LtABI, signatures_for
from unimatmul_backends.lt.layout import LtGemm, LtMatrix

# Canonical dtype -> the ABI table's data-type key.
DATATYPES: dict[str, str] = {
    "f32": "R_32F",
    "f64": "R_64F",
    "f16": "R_16F",
    "bf16": "R_16BF",
    "f8e4m3": "R_8F_E4M3",
    "f8e5m2": "R_8F_E5M2",
    "f8e4m3fnuz": "R_8F_E4M3_FNUZ",
    "f8e5m2fnuz": "R_8F_E5M2_FNUZ",
}
_SCALE_CTYPES: dict[str, Any] = {"f32": ctypes.c_float, "f64": ctypes.c_double}


class LtError(RuntimeError):
    """An Lt library call returned a failure status; names the call and the status."""

    def __init__(self, function: str, status: int, status_name: str) -> None:
        super().__init__(f"{function} failed with {status_name} ({status})")
        self.function = function
        self.status = status
        self.status_name = status_name


def status_of(exc: BaseException) -> int | None:
    """The library status carried by an exception from either library object."""
    status = getattr(exc, "status", None)
    return int(status) if isinstance(status, int) else None


class LtLibrary(Protocol):
    """The Lt C functions in ``nvmath.bindings.cublasLt``'s Python shapes (see module doc).

    The functions after ``matmul`` exist in cuBLASLt only; the driver calls them for
    exhaustive search and for rebuilding an algo from its configuration.
    """

    def create(self) -> int: ...
    def destroy(self, handle: int) -> None: ...
    def get_version(self) -> int: ...
    def matrix_layout_create(self, dtype: int, rows: int, cols: int, ld: int) -> int: ...
    def matrix_layout_destroy(self, layout: int) -> None: ...
    def matrix_layout_set_attribute(self, layout: int, attr: int, buf: int, size: int) -> None: ...
    def matmul_desc_create(self, compute_type: int, scale_type: int) -> int: ...
    def matmul_desc_destroy(self, desc: int) -> None: ...
    def matmul_desc_set_attribute(self, desc: int, attr: int, buf: int, size: int) -> None: ...
    def matmul_preference_create(self) -> int: ...
    def matmul_preference_destroy(self, pref: int) -> None: ...
    def matmul_preference_set_attribute(self, pref: int, attr: int, buf: int, size: int) -> None: ...
    def matmul_algo_get_heuristic(
        self,
        handle: int,
        desc: int,
        adesc: int,
        bdesc: int,
        cdesc: int,
        ddesc: int,
        pref: int,
        requested: int,
        results: int,
        count: int,
    ) -> None: ...
    def matmul(
        self,
        handle: int,
        desc: int,
        alpha: int,
        a: int,
        adesc: int,
        b: int,
        bdesc: int,
        beta: int,
        c: int,
        cdesc: int,
        d: int,
        ddesc: int,
        algo: int,
        workspace: int,
        workspace_size: int,
        stream: int,
    ) -> None: ...
    def matmul_algo_get_ids(
        self,
        handle: int,
        compute_type: int,
        scale_type: int,
        atype: int,
        btype: int,
        ctype: int,
        dtype: int,
        requested: int,
    ) -> tuple[int, ...]: ...
    def matmul_algo_init(
        self,
        handle: int,
        compute_type: int,
        scale_type: int,
        atype: int,
        btype: int,
        ctype: int,
        dtype: int,
        algo_id: int,
        algo: int,
    ) -> None: ...
    def matmul_algo_check(
        self, handle: int, desc: int, adesc: int, bdesc: int, cdesc: int, ddesc: int, algo: int, result: int
    ) -> None: ...
    def matmul_algo_cap_get_attribute(
        self, algo: int, attr: int, buf: int, size: int, written: int
    ) -> None: ...
    def matmul_algo_config_set_attribute(self, algo: int, attr: int, buf: int, size: int) -> None: ...
    def matmul_algo_config_get_attribute(
        self, algo: int, attr: int, buf: int, size: int, written: int
    ) -> None: ...


# --- the ctypes library object -------------------------------------------------------


class CtypesLtLibrary:
    """:class:`LtLibrary` over a loaded ``libcublasLt`` / ``libhipblaslt`` through ctypes.

    Every symbol is bound with the ABI table's signature when the object is made, so a
    library that lacks one fails here, by name, and not in the middle of a tuning run.
    Functions the library does not export (hipBLASLt has no algo-config API) raise
    ``NotImplementedError`` when called.
    """

    def __init__(self, abi: LtABI, cdll: ctypes.CDLL, path: str = "") -> None:
        self.abi = abi
        self.path = path or getattr(cdll, "_name", "") or ""
        self._cdll = cdll
        self._fns: dict[str, Any] = {}
        missing = []
        for generic, signature in signatures_for(abi).items():
            try:
                fn = getattr(cdll, abi.symbol(generic))
            except AttributeError:
                missing.append(abi.symbol(generic))
                continue
            fn.restype = signature.restype
            fn.argtypes = list(signature.argtypes)
            self._fns[generic] = fn
        required = ("Create", "Destroy", "MatrixLayoutCreate", "MatmulDescCreate", "Matmul")
        absent = [abi.symbol(g) for g in required if g not in self._fns]
        if absent:
            msg = f"{self.path or abi.label} does not export {', '.join(absent)}: not a {abi.label} library"
            raise OSError(msg)
        self.missing = tuple(missing)
        # The hot path: one bound C function, pointer arguments as plain ints.
        self._matmul_fn = self._fns["Matmul"]

    def function_address(self, generic: str) -> int | None:
        """The address of a bound C function (``"Matmul"``), for native callers; None if absent."""
        fn = self._fns.get(generic)
        return None if fn is None else ctypes.cast(fn, ctypes.c_void_p).value

    def _fn(self, generic: str) -> Any:
        try:
            return self._fns[generic]
        except KeyError:
            msg = f"{self.abi.label} has no {self.abi.symbol(generic)}"
            raise NotImplementedError(msg) from None

    def _check(self, generic: str, status: int) -> None:
        if status != 0:
            raise LtError(self.abi.symbol(generic), status, self.abi.status_name(status))

    def _call(self, generic: str, *args: Any) -> None:
        self._check(generic, self._fn(generic)(*args))

    def _create(self, generic: str, *args: Any) -> int:
        out = ctypes.c_void_p()
        self._check(generic, self._fn(generic)(ctypes.byref(out), *args))
        return int(out.value or 0)

    # -- handle and version
    def create(self) -> int:
        return self._create("Create")

    def destroy(self, handle: int) -> None:
        self._call("Destroy", handle)

    def get_version(self) -> int:
        if self.abi.name == "cublaslt":
            return int(self._fn("GetVersion")())
        # hipblasLtGetVersion(handle, int*) needs a handle of its own.
        handle = self.create()
        try:
            value = ctypes.c_int()
            self._call("GetVersion", handle, ctypes.byref(value))
            return int(value.value)
        finally:
            self.destroy(handle)

    # -- descriptors
    def matrix_layout_create(self, dtype: int, rows: int, cols: int, ld: int) -> int:
        return self._create("MatrixLayoutCreate", dtype, rows, cols, ld)

    def matrix_layout_destroy(self, layout: int) -> None:
        self._call("MatrixLayoutDestroy", layout)

    def matrix_layout_set_attribute(self, layout: int, attr: int, buf: int, size: int) -> None:
        self._call("MatrixLayoutSetAttribute", layout, attr, buf, size)

    def matmul_desc_create(self, compute_type: int, scale_type: int) -> int:
        return self._create("MatmulDescCreate", compute_type, scale_type)

    def matmul_desc_destroy(self, desc: int) -> None:
        self._call("MatmulDescDestroy", desc)

    def matmul_desc_set_attribute(self, desc: int, attr: int, buf: int, size: int) -> None:
        self._call("MatmulDescSetAttribute", desc, attr, buf, size)

    def matmul_preference_create(self) -> int:
        return self._create("MatmulPreferenceCreate")

    def matmul_preference_destroy(self, pref: int) -> None:
        self._call("MatmulPreferenceDestroy", pref)

    def matmul_preference_set_attribute(self, pref: int, attr: int, buf: int, size: int) -> None:
        self._call("MatmulPreferenceSetAttribute", pref, attr, buf, size)

    # -- algos
    def matmul_algo_get_heuristic(
        self,
        handle: int,
        desc: int,
        adesc: int,
        bdesc: int,
        cdesc: int,
        ddesc: int,
        pref: int,
        requested: int,
        results: int,
        count: int,
    ) -> None:
        count_ptr = ctypes.cast(count, ctypes.POINTER(ctypes.c_int))
        self._call(
            "MatmulAlgoGetHeuristic",
            handle,
            desc,
            adesc,
            bdesc,
            cdesc,
            ddesc,
            pref,
            requested,
            results,
            count_ptr,
        )

    def matmul(
        self,
        handle: int,
        desc: int,
        alpha: int,
        a: int,
        adesc: int,
        b: int,
        bdesc: int,
        beta: int,
        c: int,
        cdesc: int,
        d: int,
        ddesc: int,
        algo: int,
        workspace: int,
        workspace_size: int,
        stream: int,
    ) -> None:
        status = self._matmul_fn(
            handle,
            desc,
            alpha,
            a,
            adesc,
            b,
            bdesc,
            beta,
            c,
            cdesc,
            d,
            ddesc,
            algo,
            workspace,
            workspace_size,
            stream,
        )
        if status:
            self._check("Matmul", status)

    def matmul_algo_get_ids(
        self,
        handle: int,
        compute_type: int,
        scale_type: int,
        atype: int,
        btype: int,
        ctype: int,
        dtype: int,
        requested: int,
    ) -> tuple[int, ...]:
        ids = (ctypes.c_int * requested)()
        count = ctypes.c_int()
        self._call(
            "MatmulAlgoGetIds",
            handle,
            compute_type,
            scale_type,
            atype,
            btype,
            ctype,
            dtype,
            requested,
            ids,
            ctypes.byref(count),
        )
        return tuple(ids[: count.value])

    def matmul_algo_init(
        self,
        handle: int,
        compute_type: int,
        scale_type: int,
        atype: int,
        btype: int,
        ctype: int,
        dtype: int,
        algo_id: int,
        algo: int,
    ) -> None:
        self._call(
            "MatmulAlgoInit", handle, compute_type, scale_type, atype, btype, ctype, dtype, algo_id, algo
        )

    def matmul_algo_check(
        self, handle: int, desc: int, adesc: int, bdesc: int, cdesc: int, ddesc: int, algo: int, result: int
    ) -> None:
        self._call("MatmulAlgoCheck", handle, desc, adesc, bdesc, cdesc, ddesc, algo, result)

    def matmul_algo_cap_get_attribute(self, algo: int, attr: int, buf: int, size: int, written: int) -> None:
        self._call(
            "MatmulAlgoCapGetAttribute",
            algo,
            attr,
            buf,
            size,
            ctypes.cast(written, ctypes.POINTER(ctypes.c_size_t)),
        )

    def matmul_algo_config_set_attribute(self, algo: int, attr: int, buf: int, size: int) -> None:
        self._call("MatmulAlgoConfigSetAttribute", algo, attr, buf, size)

    def matmul_algo_config_get_attribute(
        self, algo: int, attr: int, buf: int, size: int, written: int
    ) -> None:
        self._call(
            "MatmulAlgoConfigGetAttribute",
            algo,
            attr,
            buf,
            size,
            ctypes.cast(written, ctypes.POINTER(ctypes.c_size_t)),
        )


def load_ctypes_library(
    candidates: Iterable[str], select_abi: Callable[[ctypes.CDLL], LtABI]
) -> CtypesLtLibrary:
    """The first of ``candidates`` (paths or sonames) that loads, bound with its ABI table.

    ``select_abi`` reads the library's version from the loaded ``CDLL`` and returns the
    table for it (or raises). A soname already loaded in this process (by torch, say)
    is reused first, so that the driver and the framework share one copy.
    """
    tried: list[str] = []
    names = list(dict.fromkeys(candidates))
    noload = getattr(os, "RTLD_NOLOAD", 0)
    attempts = [(name, noload | os.RTLD_GLOBAL) for name in names if noload and "/" not in name]
    attempts += [(name, os.RTLD_GLOBAL) for name in names]
    for name, mode in attempts:
        try:
            cdll = ctypes.CDLL(name, mode=mode)
        except OSError as exc:
            if not mode & noload:
                tried.append(f"{name}: {exc}")
            continue
        try:
            return CtypesLtLibrary(select_abi(cdll), cdll, name)
        except (OSError, ValueError, AttributeError) as exc:
            tried.append(f"{name}: {exc}")
    msg = "no loadable Lt library; tried: " + ("; ".join(tried) or "nothing")
    raise OSError(msg)


def function_addresses(lib: Any, abi: LtABI, generics: Sequence[str]) -> tuple[int, ...] | None:
    """Addresses of the library's C functions (``"Matmul"``, ...), or None if one is unknown.

    A :class:`CtypesLtLibrary` knows its own; for ``nvmath.bindings.cublasLt`` they come
    from its internal module's function-pointer table (``__cublasLtMatmul``, ...), which
    is the library copy its handles belong to.
    """
    found: list[int] = []
    lookup: Callable[[str], Any] | None = getattr(lib, "function_address", None)
    if lookup is None:
        try:
            internal = importlib.import_module(lib.__name__.replace(".bindings.", ".bindings._internal.", 1))
            inspect = internal._inspect_function_pointer
        except (AttributeError, ImportError):
            return None

        def lookup(generic: str) -> Any:
            return inspect("__" + abi.symbol(generic))

    for generic in generics:
        try:
            address = lookup(generic)
        except Exception:
            return None
        if not address:
            return None
        found.append(int(address))
    return tuple(found)


# --- algos ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LtAlgo:
    """One algo as the library stores it (opaque struct bytes) and what it needs."""

    data: bytes
    workspace: int = 0
    waves: float = 0.0


class LtDriver:
    """One library handle and the ABI table that goes with it."""

    def __init__(self, abi: LtABI, lib: LtLibrary) -> None:
        self.abi = abi
        self.lib = lib
        self.handle = lib.create()
        self._finalizer = weakref.finalize(self, lib.destroy, self.handle)

    def version(self) -> int:
        return int(self.lib.get_version())

    def datatype(self, dtype: str) -> int:
        key = DATATYPES.get(dtype)
        value = self.abi.datatype.get(key) if key else None
        if value is None:
            # The protocol's "no" (a dtype this library version has no name for, e.g. the
            # fnuz fp8 types on cuBLASLt): the caller moves on, nothing crashed.
            msg = f"{self.abi.label} has no data type for {dtype}"
            raise UnsupportedProblem(msg)
        return value

    def compute_type(self, key: str) -> int:
        value = self.abi.compute_type.get(key)
        if value is None:
            msg = f"{self.abi.label} has no compute type {key}"
            raise KeyError(msg)
        return value

    def plan(self, gemm: LtGemm, workspace_limit: int) -> LtPlan:
        return LtPlan(self, gemm, workspace_limit)

    def close(self) -> None:
        self._finalizer()


def _destroy_plan(lib: LtLibrary, desc: int, layouts: Sequence[int], pref: int) -> None:
    # Called at garbage collection too: never raise from here.
    for destroy, obj in (
        (lib.matmul_preference_destroy, pref),
        *((lib.matrix_layout_destroy, layout) for layout in layouts),
        (lib.matmul_desc_destroy, desc),
    ):
        if obj:
            try:
                destroy(obj)
            except Exception:
                pass


class LtPlan:
    """The descriptors of one LtGemm, built once (see the module docstring)."""

    def __init__(self, driver: LtDriver, gemm: LtGemm, workspace_limit: int) -> None:
        self.driver = driver
        self.gemm = gemm
        self.workspace_limit = int(workspace_limit)
        abi, lib = driver.abi, driver.lib
        self.desc = 0
        self.layouts: list[int] = []
        self.pref = 0
        self._finalizer = weakref.finalize(self, _destroy_plan, lib, 0, (), 0)
        self.scale_ctype = _SCALE_CTYPES[gemm.scale]
        self.types = {name: driver.datatype(getattr(gemm, name).dtype) for name in ("a", "b", "c")}
        self.compute = driver.compute_type(gemm.compute)
        self.scale_type = driver.datatype(gemm.scale)
        try:
            self.desc = lib.matmul_desc_create(self.compute, self.scale_type)
            self._update_finalizer()
            self._set_desc("TRANSA", abi.operation["T" if gemm.trans_a else "N"])
            self._set_desc("TRANSB", abi.operation["T" if gemm.trans_b else "N"])
            epilogue = abi.epilogue.get(gemm.epilogue)
            if epilogue is None:
                msg = f"{abi.label} has no epilogue {gemm.epilogue}"
                raise KeyError(msg)
            if gemm.epilogue != "DEFAULT":
                self._set_desc("EPILOGUE", epilogue)
            if gemm.bias_dtype is not None and abi.supports("matmul_desc_attr", "BIAS_DATA_TYPE"):
                self._set_desc("BIAS_DATA_TYPE", driver.datatype(gemm.bias_dtype))
            if gemm.scaled:
                self._set_scaling(gemm)
            for matrix in (gemm.a, gemm.b, gemm.c):
                self.layouts.append(self._layout(matrix))
                self._update_finalizer()
            self.pref = lib.matmul_preference_create()
            self._update_finalizer()
            attr, ctype = abi.pref_attr_of("MAX_WORKSPACE_BYTES")
            value = ctype(self.workspace_limit)
            lib.matmul_preference_set_attribute(
                self.pref, attr, ctypes.addressof(value), ctypes.sizeof(value)
            )
        except Exception:
            self.close()
            raise
        self.adesc, self.bdesc, self.cdesc = self.layouts

    def _update_finalizer(self) -> None:
        self._finalizer.detach()
        self._finalizer = weakref.finalize(
            self, _destroy_plan, self.driver.lib, self.desc, tuple(self.layouts), self.pref
        )

    def _set_scaling(self, gemm: LtGemm) -> None:
        """The scale modes and fast accumulation of a scaled (fp8) GEMM, as torch sets them."""
        abi = self.driver.abi
        for attr, mode in (("A_SCALE_MODE", gemm.scale_a), ("B_SCALE_MODE", gemm.scale_b)):
            value = abi.matrix_scale.get(mode or "")
            if value is not None and abi.supports("matmul_desc_attr", attr):
                self._set_desc(attr, value)
            elif mode != "SCALAR_32F":
                # One scalar per matrix is every library's default; any other mode needs the attribute.
                msg = f"{abi.label} has no {attr} {mode}: only per-tensor scales"
                raise KeyError(msg)
        # cuBLASLt only: hipBLASLt's MFMA kernels always accumulate in full precision
        # (its descriptor has no such attribute), so the flag has nothing to change there.
        if abi.supports("matmul_desc_attr", "FAST_ACCUM"):
            self._set_desc("FAST_ACCUM", int(gemm.fast_accum))

    def _set_desc(self, key: str, value: int) -> None:
        attr, ctype = self.driver.abi.desc_attr(key)
        buf = ctype(value)
        self.driver.lib.matmul_desc_set_attribute(self.desc, attr, ctypes.addressof(buf), ctypes.sizeof(buf))

    def _layout(self, matrix: LtMatrix) -> int:
        lib, abi = self.driver.lib, self.driver.abi
        layout = lib.matrix_layout_create(
            self.driver.datatype(matrix.dtype), matrix.rows, matrix.cols, matrix.ld
        )
        try:
            if matrix.batch > 1:
                for key, value in (("BATCH_COUNT", matrix.batch), ("STRIDED_BATCH_OFFSET", matrix.stride)):
                    attr, ctype = abi.layout_attr_of(key)
                    buf = ctype(value)
                    lib.matrix_layout_set_attribute(layout, attr, ctypes.addressof(buf), ctypes.sizeof(buf))
        except Exception:
            lib.matrix_layout_destroy(layout)
            raise
        return layout

    # -- algos
    def heuristics(self, count: int) -> list[LtAlgo]:
        """Up to ``count`` algos the library's heuristic proposes, best guess first."""
        abi, lib = self.driver.abi, self.driver.lib
        results = (abi.heuristic_result_struct() * max(1, count))()
        returned = ctypes.c_int(0)
        lib.matmul_algo_get_heuristic(
            self.driver.handle,
            self.desc,
            self.adesc,
            self.bdesc,
            self.cdesc,
            self.cdesc,
            self.pref,
            max(1, count),
            ctypes.addressof(results),
            ctypes.addressof(returned),
        )
        ok = abi.status["SUCCESS"]
        found = []
        for result in results[: returned.value]:
            if result.state == ok:
                found.append(LtAlgo(bytes(result.algo), int(result.workspaceSize), float(result.wavesCount)))
        return found

    def check(self, algo: LtAlgo | ctypes.Structure) -> LtAlgo:
        """Validate ``algo`` for this plan; the algo with its workspace size, or raise."""
        abi = self.driver.abi
        struct = algo if isinstance(algo, ctypes.Structure) else abi.algo_struct().from_buffer_copy(algo.data)
        result = abi.heuristic_result_struct()()
        self.driver.lib.matmul_algo_check(
            self.driver.handle,
            self.desc,
            self.adesc,
            self.bdesc,
            self.cdesc,
            self.cdesc,
            ctypes.addressof(struct),
            ctypes.addressof(result),
        )
        return LtAlgo(bytes(struct), int(result.workspaceSize), float(result.wavesCount))

    # -- running
    def set_bias(self, ptr: int) -> None:
        self._set_desc("BIAS_POINTER", ptr)

    def set_scales(self, a_ptr: int, b_ptr: int) -> None:
        """Point a scaled GEMM at the device scales of the library's A and B (caller's B, A)."""
        self._set_desc("A_SCALE_POINTER", a_ptr)
        self._set_desc("B_SCALE_POINTER", b_ptr)

    def call_prefix(self) -> tuple[Callable[..., None], int, int]:
        """(library matmul function, handle, descriptor) for a runner's bound call."""
        return self.driver.lib.matmul, self.driver.handle, self.desc

    def close(self) -> None:
        self._finalizer()
        self.desc, self.layouts, self.pref = 0, [], 0


# --- the cuBLASLt algo codec -----------------------------------------------------------

#: Candidate parameter name -> cuBLASLt algo-config attribute key, in identity order.
CONFIG_PARAMS: tuple[tuple[str, str], ...] = (
    ("algo", "ID"),
    ("tile", "TILE_ID"),
    ("stages", "STAGES_ID"),
    ("splitk", "SPLITK_NUM"),
    ("reduction", "REDUCTION_SCHEME"),
    ("swizzle", "CTA_SWIZZLING"),
    ("custom", "CUSTOM_OPTION"),
    ("inner", "INNER_SHAPE_ID"),
    ("cluster", "CLUSTER_SHAPE_ID"),
)

# cublasLt.h (cuda13.1) cublasLtClusterShape_t: AUTO=0, 1x1x1=2, 2x1x1=3, 4x1x1=4,
# 1x2x1=5, 2x2x1=6, 1x4x1=8. The small clusters the Hopper kernels use most.
CLUSTER_SHAPES: tuple[int, ...] = (0, 2, 3, 5, 6, 4, 8)


class CublasLtConfig:
    """Algo identity for cuBLASLt: its algo-config attributes (see module docstring)."""

    def __init__(self, driver: LtDriver) -> None:
        self.driver = driver
        self.attrs = [
            (param, key, driver.abi.algo_config_attr[key], driver.abi.algo_config_attr_ctype[key])
            for param, key in CONFIG_PARAMS
            if key in driver.abi.algo_config_attr
        ]

    def params(self, algo: LtAlgo | ctypes.Structure) -> dict[str, int]:
        """The configuration of ``algo`` as candidate parameters."""
        abi, lib = self.driver.abi, self.driver.lib
        struct = algo if isinstance(algo, ctypes.Structure) else abi.algo_struct().from_buffer_copy(algo.data)
        written = ctypes.c_size_t()
        out: dict[str, int] = {}
        for param, _key, attr, ctype in self.attrs:
            value = ctype()
            lib.matmul_algo_config_get_attribute(
                ctypes.addressof(struct),
                attr,
                ctypes.addressof(value),
                ctypes.sizeof(value),
                ctypes.addressof(written),
            )
            out[param] = int(value.value)
        return out

    def build(self, plan: LtPlan, params: Mapping[str, int]) -> ctypes.Structure:
        """An algo struct with exactly this configuration (not yet checked)."""
        abi, lib = self.driver.abi, self.driver.lib
        struct = abi.algo_struct()()
        types = plan.types
        lib.matmul_algo_init(
            self.driver.handle,
            plan.compute,
            plan.scale_type,
            types["a"],
            types["b"],
            types["c"],
            types["c"],
            int(params["algo"]),
            ctypes.addressof(struct),
        )
        for param, key, attr, ctype in self.attrs:
            if key == "ID" or param not in params:
                continue
            value = ctype(int(params[param]))
            lib.matmul_algo_config_set_attribute(
                ctypes.addressof(struct), attr, ctypes.addressof(value), ctypes.sizeof(value)
            )
        return struct

    def rebuild(self, plan: LtPlan, params: Mapping[str, int]) -> LtAlgo:
        """The checked algo of a stored identity; raises if the library rejects it."""
        return plan.check(self.build(plan, params))

    # -- exhaustive search
    def _cap_list(self, struct: ctypes.Structure, key: str) -> list[int]:
        caps = self.driver.abi.algo_cap_attr
        if key not in caps:
            return []
        lib = self.driver.lib
        written = ctypes.c_size_t(0)
        lib.matmul_algo_cap_get_attribute(
            ctypes.addressof(struct), caps[key], 0, 0, ctypes.addressof(written)
        )
        count = written.value // 4
        if count == 0:
            return []
        values = (ctypes.c_uint32 * count)()
        lib.matmul_algo_cap_get_attribute(
            ctypes.addressof(struct),
            caps[key],
            ctypes.addressof(values),
            4 * count,
            ctypes.addressof(written),
        )
        return [int(v) for v in values]

    def _cap(self, struct: ctypes.Structure, key: str) -> int:
        abi = self.driver.abi
        if key not in abi.algo_cap_attr:
            return 0
        value = abi.algo_cap_attr_ctype[key]()
        written = ctypes.c_size_t()
        self.driver.lib.matmul_algo_cap_get_attribute(
            ctypes.addressof(struct),
            abi.algo_cap_attr[key],
            ctypes.addressof(value),
            ctypes.sizeof(value),
            ctypes.addressof(written),
        )
        return int(value.value)

    def enumerate(
        self, plan: LtPlan, seeds: Sequence[Mapping[str, int]], *, max_checks: int, max_found: int
    ) -> tuple[list[dict[str, int]], dict[str, int]]:
        """Valid configurations beyond the heuristic ``seeds``, and counts of the search.

        The Hopper kernels only validate with the inner shape and cluster shape they were
        built for, which no capability lists: those come from the seeds (what the
        heuristic returned) plus AUTO and the small cluster shapes. The order of the
        search puts variations of the seeds first (each tile, stage count, cluster,
        split-K, swizzle, custom option of a seed's algo), then the plain tile x stages
        grid of every other algo id; ``max_checks`` bounds the ``algo_check`` calls.
        """
        lib, driver = self.driver.lib, self.driver
        types = plan.types
        ids = lib.matmul_algo_get_ids(
            driver.handle, plan.compute, plan.scale_type, types["a"], types["b"], types["c"], types["c"], 256
        )
        seen = {tuple(sorted(s.items())) for s in seeds}
        seed_by_id: dict[int, list[Mapping[str, int]]] = {}
        for s in seeds:
            seed_by_id.setdefault(int(s["algo"]), []).append(s)
        inners = sorted({0, *(int(s.get("inner", 0)) for s in seeds)})
        clusters = list(dict.fromkeys([*(int(s.get("cluster", 0)) for s in seeds), *CLUSTER_SHAPES]))
        stats = {"algo_ids": len(ids), "checked": 0, "valid": 0, "duplicates": 0}
        found: list[dict[str, int]] = []

        def trial(config: dict[str, int]) -> bool:
            key = tuple(sorted(config.items()))
            if key in seen:
                stats["duplicates"] += 1
                return True
            seen.add(key)
            stats["checked"] += 1
            try:
                algo = self.rebuild(plan, config)
            except Exception:
                return stats["checked"] < max_checks
            if algo.workspace <= plan.workspace_limit:
                stats["valid"] += 1
                found.append(self.params(algo))
            return stats["checked"] < max_checks and len(found) < max_found

        caps: dict[int, tuple[list[int], list[int], int, int, int, int]] = {}
        for algo_id in ids:
            base = self.build(plan, {"algo": algo_id})
            caps[algo_id] = (
                self._cap_list(base, "TILE_IDS") or [0],
                self._cap_list(base, "STAGES_IDS") or [0],
                self._cap(base, "SPLITK_SUPPORT"),
                self._cap(base, "REDUCTION_SCHEME_MASK"),
                self._cap(base, "CTA_SWIZZLING_SUPPORT"),
                self._cap(base, "CUSTOM_OPTION_MAX"),
            )

        def variations() -> Iterable[dict[str, int]]:
            # Neighbours of what the heuristic chose first: they hold the Hopper
            # kernels' inner and cluster shapes.
            for algo_id, algo_seeds in seed_by_id.items():
                if algo_id not in caps:
                    continue
                tiles, stages, splitk, reductions, swizzle, custom_max = caps[algo_id]
                for seed in algo_seeds:
                    s = {k: int(v) for k, v in seed.items()}
                    yield from (s | {"tile": t} for t in tiles)
                    yield from (s | {"stages": st} for st in stages)
                    yield from (s | {"cluster": c} for c in clusters)
                    yield from (s | {"inner": i} for i in inners)
                    if splitk:
                        scheme = reductions & -reductions if reductions else 0
                        yield from (s | {"splitk": n, "reduction": scheme} for n in (2, 3, 4, 8))
                    if swizzle:
                        yield s | {"swizzle": 1 - s.get("swizzle", 0)}
                    yield from (s | {"custom": c} for c in range(custom_max + 1))
            defaults = {"splitk": 1, "reduction": 0, "swizzle": 0, "custom": 0}
            for algo_id, (tiles, stages, *_rest) in caps.items():
                for t in tiles:
                    for st in stages:
                        for i in inners:
                            for c in clusters[:2]:
                                yield {
                                    "algo": algo_id,
                                    "tile": t,
                                    "stages": st,
                                    "inner": i,
                                    "cluster": c,
                                    **defaults,
                                }

        for config in variations():
            if not trial(config):
                break
        return found, stats
