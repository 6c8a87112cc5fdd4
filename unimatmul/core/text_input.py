"""Reading a text input file (a TunableOp CSV, a record file): a regular file only, within
a size limit, line by line.

A path may name anything: ``/dev/zero`` never ends, a FIFO blocks until a writer comes,
and a huge file would be held whole. The file is opened without blocking and refused
unless it is a regular file, refused when its size is over the limit, and read one line
at a time, counting the bytes, so that a file that grows while it is read is refused
too (docs/cache-format.md, "Input files").
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

MAX_INPUT_BYTES = 16 << 20  # a TunableOp file of a large model: a few thousand rows (< 1 MB)


MAX_LINE_BYTES = 1 << 20


def not_regular_kind(mode: int) -> str:
    """What a file of this mode is, in words (for something that is not a regular file)."""
    return {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO"}.get(stat.S_IFMT(mode), "a device")


class InputFileError(ValueError):
    """A file given as input that is not one (not a regular file, or too large)."""


def text_lines(path: str | os.PathLike[str], what: str, *, limit: int | None = None) -> Iterator[str]:
    """The lines of the regular file at ``path`` (without line ends), read as they are used.

    InputFileError (checked here, before the first line) when it is not a regular file or
    is larger than ``limit`` bytes (default :data:`MAX_INPUT_BYTES`); OSError when it
    cannot be opened; UnicodeDecodeError for a line that is not UTF-8.
    """
    limit = MAX_INPUT_BYTES if limit is None else limit
    flags = (
        os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    )
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            msg = f"{path}: {not_regular_kind(st.st_mode)}, not a regular file ({what} is read from regular files only)"
            raise InputFileError(msg)
        if st.st_size > limit:
            msg = f"{path}: {st.st_size} bytes, over the {limit} byte limit of {what}"
            raise InputFileError(msg)
    except BaseException:
        os.close(fd)
        raise
    return _lines(os.fdopen(fd, "rb"), Path(path), what, limit)


def _lines(fh: BinaryIO, path: Path, what: str, limit: int) -> Iterator[str]:
    with fh:
        total = 0
        while True:
            raw: bytes = fh.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            total += len(raw)
            if total > limit:
                msg = f"{path}: it grew past the {limit} byte limit of {what} while it was read"
                raise InputFileError(msg)
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                msg = f"{path}: a line longer than {MAX_LINE_BYTES} bytes (not {what})"
                raise InputFileError(msg)
            yield raw.decode("utf-8").rstrip("\n").rstrip("\r")
