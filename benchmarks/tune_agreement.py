"""Do two independent tuning runs agree? Tunes the same problems several times, each in a
fresh process with a fresh cache file, and compares the winners and the speedups.

    python benchmarks/tune_agreement.py --preset bert-base --runs 6 --out benchmarks/results/tune-agreement-cpu
    python benchmarks/tune_agreement.py --device cuda --runs 4 --out benchmarks/results/tune-agreement-h200

Each run is ``python -m unimatmul tune ... --json FILE`` in a process of its own, with
``UNIMATMUL_CACHE`` pointing at a new, empty file (the user's cache is never read or
written): nothing one run measured can reach the next. With ``--preset`` the runs tune
that preset (NumPy on the CPU by default); without one, :data:`MODEL_PRODUCTS`: 16
products of real model configs (``unimatmul/tuning/model_configs.py``), decode and
prefill, as PyTorch routing meets them (``x @ W^T``, with the layer's bias), in the
config's dtype; give ``--device cuda`` for a GPU (``--array torch`` is then implied).

Every pair of runs is compared: the share of problems whose winners are the same
identity, and how far their speedups (Default's time over the winner's, as each run
measured) are apart. ``--pythonpath DIR`` runs another copy of the package (a baseline
checkout) instead of the installed one. The runs see no ``UNIMATMUL_*`` variable of the
calling environment but the cache file's and those given with ``--setting NAME=VALUE``
(repeatable; recorded with the set), so that a set measures what it says. Writes
``agreement.json`` (every run's records, the load average around each run, every pair),
``agreement.md`` (tables) and, with
matplotlib, ``agreement.png`` under ``--out``; ``--tag`` names the set of runs in them, so
that a baseline and the current code can share one folder.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from unimatmul import __version__
from unimatmul.core.problem import Problem
from unimatmul.tuning.model_configs import MODELS
from unimatmul.tuning.model_gemms import model_gemms
from unimatmul.tuning.record_mode import RecordedProblem

#: (model, GEMM, tokens): 16 dense products of the built-in configs, decode and prefill.
MODEL_PRODUCTS: tuple[tuple[str, str, int], ...] = (
    ("llama-3-8b", "q_proj", 1),
    ("llama-3-8b", "k_proj", 1),
    ("llama-3-8b", "mlp.gate_proj", 1),
    ("llama-3-8b", "mlp.down_proj", 1),
    ("llama-3-8b", "q_proj", 2048),
    ("llama-3-8b", "mlp.down_proj", 2048),
    ("qwen2.5-7b", "q_proj", 16),  # with its bias
    ("qwen2.5-7b", "mlp.gate_proj", 16),
    ("qwen2.5-7b", "mlp.down_proj", 512),
    ("mixtral-8x7b", "mlp.gate", 64),  # the router
    ("deepseek-v2-lite", "kv_a_proj_with_mqa", 1),
    ("deepseek-v2-lite", "kv_b_proj", 512),
    ("deepseek-v2-lite", "mlp.shared_experts.down_proj", 64),
    ("gpt-oss-20b", "o_proj", 8),  # with its bias
    ("gpt-oss-20b", "q_proj", 4096),
    ("qwen3-30b-a3b", "o_proj", 32),
)


def model_problems(dtype: str | None) -> list[dict[str, str]]:
    """The products of :data:`MODEL_PRODUCTS`: label and problem key."""
    out = []
    for model, name, tokens in MODEL_PRODUCTS:
        found = [g for g in model_gemms(MODELS[model], [tokens], dtype=dtype) if g.name == name]
        if not found:
            msg = f"{model} has no GEMM {name!r} at {tokens} tokens"
            raise SystemExit(msg)
        gemm = found[0]
        out.append({"label": f"{model} {name} t={tokens}", "key": gemm.problem().key})
    return out


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def rows_of(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Each problem's row of one run, from ``unimatmul tune --json``'s records."""
    rows: dict[str, Any] = {}
    for r in records:
        default_s, winner_s = r.get("default_s"), r.get("winner_s")
        speedup = default_s / winner_s if default_s and winner_s else 1.0
        settings = r.get("settings") or {}
        win = settings.get("win") or {}
        rows[r["problem"]] = {
            "winner": r["winner"],
            "speedup": round(speedup, 4),
            "default_us": round(default_s * 1e6, 2) if default_s else None,
            "winner_us": round(winner_s * 1e6, 2) if winner_s else None,
            "confidence": settings.get("confidence"),
            "bound_low": win.get("low"),
            "bound_high": win.get("high"),
            "tied": win.get("tied"),
            "fastest": win.get("fastest"),
            "repeat": (settings.get("repeat") or {}).get("verdict"),
            "tune_s": round(r.get("tune_s") or 0.0, 3),
            # Every candidate's status and median (the winner's and Default's from the
            # repeat, where there was one): what a replay of another tie rule needs.
            "candidates": {
                c["identity"]: {
                    "status": c["status"],
                    "median_us": round(c["median_s"] * 1e6, 3) if c.get("median_s") else None,
                    "samples": c.get("samples"),
                }
                for c in r.get("results", [])
            },
        }
    return rows


def tune_once(args: argparse.Namespace, record_file: Path | None, folder: Path, index: int) -> dict[str, Any]:
    """One tuning run in a fresh process, over a fresh cache file: its records and conditions."""
    cache = folder / f"cache-{index}.msgpack"
    out_json = folder / f"run-{index}.json"
    command = [sys.executable, "-m", "unimatmul", "tune", "--quiet", "--json", str(out_json)]
    if args.preset:
        command += ["--preset", args.preset]
    else:
        assert record_file is not None
        command += ["--from", str(record_file)]
    if args.device != "cpu" or args.array:
        command += ["--device", args.device, "--array", args.array or "torch"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    env.update(dict(args.setting))
    env["UNIMATMUL_CACHE"] = str(cache)
    if args.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([args.pythonpath, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    before = _load()
    started = time.perf_counter()
    # Run from the temporary folder: a checkout in the working directory would shadow --pythonpath.
    done = subprocess.run(command, env=env, cwd=folder, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        msg = f"run {index} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        raise SystemExit(msg)
    rows = rows_of(json.loads(out_json.read_text()))
    return {
        "index": index,
        "wall_s": round(wall, 2),
        "load_before": before,
        "load_after": _load(),
        "rows": rows,
    }


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """How two runs agree: the share of common problems with the same winner, and the
    spread of their speedups (the ratio of the larger to the smaller, per problem)."""
    keys = sorted(set(a["rows"]) & set(b["rows"]))
    same = [k for k in keys if a["rows"][k]["winner"] == b["rows"][k]["winner"]]
    ratios = []
    for k in keys:
        x, y = a["rows"][k]["speedup"], b["rows"][k]["speedup"]
        ratios.append(max(x, y) / min(x, y))
    return {
        "runs": [a["index"], b["index"]],
        "problems": len(keys),
        "winners_agree": len(same),
        "agreement": round(len(same) / len(keys), 4) if keys else None,
        "disagree": [k for k in keys if k not in same],
        "geomean": [
            round(geomean([a["rows"][k]["speedup"] for k in keys]), 4),
            round(geomean([b["rows"][k]["speedup"] for k in keys]), 4),
        ],
        "speedup_ratio_median": round(sorted(ratios)[len(ratios) // 2], 4) if ratios else None,
        "speedup_ratio_max": round(max(ratios), 4) if ratios else None,
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    pairs = [compare(a, b) for a, b in itertools.combinations(runs, 2)]
    agreements = [p["agreement"] for p in pairs if p["agreement"] is not None]
    keys = sorted(set.intersection(*(set(r["rows"]) for r in runs))) if runs else []
    per_problem = {}
    for k in keys:
        winners = [r["rows"][k]["winner"] for r in runs]
        top = max(set(winners), key=winners.count)
        per_problem[k] = {"winners": winners, "modal_share": round(winners.count(top) / len(winners), 4)}
    return {
        "pairs": pairs,
        "mean_pair_agreement": round(sum(agreements) / len(agreements), 4) if agreements else None,
        "min_pair_agreement": min(agreements) if agreements else None,
        "geomeans": [round(geomean([r["rows"][k]["speedup"] for k in keys]), 4) for r in runs],
        "per_problem": per_problem,
    }


def write_markdown(data: dict[str, Any], path: Path, labels: dict[str, str]) -> None:
    lines = ["# Do two tuning runs agree?", ""]
    for tag, part in data["sets"].items():
        runs, s = part["runs"], part["summary"]
        lines += [
            f"## {tag}",
            "",
            f"{part['what']}; {len(runs)} runs, each a fresh process with a fresh cache file; "
            f"{len(s['pairs'])} pairs of runs.",
            "",
            f"- winners agree, mean over pairs: **{s['mean_pair_agreement']:.1%}** "
            f"(lowest pair {s['min_pair_agreement']:.1%}; target >= 90%)",
            f"- geometric-mean speedup of each run: {', '.join(f'{g:.3f}x' for g in s['geomeans'])}",
            "- load average (1 min) before each run: "
            + ", ".join(str((r["load_before"] or ["?"])[0]) for r in runs),
            "",
            "| problem | " + " | ".join(f"run {r['index']}" for r in runs) + " | same winner |",
            "| --- | " + " | ".join("---" for _ in runs) + " | --- |",
        ]
        for key, info in s["per_problem"].items():
            cells = []
            for r in runs:
                row = r["rows"][key]
                kernel = "Default" if row["winner"] == "default/default" else row["winner"].split("/", 1)[-1]
                bound = ""
                if row["winner"] != "default/default" and row["bound_low"] is not None:
                    bound = f" (>={row['bound_low']:.2f}x)"
                elif row["bound_high"] is not None:
                    bound = f" (<={row['bound_high']:.2f}x)"
                cells.append(f"{kernel} {row['speedup']:.2f}x{bound}")
            lines.append(
                f"| {labels.get(key) or Problem.from_key(key).shape_text} | "
                + " | ".join(cells)
                + f" | {info['modal_share']:.0%} |"
            )
        lines.append("")
    lines.append(
        "A cell: the winner (Default, or the kernel) and the speedup that run measured; in "
        "brackets the bound its samples give at 95% (`>=` for a kernel: its speedup is at least "
        "that; `<=` for Default: the best contender's is at most that), where the run recorded one. "
        "`same winner`: the share of runs that chose the most common winner."
    )
    path.write_text("\n".join(lines) + "\n")


def plot(data: dict[str, Any], path: Path, labels: dict[str, str]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    sets = list(data["sets"].items())
    fig, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 4.5), squeeze=False, sharey=True)
    for ax, (tag, part) in zip(axes[0], sets, strict=True):
        keys = list(part["summary"]["per_problem"])
        for j, run in enumerate(part["runs"]):
            speedups = [run["rows"][k]["speedup"] for k in keys]
            offsets = [i + (j - (len(part["runs"]) - 1) / 2) * 0.08 for i in range(len(keys))]
            ax.scatter(offsets, speedups, s=18, label=f"run {run['index']}")
        ax.set_xticks(range(len(keys)))
        ax.set_xticklabels(
            [labels.get(k) or Problem.from_key(k).shape_text for k in keys],
            rotation=35,
            ha="right",
            fontsize=7,
        )
        ax.set_yscale("log")
        ax.axhline(1.0, color="grey", lw=0.8)
        share = part["summary"]["mean_pair_agreement"]
        ax.set_title(f"{tag}: winners agree {share:.0%} (mean over pairs)", fontsize=9)
        ax.set_ylabel("speedup over Default, as each run measured")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def _setting(text: str) -> tuple[str, str]:
    """``--setting NAME=VALUE``: a ``UNIMATMUL_*`` variable the runs see (not the cache's)."""
    name, sep, value = text.partition("=")
    if not sep or not name.startswith("UNIMATMUL_") or name == "UNIMATMUL_CACHE":
        msg = f"{text!r}: give NAME=VALUE for a UNIMATMUL_* variable other than UNIMATMUL_CACHE"
        raise argparse.ArgumentTypeError(msg)
    return name, value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", help="tune this preset (default: the 16 model products)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda[:N] or hip[:N]")
    p.add_argument("--array", help="numpy or torch (default: numpy for a preset on the CPU, else torch)")
    p.add_argument("--dtype", help="the model products' dtype (default: each config's)")
    p.add_argument("--runs", type=int, default=2, help="independent runs (default 2)")
    p.add_argument("--tag", default="current", help="name of this set of runs in the results")
    p.add_argument("--pythonpath", help="run the package found in this folder (a baseline)")
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        type=_setting,
        metavar="NAME=VALUE",
        help="a UNIMATMUL_* variable the runs see (repeatable; others are not passed on)",
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/tune-agreement"))
    p.add_argument("--first", type=int, help="only the first N model products (a quick check)")
    p.add_argument("--dry-run", action="store_true", help="list the problems and stop")
    args = p.parse_args(argv)
    if args.runs < 2:
        p.error("--runs must be at least 2")
    products = [] if args.preset else model_problems(args.dtype)[: args.first]
    labels = {item["key"]: item["label"] for item in products}
    if args.dry_run:
        for item in products or [{"label": args.preset, "key": "(the preset's shapes)"}]:
            print(f"{item['label']:50s} {item['key']}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "agreement.json"
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"sets": {}}
    with tempfile.TemporaryDirectory(prefix="tune-agreement-") as tmp:
        folder = Path(tmp)
        record_file = None
        if not args.preset:
            record_file = folder / "products.jsonl"
            device = args.device if ":" in args.device or args.device == "cpu" else f"{args.device}:0"
            array = args.array or "torch"
            lines = [RecordedProblem(Problem.from_key(i["key"]), array, device).to_line() for i in products]
            record_file.write_text("".join(lines))
        runs = []
        for index in range(1, args.runs + 1):
            run = tune_once(args, record_file, folder, index)
            runs.append(run)
            print(
                f"run {index}: {run['wall_s']} s, load {run['load_before']} -> {run['load_after']}",
                flush=True,
            )
    what = f"preset {args.preset}" if args.preset else f"{len(products)} model products"
    data["sets"][args.tag] = {
        "what": f"{what} on {args.device} ({args.array or ('numpy' if args.preset and args.device == 'cpu' else 'torch')})",
        "code": args.pythonpath or f"unimatmul {__version__} (this checkout)",
        "settings": dict(args.setting),
        "runs": runs,
        "summary": summary(runs),
        "labels": labels,
    }
    data["machine"] = {
        "host_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    path.write_text(json.dumps(data, indent=1) + "\n")
    every_label = {k: v for part in data["sets"].values() for k, v in part.get("labels", {}).items()}
    write_markdown(data, args.out / "agreement.md", every_label)
    plotted = plot(data, args.out / "agreement.png", every_label)
    s = data["sets"][args.tag]["summary"]
    print(
        f"{args.tag}: winners agree {s['mean_pair_agreement']:.1%} (mean over pairs), geomeans {s['geomeans']}"
    )
    print(
        f"wrote {path}, {args.out / 'agreement.md'}" + (f", {args.out / 'agreement.png'}" if plotted else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
