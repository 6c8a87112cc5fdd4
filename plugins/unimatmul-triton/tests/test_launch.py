"""A launch plan's specialisation (``LaunchPlan.key``): what of a shape makes a new binary.

Two products whose plans have one key share one compile (``compiler.Compiler`` keeps one
future per key); these tests pin down which shape properties split the key (Triton's own
specialisation: 1, multiples of 16, pointer alignment, i64, EVEN_K) and which do not.
Pure Python: nothing here compiles or runs a kernel.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

from test_triton_backend import problem_of
from unimatmul_triton.configs import GEMV, PERSISTENT, SKINNY, TILE, KernelConfig
from unimatmul_triton.launch import plan_for

TILE_CONFIG = KernelConfig(TILE, 64, 64, 32, 4, 3, group_m=8)


def key(m: int, n: int, k: int, config: KernelConfig = TILE_CONFIG, **options: Any) -> tuple[object, ...]:
    return plan_for(problem_of(m, n, k, **options), config).key()


def test_shapes_of_one_alignment_class_share_a_specialisation() -> None:
    # Sizes and leading dimensions all multiples of 16, k a multiple of block_k: one binary.
    assert key(64, 128, 256) == key(4096, 14336, 4096) == key(48, 4096, 96)
    linear = KernelConfig(SKINNY, 16, 64, 128, 4, 3)
    assert key(16, 4096, 4096, linear, linear=True) == key(16, 128256, 4096, linear, linear=True)
    persistent = KernelConfig(PERSISTENT, 128, 128, 64, 4, 4, group_m=8)
    assert key(128, 256, 512, persistent) == key(1024, 2048, 4096, persistent)


@pytest.mark.parametrize(
    ("label", "other"),
    [
        ("pointers below 16 bytes", {"align": 2}),
        ("leading dimensions not multiples of 16", {"pad": 8}),
        ("A transposed", {"trans_a": True}),
        ("batched", {"batch": 2}),
        ("beta != 0", {"beta_zero": False}),
        ("an epilogue", {"epilogue": "bias_relu"}),
        ("an f32 output", {"dtype_c": "f32"}),
        ("f16", {"dtype": "f16"}),
    ],
)
def test_what_splits_the_specialisation(label: str, other: dict[str, Any]) -> None:
    assert key(64, 128, 256) != key(64, 128, 256, **other), label


def test_sizes_split_it_only_at_1_16_and_k_blocks() -> None:
    assert key(64, 128, 256) != key(65, 128, 256)  # m no longer a multiple of 16
    assert key(65, 128, 256) == key(67, 128, 256)  # neither is
    assert key(64, 128, 256) != key(64, 128, 272)  # 272 is no multiple of block_k (32): EVEN_K
    gemv = KernelConfig(GEMV, 1, 64, 256, 4, 1)
    assert key(1, 4096, 4096, gemv, linear=True) != key(2, 4096, 4096, KernelConfig(GEMV, 2, 64, 256, 4, 1))


def test_sizes_past_2_31_are_i64() -> None:
    small = plan_for(problem_of(16, 4096, 4096, linear=True), KernelConfig(SKINNY, 16, 64, 128, 4, 3))
    wide = plan_for(problem_of(16, 64, 2**31, linear=True), KernelConfig(SKINNY, 16, 64, 128, 4, 3))
    assert small.key() != wide.key()
    assert small.signature()["K"] == "i32" and wide.signature()["K"] == "i64"


def test_the_launcher_is_shared_more_widely_than_the_binary() -> None:
    """A launcher depends on the kinds of the arguments only: another config, another
    alignment or another dtype keep it; a split (the workspace pointers) changes it."""
    base = plan_for(problem_of(64, 128, 256), TILE_CONFIG)
    for other in (
        plan_for(problem_of(64, 128, 256), KernelConfig(TILE, 128, 128, 64, 8, 3, group_m=8)),
        plan_for(problem_of(64, 128, 256, align=2), TILE_CONFIG),
        plan_for(problem_of(64, 128, 256, dtype="f16"), TILE_CONFIG),
    ):
        assert other.key() != base.key()
        assert other.launcher_key() == base.launcher_key()
    split = plan_for(problem_of(64, 128, 256), KernelConfig(TILE, 64, 64, 32, 4, 3, split_k=2, group_m=8))
    assert split.launcher_key() != base.launcher_key()
