"""A grouped GEMM computed as a loop of dense GEMMs, one ``torch.mm`` per group.

Each group's product is torch's dense kernel (cuBLAS / hipBLASLt on a GPU, oneDNN or MKL
on a CPU) through its ``out=`` form, which PyTorch routing never takes over (a kernel
must not call routed ops). On a GPU that is what the loop is for: torch's grouped kernel
sizes one tile for every group, a dense kernel per group picks its own. Reaching each
group's *tuned* dense choice instead needs the engine (the Selector), which a backend
may not import; the shared call path can offer that loop. The loop reads ``offs`` on the
host, which on a GPU is a copy and a synchronisation per call (as torch's own fallback
makes) and cannot be captured in a CUDA graph: on a GPU it is offered only for the form
without ``offs`` (3-D x 3-D), everywhere only for few groups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, ClassVar

from unimatmul.backend import (
    Backend,
    Candidate,
    Problem,
    Target,
    UnsupportedProblem,
    group_bounds,
    plain_grouped_call,
)

NAME = "grouped_loop"
#: The most groups the loop is offered for: past this, a launch (and a dispatch) per group
#: costs more than one grouped kernel saves by sizing its tiles per group.
MAX_GROUPS = 16
LOOP = Candidate.make(NAME, "dense")


@dataclass
class GroupedLoopRunner:
    """``runner(a, b, out, alpha, beta, bias, offs)``: one dense product per group."""

    jagged: str
    candidate: Candidate = field(default=LOOP)

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
        import torch  # the runner is only ever called with torch tensors

        mm, jagged = torch.mm, self.jagged
        if jagged == "none":
            for g in range(a.shape[0]):
                mm(a[g], b[g], out=out[g])
            return
        extent = {"m": a.shape[0], "k": a.shape[1], "n": b.shape[1]}[jagged]
        for g, (s, e) in enumerate(group_bounds(offs, extent)):
            if jagged == "m":
                if e > s:
                    mm(a[s:e], b[g], out=out[s:e])
            elif jagged == "k":
                if e > s:
                    mm(a[:, s:e], b[s:e], out=out[g])
                else:
                    out[g].zero_()  # an empty sum (torch's mm over K = 0)
            elif e > s:
                out[:, s:e] = mm(a[g], b[:, s:e])  # a column block: not an out= torch takes in place


class GroupedLoopBackend(Backend):
    """One candidate for grouped problems of at most MAX_GROUPS groups, on torch tensors."""

    name = NAME
    device_kinds: ClassVar[frozenset[str]] = frozenset({"cpu", "cuda", "hip"})
    array_kinds: ClassVar[frozenset[str]] = frozenset({"torch"})
    ops: ClassVar[frozenset[str]] = frozenset({"grouped_gemm"})

    def availability(self) -> str | None:
        return None

    def versions(self) -> dict[str, str]:
        # Its kernels are torch's own dense ones: a torch upgrade re-checks its entries.
        try:
            return {"torch": metadata.version("torch")}
        except metadata.PackageNotFoundError:
            return {}

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        self._require(problem)
        if target.device.kind != "cpu" and problem.jagged != "none":
            return []  # offs on the host: a synchronisation per call, no CUDA graph
        return [LOOP] if problem.batch <= MAX_GROUPS else []

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> GroupedLoopRunner:
        self._require(problem)
        if candidate != LOOP:
            msg = f"{candidate.identity} is not a {NAME} candidate (it has one: {LOOP.identity})"
            raise UnsupportedProblem(msg, problem=problem, backend=NAME)
        return GroupedLoopRunner(problem.jagged)

    def _require(self, problem: Problem) -> None:
        if not problem.is_grouped:
            msg = f"{NAME} computes grouped GEMMs, not {problem.op}"
            raise UnsupportedProblem(msg, problem=problem, backend=NAME)
