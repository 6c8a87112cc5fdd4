"""The shim's ctypes binder (``HipblasltExt``) and its builder's choices, without a GPU.

The real shim is built and loaded against Debian's hipBLASLt in ``tests/amd_real``, but
its listing functions need a handle, which needs a device. Here its C exports are real C
function pointers (``ctypes.CFUNCTYPE`` callbacks) with the shim's signatures, so the
binder's argument passing, two-call growth of result arrays and name buffers, and the
algo bytes it hands back run as they would against the shim. The fake GroupedGemm computes
the grouped product it is handed (column-major, on host memory standing in for the GPU's),
from the host problem or from the UserArguments the binder's caller wrote, so sizes,
leading dimensions, pointers and scalars are checked against a float64 reference.
"""

from __future__ import annotations

import ctypes
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hipblaslt_ext_fakes import ABI, VERSION, FakeShim

from unimatmul_backends.lt.driver import LtAlgo, LtError
from unimatmul_backends.rocm import hipblaslt_ext
from unimatmul_backends.rocm.hipblaslt_ext import (
    GroupedPointers,
    GroupedSpec,
    HipblasltExt,
    UserArguments,
)


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
    lib, _, _ = fake_toolchain(tmp_path)
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


# --- the grouped GEMM -------------------------------------------------------------------
F32 = ABI.datatype["R_32F"]
C32F = ABI.compute_type["32F"]
HANDLE = 0x1234


def buffer(rng: np.random.Generator, ld: int, cols: int) -> np.ndarray[Any, Any]:
    """A column-major matrix's memory (``ld * cols`` float32), random and never zero."""
    return (rng.uniform(0.5, 1.5, ld * cols) * rng.choice([-1, 1], ld * cols)).astype(np.float32)


def spec_of(**fields: Any) -> GroupedSpec:
    base: dict[str, Any] = {
        "trans_a": False, "trans_b": False, "type_a": F32, "type_b": F32, "type_c": F32, "type_d": F32,
        "compute": C32F, "scale": ctypes.c_float,
    }  # fmt: skip
    return GroupedSpec(**{**base, **fields})


def test_grouped_gemm_passes_its_problem_and_runs_it() -> None:
    """Sizes, leading dimensions, transposes, pointers and scalars reach the library as given."""
    rng = np.random.default_rng(7)
    m, n, k = (5, 3, 7), (4, 6, 2), (3, 8, 5)
    lda = tuple(x + 2 for x in k)  # A stored k x m (transposed), padded
    ldb = tuple(x + 1 for x in k)
    ldc = ldd = tuple(x + 3 for x in m)
    spec = spec_of(trans_a=True, m=m, n=n, k=k, lda=lda, ldb=ldb, ldc=ldc, ldd=ldd, alpha=1.5, beta=0.5)
    a = [buffer(rng, lda[g], m[g]) for g in range(3)]
    b = [buffer(rng, ldb[g], n[g]) for g in range(3)]
    c = [buffer(rng, ldc[g], n[g]) for g in range(3)]
    d = [np.full(ldd[g] * n[g], np.nan, np.float32) for g in range(3)]
    pointers = GroupedPointers(*(tuple(x.ctypes.data for x in arrays) for arrays in (a, b, c, d)))
    shim = FakeShim([0, 2])
    ext = HipblasltExt(shim, ABI, VERSION)
    with ext.grouped_gemm(HANDLE, spec, pointers, 1 << 20) as grouped:
        made = shim.instances[grouped.ptr]
        assert made["handle"] == HANDLE and made["compute"] == C32F
        assert made["ops"] == (ABI.operation["T"], ABI.operation["N"]) and made["types"] == (F32,) * 4
        assert (made["m"], made["n"], made["k"]) == (list(m), list(n), list(k))
        assert (made["lda"], made["ldb"], made["ldc"], made["ldd"]) == (
            list(lda),
            list(ldb),
            list(ldc),
            list(ldd),
        )
        assert made["a"] == list(pointers.a) and made["d"] == list(pointers.d)
        assert made["alpha"] == [1.5] * 3 and made["beta"] == [0.5] * 3 and made["max_workspace"] == 1 << 20
        (solution, *_) = grouped.solutions()
        grouped.initialize(solution.algo, 0)
        grouped.run(0)
    assert shim.destroyed == [0x5000]
    for g in range(3):
        at = np.asarray(a[g], np.float64).reshape(m[g], lda[g]).T[: k[g]]  # stored k x m
        bt = np.asarray(b[g], np.float64).reshape(n[g], ldb[g]).T[: k[g]]
        ct = np.asarray(c[g], np.float64).reshape(n[g], ldc[g]).T[: m[g]]
        want = 1.5 * at.T @ bt + 0.5 * ct
        got = d[g].reshape(n[g], ldd[g]).T
        np.testing.assert_allclose(got[: m[g]], want, rtol=1e-5, atol=1e-5)
        assert np.isnan(got[m[g] :]).all()  # the padding rows of D are never written


def test_grouped_solutions_are_the_grouped_types_supported_ones_within_the_workspace() -> None:
    shim = FakeShim([0, 1, 2, 3, 4, 40])
    ext = HipblasltExt(shim, ABI, VERSION)
    spec = spec_of(trans_a=True, m=(8,), n=(8,), k=(8,), lda=(8,), ldb=(8,), ldc=(8,), ldd=(8,))
    grouped = ext.grouped_gemm(HANDLE, spec, GroupedPointers((1,), (2,), (3,), (4,)), 8 * 1024)
    found = grouped.solutions()
    # Odd ones refuse the problem; 40 needs 40 KiB, over the 8 KiB limit.
    assert [s.index for s in found] == [0, 2, 4]
    assert [s.algo.workspace for s in found] == [0, 2048, 4096]
    assert all(s.algo.data[4:8] == b"\x09" * 4 for s in found)  # as the support check wrote it
    assert found[1].kernel_name == "Cijk_kernel_2" and found[1].solution_name.startswith("Cijk_solution_2_")
    op_t, op_n = ABI.operation["T"], ABI.operation["N"]
    assert shim.listed_types == [(hipblaslt_ext.GEMM_TYPE_GROUPED, op_t, op_n, F32, F32, F32, F32, C32F)]
    grouped.initialize(found[2].algo, 0x7000, user_args=True, stream=0x42)
    assert shim.instances[grouped.ptr]["initialized"] == [(4, 0x7000, 1, 0x42)]
    grouped.close()
    grouped.close()  # idempotent: destroyed once
    assert shim.destroyed == [0x5000]
    with pytest.raises(ValueError, match="was closed"):
        grouped.run(0)


def test_user_args_carry_new_group_sizes_and_pointers_per_call() -> None:
    """Prepared once for a mixture-of-experts shape, run per call with other group sizes.

    Row-major ``out[rows of g] = tokens[rows of g] @ w[g]`` is, column-major, the grouped
    problem m = N, n = rows of g, k = K, A = w[g] (N x K, ld N), B = the group's tokens
    (K x rows, ld K), D = its output rows (N x rows, ld N): set up as n = {T, 1, 1} (the
    launch covers T rows in all) and given each call's n and pointers in the user arguments.
    """
    rng = np.random.default_rng(11)
    groups, tokens_max, width, depth = 3, 9, 4, 6  # T, N, K
    w = rng.uniform(0.5, 1.5, (groups, depth, width)).astype(np.float32)  # G x K x N, row-major
    spec = spec_of(
        m=(width,) * groups, n=(tokens_max, 1, 1), k=(depth,) * groups,
        lda=(width,) * groups, ldb=(depth,) * groups, ldc=(width,) * groups, ldd=(width,) * groups,
    )  # fmt: skip
    tokens = rng.uniform(0.5, 1.5, (tokens_max, depth)).astype(np.float32)
    out = np.zeros((tokens_max, width), np.float32)
    weights = tuple(w[g].ctypes.data for g in range(groups))
    start = (tokens.ctypes.data,) * groups
    shim = FakeShim([0])
    ext = HipblasltExt(shim, ABI, VERSION)
    grouped = ext.grouped_gemm(
        HANDLE, spec, GroupedPointers(weights, start, (out.ctypes.data,) * 3, start), 0
    )
    template = grouped.default_user_args()
    assert [a.n for a in template] == [tokens_max, 1, 1] and [a.m for a in template] == [width] * 3
    assert [a.a for a in template] == list(weights) and template[0].strideB1 == depth
    (solution,) = grouped.solutions()
    grouped.initialize(solution.algo, 0, user_args=True)
    device = (UserArguments * groups)()  # stands in for the device buffer
    for sizes in ([3, 0, 5], [9, 0, 0], [0, 0, 9], [1, 1, 1]):
        out[...] = np.nan
        ctypes.memmove(device, template, ctypes.sizeof(device))
        rows = np.cumsum([0, *sizes])
        for g, arg in enumerate(device):
            arg.n = sizes[g]
            arg.b = tokens.ctypes.data + int(rows[g]) * depth * 4
            arg.c = arg.d = out.ctypes.data + int(rows[g]) * width * 4
        grouped.run_user_args(ctypes.addressof(device), 0)
        for g in range(groups):
            want = tokens[rows[g] : rows[g + 1]].astype(np.float64) @ w[g]
            np.testing.assert_allclose(out[rows[g] : rows[g + 1]], want, rtol=1e-5, atol=1e-5)
        assert np.isnan(out[rows[-1] :]).all()


def test_grouped_gemm_errors_say_what_is_wrong() -> None:
    shim = FakeShim([0])
    ext = HipblasltExt(shim, ABI, VERSION)
    one = {"m": (2,), "n": (2,), "k": (2,), "lda": (2,), "ldb": (2,), "ldc": (2,), "ldd": (2,)}
    pointers = GroupedPointers((1,), (2,), (3,), (4,))
    with pytest.raises(ValueError, match="at least one group"):
        spec_of(**{name: () for name in one})
    with pytest.raises(ValueError, match="ldb has 2 values for 1 groups"):
        spec_of(**{**one, "ldb": (2, 2)})
    with pytest.raises(ValueError, match="group 0: lda=2 is below the 3 rows"):
        spec_of(**{**one, "m": (3,), "ldc": (3,), "ldd": (3,)})
    with pytest.raises(ValueError, match="group 0: lda=2 is below the 5 rows"):
        spec_of(**{**one, "trans_a": True, "k": (5,), "ldb": (5,)})
    with pytest.raises(ValueError, match="must not be negative"):
        spec_of(**{**one, "n": (-1,)})
    with pytest.raises(ValueError, match="2 c pointers for 1 groups"):
        ext.grouped_gemm(HANDLE, spec_of(**one), GroupedPointers((1,), (2,), (3, 3), (4,)), 0)
    shim.refuse_problem = True
    with pytest.raises(LtError, match=r"GroupedGemm::setProblem failed with INVALID_VALUE \(3\)"):
        ext.grouped_gemm(HANDLE, spec_of(**one), pointers, 0)
    shim.refuse_problem = False
    grouped = ext.grouped_gemm(HANDLE, spec_of(**one), pointers, 1024)
    with pytest.raises(LtError, match=r"GroupedGemm::run failed with NOT_INITIALIZED"):
        grouped.run(0)  # never initialized: the library's status, named
    with pytest.raises(ValueError, match="needs 4096 bytes of workspace, above this GroupedGemm's 1024"):
        grouped.initialize(LtAlgo(bytes(24), 4096), 0)
    grouped.initialize(grouped.solutions()[0].algo, 0)  # without user args
    with pytest.raises(LtError, match=r"run\(userArgs\) failed with INVALID_VALUE"):
        grouped.run_user_args(0x9000, 0)


def test_a_shim_without_grouped_gemm_or_user_args_says_so() -> None:
    one = {"m": (2,), "n": (2,), "k": (2,), "lda": (2,), "ldb": (2,), "ldc": (2,), "ldd": (2,)}
    pointers = GroupedPointers((1,), (2,), (3,), (4,))
    bare = HipblasltExt(FakeShim([0], grouped=hipblaslt_ext.GROUPED_NONE), ABI, VERSION)
    assert bare.grouped == hipblaslt_ext.GROUPED_NONE
    assert "unimatmul_hipblaslt_grouped_create" not in bare.fn  # nothing of it bound
    with pytest.raises(hipblaslt_ext.ExtUnavailable, match="built without GroupedGemm"):
        bare.grouped_gemm(HANDLE, spec_of(**one), pointers, 0)
    host = HipblasltExt(FakeShim([0], grouped=hipblaslt_ext.GROUPED_HOST), ABI, VERSION)
    grouped = host.grouped_gemm(HANDLE, spec_of(**one), pointers, 0)
    for attempt in (
        grouped.default_user_args,
        lambda: grouped.run_user_args(0x9000, 0),
        lambda: grouped.initialize(LtAlgo(bytes(24)), 0, user_args=True),
    ):
        with pytest.raises(hipblaslt_ext.ExtUnavailable, match="without UserArguments"):
            attempt()
    # Headers whose UserArguments differs from the binder's struct: the form is turned off.
    moved = hipblaslt_ext.user_args_layout()
    moved[0] = 200
    other = HipblasltExt(FakeShim([0], layout=moved), ABI, VERSION)
    assert other.grouped == hipblaslt_ext.GROUPED_HOST
    assert (
        "sizeof and offsets [200, 0, 4" in other.grouped_reason
        and "user-args form is off" in other.grouped_reason
    )


def test_user_arguments_is_the_headers_packed_struct() -> None:
    """hipblaslt-ext.hpp (1.1): four uint32 sizes, four pointers, eight uint32 strides, two
    16-byte scalars, six pointers, int + reserved, a pointer, two uint32, two floats, an int."""
    assert (
        ctypes.sizeof(UserArguments) == 4 * 4 + 4 * 8 + 8 * 4 + 2 * 16 + 6 * 8 + 2 * 4 + 8 + 2 * 4 + 2 * 4 + 4
    )
    assert hipblaslt_ext.user_args_layout() == [196, 0, 4, 8, 12, 16, 24, 32, 40, *range(48, 80, 4), 80, 96]


# --- the builder: one build per library version, the older headers' fallbacks ------------
def fake_toolchain(tmp_path: Path, refuse: str = "") -> tuple[Path, Path, Path]:
    """Headers of hipBLASLt 1.1.0, a library file, and a stand-in compiler that logs its
    switches and writes its output (refusing any command line holding ``refuse``)."""
    include = tmp_path / "include" / "hipblaslt"
    include.mkdir(parents=True)
    (include / "hipblaslt-ext.hpp").write_text("")
    (include / "hipblaslt-version.h").write_text(
        "#define HIPBLASLT_VERSION_MAJOR 1\n#define HIPBLASLT_VERSION_MINOR 1\n#define HIPBLASLT_VERSION_PATCH 0\n"
    )
    lib = tmp_path / "lib" / "libhipblaslt.so.1"
    lib.parent.mkdir()
    lib.write_bytes(b"")
    log = tmp_path / "compiler.log"
    cxx = tmp_path / "cxx"
    cxx.write_text(
        "#!/bin/sh\n"
        f'echo "$*" | tr " " "\\n" | grep SHIM_HAS | tr "\\n" " " >> {log}; echo >> {log}\n'
        + (f'case "$*" in *{refuse}*) echo "no such member" >&2; exit 1;; esac\n' if refuse else "")
        + 'while [ "$1" != "-o" ]; do shift; done; echo built > "$2"\n'
    )
    cxx.chmod(cxx.stat().st_mode | stat.S_IEXEC)
    return lib, cxx, log


def test_the_shim_is_built_once_per_library_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib, cxx, log = fake_toolchain(tmp_path)
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = hipblaslt_ext.built_shim(str(lib), VERSION, "abc")
    again = hipblaslt_ext.built_shim(str(lib), VERSION, "abc")
    assert again == first and len(log.read_text().splitlines()) == 1  # the cached build
    assert first.parent.name == f"{VERSION}-abc-{hipblaslt_ext.source_hash()}"
    other = hipblaslt_ext.built_shim(str(lib), VERSION, "def")  # another build of the library
    assert other != first and len(log.read_text().splitlines()) == 2
    assert log.read_text().splitlines()[0].split() == [
        "-DSHIM_HAS_KERNEL_NAME=1", "-DSHIM_HAS_GROUPED=1", "-DSHIM_HAS_USER_ARGS=1",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("refuse", "built"),
    [
        ("USER_ARGS=1", ["-DSHIM_HAS_KERNEL_NAME=1", "-DSHIM_HAS_GROUPED=1", "-DSHIM_HAS_USER_ARGS=0"]),
        ("GROUPED=1", ["-DSHIM_HAS_KERNEL_NAME=1", "-DSHIM_HAS_GROUPED=0", "-DSHIM_HAS_USER_ARGS=0"]),
        ("KERNEL_NAME=1", ["-DSHIM_HAS_KERNEL_NAME=0", "-DSHIM_HAS_GROUPED=0", "-DSHIM_HAS_USER_ARGS=0"]),
    ],
)
def test_headers_without_a_part_get_a_build_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refuse: str, built: list[str]
) -> None:
    lib, cxx, log = fake_toolchain(tmp_path, refuse)
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = hipblaslt_ext.built_shim(str(lib), VERSION, "abc")
    assert path.read_text() == "built\n"
    assert log.read_text().splitlines()[-1].split() == built
    assert not [p for p in os.listdir(path.parent) if p.startswith(".build-")]  # no temporaries left


def test_no_build_at_all_says_what_the_compiler_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib, cxx, _ = fake_toolchain(tmp_path, "SHIM_HAS")
    monkeypatch.setenv("CXX", str(cxx))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(
        hipblaslt_ext.ExtUnavailable, match=r"could not build hipblaslt_ext\.cpp .*no such member"
    ):
        hipblaslt_ext.built_shim(str(lib), VERSION, "abc")
