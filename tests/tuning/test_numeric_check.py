"""The numeric check: an output made of parts (a grouped GEMM's groups) gets one Check for all; rows of zeros in A."""

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


def _reference_arrays(ref: object) -> dict[str, torch.Tensor]:
    return {name: getattr(ref, name) for name in ("ref", "r2", "c2", "r4", "c4")}


@pytest.mark.parametrize("batch", [1, 3])
def test_a_reference_taken_a_range_of_bs_columns_at_a_time_is_the_whole_one(
    monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    from unimatmul.tuning import numeric_check

    gen = torch.Generator().manual_seed(5)
    a = torch.randn(batch, 600, 256, generator=gen).to(torch.bfloat16)
    b = torch.randn(batch, 256, 160, generator=gen).to(torch.bfloat16)
    c0 = torch.randn(batch, 600, 160, generator=gen).to(torch.bfloat16)
    bias = torch.randn(160, generator=gen).to(torch.bfloat16)
    model = ErrorModel.for_problem(
        k=256, dtype_in="bf16", dtype_out="bf16", compute="f32", activation="gelu", ref_dtype="f32"
    )

    def reference() -> object:
        ops = Operands(a, b, torch.empty(batch, 600, 160, dtype=torch.bfloat16), bias)
        return make_reference(ADAPTER, ops, c0, 0.5, 2.0, "gelu", model, CPU)

    whole = reference()
    # 48 columns a range (the last one 16): as a weight too large for one float64 copy is taken.
    taken: list[slice] = []

    def columns(k: int, n: int, block: int) -> int:
        taken.append(slice(k, n))
        return 48

    monkeypatch.setattr(numeric_check, "b_columns", columns)
    monkeypatch.setattr(numeric_check, "a_rows", lambda m, n, k, block: 256)  # and A's rows 256 at a time
    ranged = reference()
    assert taken, "the reference did not ask for B's column ranges"
    for name, want in _reference_arrays(whole).items():
        found = _reference_arrays(ranged)[name]
        assert found is not None and want is not None, name
        torch.testing.assert_close(found, want, rtol=1e-12, atol=0.0, msg=name)
    assert ranged.sumsq == pytest.approx(whole.sumsq, rel=1e-12)
    # The check reads the same: a wrong element in the last column range is found.
    out = (a.double() @ b.double() * 0.5 + 2.0 * c0.double() + bias.double()).to(torch.bfloat16)
    out = torch.nn.functional.gelu(out.double()).to(torch.bfloat16)
    assert compare(ADAPTER, out, ranged, CPU).ok()
    out[batch - 1, 599, 150] += 4.0
    found = compare(ADAPTER, out, ranged, CPU)
    assert not found.ok() and found.bad == 1


def test_b_is_taken_whole_unless_it_is_larger_than_its_blocks() -> None:
    from unimatmul.tuning.numeric_check import INPUT_BLOCKS, a_rows, b_columns

    assert b_columns(2048, 4096, 1 << 22) == 4096
    # A 57344 x 8192 weight (Llama-3.1-70B's gate/up) in ranges of INPUT_BLOCKS blocks.
    cols = b_columns(8192, 57344, 1 << 22)
    assert cols * 8192 <= INPUT_BLOCKS * (1 << 22) and cols == INPUT_BLOCKS * (1 << 22) // 8192
    assert b_columns(1 << 30, 8, 1 << 20) == 1  # never none
    # Llama-3.1-8B's down at 4096 tokens: A's rows a range at a time too.
    rows = a_rows(4096, 4096, 14336, 1 << 22)
    assert rows * 14336 <= INPUT_BLOCKS * (1 << 22) and a_rows(16, 4096, 4096, 1 << 22) == 16


def test_rows_of_zeros_pass_the_one_pass_check_and_a_value_there_is_still_caught() -> None:
    """A row of zeros in A (the checks after timing have a band of them) has a bound of 0:
    an exact 0 there passes in one pass, with nothing to count again; anything else there
    is over the bound, counted by the full comparison."""
    from unimatmul.tuning import numeric_check

    a, b, _ = _product()
    numeric_check.structure_inputs(ADAPTER, a, b, 0, ("bf16", "bf16", "bf16"))
    zero_rows = torch.nonzero(a.abs().sum(1) == 0).flatten()
    assert len(zero_rows) > 0
    out = (a.double() @ b.double()).to(torch.bfloat16)
    reference = make_reference(ADAPTER, Operands(a, b, out), None, 1.0, 0.0, None, MODEL, CPU)
    assert not reference.host  # on the operands' device: the one-pass check applies

    def one_pass() -> object:
        launched = numeric_check.compare_launch(ADAPTER, out, reference, CPU)
        assert launched is not None
        return launched.verdict(ADAPTER.scalars(launched.scalars))

    found = one_pass()
    assert found is not None and found.ok() and found.counted
    out[zero_rows[0], 3] = 2.0**-20
    found = one_pass()
    assert found is not None and not found.ok() and not found.counted
    full = compare(ADAPTER, out, reference, CPU)
    assert full.bad == 1 and full.nonfinite == 0 and f"({int(zero_rows[0])}, 3)" in full.worst
    out[zero_rows[0], 3] = float("nan")
    assert one_pass() is None


def test_a_screen_in_wide_blocks_compares_what_it_does_not_clear_in_plain_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A large output is screened in wide blocks (a GPU's: few launches) and only the
    blocks the screen cannot clear are compared in full, in blocks of the plain size
    (whose float64 temporaries the memory plan counts): the count and the worst element
    are the same as with plain blocks throughout."""
    from unimatmul.tuning import numeric_check

    gen = torch.Generator().manual_seed(5)
    m, n, k = 2080, 2048, 16  # 4.3 Mi elements: over SCREEN_ELEMENTS, screened
    a = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(k, n, generator=gen).to(torch.bfloat16)
    out = (a.double() @ b.double()).to(torch.bfloat16)
    model = ErrorModel.for_problem(
        k=k, dtype_in="bf16", dtype_out="bf16", compute="f32", activation=None, ref_dtype="f32"
    )
    reference = make_reference(ADAPTER, Operands(a, b, out), None, 1.0, 0.0, None, model, CPU)
    out[1500, 7] += 64.0
    plain = compare(ADAPTER, out, reference, CPU)
    assert plain.bad == 1 and not plain.exact and "(1500, 7)" in plain.worst

    original = ADAPTER.block_elements
    wide, size = 1 << 20, 1 << 15

    def blocks(device: object, *, reference: bool = False, screen: bool = False, total: int = 0) -> int:
        if reference:
            return original(device, reference=True, total=total)
        return wide if screen else size

    full_blocks: list[tuple[slice, slice]] = []
    full = numeric_check._full

    def recorded(adapter: object, out3: object, ref: object, given: list[tuple[slice, slice]]) -> object:
        full_blocks.extend(given)
        return full(adapter, out3, ref, given)

    monkeypatch.setattr(ADAPTER, "block_elements", blocks)
    monkeypatch.setattr(numeric_check, "_full", recorded)
    found = compare(ADAPTER, out, reference, CPU)
    assert (found.bad, found.nonfinite, found.worst, found.exact) == (plain.bad, 0, plain.worst, False)
    # Blocks the screen cleared add their squared errors in the reference's precision:
    # other blocks, other sums, the same figure to a few per mille.
    assert found.rel_error == pytest.approx(plain.rel_error, rel=1e-2)
    # The wide block holding row 1500 (rows 1024-1535), in plain blocks of 16 rows.
    rows = [(rs.start, rs.stop) for _, rs in full_blocks]
    assert rows == [(r, r + size // n) for r in range(1024, 1536, size // n)]


@pytest.mark.parametrize(
    ("block", "n", "elements", "want"),
    [
        ((slice(0, 1), slice(0, 10)), 4, 16, [(0, 0, 4), (0, 4, 8), (0, 8, 10)]),
        ((slice(0, 3), slice(0, 2)), 4, 8, [(0, 0, 2), (1, 0, 2), (2, 0, 2)]),
        ((slice(2, 4), slice(0, 2)), 4, 8, [(2, 0, 2), (3, 0, 2)]),
        ((slice(0, 2), slice(0, 2)), 4, 64, None),  # small enough already: as it is
        ((slice(0, 1), slice(3, 5)), 100, 10, [(0, 3, 4), (0, 4, 5)]),  # one row at least
    ],
)
def test_a_block_is_split_into_rows_of_one_matrix_at_a_time(
    block: tuple[slice, slice], n: int, elements: int, want: list[tuple[int, int, int]] | None
) -> None:
    from unimatmul.tuning.numeric_check import _split

    found = _split(block, n, elements)
    if want is None:
        assert found == [block]
    else:
        assert [(bs.start, rs.start, rs.stop) for bs, rs in found] == want
        assert all(bs.stop - bs.start == 1 for bs, _ in found)


def test_a_gpu_screens_a_large_output_in_fewer_wider_blocks() -> None:
    from unimatmul.core.arrays.adapter import gpu_block_elements

    assert gpu_block_elements(False, 1 << 30) == 1 << 22  # plain blocks: one size
    assert gpu_block_elements(True, 1 << 23) == 1 << 22  # never below the plain size
    assert gpu_block_elements(True, 1 << 27) == 1 << 24  # an eighth of the output
    assert gpu_block_elements(True, 1 << 30) == 1 << 25  # at most 32 Mi elements
