"""The fleet flow of docs/distributed.md: tune on machines of a kind, merge, pin the
digest, ship the file read-only, and serve from it alone."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from unimatmul.cli import main
from unimatmul.testing import isolated_selector

# A served process: answers from the file only (cached mode), checked against float64.
SERVE = r"""
import json, sys
import numpy as np
import unimatmul
from unimatmul.tuning.selector import get_selector

errors = []
rng = np.random.default_rng(3)
for shape in sys.argv[1:]:
    m, n, k = (int(x) for x in shape.split("x"))
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b
    errors.append(float(np.linalg.norm(unimatmul.matmul(a, b) - ref) / np.linalg.norm(ref)))
stats = get_selector().stats
json.dump({"tuned": stats.tuned, "hits": stats.cache_hits, "matched": stats.matched,
           "fallbacks": stats.fallbacks, "errors": errors}, sys.stdout)
"""


def _tune(cache: Path, *args: str) -> None:
    with isolated_selector(cache):
        assert main(["tune", *args, "--budget-ms", "1", "--quiet"]) == 0


def _verify(cache: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    code = main(["cache", "verify", "--cache", str(cache), "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_tune_merge_pin_and_serve_read_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    machine_a, machine_b, fleet = tmp_path / "a.msgpack", tmp_path / "b.msgpack", tmp_path / "fleet.msgpack"
    # Two tuning machines of this kind, one shape in common; B also tunes against torch.matmul
    # (another baseline: another namespace in the same file).
    _tune(machine_a, "--shape", "64x96x64", "--shape", "32x48x80")
    _tune(machine_b, "--shape", "32x48x80", "--shape", "16x64x32")
    _tune(machine_b, "--shape", "16x64x32", "--array", "torch")
    assert main(["cache", "merge", str(machine_a), str(machine_b), "-o", str(fleet)]) == 0
    assert "1 key in several files (the faster record kept)" in capsys.readouterr().out
    code, pinned = _verify(fleet, capsys)
    assert code == 0 and pinned["valid"]
    assert pinned["entries"] == 4 and pinned["namespaces"] == 2

    # Shipped: a read-only copy, checked against the pinned digest and this machine's libraries.
    deployed = tmp_path / "deploy" / "fleet.msgpack"
    deployed.parent.mkdir()
    shutil.copy(fleet, deployed)
    deployed.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    code, checked = _verify(deployed, capsys, "--expect", pinned["sha256"], "--validate")
    assert code == 0 and checked["matches"]
    assert checked["validation"]["matched"] == 3  # the NumPy namespace: all tuned here
    assert checked["validation"]["invalidated"] == 0

    before = deployed.read_bytes()
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    env.update(UNIMATMUL_CACHE=str(deployed), UNIMATMUL_CACHE_READONLY="1", UNIMATMUL_MODE="cached")
    shapes = ["64x96x64", "32x48x80", "16x64x32"]
    done = subprocess.run(
        [sys.executable, "-c", SERVE, *shapes],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    served = json.loads(done.stdout)
    assert served["hits"] == served["matched"] == 3 and served["tuned"] == 0 and served["fallbacks"] == 0
    assert max(served["errors"]) < 1e-5
    assert deployed.read_bytes() == before  # never written
    assert _verify(deployed, capsys, "--expect", pinned["sha256"])[0] == 0
