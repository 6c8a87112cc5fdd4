"""benchmarks/window_cost.py: a run's window costs, from the medians its windows stored."""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from unimatmul.cache.file_store import MsgpackFileStore
from unimatmul.cache.record import TuningRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import window_cost


def _verdict(verdict: str, kernel_s: float, default_s: float) -> dict[str, object]:
    return {"verdict": verdict, "kernel": "x/k", "kernel_s": kernel_s, "default_s": default_s, "calls": 16}


def test_costs_come_from_the_stored_in_situ_medians(tmp_path: Path) -> None:
    store = MsgpackFileStore(tmp_path / "cache.msgpack")
    settings = {
        "lost": _verdict("reverted", 45e-6, 32e-6),  # the choice lost in situ: 17 calls x 13 us
        "kept": _verdict("confirmed", 25e-6, 34e-6),  # kept: its window's 17 Default calls x 9 us
        "unjudged": {"verdict": "unjudged", "kernel": "x/k", "calls": 0},
    }
    for key, confirm in settings.items():
        store.put("ns", key, TuningRecord(key, "x/k", 1e-6, 2e-6, settings={"confirm": confirm}))
    store.put("ns", "plain", TuningRecord("plain", "x/k", 1e-6, 2e-6))
    store.flush(strict=True)
    problems = [{"problem": k, "shape": "1x2x3"} for k in (*settings, "plain", "absent")]
    row = {"id": "m/generate/b1/eager", "problems": problems, "routed": {"median_s": 0.5}}
    (tmp_path / "results.json").write_text(json.dumps({"rows": [row, {"id": "failed"}]}))
    text = io.StringIO()
    with redirect_stdout(text):
        assert window_cost.main([str(tmp_path), "--md", str(tmp_path / "cost.md")]) == 0
    (line,) = [x for x in text.getvalue().splitlines() if x.startswith("| m/generate")]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1:] == ["500.0 ms", "2", "0.221 ms (0.04 %)", "0.153 ms (0.03 %)"]
    assert (tmp_path / "cost.md").read_text() == text.getvalue()


def test_a_missing_run_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert window_cost.main([str(tmp_path)]) == 2
    assert "window_cost: error:" in capsys.readouterr().err
