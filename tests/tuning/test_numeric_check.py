"""The numeric check of an output made of parts (a grouped GEMM's groups): one Check for all."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from unimatmul.core.arrays import CPU, Operands, adapter_for_kind  # noqa: E402
from unimatmul.core.dtypes import ErrorModel  # noqa: E402
from unimatmul.tuning.numeric_check import compare, compare_parts, make_parts_reference, make_reference  # noqa: E402

ADAPTER = adapter_for_kind("torch")
MODEL = ErrorModel.for_problem(
    k=256, dtype_in="bf16", dtype_out="bf16", compute="f32", activation=None, ref_dtype="f32"
)
# Row ranges of a [600, 160] output: two parts, the second large enough to be checked on
# the device (not on the host) and the last rows in no part.
PARTS = (slice(0, 40), slice(40, 560))


def _product() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(600, 256, generator=gen).to(torch.bfloat16)
    b = torch.randn(256, 160, generator=gen).to(torch.bfloat16)
    return a, b, (a.double() @ b.double()).to(torch.bfloat16)


def _parts(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> object:
    parts = [(f"rows {r.start}:{r.stop}", lambda x, r=r: x[r], Operands(a[r], b, out[r])) for r in PARTS]
    return make_parts_reference(ADAPTER, parts, MODEL, CPU)


def test_parts_sum_to_the_check_of_the_rows_they_cover() -> None:
    a, b, out = _product()
    reference = _parts(a, b, out)
    whole = make_reference(ADAPTER, Operands(a[:560], b, out[:560]), None, 1.0, 0.0, None, MODEL, CPU)
    found, want = compare_parts(ADAPTER, out, reference, CPU), compare(ADAPTER, out[:560], whole, CPU)
    assert found.ok() and want.ok()
    assert found.rel_error == pytest.approx(want.rel_error, rel=1e-6)
    assert found.worst_ratio == pytest.approx(want.worst_ratio, rel=1e-6)
    assert 0 < found.rel_error < 1e-2
    out[560:] = float("nan")  # rows in no part are not compared
    assert compare_parts(ADAPTER, out, reference, CPU).ok()


@pytest.mark.parametrize("part", [0, 1])
def test_an_element_wrong_in_one_part_is_found_and_its_part_named(part: int) -> None:
    a, b, out = _product()
    reference = _parts(a, b, out)
    row = PARTS[part].start + 7
    out[row, 5] += 4.0
    found = compare_parts(ADAPTER, out, reference, CPU)
    assert not found.ok() and found.bad == 1 and found.nonfinite == 0
    assert found.worst.startswith(f"rows {PARTS[part].start}:{PARTS[part].stop}: worst element (7, 5)")
    out[row, 5] = float("nan")  # a part left unwritten: NaN where the reference is finite
    found = compare_parts(ADAPTER, out, reference, CPU)
    assert found.nonfinite == 1 and math.isinf(found.rel_error) and not found.ok()
