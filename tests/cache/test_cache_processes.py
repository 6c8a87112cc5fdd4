"""The cache file carries answers across processes: one tunes, the next one only reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# The child computes, checks against float64 and reports what its selector did.
CHILD = r"""
import json, sys
import numpy as np
import unimatmul
from unimatmul.tuning.harness import HarnessConfig
from unimatmul.tuning.selector import Selector, get_selector, set_selector
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.backend import Target
from unimatmul.core.problem import Problem

set_selector(Selector(settings=HarnessConfig(warmup=1, min_samples=3, budget_s=0.01, settle_s=0.0, max_sets=2)))
batch, m, n, k = (int(x) for x in sys.argv[1:5])
rng = np.random.default_rng(7)
a = rng.standard_normal((batch, m, k)).astype(np.float32)
b = rng.standard_normal((batch, k, n)).astype(np.float32)
out = unimatmul.matmul(a, b)
error = float(np.linalg.norm(out - a.astype(np.float64) @ b) / np.linalg.norm(a.astype(np.float64) @ b))
selector = get_selector()
target = Target(adapter_for_kind("numpy"), CPU)
problem, _ = Problem.from_operands(target.adapter, a, b)
record = selector.store.get(selector.platform(target).namespace, problem.key)
stats = selector.stats
json.dump({
    "mode": unimatmul.get_mode(),
    "tuned": stats.tuned,
    "cache_hits": stats.cache_hits,
    "lookups": stats.lookups,
    "fallbacks": stats.fallbacks,
    "error": error,
    "winner": None if record is None else record.winner,
    "tuned_at": None if record is None else record.tuned_at,
    "entries": selector.store.count(),
}, sys.stdout)
"""


def _child(cache: Path, mode: str, shape: str = "3x40x24x56", **extra_env: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    env.update(UNIMATMUL_CACHE=str(cache), UNIMATMUL_MODE=mode, **extra_env)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *shape.split("x")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # A tuning on a busy machine is marked low-confidence, with a warning: this machine's
    # load is not the test's to decide, so that warning is not counted.
    warned = [line for line in done.stderr.splitlines() if "Warning" in line and "low-confidence" not in line]
    # The only warning allowed is the one saying that a read-only cache keeps new results in memory.
    assert all("read-only" in line for line in warned), done.stderr
    if extra_env.get("UNIMATMUL_CACHE_READONLY") != "1":
        assert not warned, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_a_second_process_answers_from_the_file(tmp_path: Path) -> None:
    cache = tmp_path / "shared" / "cache.msgpack"
    first = _child(cache, "tune")
    assert first["mode"] == "tune"
    assert first["tuned"] == 1 and first["cache_hits"] == 0
    assert first["error"] < 1e-5
    assert first["entries"] == 1 and first["winner"]
    assert cache.exists()

    second = _child(cache, "cached")
    assert second["mode"] == "cached"
    assert second["tuned"] == 0  # nothing measured in this process ...
    assert second["cache_hits"] == 1  # ... the answer came from the file
    assert second["fallbacks"] == 0
    assert second["error"] < 1e-5
    assert (second["winner"], second["tuned_at"]) == (first["winner"], first["tuned_at"])

    # UNIMATMUL_CACHE_READONLY: a process may tune a new problem, but never writes the file.
    before = cache.read_bytes()
    third = _child(cache, "tune", "2x16x8x24", UNIMATMUL_CACHE_READONLY="1")
    assert third["tuned"] == 1 and third["error"] < 1e-5
    assert cache.read_bytes() == before


def test_a_missing_file_in_cached_mode_tunes_nothing_and_writes_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "none" / "cache.msgpack"
    result = _child(cache, "cached")
    assert result["tuned"] == 0 and result["cache_hits"] == 0 and result["winner"] is None
    assert result["error"] < 1e-5  # Default answered
    assert not cache.exists()
