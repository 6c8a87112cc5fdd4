"""Tuning memory is bounded: a multiple of the product's own operands, and what is free.

``(20000,8)@(8,20000)`` f32 once peaked at 9.4 GB in tune mode against 1.6 GB
untuned. The rotated sets and the check's arrays stay within
``UNIMATMUL_TUNE_MEMORY`` times the operands (or the rotation target, if larger), and a
product that cannot be tuned within that runs Default with one warning.
"""

from __future__ import annotations

import tracemalloc
import warnings
from typing import Any

import numpy as np
import pytest

import unimatmul
from unimatmul.backend import Target
from unimatmul.core.arrays import CPU, adapter_for_kind, operand_bytes
from unimatmul.core.problem import Problem
from unimatmul.testing import fast_config
from unimatmul.tuning.harness import CpuTimer, Harness, HarnessConfig, TuningTooLarge

NUMPY = Target(adapter_for_kind("numpy"), CPU)
# C dominates, as in the issue: 16 MiB of output from 64 KiB of inputs.
WIDE = Problem.from_shape(2048, 2048, 8)


@pytest.mark.parametrize(("factor", "keeps", "most"), [(4.0, True, 3.2), (3.0, False, 2.6)])
def test_tuning_a_wide_product_stays_within_its_multiple(
    isolated: Any, factor: float, keeps: bool, most: float
) -> None:
    # numpy registers its arrays with tracemalloc: the peak is what tuning allocated.
    settings = HarnessConfig(**{**fast_config().to_dict(), "rotate_bytes": 1 << 20, "memory_factor": factor})
    isolated.selector.settings = settings
    plan = Harness(CpuTimer(), settings).plan_memory(WIDE, NUMPY, beta=0.0)
    footprint = operand_bytes(WIDE)
    tracemalloc.start()
    try:
        record = isolated.selector.tune(WIDE, NUMPY)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert record.settings["sets"] == plan.sets == 1
    assert peak <= plan.allowed
    # One set, a float32 reference and small float64 blocks (the old harness took ~7x);
    # with room for them, the check also keeps the output's bounds in float32: one more
    # output's worth. Without that room it makes them block by block, as before.
    assert plan.keep_bounds is keeps
    assert peak <= most * footprint, f"peak {peak / footprint:.2f}x the operands"


def test_the_plan_counts_sets_and_the_check_within_the_bound() -> None:
    settings = HarnessConfig(rotate_bytes=1 << 20, memory_factor=4.0)
    plan = Harness(CpuTimer(), settings).plan_memory(WIDE, NUMPY, beta=0.0)
    assert plan.per_set == operand_bytes(WIDE)
    assert plan.sets * plan.per_set + plan.check <= plan.allowed <= 4 * plan.per_set + (1 << 20)
    # beta != 0: C's values are kept for every check call, the check needs more.
    settings.memory_factor = 6.0
    with_c = Harness(CpuTimer(), settings).plan_memory(WIDE, NUMPY, beta=1.0)
    assert with_c.check > plan.check + WIDE.m * WIDE.n * 4


def test_small_products_still_rotate_through_the_cache() -> None:
    # 4 x a 48 KiB product would not even hold the check: the rotation target decides.
    settings = HarnessConfig(rotate_bytes=8 << 20, max_sets=256, memory_factor=1.0)
    plan = Harness(CpuTimer(), settings).plan_memory(Problem.from_shape(64, 64, 64), NUMPY, beta=0.0)
    assert plan.sets == -(-(8 << 20) // plan.per_set)


def test_free_memory_bounds_tuning_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(NUMPY.adapter, "available_bytes", lambda device: 20 << 20)  # 20 MiB free
    with pytest.raises(TuningTooLarge, match=r"75% of the 20\.0 MiB free"):
        Harness(CpuTimer(), HarnessConfig(memory_factor=100.0)).plan_memory(WIDE, NUMPY, beta=0.0)


def test_a_product_too_large_to_tune_runs_default_with_one_warning(
    isolated: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNIMATMUL_TUNE_MEMORY", "1.5")
    isolated.selector.settings = HarnessConfig(**{**fast_config().to_dict(), "rotate_bytes": 1 << 20})
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2048, 8)).astype(np.float32)
    b = rng.standard_normal((8, 2048)).astype(np.float32)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with unimatmul.mode("tune"):
            first = unimatmul.matmul(a, b)
            second = unimatmul.matmul(a, b, out=np.empty_like(first))
            third = unimatmul.matmul(a[:, :8], b)
    messages = [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert "TuningTooLarge" in messages[0] and "UNIMATMUL_TUNE_MEMORY" in messages[0]
    assert "2048x2048x8" in messages[0]
    expected = a.astype(np.float64) @ b
    for out in (first, second, third):
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
    assert isolated.store_count() == 0  # nothing measured, nothing stored


@pytest.mark.parametrize(
    ("m", "n", "k"),
    [(1, 57344, 8192), (16, 57344, 8192), (64, 8192, 28672), (4096, 4096, 14336), (4096, 5120, 25600)],
)
def test_a_large_fp8_weight_tunes_within_the_default_multiple(
    monkeypatch: pytest.MonkeyPatch, m: int, n: int, k: int
) -> None:
    # Llama-3.1-70B-FP8's gate/up and down, and prefill of large A: the check once took a
    # float64 copy of the whole weight (8x its fp8 bytes) and a float32 one of A, and these
    # could not be tuned at the default multiple.
    pytest.importorskip("torch")
    from unimatmul.core.arrays import Device
    from unimatmul.core.scales import scaled_problem

    torch_gpu = Target(adapter_for_kind("torch"), Device("cuda"))
    monkeypatch.setattr(torch_gpu.adapter, "available_bytes", lambda device: 140 << 30)
    problem = scaled_problem(m, n, k, scales="rowwise")
    plan = Harness(CpuTimer(), HarnessConfig()).plan_memory(problem, torch_gpu, beta=0.0)
    assert plan.sets >= 1 and plan.factor == 8.0
    assert plan.sets * plan.per_set + plan.check <= plan.allowed


def test_a_gpu_plan_counts_the_screen_of_a_large_output(monkeypatch: pytest.MonkeyPatch) -> None:
    # Llama-3-8B's lm_head over 8192 tokens: a 1 Gi-element output, screened on a GPU in
    # blocks of 32 Mi elements with two float32 temporaries each (numeric_check.compare).
    pytest.importorskip("torch")
    from unimatmul.core.arrays import Device

    torch_gpu = Target(adapter_for_kind("torch"), Device("cuda"))
    monkeypatch.setattr(torch_gpu.adapter, "available_bytes", lambda device: 140 << 30)
    problem = Problem.from_shape(8192, 128256, 4096, dtype="bf16")
    plan = Harness(CpuTimer(), HarnessConfig()).plan_memory(problem, torch_gpu, beta=0.0)
    screen = 2 * (1 << 25) * 4
    monkeypatch.setattr(
        torch_gpu.adapter, "block_elements", _without_screen(torch_gpu.adapter.block_elements)
    )
    without = Harness(CpuTimer(), HarnessConfig()).plan_memory(problem, torch_gpu, beta=0.0)
    assert plan.check - without.check == screen - 2 * (1 << 22) * 4
    assert plan.sets >= 1 and plan.sets * plan.per_set + plan.check <= plan.allowed


def _without_screen(original: Any) -> Any:
    """``block_elements`` with the screen's blocks of the plain size."""

    def blocks(device: Any, *, reference: bool = False, screen: bool = False, total: int = 0) -> int:
        return original(device, reference=reference, total=total)

    return blocks
