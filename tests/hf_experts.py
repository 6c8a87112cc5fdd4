"""The experts of a transformers 5 MoE layer as its default ``experts_implementation``
(``"grouped_mm"``) runs them, rewritten without transformers: the routed rows sorted by
expert, ``offs`` from a histogram of the expert ids, and two grouped products, gate/up
fused in one weight and down, each ``grouped_mm(x, w.transpose(-2, -1), offs)`` for
weights stored ``[E, N, K]`` (gpt-oss: stored ``[E, K, N]``, passed as they are).

Only the layout of the operands matters to the tests (it decides the grouped door's
Problem); the gate is SiLU-and-multiply for every kind (gpt-oss's clamped GLU makes
operands of the same layout).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def top_k_routing(tokens: int, experts: int, top_k: int, seed: int = 0) -> torch.Tensor:
    """``top_k_index [tokens, top_k]``: each token's top-k experts of random router logits."""
    gen = torch.Generator().manual_seed(seed)
    return torch.topk(torch.randn(tokens, experts, generator=gen), top_k, dim=-1).indices


def experts_forward(
    x: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    top_k_index: torch.Tensor,
    *,
    is_transposed: bool = False,
    grouped_mm: Callable[..., Any] = torch._grouped_mm,
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """(the experts' output per routed row, the (a, b, offs) of each grouped product)."""
    tokens, top_k = top_k_index.shape
    experts = gate_up_proj.shape[0]
    token_idx = torch.arange(tokens).unsqueeze(1).expand(-1, top_k).reshape(-1)
    expert_ids = top_k_index.reshape(-1)
    perm = torch.argsort(expert_ids)
    rows = x[token_idx][perm]
    counts = torch.histc(expert_ids[perm].float(), bins=experts, min=0, max=experts - 1)
    offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
    calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def linear(a: torch.Tensor, w: torch.Tensor) -> Any:
        a, b = a.to(w.dtype), w if is_transposed else w.transpose(-2, -1)
        calls.append((a, b, offs))
        return grouped_mm(a, b, offs)

    gate_up = linear(rows, gate_up_proj)
    gate, up = (gate_up[..., ::2], gate_up[..., 1::2]) if is_transposed else gate_up.chunk(2, dim=-1)
    out = linear(torch.nn.functional.silu(gate) * up, down_proj)
    return out, calls
