"""``unimatmul tune --model CONFIG`` and ``--budget``: a model's GEMMs from its config, and
a whole run within a time budget, spent where it is expected to gain the most.

    unimatmul tune --model llama-3-8b --array torch --device cuda --budget 10
    unimatmul tune --model path/to/config.json --tokens 1,8,64,2048 --tp 2 --dry-run

The GEMMs come from :mod:`unimatmul.tuning.model_gemms`; the order, the budget and the
coverage from :mod:`unimatmul.tuning.plan`. This module adds the options to the ``tune``
command of :mod:`unimatmul.cli.tune` and builds what that command runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from pathlib import Path
from typing import TextIO

from unimatmul.cli import output
from unimatmul.cli.output import EXIT_OK, EXIT_UNAVAILABLE, CliError
from unimatmul.core._backend import Target
from unimatmul.tuning.jobs import TuneJob
from unimatmul.tuning.model_gemms import DEFAULT_TOKENS, ConfigError, ModelGemm, load_config, model_gemms
from unimatmul.tuning.plan import LeftOut, PlannedJob, TunePlan, problem_seconds, roofline_s
from unimatmul.tuning.record_mode import parse_record_lines

TORCH_ONLY = "grouped (MoE experts): grouped problems tune on torch tensors only (--array torch)"
GROUPED_NOTE = (
    "grouped: the experts as transformers' grouped_mm runs them (the tokens x top_k routed rows "
    "against every expert's weight), shown as experts x (rows/experts) x N x K; each is tuned at "
    "its rows' bucket (the next power of two): the Problem the grouped door builds for every "
    "call of that bucket"
)
ROOFLINE_NOTE = (
    "shares: estimated from FLOPs and bytes with a simple roofline (a nominal {device}), "
    "each token count weighing the same; attention scores run in SDPA and are not GEMMs here"
)


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        metavar="CONFIG",
        help="tune every GEMM of a model: a Hugging Face config.json (or its folder) or a built-in name",
    )
    p.add_argument(
        "--tokens",
        metavar="T1,T2,...",
        help="with --model: token counts per forward pass (default: 1,2,...,64 and 512,...,8192)",
    )
    p.add_argument("--tp", type=int, default=1, metavar="N", help="with --model: tensor-parallel degree")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="with --model: list its GEMMs and their shares of its time; tune nothing",
    )
    p.add_argument(
        "--budget",
        type=float,
        metavar="SECONDS",
        help="the most seconds for the whole run, from the command's start (its imports included), "
        "spent where expected gain x share per expected second of tuning is largest",
    )
    p.add_argument(
        "--cap",
        type=float,
        metavar="SECONDS",
        help="the most seconds one problem may take (UNIMATMUL_TUNE_CAP_S)",
    )


def check_options(args: argparse.Namespace) -> None:
    for flag, value in (("--budget", args.budget), ("--cap", args.cap)):
        if value is not None and not (0 < value < math.inf):
            raise CliError(f"{flag} must be a positive number of seconds, got {value:g}")
    if args.model is None:
        for flag, given in (("--tokens", args.tokens), ("--tp", args.tp != 1)):
            if given:
                raise CliError(f"{flag} only applies with --model")
    elif args.buckets:
        raise CliError("--model tunes each token count exactly (--tokens); it does not take --buckets")
    elif args.shape or args.preset or args.from_file:
        raise CliError(
            "--model tunes one model's products (their shares are of its time): give --shape, "
            "--preset or --from in a run of their own"
        )
    if args.tp < 1:
        raise CliError(f"--tp must be at least 1, got {args.tp}")


def tokens(args: argparse.Namespace) -> tuple[int, ...]:
    if not args.tokens:
        return DEFAULT_TOKENS
    try:
        found = tuple(int(part) for part in args.tokens.split(",") if part.strip())
    except ValueError:
        found = ()
    if not found or min(found) < 1:
        raise CliError(f"--tokens {args.tokens!r}: expected positive integers separated by commas")
    return found


def gemms(args: argparse.Namespace) -> tuple[list[ModelGemm], str]:
    """The model's GEMMs as the arguments ask for them, and where its config came from."""
    try:
        config, source = load_config(args.model)
        dtype = args.dtype
        return model_gemms(config, tokens(args), tp=args.tp, dtype=dtype), source
    except OSError as exc:
        raise CliError(f"cannot read --model {args.model}: {exc.strerror or exc}", EXIT_UNAVAILABLE) from exc
    except (ConfigError, TypeError) as exc:
        raise CliError(f"--model {args.model}: {exc}") from exc


def model_target(args: argparse.Namespace) -> Target:
    """A model's products run in PyTorch: ``--array`` defaults to torch."""
    if args.array is None and importlib.util.find_spec("torch") is None:
        raise CliError(
            "--model tunes against torch.matmul (a model runs in PyTorch), and torch is not "
            "installed: pip install torch, or tune against numpy.matmul with --array numpy "
            "(and --dtype f32 for a model whose weights are bf16, which NumPy cannot hold)",
            EXIT_UNAVAILABLE,
        )
    return output.target(args.array or "torch", args.device)


def refused(gemm: ModelGemm, array: str) -> str:
    """Why a model's product is not tuned on ``array``'s tensors ("" when it is)."""
    if gemm.refused:
        return gemm.refused
    if gemm.grouped and array != "torch":
        return TORCH_ONLY
    return ""


def model_jobs(args: argparse.Namespace) -> list[TuneJob]:
    """A job for every product of the model that can be tuned here (dense and grouped)."""
    target = model_target(args)
    return [TuneJob(g.problem(), target) for g in gemms(args)[0] if not refused(g, target.array_kind)]


def _gemm_seconds(gemm: ModelGemm, device_kind: str) -> float:
    return gemm.layers * roofline_s(gemm.flops, gemm.min_bytes, gemm.dtype, device_kind)


def _shares(found: list[ModelGemm], device_kind: str) -> list[float]:
    """Each GEMM's share of its pass's time, divided by the number of passes."""
    totals: dict[int, float] = {}
    for g in found:
        totals[g.tokens] = totals.get(g.tokens, 0.0) + _gemm_seconds(g, device_kind)
    passes = len(totals)
    return [_gemm_seconds(g, device_kind) / (totals[g.tokens] * passes) for g in found]


def plan(args: argparse.Namespace, jobs: list[TuneJob]) -> TunePlan:
    """The run's plan: each job's share (the model's roofline, a record file's call counts,
    else each problem once), the budget and the cap."""
    items: dict[tuple[str, Target], PlannedJob] = {}
    left_out: list[LeftOut] = []
    for job in jobs:
        items.setdefault((job.problem.key, job.target), PlannedJob(job, 0.0))
    if args.model:
        found, _ = gemms(args)
        target = jobs[0].target if jobs else None
        kind = target.device.kind if target is not None else "cuda"
        for gemm, share in zip(found, _shares(found, kind), strict=True):
            what = f"{gemm.name} @ {gemm.tokens}"
            why = refused(gemm, target.array_kind if target is not None else args.array or "torch")
            if why:
                left_out.append(LeftOut(what, share, why))
                continue
            item = items.get((gemm.problem().key, target))  # type: ignore[arg-type]
            if item is not None:
                item.share += share
                item.what = f"{item.what}, {gemm.name}" if item.what else what
    calls = _record_calls(args)
    for (key, _), item in items.items():
        if item.share == 0.0:
            item.share = calls.get(key, 1) * problem_seconds(item.job.problem, item.job.target.device.kind)
    by_priority = bool(args.model) or args.budget is not None
    return TunePlan(
        list(items.values()),
        left_out,
        budget_s=args.budget,
        cap_s=args.cap,
        by_priority=by_priority,
        run_started=getattr(args, "started", None),
    )


def _record_calls(args: argparse.Namespace) -> dict[str, int]:
    """Call counts a record file's lines carry (``"calls"``), by problem key."""
    if not args.from_file:
        return {}
    try:
        text = Path(args.from_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}  # build_jobs read it already; a TunableOp file has no counts
    counts: dict[str, int] = {}
    for item in parse_record_lines(text).problems:
        if item.calls:
            counts[item.problem.key] = counts.get(item.problem.key, 0) + item.calls
    return counts


def dry_run(args: argparse.Namespace, out: TextIO) -> int:
    """List the model's GEMMs and their shares; tune nothing, touch no cache."""
    if not args.model:
        raise CliError("--dry-run lists a model's GEMMs: give --model CONFIG")
    found, source = gemms(args)
    kind = (args.device or "cpu").partition(":")[0]
    shares = _shares(found, kind)
    rows = []
    skipped: dict[str, float] = {}
    for gemm, share in zip(found, shares, strict=True):
        layout = "NT" if gemm.trans_b else "NN"
        why = refused(gemm, args.array or "torch")
        if why:
            skipped[why] = skipped.get(why, 0.0) + share
        rows.append(
            [
                gemm.name,
                str(gemm.tokens),
                gemm.shape_text,
                f"{layout}{' +bias' if gemm.bias else ''}",
                gemm.dtype,
                str(gemm.layers),
                f"{share:.2%}",
                "skipped" if why else ("tune grouped" if gemm.grouped else "tune"),
            ]
        )
    out.write(f"model: {source}; tp {args.tp}\n")
    output.table(rows, ["gemm", "tokens", "MxNxK", "layout", "dtype", "layers", "share", "status"], out)
    tuned = [g for g, row in zip(found, rows, strict=True) if row[-1] != "skipped"]
    keys = {g.problem().key for g in tuned}
    grouped = {g.problem().key for g in tuned if g.grouped}
    out.write(
        f"{len(found)} GEMMs; {len(keys)} distinct problems to tune, {len(grouped)} of them grouped "
        f"({1 - sum(skipped.values()):.1%} of the GEMM time)\n"
    )
    for why, share in skipped.items():
        out.write(f"skipped: {share:.1%} of the GEMM time is {why}\n")
    if grouped:
        out.write(GROUPED_NOTE + "\n")
    device = "CPU" if kind == "cpu" else "GPU (H200)"
    out.write(ROOFLINE_NOTE.format(device=device) + "\n")
    return EXIT_OK
