"""How much faster are mixture-of-experts grouped GEMMs under unimatmul than torch._grouped_mm?

One command (on a CUDA GPU):

    python benchmarks/moe_bench.py --out benchmarks/results/moe-h200

The experts of four real MoE configurations (N, K and the expert count from their
config.json: gate/up and down), total tokens 1, 16, 128, 1024 and 8192 routed to top-k
experts, uniform and skewed (Zipf) routing. Each product is tuned through
``unimatmul.grouped_matmul`` in tune mode (first-time and warm tuning wall time recorded),
checked against the float64 product of every group, then timed by ``paired_timing``: each
side one CUDA graph of back-to-back calls over input sets (activations and copies of the
expert weights) that touch more than 3.2x L2, the two graphs replayed in alternating rounds
(A B, B A, ...), the speedup the median of the rounds' own ratios. Writes
``moe-bench.json``, ``moe-summary.md`` and ``moe-speedup.png``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import paired_timing

# name, experts, hidden, expert intermediate, top-k, source
CONFIGS = (
    ("mixtral-8x7b", 8, 4096, 14336, 2, "mistralai/Mixtral-8x7B-v0.1"),
    ("qwen3-30b-a3b", 128, 2048, 768, 8, "Qwen/Qwen3-30B-A3B"),
    ("deepseek-v2-lite", 64, 2048, 1408, 6, "deepseek-ai/DeepSeek-V2-Lite"),
    ("gpt-oss-20b", 32, 2880, 2880, 4, "openai/gpt-oss-20b"),
)
TOKENS = (1, 16, 128, 1024, 8192)
ROUTINGS = ("uniform", "skewed")


def counts_of(tokens: int, experts: int, top_k: int, routing: str, seed: int) -> list[int]:
    """Rows per expert: each token picks ``top_k`` distinct experts, uniformly or by a
    Zipf law (expert i drawn with weight 1 / (i + 1))."""
    import numpy as np

    rng = np.random.default_rng(seed)
    weights = np.ones(experts) if routing == "uniform" else 1.0 / np.arange(1, experts + 1)
    weights = weights / weights.sum()
    counts = np.zeros(experts, dtype=np.int64)
    for _ in range(tokens):
        counts[rng.choice(experts, size=top_k, replace=False, p=weights)] += 1
    return [int(c) for c in counts]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--configs", default=",".join(c[0] for c in CONFIGS))
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument(
        "--rounds", type=int, default=paired_timing.MAX_ROUNDS, help="timed rounds a product at most"
    )
    p.add_argument(
        "--time-s",
        type=float,
        default=paired_timing.BUDGET_S,
        help=f"seconds of timed rounds a product (at least {paired_timing.MIN_ROUNDS} rounds)",
    )
    p.add_argument(
        "--rotate-gb",
        type=float,
        default=paired_timing.MAX_ROTATION_BYTES / 2**30,
        help="memory the rotated input sets of a product may take (GiB)",
    )
    p.add_argument("--budget-s", type=float, default=math.inf, help="stop starting new products after this")
    args = p.parse_args(argv)
    os.environ.setdefault("UNIMATMUL_CACHE", str(Path(tempfile.mkdtemp()) / "moe-cache.msgpack"))
    import torch

    import unimatmul

    if not torch.cuda.is_available():
        print("moe_bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.perf_counter()
    wanted = set(args.configs.split(","))
    tokens = [int(t) for t in args.tokens.split(",")]
    device = torch.device("cuda")
    l2 = paired_timing.cuda_l2_bytes(device.index or 0)
    rows: list[dict[str, Any]] = []
    left_out: list[str] = []
    for name, experts, hidden, inter, top_k, source in CONFIGS:
        if name not in wanted:
            continue
        weights = expert_weights(torch, device, experts, hidden, inter)
        for t in tokens:
            for routing in ROUTINGS:
                if routing == "skewed" and t * top_k < experts:
                    continue  # too few rows for the two routings to differ
                counts = counts_of(t, experts, top_k, routing, seed=t)
                offs = offs_of(torch, counts, device)
                for proj, w in weights.items():
                    row_id = f"{name}/{proj}/t{t}/{routing}"
                    if time.perf_counter() - started > args.budget_s:
                        left_out.append(f"{row_id}: over the run's budget")
                        continue
                    a, b = operands_of(torch, w, counts)
                    try:
                        row = measure(row_id, a, b, offs, counts, args, l2, torch, unimatmul)
                    except Exception as exc:  # recorded, and the run goes on with the next product
                        left_out.append(
                            f"{row_id}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                        )
                        print(f"moe_bench: {left_out[-1]}", file=sys.stderr, flush=True)
                        torch.cuda.synchronize()
                        continue
                    row.update(config=name, config_source=source, proj=proj, tokens=t, routing=routing)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        del weights
        torch.cuda.empty_cache()
    write(args.out, rows, left_out, torch)
    return 0


def offs_of(torch: Any, counts: list[int], device: Any) -> Any:
    """``torch._grouped_mm``'s ``offs`` for groups of ``counts`` rows: their running end, int32."""
    return torch.tensor(counts, device=device, dtype=torch.int64).cumsum(0).to(torch.int32)


def operands_of(torch: Any, w: Any, counts: list[int]) -> tuple[Any, Any]:
    """(a, b) of one expert weight's grouped product: ``b`` the ``[E, K, N]`` view of
    transformers' ``[E, N, K]`` weights, ``a`` random rows for every group (bf16)."""
    b = w.transpose(-2, -1)
    return torch.randn(sum(counts), b.shape[1], device=w.device, dtype=torch.bfloat16), b


def config_named(name: str) -> tuple[str, int, int, int, int, str]:
    """The entry of :data:`CONFIGS` called ``name``."""
    return next(c for c in CONFIGS if c[0] == name)


def expert_weights(torch: Any, device: Any, experts: int, hidden: int, inter: int) -> dict[str, Any]:
    """A MoE layer's expert weights as transformers keeps them (``[E, N, K]``, bf16; seeded)."""
    torch.manual_seed(0)
    return {
        "gate_up": torch.randn(experts, 2 * inter, hidden, device=device, dtype=torch.bfloat16) * 0.02,
        "down": torch.randn(experts, hidden, inter, device=device, dtype=torch.bfloat16) * 0.02,
    }


def copy_of(x: Any, torch: Any) -> Any:
    """A copy of ``x`` with its strides (a transposed weight view stays one)."""
    return torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=x.device).copy_(x)


def plan_of(unimatmul: Any, a: Any, b: Any) -> Any:
    """The grouped door's plan for this product's bucket (uniform and skewed routings of
    one token count share it), or None: its ``label`` says what runs, its ``source`` where
    the choice stands (tuned, cache, confirmed or reverted: its window's verdict)."""
    from unimatmul.core.grouped import bucket_extent

    m, (groups, k, n) = bucket_extent(int(a.shape[0])), tuple(b.shape)
    for plan in unimatmul.grouped.TABLE.live():
        p = plan.problem
        if p is not None and (p.m, p.n, p.k, p.batch) == (m, n, k, groups):
            return plan
    return None


def measure(
    row_id: str,
    a: Any,
    b: Any,
    offs: Any,
    counts: list[int],
    args: argparse.Namespace,
    l2: int,
    torch: Any,
    unimatmul: Any,
) -> dict[str, Any]:
    t0 = time.perf_counter()
    with unimatmul.mode("tune"):
        got = unimatmul.grouped_matmul(a, b, offs)
    torch.cuda.synchronize()
    tune_s = time.perf_counter() - t0
    # The float64 product of every group.
    worst = 0.0
    start = 0
    for g, c in enumerate(counts):
        if c:
            ref = a[start : start + c].double() @ b[g].double()
            err = (got[start : start + c].double() - ref).abs().max().item() / max(
                ref.abs().max().item(), 1e-6
            )
            worst = max(worst, err)
        start += c
    ok = worst < 2e-2
    # Input sets: a call reads a and its active experts' weights and writes its output; a copy
    # allocates a and every expert's weights (their copies make most of the memory).
    size = a.element_size()
    n, k = int(b.shape[2]), int(b.shape[1])
    touched = size * (a.shape[0] * k + sum(1 for c in counts if c) * n * k + a.shape[0] * n)
    count = paired_timing.rotation_sets(
        touched, l2, set_bytes=size * (a.numel() + b.numel()), max_bytes=int(args.rotate_gb * 2**30)
    )
    sets = [(a, b)] + [(copy_of(a, torch), copy_of(b, torch)) for _ in range(count - 1)]
    with unimatmul.mode("cached"):
        ours = [functools.partial(unimatmul.grouped_matmul, x, w, offs) for x, w in sets]
        # A program's first calls of the bucket confirm its choice against torch's (the
        # confirmation window, on these calls' own routing): timed after them, as the
        # program's steady state runs.
        paired_timing.past_confirmation(ours, torch)
        timing = paired_timing.time_candidates(
            {
                "torch": [functools.partial(torch._grouped_mm, x, w, offs) for x, w in sets],
                "unimatmul": ours,
            },
            torch=torch,
            budget_s=args.time_s,
            max_rounds=args.rounds,
        )
    del sets
    stats = timing.stats("torch", "unimatmul")
    plan = plan_of(unimatmul, a, b)
    return {
        "id": row_id,
        "m": int(a.shape[0]),
        "n": int(b.shape[2]),
        "k": int(b.shape[1]),
        "groups": int(b.shape[0]),
        "largest_group": max(counts),
        "empty_groups": sum(1 for c in counts if c == 0),
        "torch_us": stats["numerator_s"] * 1e6,
        "unimatmul_us": stats["denominator_s"] * 1e6,
        "speedup": stats["speedup"],
        "round_ratios": stats["round_ratios"],
        "ratio_of_medians": stats["ratio_of_medians"],
        "speedup_method": stats["speedup_method"],
        "sets": count,
        "rotation_mb": round(count * touched / 2**20, 1),
        "calls_per_graph": timing.calls,
        "timing_modes": timing.modes,
        "tune_s": tune_s,
        "max_rel_err": worst,
        "correct": ok,
        "choice": plan.label if plan is not None else "",
        "source": plan.source if plan is not None else "",
    }


def write(out: Path, rows: list[dict[str, Any]], left_out: list[str], torch: Any) -> None:
    out.mkdir(parents=True, exist_ok=True)
    ran = [r for r in rows if r["correct"]]
    geo = math.exp(statistics.fmean(math.log(r["speedup"]) for r in ran)) if ran else math.nan
    tunes = sorted(r["tune_s"] for r in rows)
    summary = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rows": len(rows),
        "wrong": [r["id"] for r in rows if not r["correct"]],
        "geomean_speedup": geo,
        "min_speedup": min((r["speedup"] for r in ran), default=math.nan),
        "speedup_method": "median of per-round ratios (paired_timing: one CUDA graph a side, "
        "inputs rotated through > 3.2x L2, replays alternating A B, B A)",
        "tune_s_first": rows[0]["tune_s"] if rows else math.nan,
        "tune_s_median": statistics.median(tunes) if tunes else math.nan,
        "left_out": left_out,
    }
    (out / "moe-bench.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
    lines = [
        f"# MoE grouped GEMMs: unimatmul against torch._grouped_mm ({summary['device']}, torch {summary['torch']})",
        "",
        f"geomean {geo:.3f}x over {len(ran)} products, lowest {summary['min_speedup']:.3f}x; "
        f"tuning median {summary['tune_s_median']:.2f} s a product; speedup: {summary['speedup_method']}",
        "",
        "| product | m x n x k, groups | largest group | torch us | unimatmul us | speedup | round ratios | tune s | choice |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['id']} | {r['m']}x{r['n']}x{r['k']}, {r['groups']} | {r['largest_group']} | {r['torch_us']:.1f} | "
            f"{r['unimatmul_us']:.1f} | {r['speedup']:.3f}x{'' if r['correct'] else ' WRONG'} | "
            f"{r['round_ratios']['min']:.3f}-{r['round_ratios']['max']:.3f} | {r['tune_s']:.2f} | {r['choice']} |"
        )
    if left_out:
        lines += ["", "Not run: " + "; ".join(left_out)]
    (out / "moe-summary.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(10, 4))
        ax.bar(range(len(rows)), [r["speedup"] for r in rows])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(range(len(rows)), [r["id"] for r in rows], rotation=90, fontsize=6)
        ax.set_ylabel("speedup over torch._grouped_mm")
        fig.tight_layout()
        fig.savefig(out / "moe-speedup.png", dpi=120)
    except Exception as exc:  # matplotlib missing: the table and JSON still stand
        print(f"moe_bench: no plot ({exc})", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
