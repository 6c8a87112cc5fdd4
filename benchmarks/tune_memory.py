"""Peak memory and time of one product, untuned and tuned.

    python benchmarks/tune_memory.py [--shape 20000x20000x8] [--array numpy|torch] [--out DIR]

Each mode runs in a fresh process (so that its peak resident memory, ``ru_maxrss``, is
its own): ``off`` calls ``unimatmul.matmul`` with tuning off (the array library's own
product), ``tune`` tunes the product on that call. Writes tune-memory.json under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
import numpy as np
import unimatmul
from unimatmul.tuning.selector import get_selector

m, n, k = (int(x) for x in sys.argv[1].split("x"))
array, mode = sys.argv[2], sys.argv[3]
rng = np.random.default_rng(0)
a = rng.standard_normal((m, k), dtype=np.float32)
b = rng.standard_normal((k, n), dtype=np.float32)
if array == "torch":
    import torch
    a, b = torch.from_numpy(a), torch.from_numpy(b)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
warning = None
import warnings
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    with unimatmul.mode(mode):
        out = unimatmul.matmul(a, b)
wall = time.perf_counter() - t0
records = [r for _, _, r in get_selector().store.items()]
plan = None
try:  # what the harness planned to allow (harnesses before the plan had none)
    from unimatmul.core.arrays import CPU, adapter_for_kind
    from unimatmul.backend import Target
    from unimatmul.core.problem import Problem
    from unimatmul.tuning.harness import CpuTimer, Harness
    target = Target(adapter_for_kind(array), CPU)
    plan = Harness(CpuTimer(), get_selector().tuner.settings_for(target)).plan_memory(
        Problem.from_shape(m, n, k), target, 0.0).to_dict()
except (AttributeError, ImportError):
    pass
print(json.dumps({
    "mode": mode,
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "rss_before_call_bytes": before * 1024,
    "wall_s": wall,
    "winner": records[0].winner if records else None,
    "memory_plan": plan,
    "warnings": [str(w.message) for w in seen],
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="20000x20000x8", help="MxNxK")
    parser.add_argument("--array", default="numpy", choices=("numpy", "torch"))
    parser.add_argument("--label", default="run")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "harness")
    args = parser.parse_args()
    env = dict(os.environ, UNIMATMUL_CACHE=":memory:")
    rows = []
    for mode in ("off", "tune"):
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-c", CHILD, args.shape, args.array, mode],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if proc.returncode != 0:
            rows.append({"mode": mode, "error": proc.stderr[-2000:]})
            continue
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row["process_s"] = time.perf_counter() - t0
        rows.append(row)
        print(
            f"{mode}: peak {row['peak_rss_bytes'] / 2**30:.2f} GiB, call {row['wall_s']:.1f} s, "
            f"winner {row['winner']}",
            flush=True,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "tune-memory.json"
    path.write_text(
        json.dumps(
            {
                "shape": args.shape,
                "array": args.array,
                "cpus": os.cpu_count(),
                "load": os.getloadavg(),
                "rows": rows,
            },
            indent=1,
        )
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
