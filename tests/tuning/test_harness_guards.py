"""The harness guards ``out`` and checks on inputs of several characters.

A kernel that writes outside its output's elements (into the row padding of a padded
``out``, or just past its end) overwrote the user's memory when it won: every check run
now poisons guard bands before and after the output and every row's padding, and any
write there rejects the candidate, saying where. A kernel right on random inputs but
NaN on others (here: a row of zeros) was chosen, and a later call returned NaN: the
checks after timing now run on inputs of several characters (ones, small integers,
mixed magnitudes, blocks of zeros beside normal values).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from harness_fakes import (
    CostClock,
    CostTimer,
    FakeKernel,
    KernelBackend,
    fake_target,
    measure_kernels,
    right,
    row_scaled,
    whole_rows,
    writes_past_the_end,
    writes_row_padding,
)

import unimatmul
from unimatmul.backend import DEFAULT, Candidate
from unimatmul.cache.record import OK, REJECTED, TuningRecord
from unimatmul.core.arrays import CPU, adapter_for_kind, make_operands
from unimatmul.core.problem import Problem
from unimatmul.testing import fast_config
from unimatmul.tuning.harness import Harness, _error_model, _worse
from unimatmul.tuning.numeric_check import A_CHARACTERS, Check, compare, make_reference, structure_inputs

KINDS = ["numpy", "torch"]
UNPRUNED = {"prune_ratio": math.inf, "first_prune_ratio": math.inf}  # nothing escapes the checks by noise


def _result(record: TuningRecord, name: str) -> Any:
    found = record.result(f"fake/{name}")
    assert found is not None
    return found


def _inputs(kind: str, m: int, k: int, n: int, seed: int) -> tuple[Any, Any]:
    """Standard-normal float32 A (m x k) and B (k x n), as NumPy arrays or torch tensors."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    if kind == "torch":
        torch = pytest.importorskip("torch")
        return torch.from_numpy(a), torch.from_numpy(b)
    return a, b


def _padded(kind: str, m: int, n: int, ld: int) -> tuple[Any, Any]:
    """(out, the buffer it is a view of): rows of ``ld`` elements, ``n`` of them used, the
    padding holding 7.0."""
    if kind == "torch":
        torch = pytest.importorskip("torch")
        buffer = torch.full((m, ld), 7.0)
    else:
        buffer = np.full((m, ld), 7.0, np.float32)
    return buffer[:, :n], buffer


# --- item 4: writes outside the output --------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_kernel_that_writes_its_rows_padding_is_rejected_and_the_users_padding_kept(
    isolated: Any, backends: Any, kind: str
) -> None:
    # The case: n = 256 in rows of 260 elements (1040 bytes), tuned for real.
    backends(KernelBackend("tile", {"wide": writes_row_padding}))
    a, b = _inputs(kind, 64, 96, 256, seed=4)
    out, buffer = _padded(kind, 64, 256, 260)
    with unimatmul.mode("tune"):
        for _ in range(3):
            unimatmul.matmul(a, b, out=out)
    (_, _, record), *_ = list(isolated.selector.store.items())
    wide = record.result("tile/wide")
    assert wide is not None and wide.status == REJECTED, wide
    assert "outside the output" in wide.note and "padding of row 0, at column 256" in wide.note, wide.note
    assert record.winner != "tile/wide"
    padding = np.asarray(buffer[:, 256:])
    assert (padding == 7.0).all()  # the user's padding, untouched by every call
    expected = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("value", [0.0, math.nan, -3.5], ids=["zero", "nan", "the-finite-poison"])
@pytest.mark.parametrize("interleave", [False, True], ids=["blocks", "rounds"])
def test_writes_of_either_poison_value_are_seen(value: float, interleave: bool) -> None:
    # The guard holds NaN on one check call and -3.5 on the other: a kernel that writes
    # one of them is caught by the other (in rounds: the check before timing, or the one
    # on new inputs after the first round, read back with the other candidates').
    def writes(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
        k.right(a, b, out, alpha, beta, bias)
        whole_rows(out)[..., out.shape[-1] :] = value

    problem = replace(Problem.from_shape(40, 24, 32), ldc=30)
    record = measure_kernels(
        problem, "numpy", {"pad": writes, "good": right}, interleave=interleave, **UNPRUNED
    )
    pad = _result(record, "pad")
    assert pad.status == REJECTED and "240 element(s) outside the output" in pad.note, pad.note
    assert _result(record, "good").status == OK


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("interleave", [False, True], ids=["blocks", "rounds"])
def test_a_write_just_past_the_end_is_rejected(kind: str, batch: int, interleave: bool) -> None:
    record = measure_kernels(
        Problem.from_shape(33, 17, 20, batch=batch),
        kind,
        {"over": writes_past_the_end, "good": right},
        interleave=interleave,
        **UNPRUNED,
    )
    over = _result(record, "over")
    assert over.status == REJECTED, over
    assert "1 element(s) outside the output (the first at 1 element(s) after the output's last)" in over.note
    assert _result(record, "good").status == OK
    assert record.result(DEFAULT.identity).status == OK


@pytest.mark.parametrize("kind", KINDS)
def test_batched_padded_outputs_guard_the_gaps_between_matrices(kind: str) -> None:
    # Rows of 20 for n = 16, and 8 spare elements after each matrix of the batch.
    problem = replace(Problem.from_shape(12, 16, 8, batch=3), ldc=20, stride_c=12 * 20 + 8)
    record = measure_kernels(problem, kind, {"pad": writes_row_padding, "good": right}, **UNPRUNED)
    pad = _result(record, "pad")
    assert pad.status == REJECTED and "outside the output" in pad.note, pad.note
    assert _result(record, "good").status == OK


# --- item 6: wrong on some inputs only -------------------------------------------------------


def test_a_kernel_nan_on_a_row_of_zeros_is_rejected_even_when_it_is_the_fastest() -> None:
    # Right on the random inputs of the first checks; its scripted times make it the
    # clear winner. Only the inputs with a block of zero rows show it.
    clock = CostClock()

    def costed(behave: Any, cost: float) -> Any:
        def run(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
            behave(k, a, b, out, alpha, beta, bias)
            clock.current = cost

        return run

    problem = Problem.from_shape(60, 48, 40)
    target = fake_target("numpy")
    backend = KernelBackend("fake", {"default": costed(right, 1.0), "scaled": costed(row_scaled, 0.2)})
    backend.kernels["good"] = costed(right, 0.5)
    entries = [(DEFAULT, lambda: backend.prepare(problem, Candidate.make("fake", "default"), target))]
    entries += [
        (
            Candidate.make("fake", name),
            lambda n=name: backend.prepare(problem, Candidate.make("fake", n), target),
        )
        for name in ("scaled", "good")
    ]
    record = Harness(CostTimer(clock), fast_config()).measure(problem, target, entries)
    scaled = _result(record, "scaled")
    assert scaled.status == REJECTED and "NaN/inf" in scaled.note, scaled.note
    assert scaled.note.startswith("wrong after timing, on new inputs")
    assert record.winner == "fake/good"


@pytest.mark.parametrize("kind", KINDS)
def test_the_api_never_serves_a_kernel_nan_on_some_inputs(isolated: Any, backends: Any, kind: str) -> None:
    backends(KernelBackend("quant", {"rows": row_scaled}))
    # It is slower than Default (it divides first): unpruned, it reaches the later checks.
    isolated.selector.settings.prune_ratio = isolated.selector.settings.first_prune_ratio = math.inf
    a, b = _inputs(kind, 80, 64, 72, seed=8)
    with unimatmul.mode("tune"):
        unimatmul.matmul(a, b)
    (_, _, record), *_ = list(isolated.selector.store.items())
    rows = record.result("quant/rows")
    assert rows is not None and rows.status == REJECTED and "NaN/inf" in rows.note, rows
    a[10:20] = 0.0  # a block of zero rows: what made it NaN
    got = np.asarray(unimatmul.matmul(a, b))
    assert np.isfinite(got).all()
    np.testing.assert_allclose(
        got, np.asarray(a, np.float64) @ np.asarray(b, np.float64), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize(
    ("kind", "dtype", "epilogue", "beta"),
    [
        ("numpy", "f32", "none", 0.0),
        ("numpy", "f64", "bias_relu", 1.0),
        ("torch", "f32", "relu", 0.5),
        ("torch", "bf16", "none", 0.0),
        ("torch", "f16", "bias_gelu", 0.0),
        ("torch", "bf16", "bias_gelu_tanh", 1.0),
    ],
)
@pytest.mark.parametrize("m", [64, 3])
def test_defaults_pass_the_structured_inputs_and_one_wrong_element_does_not(
    kind: str, dtype: str, epilogue: str, beta: float, m: int
) -> None:
    # Default is what the caller has without tuning: it must pass on every character of
    # input, in every dtype, while one element off is still caught there.
    adapter = fake_target(kind).adapter
    problem = Problem.from_shape(m, 96, 700, dtype=dtype, epilogue=epilogue)
    if beta:
        problem = Problem(**{**problem.__dict__, "beta_zero": False})
    for variant in range(2):
        ops = make_operands(problem, adapter, CPU, np.random.default_rng(4 + variant))
        structure_inputs(adapter, ops.a, ops.b, variant, (dtype, dtype, dtype))
        c0 = adapter.empty(tuple(ops.out.shape), dtype, CPU)
        adapter.copy_(c0, ops.out)
        model = _error_model(problem)  # the bound the harness holds every candidate to
        reference = make_reference(adapter, ops, c0, 1.0, beta, problem.activation, model, CPU)
        adapter.matmul(ops.a, ops.b, ops.out, 1.0, beta, ops.bias, problem.activation)
        check = compare(adapter, ops.out, reference, CPU)
        assert check.ok(), (variant, check)
        ops.out[m - 1, 5] += 100.0 * (abs(float(ops.out[m - 1, 5])) + 1.0)  # far out in any dtype
        assert not compare(adapter, ops.out, reference, CPU).ok()


@pytest.mark.parametrize("m", [50, 2])
def test_structured_inputs_have_every_character_and_are_never_all_zeros(m: int) -> None:
    adapter = adapter_for_kind("numpy")
    problem = Problem.from_shape(m, 30, 40)
    ops = make_operands(problem, adapter, CPU, np.random.default_rng(1))
    structure_inputs(adapter, ops.a, ops.b, 0, ("f32", "f32", "f32"))
    a, b = np.asarray(ops.a), np.asarray(ops.b)
    bands = np.array_split(a, len(A_CHARACTERS), axis=0 if m >= len(A_CHARACTERS) else 1)
    found = dict(zip(A_CHARACTERS, bands, strict=True))
    assert (found["ones"] == 1.0).all() and (found["zeros"] == 0.0).all()
    integers = found["integers"]
    assert (
        (integers == np.round(integers)).all()
        and np.abs(integers).max() <= 4
        and len(np.unique(integers)) > 3
    )
    magnitudes = np.abs(found["magnitudes"][found["magnitudes"] != 0])
    assert magnitudes.max() / magnitudes.min() > 2.0**20
    assert (found["normal"] != np.round(found["normal"])).any()
    assert (np.abs(b).sum(axis=0) > 0).all()  # no zero column in B (the screen's norms)
    assert (a != 0).any()
    ops2 = make_operands(problem, adapter, CPU, np.random.default_rng(1))
    structure_inputs(adapter, ops2.a, ops2.b, 1, ("f32", "f32", "f32"))
    assert (np.asarray(ops2.a) != a).any()  # another variant: other values in the same bands


@pytest.mark.parametrize("ldc", [30, 31, 2000])
def test_guarded_outputs_keep_the_alignment_the_problem_says(ldc: int) -> None:
    # Rows of 120, 124 or 8000 bytes: the bands before the output are whole 256-byte
    # units, so a kernel sees the same pointer alignment as the caller's output had.
    seen: list[int] = []

    def notes(k: FakeKernel, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
        seen.append(k.adapter.ptr(out) % 16)
        k.right(a, b, out, alpha, beta, bias)

    record = measure_kernels(replace(Problem.from_shape(9, 24, 16), ldc=ldc), "numpy", {"notes": notes})
    assert _result(record, "notes").status in (OK, "pruned")
    assert seen and set(seen) == {0}


def test_a_write_seen_by_one_check_call_only_still_rejects() -> None:
    # Right values on both calls; the writes show only on the call whose poison differs
    # from what the kernel writes: the record keeps them whichever call looked worse.
    seen = Check(1e-7, 0.01, 0, 0, outside=3, outside_where="the first at 1 element(s) before the output")
    clean = Check(2e-7, 0.02, 0, 0)
    for a, b in ((seen, clean), (clean, seen)):
        merged = _worse(a, b)
        assert not merged.ok() and merged.outside == 3 and merged.worst_ratio == 0.02
        assert merged.describe().startswith("wrote 3 element(s) outside the output (the first at 1")
