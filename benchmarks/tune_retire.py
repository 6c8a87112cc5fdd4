"""What retiring losing kernel families saves a model's tuning, and what it costs (GPU or CPU).

    python benchmarks/tune_retire.py --model llama-3-8b --device cuda --rounds 2 \
        --out benchmarks/results/tune-retire-h200

Runs ``unimatmul tune --model MODEL`` in fresh processes, each into a fresh cache file,
in turns: retirement on (``UNIMATMUL_TUNE_RETIRE_AFTER`` unset: the default) and off
(``UNIMATMUL_TUNE_RETIRE_AFTER=0``), ``--rounds`` times, after one unrecorded run that
fills a Triton cache all of them share (``TRITON_CACHE_DIR``): the time per problem with
Triton's cache warm, which is what retirement changes (the compiles run ahead, in
parallel). For each run: the tuning time the command reports, its wall time, the median
tuning time per problem, the candidates measured, and the model's GEMM speedup its
records claim (each problem weighted by its share of the model's GEMM time:
``sum(share) / sum(share / speedup)``). Across runs: how often the winners of an on run
and an off run agree, against two runs of the same setting.

Writes ``tune-retire.json``, ``tune-retire.md`` and ``tune-retire.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tune_model_budget, beside this file
from tune_model_budget import model_speedup, record_speedup, run_tune

MODES = {"on": None, "off": "0"}


def tune(args: argparse.Namespace, work: Path, tag: str, retire: str | None, triton: Path) -> dict[str, Any]:
    records = work / f"{tag}.json"
    env = {k: v for k, v in os.environ.items() if k != "UNIMATMUL_TUNE_RETIRE_AFTER"}
    env.update(UNIMATMUL_CACHE=str(work / f"{tag}.msgpack"), TRITON_CACHE_DIR=str(triton))
    if retire is not None:
        env["UNIMATMUL_TUNE_RETIRE_AFTER"] = retire
    argv = ["--model", args.model, "--device", args.device, "--quiet", "--json", str(records)]
    if args.tokens:
        argv += ["--tokens", args.tokens]
    stdout, wall = run_tune(argv, env)
    rows = [r for r in json.loads(records.read_text()) if r["source"] == "tuned"]
    coverage = re.search(r"tuned in ([0-9.]+) s", stdout)
    retired = re.search(r"retired: (\d+) candidates not measured \(([^)]*)\)", stdout)
    times = sorted(r["tune_s"] for r in rows)
    return {
        "tag": tag,
        "wall_s": wall,
        "tuning_s": float(coverage.group(1)) if coverage else None,
        "median_problem_s": statistics.median(times) if times else None,
        "problems": len(rows),
        "candidates_measured": sum(len(r["results"]) for r in rows),
        "retired": {"candidates": int(retired.group(1)), "by_family": retired.group(2)} if retired else None,
        "speedup": claimed_speedup(rows),
        "winners": {r["problem"]: r["winner"] for r in rows},
        # the families each problem left out (its record's settings["retired"])
        "retired_families": {
            r["problem"]: r["settings"]["retired"]["families"]
            for r in rows
            if "retired" in r.get("settings", {})
        },
        "tune_s": {r["problem"]: r["tune_s"] for r in rows},
    }


def claimed_speedup(rows: list[dict[str, Any]]) -> float:
    """The GEMM time's speedup over Default the records claim, weighted by share."""
    shares = {r["problem"]: r["share"] for r in rows}
    return model_speedup(shares, {r["problem"]: record_speedup(r) for r in rows})


def agreement(a: dict[str, str], b: dict[str, str]) -> float:
    common = set(a) & set(b)
    return sum(a[p] == b[p] for p in common) / len(common) if common else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", help="token counts (default: the command's)")
    p.add_argument("--rounds", type=int, default=2, help="on/off pairs (default 2)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        triton = work / "triton"
        triton.mkdir()
        warming = tune(args, work, "warming", None, triton)
        print(f"warming run (Triton cache filled): {warming['tuning_s']} s of tuning", flush=True)
        for i in range(args.rounds):
            # Alternate which goes first, so that a drift of the machine hits both alike.
            order = list(MODES.items()) if i % 2 == 0 else list(MODES.items())[::-1]
            for mode, value in order:
                run = tune(args, work, f"{mode}-{i}", value, triton)
                run["mode"] = mode
                runs.append(run)
                print(
                    f"{mode}: tuning {run['tuning_s']} s, wall {run['wall_s']:.1f} s, median/problem "
                    f"{run['median_problem_s'] * 1e3:.0f} ms, {run['candidates_measured']} candidates, "
                    f"claimed {run['speedup']:.4f}x",
                    flush=True,
                )
    pairs: dict[str, list[float]] = {"on-on": [], "off-off": [], "on-off": []}
    for a, b in itertools.combinations(runs, 2):
        key = "-".join(sorted((a["mode"], b["mode"]), reverse=True))
        pairs[key].append(agreement(a["winners"], b["winners"]))
    summary = {
        mode: {
            "tuning_s": [r["tuning_s"] for r in runs if r["mode"] == mode],
            "median_problem_ms": [round(r["median_problem_s"] * 1e3, 1) for r in runs if r["mode"] == mode],
            "candidates_measured": [r["candidates_measured"] for r in runs if r["mode"] == mode],
            "speedup": [round(r["speedup"], 4) for r in runs if r["mode"] == mode],
        }
        for mode in MODES
    }
    result = {
        "model": args.model,
        "device": args.device,
        "rounds": args.rounds,
        "summary": summary,
        "agreement": {k: [round(v, 3) for v in vs] for k, vs in pairs.items()},
        "runs": runs,
    }
    (args.out / "tune-retire.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"`unimatmul tune --model {args.model} --device {args.device}`, Triton's cache warm, "
        f"{args.rounds} runs of each setting in turns",
        "",
        "| retirement | tuning s | median per problem ms | candidates measured | claimed GEMM speedup |",
        "|---|---|---|---|---|",
    ]
    for mode, s in summary.items():
        lines.append(
            f"| {mode} | {', '.join(f'{x:.1f}' for x in s['tuning_s'] if x is not None)} | "
            f"{', '.join(f'{x:.0f}' for x in s['median_problem_ms'])} | "
            f"{', '.join(str(x) for x in s['candidates_measured'])} | "
            f"{', '.join(f'{x:.3f}x' for x in s['speedup'])} |"
        )
    lines += ["", "| winners agree | pairs |", "|---|---|"]
    for key, values in pairs.items():
        if values:
            lines.append(f"| {key} | {', '.join(f'{v:.1%}' for v in values)} |")
    (args.out / "tune-retire.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        plot(runs, args.out / "tune-retire.png")
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
    return 0


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for run in runs:
        times = sorted(run["tune_s"].values())
        ax.plot(
            [t * 1e3 for t in times],
            [(i + 1) / len(times) for i in range(len(times))],
            color="tab:blue" if run["mode"] == "on" else "tab:orange",
            label=f"retirement {run['mode']} ({run['tag']})",
        )
    ax.set_xscale("log")
    ax.set_xlabel("tuning time per problem (ms), Triton cache warm")
    ax.set_ylabel("share of problems")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
