"""Kernel families that lose everywhere in a tuning run stop being measured in it.

A run of many problems (``unimatmul tune --model``, a preset, a record file) measures the
same kernel families on problem after problem. Some never come near the best on a class
of problems: measured on Llama-3-8B's 60 products on the H200, Triton's tile and
persistent kernels were 1.3x or more behind the best on every prefill product (316 and
84 candidates over two runs, none within 5 % of the best), and its GEMV kernel on all but
two of 70 decode products. Each still paid its preparation, its numeric checks, a CUDA
graph's capture and its first samples on every problem.

A :class:`Retirement` watches the records of a run. A **family** is a backend's kernel
kind (``triton/tile``: a candidate's identity before its parameters). A problem's
**class** is its target, operation, dtypes, layout, alignment, whether it is scaled, and
its rows (per group for grouped products) to within a factor of four
(``m.bit_length() // 2``). A family *lost* a problem when none of its candidates there
came within :data:`RETIRE_RATIO` of the best median (a candidate that failed, was
rejected or not supported counts as a loss; one never measured, e.g. left out by the
problem's cap, says nothing). A family that lost :attr:`Retirement.after` problems of a
class in a row is **retired** for that class for the rest of the run: its candidates are
not offered to the later problems of the class, and their records say how many were left
out and which families (``settings["retired"]``). A win, or a near one, in between
starts the count again.

GPU targets only: on a CPU, blocks of one kernel are timed at one of two speeds on some
machines (``benchmarks/results/tune-agreement-cpu``), and three losses in a row say less.
``UNIMATMUL_TUNE_RETIRE_AFTER`` sets the count (0: never retire).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from unimatmul import settings
from unimatmul.cache.record import FAILED, OK, REJECTED, TuningRecord
from unimatmul.core._backend import DEFAULT, Candidate, Target
from unimatmul.core.problem import Problem

#: A family whose best candidate is this much slower than the problem's best lost it:
#: the ratio at which the GPU harness prunes a candidate after its first round of samples.
RETIRE_RATIO = 1.3

ProblemClass = tuple[object, ...]


def family(identity: str) -> str:
    """A candidate's kernel family: its identity before the parameters (``triton/tile``)."""
    return identity.split("?", 1)[0]


def problem_class(problem: Problem, target: Target) -> ProblemClass:
    """What a family's losses are counted over (see the module docstring)."""
    groups = problem.batch if problem.is_grouped else 1
    rows = max(1, problem.m // groups)
    return (
        target,
        problem.op,
        problem.dtype_a,
        problem.dtype_b,
        problem.dtype_c,
        problem.trans_a,
        problem.trans_b,
        problem.align >= 16,
        problem.is_scaled,
        rows.bit_length() // 2,
    )


@dataclass
class Retirement:
    """The families retired so far in one run, and the losses counted towards it."""

    after: int = field(default_factory=lambda: settings.TUNE_RETIRE_AFTER.get())
    ratio: float = RETIRE_RATIO
    gpu_only: bool = True  # see the module docstring
    _lost: dict[tuple[ProblemClass, str], int] = field(default_factory=dict, init=False, repr=False)
    _retired: set[tuple[ProblemClass, str]] = field(default_factory=set, init=False, repr=False)
    #: Candidates left out so far, by family (for the run's summary).
    left_out: dict[str, int] = field(default_factory=dict, init=False)

    def applies(self, target: Target) -> bool:
        return self.after > 0 and (target.device.kind != "cpu" or not self.gpu_only)

    def split(
        self, problem: Problem, target: Target, candidates: Sequence[Candidate]
    ) -> tuple[list[Candidate], list[Candidate]]:
        """(kept, left out): the candidates of families retired for ``problem``'s class are
        left out (Default never is)."""
        if not self._retired or not self.applies(target):
            return list(candidates), []
        cls = problem_class(problem, target)
        kept: list[Candidate] = []
        out: list[Candidate] = []
        for candidate in candidates:
            if candidate != DEFAULT and (cls, family(candidate.identity)) in self._retired:
                out.append(candidate)
            else:
                kept.append(candidate)
        for candidate in out:
            name = family(candidate.identity)
            self.left_out[name] = self.left_out.get(name, 0) + 1
        return kept, out

    def learn(self, problem: Problem, target: Target, record: TuningRecord) -> None:
        """Count each family's loss (or not) on ``record``'s problem; retire at :attr:`after`."""
        if not self.applies(target):
            return
        medians = [r.median_s for r in record.results if r.status == OK and r.median_s]
        if not medians:
            return
        best = min(medians)
        fastest: dict[str, float] = {}
        for result in record.results:
            if result.identity == DEFAULT.identity:
                continue
            name = family(result.identity)
            if result.median_s:
                fastest[name] = min(fastest.get(name, math.inf), result.median_s)
            elif result.status in (FAILED, REJECTED):
                fastest.setdefault(name, math.inf)
        cls = problem_class(problem, target)
        for name, seconds in fastest.items():
            key = (cls, name)
            if seconds <= best * self.ratio:
                self._lost[key] = 0
                continue
            self._lost[key] = self._lost.get(key, 0) + 1
            if self._lost[key] >= self.after:
                self._retired.add(key)

    def summary(self) -> str:
        """One line on what was left out (empty when nothing was)."""
        if not self.left_out:
            return ""
        count = sum(self.left_out.values())
        families = ", ".join(f"{name} {n}" for name, n in sorted(self.left_out.items()))
        return (
            f"retired: {count} candidates not measured ({families}): their family lost by "
            f"{self.ratio:g}x or more on {self.after} problems like theirs in a row"
        )
