"""Retirement of kernel families that lose everywhere in a tuning run."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from harness_fakes import KernelBackend, right, sleeps

from unimatmul.backend import DEFAULT, Candidate, Target
from unimatmul.cache.protocol import open_store
from unimatmul.cache.record import FAILED, OK, PRUNED, CandidateResult, TuningRecord
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.core.plugins import PluginManager
from unimatmul.core.problem import Problem
from unimatmul.testing import registered
from unimatmul.tuning.harness import HarnessConfig
from unimatmul.tuning.retire import Retirement, family, problem_class
from unimatmul.tuning.selector import Selector

FAST = HarnessConfig(warmup=1, min_samples=3, max_samples=6, budget_s=0.01, settle_s=0.0, max_sets=2)
CPU_TARGET = Target(adapter_for_kind("numpy"), CPU)


def _record(
    problem: Problem, times: Mapping[str, float | None], status: dict[str, str] | None = None
) -> TuningRecord:
    results = [
        CandidateResult(identity, (status or {}).get(identity, OK if t else PRUNED), median_s=t)
        for identity, t in times.items()
    ]
    return TuningRecord(
        problem=problem.key, winner=DEFAULT.identity, winner_s=1.0, default_s=1.0, results=results
    )


def test_family_is_the_identity_before_its_parameters() -> None:
    assert family("triton/tile?block_k=64&block_m=128") == "triton/tile"
    assert family("default/default") == "default/default"


def test_a_problem_class_is_rows_within_a_factor_of_four() -> None:
    base = Problem.from_shape(1, 4096, 4096, dtype="bf16")
    classes = {
        m: problem_class(base.with_m(m), CPU_TARGET) for m in (1, 2, 3, 4, 7, 8, 15, 16, 64, 512, 8192)
    }
    assert classes[2] == classes[3] == classes[4] == classes[7]
    assert classes[8] == classes[15] and classes[15] == classes[16]
    assert len({classes[1], classes[2], classes[8], classes[64], classes[512], classes[8192]}) == 6
    other = Problem.from_shape(1, 4096, 4096, dtype="f16")
    assert problem_class(other, CPU_TARGET) != classes[1]


def test_a_family_retires_after_losses_in_a_row_and_a_near_win_resets_the_count() -> None:
    retire = Retirement(after=3, gpu_only=False)
    slow = Candidate.make("t", "slow", x=1)
    fast = Candidate.make("t", "fast", x=1)
    problems = [Problem.from_shape(512 + i, 1024, 1024) for i in range(6)]
    loss = {"default/default": 1.0, fast.identity: 0.9, slow.identity: 1.5}  # 1.67x the best
    near = {"default/default": 1.0, fast.identity: 0.9, slow.identity: 1.1}  # within 1.3x
    for problem, times in zip(problems, (loss, loss, near, loss, loss), strict=False):
        assert retire.split(problem, CPU_TARGET, [DEFAULT, fast, slow])[1] == []
        retire.learn(problem, CPU_TARGET, _record(problem, times))
    retire.learn(problems[5], CPU_TARGET, _record(problems[5], loss))  # the third loss in a row
    kept, out = retire.split(problems[0], CPU_TARGET, [DEFAULT, fast, slow])
    assert kept == [DEFAULT, fast] and out == [slow]
    # Another class (rows 4x fewer) still measures it; so does a CPU target by default.
    assert retire.split(problems[0].with_m(64), CPU_TARGET, [DEFAULT, slow])[1] == []
    assert Retirement(after=1).applies(CPU_TARGET) is False
    assert retire.left_out == {"t/slow": 1}
    assert "1 candidates not measured (t/slow 1)" in retire.summary()


def test_failures_count_as_losses_and_unmeasured_candidates_say_nothing() -> None:
    retire = Retirement(after=2, gpu_only=False)
    broken = Candidate.make("t", "broken")
    capped = Candidate.make("t", "capped")
    problem = Problem.from_shape(100, 64, 64)
    for _ in range(2):
        times: dict[str, float | None] = {
            "default/default": 1.0,
            broken.identity: None,
            capped.identity: None,
        }
        retire.learn(problem, CPU_TARGET, _record(problem, times, {broken.identity: FAILED}))
    _, out = retire.split(problem, CPU_TARGET, [DEFAULT, broken, capped])
    assert out == [broken]


def test_off_and_default_is_never_retired() -> None:
    retire = Retirement(after=0, gpu_only=False)
    problem = Problem.from_shape(100, 64, 64)
    slow = Candidate.make("t", "slow")
    for _ in range(5):
        retire.learn(problem, CPU_TARGET, _record(problem, {"default/default": 1.0, slow.identity: 9.0}))
    assert retire.split(problem, CPU_TARGET, [DEFAULT, slow])[1] == []
    on = Retirement(after=1, gpu_only=False)
    fast = Candidate.make("t", "fast")
    on.learn(problem, CPU_TARGET, _record(problem, {"default/default": 9.0, fast.identity: 1.0}))
    assert on.split(problem, CPU_TARGET, [DEFAULT, fast])[1] == []


# --- through the tuner, measured for real (NumPy's Default and a kernel that sleeps) ------


def test_the_tuner_leaves_a_retired_family_out_and_says_so(tmp_path: Path) -> None:
    plugins = PluginManager(load_entry_points=False)
    # NumPy's own product, and the same far behind it (3 ms of sleep a call, hundreds of
    # times the product). A ratio of 10 keeps "same" (Default's product behind a Python
    # call, a few microseconds) within it on a loaded machine, where 1.3x is noise.
    backend = KernelBackend("twofam", {"same": right, "sleepy": sleeps(3e-3)})
    selector = Selector(plugins=plugins, store=open_store(tmp_path / "c.msgpack"), settings=FAST)
    selector.tuner.retirement = Retirement(after=2, gpu_only=False, ratio=10.0)
    with registered(plugins, backend):
        records = [selector.tune(Problem.from_shape(32 + i, 48, 40), CPU_TARGET) for i in range(4)]
        other = selector.tune(Problem.from_shape(300, 48, 40), CPU_TARGET)
    measured = [{r.identity for r in record.results} for record in records]
    assert all("twofam/sleepy" in seen for seen in measured[:2])
    assert all("twofam/sleepy" not in seen and "twofam/same" in seen for seen in measured[2:])
    for record in records[2:]:
        assert record.settings["retired"] == {
            "left_out": 1,
            "families": ["twofam/sleepy"],
            "after": 2,
            "ratio": 10.0,
        }
        assert record.winner != "twofam/sleepy"
    assert "retired" not in records[0].settings
    # Another class of rows still measures it.
    assert "twofam/sleepy" in {r.identity for r in other.results}
