"""Distributed tuning: sharding and gathering across ranks, agreed choices in a job.

The multi-process tests start two real ranks on the CPU (gloo) with torchrun's
variables, each running ``dist_rank.py``, or ``torchrun`` itself for the command; they
tune with the real oneDNN backend. The rules (sharding, the agreed choice) are also
tested as plain functions.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from onednn_caps import skip_unless_offered

from unimatmul.backend import DEFAULT, Target
from unimatmul.cache.file_store import MsgpackFileStore
from unimatmul.cache.record import FAILED, OK, PRUNED, REJECTED, CandidateResult, TuningRecord
from unimatmul.cli import main
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.core.problem import Problem
from unimatmul.tuning import agreement
from unimatmul.tuning.agreement import Item, adopt, agreed_winner
from unimatmul.tuning.buckets import Buckets
from unimatmul.tuning.distributed import estimated_cost, lpt_order, static_shards
from unimatmul.tuning.harness import HarnessConfig
from unimatmul.tuning.jobs import TuneJob

pytest.importorskip("torch.distributed")

HERE = Path(__file__).parent
RANK_PROGRAM = HERE / "dist_rank.py"
TIMEOUT_S = 240


# --- launching two ranks -----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    env.update(UNIMATMUL_TORCH_NATIVE="0", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    return env


def launch_ranks(*args: str, world: int = 2) -> list[tuple[int, dict[str, Any] | None, str]]:
    """Run ``dist_rank.py ARGS`` as ``world`` ranks; (exit code, its JSON line, stderr) per rank."""
    port = _free_port()
    procs = []
    for rank in range(world):
        env = _clean_env(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(RANK_PROGRAM), *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=TIMEOUT_S)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            results.append((proc.returncode, json.loads(lines[-1]) if lines else None, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return results


def _keys(path: Path) -> list[str]:
    """Every key of a cache file, each entry decoded (a broken one fails the test)."""
    store = MsgpackFileStore(path, read_only=True)
    keys = [key for _, key, _ in store.items()]
    assert not store.problems, store.problems
    return keys


# --- the rules as functions --------------------------------------------------------------------


def test_static_shards_hold_every_job_once_and_balance_the_cost() -> None:
    costs = [5.0, 1.0, 4.0, 3.0, 3.0, 2.0, 2.0, 8.0]
    shards = static_shards(costs, 3)
    assert sorted(i for share in shards for i in share) == list(range(len(costs)))
    loads = [sum(costs[i] for i in share) for share in shards]
    # Longest processing time first: within the largest job of the ideal share.
    assert max(loads) - min(loads) <= max(costs)
    assert max(loads) <= sum(costs) / 3 + max(costs) / 3 * 2
    assert static_shards(costs, 3) == shards  # the same deal on every rank
    assert lpt_order(costs)[:2] == [7, 0]
    assert static_shards([], 2) == [[], []]


def test_the_cost_estimate_orders_bigger_work_first() -> None:
    target = Target(adapter_for_kind("numpy"), CPU)
    settings = HarnessConfig()
    small = TuneJob(Problem.parse_shape("16x16x16:f32"), target)
    big = TuneJob(Problem.parse_shape("2048x2048x2048:f32"), target)
    bucket = TuneJob(Problem.parse_shape("16x16x16:f32"), target, Buckets.parse("pow2"))
    assert estimated_cost(big, settings) > estimated_cost(small, settings) > 0
    assert estimated_cost(bucket, settings) > estimated_cost(small, settings)


def _record(times: dict[str, float | None], statuses: dict[str, str] | None = None) -> TuningRecord:
    statuses = statuses or {}
    results = [CandidateResult(k, statuses.get(k, OK), v, 5) for k, v in times.items()]
    ok = {k: v for k, v in times.items() if v is not None and statuses.get(k, OK) == OK}
    winner = min(ok, key=lambda k: ok[k])
    return TuningRecord("gemm:key", winner, ok[winner], times.get(DEFAULT.identity), results)


def test_the_agreed_winner_is_the_best_median_over_ranks() -> None:
    d = DEFAULT.identity
    # Alone, rank 0 would run k1 and rank 1 k2; over both, k2 is faster (median 1.5 vs 2.0).
    ranks = [_record({d: 10.0, "x/k1": 1.0, "x/k2": 2.0}), _record({d: 10.0, "x/k1": 3.0, "x/k2": 1.0})]
    assert [r.winner for r in ranks] == ["x/k1", "x/k2"]
    assert agreed_winner(ranks, 0.01) == "x/k2"
    assert agreed_winner(list(reversed(ranks)), 0.01) == "x/k2"  # rank order does not matter
    # A rank that failed altogether does not vote.
    assert agreed_winner([ranks[0], None], 0.01) == "x/k1"
    assert agreed_winner([None, None], 0.01) == d


@pytest.mark.parametrize("status", [REJECTED, FAILED, PRUNED])
def test_a_kernel_not_ok_on_one_rank_cannot_win(status: str) -> None:
    d = DEFAULT.identity
    fast_but_wrong_on_1 = _record({d: 10.0, "x/k1": 1.0, "x/k2": 5.0})
    other = _record({d: 10.0, "x/k1": 1.0, "x/k2": 5.0}, {"x/k1": status})
    assert agreed_winner([fast_but_wrong_on_1, other], 0.01) == "x/k2"
    # Missing on one rank (a plugin installed on one machine only): cannot win either.
    assert agreed_winner([fast_but_wrong_on_1, _record({d: 10.0, "x/k2": 5.0})], 0.01) == "x/k2"


def test_the_agreed_winner_must_beat_default_by_min_gain() -> None:
    d = DEFAULT.identity
    ranks = [_record({d: 1.0, "x/k1": 0.995}), _record({d: 1.0, "x/k1": 0.995})]
    assert agreed_winner(ranks, 0.01) == d
    assert agreed_winner(ranks, 0.001) == "x/k1"


def test_buckets_agree_on_the_median_ratios_at_every_point() -> None:
    d = DEFAULT.identity

    def bucket(ratios: dict[str, str]) -> TuningRecord:
        record = _record({d: 1.0, "x/k1": 0.5, "x/k2": 0.6})
        record.settings["bucket"] = {"rep": 16, "lo": 9, "hi": 16, "ratios": ratios}
        return record

    # k1 loses at the last point on two ranks of three; k2 wins everywhere.
    ranks = [
        bucket({"x/k1": "0.5,0.6,1.2", "x/k2": "0.6,0.7,0.8"}),
        bucket({"x/k1": "0.5,0.6,0.7", "x/k2": "0.6,0.7,0.8"}),
        bucket({"x/k1": "0.5,0.6,1.1", "x/k2": "0.6,0.7,0.8"}),
    ]
    assert agreed_winner(ranks, 0.01) == "x/k2"


def test_adopt_keeps_the_ranks_own_times_and_notes_its_own_choice() -> None:
    d = DEFAULT.identity
    mine = _record({d: 10.0, "x/k1": 1.0, "x/k2": 2.0})
    record = adopt(mine, "x/k2", ranks=2, agreed={"x/k2": 1.5, d: 10.0})
    assert record.winner == "x/k2" and record.winner_s == 2.0
    assert record.settings["agreed"] == {
        "ranks": 2,
        "rule": "median-of-rank-medians",
        "alone": "x/k1",
        "winner_s": 1.5,
        "default_s": 10.0,
    }
    assert mine.winner == "x/k1"  # the rank's own record is not changed in place
    assert math.isclose(adopt(mine, d, ranks=2, agreed={}).winner_s, 10.0)


def test_an_item_is_the_bucket_representative_when_bucketing() -> None:
    target = Target(adapter_for_kind("numpy"), CPU)
    problem = Problem.parse_shape("24x64x32:f32")
    spec = Buckets.parse("pow2")
    assert spec is not None
    item = Item.of(problem, target, spec)
    assert item.key == problem.with_m(32).key and item.buckets == "pow2"
    assert Item.of(problem, target).key == problem.key
    job = item.job({})
    assert job.problem.m == 32 and job.buckets is not None and job.target.device == CPU


def test_without_a_process_group_nothing_is_deferred(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIMATMUL_DISTRIBUTED", "1")
    assert not agreement.active()
    assert not agreement._defer(Problem.parse_shape("8x8x8:f32"), Target(adapter_for_kind("numpy"), CPU))
    assert agreement.pending() == []


def test_distributed_needs_torchrun(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert main(["tune", "--shape", "8x8x8", "--distributed"]) == 2
    assert "runs under torchrun" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    assert main(["tune", "--shape", "8x8x8", "--device", "cuda:1"]) == 2
    assert "each rank uses its own device" in capsys.readouterr().err


# --- two real ranks --------------------------------------------------------------------------


def test_two_ranks_tune_a_preset_once_and_report_the_same_choices(tmp_path: Path) -> None:
    skip_unless_offered("f32")  # each problem must have kernels besides Default
    results = launch_ranks("sharded", str(tmp_path))
    for code, result, err in results:
        assert code == 0 and result is not None, err
    by_rank = {result["rank"]: result for _, result, _ in results if result}
    for how in ("claim", "static"):
        runs = [by_rank[r][how] for r in (0, 1)]
        assert runs[0]["outcomes"] == runs[1]["outcomes"], f"{how}: the ranks report different choices"
        outcomes = runs[0]["outcomes"]
        assert len(outcomes) == 6 and all(o["source"] == "tuned" for o in outcomes)
        assert {o["rank"] for o in outcomes} == {0, 1}, f"{how}: one rank did all the work"
        assert all(o["candidates"] >= 2 for o in outcomes)  # Default and oneDNN's kernels
        assert runs[0]["claiming"] is (how == "claim")
        # Written once, by rank 0: the file holds every problem exactly once.
        assert [runs[0]["written"], runs[1]["written"]] == [6, 0]
        keys = _keys(tmp_path / f"{how}.msgpack")
        assert sorted(keys) == sorted(o["problem"] for o in outcomes)
        assert len(keys) == len(set(keys)) == 6


def test_a_rank_that_dies_leaves_a_valid_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    skip_unless_offered("f32")  # the ranks tune CPU problems: without a CPU backend they refuse to start
    (code0, result0, err0), (code1, result1, _) = launch_ranks("die", str(tmp_path))
    assert code1 == 17 and result1 is None
    assert code0 == 0 and result0 is not None, err0
    # The survivor says what happened and kept what it measured itself.
    assert "gathering the records failed" in result0["error"]
    assert "stored its own" in result0["error"]
    assert 1 <= result0["entries"] <= 5  # rank 1's job died with it
    cache = tmp_path / "cache.msgpack"
    assert main(["cache", "verify", "--cache", str(cache)]) == 0
    assert f"ok: {result0['entries']} entries" in capsys.readouterr().out
    assert not list(tmp_path.glob(".cache.msgpack.*.tmp"))


def _two_gpus() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not _two_gpus(), reason="needs two GPUs (NCCL)")],
        ),
    ],
)
def test_two_ranks_of_a_tensor_parallel_stack_run_the_same_kernels(tmp_path: Path, device: str) -> None:
    results = launch_ranks("agree", str(tmp_path), "--device", device)
    for code, result, err in results:
        assert code == 0 and result is not None, err
    r0, r1 = (result for _, result, _ in sorted(results, key=lambda r: r[1]["rank"] if r[1] else -1))
    assert r0 is not None and r1 is not None
    # Warm-up: rank 1 met one product more than rank 0; both settled the union.
    assert r1["warmup_problems"] == r0["warmup_problems"] + 1
    assert r0["stored"].keys() == r1["stored"].keys()
    assert {k: v["winner"] for k, v in r0["stored"].items()} == {
        k: v["winner"] for k, v in r1["stored"].items()
    }
    assert all(v["agreed"]["ranks"] == 2 and v["ok"] >= 1 for v in r0["stored"].values())
    shared = r0["after_warmup"].keys() & r1["after_warmup"].keys()
    assert shared and all(r0["after_warmup"][k] == r1["after_warmup"][k] for k in shared)
    # Tune mode on a call: deferred (Default ran), then agree() settled both ranks' problems.
    assert len(r0["deferred"]) == len(r1["deferred"]) == 1 and r0["deferred"] != r1["deferred"]
    assert r0["deferred_sources"] == r1["deferred_sources"] == ["deferred"]
    assert r0["settled"] == r1["settled"] and set(r0["settled"]) == {r0["deferred"][0], r1["deferred"][0]}
    for r in (r0, r1):
        key = r["deferred"][0]
        assert r["after_agree"][key] == r["settled"][key]
        assert r["stored"][key]["winner"] == r["settled"][key]
    # Unequal numbers of agree() calls: both ranks raise, neither hangs.
    assert r0["mismatch"] and r1["mismatch"] and "different numbers of times" in r0["mismatch"]


def test_torchrun_runs_the_command_on_two_ranks(tmp_path: Path) -> None:
    skip_unless_offered("f32")  # CPU shapes: every rank needs a CPU backend
    cache, report = tmp_path / "cache.msgpack", tmp_path / "records.json"
    shapes = ["--shape", "64x96x64", "--shape", "48x64x80", "--shape", "4x32x32x48"]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "unimatmul", "tune", *shapes, "--budget-ms", "1", "--quiet", "--json", str(report)]
    done = subprocess.run(
        command,
        env=_clean_env(UNIMATMUL_CACHE=str(cache)),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    # One table, from rank 0, with the rank that tuned each shape.
    assert done.stdout.count("best candidate") == 1
    assert "ranks: 2 (gloo), jobs claimed largest first" in done.stdout
    assert "3 written once by rank 0" in done.stdout
    records = json.loads(report.read_text())
    assert sorted(r["problem"] for r in records) == sorted({r["problem"] for r in records})
    assert len(records) == 3 and {r["rank"] for r in records} == {0, 1}
    assert sorted(_keys(cache)) == sorted(r["problem"] for r in records)
