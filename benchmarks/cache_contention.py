"""Many processes writing one cache file at once: how long does a ``put`` take, and is
anything lost?

Each writer process puts its own records one by one with the default ``autoflush=1`` (as
processes that tune do), timing every ``put``, then flushes. The file is seeded first
so that every write takes a while. Results go to stdout as JSON (and ``--out FILE``);
nothing is asserted. Run: ``python benchmarks/cache_contention.py [--writers 8] ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WRITER = r"""
import json, sys, time, warnings
from unimatmul.cache.file_store import MsgpackFileStore
from unimatmul.cache.record import CandidateResult, TuningRecord
path, worker, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def record(k, t):
    results = [CandidateResult("default/default", "ok", t * 1.5, 10), CandidateResult("fake/k0", "ok", t, 10)]
    return TuningRecord(k, "fake/k0", t, t * 1.5, results, {"fake": "1"}, time.time(), 0.1, {}, f"w{worker}")
store = MsgpackFileStore(path)
times, warned = [], []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for i in range(count):
        k = f"w{worker}-{i}"
        started = time.perf_counter()
        store.put("ns", k, record(k, 1e-3 + i * 1e-9))
        times.append(time.perf_counter() - started)
    started = time.perf_counter()
    store.flush()
    final = time.perf_counter() - started
print(json.dumps({"put_s": times, "final_flush_s": final, "warnings": [str(w.message) for w in caught]}))
"""

SEED = r"""
import sys, time
from unimatmul.cache.file_store import MsgpackFileStore
from unimatmul.cache.record import CandidateResult, TuningRecord
store = MsgpackFileStore(sys.argv[1], autoflush=0)
with store.batch():
    for i in range(int(sys.argv[2])):
        k = f"seed-{i}"
        results = [CandidateResult("default/default", "ok", 2e-3, 10), CandidateResult("fake/k0", "ok", 1e-3, 10)]
        store.put("ns", k, TuningRecord(k, "fake/k0", 1e-3, 2e-3, results, {"fake": "1"}, time.time(), 0.1, {}, "seed"))
"""

COUNT = r"""
import sys
from unimatmul.cache.file_store import read_file
print(read_file(__import__("pathlib").Path(sys.argv[1])).count())
"""


def trial(python: str, env: dict[str, str], writers: int, puts: int, seed: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "c.msgpack")
        subprocess.run([python, "-c", SEED, path, str(seed)], env=env, check=True)
        started = time.monotonic()
        procs = [
            subprocess.Popen(
                [python, "-c", WRITER, path, str(w), str(puts)], env=env, stdout=subprocess.PIPE, text=True
            )
            for w in range(writers)
        ]
        results = [json.loads(p.communicate(timeout=1200)[0]) for p in procs]
        wall = time.monotonic() - started
        count = int(subprocess.run([python, "-c", COUNT, path], env=env, check=True, capture_output=True,
                                   text=True).stdout)  # fmt: skip
    puts_s = sorted(t for r in results for t in r["put_s"])
    return {
        "wall_s": round(wall, 2),
        "entries": count,
        "expected": seed + writers * puts,
        "put_max_s": round(puts_s[-1], 3),
        "put_p99_s": round(puts_s[int(0.99 * (len(puts_s) - 1))], 3),
        "put_median_s": round(statistics.median(puts_s), 4),
        "final_flush_max_s": round(max(r["final_flush_s"] for r in results), 3),
        "writers_warned": sum(1 for r in results if r["warnings"]),
        "warnings": sorted({w.split(": ", 1)[-1] for r in results for w in r["warnings"]}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--puts", type=int, default=40, help="records each writer puts")
    parser.add_argument("--seed", type=int, default=20000, help="entries in the file before they start")
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument(
        "--pythonpath", default=None, help="another unimatmul tree to measure (e.g. an older one)"
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    trials = [trial(sys.executable, env, args.writers, args.puts, args.seed) for _ in range(args.trials)]
    doc = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()}",
        "code": args.pythonpath or "this checkout",
        "writers": args.writers,
        "puts_each": args.puts,
        "seed_entries": args.seed,
        "trials": trials,
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
