"""benchmarks/budget_replay.py: a budget spent over measured tunes, the order against an oracle."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import budget_replay as replay

from unimatmul.core.problem import Problem


def _row(m: int, n: int, share: float, tune_s: float, speedup: float) -> replay.Row:
    return replay.Row(Problem.from_shape(m, n, 4096, "bf16").key, share, tune_s, speedup)


ROWS = [
    _row(1, 14336, 0.4, 0.2, 1.0),  # the largest share, no gain
    _row(1, 1024, 0.1, 0.2, 1.5),  # a small share, a large gain
    _row(2, 1024, 0.1, 0.2, 1.4),
    _row(8192, 14336, 0.4, 3.0, 1.01),  # a long tuning for a little
]


def test_kept_is_the_share_of_the_free_tunes_gain() -> None:
    everything = {r.problem for r in ROWS}
    assert replay.kept(ROWS, everything) == pytest.approx(1.0)
    assert replay.kept(ROWS, set()) == pytest.approx(0.0)
    free = replay.model_speedup(ROWS, everything)
    one = replay.model_speedup(ROWS, {ROWS[1].problem})
    assert replay.kept(ROWS, {ROWS[1].problem}) == pytest.approx((one - 1) / (free - 1))


def test_the_oracle_takes_the_most_gain_a_second_and_pays_the_first_problems_start() -> None:
    # 1 s of start-up, 2 s budget: the first problem takes the free run's first (0.5 s)
    tuned = replay.replay_oracle(ROWS, budget=2.0, before=1.0, first_s=0.5)
    assert tuned == {ROWS[1].problem, ROWS[2].problem}
    assert replay.replay_oracle(ROWS, budget=1.2, before=1.0, first_s=0.5) == set()


def test_the_order_is_the_products_plan_with_the_measured_times() -> None:
    """The replay runs TunePlan itself: within a budget that fits three quick problems
    after a slow first one, it tunes the quick ones and never the long prefill one; and a
    problem that would end past the budget is not counted."""
    tuned = replay.replay_order(ROWS, budget=2.0, before=0.5, first_s=0.5)
    assert ROWS[3].problem not in tuned
    assert len(tuned) == 3
    assert replay.replay_order(ROWS, budget=0.9, before=0.5, first_s=0.5) == set()


def test_the_command_writes_its_table_from_recorded_runs(tmp_path: Path) -> None:
    records = [
        {"problem": r.problem, "share": r.share, "tune_s": r.tune_s, "speedup": r.speedup} for r in ROWS
    ]
    run = {"device": "cuda", "budgeted": {"before_tuning_s": 1.0}, "free": {"records": records}}
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": [run, run]}))
    out = tmp_path / "out"
    assert replay.main([str(path), "--budgets", "2,10", "--out", str(out)]) == 0
    result = json.loads((out / "budget-replay.json").read_text())
    assert [b["budget_s"] for b in result["budgets"]] == [2.0, 10.0]
    assert result["budgets"][1]["order_kept"] == [pytest.approx(1.0)] * 2
    assert "| 10 | 100% (100%-100%) | 100% (100%-100%) |" in (out / "budget-replay.md").read_text()


def test_runs_are_selected_by_their_recorded_code(tmp_path: Path) -> None:
    def run(code: str) -> dict[str, object]:
        records = [
            {"problem": r.problem, "share": r.share, "tune_s": r.tune_s, "speedup": r.speedup} for r in ROWS
        ]
        return {"code": code, "free": {"records": records}, "budgeted": {"before_tuning_s": 2.0}}

    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": [run("plain start-up"), run("bytecode kept")]}))
    assert len(replay.free_runs(path)) == 2
    assert len(replay.free_runs(path, "bytecode")) == 1
    assert replay.free_runs(path, "nothing like it") == []
