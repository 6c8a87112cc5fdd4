"""Does a GEMM time the same behind itself as behind the kernel that feeds it? (issue #15)

The GPU harness times a candidate in a CUDA graph of back-to-back calls of the same
product. In a model every product runs behind the small kernel that made its input
(a norm, an activation, a quantisation). In session 7 a per-tensor fp8 choice at m = 1
(the gate/up product) won in the harness and was ~4 % slower inside the stack's graph.
This script times every checked candidate of the fp8 stack's products both ways, in the
same interleaved rounds:

- ``plain``: ``TorchGraphTimer`` as the harness uses it (each call behind the previous one);
- ``spaced``: the same calls, each behind one small elementwise kernel (a 4096-element
  ``neg_``, a few CTAs, like the quantisation kernels before each product in the stack),
  in the same timer; the time of a graph of spacers alone is subtracted.

Session 9's run (``benchmarks/results/fp8-h200/spacer-s9/``) found the same fastest
candidate both ways in 14 of 16 products, and in the other two the plain and spaced
winners within 0.05 us of each other: the harness's back-to-back timing is not what
made a choice lose in the stack.

Per product: the candidates ranked both ways, and whether the fastest differs. Written
to ``$OUT/spacer.json`` and ``spacer.md``::

    python3 scripts/gpu_spacer.py [--m 1,16] [--scales tensor,rowwise] [--top 10]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from gpu_fp8 import operands, rotated_sets

ROUNDS = 11
SPACER_ELEMENTS = 4096
#: The fp8 stack's products (scripts/gpu_fp8.py's Fp8Stack): (layer, n, k).
PRODUCTS = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/unimatmul-spacer"))
    parser.add_argument("--m", default="1,16")
    parser.add_argument("--scales", default="tensor,rowwise")
    parser.add_argument(
        "--top", type=int, default=10, help="the harness's fastest N candidates (and Default)"
    )
    parser.add_argument("--exhaustive", type=int, default=16)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 3
    os.environ["UNIMATMUL_LT_EXHAUSTIVE"] = "1"
    os.environ["UNIMATMUL_LT_EXHAUSTIVE_MAX"] = str(args.exhaustive)
    os.environ["UNIMATMUL_LT_EXHAUSTIVE_CHECKS"] = "600"
    from unimatmul.cache.protocol import MemoryStore
    from unimatmul.core.arrays import Device, adapter_for_kind
    from unimatmul.core.backend import Candidate, Target
    from unimatmul.core.scaled import scaled_problem
    from unimatmul.tuning.selector import Selector
    from unimatmul.tuning.timers import TorchGraphTimer, l2_cache_bytes

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    index = torch.cuda.current_device()
    device = torch.device("cuda", index)
    target = Target(adapter_for_kind("torch"), Device("cuda", index))
    selector = Selector(store=MemoryStore())
    l2 = l2_cache_bytes(target)
    timer = TorchGraphTimer(index, min_calls=20, max_batch_s=0.02)
    scratch = torch.ones(SPACER_ELEMENTS, device=device)
    spacer_graphs: dict[int, float] = {}

    def space() -> None:
        scratch.neg_()

    def spacer_s(count: int) -> float:
        """Seconds of one spacer in a graph of ``count`` of them (median of 5 replays)."""
        if count not in spacer_graphs:
            sample = timer.prepare([space] * count)
            sample()
            spacer_graphs[count] = statistics.median(sample() for _ in range(5))
        return spacer_graphs[count]

    def spaced(calls: list[Any]) -> Any:
        """A sampler of ``calls``, each behind a spacer, the spacer's time taken off."""

        def call_after_spacer(call: Any) -> Any:
            def both() -> None:
                space()
                call()

            return both

        sample = timer.prepare([call_after_spacer(c) for c in calls])
        plain_count = len(calls)
        return lambda: sample() - spacer_s(max(20, plain_count))

    how_names = ("plain", "spaced")
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for scales in args.scales.split(","):
        for m in (int(x) for x in args.m.split(",")):
            for layer, n, k in PRODUCTS:
                problem = scaled_problem(m, n, k, scales=scales)
                record = selector.tune(problem, target, force=True, store=False)
                measured = sorted(
                    (r for r in record.results if r.median_s is not None and r.status in ("ok", "pruned")),
                    key=lambda r: r.median_s or math.inf,
                )
                chosen = [r.identity for r in measured[: args.top]]
                if "default/default" not in chosen:
                    chosen.append("default/default")
                sets = operands(m, n, k, scales, rotated_sets(m, n, k, l2), device, seed=99 + m)
                samplers: dict[tuple[str, str], Any] = {}
                for identity in chosen:
                    runner: Any = selector.prepare(problem, Candidate.from_identity(identity), target)
                    calls = [
                        (lambda s=s, r=runner: r(s[0], s[1], s[4], 1.0, 0.0, None, s[2], s[3])) for s in sets
                    ]
                    samplers[(identity, "plain")] = timer.prepare(calls)
                    samplers[(identity, "spaced")] = spaced(calls)
                for sample in samplers.values():
                    sample()  # the graph's upload
                times: dict[tuple[str, str], list[float]] = {key: [] for key in samplers}
                for _ in range(ROUNDS):
                    for key, sample in samplers.items():
                        times[key].append(sample())
                harness = {r.identity: r.median_s for r in measured}
                cands: list[dict[str, Any]] = []
                for identity in chosen:
                    cands.append(
                        {
                            "identity": identity,
                            "harness_us": round((harness.get(identity) or math.nan) * 1e6, 2),
                            "plain_us": round(statistics.median(times[(identity, "plain")]) * 1e6, 2),
                            "spaced_us": round(statistics.median(times[(identity, "spaced")]) * 1e6, 2),
                        }
                    )
                best = {how: min(cands, key=lambda c: c[f"{how}_us"])["identity"] for how in how_names}
                default = next(c for c in cands if c["identity"] == "default/default")
                row = {
                    "scales": scales,
                    "m": m,
                    "layer": layer,
                    "n": n,
                    "k": k,
                    "winner": record.winner,
                    "best_plain": best["plain"],
                    "best_spaced": best["spaced"],
                    "differs": best["plain"] != best["spaced"],
                    "default_plain_us": default["plain_us"],
                    "default_spaced_us": default["spaced_us"],
                    "candidates": cands,
                }
                rows.append(row)
                bp = next(c for c in cands if c["identity"] == best["plain"])
                print(
                    f"{scales:8s} m={m:3d} {layer:8s} winner {record.winner[:50]:50s} | plain best "
                    f"{bp['plain_us']:7.2f} us (spaced {bp['spaced_us']:7.2f}; default {default['plain_us']:7.2f}/"
                    f"{default['spaced_us']:7.2f}) | spaced best {best['spaced'][:50]} differs={row['differs']}"
                )
                for c in cands:
                    print(
                        f"    {c['identity'][:80]:80s} harness {c['harness_us']:8.2f} plain {c['plain_us']:8.2f} spaced {c['spaced_us']:8.2f}"
                    )
                samplers.clear()
                del sets
                torch.cuda.empty_cache()
                (out / "spacer.json").write_text(json.dumps({"rows": rows, "rounds": ROUNDS}, indent=1))
    lines = [
        "# Each candidate behind itself (plain) and behind a small kernel (spaced), H200",
        "",
        f"{ROUNDS} interleaved rounds, medians; {time.perf_counter() - started:.0f} s.",
        "",
        "| scales | m | product | plain best | its us plain / spaced | spaced best | its us plain / spaced | Default plain / spaced | differs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        by_id = {c["identity"]: c for c in row["candidates"]}
        bp, bs = by_id[row["best_plain"]], by_id[row["best_spaced"]]
        lines.append(
            f"| {row['scales']} | {row['m']} | {row['layer']} {row['n']}x{row['k']} | {bp['identity'][:40]} | "
            f"{bp['plain_us']:.2f} / {bp['spaced_us']:.2f} | {bs['identity'][:40]} | {bs['plain_us']:.2f} / "
            f"{bs['spaced_us']:.2f} | {row['default_plain_us']:.2f} / {row['default_spaced_us']:.2f} | {row['differs']} |"
        )
    (out / "spacer.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
