"""benchmarks/cache_flush_every.py: both ways write every record; once a second writes less."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import cache_flush_every


def test_both_ways_end_with_every_record_and_the_interval_writes_less(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    argv = [
        "cache_flush_every.py",
        "--entries",
        "40",
        "--puts",
        "6",
        "--rounds",
        "1",
        "--work-ms",
        "1",
        "--out",
        str(out),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    assert cache_flush_every.main() == 0
    data = json.loads((out / "flush-every.json").read_text())
    rows = {row["way"]: row for row in data["rows"]}
    assert rows["every put"]["writes"] == [6]  # the strict flush finds nothing left
    assert rows["at most once a second"]["writes"] == [2]  # the first put, then the flush
    assert "| 40 | every put | 6 |" in (out / "flush-every.md").read_text()
