"""The shim's ctypes binder (``HipblasltExt``) and its builder's choices, without a GPU.

The real shim is built and loaded against Debian's hipBLASLt in ``tests/amd_real``, but
its listing functions need a handle, which needs a device. Here its C exports are real C
function pointers (``ctypes.CFUNCTYPE`` callbacks) with the shim's signatures, so the
binder's argument passing, two-call growth of result arrays and name buffers, and the
algo bytes it hands back run as they would against the shim.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest

from unimatmul_backends.lt.abi import HIPBLASLT_1_1
from unimatmul_backends.lt.driver import LtAlgo
from unimatmul_backends.rocm import hipblaslt_ext
from unimatmul_backends.rocm.hipblaslt_ext import HipblasltExt

ABI = HIPBLASLT_1_1
VERSION = 100100


class FakeShim:
    """The shim's exports over a list of solution indices (what getAllAlgos would list)."""

    def __init__(self, indices: list[int], *, header_version: int = VERSION) -> None:
        self.indices = indices
        self.header_version = header_version
        self.capacities: list[int] = []
        self.listed_types: list[tuple[int, ...]] = []
        self._keep: list[Any] = []
        impls = {
            "unimatmul_hipblaslt_ext_abi": lambda: hipblaslt_ext.EXT_ABI,
            "unimatmul_hipblaslt_ext_header_version": lambda: self.header_version,
            "unimatmul_hipblaslt_ext_has_kernel_name": lambda: 1,
            "unimatmul_hipblaslt_get_all_algos": self._all,
            "unimatmul_hipblaslt_algos_from_index": self._from_index,
            "unimatmul_hipblaslt_is_algo_supported": self._supported,
            "unimatmul_hipblaslt_kernel_name": self._kernel,
            "unimatmul_hipblaslt_solution_name": self._solution,
        }
        for name, (restype, argtypes) in hipblaslt_ext._SIGNATURES.items():
            argtypes = [ctypes.c_void_p if t is ctypes.c_char_p else t for t in argtypes]
            fn = ctypes.CFUNCTYPE(restype, *argtypes)(impls[name])
            self._keep.append(fn)
            setattr(self, name, fn)

    def _fill(self, indices: list[int], results: int, capacity: int, total: Any) -> int:
        self.capacities.append(capacity)
        struct = ABI.heuristic_result_struct()
        array = (struct * capacity).from_address(results)
        for slot, index in zip(array, indices[:capacity], strict=False):
            ctypes.memmove(ctypes.addressof(slot.algo), int(index).to_bytes(4, "little", signed=True), 4)
            slot.workspaceSize = 1000 + index
            slot.state = 0
        total[0] = len(indices)
        return 0

    def _all(self, handle: int, gemm_type: int, *rest: Any) -> int:
        *types, results, capacity, total = rest
        self.listed_types.append((gemm_type, *types))
        return self._fill(self.indices, results, capacity, total)

    def _from_index(
        self, handle: int, wanted: int, count: int, results: int, capacity: int, total: Any
    ) -> int:
        asked = list((ctypes.c_int * count).from_address(wanted))
        found = [i for i in asked if i in self.indices]
        status = self._fill(found, results, capacity, total)
        return status if found else 7  # HIPBLAS_STATUS_INVALID_VALUE: all out of range

    def _supported(self, handle: int, desc: int, *rest: Any) -> int:
        algo, workspace = rest[-2], rest[-1]
        index = int.from_bytes(ctypes.string_at(algo, 4), "little", signed=True)
        if index % 2:
            return 7  # odd solutions do not support the problem
        ctypes.memmove(algo + 4, b"\x07" * 4, 4)  # the library writes the problem in
        workspace[0] = 4096
        return 0

    def _name(self, text: str, buf: int, size: int, needed: Any) -> int:
        raw = text.encode()
        needed[0] = len(raw) + 1
        if buf and size:
            ctypes.memmove(buf, raw[: size - 1] + b"\0", min(len(raw), size - 1) + 1)
        return 0

    def _kernel(self, handle: int, algo: int, buf: int, size: int, needed: Any) -> int:
        index = int.from_bytes(ctypes.string_at(algo, 4), "little", signed=True)
        return self._name(f"Cijk_kernel_{index % 3}", buf, size, needed)

    def _solution(self, handle: int, algo: int, buf: int, size: int, needed: Any) -> int:
        index = int.from_bytes(ctypes.string_at(algo, 4), "little", signed=True)
        return self._name(f"Cijk_solution_{index}_" + "x" * 700, buf, size, needed)  # over 512


class Plan:
    """What the binder reads of an LtPlan."""

    class driver:
        handle = 0x1234

    class gemm:
        trans_a, trans_b = True, False

    types = {"a": ABI.datatype["R_16F"], "b": ABI.datatype["R_16F"], "c": ABI.datatype["R_32F"]}
    compute = ABI.compute_type["32F"]
    scale_ctype = ctypes.c_float
    desc = adesc = bdesc = cdesc = 0x99


def test_all_algos_grows_past_the_first_capacity_and_passes_the_type() -> None:
    shim = FakeShim(list(range(hipblaslt_ext._FIRST_CAPACITY + 10)))
    ext = HipblasltExt(shim, ABI, VERSION)
    found = ext.all_algos(Plan())  # type: ignore[arg-type]
    assert [ABI.solution_index(a.data) for a in found] == shim.indices
    assert found[5].workspace == 1005
    assert shim.capacities == [hipblaslt_ext._FIRST_CAPACITY, len(shim.indices)]
    f16, f32 = ABI.datatype["R_16F"], ABI.datatype["R_32F"]
    op_t, op_n = ABI.operation["T"], ABI.operation["N"]
    assert (
        shim.listed_types
        == [(hipblaslt_ext.GEMM_TYPE_GEMM, op_t, op_n, f16, f16, f32, f32, ABI.compute_type["32F"])] * 2
    )  # asked again, larger


def test_from_index_support_check_and_names() -> None:
    ext = HipblasltExt(FakeShim([4, 5, 8]), ABI, VERSION)
    plan: Any = Plan()
    assert [ABI.solution_index(a.data) for a in ext.from_index(plan, [8, 99, 4])] == [8, 4]
    assert ext.from_index(plan, [99]) == []
    algo = ext.from_index(plan, [4])[0]
    checked = ext.supported(plan, algo)
    assert checked is not None and checked.workspace == 4096
    assert checked.data[4:8] == b"\x07" * 4  # what the library wrote into the algo is kept
    assert ext.supported(plan, LtAlgo((5).to_bytes(4, "little") + bytes(20))) is None
    assert ext.kernel_name(plan, algo) == "Cijk_kernel_1"
    name = ext.solution_name(plan, algo)
    assert name.startswith("Cijk_solution_4_") and len(name) == len("Cijk_solution_4_") + 700


def test_a_shim_for_other_headers_or_another_abi_is_refused() -> None:
    with pytest.raises(hipblaslt_ext.ExtUnavailable, match="built against hipBLASLt 100000 headers"):
        HipblasltExt(FakeShim([1], header_version=100000), ABI, VERSION)


def test_the_builder_needs_matching_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    include = tmp_path / "include" / "hipblaslt"
    include.mkdir(parents=True)
    (include / "hipblaslt-ext.hpp").write_text("")
    (include / "hipblaslt-version.h").write_text(
        "#define HIPBLASLT_VERSION_MAJOR 1\n#define HIPBLASLT_VERSION_MINOR 1\n#define HIPBLASLT_VERSION_PATCH 0\n"
    )
    lib = tmp_path / "lib" / "libhipblaslt.so.1"
    lib.parent.mkdir()
    lib.write_bytes(b"")
    assert hipblaslt_ext.find_include(str(lib), environ={}) == tmp_path / "include"
    assert hipblaslt_ext.header_version(tmp_path / "include") == 100100
    with pytest.raises(
        hipblaslt_ext.ExtUnavailable, match=r"headers in .* are hipBLASLt 100100, the library is 100000"
    ):
        hipblaslt_ext.built_shim(str(lib), 100000, "abc")
    monkeypatch.setenv("UNIMATMUL_HIPBLASLT_POOL", "0")
    with pytest.raises(hipblaslt_ext.ExtUnavailable, match="the heuristic only"):
        hipblaslt_ext.load_ext(str(lib), 100100, "abc", ABI)


def test_a_bare_soname_not_in_this_process_builds_nothing() -> None:
    with pytest.raises(hipblaslt_ext.ExtUnavailable, match="not mapped into this process"):
        hipblaslt_ext.built_shim("libhipblaslt.so.1", VERSION, "abc")
