"""Helpers for the torch routing tests: a small transformer built from torch.nn modules,
and tuning that prefers a kernel."""

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
