"""``unimatmul tune --distributed``: tune across the ranks that torchrun started.

    torchrun --nproc-per-node 8 -m unimatmul tune --preset llama3-8b --array torch --device cuda

Under torchrun (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set) this path
is taken without the flag; ``--no-distributed`` makes each process tune alone instead.
Each rank tunes on its own device (``--device cuda`` means ``cuda:LOCAL_RANK``), claims
jobs largest first, and rank 0 writes every record into the cache once and prints the
table (with the rank that tuned each shape) and the progress bar; the other ranks print
nothing but errors. See :mod:`unimatmul.tuning.distributed`.

This module adds ``--distributed`` to the ``tune`` command that :mod:`unimatmul.cli.tune`
defines, and hands every other run back to it unchanged.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from unimatmul.cli import output, tune, tune_model
from unimatmul.cli.output import EXIT_ERROR, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, CliError
from unimatmul.core._backend import Target
from unimatmul.tuning.distributed import (
    DistributedError,
    ShardedRun,
    launch,
    launch_env,
    rank_device,
    tune_sharded,
)
from unimatmul.tuning.harness import HarnessConfig
from unimatmul.tuning.jobs import TuneJob
from unimatmul.tuning.selector import get_selector


def add_options(p: argparse.ArgumentParser) -> None:
    """Give the ``tune`` parser ``--distributed`` and route its runs through :func:`cmd`."""
    p.add_argument(
        "--distributed",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tune across the ranks torchrun started, one device each; rank 0 writes the cache "
        "once (default: on under torchrun)",
    )
    p.set_defaults(func=cmd)


def wanted(args: argparse.Namespace) -> bool:
    if args.distributed is not None:
        return bool(args.distributed)
    try:
        return launch_env() is not None
    except DistributedError as exc:
        raise CliError(str(exc)) from None


def cmd(args: argparse.Namespace, out: TextIO) -> int:
    if not wanted(args):
        return tune.cmd_tune(args, out)
    return cmd_tune_distributed(args, out)


def _local_jobs(args: argparse.Namespace) -> tuple[list[TuneJob], list[str], str]:
    """The jobs on this rank's device, the notes, and the kind of device the group runs on."""
    try:
        env = launch_env()
    except DistributedError as exc:
        raise CliError(str(exc)) from None
    if env is None:
        raise CliError(
            "--distributed runs under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not set): "
            "torchrun --nproc-per-node N -m unimatmul tune ...",
            EXIT_USAGE,
        )
    kind, _, index = (args.device or "cpu").partition(":")
    if index:
        raise CliError(
            f"--device {args.device}: with --distributed each rank uses its own device "
            f"({kind}:LOCAL_RANK); give --device {kind}"
        )
    jobs, notes = tune.build_jobs(args)
    # Recorded problems (--from) name the device they were met on: each rank uses its own.
    jobs = [
        TuneJob(
            j.problem, Target(j.target.adapter, rank_device(j.target.device.kind, env.local_rank)), j.buckets
        )
        for j in jobs
    ]
    kinds = {j.target.device.kind for j in jobs}
    gpu = sorted(kinds - {"cpu"})
    return jobs, notes, gpu[0] if gpu else "cpu"


def cmd_tune_distributed(args: argparse.Namespace, out: TextIO) -> int:
    from tqdm import tqdm

    tune_model.check_options(args)
    for flag, given in (("--budget", args.budget), ("--cap", args.cap), ("--dry-run", args.dry_run)):
        if given:
            raise CliError(f"{flag} does not apply with --distributed (each rank tunes a share of every job)")
    jobs, notes, kind = _local_jobs(args)
    try:
        group = launch(kind)
    except DistributedError as exc:
        raise CliError(str(exc), EXIT_UNAVAILABLE if exc.unavailable else EXIT_USAGE) from None
    lead = group.rank == 0
    selector = get_selector()
    if args.budget_ms is not None and jobs:
        settings = selector.tuner.settings_for(jobs[0].target)
        selector.settings = HarnessConfig(**{**settings.to_dict(), "budget_s": args.budget_ms / 1e3})
    if lead:
        for note in notes:
            sys.stderr.write(f"unimatmul: {note}\n")
    bar = tqdm(total=0, desc="tuning", unit="shape", file=sys.stderr, disable=args.quiet or not lead or None)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    try:
        run = tune_sharded(jobs, selector, group, force=args.force, progress=progress)
    except DistributedError as exc:
        raise CliError(str(exc), EXIT_UNAVAILABLE if exc.unavailable else EXIT_ERROR) from None
    finally:
        bar.close()
        group.close()
    if lead:
        _report(args, jobs, run, out, selector.store.location, selector.store.count())
    return EXIT_ERROR if run.failed else EXIT_OK


def _report(
    args: argparse.Namespace, jobs: list[TuneJob], run: ShardedRun, out: TextIO, where: str, entries: int
) -> None:
    """Rank 0: the table, every failure, the balance of the ranks and where the records went."""
    rows: list[list[str]] = []
    results: list[dict[str, Any]] = []
    for job, outcome in zip(jobs, run.outcomes, strict=True):
        record = outcome.record
        if record is None:
            cells = ["-"] * len(tune.HEADERS)
            cells[:3] = [job.label, tune.array_text(job.target), job.problem.dtype_a]
            cells[5] = f"failed: {outcome.error}"
            rows.append([*cells[:-1], "", "-"])  # no verdict, no rank
            continue
        tuned = outcome.source == "tuned"
        rows.append([*tune.row(job, record, outcome.source), str(outcome.rank) if tuned else "-"])
        results.append(
            {"problem": job.problem.key, "source": outcome.source, "rank": outcome.rank, **record.to_dict()}
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    tune.write_table(rows, [*tune.HEADERS, "rank"], results, out)
    how = "claimed largest first" if run.claiming else "dealt out statically, largest first"
    out.write(f"ranks: {run.ranks} ({run.backend}), jobs {how}\n")
    for rank in range(run.ranks):
        out.write(f"  rank {rank}: {run.tuned[rank]} tuned, {run.busy_s[rank]:.2f} s busy\n")
    busy = sum(run.busy_s)
    if run.tuning_s > 0 and busy > 0:
        out.write(
            f"tuning: {run.tuning_s:.2f} s on {run.ranks} ranks "
            f"(busy {busy:.2f} s, {busy / (run.ranks * run.tuning_s):.0%} of the ranks' time)\n"
        )
    shared = {host: n for host, n in run.hosts.items() if n > 1}
    if any(job.target.device.kind == "cpu" for job in jobs):
        if shared:
            out.write(
                f"note: {', '.join(f'{n} ranks share {host}' for host, n in shared.items())}: CPU ranks on "
                "one machine disturb each other's timings; tune CPUs with one rank per machine\n"
            )
        if run.omp_threads is not None:
            out.write(
                f"note: OMP_NUM_THREADS={run.omp_threads} (torchrun sets 1 for several processes per "
                "machine): CPU kernels were timed with that many threads\n"
            )
    for outcome in run.failed:
        out.write(f"failed: {jobs[outcome.index].label}: {outcome.error}\n")
    out.write(f"cache: {where} ({output.entries(entries)}; {run.written} written once by rank 0)\n")
