"""The harness's rounds on the device a user tunes on: candidates sampled in rounds, their
checks read back together, and still no wrong kernel wins. On a GPU with the device's own
timer and settings (CUDA graphs, samples launched back to back); on the CPU with the same
rounds and the CPU clock, so that the test's own logic runs everywhere."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from harness_fakes import KernelBackend, right, sleeps, stale, writes_past_the_end  # noqa: E402

from unimatmul.backend import DEFAULT, Candidate, Runner, Target  # noqa: E402
from unimatmul.cache.record import ABANDONED, OK, REJECTED  # noqa: E402
from unimatmul.core.arrays import CPU, Device, adapter_for_kind  # noqa: E402
from unimatmul.core.problem import Problem  # noqa: E402
from unimatmul.core.runners import DefaultRunner  # noqa: E402
from unimatmul.testing import fast_config  # noqa: E402
from unimatmul.tuning.harness import CpuTimer, Harness  # noqa: E402
from unimatmul.tuning.timers import device_settings, device_timer  # noqa: E402

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or HIP device"),
        ],
    ),
]


def way_off(k: Any, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    """Right everywhere but one element, 1,000 too large: far outside any bound."""
    k.right(a, b, out, alpha, beta, bias)
    out[(0,) * len(out.shape)] += 1000.0


def negated(k: Any, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    """The product with its sign flipped."""
    k.right(a, b, out, alpha, beta, bias)
    out.neg_()


def _measure(device: str, kernels: dict[str, Callable[..., None]], **settings_: Any) -> Any:
    adapter = adapter_for_kind("torch")
    if device == "cpu":
        target = Target(adapter, CPU)
        timer: Any = CpuTimer()
        settings = fast_config()
        settings.interleave = True
        settings.round_prune_ratio = 1.3
    else:
        target = Target(adapter, Device("cuda", torch.cuda.current_device()))
        timer, settings = device_timer(target), device_settings(target)
    settings.prune_ratio = settings.first_prune_ratio = settings.round_prune_ratio = float("inf")
    settings.prune_untied = False  # every right kernel timed to the end, however it compares
    for name, value in settings_.items():
        setattr(settings, name, value)
    problem = Problem.from_shape(32, 2048, 1024, "bf16")
    backend = KernelBackend("fake", kernels)
    entries: list[tuple[Candidate, Callable[[], Runner]]] = [
        (DEFAULT, lambda: DefaultRunner(adapter, problem.activation))
    ]
    for name in kernels:
        candidate = Candidate.make("fake", name)
        entries.append((candidate, lambda c=candidate: backend.prepare(problem, c, target)))
    return Harness(timer, settings).measure(problem, target, entries)


@pytest.mark.parametrize("device", DEVICES)
def test_in_rounds_only_right_kernels_are_timed_to_the_end(device: str) -> None:
    kernels = {f"right{i}": right for i in range(3)}
    kernels |= {"way_off": way_off, "negated": negated, "past": writes_past_the_end, "stale": stale}
    record = _measure(device, kernels)
    for i in range(3):
        assert record.result(f"fake/right{i}").status == OK
    off = record.result("fake/way_off")
    assert off.status == REJECTED and "1 element(s) over the error bound" in off.note, off.note
    assert "worst element (0, 0)" in off.note  # checked again whole, for the note
    assert record.result("fake/negated").status == REJECTED
    past = record.result("fake/past")
    assert past.status == REJECTED and "outside the output" in past.note, past.note
    late = record.result("fake/stale")
    assert late.status == REJECTED and late.note.startswith("wrong after timing"), late.note
    assert record.winner in {DEFAULT.identity, *(f"fake/right{i}" for i in range(3))}
    assert record.settings["check"]["calls"] == 3  # in rounds: one before timing, two after


def _guard_calls_counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many times the guard bands are poisoned and counted, from now on."""
    from unimatmul.tuning import numeric_check

    seen = {"poison_guard": 0, "guard_count": 0}
    for name in seen:
        original = getattr(numeric_check, name)

        def counted(*args: Any, _name: str = name, _original: Any = original) -> Any:
            seen[_name] += 1
            return _original(*args)

        monkeypatch.setattr(numeric_check, name, counted)
    return seen


def past_the_end_once_timed(k: Any, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any) -> None:
    """Right on its first call (the check before timing), then one element written past
    the output's end on every call."""
    (right if k.calls == 1 else writes_past_the_end)(k, a, b, out, alpha, beta, bias)


@pytest.mark.parametrize("device", DEVICES)
def test_in_rounds_a_batch_of_checks_poisons_and_counts_its_guards_once(
    device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks read back together (before timing, after the first round, after all
    timing) poison each output's guard bands before the batch and count them once after
    it, not once a call; a write outside by one call of a batch sends each of its calls
    to a check of its own, which names the writer and clears the others."""
    seen = _guard_calls_counted(monkeypatch)
    record = _measure(device, {f"right{i}": right for i in range(4)})
    assert all(r.status == OK for r in record.results), [(r.identity, r.note) for r in record.results]
    assert seen == {"poison_guard": 3, "guard_count": 3}  # five candidates, three batches

    seen.update(poison_guard=0, guard_count=0)
    record = _measure(device, {f"right{i}": right for i in range(3)} | {"late": past_the_end_once_timed})
    late = record.result("fake/late")
    assert late.status == REJECTED and late.note.startswith("wrong after timing"), late.note
    assert "1 element(s) outside the output" in late.note, late.note
    for i in range(3):
        assert record.result(f"fake/right{i}").status == OK
    # The batch after the first round: one poison and count for the batch, then one for
    # each of its five calls checked again alone; the batch after all timing: one.
    assert seen == {"poison_guard": 8, "guard_count": 8}


def test_in_rounds_a_batch_counts_the_guard_of_an_output_renewed_within_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A call abandoned in the middle of a batch (over its time limit) gets the set a new
    output: the batch poisons the new output's guard at its first use and counts both
    guards after its last call; the others are checked as usual. (On the CPU, where a
    step over its limit is left to its worker thread.)"""
    seen = _guard_calls_counted(monkeypatch)
    # A limit of three times Default's steps: far above a right kernel's (a loaded or
    # AVX2-only CPU makes both slow alike), far below the hang's.
    kernels = {"right0": right, "hang": sleeps(60.0), "right1": right}
    record = _measure("cpu", kernels, limit_s=1.0, limit_ratio=3.0)
    assert record.result("fake/hang").status == ABANDONED, record.result("fake/hang").note
    assert record.result("fake/right0").status == OK and record.result("fake/right1").status == OK
    # Before timing: the first output's guard and the renewed one's, each poisoned and
    # counted once; after the first round and after all timing, one each.
    assert seen == {"poison_guard": 4, "guard_count": 4}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or HIP device")
def test_the_batch_size_setting_sets_the_calls_a_sample_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    target = Target(adapter_for_kind("torch"), Device("cuda", torch.cuda.current_device()))
    counter = torch.zeros(1, device="cuda", dtype=torch.float64)
    # The kernel's first launch loads its module (milliseconds): the timer's warm-up would
    # time that and cut the batch to one call (a batch stays under MAX_BATCH_S).
    counter.add_(0.0)
    torch.cuda.synchronize()

    def calls_per_sample() -> float:
        timer = device_timer(target)
        sample = timer.prepare([lambda: counter.add_(1.0), lambda: counter.add_(1.0)])
        torch.cuda.synchronize()
        before = counter.item()
        sample()
        return counter.item() - before

    monkeypatch.delenv("UNIMATMUL_GPU_BATCH_CALLS", raising=False)
    assert calls_per_sample() == 10
    assert device_timer(target).name == "torch-cuda-graph"
    monkeypatch.setenv("UNIMATMUL_GPU_BATCH_CALLS", "7")
    assert device_timer(target).min_calls == 7
    assert device_timer(target).name == "torch-cuda-graph (7 calls a batch)"  # as records keep it
    assert calls_per_sample() == 7


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or HIP device")
def test_a_graph_timer_made_within_a_bound_waits_for_nothing_and_runs_the_whole_batch() -> None:
    target = Target(adapter_for_kind("torch"), Device("cuda", torch.cuda.current_device()))
    counter = torch.zeros(1, device="cuda", dtype=torch.float64)
    counter.add_(0.0)  # the kernel's module loaded before any timing
    torch.cuda.synchronize()
    timer = device_timer(target)
    calls = [lambda: counter.add_(1.0)] * 4  # four input sets
    assert timer.prepare_within(calls, call_s=1.0) is None  # ten 1 s calls: over a batch's bound
    sample = timer.prepare_within(calls, call_s=1e-5)
    assert sample is not None
    torch.cuda.synchronize()
    assert counter.item() == 3  # the eager warm-up's (the first three sets), then a capture (none)
    read = sample.launch()  # type: ignore[attr-defined]
    seconds = read()
    assert counter.item() == 13  # the batch the timed warm-up would have sized: ten calls
    assert 0.0 < seconds < 1e-3
