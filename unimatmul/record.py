"""The TuningRecord: a winner, every candidate's time, and the conditions of the run."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

# Statuses of one candidate in one tuning run.
OK = "ok"
REJECTED = "rejected"  # ran, but the numeric check failed: never chosen
FAILED = "failed"  # raised while preparing or running
PRUNED = "pruned"  # measured briefly, a clear loser, not measured further


@dataclass
class CandidateResult:
    identity: str
    status: str
    median_s: float | None = None
    samples: int = 0
    error: float | None = None
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CandidateResult:
        return cls(
            identity=str(data["identity"]),
            status=str(data["status"]),
            median_s=_opt_float(data.get("median_s")),
            samples=int(data.get("samples", 0)),
            error=_opt_float(data.get("error")),
            note=str(data.get("note", "")),
        )


@dataclass
class TuningRecord:
    """What one tuning of one Problem on one Platform found."""

    problem: str
    winner: str
    winner_s: float
    default_s: float | None
    results: list[CandidateResult] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    tuned_at: float = 0.0
    tune_s: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)
    writer: str = ""

    @property
    def speedup(self) -> float:
        """Default time over the winner's time (1.0 when Default won or is unknown)."""
        if not self.default_s or not self.winner_s or not math.isfinite(self.default_s):
            return 1.0
        return self.default_s / self.winner_s

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["results"] = [r.to_dict() for r in self.results]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuningRecord:
        """Rebuild a record, checking types strictly (the data may come from a file)."""
        if not isinstance(data, dict):
            msg = f"a tuning record must be a map, got {type(data).__name__}"
            raise TypeError(msg)
        results = data.get("results", [])
        versions = data.get("versions", {})
        settings = data.get("settings", {})
        if not isinstance(results, list) or not isinstance(versions, dict) or not isinstance(settings, dict):
            msg = "a tuning record's results/versions/settings have the wrong types"
            raise TypeError(msg)
        winner_s = _opt_float(data["winner_s"])
        return cls(
            problem=_str(data["problem"]),
            winner=_str(data["winner"]),
            winner_s=winner_s if winner_s is not None else math.inf,
            default_s=_opt_float(data.get("default_s")),
            results=[CandidateResult.from_dict(r) for r in results],
            versions={_str(k): _str(v) for k, v in versions.items()},
            tuned_at=float(data.get("tuned_at", 0.0)),
            tune_s=float(data.get("tune_s", 0.0)),
            settings=dict(settings),
            writer=str(data.get("writer", "")),
        )


def _str(value: Any) -> str:
    if not isinstance(value, str):
        msg = f"expected a string, got {type(value).__name__}"
        raise TypeError(msg)
    return value


def _opt_float(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"expected a number, got {type(value).__name__}"
        raise TypeError(msg)
    return float(value)
