"""benchmarks/tune_agreement.py: a run's rows keep every candidate's status and median."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def _refs_offered(out: Path, argv: list[str]) -> list[bool]:
    # f32: oneDNN offers its reference f32 matmul on every x86-64 ISA (its bf16 one not with
    # ONEDNN_MAX_CPU_ISA=AVX2).
    argv = ["--first", "1", "--runs", "2", "--dtype", "f32", "--out", str(out), *argv]
    assert tune_agreement.main(argv) == 0
    found = json.loads((out / "agreement.json").read_text())["sets"]["current"]
    offered = []
    for run in found["runs"]:
        (row,) = run["rows"].values()
        assert "default/default" in row["candidates"]
        offered.append(any(name.startswith("onednn/ref:") for name in row["candidates"]))
    return offered


def test_the_runs_see_the_settings_given_and_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # oneDNN's reference candidates are offered only where UNIMATMUL_ONEDNN_REF=1 reaches
    # the runs: through --setting (recorded with the set), not from the caller's environment.
    monkeypatch.setenv("UNIMATMUL_ONEDNN_REF", "1")
    assert _refs_offered(tmp_path / "caller", []) == [False, False]
    monkeypatch.delenv("UNIMATMUL_ONEDNN_REF")
    assert _refs_offered(tmp_path / "given", ["--setting", "UNIMATMUL_ONEDNN_REF=1"]) == [True, True]
    found = json.loads((tmp_path / "given" / "agreement.json").read_text())["sets"]["current"]
    assert found["settings"] == {"UNIMATMUL_ONEDNN_REF": "1"}


@pytest.mark.parametrize("bad", ["LT_HEURISTICS=2", "UNIMATMUL_CACHE=x.msgpack", "UNIMATMUL_LT_HEURISTICS"])
def test_a_setting_must_name_a_unimatmul_variable(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        tune_agreement.main(["--setting", bad, "--dry-run"])
    assert exited.value.code == 2
    assert "give NAME=VALUE for a UNIMATMUL_* variable" in capsys.readouterr().err
