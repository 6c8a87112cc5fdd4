"""The Lt driver against a recording fake library, on the cuBLASLt ABI table.

No GPU and no vendor library: :class:`RecordingLtLibrary` implements the LtLibrary
protocol in Python, records every call, and keeps descriptor state so that the tests
can check what the driver asked for (layouts, transposes, epilogue, the pointer order
of the matmul call). The same fake takes any ABI table, so a hipBLASLt test can reuse
it with a hip table (its algo-config functions then raise, as hipBLASLt has none).
The GPU tests (tests/backends/cuda/*_gpu.py) run the same driver on the real library.
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from unimatmul.backend import Candidate, Target
from unimatmul.core.arrays import Device
from unimatmul.core.errors import UnsupportedProblem
from unimatmul.core.problem import Problem
from unimatmul_backends.lt.abi import CUBLASLT_13, HIPBLASLT_6, LtABI
from unimatmul_backends.lt.backend import LtBackend
from unimatmul_backends.lt.driver import (
    CONFIG_PARAMS,
    CtypesLtLibrary,
    CublasLtConfig,
    LtAlgo,
    LtDriver,
    LtError,
    LtPlan,
    function_addresses,
)
from unimatmul_backends.lt.layout import lt_gemm
from unimatmul_backends.lt.runner import ArrayHooks, LtRunner, PaddedRunner, no_device


class RecordingLtLibrary:
    """A fake Lt library: records calls, keeps descriptor attributes, offers fake algos.

    Algo structs encode their configuration as uint32 at offset ``4 * attribute id``,
    so that config get/set and the heuristic results agree the way the real library's
    do. The heuristic proposes ``len(self.configs)`` algos.
    """

    def __init__(self, abi: LtABI, configs: list[dict[str, int]] | None = None) -> None:
        self.abi = abi
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self._ids = itertools.count(0x1000, 0x10)
        self.objects: dict[int, dict[str, Any]] = {}
        self.destroyed: list[int] = []
        self.configs = configs or [
            {"algo": 66, "tile": 20, "stages": 33, "inner": 12, "cluster": 2},
            {"algo": 66, "tile": 18, "stages": 33, "inner": 12, "cluster": 3},
            {"algo": 31, "tile": 15, "stages": 10, "splitk": 2, "reduction": 1},
            {"algo": 66, "tile": 20, "stages": 33, "inner": 12, "cluster": 2},  # a duplicate
        ]
        self.rejected_ids: set[int] = set()
        self.workspace = 4096

    def _new(self, kind: str, **state: Any) -> int:
        handle = next(self._ids)
        self.objects[handle] = {"kind": kind, **state}
        return handle

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    # -- handle
    def create(self) -> int:
        self._record("create")
        return self._new("handle")

    def destroy(self, handle: int) -> None:
        self._record("destroy", handle)
        self.destroyed.append(handle)

    def get_version(self) -> int:
        return 130100 if self.abi.name == "cublaslt" else 100100

    # -- descriptors
    def matrix_layout_create(self, dtype: int, rows: int, cols: int, ld: int) -> int:
        self._record("matrix_layout_create", dtype, rows, cols, ld)
        return self._new("layout", dtype=dtype, rows=rows, cols=cols, ld=ld, attrs={})

    def matrix_layout_destroy(self, layout: int) -> None:
        self._record("matrix_layout_destroy", layout)
        self.destroyed.append(layout)

    def matrix_layout_set_attribute(self, layout: int, attr: int, buf: int, size: int) -> None:
        self._record("matrix_layout_set_attribute", layout, attr, size)
        self.objects[layout]["attrs"][attr] = _read(buf, size)

    def matmul_desc_create(self, compute_type: int, scale_type: int) -> int:
        self._record("matmul_desc_create", compute_type, scale_type)
        return self._new("desc", compute=compute_type, scale=scale_type, attrs={})

    def matmul_desc_destroy(self, desc: int) -> None:
        self._record("matmul_desc_destroy", desc)
        self.destroyed.append(desc)

    def matmul_desc_set_attribute(self, desc: int, attr: int, buf: int, size: int) -> None:
        self._record("matmul_desc_set_attribute", desc, attr, size)
        self.objects[desc]["attrs"][attr] = _read(buf, size)

    def matmul_preference_create(self) -> int:
        self._record("matmul_preference_create")
        return self._new("pref", attrs={})

    def matmul_preference_destroy(self, pref: int) -> None:
        self._record("matmul_preference_destroy", pref)
        self.destroyed.append(pref)

    def matmul_preference_set_attribute(self, pref: int, attr: int, buf: int, size: int) -> None:
        self._record("matmul_preference_set_attribute", pref, attr, size)
        self.objects[pref]["attrs"][attr] = _read(buf, size)

    # -- algos
    def _write_config(self, algo: int, config: dict[str, int]) -> None:
        for param, key in CONFIG_PARAMS:
            if key in self.abi.algo_config_attr:
                ctypes.c_uint32.from_address(algo + 4 * self.abi.algo_config_attr[key]).value = config.get(
                    param, 1 if param == "splitk" else 0
                )

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
        self._record("matmul_algo_get_heuristic", handle, desc, adesc, bdesc, cdesc, ddesc, pref, requested)
        size = self.abi.heuristic_result_size
        offsets = self.abi.heuristic_result_offsets
        n = min(requested, len(self.configs))
        for i in range(n):
            base = results + i * size
            if self.abi.algo_config_attr:
                self._write_config(base, self.configs[i])
            else:  # hipBLASLt: the solution index in the first 4 bytes
                ctypes.c_int32.from_address(base).value = 1000 + i
            ctypes.c_size_t.from_address(base + offsets["workspaceSize"]).value = self.workspace
            ctypes.c_int.from_address(base + offsets["state"]).value = 0
        ctypes.c_int.from_address(count).value = n

    def matmul(self, *args: int) -> None:
        self._record("matmul", *args)

    def matmul_algo_get_ids(self, handle: int, *types_and_count: int) -> tuple[int, ...]:
        self._record("matmul_algo_get_ids", handle, *types_and_count)
        return (31, 66)

    def matmul_algo_init(self, handle: int, *args: int) -> None:
        self._record("matmul_algo_init", handle, *args)
        *_types, algo_id, algo = args
        ctypes.memset(algo, 0, self.abi.algo_size)
        self._write_config(algo, {"algo": algo_id})

    def matmul_algo_check(
        self, handle: int, desc: int, adesc: int, bdesc: int, cdesc: int, ddesc: int, algo: int, result: int
    ) -> None:
        self._record("matmul_algo_check", handle, desc, adesc, bdesc, cdesc, ddesc)
        algo_id = ctypes.c_uint32.from_address(algo).value
        if algo_id in self.rejected_ids:
            raise LtError("cublasLtMatmulAlgoCheck", 15, "NOT_SUPPORTED")
        offsets = self.abi.heuristic_result_offsets
        ctypes.c_size_t.from_address(result + offsets["workspaceSize"]).value = self.workspace

    def matmul_algo_cap_get_attribute(self, algo: int, attr: int, buf: int, size: int, written: int) -> None:
        caps = self.abi.algo_cap_attr
        lists = {caps["TILE_IDS"]: [15, 18, 20], caps["STAGES_IDS"]: [10, 33]}
        if attr in lists:
            values = lists[attr]
            ctypes.c_size_t.from_address(written).value = 4 * len(values)
            if size:
                for i, v in enumerate(values):
                    ctypes.c_uint32.from_address(buf + 4 * i).value = v
            return
        ctypes.memset(buf, 0, size)
        if attr == caps["SPLITK_SUPPORT"]:
            ctypes.c_int32.from_address(buf).value = 1
        if attr == caps["REDUCTION_SCHEME_MASK"]:
            ctypes.c_uint32.from_address(buf).value = 0b110
        ctypes.c_size_t.from_address(written).value = size

    def matmul_algo_config_set_attribute(self, algo: int, attr: int, buf: int, size: int) -> None:
        self._record("matmul_algo_config_set_attribute", attr, _read(buf, size))
        ctypes.c_uint32.from_address(algo + 4 * attr).value = _read(buf, size)

    def matmul_algo_config_get_attribute(
        self, algo: int, attr: int, buf: int, size: int, written: int
    ) -> None:
        value = ctypes.c_uint32.from_address(algo + 4 * attr).value
        ctypes.memmove(buf, ctypes.byref(ctypes.c_uint64(value)), size)
        ctypes.c_size_t.from_address(written).value = size


def _read(buf: int, size: int) -> int:
    return int.from_bytes(ctypes.string_at(buf, size), "little")


def desc_attrs(lib: RecordingLtLibrary, plan: LtPlan) -> dict[str, int]:
    """The plan descriptor's attributes by ABI key."""
    by_id = {v: k for k, v in lib.abi.matmul_desc_attr.items() if v is not None}
    return {by_id[attr]: value for attr, value in lib.objects[plan.desc]["attrs"].items()}


def layout_of(lib: RecordingLtLibrary, layout: int) -> dict[str, Any]:
    obj = lib.objects[layout]
    by_id = {v: k for k, v in lib.abi.layout_attr.items() if v is not None}
    return {
        "rows": obj["rows"],
        "cols": obj["cols"],
        "ld": obj["ld"],
        **{by_id[a]: v for a, v in obj["attrs"].items()},
    }


@pytest.fixture
def lib() -> RecordingLtLibrary:
    return RecordingLtLibrary(CUBLASLT_13)


@pytest.fixture
def driver(lib: RecordingLtLibrary) -> Iterator[LtDriver]:
    drv = LtDriver(CUBLASLT_13, lib)
    yield drv
    drv.close()


# --- plans --------------------------------------------------------------------------


def test_plan_builds_swapped_layouts_and_attributes(lib: RecordingLtLibrary, driver: LtDriver) -> None:
    problem = Problem(m=64, n=48, k=32, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16", trans_a=True)
    plan = driver.plan(lt_gemm(problem), 1 << 20)
    create = lib.calls[1]
    assert create == ("matmul_desc_create", (CUBLASLT_13.compute_type["32F"], CUBLASLT_13.datatype["R_32F"]))
    attrs = desc_attrs(lib, plan)
    # Caller's B (not transposed) is Lt's A with op N; caller's A (transposed view) is Lt's B with op T.
    assert attrs["TRANSA"] == CUBLASLT_13.operation["N"]
    assert attrs["TRANSB"] == CUBLASLT_13.operation["T"]
    assert "EPILOGUE" not in attrs  # DEFAULT is the library's default: nothing set
    bf16 = CUBLASLT_13.datatype["R_16BF"]
    assert lib.objects[plan.adesc]["dtype"] == bf16
    assert layout_of(lib, plan.adesc) == {"rows": 48, "cols": 32, "ld": 48}  # B^T: n x k, ldb
    assert layout_of(lib, plan.bdesc) == {"rows": 64, "cols": 32, "ld": 64}  # A as stored: m x k, lda
    assert layout_of(lib, plan.cdesc) == {"rows": 48, "cols": 64, "ld": 48}  # C^T: n x m, ldc
    pref = lib.objects[plan.pref]["attrs"]
    assert pref[CUBLASLT_13.pref_attr["MAX_WORKSPACE_BYTES"]] == 1 << 20
    plan.close()
    assert {plan_obj for plan_obj in lib.destroyed} >= set()
    assert lib.names()[-5:] == [
        "matmul_preference_destroy",
        "matrix_layout_destroy",
        "matrix_layout_destroy",
        "matrix_layout_destroy",
        "matmul_desc_destroy",
    ]


def test_plan_batched_bias_epilogue_and_tf32(lib: RecordingLtLibrary, driver: LtDriver) -> None:
    problem = Problem(
        m=8,
        n=16,
        k=24,
        batch=3,
        compute="tf32",
        epilogue="bias_gelu_tanh",
        ldc=32,
        stride_c=8 * 32,
        stride_b=24 * 16,
    )
    plan = driver.plan(lt_gemm(problem), 0)
    assert lib.objects[plan.desc]["compute"] == CUBLASLT_13.compute_type["32F_FAST_TF32"]
    attrs = desc_attrs(lib, plan)
    assert attrs["EPILOGUE"] == CUBLASLT_13.epilogue["GELU_BIAS"]
    assert attrs["BIAS_DATA_TYPE"] == CUBLASLT_13.datatype["R_32F"]
    assert layout_of(lib, plan.cdesc) == {
        "rows": 16,
        "cols": 8,
        "ld": 32,
        "BATCH_COUNT": 3,
        "STRIDED_BATCH_OFFSET": 8 * 32,
    }
    assert layout_of(lib, plan.adesc)["STRIDED_BATCH_OFFSET"] == 24 * 16
    assert layout_of(lib, plan.bdesc)["STRIDED_BATCH_OFFSET"] == 0  # A broadcast over the batch
    plan.set_bias(0xB1A5)
    assert desc_attrs(lib, plan)["BIAS_POINTER"] == 0xB1A5
    plan.close()


def test_plan_is_released_on_error(lib: RecordingLtLibrary, driver: LtDriver) -> None:
    def broken(*args: Any) -> None:
        raise LtError("cublasLtMatmulPreferenceSetAttribute", 7, "INVALID_VALUE")

    lib.matmul_preference_set_attribute = broken  # type: ignore[method-assign]
    with pytest.raises(LtError, match="INVALID_VALUE"):
        driver.plan(lt_gemm(Problem(m=4, n=4, k=4)), 0)
    # Everything created before the failure was destroyed again.
    created = [args for name, args in lib.calls if name.endswith("_create")]
    destroyed = [name for name in lib.names() if name.endswith("_destroy")]
    assert len(destroyed) == len(created) == 5


def test_heuristics_and_identity_round_trip(lib: RecordingLtLibrary, driver: LtDriver) -> None:
    plan = driver.plan(
        lt_gemm(Problem(m=128, n=256, k=64, dtype_a="f16", dtype_b="f16", dtype_c="f16")), 1 << 22
    )
    algos = plan.heuristics(16)
    assert len(algos) == 4
    assert all(len(a.data) == CUBLASLT_13.algo_size and a.workspace == 4096 for a in algos)
    codec = CublasLtConfig(driver)
    params = codec.params(algos[0])
    assert params == {
        "algo": 66,
        "tile": 20,
        "stages": 33,
        "splitk": 1,
        "reduction": 0,
        "swizzle": 0,
        "custom": 0,
        "inner": 12,
        "cluster": 2,
    }
    # The identity survives text, and rebuilding it gives the same algo bytes.
    candidate = Candidate.make("cublaslt", "gemm", **params)
    back = Candidate.from_identity(candidate.identity)
    assert back == candidate
    rebuilt = codec.rebuild(plan, dict(back.params))
    assert rebuilt.data == algos[0].data
    assert rebuilt.workspace == 4096
    init = next(args for name, args in lib.calls if name == "matmul_algo_init")
    f16 = CUBLASLT_13.datatype["R_16F"]
    assert init[1:8] == (
        CUBLASLT_13.compute_type["32F"],
        CUBLASLT_13.datatype["R_32F"],
        f16,
        f16,
        f16,
        f16,
        66,
    )
    plan.close()


def test_rebuild_rejected_by_library(lib: RecordingLtLibrary, driver: LtDriver) -> None:
    plan = driver.plan(lt_gemm(Problem(m=4, n=4, k=4)), 0)
    lib.rejected_ids.add(66)
    with pytest.raises(LtError, match="NOT_SUPPORTED"):
        CublasLtConfig(driver).rebuild(plan, {"algo": 66, "tile": 20})
    plan.close()


def test_exhaustive_search_varies_seeds_and_counts(lib: RecordingLtLibrary, driver: LtDriver) -> None:
    plan = driver.plan(lt_gemm(Problem(m=32, n=32, k=32)), 1 << 20)
    codec = CublasLtConfig(driver)
    seeds = [codec.params(a) for a in plan.heuristics(2)]
    found, stats = codec.enumerate(plan, seeds, max_checks=40, max_found=1000)
    assert stats["algo_ids"] == 2
    assert stats["checked"] == 40  # bounded by max_checks
    assert stats["valid"] == len(found) > 0
    # Variations of the seed come first: its other tiles, stages and cluster shapes.
    first = found[0]
    assert first["algo"] == 66 and first["inner"] == 12
    assert any(f["tile"] == 15 and f["algo"] == 66 for f in found)
    assert any(f["cluster"] == 0 and f["algo"] == 66 for f in found)
    assert all(tuple(sorted(f.items())) not in {tuple(sorted(s.items())) for s in seeds} for f in found)
    plan.close()


# --- the backend over the fake -------------------------------------------------------


class FakeHooks:
    """ArrayHooks over NumPy arrays (pointers only: the fake library computes nothing)."""

    @staticmethod
    def make() -> ArrayHooks:
        def empty(shape: tuple[int, ...], strides: tuple[int, ...], dtype: str) -> Any:
            size = 1 + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))
            item = 1 if dtype == "u8" else 4
            base = np.zeros(size, dtype=np.uint8 if item == 1 else np.float32)
            return np.lib.stride_tricks.as_strided(base, shape, tuple(s * item for s in strides))

        def copy(dst: Any, src: Any) -> None:
            dst[...] = src

        def zero(x: Any) -> None:
            x[...] = 0

        return ArrayHooks(
            ptr=lambda x: int(x.__array_interface__["data"][0]),
            stream=lambda: 0x57,
            empty_strided=empty,
            copy_=copy,
            zero_=zero,
            device=no_device,
        )


class FakeLtBackend(LtBackend):
    name = "fakelt"
    version_name = "fakelt"
    device_kinds = frozenset({"cpu"})
    array_kinds = frozenset({"numpy"})

    def __init__(self, lib: RecordingLtLibrary) -> None:
        super().__init__()
        self.lib = lib

    def load_driver(self) -> LtDriver:
        drv = LtDriver(self.lib.abi, self.lib)
        self.codec = CublasLtConfig(drv)
        return drv

    def hooks(self, target: Target) -> ArrayHooks:
        return FakeHooks.make()

    def algo_params(self, plan: LtPlan, algo: LtAlgo) -> dict[str, int]:
        return self.codec.params(algo)

    def algo_from_params(self, plan: LtPlan, params: Any) -> LtAlgo:
        return self.codec.rebuild(plan, params)


def _target() -> Target:
    from unimatmul.core.arrays import adapter_for_kind

    return Target(adapter_for_kind("numpy"), Device("cpu"))


def test_backend_candidates_are_deduplicated_configs(lib: RecordingLtLibrary) -> None:
    backend = FakeLtBackend(lib)
    found = backend.candidates(Problem(m=64, n=64, k=64), _target())
    assert [c.name for c in found] == ["gemm", "gemm", "gemm"]  # the duplicate config dropped
    assert found[0].identity.startswith("fakelt/gemm?algo=66&cluster=2&custom=0&inner=12")
    assert backend.check(Problem(m=64, n=64, k=64), found[2], _target())
    lib.rejected_ids.add(31)
    assert not backend.check(Problem(m=64, n=64, k=64), found[2], _target())


def test_backend_offers_padding_for_misaligned_ld(lib: RecordingLtLibrary) -> None:
    backend = FakeLtBackend(lib)
    problem = Problem.from_shape(1024, 1025, 1024, "bf16")
    found = backend.candidates(problem, _target())
    names = [c.name for c in found]
    # UNIMATMUL_LT_PAD_HEURISTICS (default 2) per flavour; the fake's 4th algo repeats its 1st.
    assert names.count("pad") == names.count("pad-dims") == 2
    layouts = [args for name, args in lib.calls if name == "matrix_layout_create"]
    bf16 = CUBLASLT_13.datatype["R_16BF"]
    # pad: B^T and C^T keep n = 1025 rows with ld 1032 (1025 rounded up to 8 bf16) ...
    assert layouts.count((bf16, 1025, 1024, 1032)) == 2
    # ... pad-dims: n itself becomes 1032.
    assert layouts.count((bf16, 1032, 1024, 1032)) == 2
    # A bias vector must not be read past n: no pad-dims candidate then.
    biased = Problem(m=64, n=1025, k=64, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16", epilogue="bias")
    assert "pad-dims" not in {c.name for c in backend.candidates(biased, _target())}


def test_runner_passes_swapped_pointers_on_the_current_stream(lib: RecordingLtLibrary) -> None:
    backend = FakeLtBackend(lib)
    problem = Problem(m=8, n=4, k=2, epilogue="bias_relu")
    candidate = backend.candidates(problem, _target())[0]
    runner = backend.prepare(problem, candidate, _target())
    assert isinstance(runner, LtRunner)
    a, b, out, bias = (np.ones(s, dtype=np.float32) for s in ((8, 2), (2, 4), (8, 4), (4,)))
    ptr = FakeHooks.make().ptr
    lib.calls.clear()
    runner(a, b, out, 2.0, 0.0, bias)
    runner(a, b, out, 3.0, 0.0, bias)
    names = lib.names()
    assert names.count("matmul_desc_set_attribute") == 1  # the bias pointer set once, not per call
    call = [args for name, args in lib.calls if name == "matmul"][-1]
    _handle, _desc, alpha, lt_a, adesc, lt_b, bdesc, beta, c, cdesc, d, ddesc, algo, ws, ws_size, stream = (
        call
    )
    assert (lt_a, lt_b, c, d) == (ptr(b), ptr(a), ptr(out), ptr(out))
    assert (adesc, bdesc, cdesc, ddesc) == (
        runner.plan.adesc,
        runner.plan.bdesc,
        runner.plan.cdesc,
        runner.plan.cdesc,
    )
    assert ctypes.c_float.from_address(alpha).value == 3.0
    assert ctypes.c_float.from_address(beta).value == 0.0
    assert stream == 0x57 and ws != 0 and ws_size == 4096
    assert bytes((ctypes.c_char * CUBLASLT_13.algo_size).from_address(algo)) == runner.algo.data


def test_padded_runner_copies_in_and_out(lib: RecordingLtLibrary) -> None:
    backend = FakeLtBackend(lib)
    problem = Problem(m=3, n=5, k=7)  # f32: 5 and 7 elements are not 16-byte multiples
    pad = next(c for c in backend.candidates(problem, _target()) if c.name == "pad")
    runner = backend.prepare(problem, pad, _target())
    assert isinstance(runner, PaddedRunner)
    assert (runner.padded.lda, runner.padded.ldb, runner.padded.ldc) == (8, 8, 8)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 7), dtype=np.float32), rng.standard_normal((7, 5), dtype=np.float32)
    out = np.full((3, 5), np.nan, dtype=np.float32)
    # The fake kernel computes nothing: fill the padded output so the copy back shows.
    a_buf, _, b_buf, _, c_buf, _ = runner._buffers(runner._stream())
    assert a_buf is not None and b_buf is not None and c_buf is not None
    c_buf[...] = 7.0
    runner(a, b, out)
    np.testing.assert_array_equal(a_buf, a)
    np.testing.assert_array_equal(b_buf, b)
    np.testing.assert_array_equal(out, 7.0)
    call = [args for name, args in lib.calls if name == "matmul"][-1]
    ptr = FakeHooks.make().ptr
    assert (call[3], call[5], call[8]) == (ptr(b_buf), ptr(a_buf), ptr(c_buf))


def test_padded_buffers_and_workspace_are_per_stream(lib: RecordingLtLibrary) -> None:
    # Calls on two streams may run at once: they must not share padded copies or the
    # split-K workspace (the H200 conformance run caught a shared workspace).
    backend = FakeLtBackend(lib)
    problem = Problem(m=3, n=5, k=7)
    pad = next(c for c in backend.candidates(problem, _target()) if c.name == "pad")
    runner = backend.prepare(problem, pad, _target())
    assert isinstance(runner, PaddedRunner)
    first = runner._buffers(1)
    second = runner._buffers(2)
    assert first[0] is not second[0] and first[4] is not second[4]
    assert runner._buffers(1) is first
    inner = runner.inner
    assert inner._ws_size == 4096
    assert inner._workspace(1) != inner._workspace(2)
    assert inner._workspace(1) == inner._workspace(1)


def test_padded_dims_runner_zero_pads_and_copies_the_corner(lib: RecordingLtLibrary) -> None:
    backend = FakeLtBackend(lib)
    problem = Problem(m=3, n=5, k=7)
    pad = next(c for c in backend.candidates(problem, _target()) if c.name == "pad-dims")
    runner = backend.prepare(problem, pad, _target())
    assert isinstance(runner, PaddedRunner)
    assert (runner.padded.m, runner.padded.n, runner.padded.k) == (3, 8, 8)
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 7), dtype=np.float32), rng.standard_normal((7, 5), dtype=np.float32)
    out = np.full((3, 5), np.nan, dtype=np.float32)
    a_buf, _, b_buf, _, c_buf, _ = runner._buffers(runner._stream())
    assert a_buf is not None and b_buf is not None and c_buf is not None
    c_buf[...] = np.arange(24, dtype=np.float32).reshape(3, 8)
    runner(a, b, out)
    # Inputs in the top-left corner, zeros in the padded k (it must add nothing).
    np.testing.assert_array_equal(a_buf[:, :7], a)
    np.testing.assert_array_equal(a_buf[:, 7:], 0.0)
    np.testing.assert_array_equal(b_buf[:7, :5], b)
    np.testing.assert_array_equal(b_buf[7:, :], 0.0)
    # The caller's part of the padded output comes back, the extra columns do not.
    np.testing.assert_array_equal(out, np.arange(24, dtype=np.float32).reshape(3, 8)[:, :5])
    assert runner.inner.plan.gemm.c.rows == 8  # the kernel computes n = 8 columns


def test_backend_rejects_unsupported_problems(lib: RecordingLtLibrary) -> None:
    backend = FakeLtBackend(lib)
    with pytest.raises(UnsupportedProblem, match="tanh"):
        backend.candidates(Problem(m=4, n=4, k=4, epilogue="gelu"), _target())
    with pytest.raises(UnsupportedProblem, match="f64"):
        backend.candidates(Problem.from_shape(4, 4, 4, "f64"), _target())
    assert lib.names().count("matmul_desc_create") == 0  # refused before any library work


# --- the ctypes library object -------------------------------------------------------


class FakeCdll:
    """C-callable fakes of a few cuBLASLt symbols, so ctypes marshals for real."""

    def __init__(self, abi: LtABI) -> None:
        self.seen: dict[str, tuple[Any, ...]] = {}
        self._keep: list[Any] = []
        st, vp = ctypes.c_int, ctypes.c_void_p

        def fake(name: str, restype: Any, argtypes: list[Any], body: Any) -> None:
            proto = ctypes.CFUNCTYPE(restype, *argtypes)
            fn = proto(body)
            self._keep.append(fn)
            setattr(self, abi.symbol(name), fn)

        def create(out: Any) -> int:
            out[0] = 0xABC0
            return 0

        def layout_create(out: Any, dtype: int, rows: int, cols: int, ld: int) -> int:
            self.seen["layout"] = (dtype, rows, cols, ld)
            out[0] = 0x1A70
            return 0

        def matmul(*args: Any) -> int:
            self.seen["matmul"] = args
            return 15 if args[3] == 0xDEAD else 0

        def heuristic(*args: Any) -> int:
            args[-1][0] = 0
            return 0

        P = ctypes.POINTER
        fake("Create", st, [P(vp)], create)
        fake("Destroy", st, [vp], lambda h: 0)
        fake(
            "MatrixLayoutCreate",
            st,
            [P(vp), st, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64],
            layout_create,
        )
        fake("MatmulDescCreate", st, [P(vp), st, st], lambda out, c, s: 0)
        fake("Matmul", st, [vp] * 14 + [ctypes.c_size_t, vp], matmul)
        fake("MatmulAlgoGetHeuristic", st, [vp] * 7 + [st, vp, P(st)], heuristic)
        fake("GetVersion", ctypes.c_size_t, [], lambda: 130100)


def test_ctypes_library_marshals_through_the_abi_signatures() -> None:
    cdll = FakeCdll(CUBLASLT_13)
    lib = CtypesLtLibrary(CUBLASLT_13, cdll, "fake")  # type: ignore[arg-type]
    assert "cublasLtMatmulAlgoCheck" in lib.missing
    assert lib.get_version() == 130100
    assert lib.create() == 0xABC0
    assert lib.matrix_layout_create(14, 1025, 1024, 1032) == 0x1A70
    assert cdll.seen["layout"] == (14, 1025, 1024, 1032)
    lib.matmul(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 1 << 33, 16)
    assert cdll.seen["matmul"][14] == 1 << 33  # size_t survives, not truncated to int
    with pytest.raises(LtError, match="cublasLtMatmul failed with NOT_SUPPORTED"):
        lib.matmul(1, 2, 3, 0xDEAD, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)
    count = ctypes.c_int(-1)
    lib.matmul_algo_get_heuristic(1, 2, 3, 4, 5, 6, 7, 8, 0, ctypes.addressof(count))
    assert count.value == 0
    with pytest.raises(NotImplementedError, match="cublasLtMatmulAlgoCheck"):
        lib.matmul_algo_check(1, 2, 3, 4, 5, 6, 7, 8)


def test_ctypes_library_refuses_a_library_without_the_core_symbols() -> None:
    class Empty:
        pass

    with pytest.raises(OSError, match="does not export hipblasLtCreate"):
        CtypesLtLibrary(HIPBLASLT_6, Empty(), "libempty.so")  # type: ignore[arg-type]


def test_padded_runner_enqueues_copy_in_product_and_copy_out_under_one_lock(lib: RecordingLtLibrary) -> None:
    # Threads sharing one stream must not interleave their copies into the padded
    # buffers between another thread's copy-in and product (seen on the H200 with
    # split-K algos: 3-18 of 24 concurrent calls returned another call's product).
    backend = FakeLtBackend(lib)
    problem = Problem(m=3, n=5, k=7)
    pad = next(c for c in backend.candidates(problem, _target()) if c.name == "pad")
    runner = backend.prepare(problem, pad, _target())
    assert isinstance(runner, PaddedRunner)
    seen: list[bool] = []
    inner = runner.inner

    def checked_inner(*args: Any) -> None:
        seen.append(runner._lock.locked())
        inner(*args)

    runner.inner = checked_inner  # type: ignore[assignment]
    a, b = np.ones((3, 7), dtype=np.float32), np.ones((7, 5), dtype=np.float32)
    runner(a, b, np.empty((3, 5), dtype=np.float32))
    assert seen == [True]
    assert not runner._lock.locked()


# --- what the native routing kernels are handed ------------------------------------------


def test_ctypes_library_gives_the_addresses_of_its_c_functions() -> None:
    cdll = FakeCdll(CUBLASLT_13)
    lib = CtypesLtLibrary(CUBLASLT_13, cdll, "fake")  # type: ignore[arg-type]
    addresses = function_addresses(lib, CUBLASLT_13, ("Matmul", "Create"))
    assert addresses is not None
    matmul = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * 14, ctypes.c_size_t, ctypes.c_void_p)(
        addresses[0]
    )
    assert (
        matmul(1, 2, 3, 0xDEAD, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16) == 15
    )  # the fake, called by address
    assert cdll.seen["matmul"][14] == 15
    assert function_addresses(lib, CUBLASLT_13, ("Matmul", "MatmulAlgoCheck")) is None  # not exported


def test_nvmath_addresses_come_from_its_function_pointer_table(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    public = types.ModuleType("nvmath.bindings.cublasLt")
    internal = types.ModuleType("nvmath.bindings._internal.cublasLt")
    table = {"__cublasLtMatmul": 0x5000, "__cublasLtMatmulDescSetAttribute": 0x5100}
    internal._inspect_function_pointer = table.__getitem__  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "nvmath.bindings._internal.cublasLt", internal)
    assert function_addresses(public, CUBLASLT_13, ("Matmul", "MatmulDescSetAttribute")) == (0x5000, 0x5100)
    assert function_addresses(public, CUBLASLT_13, ("Matmul", "Create")) is None  # KeyError: unknown
    monkeypatch.setitem(sys.modules, "nvmath.bindings._internal.cublasLt", types.ModuleType("empty"))
    assert function_addresses(public, CUBLASLT_13, ("Matmul",)) is None


def test_runner_native_call_words(lib: RecordingLtLibrary) -> None:
    backend = FakeLtBackend(lib)
    problem = Problem(m=8, n=4, k=2, epilogue="bias")
    candidate = backend.candidates(problem, _target())[0]
    runner = backend.prepare(problem, candidate, _target())
    assert isinstance(runner, LtRunner)
    assert runner.native_call() is None  # this fake library has no C functions to hand over
    lib.function_address = {"Matmul": 0x7000, "MatmulDescSetAttribute": 0x7100}.get  # type: ignore[attr-defined]
    creates = lib.names().count("matmul_desc_create")
    call = runner.native_call()
    assert call is not None and not call.padded
    words = call.words
    matmul, set_attr, bias_attr, handle, desc, adesc, bdesc, cdesc, ws, ws_size, stream, scale = words[:12]
    assert (matmul, set_attr) == (0x7000, 0x7100)
    assert bias_attr == CUBLASLT_13.desc_attr("BIAS_POINTER")[0]
    assert handle == runner.plan.driver.handle
    # A descriptor and layouts of its own: the native caller sets the bias pointer there.
    assert desc != runner.plan.desc and lib.names().count("matmul_desc_create") == creates + 1
    assert adesc not in runner.plan.layouts and len({adesc, bdesc, cdesc}) == 3
    assert ws != 0 and ws_size == 4096 and stream == 0x57 and scale == 4
    algo = b"".join(w.to_bytes(8, "little", signed=True) for w in words[12:])
    assert algo[: len(runner.algo.data)] == runner.algo.data
    again = runner.native_call()
    assert again is not None and again.words[4] == desc  # made once


def test_padded_runner_native_call_hands_over_its_buffers(lib: RecordingLtLibrary) -> None:
    backend = FakeLtBackend(lib)
    problem = Problem.from_shape(16, 17, 16, "bf16")  # a misaligned leading dimension: padding offered
    padded = [c for c in backend.candidates(problem, _target()) if c.name == "pad-dims"]
    assert padded
    runner = backend.prepare(problem, padded[0], _target())
    assert isinstance(runner, PaddedRunner)
    lib.function_address = {"Matmul": 0x7000, "MatmulDescSetAttribute": 0x7100}.get  # type: ignore[attr-defined]
    call = runner.native_call()
    assert call is not None and call.padded
    assert len(call.buffers) == 6
    assert call.buffers == runner._by_stream[0x57]  # this stream's buffers, the ones Python uses
    assert any(buf is not None for buf in call.buffers)
    assert call.flags == (0, 0)
    assert call.words[8] == runner.inner._workspace(0x57)  # the inner runner's workspace
