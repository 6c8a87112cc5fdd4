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
import time
import traceback
from collections.abc import Sequence
from typing import TextIO

from unimatmul import __version__, settings
from unimatmul.cli import cache, info, output, tune, tune_distributed, warning_summary
from unimatmul.cli.output import (
    EXIT_CLOSED_OUTPUT,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CliError,
)
from unimatmul.core.modes import get_mode
from unimatmul.core.plugins import get_plugin_manager
from unimatmul.tuning.buckets import Buckets

__all__ = [
    "EXIT_CLOSED_OUTPUT",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "CliError",
    "build_parser",
    "check_settings",
    "main",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="unimatmul",
        description="Measure, pick and remember the fastest GEMM kernel on this machine.",
        epilog="Run `unimatmul COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"unimatmul {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    info.add_command(sub)
    tune.add_command(sub)
    tune_distributed.add_options(sub.choices["tune"])  # --distributed, under torchrun
    cache.add_command(sub)
    for command in get_plugin_manager().commands().values():
        p = sub.add_parser(command.name, help=command.help)
        command.configure(p)
        p.set_defaults(func=command.run)
    parser.set_defaults(func=output.help_of(parser))
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command ``argv`` names (default: ``sys.argv``) and return its exit code.

    argparse's own errors (an unknown option) still end in ``SystemExit(2)``, and
    ``--help`` in ``SystemExit(0)``. The warnings the command meets are shown after its
    output, one line per kind (:mod:`unimatmul.cli.warning_summary`), then its error.
    """
    out = out or sys.stdout
    started = run_started(argv is None)
    args: argparse.Namespace | None = None
    with warning_summary.collecting() as caught:
        try:
            args = build_parser().parse_args(argv)
            args.started = started
            check_settings()
            code: int = args.func(args, out)
            failure = ""
        except BrokenPipeError:
            # The reader of our output went away (`| head -1`): nothing to tell it, and no
            # one to tell; end as a tool that SIGPIPE stops does.
            _silence_stdout()
            return EXIT_CLOSED_OUTPUT
        except BaseException as exc:  # SystemExit (argparse) goes on below
            code, failure = _failure(exc)
    verbose, quiet = bool(getattr(args, "verbose", False)), bool(getattr(args, "quiet", False))
    for line in warning_summary.lines(caught, verbose=verbose, quiet=quiet):
        _say(line)
    if failure:
        _say(failure)
    return code


def run_started(whole_process: bool) -> float:
    """When the command started, on ``time.perf_counter``'s scale: the process's start
    where the command is the process (``argv`` from the command line: its imports count
    too), else now. The process's age comes from Linux's ``/proc``; elsewhere, now."""
    now = time.perf_counter()
    if not whole_process:
        return now
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as fh:
            uptime = float(fh.read().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return now
    return now - min(max(age, 0.0), 3600.0)


def check_settings() -> None:
    """Every ``UNIMATMUL_*`` variable set now must parse (SettingError, exit 2, names the
    first that does not), before a command starts rather than in the middle of its work."""
    get_mode()  # UNIMATMUL_MODE through its own reader, the message every entry point gives
    for setting in settings.REGISTRY.values():
        setting.get()
    Buckets.from_env()  # a spec, which its Setting keeps as text


def _failure(exc: BaseException) -> tuple[int, str]:
    """The exit code and the last line for a command that ended in ``exc``."""
    if isinstance(exc, CliError):
        return exc.code, _error(str(exc))
    if isinstance(exc, settings.SettingError):
        return EXIT_USAGE, _error(str(exc))
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "unimatmul: interrupted"
    if isinstance(exc, MemoryError):
        _debug_traceback()
        return EXIT_UNAVAILABLE, _error("out of memory (a problem too large for this machine?)")
    if isinstance(exc, OSError):
        # A file or a device the command needed and could not use: not a bug.
        _debug_traceback()
        where = f"{exc.filename}: " if exc.filename else ""
        return EXIT_UNAVAILABLE, _error(f"{where}{exc.strerror or exc}")
    if isinstance(exc, Exception):
        _debug_traceback()
        hint = "" if _debug() else " (an unexpected error; UNIMATMUL_DEBUG=1 shows its traceback)"
        return EXIT_ERROR, _error(f"{type(exc).__name__}: {exc}{hint}")
    raise exc  # SystemExit and the like: not a failure of the command's own


def _error(message: str) -> str:
    return f"unimatmul: error: {message}"


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
