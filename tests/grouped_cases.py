"""Operands of torch._grouped_mm's four forms, with chosen group sizes, for the grouped tests."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import torch

from unimatmul import Backend, Candidate, Problem, Target

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
TOL = {"bf16": 2e-2, "f16": 3e-3, "f32": 1e-5}


def offs_of(sizes: list[int]) -> torch.Tensor:
    ends, total = [], 0
    for size in sizes:
        total += size
        ends.append(total)
    return torch.tensor(ends, dtype=torch.int32)


def operands(
    jagged: str,
    sizes: list[int],
    dtype: str = "bf16",
    *,
    m: int = 24,
    n: int = 32,
    k: int = 48,
    extent: int | None = None,
    seed: int = 0,
) -> tuple[Any, Any, Any]:
    """(a, b, offs) of one form: ``sizes`` are the groups' sizes along the jagged
    dimension, whose total is ``extent`` (default: their sum)."""
    gen = torch.Generator().manual_seed(seed)
    dt = DTYPES[dtype]
    g = len(sizes)
    total = extent if extent is not None else sum(sizes)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dt)

    if jagged == "m":
        # b as the MoE weights are stored: w [G, N, K], passed transposed
        return rand(total, k), rand(g, n, k).transpose(-2, -1), offs_of(sizes)
    if jagged == "k":
        return rand(total, m).t(), rand(total, n), offs_of(sizes)  # the weight gradient: x.t() @ dy
    if jagged == "n":
        return rand(g, m, k), rand(k, total), offs_of(sizes)
    return rand(len(sizes), m, k), rand(len(sizes), k, n), None


def reference(jagged: str, a: Any, b: Any, offs: Any) -> torch.Tensor:
    """The float64 product of each group, laid out as torch._grouped_mm's output (rows or
    columns no group covers hold NaN: they are not compared)."""
    a64, b64 = a.double(), b.double()
    if jagged == "none":
        return a64 @ b64
    ends = [int(v) for v in offs.tolist()]
    starts = [0, *ends[:-1]]
    if jagged == "m":
        out = torch.full((a.shape[0], b.shape[-1]), float("nan"), dtype=torch.float64)
        for g, (s, e) in enumerate(zip(starts, ends, strict=True)):
            out[s:e] = a64[s:e] @ b64[g]
        return out
    if jagged == "k":
        return torch.stack([a64[:, s:e] @ b64[s:e] for s, e in zip(starts, ends, strict=True)])
    out = torch.full((a.shape[1], b.shape[1]), float("nan"), dtype=torch.float64)
    for g, (s, e) in enumerate(zip(starts, ends, strict=True)):
        out[:, s:e] = a64[g] @ b64[:, s:e]
    return out


def close(out: Any, ref: torch.Tensor, dtype: str) -> bool:
    """Every element a group covers within the dtype's tolerance of the reference."""
    covered = ~torch.isnan(ref)
    err = (out.double() - ref).abs()[covered]
    scale = ref.abs()[covered].max().clamp(min=1.0) if covered.any() else 1.0
    return bool(torch.isfinite(out.double()[covered]).all()) and bool((err <= TOL[dtype] * scale).all())


class GroupedFake(Backend):
    """Grouped products (2-D x 3-D) in float64, right or wrong on purpose: ``skips_empty``
    takes the weights of the groups after an empty one from the wrong expert;
    ``short_tiles`` leaves the last quarter of a group holding most rows unwritten."""

    device_kinds: ClassVar[frozenset[str]] = frozenset({"cpu"})
    array_kinds: ClassVar[frozenset[str]] = frozenset({"torch"})
    ops: ClassVar[frozenset[str]] = frozenset({"grouped_gemm"})

    def __init__(self, behaviour: str) -> None:
        self.name = f"fake-grouped-{behaviour}"
        self.behaviour = behaviour
        self.calls = 0
        self.lock = threading.Lock()

    def availability(self) -> str | None:
        return None

    def versions(self) -> dict[str, str]:
        return {}

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        return [Candidate.make(self.name, "kernel")]

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> Any:
        backend = self

        class Runner:
            def __init__(self) -> None:
                self.candidate = candidate

            def __call__(
                self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, offs: Any
            ) -> None:
                with backend.lock:
                    backend.calls += 1
                ends = [int(v) for v in offs.tolist()]
                start, used = 0, 0
                for g, end in enumerate(ends):
                    # skips_empty: packs the non-empty groups and takes the weights in that
                    # order, so every group after an empty one gets the wrong weight
                    w = used if backend.behaviour == "skips_empty" else g
                    used += end > start
                    stop = end
                    if backend.behaviour == "short_tiles":
                        stop = min(end, start + 3 * a.shape[0] // 4)  # a tile limit a full group passes
                    out[start:stop] = (a[start:stop].double() @ b[w].double()).to(out.dtype)
                    start = end

        return Runner()


def tie_record(problem: Problem, kernel: str, versions: dict[str, str]) -> Any:
    """A Default record whose ``kernel`` was measured a hair faster than Default: a tie
    (``confirm.tie_of``), which its confirmation window judges where it runs."""
    from unimatmul.cache.record import OK, CandidateResult, TuningRecord
    from unimatmul.core._backend import DEFAULT

    return TuningRecord(
        problem.key,
        DEFAULT.identity,
        2e-6,
        2e-6,
        results=[CandidateResult(DEFAULT.identity, OK, 2e-6, 5), CandidateResult(kernel, OK, 1.99e-6, 5)],
        versions=dict(versions),
    )


def check_window_turns(call: Any, fake: Any, made: list[Any], want: torch.Tensor) -> None:
    """Eight calls through a tie's window: each right, nothing lent after it, and on
    Default's turns (the fake kernel not called) the very output torch made (``made``:
    torch's outputs, in order), not a copy; both take turns."""
    from unimatmul.core.grouped import LENT

    defaults = 0
    for _ in range(8):
        kernel_calls, torch_calls = fake.calls, len(made)
        out = call()
        assert close(out, want, "bf16")
        assert LENT.out is None  # lent for the call only
        if fake.calls == kernel_calls:  # Default's turn
            assert len(made) == torch_calls + 1 and out is made[-1]
            defaults += 1
    assert defaults >= 3 and fake.calls >= 3  # both took turns
