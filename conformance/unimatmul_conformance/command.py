"""``unimatmul conformance``: run the suite on one backend and print the summary.

The command is added to the ``unimatmul`` CLI through the ``unimatmul_register_commands``
hook (this module is the ``conformance`` entry point of group ``unimatmul``), so that
the core never imports the suite. Exit codes follow the ``unimatmul`` command: 0 every check passed (or failed as
expected); 1 a check failed; 2 bad usage (an unknown backend); 3 nothing could be
done here (the backend's library or device is missing).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from typing import TextIO

from unimatmul.core.errors import BackendUnavailable, CommandError
from unimatmul.core.hookspecs import hookimpl
from unimatmul_conformance.expectations import Expectations
from unimatmul_conformance.loading import BackendNotFound, load_backend
from unimatmul_conformance.suite import Check, Suite, parse_device

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3


@hookimpl
def unimatmul_register_commands(register: Callable[..., None]) -> None:
    register("conformance", "run the conformance suite on one backend", configure, run_from_cli)


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", required=True, help="backend name (see `unimatmul info`)")
    p.add_argument("--json", metavar="FILE", help="write the JSON report to FILE")
    p.add_argument("--quick", action="store_true", help="a smaller problem matrix")
    p.add_argument(
        "--device", help="cpu, cuda[:N] or hip[:N] (default: the GPU the backend serves, else cpu)"
    )
    p.add_argument(
        "--xfail", metavar="FILE", help="more expected failures (one 'check-id-pattern reason' a line)"
    )


def run_from_cli(args: argparse.Namespace, out: TextIO) -> int:
    try:
        backend = load_backend(args.backend)
    except BackendNotFound as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    device_text = args.device
    try:
        device = parse_device(device_text) if device_text else None
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    expectations = None
    xfail_path = args.xfail
    if xfail_path:
        try:
            expectations = Expectations.builtin(backend.name)
            expectations.extend(Expectations.from_file(xfail_path))
        except (OSError, ValueError) as exc:
            raise CommandError(f"cannot read the expected-failure file: {exc}", EXIT_USAGE) from exc
    try:
        suite = Suite(
            backend, spec=args.backend, device=device, quick=bool(args.quick), expectations=expectations
        )
    except BackendUnavailable as exc:
        out.write(f"unimatmul conformance: {exc}\n")
        return EXIT_UNAVAILABLE

    def progress(checks: Iterable[Check]) -> Iterable[Check]:
        from tqdm import tqdm

        items = list(checks)
        bar = tqdm(items, desc=f"conformance {backend.name}", unit="check", file=sys.stderr, disable=None)
        for check in bar:
            bar.set_postfix_str(check.name, refresh=False)
            yield check

    report = suite.run(progress=progress)
    if args.json:
        report.write_json(args.json)
    out.write(report.summary())
    if args.json:
        out.write(f"report: {args.json}\n")
    return EXIT_OK if report.ok else EXIT_FAILED
