"""The CPU benchmark: Default (numpy.matmul) vs the tuned kernel for every preset shape.

Run on the machine to measure, ideally a quiet one::

    python benchmarks/cpu_presets.py [--presets bert-base gpt2 ...] [--out benchmarks/results/cpu-presets]

For each shape (f32, NumPy arrays) it tunes with the default harness settings into a
temporary cache file of its own (the user's cache is never touched), then measures
Default and the tuned winner again in a separate confirmation run on fresh operands,
without pruning, so that the quoted speedup is not the tuning run's own best pick
(a minimum over noisy medians flatters the winner). Medians are per call, with inputs
rotated through more memory than the last-level cache.

Writes cpu-presets.json (every number and the machine's facts) and cpu-presets.md
(tables) under --out, after every shape, so that a run cut short still leaves results.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from unimatmul import __version__
from unimatmul.backend import DEFAULT, Candidate, Target
from unimatmul.cache.protocol import open_store
from unimatmul.cache.record import OK, TuningRecord
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.core.plugins import PluginManager
from unimatmul.core.problem import Problem
from unimatmul.core.runners import DefaultRunner
from unimatmul.tuning.harness import CpuTimer, Harness, HarnessConfig
from unimatmul.tuning.selector import Selector

PRESETS = ("bert-base", "gpt2", "llama3-8b", "resnet50")


@dataclass
class Row:
    preset: str
    shape: str
    key: str
    candidates: int
    tuned_winner: str
    tune_s: float
    tuning_default_us: float | None
    tuning_winner_us: float
    best_backend_candidate: str | None  # the fastest non-Default candidate of the tuning run
    best_backend_us: float | None
    default_us: float  # confirmation run
    tuned_us: float  # confirmation run
    speedup: float  # confirmation run: default_us / tuned_us


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def machine_facts(selector: Selector, target: Target) -> dict[str, Any]:
    plat = selector.platform(target)
    return {
        "cpu": plat.device,
        "arch": plat.arch,
        "cores_used": plat.cores,
        "cpus_online": os.cpu_count(),
        "namespace": plat.namespace,
        "libraries": dict(plat.libraries),
        "numpy_blas": _numpy_blas(),
        "python": platform.python_version(),
        "unimatmul": __version__,
        "os": f"{platform.system()} {platform.release()}",
    }


def _numpy_blas() -> str:
    try:
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # older NumPy: no dict mode; the name is a nicety
        return "unknown"


def confirm(
    problem: Problem, target: Target, selector: Selector, winner: str, settings: HarnessConfig
) -> tuple[float, float]:
    """Median seconds per call of Default and of ``winner``, measured afresh, unpruned."""
    adapter = target.adapter
    entries: list[tuple[Candidate, Any]] = [(DEFAULT, lambda: DefaultRunner(adapter, problem.activation))]
    candidate = Candidate.from_identity(winner)
    if candidate != DEFAULT:
        entries.append((candidate, lambda: selector.prepare(problem, candidate, target)))
    record = Harness(CpuTimer(), settings).measure(problem, target, entries)
    medians = {r.identity: r.median_s for r in record.results if r.status == OK and r.median_s}
    default_s = medians[DEFAULT.identity]
    return default_s, medians.get(candidate.identity, default_s)


def best_backend(record: TuningRecord) -> tuple[str | None, float | None]:
    timed = [r for r in record.results if r.identity != DEFAULT.identity and r.status == OK and r.median_s]
    if not timed:
        return None, None
    best = min(timed, key=lambda r: r.median_s or math.inf)
    return best.identity, (best.median_s or 0.0) * 1e6


def summarize(rows: list[Row]) -> dict[str, Any]:
    presets: dict[str, Any] = {}
    for name in dict.fromkeys(r.preset for r in rows):
        mine = [r for r in rows if r.preset == name]
        presets[name] = {
            "shapes": len(mine),
            "geomean_speedup": geomean([r.speedup for r in mine]),
            "tuning_run_geomean_speedup": geomean(
                [r.tuning_default_us / r.tuning_winner_us for r in mine if r.tuning_default_us]
            ),
            "tune_s": sum(r.tune_s for r in mine),
        }
    return {
        "presets": presets,
        "overall_geomean_speedup": geomean([r.speedup for r in rows]),
        "shapes": len(rows),
        "tune_s": sum(r.tune_s for r in rows),
    }


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [
        "# CPU presets: numpy.matmul (Default) vs the kernel unimatmul tuned",
        "",
        f"- Date: {data['date']}",
        f"- CPU: {m['cpu']} ({m['arch']}), {m['cores_used']} cores used of {m['cpus_online']} online",
        f"- Libraries: {', '.join(f'{k} {v}' for k, v in m['libraries'].items())}; NumPy BLAS: {m['numpy_blas']}",
        f"- Python {m['python']}, unimatmul {m['unimatmul']}, {m['os']}",
        f"- Load average (1 min) at start / end: {data['load_start']:.2f} / {data['load_end']:.2f}",
        f"- Arrays: NumPy f32, row-major; harness: default settings ({data['settings']['budget_s']} s "
        f"budget per candidate, median, inputs rotated through 2x the last-level cache)",
    ]
    if data.get("note"):
        lines += ["", f"> {data['note']}"]
    lines += [
        "",
        "`default us` and `tuned us` come from a confirmation run after tuning (fresh operands, no "
        "pruning); `speedup` is their ratio. `tuning run` is the speedup the tuning run itself saw. "
        "`tune s` is the wall-clock time to tune the shape (every candidate checked and measured).",
        "",
    ]
    summary = data["summary"]
    lines += [
        "| preset | shapes | geomean speedup | tuning-run geomean | tune s |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, s in summary["presets"].items():
        lines.append(
            f"| {name} | {s['shapes']} | {s['geomean_speedup']:.2f}x | {s['tuning_run_geomean_speedup']:.2f}x "
            f"| {s['tune_s']:.1f} |"
        )
    lines.append(
        f"| **all** | {summary['shapes']} | **{summary['overall_geomean_speedup']:.2f}x** | | "
        f"{summary['tune_s']:.1f} |"
    )
    for name in summary["presets"]:
        lines += [
            "",
            f"## {name}",
            "",
            "| shape (MxNxK) | default us | tuned winner | tuned us | speedup | tuning run | best non-Default (us) | tune s |",
            "|---|---:|---|---:|---:|---:|---|---:|",
        ]
        for r in data["rows"]:
            if r["preset"] != name:
                continue
            tuning = (
                r["tuning_default_us"] / r["tuning_winner_us"] if r["tuning_default_us"] else float("nan")
            )
            best = (
                f"{r['best_backend_candidate']} ({r['best_backend_us']:,.1f})"
                if r["best_backend_candidate"]
                else "-"
            )
            lines.append(
                f"| {r['shape']} | {r['default_us']:,.1f} | {r['tuned_winner']} | {r['tuned_us']:,.1f} "
                f"| {r['speedup']:.2f}x | {tuning:.2f}x | {best} | {r['tune_s']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), help="presets to run (default: all)")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "cpu-presets", help="output folder"
    )
    parser.add_argument("--budget-ms", type=float, default=None, help="measuring time per candidate")
    parser.add_argument("--note", default="", help="a line for the report (e.g. the machine was busy)")
    args = parser.parse_args(argv)

    plugins = PluginManager()
    presets = plugins.presets()
    unknown = [p for p in args.presets if p not in presets]
    if unknown:
        parser.error(f"unknown presets {unknown}; valid: {', '.join(sorted(presets))}")
    settings = HarnessConfig()
    if args.budget_ms is not None:
        settings.budget_s = args.budget_ms / 1e3
    confirm_settings = HarnessConfig(
        budget_s=settings.budget_s, prune_ratio=math.inf, first_prune_ratio=math.inf, seed=settings.seed + 1
    )
    target = Target(adapter_for_kind("numpy"), CPU)
    args.out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="unimatmul-bench-") as tmp:
        selector = Selector(plugins=plugins, store=open_store(Path(tmp) / "cache.msgpack"), settings=settings)
        if not selector.backends_for(target):
            sys.stderr.write("no backend is available for numpy on cpu (is onednn-cpu-gomp installed?)\n")
            return 3
        data: dict[str, Any] = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine_facts(selector, target),
            "settings": settings.to_dict(),
            "load_start": os.getloadavg()[0],
            "note": args.note,
            "rows": [],
        }
        rows: list[Row] = []
        for name in args.presets:
            for shape in presets[name].shapes:
                problem = Problem.parse_shape(f"{shape}:f32")
                started = time.perf_counter()
                record = selector.tune(problem, target, force=True)
                tune_s = time.perf_counter() - started
                default_s, tuned_s = confirm(problem, target, selector, record.winner, confirm_settings)
                best_id, best_us = best_backend(record)
                row = Row(
                    preset=name,
                    shape=shape,
                    key=problem.key,
                    candidates=len(record.results),
                    tuned_winner=record.winner,
                    tune_s=tune_s,
                    tuning_default_us=None if record.default_s is None else record.default_s * 1e6,
                    tuning_winner_us=record.winner_s * 1e6,
                    best_backend_candidate=best_id,
                    best_backend_us=best_us,
                    default_us=default_s * 1e6,
                    tuned_us=tuned_s * 1e6,
                    speedup=default_s / tuned_s,
                )
                rows.append(row)
                print(
                    f"{name:<10} {shape:<16} default {row.default_us:>11,.1f} us   {row.tuned_winner:<28} "
                    f"{row.tuned_us:>11,.1f} us   {row.speedup:5.2f}x   tuned in {tune_s:5.2f} s",
                    flush=True,
                )
                data["rows"] = [asdict(r) for r in rows]
                data["summary"] = summarize(rows)
                data["load_end"] = os.getloadavg()[0]
                (args.out / "cpu-presets.json").write_text(
                    json.dumps(data, indent=2) + "\n", encoding="utf-8"
                )
                (args.out / "cpu-presets.md").write_text(markdown(data), encoding="utf-8")
    summary = data["summary"]
    for name, s in summary["presets"].items():
        print(f"{name:<10} geomean speedup {s['geomean_speedup']:.3f}x over {s['shapes']} shapes")
    print(
        f"overall    geomean speedup {summary['overall_geomean_speedup']:.3f}x over {summary['shapes']} shapes"
    )
    print(f"wrote {args.out / 'cpu-presets.json'} and {args.out / 'cpu-presets.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
