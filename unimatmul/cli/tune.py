"""``unimatmul tune``: tune shapes, presets or a record file, write the cache, print a table.

``--from FILE`` reads a record file (``UNIMATMUL_MODE=record``) or PyTorch TunableOp's
untuned file; each recorded problem is tuned on the array library and device it was
met on, unless ``--array``/``--device`` say otherwise. ``--buckets [SPEC]`` tunes,
for each problem, every bucket from m=1 up to the bucket of its m (or of ``--max-m``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from unimatmul.cache.errors import CacheWriteError
from unimatmul.cache.file_store import MsgpackFileStore
from unimatmul.cache.record import TuningRecord
from unimatmul.cli import output, tune_model
from unimatmul.cli.output import EXIT_ERROR, EXIT_OK, EXIT_UNAVAILABLE, CliError, entries, fmt_us, plural
from unimatmul.core._backend import Target
from unimatmul.core.notices import size_text
from unimatmul.core.plugins import get_plugin_manager
from unimatmul.core.problem import Problem
from unimatmul.core.text_input import text_lines
from unimatmul.interop.tunableop_cache import untuned_problems
from unimatmul.tuning import confirm
from unimatmul.tuning.buckets import Buckets
from unimatmul.tuning.harness import LOW, HarnessConfig
from unimatmul.tuning.jobs import TuneJob, bucket_jobs, distinct
from unimatmul.tuning.plan import PlannedJob
from unimatmul.tuning.record_mode import ReadResult, RecordedProblem, parse_record_lines
from unimatmul.tuning.retire import Retirement
from unimatmul.tuning.selector import Selector, get_selector


def add_command(sub: Any) -> None:
    presets = get_plugin_manager().presets()
    listed = "\n".join(
        f"  {p.name:<12} {plural(len(p.shapes), 'shape')}: {p.description}" for p in presets.values()
    )
    p = sub.add_parser(
        "tune",
        help="tune shapes and write the cache; prints a table",
        description="Tune shapes, presets or a record file, write the cache and print a table.",
        epilog=f"presets (--preset NAME):\n{listed or '  none'}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    output.add_target_args(p, defaults_from_file=True)
    p.add_argument(
        "--shape",
        action="append",
        metavar="MxNxK[:dtype]",
        help="a problem to tune (repeatable); BxMxNxK for batched",
    )
    p.add_argument(
        "--preset",
        action="append",
        metavar="NAME",
        help=f"a shape suite of a real model (repeatable): {', '.join(presets) or 'none'}",
    )
    p.add_argument(
        "--dtype",
        help="dtype for shapes without one (default: f32), or of a --model (default: its torch_dtype)",
    )
    p.add_argument("--force", action="store_true", help="tune again even when the cache has an answer")
    p.add_argument("--budget-ms", type=float, default=None, help="measuring time per candidate")
    p.add_argument("--json", metavar="FILE", help="also write every record to FILE")
    output.add_verbosity(p, quiet="no progress bar and no warnings")
    p.add_argument(
        "--from",
        dest="from_file",
        metavar="FILE",
        help="tune the problems of a record file (UNIMATMUL_MODE=record) or a TunableOp untuned file",
    )
    p.add_argument(
        "--buckets",
        nargs="?",
        const="pow2",
        metavar="SPEC",
        help="tune every bucket of m up to each problem's m: pow2 (default), pow2:MAX or M1,M2,...",
    )
    p.add_argument("--max-m", type=int, metavar="M", help="with --buckets: sweep the buckets up to M")
    tune_model.add_options(p)
    p.set_defaults(func=cmd_tune)


def read_problem_file(path: str | Path) -> ReadResult:
    """The distinct problems of a record file or of a PyTorch TunableOp untuned file."""
    lines = text_lines(path, "a problem file")  # a regular file within the limit, line by line
    head = []
    for line in lines:
        head.append(line)
        if line.strip():
            break
    first = head[-1].strip() if head else ""
    if first.startswith("{"):
        return parse_record_lines(itertools.chain(head, lines)).distinct()
    try:
        found = untuned_problems(itertools.chain(head, lines))
    except UnicodeDecodeError:
        raise  # not text at all: said as such by the caller
    except ValueError as exc:
        msg = f"{path}: neither a unimatmul record file (JSON lines) nor a TunableOp untuned file: {exc}"
        raise ValueError(msg) from None
    problems = [RecordedProblem(problem, "torch", None) for _, problem in found.problems]
    return ReadResult(problems, found.skipped, "tunableop-untuned").distinct()


def _shape_problems(args: argparse.Namespace) -> list[Problem]:
    texts: list[str] = []
    dtype = args.dtype or "f32"
    presets = get_selector().plugins.presets()
    for name in args.preset or []:
        if name not in presets:
            valid = ", ".join(sorted(presets)) or "none"
            raise CliError(f"unknown preset {name!r}; valid presets: {valid}")
        texts.extend(f"{shape}:{dtype}" for shape in presets[name].shapes)
    texts.extend(s if ":" in s else f"{s}:{dtype}" for s in args.shape or [])
    if not texts:
        raise CliError(
            "nothing to tune: give --shape MxNxK[:dtype], --preset NAME, --from FILE or --model CONFIG"
        )
    problems: dict[str, Problem] = {}
    for text in texts:
        try:
            problem = Problem.parse_shape(text)
        except (ValueError, TypeError) as exc:
            raise CliError(str(exc)) from exc
        problems.setdefault(problem.key, problem)
    return list(problems.values())


def build_jobs(args: argparse.Namespace) -> tuple[list[TuneJob], list[str]]:
    """The distinct jobs the arguments ask for, and notes on what was skipped."""
    jobs: list[TuneJob] = []
    notes: list[str] = []
    if args.shape or args.preset or not (args.from_file or getattr(args, "model", None)):
        default = output.target(args.array, args.device)
        jobs.extend(TuneJob(p, default) for p in _shape_problems(args))
    if getattr(args, "model", None):
        jobs.extend(tune_model.model_jobs(args))
    if args.from_file:
        try:
            found = read_problem_file(args.from_file)
        except OSError as exc:
            raise CliError(f"cannot read {args.from_file}: {exc}", EXIT_UNAVAILABLE) from exc
        except UnicodeDecodeError as exc:
            msg = f"{args.from_file} is not a text file ({exc.reason} at byte {exc.start})"
            raise CliError(msg) from exc
        except ValueError as exc:
            raise CliError(str(exc)) from exc
        targets: dict[tuple[str, str], Target] = {}
        for item in found.problems:
            array = args.array or item.array
            device = args.device or item.device or "cuda"
            if item.problem.is_scaled and array != "torch":
                notes.append(f"{item.problem.shape_text}: scaled (fp8) problems tune on torch tensors only")
                continue
            if item.problem.is_grouped and array != "torch":
                notes.append(f"{item.problem.shape_text}: grouped problems tune on torch tensors only")
                continue
            key = (array, device)
            if key not in targets:
                targets[key] = output.target(array, device)
            jobs.append(TuneJob(item.problem, targets[key]))
        for line_no, why in found.skipped:
            notes.append(f"{args.from_file}:{line_no}: skipped ({why})")
    if args.buckets:
        try:
            spec = Buckets.parse(args.buckets)
        except ValueError as exc:
            raise CliError(str(exc)) from exc
        if spec is None:
            raise CliError(f"--buckets {args.buckets!r} turns bucketing off: nothing to tune")
        jobs = bucket_jobs(jobs, spec, args.max_m, notes)
    return distinct(jobs), notes


def check_jobs(jobs: list[TuneJob]) -> None:
    """Refuse, before any tuning, what could only fail later: a dtype the target's array
    library cannot hold (exit 2), operands larger than the memory free on the device (3)."""
    free: dict[Target, int | None] = {}
    seen: set[tuple[Target, str]] = set()
    for job in jobs:
        problem, target = job.problem, job.target
        for dtype in dict.fromkeys((problem.dtype_a, problem.dtype_b, problem.dtype_c)):
            if (target, dtype) in seen:
                continue
            seen.add((target, dtype))
            try:
                target.adapter.empty((1, 1), dtype, target.device)
            except TypeError as exc:
                hint = " (--array torch)" if target.array_kind == "numpy" else ""
                raise CliError(f"cannot tune {problem.shape_text}:{dtype} here: {exc}{hint}") from exc
        if target not in free:
            free[target] = output.available_memory(target.device, target.array_kind)
        need, have = output.operand_bytes(problem), free[target]
        if have is not None and need > have:
            msg = (
                f"{problem.shape_text}:{problem.dtype_a} needs {size_text(need)} for its operands "
                f"alone; {target.device} has {size_text(have)} free"
            )
            raise CliError(msg, EXIT_UNAVAILABLE)


def check_cache_writable(selector: Selector, jobs: list[TuneJob], force: bool) -> None:
    """Refuse now (exit 1: a write that fails) when the cache cannot take what tuning these jobs will find,
    instead of measuring for nothing. Jobs the cache answers already write nothing."""
    store = selector.store
    path = getattr(store, "path", None)
    if path is None:  # ':memory:' or another store: results live where it keeps them
        return
    if not force and all(job.stored(selector) is not None for job in jobs):
        return
    if getattr(store, "read_only", False):
        reason = getattr(store, "read_only_reason", "") or "read-only"
        raise CliError(f"cannot write the cache {path}: {reason}; nothing would be saved", EXIT_ERROR)
    output.check_writable(path, "the cache", make_parent=True)
    lock = getattr(store, "lock_path", None)
    if lock is not None and lock.exists() and (not lock.is_file() or not os.access(lock, os.W_OK)):
        raise CliError(f"cannot write the cache {path}: its lock file {lock} cannot be opened", EXIT_ERROR)


#: During a run, the cache file is written at most this often (seconds); see ``cmd_tune``.
FLUSH_EVERY_S = 1.0


def check_cache_written(selector: Selector) -> None:
    """After tuning something: fail (exit 1: a write that fails) if the results did not reach the cache file."""
    store = selector.store
    path = getattr(store, "path", None)
    if path is None:
        return
    try:
        store.flush(strict=True)
    except CacheWriteError as exc:
        raise CliError(f"the results were not written to the cache {path}: {exc}", EXIT_ERROR) from exc


def check_options(args: argparse.Namespace) -> None:
    if args.budget_ms is not None and not (0 < args.budget_ms < math.inf):
        raise CliError(f"--budget-ms must be a positive number of milliseconds, got {args.budget_ms:g}")
    if args.max_m is not None and args.max_m < 1:
        raise CliError(f"--max-m must be at least 1, got {args.max_m}")
    if args.max_m is not None and not args.buckets:
        raise CliError("--max-m only applies with --buckets")


def cmd_tune(args: argparse.Namespace, out: TextIO) -> int:
    from tqdm import tqdm

    check_options(args)
    tune_model.check_options(args)
    if args.dry_run:
        return tune_model.dry_run(args, out)
    if args.json:
        output.check_writable(args.json, "--json")
    jobs, notes = build_jobs(args)
    for note in notes:
        sys.stderr.write(f"unimatmul: {note}\n")
    selector = get_selector()
    for target in dict.fromkeys(job.target for job in jobs):
        if not selector.backends_for(target):
            why = selector.tuner.why_no_backend(target)
            raise CliError(
                f"no backend is available for {target.array_kind} on {target.device}: {why}", EXIT_UNAVAILABLE
            )
    check_jobs(jobs)
    check_cache_writable(selector, jobs, args.force)
    if args.budget_ms is not None and jobs:
        settings = selector.tuner.settings_for(jobs[0].target)
        selector.settings = HarnessConfig(**{**settings.to_dict(), "budget_s": args.budget_ms / 1e3})
    rows: list[list[str]] = []
    results = []
    plan = tune_model.plan(args, jobs)
    # Kernel families that lose by far on every problem of a class stop being measured.
    retirement = Retirement()
    selector.tuner.retirement = retirement
    # The cache file is written at most once a second during the run (and at its end):
    # each write re-reads, merges and replaces the whole file, which takes a large cache
    # longer than tuning a problem does. A run killed loses at most the last second's.
    store = selector.store
    paced = store if isinstance(store, MsgpackFileStore) and store.autoflush_s is None else None
    if paced is not None:
        paced.autoflush_s = FLUSH_EVERY_S
    bar = tqdm(total=len(jobs), desc="tuning", unit="shape", file=sys.stderr, disable=args.quiet or None)

    stops: list[Callable[[], None]] = []

    def ahead(items: list[PlannedJob]) -> None:
        # Kernels that compile (Triton's) start compiling for every problem, in the order
        # they come, while the first ones are measured.
        stops.append(selector.tuner.ahead_started([(i.job.problem, i.job.target) for i in items]))

    try:
        for item in plan.order(selector, force=args.force, before=ahead):
            job = item.job
            problem = job.problem
            bar.set_postfix_str(f"{job.label} {problem.dtype_a}, coverage {plan.coverage():.0%}")
            record, source = job.run(selector, force=args.force, cap_s=plan.cap_for_next())
            plan.done(item, record, source)
            bar.update()
            rows.append(row(job, record, source))
            results.append(
                {"problem": problem.key, "source": source, "share": item.share, **record.to_dict()}
            )
    finally:
        # Kernels still compiling for problems the budget left out are not wanted: without
        # this the process's exit would wait for every one of them.
        for stop in stops:
            stop()
        selector.tuner.retirement = None  # the run is over (the selector is the process's)
        if paced is not None:
            paced.autoflush_s = None  # (the check below writes the rest)
    if plan.left_out:
        bar.set_postfix_str(f"coverage {plan.coverage():.0%}, {len(plan.left_out)} left out")
    bar.close()
    write_table(rows, HEADERS, results, out)
    out.write(plan.summary() + "\n")
    retired = retirement.summary()
    if retired:
        out.write(retired + "\n")
    # After the table: a file that cannot be written after all loses nothing shown.
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as fh:
                json.dump(results, fh, indent=2)
        except OSError as exc:
            raise CliError(f"cannot write --json {args.json}: {exc.strerror or exc}", EXIT_ERROR) from exc
    if any(r["source"] == "tuned" for r in results):
        check_cache_written(selector)
    out.write(f"cache: {selector.store.location} ({entries(selector.store.count())})\n")
    return EXIT_OK


#: The columns of the table ``tune`` prints (``--distributed`` adds the rank's).
HEADERS = [
    "shape",
    "array",
    "dtype",
    "epilogue",
    "default us",
    "best candidate",
    "best us",
    "speedup",
    "bound",
    "confidence",
    "tune s",
    "in situ",
]
#: Left out of the table when no row has one.
OPTIONAL = ["in situ"]


def row(job: TuneJob, record: TuningRecord, source: str) -> list[str]:
    """The cells of one job's row, in the order of :data:`HEADERS`."""
    problem = job.problem
    return [
        job.label,
        array_text(job.target),
        problem.dtype_a,
        problem.epilogue,
        fmt_us(record.default_s),
        record.winner,
        fmt_us(record.winner_s),
        f"{record.speedup:.2f}x",
        output.bound(record),
        output.confidence(record),
        f"{record.tune_s:.2f}" if source == "tuned" else "cached",
        confirm.describe(record),
    ]


def array_text(target: Target) -> str:
    """The array column: the library, and the device when it is not the CPU."""
    return target.array_kind if target.device.kind == "cpu" else f"{target.array_kind} {target.device}"


def write_table(
    rows: list[list[str]], headers: list[str], results: list[dict[str, Any]], out: TextIO
) -> None:
    """The table, the geometric-mean speedup of the rows, and a note on low-confidence ones."""
    output.table(rows, headers, out, optional=OPTIONAL)
    speedups = [r["default_s"] / r["winner_s"] for r in results if r["default_s"] and r["winner_s"]]
    if speedups:
        geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        out.write(f"geometric-mean speedup over default: {geo:.3f}x on {plural(len(speedups), 'shape')}\n")
    low = sum(1 for r in results if (r.get("settings") or {}).get("confidence") == LOW)
    if low:
        out.write(
            f"{plural(low, 'shape')} of low confidence (a busy or noisy machine): "
            "tune again on a quieter one with --force\n"
        )
