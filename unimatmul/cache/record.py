"""The TuningRecord: a winner, every candidate's time, and the conditions of the run."""

from __future__ import annotations

import functools
import math
import socket
from dataclasses import asdict, dataclass, field, replace
from typing import Any

# Statuses of one candidate in one tuning run.
OK = "ok"
REJECTED = "rejected"  # ran, but the numeric check failed: never chosen
FAILED = "failed"  # raised while preparing or running
PRUNED = "pruned"  # measured briefly, a clear loser, not measured further
ABANDONED = "abandoned"  # over its time limit: left running, never chosen

Scalar = str | int | float | bool | None

# Settings come from files too: nesting is bounded so that a crafted record cannot
# make the code that walks it recurse without end.
_MAX_SETTINGS_DEPTH = 4


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
    def from_dict(cls, data: Any) -> CandidateResult:
        if not isinstance(data, dict):
            msg = f"a candidate result must be a map, got {type(data).__name__}"
            raise TypeError(msg)
        return cls(
            identity=_str(data["identity"]),
            status=_str(data["status"]),
            median_s=_opt_float(data.get("median_s")),
            samples=_int(data.get("samples", 0)),
            error=_opt_float(data.get("error")),
            note=_str(data.get("note", "")),
        )


@dataclass
class TuningRecord:
    """What one tuning of one Problem on one Platform found.

    ``device_state`` holds what could be read about the device while it was tuned
    (clock in MHz, temperature in degrees C, ...; see :mod:`unimatmul.tuning.conditions`),
    so that a surprising record can be explained later. It may be empty.
    """

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
    device_state: dict[str, Scalar] = field(default_factory=dict)

    @property
    def speedup(self) -> float:
        """Default time over the winner's time (1.0 when Default won or is unknown)."""
        if not self.default_s or not self.winner_s or not math.isfinite(self.default_s):
            return 1.0
        return self.default_s / self.winner_s

    def result(self, identity: str) -> CandidateResult | None:
        """The result of one candidate, or None if it was not measured."""
        return next((r for r in self.results if r.identity == identity), None)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["results"] = [r.to_dict() for r in self.results]
        return data

    @classmethod
    def from_dict(cls, data: Any) -> TuningRecord:
        """Rebuild a record, checking types strictly (the data may come from a file)."""
        if not isinstance(data, dict):
            msg = f"a tuning record must be a map, got {type(data).__name__}"
            raise TypeError(msg)
        results = data.get("results", [])
        versions = data.get("versions", {})
        settings = data.get("settings", {})
        device_state = data.get("device_state", {})
        if not isinstance(results, list) or not isinstance(versions, dict):
            msg = "a tuning record's results must be a list and its versions a map"
            raise TypeError(msg)
        winner_s = _opt_float(data["winner_s"])
        return cls(
            problem=_str(data["problem"]),
            winner=_str(data["winner"]),
            winner_s=winner_s if winner_s is not None else math.inf,
            default_s=_opt_float(data.get("default_s")),
            results=[CandidateResult.from_dict(r) for r in results],
            versions={_str(k): _str(v) for k, v in versions.items()},
            tuned_at=_float(data.get("tuned_at", 0.0)),
            tune_s=_float(data.get("tune_s", 0.0)),
            settings=check_settings(settings),
            writer=_str(data.get("writer", "")),
            device_state=check_device_state(device_state),
        )


# --- provenance: where an entry's choice was checked (docs/trust.md) -------------------------

#: The settings key of an entry's provenance: ``{"checked": [host, ...], "origin": str}``.
TRUST = "trust"
#: Hosts kept in one entry's ``checked`` list (a cache file shared by a few machines).
MAX_CHECKED_HOSTS = 8


@functools.cache
def local_host() -> str:
    """This machine's name, as entries record the hosts that checked them."""
    return socket.gethostname() or "unknown"


def checked_hosts(record: TuningRecord) -> list[str]:
    """The hosts on which ``record``'s choice passed a numeric check (empty: none known)."""
    found = record.settings.get(TRUST)
    hosts = found.get("checked") if isinstance(found, dict) else None
    if not isinstance(hosts, list):
        return []
    return [h for h in hosts if isinstance(h, str)]


def checked_here(record: TuningRecord) -> bool:
    """Whether this machine checked ``record``'s choice (an entry without the mark was not)."""
    return local_host() in checked_hosts(record)


def mark_checked(record: TuningRecord, host: str | None = None) -> TuningRecord:
    """``record`` with ``host`` (default: this machine) among the hosts that checked it."""
    host = host or local_host()
    hosts = [h for h in checked_hosts(record) if h != host][-(MAX_CHECKED_HOSTS - 1) :]
    found = record.settings.get(TRUST)
    mark: dict[str, Any] = dict(found) if isinstance(found, dict) else {}
    mark["checked"] = [*hosts, host]
    return replace(record, settings={**record.settings, TRUST: mark})


def mark_from_elsewhere(record: TuningRecord, origin: str) -> TuningRecord:
    """``record`` as it arrives by ``origin`` (``import:tunableop``, ``merge``): checked
    nowhere yet, so that its first call in every process on every host checks it."""
    return replace(record, settings={**record.settings, TRUST: {"checked": [], "origin": origin}})


def check_settings(value: Any, depth: int = 0) -> dict[str, Any]:
    """``value`` if it is a map of str to scalars, lists and maps (bounded depth)."""
    if not isinstance(value, dict):
        msg = f"settings must be a map, got {type(value).__name__}"
        raise TypeError(msg)
    for key, item in value.items():
        _str(key)
        _check_plain(item, depth + 1)
    return dict(value)


def _check_plain(value: Any, depth: int) -> None:
    if depth > _MAX_SETTINGS_DEPTH:
        msg = f"settings nest deeper than {_MAX_SETTINGS_DEPTH} levels"
        raise TypeError(msg)
    if value is None or isinstance(value, (str, int, float, bool)):
        return
    if isinstance(value, list):
        for item in value:
            _check_plain(item, depth + 1)
        return
    if isinstance(value, dict):
        check_settings(value, depth)
        return
    msg = f"settings hold a {type(value).__name__}; only str, numbers, bool, None, lists and maps"
    raise TypeError(msg)


def check_device_state(value: Any) -> dict[str, Scalar]:
    """``value`` if it is a flat map of str to scalars."""
    if not isinstance(value, dict):
        msg = f"device_state must be a map, got {type(value).__name__}"
        raise TypeError(msg)
    for key, item in value.items():
        _str(key)
        if item is not None and not isinstance(item, (str, int, float, bool)):
            msg = f"device_state[{key!r}] is a {type(item).__name__}; only scalars"
            raise TypeError(msg)
    return dict(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        msg = f"expected a string, got {type(value).__name__}"
        raise TypeError(msg)
    return value


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"expected an integer, got {type(value).__name__}"
        raise TypeError(msg)
    return value


def _float(value: Any) -> float:
    result = _opt_float(value)
    if result is None:
        msg = "expected a number, got None"
        raise TypeError(msg)
    return result


def _opt_float(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"expected a number, got {type(value).__name__}"
        raise TypeError(msg)
    return float(value)
