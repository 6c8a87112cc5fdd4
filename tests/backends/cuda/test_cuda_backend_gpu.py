"""cuBLASLt on a real NVIDIA GPU: every candidate checked against a float64 reference.

Marked ``gpu`` and skipped, with the reason, where torch has no CUDA device. Both
library objects run: ``ctypes`` (the ABI-table path that hipBLASLt shares) and
``nvmath`` (nvmath-python's bindings). Outputs are poisoned with NaN before each run,
inputs are random, the reference is computed in float64 on the device.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from unimatmul.backend import Candidate, Target  # noqa: E402
from unimatmul.core.arrays import Device, adapter_for_kind, make_operands  # noqa: E402
from unimatmul.core.dtypes import tolerance  # noqa: E402
from unimatmul.core.errors import UnsupportedProblem  # noqa: E402
from unimatmul.core.problem import Problem  # noqa: E402

HAVE_CUDA = bool(torch.cuda.is_available() and torch.version.cuda)
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAVE_CUDA, reason="needs an NVIDIA GPU and a CUDA build of torch"),
]

LIBRARIES = ("ctypes", "nvmath")


def _problem(m: int, n: int, k: int, dtype: str = "bf16", **kw: Any) -> Problem:
    base = Problem.from_shape(m, n, k, dtype)
    fields = {f: getattr(base, f) for f in ("m", "n", "k", "dtype_a", "dtype_b", "dtype_c", "compute")}
    fields.update(kw)
    return Problem(**fields)


# (id, problem, alpha, beta): aligned and odd shapes, transposes, batches, epilogues.
CASES: list[tuple[str, Problem, float, float]] = [
    ("bf16-aligned", _problem(256, 512, 128), 1.0, 0.0),
    ("bf16-odd", _problem(97, 131, 77), 1.0, 0.0),
    ("bf16-1024x1025x1024", _problem(1024, 1025, 1024), 1.0, 0.0),
    ("f16-NT", _problem(128, 256, 64, "f16", trans_b=True), 1.0, 0.0),
    ("f16-TN", _problem(128, 256, 64, "f16", trans_a=True), 1.0, 0.0),
    ("f16-TT", _problem(64, 72, 136, "f16", trans_a=True, trans_b=True), 1.0, 0.0),
    ("f32", _problem(64, 96, 80, "f32"), 1.0, 0.0),
    ("tf32", _problem(64, 96, 80, "f32", compute="tf32"), 1.0, 0.0),
    ("bf16-batched", _problem(64, 32, 48, batch=4), 1.0, 0.0),
    (
        "bf16-batched-NT-ld",
        _problem(
            64, 32, 48, batch=3, trans_b=True, ldb=56, stride_a=64 * 48, stride_b=32 * 56, stride_c=64 * 32
        ),
        1.0,
        0.0,
    ),
    (
        "f16-broadcast-b",
        _problem(64, 32, 48, "f16", batch=3, stride_a=64 * 48, stride_b=0, stride_c=64 * 32),
        1.0,
        0.0,
    ),
    ("f16-bias", _problem(128, 64, 32, "f16", epilogue="bias"), 1.0, 0.0),
    ("bf16-bias-relu", _problem(128, 64, 32, epilogue="bias_relu"), 1.0, 0.0),
    ("bf16-bias-gelu-tanh", _problem(128, 64, 32, epilogue="bias_gelu_tanh"), 1.0, 0.0),
    ("f16-relu", _problem(128, 64, 32, "f16", epilogue="relu"), 1.0, 0.0),
    ("f32-gelu-tanh", _problem(32, 64, 16, "f32", epilogue="gelu_tanh"), 1.0, 0.0),
    ("bf16-alpha-beta", _problem(128, 256, 64, beta_zero=False), 0.5, 2.0),
    (
        "f32-batched-beta-bias",
        _problem(32, 48, 16, "f32", batch=2, beta_zero=False, epilogue="bias"),
        1.5,
        -1.0,
    ),
    ("bf16-m1", _problem(1, 4096, 512), 1.0, 0.0),
    # Misaligned with transposes, batches, bias and beta: both padding flavours.
    ("bf16-odd-TN", _problem(45, 64, 30, trans_a=True), 1.0, 0.0),
    ("bf16-odd-TT-batched", _problem(45, 38, 30, trans_a=True, trans_b=True, batch=2), 1.0, 0.0),
    (
        "f16-odd-bias-gelu-beta",
        _problem(33, 47, 29, "f16", epilogue="bias_gelu_tanh", beta_zero=False),
        1.0,
        0.5,
    ),
]


@pytest.fixture(scope="module", params=LIBRARIES)
def backend(request: pytest.FixtureRequest) -> Iterator[Any]:
    from unimatmul_backends.cuda.backend import CublasLtBackend

    if request.param == "nvmath":
        pytest.importorskip("nvmath.bindings.cublasLt")
    found = CublasLtBackend(library=request.param)
    reason = found.availability()
    assert reason is None, reason
    assert found.library == request.param
    yield found
    found.close()


@pytest.fixture(scope="module")
def target() -> Target:
    return Target(adapter_for_kind("torch"), Device("cuda", torch.cuda.current_device()))


def check_candidate(
    backend: Any, problem: Problem, candidate: Candidate, target: Target, alpha: float, beta: float, seed: int
) -> float:
    """Run one candidate on fresh random operands and return its relative error."""
    adapter = target.adapter
    ops = make_operands(problem, adapter, target.device, np.random.default_rng(seed))
    c_in = ops.out.clone()
    runner = backend.prepare(problem, candidate, target)
    if beta == 0.0:
        adapter.fill_nan(ops.out)
    runner(ops.a, ops.b, ops.out, alpha, beta, ops.bias)
    torch.cuda.synchronize()
    ref = adapter.reference(ops.a, ops.b, c_in, alpha, beta, ops.bias, problem.activation)
    return adapter.rel_error(ops.out, ref)


@pytest.mark.parametrize(("case", "problem", "alpha", "beta"), CASES, ids=[c[0] for c in CASES])
def test_every_candidate_is_correct(
    backend: Any, target: Target, case: str, problem: Problem, alpha: float, beta: float
) -> None:
    candidates = backend.candidates(problem, target)
    assert candidates, f"cuBLASLt offered nothing for {problem.key}"
    tol = tolerance(problem.dtype_c, problem.compute)
    errors = {}
    for i, candidate in enumerate(candidates):
        errors[candidate.identity] = check_candidate(backend, problem, candidate, target, alpha, beta, seed=i)
    bad = {ident: err for ident, err in errors.items() if not err <= tol}
    assert not bad, f"{len(bad)} of {len(errors)} candidates over tolerance {tol}: {bad}"
    if "1025" in case or "odd" in case:
        names = {c.name for c in candidates}
        assert "pad" in names, "misaligned ld but no alignment candidate"
        assert ("pad-dims" in names) == (not problem.has_bias), names


def test_identity_rebuilds_the_heuristic_algo(backend: Any, target: Target) -> None:
    from unimatmul_backends.lt.layout import lt_gemm

    driver = backend.driver()
    codec = backend.codec
    same_bytes = 0
    total = 0
    for problem in (_problem(1000, 1000, 1000), _problem(2048, 2048, 512), _problem(1, 4096, 4096, "f16")):
        plan = driver.plan(lt_gemm(problem), backend.workspace_limit)
        try:
            for algo in plan.heuristics(16):
                params = codec.params(algo)
                rebuilt = codec.rebuild(plan, params)
                assert codec.params(rebuilt) == params
                total += 1
                same_bytes += rebuilt.data == algo.data
        finally:
            plan.close()
    assert total > 0
    print(f"rebuilt algo structs byte-identical to the heuristic's: {same_bytes}/{total}")


def test_exhaustive_candidates_are_correct(
    backend: Any, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UNIMATMUL_LT_EXHAUSTIVE", "1")
    monkeypatch.setenv("UNIMATMUL_LT_EXHAUSTIVE_MAX", "24")
    problem = _problem(512, 384, 256)
    monkeypatch.setenv("UNIMATMUL_LT_EXHAUSTIVE", "0")
    heuristic = set(backend.candidates(problem, target))
    monkeypatch.setenv("UNIMATMUL_LT_EXHAUSTIVE", "1")
    found = backend.candidates(problem, target)
    extra = [c for c in found if c not in heuristic]
    print(f"exhaustive search: {backend.last_search}; {len(extra)} beyond the heuristic's {len(heuristic)}")
    assert backend.last_search["checked"] > 0
    assert extra, f"the exhaustive search found nothing beyond the heuristics: {backend.last_search}"
    tol = tolerance(problem.dtype_c, problem.compute)
    for i, candidate in enumerate(extra):
        err = check_candidate(backend, problem, candidate, target, 1.0, 0.0, seed=100 + i)
        assert err <= tol, f"{candidate.identity}: relative error {err}"


def test_runner_is_captured_in_a_cuda_graph(backend: Any, target: Target) -> None:
    problem = _problem(512, 768, 256, epilogue="bias_relu")
    candidate = backend.candidates(problem, target)[0]
    runner = backend.prepare(problem, candidate, target)
    adapter = target.adapter
    ops = make_operands(problem, adapter, target.device, np.random.default_rng(7))
    runner(ops.a, ops.b, ops.out, 1.0, 0.0, ops.bias)  # warm-up outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        runner(ops.a, ops.b, ops.out, 1.0, 0.0, ops.bias)
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    # New inputs in the same buffers: the replay must compute with them.
    fresh = make_operands(problem, adapter, target.device, np.random.default_rng(8))
    ops.a.copy_(fresh.a)
    ops.b.copy_(fresh.b)
    ops.bias.copy_(fresh.bias)
    adapter.fill_nan(ops.out)
    graph.replay()
    torch.cuda.synchronize()
    ref = adapter.reference(ops.a, ops.b, ops.out, 1.0, 0.0, ops.bias, "relu")
    assert adapter.rel_error(ops.out, ref) <= tolerance("bf16")


def test_runner_runs_on_the_callers_stream(backend: Any, target: Target) -> None:
    problem = _problem(1024, 1024, 1024)
    candidate = backend.candidates(problem, target)[0]
    runner = backend.prepare(problem, candidate, target)
    adapter = target.adapter
    ops = make_operands(problem, adapter, target.device, np.random.default_rng(9))
    source = ops.a.clone()
    adapter.fill_nan(ops.a)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # ~25 ms: a runner on another stream would read NaN
        ops.a.copy_(source)
        adapter.fill_nan(ops.out)
        runner(ops.a, ops.b, ops.out, 1.0, 0.0, None)
    torch.cuda.synchronize()
    ref = adapter.reference(source, ops.b, ops.out, 1.0, 0.0, None, None)
    assert adapter.rel_error(ops.out, ref) <= tolerance("bf16")


def test_graph_timer_times_lt_and_default(backend: Any, target: Target) -> None:
    from unimatmul.core.runners import DefaultRunner
    from unimatmul.tuning.timers import TorchGraphTimer

    problem = _problem(256, 256, 256)
    adapter = target.adapter
    sets = [make_operands(problem, adapter, target.device, np.random.default_rng(i)) for i in range(3)]
    # upload=False (the harness's): the first sample launches the new graph, and uploads it.
    for timer in (TorchGraphTimer(target.device.index), TorchGraphTimer(target.device.index, upload=False)):
        samplers = []
        for runner in (
            backend.prepare(problem, backend.candidates(problem, target)[0], target),
            DefaultRunner(adapter),
        ):
            calls = [lambda s=s, r=runner: r(s.a, s.b, s.out, 1.0, 0.0, None) for s in sets]
            sample = timer.prepare(calls)
            assert timer.last_mode == "graph"
            times = [sample() for _ in range(3)]
            assert all(0 < t < 1e-2 for t in times), times
            samplers.append(sample)
            # Every set was computed by the replays: each output is its product.
            for s in sets:
                ref = adapter.reference(s.a, s.b, s.out, 1.0, 0.0, None, None)
                assert adapter.rel_error(s.out, ref) <= tolerance("bf16")
        # The harness's rounds: both samples launched back to back, then read (each by its
        # own events), and the outputs still right.
        for _ in range(3):
            reads = [sample.launch() for sample in samplers]  # type: ignore[attr-defined]
            assert all(0 < read() < 1e-2 for read in reads)
        assert all(sample.calls >= len(sets) for sample in samplers)  # type: ignore[attr-defined]
        for s in sets:
            ref = adapter.reference(s.a, s.b, s.out, 1.0, 0.0, None, None)
            assert adapter.rel_error(s.out, ref) <= tolerance("bf16")


def test_graph_timer_runs_on_its_stream_and_puts_the_callers_back(backend: Any, target: Target) -> None:
    from unimatmul.tuning.timers import TorchGraphTimer

    problem = _problem(256, 256, 256)
    adapter = target.adapter
    sets = [make_operands(problem, adapter, target.device, np.random.default_rng(i)) for i in range(3)]
    index = target.device.index
    timer = TorchGraphTimer(index, upload=False)
    seen: list[int] = []
    runner = backend.prepare(problem, backend.candidates(problem, target)[0], target)

    def call(s: Any) -> None:
        seen.append(torch.cuda.current_stream(index).stream_id)
        runner(s.a, s.b, s.out, 1.0, 0.0, None)

    mine = torch.cuda.Stream(device=index)
    with torch.cuda.stream(mine):
        sample = timer.prepare([lambda s=s: call(s) for s in sets])  # warm-up and capture
        assert timer.last_mode == "graph"
        assert torch.cuda.current_stream(index).stream_id == mine.stream_id
        times = [sample.launch()() for _ in range(3)]  # type: ignore[attr-defined]
        assert torch.cuda.current_stream(index).stream_id == mine.stream_id
    assert torch.cuda.current_stream(index).stream_id == torch.cuda.default_stream(index).stream_id
    assert all(0 < t < 1e-2 for t in times), times
    # The warm-up and the capture ran on the timer's stream, never on the caller's.
    assert seen and set(seen) == {timer.stream.stream_id}
    for s in sets:
        ref = adapter.reference(s.a, s.b, s.out, 1.0, 0.0, None, None)
        assert adapter.rel_error(s.out, ref) <= tolerance("bf16")


# --- the front door, CuPy, bad input ----------------------------------------------------


@pytest.fixture
def front_door(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A Selector on the installed entry points (plugins load as a user's would)."""
    from unimatmul.cache.protocol import MemoryStore
    from unimatmul.core.plugins import PluginManager
    from unimatmul.tuning.selector import Selector, set_selector

    monkeypatch.delenv("UNIMATMUL_PLUGINS", raising=False)
    selector = Selector(plugins=PluginManager(), store=MemoryStore())
    old = set_selector(selector)
    try:
        yield selector
    finally:
        set_selector(old)


def test_matmul_tunes_through_the_entry_point(front_door: Any) -> None:
    import unimatmul

    backends = front_door.plugins.backends()
    assert "cublaslt" in backends, f"entry points gave {sorted(backends)}: install the package"
    assert backends["cublaslt"].availability() is None
    gen = torch.Generator(device="cuda").manual_seed(1)
    a = torch.randn(512, 256, device="cuda", generator=gen).bfloat16()
    b = torch.randn(256, 1024, device="cuda", generator=gen).bfloat16()
    with unimatmul.mode("tune"):
        out = unimatmul.matmul(a, b)
        again = unimatmul.matmul(a, b)
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    for result in (out, again):
        assert float((result.double() - ref).norm() / ref.norm()) <= tolerance("bf16")
    assert front_door.stats.tuned == 1
    record = next(iter(front_door.store.items()))[2]
    identities = [r.identity for r in record.results]
    assert any(i.startswith("cublaslt/gemm?") for i in identities), identities
    assert record.settings["timer"] == "torch-cuda-graph"
    assert "cublaslt" in record.versions
    print(f"tuned 512x1024x256 bf16 in {record.tune_s * 1e3:.1f} ms; winner {record.winner}")


def test_stored_identity_is_rechecked_after_a_version_change(front_door: Any) -> None:
    from unimatmul.cache.record import TuningRecord

    backend = front_door.plugins.backends()["cublaslt"]
    adapter = adapter_for_kind("torch")
    target = Target(adapter, Device("cuda", torch.cuda.current_device()))
    problem = _problem(256, 512, 128)
    platform = front_door.platform(target)
    good = backend.candidates(problem, target)[0]
    bogus = Candidate.make("cublaslt", "gemm", **(dict(good.params) | {"algo": 99999}))
    for winner, expect_hit in ((good, True), (bogus, False)):
        record = TuningRecord(problem.key, winner.identity, 1e-5, 2e-5, versions={"cublaslt": "0.0.1"})
        front_door.store.put(platform.namespace, problem.key, record)
        found = front_door.lookup(problem, target)
        assert (found is not None) == expect_hit, winner.identity
    assert front_door.stats.invalidated == 1


def test_cupy_arrays() -> None:
    cupy = pytest.importorskip("cupy")
    from unimatmul_backends.cuda.backend import CublasLtBackend

    backend = CublasLtBackend(library="ctypes")
    target = Target(adapter_for_kind("cupy"), Device("cuda", 0))
    problem = _problem(128, 256, 64, "f16", epilogue="bias_relu")
    candidates = backend.candidates(problem, target)
    assert candidates
    for i, candidate in enumerate(candidates):
        err = check_candidate_cupy(cupy, backend, problem, candidate, target, seed=i)
        assert err <= tolerance("f16"), candidate.identity


def check_candidate_cupy(
    cupy: Any, backend: Any, problem: Problem, candidate: Candidate, target: Target, seed: int
) -> float:
    adapter = target.adapter
    ops = make_operands(problem, adapter, target.device, np.random.default_rng(seed))
    runner = backend.prepare(problem, candidate, target)
    adapter.fill_nan(ops.out)
    runner(ops.a, ops.b, ops.out, 1.0, 0.0, ops.bias)
    cupy.cuda.get_current_stream().synchronize()
    ref = adapter.reference(ops.a, ops.b, ops.out, 1.0, 0.0, ops.bias, problem.activation)
    return adapter.rel_error(ops.out, ref)


def test_bad_input_gives_clear_errors_or_default(front_door: Any) -> None:
    import unimatmul

    backend = front_door.plugins.backends()["cublaslt"]
    target = Target(adapter_for_kind("torch"), Device("cuda", 0))
    a = torch.randn(64, 32, device="cuda")
    with pytest.raises(ValueError, match="all operands must be on one device"):
        unimatmul.matmul(a, torch.randn(32, 16))
    with pytest.raises(TypeError, match="both operands must have one dtype"):
        unimatmul.matmul(a.half(), torch.randn(32, 16, device="cuda"))
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match="all operands must be on one device"):
            unimatmul.matmul(a, torch.randn(32, 16, device="cuda:1"))
    # Valid for torch but not for an Lt kernel: the backend says so, and Default runs.
    for problem in (_problem(64, 16, 32, "f64"), _problem(64, 16, 32, epilogue="gelu")):
        with pytest.raises(UnsupportedProblem):
            backend.candidates(problem, target)
    with unimatmul.mode("tune"):
        out64 = unimatmul.matmul(a.double(), torch.randn(32, 16, device="cuda", dtype=torch.float64))
        gelu = unimatmul.matmul(
            a.bfloat16(), torch.randn(32, 16, device="cuda").bfloat16(), activation="gelu"
        )
    assert out64.dtype == torch.float64 and torch.isfinite(out64).all()
    assert gelu.dtype == torch.bfloat16 and torch.isfinite(gelu).all()
    # cuBLASLt offers nothing for these (another kernel source, e.g. the Triton plugin
    # where it is installed, may win the bf16 one).
    winners = {r.winner for _, _, r in front_door.store.items()}
    assert winners and not any(w.startswith("cublaslt/") for w in winners), winners
