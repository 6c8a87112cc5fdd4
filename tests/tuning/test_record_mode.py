"""Record mode: distinct problems written once, across processes; reading records back."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import unimatmul
from unimatmul.backend import Target
from unimatmul.cli.tune import read_problem_file
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.core.plugins import PluginManager
from unimatmul.core.problem import Problem
from unimatmul.tuning.harness import HarnessConfig
from unimatmul.tuning.record_mode import ProblemRecorder, RecordedProblem, default_record_path, read_problems
from unimatmul.tuning.selector import Selector, set_selector

REPO = Path(__file__).resolve().parents[2]
UNTUNED = REPO / "tests" / "interop" / "data" / "untuned.csv"


def _target() -> Target:
    return Target(adapter_for_kind("numpy"), CPU)


def test_default_path_is_beside_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UNIMATMUL_RECORD_FILE", raising=False)
    monkeypatch.setenv("UNIMATMUL_CACHE", str(tmp_path / "sub" / "cache.msgpack"))
    assert default_record_path() == tmp_path / "sub" / "recorded.jsonl"
    monkeypatch.setenv("UNIMATMUL_RECORD_FILE", str(tmp_path / "mine.jsonl"))
    assert default_record_path() == tmp_path / "mine.jsonl"


def test_a_problem_is_written_once_even_by_two_recorders(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    first, second = ProblemRecorder(path), ProblemRecorder(path)
    p1, p2 = Problem.from_shape(8, 16, 32), Problem.from_shape(8, 16, 32, "bf16")
    first(p1, _target())
    first(p1, _target())
    second(p1, _target())  # the second learns what the first wrote
    second(p2, _target())
    first(p2, _target())
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    assert [json.loads(line)["problem"] for line in lines] == [p1.key, p2.key]
    assert json.loads(lines[0]) == {"problem": p1.key, "array": "numpy", "device": "cpu"}


def test_processes_recording_at_once_write_each_problem_once(tmp_path: Path) -> None:
    path = tmp_path / "shared.jsonl"
    script = textwrap.dedent(
        f"""
        import random, sys
        from unimatmul.core.problem import Problem
        from unimatmul.tuning.record_mode import ProblemRecorder, RecordedProblem
        recorder = ProblemRecorder({str(path)!r})
        shapes = [(m, 64, 32) for m in range(1, 41)]
        random.Random(int(sys.argv[1])).shuffle(shapes)
        for m, n, k in shapes:
            recorder.record(RecordedProblem(Problem.from_shape(m, n, k), "torch", "cpu"))
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(seed)]) for seed in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    lines = path.read_text().splitlines()
    keys = [json.loads(line)["problem"] for line in lines]
    assert len(keys) == 40 and len(set(keys)) == 40


def test_read_skips_a_torn_line_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "rec.jsonl"
    recorder = ProblemRecorder(path)
    recorder.record(RecordedProblem(Problem.from_shape(4, 8, 16), "torch", "cuda:1"))
    with path.open("a") as fh:
        fh.write('{"problem": "gemm:f32')  # a writer died mid-line
    recorder2 = ProblemRecorder(path)
    recorder2.record(RecordedProblem(Problem.from_shape(5, 8, 16), "torch", "cpu"))
    found = read_problems(path)
    assert [(r.problem.m, r.device) for r in found.problems] == [(4, "cuda:1"), (5, "cpu")]
    assert len(found.skipped) == 1 and found.skipped[0][0] == 2
    assert found.format == "unimatmul-record"


def test_read_tunableop_untuned_file() -> None:
    found = read_problem_file(UNTUNED)
    assert found.format == "tunableop-untuned"
    by_dtype = {r.problem.dtype_a: r.problem for r in found.problems}
    # x[2, 3584] @ W.T with W[8192, 3584]: TunableOp writes it as tn_8192_2_3584.
    linear = by_dtype["bf16"]
    assert (linear.m, linear.n, linear.k) == (2, 8192, 3584)
    assert (linear.trans_a, linear.trans_b) == (False, True)
    assert (linear.lda, linear.ldb, linear.ldc) == (3584, 3584, 8192)
    assert linear.epilogue == "none"
    with_bias = by_dtype["f16"]
    assert (with_bias.m, with_bias.n, with_bias.k, with_bias.epilogue) == (32, 768, 1024, "bias")
    assert all(r.device is None and r.array == "torch" for r in found.problems)
    # The ScaledGemm row (tn_64_12288_2048_ld_2048_2048_64_rw_1_bias_None) is x[12288, 2048] @ w.t(),
    # fp8 with row-wise scales: a scaled problem, nothing skipped.
    scaled = by_dtype["f8e4m3"]
    assert (scaled.op, scaled.m, scaled.n, scaled.k, scaled.dtype_c) == (
        "scaled_gemm",
        12288,
        64,
        2048,
        "bf16",
    )
    assert (scaled.trans_a, scaled.trans_b, scaled.scale_a, scaled.scale_b) == (
        False,
        True,
        "rowwise",
        "rowwise",
    )
    assert not found.skipped


def test_neither_format_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.txt"
    path.write_text("hello world\n")
    with pytest.raises(ValueError, match="neither a unimatmul record file"):
        read_problem_file(path)


@pytest.fixture
def recording_selector(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("UNIMATMUL_CACHE", str(tmp_path / "cache.msgpack"))
    monkeypatch.setenv("UNIMATMUL_RECORD_FILE", str(tmp_path / "rec.jsonl"))
    fast = HarnessConfig(warmup=1, min_samples=3, max_samples=10, budget_s=0.01, settle_s=0.0, max_sets=2)
    old = set_selector(Selector(plugins=PluginManager(), settings=fast))
    try:
        yield tmp_path / "rec.jsonl"
    finally:
        set_selector(old)


def test_record_mode_writes_each_problem_met_and_tunes_nothing(recording_selector: Path) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((6, 10)).astype(np.float32)
    b = rng.standard_normal((10, 12)).astype(np.float32)
    with unimatmul.mode("record"):
        for _ in range(3):
            out = unimatmul.matmul(a, b)
        unimatmul.matmul(a[:3], b)
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)
    found = read_problems(recording_selector)
    assert [(r.problem.m, r.problem.n, r.problem.k) for r in found.problems] == [(6, 12, 10), (3, 12, 10)]
    assert all(r.array == "numpy" and r.device == "cpu" for r in found.problems)
    from unimatmul.tuning.selector import get_selector

    assert get_selector().stats.tuned == 0


def test_record_mode_writes_nothing_beside_a_read_only_cache(
    recording_selector: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from unimatmul.core import notices

    monkeypatch.delenv("UNIMATMUL_RECORD_FILE")
    monkeypatch.setenv("UNIMATMUL_CACHE_READONLY", "1")
    notices.forget()
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 9)).astype(np.float32)
    b = rng.standard_normal((9, 7)).astype(np.float32)
    with unimatmul.mode("record"), pytest.warns(RuntimeWarning, match="no recorded.jsonl is written"):
        out = unimatmul.matmul(a, b)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-5)
    assert not list(recording_selector.parent.glob("*.jsonl"))
    # A record file named on purpose is still written.
    monkeypatch.setenv("UNIMATMUL_RECORD_FILE", str(recording_selector))
    with unimatmul.mode("record"):
        unimatmul.matmul(a[:2], b)
    assert [r.problem.m for r in read_problems(recording_selector).problems] == [2]
