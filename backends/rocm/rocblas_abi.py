"""rocBLAS ABI table: enum values and ctypes signatures used by the rocBLAS backend.

Every number was read from ROCm/rocBLAS ``library/include/internal/rocblas-types.h``,
``rocblas-functions.h``, ``rocblas-beta.h`` and ``rocblas-auxiliary.h`` at the git tags
rocm-5.5.0 (rocBLAS 2.47.0), rocm-5.7.0 (3.1.0), rocm-6.0.0 (4.0.0), rocm-6.2.0
(4.2.0) and the repository HEAD of 2024-10-23 (4.4.0), plus ``rocblas-types.h`` of
ROCm/rocm-libraries ``projects/rocblas`` (develop, rocBLAS 5.1.0).  The values used
here are identical in all of them except where a comment says otherwise.  See
``docs/abi-sources.md``.

Versions: rocBLAS has no integer version getter.  ``rocblas_get_version_string``
fills ``"MAJOR.MINOR.PATCH.TWEAK"`` (``library/src/buildinfo.cpp``; TWEAK is a build
id/commit string); :func:`parse_rocblas_version` turns it into a tuple.  rocBLAS
versions by ROCm release (``CMakeLists.txt`` ``VERSION_STRING`` at each tag):
5.5 -> 2.47.0, 5.6 -> 3.0.0, 5.7 -> 3.1.0, 6.0 -> 4.0.0, 6.1 -> 4.1.0, 6.2 -> 4.2.0.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "ROCBLAS_COMPUTETYPE",
    "ROCBLAS_DATATYPE",
    "ROCBLAS_GEMM_ALGO",
    "ROCBLAS_GEMM_FLAGS",
    "ROCBLAS_GEMM_FLAGS_PACK_INT8X4_PRE_4",
    "ROCBLAS_LIBRARY_NAMES",
    "ROCBLAS_OPERATION",
    "ROCBLAS_POINTER_MODE",
    "ROCBLAS_SIGNATURES",
    "ROCBLAS_STATUS",
    "parse_rocblas_version",
    "rocblas_status_name",
]

# Sonames to try: librocblas.so.4 (ROCm 6.x), .so.3 (5.6/5.7), .so.5 (ROCm 7, not verified).
ROCBLAS_LIBRARY_NAMES: tuple[str, ...] = (
    "librocblas.so",
    "librocblas.so.5",
    "librocblas.so.4",
    "librocblas.so.3",
)

# rocblas_status (rocblas-types.h).  0..13 in every tag read; excluded_from_build=14 and
# arch_mismatch=15 from rocm-5.7.0 on (absent at rocm-5.5.0 and rocm-5.6.0).
ROCBLAS_STATUS: Mapping[str, int] = MappingProxyType(
    {
        "success": 0,
        "invalid_handle": 1,
        "not_implemented": 2,
        "invalid_pointer": 3,
        "invalid_size": 4,
        "memory_error": 5,
        "internal_error": 6,
        "perf_degraded": 7,
        "size_query_mismatch": 8,
        "size_increased": 9,
        "size_unchanged": 10,
        "invalid_value": 11,
        "continue": 12,
        "check_numerics_fail": 13,
        "excluded_from_build": 14,
        "arch_mismatch": 15,
    }
)

# rocblas_operation (rocblas-types.h): none=111, transpose=112, conjugate_transpose=113.
ROCBLAS_OPERATION: Mapping[str, int] = MappingProxyType(
    {"none": 111, "transpose": 112, "conjugate_transpose": 113}
)

# rocblas_datatype (rocblas-types.h).  150..169 and 255 in every tag read (rocm-5.5.0 on).
# f8_r=170 / bf8_r=171 exist from rocm-5.7.0 to at
# least HEAD 2024-10 (4.4.0) but are gone from the rocm-libraries develop header (5.1.0);
# which release dropped them was not pinned down.
ROCBLAS_DATATYPE: Mapping[str, int] = MappingProxyType(
    {
        "f16_r": 150,
        "f32_r": 151,
        "f64_r": 152,
        "f16_c": 153,
        "f32_c": 154,
        "f64_c": 155,
        "i8_r": 160,
        "u8_r": 161,
        "i32_r": 162,
        "u32_r": 163,
        "i8_c": 164,
        "u8_c": 165,
        "i32_c": 166,
        "u32_c": 167,
        "bf16_r": 168,
        "bf16_c": 169,
        "f8_r": 170,
        "bf8_r": 171,
        "invalid": 255,
    }
)

# rocblas_computetype (rocblas-types.h, rocm-5.7.0..4.4.0; used only by the fp8
# rocblas_gemm_ex3 API, not by rocblas_gemm_ex; absent from develop 5.1.0).
ROCBLAS_COMPUTETYPE: Mapping[str, int] = MappingProxyType(
    {
        "f32": 300,
        "f8_f8_f32": 301,
        "f8_bf8_f32": 302,
        "bf8_f8_f32": 303,
        "bf8_bf8_f32": 304,
        "invalid": 455,
    }
)

# rocblas_pointer_mode (rocblas-types.h).
ROCBLAS_POINTER_MODE: Mapping[str, int] = MappingProxyType({"host": 0, "device": 1})

# rocblas_gemm_algo (rocblas-types.h): standard=0x0, solution_index=0x1.
ROCBLAS_GEMM_ALGO: Mapping[str, int] = MappingProxyType({"standard": 0, "solution_index": 1})

# rocblas_gemm_flags (rocblas-types.h, rocm-5.7.0 .. develop).  none/use_cu_efficiency/
# fp16_alt_impl/check_solution_index are in every tag read (rocm-5.5.0 on);
# fp16_alt_impl_rnz appears at rocm-5.6.0 and stochastic_rounding at rocm-5.7.0.
ROCBLAS_GEMM_FLAGS: Mapping[str, int] = MappingProxyType(
    {
        "none": 0x0,
        "use_cu_efficiency": 0x2,
        "fp16_alt_impl": 0x4,
        "check_solution_index": 0x8,
        "fp16_alt_impl_rnz": 0x10,
        "stochastic_rounding": 0x20,
    }
)
# rocblas_gemm_flags_pack_int8x4 = 0x1 existed before rocBLAS 4.0 (ROCm 6.0); the
# header now says "Before ROCm 6.0 rocblas_gemm_flags_pack_int8x4 = 0x1, ... removed".
ROCBLAS_GEMM_FLAGS_PACK_INT8X4_PRE_4 = 0x1

_st = ctypes.c_int  # rocblas_status
_vp = ctypes.c_void_p  # rocblas_handle, hipStream_t, const void*, void*
_int = ctypes.c_int32  # rocblas_int (LP64 build; rocblas_ILP64 would make it int64_t)
_enum = ctypes.c_int  # rocblas_operation / rocblas_datatype / rocblas_gemm_algo
_stride = ctypes.c_int64  # rocblas_stride

# rocblas.h / rocblas-functions.h: the argument lists of the two GEMMs we run.
_GEMM_EX: tuple[object, ...] = (
    _vp,  # rocblas_handle handle
    _enum,  # rocblas_operation transA
    _enum,  # rocblas_operation transB
    _int,  # rocblas_int m
    _int,  # rocblas_int n
    _int,  # rocblas_int k
    _vp,  # const void* alpha
    _vp,  # const void* a
    _enum,  # rocblas_datatype a_type
    _int,  # rocblas_int lda
    _vp,  # const void* b
    _enum,  # rocblas_datatype b_type
    _int,  # rocblas_int ldb
    _vp,  # const void* beta
    _vp,  # const void* c
    _enum,  # rocblas_datatype c_type
    _int,  # rocblas_int ldc
    _vp,  # void* d
    _enum,  # rocblas_datatype d_type
    _int,  # rocblas_int ldd
    _enum,  # rocblas_datatype compute_type
    _enum,  # rocblas_gemm_algo algo
    ctypes.c_int32,  # int32_t solution_index
    ctypes.c_uint32,  # uint32_t flags
)
_GEMM_STRIDED_BATCHED_EX: tuple[object, ...] = (
    _vp,  # rocblas_handle handle
    _enum,  # rocblas_operation transA
    _enum,  # rocblas_operation transB
    _int,  # rocblas_int m
    _int,  # rocblas_int n
    _int,  # rocblas_int k
    _vp,  # const void* alpha
    _vp,  # const void* a
    _enum,  # rocblas_datatype a_type
    _int,  # rocblas_int lda
    _stride,  # rocblas_stride stride_a
    _vp,  # const void* b
    _enum,  # rocblas_datatype b_type
    _int,  # rocblas_int ldb
    _stride,  # rocblas_stride stride_b
    _vp,  # const void* beta
    _vp,  # const void* c
    _enum,  # rocblas_datatype c_type
    _int,  # rocblas_int ldc
    _stride,  # rocblas_stride stride_c
    _vp,  # void* d
    _enum,  # rocblas_datatype d_type
    _int,  # rocblas_int ldd
    _stride,  # rocblas_stride stride_d
    _int,  # rocblas_int batch_count
    _enum,  # rocblas_datatype compute_type
    _enum,  # rocblas_gemm_algo algo
    ctypes.c_int32,  # int32_t solution_index
    ctypes.c_uint32,  # uint32_t flags
)


def _get_solutions(gemm: tuple[object, ...]) -> tuple[object, ...]:
    """rocblas-beta.h's ``*_get_solutions`` (a "beta feature", same shape since 5.5): the
    GEMM's arguments without ``solution_index``, then flags, ``rocblas_int* list_array``
    (NULL: query the count) and ``rocblas_int* list_size`` (in: capacity, out: count)."""
    return (*gemm[:-2], ctypes.c_uint32, ctypes.POINTER(_int), ctypes.POINTER(_int))


ROCBLAS_SIGNATURES: Mapping[str, tuple[object, tuple[object, ...]]] = MappingProxyType(
    {
        # rocblas-auxiliary.h
        "rocblas_create_handle": (_st, (ctypes.POINTER(_vp),)),  # (rocblas_handle* handle)
        "rocblas_destroy_handle": (_st, (_vp,)),  # (rocblas_handle handle)
        "rocblas_set_stream": (_st, (_vp, _vp)),  # (rocblas_handle handle, hipStream_t stream)
        # rocblas-functions.h
        "rocblas_get_version_string": (_st, (ctypes.c_char_p, ctypes.c_size_t)),  # (char* buf, size_t len)
        "rocblas_get_version_string_size": (_st, (ctypes.POINTER(ctypes.c_size_t),)),  # (size_t* len)
        "rocblas_gemm_ex": (_st, _GEMM_EX),
        "rocblas_gemm_strided_batched_ex": (_st, _GEMM_STRIDED_BATCHED_EX),
        "rocblas_gemm_ex_get_solutions": (_st, _get_solutions(_GEMM_EX)),
        "rocblas_gemm_strided_batched_ex_get_solutions": (_st, _get_solutions(_GEMM_STRIDED_BATCHED_EX)),
    }
)


def rocblas_status_name(code: int) -> str:
    for k, v in ROCBLAS_STATUS.items():
        if v == code:
            return f"rocblas_status_{k}"
    return f"rocblas_status_unknown_{code}"


_VERSION_RE = re.compile(r"^\s*(\d+)\.(\d+)\.(\d+)")


def parse_rocblas_version(text: str | bytes) -> tuple[int, int, int]:
    """``"4.2.0.abcdef"`` (rocblas_get_version_string) -> ``(4, 2, 0)``."""
    if isinstance(text, bytes):
        text = text.split(b"\0", 1)[0].decode("ascii", "replace")
    m = _VERSION_RE.match(text)
    if not m:
        raise ValueError(f"not a rocBLAS version string: {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))
