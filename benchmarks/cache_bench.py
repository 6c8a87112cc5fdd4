"""Cache store benchmark: file size, load time and lookup cost for 1k, 10k and 100k entries.

Records are shaped like real ones (4-16 candidates each, statuses, notes, settings,
device state), built from a fixed seed. Results go to benchmarks/results/cache-bench/cache-bench.json
and .md; nothing here is asserted. Run: ``python benchmarks/cache_bench.py [--sizes ...]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from unimatmul import __version__
from unimatmul.cache.file_store import MsgpackFileStore, read_file
from unimatmul.cache.lru import LRU
from unimatmul.cache.record import FAILED, OK, PRUNED, REJECTED, CandidateResult, TuningRecord
from unimatmul.core.problem import Problem
from unimatmul.tuning.harness import HarnessConfig

NAMESPACE = "nvidia/sm_90/NVIDIA H200/132/torch"
PLATFORM = {
    "vendor": "nvidia",
    "arch": "sm_90",
    "device": "NVIDIA H200",
    "cores": 132,
    "array": "torch",
    "libraries": {"cublasLt": "130002", "torch": "2.13.0", "cuda": "13.0"},
}
DIMS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]
DIMS += [5120, 6144, 8192, 11008, 12288, 13824, 14336, 16384, 28672, 32000, 128256]
DTYPES = ["bf16", "f16", "f32", "f8e4m3"]


def candidate_pool(rng: random.Random, size: int = 240) -> list[str]:
    """cuBLASLt-like algo configurations: identities of realistic length."""
    pool = set()
    while len(pool) < size:
        pool.add(
            "cublaslt/algo?"
            + "&".join(
                f"{k}={v}"
                for k, v in (
                    ("cluster", rng.choice([0, 1, 2])),
                    ("custom", rng.choice([0, 1])),
                    ("id", rng.choice([6, 21, 23, 24, 31, 66, 67, 71])),
                    ("reduction", rng.choice([0, 1, 4])),
                    ("splitk", rng.choice([1, 2, 4, 8])),
                    ("stages", rng.choice([0, 8, 16, 19, 22])),
                    ("swizzle", rng.choice([0, 1])),
                    ("tile", rng.choice([15, 18, 20, 24, 30, 41, 42])),
                )
            )
        )
    return sorted(pool)


def make_problem(rng: random.Random) -> Problem:
    dtype = rng.choice(DTYPES)
    out = "bf16" if dtype == "f8e4m3" else dtype
    batch = rng.choice([1, 1, 1, 1, 8, 16, 32])
    return Problem(
        m=rng.choice(DIMS),
        n=rng.choice(DIMS),
        k=rng.choice(DIMS),
        dtype_a=dtype,
        dtype_b=dtype,
        dtype_c=out,
        compute="f32",
        trans_a=rng.random() < 0.2,
        trans_b=rng.random() < 0.5,
        batch=batch,
        epilogue=rng.choice(["none", "none", "none", "bias", "bias_gelu", "relu"]),
    )


def shape_class(problem: Problem) -> tuple[Any, ...]:
    """Problems a heuristic would answer alike: same dtypes and layout, sizes within 16x."""
    bucket = [round(math.log(d, 16)) for d in (problem.m, problem.n, problem.k)]
    return (problem.dtype_a, problem.trans_a, problem.trans_b, problem.epilogue, problem.batch > 1, *bucket)


def make_record(
    rng: random.Random, problem: Problem, identities: list[str], settings: dict[str, Any]
) -> TuningRecord:
    base = max(problem.flops / 600e12, 4e-6) * rng.uniform(0.9, 1.5)
    results: list[CandidateResult] = []
    for identity in identities:
        ratio = math.exp(abs(rng.gauss(0.0, 0.5)))
        draw = rng.random()
        error = 10 ** rng.uniform(-4.5, -2.5)
        if draw < 0.70:
            results.append(CandidateResult(identity, OK, base * ratio, rng.randint(5, 100), error))
        elif draw < 0.90:
            ratio += 0.3
            samples = rng.choice([1, 5])
            note = (
                f"{ratio:.1f}x the best on its first timed call"
                if samples == 1
                else f"{ratio:.2f}x the best after {samples} samples"
            )
            results.append(CandidateResult(identity, PRUNED, base * ratio, samples, error, note))
        elif draw < 0.97:
            note = rng.choice(
                [
                    "unsupported: CUBLAS_STATUS_NOT_SUPPORTED",
                    "unsupported: workspace too small",
                    "RuntimeError: CUBLAS_STATUS_EXECUTION_FAILED",
                ]
            )
            results.append(CandidateResult(identity, FAILED, note=note))
        else:
            bad = 10 ** rng.uniform(-1.5, 0)
            note = f"relative error {bad:.3g} > tolerance {1e-2:.3g}"
            results.append(CandidateResult(identity, REJECTED, None, 0, bad, note))
    timed = [r for r in results if r.status == OK]
    default = results[0]
    winner = min(timed, key=lambda r: r.median_s or math.inf) if timed else default
    return TuningRecord(
        problem=problem.key,
        winner=winner.identity,
        winner_s=winner.median_s if winner.median_s is not None else math.inf,
        default_s=default.median_s,
        results=results,
        versions=dict(PLATFORM["libraries"]),  # type: ignore[arg-type]
        tuned_at=1.76e9 + rng.uniform(0, 3e7),
        tune_s=rng.uniform(0.2, 20.0),
        settings={**settings, "default_error": default.error if default.error is not None else 0.0},
        writer=f"unimatmul {__version__}",
        device_state={
            "gpu_sm_mhz": rng.choice([1980, 1980, 1980, 1755, 1410]),
            "gpu_mem_mhz": 3201,
            "gpu_temp_c": rng.randint(35, 75),
            "gpu_power_w": rng.randint(80, 700),
        },
    )


def make_records(n: int, seed: int = 1, *, shared_lists: bool = True) -> dict[str, TuningRecord]:
    """``n`` records. ``shared_lists``: problems of one shape class get the same
    candidate list (as a vendor heuristic answers); else every record draws its own
    (the worst case for the store's interning)."""
    rng = random.Random(seed)
    lists: dict[tuple[Any, ...], list[str]] = {}
    pool = candidate_pool(rng)
    base_settings = HarnessConfig(interleave=True, settle_s=0.0).to_dict()
    settings_by_dtype = {
        d: {**base_settings, "timer": "cuda-events", "sets": 16, "tolerance": t}
        for d, t in (("bf16", 2e-2), ("f16", 5e-3), ("f32", 1e-4), ("f8e4m3", 1.25e-1))
    }
    records: dict[str, TuningRecord] = {}
    while len(records) < n:
        problem = make_problem(rng)
        if problem.key in records:
            continue
        cls = shape_class(problem) if shared_lists else (len(records),)
        identities = lists.get(cls)
        if identities is None:
            identities = lists[cls] = ["default/default", *rng.sample(pool, rng.randint(3, 15))]
        records[problem.key] = make_record(rng, problem, identities, settings_by_dtype[problem.dtype_a])
    return records


def write_store(path: Path, records: dict[str, TuningRecord]) -> float:
    store = MsgpackFileStore(path, autoflush=0)
    store.note_platform(NAMESPACE, PLATFORM)
    t0 = time.perf_counter()
    with store.batch():
        for key, record in records.items():
            store.put(NAMESPACE, key, record)
    return time.perf_counter() - t0


def best_of(fn: Any, repeat: int) -> tuple[float, float]:
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
        del result  # freeing what was loaded is not part of loading it
    return min(times), statistics.median(times)


def after_one_flipped_bit(path: Path, flips: int) -> dict[str, Any]:
    """Entries still readable after one random bit of the file is flipped, over ``flips``
    trials (a schema 2 file has one checksum: none; schema 3: all but one block's)."""
    if not flips:
        return {}
    data = path.read_bytes()
    rng = random.Random(11)
    counts = []
    damaged = path.with_name("flipped.msgpack")
    for _ in range(flips):
        blob = bytearray(data)
        blob[rng.randrange(len(blob))] ^= 1 << rng.randrange(8)
        damaged.write_bytes(bytes(blob))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                counts.append(read_file(damaged).count())
            except Exception:  # the old format: the whole file is unreadable
                counts.append(0)
    damaged.unlink()
    return {"trials": flips, "min": min(counts), "median": statistics.median(counts)}


def bench(n: int, workdir: Path, repeat: int, shared_lists: bool = True, flips: int = 0) -> dict[str, Any]:
    records = make_records(n, shared_lists=shared_lists)
    path = workdir / f"cache-{n}-{'shared' if shared_lists else 'own'}.msgpack"
    write_s = write_store(path, records)
    assert read_file(path).count() == n
    size = path.stat().st_size
    keys = list(records)

    def load() -> MsgpackFileStore:
        store = MsgpackFileStore(path, read_only=True)
        store.count()
        return store

    load_min, load_med = best_of(load, repeat)
    store = MsgpackFileStore(path, read_only=True)
    store.count()
    rng = random.Random(7)
    sample = [rng.choice(keys) for _ in range(2000)]
    t0 = time.perf_counter()
    for key in sample:
        store.get(NAMESPACE, key)
    first_get_us = (time.perf_counter() - t0) / len(sample) * 1e6
    t0 = time.perf_counter()
    for key in sample:
        store.get(NAMESPACE, key)
    memo_get_us = (time.perf_counter() - t0) / len(sample) * 1e6
    t0 = time.perf_counter()
    for _ in range(5):
        for key in sample:
            store.get(NAMESPACE, key + "-missing")
    miss_us = (time.perf_counter() - t0) / (5 * len(sample)) * 1e6
    # The hot path of a cached call: the bounded in-process LRU in front of the store.
    lru: LRU[str, TuningRecord] = LRU(4096)
    for key in sample[:1000]:
        lru.put(key, records[key])
    hot = sample[:1000]
    t0 = time.perf_counter()
    for _ in range(100):
        for key in hot:
            lru.get(key)
    lru_ns = (time.perf_counter() - t0) / (100 * len(hot)) * 1e9
    loaded = store.get(NAMESPACE, keys[0])
    assert loaded is not None and loaded.winner == records[keys[0]].winner
    candidates = sum(len(r.results) for r in records.values()) / n
    survivors = after_one_flipped_bit(path, flips)
    return {
        "entries": n,
        "schema": read_file(path).schema,
        "after_one_flipped_bit": survivors,
        "candidate_lists": "shared by shape class" if shared_lists else "one per record",
        "candidates_per_entry": round(candidates, 2),
        "file_bytes": size,
        "bytes_per_entry": round(size / n, 1),
        "write_s": round(write_s, 4),
        "load_ms_min": round(load_min * 1e3, 2),
        "load_ms_median": round(load_med * 1e3, 2),
        "get_first_us": round(first_get_us, 2),
        "get_again_us": round(memo_get_us, 3),
        "get_miss_us": round(miss_us, 3),
        "lru_hit_ns": round(lru_ns, 1),
    }


def machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import msgpack

    try:
        load = Path("/proc/loadavg").read_text(encoding="ascii").split()[:3]
    except OSError:
        load = []
    return {
        "loadavg_at_start": " ".join(load),
        "cpu": model,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "msgpack": ".".join(map(str, msgpack.version)),
        "unimatmul": __version__,
    }


def write_markdown(path: Path, data: dict[str, Any]) -> None:
    lines = [
        "# Cache store benchmark",
        "",
        f"Machine: {data['machine']['cpu']}, {data['machine']['cores']} cores "
        f"(load average {data['machine']['loadavg_at_start']} at the start), "
        f"Python {data['machine']['python']}, msgpack {data['machine']['msgpack']}. "
        f"Produced by `python benchmarks/cache_bench.py`; not asserted anywhere.",
        "",
        "Aim: 100k entries load in under 150 ms and take under 100 bytes each on disk.",
        "",
        "| entries | schema | candidate lists | cand./entry | file | bytes/entry | write all | load (min / median) "
        "| first get | get again | miss | LRU hit | readable after 1 flipped bit (min / median) |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in data["results"]:
        flips = r.get("after_one_flipped_bit") or {}
        flipped = f"{flips['min']:,} / {flips['median']:,.0f} ({flips['trials']} trials)" if flips else "-"
        lines.append(
            f"| {r['entries']:,} | {r.get('schema', '?')} | {r['candidate_lists']} | {r['candidates_per_entry']} "
            f"| {r['file_bytes'] / 1e6:.2f} MB | {r['bytes_per_entry']} | {r['write_s'] * 1e3:.0f} ms "
            f"| {r['load_ms_min']} / {r['load_ms_median']} ms | {r['get_first_us']} us "
            f"| {r['get_again_us']} us | {r['get_miss_us']} us | {r['lru_hit_ns']} ns | {flipped} |"
        )
    lines += ["", *data["notes"], ""]
    path.write_text("\n".join(lines), encoding="utf-8")


NOTES = [
    "- Records: 4-16 candidates (cuBLASLt-like identities), 70% ok / 20% pruned / 7% failed /",
    "  3% rejected, notes, settings, library versions, GPU device state (clock, temperature, power).",
    "  *shared by shape class*: problems of one dtype/layout/epilogue with sizes within 16x get",
    "  the same candidate list, as a vendor heuristic answers; *one per record*: every record",
    "  draws its own list, the worst case for interning.",
    "- *load*: open the file, check it (pre-scan, CRC-32s, bounded inflation) and index every key;",
    "  rows stay encoded until asked for. *first get* decodes one row into a TuningRecord;",
    "  *get again* is the store's memo; *miss* is a key that is not there.",
    "- The cached call never reaches the store: `unimatmul.matmul` finds its prepared runner",
    "  with one lock-free dict read (`LRU.peek`); *LRU hit* is the locked, recency-keeping",
    "  `LRU.get` of the selector's map, used when a signature is first resolved.",
    "- *write all*: every record encoded and the file written once (a batch), fsync included.",
    "- Candidate times other than the base time are stored to 0.024% (log scale, 16 bits);",
    "  errors to 3 significant digits (bfloat16). Winner time, Default time and dates are exact.",
    "- *readable after 1 flipped bit*: one random bit of the file flipped, 20 trials, entries a",
    "  reader still gets (schema 2: one CRC over the body, so none; schema 3: every block but",
    "  the damaged one).",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--worst-case-sizes", type=int, nargs="*", default=[100_000])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "cache-bench")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--name", default="cache-bench", help="results file name (without .json/.md)")
    parser.add_argument("--flips", type=int, default=20, help="one-bit-flip trials per file (0: none)")
    parser.add_argument(
        "--entry-block",
        type=int,
        default=None,
        help="entries per block when writing (schema 3; for the trade-off)",
    )
    args = parser.parse_args()
    if args.entry_block is not None:
        from unimatmul.cache import codec

        codec.ENTRY_BLOCK = args.entry_block  # type: ignore[attr-defined]
    results = []
    facts = machine()  # the load average before this benchmark adds its own
    with tempfile.TemporaryDirectory() as tmp:
        for n, shared in [(n, True) for n in args.sizes] + [(n, False) for n in args.worst_case_sizes]:
            row = bench(n, Path(tmp), args.repeat, shared_lists=shared, flips=args.flips)
            if args.entry_block is not None:
                row["entry_block"] = args.entry_block
            print(json.dumps(row))
            results.append(row)
    data = {"machine": facts, "results": results, "notes": NOTES}
    if not args.no_write:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        write_markdown(args.out / f"{args.name}.md", data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
