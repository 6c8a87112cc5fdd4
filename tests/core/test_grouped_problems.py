"""Grouped GEMM problems: keys, buckets, torch's checks, the offs the harness draws, and
the harness's check of grouped kernels (a wrong one is rejected, before or after timing)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from grouped_cases import GroupedFake, operands, reference  # noqa: E402

from unimatmul import Problem, Target  # noqa: E402
from unimatmul.cache.record import REJECTED  # noqa: E402
from unimatmul.core._backend import DEFAULT  # noqa: E402
from unimatmul.core.arrays import CPU, Device, adapter_for_kind  # noqa: E402
from unimatmul.core.grouped import (  # noqa: E402
    DISTRIBUTIONS,
    GroupedInputError,
    GroupedOperands,
    bucket_extent,
    group_products,
    group_sizes,
    grouped_problem,
    grouped_problem_of,
    grouped_shapes,
    make_grouped_operands,
)
from unimatmul.tuning.harness import HarnessConfig  # noqa: E402
from unimatmul.tuning.tuner import Tuner  # noqa: E402

ADAPTER = adapter_for_kind("torch")
TARGET = Target(ADAPTER, CPU)


@pytest.mark.parametrize("jagged", ["m", "k", "n", "none"])
@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_grouped_keys_round_trip(jagged: str, dtype: str) -> None:
    problem = grouped_problem(8, 40, 96, 64, dtype, jagged=jagged)
    assert problem.key.endswith(f":jagged={jagged}")
    assert Problem.from_key(problem.key) == problem
    assert problem.is_grouped and not problem.is_scaled


def test_a_plain_key_is_what_it_was() -> None:
    plain = Problem.from_shape(64, 32, 16, "bf16")
    assert "jagged" not in plain.key and Problem.from_key(plain.key) == plain


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"op": "gemm", "jagged": "m"}, "belongs to op 'grouped_gemm'"),
        ({"op": "grouped_gemm", "jagged": "x"}, "jagged"),
        ({"op": "grouped_gemm", "jagged": "m", "dtype_c": "f32"}, "one dtype"),
        ({"op": "grouped_gemm", "jagged": "m", "epilogue": "bias"}, "no epilogue"),
    ],
)
def test_grouped_fields_are_checked(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Problem(
            **{
                "m": 16,
                "n": 16,
                "k": 16,
                "dtype_a": "bf16",
                "dtype_b": "bf16",
                "dtype_c": "bf16",
                "batch": 2,
                **changes,
            }
        )


def test_the_output_shape_of_each_form_and_ranks_of_none() -> None:
    assert grouped_shapes((40, 32), (4, 32, 16), 4) == ("m", (40, 16))
    assert grouped_shapes((24, 40), (40, 16), 4) == ("k", (4, 24, 16))
    assert grouped_shapes((4, 24, 32), (32, 40), 4) == ("n", (24, 40))
    assert grouped_shapes((4, 24, 32), (4, 32, 16), 0) == ("none", (4, 24, 16))
    with pytest.raises(GroupedInputError, match=r"2 or 3d, got shapes \(32,\) and \(4, 32, 16\)"):
        grouped_shapes((32,), (4, 32, 16), 4)


def test_buckets_are_the_next_power_of_two() -> None:
    assert [bucket_extent(x) for x in (1, 2, 3, 4, 5, 16, 17, 1000, 1024, 1025)] == [
        1, 2, 4, 4, 8, 16, 32, 1024, 1024, 2048,
    ]  # fmt: skip


def _moe_call(rows: int, sizes: list[int]) -> tuple[Any, Any, Any]:
    x = torch.randn(rows, 64).to(torch.bfloat16)
    w = torch.randn(len(sizes), 128, 64).to(torch.bfloat16)
    offs = torch.tensor(np.cumsum(sizes), dtype=torch.int32)
    return x, w.transpose(-2, -1), offs


def test_calls_of_one_bucket_have_one_problem_whatever_their_offs() -> None:
    keys = {
        grouped_problem_of(ADAPTER, *_moe_call(rows, sizes)).key
        for rows, sizes in (
            (33, [33, 0, 0, 0]),
            (40, [10, 10, 10, 10]),
            (64, [1, 2, 3, 58]),
            (64, [0, 0, 0, 64]),
        )
    }
    assert len(keys) == 1
    (key,) = keys
    assert Problem.from_key(key).m == 64
    assert grouped_problem_of(ADAPTER, *_moe_call(65, [65, 0, 0, 0])).m == 128


def test_the_problem_of_a_call_describes_its_layout() -> None:
    problem = grouped_problem_of(ADAPTER, *_moe_call(24, [8, 8, 4, 4]))
    assert (problem.jagged, problem.batch, problem.m, problem.n, problem.k) == ("m", 4, 32, 128, 64)
    assert problem.trans_b and not problem.trans_a and problem.stride_b == 128 * 64
    assert problem == grouped_problem(4, 24, 128, 64)  # what the helper says an MoE layer calls
    wgrad = grouped_problem_of(
        ADAPTER, torch.randn(48, 24).to(torch.bfloat16).t(), torch.randn(48, 32).to(torch.bfloat16),
        torch.tensor([8, 40, 48], dtype=torch.int32),
    )  # fmt: skip
    assert (wgrad.jagged, wgrad.batch, wgrad.m, wgrad.k, wgrad.trans_a, wgrad.lda) == (
        "k",
        3,
        24,
        64,
        True,
        24,
    )


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("device", [CPU, Device("cuda", 0)])
def test_the_harness_offs_cover_the_edges(distribution: str, device: Device) -> None:
    rng = np.random.default_rng(1)
    for jagged in ("m", "k", "n"):
        problem = grouped_problem(8, 64, 64, 64, "bf16", jagged=jagged)
        for _ in range(20):
            sizes = group_sizes(problem, distribution, rng, device)
            assert len(sizes) == 8 and min(sizes) >= 0
            if distribution == "tail":
                assert sum(sizes) < 64
            else:
                assert sum(sizes) == 64
            if distribution == "one":
                assert sorted(sizes)[-2:] == [0, 64]
            if distribution in ("skewed", "tail"):
                assert 0 in sizes
            if device.kind != "cpu" and jagged in ("k", "n"):
                assert all(s % 8 == 0 for s in sizes)  # 16-byte group starts on a GPU
    if distribution == "tail":
        odd = group_sizes(grouped_problem(8, 64, 64, 64, "bf16"), "tail", np.random.default_rng(3), CPU)
        assert any(s % 2 for s in np.cumsum(odd))  # a group starts at an odd row


def test_operands_are_never_zero_and_offs_are_int32() -> None:
    problem = grouped_problem(4, 32, 48, 64, "bf16")
    ops = make_grouped_operands(problem, ADAPTER, CPU, np.random.default_rng(0))
    assert ops.offs.dtype == torch.int32 and int(ops.offs[-1]) == 32
    assert ops.a.shape == (32, 64) and ops.b.shape == (4, 64, 48) and ops.out.shape == (32, 48)
    assert ops.b.stride() == (64 * 48, 1, 64)  # w.t() of [4, 48, 64] weights
    assert bool((ops.a != 0).any()) and bool((ops.b != 0).any())


@pytest.mark.parametrize("jagged", ["m", "k", "n", "none"])
@pytest.mark.parametrize("sizes", [[5, 0, 9, 2], [0, 16, 0, 0], [3, 0, 0, 0]], ids=["skewed", "one", "tail"])
def test_group_products_are_views_whose_products_are_the_groups_parts(jagged: str, sizes: list[int]) -> None:
    # "tail": 13 of the 16 rows (columns, k) past offs[-1] belong to no group.
    a, b, offs = operands(jagged, sizes, "bf16", extent=16)
    out = torch._grouped_mm(a, b, offs)
    want = reference(jagged, a, b, offs)
    products = group_products(GroupedOperands(a, b, out, None, offs, jagged))
    covered = torch.zeros(want.shape, dtype=torch.bool)
    for p in products:
        mine = {x.untyped_storage().data_ptr() for x in (p.a, p.b)}
        assert mine == {x.untyped_storage().data_ptr() for x in (a, b)}  # views, never copies
        part = p.a.double() @ p.b.double()
        torch.testing.assert_close(part, p.view(want), rtol=0, atol=1e-9)
        torch.testing.assert_close(p.view(out).double(), part, rtol=2e-2, atol=2e-2)
        p.view(covered).fill_(True)
    # every element a group gives is in one product, and nothing past offs[-1] is
    assert bool((covered == ~torch.isnan(want)).all())
    if jagged == "k":  # every group, empty ones too: their output must be zeros
        assert [p.group for p in products] == list(range(len(sizes)))
    elif jagged != "none":
        assert [p.group for p in products] == [g for g, s in enumerate(sizes) if s]


@pytest.mark.parametrize(("behaviour", "when"), [("skips_empty", "checked"), ("short_tiles", "after timing")])
def test_a_grouped_kernel_wrong_for_some_offs_is_rejected(
    isolated: Any, registered: Any, behaviour: str, when: str
) -> None:
    fake = GroupedFake(behaviour)
    problem = grouped_problem(8, 64, 32, 64, "bf16")
    # No pruning: a slow wrong kernel must still be caught by the check after timing.
    settings = HarnessConfig(prune_ratio=math.inf, first_prune_ratio=math.inf, budget_s=0.02, settle_s=0.0)
    with registered(isolated.plugins, fake):
        record = Tuner(plugins=isolated.plugins, settings=settings).tune(problem, TARGET)
    result = record.result(f"{fake.name}/kernel")
    assert result is not None and result.status == REJECTED, result
    # Default, or a right kernel of another backend (oneDNN's loops on the m form)
    assert record.winner == DEFAULT.identity or record.winner.startswith("onednn/loop:")
    if when == "after timing":  # right on the timed distributions; one group holding all rows is not
        assert "after timing" in result.note or "new inputs" in result.note, result.note


def test_a_right_grouped_kernel_passes_every_check(isolated: Any, registered: Any) -> None:
    fake = GroupedFake("correct")
    with registered(isolated.plugins, fake):
        record = Tuner(plugins=isolated.plugins).tune(grouped_problem(8, 64, 32, 64, "bf16"), TARGET)
    result = record.result(f"{fake.name}/kernel")
    assert result is not None and result.status != REJECTED and result.error is not None
    assert fake.calls >= 4  # two checks before timing, one after, and the timing itself


def test_a_backend_that_names_no_grouped_op_is_never_asked(isolated: Any, fake_backend: Any) -> None:
    fake = fake_backend("fake-dense")
    record = Tuner(plugins=isolated.plugins).tune(grouped_problem(4, 32, 32, 32, "f32"), TARGET)
    assert record.result("fake-dense/correct") is None and fake.calls == 0
