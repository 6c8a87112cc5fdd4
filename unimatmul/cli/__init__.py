"""The ``unimatmul`` command: ``info``, ``tune``, ``cache ...``, and commands of plugins.

The built-in commands live in this package (``info``, ``tune``, ``cache``); a plugin
adds its own through the ``unimatmul_register_commands`` hook (the conformance suite
adds ``unimatmul conformance`` that way), so that nothing here imports it. Exit codes:
:mod:`unimatmul.cli.output`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from unimatmul.cli import cache, info, tune, tune_distributed
from unimatmul.cli.output import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
)
from unimatmul.core.plugins import get_plugin_manager

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "CliError",
    "build_parser",
    "main",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="unimatmul",
        description="Measure, pick and remember the fastest GEMM kernel on this machine.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    info.add_command(sub)
    tune.add_command(sub)
    tune_distributed.add_options(sub.choices["tune"])  # --distributed, under torchrun
    cache.add_command(sub)
    for command in get_plugin_manager().commands().values():
        p = sub.add_parser(command.name, help=command.help)
        command.configure(p)
        p.set_defaults(func=command.run)
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
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
