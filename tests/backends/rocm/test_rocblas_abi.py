"""Pin the ABI table of backends/rocm/rocblas_abi.py.

Pure Python: no GPU, no vendor library. Each expected number below is the value written
in the rocBLAS header named in the comment (see docs/abi-sources.md), typed in by hand so
that a slip in the table shows up.
"""

from __future__ import annotations

import ctypes

import pytest

from unimatmul_backends.rocm import rocblas_abi as rb

# ------------------------------------------------------------------------------------------
# rocBLAS (ROCm/rocBLAS library/include/internal/rocblas-*.h)
# ------------------------------------------------------------------------------------------


def test_rocblas_enums() -> None:
    assert dict(rb.ROCBLAS_OPERATION) == {"none": 111, "transpose": 112, "conjugate_transpose": 113}
    dt = rb.ROCBLAS_DATATYPE
    assert (dt["f16_r"], dt["f32_r"], dt["f64_r"], dt["i8_r"], dt["i32_r"], dt["bf16_r"]) == (
        150,
        151,
        152,
        160,
        162,
        168,
    )
    assert (dt["f16_c"], dt["f32_c"], dt["f64_c"], dt["bf16_c"], dt["invalid"]) == (153, 154, 155, 169, 255)
    assert (dt["f8_r"], dt["bf8_r"]) == (170, 171)
    assert dict(rb.ROCBLAS_GEMM_ALGO) == {"standard": 0, "solution_index": 1}
    assert dict(rb.ROCBLAS_GEMM_FLAGS) == {
        "none": 0,
        "use_cu_efficiency": 2,
        "fp16_alt_impl": 4,
        "check_solution_index": 8,
        "fp16_alt_impl_rnz": 16,
        "stochastic_rounding": 32,
    }
    assert rb.ROCBLAS_GEMM_FLAGS_PACK_INT8X4_PRE_4 == 1
    st = rb.ROCBLAS_STATUS
    assert (st["success"], st["invalid_handle"], st["not_implemented"], st["invalid_pointer"]) == (0, 1, 2, 3)
    assert (st["invalid_size"], st["memory_error"], st["internal_error"], st["perf_degraded"]) == (4, 5, 6, 7)
    assert (st["invalid_value"], st["continue"], st["check_numerics_fail"]) == (11, 12, 13)
    assert (st["excluded_from_build"], st["arch_mismatch"]) == (14, 15)
    assert dict(rb.ROCBLAS_POINTER_MODE) == {"host": 0, "device": 1}
    assert rb.ROCBLAS_COMPUTETYPE["f32"] == 300
    assert rb.rocblas_status_name(11) == "rocblas_status_invalid_value"


def test_rocblas_signatures() -> None:
    s = rb.ROCBLAS_SIGNATURES
    restype, args = s["rocblas_gemm_ex"]
    assert restype is ctypes.c_int
    assert len(args) == 24
    assert args[-2:] == (ctypes.c_int32, ctypes.c_uint32)  # int32_t solution_index, uint32_t flags
    assert args[3:6] == (ctypes.c_int32,) * 3  # rocblas_int m, n, k
    _, sb = s["rocblas_gemm_strided_batched_ex"]
    assert len(sb) == 29
    assert [i for i, a in enumerate(sb) if a is ctypes.c_int64] == [10, 14, 19, 23]  # the four strides
    _, gs = s["rocblas_gemm_ex_get_solutions"]
    assert len(gs) == 25 and gs[22] is ctypes.c_uint32
    assert gs[23] is gs[24]  # both rocblas_int*
    _, sgs = s["rocblas_gemm_strided_batched_ex_get_solutions"]
    assert len(sgs) == 30
    assert s["rocblas_set_stream"] == (ctypes.c_int, (ctypes.c_void_p, ctypes.c_void_p))
    assert s["rocblas_get_version_string"][1] == (ctypes.c_char_p, ctypes.c_size_t)
    assert len(s["rocblas_create_handle"][1]) == 1


def test_rocblas_version_parse() -> None:
    assert rb.parse_rocblas_version("4.2.0.abcdef12") == (4, 2, 0)
    assert rb.parse_rocblas_version(b"3.1.0.0\0\0\0") == (3, 1, 0)
    with pytest.raises(ValueError):
        rb.parse_rocblas_version("garbage")
