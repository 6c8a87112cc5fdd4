"""benchmarks/tune_retire.py: retirement on against off, the claimed speedup and agreement."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import tune_retire


def test_the_model_speedup_weights_each_problem_by_its_share() -> None:
    rows = [
        {"problem": "p1", "share": 0.75, "default_s": 2.0, "winner_s": 1.0},  # 2x on three quarters
        {"problem": "p2", "share": 0.25, "default_s": 1.0, "winner_s": 1.0},
        {"problem": "p3", "share": 0.0, "default_s": None, "winner_s": 1.0},  # Default failed: counts as 1x
    ]
    assert tune_retire.claimed_speedup(rows) == pytest.approx(1.0 / (0.75 / 2 + 0.25))


def test_agreement_is_over_the_problems_both_runs_tuned() -> None:
    a = {"p1": "x", "p2": "y", "p3": "z"}
    b = {"p1": "x", "p2": "w"}
    assert tune_retire.agreement(a, b) == pytest.approx(0.5)
    assert tune_retire.agreement(a, {}) == 0.0


def test_rounds_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        tune_retire.main(["--rounds", "0", "--out", str(tmp_path)])
