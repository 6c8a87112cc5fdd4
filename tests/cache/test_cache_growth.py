"""A cache file grown by real tuning stays readable: nothing lost to its own reader's limits.

Records made by real tune mode differ in their measurements (load, noise, speedups):
those are the row's values, so the tables grow with the kinds of records, never with
their number (docs/cache-format.md, "A row"). Tiny numpy problems and a small harness
budget keep a tuning at a few milliseconds on a 2-core machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fuzz_cases import fast_folder

from unimatmul.cache.codec import BadEntry, iter_records
from unimatmul.cache.file_store import MsgpackFileStore, read_file
from unimatmul.core.problem import Problem

# Tunes problems start..start+count-1 (see problem_shape) in real tune mode into one file.
TUNER = r"""
import sys, warnings
import numpy as np
import unimatmul
from unimatmul.cache.file_store import MsgpackFileStore
from unimatmul.tuning.harness import HarnessConfig
from unimatmul.tuning.selector import Selector, set_selector

warnings.simplefilter("ignore")  # low-confidence tunings on a busy machine say so
path, start, count, autoflush = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
fast = HarnessConfig(
    warmup=1, min_samples=2, max_samples=3, budget_s=0.0, settle_s=0.0, max_sets=1,
    confirm_pairs=2, confirm_rounds=1,
)
selector = Selector(store=MsgpackFileStore(path, autoflush=autoflush), settings=fast)
set_selector(selector)
with unimatmul.mode("tune"):
    for j in range(start, start + count):
        m, k, n, b = 1 + j % 16, 1 + (j // 16) % 16, 1 + (j // 256) % 16, 1 + j // 4096
        shape_a, shape_b = ((b, m, k), (b, k, n)) if b > 1 else ((m, k), (k, n))
        a = np.arange(np.prod(shape_a), dtype=np.float32).reshape(shape_a) % 7 - 3
        w = np.arange(np.prod(shape_b), dtype=np.float32).reshape(shape_b) % 5 - 2
        out = unimatmul.matmul(a, w)
        want = a.astype(np.float64) @ w
        assert np.allclose(out, want, rtol=1e-5, atol=1e-5), (m, n, k, b)
selector.store.flush(strict=True)
print("tuned", selector.stats.tuned, flush=True)
"""


def problem_key(j: int) -> str:
    """The key of the TUNER's problem j (m, k, n in 1..16, then a batch count)."""
    m, k, n, b = 1 + j % 16, 1 + (j // 16) % 16, 1 + (j // 256) % 16, 1 + j // 4096
    return Problem.from_shape(m, n, k, "f32", batch=b).key


def _tuner(path: Path, start: int, count: int, autoflush: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    return subprocess.Popen(
        [sys.executable, "-c", TUNER, str(path), str(start), str(count), str(autoflush)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen[str], timeout: float) -> str:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()  # never left writing a file the test removes
        proc.communicate()
        raise
    assert proc.returncode == 0, err[-3000:]
    return out


def _all_readable(path: Path) -> dict[str, int]:
    snapshot = read_file(path)
    assert not snapshot.damage and not snapshot.unread and not snapshot.bad
    keys: dict[str, int] = {}
    for _, key, record in iter_records(snapshot):
        assert not isinstance(record, BadEntry), record
        assert record.problem == key and record.winner
        keys[key] = keys.get(key, 0) + 1
    # What grows with the entries is in the rows: the interned maps are their kinds.
    for ns in snapshot.namespaces.values():
        assert len(ns.tables.maps) < 200, len(ns.tables.maps)
    return keys


@pytest.mark.slow
def test_eight_processes_tuning_500_problems_each_keep_all_4000(tmp_path: Path) -> None:
    folder = Path(fast_folder() or tmp_path)
    path = folder / f"growth-{os.getpid()}.msgpack"
    try:
        # Every tuning is put through the real put path (autoflush=1): a locked
        # read-merge-write each, 4,000 of them, overlapping.
        tuners = [_tuner(path, w * 500, 500, 1) for w in range(8)]
        for proc in tuners:
            assert "tuned 500" in _finish(proc, 900)
        keys = _all_readable(path)
        assert set(keys) == {problem_key(j) for j in range(4000)}
        assert len(keys) == 4000
    finally:
        for leftover in folder.glob(f"{path.name}*"):
            leftover.unlink()


@pytest.mark.slow
def test_twenty_thousand_problems_tuned_in_one_process_all_read_back(tmp_path: Path) -> None:
    folder = Path(fast_folder() or tmp_path)
    path = folder / f"growth20k-{os.getpid()}.msgpack"
    try:
        # Written every 1,000 tunings: one process rewriting a growing file after each of
        # 20,000 tunings would measure the disk, not the format.
        assert "tuned 20000" in _finish(_tuner(path, 0, 20_000, 1000), 2400)
        started, cpu = time.perf_counter(), time.process_time()
        store = MsgpackFileStore(path, read_only=True)
        count = store.count()
        load_ms = (time.perf_counter() - started) * 1e3
        cpu_ms = (time.process_time() - cpu) * 1e3
        # The figure (not asserted: machines differ): docs/cache-format.md, "Size and load time".
        print(
            f"20,000 tuned entries: {path.stat().st_size} bytes, loaded in {load_ms:.0f} ms ({cpu_ms:.0f} ms CPU)"
        )
        assert count == 20_000
        keys = _all_readable(path)
        assert set(keys) == {problem_key(j) for j in range(20_000)}
    finally:
        for leftover in folder.glob(f"{path.name}*"):
            leftover.unlink()
