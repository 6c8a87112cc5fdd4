"""Grouped-GEMM kernel lab: the row-tile kernel's configs against torch._grouped_mm.

    python plugins/unimatmul-triton/scripts/moe_lab.py --out DIR [--tokens 1,16,128,1024]

The expert products of benchmarks/moe_bench.py (four real MoE configs, gate/up and down,
uniform and skewed routing), each config of ``grouped_rows_kernel`` checked against the
float64 product of every group (and on edge ``offs``: one group holding every row, empty
groups, odd starts), then timed: one CUDA graph per candidate of ``CALLS`` calls over
expert-weight copies rotated through > 3x L2, the graphs replayed in turn for ``ROUNDS``
rounds, each candidate's speedup the median of its per-round ratios to torch. Prints a
table and writes ``lab.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import triton

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[3] / "benchmarks"))
from moe_bench import CONFIGS, ROUTINGS, counts_of  # noqa: E402
from unimatmul_triton.grouped_kernels import grouped_rows_kernel  # noqa: E402

# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)
DECODE = [
    (16, 32, 256, 4, 4),
    (16, 64, 128, 4, 4),
    (16, 64, 256, 4, 3),
    (16, 128, 128, 4, 3),
    (32, 64, 128, 4, 4),
]
TILES = [
    (64, 64, 64, 4, 4),
    (64, 128, 64, 4, 3),
    (128, 128, 64, 8, 3),
    (128, 256, 64, 8, 3),
    (64, 256, 64, 8, 3),
]
CALLS, ROUNDS = 10, 7
L2 = 60 * 2**20


def g_pow2(g: int) -> int:
    return 256 if g <= 256 else triton.next_power_of_2(g)


def launch(cfg: tuple[int, ...], a: Any, b: Any, out: Any, offs: Any) -> None:
    bm, bn, bk, w, s = cfg
    m, k = a.shape
    g, _, n = b.shape
    if m == 0:
        return
    slots = min(triton.cdiv(m, bm) + min(g, m), m)
    grid = (slots * triton.cdiv(n, bn),)
    sb = b.stride()
    grouped_rows_kernel[grid](
        a, b, out, offs, g, m, n, k,
        a.stride(0), a.stride(1), sb[0], sb[1], sb[2], out.stride(0), out.stride(1), slots,
        G_POW2=g_pow2(g), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=s,
    )  # fmt: skip


def rel_err(got: Any, a: Any, b: Any, offs: Any) -> float:
    worst, start = 0.0, 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            ref = a[start:end].double() @ b[g].double()
            err = (got[start:end].double() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
            worst = max(worst, err)
        start = end
    return worst


def edge_check(cfg: tuple[int, ...], k: int, n: int, g: int) -> float:
    """Worst error over edge offs (one group holding all rows, empties, odd starts, tail)."""
    worst = 0.0
    for sizes in ([0] * (g - 1) + [37], [37] + [0] * (g - 1), [i % 3 for i in range(g)], [5] * g):
        m = sum(sizes)
        a = torch.randn(m + 3, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(g, n, k, device="cuda", dtype=torch.bfloat16).transpose(-2, -1)
        offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
        out = torch.full((m + 3, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        launch(cfg, a, b, out, offs)
        worst = max(worst, rel_err(out, a, b, offs))
        if m and torch.isnan(out[:m]).any():
            return math.inf
    return worst


def graph_of(fn: Any, sets: int) -> Any:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(sets):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            fn(i % sets)
    return graph


def time_round(graphs: list[Any]) -> list[float]:
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in graphs]
    for (s, e), g in zip(ev, graphs, strict=True):
        s.record()
        g.replay()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e3 / CALLS for s, e in ev]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tokens", default="1,16,128,1024")
    p.add_argument("--budget-s", type=float, default=240)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    dev = torch.device("cuda")
    for name, experts, hidden, inter, top_k, _ in CONFIGS:
        torch.manual_seed(0)
        shapes = {"gate_up": (experts, 2 * inter, hidden), "down": (experts, hidden, inter)}
        for proj, shape in shapes.items():
            wbytes = math.prod(shape) * 2
            sets = max(1, min(4, math.ceil(3 * L2 / wbytes)))
            ws = [torch.randn(*shape, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(sets)]
            bs = [w.transpose(-2, -1) for w in ws]
            n, k = shape[1], shape[2]
            for cfg in DECODE + TILES:  # every config right on edge offs first
                err = edge_check(cfg, k, n, experts)
                if not err < 2e-2:
                    print(f"EDGE FAIL {name}/{proj} {cfg}: {err}", flush=True)
            for t in (int(x) for x in args.tokens.split(",")):
                for routing in ROUTINGS:
                    if routing == "skewed" and t * top_k < experts:
                        continue
                    if time.perf_counter() - started > args.budget_s:
                        break
                    counts = counts_of(t, experts, top_k, routing, seed=t)
                    offs = torch.tensor(counts, device=dev).cumsum(0).to(torch.int32)
                    m = sum(counts)
                    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                    outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(sets)]
                    rpg = m / experts
                    cfgs = (
                        (DECODE + TILES[:2]) if rpg <= 16 else (DECODE[-1:] + TILES) if rpg <= 128 else TILES
                    )
                    ok_cfgs = []
                    for cfg in cfgs:
                        out = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
                        launch(cfg, a, bs[0], out, offs)
                        err = rel_err(out, a, bs[0], offs)
                        if err < 2e-2 and not torch.isnan(out).any():
                            ok_cfgs.append(cfg)
                        else:
                            print(f"WRONG {name}/{proj}/t{t}/{routing} {cfg}: {err}", flush=True)
                    fns = [lambda i, a=a, bs=bs, offs=offs: torch._grouped_mm(a, bs[i], offs)]
                    fns += [
                        lambda i, c=c, a=a, bs=bs, o=outs, offs=offs: launch(c, a, bs[i], o[i], offs)
                        for c in ok_cfgs
                    ]
                    graphs = [graph_of(f, sets) for f in fns]
                    per = [time_round(graphs) for _ in range(ROUNDS)]
                    torch_us = statistics.median(r[0] for r in per)
                    best = None
                    for j, cfg in enumerate(ok_cfgs, start=1):
                        ratio = statistics.median(r[0] / r[j] for r in per)
                        us = statistics.median(r[j] for r in per)
                        if best is None or ratio > best[0]:
                            best = (ratio, cfg, us)
                    row = {
                        "id": f"{name}/{proj}/t{t}/{routing}",
                        "m": m, "n": n, "k": k, "groups": experts, "largest": max(counts),
                        "active": sum(1 for c in counts if c), "weight_sets": sets,
                        "torch_us": torch_us,
                        "best_us": best[2] if best else None, "best_cfg": best[1] if best else None,
                        "speedup": best[0] if best else None,
                        "all": {str(c): statistics.median(r[0] / r[j] for r in per)
                                for j, c in enumerate(ok_cfgs, start=1)},
                    }  # fmt: skip
                    rows.append(row)
                    print(
                        f"{row['id']:40s} m={m:6d} torch {torch_us:8.1f} us  best {row['best_us'] or 0:8.1f} us "
                        f"{row['speedup'] or 0:5.3f}x {row['best_cfg']}",
                        flush=True,
                    )
                    del graphs
            del ws, bs
            torch.cuda.empty_cache()
    (args.out / "lab.json").write_text(json.dumps(rows, indent=1))
    sp = [r["speedup"] for r in rows if r["speedup"]]
    if sp:
        geo = math.exp(sum(math.log(max(s, 1.0)) for s in sp) / len(sp))
        print(f"rows {len(sp)}: geomean of max(best, 1.0) {geo:.3f}x; min best {min(sp):.3f}x")
    print(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
