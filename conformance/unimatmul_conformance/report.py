"""The report: every check's outcome and why, as JSON and as a one-screen summary."""

from __future__ import annotations

import gzip
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

PASSED, FAILED, SKIPPED, XFAILED, XPASSED = "passed", "failed", "skipped", "xfailed", "xpassed"
STATUSES = (PASSED, FAILED, XFAILED, XPASSED, SKIPPED)
FORMAT = "unimatmul-conformance-report"
SCHEMA = 1


@dataclass
class CheckResult:
    """One check's outcome. ``why`` says what was measured, or what went wrong."""

    id: str
    check: str
    status: str
    why: str = ""
    case: str | None = None
    candidate: str | None = None
    duration_s: float = 0.0
    expected: str | None = None  # the expected-failure reason in force, if any

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Report:
    """Everything a run found; ``ok`` when nothing failed unexpectedly."""

    backend: str
    target: dict[str, str]
    mode: str
    versions: dict[str, str] = field(default_factory=dict)
    platform: dict[str, Any] = field(default_factory=dict)
    cases: int = 0
    supported_cases: int = 0
    results: list[CheckResult] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    duration_s: float = 0.0
    suite_version: str = ""

    @property
    def ok(self) -> bool:
        return not any(r.status == FAILED for r in self.results)

    def counts(self) -> dict[str, int]:
        found = Counter(r.status for r in self.results)
        return {status: found.get(status, 0) for status in STATUSES}

    def by_check(self) -> dict[str, dict[str, int]]:
        table: dict[str, Counter[str]] = {}
        for r in self.results:
            table.setdefault(r.check, Counter())[r.status] += 1
        return {name: {s: c.get(s, 0) for s in STATUSES} for name, c in table.items()}

    def failed(self, check: str | None = None) -> list[CheckResult]:
        return [r for r in self.results if r.status == FAILED and (check is None or r.check == check)]

    def result(self, check_id: str) -> CheckResult:
        for r in self.results:
            if r.id == check_id:
                return r
        msg = f"no check {check_id!r} in this report"
        raise KeyError(msg)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "schema": SCHEMA,
            "suite_version": self.suite_version,
            "backend": self.backend,
            "versions": self.versions,
            "target": self.target,
            "platform": self.platform,
            "mode": self.mode,
            "started": self.started,
            "duration_s": self.duration_s,
            "ok": self.ok,
            "counts": self.counts(),
            "by_check": self.by_check(),
            "cases": self.cases,
            "supported_cases": self.supported_cases,
            "checks": [r.to_dict() for r in self.results],
        }

    def write_json(self, path: str | Path) -> None:
        """Write the report; a name ending in ``.gz`` is gzipped (a GPU run's report is megabytes)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = (json.dumps(self.to_dict(), indent=1) + "\n").encode("utf-8")
        if path.suffix == ".gz":
            # mtime=0: the same report gives the same bytes, so a committed file only changes with it.
            path.write_bytes(gzip.compress(data, mtime=0))
        else:
            path.write_bytes(data)

    def summary(self, width: int = 100, max_failures: int = 8) -> str:
        """The one-screen summary: what ran where, a table per check, the first failures."""
        lines = []
        libs = ", ".join(f"{k} {v}" for k, v in self.versions.items()) or "no versions reported"
        lines.append(f"unimatmul conformance: backend {self.backend} ({libs})")
        plat = self.platform
        where = "/".join(str(plat.get(k, "?")) for k in ("vendor", "arch", "device", "cores"))
        lines.append(
            f"target: {self.target.get('arrays') or self.target.get('array', '?')} arrays on {self.target.get('device', '?')} "
            f"[{where}]  matrix: {self.mode}, {self.supported_cases} of {self.cases} problems supported"
        )
        header = f"  {'check':<18}" + "".join(f"{s:>9}" for s in STATUSES)
        lines.append(header)
        for name, counts in self.by_check().items():
            lines.append(f"  {name:<18}" + "".join(f"{counts[s] or '.':>9}" for s in STATUSES))
        failures = self.failed()
        for r in failures[:max_failures]:
            text = f"  FAILED {r.id}: {r.why}"
            lines.append(text if len(text) <= width else text[: width - 3] + "...")
        if len(failures) > max_failures:
            lines.append(f"  ... and {len(failures) - max_failures} more failures (see the JSON report)")
        xpassed = [r for r in self.results if r.status == XPASSED]
        if xpassed:
            lines.append(
                f"  {len(xpassed)} expected failures passed: remove them from the expected-failure file"
            )
        counts = self.counts()
        verdict = "PASSED" if self.ok else "FAILED"
        lines.append(
            f"{verdict}: {counts[PASSED]} passed, {counts[FAILED]} failed, {counts[XFAILED]} expected failures, "
            f"{counts[SKIPPED]} skipped in {self.duration_s:.1f} s"
        )
        return "\n".join(lines) + "\n"
