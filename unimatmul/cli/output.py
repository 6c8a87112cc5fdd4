"""What every command shares: exit codes, the error a command reports, tables, the target,
and the checks a command makes before it starts work (files it will write, memory).

Exit codes a script can rely on (the README lists the same):

* 0 success (bare ``unimatmul`` and ``unimatmul cache`` print their help);
* 1 an unexpected error (a bug: ``unimatmul: error: ...`` names the exception;
  ``UNIMATMUL_DEBUG=1`` prints its traceback), or a write that fails (a read-only cache,
  a file or folder that cannot be written: checked before work starts where it can be);
* 2 bad usage or input: an unknown option (argparse's own code), a bad ``--shape``, an
  unknown preset, a dtype the array library cannot hold, a bad ``UNIMATMUL_*`` value
  (every one is checked before a command starts), a file to write (``-o``, ``--json``)
  in a folder that does not exist;
* 3 nothing could be done here: no backend or no such device for what was asked, a file
  that cannot be read, a problem too large for the memory here;
* 130 interrupted (Ctrl-C);
* 141 the output was closed early (``unimatmul info --json | head -1``): quietly, as a
  tool killed by SIGPIPE ends.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TextIO

from unimatmul import settings
from unimatmul.cache.protocol import default_cache_path
from unimatmul.cache.record import TuningRecord
from unimatmul.core._backend import DEFAULT, Target
from unimatmul.core.arrays import Device, adapter_for_kind
from unimatmul.core.dtypes import ITEMSIZE
from unimatmul.core.errors import CommandError
from unimatmul.core.grouped import grouped_operand_bytes
from unimatmul.core.problem import Problem
from unimatmul.tuning.harness import HIGH, LOW

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
EXIT_INTERRUPTED = 130
EXIT_CLOSED_OUTPUT = 141  # 128 + SIGPIPE, what a shell reports for `yes | head -1`

#: The error a command raises to end with a message and an exit code (default 2).
CliError = CommandError


def target(array: str | None, device: str | None) -> Any:
    """The Target that ``--array`` and ``--device`` name (numpy on the CPU by default)."""
    array, device = array or "numpy", device or "cpu"
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda", "hip") or (index and not index.isdigit()):
        raise CliError(f"unknown device {device!r}; use cpu, cuda[:N] or hip[:N]")
    if array == "numpy" and kind != "cpu":
        raise CliError("NumPy arrays live on the CPU; use --array torch or cupy for a GPU")
    try:
        adapter = adapter_for_kind(array)
    except ImportError as exc:
        raise CliError(f"--array {array} needs {array} installed ({exc})", EXIT_UNAVAILABLE) from exc
    where = Device(kind, int(index or 0))
    if kind != "cpu":
        _check_gpu(array, where)
    return Target(adapter, where)


def _check_gpu(array: str, device: Device) -> None:
    """Refuse a GPU that this array library cannot reach, before anything asks it for its
    properties (a CPU build of torch answers those with an AssertionError)."""
    if array == "torch":
        import torch

        hip = getattr(torch.version, "hip", None)
        build = f"torch {torch.__version__}"
        if device.kind == "hip" and not hip:
            raise CliError(f"{build} is not a ROCm build: it has no hip device", EXIT_UNAVAILABLE)
        if device.kind == "cuda" and hip:
            raise CliError(f"{build} is a ROCm build: use --device hip[:N]", EXIT_UNAVAILABLE)
        if not torch.cuda.is_available():
            why = "was built without CUDA" if torch.version.cuda is None and not hip else "sees no GPU"
            msg = f"{build} {why}: no {device.kind} device here (`unimatmul info` shows the CPU)"
            raise CliError(msg, EXIT_UNAVAILABLE)
        count = torch.cuda.device_count()
    else:  # cupy
        import cupy

        if device.kind == "hip" and not cupy.cuda.runtime.is_hip:
            raise CliError("this CuPy is not a ROCm build: it has no hip device", EXIT_UNAVAILABLE)
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # CUDAdriverError / CUDARuntimeError without a GPU or driver
            raise CliError(f"CuPy sees no GPU: {exc}", EXIT_UNAVAILABLE) from exc
    if device.index >= count:
        msg = f"no device {device}: {array} sees {count} GPU{'s' if count != 1 else ''}"
        raise CliError(msg, EXIT_UNAVAILABLE)


# --- before work starts ------------------------------------------------------------------


def check_writable(path: str | os.PathLike[str], what: str, *, make_parent: bool = False) -> Path:
    """Fail now, with the reason, if ``path`` cannot be written, rather than after the work
    that would fill it. The rule for every file a command is told to write (``-o``,
    ``--json``): its folder must exist, and a missing one is bad input (exit 2, naming
    it); any other reason it cannot be written is a write that fails (exit 1).
    ``make_parent``: create a missing folder instead (the cache file, as the cache store
    would). Leaves nothing else behind: the probe file it writes (``os.access`` says yes
    to root on a read-only mount) is removed."""
    file = Path(path).expanduser()
    folder = file.parent
    if file.is_dir():
        raise CliError(f"cannot write {what} {file}: it is a directory", EXIT_ERROR)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise CliError(f"cannot write {what} {file}: {existing} is a file, not a directory", EXIT_ERROR)
    if not make_parent and not folder.is_dir():
        raise CliError(f"cannot write {what} {file}: no directory {folder} (create it first)", EXIT_USAGE)
    try:
        if make_parent:
            folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{file.name}.probe-"):
            pass
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise CliError(f"cannot write {what} {file}: {why} (in {folder})", EXIT_ERROR) from exc
    if file.exists() and not os.access(file, os.W_OK):
        raise CliError(f"cannot write {what} {file}: the file is not writable", EXIT_ERROR)
    return file


def operand_bytes(problem: Problem) -> int:
    """The bytes of A, B and C of one problem: the least that measuring it must allocate
    (the harness needs more: rotated copies and a float64 reference)."""
    if problem.is_grouped:
        return grouped_operand_bytes(problem)  # a jagged operand is cut, not repeated per group
    m, n, k = problem.m, problem.n, problem.k
    a, b, c = (ITEMSIZE.get(d, 4) for d in (problem.dtype_a, problem.dtype_b, problem.dtype_c))
    return problem.batch * (m * k * a + k * n * b + m * n * c)


def available_memory(device: Device, array: str) -> int | None:
    """Bytes that can be allocated now on ``device``, or None when it cannot be told."""
    try:
        if device.kind == "cpu":
            return _host_available()
        if array == "torch":
            import torch

            return int(torch.cuda.mem_get_info(device.index)[0])
        if array == "cupy":
            import cupy

            with cupy.cuda.Device(device.index):
                return int(cupy.cuda.runtime.memGetInfo()[0])
    except Exception:  # no way to tell: the check is skipped, the harness copes
        return None
    return None


def _host_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


# --- printing ----------------------------------------------------------------------------


def plural(count: int, word: str, many: str = "") -> str:
    """A count and its noun: ``1 entry``, ``2 entries`` (``many`` defaults to ``word + "s"``)."""
    return f"{count} {word if count == 1 else (many or word + 's')}"


def entries(count: int) -> str:
    """``1 entry``, ``2 entries``: the count every command reports most."""
    return plural(count, "entry", "entries")


def fmt_us(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e6:,.1f}"


def table(rows: list[list[str]], headers: list[str], out: TextIO, *, optional: Collection[str] = ()) -> None:
    """Rows under their headers, first column left-aligned, the others right-aligned. A
    column named in ``optional`` is left out when none of its cells says anything."""
    keep = [i for i, h in enumerate(headers) if h not in optional or any(r[i] for r in rows)]
    headers = [headers[i] for i in keep]
    rows = [[row[i] for i in keep] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out.write(line.rstrip() + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for row in rows:
        cells = [c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        out.write("  ".join(cells).rstrip() + "\n")


def confidence(record: TuningRecord) -> str:
    """How far a record's measurements can be trusted: ``high``, ``low`` (a busy or noisy
    machine: the tuner warned), or ``-`` for a record that does not say (imported, older)."""
    found = record.settings.get("confidence")
    return found if found in (HIGH, LOW) else "-"


def bound(record: TuningRecord) -> str:
    """What the samples say for sure of a record's choice, at the confidence level its
    harness used (``settings["win"]``): ``>=1.42x`` for a kernel that replaced Default (its
    speedup is at least that), ``<=1.05x`` for a Default that stayed (the best contender's
    is at most that); ``-`` where the record does not say (older, imported, nothing to
    hold against Default) or its choice was made after the harness (a bucket, agreed ranks)."""
    win = record.settings.get("win")
    if not isinstance(win, dict):
        return "-"
    low, high = win.get("low"), win.get("high")
    if record.winner == win.get("candidate") and isinstance(low, (int, float)):
        return f">={low:.2f}x"
    if record.winner == DEFAULT.identity and isinstance(high, (int, float)):
        return f"<={high:.2f}x"
    return "-"


def help_of(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace, TextIO], int]:
    """A command that prints ``parser``'s help: what bare ``unimatmul`` (or ``unimatmul
    cache``) does, rather than an error about the missing command."""

    def show(args: argparse.Namespace, out: TextIO) -> int:
        parser.print_help(out)
        return EXIT_OK

    return show


def add_verbosity(p: argparse.ArgumentParser, *, quiet: str = "") -> None:
    """``-v``: the warnings met (and what else the command elides) in full; ``quiet``, when
    given, the help of a ``-q/--quiet`` that hides them too."""
    p.add_argument("-v", "--verbose", action="store_true", help="show every warning in full")
    if quiet:
        p.add_argument("-q", "--quiet", action="store_true", help=quiet)


def add_target_args(p: Any, *, defaults_from_file: bool = False) -> None:
    """``--array`` and ``--device``: whose arrays and which device a command is about."""
    when = "; with --from, as recorded" if defaults_from_file else ""
    p.add_argument(
        "--array",
        choices=["numpy", "torch", "cupy"],
        help=f"array library whose Default is the baseline (default: numpy{when})",
    )
    p.add_argument("--device", help=f"cpu, cuda[:N] or hip[:N] (default: cpu{when})")


def cache_path(args: argparse.Namespace) -> Path:
    """The file the command works on: ``--cache`` or the default one."""
    text = getattr(args, "cache", None)
    if text == ":memory:" or (text is None and settings.CACHE.get() == ":memory:"):
        raise CliError("this command works on a cache file, not on ':memory:'")
    return Path(text).expanduser() if text else default_cache_path()
