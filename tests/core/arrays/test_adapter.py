"""The array adapters' package: one module per library behind ``unimatmul.core.arrays``."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import unimatmul.core.arrays as arrays
from unimatmul.core.arrays import cupy as cupy_module
from unimatmul.core.arrays import numpy as numpy_module
from unimatmul.core.arrays import torch as torch_module
from unimatmul.core.arrays.adapter import RANDOM_PERIOD
from unimatmul.tuning.numeric_check import structure_inputs


def test_every_name_of_the_package_is_the_one_of_its_module() -> None:
    for name in arrays.__all__:
        assert getattr(arrays, name) is not None, name
    assert arrays.NumpyAdapter is numpy_module.NumpyAdapter
    assert arrays.TorchAdapter is torch_module.TorchAdapter
    assert arrays.CupyAdapter is cupy_module.CupyAdapter
    assert arrays.kept_torch_buffer is torch_module.kept_torch_buffer


def test_dispatch_by_type_finds_each_librarys_adapter_once() -> None:
    a = np.arange(1.0, 7.0, dtype=np.float32).reshape(2, 3)
    found = arrays.adapter_of(a)
    assert isinstance(found, numpy_module.NumpyAdapter)
    assert found is arrays.adapter_for_kind("numpy") is arrays.adapter_of(a.T)
    assert found.signature(a) == (a.shape, a.strides, a.dtype.num, a.__array_interface__["data"][0] & 15)
    torch = pytest.importorskip("torch")
    t = torch.ones(2, 3)
    assert isinstance(arrays.adapter_of(t), torch_module.TorchAdapter)
    assert arrays.adapter_of(t) is arrays.adapter_for_kind("torch")


def test_an_unknown_kind_or_array_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown array kind 'jax'; valid: numpy, torch, cupy"):
        arrays.adapter_for_kind("jax")
    with pytest.raises(
        TypeError, match=r"takes NumPy arrays, torch tensors or CuPy arrays, not builtins\.list"
    ):
        arrays.adapter_of([[1.0]])


def test_the_packages_import_loads_no_array_library_but_numpy() -> None:
    code = "import sys, unimatmul.core.arrays; print(sorted({'torch', 'cupy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_default_runner_through_the_sdk_gives_numpys_product() -> None:
    from unimatmul.backend import DefaultRunner
    from unimatmul.core.problem import Problem
    from unimatmul.core.runners import default_runner

    rng = np.random.default_rng(3)
    a = rng.standard_normal((5, 7)).astype(np.float32)
    b = rng.standard_normal((7, 4)).astype(np.float32)
    out = np.empty((5, 4), dtype=np.float32)
    runner = default_runner(Problem.from_shape(5, 4, 7), arrays.adapter_of(a))
    assert isinstance(runner, DefaultRunner)
    runner(a, b, out, 2.0)
    ref = 2.0 * (a.astype(np.float64) @ b.astype(np.float64))
    assert np.abs(out - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_torchs_fewer_pass_check_primitives_give_the_generic_values(out_dtype: str) -> None:
    # The numeric check's per-block work: torch's override (a promoting subtraction, the
    # ratio's extremes) against the generic primitives, on errors of both signs, an exact
    # element with a zero bound (NaN either way), and an output element left NaN.
    torch = pytest.importorskip("torch")
    adapter = arrays.adapter_for_kind("torch")
    generic = arrays.ArrayAdapter
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(3, 64, 48, generator=g)
    out = (ref + 1e-2 * torch.randn(3, 64, 48, generator=g)).to(getattr(torch, out_dtype))
    bound = 0.05 + torch.rand(3, 64, 48, generator=g)
    for mine, theirs in (
        (adapter.error_parts(out, ref, bound), generic.error_parts(adapter, out, ref, bound)),
        (adapter.screen_parts(out, ref, 0.25), generic.screen_parts(adapter, out, ref, 0.25)),
    ):
        for a, b in zip(mine, theirs, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=0.0)
    zero = bound.clone()
    zero[1, 2, 3] = 0.0
    exact = out.clone()
    exact[1, 2, 3] = ref[1, 2, 3].to(exact.dtype)
    ref_exact = ref.clone()
    ref_exact[1, 2, 3] = exact[1, 2, 3].float()
    worst, _ = adapter.error_parts(exact, ref_exact, zero)
    assert adapter.scalars([worst]) == [float("inf")]  # 0 / 0: NaN, read as inf
    holed = out.clone()
    holed[2, 63, 47] = float("nan")
    worst, squares = adapter.error_parts(holed, ref, bound)
    excess, screened = adapter.screen_parts(holed, ref, 0.25)
    assert adapter.scalars([worst, squares, screened]) == [float("inf")] * 3
    assert torch.isnan(excess[2, 63]) and not torch.isnan(excess[2, 62])


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32", "f8e4m3"])
def test_torchs_random_operands_are_of_their_dtype_never_zero_and_seeded(dtype: str) -> None:
    torch = pytest.importorskip("torch")
    adapter: Any = arrays.adapter_for_kind("torch")
    if dtype == "f8e4m3" and not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8")
    shape, strides = (3, 5), (1, 4)  # column-major with a padded leading dimension

    def draw(seed: int) -> Any:
        return adapter.random_strided(shape, strides, dtype, arrays.CPU, np.random.default_rng(seed))

    x = draw(7)
    assert x.dtype == adapter.torch_dtype(dtype)
    assert tuple(x.shape) == shape and tuple(x.stride()) == strides
    values = x.to(torch.float64)
    assert bool(torch.isfinite(values).all()) and bool((values != 0).any())
    assert torch.equal(values, draw(7).to(torch.float64))  # the same seed, the same values
    assert not torch.equal(values, draw(8).to(torch.float64))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_a_large_cpu_operand_repeats_one_draw_of_a_prime_period(kind: str) -> None:
    # Drawing normal numbers is the cost of a large operand on a CPU: past two periods
    # one draw of RANDOM_PERIOD (a prime) values is repeated. A smaller one is drawn whole.
    if kind == "torch":
        pytest.importorskip("torch")
    adapter: Any = arrays.adapter_for_kind(kind)
    period = RANDOM_PERIOD
    rows = -(-(2 * period + 3) // 1024)  # just past two periods, in rows of 1024
    seeded = adapter.random_strided((rows, 1024), (1024, 1), "f32", arrays.CPU, np.random.default_rng(3))
    x = np.asarray(adapter.to_numpy(seeded)).reshape(-1)
    assert np.array_equal(x[period : 2 * period], x[:period])
    assert np.array_equal(x[2 * period :], x[: x.size - 2 * period])
    block = x[:period]
    assert abs(float(block.mean())) < 0.01 and abs(float(block.std()) - 1.0) < 0.01
    assert len(np.unique(block[:100_000])) > 99_000  # no shorter period inside the draw
    # A row and the next one, or any two rows, never hold the same values (a kernel that
    # reads the wrong row is caught), and another seed draws other values.
    assert not np.array_equal(x[:1024], x[1024:2048])
    other = adapter.random_strided((rows, 1024), (1024, 1), "f32", arrays.CPU, np.random.default_rng(4))
    assert not np.array_equal(np.asarray(adapter.to_numpy(other)).reshape(-1)[:period], block)
    whole = adapter.random_strided((2 * period,), (1,), "f32", arrays.CPU, np.random.default_rng(3))
    drawn = np.asarray(adapter.to_numpy(whole))
    assert not np.array_equal(drawn[period:], drawn[:period])  # two periods: drawn whole


def test_structured_integers_in_a_strided_band_of_a_torch_weight() -> None:
    # B's bands are columns (strided views); its integers are made in place there.
    torch = pytest.importorskip("torch")
    adapter: Any = arrays.adapter_for_kind("torch")
    b = torch.randn(64, 90, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(5))
    a = torch.randn(10, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(6))
    before = b.clone()
    structure_inputs(adapter, a, b, 0, ("bf16", "bf16", "f32"))  # B's first band: integers
    assert torch.equal(b[:, :30], torch.clip(torch.round(before[:, :30] * 2.0), -4.0, 4.0))
    assert torch.equal(b[:, 30:60], torch.ones(64, 30, dtype=torch.bfloat16))
    assert torch.equal(b[:, 60:], before[:, 60:])
