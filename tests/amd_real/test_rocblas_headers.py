"""The rocBLAS ABI table against the real headers of Debian's rocBLAS (library 4.4.1).

As for hipBLASLt (``test_hipblaslt_headers.py``): every enum value the table holds is
the header's, the value the table keeps only for releases before 4.0 is gone, the
integer types are the LP64 ones, and every signature bound is the compiler's.
"""

from __future__ import annotations

import pytest
from amd_archive import AmdRoot
from header_probe import HeaderFacts, enumerators, mismatch, probe_source, run_probe

from unimatmul_backends.rocm import rocblas_abi as rb

#: Table -> (C enum, prefix of its enumerators).
ENUMS = {
    "ROCBLAS_STATUS": ("rocblas_status", "rocblas_status_"),
    "ROCBLAS_OPERATION": ("rocblas_operation", "rocblas_operation_"),
    "ROCBLAS_DATATYPE": ("rocblas_datatype", "rocblas_datatype_"),
    "ROCBLAS_COMPUTETYPE": ("rocblas_computetype", "rocblas_compute_type_"),
    "ROCBLAS_POINTER_MODE": ("rocblas_pointer_mode", "rocblas_pointer_mode_"),
    "ROCBLAS_GEMM_ALGO": ("rocblas_gemm_algo", "rocblas_gemm_algo_"),
    "ROCBLAS_GEMM_FLAGS": ("rocblas_gemm_flags", "rocblas_gemm_flags_"),
}
TYPES_HEADER = "rocblas/internal/rocblas-types.h"
VERSION_MACROS = ("ROCBLAS_VERSION_MAJOR", "ROCBLAS_VERSION_MINOR", "ROCBLAS_VERSION_PATCH")


@pytest.fixture(scope="module")
def facts(amd: AmdRoot, tmp_path_factory: pytest.TempPathFactory) -> HeaderFacts:
    text = (amd.include / TYPES_HEADER).read_text()
    source = probe_source(
        ["rocblas/rocblas.h"],
        {enum: enumerators(text, enum) for enum, _prefix in ENUMS.values()},
        values=VERSION_MACROS,
        sizes=["rocblas_int", "rocblas_stride"],
        functions=list(rb.ROCBLAS_SIGNATURES),
        # rocblas_gemm_ex_get_solutions is a "beta feature": declared only with this.
        defines=["ROCBLAS_BETA_FEATURES_API"],
    )
    return run_probe(source, amd.include, tmp_path_factory.mktemp("rocblas-probe"))


def test_the_archive_has_rocblas_4(facts: HeaderFacts, amd: AmdRoot) -> None:
    version = tuple(facts.values[m] for m in VERSION_MACROS)
    print(f"rocBLAS {'.'.join(map(str, version))} in the archive")
    assert version[0] == 4, "rocblas_abi.py covers rocBLAS 2.47 - 4.x"
    assert amd.rocblas.name in rb.ROCBLAS_LIBRARY_NAMES


@pytest.mark.parametrize("table", list(ENUMS))
def test_enum_values_are_the_headers(facts: HeaderFacts, table: str) -> None:
    enum, prefix = ENUMS[table]
    header = facts.enums[enum]
    wrong = [
        f"{prefix}{key}: table {value}, header {header.get(prefix + key, 'absent')}"
        for key, value in getattr(rb, table).items()
        if header.get(prefix + key) != value
    ]
    assert not wrong, f"{table} vs {enum}:\n" + "\n".join(wrong)


def test_the_pre_4_flag_is_gone(facts: HeaderFacts) -> None:
    """rocblas_gemm_flags_pack_int8x4 (0x1) was removed in rocBLAS 4.0 (ROCm 6.0)."""
    assert "rocblas_gemm_flags_pack_int8x4" not in facts.enums["rocblas_gemm_flags"]
    assert rb.ROCBLAS_GEMM_FLAGS_PACK_INT8X4_PRE_4 not in facts.enums["rocblas_gemm_flags"].values()


def test_integer_types_are_lp64(facts: HeaderFacts) -> None:
    """rocblas_int is int32_t unless the library was built with rocblas_ILP64; the table says so."""
    assert facts.sizes["rocblas_int"] == 4
    assert facts.sizes["rocblas_stride"] == 8


def test_every_bound_signature_is_the_headers(facts: HeaderFacts) -> None:
    wrong = []
    for name, (restype, argtypes) in rb.ROCBLAS_SIGNATURES.items():
        ret, params = facts.functions[name]
        if len(params) != len(argtypes):
            wrong.append(f"{name}: header {len(params)} parameters, ours {len(argtypes)}")
            continue
        pairs = [("returns", ret, restype)]
        pairs += [(f"parameter {i}", p, a) for i, (p, a) in enumerate(zip(params, argtypes, strict=True))]
        for where, header, ours in pairs:
            problem = mismatch(header, ours)
            if problem:
                wrong.append(f"{name} {where}: {problem}")
        # The compiler names an enum by its tag: typedef enum rocblas_status_ {...} rocblas_status.
        if ret.type_name != "rocblas_status_":
            wrong.append(f"{name} returns {ret}, not rocblas_status")
    assert not wrong, "\n".join(wrong)


def test_gemm_ex_takes_the_tables_enums(facts: HeaderFacts) -> None:
    """The enum arguments of rocblas_gemm_ex are the enums checked above (compute_type too
    is a rocblas_datatype there, not a rocblas_computetype), and flags is a uint32_t."""
    _ret, params = facts.functions["rocblas_gemm_ex"]
    names = [p.type_name for p in params]
    assert names[1:3] == ["rocblas_operation_"] * 2
    assert [names[i] for i in (8, 11, 15, 18, 20)] == ["rocblas_datatype_"] * 5
    assert names[21] == "rocblas_gemm_algo_"
    assert (params[22].kind, params[22].size) == ("int", 4)  # int32_t solution_index
    assert (params[23].kind, params[23].size) == ("uint", 4)  # uint32_t flags
