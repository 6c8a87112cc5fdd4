"""The numeric check: element by element, on every call it makes, before and after timing.

A kernel right but for one element off by +1.0 passes a whole-matrix relative error at
1024^3; a kernel right on its first call and wrong after passes a check made once. Each test here
fails against the old check.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from harness_fakes import (
    CostClock,
    CostTimer,
    KernelBackend,
    LaunchCostTimer,
    fake_target,
    first_call_only,
    measure_kernels,
    memo_by_pointer,
    one_inf,
    one_nan,
    one_off,
    right,
    stale,
)

import unimatmul
from unimatmul.backend import DEFAULT, Candidate, Runner
from unimatmul.cache.record import OK, PRUNED, REJECTED, TuningRecord
from unimatmul.core.arrays import CPU, adapter_for_kind, make_operands
from unimatmul.core.dtypes import ErrorModel
from unimatmul.core.problem import Problem
from unimatmul.core.runners import DefaultRunner
from unimatmul.testing import fast_config, registered
from unimatmul.tuning import numeric_check
from unimatmul.tuning.harness import MAX_WIDEN, CpuTimer, Harness
from unimatmul.tuning.numeric_check import compare, make_reference

KINDS = ["numpy", "torch"]


def _result(record: TuningRecord, name: str) -> Any:
    found = record.result(f"fake/{name}")
    assert found is not None
    return found


# --- item 6: one wrong element ------------------------------------------------------------


def test_one_element_off_by_one_at_1024_cubed_is_rejected() -> None:
    # The case: the whole-matrix relative error of this output is ~3e-5, under
    # f32's 1e-4, so the old check passed it in 4 of 4 runs.
    record = measure_kernels(Problem.from_shape(1024, 1024, 1024), "numpy", {"off": one_off}, max_sets=1)
    result = _result(record, "off")
    assert result.error < 1e-4  # what the old check looked at: it would have passed
    assert result.status == REJECTED
    assert "1 element(s) over the error bound" in result.note and "worst element (0, 0)" in result.note
    assert record.winner != "fake/off"
    assert record.result(DEFAULT.identity).status == OK


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("behave", "says"), [(one_off, "over the error bound"), (one_nan, "NaN/inf"), (one_inf, "NaN/inf")]
)
@pytest.mark.parametrize("interleave", [False, True], ids=["blocks", "rounds"])
def test_one_wrong_element_is_rejected(kind: str, behave: Any, says: str, interleave: bool) -> None:
    # In rounds the checks of all candidates are read back at once; the one the quick pass
    # cannot clear is compared whole, on its own, for the note's worst element.
    record = measure_kernels(
        Problem.from_shape(96, 80, 200, batch=3),
        kind,
        {"bad": behave, "good": right},
        prune_ratio=math.inf,  # "good" is Default's kernel: on a busy machine noise could prune it
        first_prune_ratio=math.inf,
        interleave=interleave,
    )
    bad, good = _result(record, "bad"), _result(record, "good")
    assert bad.status == REJECTED and says in bad.note, bad
    assert "worst element" in bad.note
    assert good.status == OK
    assert record.winner != "fake/bad"


def test_the_bound_has_headroom_for_right_kernels_and_none_for_one_wrong_element() -> None:
    adapter = adapter_for_kind("numpy")
    problem = Problem.from_shape(1024, 1024, 1024)
    ops = make_operands(problem, adapter, CPU, np.random.default_rng(3))
    model = ErrorModel.for_problem(
        k=1024, dtype_in="f32", dtype_out="f32", compute="f32", activation=None, ref_dtype="f32"
    )
    reference = make_reference(adapter, ops, None, 1.0, 0.0, None, model, CPU)
    np.matmul(ops.a, ops.b, out=ops.out)
    right_check = compare(adapter, ops.out, reference, CPU)
    assert right_check.ok() and right_check.worst_ratio < 0.05  # 20x headroom for numpy's own f32
    ops.out[511, 7] += 1.0
    wrong = compare(adapter, ops.out, reference, CPU)
    assert not wrong.ok() and wrong.bad == 1 and wrong.worst_ratio > 50
    assert "(511, 7)" in wrong.worst


@pytest.mark.parametrize("kind", KINDS)
def test_kept_bounds_give_the_same_check_and_still_catch_one_element(kind: str) -> None:
    # A tuning run keeps each block's bound with its reference (the one-pass check of
    # numeric_check._within): a right output gets the worst ratio the full pass finds,
    # and an output with one wrong element or one NaN is still counted exactly.
    target = fake_target(kind)
    adapter = target.adapter
    problem = Problem.from_shape(300, 520, 700)  # above HOST_CHECK_ELEMENTS: on the array's device
    ops = make_operands(problem, adapter, CPU, np.random.default_rng(8))
    model = ErrorModel.for_problem(
        k=700, dtype_in="f32", dtype_out="f32", compute="f32", activation=None, ref_dtype="f32"
    )
    reference = make_reference(adapter, ops, None, 1.0, 0.0, None, model, CPU)
    reference.keep_bounds = True
    adapter.matmul(ops.a, ops.b, ops.out, 1.0, 0.0, None, None)
    first = compare(adapter, ops.out, reference, CPU)
    assert reference.bounds is not None  # kept by the first check
    again = compare(adapter, ops.out, reference, CPU)
    plain = make_reference(adapter, ops, None, 1.0, 0.0, None, model, CPU)
    full = numeric_check._full(
        adapter, ops.out[None], plain, [(slice(0, 1), slice(0, 300))]
    )  # the pass that counts
    assert first.ok() and first.exact and first.bad == first.nonfinite == 0
    assert again.worst_ratio == first.worst_ratio
    assert first.worst_ratio == pytest.approx(full[3][0], rel=1e-5)
    assert first.rel_error == pytest.approx(math.sqrt(full[0][0] / plain.sumsq), rel=1e-4)
    ops.out[123, 45] += 1.0
    wrong = compare(adapter, ops.out, reference, CPU)
    assert wrong.bad == 1 and wrong.nonfinite == 0 and "(123, 45)" in wrong.worst
    ops.out[7, 9] = float("nan")
    wrong = compare(adapter, ops.out, reference, CPU)
    assert wrong.bad == 2 and wrong.nonfinite == 1 and not wrong.ok(MAX_WIDEN)


def test_the_tuning_plan_keeps_bounds_for_small_outputs_only() -> None:
    harness = Harness(CpuTimer(), fast_config())
    target = fake_target("numpy")
    assert harness.plan_memory(Problem.from_shape(300, 520, 700), target, 0.0).keep_bounds
    # Above SCREEN_ELEMENTS the output is screened: no bounds are kept.
    assert not harness.plan_memory(Problem.from_shape(2100, 2048, 4), target, 0.0).keep_bounds


@pytest.mark.parametrize("kind", KINDS)
def test_a_large_output_is_screened_and_still_catches_one_element(kind: str) -> None:
    # Above SCREEN_ELEMENTS a cheap screen clears most blocks; a block with one wrong
    # element gets the whole bound, so the element is found all the same.
    target = fake_target(kind)
    adapter = target.adapter
    problem = Problem.from_shape(2100, 2048, 4)  # 4.3 M elements > SCREEN_ELEMENTS
    ops = make_operands(problem, adapter, CPU, np.random.default_rng(6))
    model = ErrorModel.for_problem(
        k=4, dtype_in="f32", dtype_out="f32", compute="f32", activation=None, ref_dtype="f32"
    )
    reference = make_reference(adapter, ops, None, 1.0, 0.0, None, model, CPU)
    adapter.matmul(ops.a, ops.b, ops.out, 1.0, 0.0, None, None)
    right_check = compare(adapter, ops.out, reference, CPU)
    assert right_check.ok() and not right_check.exact
    exact = compare(adapter, ops.out, reference, CPU, exact=True)
    assert right_check.rel_error == pytest.approx(exact.rel_error, rel=0.01)  # sums of squares in f32
    ops.out[1500, 1000] += 1.0
    wrong = compare(adapter, ops.out, reference, CPU)
    assert wrong.bad == 1 and "(1500, 1000)" in wrong.worst
    ops.out[7, 9] = float("nan")
    assert compare(adapter, ops.out, reference, CPU).nonfinite == 1


@pytest.mark.parametrize(
    ("dtype", "epilogue", "beta"),
    [("bf16", "none", 0.0), ("f16", "bias_gelu", 0.0), ("bf16", "bias_gelu_tanh", 1.0), ("f32", "relu", 0.5)],
)
def test_torch_defaults_pass_their_bound_in_every_dtype(dtype: str, epilogue: str, beta: float) -> None:
    # Default (torch's own kernels, which round the bias and activation steps to the
    # output dtype one by one) must pass: it is what the user has without tuning.
    torch = pytest.importorskip("torch")
    adapter = adapter_for_kind("torch")
    problem = Problem.from_shape(64, 96, 700, dtype=dtype, epilogue=epilogue)
    if beta:
        problem = Problem(**{**problem.__dict__, "beta_zero": False})
    ops = make_operands(problem, adapter, CPU, np.random.default_rng(4))
    c0 = ops.out.clone()
    model = ErrorModel.for_problem(
        k=problem.k,
        dtype_in=dtype,
        dtype_out=dtype,
        compute=problem.compute,
        activation=problem.activation,
        ref_dtype="f32",
    )
    reference = make_reference(adapter, ops, c0, 1.0, beta, problem.activation, model, CPU)
    adapter.matmul(ops.a, ops.b, ops.out, 1.0, beta, ops.bias, problem.activation)
    check = compare(adapter, ops.out, reference, CPU)
    assert check.ok(), check
    ops.out[0, 0] = torch.nan
    assert not compare(adapter, ops.out, reference, CPU).ok()


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("splits", [8, 32])
def test_split_k_kernels_that_keep_partial_sums_in_the_output_dtype_pass(dtype: str, splits: int) -> None:
    # cuBLASLt's split-K reductions may keep partial sums (even the running sum) in a
    # 16-bit output dtype: a right kernel, which the bound must let through, while one
    # element of the wrong sign is still caught.
    pytest.importorskip("torch")
    adapter = adapter_for_kind("torch")
    problem = Problem.from_shape(128, 128, 4096, dtype=dtype)
    ops = make_operands(problem, adapter, CPU, np.random.default_rng(5))
    model = ErrorModel.for_problem(
        k=4096, dtype_in=dtype, dtype_out=dtype, compute="f32", activation=None, ref_dtype="f32"
    )
    reference = make_reference(adapter, ops, None, 1.0, 0.0, None, model, CPU)
    a, b, step = ops.a.float(), ops.b.float(), 4096 // splits
    running = None
    for s in range(splits):
        part = (a[:, s * step : (s + 1) * step] @ b[s * step : (s + 1) * step]).to(ops.out.dtype)
        running = part if running is None else (running.float() + part.float()).to(ops.out.dtype)
    ops.out.copy_(running)
    assert compare(adapter, ops.out, reference, CPU).ok()
    flat = ops.out.view(-1)
    flat[int(flat.float().abs().argmax())] *= -1
    assert not compare(adapter, ops.out, reference, CPU).ok()


def test_tf32_products_get_an_input_rounding_term() -> None:
    f32 = ErrorModel.for_problem(k=4096, dtype_in="f32", dtype_out="f32", compute="f32", activation=None)
    tf32 = ErrorModel.for_problem(k=4096, dtype_in="f32", dtype_out="f32", compute="tf32", activation=None)
    bf16 = ErrorModel.for_problem(k=4096, dtype_in="bf16", dtype_out="bf16", compute="f32", activation=None)
    assert f32.inputs == 0  # products of f32 inputs are exact (FMA) and the sums are f32
    # bf16 products are exact, but partial sums may be kept in bf16 (split-K reductions)
    assert bf16.inputs == 2 * 4 * 2.0**-8
    assert tf32.inputs == 2 * 4 * 2.0**-11  # 2 lam u_tf32
    assert tf32.u_acc == f32.u_acc == 2.0**-24  # tensor cores sum tf32 products in f32
    assert f32.sqrt_k_acc == pytest.approx((4 * math.sqrt(4096) + 16) * (2.0**-24 + 2.0**-53))


def test_a_sloppy_default_widens_the_bound_for_everyone_but_a_wrong_element_still_fails() -> None:
    # If Default itself is further from float64 than the model allows, the model is too
    # strict on this platform: candidates as accurate as Default must not be rejected.
    torch = pytest.importorskip("torch")
    target = fake_target("torch")
    problem = Problem.from_shape(64, 64, 256)

    def sloppy(k: Any, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
        # f32 in, f32 out, but the products of inputs rounded to f16's 10-bit mantissa
        # (~15x the f32 bound: within MAX_WIDEN; bf16's ~115x is not, and is rejected).
        out.copy_(a.to(torch.float16).float() @ b.to(torch.float16).float())

    def sloppy_and_one_off(k: Any, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
        sloppy(k, a, b, out, alpha, beta, bias)
        out[0, 0] += 1.0

    backend = KernelBackend("fake", {"same": sloppy, "off": sloppy_and_one_off})
    entries: list[tuple[Candidate, Callable[[], Runner]]] = [
        (DEFAULT, lambda: backend.prepare(problem, Candidate.make("fake", "same"), target)),
        (
            Candidate.make("fake", "same"),
            lambda: backend.prepare(problem, Candidate.make("fake", "same"), target),
        ),
        (
            Candidate.make("fake", "off"),
            lambda: backend.prepare(problem, Candidate.make("fake", "off"), target),
        ),
    ]
    settings = fast_config()
    settings.prune_ratio = settings.first_prune_ratio = math.inf  # "same" is Default's kernel
    record = Harness(CpuTimer(), settings).measure(problem, target, entries)
    assert record.settings["check"]["widen"] > 1.0
    assert _result(record, "same").status == OK
    off = _result(record, "off")
    assert off.status == REJECTED and "widened" in off.note


def test_a_default_far_beyond_the_bound_is_rejected_not_followed() -> None:
    # Widening stops at MAX_WIDEN: a Default ~115x over (products of bf16-rounded f32
    # inputs) is wrong for an f32 problem, as the old relative-error rule also said.
    torch = pytest.importorskip("torch")
    target = fake_target("torch")
    problem = Problem.from_shape(64, 64, 256)

    def bf16ish(k: Any, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
        out.copy_(a.to(torch.bfloat16).float() @ b.to(torch.bfloat16).float())

    backend = KernelBackend("fake", {"bf16ish": bf16ish})
    entries: list[tuple[Candidate, Callable[[], Runner]]] = [
        (DEFAULT, lambda: backend.prepare(problem, Candidate.make("fake", "bf16ish"), target)),
        (Candidate.make("fake", "right"), lambda: DefaultRunner(target.adapter)),
    ]
    record = Harness(CpuTimer(), fast_config()).measure(problem, target, entries)
    assert record.result(DEFAULT.identity).status == REJECTED
    assert record.settings["check"]["widen"] == MAX_WIDEN
    assert record.winner == "fake/right" and record.default_s is None


# --- item 7: right once, wrong after ----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_kernel_that_does_nothing_after_its_first_call_is_never_timed(kind: str) -> None:
    record = measure_kernels(Problem.from_shape(128, 128, 128), kind, {"lazy": first_call_only})
    lazy = _result(record, "lazy")
    assert lazy.status == REJECTED and "NaN/inf" in lazy.note  # the poison was left in place
    assert lazy.samples == 0 and lazy.median_s is None
    assert record.result(DEFAULT.identity).status == OK  # it pruned nobody


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("behave", [stale, memo_by_pointer], ids=["stale", "memo-by-pointer"])
def test_a_kernel_wrong_on_new_inputs_is_rejected_after_timing(kind: str, behave: Any) -> None:
    # Right twice on the first set (the same inputs), fast because it only copies: it is
    # timed, then checked on a set whose values were replaced in place, and rejected.
    # (Nothing is pruned here: a cheat slowed by a busy moment must not escape the check.)
    record = measure_kernels(
        Problem.from_shape(192, 160, 256),
        kind,
        {"cheat": behave, "good": right},
        prune_ratio=math.inf,
        first_prune_ratio=math.inf,
    )
    cheat = _result(record, "cheat")
    assert cheat.status == REJECTED, cheat
    assert cheat.note.startswith("wrong after"), cheat.note
    assert cheat.samples > 0  # it was timed: the pre-timing checks could not see it
    assert record.winner != "fake/cheat"
    assert _result(record, "good").status == OK


def test_a_stale_kernel_is_caught_before_its_times_prune_the_right_ones() -> None:
    # Timed in the order Default (1.0), cheat (0.1: it only copies), good (0.5). Checked
    # right after its own block, the cheat is out before good is compared with it; else
    # good (0.5 > 1.3 x 0.1) would be pruned as a loser and Default would win.
    clock = CostClock()
    problem = Problem.from_shape(48, 40, 32)
    kernels = {"default": (right, 1.0), "cheat": (stale, 0.1), "good": (right, 0.5)}
    target, entries = _costed_entries(clock, "numpy", problem, kernels)
    settings = fast_config()
    settings.prune_ratio = 1.3
    record = Harness(CostTimer(clock), settings).measure(problem, target, entries)
    assert _result(record, "cheat").status == REJECTED
    assert _result(record, "good").status == OK
    assert record.winner == "fake/good"


def _costed_entries(
    clock: CostClock, kind: str, problem: Problem, kernels: dict[str, tuple[Any, float]]
) -> tuple[Any, list[tuple[Candidate, Callable[[], Runner]]]]:
    """A target and entries whose runners set ``clock`` to their cost (``default`` first)."""
    target = fake_target(kind)

    def costed(behave: Any, cost: float) -> Any:
        def run(k: Any, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
            behave(k, a, b, out, alpha, beta, bias)
            clock.current = cost

        return run

    backend = KernelBackend("fake", {name: costed(*how) for name, how in kernels.items()})
    entries: list[tuple[Candidate, Callable[[], Runner]]] = [
        (
            DEFAULT if name == "default" else Candidate.make("fake", name),
            lambda name=name: backend.prepare(problem, Candidate.make("fake", name), target),
        )
        for name in kernels
    ]
    return target, entries


def _rounds_config(**overrides: Any) -> Any:
    """GPU-style settings (candidates sampled in rounds) with only the pruning asked for."""
    settings = fast_config()
    settings.interleave = True
    settings.prune_ratio = settings.first_prune_ratio = settings.round_prune_ratio = math.inf
    for key, value in overrides.items():
        setattr(settings, key, value)
    return settings


@pytest.mark.parametrize("kind", KINDS)
def test_a_stale_kernel_is_caught_before_the_first_round_prunes_the_right_ones(kind: str) -> None:
    # In rounds (a GPU), the first round's losers are pruned at once (round_prune_ratio);
    # the check on new inputs comes first, so the cheat (0.1: it only copies) is out before
    # good (0.5 > 1.3 x 0.1) is compared with it.
    clock = CostClock()
    problem = Problem.from_shape(48, 40, 32)
    kernels = {"default": (right, 1.0), "cheat": (stale, 0.1), "good": (right, 0.5)}
    target, entries = _costed_entries(clock, kind, problem, kernels)
    record = Harness(CostTimer(clock), _rounds_config(round_prune_ratio=1.3)).measure(
        problem, target, entries
    )
    assert _result(record, "cheat").status == REJECTED
    assert _result(record, "cheat").note.startswith("wrong after timing")
    assert _result(record, "good").status == OK
    assert record.winner == "fake/good"


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("launch", [False, True], ids=["sampled", "launched"])
def test_a_stale_kernel_never_prunes_on_its_first_timed_call_in_rounds(kind: str, launch: bool) -> None:
    # In rounds only the first call is checked before timing: a kernel stale from its
    # second call (0.1: it only copies) is as fast on its first timed call, and 0.5 is
    # 5x that. The first calls are judged only once the check on new inputs is made.
    clock = CostClock()
    problem = Problem.from_shape(48, 40, 32)
    kernels = {"default": (right, 1.0), "cheat": (stale, 0.1), "good": (right, 0.5)}
    target, entries = _costed_entries(clock, kind, problem, kernels)
    timer = LaunchCostTimer(clock) if launch else CostTimer(clock)
    record = Harness(timer, _rounds_config(first_prune_ratio=2.0)).measure(problem, target, entries)
    assert _result(record, "cheat").status == REJECTED
    assert _result(record, "cheat").note.startswith("wrong after timing")
    assert _result(record, "good").status == OK
    assert record.winner == "fake/good"


class _OrderTimer(LaunchCostTimer):
    """A :class:`LaunchCostTimer` that notes which sampler each launch was."""

    def __init__(self, clock: CostClock) -> None:
        super().__init__(clock)
        self.order: list[int] = []

    def prepare(self, calls: Any) -> Callable[[], float]:
        sample = super().prepare(calls)
        launch = sample.launch  # type: ignore[attr-defined]

        def noted() -> Callable[[], float]:
            self.order.append(id(sample))
            return launch()

        sample.launch = noted  # type: ignore[attr-defined]
        return sample


def test_each_round_starts_at_another_candidate() -> None:
    # The device waits for the host between rounds; whoever runs first after that wait
    # must not always be the same candidate (Default, the first, looked slower so).
    clock = CostClock()
    problem = Problem.from_shape(48, 40, 32)
    kernels = {"default": (right, 1.0), "a": (right, 1.0), "b": (right, 1.0)}
    target, entries = _costed_entries(clock, "numpy", problem, kernels)
    timer = _OrderTimer(clock)
    settings = _rounds_config(min_samples=4, max_samples=6, budget_s=60.0)
    record = Harness(timer, settings).measure(problem, target, entries)
    assert all(r.status == OK for r in record.results)
    rounds = [timer.order[i : i + 3] for i in range(0, len(timer.order), 3)]
    assert len(rounds) >= 4 and all(len(set(r)) == 3 for r in rounds)  # everyone once a round
    assert len({r[0] for r in rounds[:3]}) == 3  # three rounds, three different candidates first


@pytest.mark.parametrize("kind", KINDS)
def test_a_first_call_far_behind_is_pruned_after_the_first_round_check(kind: str) -> None:
    clock = CostClock()
    problem = Problem.from_shape(48, 40, 32)
    kernels = {"default": (right, 1.0), "slow": (right, 1.5), "fast": (right, 0.5)}
    target, entries = _costed_entries(clock, kind, problem, kernels)
    record = Harness(LaunchCostTimer(clock), _rounds_config(first_prune_ratio=2.0)).measure(
        problem, target, entries
    )
    slow = _result(record, "slow")
    assert slow.status == PRUNED and slow.note == "3.0x the best on its first timed call"
    assert slow.samples == 1  # its first round's sample: pruned before any other
    assert record.result(DEFAULT.identity).status == OK  # Default is never pruned
    assert record.winner == "fake/fast"


class _WithinTimer(LaunchCostTimer):
    """A :class:`LaunchCostTimer` with ``prepare_within`` (None where ``fits`` is False),
    noting what happened in order: ``prepare``, ``within`` (with its ``call_s``),
    ``launch`` and ``read``, each with the sample's cost."""

    def __init__(self, clock: CostClock, fits: bool = True) -> None:
        super().__init__(clock)
        self.fits = fits
        self.events: list[tuple[str, float]] = []

    def _noted(self, calls: Any) -> Callable[[], float]:
        sample = super().prepare(calls)
        launch = sample.launch  # type: ignore[attr-defined]

        def noted() -> Callable[[], float]:
            read = launch()
            cost = read()
            self.events.append(("launch", cost))

            def noted_read() -> float:
                self.events.append(("read", cost))
                return cost

            return noted_read

        def sampled() -> float:
            return noted()()

        sampled.launch = noted  # type: ignore[attr-defined]
        sampled.calls = 1  # type: ignore[attr-defined]
        return sampled

    def prepare(self, calls: Any) -> Callable[[], float]:
        self.events.append(("prepare", 0.0))
        return self._noted(calls)

    def prepare_within(self, calls: Any, call_s: float) -> Callable[[], float] | None:
        self.events.append(("within", call_s))
        return self._noted(calls) if self.fits else None


@pytest.mark.parametrize("fits", [True, False], ids=["within", "timed"])
def test_in_rounds_warm_ups_after_defaults_wait_for_nothing(fits: bool) -> None:
    # Default's warm-up sample is read at once (its time bounds the others' batches);
    # every other candidate's sampler is made by prepare_within (calls of at most
    # first_prune_ratio x Default's), or by prepare where that cannot size it, and its
    # warm-up sample is launched and read with the others' before the first round. The
    # first calls still prune as before.
    clock = CostClock()
    problem = Problem.from_shape(48, 40, 32)
    kernels = {"default": (right, 1.0), "slow": (right, 1.5), "fast": (right, 0.5), "near": (right, 0.6)}
    target, entries = _costed_entries(clock, "numpy", problem, kernels)
    timer = _WithinTimer(clock, fits)
    record = Harness(timer, _rounds_config(first_prune_ratio=2.0)).measure(problem, target, entries)
    expected = [("prepare", 0.0), ("launch", 1.0), ("read", 1.0)]
    for cost in (1.5, 0.5, 0.6):
        expected += [("within", 2.0)] + ([] if fits else [("prepare", 0.0)]) + [("launch", cost)]
    expected += [("read", 1.5), ("read", 0.5), ("read", 0.6)]
    assert timer.events[: len(expected)] == expected, timer.events
    slow = _result(record, "slow")
    assert slow.status == PRUNED and slow.note == "3.0x the best on its first timed call"
    assert _result(record, "fast").status == OK and _result(record, "near").status == OK
    assert record.winner == "fake/fast"


@pytest.mark.parametrize("kind", KINDS)
def test_a_clear_loser_is_pruned_after_the_first_round(kind: str) -> None:
    clock = CostClock()
    problem = Problem.from_shape(48, 40, 32)
    kernels = {"default": (right, 1.0), "slow": (right, 0.8), "fast": (right, 0.5), "near": (right, 0.6)}
    target, entries = _costed_entries(clock, kind, problem, kernels)
    settings = _rounds_config(round_prune_ratio=1.3)
    record = Harness(CostTimer(clock), settings).measure(problem, target, entries)
    slow = _result(record, "slow")
    assert slow.status == PRUNED and slow.note == "1.60x the best in the first round"
    assert slow.samples == 1  # no further samples, and no check after timing
    assert _result(record, "near").status == OK and _result(record, "near").samples >= settings.min_samples
    assert record.result(DEFAULT.identity).status == OK  # Default is never pruned
    assert record.winner == "fake/fast"


@pytest.mark.parametrize("kind", KINDS)
def test_in_rounds_a_candidate_none_of_whose_samples_ties_stops_at_min_samples(kind: str) -> None:
    # prune_untied: once it has min_samples, a candidate whose fastest sample is over
    # tie_ratio times the best median stops; one within it goes on, and Default is never
    # pruned. prune_ratio (1.10 on a GPU) alone would keep "behind" to the end.
    clock = CostClock()
    problem = Problem.from_shape(48, 40, 32)
    kernels = {
        "default": (right, 1.0),
        "fast": (right, 0.5),
        "near": (right, 0.5 * 1.03),
        "behind": (right, 0.5 * 1.07),
    }
    target, entries = _costed_entries(clock, kind, problem, kernels)
    settings = _rounds_config(prune_ratio=1.10, prune_untied=True, tie_ratio=1.05)
    record = Harness(CostTimer(clock), settings).measure(problem, target, entries)
    behind = _result(record, "behind")
    assert behind.status == PRUNED, behind.note
    assert behind.samples == settings.min_samples
    assert behind.note == f"none of {settings.min_samples} samples within 1.05x the best (fastest 1.070x)"
    near = _result(record, "near")
    assert near.status == OK and near.samples > settings.min_samples
    assert record.result(DEFAULT.identity).status == OK
    assert record.winner == "fake/fast"
    # Without it, "behind" (within prune_ratio) is sampled as long as the others.
    settings.prune_untied = False
    again = Harness(CostTimer(clock), settings).measure(problem, target, entries)
    assert _result(again, "behind").status == OK
    assert _result(again, "behind").samples > settings.min_samples


def right_once_then_doubled(k: Any, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    """Right on its first call; every later call writes twice the right values."""
    k.right(a, b, out, alpha, beta, bias)
    if k.calls > 1:
        out *= 2


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("interleave", [False, True], ids=["blocks", "rounds"])
def test_a_kernel_wrong_from_its_second_call_is_rejected_by_the_full_check_after_timing(
    kind: str, interleave: bool
) -> None:
    # The second call before timing only has to write every element (it did: finite,
    # wrong values); the full compare on new inputs after its first timing rejects it.
    record = measure_kernels(
        Problem.from_shape(64, 48, 40),
        kind,
        {"doubled": right_once_then_doubled, "good": right},
        interleave=interleave,
        prune_ratio=math.inf,
        first_prune_ratio=math.inf,
    )
    doubled = _result(record, "doubled")
    assert doubled.status == REJECTED and doubled.note.startswith("wrong after timing"), doubled.note
    assert doubled.samples > 0
    assert record.winner != "fake/doubled"
    assert _result(record, "good").status == OK


@pytest.fixture
def cheat_backend(isolated: Any) -> Iterator[KernelBackend]:
    backend = KernelBackend("cheat", {"stale": stale})
    with registered(isolated.plugins, backend):
        yield backend


def test_the_api_never_serves_a_stale_kernel(isolated: Any, cheat_backend: KernelBackend) -> None:
    rng = np.random.default_rng(11)
    a = rng.standard_normal((200, 300)).astype(np.float32)
    b = rng.standard_normal((300, 250)).astype(np.float32)
    with unimatmul.mode("tune"):
        first = unimatmul.matmul(a, b)
        second = unimatmul.matmul(-a, b)
    np.testing.assert_allclose(second, -first, rtol=1e-5, atol=1e-4)
    (_, _, record), *_ = list(isolated.selector.store.items())
    assert record.result("cheat/stale").status == REJECTED
    assert record.winner != "cheat/stale"
