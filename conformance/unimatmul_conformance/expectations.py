"""Expected failures: per-backend files listing checks known to fail, with reasons.

A file holds one entry per line: a check id pattern (``fnmatch`` style: ``*`` and
``?``; ids hold no whitespace), then whitespace, then the reason, which is required.
``#`` starts a comment line. The suite ships one file per built-in backend in
``unimatmul_conformance/xfail/<backend>.txt``; a plugin author passes their own.

    # oneDNN's bf16 GEMV rounds twice (upstream issue 1234)
    result::gemm:bf16.bf16.bf16:*:m1n*::onednn/gemm:jit:bf16   double rounding in the GEMV path
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path


@dataclass(frozen=True)
class Expectation:
    pattern: str
    reason: str
    source: str  # file:line, so that a stale entry can be found and removed


@dataclass
class Expectations:
    """The expected failures in force for one run."""

    entries: list[Expectation] = field(default_factory=list)

    def match(self, check_id: str) -> Expectation | None:
        for entry in self.entries:
            if fnmatch.fnmatchcase(check_id, entry.pattern):
                return entry
        return None

    def extend(self, other: Expectations) -> None:
        self.entries.extend(other.entries)

    @classmethod
    def parse(cls, text: str, source: str) -> Expectations:
        entries = []
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            pattern, *rest = line.split(None, 1)
            reason = rest[0].strip() if rest else ""
            if not reason:
                msg = f"{source}:{number}: expected failure {pattern!r} has no reason; write one after the id"
                raise ValueError(msg)
            entries.append(Expectation(pattern, reason, f"{source}:{number}"))
        return cls(entries)

    @classmethod
    def from_file(cls, path: str | Path) -> Expectations:
        path = Path(path)
        return cls.parse(path.read_text(encoding="utf-8"), path.name)

    @classmethod
    def builtin(cls, backend: str) -> Expectations:
        """The file shipped with the suite for ``backend`` (empty when there is none)."""
        resource = resources.files("unimatmul_conformance").joinpath("xfail", f"{backend}.txt")
        if not resource.is_file():
            return cls()
        return cls.parse(resource.read_text(encoding="utf-8"), f"xfail/{backend}.txt")
