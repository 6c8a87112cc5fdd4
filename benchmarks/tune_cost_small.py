"""What tuning a small problem costs on the CPU: PyTorch's OpInfo matmul samples.

Run on the machine to measure (it needs torch and ``expecttest``, which PyTorch's
testing module imports)::

    python benchmarks/tune_cost_small.py [--repeat 2] [--out benchmarks/results/harness]

It collects the distinct problems that PyTorch's OpInfo sample inputs of the matrix
product ops (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``matmul``, ``linear``, ...) meet
in float32 on the CPU, by running every sample once with routing on in ``record``
mode, then tunes each one ``--repeat`` times with the default CPU harness settings
(a fresh in-memory cache each time) and reports the tuning time per problem: median,
90th percentile and total, for all of them and for those whose Default takes less than
10 us. It also says what else the machine was doing (load average before and after),
because on a shared machine that is most of the noise.

Writes tune-cost-small.json and tune-cost-small.md under --out (``--label`` names
the run inside them).
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

import numpy as np
import torch

import unimatmul
import unimatmul.torch as um_torch
from unimatmul.backend import Target
from unimatmul.cache.protocol import open_store
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.core.problem import Problem
from unimatmul.tuning.selector import Selector, get_selector, set_selector

OPS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "nn.functional.linear", "__rmatmul__", "addbmm"}
# What collect() found with torch 2.13 (float32, CPU): used where PyTorch's testing module
# cannot be imported (it needs ``expecttest``).
OPINFO_KEYS = [
    "gemm:f32.f32.f32:f32:NN:m2n3k2b1:ld2,3,3:st0,0,0:beta1:none:al16",
    "gemm:f32.f32.f32:f32:NN:m3n3k3b1:ld3,3,3:st0,0,0:beta1:none:al16",
    "gemm:f32.f32.f32:f32:NN:m5n10k5b5:ld5,10,10:st25,50,50:beta1:none:al16",
    "gemm:f32.f32.f32:f32:NN:m5n5k10b10:ld10,5,5:st50,50,25:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NN:m1n5k10b1:ld10,5,5:st0,0,0:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NN:m5n5k10b1:ld10,5,5:st0,0,0:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NN:m25n5k10b1:ld10,5,5:st0,0,0:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NN:m1n5k10b5:ld10,5,5:st0,50,5:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NN:m5n5k10b5:ld10,5,5:st0,50,25:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NN:m10n5k10b25:ld10,5,5:st100,50,50:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NN:m1n5k10b25:ld10,5,5:st0,50,5:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NN:m5n5k5b5:ld5,5,5:st25,0,25:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NT:m1n4k3b1:ld3,3,4:st0,0,0:beta0:bias:biasf32:al16",
    "gemm:f32.f32.f32:f32:NT:m8n4k3b1:ld3,3,4:st0,0,0:beta0:bias:biasf32:al16",
    "gemm:f32.f32.f32:f32:NT:m6n4k3b1:ld3,3,4:st0,0,0:beta0:bias:biasf32:al16",
    "gemm:f32.f32.f32:f32:NT:m1n8k8b1:ld8,8,8:st0,0,0:beta0:bias:biasf32:al16",
    "gemm:f32.f32.f32:f32:NT:m8n8k8b1:ld8,8,8:st0,0,0:beta0:bias:biasf32:al16",
    "gemm:f32.f32.f32:f32:NT:m6n8k8b1:ld8,8,8:st0,0,0:beta0:bias:biasf32:al16",
    "gemm:f32.f32.f32:f32:NT:m1n4k3b1:ld3,3,4:st0,0,0:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NT:m8n4k3b1:ld3,3,4:st0,0,0:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NT:m6n4k3b1:ld3,3,4:st0,0,0:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NT:m1n8k8b1:ld8,8,8:st0,0,0:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NT:m8n8k8b1:ld8,8,8:st0,0,0:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NT:m6n8k8b1:ld8,8,8:st0,0,0:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NT:m4n4k2b1:ld2,2,4:st0,0,0:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NT:m4n4k2b1:ld2,2,4:st0,0,0:beta0:bias:biasf32:al16",
    "gemm:f32.f32.f32:f32:NN:m16n32k1b2:ld1,32,32:st16,32,512:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NN:m64n64k1b4:ld1,64,64:st64,64,4096:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NN:m128n256k1b8:ld1,256,256:st128,256,32768:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NN:m512n128k1b1:ld1,128,128:st0,0,0:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NN:m32n64k1b16:ld1,64,64:st32,64,2048:beta0:none:al16",
    "gemm:f32.f32.f32:f32:NN:m7n11k1b3:ld1,11,11:st7,11,77:beta0:none:al16",
]


def collect() -> list[tuple[Problem, Target]]:
    """The distinct problems OpInfo's float32 CPU samples of the product ops meet."""
    try:
        from torch.testing._internal.common_methods_invocations import op_db
    except ImportError as exc:
        print(f"OpInfo not importable ({exc}): the problems it gave before", flush=True)
        target = Target(adapter_for_kind("torch"), CPU)
        return [(Problem.from_key(key), target) for key in OPINFO_KEYS]

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


def confirm(problem: Problem, target: Target, selector: Selector, winner: str, pairs: int = 30) -> float:
    """Default's time over the winner's, measured apart from tuning: pairs of 1 ms samples
    of each, taken in turns on one set of operands, median of the pair ratios."""
    from unimatmul.backend import DEFAULT, Candidate
    from unimatmul.core.arrays import make_operands

    ops = make_operands(problem, target.adapter, target.device, np.random.default_rng(1))
    runners = [selector.prepare(problem, c, target) for c in (DEFAULT, Candidate.from_identity(winner))]
    beta = 0.0 if problem.beta_zero else 1.0

    def sample(runner: Any) -> float:
        done, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 1e-3:
            runner(ops.a, ops.b, ops.out, 1.0, beta, ops.bias)
            done += 1
        return (time.perf_counter() - t0) / done

    for runner in runners:
        sample(runner)  # warm-up
    ratios = []
    for i in range(pairs):
        order = runners if i % 2 == 0 else runners[::-1]
        times = {id(r): sample(r) for r in order}
        ratios.append(times[id(runners[0])] / times[id(runners[1])])
    return statistics.median(ratios)


def tune_all(problems: list[tuple[Problem, Target]]) -> list[dict[str, Any]]:
    rows = []
    for problem, target in problems:
        selector = Selector(store=open_store(":memory:"))
        t0, c0 = time.perf_counter(), time.process_time()
        record = selector.tune(problem, target, force=True, store=False)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        # A chosen kernel is right only if it is faster than Default when measured again.
        confirmed = None
        if record.winner != "default/default":
            confirmed = confirm(problem, target, selector, record.winner)
        rows.append(
            {
                "key": problem.key,
                "shape": problem.shape_text,
                "wall_s": wall,
                "cpu_s": cpu,  # this process's CPU time: what a busy machine inflates least
                "default_us": (record.default_s or 0.0) * 1e6,
                "winner": record.winner,
                "tuned_speedup": record.speedup,
                "confirmed_speedup": confirmed,  # None when Default won
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

    small = [r for r in rows if r["default_us"] < 10.0]
    chosen = [r for r in rows if r["confirmed_speedup"] is not None]
    return {
        "chosen_over_default": len(chosen),
        # a choice that is slower than Default when measured again (by more than 2 %)
        "wrong_choices": [
            (r["shape"], r["winner"], round(r["confirmed_speedup"], 3))
            for r in chosen
            if r["confirmed_speedup"] < 0.98
        ],
        "all": stats([r["wall_s"] for r in rows]),
        "default_below_10us": stats([r["wall_s"] for r in small]),
        "default_below_10us_cpu": stats([r["cpu_s"] for r in small]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--label", default="run")
    parser.add_argument("--limit", type=int, default=0, help="tune only the first N problems")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "harness")
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
            f"default < 10 us: {s['default_below_10us']}; its CPU time: {s['default_below_10us_cpu']}; "
            f"chosen over Default {s['chosen_over_default']}, slower than Default when measured again: "
            f"{s['wrong_choices']}",
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
    json_path = args.out / "tune-cost-small.json"
    json_path.write_text(json.dumps(result, indent=1))
    lines = [
        f"# Tuning cost of small problems ({args.label})",
        "",
        f"{len(problems)} distinct problems from PyTorch's OpInfo samples of the product ops "
        f"(float32, CPU), {os.cpu_count()} CPUs.",
        "",
        "| run | load before/after | problems | median ms | p90 ms | total s "
        "| Default < 10 us: count | median ms | p90 ms | total s | median CPU ms | chosen | wrong |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        a, s = run["summary"]["all"], run["summary"]["default_below_10us"]
        c = run["summary"]["default_below_10us_cpu"]
        lines.append(
            f"| {run['repeat']} | {run['load_before'][0]:.1f} / {run['load_after'][0]:.1f} | {a['count']} "
            f"| {a['median_ms']:.1f} | {a['p90_ms']:.1f} | {a['total_s']:.1f} "
            f"| {s.get('count', 0)} | {s.get('median_ms', 0):.1f} | {s.get('p90_ms', 0):.1f} "
            f"| {s.get('total_s', 0):.1f} | {c.get('median_ms', 0):.1f} "
            f"| {run['summary']['chosen_over_default']} | {len(run['summary']['wrong_choices'])} |"
        )
    (args.out / "tune-cost-small.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {json_path}")


if __name__ == "__main__":
    main()
