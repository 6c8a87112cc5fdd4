"""Does a grouped kernel round as torch's own does? Bitwise agreement with ``torch._grouped_mm``.

    python benchmarks/grouped_bitwise.py --out DIR [--config qwen3-30b-a3b] [--tokens 512]

For the gate/up and down expert products of a MoE config (``moe_bench.py``'s: N, K and the
expert count from its config.json) at a token count, routed uniformly and by a Zipf law,
runs ``torch._grouped_mm`` and every candidate the Triton grouped backend offers for the
bucket, each on the same bf16 inputs, and reports for each candidate the share of output
elements equal bit for bit to torch's, the largest difference relative to the output's
largest magnitude, and the error of both against the float64 product. A Hugging Face check
that finds a routed model's logits equal to routing off's (relative error 0.0) can then be
read: a kernel that rounds as torch's does leaves them equal. Writes ``grouped-bitwise.json``
under ``--out`` and prints a table. On a machine without a CUDA GPU it runs on the CPU,
the candidates in Triton's interpreter (slow: a few tokens only), which checks the script,
not the GPU's rounding.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # moe_bench, beside this file
from moe_bench import CONFIGS, ROUTINGS, config_named, counts_of, expert_weights, offs_of, operands_of

from unimatmul.backend import Device, Target, adapter_for_kind
from unimatmul.core.grouped import grouped_problem_of


def _backend() -> Any:
    from unimatmul_triton import make_backend, make_grouped_backend

    found = make_grouped_backend(make_backend())
    why = found.availability()
    if why is not None:
        raise SystemExit(f"triton grouped backend unavailable: {why}")
    return found


def compare(name: str, weight: Any, counts: list[int], backend: Any, device: str) -> list[dict]:
    """Every candidate of ``backend`` for one expert weight's product with groups of
    ``counts`` rows, against ``torch._grouped_mm`` and the float64 product."""
    a, b = operands_of(torch, weight, counts)
    offs = offs_of(torch, counts, device)
    want = torch._grouped_mm(a, b, offs=offs)
    exact = torch.empty(a.shape[0], b.shape[-1], dtype=torch.float64, device=device)
    start = 0
    for g, rows in enumerate(counts):  # the groups' bounds from the host's counts
        if rows:
            exact[start : start + rows] = a[start : start + rows].double() @ b[g].double()
        start += rows
    scale = float(exact.abs().max())
    target = Target(adapter_for_kind("torch"), Device(device, 0))
    problem = grouped_problem_of(target.adapter, a, b, offs)
    found = []
    torch_error = float((want.double() - exact).abs().max()) / scale
    for candidate in backend.candidates(problem, target):
        runner = backend.prepare(problem, candidate, target)
        out = torch.full_like(want, float("nan"))
        runner(a, b, out, 1.0, 0.0, None, offs)
        same = float((out.view(torch.int16) == want.view(torch.int16)).double().mean())
        found.append(
            {
                "product": name,
                "candidate": candidate.identity,
                "bitwise_equal": round(same, 6),
                "max_diff_vs_torch": float((out.double() - want.double()).abs().max()) / scale,
                "max_error": float((out.double() - exact).abs().max()) / scale,
                "torch_max_error": torch_error,
            }
        )
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="qwen3-30b-a3b", choices=[c[0] for c in CONFIGS])
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ.setdefault("UNIMATMUL_TRITON_INTERPRET", "1")
    _, experts, hidden, inter, top, _ = config_named(args.config)
    weights = expert_weights(torch, device, experts, hidden, inter)
    backend = _backend()
    rows: list[dict] = []
    for name, weight in weights.items():
        for routing in ROUTINGS:
            counts = counts_of(args.tokens, experts, top, routing, seed=args.tokens)
            for row in compare(f"{args.config} {name}", weight, counts, backend, device):
                rows.append({**row, "tokens": args.tokens, "routing": routing})
    args.out.mkdir(parents=True, exist_ok=True)
    what = {
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "none (CPU, interpreter)",
        "torch": torch.__version__,
        "rows": rows,
    }
    (args.out / "grouped-bitwise.json").write_text(json.dumps(what, indent=1) + "\n")
    print(f"{what['gpu']}, torch {what['torch']}")
    print(
        "| product | tokens | routing | candidate | bitwise equal | max diff vs torch | max error | torch's |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['product']} | {r['tokens']} | {r['routing']} | {r['candidate']} | {r['bitwise_equal']:.4f} "
            f"| {r['max_diff_vs_torch']:.2e} | {r['max_error']:.2e} | {r['torch_max_error']:.2e} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
