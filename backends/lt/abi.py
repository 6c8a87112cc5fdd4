"""Per-library ABI tables for the shared "Lt" driver (cuBLASLt and hipBLASLt).

cuBLASLt and hipBLASLt expose the same C function *shapes* (``xxxLtCreate``,
``xxxLtMatmulDescCreate``, ``xxxLtMatmulAlgoGetHeuristic``, ``xxxLtMatmul`` ...)
but differ in symbol prefix, enum numbers and the size of the algo /
heuristic-result structs.  Everything the driver needs to know to talk to one
of them through ctypes is collected in one frozen :class:`LtABI` table.

Every number below was read from the real headers; the comment next to each
table names repository, file and tag.  ``docs/abi-sources.md`` has the summary.
Abbreviations used in the comments:

``cuda13.1``
    ``cublasLt.h`` / ``cublas_api.h`` / ``library_types.h`` of the CUDA 13.0
    toolkit (``/usr/local/cuda-13.0/targets/x86_64-linux/include``) as shipped
    with cuBLAS 13.1.0.3 (``CUBLAS_VER_MAJOR 13, MINOR 1, PATCH 0, BUILD 3``).
    Struct sizes/offsets were also measured there with ``sizeof``/``offsetof``
    and ``cublasLtGetVersion()`` returned 130100.
``nvmath``
    NVIDIA/nvmath-python ``nvmath/bindings/cycublasLt.pxd`` (commit 63409f5,
    "generated across versions from 11.0.3 to 13.1.0").
``hipify``
    ROCm/HIPIFY ``docs/tables/CUBLAS_API_supported_by_*.md`` (the "A/D/R"
    columns give the CUDA version that added / deprecated / removed a name).
``hipblaslt@rocm-X``
    ROCm/hipBLASLt ``library/include/hipblaslt.h`` at git tag ``rocm-X``.
``hipblaslt@develop``
    ROCm/rocm-libraries ``projects/hipblaslt/library/include/hipblaslt/hipblaslt.h``
    (develop, hipBLASLt 1.1.0 per ``projects/hipblaslt/CMakeLists.txt``).
``hip@rocm-X``
    ROCm/HIP ``include/hip/library_types.h`` at git tag ``rocm-X``.
``hipblas@rocm-X``
    ROCm/hipBLAS ``library/include/hipblas.h`` at git tag ``rocm-X``.
``hipblas-common``
    ROCm/hipBLAS-common ``library/include/hipblas-common.h`` (commit 9666c57);
    the same enums lived in ``hipblas.h`` for ROCm 6.0-6.2 (identical values).
``debian-1.1``
    The real packages of Debian unstable: ``libhipblaslt-dev`` 7.1.1+dfsg-4
    (``hipblaslt-version.h``: 1.1.0), ``libamdhip64-dev`` 6.4.3, ``libhipblas-common-dev``
    7.1.0. CI (``tests/amd_real``, ``.ci/amd-real``) compiles a probe against these
    headers and loads the real ``libhipblaslt.so.1``; see ``docs/abi-sources.md``.

Version encodings (what the ``select_*`` functions take):

* ``cublasLtGetVersion()`` returns ``size_t`` =
  ``CUBLAS_VER_MAJOR*10000 + CUBLAS_VER_MINOR*100 + CUBLAS_VER_PATCH``
  (``cublas_api.h`` ``CUBLAS_VERSION`` in cuda13.1; 13.1.0 -> 130100, measured).
  It takes no handle.
* ``hipblasLtGetVersion(handle, int* version)`` writes
  ``HIPBLASLT_VERSION_MAJOR*100000 + HIPBLASLT_VERSION_MINOR*100 + HIPBLASLT_VERSION_PATCH``
  (hipBLASLt ``library/src/amd_detail/hipblaslt.cpp`` at rocm-6.2.0, same in
  rocm-libraries develop).  It needs a created handle.  The hipBLASLt version is
  *not* the ROCm version: ROCm 5.5 = 0.1.0 (100), 5.6 = 0.2.0 (200),
  5.7 = 0.3.0 (300), 6.0 = 0.6.0 (600), 6.1 = 0.7.0 (700), 6.2 = 0.8.0 (800),
  6.3 = 0.10.0 (1000), 7.1 = 1.1.0 (100100: develop then, and Debian's 7.1.1)
  (``CMakeLists.txt`` ``VERSION_STRING`` at each tag).
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = [
    "ALL_ABIS",
    "CUBLASLT_12",
    "CUBLASLT_13",
    "CUBLASLT_ONLY_SIGNATURES",
    "HIPBLASLT_1_1",
    "HIPBLASLT_5",
    "HIPBLASLT_5_5",
    "HIPBLASLT_5_6",
    "HIPBLASLT_6",
    "HIPBLASLT_6_0",
    "HIPBLASLT_ONLY_SIGNATURES",
    "LT_SHARED_SIGNATURES",
    "CFunction",
    "LtABI",
    "UnsupportedLibraryVersion",
    "decode_cublaslt_version",
    "decode_hipblaslt_version",
    "select_cublaslt_abi",
    "select_hipblaslt_abi",
    "signatures_for",
]


class UnsupportedLibraryVersion(ValueError):
    """The library reported a version for which no ABI table is known."""


def _ro(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))


# --------------------------------------------------------------------------------------
# Table type
# --------------------------------------------------------------------------------------

_CFields = tuple[tuple[str, Any], ...]


@dataclass(frozen=True, eq=False)
class LtABI:
    """Everything that differs between cuBLASLt and hipBLASLt builds.

    Enum/attribute maps use library-neutral keys (``"TRANSA"``, ``"R_16BF"``,
    ``"32F"`` ...).  A value of ``None`` means "this build has no such enumerator":
    the driver must not try to set it (e.g. hipBLASLt has no
    ``MATMUL_DESC_COMPUTE_TYPE`` attribute; compute and scale type are given only
    to ``MatmulDescCreate``).
    """

    name: str  # "cublaslt" | "hipblaslt"
    label: str  # human readable, e.g. "cuBLASLt 13.x"
    # [version_min, version_max) in the encoding of the library's GetVersion (module doc).
    version_min: int
    version_max: int
    source: str  # header / repo / tag the table was read from
    fn_prefix: str  # "cublasLt" | "hipblasLt"
    library_names: tuple[str, ...]  # sonames to try with ctypes.CDLL
    status: Mapping[str, int | None]
    operation: Mapping[str, int]  # N, T, C
    datatype_enum: str  # C type name of the data-type enum
    datatype: Mapping[str, int | None]
    compute_type_enum: str  # C type name of the compute-type enum
    compute_type: Mapping[str, int | None]
    matmul_desc_attr: Mapping[str, int | None]
    matmul_desc_attr_ctype: Mapping[str, Any]  # value type to pass for each attribute
    layout_attr: Mapping[str, int | None]
    layout_attr_ctype: Mapping[str, Any]
    pref_attr: Mapping[str, int | None]
    pref_attr_ctype: Mapping[str, Any]
    epilogue: Mapping[str, int | None]
    pointer_mode: Mapping[str, int | None]
    order: Mapping[str, int | None]
    # (field name, ctypes type) in declaration order, as in the C header.
    algo_fields: _CFields
    algo_size: int
    heuristic_result_fields: _CFields
    heuristic_result_size: int
    heuristic_result_offsets: Mapping[str, int]
    # cuBLASLt only (empty for hipBLASLt: its C API has no algo config/cap functions).
    algo_config_attr: Mapping[str, int]
    algo_config_attr_ctype: Mapping[str, Any]
    algo_cap_attr: Mapping[str, int]
    algo_cap_attr_ctype: Mapping[str, Any]
    # hipBLASLt >= 0.3 keeps the Tensile solution index as int32 in algo.data[0:4];
    # None where that is not so (cuBLASLt: ask CUBLASLT_ALGO_CONFIG_ID instead; hipBLASLt
    # 0.1/0.2 stored a std::shared_ptr there, so the algo was not serialisable).
    solution_index_offset: int | None
    notes: tuple[str, ...] = ()
    # How the A/B scale pointers of a scaled (fp8) GEMM are read, set through the
    # A/B_SCALE_MODE descriptor attributes (cublasLtMatmulMatrixScale_t,
    # hipblasLtMatmulMatrixScale_t). Empty where the table has no such attribute: then
    # only the default, one scalar per matrix, is available.
    matrix_scale: Mapping[str, int | None] = field(default_factory=lambda: _ro({}))

    # ---- helpers -------------------------------------------------------------------
    def symbol(self, generic: str) -> str:
        """``symbol("MatmulDescCreate")`` -> ``"cublasLtMatmulDescCreate"`` / ``"hipblasLt..."``."""
        return self.fn_prefix + generic

    @property
    def function_names(self) -> Mapping[str, str]:
        """Generic name -> exported symbol for every function this library offers."""
        return _ro({g: self.symbol(g) for g in signatures_for(self)})

    def supports(self, table: str, key: str) -> bool:
        """True when ``getattr(self, table)[key]`` exists and is not None."""
        return getattr(self, table).get(key) is not None

    def desc_attr(self, key: str) -> tuple[int, Any]:
        """(attribute id, ctypes value type) of a matmul-descriptor attribute; KeyError if absent."""
        return _attr(self, self.matmul_desc_attr, self.matmul_desc_attr_ctype, key, "matmul desc")

    def layout_attr_of(self, key: str) -> tuple[int, Any]:
        return _attr(self, self.layout_attr, self.layout_attr_ctype, key, "matrix layout")

    def pref_attr_of(self, key: str) -> tuple[int, Any]:
        return _attr(self, self.pref_attr, self.pref_attr_ctype, key, "preference")

    def status_name(self, code: int) -> str:
        for k, v in self.status.items():
            if v == code:
                return k
        return f"UNKNOWN_STATUS_{code}"

    def algo_struct(self) -> type[ctypes.Structure]:
        """ctypes class of ``xxxLtMatmulAlgo_t`` for this build (cached)."""
        return _structs(self)[0]

    def heuristic_result_struct(self) -> type[ctypes.Structure]:
        """ctypes class of ``xxxLtMatmulHeuristicResult_t`` for this build (cached)."""
        return _structs(self)[1]

    def solution_index(self, algo: ctypes.Structure | bytes | bytearray | memoryview) -> int:
        """hipBLASLt solution index stored in an algo (``*(int*)algo.data``).

        Source: hipBLASLt ``library/src/amd_detail/hipblaslt-ext.cpp`` rocm-6.2.0,
        ``getIndexFromAlgo``: ``int* algo_ptr = (int*)algo.data; ... return *algo_ptr;``
        and ``rocblaslt/src/tensile_host.cpp`` (``int* solutionIndex =
        (int*)(heuristicResultsArray[i].algo.data); *solutionIndex = solution->index;``).
        Same code at rocm-5.7.0.  Negative means "no solution".
        """
        if self.solution_index_offset is None:
            raise TypeError(f"{self.label}: the algo struct carries no solution index")
        raw = bytes(algo)
        off = self.solution_index_offset
        return int.from_bytes(raw[off : off + 4], "little", signed=True)


def _attr(
    abi: LtABI, ids: Mapping[str, int | None], types: Mapping[str, Any], key: str, what: str
) -> tuple[int, Any]:
    v = ids.get(key)
    if v is None:
        raise KeyError(f"{abi.label} has no {what} attribute {key!r}")
    return v, types[key]


_STRUCT_CACHE: dict[int, tuple[type[ctypes.Structure], type[ctypes.Structure]]] = {}


def _structs(abi: LtABI) -> tuple[type[ctypes.Structure], type[ctypes.Structure]]:
    got = _STRUCT_CACHE.get(id(abi))
    if got is None:
        tag = abi.label.replace(" ", "_").replace(".", "_").replace("/", "_")
        algo = type(f"MatmulAlgo_{tag}", (ctypes.Structure,), {"_fields_": list(abi.algo_fields)})
        fields = [("algo", algo)] + [f for f in abi.heuristic_result_fields if f[0] != "algo"]
        res = type(f"MatmulHeuristicResult_{tag}", (ctypes.Structure,), {"_fields_": fields})
        got = (algo, res)
        _STRUCT_CACHE[id(abi)] = got
    return got


# --------------------------------------------------------------------------------------
# Attribute value types (the size passed as sizeInBytes is ctypes.sizeof of these).
# Types are the "Data Type" lines of the header docs; hipBLASLt's setters memcpy
# exactly sizeof(int32_t)/sizeof(int64_t)/sizeof(void*) (rocblaslt_auxiliary.cpp
# rocm-5.7.0 and rocm-6.2.0, rocblaslt_matmul_desc_set_attribute /
# rocblaslt_matrix_layout_set_attribute).
# --------------------------------------------------------------------------------------

_DESC_CTYPES = _ro(
    {
        "COMPUTE_TYPE": ctypes.c_int32,
        "SCALE_TYPE": ctypes.c_int32,
        "POINTER_MODE": ctypes.c_int32,
        "TRANSA": ctypes.c_int32,
        "TRANSB": ctypes.c_int32,
        "TRANSC": ctypes.c_int32,
        "FILL_MODE": ctypes.c_int32,
        "EPILOGUE": ctypes.c_uint32,
        "BIAS_POINTER": ctypes.c_void_p,
        "BIAS_BATCH_STRIDE": ctypes.c_int64,
        "BIAS_DATA_TYPE": ctypes.c_int32,
        "EPILOGUE_AUX_POINTER": ctypes.c_void_p,
        "EPILOGUE_AUX_LD": ctypes.c_int64,
        "EPILOGUE_AUX_BATCH_STRIDE": ctypes.c_int64,
        "EPILOGUE_AUX_DATA_TYPE": ctypes.c_int32,
        "EPILOGUE_AUX_SCALE_POINTER": ctypes.c_void_p,
        "ALPHA_VECTOR_BATCH_STRIDE": ctypes.c_int64,
        "SM_COUNT_TARGET": ctypes.c_int32,
        "A_SCALE_POINTER": ctypes.c_void_p,
        "B_SCALE_POINTER": ctypes.c_void_p,
        "C_SCALE_POINTER": ctypes.c_void_p,
        "D_SCALE_POINTER": ctypes.c_void_p,
        "D_SCALE_VECTOR_POINTER": ctypes.c_void_p,
        "AMAX_D_POINTER": ctypes.c_void_p,
        "FAST_ACCUM": ctypes.c_int8,
        "A_SCALE_MODE": ctypes.c_int32,
        "B_SCALE_MODE": ctypes.c_int32,
    }
)

_LAYOUT_CTYPES = _ro(
    {
        "TYPE": ctypes.c_uint32,
        "ORDER": ctypes.c_int32,
        "ROWS": ctypes.c_uint64,
        "COLS": ctypes.c_uint64,
        "LD": ctypes.c_int64,
        "BATCH_COUNT": ctypes.c_int32,
        "STRIDED_BATCH_OFFSET": ctypes.c_int64,
    }
)

_PREF_CTYPES = _ro({"SEARCH_MODE": ctypes.c_uint32, "MAX_WORKSPACE_BYTES": ctypes.c_uint64})

# Common epilogue numbering: identical in cublasLt.h (cuda13.1) and hipblaslt.h
# (every tag from rocm-5.5.0 to develop): DEFAULT=1, RELU=2, BIAS=4, RELU_BIAS=2|4,
# GELU=32, GELU_BIAS=32|4.
_EPILOGUE_BASE = {"DEFAULT": 1, "RELU": 2, "BIAS": 4, "RELU_BIAS": 6, "GELU": 32, "GELU_BIAS": 36}
# cuda13.1: GELU_AUX=GELU|128=160, GELU_AUX_BIAS=164, DGELU=64|128=192, DGELU_BGRAD=192|16=208,
# BGRADA=256, BGRADB=512, RELU_AUX=130, RELU_AUX_BIAS=134, DRELU=8|128=136, DRELU_BGRAD=152.
_EPILOGUE_EXT = {
    "GELU_AUX": 160,
    "GELU_AUX_BIAS": 164,
    "DGELU": 192,
    "DGELU_BGRAD": 208,
    "BGRADA": 256,
    "BGRADB": 512,
}

# --------------------------------------------------------------------------------------
# cuBLASLt
# --------------------------------------------------------------------------------------

# cublas_api.h (cuda13.1) enum cublasStatus_t; unchanged since CUDA 10.
_CUBLAS_STATUS = {
    "SUCCESS": 0,
    "NOT_INITIALIZED": 1,
    "ALLOC_FAILED": 3,
    "INVALID_VALUE": 7,
    "ARCH_MISMATCH": 8,
    "MAPPING_ERROR": 11,
    "EXECUTION_FAILED": 13,
    "INTERNAL_ERROR": 14,
    "NOT_SUPPORTED": 15,
    "LICENSE_ERROR": 16,
    "HANDLE_IS_NULLPTR": None,
    "INVALID_ENUM": None,
    "UNKNOWN": None,
}

# cublas_api.h (cuda13.1) cublasOperation_t: CUBLAS_OP_N=0, T=1, C=2.
_CUBLAS_OP = {"N": 0, "T": 1, "C": 2}

# library_types.h (cuda13.1) cudaDataType_t.  E4M3/E5M2 added in CUDA 11.8 (hipify).
_CUDA_DATATYPE = {
    "R_32F": 0,
    "R_64F": 1,
    "R_16F": 2,
    "R_8I": 3,
    "R_8U": 8,
    "R_32I": 10,
    "R_16BF": 14,
    "R_8F_E4M3": 28,
    "R_8F_E5M2": 29,
    "R_8F_E4M3_FNUZ": None,
    "R_8F_E5M2_FNUZ": None,
}

# cublas_api.h (cuda13.1) cublasComputeType_t (all since CUDA 11.0 per hipify).
_CUBLAS_COMPUTE = {
    "16F": 64,
    "16F_PEDANTIC": 65,
    "32F": 68,
    "32F_PEDANTIC": 69,
    "64F": 70,
    "64F_PEDANTIC": 71,
    "32I": 72,
    "32I_PEDANTIC": 73,
    "32F_FAST_16F": 74,
    "32F_FAST_16BF": 75,
    "32F_FAST_TF32": 77,
}

# cublasLt.h (cuda13.1) cublasLtMatmulDescAttributes_t.  All of these were added in
# CUDA <= 11.8 (hipify "A" column) and are present in 13.1, so they hold for 12.x too.
_CUBLASLT_DESC = {
    "COMPUTE_TYPE": 0,
    "SCALE_TYPE": 1,
    "POINTER_MODE": 2,
    "TRANSA": 3,
    "TRANSB": 4,
    "TRANSC": 5,
    "FILL_MODE": 6,
    "EPILOGUE": 7,
    "BIAS_POINTER": 8,
    "BIAS_BATCH_STRIDE": 10,
    "EPILOGUE_AUX_POINTER": 11,
    "EPILOGUE_AUX_LD": 12,
    "EPILOGUE_AUX_BATCH_STRIDE": 13,
    "ALPHA_VECTOR_BATCH_STRIDE": 14,
    "SM_COUNT_TARGET": 15,
    "A_SCALE_POINTER": 17,
    "B_SCALE_POINTER": 18,
    "C_SCALE_POINTER": 19,
    "D_SCALE_POINTER": 20,
    "AMAX_D_POINTER": 21,
    "EPILOGUE_AUX_DATA_TYPE": 22,
    "EPILOGUE_AUX_SCALE_POINTER": 23,
    "FAST_ACCUM": 25,
    "BIAS_DATA_TYPE": 26,
    "D_SCALE_VECTOR_POINTER": None,
    # A/B_SCALE_MODE (31/32, block scaling) are filled in per major below.
    "A_SCALE_MODE": None,
    "B_SCALE_MODE": None,
}

# cublasLt.h (cuda13.1) cublasLtMatrixLayoutAttribute_t.
_CUBLASLT_LAYOUT = {
    "TYPE": 0,
    "ORDER": 1,
    "ROWS": 2,
    "COLS": 3,
    "LD": 4,
    "BATCH_COUNT": 5,
    "STRIDED_BATCH_OFFSET": 6,
}

# cublasLt.h (cuda13.1) cublasLtMatmulPreferenceAttributes_t.
_CUBLASLT_PREF = {"SEARCH_MODE": 0, "MAX_WORKSPACE_BYTES": 1}

# cublasLt.h (cuda13.1) cublasLtPointerMode_t (HOST/DEVICE = CUBLAS_POINTER_MODE_HOST/DEVICE = 0/1).
_CUBLASLT_POINTER_MODE = {
    "HOST": 0,
    "DEVICE": 1,
    "DEVICE_VECTOR": 2,
    "ALPHA_DEVICE_VECTOR_BETA_ZERO": 3,
    "ALPHA_DEVICE_VECTOR_BETA_HOST": 4,
}

# cublasLt.h (cuda13.1) cublasLtOrder_t.
_CUBLASLT_ORDER = {"COL": 0, "ROW": 1}

# cublasLt.h (cuda13.1) cublasLtMatmulAlgoConfigAttributes_t.  INNER_SHAPE_ID and
# CLUSTER_SHAPE_ID were added in CUDA 11.8 (hipify).
_CUBLASLT_ALGO_CONFIG = {
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
# Value types, from the same header's doc comments.
_CUBLASLT_ALGO_CONFIG_CTYPES = {
    "ID": ctypes.c_int32,
    "TILE_ID": ctypes.c_uint32,
    "SPLITK_NUM": ctypes.c_int32,
    "REDUCTION_SCHEME": ctypes.c_uint32,
    "CTA_SWIZZLING": ctypes.c_uint32,
    "CUSTOM_OPTION": ctypes.c_uint32,
    "STAGES_ID": ctypes.c_uint32,
    "INNER_SHAPE_ID": ctypes.c_uint16,
    "CLUSTER_SHAPE_ID": ctypes.c_uint16,
}

# cublasLt.h (cuda13.1) cublasLtMatmulAlgoCapAttributes_t.  There is no
# "CLUSTER_SHAPE_IDS" capability in any header read (13.1, nvmath union 11.0-13.1).
_CUBLASLT_ALGO_CAP = {
    "SPLITK_SUPPORT": 0,
    "REDUCTION_SCHEME_MASK": 1,
    "CTA_SWIZZLING_SUPPORT": 2,
    "STRIDED_BATCH_SUPPORT": 3,
    "OUT_OF_PLACE_RESULT_SUPPORT": 4,
    "UPLO_SUPPORT": 5,
    "TILE_IDS": 6,
    "CUSTOM_OPTION_MAX": 7,
    "CUSTOM_MEMORY_ORDER": 10,
    "POINTER_MODE_MASK": 11,
    "EPILOGUE_MASK": 12,
    "STAGES_IDS": 13,
    "LD_NEGATIVE": 14,
    "NUMERICAL_IMPL_FLAGS": 15,
    "MIN_ALIGNMENT_A_BYTES": 16,
    "MIN_ALIGNMENT_B_BYTES": 17,
    "MIN_ALIGNMENT_C_BYTES": 18,
    "MIN_ALIGNMENT_D_BYTES": 19,
}
# TILE_IDS / STAGES_IDS are "array of uint32_t" (query the count with sizeInBytes=0).
_CUBLASLT_ALGO_CAP_CTYPES = {
    "SPLITK_SUPPORT": ctypes.c_int32,
    "REDUCTION_SCHEME_MASK": ctypes.c_uint32,
    "CTA_SWIZZLING_SUPPORT": ctypes.c_uint32,
    "STRIDED_BATCH_SUPPORT": ctypes.c_int32,
    "OUT_OF_PLACE_RESULT_SUPPORT": ctypes.c_int32,
    "UPLO_SUPPORT": ctypes.c_int32,
    "TILE_IDS": ctypes.c_uint32,
    "CUSTOM_OPTION_MAX": ctypes.c_int32,
    "CUSTOM_MEMORY_ORDER": ctypes.c_int32,
    "POINTER_MODE_MASK": ctypes.c_uint32,
    "EPILOGUE_MASK": ctypes.c_uint32,
    "STAGES_IDS": ctypes.c_uint32,
    "LD_NEGATIVE": ctypes.c_int32,
    "NUMERICAL_IMPL_FLAGS": ctypes.c_uint64,
    "MIN_ALIGNMENT_A_BYTES": ctypes.c_uint32,
    "MIN_ALIGNMENT_B_BYTES": ctypes.c_uint32,
    "MIN_ALIGNMENT_C_BYTES": ctypes.c_uint32,
    "MIN_ALIGNMENT_D_BYTES": ctypes.c_uint32,
}

# cublasLt.h (cuda13.1): typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
# typedef struct { cublasLtMatmulAlgo_t algo; size_t workspaceSize; cublasStatus_t state;
#                  float wavesCount; int reserved[4]; } cublasLtMatmulHeuristicResult_t;
# Measured with gcc on x86-64 against that header: sizeof 64 / 96, offsets 0/64/72/76/80.
# Same definition in nvmath cycublasLt.pxd (11.0.3 .. 13.1.0).
_CUBLASLT_ALGO_FIELDS: _CFields = (("data", ctypes.c_uint64 * 8),)
_CUBLASLT_RESULT_FIELDS: _CFields = (
    ("algo", None),  # replaced by the algo struct
    ("workspaceSize", ctypes.c_size_t),
    ("state", ctypes.c_int),
    ("wavesCount", ctypes.c_float),
    ("reserved", ctypes.c_int * 4),
)
_CUBLASLT_RESULT_OFFSETS = {"algo": 0, "workspaceSize": 64, "state": 72, "wavesCount": 76, "reserved": 80}


def _cublaslt(
    label: str,
    vmin: int,
    vmax: int,
    source: str,
    desc_extra: dict,
    notes: tuple,
    matrix_scale: Mapping[str, int | None] | None = None,
) -> LtABI:
    desc = dict(_CUBLASLT_DESC)
    desc.update(desc_extra)
    return LtABI(
        name="cublaslt",
        label=label,
        version_min=vmin,
        version_max=vmax,
        source=source,
        fn_prefix="cublasLt",
        library_names=(f"libcublasLt.so.{vmin // 10000}", "libcublasLt.so"),
        status=_ro(_CUBLAS_STATUS),
        operation=_ro(_CUBLAS_OP),
        datatype_enum="cudaDataType_t",
        datatype=_ro(_CUDA_DATATYPE),
        compute_type_enum="cublasComputeType_t",
        compute_type=_ro(_CUBLAS_COMPUTE),
        matmul_desc_attr=_ro(desc),
        matmul_desc_attr_ctype=_DESC_CTYPES,
        layout_attr=_ro(_CUBLASLT_LAYOUT),
        layout_attr_ctype=_LAYOUT_CTYPES,
        pref_attr=_ro(_CUBLASLT_PREF),
        pref_attr_ctype=_PREF_CTYPES,
        epilogue=_ro({**_EPILOGUE_BASE, **_EPILOGUE_EXT}),
        pointer_mode=_ro(_CUBLASLT_POINTER_MODE),
        order=_ro(_CUBLASLT_ORDER),
        algo_fields=_CUBLASLT_ALGO_FIELDS,
        algo_size=64,
        heuristic_result_fields=_CUBLASLT_RESULT_FIELDS,
        heuristic_result_size=96,
        heuristic_result_offsets=_ro(_CUBLASLT_RESULT_OFFSETS),
        algo_config_attr=_ro(_CUBLASLT_ALGO_CONFIG),
        algo_config_attr_ctype=_ro(_CUBLASLT_ALGO_CONFIG_CTYPES),
        algo_cap_attr=_ro(_CUBLASLT_ALGO_CAP),
        algo_cap_attr_ctype=_ro(_CUBLASLT_ALGO_CAP_CTYPES),
        solution_index_offset=None,
        notes=notes,
        matrix_scale=_ro(matrix_scale or {}),
    )


# cublasLt.h (cuda13.1) cublasLtMatmulMatrixScale_t (the same numbers in nvmath's
# MatmulMatrixScale). OUTER_VEC_32F is the row-wise mode (scale_A has M values, scale_B
# N); the cuBLAS guide ("Narrow Precision Data Types Usage") lists it, and the 128 /
# 128x128 block modes, for compute capability 9.0; tensor-wise for 8.9+.
_CUBLASLT_MATRIX_SCALE = {
    "SCALAR_32F": 0,
    "VEC16_UE4M3": 1,
    "VEC32_UE8M0": 2,
    "OUTER_VEC_32F": 3,
    "VEC128_32F": 4,
    "BLK128x128_32F": 5,
}

#: cuBLASLt 13.x (CUDA 13).  Read from cuda13.1 (cuBLAS 13.1.0.3).
CUBLASLT_13 = _cublaslt(
    "cuBLASLt 13.x",
    130000,
    140000,
    "cublasLt.h/cublas_api.h/library_types.h of CUDA 13.0 toolkit, cuBLAS 13.1.0.3",
    # A/B_SCALE_MODE: cublasLt.h cuda13.1 (31/32).
    {"A_SCALE_MODE": 31, "B_SCALE_MODE": 32},
    (
        "ATOMIC_SYNC_* descriptor attributes (27-30) and ALGO_CAP_ATOMIC_SYNC (20) are absent "
        "from the 13.1 header (present since 12.2 per hipify); they are not in this table.",
    ),
    _CUBLASLT_MATRIX_SCALE,
)

#: cuBLASLt 12.x (CUDA 12).  Same numbers as 13.x for every entry in the table: all were
#: added in CUDA <= 11.8 and none is marked deprecated/removed in hipify's 12.x tables.
CUBLASLT_12 = _cublaslt(
    "cuBLASLt 12.x",
    120000,
    130000,
    "cuda13.1 headers + ROCm/HIPIFY docs/tables (added/removed versions) + nvmath cycublasLt.pxd",
    {},
    (
        "No 12.x cublasLt.h was read directly: values are the 13.1 ones, which HIPIFY's tables "
        "show unchanged since <= 11.8; A/B_SCALE_MODE left out (added late in 12.x).",
    ),
)

# --------------------------------------------------------------------------------------
# hipBLASLt
# --------------------------------------------------------------------------------------

# hipblasStatus_t: hipblas-common.h (== hipblas@rocm-5.7.0 and @rocm-6.0.0 hipblas.h).
_HIPBLAS_STATUS = {
    "SUCCESS": 0,
    "NOT_INITIALIZED": 1,
    "ALLOC_FAILED": 2,
    "INVALID_VALUE": 3,
    "MAPPING_ERROR": 4,
    "EXECUTION_FAILED": 5,
    "INTERNAL_ERROR": 6,
    "NOT_SUPPORTED": 7,
    "ARCH_MISMATCH": 8,
    "HANDLE_IS_NULLPTR": 9,
    "INVALID_ENUM": 10,
    "UNKNOWN": 11,
    "LICENSE_ERROR": None,
}

# hipblasOperation_t: hipblas-common.h (static_assert'ed there) == hipblas@rocm-5.7.0.
_HIPBLAS_OP = {"N": 111, "T": 112, "C": 113}

# hipDataType: hip@rocm-6.0.0 .. hip@rocm-6.2.0 and HIP HEAD (Oct 2024).
# HIP_R_8F_E4M3=28 / HIP_R_8F_E5M2=29 (OCP fp8) were added by ROCm/HIP commit 4d4c6a44e
# (2024-08-15, "add fp8 ocp hip data type"), i.e. after the rocm-6.2.x tags -> ROCm >= 6.3.
# The FNUZ variants (1000/1001) are what gfx942 (MI300) uses.
_HIP_DATATYPE = {
    "R_32F": 0,
    "R_64F": 1,
    "R_16F": 2,
    "R_8I": 3,
    "R_8U": 8,
    "R_32I": 10,
    "R_16BF": 14,
    "R_8F_E4M3": 28,
    "R_8F_E5M2": 29,
    "R_8F_E4M3_FNUZ": 1000,
    "R_8F_E5M2_FNUZ": 1001,
}

# hipblasComputeType_t: hipblas-common.h == hipblas@rocm-6.0.0 hipblas.h.
_HIPBLAS_COMPUTE = {
    "16F": 0,
    "16F_PEDANTIC": 1,
    "32F": 2,
    "32F_PEDANTIC": 3,
    "32F_FAST_16F": 4,
    "32F_FAST_16BF": 5,
    "32F_FAST_TF32": 6,  # hipBLASLt maps its "xf32" to this (library/src/include/auxiliary.hpp rocm-6.2.0)
    "64F": 7,
    "64F_PEDANTIC": 8,
    "32I": 9,
    "32I_PEDANTIC": 10,
}

# hipblasLtMatmulDescAttributes_t, hipblaslt@rocm-6.1.0 == rocm-6.2.0 == develop for 0..13.
_HIPBLASLT6_DESC = {
    "COMPUTE_TYPE": None,  # not an attribute in hipBLASLt: only a MatmulDescCreate argument
    "SCALE_TYPE": None,  # idem
    "TRANSA": 0,
    "TRANSB": 1,
    "EPILOGUE": 2,
    "BIAS_POINTER": 3,
    "BIAS_DATA_TYPE": 4,
    "A_SCALE_POINTER": 5,
    "B_SCALE_POINTER": 6,
    "C_SCALE_POINTER": 7,
    "D_SCALE_POINTER": 8,
    "EPILOGUE_AUX_SCALE_POINTER": 9,
    "EPILOGUE_AUX_POINTER": 10,
    "EPILOGUE_AUX_LD": 11,
    "EPILOGUE_AUX_BATCH_STRIDE": 12,
    "POINTER_MODE": 13,
    # AMAX_D_POINTER=14 only from rocm-6.2.0; BIAS_BATCH_STRIDE=23, EPILOGUE_AUX_DATA_TYPE=22,
    # A/B_SCALE_MODE=31/32, SM_COUNT_TARGET=33 only in develop.  Left out (not in all 0.6+).
    "TRANSC": None,
    "FILL_MODE": None,
    "BIAS_BATCH_STRIDE": None,
    "ALPHA_VECTOR_BATCH_STRIDE": None,
    "SM_COUNT_TARGET": None,
    "AMAX_D_POINTER": None,
    "EPILOGUE_AUX_DATA_TYPE": None,
    "FAST_ACCUM": None,
    "D_SCALE_VECTOR_POINTER": None,
    "A_SCALE_MODE": None,
    "B_SCALE_MODE": None,
}

# hipblasLtMatmulDescAttributes_t of hipBLASLt 1.1.0 as released (``debian-1.1``: Debian
# unstable's libhipblaslt-dev 7.1.1+dfsg-4, hipblaslt-version.h 1.1.0; read by the
# compiler in CI, tests/amd_real): 0..13 as above, plus AMAX_D_POINTER=14,
# EPILOGUE_AUX_DATA_TYPE=22, A_SCALE_MODE=31, B_SCALE_MODE=32. The release has no
# BIAS_BATCH_STRIDE (23) and no SM_COUNT_TARGET (33): those were seen on develop only.
_HIPBLASLT11_DESC = _HIPBLASLT6_DESC | {
    "AMAX_D_POINTER": 14,
    "EPILOGUE_AUX_DATA_TYPE": 22,
    "A_SCALE_MODE": 31,
    "B_SCALE_MODE": 32,
}

# hipblasLtMatmulMatrixScale_t of hipBLASLt 1.1.0 (``debian-1.1``, read by the compiler in
# CI): the cuBLASLt numbers. The header marks VEC16_UE4M3, VEC128_32F and BLK128x128_32F
# "Not supported yet"; OUTER_VEC_32F replaces the A/B_SCALE_POINTER_VEC_EXT attributes of
# 0.7-1.0, which the 1.1 header turns into a static_assert.
_HIPBLASLT11_MATRIX_SCALE = {
    "SCALAR_32F": 0,
    "VEC16_UE4M3": 1,
    "VEC32_UE8M0": 2,
    "OUTER_VEC_32F": 3,
    "VEC128_32F": 4,
    "BLK128x128_32F": 5,
}

# hipblasLtMatrixLayoutAttribute_t, hipblaslt@rocm-6.0.0 .. develop.
_HIPBLASLT6_LAYOUT = {
    "BATCH_COUNT": 0,
    "STRIDED_BATCH_OFFSET": 1,
    "TYPE": 2,
    "ORDER": 3,
    "ROWS": 4,
    "COLS": 5,
    "LD": 6,
}

# hipblasLtMatmulPreferenceAttributes_t, every tag rocm-5.5.0 .. develop.
_HIPBLASLT_PREF = {"SEARCH_MODE": 0, "MAX_WORKSPACE_BYTES": 1}

# hipblasLtOrder_t, hipblaslt@rocm-6.0.0 .. develop (COL=0, ROW=1).
_HIPBLASLT_ORDER = {"COL": 0, "ROW": 1}

# hipblasLtPointerMode_t: rocm-6.1.0 .. develop: HOST=0, DEVICE=1, ALPHA_DEVICE_VECTOR_BETA_HOST=4.
_HIPBLASLT_POINTER_MODE = {
    "HOST": 0,
    "DEVICE": 1,
    "DEVICE_VECTOR": None,
    "ALPHA_DEVICE_VECTOR_BETA_ZERO": None,
    "ALPHA_DEVICE_VECTOR_BETA_HOST": 4,
}
# rocm-6.0.0 only: HOST=0, ALPHA_DEVICE_VECTOR_BETA_HOST=1 (no DEVICE).
_HIPBLASLT60_POINTER_MODE = {**_HIPBLASLT_POINTER_MODE, "DEVICE": None, "ALPHA_DEVICE_VECTOR_BETA_HOST": 1}

# hipblaslt@rocm-5.7.0 .. develop:
#   typedef struct _hipblasLtMatmulAlgo_t { uint8_t data[16]; size_t max_workspace_bytes; }
#   typedef struct _hipblasLtMatmulHeuristicResult_t { hipblasLtMatmulAlgo_t algo;
#       size_t workspaceSize; hipblasStatus_t state; float wavesCount; int reserved[4]; }
# -> algo 24 bytes (16 + 8, align 8), result 24+8+4+4+16 = 56 bytes.
# NB: the library itself reinterprets the 24 bytes as rocblaslt_matmul_algo
# (__attribute__((packed, aligned(8))) { uint8_t data[8]; bool fallback; size_t
# max_workspace_bytes; }, rocblaslt-types.h rocm-6.2.0), so the public
# max_workspace_bytes field is NOT where the library keeps that value: treat the
# algo as an opaque 24-byte blob and copy it whole.
_HIP_ALGO16_FIELDS: _CFields = (("data", ctypes.c_uint8 * 16), ("max_workspace_bytes", ctypes.c_size_t))
_HIP_RESULT_FIELDS: _CFields = (
    ("algo", None),
    ("workspaceSize", ctypes.c_size_t),
    ("state", ctypes.c_int),
    ("wavesCount", ctypes.c_float),
    ("reserved", ctypes.c_int * 4),
)

_HIP_SOURCES_6 = (
    "ROCm/hipBLASLt library/include/hipblaslt.h @rocm-6.0.0..rocm-6.2.0 + rocm-rel-6.3 branch; "
    "ROCm/rocm-libraries projects/hipblaslt (develop, 1.1.0); ROCm/HIP include/hip/library_types.h; "
    "ROCm/hipBLAS-common hipblas-common.h"
)


def _hip6(
    label: str,
    vmin: int,
    vmax: int,
    pointer_mode: dict,
    datatype: dict,
    notes: tuple,
    *,
    desc: dict | None = None,
    source: str = _HIP_SOURCES_6,
    matrix_scale: Mapping[str, int | None] | None = None,
) -> LtABI:
    return LtABI(
        name="hipblaslt",
        label=label,
        version_min=vmin,
        version_max=vmax,
        source=source,
        fn_prefix="hipblasLt",
        # .so.1: ROCm 7 (Debian's hipBLASLt 7.1.1 ships libhipblaslt.so.1); .so.0: ROCm 6.
        library_names=("libhipblaslt.so", "libhipblaslt.so.1", "libhipblaslt.so.0"),
        status=_ro(_HIPBLAS_STATUS),
        operation=_ro(_HIPBLAS_OP),
        datatype_enum="hipDataType",
        datatype=_ro(datatype),
        compute_type_enum="hipblasComputeType_t",
        compute_type=_ro(_HIPBLAS_COMPUTE),
        matmul_desc_attr=_ro(_HIPBLASLT6_DESC if desc is None else desc),
        matmul_desc_attr_ctype=_DESC_CTYPES,
        layout_attr=_ro(_HIPBLASLT6_LAYOUT),
        layout_attr_ctype=_LAYOUT_CTYPES,
        pref_attr=_ro(_HIPBLASLT_PREF),
        pref_attr_ctype=_PREF_CTYPES,
        epilogue=_ro({**_EPILOGUE_BASE, **_EPILOGUE_EXT}),
        pointer_mode=_ro(pointer_mode),
        order=_ro(_HIPBLASLT_ORDER),
        algo_fields=_HIP_ALGO16_FIELDS,
        algo_size=24,
        heuristic_result_fields=_HIP_RESULT_FIELDS,
        heuristic_result_size=56,
        heuristic_result_offsets=_ro(
            {"algo": 0, "workspaceSize": 24, "state": 32, "wavesCount": 36, "reserved": 40}
        ),
        algo_config_attr=_ro({}),
        algo_config_attr_ctype=_ro({}),
        algo_cap_attr=_ro({}),
        algo_cap_attr_ctype=_ro({}),
        solution_index_offset=0,
        notes=notes,
        matrix_scale=_ro(matrix_scale or {}),
    )


_HIP6_NOTES = (
    "hipDataType/hipblasComputeType_t replaced hipblasDatatype_t/hipblasLtComputeType_t in ROCm 6.0 "
    "(hipBLASLt commit 592518e7 'Hotfix adopt hipDataType and hipblasComputeType_t', first tag rocm-6.0.0).",
    "R_8F_E4M3/E5M2 (OCP, 28/29) exist only in HIP >= ROCm 6.3 and are accepted only where the GPU "
    "has OCP fp8 (gfx950/gfx12); MI300 (gfx942) uses the *_FNUZ types 1000/1001.",
    "hipblasLtGetVersion needs a handle; the heuristic 'state' field is a hipblasStatus_t (int).",
)

#: hipBLASLt 1.1+ (ROCm 7.1 ..): the numbers of HIPBLASLT_6 with the descriptor
#: attributes the 1.1 release adds. Checked in CI against the real header and library
#: of Debian's hipBLASLt 7.1.1 (hipBLASLt 1.1.0): every enum value, struct size and
#: offset, bound signature and attribute value size (tests/amd_real).
HIPBLASLT_1_1 = _hip6(
    "hipBLASLt 1.1+ (ROCm >= 7.1)",
    100100,
    200000,
    _HIPBLASLT_POINTER_MODE,
    _HIP_DATATYPE,
    (
        *_HIP6_NOTES,
        "Checked against the compiled header and the loaded library of Debian's hipBLASLt 7.1.1 "
        "(1.1.0), without a GPU: no kernel ran. Its getters refuse the layout TYPE/ORDER/ROWS/COLS/LD "
        "attributes (the setters take them).",
    ),
    desc=_HIPBLASLT11_DESC,
    matrix_scale=_HIPBLASLT11_MATRIX_SCALE,
    source="hipblaslt.h of hipBLASLt 1.1.0 (Debian libhipblaslt-dev 7.1.1+dfsg-4), hip/library_types.h "
    "(HIP 6.4.3), hipblas-common.h (7.1.0), read by the C++ compiler (tests/amd_real)",
)

#: hipBLASLt 0.7.0 .. 1.0.x (ROCm 6.1 .. 7.0). 1.1 has a table of its own (HIPBLASLT_1_1),
#: whose extra attributes this one marks absent: not every release in this range has them.
HIPBLASLT_6 = _hip6(
    "hipBLASLt 0.7-1.0 (ROCm 6.1-7.0)",
    700,
    100100,
    _HIPBLASLT_POINTER_MODE,
    _HIP_DATATYPE,
    _HIP6_NOTES,
)

#: hipBLASLt 0.6.x (ROCm 6.0): as HIPBLASLT_6 except hipblasLtPointerMode_t
#: (HOST=0, ALPHA_DEVICE_VECTOR_BETA_HOST=1, no DEVICE) and no OCP fp8 in HIP 6.0.
HIPBLASLT_6_0 = _hip6(
    "hipBLASLt 0.6 (ROCm 6.0)",
    600,
    700,
    _HIPBLASLT60_POINTER_MODE,
    {**_HIP_DATATYPE, "R_8F_E4M3": None, "R_8F_E5M2": None},
    (
        *_HIP6_NOTES,
        "Develop builds of Sept-Dec 2023 also reported 0.6.0 but still used hipblasltDatatype_t "
        "(HIPBLASLT_R_16F=150 ...); this table is for the released ROCm 6.0 library.",
    ),
)

# ---- hipBLASLt 0.1 - 0.3 (ROCm 5.5 - 5.7) ----------------------------------------------

# hipblasDatatype_t from hipBLAS (hipblas@rocm-5.7.0 hipblas.h): what hipBLASLt 5.x took
# for matrix/scale types.  No fp8 here: HIPBLASLT_R_8F_E4M3=170/E5M2=171 existed only in
# the develop-branch hipblasltDatatype_t (Aug-Nov 2023, never in a rocm-5.x tag; it had
# the same 150.. numbers as hipblasDatatype_t for the other types).
_HIPBLAS_DATATYPE_V1 = {
    "R_16F": 150,
    "R_32F": 151,
    "R_64F": 152,
    "R_8I": 160,
    "R_8U": 161,
    "R_32I": 162,
    "R_16BF": 168,  # HIPBLAS_R_16B
    "R_8F_E4M3": None,
    "R_8F_E5M2": None,
    "R_8F_E4M3_FNUZ": None,
    "R_8F_E5M2_FNUZ": None,
}

# hipblasLtComputeType_t (hipblaslt.h rocm-5.5.0..5.7.x): HIPBLASLT_COMPUTE_F32=300;
# HIPBLASLT_COMPUTE_F32_FAST_XF32=301 from rocm-5.7.0.
_HIPBLASLT5_COMPUTE = dict.fromkeys(_HIPBLAS_COMPUTE, None) | {"32F": 300}

# hipblasLtMatrixLayoutAttribute_t rocm-5.5.0..5.7.x: only BATCH_COUNT=0, STRIDED_BATCH_OFFSET=1.
_HIPBLASLT5_LAYOUT = dict.fromkeys(_HIPBLASLT6_LAYOUT, None) | {"BATCH_COUNT": 0, "STRIDED_BATCH_OFFSET": 1}

_HIPBLASLT5_DESC_COMMON = dict.fromkeys(_HIPBLASLT6_DESC, None) | {
    "TRANSA": 0,
    "TRANSB": 1,
    "EPILOGUE": 2,
    "BIAS_POINTER": 3,
    "BIAS_DATA_TYPE": 4,
}
# rocm-5.7.0: EPILOGUE_AUX_POINTER=6, _LD=7, _BATCH_STRIDE=8, D_SCALE_VECTOR_POINTER=100.
_HIPBLASLT57_DESC = _HIPBLASLT5_DESC_COMMON | {
    "EPILOGUE_AUX_POINTER": 6,
    "EPILOGUE_AUX_LD": 7,
    "EPILOGUE_AUX_BATCH_STRIDE": 8,
    "D_SCALE_VECTOR_POINTER": 100,
}
# rocm-5.5.0 / 5.6.0: HIPBLASLT_MATMUL_DESC_D_SCALE_POINTER = 5, documented as "D scale
# vector length must match matrix D rows" -> it is the per-row vector, named so here.
_HIPBLASLT55_DESC = _HIPBLASLT5_DESC_COMMON | {"D_SCALE_VECTOR_POINTER": 5}

_HIP5_EPILOGUE_55 = {**_EPILOGUE_BASE} | dict.fromkeys(_EPILOGUE_EXT, None)
_HIP5_POINTER_MODE = dict.fromkeys(_HIPBLASLT_POINTER_MODE, None) | {"HOST": 0}  # no pointer-mode attr
_HIP5_ORDER = {"COL": 0, "ROW": None}  # column-major only, no ORDER attribute


def _hip5(
    label: str,
    vmin: int,
    vmax: int,
    tag: str,
    desc: dict,
    compute: dict,
    epilogue: dict,
    algo_data: int,
    solution_index_offset: int | None,
    notes: tuple,
) -> LtABI:
    algo_size = algo_data + 8  # uint8_t data[N]; size_t max_workspace_bytes  (N % 8 == 0)
    return LtABI(
        name="hipblaslt",
        label=label,
        version_min=vmin,
        version_max=vmax,
        source=f"ROCm/hipBLASLt library/include/hipblaslt.h @{tag}; ROCm/hipBLAS hipblas.h @{tag}",
        fn_prefix="hipblasLt",
        library_names=("libhipblaslt.so", "libhipblaslt.so.0"),
        status=_ro(_HIPBLAS_STATUS),
        operation=_ro(_HIPBLAS_OP),
        datatype_enum="hipblasDatatype_t",
        datatype=_ro(_HIPBLAS_DATATYPE_V1),
        compute_type_enum="hipblasLtComputeType_t",
        compute_type=_ro(compute),
        matmul_desc_attr=_ro(desc),
        matmul_desc_attr_ctype=_DESC_CTYPES,
        layout_attr=_ro(_HIPBLASLT5_LAYOUT),
        layout_attr_ctype=_LAYOUT_CTYPES,
        pref_attr=_ro(_HIPBLASLT_PREF),
        pref_attr_ctype=_PREF_CTYPES,
        epilogue=_ro(epilogue),
        pointer_mode=_ro(_HIP5_POINTER_MODE),
        order=_ro(_HIP5_ORDER),
        algo_fields=(("data", ctypes.c_uint8 * algo_data), ("max_workspace_bytes", ctypes.c_size_t)),
        algo_size=algo_size,
        heuristic_result_fields=_HIP_RESULT_FIELDS,
        heuristic_result_size=algo_size + 32,
        heuristic_result_offsets=_ro(
            {
                "algo": 0,
                "workspaceSize": algo_size,
                "state": algo_size + 8,
                "wavesCount": algo_size + 12,
                "reserved": algo_size + 16,
            }
        ),
        algo_config_attr=_ro({}),
        algo_config_attr_ctype=_ro({}),
        algo_cap_attr=_ro({}),
        algo_cap_attr_ctype=_ro({}),
        solution_index_offset=solution_index_offset,
        notes=notes,
    )


_HIP5_NOTES = (
    "MatmulDescCreate takes (hipblasLtComputeType_t, hipblasDatatype_t); MatrixLayoutCreate takes "
    "hipblasDatatype_t.  No ORDER/TYPE/ROWS/COLS/LD layout attributes and no POINTER_MODE.",
)

#: hipBLASLt 0.3.x (ROCm 5.7): 24-byte algo, solution index in algo.data[0:4].
HIPBLASLT_5 = _hip5(
    "hipBLASLt 0.3 (ROCm 5.7)",
    300,
    400,
    "rocm-5.7.0",
    _HIPBLASLT57_DESC,
    _HIPBLASLT5_COMPUTE | {"32F_FAST_TF32": 301},  # HIPBLASLT_COMPUTE_F32_FAST_XF32
    {**_EPILOGUE_BASE, **_EPILOGUE_EXT},
    16,
    0,
    _HIP5_NOTES,
)

#: hipBLASLt 0.2.x (ROCm 5.6): uint8_t data[104] algo (112 bytes) holding shared_ptrs.
HIPBLASLT_5_6 = _hip5(
    "hipBLASLt 0.2 (ROCm 5.6)",
    200,
    300,
    "rocm-5.6.0",
    _HIPBLASLT55_DESC,
    _HIPBLASLT5_COMPUTE,
    _HIP5_EPILOGUE_55,
    104,
    None,
    (
        *_HIP5_NOTES,
        "algo.data holds std::shared_ptr<void> objects (tensile_host.cpp rocm-5.6.0 "
        "'algo.data.ptr = std::static_pointer_cast<void>(solution)'): not serialisable, no index.",
    ),
)

#: hipBLASLt 0.1.x (ROCm 5.5): uint8_t data[56] algo (64 bytes) holding a shared_ptr.
HIPBLASLT_5_5 = _hip5(
    "hipBLASLt 0.1 (ROCm 5.5)",
    100,
    200,
    "rocm-5.5.0",
    _HIPBLASLT55_DESC,
    _HIPBLASLT5_COMPUTE,
    _HIP5_EPILOGUE_55,
    56,
    None,
    (*_HIP5_NOTES, "algo.data holds a std::shared_ptr (tensile_host.cpp rocm-5.5.0): no index."),
)

ALL_ABIS: tuple[LtABI, ...] = (
    CUBLASLT_12,
    CUBLASLT_13,
    HIPBLASLT_5_5,
    HIPBLASLT_5_6,
    HIPBLASLT_5,
    HIPBLASLT_6_0,
    HIPBLASLT_6,
    HIPBLASLT_1_1,
)

# --------------------------------------------------------------------------------------
# Version selection
# --------------------------------------------------------------------------------------


def decode_cublaslt_version(v: int) -> tuple[int, int, int]:
    """130100 -> (13, 1, 0)."""
    return v // 10000, (v // 100) % 100, v % 100


def decode_hipblaslt_version(v: int) -> tuple[int, int, int]:
    """100100 -> (1, 1, 0); 800 -> (0, 8, 0)."""
    return v // 100000, (v // 100) % 1000, v % 100


def select_cublaslt_abi(version: int) -> LtABI:
    """Table for the value returned by ``cublasLtGetVersion()``."""
    for abi in (CUBLASLT_12, CUBLASLT_13):
        if abi.version_min <= version < abi.version_max:
            return abi
    maj, mnr, pat = decode_cublaslt_version(version)
    raise UnsupportedLibraryVersion(
        f"cuBLASLt version {version} (= {maj}.{mnr}.{pat}) is not supported: "
        "known ABI tables cover cuBLASLt 12.x (120000-129999) and 13.x (130000-139999)"
    )


def select_hipblaslt_abi(version: int) -> LtABI:
    """Table for the value written by ``hipblasLtGetVersion(handle, &v)``."""
    if 400 <= version < 600:
        raise UnsupportedLibraryVersion(
            f"hipBLASLt version {version} (0.{version // 100}) was never released: develop-branch "
            "builds of that time used the transitional hipblasltDatatype_t ABI, which is not supported"
        )
    for abi in (HIPBLASLT_5_5, HIPBLASLT_5_6, HIPBLASLT_5, HIPBLASLT_6_0, HIPBLASLT_6, HIPBLASLT_1_1):
        if abi.version_min <= version < abi.version_max:
            return abi
    maj, mnr, pat = decode_hipblaslt_version(version)
    raise UnsupportedLibraryVersion(
        f"hipBLASLt version {version} (= {maj}.{mnr}.{pat}) is not supported: known ABI tables "
        "cover hipBLASLt 0.1-0.3 (ROCm 5.5-5.7) and 0.6-1.x (ROCm 6.0-7.x), i.e. 100-399 and 600-199999"
    )


# --------------------------------------------------------------------------------------
# C signatures (ctypes).  Keys are the names without the cublasLt/hipblasLt prefix.
# Enum parameters are C ints; struct pointers are passed as c_void_p (use ctypes.byref
# or an array of abi.heuristic_result_struct()).  Return type cublasStatus_t /
# hipblasStatus_t = c_int.
# Sources: cublasLt.h (cuda13.1) and hipblaslt.h (rocm-5.7.0 .. develop): the shapes
# below are identical in both, parameter for parameter.
# --------------------------------------------------------------------------------------


class CFunction(tuple):
    """(restype, argtypes) of one C function; a plain 2-tuple with names."""

    __slots__ = ()

    def __new__(cls, restype: Any, argtypes: list[Any]) -> CFunction:
        return super().__new__(cls, (restype, tuple(argtypes)))

    @property
    def restype(self) -> Any:
        return self[0]

    @property
    def argtypes(self) -> tuple[Any, ...]:
        return self[1]


_st = ctypes.c_int  # cublasStatus_t / hipblasStatus_t
_vp = ctypes.c_void_p
_P = ctypes.POINTER

LT_SHARED_SIGNATURES: Mapping[str, CFunction] = _ro(
    {
        # (xxxLtHandle_t* handle)
        "Create": CFunction(_st, [_P(_vp)]),
        # (xxxLtHandle_t handle)
        "Destroy": CFunction(_st, [_vp]),
        # (MatrixLayout_t* matLayout, cudaDataType|hipDataType type, uint64_t rows,
        #  uint64_t cols, int64_t ld)
        "MatrixLayoutCreate": CFunction(
            _st, [_P(_vp), ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64]
        ),
        # (MatrixLayout_t matLayout)
        "MatrixLayoutDestroy": CFunction(_st, [_vp]),
        # (MatrixLayout_t matLayout, MatrixLayoutAttribute_t attr, const void* buf, size_t sizeInBytes)
        "MatrixLayoutSetAttribute": CFunction(_st, [_vp, ctypes.c_int, _vp, ctypes.c_size_t]),
        # (MatrixLayout_t matLayout, MatrixLayoutAttribute_t attr, void* buf, size_t sizeInBytes,
        #  size_t* sizeWritten)
        "MatrixLayoutGetAttribute": CFunction(
            _st, [_vp, ctypes.c_int, _vp, ctypes.c_size_t, _P(ctypes.c_size_t)]
        ),
        # (MatmulDesc_t* matmulDesc, ComputeType_t computeType, DataType scaleType)
        "MatmulDescCreate": CFunction(_st, [_P(_vp), ctypes.c_int, ctypes.c_int]),
        # (MatmulDesc_t matmulDesc)
        "MatmulDescDestroy": CFunction(_st, [_vp]),
        # (MatmulDesc_t matmulDesc, MatmulDescAttributes_t attr, const void* buf, size_t sizeInBytes)
        "MatmulDescSetAttribute": CFunction(_st, [_vp, ctypes.c_int, _vp, ctypes.c_size_t]),
        # (MatmulDesc_t matmulDesc, MatmulDescAttributes_t attr, void* buf, size_t sizeInBytes,
        #  size_t* sizeWritten)
        "MatmulDescGetAttribute": CFunction(
            _st, [_vp, ctypes.c_int, _vp, ctypes.c_size_t, _P(ctypes.c_size_t)]
        ),
        # (MatmulPreference_t* pref)
        "MatmulPreferenceCreate": CFunction(_st, [_P(_vp)]),
        # (MatmulPreference_t pref)
        "MatmulPreferenceDestroy": CFunction(_st, [_vp]),
        # (MatmulPreference_t pref, MatmulPreferenceAttributes_t attr, const void* buf, size_t sizeInBytes)
        "MatmulPreferenceSetAttribute": CFunction(_st, [_vp, ctypes.c_int, _vp, ctypes.c_size_t]),
        # (MatmulPreference_t pref, MatmulPreferenceAttributes_t attr, void* buf, size_t sizeInBytes,
        #  size_t* sizeWritten)
        "MatmulPreferenceGetAttribute": CFunction(
            _st, [_vp, ctypes.c_int, _vp, ctypes.c_size_t, _P(ctypes.c_size_t)]
        ),
        # (Handle_t lightHandle, MatmulDesc_t operationDesc, MatrixLayout_t Adesc, MatrixLayout_t Bdesc,
        #  MatrixLayout_t Cdesc, MatrixLayout_t Ddesc, MatmulPreference_t preference,
        #  int requestedAlgoCount, MatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount)
        "MatmulAlgoGetHeuristic": CFunction(
            _st, [_vp, _vp, _vp, _vp, _vp, _vp, _vp, ctypes.c_int, _vp, _P(ctypes.c_int)]
        ),
        # (Handle_t lightHandle, MatmulDesc_t computeDesc, const void* alpha, const void* A,
        #  MatrixLayout_t Adesc, const void* B, MatrixLayout_t Bdesc, const void* beta,
        #  const void* C, MatrixLayout_t Cdesc, void* D, MatrixLayout_t Ddesc,
        #  const MatmulAlgo_t* algo, void* workspace, size_t workspaceSizeInBytes,
        #  cudaStream_t|hipStream_t stream)
        "Matmul": CFunction(
            _st,
            [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp, ctypes.c_size_t, _vp],
        ),
    }
)

CUBLASLT_ONLY_SIGNATURES: Mapping[str, CFunction] = _ro(
    {
        # size_t cublasLtGetVersion(void)   (no handle; encoding in the module doc)
        "GetVersion": CFunction(ctypes.c_size_t, []),
        # size_t cublasLtGetCudartVersion(void)
        "GetCudartVersion": CFunction(ctypes.c_size_t, []),
        # const char* cublasLtGetStatusName(cublasStatus_t status)
        "GetStatusName": CFunction(ctypes.c_char_p, [ctypes.c_int]),
        # const char* cublasLtGetStatusString(cublasStatus_t status)
        "GetStatusString": CFunction(ctypes.c_char_p, [ctypes.c_int]),
        # (cublasLtHandle_t lightHandle, cublasComputeType_t computeType, cudaDataType_t scaleType,
        #  cudaDataType_t Atype, Btype, Ctype, Dtype, int requestedAlgoCount, int algoIdsArray[],
        #  int* returnAlgoCount)
        "MatmulAlgoGetIds": CFunction(
            _st,
            [
                _vp,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                _P(ctypes.c_int),
                _P(ctypes.c_int),
            ],
        ),
        # (cublasLtHandle_t lightHandle, cublasComputeType_t computeType, cudaDataType_t scaleType,
        #  Atype, Btype, Ctype, Dtype, int algoId, cublasLtMatmulAlgo_t* algo)
        "MatmulAlgoInit": CFunction(
            _st,
            [
                _vp,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                ctypes.c_int,
                _vp,
            ],
        ),
        # (cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, Adesc, Bdesc, Cdesc, Ddesc,
        #  const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result)
        "MatmulAlgoCheck": CFunction(_st, [_vp, _vp, _vp, _vp, _vp, _vp, _vp, _vp]),
        # (const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoCapAttributes_t attr, void* buf,
        #  size_t sizeInBytes, size_t* sizeWritten)
        "MatmulAlgoCapGetAttribute": CFunction(
            _st, [_vp, ctypes.c_int, _vp, ctypes.c_size_t, _P(ctypes.c_size_t)]
        ),
        # (cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, const void* buf,
        #  size_t sizeInBytes)
        "MatmulAlgoConfigSetAttribute": CFunction(_st, [_vp, ctypes.c_int, _vp, ctypes.c_size_t]),
        # (const cublasLtMatmulAlgo_t* algo, cublasLtMatmulAlgoConfigAttributes_t attr, void* buf,
        #  size_t sizeInBytes, size_t* sizeWritten)
        "MatmulAlgoConfigGetAttribute": CFunction(
            _st, [_vp, ctypes.c_int, _vp, ctypes.c_size_t, _P(ctypes.c_size_t)]
        ),
    }
)

HIPBLASLT_ONLY_SIGNATURES: Mapping[str, CFunction] = _ro(
    {
        # hipblasStatus_t hipblasLtGetVersion(hipblasLtHandle_t handle, int* version)
        "GetVersion": CFunction(_st, [_vp, _P(ctypes.c_int)]),
        # hipblasStatus_t hipblasLtGetGitRevision(hipblasLtHandle_t handle, char* rev)
        "GetGitRevision": CFunction(_st, [_vp, ctypes.c_char_p]),
        # hipblasStatus_t hipblasLtGetArchName(char** archName)   (rocm-5.7.0 and later)
        "GetArchName": CFunction(_st, [_P(ctypes.c_char_p)]),
    }
)


def signatures_for(abi: LtABI) -> Mapping[str, CFunction]:
    """Generic name -> CFunction for every function the driver may bind on ``abi``'s library."""
    extra = CUBLASLT_ONLY_SIGNATURES if abi.name == "cublaslt" else HIPBLASLT_ONLY_SIGNATURES
    return _ro({**LT_SHARED_SIGNATURES, **extra})
