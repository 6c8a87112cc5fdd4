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
    dequantised_rows,
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


@pytest.mark.parametrize("mode", ["tensor", "rowwise", "block"])
@pytest.mark.parametrize("rows", [slice(0, 40), slice(0, 1), slice(13, 29)])
def test_rows_of_the_dequantised_activation_are_those_of_the_whole_one(mode: str, rows: slice) -> None:
    gen = torch.Generator().manual_seed(12)
    a = torch.randn(40, K, generator=gen).to(torch.float8_e4m3fn)
    if mode == "tensor":
        scale_a = torch.rand((), generator=gen) + 0.5
    elif mode == "rowwise":
        scale_a = torch.rand(40, 1, generator=gen) + 0.5
    else:  # one per token and 128 of K, outer-dim-major as torch takes it
        shape_a, _ = block_scale_shapes(40, N, K)
        scale_a = (torch.rand(shape_a[::-1], generator=gen) + 0.5).t()
    whole = a.double() * expanded_scale(scale_a.double(), a.shape)
    torch.testing.assert_close(dequantised_rows(a, scale_a, rows), whole[rows], rtol=0.0, atol=0.0)


@pytest.mark.parametrize("scales", ["tensor", "rowwise", "block"])
def test_the_reference_operands_of_a_scaled_product(scales: str) -> None:
    problem = scaled_problem(40, N, K, scales=scales)
    ops = make_scaled_operands(problem, ADAPTER, CPU, np.random.default_rng(2))
    plain, rows, columns = dequantised(ADAPTER, ops)
    assert plain.a is ops.a and plain.b is ops.b and plain.out is ops.out  # for their shapes
    want_a = ops.a.double() * expanded_scale(ops.scale_a.double(), ops.a.shape)
    torch.testing.assert_close(rows(slice(0, 1), slice(7, 33)), want_a[None, 7:33], rtol=0.0, atol=0.0)
    want_b = ops.b.double() * expanded_scale(ops.scale_b.double(), ops.b.shape)
    torch.testing.assert_close(
        columns(slice(0, 1), slice(40, 300)), want_b[None, :, 40:300], rtol=0.0, atol=0.0
    )
    assert not torch.equal(rows(slice(0, 1), slice(0, 40))[0], ops.a.double())  # the scales applied
