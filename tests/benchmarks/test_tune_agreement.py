"""benchmarks/tune_agreement.py: a run's rows keep every candidate's status and median."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import tune_agreement


def test_a_rows_candidates_are_the_records_results(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    env["UNIMATMUL_CACHE"] = str(tmp_path / "cache.msgpack")
    command = [
        sys.executable,
        "-m",
        "unimatmul",
        "tune",
        "--quiet",
        "--shape",
        "48x96x64",
        "--json",
        str(out),
    ]
    subprocess.run(command, env=env, check=True, capture_output=True, cwd=tmp_path)
    records = json.loads(out.read_text())
    rows = tune_agreement.rows_of(records)
    assert list(rows) == [records[0]["problem"]]
    row = rows[records[0]["problem"]]
    results = records[0]["results"]
    assert set(row["candidates"]) == {r["identity"] for r in results}
    default = row["candidates"]["default/default"]
    assert default["status"] == "ok" and default["median_us"] > 0 and default["samples"] >= 2
    assert row["winner"] in row["candidates"]
    assert row["repeat"] in (None, "confirmed", "within noise", "failed", "abandoned")
