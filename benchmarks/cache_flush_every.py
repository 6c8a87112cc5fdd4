"""What a tuning run waits for the cache file: every put written at once against writes at
most once a second (``MsgpackFileStore.autoflush_s``, what ``unimatmul tune`` sets for its run).

    python benchmarks/cache_flush_every.py --entries 1000,20000 --puts 30 --out DIR

For each cache size: a file of that many entries (records of ``cache_bench``'s kind), then
``--puts`` new records put one at a time, each after ``--work-ms`` of pure-Python work
standing for the tuning of the next problem. The two ways take turns, round by round, on
copies of the same file. Per way: the median and largest time a ``put`` took, the wall
time of the whole run (puts, work and the final strict flush) and the file's writes. Every
record is checked to be in the file at the end. Writes ``flush-every.json`` and
``flush-every.md`` under ``--out`` and prints the table. Nothing here is asserted in a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # cache_bench, beside this file
from cache_bench import make_records

from unimatmul.cache.file_store import MsgpackFileStore

NS = "bench"


def busy(ms: float) -> None:
    """Pure-Python work for ``ms`` milliseconds."""
    end = time.perf_counter() + ms / 1e3
    x = 0
    while time.perf_counter() < end:
        x += 1


def one_run(path: Path, records: list[Any], every_s: float | None, work_ms: float) -> dict[str, Any]:
    store = MsgpackFileStore(path)
    store.autoflush_s = every_s
    writes = 0
    write = store._replace_file

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal writes
        writes += 1
        return write(*args, **kwargs)

    store._replace_file = counted  # type: ignore[method-assign]  # counts, changes nothing
    puts = []
    t0 = time.perf_counter()
    for k, rec in records:
        busy(work_ms)
        p0 = time.perf_counter()
        store.put(NS, k, rec)
        puts.append(time.perf_counter() - p0)
    store.flush(strict=True)
    wall = time.perf_counter() - t0
    found = MsgpackFileStore(path, read_only=True).count()
    return {
        "put_median_ms": statistics.median(puts) * 1e3,
        "put_max_ms": max(puts) * 1e3,
        "wall_s": wall,
        "writes": writes,
        "entries_after": found,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", default="1000,20000")
    p.add_argument("--puts", type=int, default=30)
    p.add_argument("--work-ms", type=float, default=100.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="unimatmul-flush-every-"))
    rows = []
    try:
        for size in [int(x) for x in args.entries.split(",")]:
            base = work / f"base-{size}.msgpack"
            seed_store = MsgpackFileStore(base, autoflush=0)
            made = list(make_records(size + args.puts, seed=1).items())
            for k, rec in made[:size]:
                seed_store.put(NS, k, rec)
            seed_store.flush(strict=True)
            new = made[size:]
            ways = {"every put": None, "at most once a second": 1.0}
            runs: dict[str, list[dict[str, Any]]] = {way: [] for way in ways}
            for r in range(args.rounds):
                order = list(ways) if r % 2 == 0 else list(reversed(ways))
                for way in order:
                    path = work / f"run-{size}.msgpack"
                    shutil.copyfile(base, path)
                    result = one_run(path, new, ways[way], args.work_ms)
                    assert result["entries_after"] == size + args.puts, result
                    runs[way].append(result)
            for way, results in runs.items():
                rows.append(
                    {
                        "entries": size,
                        "way": way,
                        "put_median_ms": [round(x["put_median_ms"], 3) for x in results],
                        "put_max_ms": [round(x["put_max_ms"], 2) for x in results],
                        "wall_s": [round(x["wall_s"], 3) for x in results],
                        "writes": [x["writes"] for x in results],
                    }
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    machine = {
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load": list(os.getloadavg()),
    }
    data = {
        "puts": args.puts,
        "work_ms": args.work_ms,
        "rounds": args.rounds,
        "machine": machine,
        "rows": rows,
    }
    (args.out / "flush-every.json").write_text(json.dumps(data, indent=1) + "\n")
    lines = [
        f"{args.puts} puts, each after {args.work_ms:g} ms of Python work; {args.rounds} runs of each way, in turns",
        "",
        "| entries in the file | file written | writes | put, median ms | put, largest ms | wall s (puts, work, flush) |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['entries']} | {row['way']} | {', '.join(str(x) for x in row['writes'])} | "
            f"{', '.join(f'{x:.2f}' for x in row['put_median_ms'])} | "
            f"{', '.join(f'{x:.1f}' for x in row['put_max_ms'])} | {', '.join(f'{x:.2f}' for x in row['wall_s'])} |"
        )
    text = "\n".join(lines) + "\n"
    (args.out / "flush-every.md").write_text(text)
    print(text)
    plot(rows, args.out / "flush-every.png")
    return 0


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """The median put and the run's wall time of each way, per cache size."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    sizes = sorted({r["entries"] for r in rows})
    ways = list(dict.fromkeys(r["way"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, field, label in (
        (axes[0], "put_median_ms", "a put, median ms"),
        (axes[1], "wall_s", "the run's wall s (puts, work, flush)"),
    ):
        for j, way in enumerate(ways):
            values = [
                statistics.median(next(r for r in rows if r["entries"] == n and r["way"] == way)[field])
                for n in sizes
            ]
            ax.bar([i + (j - 0.5) * 0.38 for i in range(len(sizes))], values, width=0.38, label=way)
        ax.set_xticks(range(len(sizes)))
        ax.set_xticklabels([f"{n} entries" for n in sizes])
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


if __name__ == "__main__":
    raise SystemExit(main())
