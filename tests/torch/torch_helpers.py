"""Helpers for the torch routing tests: a small transformer built from torch.nn modules,
an MoE experts block, and tuning that prefers a kernel."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from unimatmul.backend import Target
from unimatmul.cache.record import TuningRecord
from unimatmul.core.problem import Problem
from unimatmul.testing import prefer_kernel
from unimatmul.tuning.harness import HarnessConfig
from unimatmul.tuning.selector import Selector

FAST = HarnessConfig(warmup=1, min_samples=3, max_samples=10, budget_s=0.01, settle_s=0.0, max_sets=2)


@dataclass
class Env:
    selector: Selector
    cache: Path
    record: Path


def onednn_available(selector: Selector) -> bool:
    from unimatmul.core.arrays import CPU, adapter_for_kind

    target = Target(adapter_for_kind("torch"), CPU)
    return any(b.name == "onednn" for b in selector.backends_for(target))


def tune_preferring_kernels(
    selector: Selector, problems: list[tuple[Problem, Target]], backend: str | None = None
) -> list[TuningRecord]:
    """Tune each problem for real; where Default (or, with ``backend``, another backend's
    kernel) won, store its fastest checked kernel (of ``backend``) instead
    (``unimatmul.testing.prefer_kernel``): the routing tests must see backend kernels run,
    whichever wins on this machine."""
    return [prefer_kernel(selector, problem, target, backend) for problem, target in problems]


class Block(torch.nn.Module):
    """A pre-norm decoder block: fused QKV, attention by matmul, GELU MLP (4 Linears, 2 bmm)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.up = torch.nn.Linear(dim, 4 * dim)
        self.down = torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d // h)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


class TinyTransformer(torch.nn.Module):
    LINEARS_PER_BLOCK = 4
    BMM_PER_BLOCK = 2

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab)
        self.layers = layers

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    @property
    def linears(self) -> int:
        return self.layers * self.LINEARS_PER_BLOCK + 1


class Experts(torch.nn.Module):
    """Experts as Hugging Face's ``grouped_mm`` implementation runs them: tokens sorted by
    expert, ``offs`` the running count, gate/up and down as two grouped products."""

    def __init__(self, experts: int, hidden: int, inter: int, top_k: int) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.top_k = top_k
        self.router = torch.nn.Linear(hidden, experts, bias=False)
        self.gate_up = torch.nn.Parameter(torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.1)
        self.down = torch.nn.Parameter(torch.randn(experts, hidden, inter, generator=gen) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, chosen = torch.topk(self.router(x).softmax(-1), self.top_k, dim=-1)
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        tokens = order // self.top_k
        offs = torch.bincount(flat, minlength=self.gate_up.shape[0]).cumsum(0).to(torch.int32)
        h = torch._grouped_mm(x[tokens], self.gate_up.transpose(-2, -1), offs)
        gate, up = h.chunk(2, dim=-1)
        y = torch._grouped_mm(torch.nn.functional.silu(gate) * up, self.down.transpose(-2, -1), offs)
        out = torch.zeros_like(x)
        out.index_add_(0, tokens, y * weights.reshape(-1)[order, None])
        return out
