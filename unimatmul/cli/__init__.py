"""The ``unimatmul`` command: info, tune, cache.

Exit codes a script can rely on: 0 success; 1 an unexpected error; 2 bad usage or
input (argparse's own code); 3 nothing could be done here (no backend available for
the device asked, or a file that cannot be read).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


# --- helpers ---------------------------------------------------------------------------


def _target(array: str | None, device: str | None) -> Any:
    from unimatmul.core.arrays import Device, adapter_for_kind
    from unimatmul.core.backend import Target

    array, device = array or "numpy", device or "cpu"
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda", "hip"):
        raise CliError(f"unknown device {device!r}; use cpu, cuda[:N] or hip[:N]")
    if array == "numpy" and kind != "cpu":
        raise CliError("NumPy arrays live on the CPU; use --array torch or cupy for a GPU")
    try:
        adapter = adapter_for_kind(array)
    except ImportError as exc:
        raise CliError(f"--array {array} needs {array} installed ({exc})", EXIT_UNAVAILABLE) from exc
    return Target(adapter, Device(kind, int(index or 0)))


def _fmt_us(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e6:,.1f}"


def _table(rows: list[list[str]], headers: list[str], out: TextIO) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out.write(line.rstrip() + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for row in rows:
        cells = [c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        out.write("  ".join(cells).rstrip() + "\n")


# --- info ------------------------------------------------------------------------------


def cmd_info(args: argparse.Namespace, out: TextIO) -> int:
    from unimatmul import __version__
    from unimatmul.core.modes import get_mode
    from unimatmul.tuning.selector import get_selector

    selector = get_selector()
    target = _target(args.array, args.device)
    platform = selector.platform(target)
    backends: list[dict[str, Any]] = []
    for name, backend in sorted(selector.plugins.backends().items()):
        reason = backend.availability()
        versions: dict[str, str] = {}
        if reason is None:
            try:
                versions = backend.versions()
            except Exception as exc:
                reason = f"versions failed: {exc!r}"
        backends.append(
            {
                "name": name,
                "available": reason is None,
                "reason": reason,
                "versions": versions,
                "devices": sorted(backend.device_kinds),
                "serves_target": backend.serves(target),
            }
        )
    report = selector.plugins.report
    store = selector.store
    data: dict[str, Any] = {
        "unimatmul": __version__,
        "mode": get_mode(),
        "target": {"array": target.array_kind, "device": str(target.device)},
        "platform": platform.to_dict() | {"namespace": platform.namespace},
        "backends": backends,
        "plugins": {"loaded": report.loaded, "skipped": report.skipped, "failed": report.failed},
        "cache": {"path": store.location, "entries": store.count()},
    }
    if args.json:
        json.dump(data, out, indent=2)
        out.write("\n")
        return EXIT_OK
    out.write(f"unimatmul {__version__}   mode: {data['mode']}\n")
    out.write(f"platform:  {platform.namespace}\n")
    libs = ", ".join(f"{k} {v}" for k, v in platform.libraries)
    out.write(f"libraries: {libs}\n")
    out.write("backends:\n")
    for b in backends:
        if b["available"]:
            names = ", ".join(f"{k} {v}" for k, v in b["versions"].items())
            out.write(f"  {b['name']:<10} available    {names}   devices: {', '.join(b['devices'])}\n")
        else:
            out.write(f"  {b['name']:<10} unavailable  {b['reason']}\n")
    if report.failed:
        out.write("plugins rejected:\n")
        for name, why in report.failed.items():
            out.write(f"  {name}: {why}\n")
    if report.skipped:
        out.write("plugins skipped: " + ", ".join(f"{k} ({v})" for k, v in report.skipped.items()) + "\n")
    out.write(f"cache:     {store.location} ({data['cache']['entries']} entries)\n")
    return EXIT_OK


# --- tune ------------------------------------------------------------------------------


def _problems(args: argparse.Namespace) -> list[Any]:
    from unimatmul.core.problem import Problem
    from unimatmul.tuning.selector import get_selector

    texts: list[str] = []
    presets = get_selector().plugins.presets()
    for name in args.preset or []:
        if name not in presets:
            valid = ", ".join(sorted(presets)) or "none"
            raise CliError(f"unknown preset {name!r}; valid presets: {valid}")
        texts.extend(f"{shape}:{args.dtype}" for shape in presets[name].shapes)
    texts.extend(s if ":" in s else f"{s}:{args.dtype}" for s in args.shape or [])
    if not texts:
        raise CliError("nothing to tune: give --shape MxNxK[:dtype], --preset NAME or --from FILE")
    problems = []
    for text in texts:
        try:
            problems.append(Problem.parse_shape(text))
        except (ValueError, TypeError) as exc:
            raise CliError(str(exc)) from exc
    unique: dict[str, Any] = {}
    for problem in problems:
        unique.setdefault(problem.key, problem)
    return list(unique.values())


def cmd_tune(args: argparse.Namespace, out: TextIO) -> int:
    from tqdm import tqdm

    from unimatmul.cli.tune import build_jobs
    from unimatmul.tuning.harness import HarnessSettings
    from unimatmul.tuning.selector import get_selector

    try:
        jobs, notes = build_jobs(args, _problems, _target)
    except FileNotFoundError as exc:
        raise CliError(str(exc), EXIT_UNAVAILABLE) from exc
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    for note in notes:
        sys.stderr.write(f"unimatmul: {note}\n")
    selector = get_selector()
    for target in dict.fromkeys(job.target for job in jobs):
        if not selector.backends_for(target):
            reasons = {n: b.availability() for n, b in selector.plugins.backends().items()}
            out.write(f"no backend is available for {target.array_kind} on {target.device}: {reasons}\n")
            return EXIT_UNAVAILABLE
    if args.budget_ms is not None and jobs:
        settings = selector.settings_for(jobs[0].target)
        selector.settings = HarnessSettings(**{**settings.to_dict(), "budget_s": args.budget_ms / 1e3})
    rows: list[list[str]] = []
    results = []
    bar = tqdm(jobs, desc="tuning", unit="shape", file=sys.stderr, disable=args.quiet or None)
    for job in bar:
        problem = job.problem
        bar.set_postfix_str(f"{job.label} {problem.dtype_a}")
        record, source = job.run(selector, force=args.force)
        rows.append(
            [
                job.label,
                problem.dtype_a,
                _fmt_us(record.default_s),
                record.winner,
                _fmt_us(record.winner_s),
                f"{record.speedup:.2f}x",
                f"{record.tune_s:.2f}" if source == "tuned" else "cached",
            ]
        )
        results.append({"problem": problem.key, "source": source, **record.to_dict()})
    bar.close()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)
    headers = ["shape", "dtype", "default us", "best candidate", "best us", "speedup", "tune s"]
    _table(rows, headers, out)
    speedups = [r["default_s"] / r["winner_s"] for r in results if r["default_s"] and r["winner_s"]]
    if speedups:
        import math

        geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        out.write(f"geometric-mean speedup over default: {geo:.3f}x on {len(speedups)} shapes\n")
    out.write(f"cache: {selector.store.location} ({selector.store.count()} entries)\n")
    return EXIT_OK


# --- conformance -----------------------------------------------------------------------


def cmd_conformance(args: argparse.Namespace, out: TextIO) -> int:
    try:
        from unimatmul_conformance.runner import run_from_cli
    except ImportError as exc:
        raise CliError(f"the conformance suite is not installed ({exc})", EXIT_UNAVAILABLE) from exc
    code: int = run_from_cli(args, out)
    return code


# --- parser ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="unimatmul",
        description="Measure, pick and remember the fastest GEMM kernel on this machine.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def target_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--array",
            choices=["numpy", "torch", "cupy"],
            help="array library whose Default is the baseline (default: numpy; with --from, as recorded)",
        )
        p.add_argument("--device", help="cpu, cuda[:N] or hip[:N] (default: cpu; with --from, as recorded)")

    p = sub.add_parser("info", help="platform, backends and their versions, cache")
    target_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("tune", help="tune shapes and write the cache; prints a table")
    target_args(p)
    p.add_argument(
        "--shape",
        action="append",
        metavar="MxNxK[:dtype]",
        help="a problem to tune (repeatable); BxMxNxK for batched",
    )
    p.add_argument("--preset", action="append", metavar="NAME", help="a shape suite of a real model")
    p.add_argument("--dtype", default="f32", help="dtype for shapes without one (default: f32)")
    p.add_argument("--force", action="store_true", help="tune again even when the cache has an answer")
    p.add_argument("--budget-ms", type=float, default=None, help="measuring time per candidate")
    p.add_argument("--json", metavar="FILE", help="also write every record to FILE")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
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
    p.set_defaults(func=cmd_tune)

    from unimatmul.cli.cache import add_cache_commands

    add_cache_commands(sub)

    p = sub.add_parser("conformance", help="run the conformance suite on one backend")
    p.add_argument("--backend", required=True, help="backend name (see `unimatmul info`)")
    p.add_argument("--json", metavar="FILE", help="write the JSON report to FILE")
    p.add_argument("--quick", action="store_true", help="a smaller problem matrix")
    p.add_argument(
        "--device", help="cpu, cuda[:N] or hip[:N] (default: the GPU the backend serves, else cpu)"
    )
    p.add_argument(
        "--xfail", metavar="FILE", help="more expected failures (one 'check-id-pattern reason' a line)"
    )
    p.set_defaults(func=cmd_conformance)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args, out)
        return code
    except CliError as exc:
        sys.stderr.write(f"unimatmul: error: {exc}\n")
        return exc.code
    except KeyboardInterrupt:
        sys.stderr.write("unimatmul: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
