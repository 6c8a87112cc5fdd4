"""Scaled (fp8) GEMMs on the Lt driver, against the fake libraries of the other Lt tests.

On the cuBLASLt 13 table, through the recording fake of ``test_driver.py``: the
plan torch's ``_scaled_mm`` makes (fp8 A and B, D of the output's dtype, f32 compute and
scale type, "TN", the A/B scale modes, fast accumulation, the bias epilogue), scale
pointers in place before the library lists algos, and the runner's call (swapped
operands and scales, C never D on cuBLASLt). The hipBLASLt tables' scaled GEMMs:
``tests/backends/rocm/test_hipblaslt_scaled.py``. No GPU: the GPU tests
(``scripts/gpu_fp8.py``) run the same code on the H200.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_driver import FakeHooks, FakeLtBackend, RecordingLtLibrary, _target, desc_attrs

from unimatmul.core.errors import UnsupportedProblem
from unimatmul.core.problem import Problem
from unimatmul.core.scales import scaled_problem
from unimatmul_backends.lt.abi import CUBLASLT_12, CUBLASLT_13
from unimatmul_backends.lt.backend import PAD
from unimatmul_backends.lt.driver import CublasLtConfig, LtDriver
from unimatmul_backends.lt.layout import lt_gemm, lt_problem, lt_scaled_gemm
from unimatmul_backends.lt.runner import ScaledLtRunner

torch = pytest.importorskip("torch")

ROWWISE_BIAS = scaled_problem(64, 48, 32, scales="rowwise", bias=True, fast_accum=True)
TENSOR = scaled_problem(16, 32, 64, dtype_a="f8e5m2", dtype_b="f8e4m3", dtype_c="f16")


def _layout(lib: RecordingLtLibrary, layout: int) -> tuple[int, int, int, int]:
    obj = lib.objects[layout]
    return obj["dtype"], obj["rows"], obj["cols"], obj["ld"]


def test_the_plan_is_torchs_scaled_gemm() -> None:
    lib = RecordingLtLibrary(CUBLASLT_13)
    driver = LtDriver(CUBLASLT_13, lib)
    plan = driver.plan(lt_scaled_gemm(ROWWISE_BIAS), 1 << 20)
    abi = CUBLASLT_13
    assert lib.objects[plan.desc]["compute"] == abi.compute_type["32F"]
    assert lib.objects[plan.desc]["scale"] == abi.datatype["R_32F"]
    attrs = desc_attrs(lib, plan)
    # Caller's A [64, 32] row-major is the library's B (N); B = w.t() is its A, transposed ("TN").
    assert (attrs["TRANSA"], attrs["TRANSB"]) == (abi.operation["T"], abi.operation["N"])
    assert attrs["A_SCALE_MODE"] == attrs["B_SCALE_MODE"] == abi.matrix_scale["OUTER_VEC_32F"] == 3
    assert attrs["FAST_ACCUM"] == 1
    assert attrs["EPILOGUE"] == abi.epilogue["BIAS"]
    assert attrs["BIAS_DATA_TYPE"] == abi.datatype["R_16BF"]
    e4m3, bf16 = abi.datatype["R_8F_E4M3"], abi.datatype["R_16BF"]
    assert _layout(lib, plan.adesc) == (e4m3, 32, 48, 32)  # w as stored: k x n, ld k
    assert _layout(lib, plan.bdesc) == (e4m3, 32, 64, 32)  # x^T: k x m, ld k
    assert _layout(lib, plan.cdesc) == (bf16, 48, 64, 48)  # D^T: n x m, ld n
    plan.set_scales(0x5CA1E_A, 0x5CA1E_B)
    attrs = desc_attrs(lib, plan)
    assert (attrs["A_SCALE_POINTER"], attrs["B_SCALE_POINTER"]) == (0x5CA1E_A, 0x5CA1E_B)
    plan.close()
    driver.close()


def test_per_tensor_scales_and_the_tables_without_scale_modes() -> None:
    lib = RecordingLtLibrary(CUBLASLT_13)
    driver = LtDriver(CUBLASLT_13, lib)
    attrs = desc_attrs(lib, driver.plan(lt_scaled_gemm(TENSOR), 0))
    assert attrs["A_SCALE_MODE"] == attrs["B_SCALE_MODE"] == 0 and attrs["FAST_ACCUM"] == 0
    # cuBLASLt 12's table has no scale-mode attribute: per-tensor still works (the default) ...
    old = RecordingLtLibrary(CUBLASLT_12)
    old_driver = LtDriver(CUBLASLT_12, old)
    attrs = desc_attrs(old, old_driver.plan(lt_scaled_gemm(TENSOR), 0))
    assert "A_SCALE_MODE" not in attrs and "B_SCALE_MODE" not in attrs
    # ... row-wise scales do not, and say why.
    with pytest.raises(KeyError, match="no A_SCALE_MODE OUTER_VEC_32F"):
        old_driver.plan(lt_scaled_gemm(ROWWISE_BIAS), 0)


def test_block_scales_are_cublaslt_13s_block_modes_on_the_swapped_operands() -> None:
    """The caller's B (128x128 blocks) is the library's A: BLK128x128_32F there, and the
    caller's A (1x128 groups) is the library's B: VEC128_32F; an older table refuses."""
    block = scaled_problem(16, 256, 384, scales="block")
    lib = RecordingLtLibrary(CUBLASLT_13)
    driver = LtDriver(CUBLASLT_13, lib)
    plan = driver.plan(lt_scaled_gemm(block), 0)
    attrs = desc_attrs(lib, plan)
    assert attrs["A_SCALE_MODE"] == CUBLASLT_13.matrix_scale["BLK128x128_32F"] == 5
    assert attrs["B_SCALE_MODE"] == CUBLASLT_13.matrix_scale["VEC128_32F"] == 4
    plan.close()
    driver.close()
    old_driver = LtDriver(CUBLASLT_12, RecordingLtLibrary(CUBLASLT_12))
    with pytest.raises(KeyError, match="no A_SCALE_MODE BLK128x128_32F"):
        old_driver.plan(lt_scaled_gemm(block), 0)


def test_scaled_problems_the_lt_kernels_refuse() -> None:
    with pytest.raises(UnsupportedProblem, match="16-byte aligned"):
        lt_problem(replace(TENSOR, align=8))
    with pytest.raises(UnsupportedProblem, match="not a scaled GEMM"):
        lt_scaled_gemm(Problem(m=4, n=4, k=4))
    with pytest.raises(UnsupportedProblem, match="run gemm, not scaled_gemm"):
        lt_gemm(TENSOR)


def test_candidates_see_scale_pointers_and_no_padding() -> None:
    lib = RecordingLtLibrary(CUBLASLT_13)
    backend = FakeLtBackend(lib)
    found = backend.candidates(ROWWISE_BIAS, _target())
    assert [c.name for c in found] == ["gemm", "gemm", "gemm"]
    names = lib.names()
    first_heuristic = names.index("matmul_algo_get_heuristic")
    set_pointers = [
        i
        for i, (name, args) in enumerate(lib.calls)
        if name == "matmul_desc_set_attribute" and args[1] == CUBLASLT_13.desc_attr("A_SCALE_POINTER")[0]
    ]
    assert set_pointers and set_pointers[0] < first_heuristic  # stand-in scales before the library looks
    # A misaligned leading dimension (k = 40 fp8 is not 16-byte aligned) still gets no pad candidate.
    odd = scaled_problem(16, 32, 40)
    assert {c.name for c in backend.candidates(odd, _target())} == {"gemm"}
    with pytest.raises(UnsupportedProblem, match="no padded scaled GEMMs"):
        backend.prepare(odd, found[0].__class__(backend.name, PAD, found[0].params), _target())
    assert backend.check(ROWWISE_BIAS, found[0], _target())


def test_scaled_runner_native_call_words() -> None:
    lib = RecordingLtLibrary(CUBLASLT_13)
    backend = FakeLtBackend(lib)
    runner = backend.prepare(ROWWISE_BIAS, backend.candidates(ROWWISE_BIAS, _target())[0], _target())
    assert isinstance(runner, ScaledLtRunner)
    assert runner.native_call() is None  # this fake library has no C functions to hand over
    lib.function_address = {"Matmul": 0x7000, "MatmulDescSetAttribute": 0x7100}.get  # type: ignore[attr-defined]
    call = runner.native_call()
    assert call is not None and call.kind == "scaled_lt" and not call.padded
    abi = CUBLASLT_13
    # The library's A and B scale-pointer attributes (the native caller sets the caller's
    # B and A scales there), and C is not D: on cuBLASLt it is the library's A.
    assert call.words[:3] == [abi.desc_attr("A_SCALE_POINTER")[0], abi.desc_attr("B_SCALE_POINTER")[0], 0]
    words = call.words[3:]
    assert words[:2] == [0x7000, 0x7100] and words[3] == runner.plan.driver.handle
    # A descriptor of its own, with this plan's scale modes, fast accumulation and epilogue.
    desc = words[4]
    assert desc != runner.plan.desc
    mine, native = lib.objects[runner.plan.desc]["attrs"], lib.objects[desc]["attrs"]
    for key in ("A_SCALE_MODE", "B_SCALE_MODE", "FAST_ACCUM", "EPILOGUE", "BIAS_DATA_TYPE"):
        attr = abi.desc_attr(key)[0]
        assert attr in native and native[attr] == mine[attr], key
    algo = b"".join(w.to_bytes(8, "little", signed=True) for w in words[12:])
    assert algo[: len(runner.algo.data)] == runner.algo.data


def test_runner_passes_swapped_operands_and_scales() -> None:
    lib = RecordingLtLibrary(CUBLASLT_13)
    backend = FakeLtBackend(lib)
    problem = ROWWISE_BIAS
    runner = backend.prepare(problem, backend.candidates(problem, _target())[0], _target())
    assert isinstance(runner, ScaledLtRunner) and runner.native_call() is None
    a, b = np.zeros((64, 32), np.uint8), np.zeros((48, 32), np.uint8).T
    out, bias = np.zeros((64, 48), np.float32), np.zeros(48, np.float32)
    sa, sb = np.ones((64, 1), np.float32), np.ones((1, 48), np.float32)
    ptr = FakeHooks.make().ptr
    lib.calls.clear()
    runner(a, b, out, 1.0, 0.0, bias, sa, sb)
    runner(a, b, out, 1.0, 0.0, bias, sa, sb)
    sets = [args[1] for name, args in lib.calls if name == "matmul_desc_set_attribute"]
    abi = CUBLASLT_13
    # Bias and both scale pointers set once: unchanged addresses are not set again.
    assert sorted(sets) == sorted(
        abi.desc_attr(k)[0] for k in ("BIAS_POINTER", "A_SCALE_POINTER", "B_SCALE_POINTER")
    )
    attrs = desc_attrs(lib, runner.plan)
    assert (attrs["A_SCALE_POINTER"], attrs["B_SCALE_POINTER"]) == (
        ptr(sb),
        ptr(sa),
    )  # the library's A is our B
    call = [args for name, args in lib.calls if name == "matmul"][-1]
    lt_a, lt_b, c, d = call[3], call[5], call[8], call[10]
    assert (lt_a, lt_b, d) == (ptr(b), ptr(a), ptr(out))
    assert c == ptr(b) != d  # cuBLASLt: C (never read) is not D, as torch passes it
    fresh = np.ones((64, 1), np.float32)
    runner(a, b, out, 1.0, 0.0, bias, fresh, sb)
    assert desc_attrs(lib, runner.plan)["B_SCALE_POINTER"] == ptr(fresh)


def test_exhaustive_search_asks_for_the_fp8_types() -> None:
    lib = RecordingLtLibrary(CUBLASLT_13)
    driver = LtDriver(CUBLASLT_13, lib)
    plan = driver.plan(lt_scaled_gemm(TENSOR), 1 << 20)
    codec = CublasLtConfig(driver)
    found, stats = codec.enumerate(plan, [codec.params(plan.heuristics(1)[0])], max_checks=8, max_found=4)
    assert found and stats["checked"] <= 8
    ids = next(args for name, args in lib.calls if name == "matmul_algo_get_ids")
    abi = CUBLASLT_13
    e5m2, e4m3, f16 = (abi.datatype[k] for k in ("R_8F_E5M2", "R_8F_E4M3", "R_16F"))
    # Types in the library's order: its A is our B (e4m3), its B our A (e5m2), then C and D.
    assert ids[1:7] == (abi.compute_type["32F"], abi.datatype["R_32F"], e4m3, e5m2, f16, f16)
