"""The hipBLASLt ABI table against the real headers of Debian's hipBLASLt (and HIP).

The table under test is the one ``select_hipblaslt_abi`` picks for the version the
header declares (``hipblaslt-version.h``), so a new upstream version in the archive
is checked against whatever table would serve it. Every number the table holds must
be the header's; every key the table marks absent (``None``) must be absent from the
header; every struct size and offset, and every C signature the driver binds, must be
what the compiler makes of the header.
"""

from __future__ import annotations

import ctypes

import pytest
from amd_archive import AmdRoot
from header_probe import HeaderFacts, enumerators, mismatch, probe_source, run_probe

# Every hipBLASLt table binds the same functions: the shared Lt ones and the hipBLASLt-only ones.
from unimatmul_backends.lt.abi import HIPBLASLT_6, LtABI, select_hipblaslt_abi, signatures_for
from unimatmul_backends.rocm.hipblaslt import LIBRARY_NAMES
from unimatmul_backends.rocm.libraries import HIP_ERRORS, HIP_GET_DEVICE_COUNT

#: LtABI map -> (C enum it encodes, prefix of its enumerators, header that declares it).
ENUMS = {
    "status": ("hipblasStatus_t", "HIPBLAS_STATUS_", "hipblas-common/hipblas-common.h"),
    "operation": ("hipblasOperation_t", "HIPBLAS_OP_", "hipblas-common/hipblas-common.h"),
    "compute_type": ("hipblasComputeType_t", "HIPBLAS_COMPUTE_", "hipblas-common/hipblas-common.h"),
    "datatype": ("hipDataType", "HIP_", "hip/library_types.h"),
    "matmul_desc_attr": (
        "hipblasLtMatmulDescAttributes_t",
        "HIPBLASLT_MATMUL_DESC_",
        "hipblaslt/hipblaslt.h",
    ),
    "layout_attr": ("hipblasLtMatrixLayoutAttribute_t", "HIPBLASLT_MATRIX_LAYOUT_", "hipblaslt/hipblaslt.h"),
    "pref_attr": ("hipblasLtMatmulPreferenceAttributes_t", "HIPBLASLT_MATMUL_PREF_", "hipblaslt/hipblaslt.h"),
    "epilogue": ("hipblasLtEpilogue_t", "HIPBLASLT_EPILOGUE_", "hipblaslt/hipblaslt.h"),
    "pointer_mode": ("hipblasLtPointerMode_t", "HIPBLASLT_POINTER_MODE_", "hipblaslt/hipblaslt.h"),
    "order": ("hipblasLtOrder_t", "HIPBLASLT_ORDER_", "hipblaslt/hipblaslt.h"),
    # How a scaled (fp8) GEMM's A/B scales are read (A/B_SCALE_MODE).
    "matrix_scale": (
        "hipblasLtMatmulMatrixScale_t",
        "HIPBLASLT_MATMUL_MATRIX_SCALE_",
        "hipblaslt/hipblaslt.h",
    ),
}
STRUCTS = {
    "hipblasLtMatmulAlgo_t": ("data", "max_workspace_bytes"),
    "hipblasLtMatmulHeuristicResult_t": ("algo", "workspaceSize", "state", "wavesCount", "reserved"),
}
VERSION_MACROS = ("HIPBLASLT_VERSION_MAJOR", "HIPBLASLT_VERSION_MINOR", "HIPBLASLT_VERSION_PATCH")
#: The setter/getter functions and the enum their attribute parameter must be.
ATTRIBUTE_ENUMS = {
    "MatmulDescSetAttribute": "matmul_desc_attr",
    "MatmulDescGetAttribute": "matmul_desc_attr",
    "MatrixLayoutSetAttribute": "layout_attr",
    "MatrixLayoutGetAttribute": "layout_attr",
    "MatmulPreferenceSetAttribute": "pref_attr",
    "MatmulPreferenceGetAttribute": "pref_attr",
}


@pytest.fixture(scope="module")
def facts(amd: AmdRoot, tmp_path_factory: pytest.TempPathFactory) -> HeaderFacts:
    names = {
        enum: enumerators((amd.include / header).read_text(), enum)
        for enum, _prefix, header in ENUMS.values()
    }
    functions = [f"hipblasLt{generic}" for generic in signatures_for(HIPBLASLT_6)]
    source = probe_source(
        ["hipblaslt/hipblaslt.h", "hip/hip_runtime_api.h"],
        names,
        values=[*VERSION_MACROS, *HIP_ERRORS.values()],
        structs=STRUCTS,
        functions=[*functions, HIP_GET_DEVICE_COUNT],
    )
    return run_probe(source, amd.include, tmp_path_factory.mktemp("hipblaslt-probe"))


def header_version(facts: HeaderFacts) -> int:
    major, minor, patch = (facts.values[m] for m in VERSION_MACROS)
    return major * 100000 + minor * 100 + patch  # hipblasLtGetVersion's encoding (abi.py)


@pytest.fixture(scope="module")
def abi(facts: HeaderFacts) -> LtABI:
    return select_hipblaslt_abi(header_version(facts))


def test_a_table_serves_the_archives_version(facts: HeaderFacts, abi: LtABI) -> None:
    """Written against 1.1.0 (100100); a later version is checked against the table it selects."""
    version = header_version(facts)
    print(f"hipBLASLt {version} in the archive: checked against {abi.label}")
    assert abi.version_min <= version < abi.version_max


def test_soname_is_one_the_loader_tries(amd: AmdRoot, abi: LtABI) -> None:
    soname = amd.hipblaslt.name
    assert soname in LIBRARY_NAMES
    assert soname in abi.library_names


@pytest.mark.parametrize("table", list(ENUMS))
def test_enum_values_are_the_headers(facts: HeaderFacts, abi: LtABI, table: str) -> None:
    enum, prefix, _header = ENUMS[table]
    header = facts.enums[enum]
    wrong = []
    for key, value in getattr(abi, table).items():
        name = prefix + key
        if value is None and name in header:
            wrong.append(f"{name}: the table says absent, the header has {header[name]}")
        elif value is not None and header.get(name) != value:
            wrong.append(f"{name}: table {value}, header {header.get(name, 'absent')}")
    assert not wrong, f"{abi.label} {table} vs {enum}:\n" + "\n".join(wrong)


def test_struct_layouts_are_the_headers(facts: HeaderFacts, abi: LtABI) -> None:
    algo, result = abi.algo_struct(), abi.heuristic_result_struct()
    assert facts.sizes["hipblasLtMatmulAlgo_t"] == abi.algo_size == ctypes.sizeof(algo)
    assert (
        facts.sizes["hipblasLtMatmulHeuristicResult_t"] == abi.heuristic_result_size == ctypes.sizeof(result)
    )
    for name, _ctype in abi.algo_fields:
        key = f"hipblasLtMatmulAlgo_t.{name}"
        assert getattr(algo, name).offset == facts.offsets[key], key
        assert getattr(algo, name).size == facts.sizes[key], key
    for name, offset in abi.heuristic_result_offsets.items():
        key = f"hipblasLtMatmulHeuristicResult_t.{name}"
        assert facts.offsets[key] == offset == getattr(result, name).offset, key
        assert facts.sizes[key] == getattr(result, name).size, key
    # The solution index is an int32 at the start of algo.data (abi.solution_index).
    assert abi.solution_index_offset == 0 == facts.offsets["hipblasLtMatmulAlgo_t.data"]


def test_every_bound_signature_is_the_headers(facts: HeaderFacts, abi: LtABI) -> None:
    wrong = []
    for generic, signature in signatures_for(abi).items():
        symbol = abi.symbol(generic)
        ret, params = facts.functions[symbol]
        if len(params) != len(signature.argtypes):
            wrong.append(f"{symbol}: header {len(params)} parameters, ours {len(signature.argtypes)}")
            continue
        problem = mismatch(ret, signature.restype)
        if problem:
            wrong.append(f"{symbol} returns: {problem}")
        for i, (param, ours) in enumerate(zip(params, signature.argtypes, strict=True)):
            problem = mismatch(param, ours)
            if problem:
                wrong.append(f"{symbol} parameter {i}: {problem}")
    assert not wrong, "\n".join(wrong)


def test_enum_parameters_are_the_tables_enums(facts: HeaderFacts, abi: LtABI) -> None:
    """The data-type, compute-type and attribute enums the functions take are the ones checked above."""
    _ret, layout_create = facts.functions["hipblasLtMatrixLayoutCreate"]
    assert layout_create[1].type_name == abi.datatype_enum
    _ret, desc_create = facts.functions["hipblasLtMatmulDescCreate"]
    assert (desc_create[1].type_name, desc_create[2].type_name) == (abi.compute_type_enum, abi.datatype_enum)
    for generic, table in ATTRIBUTE_ENUMS.items():
        _ret, params = facts.functions[abi.symbol(generic)]
        assert params[1].type_name == ENUMS[table][0], generic
    for generic in signatures_for(abi):
        ret, _params = facts.functions[abi.symbol(generic)]
        assert ret.type_name == ENUMS["status"][0], generic  # what abi.status decodes


def test_hip_device_count_is_what_the_device_check_calls(facts: HeaderFacts) -> None:
    """The availability check asks hipGetDeviceCount before any hipBLASLt handle exists."""
    ret, params = facts.functions[HIP_GET_DEVICE_COUNT]
    assert ret.kind == "enum" and ret.type_name == "hipError_t"
    assert [p.kind for p in params] == ["ptr"]
    for value, name in HIP_ERRORS.items():
        assert facts.values[name] == value, name


def test_header_enumerators_the_table_leaves_out(facts: HeaderFacts, abi: LtABI) -> None:
    """Not an error: a list of what the header has and the table does not name, for the log."""
    left_out = []
    for table, (enum, prefix, _header) in ENUMS.items():
        keys = {prefix + key for key in getattr(abi, table)}
        left_out += [
            f"{table}: {name}={value}" for name, value in facts.enums[enum].items() if name not in keys
        ]
    print(f"{abi.label}: header enumerators not in the table ({len(left_out)}):")
    for line in left_out:
        print("  " + line)
    assert facts.enums["hipblasLtMatmulDescAttributes_t"], "the probe read no descriptor attribute at all"
