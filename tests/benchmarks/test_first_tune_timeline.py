"""benchmarks/first_tune_timeline.py: spans per thread, in the order they started."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import first_tune_timeline as timeline


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    monkeypatch.setattr(timeline, "SPANS", found)
    return found


def test_a_wrapped_call_records_its_span_in_its_own_thread(spans: list[dict[str, Any]]) -> None:
    class Owner:
        @staticmethod
        def work(x: int) -> int:
            return x + 1

    timeline.wrap(Owner, "work", "stage", static=True)
    assert Owner.work(1) == 2
    worker = threading.Thread(target=Owner.work, args=(2,), name="compile-1")
    worker.start()
    worker.join()
    assert [(s["kind"], s["name"], s["thread"]) for s in spans] == [
        ("stage", "work", threading.current_thread().name),
        ("stage", "work", "compile-1"),
    ]
    assert all(0 <= s["start"] <= s["end"] for s in spans)


def test_a_span_is_recorded_when_the_call_raises(spans: list[dict[str, Any]]) -> None:
    def fails() -> None:
        raise ValueError("no")

    with pytest.raises(ValueError):
        timeline.timed(fails, "cc", "_build")()
    assert [s["name"] for s in spans] == ["_build"]


def test_lines_go_by_start() -> None:
    later = {"kind": "job", "name": "_job", "thread": "t1", "start": 2.0, "end": 3.5}
    first = {"kind": "warm", "name": "_triton_key", "thread": "t2", "start": 1.0, "end": 1.5}
    text = timeline.lines([later, first])
    assert text[0].split()[:5] == ["1.000", "1.500", "0.500", "warm", "_triton_key"]
    assert text[1].split()[3:5] == ["job", "_job"]


def test_without_a_gpu_it_says_so(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the benchmark would run")
    script = Path(timeline.__file__)
    proc = subprocess.run(
        [sys.executable, str(script), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert "needs a CUDA GPU" in proc.stderr
