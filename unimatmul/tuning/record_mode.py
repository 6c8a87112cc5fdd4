"""Record mode: remember every distinct problem a workload meets, to tune it later.

With ``UNIMATMUL_MODE=record`` the Selector behaves like ``cached`` and hands each
problem it resolves to :func:`record_problem`, which appends it to the record file
(``UNIMATMUL_RECORD_FILE``, default ``recorded.jsonl`` beside the cache file) once;
under ``UNIMATMUL_CACHE_READONLY`` only a file named by ``UNIMATMUL_RECORD_FILE``.
``unimatmul tune --from FILE`` then tunes them, and the workload runs with ``cached``.

The file is JSON Lines, one problem per line::

    {"problem": "gemm:f32.f32.f32:f32:NT:m8n64k32b1:...", "array": "torch", "device": "cpu"}

Several processes may record into one file at once: each append happens under an
exclusive advisory lock, after reading what the others appended since, so a problem
is written once, and a line is written by a single ``write`` (never interleaved). A
line that cannot be parsed (a crash mid-write) is skipped by readers. Problems only
reach this module on the Selector's slow path, never on a cached call.

PyTorch TunableOp's untuned file (``PYTORCH_TUNABLEOP_RECORD_UNTUNED=1``) is read by
:mod:`unimatmul.interop.tunableop_cache`; ``unimatmul tune --from`` takes either.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from unimatmul import settings
from unimatmul.cache.protocol import default_cache_folder, default_cache_path
from unimatmul.core import notices
from unimatmul.core.problem import Problem
from unimatmul.core.text_input import text_lines

if TYPE_CHECKING:
    from unimatmul.core._backend import Target

ENV = settings.RECORD_FILE.name
FILENAME = "recorded.jsonl"

try:  # POSIX advisory locks; elsewhere appends are still single writes
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


def default_record_path() -> Path:
    """``$UNIMATMUL_RECORD_FILE``, else ``recorded.jsonl`` in the cache file's folder."""
    explicit = settings.RECORD_FILE.get()
    if explicit:
        return Path(explicit).expanduser()
    if settings.CACHE.get() == ":memory:":
        return default_cache_folder() / FILENAME
    return default_cache_path().parent / FILENAME


@dataclass(frozen=True)
class RecordedProblem:
    """One problem met by a workload, and where: array library and device (``cuda:0``).

    ``device`` is None when the source did not say (TunableOp's untuned file); ``calls``
    is how often it was called, where the line says (``"calls"``), else None.
    """

    problem: Problem
    array: str = "torch"
    device: str | None = "cpu"
    calls: int | None = None

    def to_line(self) -> str:
        data = {"problem": self.problem.key, "array": self.array, "device": self.device}
        return json.dumps(data, separators=(",", ":")) + "\n"


class ProblemRecorder:
    """Appends each distinct (problem, array, device) once to one file."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_record_path()
        self._seen: set[str] = set()
        self._offset = 0  # how far this process has read the file
        self._lock = threading.Lock()

    def __call__(self, problem: Problem, target: Target) -> None:
        """The Selector's ``on_problem`` hook."""
        self.record(RecordedProblem(problem, target.array_kind, str(target.device)))

    def record(self, item: RecordedProblem) -> bool:
        """Append ``item`` unless the file already holds it; True when written."""
        line = item.to_line()
        if line in self._seen:
            return False
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            with os.fdopen(fd, "r+b", buffering=0) as fh, _exclusive(fh):
                # Learn what other processes appended since we last looked.
                fh.seek(self._offset)
                tail = fh.read()
                for raw in tail.splitlines():
                    self._seen.add(raw.decode("utf-8", "replace") + "\n")
                self._offset += len(tail)
                if line in self._seen:
                    return False
                data = line.encode()
                if tail and not tail.endswith(b"\n"):
                    data = b"\n" + data  # a writer crashed mid-line: do not glue onto it
                fh.write(data)
                fh.flush()
                self._offset += len(data)
                self._seen.add(line)
                return True


@contextlib.contextmanager
def _exclusive(fh: io.FileIO) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


class _ProcessRecorder:
    """The process-wide recorder (None until first use) and its lock."""

    def __init__(self) -> None:
        self.recorder: ProblemRecorder | None = None
        self.lock = threading.Lock()


_process = _ProcessRecorder()


def get_recorder() -> ProblemRecorder:
    """The process-wide recorder, following ``UNIMATMUL_RECORD_FILE`` if it changes."""
    path = default_record_path()
    with _process.lock:
        if _process.recorder is None or _process.recorder.path != path:
            _process.recorder = ProblemRecorder(path)
        return _process.recorder


def record_problem(problem: Problem, target: Target) -> None:
    """The Selector's default ``on_problem`` hook in record mode. Under
    ``UNIMATMUL_CACHE_READONLY`` nothing is written beside the cache (a record file named
    by ``UNIMATMUL_RECORD_FILE`` still is: it was asked for)."""
    if settings.CACHE_READONLY.get() and not settings.RECORD_FILE.get():
        notices.warn_once(
            ("record", "read-only"),
            f"unimatmul record mode: UNIMATMUL_CACHE_READONLY is set, so no {FILENAME} is written "
            f"beside the cache (set {ENV} to record into a file of your choice)",
        )
        return
    get_recorder()(problem, target)


# --- reading --------------------------------------------------------------------------


@dataclass
class ReadResult:
    """The problems of a file, in file order, and the lines left out (why)."""

    problems: list[RecordedProblem]
    skipped: list[tuple[int, str]]
    format: str

    def distinct(self) -> ReadResult:
        """The same, each (problem, array, device) once."""
        unique: dict[tuple[str, str, str | None], RecordedProblem] = {}
        for item in self.problems:
            unique.setdefault((item.problem.key, item.array, item.device), item)
        return ReadResult(list(unique.values()), self.skipped, self.format)


def read_problems(path: str | os.PathLike[str]) -> ReadResult:
    """The distinct problems of a record file (a regular file within the size limit, read
    line by line: :func:`unimatmul.core.text_input.text_lines`)."""
    return parse_record_lines(text_lines(path, "a record file")).distinct()


def parse_record_lines(text: str | Iterable[str]) -> ReadResult:
    """Every problem of a record file's text (or its lines); a line that cannot be read is
    skipped (why)."""
    problems: list[RecordedProblem] = []
    skipped: list[tuple[int, str]] = []
    lines = text.splitlines() if isinstance(text, str) else text
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            device = data.get("device")
            calls = data.get("calls")
            problems.append(
                RecordedProblem(
                    Problem.from_key(str(data["problem"])),
                    str(data.get("array", "torch")),
                    None if device is None else str(device),
                    calls if isinstance(calls, int) and not isinstance(calls, bool) and calls > 0 else None,
                )
            )
        except (ValueError, TypeError, KeyError) as exc:
            skipped.append((line_no, f"{type(exc).__name__}: {exc}"))
    return ReadResult(problems, skipped, "unimatmul-record")
