"""Where the time of ``unimatmul tune --model`` goes: cProfile of two runs (GPU or CPU).

    python benchmarks/tune_profile.py --model llama-3-8b --device cuda --tokens 1,16,64,512,4096 \
        --out DIR

Runs ``unimatmul tune --model MODEL`` under cProfile in a fresh process twice, each into a
fresh cache file: first with an empty Triton cache (``TRITON_CACHE_DIR`` a new folder:
every Triton candidate compiles), then with the Triton cache the first run left (what a
second tuning on the machine costs). For each run it writes the profile (``cold.prof``,
``warm.prof``) and the functions with the most cumulative and the most own time into
``tune-profile.json``, and prints them; each run's records in full (``cold-records.json``,
``warm-records.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tune_model_budget, beside this file
from tune_model_budget import run_tune

TOP = 40


def profile(args: argparse.Namespace, work: Path, tag: str, triton_cache: Path) -> dict[str, Any]:
    prof = args.out / f"{tag}.prof"
    env = {
        **os.environ,
        "UNIMATMUL_CACHE": str(work / f"{tag}.msgpack"),
        "TRITON_CACHE_DIR": str(triton_cache),
    }
    argv = ["--model", args.model, "--device", args.device, "--quiet", "--json", str(work / f"{tag}.json")]
    if args.tokens:
        argv += ["--tokens", args.tokens]
    _, wall = run_tune(argv, env, prefix=["-m", "cProfile", "-o", str(prof)])
    text = (work / f"{tag}.json").read_text()
    records = json.loads(text)
    (args.out / f"{tag}-records.json").write_text(text)  # every candidate's result
    stats = pstats.Stats(str(prof))
    rows = []
    for (file, line, name), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "function": f"{Path(file).name}:{line}:{name}",
                "calls": calls,
                "own_s": own,
                "cum_s": cumulative,
            }
        )
    return {
        "tag": tag,
        "wall_s": wall,
        "problems": len(records),
        "tune_s": sorted(r.get("tune_s", 0.0) for r in records if r.get("source") == "tuned"),
        "by_cumulative": sorted(rows, key=lambda r: -r["cum_s"])[:TOP],
        "by_own": sorted(rows, key=lambda r: -r["own_s"])[:TOP],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", default="1,16,64,512,4096")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        triton_cache = work / "triton"
        triton_cache.mkdir()
        runs = [profile(args, work, tag, triton_cache) for tag in ("cold", "warm")]
    (args.out / "tune-profile.json").write_text(json.dumps({"model": args.model, "runs": runs}, indent=1))
    for run in runs:
        times = run["tune_s"]
        median = times[len(times) // 2] if times else 0.0
        print(f"== {run['tag']}: {run['problems']} problems, wall {run['wall_s']:.1f} s, "
              f"median tune {median * 1e3:.0f} ms")  # fmt: skip
        for key in ("by_cumulative", "by_own"):
            print(f"-- {key}")
            for r in run[key]:
                print(f"{r['cum_s']:8.2f} {r['own_s']:8.2f} {r['calls']:8d}  {r['function'][:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
