"""Contract tests of the rocBLAS backend against a fake librocblas.

No AMD GPU exists on the machines that run these tests, so librocblas cannot run
here; that is the only reason a fake is used. The fake exposes the real C function
names, checks every argument the way ``rocblas_gemm_ex_arg_check`` does (enum values
from the rocBLAS headers, leading dimensions, non-NULL pointers), records each call,
and computes the column-major GEMM it is asked for on the memory behind the
pointers (host memory here). So the tests check the call sequence (two-call
``get_solutions``, ``check_solution_index``, the solution index passed through,
streams) and that the row-major -> column-major operand swap gives the right
numbers against a float64 reference.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

from unimatmul.backend import Candidate, Target
from unimatmul.core.arrays import Device, NumpyAdapter, make_operands
from unimatmul.core.errors import UnsupportedProblem
from unimatmul.core.problem import Problem
from unimatmul_backends.rocm.libraries import LibraryChoice
from unimatmul_backends.rocm.rocblas import RocblasBackend, RocblasError, blas_view, solution_candidate
from unimatmul_backends.rocm.rocblas_abi import ROCBLAS_DATATYPE, ROCBLAS_SIGNATURES

_NP = {ROCBLAS_DATATYPE["f32_r"]: np.float32, ROCBLAS_DATATYPE["f64_r"]: np.float64, 150: np.float16}
_SCALAR = {ROCBLAS_DATATYPE["f32_r"]: ctypes.c_float, ROCBLAS_DATATYPE["f64_r"]: ctypes.c_double}
_OPS = {111: False, 112: True}
HANDLE = 0xAB0


def _matrix(ptr: int, dtype: Any, rows: int, cols: int, ld: int, batch: int, stride: int) -> np.ndarray:
    """A column-major ``rows x cols`` matrix (batched) over the memory at ``ptr``."""
    item = np.dtype(dtype).itemsize
    extent = (batch - 1) * stride + (cols - 1) * ld + rows
    buf = (ctypes.c_char * (extent * item)).from_address(ptr)
    flat = np.frombuffer(buf, dtype=dtype, count=extent)
    return np.lib.stride_tricks.as_strided(
        flat, shape=(batch, rows, cols), strides=(stride * item, item, ld * item)
    )


class FakeRocblas:
    """librocblas's C functions, checked and recorded; GEMMs computed with NumPy."""

    def __init__(self, listed: list[int], valid: set[int], version: bytes = b"4.3.0.ef408db7-dirty") -> None:
        self.listed = listed
        self.valid = valid
        self.version = version
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.streams: list[int] = []
        self.ran: list[int] = []

    def _record(self, name: str, args: tuple[Any, ...]) -> None:
        assert len(args) == len(ROCBLAS_SIGNATURES[name][1]), f"{name}: wrong argument count"
        self.calls.append((name, args))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    # --- auxiliary ---------------------------------------------------------------
    def rocblas_create_handle(self, out: Any) -> int:
        self._record("rocblas_create_handle", (out,))
        out[0] = HANDLE
        return 0

    def rocblas_destroy_handle(self, handle: int) -> int:
        self._record("rocblas_destroy_handle", (handle,))
        return 0 if handle == HANDLE else 1

    def rocblas_set_stream(self, handle: int, stream: int) -> int:
        self._record("rocblas_set_stream", (handle, stream))
        self.streams.append(stream)
        return 0 if handle == HANDLE else 1

    def rocblas_get_version_string_size(self, size: Any) -> int:
        self._record("rocblas_get_version_string_size", (size,))
        size[0] = len(self.version) + 1
        return 0

    def rocblas_get_version_string(self, buf: Any, size: Any) -> int:
        self._record("rocblas_get_version_string", (buf, size))
        if size.value < len(self.version) + 1:
            return 4  # invalid_size
        buf.value = self.version
        return 0

    # --- GEMM ---------------------------------------------------------------------
    def _check(
        self, handle: int, ta: int, tb: int, m: int, n: int, k: int, lda: int, ldb: int, ldc: int
    ) -> int:
        """``rocblas_gemm_ex_arg_check``'s size rules (rocBLAS library/src/blas_ex)."""
        if handle != HANDLE:
            return 1
        if ta not in _OPS or tb not in _OPS:
            return 11
        if min(m, n, k) < 0 or ldc < m or lda < (k if _OPS[ta] else m) or ldb < (n if _OPS[tb] else k):
            return 4
        return 0

    def _gemm(self, name: str, args: tuple[Any, ...], batched: bool) -> int:
        self._record(name, args)
        if batched:
            (h, ta, tb, m, n, k, alpha, a, at, lda, sa, b, bt, ldb, sb, beta,
             c, ct, ldc, sc, d, dt, ldd, sd, batch, comp, algo, index, flags) = args  # fmt: skip
        else:
            (h, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta,
             c, ct, ldc, d, dt, ldd, comp, algo, index, flags) = args  # fmt: skip
            sa = sb = sc = sd = 0
            batch = 1
        status = self._check(h, ta, tb, m, n, k, lda, ldb, ldc)
        if status:
            return status
        assert at == bt == ct == dt and at in _NP, "one known datatype for A/B/C/D"
        assert comp in _SCALAR
        assert (c, ldc, sc) == (d, ldd, sd), "C and D are the same matrix (in place)"
        assert all(isinstance(p, int) and p for p in (alpha, beta, a, b, c)), "NULL pointer"
        assert algo == 1, "rocblas_gemm_algo_solution_index"
        if index not in self.valid:
            return 11  # invalid_value: what rocBLAS answers for an index that cannot solve
        if flags & 0x8:  # rocblas_gemm_flags_check_solution_index: validate only
            return 0
        assert flags == 0
        self.ran.append(index)
        dtype = _NP[at]
        scalar = _SCALAR[comp]
        al, be = scalar.from_address(alpha).value, scalar.from_address(beta).value
        ta_, tb_ = _OPS[ta], _OPS[tb]
        ma = _matrix(a, dtype, k if ta_ else m, m if ta_ else k, lda, batch, sa).astype(np.float64)
        mb = _matrix(b, dtype, n if tb_ else k, k if tb_ else n, ldb, batch, sb).astype(np.float64)
        mc = _matrix(c, dtype, m, n, ldc, batch, sc)
        opa = ma.transpose(0, 2, 1) if ta_ else ma
        opb = mb.transpose(0, 2, 1) if tb_ else mb
        result = al * (opa @ opb)
        if be != 0.0:
            result = result + be * mc.astype(np.float64)
        mc[...] = result.astype(dtype)
        return 0

    def rocblas_gemm_ex(self, *args: Any) -> int:
        return self._gemm("rocblas_gemm_ex", args, batched=False)

    def rocblas_gemm_strided_batched_ex(self, *args: Any) -> int:
        return self._gemm("rocblas_gemm_strided_batched_ex", args, batched=True)

    def _solutions(self, name: str, args: tuple[Any, ...], batched: bool) -> int:
        self._record(name, args)
        h, ta, tb, m, n, k = args[:6]
        lda, ldb, ldc = (args[9], args[13], args[18]) if batched else (args[9], args[12], args[16])
        status = self._check(h, ta, tb, m, n, k, lda, ldb, ldc)
        if status:
            return status
        listed, size = args[-2], args[-1]
        if listed is None:
            size[0] = len(self.listed)
        else:
            for i, index in enumerate(self.listed[: size[0]]):
                listed[i] = index
        return 0

    def rocblas_gemm_ex_get_solutions(self, *args: Any) -> int:
        return self._solutions("rocblas_gemm_ex_get_solutions", args, batched=False)

    def rocblas_gemm_strided_batched_ex_get_solutions(self, *args: Any) -> int:
        return self._solutions("rocblas_gemm_strided_batched_ex_get_solutions", args, batched=True)


class StreamAdapter(NumpyAdapter):
    """Host arrays with a settable 'current stream', standing in for torch on HIP."""

    current = 0

    def stream(self, device: Device) -> int:
        return self.current


def make_backend(fake: FakeRocblas) -> RocblasBackend:
    return RocblasBackend(
        loader=lambda: (fake, LibraryChoice("fake", "test")),
        device_check=lambda: None,
        runtime_check=lambda: None,
    )


@pytest.fixture
def target() -> Target:
    return Target(StreamAdapter(), Device("hip", 0))


def _operands(problem: Problem, seed: int) -> tuple[Any, Any, Any]:
    """A, B and out laid out exactly as ``problem`` says (transposed views, padded lds, batch)."""
    ops = make_operands(problem, NumpyAdapter(), Device("hip", 0), np.random.default_rng(seed))
    return ops.a, ops.b, ops.out


def test_candidates_use_the_two_call_pattern_and_check_each_index(target: Target) -> None:
    fake = FakeRocblas(listed=[12, 5, 3, 7, 3], valid={3, 7, 12})
    backend = make_backend(fake)
    problem = Problem(m=40, n=24, k=56)

    found = backend.candidates(problem, target)

    assert found == [solution_candidate(i, "tensile") for i in (3, 7, 12)]
    assert found[0].identity == "rocblas/solution?index=3&source=s:tensile"
    gets = [args for name, args in fake.calls if name == "rocblas_gemm_ex_get_solutions"]
    assert len(gets) == 2
    assert gets[0][-2] is None  # first call: NULL list, the size comes back
    assert gets[1][-2] is not None and gets[1][-1][0] == 5
    assert gets[0][21] == 1 and gets[0][22] == 0  # algo = solution_index, flags = none
    checks = [args for name, args in fake.calls if name == "rocblas_gemm_ex"]
    assert [args[22] for args in checks] == [3, 5, 7, 12]  # each listed index, once, sorted
    assert all(args[23] == 0x8 for args in checks)  # rocblas_gemm_flags_check_solution_index
    assert fake.ran == []  # checking launches nothing
    # Row-major C[40,24] = A[40,56] @ B[56,24] is rocBLAS's C^T[24,40] = B^T A^T.
    m, n, k, lda, ldb, ldc = (
        checks[0][3],
        checks[0][4],
        checks[0][5],
        checks[0][9],
        checks[0][12],
        checks[0][16],
    )
    assert (m, n, k, lda, ldb, ldc) == (24, 40, 56, 24, 56, 24)
    # Listing again is served from memory: no new library calls.
    before = len(fake.calls)
    assert backend.candidates(problem, target) == found
    assert len(fake.calls) == before


def test_batched_problems_ask_the_strided_batched_functions(target: Target) -> None:
    fake = FakeRocblas(listed=[9], valid={9})
    backend = make_backend(fake)
    problem = Problem(m=8, n=16, k=32, batch=3)
    assert backend.candidates(problem, target) == [solution_candidate(9, "tensile")]
    names = fake.names()
    assert names.count("rocblas_gemm_strided_batched_ex_get_solutions") == 2
    assert "rocblas_gemm_ex_get_solutions" not in names
    (args,) = [a for n, a in fake.calls if n == "rocblas_gemm_strided_batched_ex"]
    # Batch strides swap with the operands: rocBLAS's A is our B.
    assert (args[10], args[14], args[19], args[24]) == (32 * 16, 8 * 32, 8 * 16, 3)


CASES = [
    Problem(m=33, n=17, k=45),
    Problem(m=33, n=17, k=45, trans_a=True),
    Problem(m=33, n=17, k=45, trans_b=True),
    Problem(m=33, n=17, k=45, trans_a=True, trans_b=True, lda=40, ldb=50, ldc=20),
    Problem(m=20, n=12, k=9, lda=16, ldb=15, ldc=13),
    Problem(m=6, n=10, k=7, batch=4),
    Problem(
        m=6,
        n=10,
        k=7,
        batch=4,
        trans_a=True,
        trans_b=True,
        lda=8,
        ldb=9,
        ldc=12,
        stride_a=80,
        stride_b=100,
        stride_c=90,
    ),
    Problem(m=24, n=8, k=16, dtype_a="f64", dtype_b="f64", dtype_c="f64", compute="f64"),
    Problem(m=24, n=8, k=16, dtype_a="f16", dtype_b="f16", dtype_c="f16"),
]


@pytest.mark.parametrize("problem", CASES, ids=lambda p: p.key)
def test_runner_computes_the_row_major_product(problem: Problem, target: Target) -> None:
    fake = FakeRocblas(listed=[4, 21], valid={4, 21})
    backend = make_backend(fake)
    runner = backend.prepare(problem, solution_candidate(21), target)
    a, b, out = _operands(problem, 1)
    c0 = out.copy()
    for alpha, beta in ((1.0, 0.0), (0.5, 2.0)):
        out[...] = c0 if beta else np.nan  # poisoned unless C is an input
        runner(a, b, out, alpha, beta)
        ref = alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * c0.astype(np.float64)
        err = np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref)
        assert err < {"f32": 1e-5, "f64": 1e-12, "f16": 2e-3}[problem.dtype_a]
    assert fake.ran == [21, 21]


def test_runner_sets_the_stream_only_when_it_changes(target: Target) -> None:
    fake = FakeRocblas(listed=[2], valid={2})
    backend = make_backend(fake)
    problem = Problem(m=4, n=4, k=4)
    runner = backend.prepare(problem, solution_candidate(2), target)
    a, b, out = _operands(problem, 2)
    adapter = target.adapter
    assert isinstance(adapter, StreamAdapter)
    for stream in (0x10, 0x10, 0x10, 0x20, 0x20, 0x10):
        adapter.current = stream
        runner(a, b, out)
    assert fake.streams == [0x10, 0x20, 0x10]


def test_prepare_rejects_an_index_rocblas_does_not_accept(target: Target) -> None:
    fake = FakeRocblas(listed=[1, 2, 3], valid={1, 3})
    backend = make_backend(fake)
    problem = Problem(m=4, n=4, k=4)
    with pytest.raises(UnsupportedProblem, match="no solution 2"):
        backend.prepare(problem, solution_candidate(2), target)
    with pytest.raises(UnsupportedProblem, match="not a rocBLAS candidate"):
        backend.prepare(problem, Candidate.make("hipblaslt", "solution", index=1), target)
    assert backend.check(problem, solution_candidate(3), target)
    assert not backend.check(problem, solution_candidate(2), target)
    assert not backend.check(problem, solution_candidate(-7), target)


def test_failed_launch_raises_with_the_status_name(target: Target) -> None:
    fake = FakeRocblas(listed=[5], valid={5})
    backend = make_backend(fake)
    problem = Problem(m=4, n=4, k=4)
    runner = backend.prepare(problem, solution_candidate(5), target)
    a, b, out = _operands(problem, 3)
    fake.valid = set()  # e.g. the library was swapped under us
    with pytest.raises(RocblasError, match="rocblas_status_invalid_value"):
        runner(a, b, out)


@pytest.mark.parametrize(
    ("problem", "reason"),
    [
        (Problem(m=4, n=4, k=4, epilogue="relu"), "no epilogue"),
        (Problem(m=4, n=4, k=4, dtype_a="f16", dtype_b="f16", dtype_c="f16", compute="f16"), "compute f16"),
        (Problem(m=4, n=4, k=4, compute="tf32"), "compute tf32"),
        (Problem(m=4, n=4, k=4, dtype_c="f16"), "one dtype"),
    ],
)
def test_unsupported_problems_are_refused_clearly(problem: Problem, reason: str) -> None:
    with pytest.raises(UnsupportedProblem, match=reason):
        blas_view(problem)


def test_versions_and_availability_come_from_the_library() -> None:
    fake = FakeRocblas(listed=[], valid=set())
    backend = make_backend(fake)
    assert backend.availability() is None
    assert backend.versions() == {"rocblas": "4.3.0.ef408db7-dirty"}
    backend.close()


def test_without_rocm_the_backend_says_why() -> None:
    """The real loader and device check on this machine (no ROCm, no HIP device)."""
    backend = RocblasBackend()
    reason = backend.availability()
    assert reason is not None
    assert "librocblas" in reason
    with pytest.raises(UnsupportedProblem, match="rocBLAS is unavailable"):
        backend.versions()


def test_empty_solution_list_gives_no_candidates(target: Target) -> None:
    fake = FakeRocblas(listed=[], valid=set())
    backend = make_backend(fake)
    assert backend.candidates(Problem(m=4, n=4, k=4), target) == []
    assert fake.names().count("rocblas_gemm_ex_get_solutions") == 1  # no second call for nothing


def test_no_device_means_no_handle_is_made() -> None:
    """Without a HIP device the library is reported unusable before any handle is made."""
    fake = FakeRocblas(listed=[1], valid={1})
    backend = RocblasBackend(
        loader=lambda: (fake, LibraryChoice("fake", "test")),
        device_check=lambda: None,
        runtime_check=lambda: "no HIP device: hipGetDeviceCount of test returned hipErrorNoDevice (100)",
    )
    reason = backend.availability()
    assert reason is not None and reason.startswith("librocblas: OSError: no HIP device")
    assert "rocblas_create_handle" not in fake.names()


# --- the biased numbering (rocBLAS 5.x: Tensile < -10, hipBLASLt > 0, -9..0 reserved) -----


def test_a_biased_rocblas_names_each_index_by_its_source(target: Target) -> None:
    fake = FakeRocblas(listed=[-61, -11, -3, 0, 4, 9], valid={-61, -11, -3, 0, 4, 9}, version=b"5.1.0.abc")
    backend = make_backend(fake)
    problem = Problem(m=8, n=8, k=8)
    found = backend.candidates(problem, target)
    assert found == [
        solution_candidate(-61, "tensile"),
        solution_candidate(-11, "tensile"),
        solution_candidate(4, "hipblaslt"),
        solution_candidate(9, "hipblaslt"),
    ]  # the reserved -3 and 0 name no solution
    assert found[0].identity == "rocblas/solution?index=-61&source=s:tensile"
    runner = backend.prepare(problem, found[0], target)
    a, b, out = _operands(problem, 6)
    runner(a, b, out)
    assert np.allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)
    assert fake.ran[-1] == -61


def test_an_index_whose_meaning_changed_with_the_version_is_never_run(target: Target) -> None:
    """Index 4 measured on rocBLAS 4.x (Tensile's 4th) is a hipBLASLt solution on 5.x."""
    problem = Problem(m=8, n=8, k=8)
    old = solution_candidate(4, "tensile")
    legacy = solution_candidate(4)  # stored before identities carried the source
    unbiased = make_backend(FakeRocblas(listed=[4], valid={4}, version=b"4.4.1."))
    assert unbiased.check(problem, old, target) and unbiased.check(problem, legacy, target)
    biased = make_backend(FakeRocblas(listed=[4], valid={4}, version=b"5.0.0.abc"))
    assert not biased.check(problem, old, target) and not biased.check(problem, legacy, target)
    with pytest.raises(UnsupportedProblem, match="numbers index 4 as a hipblaslt solution"):
        biased.prepare(problem, legacy, target)
    assert biased.check(problem, solution_candidate(4, "hipblaslt"), target)


def test_a_listing_below_minus_ten_is_biased_whatever_the_version_says(target: Target) -> None:
    fake = FakeRocblas(listed=[-20, 5], valid={-20, 5}, version=b"4.9.0.dev")
    backend = make_backend(fake)
    assert backend.candidates(Problem(m=8, n=8, k=8), target) == [
        solution_candidate(-20, "tensile"),
        solution_candidate(5, "hipblaslt"),
    ]
