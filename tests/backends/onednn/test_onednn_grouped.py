"""oneDNN's grouped loops (``loop:<impl>``): the MoE form on real oneDNN, every kind of offs.

Each group's rows are compared with a float64 product of the same rows and expert; the
output is poisoned (NaN) first, so an unwritten row fails, and rows past ``offs[-1]`` must
stay as they were (torch leaves them undefined; the loop does not write them).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from unimatmul.backend import Candidate, Target  # noqa: E402
from unimatmul.core.arrays import CPU, adapter_for_kind, adapter_of  # noqa: E402
from unimatmul.core.dtypes import tolerance  # noqa: E402
from unimatmul.core.errors import UnsupportedProblem  # noqa: E402
from unimatmul.core.grouped import grouped_problem_of  # noqa: E402
from unimatmul_backends.onednn import OneDNNBackend  # noqa: E402
from unimatmul_backends.onednn.backend import GroupedOneDNNRunner  # noqa: E402
from unimatmul_conformance import run_suite  # noqa: E402

BACKEND = OneDNNBackend()
if BACKEND.availability() is not None:  # pragma: no cover - depends on the machine
    pytest.skip(f"oneDNN is unavailable: {BACKEND.availability()}", allow_module_level=True)

TORCH = Target(adapter_for_kind("torch"), CPU)
NUMPY = Target(adapter_for_kind("numpy"), CPU)
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
E, K, N = 8, 72, 40


def _offs(kind: str, rows: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(len(kind) + rows)
    if kind == "one":  # every row in one group, the others empty
        ends = [0, 0, 0, rows, rows, rows, rows, rows]
    elif kind == "tail":  # empty groups, odd starts, rows past the last end
        ends = [0, 3, 3, 10, 11, 11, 20, rows - 5]
    else:  # random sizes, some empty
        cuts = torch.sort(torch.randint(0, rows + 1, (E - 1,), generator=gen)).values.tolist()
        ends = [*cuts, rows]
    return torch.tensor(ends, dtype=torch.int32)


def _operands(dtype: torch.dtype, rows: int, transposed: bool) -> tuple[Any, Any]:
    gen = torch.Generator().manual_seed(rows)
    a = torch.randn(rows, K, generator=gen).to(dtype)
    if transposed:  # weights [E, N, K] as transformers keeps them, passed transposed
        b = torch.randn(E, N, K, generator=gen).to(dtype).transpose(-2, -1)
    else:
        b = torch.randn(E, K, N, generator=gen).to(dtype)
    return a, b


def _candidates(problem: Any) -> list[Any]:
    cands = BACKEND.candidates(problem, TORCH)
    if not cands:
        pytest.skip(f"oneDNN offers no implementation for {problem.key} on this CPU")
    return cands


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("offs_kind", ["random", "one", "tail"])
@pytest.mark.parametrize("transposed", [True, False])
def test_every_loop_computes_every_group(dtype: str, offs_kind: str, transposed: bool) -> None:
    a, b = _operands(DTYPES[dtype], 48, transposed)
    offs = _offs(offs_kind, a.shape[0])
    adapter = adapter_of(a)
    problem = grouped_problem_of(adapter, a, b, offs)
    ends = offs.tolist()
    for candidate in _candidates(problem):
        assert candidate.name.startswith("loop:")
        assert BACKEND.check(problem, candidate, TORCH)
        out = torch.full((a.shape[0], N), float("nan"), dtype=a.dtype)
        runner = BACKEND.prepare(problem, candidate, TORCH)
        runner(a, b, out, 1.0, 0.0, None, offs)
        start = 0
        for g, end in enumerate(ends):
            if end > start:
                ref = a[start:end].double() @ b[g].double()
                got = out[start:end].double()
                assert not got.isnan().any(), f"{candidate.name}: group {g} left unwritten"
                err = float((got - ref).norm() / ref.norm())
                assert err < tolerance(dtype), f"{candidate.name}: group {g} rel. error {err:.2e}"
            start = end
        assert out[ends[-1] :].isnan().all(), "rows past offs[-1] were written"
        runner.close()


def test_only_the_moe_form_on_torch_tensors_gets_loops() -> None:
    a, b = _operands(torch.float32, 32, True)
    offs = _offs("random", 32)
    adapter = adapter_of(a)
    m_form = grouped_problem_of(adapter, a, b, offs)
    assert _candidates(m_form)
    with pytest.raises(UnsupportedProblem, match="torch tensors"):
        BACKEND.candidates(m_form, NUMPY)
    k_form = grouped_problem_of(
        adapter, a.t().contiguous(), torch.randn(32, N), torch.tensor([8, 20, 32], dtype=torch.int32)
    )
    with pytest.raises(UnsupportedProblem, match="jagged=k"):
        BACKEND.candidates(k_form, TORCH)
    assert not BACKEND.check(k_form, _candidates(m_form)[0], TORCH)
    with pytest.raises(UnsupportedProblem, match="not a oneDNN loop"):
        BACKEND.prepare(m_form, Candidate.make("onednn", "loop:no-such-impl"), TORCH)


def test_primitives_are_kept_per_height_and_the_oldest_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(GroupedOneDNNRunner, "MAX_PRIMITIVES", 3)
    a, b = _operands(torch.float32, 64, True)
    adapter = adapter_of(a)
    problem = grouped_problem_of(adapter, a, b, _offs("random", 64))
    runner = BACKEND.prepare(problem, _candidates(problem)[0], TORCH)
    for heights in ([1, 2, 3, 4], [5, 5, 6, 7], [1, 1, 1, 1]):
        ends = torch.tensor(
            [sum(heights[: i + 1]) for i in range(len(heights))] + [sum(heights)] * 4, dtype=torch.int32
        )
        out = torch.full((64, N), float("nan"))
        runner(a, b, out, 1.0, 0.0, None, ends)
        ref = torch._grouped_mm(a, b, ends)
        rows = int(ends[-1])
        assert torch.allclose(out[:rows], ref[:rows], rtol=1e-4, atol=1e-4)
        assert len(runner._prims) <= 3
    assert (1, *a.stride(), *b.stride()[1:], N, 1) in runner._prims  # the last call's height
    runner.close()
    assert not runner._prims


def test_a_loop_refuses_alpha_beta_and_a_missing_offs() -> None:
    a, b = _operands(torch.float32, 16, True)
    adapter = adapter_of(a)
    problem = grouped_problem_of(adapter, a, b, _offs("random", 16))
    runner = BACKEND.prepare(problem, _candidates(problem)[0], TORCH)
    out = torch.empty(16, N)
    with pytest.raises(ValueError, match="alpha"):
        runner(a, b, out, 2.0, 0.0, None, _offs("random", 16))
    with pytest.raises(ValueError, match="needs offs"):
        runner(a, b, out, 1.0, 0.0, None, None)


def test_the_conformance_suite_passes_the_loops() -> None:
    report = run_suite(BACKEND, quick=True, checks=frozenset({"grouped", "candidates"}))
    assert report.ok, [f"{r.id}: {r.why}" for r in report.failed()][:5]
    grouped = [r for r in report.results if r.check == "grouped"]
    assert all(r.status == "passed" for r in grouped)
    assert all("jagged=m" in r.case for r in grouped)  # the MoE form only
