"""Contract tests of the hipBLASLt backend: the shared Lt driver with the hipBLASLt ABI tables.

No AMD GPU exists on the machines that run these tests, so libhipblaslt cannot run
here; that is the only reason a fake is used. The fake is a set of real C function
pointers (``ctypes.CFUNCTYPE`` callbacks) under the hipblasLt* symbol names, so the
driver's ctypes bindings (argument types, widths, pointer passing) run exactly as
they would against the real library. Each function checks its arguments against
the hipBLASLt ABI table of the version the fake reports (enum numbers, attribute
ids and value sizes), records the call, and ``hipblasLtMatmul`` computes the
column-major GEMM it is given on the host memory behind the pointers, so the tests
check the numbers against a float64 reference too. The same driver runs cuBLASLt
on the H200 for real.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from unimatmul.backend import Candidate, Target, adapter_for_kind
from unimatmul.core.arrays import Device, NumpyAdapter, make_operands
from unimatmul.core.errors import UnsupportedProblem
from unimatmul.core.problem import Problem
from unimatmul_backends.lt.abi import (
    HIPBLASLT_1_1,
    HIPBLASLT_5,
    HIPBLASLT_6,
    HIPBLASLT_6_0,
    LtABI,
    select_hipblaslt_abi,
    signatures_for,
)
from unimatmul_backends.lt.driver import LtAlgo
from unimatmul_backends.lt.runner import ArrayHooks
from unimatmul_backends.rocm.hipblaslt import (
    HipblasltBackend,
    name_fingerprint,
    select_abi,
    solution_candidate,
    tile_order,
)
from unimatmul_backends.rocm.hipblaslt_ext import ExtUnavailable
from unimatmul_backends.rocm.libraries import LibraryChoice

VERSIONS = {300: HIPBLASLT_5, 600: HIPBLASLT_6_0, 1000: HIPBLASLT_6, 100100: HIPBLASLT_1_1}
STREAM = 0x5EED


def _key(table: dict[str, int | None], value: int, what: str) -> str:
    keys = [k for k, v in table.items() if v == value]
    assert keys, f"{what} {value} is not in the ABI table"
    return keys[0]


def _numpy_dtype(abi: LtABI, value: int) -> Any:
    key = _key(dict(abi.datatype), value, "data type")
    if key in _FP8:
        return np.uint8  # the bits: decoded by _as_float64
    return {"R_32F": np.float32, "R_16F": np.float16, "R_64F": np.float64}[key]


# fp8 data types of the table -> torch's dtype name (torch decodes them on the CPU).
_FP8 = {
    "R_8F_E4M3": "float8_e4m3fn",
    "R_8F_E5M2": "float8_e5m2",
    "R_8F_E4M3_FNUZ": "float8_e4m3fnuz",
    "R_8F_E5M2_FNUZ": "float8_e5m2fnuz",
}


def _as_float64(abi: LtABI, value: int, x: np.ndarray) -> np.ndarray:
    """The values of a matrix read as ``value``'s data type, in float64."""
    key = _key(dict(abi.datatype), value, "data type")
    if key not in _FP8:
        return x.astype(np.float64)
    import torch

    bits = torch.from_numpy(np.ascontiguousarray(x))
    return bits.view(getattr(torch, _FP8[key])).to(torch.float64).numpy()


def _matrix(ptr: int, dtype: Any, rows: int, cols: int, ld: int, batch: int, stride: int) -> np.ndarray:
    item = np.dtype(dtype).itemsize
    extent = (batch - 1) * stride + (cols - 1) * ld + rows
    flat = np.frombuffer((ctypes.c_char * (extent * item)).from_address(ptr), dtype=dtype, count=extent)
    return np.lib.stride_tricks.as_strided(
        flat, shape=(batch, rows, cols), strides=(stride * item, item, ld * item)
    )


FAKES: list[FakeHipblaslt] = []


@pytest.fixture(autouse=True)
def no_bad_calls() -> Iterator[None]:
    """Every argument check the fake made during a test passed."""
    FAKES.clear()
    yield
    failures = [f for fake in FAKES for f in fake.failures]
    FAKES.clear()
    assert not failures, failures


class FakeHipblaslt:
    """libhipblaslt's C functions for one ABI table, checked and recorded (module docstring)."""

    def __init__(self, version: int, solutions: list[int], *, workspace: int = 4096) -> None:
        self.abi = select_hipblaslt_abi(version)
        self.version = version
        self.revision = b"a6254b89-dirty"
        self.solutions = solutions
        self.valid = set(solutions)
        self.workspace = workspace
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.failures: list[str] = []
        FAKES.append(self)
        self.objects: dict[int, dict[str, Any]] = {}
        self.requested: list[int] = []
        self.ran: list[tuple[int, int]] = []  # (solution index, stream)
        self._next = 0x1000
        self._keep: list[Any] = []
        for generic, signature in signatures_for(self.abi).items():
            impl = getattr(self, f"_{generic}", None)
            if impl is None:
                continue  # the real library exports it; nothing here calls it
            # Char buffers arrive as addresses so that the fake can write into them.
            argtypes = [ctypes.c_void_p if t is ctypes.c_char_p else t for t in signature.argtypes]
            fn = ctypes.CFUNCTYPE(signature.restype, *argtypes)(self._recording(generic, impl))
            self._keep.append(fn)
            setattr(self, self.abi.symbol(generic), fn)

    def _recording(self, generic: str, impl: Any) -> Any:
        def call(*args: Any) -> int:
            self.calls.append((generic, args))
            try:
                return int(impl(*args))
            except AssertionError as exc:
                # An exception cannot cross a C callback: keep it for the fixture to raise.
                self.failures.append(f"{generic}: {exc}")
                return 3  # HIPBLAS_STATUS_INVALID_VALUE

        return call

    def _new(self, kind: str, **fields: Any) -> int:
        self._next += 0x10
        self.objects[self._next] = {"kind": kind, "attrs": {}, **fields}
        return self._next

    def _obj(self, handle: int | None, kind: str) -> dict[str, Any]:
        assert handle in self.objects and self.objects[handle]["kind"] == kind, f"not a {kind}: {handle}"
        return self.objects[handle]

    def args(self, generic: str) -> list[tuple[Any, ...]]:
        return [args for name, args in self.calls if name == generic]

    # --- handle and version
    def _Create(self, out: Any) -> int:
        out[0] = self._new("handle")
        return 0

    def _Destroy(self, handle: int) -> int:
        self._obj(handle, "handle")
        return 0

    def _GetVersion(self, handle: int, out: Any) -> int:
        self._obj(handle, "handle")
        out[0] = self.version
        return 0

    def _GetGitRevision(self, handle: int, buf: int) -> int:
        self._obj(handle, "handle")
        ctypes.memmove(buf, self.revision + b"\0", len(self.revision) + 1)
        return 0

    # --- descriptors
    def _MatrixLayoutCreate(self, out: Any, dtype: int, rows: int, cols: int, ld: int) -> int:
        _key(dict(self.abi.datatype), dtype, "data type")
        assert rows >= 1 and cols >= 1 and ld >= rows, (rows, cols, ld)
        out[0] = self._new("layout", dtype=dtype, rows=rows, cols=cols, ld=ld)
        return 0

    def _MatrixLayoutDestroy(self, layout: int) -> int:
        self._obj(layout, "layout")["destroyed"] = True
        return 0

    def _set(self, obj: dict[str, Any], ids: Any, ctypes_of: Any, attr: int, buf: int, size: int) -> int:
        key = _key(dict(ids), attr, "attribute")
        ctype = ctypes_of[key]
        assert size == ctypes.sizeof(ctype), (
            f"{key}: {size} bytes, the header's type has {ctypes.sizeof(ctype)}"
        )
        obj["attrs"][key] = ctype.from_address(buf).value
        return 0

    def _MatrixLayoutSetAttribute(self, layout: int, attr: int, buf: int, size: int) -> int:
        obj = self._obj(layout, "layout")
        return self._set(obj, self.abi.layout_attr, self.abi.layout_attr_ctype, attr, buf, size)

    def _MatmulDescCreate(self, out: Any, compute: int, scale: int) -> int:
        _key(dict(self.abi.compute_type), compute, "compute type")
        _key(dict(self.abi.datatype), scale, "scale type")
        out[0] = self._new("desc", compute=compute, scale=scale)
        return 0

    def _MatmulDescDestroy(self, desc: int) -> int:
        self._obj(desc, "desc")["destroyed"] = True
        return 0

    def _MatmulDescSetAttribute(self, desc: int, attr: int, buf: int, size: int) -> int:
        obj = self._obj(desc, "desc")
        return self._set(obj, self.abi.matmul_desc_attr, self.abi.matmul_desc_attr_ctype, attr, buf, size)

    def _MatmulPreferenceCreate(self, out: Any) -> int:
        out[0] = self._new("pref")
        return 0

    def _MatmulPreferenceDestroy(self, pref: int) -> int:
        self._obj(pref, "pref")["destroyed"] = True
        return 0

    def _MatmulPreferenceSetAttribute(self, pref: int, attr: int, buf: int, size: int) -> int:
        obj = self._obj(pref, "pref")
        return self._set(obj, self.abi.pref_attr, self.abi.pref_attr_ctype, attr, buf, size)

    # --- the GEMM
    def _shapes(self, desc: int, a: int, b: int, c: int, d: int) -> tuple[dict[str, Any], ...]:
        dsc = self._obj(desc, "desc")
        la, lb, lc = self._obj(a, "layout"), self._obj(b, "layout"), self._obj(c, "layout")
        assert c == d, "D is laid out as C"
        ops = {v: k for k, v in self.abi.operation.items()}
        ta = ops[dsc["attrs"].get("TRANSA", self.abi.operation["N"])]
        tb = ops[dsc["attrs"].get("TRANSB", self.abi.operation["N"])]
        m, n = lc["rows"], lc["cols"]
        k = la["rows"] if ta == "T" else la["cols"]
        assert (la["cols"] if ta == "T" else la["rows"]) == m, "op(A) rows != m"
        assert (lb["rows"] if tb == "T" else lb["cols"]) == n, "op(B) cols != n"
        assert (lb["cols"] if tb == "T" else lb["rows"]) == k, "op(B) rows != k"
        return dsc, la, lb, lc, {"ta": ta == "T", "tb": tb == "T", "m": m, "n": n, "k": k}

    def _MatmulAlgoGetHeuristic(
        self,
        handle: int,
        desc: int,
        a: int,
        b: int,
        c: int,
        d: int,
        pref: int,
        requested: int,
        results: int,
        count: Any,
    ) -> int:
        self._obj(handle, "handle")
        self._obj(pref, "pref")
        self._shapes(desc, a, b, c, d)
        self.requested.append(requested)
        struct = self.abi.heuristic_result_struct()
        array = (struct * requested).from_address(results)
        limit = self._obj(pref, "pref")["attrs"].get("MAX_WORKSPACE_BYTES", 0)
        found = [i for i in self.solutions if self.workspace <= limit][:requested]
        for slot, index in zip(array, found, strict=False):
            raw = bytearray(self.abi.algo_size)
            raw[0:4] = int(index).to_bytes(4, "little", signed=True)
            ctypes.memmove(ctypes.addressof(slot.algo), bytes(raw), len(raw))
            slot.workspaceSize = self.workspace
            slot.state = self.abi.status["SUCCESS"]
            slot.wavesCount = 1.0
        count[0] = len(found)
        return 0

    def _Matmul(
        self, handle: int, desc: int, alpha: int, a: int, adesc: int, b: int, bdesc: int, beta: int,
        c: int, cdesc: int, d: int, ddesc: int, algo: int, workspace: int, ws_size: int, stream: int,
    ) -> int:  # fmt: skip
        self._obj(handle, "handle")
        dsc, la, lb, lc, s = self._shapes(desc, adesc, bdesc, cdesc, ddesc)
        index = int.from_bytes(ctypes.string_at(algo, 4), "little", signed=True)
        if index not in self.valid:
            return self.abi.status["INVALID_VALUE"] or 3
        assert ws_size >= self.workspace and workspace, "the algo's workspace was not given"
        assert all(p for p in (alpha, beta, a, b, c, d)), "NULL pointer"
        assert c == d, "in place: C is D"
        scale = (
            ctypes.c_float
            if _key(dict(self.abi.datatype), dsc["scale"], "scale") == "R_32F"
            else ctypes.c_double
        )
        al, be = scale.from_address(alpha).value, scale.from_address(beta).value
        dtype = _numpy_dtype(self.abi, lc["dtype"])
        batch = la["attrs"].get("BATCH_COUNT", 1)
        assert lb["attrs"].get("BATCH_COUNT", 1) == batch == lc["attrs"].get("BATCH_COUNT", 1)

        def view(ptr: int, lay: dict[str, Any]) -> np.ndarray:
            stride = lay["attrs"].get("STRIDED_BATCH_OFFSET", 0)
            return _matrix(
                ptr, _numpy_dtype(self.abi, lay["dtype"]), lay["rows"], lay["cols"], lay["ld"], batch, stride
            )

        ma = _as_float64(self.abi, la["dtype"], view(a, la))
        mb = _as_float64(self.abi, lb["dtype"], view(b, lb))
        mc = view(c, lc)
        opa = ma.transpose(0, 2, 1) if s["ta"] else ma
        opb = mb.transpose(0, 2, 1) if s["tb"] else mb
        result = al * (opa @ opb) * self._scales(dsc, s["m"], s["n"])
        if be != 0.0:
            result = result + be * mc.astype(np.float64)
        epilogue = _key(
            dict(self.abi.epilogue), dsc["attrs"].get("EPILOGUE", self.abi.epilogue["DEFAULT"]), "epilogue"
        )
        if "BIAS" in epilogue:
            bias_ptr = dsc["attrs"]["BIAS_POINTER"]
            assert bias_ptr, "bias epilogue without a bias pointer"
            bias_dtype = _numpy_dtype(self.abi, dsc["attrs"].get("BIAS_DATA_TYPE", lc["dtype"]))
            bias = np.frombuffer(
                (ctypes.c_char * (s["m"] * np.dtype(bias_dtype).itemsize)).from_address(bias_ptr), bias_dtype
            )
            result = result + bias.astype(np.float64)[None, :, None]  # one value per row of D
        if "RELU" in epilogue:
            result = np.maximum(result, 0)
        mc[...] = result.astype(dtype)
        self.ran.append((index, stream))
        return 0

    def _scales(self, dsc: dict[str, Any], m: int, n: int) -> Any:
        """The product's scale factors: 1, or A's (per row of D) times B's (per column of D).

        hipblaslt.h: a scale pointer is a device pointer to f32, NULL meaning 1; mode
        SCALAR_32F one value, OUTER_VEC_32F a vector of M (A) or N (B) values.
        """
        attrs = dsc["attrs"]
        factor: Any = 1.0
        for which, length, shape in (("A", m, (1, m, 1)), ("B", n, (1, 1, n))):
            ptr = attrs.get(f"{which}_SCALE_POINTER")
            if not ptr:
                continue
            mode = "SCALAR_32F"  # the default, and the only mode of tables without the attribute
            if f"{which}_SCALE_MODE" in attrs:
                mode = _key(dict(self.abi.matrix_scale), attrs[f"{which}_SCALE_MODE"], "scale mode")
            assert mode in ("SCALAR_32F", "OUTER_VEC_32F"), f"{which} scale mode {mode}"
            count = length if mode == "OUTER_VEC_32F" else 1
            values = np.frombuffer((ctypes.c_float * count).from_address(ptr), np.float32).astype(np.float64)
            factor = factor * (values.reshape(shape) if count > 1 else values[0])
        return factor


def host_hooks(target: Target) -> ArrayHooks:
    """Array hooks over NumPy arrays in host memory (what the fake library reads)."""

    @contextlib.contextmanager
    def device() -> Iterator[None]:
        yield

    def empty_strided(shape: tuple[int, ...], strides: tuple[int, ...], dtype: str) -> Any:
        npdt = np.dtype({"f32": np.float32, "f16": np.float16}.get(dtype, np.uint8))
        size = 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
        return np.lib.stride_tricks.as_strided(
            np.empty(size, npdt), shape=shape, strides=tuple(s * npdt.itemsize for s in strides)
        )

    def copy_(dst: Any, src: Any) -> None:
        dst[...] = src

    def zero_(x: Any) -> None:
        x[...] = 0

    return ArrayHooks(
        ptr=lambda x: int(x.__array_interface__["data"][0]),
        stream=lambda: STREAM,
        empty_strided=empty_strided,
        copy_=copy_,
        zero_=zero_,
        device=device,
    )


def no_shim(library: str, version: int, revision: str, abi: LtABI) -> Any:
    msg = "no extension shim in this test"
    raise ExtUnavailable(msg)


def make_backend(fake: FakeHipblaslt, ext: Any = None) -> HipblasltBackend:
    return HipblasltBackend(
        loader=lambda: (fake, LibraryChoice("fake-libhipblaslt", "test")),
        device_check=lambda: None,
        runtime_check=lambda: None,
        hooks=host_hooks,
        ext_loader=no_shim if ext is None else (lambda *args: ext),
    )


TARGET = Target(NumpyAdapter(), Device("hip", 0))
VERSION_IDS = [f"hipblaslt-{v}" for v in VERSIONS]


@pytest.mark.parametrize("abi", [HIPBLASLT_5, HIPBLASLT_6_0, HIPBLASLT_6], ids=lambda a: a.label)
def test_struct_layouts_are_the_headers(abi: LtABI) -> None:
    algo, result = abi.algo_struct(), abi.heuristic_result_struct()
    assert ctypes.sizeof(algo) == abi.algo_size == 24
    assert ctypes.sizeof(result) == abi.heuristic_result_size == 56
    for name, offset in abi.heuristic_result_offsets.items():
        assert getattr(result, name).offset == offset
    raw = (61169).to_bytes(4, "little") + bytes(20)
    assert abi.solution_index(raw) == 61169
    assert abi.solution_index((-7).to_bytes(4, "little", signed=True) + bytes(20)) == -7


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS)
def test_candidates_ask_a_large_heuristic_and_name_solution_indices(version: int) -> None:
    fake = FakeHipblaslt(version, [61169, 572, 61169, 30410])
    backend = make_backend(fake)
    problem = Problem(m=64, n=128, k=32, dtype_a="f16", dtype_b="f16", dtype_c="f16")
    found = backend.candidates(problem, TARGET)
    assert found == [solution_candidate(61169), solution_candidate(572), solution_candidate(30410)]
    assert found[0].identity == "hipblaslt/gemm?index=61169"
    assert fake.requested == [256]
    abi = fake.abi
    # hipBLASLt has no compute-type attribute: compute and scale go to MatmulDescCreate only.
    ((_out, compute, scale),) = fake.args("MatmulDescCreate")
    assert (compute, scale) == (abi.compute_type["32F"], abi.datatype["R_32F"])
    set_desc = {
        _key(dict(abi.matmul_desc_attr), attr, "attr"): size
        for _, attr, _, size in fake.args("MatmulDescSetAttribute")
    }
    assert set(set_desc) == {"TRANSA", "TRANSB"} and set(set_desc.values()) == {4}
    # Row-major C[64,128] = A[64,32] @ B[32,128] is C^T[128,64] = B^T[128,32] A^T[32,64].
    layouts = [(dtype, rows, cols, ld) for _, dtype, rows, cols, ld in fake.args("MatrixLayoutCreate")]
    f16 = abi.datatype["R_16F"]
    assert layouts == [(f16, 128, 32, 128), (f16, 32, 64, 32), (f16, 128, 64, 128)]
    ((_, attr, _, size),) = fake.args("MatmulPreferenceSetAttribute")
    assert (attr, size) == (abi.pref_attr["MAX_WORKSPACE_BYTES"], 8)
    assert all(o.get("destroyed") for o in fake.objects.values() if o["kind"] != "handle")


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS)
def test_batches_and_bias_set_the_tables_attribute_ids(version: int) -> None:
    fake = FakeHipblaslt(version, [5])
    abi = fake.abi
    backend = make_backend(fake)
    backend.candidates(Problem(m=8, n=16, k=24, batch=3), TARGET)
    sets = [(attr, size) for _, attr, _, size in fake.args("MatrixLayoutSetAttribute")]
    assert sets == [(abi.layout_attr["BATCH_COUNT"], 4), (abi.layout_attr["STRIDED_BATCH_OFFSET"], 8)] * 3
    fake.calls.clear()
    backend.candidates(Problem(m=8, n=16, k=24, epilogue="bias_relu"), TARGET)
    # What the fake read from the driver's buffers during each call.
    values = [o for o in fake.objects.values() if o["kind"] == "desc"][-1]["attrs"]
    assert values["EPILOGUE"] == abi.epilogue["RELU_BIAS"] == 6
    assert values["BIAS_DATA_TYPE"] == abi.datatype["R_32F"]


CASES = [
    Problem(m=33, n=17, k=45),
    Problem(m=33, n=17, k=45, trans_a=True),
    Problem(m=33, n=17, k=45, trans_b=True, ldb=50),
    Problem(m=20, n=12, k=9, trans_a=True, trans_b=True, lda=24, ldb=16, ldc=13),
    Problem(m=6, n=10, k=7, batch=4),
    Problem(m=24, n=8, k=16, dtype_a="f16", dtype_b="f16", dtype_c="f16"),
    Problem(m=12, n=20, k=8, epilogue="bias"),
    Problem(m=12, n=20, k=8, epilogue="bias_relu"),
    Problem(m=12, n=20, k=8, epilogue="relu"),
]


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS)
@pytest.mark.parametrize("problem", CASES, ids=lambda p: p.key)
def test_runner_computes_the_row_major_product(version: int, problem: Problem) -> None:
    fake = FakeHipblaslt(version, [11, 42])
    backend = make_backend(fake)
    runner = backend.prepare(problem, solution_candidate(42), TARGET)
    ops = make_operands(problem, NumpyAdapter(), TARGET.device, np.random.default_rng(5))
    c0 = ops.out.copy()
    tol = {"f32": 1e-5, "f16": 2e-3}[problem.dtype_a]
    for alpha, beta in ((1.0, 0.0), (0.5, 2.0)):
        ops.out[...] = c0 if beta else np.nan
        runner(ops.a, ops.b, ops.out, alpha, beta, ops.bias)
        ref = alpha * (ops.a.astype(np.float64) @ ops.b.astype(np.float64)) + beta * c0.astype(np.float64)
        if ops.bias is not None:
            ref = ref + ops.bias.astype(np.float64)
        if problem.activation == "relu":
            ref = np.maximum(ref, 0)
        err = np.linalg.norm(ops.out.astype(np.float64) - ref) / np.linalg.norm(ref)
        assert err < tol, err
    assert fake.ran == [(42, STREAM), (42, STREAM)]


def test_prepare_and_check_rebuild_by_heuristic_match() -> None:
    fake = FakeHipblaslt(1000, [7, 8, 9])
    backend = make_backend(fake)
    problem = Problem(m=16, n=16, k=16)
    assert backend.check(problem, solution_candidate(8), TARGET)
    assert not backend.check(problem, solution_candidate(61169), TARGET)
    with pytest.raises(UnsupportedProblem, match="not among the 3 the heuristic returns"):
        backend.prepare(problem, solution_candidate(61169), TARGET)
    # The rebuild asks for many results, and the answer is reused for the same layout.
    assert fake.requested == [1024]
    backend.prepare(problem, solution_candidate(9), TARGET)
    assert fake.requested == [1024]


def test_workspace_over_the_limit_is_not_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeHipblaslt(1000, [1], workspace=64 << 20)
    backend = make_backend(fake)
    assert backend.candidates(Problem(m=16, n=16, k=16), TARGET) == []
    monkeypatch.setenv("UNIMATMUL_LT_WORKSPACE_MB", "128")
    assert backend.candidates(Problem(m=16, n=16, k=16), TARGET) == [solution_candidate(1)]


def test_heuristic_count_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeHipblaslt(1000, list(range(1, 40)))
    backend = make_backend(fake)
    monkeypatch.setenv("UNIMATMUL_HIPBLASLT_HEURISTICS", "8")
    assert len(backend.candidates(Problem(m=16, n=16, k=16), TARGET)) == 8
    assert fake.requested == [8]


@pytest.mark.parametrize("version", VERSIONS, ids=VERSION_IDS)
def test_version_is_written_as_torch_writes_it(version: int) -> None:
    fake = FakeHipblaslt(version, [])
    backend = make_backend(fake)
    assert backend.availability() is None
    assert backend.versions() == {"hipblaslt": f"{version}-a6254b89-dirty"}
    assert backend.driver().abi is VERSIONS[version]


@pytest.mark.parametrize("version", [100, 250, 450])
def test_versions_without_a_stable_identity_are_refused(version: int) -> None:
    with pytest.raises(Exception, match=r"no solution index|never released"):
        select_abi(version)


def test_unsupported_problems_are_refused_before_any_call() -> None:
    fake = FakeHipblaslt(1000, [1])
    backend = make_backend(fake)
    with pytest.raises(UnsupportedProblem, match="gelu_tanh"):
        backend.candidates(Problem(m=8, n=8, k=8, epilogue="gelu"), TARGET)
    with pytest.raises(UnsupportedProblem):
        backend.candidates(
            Problem(m=8, n=8, k=8, dtype_a="f64", dtype_b="f64", dtype_c="f64", compute="f64"), TARGET
        )
    assert fake.args("MatmulAlgoGetHeuristic") == []


def test_without_rocm_the_backend_says_why() -> None:
    """The real loader and device check on this machine (no ROCm, no HIP device)."""
    reason = HipblasltBackend().availability()
    assert reason is not None and "libhipblaslt" in reason


def test_no_device_means_no_handle_is_made() -> None:
    """The real hipblasLtCreate ends the process when no device is visible (7.1.1, see
    tests/amd_real): the HIP device count runs first, and its answer is the reason."""
    fake = FakeHipblaslt(100100, [1])
    backend = HipblasltBackend(
        loader=lambda: (fake, LibraryChoice("fake-libhipblaslt", "test")),
        device_check=lambda: None,
        runtime_check=lambda: "no HIP device: hipGetDeviceCount of test returned hipErrorNoDevice (100)",
        hooks=host_hooks,
    )
    reason = backend.availability()
    assert (
        reason
        == "libhipblaslt: OSError: no HIP device: hipGetDeviceCount of test returned hipErrorNoDevice (100)"
    )
    with pytest.raises(UnsupportedProblem, match="no HIP device"):
        backend.versions()
    assert fake.calls == []  # not even hipblasLtCreate


# --- the extension shim (getAllAlgos, getAlgosFromIndex, support check, kernel names) ----


class FakeExt:
    """The shim's calls over one build's solution table (``ExtAPI``).

    ``table`` maps solution index -> (solution name, largest m it supports, workspace):
    what ``getAllAlgos`` lists for every type, what ``getAlgosFromIndex`` finds, what
    ``matmulIsAlgoSupported`` accepts for a plan (its column-major m no larger than the
    limit) and ``getSolutionNameFromAlgo`` names; ``getKernelNameFromAlgo`` is the name
    without its ``_GSU<n>`` part, as in the real tables, where many solutions share one
    kernel. The runs go through the fake library, which accepts exactly these indices.
    """

    has_kernel_name = True

    def __init__(self, fake: FakeHipblaslt, table: dict[int, tuple[str, int, int]]) -> None:
        self.fake, self.table = fake, table
        fake.valid = set(fake.solutions) | set(table)
        self.listed = 0
        self.looked_up: list[list[int]] = []

    def _algo(self, index: int) -> LtAlgo:
        return LtAlgo(int(index).to_bytes(4, "little", signed=True) + bytes(20), 0, 0.0)

    def all_algos(self, plan: Any) -> list[LtAlgo]:
        self.listed += 1
        return [self._algo(i) for i in self.table]

    def from_index(self, plan: Any, indices: Any) -> list[LtAlgo]:
        self.looked_up.append(list(indices))
        return [self._algo(i) for i in indices if i in self.table]

    def supported(self, plan: Any, algo: LtAlgo) -> LtAlgo | None:
        index = int.from_bytes(algo.data[:4], "little", signed=True)
        found = self.table.get(index)
        if found is None or plan.gemm.m > found[1]:
            return None
        # The library writes the problem into the algo's other bytes: kept from here on.
        return LtAlgo(algo.data[:4] + b"\x01" * 20, found[2], algo.waves)

    def solution_name(self, plan: Any, algo: LtAlgo) -> str:
        index = int.from_bytes(algo.data[:4], "little", signed=True)
        return self.table[index][0] if index in self.table else ""

    def kernel_name(self, plan: Any, algo: LtAlgo) -> str:
        return re.sub(r"_GSU\d+", "", self.solution_name(plan, algo))


def kernel(mt0: int, mt1: int, gsu: int = 1) -> str:
    """A solution name in Tensile's form (macro tile, GSU)."""
    return f"Cijk_Ailk_Bljk_HHS_BH_MT{mt0}x{mt1}x32_MI16x16x16x1_SN_GSU{gsu}_LDSB0"


def test_tile_order_prefers_tiles_that_fit_then_larger_ones() -> None:
    # A 64 x 64 output: a 64x64 tile covers it exactly, a 128x128 one is three quarters padding.
    assert tile_order(64, 64, kernel(64, 64)) < tile_order(64, 64, kernel(128, 128))
    # A large one is covered by both: the larger tile reuses more of each loaded byte.
    assert tile_order(4096, 4096, kernel(256, 128)) < tile_order(4096, 4096, kernel(64, 64))
    assert tile_order(64, 64, "no tile here") > tile_order(64, 64, kernel(256, 256))


def test_the_shim_offers_every_supported_solution_of_the_type() -> None:
    """The pool is TunableOp's: all of getAllAlgos's solutions that support the problem."""
    fake = FakeHipblaslt(100100, [30, 10])  # the heuristic's answer, best first
    table = {
        10: (kernel(64, 64), 1 << 20, 4096),
        20: (kernel(256, 256), 1 << 20, 4096),  # supported, mostly padding for this problem
        30: (kernel(128, 64), 1 << 20, 4096),
        40: (kernel(128, 128), 1 << 20, 4096),
        50: (kernel(64, 64), 16, 4096),  # the support check refuses m = 128
        60: (kernel(64, 64), 1 << 20, 1 << 40),  # over the workspace limit
    }
    ext = FakeExt(fake, table)
    backend = make_backend(fake, ext)
    problem = Problem(m=64, n=128, k=32, dtype_a="f16", dtype_b="f16", dtype_c="f16")
    found = backend.candidates(problem, TARGET)
    # The heuristic's first, in its order; then the rest by the analytic order; all named.
    assert [c.param("index") for c in found] == [30, 10, 40, 20]
    assert found[0] == solution_candidate(30, kernel(128, 64))
    assert found[0].identity == f"hipblaslt/gemm?index=30&solution=s:{name_fingerprint(kernel(128, 64))}"
    assert backend.last_search == {"type_pool": 6, "offered": 2, "seeds": 2}
    # The type's list is asked once and reused for the next problem of the type.
    backend.candidates(Problem(m=32, n=128, k=32, dtype_a="f16", dtype_b="f16", dtype_c="f16"), TARGET)
    assert ext.listed == 1


def test_the_pool_setting_caps_or_turns_off_the_shim(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeHipblaslt(100100, [10])
    table = {i: (kernel(64, 64 * (i % 3 + 1)), 1 << 20, 4096) for i in range(10, 20)}
    monkeypatch.setenv("UNIMATMUL_HIPBLASLT_POOL", "3")
    found = make_backend(fake, FakeExt(fake, table)).candidates(Problem(m=64, n=64, k=16), TARGET)
    assert len(found) == 1 + 3
    monkeypatch.setenv("UNIMATMUL_HIPBLASLT_POOL", "0")
    found = make_backend(fake, FakeExt(fake, table)).candidates(Problem(m=64, n=64, k=16), TARGET)
    assert [c.param("index") for c in found] == [10]


@pytest.mark.parametrize("problem", CASES[:4], ids=lambda p: p.key)
def test_an_index_outside_the_heuristic_is_rebuilt_by_index_and_runs(problem: Problem) -> None:
    """A TunableOp winner the heuristic never returns: getAlgosFromIndex, then the product."""
    fake = FakeHipblaslt(100100, [11])
    ext = FakeExt(fake, {11: (kernel(64, 64), 1 << 20, 4096), 61169: (kernel(128, 128), 1 << 20, 4096)})
    backend = make_backend(fake, ext)
    runner = backend.prepare(problem, solution_candidate(61169), TARGET)
    assert ext.looked_up == [[61169]]
    ops = make_operands(problem, NumpyAdapter(), TARGET.device, np.random.default_rng(3))
    runner(ops.a, ops.b, ops.out, 1.0, 0.0, ops.bias)
    ref = ops.a.astype(np.float64) @ ops.b.astype(np.float64)
    assert np.linalg.norm(ops.out - ref) / np.linalg.norm(ref) < 1e-5
    assert fake.ran == [(61169, STREAM)]
    assert backend.check(problem, solution_candidate(61169), TARGET)
    assert not backend.check(problem, solution_candidate(777), TARGET)  # not in this build


def test_a_moved_solution_is_found_by_name_never_run_as_another() -> None:
    """Indices move between builds: the stored solution name decides what runs."""
    fake = FakeHipblaslt(100100, [])
    # This build numbers the measured kernel 9; index 5 is now another kernel.
    ext = FakeExt(fake, {5: (kernel(64, 64), 1 << 20, 4096), 9: (kernel(128, 128), 1 << 20, 4096)})
    backend = make_backend(fake, ext)
    problem = Problem(m=16, n=16, k=16)
    runner = backend.prepare(problem, solution_candidate(5, kernel(128, 128)), TARGET)
    ops = make_operands(problem, NumpyAdapter(), TARGET.device, np.random.default_rng(4))
    runner(ops.a, ops.b, ops.out)
    assert fake.ran == [(9, STREAM)]
    # Same index, same name: that index runs.
    backend.prepare(problem, solution_candidate(5, kernel(64, 64)), TARGET)(ops.a, ops.b, ops.out)
    assert fake.ran[-1] == (5, STREAM)
    # A name no solution of this build has: refused (the selector re-tunes or uses Default).
    gone = solution_candidate(5, kernel(32, 32))
    with pytest.raises(UnsupportedProblem, match="no longer is the solution named"):
        backend.prepare(problem, gone, TARGET)
    assert not backend.check(problem, gone, TARGET)


def test_without_the_shim_a_named_index_is_refused_and_the_heuristic_stays() -> None:
    fake = FakeHipblaslt(100100, [5, 6])
    backend = make_backend(fake)
    problem = Problem(m=16, n=16, k=16)
    assert backend.candidates(problem, TARGET) == [solution_candidate(5), solution_candidate(6)]
    assert backend.ext is None and "no extension shim in this test" in backend.ext_reason
    with pytest.raises(UnsupportedProblem, match="cannot say which solution"):
        backend.prepare(problem, solution_candidate(5, kernel(64, 64)), TARGET)
    backend.prepare(problem, solution_candidate(5), TARGET)  # an index alone: the heuristic's


def test_solutions_sharing_a_kernel_are_told_apart_by_the_solution_name() -> None:
    """The same kernel with another GSU is another solution: never picked for the stored one."""
    fake = FakeHipblaslt(100100, [])
    ext = FakeExt(
        fake, {3: (kernel(64, 64, gsu=1), 1 << 20, 4096), 4: (kernel(64, 64, gsu=2), 1 << 20, 4096)}
    )
    assert ext.kernel_name(None, ext._algo(3)) == ext.kernel_name(None, ext._algo(4))
    backend = make_backend(fake, ext)
    problem = Problem(m=16, n=16, k=16)
    ops = make_operands(problem, NumpyAdapter(), TARGET.device, np.random.default_rng(8))
    # Measured as index 7 (another build's number) with GSU 2: this build's 4 runs.
    backend.prepare(problem, solution_candidate(7, kernel(64, 64, gsu=2)), TARGET)(ops.a, ops.b, ops.out)
    assert fake.ran == [(4, STREAM)]


def measured(backend: HipblasltBackend, problem: Problem, target: Target, default: Any) -> dict[str, Any]:
    """The harness's results for Default (``default()`` its runner) and every candidate the
    backend offers, by identity; each candidate passed the numeric check against float64 (a
    fake's Python product is slower than Default, so it may be pruned after it, never rejected)."""
    from unimatmul.backend import DEFAULT
    from unimatmul.cache.record import OK, PRUNED
    from unimatmul.testing import fast_config
    from unimatmul.tuning.harness import CpuTimer, Harness

    candidates = backend.candidates(problem, target)
    entries: list[Any] = [(DEFAULT, default)]
    entries += [(c, lambda c=c: backend.prepare(problem, c, target)) for c in candidates]
    record = Harness(CpuTimer(), fast_config()).measure(problem, target, entries)
    results = {r.identity: r for r in record.results}
    for c in candidates:
        assert results[c.identity].status in (OK, PRUNED), results[c.identity]
        assert results[c.identity].error is not None and results[c.identity].error < 1e-5
    return {c.identity: results[c.identity] for c in candidates}


def test_the_harness_measures_the_pool_and_the_best_reruns_by_name_in_another_build() -> None:
    """Tuning over the pool: every supported solution measured and checked against float64,
    and the best one's identity runs the same solution where the build numbers it anew."""
    from unimatmul.backend import Candidate
    from unimatmul.core.runners import DefaultRunner

    names = {10: kernel(64, 64), 20: kernel(128, 64), 30: kernel(32, 32, gsu=2), 40: kernel(64, 32)}
    fake = FakeHipblaslt(100100, [10])  # the heuristic knows one of them
    table = {i: (name, 1 << 20, 4096) for i, name in names.items()}
    table[40] = (names[40], 8, 4096)  # refuses this problem
    backend = make_backend(fake, FakeExt(fake, table))
    problem = Problem(m=48, n=40, k=32)
    results = measured(backend, problem, TARGET, lambda: DefaultRunner(TARGET.adapter))
    # The heuristic's, then the tile order.
    assert [Candidate.from_identity(i).param("index") for i in results] == [10, 30, 20]
    assert {index for index, _stream in fake.ran} == {10, 20, 30}
    best = min((r.median_s or math.inf, identity) for identity, r in results.items())[1]
    # Another build of the library: the same solutions under other numbers.
    moved = FakeHipblaslt(100100, [])
    rebuilt = make_backend(moved, FakeExt(moved, {i + 1000: row for i, row in table.items()}))
    stored = Candidate.from_identity(best)
    ops = make_operands(problem, NumpyAdapter(), TARGET.device, np.random.default_rng(9))
    rebuilt.prepare(problem, stored, TARGET)(ops.a, ops.b, ops.out)
    assert moved.ran == [(int(stored.param("index")) + 1000, STREAM)]
    ref = ops.a.astype(np.float64) @ ops.b.astype(np.float64)
    assert np.linalg.norm(ops.out - ref) / np.linalg.norm(ref) < 1e-5


def test_a_named_identity_is_refused_where_the_shim_has_no_names() -> None:
    """Headers without the name functions: an index alone cannot vouch for a measured name."""
    fake = FakeHipblaslt(100100, [])
    ext = FakeExt(fake, {5: (kernel(64, 64), 1 << 20, 4096)})
    ext.has_kernel_name = False
    backend = make_backend(fake, ext)
    problem = Problem(m=16, n=16, k=16)
    with pytest.raises(UnsupportedProblem, match="no names to check it"):
        backend.prepare(problem, solution_candidate(5, kernel(64, 64)), TARGET)
    backend.prepare(problem, solution_candidate(5), TARGET)  # by index, as TunableOp rebuilds it


# --- grouped GEMMs: the shim's GroupedGemm offered by the backend ----------------------------
# The fake shim (tests/hipblaslt_ext_fakes.py) computes, on host memory, the grouped product its
# user arguments describe; the runner writes them with real torch ops. So the tensors are CPU
# ones, and the target is the CPU's: its torch device is where the runner keeps its argument
# template (on ROCm, the HIP device's). The backend's hooks are the test's, over torch tensors.


def torch_host_hooks(target: Target) -> ArrayHooks:
    """Array hooks over CPU torch tensors (the memory the fake shim reads and writes)."""
    import torch

    @contextlib.contextmanager
    def device() -> Iterator[None]:
        yield

    def empty_strided(shape: tuple[int, ...], strides: tuple[int, ...], dtype: str) -> Any:
        return torch.empty_strided(shape, strides, dtype={"f32": torch.float32}.get(dtype, torch.uint8))

    def copy_(dst: Any, src: Any) -> None:
        dst.copy_(src)

    def zero_(x: Any) -> None:
        x.zero_()

    return ArrayHooks(
        ptr=torch.Tensor.data_ptr,
        stream=lambda: STREAM,
        empty_strided=empty_strided,
        copy_=copy_,
        zero_=zero_,
        device=device,
    )


def grouped_backend(shim: Any, **kwargs: Any) -> tuple[HipblasltBackend, FakeHipblaslt]:
    """The backend on the fake library and the real binder over the fake shim ``shim``."""
    from hipblaslt_ext_fakes import ABI, VERSION

    from unimatmul_backends.rocm.hipblaslt_ext import HipblasltExt

    fake = FakeHipblaslt(VERSION, [1])
    assert fake.abi is ABI
    backend = HipblasltBackend(
        loader=lambda: (fake, LibraryChoice("fake-libhipblaslt", "test")),
        device_check=kwargs.pop("device_check", lambda: None),
        runtime_check=kwargs.pop("runtime_check", lambda: None),
        hooks=torch_host_hooks,
        ext_loader=lambda *args: HipblasltExt(shim, ABI, VERSION),
    )
    return backend, fake


def torch_target() -> Target:
    return Target(adapter_for_kind("torch"), Device("cpu"))


def test_grouped_problems_get_the_shims_grouped_solutions_as_candidates() -> None:
    from hipblaslt_ext_fakes import ABI, FakeShim

    from unimatmul.core.grouped import grouped_problem
    from unimatmul_backends.rocm import hipblaslt_ext

    names = {0: "S_zero", 2: "S_two", 4: "S_four"}
    shim = FakeShim([0, 1, 2, 3, 4], solution_names=names)
    backend, fake = grouped_backend(shim)
    assert "grouped_gemm" in backend.ops
    problem = grouped_problem(4, 16, 8, 12, "f32")  # x [16, 12] @ w[g].t(), w [4, 8, 12]
    target = torch_target()
    found = backend.candidates(problem, target)
    # Odd solutions refuse the problem (the fake's support check); each named by its solution.
    assert [c.identity for c in found] == [
        f"hipblaslt/grouped?index={i}&solution=s:{name_fingerprint(names[i])}" for i in (0, 2, 4)
    ]
    f32, c32 = ABI.datatype["R_32F"], ABI.compute_type["32F"]
    op_t, op_n = ABI.operation["T"], ABI.operation["N"]
    assert shim.listed_types == [(hipblaslt_ext.GEMM_TYPE_GROUPED, op_t, op_n, f32, f32, f32, f32, c32)]
    ((listing, made),) = shim.instances.items()
    # On the dense backend's one handle, set up for the bucket: column-major m = N, n = rows.
    assert made["handle"] == backend.driver().handle
    assert (made["m"], made["n"], made["k"]) == ([8] * 4, [16, 1, 1, 1], [12] * 4)
    assert made["max_workspace"] == backend.workspace_limit
    assert shim.destroyed == [listing]  # the listing's GroupedGemm is freed at once
    assert all(backend.check(problem, c, target) for c in found)
    assert not backend.check(problem, Candidate.make("hipblaslt", "grouped", index=1), target)
    assert not backend.check(problem, solution_candidate(0), target)  # a dense identity
    with pytest.raises(UnsupportedProblem, match="not a hipBLASLt grouped candidate"):
        backend.prepare(problem, solution_candidate(0), target)
    assert len(shim.instances) == 1  # check and a refused prepare reuse the listing
    # The dense path is untouched: a plain GEMM gets the heuristic's solution, then the pool's.
    dense = backend.candidates(Problem(m=16, n=16, k=16), target)
    assert [(c.name, c.param("index")) for c in dense] == [("gemm", i) for i in (1, 0, 2, 4)]
    assert backend.versions() == {"hipblaslt": f"{fake.version}-a6254b89-dirty"}


@pytest.mark.parametrize("weights_nk", [True, False], ids=["w.t()", "w"])
def test_the_backends_grouped_runner_matches_a_float64_reference(weights_nk: bool) -> None:
    """prepare() through the grouped binding; the runner on several offs of one bucket."""
    import torch
    from grouped_cases import close, offs_of, reference
    from hipblaslt_ext_fakes import FakeShim

    from unimatmul.core.grouped import grouped_problem_of
    from unimatmul_backends.rocm.hipblaslt_grouped import HipblasltGroupedRunner

    shim = FakeShim([0, 2, 3])
    backend, _ = grouped_backend(shim)
    target = torch_target()
    groups, rows, n, k = 4, 29, 24, 40
    gen = torch.Generator().manual_seed(5)
    sign = torch.tensor([-1.0, 1.0])
    x = (torch.rand(rows, k, generator=gen) + 0.5) * sign[torch.randint(0, 2, (rows, k), generator=gen)]
    w = torch.rand(groups, n, k, generator=gen) + 0.5  # [G, N, K], as MoE weights are stored
    b = w.transpose(-2, -1) if weights_nk else w.transpose(-2, -1).contiguous()
    problem = grouped_problem_of(adapter_for_kind("torch"), x, b, offs_of([7, 7, 7, 8]))
    assert (problem.jagged, problem.m, problem.batch, problem.trans_b) == ("m", 32, groups, weights_nk)
    (first, second) = backend.candidates(problem, target)
    runner = backend.prepare(problem, second, target)
    assert isinstance(runner, HipblasltGroupedRunner) and runner.candidate == second
    made = shim.instances[runner.grouped.ptr]
    assert made["initialized"] == [(2, runner.workspace.data_ptr(), 1, STREAM)]  # 2 KiB of workspace
    assert runner.workspace.numel() >= 2048
    for sizes in ([7, 7, 7, 8], [0, 29, 0, 0], [3, 0, 11, 9], [1, 2, 3, 4], [0, 0, 0, 0]):
        offs = offs_of(sizes)
        out = torch.full((rows, n), float("nan"))
        runner(x, b, out, 1.0, 0.0, None, offs)
        want = reference("m", x, b, offs)
        assert close(out, want, "f32"), sizes
        covered = sum(sizes)
        assert torch.isnan(out[covered:]).all(), sizes  # rows in no group are not written
    # The Default agrees (torch's own grouped product on the same operands).
    offs = offs_of([3, 0, 11, 9])
    out = torch.full((rows, n), float("nan"))
    runner(x, b, out, 1.0, 0.0, None, offs)
    torch.testing.assert_close(out[:23], torch._grouped_mm(x, b, offs)[:23], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="no alpha, beta or bias"):
        runner(x, b, out, 2.0, 0.0, None, offs)
    assert backend.check(problem, first, target)


class _GroupedSuite:
    """The parts of the conformance suite (``SuiteContext``) its grouped checks read."""

    def __init__(self, backend: HipblasltBackend, target: Target) -> None:
        self.backend, self.seed, self.targets = backend, 0xC0FFEE, {"torch": target}
        self._offered: dict[str, Any] = {}

    def offered(self, case: Any) -> Any:
        key = case.problem.key
        if key not in self._offered:
            try:
                self._offered[key] = self.backend.candidates(case.problem, self.targets["torch"])
            except Exception as exc:
                self._offered[key] = exc
        return self._offered[key]


def test_the_conformance_suites_grouped_checks_pass_on_the_fake_shim() -> None:
    """Every grouped problem of the suite's f32 matrix: candidates() listed and checked, each
    candidate right on every distribution of offs against the float64 reference (the
    harness's own comparison, canaries around the output); the forms the candidate does not
    compute are refused with UnsupportedProblem naming the form."""
    from hipblaslt_ext_fakes import FakeShim

    from unimatmul.core.grouped import grouped_problem
    from unimatmul_conformance.checks import check_candidates
    from unimatmul_conformance.grouped import SHAPES, check_grouped
    from unimatmul_conformance.matrix import Case
    from unimatmul_conformance.report import PASSED

    backend, _ = grouped_backend(FakeShim([0, 2]))
    suite: Any = _GroupedSuite(backend, torch_target())
    ran = 0
    for jagged in ("m", "k", "n", "none"):
        for groups, m, n, k in SHAPES:
            problem = grouped_problem(groups, m, n, k, "f32", jagged=jagged)
            case = Case(problem, kind="torch")
            status, why = check_candidates(suite, case)
            assert status == PASSED, (problem.key, why)
            offered = suite.offered(case)
            if jagged != "m":
                assert isinstance(offered, UnsupportedProblem), problem.key
                assert f"only the 2-D x 3-D form (offs over a's rows), not jagged={jagged!r}" in str(offered)
                continue
            assert len(offered) == 2
            for candidate in offered:
                status, why = check_grouped(suite, problem, candidate)
                assert status == PASSED, (problem.key, candidate.identity, why)
                ran += 1
    assert ran == 2 * len(SHAPES)


def test_the_harness_tunes_a_grouped_problem_over_the_backends_candidates() -> None:
    """The Tuner's measurement on the backend's grouped candidates: each checked against the
    float64 reference on the harness's distributions of offs, none rejected."""
    from hipblaslt_ext_fakes import FakeShim

    from unimatmul.core.grouped import GroupedDefaultRunner, grouped_problem

    backend, _ = grouped_backend(FakeShim([0, 2, 4]))
    target = torch_target()
    results = measured(
        backend, grouped_problem(4, 32, 16, 24, "f32"), target, lambda: GroupedDefaultRunner(target.adapter)
    )
    assert [Candidate.from_identity(i).param("index") for i in results] == [0, 2, 4]


def test_grouped_gemms_without_a_device_library_or_shim_say_why() -> None:
    from hipblaslt_ext_fakes import VERSION, FakeShim

    from unimatmul.core.grouped import grouped_problem
    from unimatmul_backends.rocm.hipblaslt_ext import GROUPED_HOST

    problem, target = grouped_problem(4, 16, 8, 12, "f32"), torch_target()
    # No HIP device: no handle is made (hipblasLtCreate would end the process), nothing set up.
    shim = FakeShim([0])
    no_device = "no HIP device: hipGetDeviceCount of test returned hipErrorNoDevice (100)"
    backend, fake = grouped_backend(shim, runtime_check=lambda: no_device)
    assert backend.availability() == f"libhipblaslt: OSError: {no_device}"
    with pytest.raises(UnsupportedProblem, match="no HIP device"):
        backend.candidates(problem, target)
    assert not backend.check(problem, Candidate.make("hipblaslt", "grouped", index=0), target)
    with pytest.raises(UnsupportedProblem, match="no HIP device"):
        backend.prepare(problem, Candidate.make("hipblaslt", "grouped", index=0), target)
    assert fake.calls == [] and shim.instances == {}
    # This machine: no ROCm at all.
    real = HipblasltBackend()
    reason = real.availability()
    assert reason is not None and "libhipblaslt" in reason
    with pytest.raises(UnsupportedProblem, match="hipblaslt is unavailable"):
        real.candidates(problem, target)
    # No shim, a shim without the user-args form, a shim with no GroupedGemm at all.
    fake = FakeHipblaslt(VERSION, [1])
    no_shim_backend = make_backend(fake)
    with pytest.raises(UnsupportedProblem, match=r"no hipBLASLt extension shim \(ExtUnavailable: no ext"):
        no_shim_backend.candidates(problem, target)
    assert no_shim_backend.candidates(Problem(m=8, n=8, k=8), TARGET) == [solution_candidate(1)]
    host_only, _ = grouped_backend(FakeShim([0], grouped=GROUPED_HOST))
    with pytest.raises(UnsupportedProblem, match="lacks the user-args form"):
        host_only.candidates(problem, target)
    with pytest.raises(UnsupportedProblem, match="has no GroupedGemm"):
        make_backend(fake, FakeExt(fake, {})).candidates(problem, target)
    # The library refuses the problem at set-up.
    refusing = FakeShim([0])
    refusing.refuse_problem = True
    backend, _ = grouped_backend(refusing)
    with pytest.raises(UnsupportedProblem, match=r"has no grouped GEMM for .*setProblem failed"):
        backend.candidates(problem, target)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"jagged": "k"}, "not jagged='k'"),
        ({"jagged": "n"}, "not jagged='n'"),
        ({"jagged": "none"}, "not jagged='none'"),
        ({"trans_a": True}, "a must be row-major"),
    ],
)
def test_grouped_forms_the_candidate_lacks_are_refused_before_any_library_call(
    change: dict[str, Any], why: str
) -> None:
    from hipblaslt_ext_fakes import FakeShim

    from unimatmul.core.grouped import grouped_problem

    shim = FakeShim([0])
    backend, fake = grouped_backend(shim)
    problem = grouped_problem(4, 16, 8, 16, "f32", jagged=change.pop("jagged", "m"))
    if change:
        problem = Problem(**{**problem.__dict__, **change, "lda": 0})
    with pytest.raises(UnsupportedProblem, match=why):
        backend.candidates(problem, torch_target())
    assert fake.calls == [] and shim.listed_types == []


def test_grouped_solutions_over_the_workspace_limit_are_not_offered(monkeypatch: pytest.MonkeyPatch) -> None:
    from hipblaslt_ext_fakes import FakeShim

    from unimatmul.core.grouped import grouped_problem

    backend, _ = grouped_backend(FakeShim([0, 2048]))  # the fake's solution 2048 needs 2 MiB
    problem, target = grouped_problem(4, 16, 8, 12, "f32"), torch_target()
    assert [c.param("index") for c in backend.candidates(problem, target)] == [0, 2048]
    monkeypatch.setenv("UNIMATMUL_LT_WORKSPACE_MB", "1")
    assert [c.param("index") for c in backend.candidates(problem, target)] == [0]
    assert not backend.check(problem, Candidate.make("hipblaslt", "grouped", index=2048), target)
