"""What every command shares: exit codes, the error a command reports, tables, the target.

Exit codes a script can rely on: 0 success; 1 an unexpected error, or a write that
failed; 2 bad usage or input (argparse's own code); 3 nothing could be done here (no
backend available for the device asked, a file that cannot be read); 130 interrupted.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, TextIO

from unimatmul import settings
from unimatmul.cache.protocol import default_cache_path
from unimatmul.core.arrays import Device, adapter_for_kind
from unimatmul.core.backend import Target
from unimatmul.core.errors import CommandError

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
EXIT_INTERRUPTED = 130

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
    return Target(adapter, Device(kind, int(index or 0)))


def fmt_us(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e6:,.1f}"


def table(rows: list[list[str]], headers: list[str], out: TextIO) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out.write(line.rstrip() + "\n")
    out.write("  ".join("-" * w for w in widths) + "\n")
    for row in rows:
        cells = [c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        out.write("  ".join(cells).rstrip() + "\n")


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
