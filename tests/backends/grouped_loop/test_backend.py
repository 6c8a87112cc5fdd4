"""The grouped-loop backend: one dense product per group, right for every form and edge offs."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from grouped_cases import close, operands, reference  # noqa: E402

from unimatmul import Problem, UnsupportedProblem  # noqa: E402
from unimatmul.core._backend import Target  # noqa: E402
from unimatmul.core.arrays import CPU, adapter_for_kind  # noqa: E402
from unimatmul.core.grouped import grouped_problem, grouped_problem_of  # noqa: E402
from unimatmul_backends.grouped_loop.backend import LOOP, MAX_GROUPS, GroupedLoopBackend  # noqa: E402

TARGET = Target(adapter_for_kind("torch"), CPU)


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("sizes", [[13, 0, 7, 4], [0, 24, 0, 0], [0, 0, 0, 0], [1, 3, 5, 15]])
@pytest.mark.parametrize("jagged", ["m", "k", "n", "none"])
def test_the_loop_is_right_for_every_form_and_edge_offs(
    isolated: Any, jagged: str, sizes: list[int], dtype: str
) -> None:
    extent = 24 if sum(sizes) == 0 else None  # all groups empty: rows no group covers
    a, b, offs = operands(jagged, sizes, dtype, extent=extent)
    problem = grouped_problem_of(TARGET.adapter, a, b, offs)
    backend = GroupedLoopBackend()
    assert backend.candidates(problem, TARGET) == [LOOP]
    runner = backend.prepare(problem, LOOP, TARGET)
    out = torch.full(torch._grouped_mm(a, b, offs).shape, float("nan"), dtype=a.dtype)
    runner(a, b, out, 1.0, 0.0, None, offs)
    assert close(out, reference(jagged, a, b, offs), dtype)


def test_offered_for_few_groups_only_and_for_grouped_problems_only() -> None:
    backend = GroupedLoopBackend()
    assert backend.candidates(grouped_problem(MAX_GROUPS, 64, 32, 32), TARGET) == [LOOP]
    assert backend.candidates(grouped_problem(MAX_GROUPS + 1, 64, 32, 32), TARGET) == []
    assert "grouped_gemm" in backend.ops and "gemm" not in backend.ops
    with pytest.raises(UnsupportedProblem, match="grouped"):
        backend.candidates(Problem.from_shape(8, 8, 8), TARGET)


def test_registered_through_the_entry_point(isolated: Any) -> None:
    assert "grouped_loop" in isolated.plugins.backends()


def test_on_a_gpu_only_the_form_without_offs_is_offered() -> None:
    """offs read on the host is a synchronisation per call and breaks CUDA-graph capture."""
    from unimatmul.core.arrays import Device

    gpu = Target(adapter_for_kind("torch"), Device("cuda", 0))
    backend = GroupedLoopBackend()
    for jagged in ("m", "k", "n"):
        assert backend.candidates(grouped_problem(8, 64, 32, 32, jagged=jagged), gpu) == []
    assert backend.candidates(grouped_problem(8, 64, 32, 32, jagged="none"), gpu) == [LOOP]
