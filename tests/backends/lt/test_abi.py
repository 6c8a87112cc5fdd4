"""Pin the ABI tables of backends/lt/abi.py (rocBLAS's: tests/backends/rocm/test_rocblas_abi.py).

Pure Python: no GPU, no vendor library.  Each expected number below is the
value written in the vendor header named in the comment (see
docs/abi-sources.md), typed in by hand so that a slip in the tables shows up.
The struct checks build *independent* ctypes.Structure definitions from the C
declarations and compare their sizes/offsets with the tables.
"""

from __future__ import annotations

import ctypes
import itertools

import pytest

from unimatmul_backends.lt import abi
from unimatmul_backends.lt.abi import (
    ALL_ABIS,
    CUBLASLT_12,
    CUBLASLT_13,
    HIPBLASLT_1_1,
    HIPBLASLT_5,
    HIPBLASLT_5_5,
    HIPBLASLT_5_6,
    HIPBLASLT_6,
    HIPBLASLT_6_0,
    UnsupportedLibraryVersion,
    select_cublaslt_abi,
    select_hipblaslt_abi,
)

HIP_ALL = (HIPBLASLT_5_5, HIPBLASLT_5_6, HIPBLASLT_5, HIPBLASLT_6_0, HIPBLASLT_6, HIPBLASLT_1_1)
CUDA_ALL = (CUBLASLT_12, CUBLASLT_13)


# ------------------------------------------------------------------------------------------
# cuBLASLt (cublasLt.h / cublas_api.h / library_types.h, CUDA 13.0 toolkit, cuBLAS 13.1.0)
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("t", CUDA_ALL, ids=lambda t: t.label)
def test_cublaslt_enums(t: abi.LtABI) -> None:
    assert t.name == "cublaslt"
    assert t.fn_prefix == "cublasLt"
    # cublasOperation_t
    assert dict(t.operation) == {"N": 0, "T": 1, "C": 2}
    # cublasStatus_t
    st = t.status
    assert (st["SUCCESS"], st["NOT_INITIALIZED"], st["ALLOC_FAILED"], st["INVALID_VALUE"]) == (0, 1, 3, 7)
    assert (st["ARCH_MISMATCH"], st["MAPPING_ERROR"], st["EXECUTION_FAILED"]) == (8, 11, 13)
    assert (st["INTERNAL_ERROR"], st["NOT_SUPPORTED"], st["LICENSE_ERROR"]) == (14, 15, 16)
    # cudaDataType_t
    dt = t.datatype
    assert (dt["R_32F"], dt["R_64F"], dt["R_16F"], dt["R_8I"], dt["R_32I"], dt["R_16BF"]) == (
        0,
        1,
        2,
        3,
        10,
        14,
    )
    assert (dt["R_8F_E4M3"], dt["R_8F_E5M2"]) == (28, 29)
    assert dt["R_8F_E4M3_FNUZ"] is None
    # cublasComputeType_t
    ct = t.compute_type
    assert (ct["16F"], ct["16F_PEDANTIC"], ct["32F"], ct["32F_PEDANTIC"]) == (64, 65, 68, 69)
    assert (ct["64F"], ct["64F_PEDANTIC"], ct["32I"], ct["32I_PEDANTIC"]) == (70, 71, 72, 73)
    assert (ct["32F_FAST_16F"], ct["32F_FAST_16BF"], ct["32F_FAST_TF32"]) == (74, 75, 77)
    # cublasLtMatmulDescAttributes_t
    d = t.matmul_desc_attr
    assert (d["COMPUTE_TYPE"], d["SCALE_TYPE"], d["POINTER_MODE"]) == (0, 1, 2)
    assert (d["TRANSA"], d["TRANSB"], d["TRANSC"], d["FILL_MODE"], d["EPILOGUE"]) == (3, 4, 5, 6, 7)
    assert (d["BIAS_POINTER"], d["BIAS_BATCH_STRIDE"], d["BIAS_DATA_TYPE"]) == (8, 10, 26)
    assert (d["EPILOGUE_AUX_POINTER"], d["EPILOGUE_AUX_LD"], d["EPILOGUE_AUX_BATCH_STRIDE"]) == (11, 12, 13)
    assert (d["A_SCALE_POINTER"], d["B_SCALE_POINTER"], d["C_SCALE_POINTER"], d["D_SCALE_POINTER"]) == (
        17,
        18,
        19,
        20,
    )
    assert (d["AMAX_D_POINTER"], d["SM_COUNT_TARGET"], d["FAST_ACCUM"]) == (21, 15, 25)
    # cublasLtMatrixLayoutAttribute_t
    la = t.layout_attr
    assert (la["TYPE"], la["ORDER"], la["ROWS"], la["COLS"], la["LD"]) == (0, 1, 2, 3, 4)
    assert (la["BATCH_COUNT"], la["STRIDED_BATCH_OFFSET"]) == (5, 6)
    # cublasLtMatmulPreferenceAttributes_t
    assert dict(t.pref_attr) == {"SEARCH_MODE": 0, "MAX_WORKSPACE_BYTES": 1}
    # cublasLtEpilogue_t
    ep = t.epilogue
    assert (ep["DEFAULT"], ep["RELU"], ep["BIAS"], ep["RELU_BIAS"], ep["GELU"], ep["GELU_BIAS"]) == (
        1,
        2,
        4,
        6,
        32,
        36,
    )
    assert (ep["GELU_AUX"], ep["DGELU"], ep["BGRADA"], ep["BGRADB"]) == (160, 192, 256, 512)
    # cublasLtPointerMode_t, cublasLtOrder_t
    assert dict(t.pointer_mode) == {
        "HOST": 0,
        "DEVICE": 1,
        "DEVICE_VECTOR": 2,
        "ALPHA_DEVICE_VECTOR_BETA_ZERO": 3,
        "ALPHA_DEVICE_VECTOR_BETA_HOST": 4,
    }
    assert dict(t.order) == {"COL": 0, "ROW": 1}
    # cublasLtMatmulAlgoConfigAttributes_t
    assert dict(t.algo_config_attr) == {
        "ID": 0,
        "TILE_ID": 1,
        "SPLITK_NUM": 2,
        "REDUCTION_SCHEME": 3,
        "CTA_SWIZZLING": 4,
        "CUSTOM_OPTION": 5,
        "STAGES_ID": 6,
        "INNER_SHAPE_ID": 7,
        "CLUSTER_SHAPE_ID": 8,
    }
    # cublasLtMatmulAlgoCapAttributes_t
    cap = t.algo_cap_attr
    assert (cap["SPLITK_SUPPORT"], cap["REDUCTION_SCHEME_MASK"], cap["CTA_SWIZZLING_SUPPORT"]) == (0, 1, 2)
    assert (cap["STRIDED_BATCH_SUPPORT"], cap["OUT_OF_PLACE_RESULT_SUPPORT"], cap["UPLO_SUPPORT"]) == (
        3,
        4,
        5,
    )
    assert (cap["TILE_IDS"], cap["CUSTOM_OPTION_MAX"], cap["CUSTOM_MEMORY_ORDER"]) == (6, 7, 10)
    assert (cap["POINTER_MODE_MASK"], cap["EPILOGUE_MASK"], cap["STAGES_IDS"], cap["LD_NEGATIVE"]) == (
        11,
        12,
        13,
        14,
    )
    assert (cap["NUMERICAL_IMPL_FLAGS"], cap["MIN_ALIGNMENT_A_BYTES"], cap["MIN_ALIGNMENT_D_BYTES"]) == (
        15,
        16,
        19,
    )
    assert "CLUSTER_SHAPE_IDS" not in cap  # no such capability in the headers
    # config value sizes: INNER/CLUSTER_SHAPE_ID are uint16_t, TILE_ID uint32_t
    assert ctypes.sizeof(t.algo_config_attr_ctype["CLUSTER_SHAPE_ID"]) == 2
    assert ctypes.sizeof(t.algo_config_attr_ctype["TILE_ID"]) == 4
    assert t.solution_index_offset is None


def test_cublaslt_12_vs_13() -> None:
    assert CUBLASLT_13.matmul_desc_attr["A_SCALE_MODE"] == 31
    assert CUBLASLT_13.matmul_desc_attr["B_SCALE_MODE"] == 32
    assert CUBLASLT_12.matmul_desc_attr["A_SCALE_MODE"] is None
    assert "libcublasLt.so.13" in CUBLASLT_13.library_names
    assert "libcublasLt.so.12" in CUBLASLT_12.library_names


# ------------------------------------------------------------------------------------------
# hipBLASLt
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("t", HIP_ALL, ids=lambda t: t.label)
def test_hipblaslt_common(t: abi.LtABI) -> None:
    assert t.name == "hipblaslt"
    assert t.fn_prefix == "hipblasLt"
    # hipblasOperation_t (hipblas-common.h / hipblas.h)
    assert dict(t.operation) == {"N": 111, "T": 112, "C": 113}
    # hipblasStatus_t
    st = t.status
    assert [st[k] for k in ("SUCCESS", "NOT_INITIALIZED", "ALLOC_FAILED", "INVALID_VALUE")] == [0, 1, 2, 3]
    assert [st[k] for k in ("MAPPING_ERROR", "EXECUTION_FAILED", "INTERNAL_ERROR", "NOT_SUPPORTED")] == [
        4,
        5,
        6,
        7,
    ]
    assert [st[k] for k in ("ARCH_MISMATCH", "HANDLE_IS_NULLPTR", "INVALID_ENUM", "UNKNOWN")] == [
        8,
        9,
        10,
        11,
    ]
    # hipblasLtMatmulDescAttributes_t: same low numbers in every release
    d = t.matmul_desc_attr
    assert (d["TRANSA"], d["TRANSB"], d["EPILOGUE"], d["BIAS_POINTER"], d["BIAS_DATA_TYPE"]) == (
        0,
        1,
        2,
        3,
        4,
    )
    assert d["COMPUTE_TYPE"] is None and d["SCALE_TYPE"] is None
    # hipblasLtMatrixLayoutAttribute_t
    assert (t.layout_attr["BATCH_COUNT"], t.layout_attr["STRIDED_BATCH_OFFSET"]) == (0, 1)
    # hipblasLtMatmulPreferenceAttributes_t
    assert dict(t.pref_attr) == {"SEARCH_MODE": 0, "MAX_WORKSPACE_BYTES": 1}
    # hipblasLtEpilogue_t
    ep = t.epilogue
    assert (ep["DEFAULT"], ep["RELU"], ep["BIAS"], ep["RELU_BIAS"], ep["GELU"], ep["GELU_BIAS"]) == (
        1,
        2,
        4,
        6,
        32,
        36,
    )
    assert t.pointer_mode["HOST"] == 0
    assert dict(t.algo_config_attr) == {} and dict(t.algo_cap_attr) == {}


@pytest.mark.parametrize("t", (HIPBLASLT_6_0, HIPBLASLT_6, HIPBLASLT_1_1), ids=lambda t: t.label)
def test_hipblaslt_6_enums(t: abi.LtABI) -> None:
    # hipDataType (ROCm/HIP include/hip/library_types.h)
    dt = t.datatype
    assert (dt["R_32F"], dt["R_64F"], dt["R_16F"], dt["R_8I"], dt["R_8U"]) == (0, 1, 2, 3, 8)
    assert (dt["R_32I"], dt["R_16BF"]) == (10, 14)
    assert (dt["R_8F_E4M3_FNUZ"], dt["R_8F_E5M2_FNUZ"]) == (1000, 1001)
    # hipblasComputeType_t (hipblas-common.h)
    ct = t.compute_type
    assert [ct[k] for k in ("16F", "16F_PEDANTIC", "32F", "32F_PEDANTIC")] == [0, 1, 2, 3]
    assert [ct[k] for k in ("32F_FAST_16F", "32F_FAST_16BF", "32F_FAST_TF32")] == [4, 5, 6]
    assert [ct[k] for k in ("64F", "64F_PEDANTIC", "32I", "32I_PEDANTIC")] == [7, 8, 9, 10]
    # hipblasLtMatmulDescAttributes_t (rocm-6.0.0 .. develop)
    d = t.matmul_desc_attr
    assert [d[k] for k in ("A_SCALE_POINTER", "B_SCALE_POINTER", "C_SCALE_POINTER", "D_SCALE_POINTER")] == [
        5,
        6,
        7,
        8,
    ]
    assert d["EPILOGUE_AUX_SCALE_POINTER"] == 9
    assert (d["EPILOGUE_AUX_POINTER"], d["EPILOGUE_AUX_LD"], d["EPILOGUE_AUX_BATCH_STRIDE"]) == (10, 11, 12)
    assert d["POINTER_MODE"] == 13
    # hipblasLtMatrixLayoutAttribute_t
    la = t.layout_attr
    assert (la["TYPE"], la["ORDER"], la["ROWS"], la["COLS"], la["LD"]) == (2, 3, 4, 5, 6)
    assert dict(t.order) == {"COL": 0, "ROW": 1}
    ep = t.epilogue
    assert (
        ep["GELU_AUX"],
        ep["GELU_AUX_BIAS"],
        ep["DGELU"],
        ep["DGELU_BGRAD"],
        ep["BGRADA"],
        ep["BGRADB"],
    ) == (
        160,
        164,
        192,
        208,
        256,
        512,
    )
    assert t.datatype_enum == "hipDataType" and t.compute_type_enum == "hipblasComputeType_t"


def test_hipblaslt_1_1_adds_descriptor_attributes() -> None:
    # hipblaslt.h of hipBLASLt 1.1.0 (Debian's 7.1.1): AMAX_D_POINTER=14, EPILOGUE_AUX_DATA_TYPE=22,
    # A_SCALE_MODE=31, B_SCALE_MODE=32; no BIAS_BATCH_STRIDE, no SM_COUNT_TARGET.
    d = HIPBLASLT_1_1.matmul_desc_attr
    added = (d["AMAX_D_POINTER"], d["EPILOGUE_AUX_DATA_TYPE"], d["A_SCALE_MODE"], d["B_SCALE_MODE"])
    assert added == (14, 22, 31, 32)
    assert d["BIAS_BATCH_STRIDE"] is None and d["SM_COUNT_TARGET"] is None
    # Everything else is HIPBLASLT_6's.
    for table in ("status", "operation", "datatype", "compute_type", "layout_attr", "pref_attr", "epilogue"):
        assert dict(getattr(HIPBLASLT_1_1, table)) == dict(getattr(HIPBLASLT_6, table)), table
    assert dict(HIPBLASLT_1_1.pointer_mode) == dict(HIPBLASLT_6.pointer_mode)
    changed = {k for k, v in d.items() if HIPBLASLT_6.matmul_desc_attr[k] != v}
    assert changed == {"AMAX_D_POINTER", "EPILOGUE_AUX_DATA_TYPE", "A_SCALE_MODE", "B_SCALE_MODE"}


def test_hipblaslt_pointer_mode_changed_after_6_0() -> None:
    # rocm-6.0.0: HOST=0, ALPHA_DEVICE_VECTOR_BETA_HOST=1; rocm-6.1.0+: HOST=0, DEVICE=1, ..._BETA_HOST=4
    assert HIPBLASLT_6_0.pointer_mode["ALPHA_DEVICE_VECTOR_BETA_HOST"] == 1
    assert HIPBLASLT_6_0.pointer_mode["DEVICE"] is None
    assert HIPBLASLT_6.pointer_mode["DEVICE"] == 1
    assert HIPBLASLT_6.pointer_mode["ALPHA_DEVICE_VECTOR_BETA_HOST"] == 4
    # OCP fp8 (HIP_R_8F_E4M3=28, E5M2=29) only in HIP >= 6.3
    assert (HIPBLASLT_6.datatype["R_8F_E4M3"], HIPBLASLT_6.datatype["R_8F_E5M2"]) == (28, 29)
    assert HIPBLASLT_6_0.datatype["R_8F_E4M3"] is None


@pytest.mark.parametrize("t", (HIPBLASLT_5_5, HIPBLASLT_5_6, HIPBLASLT_5), ids=lambda t: t.label)
def test_hipblaslt_5_enums(t: abi.LtABI) -> None:
    # hipblasDatatype_t (ROCm/hipBLAS hipblas.h rocm-5.7.0): HIPBLAS_R_16F=150 ...
    dt = t.datatype
    assert (dt["R_16F"], dt["R_32F"], dt["R_64F"], dt["R_8I"], dt["R_32I"], dt["R_16BF"]) == (
        150,
        151,
        152,
        160,
        162,
        168,
    )
    assert dt["R_8F_E4M3"] is None and dt["R_8F_E4M3_FNUZ"] is None
    # hipblasLtComputeType_t: HIPBLASLT_COMPUTE_F32 = 300
    assert t.compute_type["32F"] == 300
    assert t.compute_type["16F"] is None
    assert t.datatype_enum == "hipblasDatatype_t" and t.compute_type_enum == "hipblasLtComputeType_t"
    # no ORDER / TYPE layout attributes, no pointer-mode attribute in 5.x
    assert t.layout_attr["ORDER"] is None and t.layout_attr["TYPE"] is None
    assert t.matmul_desc_attr["POINTER_MODE"] is None
    with pytest.raises(KeyError):
        t.desc_attr("POINTER_MODE")


def test_hipblaslt_5_7_specifics() -> None:
    d = HIPBLASLT_5.matmul_desc_attr
    assert (d["EPILOGUE_AUX_POINTER"], d["EPILOGUE_AUX_LD"], d["EPILOGUE_AUX_BATCH_STRIDE"]) == (6, 7, 8)
    assert d["D_SCALE_VECTOR_POINTER"] == 100
    assert HIPBLASLT_5.compute_type["32F_FAST_TF32"] == 301  # HIPBLASLT_COMPUTE_F32_FAST_XF32
    # rocm-5.5.0/5.6.0: HIPBLASLT_MATMUL_DESC_D_SCALE_POINTER = 5 (a per-row vector)
    assert HIPBLASLT_5_5.matmul_desc_attr["D_SCALE_VECTOR_POINTER"] == 5
    assert HIPBLASLT_5_6.matmul_desc_attr["D_SCALE_VECTOR_POINTER"] == 5
    assert HIPBLASLT_5_5.matmul_desc_attr["EPILOGUE_AUX_POINTER"] is None
    assert HIPBLASLT_5_5.epilogue["GELU_AUX"] is None
    assert HIPBLASLT_5_5.compute_type["32F_FAST_TF32"] is None


# ------------------------------------------------------------------------------------------
# Struct layouts, checked against ctypes definitions written from the C declarations
# ------------------------------------------------------------------------------------------


def _result_struct(algo_cls: type) -> type:
    class Result(ctypes.Structure):
        _fields_ = (
            ("algo", algo_cls),
            ("workspaceSize", ctypes.c_size_t),
            ("state", ctypes.c_int),  # cublasStatus_t / hipblasStatus_t
            ("wavesCount", ctypes.c_float),
            ("reserved", ctypes.c_int * 4),
        )

    return Result


class CublasLtMatmulAlgo(ctypes.Structure):  # cublasLt.h: uint64_t data[8]
    _fields_ = (("data", ctypes.c_uint64 * 8),)


class HipblasLtMatmulAlgo(ctypes.Structure):  # hipblaslt.h rocm-5.7.0..develop
    _fields_ = (("data", ctypes.c_uint8 * 16), ("max_workspace_bytes", ctypes.c_size_t))


class HipblasLtMatmulAlgo55(ctypes.Structure):  # hipblaslt.h rocm-5.5.0
    _fields_ = (("data", ctypes.c_uint8 * 56), ("max_workspace_bytes", ctypes.c_size_t))


class HipblasLtMatmulAlgo56(ctypes.Structure):  # hipblaslt.h rocm-5.6.0
    _fields_ = (("data", ctypes.c_uint8 * 104), ("max_workspace_bytes", ctypes.c_size_t))


# (table, reference algo struct, algo size, result size, expected offsets) -- sizes as
# worked out from the headers for LP64 (x86-64); cuBLASLt's 64/96 and 0/64/72/76/80
# were also measured with sizeof/offsetof against the real CUDA 13 header.
_LAYOUTS = [
    (CUBLASLT_13, CublasLtMatmulAlgo, 64, 96, (0, 64, 72, 76, 80)),
    (CUBLASLT_12, CublasLtMatmulAlgo, 64, 96, (0, 64, 72, 76, 80)),
    (HIPBLASLT_1_1, HipblasLtMatmulAlgo, 24, 56, (0, 24, 32, 36, 40)),
    (HIPBLASLT_6, HipblasLtMatmulAlgo, 24, 56, (0, 24, 32, 36, 40)),
    (HIPBLASLT_6_0, HipblasLtMatmulAlgo, 24, 56, (0, 24, 32, 36, 40)),
    (HIPBLASLT_5, HipblasLtMatmulAlgo, 24, 56, (0, 24, 32, 36, 40)),
    (HIPBLASLT_5_6, HipblasLtMatmulAlgo56, 112, 144, (0, 112, 120, 124, 128)),
    (HIPBLASLT_5_5, HipblasLtMatmulAlgo55, 64, 96, (0, 64, 72, 76, 80)),
]
_FIELD_NAMES = ("algo", "workspaceSize", "state", "wavesCount", "reserved")


@pytest.mark.skipif(ctypes.sizeof(ctypes.c_void_p) != 8, reason="tables are for 64-bit (LP64) builds")
@pytest.mark.parametrize(
    "t,ref_algo,algo_size,res_size,offsets", _LAYOUTS, ids=[x[0].label for x in _LAYOUTS]
)
def test_struct_layouts(t: abi.LtABI, ref_algo: type, algo_size: int, res_size: int, offsets: tuple) -> None:
    ref_res = _result_struct(ref_algo)
    # the reference definitions agree with the hand-computed numbers ...
    assert ctypes.sizeof(ref_algo) == algo_size
    assert ctypes.sizeof(ref_res) == res_size
    assert tuple(getattr(ref_res, f).offset for f in _FIELD_NAMES) == offsets
    # ... and with the table ...
    assert t.algo_size == algo_size
    assert t.heuristic_result_size == res_size
    assert tuple(t.heuristic_result_offsets[f] for f in _FIELD_NAMES) == offsets
    # ... and with the structs the table builds
    algo_cls, res_cls = t.algo_struct(), t.heuristic_result_struct()
    assert ctypes.sizeof(algo_cls) == algo_size
    assert ctypes.sizeof(res_cls) == res_size
    assert tuple(getattr(res_cls, f).offset for f in _FIELD_NAMES) == offsets
    # the size is consistent with the last field's offset + size (no hidden tail padding surprises)
    assert offsets[-1] + 16 == res_size
    # classes are cached per table
    assert t.algo_struct() is algo_cls


def test_hipblaslt_solution_index_is_first_int32() -> None:
    algo = HIPBLASLT_6.algo_struct()()
    ctypes.memmove(ctypes.addressof(algo), (12345).to_bytes(4, "little", signed=True), 4)
    assert HIPBLASLT_6.solution_index(algo) == 12345
    ctypes.memmove(ctypes.addressof(algo), (-1).to_bytes(4, "little", signed=True), 4)
    assert HIPBLASLT_6.solution_index(algo) == -1
    res = HIPBLASLT_6.heuristic_result_struct()()
    res.algo.data[0:4] = list((77).to_bytes(4, "little"))
    assert HIPBLASLT_6.solution_index(res.algo) == 77
    assert HIPBLASLT_5.solution_index_offset == 0
    for t in (HIPBLASLT_5_5, HIPBLASLT_5_6, CUBLASLT_13):
        with pytest.raises(TypeError):
            t.solution_index(t.algo_struct()())


@pytest.mark.parametrize("t", ALL_ABIS, ids=lambda t: t.label)
def test_attribute_value_sizes(t: abi.LtABI) -> None:
    sz = {k: ctypes.sizeof(v) for k, v in t.matmul_desc_attr_ctype.items()}
    assert sz["TRANSA"] == sz["TRANSB"] == sz["EPILOGUE"] == sz["BIAS_DATA_TYPE"] == 4
    assert sz["BIAS_POINTER"] == ctypes.sizeof(ctypes.c_void_p)
    assert sz["EPILOGUE_AUX_LD"] == 8 and sz["POINTER_MODE"] == 4
    lsz = {k: ctypes.sizeof(v) for k, v in t.layout_attr_ctype.items()}
    assert lsz == {
        "TYPE": 4,
        "ORDER": 4,
        "ROWS": 8,
        "COLS": 8,
        "LD": 8,
        "BATCH_COUNT": 4,
        "STRIDED_BATCH_OFFSET": 8,
    }
    assert ctypes.sizeof(t.pref_attr_ctype["MAX_WORKSPACE_BYTES"]) == 8
    assert ctypes.sizeof(t.pref_attr_ctype["SEARCH_MODE"]) == 4
    # every present attribute has a value type
    for table, types in (
        (t.matmul_desc_attr, t.matmul_desc_attr_ctype),
        (t.layout_attr, t.layout_attr_ctype),
        (t.pref_attr, t.pref_attr_ctype),
        (t.algo_config_attr, t.algo_config_attr_ctype),
        (t.algo_cap_attr, t.algo_cap_attr_ctype),
    ):
        for key, value in table.items():
            if value is not None:
                assert key in types, key
    # ids inside one enum are unique
    for table in (t.matmul_desc_attr, t.layout_attr, t.status, t.datatype, t.compute_type, t.epilogue):
        present = [v for v in table.values() if v is not None]
        assert len(present) == len(set(present))


def test_desc_attr_helper() -> None:
    assert CUBLASLT_13.desc_attr("TRANSA") == (3, ctypes.c_int32)
    assert HIPBLASLT_6.desc_attr("TRANSA") == (0, ctypes.c_int32)
    assert HIPBLASLT_6.layout_attr_of("BATCH_COUNT") == (0, ctypes.c_int32)
    assert CUBLASLT_12.layout_attr_of("BATCH_COUNT") == (5, ctypes.c_int32)
    assert HIPBLASLT_6.pref_attr_of("MAX_WORKSPACE_BYTES") == (1, ctypes.c_uint64)
    with pytest.raises(KeyError):
        HIPBLASLT_6.desc_attr("COMPUTE_TYPE")
    assert not HIPBLASLT_6.supports("matmul_desc_attr", "SCALE_TYPE")
    assert CUBLASLT_13.supports("matmul_desc_attr", "SCALE_TYPE")
    assert CUBLASLT_13.status_name(15) == "NOT_SUPPORTED"
    assert HIPBLASLT_6.status_name(7) == "NOT_SUPPORTED"
    assert HIPBLASLT_6.status_name(999) == "UNKNOWN_STATUS_999"


# ------------------------------------------------------------------------------------------
# Version selection
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version,expected",
    [
        (120000, CUBLASLT_12),
        (120408, CUBLASLT_12),  # 12.4.8 style
        (120901, CUBLASLT_12),
        (130000, CUBLASLT_13),
        (130100, CUBLASLT_13),  # value measured from cublasLtGetVersion() of cuBLAS 13.1.0.3
    ],
)
def test_select_cublaslt(version: int, expected: abi.LtABI) -> None:
    assert select_cublaslt_abi(version) is expected


@pytest.mark.parametrize("version", [0, 11080, 11800, 110000, 119999, 140000, 150100])
def test_select_cublaslt_unsupported(version: int) -> None:
    with pytest.raises(UnsupportedLibraryVersion, match="cuBLASLt version"):
        select_cublaslt_abi(version)


@pytest.mark.parametrize(
    "version,expected",
    [
        (100, HIPBLASLT_5_5),  # 0.1.0, ROCm 5.5
        (200, HIPBLASLT_5_6),  # 0.2.0, ROCm 5.6
        (300, HIPBLASLT_5),  # 0.3.0, ROCm 5.7
        (600, HIPBLASLT_6_0),  # 0.6.0, ROCm 6.0
        (700, HIPBLASLT_6),  # 0.7.0, ROCm 6.1
        (800, HIPBLASLT_6),  # 0.8.0, ROCm 6.2
        (1000, HIPBLASLT_6),  # 0.10.0, ROCm 6.3
        (1200, HIPBLASLT_6),  # 0.12.0
        (100000, HIPBLASLT_6),  # 1.0.0, ROCm 7.0
        (100100, HIPBLASLT_1_1),  # 1.1.0, ROCm 7.1 (Debian's 7.1.1)
        (100105, HIPBLASLT_1_1),
        (199999, HIPBLASLT_1_1),
    ],
)
def test_select_hipblaslt(version: int, expected: abi.LtABI) -> None:
    assert select_hipblaslt_abi(version) is expected


@pytest.mark.parametrize("version", [0, 99, 400, 500, 599, 200000, 300000])
def test_select_hipblaslt_unsupported(version: int) -> None:
    with pytest.raises(UnsupportedLibraryVersion, match="hipBLASLt version"):
        select_hipblaslt_abi(version)


def test_version_decoding() -> None:
    assert abi.decode_cublaslt_version(130100) == (13, 1, 0)
    assert abi.decode_cublaslt_version(120408) == (12, 4, 8)
    assert abi.decode_hipblaslt_version(800) == (0, 8, 0)
    assert abi.decode_hipblaslt_version(1000) == (0, 10, 0)
    assert abi.decode_hipblaslt_version(100100) == (1, 1, 0)


def test_version_ranges_do_not_overlap() -> None:
    for family in (CUDA_ALL, HIP_ALL):
        spans = sorted((t.version_min, t.version_max) for t in family)
        for (_, hi), (lo, _) in itertools.pairwise(spans):
            assert hi <= lo


# ------------------------------------------------------------------------------------------
# Function names and signatures
# ------------------------------------------------------------------------------------------


def test_function_names() -> None:
    assert CUBLASLT_13.symbol("Matmul") == "cublasLtMatmul"
    assert HIPBLASLT_6.symbol("Matmul") == "hipblasLtMatmul"
    names = HIPBLASLT_6.function_names
    assert names["MatmulAlgoGetHeuristic"] == "hipblasLtMatmulAlgoGetHeuristic"
    assert names["GetVersion"] == "hipblasLtGetVersion"
    assert "MatmulAlgoConfigGetAttribute" not in names  # cuBLASLt-only
    assert (
        CUBLASLT_12.function_names["MatmulAlgoConfigSetAttribute"] == "cublasLtMatmulAlgoConfigSetAttribute"
    )


def test_signatures() -> None:
    sig = abi.LT_SHARED_SIGNATURES
    restype, argtypes = sig["Matmul"]  # a plain (restype, argtypes) pair
    assert restype is ctypes.c_int
    assert len(argtypes) == 16 and argtypes[14] is ctypes.c_size_t
    assert len(sig["MatmulAlgoGetHeuristic"].argtypes) == 10
    assert sig["MatmulAlgoGetHeuristic"].argtypes[7] is ctypes.c_int
    assert sig["MatrixLayoutCreate"].argtypes[2:] == (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64)
    assert sig["MatmulDescCreate"].argtypes[1:] == (ctypes.c_int, ctypes.c_int)
    # GetVersion differs: cuBLASLt size_t(void), hipBLASLt status(handle, int*)
    assert abi.CUBLASLT_ONLY_SIGNATURES["GetVersion"] == (ctypes.c_size_t, ())
    hv = abi.HIPBLASLT_ONLY_SIGNATURES["GetVersion"]
    assert hv.restype is ctypes.c_int and len(hv.argtypes) == 2
    # struct pointers travel as c_void_p: byref() of the table's struct must be accepted
    res_array = (HIPBLASLT_6.heuristic_result_struct() * 4)()
    ctypes.c_void_p.from_param(res_array)
    ctypes.c_void_p.from_param(ctypes.byref(CUBLASLT_13.algo_struct()()))
