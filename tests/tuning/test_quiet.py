"""The CPU harness's settling pause: it lasts while another thread of the process runs."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from unimatmul.tuning import quiet

READABLE = os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat")
needs_schedstat = pytest.mark.skipif(
    not READABLE, reason="no per-thread CPU times (/proc/self/task/*/schedstat)"
)


def scripted(monkeypatch: pytest.MonkeyPatch, busy_windows: int | None) -> list[int]:
    """Readings of one other thread that runs all through ``busy_windows`` windows (None:
    for ever), then not at all; returns the list the readings are counted in."""
    readings: list[int] = []
    total = [0]

    def cpu_ns(skip: int) -> dict[str, int]:
        if readings and (busy_windows is None or len(readings) <= busy_windows):
            total[0] += 10**9  # a whole second of CPU: far over any window
        readings.append(total[0])
        return {"1": total[0]}

    monkeypatch.setattr(quiet, "_cpu_ns", cpu_ns)
    return readings


def test_the_pause_lasts_while_another_thread_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = scripted(monkeypatch, busy_windows=3)
    waited = quiet.wait_quiet(5.0, window_s=0.001)
    assert len(readings) == 1 + 4  # the first reading, three busy windows and the quiet one
    assert waited < 5.0


def test_the_pause_ends_at_its_longest(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted(monkeypatch, busy_windows=None)
    waited = quiet.wait_quiet(0.03, window_s=0.005)
    assert 0.03 <= waited < 0.5


def test_without_per_thread_times_the_pause_is_its_longest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quiet, "_TASKS", "/nonexistent/task")
    waited = quiet.wait_quiet(0.02)
    assert waited >= 0.02


def test_no_pause_asked_is_none() -> None:
    assert quiet.wait_quiet(0.0) == 0.0


@needs_schedstat
def test_a_quiet_process_waits_one_window() -> None:
    waited = quiet.wait_quiet(1.0)
    assert waited < 0.5


@pytest.fixture
def spinner() -> Iterator[threading.Thread]:
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join()


@needs_schedstat
def test_the_cpu_time_of_a_spinning_thread_is_seen(spinner: threading.Thread) -> None:
    me = threading.get_native_id()
    before = quiet._cpu_ns(me)
    time.sleep(0.05)
    after = quiet._cpu_ns(me)
    assert before is not None and after is not None
    tid = str(spinner.native_id)
    assert str(me) not in after  # the caller's own time is not counted
    assert after[tid] - before[tid] > 5_000_000  # > 5 ms of its 50 ms
