"""benchmarks/hf_models.py counts CUDA graph re-recordings of compiled rows and says so; a row
takes rounds until its ratio is resolved, within its limits."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import hf_models


def test_rerecordings_are_counted_without_being_printed(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger(hf_models.Rerecords.LOGGER)
    level, propagate = logger.level, logger.propagate
    counter = hf_models.Rerecords.watch()
    try:
        with caplog.at_level(logging.DEBUG):
            # What the trees write (torch 2.11 and 2.13 word it so).
            logger.debug(
                "Re-recording function=%s, reason=%s", "partition_0", "static input data pointer changed"
            )
            logger.debug("[%s] Re-recording function=%s, mode=%s, reason=%s", "0/1", "f", "INFERENCE", "x")
            logger.debug("Recording function %d of graph recording id %d", 0, 1)
        assert counter.count == 2
        assert not [r for r in caplog.records if r.name == hf_models.Rerecords.LOGGER]
    finally:
        logger.removeHandler(counter)
        logger.setLevel(level)
        logger.propagate = propagate


def test_the_report_names_rows_whose_graphs_were_recorded_again() -> None:
    row = {
        "id": "gpt2/generate/b1/compiled",
        "problems": [],
        "check": {"same_tokens": 1.0},
        "round_ratios": [0.9, 0.95],
        "tokens_per_call": 64,
        "off": {"tokens_per_s": 465.0, "samples": [0.1, 0.11], "rounds": 2},
        "routed": {"tokens_per_s": 419.0, "samples": [0.11, 0.12], "rounds": 2},
        "ratio": 0.9,
        "ratio_interval_95": [0.88, 0.97],
        "graph_rerecords": {"off": 441, "routed": 630},
    }
    calm = {**row, "id": "qwen2-1.5b/generate/b1/compiled", "graph_rerecords": {"off": 0, "routed": 0}}
    lines = hf_models.summary_table({"rows": [row, calm], "not_run": []})
    assert "- `gpt2/generate/b1/compiled`: off 441, routed 630 re-recordings" in lines
    assert "| 0.880-0.970 |" in lines[2]  # the 95 % interval of the median round ratio
    assert not [x for x in lines if x.startswith("- `qwen2")]


def _samplers(off: list[float], routed: list[float]) -> tuple[dict[str, object], list[int]]:
    """Samplers that hand out the given seconds in turn (the rounds' own numbers)."""
    taken = [0]

    def take(values: list[float]) -> object:
        def sample() -> float:
            taken[0] += 1
            return values[(taken[0] - 1) // 2 % len(values)]

        return sample

    return {"off": take(off), "routed": take(routed)}, taken


def test_a_row_takes_rounds_until_its_ratio_is_resolved() -> None:
    from torch_models import rounds

    # Off 1.05x routed's time, every round alike: resolved once there are rounds enough
    # for an interval at all (the order statistics need 6 at 97.5 % a side).
    variants, taken = _samplers([1.05], [1.0])
    done = rounds(variants, 3, more=hf_models.unresolved(0.02), most=50)  # type: ignore[arg-type]
    assert done["off"]["rounds"] == 6 and taken[0] == 12
    assert hf_models.ratio_interval([1.05] * 5) is None
    assert hf_models.ratio_interval([1.05] * 6) == pytest.approx((1.05, 1.05))


def test_a_row_whose_ratio_stays_scattered_stops_at_its_most_rounds() -> None:
    from torch_models import rounds

    variants, _ = _samplers([1.0, 1.5, 0.7, 1.2, 0.9], [1.0])
    done = rounds(variants, 3, more=hf_models.unresolved(0.02), most=12)  # type: ignore[arg-type]
    assert done["off"]["rounds"] == 12
    # Without ``more`` the rounds asked for, no more.
    variants, _ = _samplers([1.0, 1.5], [1.0])
    assert rounds(variants, 3)["off"]["rounds"] == 3  # type: ignore[arg-type]
