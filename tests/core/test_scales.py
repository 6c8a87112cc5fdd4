"""A scaled product's dequantised operands, as the numeric check's reference takes them."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from unimatmul.core.arrays import CPU, adapter_for_kind  # noqa: E402
from unimatmul.core.scales import (  # noqa: E402
    block_scale_shapes,
    dequantised,
    dequantised_columns,
    expanded_scale,
    make_scaled_operands,
    scaled_problem,
)

if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("this torch has no fp8 dtype", allow_module_level=True)

ADAPTER = adapter_for_kind("torch")
# k and n not multiples of 128: block scales' last blocks are partial.
K, N = 300, 330


def _scale_b(mode: str, gen: torch.Generator) -> torch.Tensor:
    if mode == "tensor":
        return torch.rand((), generator=gen) + 0.5
    if mode == "rowwise":
        return torch.rand(1, N, generator=gen) + 0.5
    _, shape_b = block_scale_shapes(1, N, K)
    return (torch.rand(shape_b[::-1], generator=gen) + 0.5).t()  # w_scale.t(), as torch takes it


@pytest.mark.parametrize("mode", ["tensor", "rowwise", "block"])
@pytest.mark.parametrize("cols", [slice(0, N), slice(0, 128), slice(100, 300), slice(256, N)])
def test_columns_of_the_dequantised_weight_are_those_of_the_whole_one(mode: str, cols: slice) -> None:
    gen = torch.Generator().manual_seed(11)
    b = torch.randn(N, K, generator=gen).to(torch.float8_e4m3fn).t()  # w.t(): column-major
    scale_b = _scale_b(mode, gen)
    whole = b.double() * expanded_scale(scale_b.double(), b.shape)
    found = dequantised_columns(b, scale_b, cols)
    torch.testing.assert_close(found, whole[:, cols], rtol=0.0, atol=0.0)
    assert found.dtype == torch.float64 and not torch.equal(found, b[:, cols].double())


@pytest.mark.parametrize("scales", ["tensor", "rowwise", "block"])
def test_the_reference_operands_of_a_scaled_product(scales: str) -> None:
    problem = scaled_problem(16, N, K, scales=scales)
    ops = make_scaled_operands(problem, ADAPTER, CPU, np.random.default_rng(2))
    plain, columns = dequantised(ADAPTER, ops)
    want_a = ops.a.float() * expanded_scale(ops.scale_a.float(), ops.a.shape)
    torch.testing.assert_close(plain.a, want_a, rtol=0.0, atol=0.0)
    assert plain.b is ops.b and plain.out is ops.out  # B only for its shape: its columns on demand
    want_b = ops.b.double() * expanded_scale(ops.scale_b.double(), ops.b.shape)
    torch.testing.assert_close(
        columns(slice(0, 1), slice(40, 300)), want_b[None, :, 40:300], rtol=0.0, atol=0.0
    )
