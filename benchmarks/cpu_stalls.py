"""How often a oneDNN kernel's first calls after the settling pause stall, and for how long.

    python benchmarks/cpu_stalls.py --out DIR [--shapes 12x128x64x128,12x128x128x64] [--reps 200]

What the CPU harness does before a backend's warm-up, done over and over: Default's block
(numpy's batched product for 20 ms: OpenBLAS's threads left spinning), the settling pause
(``unimatmul.tuning.quiet.wait_quiet``, at most 0.2 s), then one call of oneDNN's jit kernel
on the tuning worker thread (``unimatmul.tuning.time_limit.run_within``), timed. A call over
2 ms (the kernel takes about 0.4 ms cold) is a stall: then the next call is timed at once,
and another after a pause of ``--pause`` seconds (the harness's ``stall_s``), which says
whether one more sample after that pause sees the kernel's speed again.

Writes ``cpu-stalls.json`` (every stall: its call, the next, the one after the pause; the
median first call and pause) and ``cpu-stalls.md`` under ``--out``, a histogram
``cpu-stalls.png`` where matplotlib imports, and prints the table. Needs the oneDNN backend
(``pip install 'unimatmul[cpu]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from unimatmul.backend import Candidate, Target
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.core.problem import Problem
from unimatmul.tuning.quiet import wait_quiet
from unimatmul.tuning.time_limit import run_within

STALL_S = 2e-3


def one_shape(shape: str, reps: int, pause_s: float) -> dict[str, Any]:
    from unimatmul_backends.onednn.backend import OneDNNBackend

    target = Target(adapter_for_kind("numpy"), CPU)
    problem = Problem.parse_shape(shape)
    batch, m, n, k = problem.batch, problem.m, problem.n, problem.k
    rng = np.random.default_rng(0)
    a = rng.standard_normal((batch, m, k), dtype=np.float32)
    b = rng.standard_normal((batch, k, n), dtype=np.float32)
    out = np.empty((batch, m, n), np.float32)
    runner = OneDNNBackend().prepare(problem, Candidate.make("onednn", "gemm:jit:f32"), target)

    def call() -> float:
        t0 = time.perf_counter()
        runner(a, b, out)
        return time.perf_counter() - t0

    for _ in range(5):
        run_within(call, 10.0)
    firsts: list[float] = []
    waits: list[float] = []
    stalls: list[dict[str, float]] = []
    for rep in range(reps):
        started = time.perf_counter()
        while time.perf_counter() - started < 0.02:  # Default's block
            np.matmul(a, b, out=out)
        waits.append(wait_quiet(0.2))
        first = run_within(call, 10.0)
        firsts.append(first)
        if first > STALL_S:
            following = run_within(call, 10.0)
            time.sleep(pause_s)
            after = run_within(call, 10.0)
            stalls.append(
                {
                    "rep": rep,
                    "first_ms": first * 1e3,
                    "next_ms": following * 1e3,
                    "after_pause_ms": after * 1e3,
                }
            )
    return {
        "shape": shape,
        "reps": reps,
        "median_first_ms": statistics.median(firsts) * 1e3,
        "median_pause_ms": statistics.median(waits) * 1e3,
        "stalls": len(stalls),
        "next_also_stalled": sum(s["next_ms"] > STALL_S * 1e3 for s in stalls),
        "stalled_after_pause": sum(s["after_pause_ms"] > STALL_S * 1e3 for s in stalls),
        "stall_list": stalls,
        "firsts_ms": [round(f * 1e3, 3) for f in firsts],
    }


def table(rows: list[dict[str, Any]], pause_s: float) -> str:
    lines = [
        f"| shape | first calls | median first call | stalled (> {STALL_S * 1e3:g} ms) | stall times | "
        f"next call stalled too | stalled {pause_s * 1e3:g} ms later |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        times = sorted(s["first_ms"] for s in r["stall_list"])
        spanned = f"{times[0]:.1f}-{times[-1]:.1f} ms" if times else "-"
        lines.append(
            f"| {r['shape']} | {r['reps']} | {r['median_first_ms']:.2f} ms | {r['stalls']} "
            f"({100 * r['stalls'] / r['reps']:.1f} %) | {spanned} | {r['next_also_stalled']} | "
            f"{r['stalled_after_pause']} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    bins = [float(x) for x in np.logspace(np.log10(0.1), np.log10(20), 60)]
    for r in rows:
        ax.hist(r["firsts_ms"], bins=bins, alpha=0.6, label=r["shape"])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axvline(STALL_S * 1e3, color="k", lw=0.8, ls="--")
    ax.set_xlabel("first call after the settling pause (ms)")
    ax.set_ylabel("calls")
    ax.set_title("oneDNN jit kernel, first call after Default's block and the pause")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shapes", default="12x128x64x128,12x128x128x64")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--pause", type=float, default=0.01, help="seconds before the sample after a stall")
    args = p.parse_args()
    try:
        import unimatmul_backends.onednn.backend  # noqa: F401
    except ImportError as exc:
        sys.stderr.write(f"cpu_stalls: needs the oneDNN backend ({exc})\n")
        return 3
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [one_shape(s, args.reps, args.pause) for s in args.shapes.split(",") if s]
    with open("/proc/stat") as fh:
        cpu_line = fh.readline().split()
    result = {
        "what": "oneDNN jit kernel's first call after Default's block and the settling pause",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor(),
        },
        "steal_share_since_boot": int(cpu_line[8]) / sum(int(x) for x in cpu_line[1:9]),
        "pause_s": args.pause,
        "rows": rows,
    }
    (args.out / "cpu-stalls.json").write_text(json.dumps(result, indent=1) + "\n")
    text = table(rows, args.pause)
    (args.out / "cpu-stalls.md").write_text(text + "\n")
    plot(rows, args.out / "cpu-stalls.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
