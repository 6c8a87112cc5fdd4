"""What tuning a small problem costs on the CPU: PyTorch's OpInfo matmul samples.

Run on the machine to measure (it needs torch and ``expecttest``, which PyTorch's
testing module imports)::

    python benchmarks/tune_cost_small.py [--repeat 2] [--out benchmarks/results]

It collects the distinct problems that PyTorch's OpInfo sample inputs of the matrix
product ops (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``matmul``, ``linear``, ...) meet
in float32 on the CPU, by running every sample once with routing on in ``record``
mode, then tunes each one ``--repeat`` times with the default CPU harness settings
(a fresh in-memory cache each time) and reports the tuning time per problem: median,
90th percentile and total, for all of them and for those whose Default takes less than
10 us. It also says what else the machine was doing (load average before and after),
because on a shared machine that is most of the noise.

Writes tune-cost-small.json and tune-cost-small.md under --out (``--label`` names
the run inside them, e.g. ``before`` / ``after``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import unimatmul
import unimatmul.torch as um_torch
from unimatmul.cache.protocol import open_store
from unimatmul.core.backend import Target
from unimatmul.core.problem import Problem
from unimatmul.tuning.selector import Selector, get_selector, set_selector

OPS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "nn.functional.linear", "__rmatmul__", "addbmm"}


def collect() -> list[tuple[Problem, Target]]:
    """The distinct problems OpInfo's float32 CPU samples of the product ops meet."""
    from torch.testing._internal.common_methods_invocations import op_db

    found: dict[str, tuple[Problem, Target]] = {}
    selector = Selector(store=open_store(":memory:"))
    selector.on_problem = lambda problem, target: found.setdefault(problem.key, (problem, target))
    old = set_selector(selector)
    um_torch.enable()
    try:
        with unimatmul.mode("record"):
            for op in op_db:
                if op.name not in OPS:
                    continue
                for sample in op.sample_inputs("cpu", torch.float32):
                    try:
                        op(sample.input, *sample.args, **sample.kwargs)
                    except Exception:  # a sample meant to raise (error inputs): not ours
                        continue
    finally:
        um_torch.disable()
        set_selector(old)
    return list(found.values())


def tune_all(problems: list[tuple[Problem, Target]]) -> list[dict[str, Any]]:
    rows = []
    for problem, target in problems:
        selector = Selector(store=open_store(":memory:"))
        t0 = time.perf_counter()
        record = selector.tune(problem, target, force=True, store=False)
        wall = time.perf_counter() - t0
        rows.append(
            {
                "key": problem.key,
                "shape": problem.shape_text,
                "wall_s": wall,
                "default_us": (record.default_s or 0.0) * 1e6,
                "winner": record.winner,
                "candidates": len(record.results),
                "confidence": record.settings.get("confidence"),
            }
        )
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(values: list[float]) -> dict[str, float]:
        if not values:
            return {}
        ordered = sorted(values)
        return {
            "count": len(ordered),
            "median_ms": statistics.median(ordered) * 1e3,
            "p90_ms": ordered[int(0.9 * (len(ordered) - 1))] * 1e3,
            "max_ms": ordered[-1] * 1e3,
            "total_s": sum(ordered),
        }

    small = [r["wall_s"] for r in rows if r["default_us"] < 10.0]
    return {"all": stats([r["wall_s"] for r in rows]), "default_below_10us": stats(small)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--label", default="run")
    parser.add_argument("--limit", type=int, default=0, help="tune only the first N problems")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    # Records of record mode go nowhere: the problems are collected in memory.
    os.environ.setdefault("UNIMATMUL_CACHE", ":memory:")
    problems = collect()
    if args.limit:
        problems = problems[: args.limit]
    print(f"{len(problems)} distinct problems from OpInfo samples", flush=True)
    runs = []
    for i in range(args.repeat):
        load_before = os.getloadavg()
        t0 = time.perf_counter()
        rows = tune_all(problems)
        runs.append(
            {
                "repeat": i,
                "load_before": load_before,
                "load_after": os.getloadavg(),
                "wall_s": time.perf_counter() - t0,
                "summary": summary(rows),
                "rows": rows,
            }
        )
        s = runs[-1]["summary"]
        print(
            f"run {i}: load {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}; all {s['all']}; "
            f"default < 10 us: {s['default_below_10us']}",
            flush=True,
        )
    get_selector()  # leave a process-wide selector behind, as a script would
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "label": args.label,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
        "problems": len(problems),
        "runs": runs,
    }
    json_path = args.out / f"tune-cost-small-{args.label}.json"
    json_path.write_text(json.dumps(result, indent=1))
    lines = [
        f"# Tuning cost of small problems ({args.label})",
        "",
        f"{len(problems)} distinct problems from PyTorch's OpInfo samples of the product ops "
        f"(float32, CPU), {os.cpu_count()} CPUs.",
        "",
        "| run | load before/after | problems | median ms | p90 ms | total s "
        "| Default < 10 us: count | median ms | p90 ms | total s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        a, s = run["summary"]["all"], run["summary"]["default_below_10us"]
        lines.append(
            f"| {run['repeat']} | {run['load_before'][0]:.1f} / {run['load_after'][0]:.1f} | {a['count']} "
            f"| {a['median_ms']:.1f} | {a['p90_ms']:.1f} | {a['total_s']:.1f} "
            f"| {s.get('count', 0)} | {s.get('median_ms', 0):.1f} | {s.get('p90_ms', 0):.1f} "
            f"| {s.get('total_s', 0):.1f} |"
        )
    (args.out / f"tune-cost-small-{args.label}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {json_path}")


if __name__ == "__main__":
    main()
