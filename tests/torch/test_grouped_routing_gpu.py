"""Routed ``torch._grouped_mm`` on a CUDA GPU: a Triton grouped kernel's launch made by the
native GROUPED table, right for every offs of its key (empty groups, one group holding
all rows, a skewed split), eagerly and in a CUDA graph replayed with new values.

Skipped without a GPU, or where the Triton plugin is not installed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("needs a CUDA or ROCm GPU", allow_module_level=True)
pytest.importorskip("unimatmul_triton")

from torch_helpers import Env  # noqa: E402

import unimatmul  # noqa: E402
import unimatmul.torch as ut  # noqa: E402
from unimatmul.cache.record import OK, PRUNED  # noqa: E402
from unimatmul.torch import grouped_routing, native  # noqa: E402

pytestmark = pytest.mark.gpu

# (total rows, experts, N, K): decode (a few rows an expert) and a prefill-like bucket.
SHAPES = [(8, 8, 512, 256), (192, 16, 384, 256)]


@pytest.fixture
def gpu_env(env: Env) -> Env:
    env.selector.settings = None  # the GPU harness settings (CUDA events, GPU budgets)
    env.selector.confirm_calls = 0  # the chosen kernel's entry at once, no window
    return env


def _offs(sizes: list[int]) -> torch.Tensor:
    return torch.tensor(sizes, dtype=torch.int32, device="cuda").cumsum(0, dtype=torch.int32)


def _splits(rows: int, groups: int) -> list[list[int]]:
    """Skewed with empty groups, all rows in one group, and an even split."""
    skewed = [0] * groups
    skewed[1], skewed[-1] = rows - rows // 3, rows // 3
    one = [0] * groups
    one[groups // 2] = rows
    even = [rows // groups + (g < rows % groups) for g in range(groups)]
    return [skewed, one, even]


def _reference(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    a64, b64 = a.double().cpu(), b.double().cpu()
    out = torch.empty(a.shape[0], b.shape[-1], dtype=torch.float64)
    start = 0
    for g, end in enumerate(offs.tolist()):
        out[start:end] = a64[start:end] @ b64[g]
        start = end
    return out


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    got = got.double().cpu()
    return bool(torch.isfinite(got).all()) and float((got - want).abs().max()) <= 2e-2 * float(
        want.abs().max()
    )


def _poison(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    """Leave NaNs where the next output of this size is likely to be allocated (the caching
    allocator hands the freed block back): rows a kernel skips stay NaN."""
    torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def _force_triton(env: Env, plan: Any) -> str:
    """Store the record of ``plan``'s problem with its fastest checked Triton grouped kernel
    as the winner (whichever won on this machine); that kernel's identity."""
    selector = env.selector
    namespace = selector.platform(plan.target).namespace
    record = selector.store.get(namespace, plan.problem.key)
    assert record is not None
    kernels = [
        r for r in record.results if r.status in (OK, PRUNED) and r.identity.startswith("triton_grouped/")
    ]
    if not kernels:
        pytest.skip(f"no Triton grouped kernel passed the check of {plan.problem.key}")
    best = min(kernels, key=lambda r: r.median_s or float("inf")).identity
    selector.store.put(namespace, plan.problem.key, replace(record, winner=best, settings={}))
    ut.clear_plans()
    return best


@pytest.mark.parametrize("env", ["native"], indirect=True)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_a_triton_grouped_choice_is_launched_natively_and_right(gpu_env: Env, shape: tuple[int, ...]) -> None:
    rows, groups, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(rows)
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=gen)
    # [G, K, N] as a transposed view of [G, N, K] weights, as transformers keeps them
    b = torch.randn(groups, n, k, device="cuda", dtype=torch.bfloat16, generator=gen).transpose(-2, -1)
    splits = [_offs(s) for s in _splits(rows, groups)]
    ut.enable()
    assert native.has_lt() and grouped_routing._router.native_keys
    with unimatmul.mode("tune"):
        torch._grouped_mm(a, b, splits[0])
    (plan,) = [p for p in grouped_routing.plans() if p.problem is not None]
    best = _force_triton(gpu_env, plan)
    torch._grouped_mm(a, b, splits[0])  # the plan, and its entry in the native table
    (plan,) = grouped_routing.plans()
    assert plan.label.endswith(f"[{best}]") and plan.native == native.LAUNCH, (
        plan.label,
        plan.native,
        plan.reason,
    )
    before = native.counts(table=native.GROUPED).get(plan.ident, 0)
    for offs in splits:
        a.copy_(torch.randn(a.shape, device="cuda", dtype=a.dtype, generator=gen))
        _poison((rows, n), a.dtype)
        got = torch._grouped_mm(a, b, offs)
        assert _close(got, _reference(a, b, offs)), (best, offs.tolist())
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
    for sizes in _splits(rows, groups)[::-1]:
        a.copy_(torch.randn(a.shape, device="cuda", dtype=a.dtype, generator=gen))
        offs.copy_(_offs(sizes))
        captured.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert _close(captured, _reference(a, b, offs)), (best, sizes)
    assert grouped_routing.plans()[0].runner is not None
