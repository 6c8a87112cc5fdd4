"""Where a tuned problem's time goes, phase by phase (GPU or CPU).

    python benchmarks/tune_phases.py --model llama-3-8b --device cuda --out DIR [--tokens 1,512]
    python benchmarks/tune_phases.py --moe mixtral-8x7b:1,qwen3-30b-a3b:16 --out DIR

Runs ``unimatmul tune --model MODEL`` in this process (a fresh cache file; Triton's cache
as the environment has it) with a wall clock around each phase of the harness: operand
sets and their guards, the first reference, each candidate's preparation, the numeric
checks before timing, the rotated check sets and the checks after timing, each timer's
eager warm-up, its capture and graph launches (``replay``: the first also uploads the
graph), the waits for timed samples, the repeat of a win against Default. A check is split
into a candidate's first (``check_first``: its first call ever) and later ones, and what
they spend comparing the output (``compare``), poisoning and reading the guard bands
(``guard``) and, where several checks are read back at once (a GPU), waiting for them
(``check_read``: their calls' and comparisons' device time). Each phase counts its own time (a phase inside another is taken out of the
outer one). ``candidates`` is the tuner's list of candidates (the backends' offers and
rankings); what is left of a problem's time (``other``) is the rest of the tuner's and
the harness's own work (records, pruning, bookkeeping). Apart from it: a warm-up's own
time outside its timer's preparation (``warm_up``: its first timed sample's wait), the
tuner's timer and settings for the target (``setup``), the device's state read after the
samples (``device_state``), the choice among those within noise (``pick``) and the
retirement of candidate families (``retire``). Python's garbage collections on the
tuning thread are timed apart from the phases they fall in (``gc``).

Writes ``tune-phases.json`` (per problem: candidates, phase seconds, the calls of each timed
function by name, the candidates' statuses and notes, each candidate's result in the tuner's
order) and ``tune-phases.md``
(the median and total of each phase over the problems) under ``--out`` and prints the table.
This measures; it changes nothing the harness does (the wrappers only read a clock).

``--moe CONFIG:TOKENS,...`` tunes grouped products instead: the gate/up and down experts of
``benchmarks/moe_bench.py``'s configs at that token count (uniform routing), through
``unimatmul.grouped_matmul`` in tune mode, in that order; the first is the process's first
grouped tuning (what the issue's "first time" counts).
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

PHASES = (
    "candidates",
    "sets",
    "reference",
    "prepare",
    "check_first",
    "check_again",
    "compare",
    "check_read",
    "guard",
    "late_set",
    "late_check",
    "warm",
    "capture",
    "replay",
    "sample",
    "confirm",
    "warm_up",
    "setup",
    "device_state",
    "pick",
    "retire",
    "other",
)


class Clock:
    """Exclusive wall time per phase on the tuning thread (nested phases are taken out)."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.stack: list[list[Any]] = []  # [phase, start, inner seconds]
        self.now: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)  # by the timed function's name

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        setattr(owner, name, self.timed(getattr(owner, name), phase))

    def timed(self, original: Any, phase: str) -> Any:
        """``original`` with its own time counted to ``phase``."""

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != self.thread:
                return original(*args, **kwargs)
            self.calls[original.__name__] += 1
            frame: list[Any] = [phase, time.perf_counter(), 0.0]
            self.stack.append(frame)
            try:
                return original(*args, **kwargs)
            finally:
                self.stack.pop()
                spent = time.perf_counter() - frame[1]
                self.now[phase] += spent - frame[2]
                if self.stack:
                    self.stack[-1][2] += spent

        return timed


def tune_grouped(specs: str, torch: Any, device_name: str = "cuda") -> None:
    """Tune the gate/up and down experts of each CONFIG:TOKENS (moe_bench's configs) on
    ``device_name``."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import moe_bench

    import unimatmul

    device = torch.device(device_name)
    for spec in specs.split(","):
        name, tokens = spec.split(":")
        _, experts, hidden, inter, top_k, _ = moe_bench.config_named(name)
        counts = moe_bench.counts_of(int(tokens), experts, top_k, "uniform", seed=int(tokens))
        offs = moe_bench.offs_of(torch, counts, device)
        for w in moe_bench.expert_weights(torch, device, experts, hidden, inter).values():
            a, b = moe_bench.operands_of(torch, w, counts)
            with unimatmul.mode("tune"):
                unimatmul.grouped_matmul(a, b, offs)
            if device.type == "cuda":
                torch.cuda.synchronize()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tokens", default=None)
    p.add_argument("--moe", default=None, help="CONFIG:TOKENS,...: grouped products of moe_bench's configs")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    work = Path(tempfile.mkdtemp(prefix="unimatmul-phases-"))
    os.environ["UNIMATMUL_CACHE"] = str(work / "cache.msgpack")

    import torch

    from unimatmul.cli import main as cli_main
    from unimatmul.tuning import harness as harness_mod
    from unimatmul.tuning import numeric_check, retire, timers, tuner

    clock = Clock()
    H = harness_mod.Harness
    checked: set[int] = set()
    check_call = H._check_call
    check_first = clock.timed(check_call, "check_first")
    check_again = clock.timed(check_call, "check_again")

    def first_or_again(self: Any, runner: Any, *args: Any, **kwargs: Any) -> Any:
        if clock.stack and clock.stack[-1][0] == "late_check":
            return check_call(self, runner, *args, **kwargs)  # counted to late_check
        first = id(runner) not in checked
        checked.add(id(runner))
        return (check_first if first else check_again)(self, runner, *args, **kwargs)

    H._check_call = first_or_again  # type: ignore[method-assign]
    check_launch = H._check_launch
    launch_first = clock.timed(check_launch, "check_first")

    def launched_first(self: Any, *args: Any, **kwargs: Any) -> Any:
        if clock.stack and clock.stack[-1][0] == "late_check":
            return check_launch(self, *args, **kwargs)  # counted to late_check
        return launch_first(self, *args, **kwargs)

    H._check_launch = launched_first  # type: ignore[method-assign]
    clock.wrap(numeric_check, "compare_launch", "compare")
    clock.wrap(H, "_read_checks", "check_read")
    clock.wrap(harness_mod, "compare_output", "compare")
    clock.wrap(numeric_check, "poison_guard", "guard")
    clock.wrap(numeric_check, "guard_count", "guard")
    clock.wrap(numeric_check, "guard_writes", "guard")
    clock.wrap(torch.cuda.CUDAGraph, "replay", "replay")
    clock.wrap(timers.TorchGraphTimer, "capture", "capture")
    clock.wrap(tuner.Tuner, "entries", "candidates")
    for name, phase in (
        ("plan_memory", "sets"),
        ("_operand_sets", "sets"),
        ("_guard", "sets"),
        ("_late_check_set", "late_set"),
        ("_late_check", "late_check"),
        ("_take", "sample"),
        ("_round", "sample"),
        ("_late_checks", "late_check"),
        ("_confirm", "confirm"),
        ("_parts_by_distribution", "confirm"),
        ("_warmed_up", "warm_up"),
        ("_pick", "pick"),
    ):
        clock.wrap(H, name, phase)
    clock.wrap(harness_mod, "read_device_state", "device_state")
    clock.wrap(tuner.Tuner, "timer_for", "setup")
    clock.wrap(tuner.Tuner, "settings_for", "setup")
    clock.wrap(retire.Retirement, "split", "retire")
    clock.wrap(retire.Retirement, "learn", "retire")
    clock.wrap(harness_mod, "reference_of", "reference")
    clock.wrap(tuner.Tuner, "prepare", "prepare")
    clock.wrap(timers.TorchGraphTimer, "prepare", "warm")
    clock.wrap(harness_mod.CpuTimer, "prepare", "warm")

    # Python's garbage collections on the tuning thread, whatever phase they fall in.
    collected = {"s": 0.0, "count": 0, "full": 0}
    gc_started: list[float] = []

    def on_gc(stage: str, info: dict[str, Any]) -> None:
        if threading.get_ident() != clock.thread:
            return
        if stage == "start":
            gc_started.append(time.perf_counter())
        elif gc_started:
            collected["s"] += time.perf_counter() - gc_started.pop()
            collected["count"] += 1
            collected["full"] += info.get("generation") == 2

    gc.callbacks.append(on_gc)

    problems: list[dict[str, Any]] = []
    original_tune = tuner.Tuner.tune

    def tune(self: Any, problem: Any, target: Any, **kwargs: Any) -> Any:
        clock.now.clear()
        clock.calls.clear()
        collected.update(s=0.0, count=0, full=0)
        t0 = time.perf_counter()
        record = original_tune(self, problem, target, **kwargs)
        total = time.perf_counter() - t0
        phases = {k: clock.now.get(k, 0.0) for k in PHASES if k != "other"}
        phases["other"] = total - sum(phases.values())
        problems.append(
            {
                "problem": problem.key,
                "candidates": len(record.results),
                "timed": sum(1 for r in record.results if r.samples),
                "samples": sum(r.samples for r in record.results),
                "winner": record.winner,
                "total_s": total,
                "phases_s": phases,
                "gc": dict(collected),
                "calls": dict(sorted(clock.calls.items())),
                "statuses": dict(collections.Counter(r.status for r in record.results)),
                "notes": sorted({r.note for r in record.results if r.note}),
                # In the tuner's order (each backend's offers as it ranked them):
                # identity, status, median seconds a call, samples.
                "results": [[r.identity, r.status, r.median_s, r.samples] for r in record.results],
                "speedup": record.speedup,
            }
        )
        return record

    tuner.Tuner.tune = tune  # type: ignore[method-assign]
    t0 = time.perf_counter()
    if args.moe:
        tune_grouped(args.moe, torch, args.device)
        what = f"grouped products {args.moe}"
    else:
        argv = ["tune", "--model", args.model, "--device", args.device, "--quiet"]
        if args.tokens:
            argv += ["--tokens", args.tokens]
        code = cli_main(argv)
        if code != 0:
            print(f"unimatmul {' '.join(argv)} exited {code}", file=sys.stderr)
            return code
        what = args.model
    wall = time.perf_counter() - t0

    rows = []
    totals = [p["total_s"] for p in problems]
    for phase in PHASES:
        values = [p["phases_s"][phase] for p in problems]
        rows.append((phase, statistics.median(values), sum(values)))
    summary = {
        "model": what,
        "device": args.device,
        "problems": len(problems),
        "wall_s": wall,
        "median_problem_s": statistics.median(totals) if totals else None,
        "sum_problem_s": sum(totals),
        "median_candidates": statistics.median(p["candidates"] for p in problems) if problems else None,
        "phases": {name: {"median_s": med, "sum_s": tot} for name, med, tot in rows},
        "gc": {
            "sum_s": sum(p["gc"]["s"] for p in problems),
            "collections": sum(p["gc"]["count"] for p in problems),
            "full": sum(p["gc"]["full"] for p in problems),
        },
    }
    (args.out / "tune-phases.json").write_text(
        json.dumps({"summary": summary, "problems": problems}, indent=1) + "\n"
    )
    lines = [
        f"{len(problems)} problems of {what} on {args.device}: median {summary['median_problem_s'] * 1e3:.0f} ms "
        f"a problem, {summary['sum_problem_s']:.1f} s in all, command {wall:.1f} s; median "
        f"{summary['median_candidates']} candidates a problem",
        "",
        "| phase | median ms a problem | total s | share |",
        "|---|---|---|---|",
    ]
    for name, med, tot in rows:
        share = tot / summary["sum_problem_s"] if summary["sum_problem_s"] else 0.0
        lines.append(f"| {name} | {med * 1e3:.1f} | {tot:.2f} | {share:.0%} |")
    g = summary["gc"]
    lines += [
        "",
        f"garbage collections on the tuning thread: {g['collections']} ({g['full']} full), {g['sum_s']:.3f} s in all",
    ]
    text = "\n".join(lines) + "\n"
    (args.out / "tune-phases.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
