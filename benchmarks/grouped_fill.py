"""Does a grouped choice win across the rows its bucket covers?

One command (on a CUDA GPU):

    python benchmarks/grouped_fill.py --out benchmarks/results/grouped-fill-h200

A grouped MoE product's choice is made for a bucket of total rows (the next power of two)
and serves every call in it. This tunes the bucket of 8192 rows of real MoE experts
(gate/up and down of the configurations in ``moe_bench.CONFIGS``) through
``unimatmul.grouped_matmul``, then times the tuning's best candidates (every one it measured
within ``--within`` of the best, and its winner) against ``torch._grouped_mm`` at several
fills of the bucket (the token counts whose top-k routing gives that many rows), uniform and
skewed routing, with ``paired_timing`` (one CUDA graph a side, inputs rotated through more
than 3.2x L2, the median of the per-round ratios). Writes ``grouped-fill.json`` and
``grouped-fill.md``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import paired_timing
from moe_bench import CONFIGS, copy_of, counts_of, expert_weights

BUCKET = 8192
FILLS = (0.5, 0.625, 0.75, 0.875, 1.0)
ROUTINGS = ("uniform", "skewed")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--configs", default="deepseek-v2-lite,qwen3-30b-a3b")
    p.add_argument("--fills", default=",".join(map(str, FILLS)))
    p.add_argument("--within", type=float, default=0.05, help="candidates within this of the best are timed")
    p.add_argument("--most", type=int, default=4, help="candidates timed a product at most, Default aside")
    p.add_argument("--time-s", type=float, default=1.0, help="seconds of timed rounds a point")
    p.add_argument("--budget-s", type=float, default=240.0, help="stop starting new products after this")
    args = p.parse_args(argv)
    os.environ.setdefault("UNIMATMUL_CACHE", str(Path(tempfile.mkdtemp()) / "fill-cache.msgpack"))
    import torch

    import unimatmul
    from unimatmul.backend import Candidate, Target
    from unimatmul.core.arrays import Device, adapter_for_kind
    from unimatmul.core.grouped import grouped_problem_of
    from unimatmul.tuning.selector import get_selector

    if not torch.cuda.is_available():
        print("grouped_fill: needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.perf_counter()
    device = torch.device("cuda")
    target = Target(adapter_for_kind("torch"), Device("cuda", device.index or 0))
    l2 = paired_timing.cuda_l2_bytes(device.index or 0)
    fills = [float(f) for f in args.fills.split(",")]
    rows: list[dict[str, Any]] = []
    left_out: list[str] = []
    for name, experts, hidden, inter, top_k, _source in CONFIGS:
        if name not in args.configs.split(","):
            continue
        weights = expert_weights(torch, device, experts, hidden, inter)
        for proj, w in weights.items():
            product = f"{name}/{proj}"
            if time.perf_counter() - started > args.budget_s:
                left_out.append(f"{product}: over the run's budget")
                continue
            b = w.transpose(-2, -1)
            # Tuned as the MoE benchmark tunes it: on the first call of the bucket.
            tokens = int(BUCKET * 0.75) // top_k
            counts = counts_of(tokens, experts, top_k, "uniform", seed=tokens)
            offs = torch.tensor(counts, device=device, dtype=torch.int64).cumsum(0).to(torch.int32)
            a = torch.randn(sum(counts), b.shape[1], device=device, dtype=torch.bfloat16)
            with unimatmul.mode("tune"):
                unimatmul.grouped_matmul(a, b, offs)
            problem = grouped_problem_of(target.adapter, a, b, offs)
            record = get_selector().lookup(problem, target)
            if record is None:
                left_out.append(f"{product}: no record of its bucket")
                continue
            timed = sorted(
                (
                    r
                    for r in record.results
                    if r.status == "ok" and r.median_s and r.identity != "default/default"
                ),
                key=lambda r: r.median_s or 0.0,
            )
            best = timed[0].median_s if timed else 0.0
            chosen = [r.identity for r in timed if (r.median_s or 0.0) <= best * (1 + args.within)][
                : args.most
            ]
            if record.winner not in chosen and record.winner != "default/default":
                chosen.append(record.winner)
            runners = {c: get_selector().prepare(problem, Candidate.from_identity(c), target) for c in chosen}
            print(f"{product}: winner {record.winner}; timing {chosen}", flush=True)
            for fill in fills:
                for routing in ROUTINGS:
                    tokens = int(BUCKET * fill) // top_k
                    counts = counts_of(tokens, experts, top_k, routing, seed=tokens + 1)
                    row = point(torch, b, counts, runners, l2, args.time_s)
                    row.update(
                        product=product, fill=fill, routing=routing, winner=record.winner, tokens=tokens
                    )
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        del weights
        torch.cuda.empty_cache()
    write(args.out, rows, left_out, torch)
    return 0


def point(
    torch: Any, b: Any, counts: list[int], runners: dict[str, Any], l2: int, time_s: float
) -> dict[str, Any]:
    """torch._grouped_mm and each runner on one routing, paired; each runner's output checked."""
    device = b.device
    offs = torch.tensor(counts, device=device, dtype=torch.int64).cumsum(0).to(torch.int32)
    a = torch.randn(sum(counts), b.shape[1], device=device, dtype=torch.bfloat16)
    want = torch._grouped_mm(a, b, offs)
    size = a.element_size()
    n, k = int(b.shape[2]), int(b.shape[1])
    touched = size * (a.shape[0] * k + sum(1 for c in counts if c) * n * k + a.shape[0] * n)
    count = paired_timing.rotation_sets(touched, l2, set_bytes=size * (a.numel() + b.numel()))
    sets = [(a, b)] + [(copy_of(a, torch), copy_of(b, torch)) for _ in range(count - 1)]
    outs = [torch.empty(a.shape[0], n, device=device, dtype=torch.bfloat16) for _ in sets]
    errors: dict[str, float] = {}
    for name, runner in runners.items():
        outs[0].fill_(float("nan"))
        runner(a, b, outs[0], 1.0, 0.0, None, offs)
        errors[name] = float((outs[0].float() - want.float()).norm() / want.float().norm())

    def calls(runner: Any) -> list[Any]:
        return [
            functools.partial(runner, x, w, o, 1.0, 0.0, None, offs)
            for (x, w), o in zip(sets, outs, strict=True)
        ]

    candidates = {"torch": [functools.partial(torch._grouped_mm, x, w, offs) for x, w in sets]}
    candidates.update({name: calls(runner) for name, runner in runners.items()})
    timing = paired_timing.time_candidates(candidates, torch=torch, budget_s=time_s)
    found: dict[str, Any] = {
        "m": int(a.shape[0]),
        "largest_group": max(counts),
        "torch_us": timing.median_s("torch") * 1e6,
    }
    found["speedups"] = {name: timing.stats("torch", name)["speedup"] for name in runners}
    found["rel_errors"] = errors
    return found


def write(out: Path, rows: list[dict[str, Any]], left_out: list[str], torch: Any) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "rows": rows,
        "left_out": left_out,
    }
    (out / "grouped-fill.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = [
        f"# A grouped bucket's candidates across its fill ({data['device']}, torch {data['torch']})",
        "",
        "speedup over torch._grouped_mm: the median of per-round ratios (paired_timing); * the tuned winner",
        "",
        "| product | fill | rows | routing | largest group | torch us | candidates: speedup |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = ", ".join(
            f"{'*' if name == r['winner'] else ''}{name.split('/')[-1]} {s:.3f}x"
            for name, s in r["speedups"].items()
        )
        lines.append(
            f"| {r['product']} | {r['fill']} | {r['m']} | {r['routing']} | {r['largest_group']} | "
            f"{r['torch_us']:.1f} | {cells} |"
        )
    lines += ["", *(f"left out: {x}" for x in left_out)]
    (out / "grouped-fill.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
