"""The ``unimatmul`` command: ``info``, ``tune``, ``cache ...``, and commands of plugins.

The built-in commands live in this package (``info``, ``tune``, ``cache``); a plugin
adds its own through the ``unimatmul_register_commands`` hook (the conformance suite
adds ``unimatmul conformance`` that way), so that nothing here imports it. Exit codes:
:mod:`unimatmul.cli.output`. :func:`main` ends every failure with one line on stderr
(``unimatmul: error: ...``) and its exit code, never with a traceback
(``UNIMATMUL_DEBUG=1`` adds the traceback of an unexpected error).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from typing import TextIO

from unimatmul import settings
from unimatmul.cli import cache, info, tune, tune_distributed
from unimatmul.cli.output import (
    EXIT_CLOSED_OUTPUT,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
)
from unimatmul.core.plugins import get_plugin_manager

__all__ = [
    "EXIT_CLOSED_OUTPUT",
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
    """Run the command ``argv`` names (default: ``sys.argv``) and return its exit code.

    argparse's own errors (an unknown option) still end in ``SystemExit(2)``, and
    ``--help`` in ``SystemExit(0)``.
    """
    out = out or sys.stdout
    try:
        args = build_parser().parse_args(argv)
        code: int = args.func(args, out)
        return code
    except CliError as exc:
        return _fail(str(exc), exc.code)
    except settings.SettingError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        _say("unimatmul: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of our output went away (`| head -1`): nothing to tell it, and no
        # one to tell; end as a tool that SIGPIPE stops does.
        _silence_stdout()
        return EXIT_CLOSED_OUTPUT
    except MemoryError:
        _debug_traceback()
        return _fail("out of memory (a problem too large for this machine?)", EXIT_UNAVAILABLE)
    except OSError as exc:
        # A file or a device the command needed and could not use: not a bug.
        _debug_traceback()
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or exc}", EXIT_UNAVAILABLE)
    except Exception as exc:
        _debug_traceback()
        hint = "" if _debug() else " (an unexpected error; UNIMATMUL_DEBUG=1 shows its traceback)"
        return _fail(f"{type(exc).__name__}: {exc}{hint}", EXIT_ERROR)


def _fail(message: str, code: int) -> int:
    _say(f"unimatmul: error: {message}")
    return code


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr closed too: the exit code is all that is left
        pass


def _debug() -> bool:
    try:
        return settings.DEBUG.get()
    except settings.SettingError:
        return False


def _debug_traceback() -> None:
    if _debug():
        _say(traceback.format_exc().rstrip())


def _silence_stdout() -> None:
    # Python flushes stdout once more at exit, which would fail again and print
    # "Exception ignored ... BrokenPipeError": point the descriptor at /dev/null.
    if sys.stdout is not sys.__stdout__ or sys.stdout is None:
        return
    try:
        fd = sys.stdout.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError):
        return
    os.dup2(devnull, fd)
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
