"""The Lt driver's host half on Debian's real libhipblaslt (run under unstable's loader).

Started by ``test_hipblaslt_library.py`` as ``LOADER --library-path LIBDIR python
lt_real_child.py VERSION`` (``amd_archive.AmdRoot.run_script``), it prints one JSON
document on stdout:

* ``missing``: hipBLASLt symbols the table's signatures name that the library lacks
  (every one is bound through ``CtypesLtLibrary``, as the backend binds them);
* ``plans``: for each of :data:`PROBLEMS`, the plan the driver builds
  (``LtPlan``: ``MatmulDescCreate``, descriptor attributes, layouts, preference,
  ``set_bias``), read back through the library's own Get functions;
* ``attributes``: for every attribute the table numbers, on fresh objects, what the
  library's getter writes (status, size, default value) and the smallest buffer its
  setter accepts.

No handle is made: ``hipblasLtCreate`` ends a process that sees no HIP device, and
descriptors, layouts and preferences need none. The expected values are computed in the
parent from the ABI table; this child only reports what the library says.
"""

from __future__ import annotations

import ctypes
import json
import sys
import weakref
from typing import Any

from unimatmul import Problem
from unimatmul_backends.lt.abi import HIPBLASLT_5, LtABI, select_hipblaslt_abi
from unimatmul_backends.lt.driver import CtypesLtLibrary, LtDriver, LtError, LtPlan
from unimatmul_backends.lt.layout import lt_problem
from unimatmul_backends.rocm.hipblaslt import LIBRARY_NAMES
from unimatmul_backends.rocm.libraries import ENV_HIPBLASLT, load_library

#: Transposes, every epilogue the backend offers with both bias types, strided
#: batches (with a broadcast operand), and each storage dtype with its compute type.
PROBLEMS: dict[str, Problem] = {
    "f32-nn": Problem(m=64, n=48, k=32),
    "f32-tn-bias-relu": Problem(m=64, n=48, k=32, trans_a=True, epilogue="bias_relu", dtype_bias="f32"),
    "tf32-nt-gelu": Problem(m=64, n=48, k=32, compute="tf32", trans_b=True, epilogue="gelu_tanh"),
    "bf16-tt-bias-gelu": Problem(
        m=32,
        n=64,
        k=16,
        dtype_a="bf16",
        dtype_b="bf16",
        dtype_c="bf16",
        trans_a=True,
        trans_b=True,
        epilogue="bias_gelu_tanh",
        dtype_bias="bf16",
    ),
    "f16-batch3-bias": Problem(
        m=16,
        n=24,
        k=8,
        dtype_a="f16",
        dtype_b="f16",
        dtype_c="f16",
        batch=3,
        stride_a=16 * 8,
        stride_b=0,  # one B broadcast over the batch
        stride_c=16 * 24,
        epilogue="bias",
        dtype_bias="f16",
    ),
    "f32-batch5-relu": Problem(
        m=8, n=8, k=8, batch=5, stride_a=64, stride_b=64, stride_c=64, trans_b=True, epilogue="relu"
    ),
    # Scaled (fp8) GEMMs as torch._scaled_mm makes them: MI300's fnuz with row-wise
    # scales and a bias, and OCP e4m3 x e5m2 with per-tensor scales.
    "fp8fnuz-rowwise-bias": Problem(
        m=32,
        n=64,
        k=48,
        dtype_a="f8e4m3fnuz",
        dtype_b="f8e4m3fnuz",
        dtype_c="bf16",
        trans_b=True,
        epilogue="bias",
        dtype_bias="bf16",
        op="scaled_gemm",
        scale_a="rowwise",
        scale_b="rowwise",
    ),
    "fp8ocp-tensor": Problem(
        m=16,
        n=32,
        k=64,
        dtype_a="f8e4m3",
        dtype_b="f8e5m2",
        dtype_c="f16",
        trans_b=True,
        op="scaled_gemm",
        scale_a="tensor",
        scale_b="tensor",
    ),
}
WORKSPACE = 3 << 20
BIAS_ADDRESS = 0x7F00_1234_5000  # set, never read: no kernel runs
SCALE_ADDRESSES = (0x7F00_1234_6000, 0x7F00_1234_7000)  # likewise: the library's A and B scales
_BUF = 32


class DescriptorOnlyDriver(LtDriver):
    """An LtDriver with no library handle (see the module docstring); plans work as usual."""

    def __init__(self, abi: LtABI, lib: CtypesLtLibrary) -> None:
        self.abi = abi
        self.lib = lib
        self.handle = 0
        self._finalizer = weakref.finalize(self, lambda: None)  # no handle to destroy


def _get(lib: CtypesLtLibrary, generic: str, obj: int, attr: int) -> dict[str, Any]:
    buf = (ctypes.c_uint8 * _BUF)()
    written = ctypes.c_size_t(0)
    status = lib._fn(generic)(obj, attr, buf, _BUF, ctypes.byref(written))
    return {"status": int(status), "written": int(written.value), "hex": bytes(buf[: written.value]).hex()}


def _smallest_set(
    lib: CtypesLtLibrary, generic: str, make: Any, destroy: Any, attr: int, value: bytes
) -> int | None:
    """The smallest buffer (1..16 bytes) the setter accepts, each try on a fresh object."""
    for size in (1, 2, 4, 8, 16):
        obj = make()
        try:
            buf = (ctypes.c_uint8 * 16).from_buffer_copy(value.ljust(16, b"\0")[:16])
            if lib._fn(generic)(obj, attr, buf, size) == 0:
                return size
        finally:
            destroy(obj)
    return None


def main(version: int) -> dict[str, Any]:
    abi = select_hipblaslt_abi(version)
    cdll, where = load_library(LIBRARY_NAMES, ENV_HIPBLASLT, "libhipblaslt")
    lib = CtypesLtLibrary(abi, cdll, where.path)
    driver = DescriptorOnlyDriver(abi, lib)
    report: dict[str, Any] = {"library": where.path, "table": abi.label, "missing": list(lib.missing)}

    plans = {}
    for name, problem in PROBLEMS.items():
        plan = LtPlan(driver, lt_problem(problem), WORKSPACE)
        if problem.has_bias:
            plan.set_bias(BIAS_ADDRESS)
        keys = ["TRANSA", "TRANSB", "EPILOGUE", "BIAS_DATA_TYPE", "BIAS_POINTER", "POINTER_MODE"]
        if problem.is_scaled:
            plan.set_scales(*SCALE_ADDRESSES)
            keys += ["A_SCALE_MODE", "B_SCALE_MODE", "A_SCALE_POINTER", "B_SCALE_POINTER"]
        desc = {key: _get(lib, "MatmulDescGetAttribute", plan.desc, abi.desc_attr(key)[0]) for key in keys}
        layouts = [
            {
                key: _get(lib, "MatrixLayoutGetAttribute", layout, abi.layout_attr_of(key)[0])
                for key in ("BATCH_COUNT", "STRIDED_BATCH_OFFSET")
            }
            for layout in plan.layouts
        ]
        pref = {
            key: _get(lib, "MatmulPreferenceGetAttribute", plan.pref, abi.pref_attr_of(key)[0])
            for key in ("MAX_WORKSPACE_BYTES", "SEARCH_MODE")
        }
        plans[name] = {"desc": desc, "layouts": layouts, "pref": pref}
        plan.close()
    report["plans"] = plans

    f32 = abi.datatype["R_32F"]
    kinds = {
        "matmul_desc_attr": (
            "MatmulDesc",
            lambda: lib.matmul_desc_create(abi.compute_type["32F"], f32),
            lib.matmul_desc_destroy,
        ),
        "layout_attr": (
            "MatrixLayout",
            lambda: lib.matrix_layout_create(f32, 4, 4, 4),
            lib.matrix_layout_destroy,
        ),
        "pref_attr": ("MatmulPreference", lib.matmul_preference_create, lib.matmul_preference_destroy),
    }
    attributes: dict[str, dict[str, Any]] = {}
    for table, (prefix, make, destroy) in kinds.items():
        found = attributes[table] = {}
        for key, attr in getattr(abi, table).items():
            if attr is None:
                continue
            obj = make()
            try:
                got = _get(lib, f"{prefix}GetAttribute", obj, attr)
            finally:
                destroy(obj)
            # The default value (or zeros where the getter refuses) is written back.
            value = bytes.fromhex(got["hex"]) if got["status"] == 0 else b""
            got["smallest_set"] = _smallest_set(lib, f"{prefix}SetAttribute", make, destroy, attr, value)
            found[key] = got
    report["attributes"] = attributes
    # The library checks the (compute, scale) pair it is given: the plans above were
    # accepted, and the ROCm 5 numbers for the same pair (hipBLASLt 0.3) are not.
    try:
        lib.matmul_desc_destroy(
            lib.matmul_desc_create(HIPBLASLT_5.compute_type["32F"], HIPBLASLT_5.datatype["R_32F"])
        )
        report["old_numbers"] = "accepted"
    except LtError as exc:
        report["old_numbers"] = exc.status_name
    return report


if __name__ == "__main__":
    json.dump(main(int(sys.argv[1])), sys.stdout)
