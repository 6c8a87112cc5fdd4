"""Fake backends for the meta-tests: one correct, the others each broken in one way.

They compute with NumPy in float64 and write into the caller's output, like a real
CPU backend; each broken one differs from the correct one by the single fault its
name says, so that a meta-test can check that the suite finds exactly that fault.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import numpy as np

from unimatmul.backend import Backend, Candidate, Target
from unimatmul.core.errors import UnsupportedProblem
from unimatmul.core.problem import Problem

_DTYPES = ("f32", "f64")
_EPILOGUES = ("none", "bias", "relu", "bias_relu")

# Differs in every process: what an identity built from a pointer, a counter or a
# random seed looks like.
PROCESS_TOKEN = secrets.token_hex(4)


def product(problem: Problem, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> np.ndarray:
    """``act(alpha * a @ b + beta * out + bias)`` in float64."""
    # einsum without optimize stays out of BLAS: several threads calling a threaded
    # BLAS at once contend in its pool and make the thread checks slow.
    result = alpha * np.einsum(
        "...ik,...kj->...ij", np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    )
    if beta != 0.0:
        result += beta * np.asarray(out, dtype=np.float64)
    if bias is not None:
        result += np.asarray(bias, dtype=np.float64)
    if problem.activation == "relu":
        result = np.maximum(result, 0.0)
    return result


class FakeRunner:
    def __init__(self, problem: Problem, candidate: Candidate) -> None:
        self.problem = problem
        self.candidate = candidate

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        out[...] = product(self.problem, a, b, out, alpha, beta, bias)


class GoodBackend(Backend):
    """Correct: f32 and f64, epilogues none/bias/relu/bias_relu, any layout, two kernels."""

    name = "fake-good"
    device_kinds = frozenset({"cpu"})
    array_kinds = frozenset({"numpy"})
    runner_class: type[FakeRunner] = FakeRunner

    def kernel_names(self) -> list[str]:
        return ["plain", "again"]

    def availability(self) -> str | None:
        return None

    def versions(self) -> dict[str, str]:
        return {"fake": "1.0", "numpy": np.__version__}

    def supported(self, problem: Problem) -> None:
        if {problem.dtype_a, problem.dtype_b, problem.dtype_c} - set(
            _DTYPES
        ) or problem.epilogue not in _EPILOGUES:
            msg = f"{self.name} runs f32/f64 with epilogues {_EPILOGUES}, not {problem.key}"
            raise UnsupportedProblem(msg, problem=problem, backend=self.name)

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        self.supported(problem)
        return [Candidate.make(self.name, name) for name in self.kernel_names()]

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> FakeRunner:
        if candidate.backend != self.name or candidate.name not in self.kernel_names():
            msg = f"{self.name} has no kernel {candidate.identity}"
            raise UnsupportedProblem(msg, problem=problem, backend=self.name)
        self.supported(problem)
        return self.runner_class(problem, candidate)


# --- one fault each ------------------------------------------------------------------


class OutOfBoundsRunner(FakeRunner):
    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        result = product(self.problem, a, b, out, alpha, beta, bias)
        # One element past the end of every row: the padding when ldc > n, the next
        # row's first element otherwise (rewritten below), past the matrix at the end.
        wide = np.lib.stride_tricks.as_strided(
            out, shape=(*out.shape[:-1], out.shape[-1] + 1), strides=out.strides
        )
        wide[..., -1] = 0.0
        out[...] = result


class WritesOutOfBounds(GoodBackend):
    name = "fake-out-of-bounds"
    runner_class = OutOfBoundsRunner


class WrongRunner(FakeRunner):
    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        # Forgets the last term of the reduction (an off-by-one in a k loop).
        k = self.problem.k
        out[...] = product(self.problem, a[..., :, : k - 1], b[..., : k - 1, :], out, alpha, beta, bias)


class WrongResults(GoodBackend):
    name = "fake-wrong"
    runner_class = WrongRunner


class OneWrongElementRunner(FakeRunner):
    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        result = product(self.problem, a, b, out, alpha, beta, bias)
        result[..., -1, -1] += 0.05  # one element a little off: lost in a large matrix's norm
        out[...] = result


class OneWrongElement(GoodBackend):
    name = "fake-one-wrong-element"
    runner_class = OneWrongElementRunner


class UnwrittenRunner(FakeRunner):
    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        result = product(self.problem, a, b, out, alpha, beta, bias)
        # Every element but the very last (a remainder loop that stops one short).
        out[..., :-1, :] = result[..., :-1, :]
        out[..., -1, :-1] = result[..., -1, :-1]


class LeavesElementsUnwritten(GoodBackend):
    name = "fake-unwritten"
    runner_class = UnwrittenRunner


class UnstableIdentities(GoodBackend):
    name = "fake-unstable"

    def kernel_names(self) -> list[str]:
        return [f"plain-{PROCESS_TOKEN}"]


class CrashesOnUnsupported(GoodBackend):
    """Raises whatever Python raises (KeyError) instead of UnsupportedProblem."""

    name = "fake-crashes"
    _ITEMSIZE = {"f32": 4, "f64": 8}

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        _ = self._ITEMSIZE[problem.dtype_a], self._ITEMSIZE[problem.dtype_c]
        return super().candidates(problem, target)

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> FakeRunner:
        kernels = {name: name for name in self.kernel_names()}
        _ = kernels[candidate.name]
        return super().prepare(problem, candidate, target)


class SharedScratchRunner(FakeRunner):
    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        # A workspace shared by every call: fine from one thread, wrong from several.
        self.scratch = product(self.problem, a, b, out, alpha, beta, bias)
        time.sleep(0.002)  # the rest of the "kernel"; another thread gets the GIL
        out[...] = self.scratch


class NotThreadSafe(GoodBackend):
    name = "fake-not-thread-safe"
    runner_class = SharedScratchRunner


class BadIdentity(GoodBackend):
    """A parameter value with the identity's own separators in it: it cannot round-trip."""

    name = "fake-bad-identity"

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        self.supported(problem)
        return [Candidate.make(self.name, "plain", tile="4&x=y")]

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> FakeRunner:
        if candidate.backend != self.name or candidate.name != "plain":
            raise UnsupportedProblem(f"no kernel {candidate.identity}", problem=problem)
        self.supported(problem)
        return FakeRunner(problem, candidate)


class IncompletePlatform(GoodBackend):
    name = "fake-no-versions"

    def versions(self) -> dict[str, str]:
        return {"fake": ""}


class InputWritingRunner(FakeRunner):
    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        out[...] = product(self.problem, a, b, out, alpha, beta, bias)
        a[..., 0, 0] = 0.0  # scribbles on an input after computing


class WritesItsInput(GoodBackend):
    name = "fake-writes-input"
    runner_class = InputWritingRunner


class RefusesWhatItOffers(GoodBackend):
    """Offers kernels, then says "unsupported" when asked to prepare them."""

    name = "fake-refuses"

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> FakeRunner:
        msg = f"{self.name} cannot build {candidate.identity} after all"
        raise UnsupportedProblem(msg, problem=problem, backend=self.name)


# --- cheap fakes for the command line's exit codes ---------------------------------


class SupportsNothing(GoodBackend):
    """Answers "unsupported" to every problem: a run has nothing to execute, so it is quick."""

    name = "fake-nothing"

    def supported(self, problem: Problem) -> None:
        msg = f"{self.name} runs nothing"
        raise UnsupportedProblem(msg, problem=problem, backend=self.name)


class SupportsNothingNoVersions(SupportsNothing):
    name = "fake-nothing-no-versions"

    def versions(self) -> dict[str, str]:
        return {}


class Missing(GoodBackend):
    name = "fake-missing"

    def availability(self) -> str | None:
        return "libfake.so not found"


# --- GPU fakes (torch tensors on CUDA or ROCm) ---------------------------------------


class TorchRunner:
    """torch's own product on the caller's stream: what the Default runner does."""

    def __init__(self, problem: Problem, candidate: Candidate, target: Target) -> None:
        self.problem = problem
        self.candidate = candidate
        self.adapter = target.adapter

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        self.adapter.matmul(a, b, out, alpha, beta, bias, self.problem.activation)


class TorchGpuGood(Backend):
    """Correct on a GPU: same-dtype f32/f16/bf16/f64, every epilogue, every layout."""

    name = "fake-torch-gpu"
    device_kinds = frozenset({"cuda", "hip"})
    array_kinds = frozenset({"torch"})
    runner_class: type[TorchRunner] = TorchRunner

    def availability(self) -> str | None:
        import torch

        return None if torch.cuda.is_available() else "torch sees no GPU"

    def versions(self) -> dict[str, str]:
        import torch

        return {"torch": str(torch.__version__)}

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        dtypes = {problem.dtype_a, problem.dtype_b, problem.dtype_c}
        if len(dtypes) != 1 or problem.dtype_a not in ("f32", "f16", "bf16", "f64"):
            msg = f"{self.name} runs one dtype in and out, not {problem.key}"
            raise UnsupportedProblem(msg, problem=problem, backend=self.name)
        if problem.compute != ("f64" if problem.dtype_a == "f64" else "f32"):
            raise UnsupportedProblem(f"compute {problem.compute} is not offered", problem=problem)
        return [Candidate.make(self.name, "torch")]

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> TorchRunner:
        if candidate != Candidate.make(self.name, "torch"):
            raise UnsupportedProblem(f"no kernel {candidate.identity}", problem=problem)
        self.candidates(problem, target)
        return self.runner_class(problem, candidate, target)


class OwnStreamRunner(TorchRunner):
    def __init__(self, problem: Problem, candidate: Candidate, target: Target) -> None:
        import torch

        super().__init__(problem, candidate, target)
        self.torch = torch
        # PyTorch hands out its streams round-robin from a pool of 32: two, so that one of
        # them is never the caller's (a graph capture's side stream may be either).
        self.streams = (torch.cuda.Stream(), torch.cuda.Stream())

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        # Ignores the caller's stream: a graph cannot capture it, and it races the caller.
        current = self.torch.cuda.current_stream()
        own = self.streams[0] if self.streams[0] != current else self.streams[1]
        with self.torch.cuda.stream(own):
            super().__call__(a, b, out, alpha, beta, bias)


class RunsOnItsOwnStream(TorchGpuGood):
    name = "fake-torch-own-stream"
    runner_class = OwnStreamRunner


class SyncingRunner(TorchRunner):
    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        import torch

        super().__call__(a, b, out, alpha, beta, bias)
        torch.cuda.synchronize()  # waits for the device on every call: no graph, no overlap


class SynchronisesTheHost(TorchGpuGood):
    name = "fake-torch-syncs"
    runner_class = SyncingRunner


# --- scaled (fp8) fakes: torch tensors on the CPU -----------------------------------


class ScaledRunner:
    """``(scale_a * a) @ (scale_b * b) + bias`` in float64, written into the caller's output."""

    def __init__(self, problem: Problem, candidate: Candidate) -> None:
        self.problem = problem
        self.candidate = candidate

    def dequantised(self, a: Any, b: Any, scale_a: Any, scale_b: Any) -> tuple[Any, Any]:
        import torch

        from unimatmul.core.scales import expanded_scale

        f64 = torch.float64
        return (
            a.to(f64) * expanded_scale(scale_a.to(f64), a.shape),
            b.to(f64) * expanded_scale(scale_b.to(f64), b.shape),
        )

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

        da, db = self.dequantised(a, b, scale_a, scale_b)
        result = alpha * (da @ db)
        if bias is not None:
            result = result + bias.to(torch.float64)
        out.copy_(result)


class ScaledGood(Backend):
    """Correct: scaled GEMMs only (fp8 OCP inputs, per-tensor, row-wise or block scales), any layout, on torch CPU."""

    name = "fake-scaled"
    device_kinds = frozenset({"cpu"})
    array_kinds = frozenset({"torch"})
    runner_class: type[ScaledRunner] = ScaledRunner

    def availability(self) -> str | None:
        return None

    def versions(self) -> dict[str, str]:
        import torch

        return {"fake": "1.0", "torch": str(torch.__version__)}

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        if not problem.is_scaled or "fnuz" in problem.dtype_a + problem.dtype_b:
            msg = f"{self.name} runs scaled GEMMs of OCP fp8, not {problem.key}"
            raise UnsupportedProblem(msg, problem=problem, backend=self.name)
        return [Candidate.make(self.name, "dequantise")]

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> ScaledRunner:
        if candidate not in self.candidates(problem, target):
            raise UnsupportedProblem(f"no kernel {candidate.identity}", problem=problem, backend=self.name)
        return self.runner_class(problem, candidate)


class FirstRowScaleRunner(ScaledRunner):
    def dequantised(self, a: Any, b: Any, scale_a: Any, scale_b: Any) -> tuple[Any, Any]:
        # Treats row-wise and block scales as one scale per tensor: its first element for all.
        return super().dequantised(a, b, scale_a.reshape(-1)[:1], scale_b.reshape(-1)[:1])


class IgnoresRowWiseScales(ScaledGood):
    name = "fake-scaled-first-scale"
    runner_class = FirstRowScaleRunner
