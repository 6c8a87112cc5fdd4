"""Does a budgeted `tune --model` keep the speedup of a budget-free one? (GPU or CPU)

    python benchmarks/tune_model_budget.py --model llama-3-8b --device cuda --budget 10 \
        --out benchmarks/results/tune-model-h200

Runs ``unimatmul tune --model MODEL --budget SECONDS`` in a fresh process with a fresh
cache file and an empty Triton cache (``TRITON_CACHE_DIR`` a new folder), then the same
without ``--budget`` (fresh cache, empty Triton cache again), and compares them:

- wall time of each command (its start-up included) and the tuning time it reports;
- the model's GEMM speedup each run's records claim, weighting every problem by its share
  of the model's GEMM time (the command's own roofline shares): ``sum(share) /
  sum(share / speedup)``, a problem left out counting as 1.0x;
- how much of the budget-free run's gain the budgeted one keeps: ``(S_budget - 1) /
  (S_free - 1)``, and the ratio ``S_budget / S_free``.

The speedups are the tuner's own measurements (Default's time over the winner's, in
CUDA-graph replays on a GPU). Writes ``tune-model.json`` and ``README``-ready
``tune-model.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def run_tune(argv: list[str], env: dict[str, str], prefix: Sequence[str] = ()) -> tuple[str, float]:
    """``unimatmul tune ARGV`` in a fresh process (``prefix``: interpreter options before
    ``-m unimatmul``, e.g. cProfile's): its standard output and wall time; SystemExit with
    its error output if it fails."""
    cmd = [sys.executable, *prefix, "-m", "unimatmul", "tune", *argv]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout, wall


def record_speedup(record: dict[str, Any]) -> float:
    """Default's time over the winner's in a ``tune --json`` record (1.0 where either is missing)."""
    if record.get("default_s") and record.get("winner_s"):
        return float(record["default_s"] / record["winner_s"])
    return 1.0


def run(
    model: str,
    device: str,
    budget: float | None,
    work: Path,
    tag: str,
    extra: list[str],
    keep: Path | None = None,
) -> dict[str, Any]:
    cache = work / f"{tag}.msgpack"
    triton_cache = work / f"triton-{tag}"
    triton_cache.mkdir()
    records = work / f"{tag}.json"
    env = {**os.environ, "UNIMATMUL_CACHE": str(cache), "TRITON_CACHE_DIR": str(triton_cache)}
    argv = ["--model", model, "--device", device, "--quiet", "--json", str(records), *extra]
    if budget is not None:
        argv += ["--budget", f"{budget:g}"]
    stdout, wall = run_tune(argv, env)
    text = records.read_text()
    rows = json.loads(text)
    if keep is not None:  # the records in full (every candidate's result), for later analysis
        (keep / f"records-{tag}.json").write_text(text)
    coverage = re.search(r"coverage: ([0-9.]+)% of the GEMM time tuned in ([0-9.]+) s", stdout)
    before = re.search(r"([0-9.]+) s of it before tuning", stdout)
    return {
        "tag": tag,
        "command": " ".join(["unimatmul", "tune", *argv]).replace(str(work), "$WORK"),
        "wall_s": wall,
        "coverage_pct": float(coverage.group(1)) if coverage else None,
        "tuning_s": float(coverage.group(2)) if coverage else None,
        "before_tuning_s": float(before.group(1)) if before else None,
        "summary": [
            line.replace(str(work), "$WORK")
            for line in stdout.splitlines()
            if line.startswith(("coverage", "cache"))
        ],
        "records": [
            {
                "problem": r["problem"],
                "share": r["share"],
                "source": r["source"],
                "winner": r["winner"],
                "tune_s": r.get("tune_s"),
                "speedup": record_speedup(r),
            }
            for r in rows
        ],
    }


def model_speedup(shares: dict[str, float], speedups: dict[str, float]) -> float:
    """The GEMM time's speedup over Default, each problem weighted by its share."""
    total = sum(shares.values())
    return total / sum(s / speedups.get(p, 1.0) for p, s in shares.items())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget", type=float, default=10.0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--extra", default="", help="more arguments for both tune commands, space-separated")
    p.add_argument(
        "--keep-records", action="store_true", help="also write each run's records in full (records-TAG.json)"
    )
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    extra = args.extra.split()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        keep = args.out if args.keep_records else None
        budgeted = run(args.model, args.device, args.budget, work, "budget", extra, keep)
        free = run(args.model, args.device, None, work, "free", extra, keep)
    shares = {r["problem"]: r["share"] for r in free["records"]}
    s_free = model_speedup(shares, {r["problem"]: r["speedup"] for r in free["records"]})
    s_budget = model_speedup(shares, {r["problem"]: r["speedup"] for r in budgeted["records"]})
    kept = (s_budget - 1) / (s_free - 1) if s_free > 1 else 1.0
    result = {
        "model": args.model,
        "device": args.device,
        "budget_s": args.budget,
        "problems": len(shares),
        "budgeted": budgeted,
        "free": free,
        "speedup_free": s_free,
        "speedup_budget": s_budget,
        "ratio": s_budget / s_free,
        "gain_kept": kept,
    }
    lines = [
        f"model {args.model} on {args.device}: {len(shares)} problems",
        "",
        "| run | wall s (command) | before tuning s | tuning s | coverage | problems tuned | GEMM speedup (claimed) |",
        "|---|---|---|---|---|---|---|",
    ]
    for tag, res, s in ((f"--budget {args.budget:g}", budgeted, s_budget), ("no budget", free, s_free)):
        cov = f"{res['coverage_pct']:.1f}%" if res["coverage_pct"] is not None else "-"
        tuned = sum(1 for r in res["records"] if r["source"] == "tuned")
        before = f"{res['before_tuning_s']:.1f}" if res["before_tuning_s"] is not None else "-"
        lines.append(
            f"| {tag} | {res['wall_s']:.1f} | {before} | {res['tuning_s'] or 0:.1f} | {cov} | {tuned} | {s:.3f}x |"
        )
    lines += ["", f"budgeted / free: {s_budget / s_free:.4f}; share of the gain kept: {kept:.1%}"]
    for tag, res in (("budgeted", budgeted), ("free", free)):
        times = sorted(
            r["tune_s"] for r in res["records"] if r["source"] == "tuned" and r["tune_s"] is not None
        )
        if times:
            result[f"median_tune_s_{tag}"] = times[len(times) // 2]
            lines.append(
                f"{tag}: per tuned problem median {times[len(times) // 2] * 1e3:.0f} ms, "
                f"max {times[-1] * 1e3:.0f} ms ({len(times)} problems)"
            )
    (args.out / "tune-model.json").write_text(json.dumps(result, indent=1))
    (args.out / "tune-model.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
