"""Distributed tuning: one suite tuned by ``unimatmul tune`` under torchrun on 1 and on N ranks.

    python benchmarks/distributed_tune.py --device cuda --suite gpu200 --ranks 1,2 --out DIR
    python benchmarks/distributed_tune.py --device cpu --suite bert-base --ranks 1,2 --out DIR

Each rank count runs the real command (``python -m torch.distributed.run --standalone
--nproc-per-node N -m unimatmul tune ...``) into a fresh cache file of its own. The
figure is the *tuning phase* that the command reports (``tuning: X s on N ranks``: from
the broadcast plan to the gathered records, the part that is distributed), so that the
start-up of each process (importing torch, CUDA and NCCL set-up: paid once per rank, in
parallel) does not hide the scaling; the wall time of each command is reported beside it.
Speedup = T(1 rank) / T(N ranks); efficiency = speedup / N. Each merged cache must hold
every problem exactly once.

Writes ``distributed-tune-DEVICE.json`` (every number) and ``distributed-tune-DEVICE.md`` (the
table) under --out; each run's cache, records and log stay in a temporary folder.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from unimatmul.cache.file_store import MsgpackFileStore

# Linear layers of real models (n = output features, k = input features): BERT-base /
# GPT-2 (hidden 768), Llama-3-8B (hidden 4096, GQA, MLP 14336), and a 1024-wide block.
GPU_LAYERS = (
    (2304, 768),
    (768, 768),
    (3072, 768),
    (768, 3072),
    (6144, 4096),
    (4096, 4096),
    (14336, 4096),
    (4096, 14336),
    (3072, 1024),
    (1024, 3072),
)
# Rows from decode (1) to long prefill (8192): 20 values of m.
GPU_ROWS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096, 8192)


def suite_args(suite: str, device: str) -> tuple[list[str], int]:
    """The command's arguments for a suite, and how many problems it holds."""
    if suite == "gpu200":
        shapes = [f"{m}x{n}x{k}" for n, k in GPU_LAYERS for m in GPU_ROWS]
        args = [arg for shape in shapes for arg in ("--shape", shape)]
        return [*args, "--dtype", "bf16"], len(shapes)
    from unimatmul.core.plugins import get_plugin_manager

    presets = get_plugin_manager().presets()
    names = suite.split(",")
    count = len({shape for name in names for shape in presets[name].shapes})
    return [arg for name in names for arg in ("--preset", name)], count


def run_once(ranks: int, args: list[str], device: str, out: Path, env: dict[str, str]) -> dict[str, Any]:
    cache = out / f"cache-{ranks}.msgpack"
    for stale in (cache, out / f"records-{ranks}.json"):
        stale.unlink(missing_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    command += ["-m", "unimatmul", "tune", *args, "--quiet", "--json", str(out / f"records-{ranks}.json")]
    if device != "cpu":
        command += ["--array", "torch", "--device", device]
    started = time.perf_counter()
    done = subprocess.run(
        command, env={**env, "UNIMATMUL_CACHE": str(cache)}, capture_output=True, text=True, check=False
    )
    wall = time.perf_counter() - started
    (out / f"tune-{ranks}.log").write_text(done.stdout + "\n--- stderr\n" + done.stderr)
    if done.returncode != 0:
        msg = f"{ranks} ranks: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        raise RuntimeError(msg)
    phase = re.search(r"^tuning: ([\d.]+) s on (\d+) ranks \(busy ([\d.]+) s", done.stdout, re.M)
    if phase is None:
        msg = f"{ranks} ranks: no 'tuning:' line in the output:\n{done.stdout[-2000:]}"
        raise RuntimeError(msg)
    per_rank = [
        {"rank": int(r), "tuned": int(n), "busy_s": float(b)}
        for r, n, b in re.findall(r"^  rank (\d+): (\d+) tuned, ([\d.]+) s busy", done.stdout, re.M)
    ]
    store = MsgpackFileStore(cache, read_only=True)
    keys = [key for _, key, _ in store.items()]
    records = json.loads((out / f"records-{ranks}.json").read_text())
    return {
        "ranks": ranks,
        "wall_s": wall,
        "tuning_s": float(phase.group(1)),
        "busy_s": float(phase.group(3)),
        "per_rank": per_rank,
        "entries": len(keys),
        "distinct_entries": len(set(keys)),
        "file_problems": store.problems,
        "winners": {r["problem"]: r["winner"] for r in records},
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (each rank uses cuda:LOCAL_RANK)")
    parser.add_argument("--suite", default="bert-base", help="gpu200, or preset names joined by commas")
    parser.add_argument("--ranks", default="1,2", help="rank counts to run, e.g. 1,2")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/distributed"))
    parser.add_argument("--target", type=float, default=0.9, help="efficiency to reach (exit 1 below it)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="unimatmul-distributed-"))
    name = f"distributed-tune-{args.device.split(':')[0]}"
    print(f"caches, records and logs of each run: {work}", flush=True)
    suite, count = suite_args(args.suite, args.device)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_") or k == "UNIMATMUL_GPU_BUDGET_S"
    }
    env["PYTHONUNBUFFERED"] = "1"
    if args.device == "cpu":
        # torchrun gives each of several processes one OpenMP thread, and one process all
        # of them: the same for every rank count, so that only the number of ranks differs.
        env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
    runs = []
    for ranks in (int(r) for r in args.ranks.split(",")):
        print(f"== {ranks} rank(s): {count} problems on {args.device}", flush=True)
        result = run_once(ranks, suite, args.device, work, env)
        print(
            f"   tuning {result['tuning_s']:.2f} s (wall {result['wall_s']:.1f} s), "
            f"{result['distinct_entries']}/{result['entries']} distinct entries",
            flush=True,
        )
        runs.append(result)
        # What is measured so far, in case a later run is cut short.
        (args.out / f"{name}.partial.json").write_text(
            json.dumps([{k: v for k, v in r.items() if k != "winners"} for r in runs], indent=2)
        )
    base = next((r for r in runs if r["ranks"] == 1), None)
    failures = []
    for r in runs:
        if r["entries"] != count or r["distinct_entries"] != count or r["file_problems"]:
            failures.append(
                f"{r['ranks']} ranks: {r['entries']} entries for {count} problems {r['file_problems']}"
            )
        if base is not None and r["ranks"] > 1:
            r["speedup"] = base["tuning_s"] / r["tuning_s"]
            r["efficiency"] = r["speedup"] / r["ranks"]
            r["wall_speedup"] = base["wall_s"] / r["wall_s"]
            same = sum(base["winners"].get(k) == w for k, w in r["winners"].items())
            r["same_winner_as_1_rank"] = f"{same}/{len(r['winners'])}"
            if r["efficiency"] < args.target:
                failures.append(f"{r['ranks']} ranks: efficiency {r['efficiency']:.3f} < {args.target}")
    facts = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "device": args.device,
        "suite": args.suite,
        "problems": count,
        "omp_num_threads": env.get("OMP_NUM_THREADS"),
    }
    if args.device != "cpu":
        import torch

        facts["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        facts["torch"] = torch.__version__
    summary = {"facts": facts, "runs": [{k: v for k, v in r.items() if k != "winners"} for r in runs]}
    summary["failures"] = failures
    (args.out / f"{name}.json").write_text(json.dumps(summary, indent=2))
    (args.out / f"{name}.partial.json").unlink(missing_ok=True)
    lines = [
        f"# Distributed tuning: {args.suite} ({count} problems) on {args.device}",
        "",
        f"{facts['date']}, {facts['host']}, {facts.get('gpus') or str(facts['cpus']) + ' CPUs'}",
        "",
        "| ranks | tuning s | speedup | efficiency | wall s | busy s per rank | entries |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        busy = ", ".join(f"{p['busy_s']:.1f}" for p in r["per_rank"])
        speedup = f"{r['speedup']:.2f}x" if "speedup" in r else "-"
        efficiency = f"{r['efficiency']:.3f}" if "efficiency" in r else "-"
        lines.append(
            f"| {r['ranks']} | {r['tuning_s']:.2f} | {speedup} | {efficiency} | {r['wall_s']:.1f} | {busy} "
            f"| {r['distinct_entries']} |"
        )
    lines += ["", *(f"FAILED: {f}" for f in failures)]
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
