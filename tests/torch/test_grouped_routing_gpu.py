"""Routed ``torch._grouped_mm`` on a CUDA GPU: a Triton grouped kernel's launch made by the
native GROUPED table, right for every offs of its key (empty groups, one group holding
all rows, a skewed split), eagerly and in a CUDA graph replayed with new values: the MoE
forward (offs over a's rows) and the weight gradient (offs over K).

Skipped without a GPU, or where the Triton plugin is not installed.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("needs a CUDA or ROCm GPU", allow_module_level=True)
pytest.importorskip("unimatmul_triton")

from grouped_cases import close, reference  # noqa: E402
from torch_helpers import Env  # noqa: E402

import unimatmul.torch as ut  # noqa: E402
from unimatmul.testing import prefer_kernel  # noqa: E402
from unimatmul.torch import grouped_routing, native  # noqa: E402

pytestmark = pytest.mark.gpu

# (form, jagged total, groups, N, K or M): the MoE forward at decode (a few rows an expert)
# and at a prefill-like bucket; the weight gradient (offs over K: the k form).
CASES = [("m", 8, 8, 512, 256), ("m", 192, 16, 384, 256), ("k", 192, 8, 256, 128)]


@pytest.fixture
def gpu_env(env: Env, monkeypatch: pytest.MonkeyPatch) -> Env:
    env.selector.settings = None  # the GPU harness settings (CUDA events, GPU budgets)
    env.selector.confirm_calls = 0  # the chosen kernel's entry at once, no window
    monkeypatch.setenv("UNIMATMUL_TRITON_GROUPED_NATIVE", "1")  # the launch these tests check
    return env


def _offs(sizes: list[int]) -> torch.Tensor:
    return torch.tensor(sizes, dtype=torch.int32, device="cuda").cumsum(0, dtype=torch.int32)


def _splits(total: int, groups: int) -> list[list[int]]:
    """Skewed with empty groups, all in one group, and an even split."""
    skewed = [0] * groups
    skewed[1], skewed[-1] = total - total // 3, total // 3
    one = [0] * groups
    one[groups // 2] = total
    even = [total // groups + (g < total % groups) for g in range(groups)]
    return [skewed, one, even]


def _operands(form: str, total: int, groups: int, n: int, other: int, gen: Any) -> tuple[torch.Tensor, ...]:
    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)

    if form == "m":
        # [G, K, N] as a transposed view of [G, N, K] weights, as transformers keeps them
        return rand(total, other), rand(groups, n, other).transpose(-2, -1)
    return rand(total, other).t(), rand(total, n)  # the weight gradient: a^T @ grad, offs over K


def _poison(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Leave NaNs where the next output of this size is likely to be allocated (the caching
    allocator hands the freed block back): what a kernel leaves unwritten stays NaN."""
    torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def _force_triton(env: Env, plan: Any) -> str:
    """Tune ``plan``'s problem and store its fastest checked Triton grouped kernel as the
    winner (whichever won on this machine); that kernel's identity."""
    record = prefer_kernel(env.selector, plan.problem, plan.target, "triton_grouped")
    if not record.winner.startswith("triton_grouped/"):
        pytest.skip(f"no Triton grouped kernel passed the check of {plan.problem.key}")
    ut.clear_plans()
    return record.winner


def _right(form: str, got: torch.Tensor, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> bool:
    """``got`` against the float64 product of each group (``grouped_cases``)."""
    return close(got.cpu(), reference(form, a.cpu(), b.cpu(), offs.cpu()), "bf16")


@pytest.mark.parametrize("env", ["native"], indirect=True)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_a_triton_grouped_choice_is_launched_natively_and_right(gpu_env: Env, case: tuple[Any, ...]) -> None:
    form, total, groups, n, other = case
    gen = torch.Generator(device="cuda").manual_seed(total)
    a, b = _operands(form, total, groups, n, other, gen)
    splits = [_offs(s) for s in _splits(total, groups)]
    ut.enable()
    assert native.has_lt() and grouped_routing._router.native_keys
    want_shape = torch._grouped_mm(a, b, splits[0]).shape  # a plan: the problem to tune
    (plan,) = [p for p in grouped_routing.plans() if p.problem is not None]
    best = _force_triton(gpu_env, plan)
    torch._grouped_mm(a, b, splits[0])  # the plan, and its entry in the native table
    (plan,) = grouped_routing.plans()
    assert plan.label.endswith(f"[{best}]"), plan.label
    assert plan.native == native.LAUNCH, (plan.native, plan.reason)
    before = native.counts(table=native.GROUPED).get(plan.ident, 0)
    for offs in splits:
        a.copy_(torch.randn(a.shape, device="cuda", dtype=a.dtype, generator=gen))
        _poison(tuple(want_shape), a.dtype)
        got = torch._grouped_mm(a, b, offs)
        assert _right(form, got, a, b, offs), (best, offs.tolist())
    assert native.counts(table=native.GROUPED)[plan.ident] - before == len(splits)

    # Captured in a graph, replayed with new values in a and in offs.
    offs = splits[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch._grouped_mm(a, b, offs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = torch._grouped_mm(a, b, offs)
    for sizes in _splits(total, groups)[::-1]:
        a.copy_(torch.randn(a.shape, device="cuda", dtype=a.dtype, generator=gen))
        offs.copy_(_offs(sizes))
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert _right(form, captured, a, b, offs), (best, sizes)
