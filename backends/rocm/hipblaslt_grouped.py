"""hipBLASLt's grouped GEMM as a candidate for the MoE form of ``torch._grouped_mm``.

**Never run on AMD hardware**: checked against a fake shim that computes what it is handed
(``tests/backends/rocm/test_hipblaslt_grouped.py``, and through the backend in
``tests/backends/rocm/test_hipblaslt.py``) and, for the shim's C ABI and
``UserArguments`` layout, against Debian's real hipBLASLt headers and library without a GPU
(``tests/amd_real``). Offered by :class:`~.hipblaslt.HipblasltBackend` for grouped Problems,
on its handle and its shim (``docs/rocm.md``).

The form: 2-D ``a [M, K]`` (row-major) times 3-D ``b [G, K, N]``, ``offs`` the int32 ends of
each group's rows (``Problem.jagged == "m"``, ``Problem.m`` the bucket of M). Row-major
``out[rows of g] = a[rows of g] @ b[g]`` is, in hipBLASLt's column-major terms, the grouped
problem ``m = N, n = rows of g, k = K`` with ``A = b[g]`` (``op T`` when ``b[g]`` is stored
``N x K``, a transposed view of torch's ``[G, N, K]`` weights), ``B`` = the group's rows of
``a`` and ``D`` = those rows of ``out``. It is set up once per Problem as
``n = {bucket, 1, ..., 1}`` (the launch covers the bucket's rows over all groups, as XLA's
ROCm ragged dot and hipBLASLt's own fixed-MK sample do) and run per call with device-side
user arguments that a few torch ops on the GPU fill from ``offs``: each group's row count and
its pointers into ``a`` and ``out``. No host sync, no host problem rebuilt per call.

A runner follows the grouped convention ``runner(a, b, out, alpha, beta, bias, offs)``
(alpha 1, beta 0, no bias: torch has none). Identity:
``hipblaslt/grouped?index=<i>[&solution=s:<fingerprint>]`` (the index of the grouped
type's solution and the fingerprint of its name, as the dense candidates).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from unimatmul.backend import ITEMSIZE, Candidate, UnsupportedProblem, plain_grouped_call
from unimatmul_backends.lt.abi import LtABI
from unimatmul_backends.lt.driver import DATATYPES
from unimatmul_backends.rocm.hipblaslt_ext import (
    GROUPED_USER_ARGS,
    GroupedPointers,
    GroupedSolution,
    GroupedSpec,
    HipblasltExt,
    HipblasltGrouped,
    user_args_layout,
)
from unimatmul_backends.rocm.hipblaslt_identity import NAME, name_fingerprint

GROUPED = "grouped"
#: The placeholder address of every operand at set-up (XLA's ROCm ragged dot passes ~0 as
#: well): the support check reads only sizes, and every run passes the call's own pointers.
PLACEHOLDER = (1 << 64) - 16
#: What torch._grouped_mm takes (f32 accumulation for each).
DTYPES = ("f32", "f16", "bf16")
#: The compute types a Problem may ask for: the set-up accumulates in f32 (tf32 asks for less).
COMPUTES = ("f32", "tf32")


@dataclass(frozen=True)
class MoeLayout:
    """The MoE form of a grouped Problem, in the terms the runner needs."""

    groups: int
    rows: int  # the bucket of M: the most rows a call of this Problem has
    n: int
    k: int
    dtype: str
    trans_b: bool  # b[g] stored N x K (torch's [G, N, K] weights, transposed)
    lda: int  # a's row stride
    ldb: int  # b[g]'s leading dimension
    ldc: int  # out's row stride
    stride_b: int  # elements from b[g] to b[g + 1]

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    def spec(self, abi: LtABI) -> GroupedSpec:
        """hipBLASLt's column-major grouped problem, set up for the bucket's rows."""
        g, dt = self.groups, abi.datatype[DATATYPES[self.dtype]]
        return GroupedSpec(
            trans_a=self.trans_b, trans_b=False, type_a=dt, type_b=dt, type_c=dt, type_d=dt,
            compute=abi.compute_type["32F"], scale=ctypes.c_float,
            m=(self.n,) * g, n=(self.rows,) + (1,) * (g - 1), k=(self.k,) * g,
            lda=(self.ldb,) * g, ldb=(self.lda,) * g, ldc=(self.ldc,) * g, ldd=(self.ldc,) * g,
        )  # fmt: skip


def unavailable(ext: object, ext_reason: str = "") -> str:
    """Why this candidate cannot be offered with the backend's shim (``HipblasltBackend.ext``,
    None without one; ``ext_reason`` its reason), or "" when it can: it needs the shim's
    GroupedGemm with the user-args form."""
    if ext is None:
        return f"no hipBLASLt extension shim ({ext_reason or 'not loaded'}): no grouped GEMM"
    if not isinstance(ext, HipblasltExt):
        return f"the extension in use ({type(ext).__name__}) has no GroupedGemm"
    if ext.grouped < GROUPED_USER_ARGS:
        return f"the shim's grouped GEMM lacks the user-args form: {ext.grouped_reason}"
    return ""


def moe_layout(problem: Any) -> MoeLayout:
    """The MoE layout of a grouped Problem; UnsupportedProblem names what this candidate lacks."""

    def refuse(why: str) -> UnsupportedProblem:
        return UnsupportedProblem(f"hipBLASLt's grouped GEMM here: {why}", problem=problem, backend=NAME)

    if getattr(problem, "op", "") != "grouped_gemm":
        raise refuse(f"computes grouped GEMMs, not {getattr(problem, 'op', '?')}")
    if problem.jagged != "m":
        raise refuse(f"only the 2-D x 3-D form (offs over a's rows), not jagged={problem.jagged!r}")
    if problem.trans_a:
        raise refuse("a must be row-major")
    if problem.dtype_a not in DTYPES or len({problem.dtype_a, problem.dtype_b, problem.dtype_c}) != 1:
        raise refuse(
            f"types {problem.dtype_a}/{problem.dtype_b}/{problem.dtype_c}, not one of f32, f16, bf16"
        )
    if problem.compute not in COMPUTES:
        raise refuse(f"accumulates in f32, which does not serve compute type {problem.compute}")
    return MoeLayout(
        groups=problem.batch, rows=problem.m, n=problem.n, k=problem.k, dtype=problem.dtype_a,
        trans_b=problem.trans_b, lda=problem.lda, ldb=problem.ldb, ldc=problem.ldc, stride_b=problem.stride_b,
    )  # fmt: skip


def set_up(ext: HipblasltExt, handle: int, layout: MoeLayout, max_workspace: int) -> HipblasltGrouped:
    """The GroupedGemm of a layout, on placeholder pointers (each run passes its own)."""
    placeholders = (PLACEHOLDER,) * layout.groups
    pointers = GroupedPointers(placeholders, placeholders, placeholders, placeholders)
    return ext.grouped_gemm(handle, layout.spec(ext.abi), pointers, max_workspace)


def _fingerprint(solution: GroupedSolution) -> str | None:
    name = solution.solution_name or solution.kernel_name
    return name_fingerprint(name) if name else None


def solution_candidate(solution: GroupedSolution) -> Candidate:
    """The Candidate of one grouped solution: its index and its name's fingerprint."""
    fingerprint = _fingerprint(solution)
    if fingerprint is not None:
        return Candidate.make(NAME, GROUPED, index=solution.index, solution=fingerprint)
    return Candidate.make(NAME, GROUPED, index=solution.index)


def candidates(grouped: HipblasltGrouped) -> list[Candidate]:
    """One candidate per solution of the grouped type that supports the problem."""
    return [solution_candidate(s) for s in grouped.solutions()]


def resolve(found: Sequence[GroupedSolution], candidate: Candidate) -> GroupedSolution:
    """The solution a stored candidate names among ``found`` (a GroupedGemm's ``solutions()``):
    by index, unless its name's fingerprint is now another index's (indices move between
    builds); never a different solution under the same identity."""
    params = dict(candidate.params)
    if candidate.backend != NAME or candidate.name != GROUPED or not isinstance(params.get("index"), int):
        msg = f"{candidate.identity} is not a hipBLASLt grouped candidate"
        raise UnsupportedProblem(msg, backend=NAME)
    wanted = params.get("solution")
    for solution in found:
        if solution.index == params["index"] and wanted in (None, _fingerprint(solution)):
            return solution
    for solution in found if wanted is not None else []:
        if _fingerprint(solution) == wanted:
            return solution
    msg = (
        f"{candidate.identity}: no solution of this hipBLASLt build supports the problem under that identity"
    )
    raise UnsupportedProblem(msg, backend=NAME)


def prepare(
    ext: HipblasltExt,
    handle: int,
    problem: Any,
    candidate: Candidate,
    max_workspace: int,
    workspace: Callable[[int], Any],
    torch: Any,
    device: Any,
    stream: Callable[[], int],
    solutions: Sequence[GroupedSolution] | None = None,
) -> HipblasltGroupedRunner:
    """The runner of ``candidate`` on ``problem``: the GroupedGemm set up, the solution resolved
    (among ``solutions``, a listing of the same layout, else this GroupedGemm's own), checked
    on this GroupedGemm and initialized for the user-args form. ``workspace(nbytes)`` returns
    a device buffer (a tensor, kept by the runner) of at least that many bytes."""
    layout = moe_layout(problem)
    solution = resolve(solutions, candidate) if solutions is not None else None
    grouped = set_up(ext, handle, layout, max_workspace)
    try:
        if solution is None:
            solution = resolve(grouped.solutions(), candidate)
        algo = grouped.supported(solution.algo)
        if algo is None or algo.workspace > max_workspace:
            msg = f"{candidate.identity}: solution {solution.index} does not support this GroupedGemm"
            raise UnsupportedProblem(msg, problem=problem, backend=NAME)
        buffer = workspace(algo.workspace) if algo.workspace else None
        ptr = buffer.data_ptr() if buffer is not None else 0
        grouped.initialize(algo, ptr, user_args=True, stream=stream())
        runner = HipblasltGroupedRunner(grouped, layout, torch, device, stream, candidate)
    except BaseException:
        grouped.close()
        raise
    runner.workspace = buffer
    return runner


class HipblasltGroupedRunner:
    """``runner(a, b, out, alpha, beta, bias, offs)`` through one initialized GroupedGemm.

    Per call, on the caller's stream: each group's rows from ``offs`` (clamped to ``a``'s
    rows as torch's slices are), the template's user arguments with those row counts and the
    call's pointers, then one grouped launch reading them. The launch was sized at set-up for
    ``layout.rows`` rows in all, so a call may have at most that many (its bucket's).
    ``stream()`` gives the raw HIP stream (0 for the null stream).
    """

    def __init__(
        self,
        grouped: HipblasltGrouped,
        layout: MoeLayout,
        torch: Any,
        device: Any,
        stream: Callable[[], int],
        candidate: Candidate,
    ) -> None:
        self.grouped, self.layout, self.torch, self.stream = grouped, layout, torch, stream
        self.candidate = candidate
        self.workspace: Any = None  # the initialized algo's workspace, kept alive with it
        size, *offsets = user_args_layout()
        field = dict(zip(("m", "n", "batch", "k", "d", "c", "a", "b"), offsets, strict=False))
        # d, c, a, b: four consecutive 8-byte pointers; the row count n: one uint32.
        assert [field[f] for f in ("c", "a", "b")] == [field["d"] + 8 * i for i in (1, 2, 3)]
        self._n, self._ptrs = field["n"] // 4, field["d"] // 4
        template = bytes(grouped.default_user_args())
        host = torch.frombuffer(bytearray(template), dtype=torch.int32).reshape(layout.groups, size // 4)
        self._template = host.to(device)
        # Per group, the d, c, a, b pointers are these offsets (b[g]'s start in bytes) plus
        # the group's first row times these bytes per row, plus the call's base pointers.
        row_bytes = (
            layout.ldc * layout.itemsize,
            layout.ldc * layout.itemsize,
            0,
            layout.lda * layout.itemsize,
        )
        self._row_bytes = torch.tensor(row_bytes, dtype=torch.int64, device=device)
        offsets = torch.zeros((layout.groups, 4), dtype=torch.int64)
        offsets[:, 2] = torch.arange(layout.groups, dtype=torch.int64) * (layout.stride_b * layout.itemsize)
        self._offsets = offsets.to(device)

    def __call__(
        self,
        a: Any,
        b: Any,
        out: Any,
        alpha: float = 1.0,
        beta: float = 0.0,
        bias: Any = None,
        offs: Any = None,
    ) -> None:
        plain_grouped_call(alpha, beta, bias)
        torch, layout = self.torch, self.layout
        rows = a.shape[0]
        if rows > layout.rows:
            msg = f"a has {rows} rows, more than the {layout.rows} this grouped GEMM was set up for"
            raise ValueError(msg)
        # A dozen small device ops, no host sync (docs/rocm.md has their cost).
        ends = offs.to(torch.int64)
        lo = torch.nn.functional.pad(ends[:-1], (1, 0)).clamp_(0, rows)
        size = (ends.clamp(max=rows) - lo).clamp_(min=0)
        args = self._template.clone()
        args[:, self._n] = size
        ptrs = torch.addcmul(self._offsets, lo[:, None], self._row_bytes)
        ptrs[:, :2] += out.data_ptr()
        ptrs[:, 2] += b.data_ptr()
        ptrs[:, 3] += a.data_ptr()
        args[:, self._ptrs : self._ptrs + 8] = ptrs.view(torch.int32)
        self.grouped.run_user_args(args.data_ptr(), self.stream())
