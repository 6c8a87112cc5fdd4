"""hipBLASLt's grouped candidate (``backends/rocm/hipblaslt_grouped.py``) against the fake shim.

The fake GroupedGemm (``tests/hipblaslt_ext_fakes.py``) computes, on host memory, the
grouped product that the user arguments it is handed describe; the runner writes those
arguments with real torch ops (on CPU tensors here, on the GPU on ROCm) from the call's
``offs``, so each group's row count, its pointers into ``a``, ``b`` and ``out`` and the
column-major mapping are checked against a float64 reference for every kind of ``offs``.
Never run on AMD hardware. ``GroupedProblem`` below carries the fields this candidate reads
of a grouped Problem, so that forms a real Problem would refuse to hold reach its refusals;
``test_hipblaslt.py`` drives the same candidate through the backend with real Problems.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hipblaslt_ext_fakes import ABI, VERSION, FakeShim

from unimatmul.backend import Candidate, UnsupportedProblem
from unimatmul_backends.rocm import hipblaslt_grouped
from unimatmul_backends.rocm.hipblaslt import name_fingerprint
from unimatmul_backends.rocm.hipblaslt_ext import GROUPED_HOST, ExtUnavailable, HipblasltExt

HANDLE = 0x1234


@dataclass(frozen=True)
class GroupedProblem:
    """The fields of a grouped Problem (``op == "grouped_gemm"``) the candidate reads."""

    batch: int
    m: int
    n: int
    k: int
    trans_b: bool
    lda: int
    ldb: int
    ldc: int
    stride_b: int
    jagged: str = "m"
    trans_a: bool = False
    dtype_a: str = "f32"
    dtype_b: str = "f32"
    dtype_c: str = "f32"
    compute: str = "f32"
    op: str = "grouped_gemm"


def moe(groups: int, bucket: int, n: int, k: int, *, weights_nk: bool) -> GroupedProblem:
    """x [rows, k] times w[g] [k, n]; ``weights_nk``: w stored [groups, n, k] and transposed."""
    if weights_nk:
        return GroupedProblem(groups, bucket, n, k, trans_b=True, lda=k, ldb=k, ldc=n, stride_b=n * k)
    return GroupedProblem(groups, bucket, n, k, trans_b=False, lda=k, ldb=n, ldc=n, stride_b=k * n)


def runner_for(
    problem: GroupedProblem, shim: FakeShim, **kwargs: Any
) -> hipblaslt_grouped.HipblasltGroupedRunner:
    ext = HipblasltExt(shim, ABI, VERSION)
    with hipblaslt_grouped.set_up(ext, HANDLE, hipblaslt_grouped.moe_layout(problem), 1 << 20) as listing:
        (first, *_) = hipblaslt_grouped.candidates(listing)
    return hipblaslt_grouped.prepare(
        ext, HANDLE, problem, first, 1 << 20, lambda nbytes: torch.empty(nbytes, dtype=torch.uint8),
        torch, "cpu", lambda: 0x77, **kwargs,
    )  # fmt: skip


OFFS = {
    "skewed": [9, 9, 11, 13],  # an empty group
    "one": [0, 13, 13, 13],  # one group holds every row
    "tail": [1, 4, 4, 10],  # odd starts, rows 10..12 in no group
    "past": [5, 20, 30, 40],  # ends past a's rows: clamped, as torch's slices
    "none": [0, 0, 0, 0],
    "negative": [-3, 5, 5, 13],  # a negative end: an empty group, the next one from row 0
}


@pytest.mark.parametrize("weights_nk", [True, False])
def test_the_runner_computes_every_groups_rows_for_every_offs(weights_nk: bool) -> None:
    groups, rows, n, k = 4, 13, 5, 6
    problem = moe(groups, 16, n, k, weights_nk=weights_nk)
    shim = FakeShim([0, 2])
    runner = runner_for(problem, shim)
    made = shim.instances[runner.grouped.ptr]
    # Set up once for the bucket: n = {16, 1, 1, 1}, m = N, k = K, A = the weights.
    assert made["n"] == [16, 1, 1, 1] and made["m"] == [n] * groups and made["k"] == [k] * groups
    assert made["ops"] == (ABI.operation["T" if weights_nk else "N"], ABI.operation["N"])
    assert made["initialized"] == [(0, 0, 1, 0x77)]  # the user-args form, on the runner's stream
    gen = torch.Generator().manual_seed(3)
    sign = torch.tensor([-1.0, 1.0])
    x = (torch.rand(rows, k, generator=gen) + 0.5) * sign[torch.randint(0, 2, (rows, k), generator=gen)]
    w = torch.rand(groups, n, k, generator=gen) + 0.5
    b = w.transpose(-2, -1) if weights_nk else w.transpose(-2, -1).contiguous()
    for name, ends in OFFS.items():
        out = torch.full((rows, n), float("nan"))
        offs = torch.tensor(ends, dtype=torch.int32)
        runner(x, b, out, 1.0, 0.0, None, offs)
        start = 0
        for g, end in enumerate(ends):
            lo = min(max(start, 0), rows)  # as torch's slices (core/grouped.py: group_bounds)
            hi = max(lo, min(max(end, 0), rows))
            want = x[lo:hi].double() @ b[g].double()
            np.testing.assert_allclose(out[lo:hi].numpy(), want.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
            start = end
        covered = min(max(ends[-1], 0), rows)
        assert torch.isnan(out[covered:]).all(), name  # rows in no group are never written
    assert len(shim.instances) == 2  # the candidates' listing, then the runner's: none per call


def test_identities_name_the_solution_and_survive_moved_indices() -> None:
    problem = moe(2, 8, 4, 4, weights_nk=True)
    shim = FakeShim([0, 1, 2, 4], solution_names={0: "S_zero", 2: "S_two", 4: "S_four"})
    ext = HipblasltExt(shim, ABI, VERSION)
    grouped = hipblaslt_grouped.set_up(ext, HANDLE, hipblaslt_grouped.moe_layout(problem), 1 << 20)
    found = hipblaslt_grouped.candidates(grouped)
    assert [c.identity for c in found] == [
        f"hipblaslt/grouped?index={i}&solution=s:{name_fingerprint(n)}"
        for i, n in ((0, "S_zero"), (2, "S_two"), (4, "S_four"))
    ]  # index 1 refuses the problem
    assert hipblaslt_grouped.resolve(grouped.solutions(), found[1]).index == 2
    # Another build: "S_two" is index 4 now, and index 2 another solution.
    shim.solution_names = {0: "S_zero", 2: "S_other", 4: "S_two"}
    assert hipblaslt_grouped.resolve(grouped.solutions(), found[1]).index == 4
    shim.solution_names = {0: "S_zero", 2: "S_other", 4: "S_four"}
    with pytest.raises(UnsupportedProblem, match="no solution of this hipBLASLt build"):
        hipblaslt_grouped.resolve(grouped.solutions(), found[1])  # gone: never another kernel under its name
    # An identity without a name (a hand-written one) is taken by index.
    assert (
        hipblaslt_grouped.resolve(grouped.solutions(), Candidate.make("hipblaslt", "grouped", index=2)).index
        == 2
    )
    with pytest.raises(UnsupportedProblem, match="is not a hipBLASLt grouped candidate"):
        hipblaslt_grouped.resolve(grouped.solutions(), Candidate.make("hipblaslt", "gemm", index=2))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"jagged": "k"}, "only the 2-D x 3-D form"),
        ({"trans_a": True}, "a must be row-major"),
        ({"dtype_a": "f64", "dtype_b": "f64", "dtype_c": "f64"}, "not one of f32, f16, bf16"),
        ({"op": "gemm"}, "computes grouped GEMMs, not gemm"),
        ({"compute": "f16"}, "does not serve compute type f16"),
    ],
)
def test_other_forms_are_refused_with_the_reason(change: dict[str, Any], why: str) -> None:
    base = moe(2, 8, 4, 4, weights_nk=True)
    problem = GroupedProblem(**{**base.__dict__, **change})
    with pytest.raises(UnsupportedProblem, match=why):
        hipblaslt_grouped.moe_layout(problem)


def test_the_layouts_hipblaslt_types() -> None:
    layout = hipblaslt_grouped.moe_layout(GroupedProblem(3, 64, 8, 16, True, 16, 16, 8, 128, dtype_a="bf16",
                                                         dtype_b="bf16", dtype_c="bf16"))  # fmt: skip
    spec = layout.spec(ABI)
    assert {spec.type_a, spec.type_b, spec.type_c, spec.type_d} == {ABI.datatype["R_16BF"]}
    assert spec.compute == ABI.compute_type["32F"] and spec.trans_a and not spec.trans_b
    assert (spec.lda, spec.ldb, spec.ldc) == ((16,) * 3, (16,) * 3, (8,) * 3)
    assert layout.itemsize == 2


def test_a_call_outside_its_set_up_is_refused() -> None:
    runner = runner_for(moe(2, 8, 4, 4, weights_nk=True), FakeShim([0]))
    x, b = torch.ones(9, 4), torch.ones(2, 4, 4)
    offs = torch.tensor([4, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match="9 rows, more than the 8 this grouped GEMM was set up for"):
        runner(x, b, torch.empty(9, 4), 1.0, 0.0, None, offs)
    with pytest.raises(ValueError, match="no alpha, beta or bias"):
        runner(x[:8], b, torch.empty(8, 4), 1.0, 1.0, None, offs)


def test_without_the_shim_or_its_user_args_form_the_candidate_says_why() -> None:
    assert hipblaslt_grouped.unavailable(HipblasltExt(FakeShim([0]), ABI, VERSION)) == ""
    why = hipblaslt_grouped.unavailable(None, "ExtUnavailable: no C++ compiler")
    assert why == "no hipBLASLt extension shim (ExtUnavailable: no C++ compiler): no grouped GEMM"
    assert "has no GroupedGemm" in hipblaslt_grouped.unavailable(object())
    host = HipblasltExt(FakeShim([0], grouped=GROUPED_HOST), ABI, VERSION)
    assert "lacks the user-args form: the shim was built without UserArguments" in (
        hipblaslt_grouped.unavailable(host)
    )
    with pytest.raises(ExtUnavailable, match="without UserArguments"):
        runner_for(moe(2, 8, 4, 4, weights_nk=True), FakeShim([0], grouped=GROUPED_HOST))
