"""A fake backend of scaled (fp8) GEMMs on CPU torch tensors, correct or broken on request.

It dequantises in float64 and writes the caller's output, like a real kernel would
(its runner takes the scales last, as every scaled runner does). ``first_scale``
applies each operand's first scale to the whole matrix (right for per-tensor scales,
wrong for row-wise ones: the numeric check must reject it); ``raise_run`` fails on
every call (the fallback must take over). ``offers``: the NativeCall its runners offer
torch routing's native table (None: none), which the native table may take or refuse.
"""

from __future__ import annotations

import threading
from typing import Any

from unimatmul import Backend, Candidate, Problem, Target, UnsupportedProblem

BEHAVIOURS = ("correct", "first_scale", "raise_run")


class ScaledFakeRunner:
    def __init__(self, backend: ScaledFakeBackend, candidate: Candidate) -> None:
        self.backend = backend
        self.candidate = candidate

    def __call__(
        self,
        a: Any,
        b: Any,
        out: Any,
        alpha: float = 1.0,
        beta: float = 0.0,
        bias: Any = None,
        scale_a: Any = None,
        scale_b: Any = None,
    ) -> None:
        import torch

        with self.backend.lock:
            self.backend.calls += 1
        behaviour = self.backend.behaviour
        if behaviour == "raise_run":
            msg = f"{self.candidate.identity} crashed on purpose"
            raise RuntimeError(msg)
        if behaviour == "first_scale":
            scale_a, scale_b = scale_a.reshape(-1)[:1], scale_b.reshape(-1)[:1]
        f64 = torch.float64
        # The out= form: PyTorch's own kernel even while routing is on (a kernel must not
        # call routed ops, or tuning would recurse into them).
        result = torch.empty(out.shape, dtype=f64)
        torch.mm(a.to(f64) * scale_a.to(f64), b.to(f64) * scale_b.to(f64), out=result)
        if bias is not None:
            result = result + bias.to(f64)
        out.copy_(alpha * result)

    def native_call(self) -> Any:
        return self.backend.offers


class ScaledFakeBackend(Backend):
    """Scaled GEMMs (any fp8 torch CPU holds, any layout) on torch CPU tensors; nothing else."""

    device_kinds = frozenset({"cpu"})
    array_kinds = frozenset({"torch"})

    def __init__(self, name: str = "fake-scaled", behaviour: str = "correct", offers: Any = None) -> None:
        if behaviour not in BEHAVIOURS:
            msg = f"unknown behaviour {behaviour!r}; valid: {BEHAVIOURS}"
            raise ValueError(msg)
        self.name = name  # type: ignore[misc]
        self.behaviour = behaviour
        self.offers = offers
        self.calls = 0
        self.lock = threading.Lock()

    def availability(self) -> str | None:
        return None

    def versions(self) -> dict[str, str]:
        return {self.name: "1.0"}

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        if not problem.is_scaled:
            raise UnsupportedProblem(
                f"{self.name} runs scaled GEMMs only", problem=problem, backend=self.name
            )
        return [Candidate.make(self.name, "dequantise")]

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> ScaledFakeRunner:
        if candidate not in self.candidates(problem, target):
            raise UnsupportedProblem(f"{self.name} has no kernel {candidate.identity}", problem=problem)
        return ScaledFakeRunner(self, candidate)
