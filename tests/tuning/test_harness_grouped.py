"""The harness's check of grouped GEMMs: memory in proportion to the rows the groups cover
(one float64 reference per group, never a batch padded to the bucket), a plan that bounds
what the check allocates, and every wrong group still caught, in each of the four forms."""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.profiler._memory_profiler import Action, MemoryProfile  # noqa: E402

from unimatmul import Backend, Candidate, Problem, Target  # noqa: E402
from unimatmul.cache.record import REJECTED  # noqa: E402
from unimatmul.core._backend import DEFAULT  # noqa: E402
from unimatmul.core.arrays import CPU, Device, adapter_for_kind  # noqa: E402
from unimatmul.core.grouped import (  # noqa: E402
    DISTRIBUTIONS,
    LOW_FILL,
    MID_FILL,
    TIMED_PARTS_M,
    GroupedDefaultRunner,
    grouped_operand_bytes,
    grouped_problem,
    make_grouped_operands,
)
from unimatmul.testing import fast_config  # noqa: E402
from unimatmul.tuning.harness import (  # noqa: E402
    CpuTimer,
    Harness,
    HarnessConfig,
    TuningTooLarge,
    _bind,
    compare_output,
    reference_of,
)
from unimatmul.tuning.tuner import Tuner  # noqa: E402

TARGET = Target(adapter_for_kind("torch"), CPU)
FORMS = ["m", "k", "n", "none"]
# Many groups with few rows each (an MoE prefill in small): a [G, bucket, n] float32 batch
# is 64 MiB, the output itself 512 KiB.
MANY = grouped_problem(128, 1024, 128, 64, "bf16")


def _settings(**changes: Any) -> HarnessConfig:
    return HarnessConfig(**{**fast_config().to_dict(), "rotate_bytes": 1 << 20, **changes})


def test_a_problem_of_many_groups_plans_within_a_limit_its_padded_check_was_over(monkeypatch: Any) -> None:
    monkeypatch.setenv("UNIMATMUL_TUNE_MEMORY", "8")
    monkeypatch.setattr(TARGET.adapter, "available_bytes", lambda device: None)
    plan = Harness(CpuTimer(), _settings()).plan_memory(MANY, TARGET, beta=0.0)
    padded = MANY.batch * MANY.m * MANY.n * 4  # the float32 reference of the padded batch alone
    assert plan.per_set == grouped_operand_bytes(MANY)
    assert plan.sets >= 1 and plan.sets * plan.per_set + plan.check <= plan.allowed < padded
    assert plan.check < padded / 4
    # the limit binds: a quarter of it refuses the product, before anything is allocated
    monkeypatch.setenv("UNIMATMUL_TUNE_MEMORY", "2")
    with pytest.raises(TuningTooLarge, match="numeric check"):
        Harness(CpuTimer(), _settings(rotate_bytes=1 << 16)).plan_memory(MANY, TARGET, beta=0.0)


def test_a_problem_of_many_groups_tunes_within_that_limit(isolated: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("UNIMATMUL_TUNE_MEMORY", "8")
    monkeypatch.setattr(TARGET.adapter, "available_bytes", lambda device: None)
    plan = Harness(CpuTimer(), _settings()).plan_memory(MANY, TARGET, beta=0.0)
    fake = WrongGroup("right", "m")
    with _registered(isolated, fake):
        tuner = Tuner(plugins=isolated.plugins, settings=_settings())
        record = tuner.tune(MANY, TARGET)  # first: what a process allocates once is not the tuning's
        used = _torch_peak(lambda: tuner.tune(MANY, TARGET)) + _host_peak(lambda: tuner.tune(MANY, TARGET))
    # the sets, the check and the candidates' own outputs, all within the plan
    assert used <= plan.sets * plan.per_set + plan.check <= plan.allowed
    by_id = {r.identity: r for r in record.results}
    for identity in (DEFAULT.identity, f"{fake.name}/kernel"):  # both passed every check
        assert by_id[identity].status != REJECTED, by_id[identity]
        assert by_id[identity].error is not None and 0 < by_id[identity].error < 1e-2
    assert fake.calls >= 4  # two checks before timing, one after each timing and after all of it


@pytest.mark.parametrize(("m", "n", "k"), [(8192, 1536, 2048), (8192, 2048, 768), (65536, 2048, 768)])
def test_qwen3_moe_prefill_products_plan_on_a_gpu(monkeypatch: Any, m: int, n: int, k: int) -> None:
    # Planned only (nothing is allocated): 128 experts, bf16, an H200's rotation target.
    # Their padded checks counted 6-64 GiB and were refused with the default multiple.
    monkeypatch.setenv("UNIMATMUL_TUNE_MEMORY", "8")
    adapter = adapter_for_kind("torch")
    monkeypatch.setattr(adapter, "available_bytes", lambda device: None)
    problem = grouped_problem(128, m, n, k, "bf16")
    plan = Harness(CpuTimer(), HarnessConfig(rotate_bytes=120 << 20)).plan_memory(
        problem, Target(adapter, Device("cuda")), beta=0.0
    )
    assert plan.sets >= 1 and plan.per_set + plan.check <= plan.allowed
    assert plan.check < 2 << 30 and plan.check < problem.batch * m * n * 4 / 4


# --- the check allocates what the plan says, at most ------------------------------------------


def _torch_peak(fn: Callable[[], None]) -> int:
    """The most bytes of torch CPU tensors ``fn`` held at one time (torch's memory profile)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
        fn()
    live, peak, mine = 0, 0, set()
    for _, action, key, size in MemoryProfile(prof.profiler.kineto_results).timeline:
        if action == Action.CREATE:
            mine.add(key)
            live += size
        elif action == Action.DESTROY and key in mine:
            live -= size
        peak = max(peak, live)
    return peak


def _host_peak(fn: Callable[[], None]) -> int:
    """The most bytes ``fn`` held on the host through Python and NumPy (a small group's check)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("jagged", "shape"),
    [
        ("m", (32, 512, 256, 128)),
        ("n", (32, 64, 512, 128)),
        ("k", (32, 64, 96, 512)),
        ("none", (8, 64, 64, 64)),
    ],
)
def test_the_plan_of_the_check_bounds_what_the_check_allocates(
    jagged: str, shape: tuple[int, int, int, int], monkeypatch: Any
) -> None:
    monkeypatch.setattr(TARGET.adapter, "available_bytes", lambda device: None)
    problem = grouped_problem(*shape, "bf16", jagged=jagged)
    plan = Harness(CpuTimer(), _settings(memory_factor=64.0)).plan_memory(problem, TARGET, beta=0.0)
    bands = plan.check - Harness(CpuTimer(), _settings()).plan_memory(problem, TARGET, beta=0.0).check
    assert plan.keep_bounds and bands == 0
    rng = np.random.default_rng(5)
    for distribution in DISTRIBUTIONS:
        ops = make_grouped_operands(problem, TARGET.adapter, CPU, rng, distribution)
        GroupedDefaultRunner(TARGET.adapter)(ops.a, ops.b, ops.out, offs=ops.offs)

        def check(ops: Any = ops, distribution: str = distribution) -> None:
            # what a check set costs: new inputs, their reference (bounds kept), two compares
            fresh = make_grouped_operands(problem, TARGET.adapter, CPU, rng, distribution, with_out=False)
            del fresh
            reference = reference_of(problem, TARGET, ops, None, 1.0, 0.0, keep_bounds=True)
            for _ in range(2):
                assert compare_output(TARGET, ops, ops.out, reference).ok()

        check()  # once first: what torch and the profiler allocate once per process is not the check's
        used = _torch_peak(check) + _host_peak(check)
        assert used <= plan.check, (distribution, used, plan.check)
        # proportion: the padded batch's float32 reference alone would be over it
        assert used < problem.batch * problem.m * problem.n * 4 or jagged in ("k", "none")


# --- a wrong group is caught in every form ---------------------------------------------------


class WrongGroup(Backend):
    """torch._grouped_mm's result, spoilt on purpose in one group: ``off`` adds 2 to one
    element of the last group that has any, ``unwritten`` leaves that group's part as it
    was, ``empty`` leaves the empty groups of the k form unwritten (they must be zeros),
    ``outside`` writes one element past the output's end; ``right`` spoils nothing."""

    device_kinds: ClassVar[frozenset[str]] = frozenset({"cpu"})
    array_kinds: ClassVar[frozenset[str]] = frozenset({"torch"})
    ops: ClassVar[frozenset[str]] = frozenset({"grouped_gemm"})

    def __init__(self, behaviour: str, jagged: str) -> None:
        self.name = f"wrong-group-{behaviour}"
        self.behaviour, self.jagged = behaviour, jagged
        self.calls = 0

    def availability(self) -> str | None:
        return None

    def versions(self) -> dict[str, str]:
        return {}

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        return [Candidate.make(self.name, "kernel")] if problem.jagged == self.jagged else []

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> Any:
        backend = self

        class Runner:
            def __init__(self) -> None:
                self.candidate = candidate

            def __call__(
                self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, offs: Any
            ) -> None:
                backend.calls += 1
                full = torch._grouped_mm(a, b, offs)
                parts = backend.parts(out, offs)
                keep = [p.clone() for p in parts] if backend.behaviour in ("unwritten", "empty") else []
                out.copy_(full)
                for part, was in zip(parts, keep, strict=False):
                    part.copy_(was)
                if backend.behaviour == "off" and parts:
                    parts[0].view(-1)[parts[0].numel() // 2] += 2.0
                if backend.behaviour == "outside":
                    out.as_strided((1,), (1,), out.storage_offset() + out.numel()).fill_(1.0)

        return Runner()

    def parts(self, out: Any, offs: Any) -> list[Any]:
        """The views of ``out`` the behaviour spoils."""
        if self.jagged == "none":
            return [out[-1]]
        ends = [int(v) for v in offs.tolist()]
        bounds = list(zip([0, *ends[:-1]], ends, strict=True))
        if self.behaviour == "empty":
            return [out[g] for g, (s, e) in enumerate(bounds) if e == s]
        g, (s, e) = [(g, se) for g, se in enumerate(bounds) if se[1] > se[0]][-1]
        return [out[s:e] if self.jagged == "m" else out[g] if self.jagged == "k" else out[:, s:e]]


def _registered(isolated: Any, *backends: Backend) -> Any:
    from unimatmul.testing import registered

    return registered(isolated.plugins, *backends)


# Only the k form gives an empty group an output (zeros).
WRONG = [(j, b) for j in FORMS for b in ("off", "unwritten", "outside")] + [("k", "empty")]


@pytest.mark.parametrize(("jagged", "behaviour"), WRONG)
def test_a_kernel_wrong_in_one_group_is_rejected(isolated: Any, jagged: str, behaviour: str) -> None:
    fake = WrongGroup(behaviour, jagged)
    problem = grouped_problem(24, 96, 48, 64, "bf16", jagged=jagged)
    # No pruning: a slow wrong kernel must still be caught by the checks after timing.
    settings = _settings(prune_ratio=math.inf, first_prune_ratio=math.inf)
    with _registered(isolated, fake):
        record = Tuner(plugins=isolated.plugins, settings=settings).tune(problem, TARGET)
    result = record.result(f"{fake.name}/kernel")
    assert result is not None and result.status == REJECTED, result
    # Default, or a right kernel of another backend (oneDNN's loops on the m form)
    assert record.winner == DEFAULT.identity or record.winner.startswith("onednn/loop:")
    said = {"off": "over the error bound", "unwritten": "NaN/inf", "outside": "outside the output"}
    assert said.get(behaviour, "over the error bound") in result.note, result.note
    if jagged != "none" and behaviour == "off":
        assert "group " in result.note  # the worst element's group is named


class OffsSeen(WrongGroup):
    """A right kernel that notes the distribution of every ``offs`` it is called with."""

    def __init__(self) -> None:
        super().__init__("right", "m")
        self.name = "offs-seen"
        self.seen: list[str] = []

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> Any:
        inner = super().prepare(problem, candidate, target)
        backend = self

        def run(a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, offs: Any) -> None:
            sizes = torch.diff(offs, prepend=offs.new_zeros(1))
            whole = int(sizes.max()) == int(offs[-1]) and int(offs[-1]) == a.shape[0]
            backend.seen.append("one" if whole else "tail" if int(offs[-1]) < a.shape[0] else "timed")
            inner(a, b, out, alpha, beta, bias, offs)

        run.candidate = candidate  # type: ignore[attr-defined]
        return run


@pytest.mark.parametrize("rotate", [1 << 10, 1 << 22])  # one timed set; several
def test_grouped_choices_are_timed_on_the_distributions_they_were_made_with(
    isolated: Any, monkeypatch: Any, rotate: int
) -> None:
    """The check after timing uses other distributions (one group holding every row, a
    tail); they go in for the check only, never into the samples."""
    monkeypatch.setenv("UNIMATMUL_TUNE_MEMORY", "16")
    fake = OffsSeen()
    problem = grouped_problem(32, 256, 64, 64, "bf16")
    settings = _settings(rotate_bytes=rotate, prune_ratio=math.inf, first_prune_ratio=math.inf)
    with _registered(isolated, fake):
        record = Tuner(plugins=isolated.plugins, settings=settings).tune(problem, TARGET)
    result = record.result(f"{fake.name}/kernel")
    assert result is not None and result.samples >= 3, result
    checks = fake.seen.count("one") + fake.seen.count("tail")
    assert fake.seen.count("timed") >= result.samples + 2  # the two first checks, and every sample
    assert 1 <= checks <= 4, fake.seen  # the check after its timing and after all timing


# --- a grouped win must stand on every distribution ----------------------------------------
_CLOCK = [0.0]  # a virtual clock: runners add their cost, the timer reads it


class _VirtualTimer(CpuTimer):
    """Seconds a call by the runners' own account (no noise, no machine in the figures)."""

    def prepare(self, calls: Any) -> Any:
        calls = list(calls)

        def sample() -> float:
            start = _CLOCK[0]
            for call in calls:
                call()
            return (_CLOCK[0] - start) / len(calls)

        return sample


def _measured_on_the_clock(problem: Problem, entries: Any) -> Any:
    """The record of ``entries`` measured on the virtual clock, every part of the timed sets
    present, nothing pruned."""
    settings = _settings(
        interleave=True, rotate_bytes=1 << 20, prune_ratio=math.inf, first_prune_ratio=math.inf, max_sets=5
    )
    return Harness(_VirtualTimer(), settings).measure(problem, TARGET, entries)


def _skewed(offs: Any, rows: int) -> bool:
    sizes = torch.diff(offs, prepend=offs.new_zeros(1))
    return int(sizes.max()) > 2 * rows / len(sizes)


class _Costed:
    """``torch._grouped_mm`` into ``out`` (right), costing ``uniform`` or ``skewed`` seconds."""

    def __init__(self, candidate: Candidate, uniform: float, skewed: float) -> None:
        self.candidate, self.uniform, self.skewed = candidate, uniform, skewed

    def __call__(self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, offs: Any) -> None:
        out.copy_(torch._grouped_mm(a, b, offs))
        _CLOCK[0] += self.skewed if _skewed(offs, a.shape[0]) else self.uniform


@pytest.mark.parametrize(
    ("uniform", "skewed", "wins"),
    [(0.5, 1.2, False), (1.2, 0.5, False), (0.6, 0.8, True)],
)
def test_a_grouped_win_must_stand_on_each_distribution(uniform: float, skewed: float, wins: bool) -> None:
    """Default costs 1.0 on both of the timed distributions. A kernel at 0.5 on one and 1.2
    on the other is ahead on the mixture the main measurement times (0.85), and is kept
    out by the repeat, which takes each distribution alone; one ahead on both wins."""
    problem = grouped_problem(16, 256, 32, 32, "bf16")
    kernel = Candidate.make("costed", "kernel")
    entries = [
        (DEFAULT, lambda: _Costed(DEFAULT, 1.0, 1.0)),
        (kernel, lambda: _Costed(kernel, uniform, skewed)),
    ]
    record = _measured_on_the_clock(problem, entries)
    repeat = record.settings.get("repeat") or {}
    assert record.winner == (kernel.identity if wins else DEFAULT.identity), (record.winner, repeat)
    by_distribution = repeat.get("by_distribution")
    # Both distributions over all the bucket's rows, then over LOW_FILL of them, and
    # uniform over MID_FILL.
    assert by_distribution is not None and len(by_distribution) == len(TIMED_PARTS_M) == 5, repeat
    assert (min(by_distribution) > 1.0) == wins


class _CostedByFill(_Costed):
    """Right, costing ``full`` seconds on a call of all the bucket's rows, ``mid`` on one of
    MID_FILL of them and ``low`` on fewer (the lower part of the bucket)."""

    def __init__(self, candidate: Candidate, full: float, low: float, mid: float | None = None) -> None:
        super().__init__(candidate, full, full)
        self.low = low
        self.mid = low if mid is None else mid

    def __call__(self, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, offs: Any) -> None:
        out.copy_(torch._grouped_mm(a, b, offs))
        # A call of the lower part passes that many rows (its a and out have no others).
        assert int(offs[-1]) == a.shape[0] == out.shape[0] or a.shape[0] == _BUCKET_ROWS
        rows = a.shape[0]
        _CLOCK[0] += (
            self.uniform
            if rows == _BUCKET_ROWS
            else self.mid
            if rows == int(_BUCKET_ROWS * MID_FILL)
            else self.low
        )


_BUCKET_ROWS = 256


@pytest.mark.parametrize(
    ("full", "low", "mid", "wins"), [(0.6, 1.1, None, False), (0.7, 0.8, None, True), (0.7, 0.8, 1.06, False)]
)
def test_a_grouped_win_must_stand_in_the_lower_part_and_middle_of_its_bucket(
    full: float, low: float, mid: float | None, wins: bool
) -> None:
    """The MoE form's timed sets route all the bucket's rows, LOW_FILL of them and, with
    uniform routing, MID_FILL: a kernel well ahead at the bucket's upper edge but behind
    Default below it, or behind in its middle alone, is kept out."""
    problem = grouped_problem(16, _BUCKET_ROWS, 32, 32, "bf16")
    kernel = Candidate.make("costed", "kernel")
    entries = [
        (DEFAULT, lambda: _CostedByFill(DEFAULT, 1.0, 1.0)),
        (kernel, lambda: _CostedByFill(kernel, full, low, mid)),
    ]
    record = _measured_on_the_clock(problem, entries)
    assert record.winner == (kernel.identity if wins else DEFAULT.identity), record.settings.get("repeat")
    by_part = (record.settings.get("repeat") or {}).get("by_distribution")
    assert by_part is not None and len(by_part) == 5
    assert (by_part[2] > 1.0, by_part[3] > 1.0) == (mid is not None or wins, mid is not None or wins)
    assert (by_part[4] > 1.0) == wins


def test_the_timed_sets_route_all_rows_and_the_lower_part_of_the_bucket() -> None:
    problem = grouped_problem(8, 1000, 64, 32, "bf16")  # bucketed to 1024 rows
    rng = np.random.default_rng(0)
    harness = Harness(CpuTimer(), _settings(rotate_bytes=1 << 22))
    sets = harness._operand_sets(problem, TARGET, rng, 10)
    ends = [int(s.offs[-1]) for s in sets]
    low, mid = int(problem.m * LOW_FILL), int(problem.m * MID_FILL)
    assert ends == [problem.m, problem.m, low, low, mid] * 2
    assert [s.part for s in sets[:5]] == [
        "skewed",
        "uniform",
        f"skewed@{LOW_FILL:g}",
        f"uniform@{LOW_FILL:g}",
        f"uniform@{MID_FILL:g}",
    ]
    # Every set has the bucket's shapes; offs covers fewer rows, and a call of a lower part
    # passes that many rows of a and out (a call routes all of its a's rows).
    assert {tuple(s.a.shape) for s in sets} == {(problem.m, problem.k)}
    assert [s.rows for s in sets[:5]] == [None, None, low, low, mid]
    seen: list[tuple[int, int]] = []
    for s in sets[:5]:
        _bind(lambda a, b, out, *rest: seen.append((a.shape[0], out.shape[0])), s, 1.0, 0.0)()
    assert seen == [(problem.m, problem.m)] * 2 + [(low, low)] * 2 + [(mid, mid)]
    # The other forms take turns of the two distributions over all of their extent.
    k_form = grouped_problem(8, 64, 64, 1000, "bf16", jagged="k")
    assert [s.part for s in harness._operand_sets(k_form, TARGET, rng, 4)] == ["skewed", "uniform"] * 2


def test_a_distribution_sampler_that_cannot_be_made_leaves_the_plain_repeat() -> None:
    """Where the per-distribution samplers fail to build, the repeat runs over every set."""

    class Refusing(_VirtualTimer):
        made = 0

        def prepare(self, calls: Any) -> Any:
            self.made += 1
            if self.made > 2:  # past the main measurement's two: a distribution's samplers
                raise RuntimeError("cannot capture")
            return super().prepare(calls)

    problem = grouped_problem(16, 256, 32, 32, "bf16")
    kernel = Candidate.make("costed", "kernel")
    entries = [
        (DEFAULT, lambda: _Costed(DEFAULT, 1.0, 1.0)),
        (kernel, lambda: _Costed(kernel, 0.6, 0.8)),
    ]
    settings = _settings(
        interleave=True, rotate_bytes=1 << 20, prune_ratio=math.inf, first_prune_ratio=math.inf
    )
    record = Harness(Refusing(), settings).measure(problem, TARGET, entries)
    assert record.winner == kernel.identity
    assert "by_distribution" not in (record.settings.get("repeat") or {})


def test_a_grouped_default_is_timed_as_the_door_runs_it_without_out() -> None:
    """Timed, Default is torch._grouped_mm itself (the door's Default for a call without
    ``out``, as every routed call is); checked, its result is copied into ``out``."""
    from unimatmul.core.grouped import GroupedDefaultRunner

    problem = grouped_problem(4, 64, 32, 48, "bf16")
    ops = make_grouped_operands(problem, TARGET.adapter, CPU, np.random.default_rng(1), "uniform")
    runner = GroupedDefaultRunner(TARGET.adapter)
    calls: list[tuple[int, ...]] = []
    real = runner.grouped_mm

    def counted(a: Any, b: Any, offs: Any) -> Any:
        calls.append(tuple(a.shape))
        return real(a, b, offs)

    runner.grouped_mm = counted
    ops.out.fill_(float("nan"))
    _bind(runner, ops, 1.0, 0.0, timing=True)()
    assert calls == [(problem.m, problem.k)] and bool(torch.isnan(ops.out).all())  # out untouched
    _bind(runner, ops, 1.0, 0.0)()
    assert len(calls) == 2 and not bool(torch.isnan(ops.out).any())
    torch.testing.assert_close(ops.out, real(ops.a, ops.b, ops.offs))
    with pytest.raises(ValueError, match="no alpha, beta or bias"):
        _bind(runner, ops, 2.0, 0.0, timing=True)
