"""Why does tuning keep Default on some grouped products the rows kernel wins? (GPU)

    UNIMATMUL_CACHE=$(mktemp -d)/diag.msgpack python plugins/unimatmul-triton/scripts/grouped_diag.py --out DIR

For a few expert products: tune through ``unimatmul.grouped_matmul`` (fresh cache) and
dump the record (every candidate's median, samples, status, note; the repeat's
verdict); then time Default against every rows config on operands the harness makes
(``make_grouped_operands``) for each of its distributions, and on the benchmark's own
routing, with ``benchmarks/paired_timing.py``. Writes ``diag.json``, prints a summary.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[3] / "benchmarks"))

PRODUCTS = (  # name, experts, n, k, rows (tokens x top-k)
    ("qwen3/gate_up/t16", 128, 1536, 2048, 128),
    ("deepseek/down/t16", 64, 2048, 1408, 96),
    ("gpt-oss/gate_up/t16", 32, 5760, 2880, 64),
    ("mixtral/gate_up/t16", 8, 28672, 4096, 32),
)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import numpy as np
    import paired_timing
    import torch
    from moe_bench import counts_of
    from unimatmul_triton.grouped import CONFIGS, ROWS

    import unimatmul
    from unimatmul.backend import Device, Target, adapter_for_kind
    from unimatmul.core.grouped import DISTRIBUTIONS, grouped_problem_of, make_grouped_operands
    from unimatmul.tuning.selector import get_selector

    dev = torch.device("cuda")
    target = Target(adapter_for_kind("torch"), Device("cuda", 0))
    backend = get_selector().plugins.backends()["triton_grouped"]
    found: list[dict[str, Any]] = []
    for name, experts, n, k, rows in PRODUCTS:
        torch.manual_seed(0)
        w = torch.randn(experts, n, k, device=dev, dtype=torch.bfloat16) * 0.02
        b = w.transpose(-2, -1)
        top_k = max(1, rows // 16)
        counts = counts_of(16, experts, top_k, "uniform", seed=16)
        offs = torch.tensor(counts, device=dev).cumsum(0).to(torch.int32)
        a = torch.randn(sum(counts), k, device=dev, dtype=torch.bfloat16)
        with unimatmul.mode("tune"):
            unimatmul.grouped_matmul(a, b, offs)
        torch.cuda.synchronize()
        problem = grouped_problem_of(target.adapter, a, b, offs)
        rec = None
        for _, _, r in get_selector().store.items(None):
            if r.problem == problem.key:
                rec = r.to_dict()
        row: dict[str, Any] = {"product": name, "problem": problem.key, "record": rec}
        print(f"== {name}: {problem.key}", flush=True)
        if rec:
            print(f"   winner {rec['winner']}  default_s {rec['default_s']}  winner_s {rec['winner_s']}")
            for r in rec["results"]:
                med = r["median_s"] * 1e6 if r["median_s"] else float("nan")
                print(
                    f"   {r['identity'][:60]:60s} {r['status']:9s} {med:8.1f} us n={r['samples']} {r['note'][:90]}"
                )
            print(f"   repeat: {rec['settings'].get('repeat')}")
        # Default against each rows config, per distribution of the harness and the real one.
        configs = [c for c in CONFIGS.values() if c.form == ROWS]
        runners = {c.candidate.identity: backend.prepare(problem, c.candidate, target) for c in configs}
        timings: dict[str, Any] = {}
        rng = np.random.default_rng(1)
        for dist in (*DISTRIBUTIONS, "real"):
            if dist == "real":
                ops_a, ops_b, ops_offs = a, b, offs
            else:
                ops = make_grouped_operands(problem, target.adapter, target.device, rng, dist)
                ops_a, ops_b, ops_offs = ops.a, ops.b, ops.offs
            out = torch.empty(ops_a.shape[0], n, device=dev, dtype=torch.bfloat16)
            cands = {"default": [functools.partial(torch._grouped_mm, ops_a, ops_b, ops_offs)]}
            for ident, run in runners.items():
                cands[ident] = [functools.partial(run, ops_a, ops_b, out, 1.0, 0.0, None, ops_offs)]
            t = paired_timing.time_candidates(cands, torch=torch, budget_s=0.6, max_rounds=21)
            timings[dist] = {i: t.median_s(i) * 1e6 for i in cands}
            best = min((v, i) for i, v in timings[dist].items() if i != "default")
            print(
                f"   {dist:8s} rows {ops_a.shape[0]:5d} active {int((ops_offs.diff(prepend=ops_offs[:1] * 0) > 0).sum())}"
                f" default {timings[dist]['default']:8.1f} us  best {best[0]:8.1f} us {best[1][15:]}",
                flush=True,
            )
        row["timings_us"] = timings
        found.append(row)
        del w, b
        torch.cuda.empty_cache()
    (args.out / "diag.json").write_text(json.dumps(found, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
