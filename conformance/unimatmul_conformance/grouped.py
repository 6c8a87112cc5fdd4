"""Grouped GEMMs (``torch._grouped_mm``'s forms) in the suite, for backends that offer them.

A backend whose ``ops`` names ``grouped_gemm`` gets the grouped matrix: every form
(``m``: 2-D x 3-D, the MoE forward with b as ``w.t()`` and row-major; ``k``: 2-D x 2-D,
the weight gradient with a column-major; ``n``: 3-D x 2-D; ``none``: 3-D x 3-D), bf16 and
f16 (and f32 in the full run), decode-like buckets (many groups of a few rows) and
prefill-like ones, N and K that are not powers of two. Each offered candidate runs on
every token distribution the harness knows (``unimatmul.core.grouped.DISTRIBUTIONS``:
skewed with an empty group, uniform, one group holding every row, a tail past
``offs[-1]`` with odd group starts) and on random ``offs`` of its own: the output is
compared group by group with the float64 reference (the harness's own check), the
memory around the output keeps its canaries, and the inputs (``offs`` included) are
unchanged. A backend that does not name the op is never asked about grouped problems
(the Tuner does not ask it either): it gets no grouped checks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from unimatmul.backend import Candidate, Target
from unimatmul.core.errors import UnsupportedProblem
from unimatmul.core.grouped import (
    DISTRIBUTIONS,
    GroupedOperands,
    grouped_problem,
    make_grouped_operands,
)
from unimatmul.core.problem import Problem
from unimatmul.tuning.harness import compare_output, reference_of
from unimatmul_conformance.checks import GROUPED
from unimatmul_conformance.report import FAILED, PASSED

if TYPE_CHECKING:
    from unimatmul_conformance.context import SuiteContext

Outcome = tuple[str, str]

#: Random draws of offs per candidate, besides DISTRIBUTIONS.
RANDOM_DRAWS = 2
#: Elements of canary before and after each output.
GUARD = 64
CANARY = -7.25  # exact in every grouped dtype

# (groups, m, n, k): decode (a few rows per group), prefill, odd N and K (multiples of 8:
# torch's 16-byte rule for 2-byte dtypes).
SHAPES = [(8, 16, 64, 48), (4, 96, 40, 56), (3, 200, 24, 72)]


def grouped_matrix(quick: bool) -> list[Problem]:
    """The grouped problems every grouped backend is asked about."""
    dtypes = ("bf16", "f16") if quick else ("bf16", "f16", "f32")
    shapes = SHAPES[:2] if quick else SHAPES
    out: list[Problem] = []
    for dtype in dtypes:
        for jagged in ("m", "k", "n", "none"):
            for index, (g, m, n, k) in enumerate(shapes):
                if dtype != dtypes[0] and index:
                    continue  # the other dtypes: one shape each
                out.append(grouped_problem(g, m, n, k, dtype, jagged=jagged))
        # b row-major (not w.t()) in the MoE form, and a column-major weight gradient
        out.append(grouped_problem(4, 96, 40, 56, dtype, jagged="m", trans_b=False))
    wgrad = grouped_problem(4, 24, 40, 96, dtypes[0], jagged="k")
    out.append(replace(wgrad, trans_a=True, lda=wgrad.m))
    return out


def _guarded(adapter: Any, out: Any) -> tuple[Any, Any]:
    """A copy of ``out``'s layout inside canaries: (output view, the whole buffer)."""
    torch = adapter.torch
    size = out.untyped_storage().nbytes() // out.element_size()
    flat = torch.full((size + 2 * GUARD,), CANARY, dtype=out.dtype, device=out.device)
    view = flat.as_strided(tuple(out.shape), tuple(out.stride()), GUARD + out.storage_offset())
    view.fill_(float("nan"))
    return view, flat


def _canaries_intact(torch: Any, flat: Any, view: Any) -> bool:
    mask = torch.ones(flat.shape, dtype=torch.bool, device=flat.device)
    mask.as_strided(tuple(view.shape), tuple(view.stride()), view.storage_offset()).fill_(False)
    return bool((flat[mask] == CANARY).all())


def check_grouped(suite: SuiteContext, problem: Problem, candidate: Candidate) -> Outcome:
    """One candidate of a grouped problem on every distribution of offs (module docstring)."""
    target: Target = suite.targets["torch"]
    adapter, device = target.adapter, target.device
    try:
        runner: Any = suite.backend.prepare(problem, candidate, target)
    except UnsupportedProblem as exc:
        return FAILED, f"prepare() refused a candidate it offered: {exc}"
    except Exception as exc:
        return FAILED, f"prepare() raised {type(exc).__name__}: {exc}"
    rng = np.random.default_rng(suite.seed ^ (hash(problem.key) & 0xFFFF))
    draws = list(DISTRIBUTIONS) + ["uniform"] * RANDOM_DRAWS
    problems = []
    for draw, distribution in enumerate(draws):
        ops = make_grouped_operands(problem, adapter, device, rng, distribution)
        out, flat = _guarded(adapter, ops.out)
        ops = GroupedOperands(ops.a, ops.b, out, None, ops.offs, ops.jagged)
        before = [x.clone() for x in (ops.a, ops.b, ops.offs) if x is not None]
        try:
            runner(ops.a, ops.b, out, 1.0, 0.0, None, ops.offs)
            adapter.synchronize(device)
        except Exception as exc:
            return FAILED, f"{distribution} offs: the runner raised {type(exc).__name__}: {exc}"
        what = f"{distribution} offs {ops.offs.tolist() if ops.offs is not None else None}"
        if draw >= len(DISTRIBUTIONS):
            what = f"random {what}"
        found = compare_output(target, ops, out, reference_of(problem, target, ops, None, 1.0, 0.0))
        if not found.ok():
            problems.append(f"{what}: {found.describe()}")
        if not _canaries_intact(adapter.torch, flat, out):  # type: ignore[attr-defined]
            problems.append(f"{what}: wrote outside the output")
        after = [x for x in (ops.a, ops.b, ops.offs) if x is not None]
        if any(not bool((x == y).all()) for x, y in zip(before, after, strict=True)):
            problems.append(f"{what}: changed an input")
    if problems:
        return FAILED, "; ".join(problems[:3])
    return PASSED, f"right on {len(draws)} distributions of offs"


__all__ = ["GROUPED", "check_grouped", "grouped_matrix"]
