"""Debian's real libhipblaslt through the project's Lt driver, in a child process.

``lt_real_child.py`` builds the driver's plans on the real library (no handle: there is
no device) and reads every attribute back with the library's own getters; here each
value is checked against what the ABI table and the plan's ``LtGemm`` say it must be.
This proves the host half of the call path: the symbols, the descriptor, layout and
preference attribute ids and value sizes, the enum values the library stores and
validates. Nothing here launches a kernel.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import pytest
from amd_archive import AmdRoot
from lt_real_child import BIAS_ADDRESS, PROBLEMS, SCALE_ADDRESSES, WORKSPACE

from unimatmul_backends.lt.abi import LtABI, select_hipblaslt_abi
from unimatmul_backends.lt.driver import DATATYPES
from unimatmul_backends.lt.layout import lt_problem
from unimatmul_backends.rocm.libraries import ENV_HIPBLASLT

CHILD = Path(__file__).with_name("lt_real_child.py")
#: hipblaslt.h: #define HIPBLASLT_DATATYPE_INVALID static_cast<hipDataType>(255), the
#: bias type of a descriptor whose bias type was never set.
DATATYPE_INVALID = 255
#: What the tables name, by the ctypes value type of each table.
CTYPES = {
    "matmul_desc_attr": "matmul_desc_attr_ctype",
    "layout_attr": "layout_attr_ctype",
    "pref_attr": "pref_attr_ctype",
}


@pytest.fixture(scope="module")
def version(amd: AmdRoot) -> int:
    major, minor, patch = amd.header_version("hipblaslt")
    return major * 100000 + minor * 100 + patch


@pytest.fixture(scope="module")
def abi(version: int) -> LtABI:
    return select_hipblaslt_abi(version)


@pytest.fixture(scope="module")
def report(amd: AmdRoot, version: int) -> dict[str, Any]:
    proc = amd.run_python(str(CHILD), str(version), env={ENV_HIPBLASLT: str(amd.hipblaslt)})
    assert proc.returncode == 0, f"the child failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def value(got: dict[str, Any], ctype: Any) -> Any:
    """The value a getter wrote, read as the table's ctype (whose size it must have)."""
    assert got["status"] == 0, f"the getter refused: status {got['status']}"
    assert got["written"] == ctypes.sizeof(ctype), f"wrote {got['written']} bytes, the table says {ctype}"
    return ctype.from_buffer_copy(bytes.fromhex(got["hex"])).value


def test_the_real_library_binds_every_symbol(report: dict[str, Any], amd: AmdRoot, abi: LtABI) -> None:
    assert report["library"] == str(amd.hipblaslt)
    assert report["table"] == abi.label
    assert report["missing"] == []


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_the_plan_is_what_the_library_holds(report: dict[str, Any], abi: LtABI, name: str) -> None:
    gemm = lt_problem(PROBLEMS[name])
    got = report["plans"][name]

    def desc(key: str) -> Any:
        return value(got["desc"][key], abi.desc_attr(key)[1])

    assert desc("TRANSA") == abi.operation["T" if gemm.trans_a else "N"]
    assert desc("TRANSB") == abi.operation["T" if gemm.trans_b else "N"]
    assert desc("EPILOGUE") == abi.epilogue[gemm.epilogue]
    assert desc("POINTER_MODE") == abi.pointer_mode["HOST"]
    if gemm.bias_dtype is None:
        assert desc("BIAS_DATA_TYPE") == DATATYPE_INVALID
        assert desc("BIAS_POINTER") is None
    else:
        assert desc("BIAS_DATA_TYPE") == abi.datatype[DATATYPES[gemm.bias_dtype]]
        assert desc("BIAS_POINTER") == BIAS_ADDRESS
    if gemm.scaled:
        # The scale modes the plan set (OUTER_VEC_32F for row-wise), and the scale addresses.
        assert desc("A_SCALE_MODE") == abi.matrix_scale[gemm.scale_a or ""]
        assert desc("B_SCALE_MODE") == abi.matrix_scale[gemm.scale_b or ""]
        assert (desc("A_SCALE_POINTER"), desc("B_SCALE_POINTER")) == SCALE_ADDRESSES
    for matrix, layout in zip((gemm.a, gemm.b, gemm.c), got["layouts"], strict=True):
        assert value(layout["BATCH_COUNT"], abi.layout_attr_of("BATCH_COUNT")[1]) == matrix.batch
        assert value(layout["STRIDED_BATCH_OFFSET"], abi.layout_attr_of("STRIDED_BATCH_OFFSET")[1]) == (
            matrix.stride if matrix.batch > 1 else 0
        )
    assert value(got["pref"]["MAX_WORKSPACE_BYTES"], abi.pref_attr_of("MAX_WORKSPACE_BYTES")[1]) == WORKSPACE
    assert value(got["pref"]["SEARCH_MODE"], abi.pref_attr_of("SEARCH_MODE")[1]) == 0


def test_every_attribute_has_the_tables_value_size(report: dict[str, Any], abi: LtABI) -> None:
    """The getter's written size, or where the getter refuses, the setter's smallest buffer."""
    wrong, refused = [], []
    for table, found in report["attributes"].items():
        types = getattr(abi, CTYPES[table])
        for key, got in found.items():
            size = ctypes.sizeof(types[key])
            if got["status"] == 0:
                library, how = got["written"], "getter wrote"
            else:
                library, how = got["smallest_set"], "setter accepts from"
                refused.append(f"{table}.{key}")
            if library != size:
                wrong.append(
                    f"{table}.{key}: the table's {types[key].__name__} is {size} bytes, the {how} {library}"
                )
    print(f"getters refused (checked through the setter): {', '.join(refused)}")
    assert not wrong, "\n".join(wrong)


def test_fresh_objects_hold_the_documented_defaults(report: dict[str, Any], abi: LtABI) -> None:
    """The header's documented defaults, read in the table's numbers."""
    desc, layout, pref = (report["attributes"][t] for t in ("matmul_desc_attr", "layout_attr", "pref_attr"))
    types = abi.matmul_desc_attr_ctype
    assert value(desc["TRANSA"], types["TRANSA"]) == abi.operation["N"]
    assert value(desc["TRANSB"], types["TRANSB"]) == abi.operation["N"]
    assert value(desc["EPILOGUE"], types["EPILOGUE"]) == abi.epilogue["DEFAULT"]
    assert value(desc["POINTER_MODE"], types["POINTER_MODE"]) == abi.pointer_mode["HOST"]
    assert value(layout["BATCH_COUNT"], abi.layout_attr_ctype["BATCH_COUNT"]) == 1
    assert value(pref["MAX_WORKSPACE_BYTES"], abi.pref_attr_ctype["MAX_WORKSPACE_BYTES"]) == 0


def test_the_library_refuses_the_rocm5_numbers(report: dict[str, Any]) -> None:
    """So that its accepting every plan above says the compute and scale numbers are right."""
    assert report["old_numbers"] == "INVALID_VALUE"
