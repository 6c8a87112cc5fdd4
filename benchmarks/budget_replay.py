"""How much of a budget-free tune can a budget keep? A replay of measured tunes (no GPU).

    python benchmarks/budget_replay.py benchmarks/results/tune-model-h200/budget-vs-free.json \
        --budgets 8,10,12,15,20,30 --out benchmarks/results/budget-replay-h200

Reads the budget-free runs that ``benchmarks/tune_model_budget.py`` recorded (each problem's
share of the model's GEMM time, its tuning time and the speedup its tuning found) and
replays, for each run and each budget, two ways of spending the budget on those problems
with the times they really took:

- **the order**: :class:`unimatmul.tuning.plan.TunePlan` itself, the order ``unimatmul tune
  --budget`` uses, learning from each replayed problem as it would from a tuned one;
- **the oracle**: knows every problem's gain and time before it starts, and takes them by
  gain x share per second (the best first problem first, then what fits).

Each replay starts its clock at the start-up that run's budgeted twin measured ("before
tuning": importing torch, the libraries, the model's problems), and its first problem takes
what the free run's first problem took (the process's first compiles and library loads),
whichever problem it is. A problem that would end past the budget is not counted (the
command caps it). The kept share of the gain is ``(S_budget - 1) / (S_free - 1)`` of the
model's GEMM speedups, each problem weighted by its share.

Writes ``budget-replay.json``, ``budget-replay.md`` and ``budget-replay.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from unimatmul.core.problem import Problem
from unimatmul.tuning.plan import PlannedJob, TunePlan


@dataclass
class Row:
    problem: str
    share: float
    tune_s: float
    speedup: float

    @property
    def gain(self) -> float:
        return self.share * (1.0 - 1.0 / self.speedup)


def model_speedup(rows: list[Row], tuned: set[str]) -> float:
    total = sum(r.share for r in rows)
    return total / sum(r.share / (r.speedup if r.problem in tuned else 1.0) for r in rows)


def kept(rows: list[Row], tuned: set[str]) -> float:
    free = model_speedup(rows, {r.problem for r in rows})
    return (model_speedup(rows, tuned) - 1.0) / (free - 1.0) if free > 1.0 else math.nan


def replay_order(
    rows: list[Row], budget: float, before: float, first_s: float, device: str = "cuda"
) -> set[str]:
    """The problems TunePlan's order tunes within ``budget`` (see the module docstring)."""
    now = [before]
    items = []
    for row in rows:
        job = SimpleNamespace(
            problem=Problem.from_key(row.problem),
            target=SimpleNamespace(device=SimpleNamespace(kind=device)),
            label=row.problem,
            stored=lambda selector: None,
        )
        items.append(PlannedJob(job=job, share=row.share))  # type: ignore[arg-type]
    by_item = {id(item): row for item, row in zip(items, rows, strict=True)}
    plan = TunePlan(items=items, budget_s=budget, clock=lambda: now[0], run_started=0.0)
    tuned: set[str] = set()
    for n, item in enumerate(plan.order(None)):  # type: ignore[arg-type]
        row = by_item[id(item)]
        took = max(row.tune_s, first_s) if n == 0 else row.tune_s
        now[0] += took
        if now[0] > budget:
            break
        tuned.add(row.problem)
        plan.done(item, SimpleNamespace(speedup=row.speedup, tune_s=took), "tuned")  # type: ignore[arg-type]
    return tuned


def replay_oracle(rows: list[Row], budget: float, before: float, first_s: float) -> set[str]:
    """What a plan that knew every gain and time would tune within ``budget``."""
    ranked = sorted((r for r in rows if r.gain > 0), key=lambda r: r.gain / max(r.tune_s, 1e-3), reverse=True)
    left = budget - before
    tuned: set[str] = set()
    for n, row in enumerate(ranked):
        took = max(row.tune_s, first_s) if n == 0 else row.tune_s
        if took <= left:
            tuned.add(row.problem)
            left -= took
    return tuned


def free_runs(path: Path, code: str | None = None) -> list[dict[str, Any]]:
    """The recorded runs of ``tune_model_budget.py`` (its ``tune-model.json``, or a file of
    ``runs``), each with its free records and its budgeted twin's start-up; only those whose
    ``code`` (what the file says of the code and conditions of each run) holds ``code``,
    where it is given."""
    data = json.loads(path.read_text())
    runs = data.get("runs", [data])
    found = []
    for run in runs:
        if code is not None and code not in run.get("code", ""):
            continue
        rows = [Row(r["problem"], r["share"], r["tune_s"], r["speedup"]) for r in run["free"]["records"]]
        before = run["budgeted"].get("before_tuning_s")
        if rows and before is not None:
            device = "cpu" if run.get("device", "cuda") == "cpu" else "cuda"
            found.append(
                {"rows": rows, "before_s": float(before), "first_s": rows[0].tune_s, "device": device}
            )
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path, nargs="+", help="tune_model_budget.py results (JSON)")
    p.add_argument("--budgets", default="8,10,12,15,20,30")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--code", help="only the runs whose recorded `code` contains this text")
    args = p.parse_args(argv)
    budgets = [float(b) for b in args.budgets.split(",")]
    runs = [run for path in args.runs for run in free_runs(path, args.code)]
    if not runs:
        raise SystemExit("no budget-free run with a budgeted twin's start-up in the given files")
    table = []
    for budget in budgets:
        order = [
            kept(r["rows"], replay_order(r["rows"], budget, r["before_s"], r["first_s"], r["device"]))
            for r in runs
        ]
        oracle = [
            kept(r["rows"], replay_oracle(r["rows"], budget, r["before_s"], r["first_s"])) for r in runs
        ]
        table.append({"budget_s": budget, "order_kept": order, "oracle_kept": oracle})
    result = {
        "what": "replay of measured budget-free tunes: the gain a budget keeps, TunePlan's order against an oracle",
        "runs": [
            {
                "before_s": r["before_s"],
                "first_s": r["first_s"],
                "problems": len(r["rows"]),
                "free_speedup": model_speedup(r["rows"], {x.problem for x in r["rows"]}),
            }
            for r in runs
        ],
        "budgets": table,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "budget-replay.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"Replay of {len(runs)} budget-free tunes (start-up {min(r['before_s'] for r in runs):.1f}-"
        f"{max(r['before_s'] for r in runs):.1f} s, first problem {min(r['first_s'] for r in runs):.1f}-"
        f"{max(r['first_s'] for r in runs):.1f} s): share of the free tune's gain kept",
        "",
        "| budget s | the order: median (range) | oracle: median (range) |",
        "|---|---|---|",
    ]
    for row in table:
        o, q = row["order_kept"], row["oracle_kept"]
        lines.append(
            f"| {row['budget_s']:g} | {statistics.median(o):.0%} ({min(o):.0%}-{max(o):.0%}) | "
            f"{statistics.median(q):.0%} ({min(q):.0%}-{max(q):.0%}) |"
        )
    (args.out / "budget-replay.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return 0
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("order_kept", "the order (TunePlan)"), ("oracle_kept", "oracle")):
        ax.plot(budgets, [100 * statistics.median(r[key]) for r in table], marker="o", label=label)
        ax.fill_between(
            budgets, [100 * min(r[key]) for r in table], [100 * max(r[key]) for r in table], alpha=0.2
        )
    ax.axhline(99, color="grey", linestyle=":", label="target 99 %")
    ax.set_xlabel("budget for the whole run, s")
    ax.set_ylabel("free tune's gain kept, %")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "budget-replay.png", dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
