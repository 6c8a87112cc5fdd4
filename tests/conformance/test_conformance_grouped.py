"""The conformance suite on grouped GEMMs: every backend that names ``grouped_gemm`` gets
the grouped matrix (every form, random and edge offs); a wrong grouped kernel fails it,
a dense backend gets no grouped checks."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from grouped_cases import GroupedFake

from unimatmul_backends.grouped_loop.backend import GroupedLoopBackend
from unimatmul_conformance import CHECKS, run_suite

FAST = frozenset(CHECKS) - {"identity-stable"}


def _grouped(report: Any) -> list[Any]:
    return [r for r in report.results if r.check == "grouped"]


def test_the_grouped_loop_passes_every_form_on_every_offs() -> None:
    report = run_suite(GroupedLoopBackend(), quick=True, checks=FAST)
    assert report.ok, [f"{r.id}: {r.why}" for r in report.failed()][:5]
    runs = _grouped(report)
    forms = {r.case.split("jagged=")[1].split("@")[0] for r in runs}
    assert forms == {"m", "k", "n", "none"}
    assert {r.case.split(":")[1] for r in runs} == {"bf16.bf16.bf16", "f16.f16.f16"}
    assert all(r.status == "passed" and "6 distributions" in r.why for r in runs)
    assert any(":TN:" in r.case and "jagged=k" in r.case for r in runs)  # a column-major weight gradient


class _MoEOnly(GroupedFake):
    """A GroupedFake that offers its kernel for the MoE form only (the one it computes)."""

    def candidates(self, problem: Any, target: Any) -> list[Any]:
        from unimatmul import UnsupportedProblem

        if problem.jagged != "m" or problem.dtype_a == "f16":
            raise UnsupportedProblem("the MoE form in bf16 only", problem=problem)
        return super().candidates(problem, target)


@pytest.mark.parametrize("behaviour", ["skips_empty", "short_tiles"])
def test_a_grouped_kernel_wrong_for_some_offs_fails_and_says_which(behaviour: str) -> None:
    report = run_suite(_MoEOnly(behaviour), quick=True, checks=frozenset({"grouped", "candidates"}))
    failed = [r for r in _grouped(report) if r.status == "failed"]
    assert failed, [r.why for r in _grouped(report)]
    assert all("over the error bound" in r.why or "NaN" in r.why for r in failed), failed[0].why
    if behaviour == "short_tiles":  # right unless one group holds most rows
        assert all("one offs" in r.why for r in failed), failed[0].why


def test_the_right_fake_passes() -> None:
    report = run_suite(_MoEOnly("correct"), quick=True, checks=frozenset({"grouped", "candidates"}))
    runs = _grouped(report)
    assert runs and all(r.status == "passed" for r in runs), [r.why for r in runs if r.status != "passed"]


def test_a_dense_backend_gets_no_grouped_checks(fake_backend: Any) -> None:
    report = run_suite(fake_backend("dense-only"), quick=True, checks=FAST)
    (only,) = _grouped(report)
    assert only.status == "skipped" and "names no grouped_gemm op" in only.why
    assert not any("grouped_gemm" in (r.case or "") for r in report.results)
