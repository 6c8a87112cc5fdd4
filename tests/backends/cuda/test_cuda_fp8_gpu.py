"""Scaled (fp8) GEMMs on a real NVIDIA GPU: cuBLASLt candidates, the API, routing, graphs,
and the native (C++) ``_scaled_mm`` kernel.

Marked ``gpu`` and skipped, with the reason, without a CUDA device with fp8 (compute
capability 8.9 or 9.x). ``scripts/gpu_fp8.sh`` runs this file and the benchmark in one
device call. Every candidate is checked against the float64 product of the dequantised
operands on poisoned outputs (the harness's rule), the ctypes and the nvmath-python
library objects both.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import unimatmul  # noqa: E402
from unimatmul.backend import DEFAULT, Target  # noqa: E402
from unimatmul.core.arrays import Device, adapter_for_kind  # noqa: E402
from unimatmul.core.dtypes import scaled_tolerance  # noqa: E402
from unimatmul.core.errors import UnsupportedProblem  # noqa: E402
from unimatmul.core.problem import Problem  # noqa: E402
from unimatmul.core.scales import make_scaled_operands, scaled_problem, scaled_reference  # noqa: E402

HAVE_FP8 = bool(
    torch.cuda.is_available()
    and torch.version.cuda
    and torch.cuda.get_device_capability() >= (8, 9)
    and torch.cuda.get_device_capability() < (10, 0)
)
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not HAVE_FP8, reason="needs an NVIDIA GPU with fp8 (sm_89 or sm_90) and CUDA torch"),
]

CASES: list[tuple[str, Problem]] = [
    ("tensor-bf16", scaled_problem(128, 256, 512)),
    ("rowwise-bf16", scaled_problem(128, 256, 512, scales="rowwise")),
    ("tensor-m1", scaled_problem(1, 4096, 4096)),
    ("rowwise-m1", scaled_problem(1, 4096, 4096, scales="rowwise")),
    ("rowwise-odd-m", scaled_problem(97, 1024, 256, scales="rowwise")),
    ("tensor-f16-bias", scaled_problem(64, 384, 256, dtype_c="f16", bias=True)),
    ("rowwise-bf16-bias", scaled_problem(64, 384, 256, scales="rowwise", bias=True)),
    ("tensor-f32", scaled_problem(64, 256, 128, dtype_c="f32")),
    ("rowwise-f32", scaled_problem(64, 256, 128, dtype_c="f32", scales="rowwise")),
    ("e5m2-e4m3", scaled_problem(64, 256, 128, dtype_a="f8e5m2", dtype_b="f8e4m3")),
    ("tensor-fast-accum", scaled_problem(256, 512, 2048, fast_accum=True)),
    ("rowwise-fast-accum", scaled_problem(256, 512, 2048, scales="rowwise", fast_accum=True)),
    ("padded-ld", replace(scaled_problem(64, 256, 128, scales="rowwise"), lda=160, ldb=192, ldc=272)),
]


@pytest.fixture(scope="module", params=("ctypes", "nvmath"))
def backend(request: pytest.FixtureRequest) -> Iterator[Any]:
    from unimatmul_backends.cuda.backend import CublasLtBackend

    if request.param == "nvmath":
        pytest.importorskip("nvmath.bindings.cublasLt")
    found = CublasLtBackend(library=request.param)
    assert found.availability() is None, found.availability()
    yield found
    found.close()


@pytest.fixture(scope="module")
def target() -> Target:
    return Target(adapter_for_kind("torch"), Device("cuda", torch.cuda.current_device()))


def run_candidate(backend: Any, problem: Problem, candidate: Any, target: Target, seed: int) -> float:
    ops = make_scaled_operands(problem, target.adapter, target.device, np.random.default_rng(seed))
    runner = backend.prepare(problem, candidate, target)
    ops.out.fill_(float("nan"))
    runner(ops.a, ops.b, ops.out, 1.0, 0.0, ops.bias, ops.scale_a, ops.scale_b)
    torch.cuda.synchronize()
    ref = scaled_reference(target.adapter, ops.a, ops.b, ops.scale_a, ops.scale_b, ops.bias)
    return float(target.adapter.rel_error(ops.out, ref))


@pytest.mark.parametrize(("case", "problem"), CASES, ids=[c[0] for c in CASES])
def test_every_cublaslt_candidate_is_correct(
    backend: Any, target: Target, case: str, problem: Problem
) -> None:
    candidates = backend.candidates(problem, target)
    assert candidates, f"cuBLASLt offered nothing for {problem.key}"
    assert {c.name for c in candidates} == {"gemm"}  # no padded fp8 candidates
    tol = scaled_tolerance(problem.dtype_c, problem.fast_accum)
    errors = {c.identity: run_candidate(backend, problem, c, target, i) for i, c in enumerate(candidates)}
    bad = {k: v for k, v in errors.items() if not v <= tol}
    print(
        f"{case}: {len(candidates)} candidates, errors {min(errors.values()):.2e}..{max(errors.values()):.2e}"
    )
    assert not bad, f"{len(bad)} of {len(errors)} candidates over {tol}: {bad}"


def test_other_layouts_are_refused_cleanly_or_correct(backend: Any, target: Target) -> None:
    """cuBLASLt's documentation gives its fp8 kernels on Ada and Hopper the "TN" form only:
    a row-major B ("NN") must be refused cleanly, and whatever is offered must be right."""
    nn = replace(scaled_problem(128, 256, 512), trans_b=False, ldb=256)
    try:
        found = backend.candidates(nn, target)
    except UnsupportedProblem as exc:
        print(f"fp8 NN refused: {exc}")
        found = []
    print(f"fp8 NN on {torch.cuda.get_device_name()}: {len(found)} candidates")
    for i, candidate in enumerate(found):
        err = run_candidate(backend, nn, candidate, target, 70 + i)
        assert err <= scaled_tolerance("bf16"), f"{candidate.identity}: relative error {err}"


def test_exhaustive_candidates_are_correct(
    backend: Any, target: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    problem = scaled_problem(512, 1024, 1024, scales="rowwise")
    monkeypatch.setenv("UNIMATMUL_LT_EXHAUSTIVE", "0")
    heuristic = set(backend.candidates(problem, target))
    monkeypatch.setenv("UNIMATMUL_LT_EXHAUSTIVE", "1")
    monkeypatch.setenv("UNIMATMUL_LT_EXHAUSTIVE_MAX", "16")
    monkeypatch.setenv("UNIMATMUL_LT_EXHAUSTIVE_CHECKS", "600")
    found = backend.candidates(problem, target)
    extra = [c for c in found if c not in heuristic]
    print(f"fp8 exhaustive search: {backend.last_search}; {len(extra)} beyond {len(heuristic)} heuristic")
    assert backend.last_search["checked"] > 0
    tol = scaled_tolerance("bf16")
    for i, candidate in enumerate(extra):
        err = run_candidate(backend, problem, candidate, target, 50 + i)
        assert err <= tol, f"{candidate.identity}: relative error {err}"


def test_a_scaled_runner_is_captured_in_a_cuda_graph(backend: Any, target: Target) -> None:
    problem = scaled_problem(256, 512, 256, scales="rowwise", bias=True)
    runner = backend.prepare(problem, backend.candidates(problem, target)[0], target)
    adapter = target.adapter
    first = make_scaled_operands(problem, adapter, target.device, np.random.default_rng(1))
    second = make_scaled_operands(problem, adapter, target.device, np.random.default_rng(2))
    args = (first.a, first.b, first.out, 1.0, 0.0, first.bias, first.scale_a, first.scale_b)
    runner(*args)  # warm-up outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        runner(*args)
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    for dst, src in ((first.a, second.a), (first.b, second.b), (first.bias, second.bias)):
        dst.copy_(src)
    first.scale_a.copy_(second.scale_a)
    first.scale_b.copy_(second.scale_b)
    first.out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref = scaled_reference(adapter, second.a, second.b, second.scale_a, second.scale_b, second.bias)
    assert adapter.rel_error(first.out, ref) <= scaled_tolerance("bf16")


# --- the API and routing ------------------------------------------------------------------------


def _isolated_selector(monkeypatch: pytest.MonkeyPatch, native_kernels: str) -> Iterator[Any]:
    """A Selector over a memory store, routing off and its counts reset afterwards."""
    from unimatmul.cache.protocol import MemoryStore
    from unimatmul.tuning.selector import Selector, set_selector

    monkeypatch.setenv("UNIMATMUL_TORCH_NATIVE", native_kernels)
    monkeypatch.delenv("UNIMATMUL_MODE", raising=False)
    found = Selector(store=MemoryStore())
    # These tests count the calls a choice serves: no confirmation windows (which send half
    # of a choice's first calls to Default) unless a test opens them.
    found.confirm_calls = 0
    old = set_selector(found)
    try:
        yield found
    finally:
        import unimatmul.torch as ut

        ut.disable()
        ut.reset_stats()
        set_selector(old)


@pytest.fixture
def selector(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The Python kernels only."""
    yield from _isolated_selector(monkeypatch, "0")


def _linear(m: int, n: int, k: int, scales: str, seed: int = 0) -> tuple[Any, ...]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(n, k, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    if scales == "rowwise":
        sa = torch.rand(m, 1, device="cuda", generator=gen) + 0.5
        sb = torch.rand(1, n, device="cuda", generator=gen) + 0.5
    else:
        sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(1.5, device="cuda")
    return a, w.t(), sa, sb


@pytest.mark.parametrize("scales", ["tensor", "rowwise"])
def test_scaled_matmul_tunes_and_serves(selector: Any, scales: str) -> None:
    a, b, sa, sb = _linear(256, 1024, 512, scales)
    with unimatmul.mode("tune"):
        out = unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=torch.bfloat16)
    ref = scaled_reference(adapter_for_kind("torch"), a, b, sa, sb, None)
    assert float((out.double() - ref).norm() / ref.norm()) <= scaled_tolerance("bf16")
    (record,) = [r for _, _, r in selector.store.items(None)]
    statuses = {r.identity: r.status for r in record.results}
    print(f"{scales}: winner {record.winner}, {len(statuses)} candidates, default {record.default_s}")
    assert any(i.startswith("cublaslt/") and s in ("ok", "pruned") for i, s in statuses.items()), statuses
    again = unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert float((again.double() - ref).norm() / ref.norm()) <= scaled_tolerance("bf16")


def test_the_api_says_what_cuda_wants() -> None:
    a, b, sa, sb = _linear(64, 128, 64, "tensor")
    with pytest.raises(ValueError, match="a must be row-major and b column-major"):
        unimatmul.scaled_matmul(a, b.contiguous(), sa, sb, out_dtype=torch.bfloat16)


def test_routed_scaled_mm_runs_tuned_kernels_and_graphs(
    selector: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import unimatmul.torch as ut

    # Whatever its margin, the kernel is captured (confirm.default_in_graphs: a slim one is not).
    monkeypatch.setenv("UNIMATMUL_SCALED_GRAPH_MIN_GAIN", "0")

    a, b, sa, sb = _linear(128, 2048, 1024, "rowwise")
    ut.enable()
    with unimatmul.mode("tune"):
        torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    _store_a_kernel(selector)
    ut.clear_plans()
    ut.reset_stats()
    out = torch.empty(128, 2048, device="cuda", dtype=torch.bfloat16)
    static = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        static = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    new = _linear(128, 2048, 1024, "rowwise", seed=9)
    for dst, src in zip((a, b, sa, sb), new, strict=True):
        dst.copy_(src)
    graph.replay()
    out.copy_(static)
    torch.cuda.synchronize()
    ref = scaled_reference(adapter_for_kind("torch"), *new, None)
    assert float((out.double() - ref).norm() / ref.norm()) <= scaled_tolerance("bf16")
    stats = ut.scaled_stats()
    assert stats["kernel"] == 2, stats  # the eager call and the captured one


def _store_a_kernel(selector: Any) -> None:
    """Routing must be seen running a kernel: when Default won the one tuned problem, store
    the fastest checked cuBLASLt candidate as its winner."""
    (record,) = [r for _, _, r in selector.store.items(None)]
    if record.winner == DEFAULT.identity:
        best = min(
            (r for r in record.results if r.identity.startswith("cublaslt/") and r.median_s),
            key=lambda r: r.median_s or 1.0,
        )
        record = replace(record, winner=best.identity, winner_s=best.median_s)
        (namespace,) = {ns for ns, _, _ in selector.store.items(None)}
        selector.store.put(namespace, record.problem, record)


def test_torch_compile_keeps_scaled_mm_routed(selector: Any) -> None:
    import unimatmul.torch as ut

    a, b, sa, sb = _linear(64, 1024, 512, "tensor")
    ut.enable()
    with unimatmul.mode("tune"):
        torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    ut.reset_stats()

    def layer(x: Any, w_t: Any, sx: Any, sw: Any) -> Any:
        return torch._scaled_mm(x, w_t, sx, sw, out_dtype=torch.bfloat16).float().relu()

    out = torch.compile(layer)(a, b, sa, sb)
    ref = scaled_reference(adapter_for_kind("torch"), a, b, sa, sb, None).relu()
    assert float((out.double() - ref).norm() / ref.norm()) <= scaled_tolerance("bf16")
    assert ut.scaled_stats()["routed"] >= 1


def test_conformance_of_cublaslt_on_scaled_problems(monkeypatch: pytest.MonkeyPatch) -> None:
    """The conformance suite's scaled cases (quick matrix) on the real cuBLASLt backend."""
    from unimatmul_backends.cuda.backend import CublasLtBackend
    from unimatmul_conformance.suite import Suite

    monkeypatch.setenv("UNIMATMUL_LT_HEURISTICS", "3")  # a few algos per case: this is one test of many
    suite = Suite(CublasLtBackend(library="ctypes"), quick=True)
    scaled = [c for c in suite.plan() if c.case is not None and c.case.problem.is_scaled]
    results = [suite.run_check(c) for c in scaled]
    failed = [f"{r.id}: {r.why}" for r in results if r.status == "failed"]
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "failed", "skipped")}
    print(f"conformance, scaled cases: {counts}")
    assert counts["passed"] > 50
    assert not failed, failed[:5]


# --- the native _scaled_mm kernel -----------------------------------------------------------------


@pytest.fixture
def native_selector(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Like ``selector``, with the native kernels on (their GPU build: a failed build fails)."""
    from unimatmul.torch import native

    assert native.load(cuda=True), f"the native kernels' GPU build failed: {native.failure(True)}"
    yield from _isolated_selector(monkeypatch, "auto")


def _rel(out: Any, ref: Any) -> float:
    return float((out.double() - ref).norm() / ref.norm())


def _native_kernel_entry(selector: Any, a: Any, b: Any, sa: Any, sb: Any, bias: Any) -> Any:
    """Tune the call, make a cuBLASLt kernel its choice, and return its plan once the native
    table holds its SCALED_LT entry (made by the first call after, in Python)."""
    import unimatmul.torch as ut
    from unimatmul.torch import native, scaled_routing

    ut.enable()
    assert "CUDA" in scaled_routing._router.native_keys and native.has_lt()
    with unimatmul.mode("tune"):
        torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16)
    _store_a_kernel(selector)
    ut.clear_plans()
    ut.reset_stats()
    torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16)
    (plan,) = scaled_routing.TABLE.plans.values()
    assert plan.native == native.SCALED_LT, (plan.label, plan.native, plan.reason)
    return plan


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "bias"])
@pytest.mark.parametrize("scales", ["tensor", "rowwise"])
def test_native_scaled_mm_makes_the_lt_call(native_selector: Any, scales: str, bias: bool) -> None:
    """A tuned cuBLASLt kernel is called from C++ (counted by the SCALED table), with fresh
    scale tensors of other values on every call: the scale pointers follow them."""
    import unimatmul.torch as ut
    from unimatmul.torch import native

    a, b, sa, sb = _linear(128, 2048, 1024, scales)
    bias_t = torch.randn(2048, device="cuda").to(torch.bfloat16) if bias else None
    # All alive at once, so at other addresses; other values, so a stale pointer shows.
    fresh = [(sa * (1.0 + 0.25 * i), sb * (1.5 - 0.2 * i)) for i in range(6)]
    expected = [torch._scaled_mm(a, b, x, y, bias=bias_t, out_dtype=torch.bfloat16) for x, y in fresh]
    plan = _native_kernel_entry(native_selector, a, b, sa, sb, bias_t)
    outs = [torch._scaled_mm(a, b, x, y, bias=bias_t, out_dtype=torch.bfloat16) for x, y in fresh]
    torch.cuda.synchronize()
    assert native.counts(table=native.SCALED) == {plan.ident: len(fresh)}
    tol = scaled_tolerance("bf16")
    adapter = adapter_for_kind("torch")
    for (x, y), out, want in zip(fresh, outs, expected, strict=True):
        ref = scaled_reference(adapter, a, b, x, y, bias_t)
        assert out.dtype == torch.bfloat16 and out.shape == want.shape
        assert _rel(out, ref) <= tol and _rel(want, ref) <= tol
        assert _rel(out, want.double()) <= 2 * tol
    stats = ut.scaled_stats()
    assert (stats["kernel"], stats["routed"]) == (len(fresh) + 1, len(fresh) + 1), stats


def test_native_scaled_lt_call_on_another_stream_and_in_a_graph(
    native_selector: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import unimatmul.torch as ut
    from unimatmul.torch import native

    # Whatever its margin, the kernel is captured (confirm.default_in_graphs: a slim one is not).
    monkeypatch.setenv("UNIMATMUL_SCALED_GRAPH_MIN_GAIN", "0")

    a, b, sa, sb = _linear(128, 2048, 1024, "rowwise")
    plan = _native_kernel_entry(native_selector, a, b, sa, sb, None)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)  # a workspace of its own
    torch.cuda.current_stream().wait_stream(side)
    capture = torch.cuda.Stream()
    capture.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(capture):
        # Warm-up on the capture stream: its workspace cannot be allocated under capture.
        static = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
        graph.capture_begin()
        static = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
        graph.capture_end()
    torch.cuda.current_stream().wait_stream(capture)
    adapter = adapter_for_kind("torch")
    first = scaled_reference(adapter, a, b, sa, sb, None)
    new = _linear(128, 2048, 1024, "rowwise", seed=9)
    for dst, src in zip((a, b, sa, sb), new, strict=True):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    tol = scaled_tolerance("bf16")
    assert _rel(on_side, first) <= tol
    assert _rel(static, scaled_reference(adapter, *new, None)) <= tol
    assert native.counts(table=native.SCALED) == {plan.ident: 3}  # side, warm-up, captured
    assert ut.scaled_stats()["kernel"] == 4


def test_native_scaled_mm_keeps_pytorch_s_kernel_and_errors(native_selector: Any) -> None:
    """Nothing tuned: PyTorch's kernel, called from C++; a call it refuses raises its error."""
    import unimatmul.torch as ut
    from unimatmul.torch import native, scaled_routing

    a, b, sa, sb = _linear(64, 1024, 512, "rowwise")
    expected = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    fp8_out = torch._scaled_mm(a, b, sa.new_ones(()), sb.new_ones(()))  # an fp8 output: not described
    with pytest.raises(RuntimeError) as own_error:
        torch._scaled_mm(a, b[:256], sa, sb, out_dtype=torch.bfloat16)
    ut.enable()
    for _ in range(3):
        assert torch.equal(torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16), expected)
        fp8 = torch._scaled_mm(a, b, sa.new_ones(()), sb.new_ones(()))
        assert torch.equal(fp8.float(), fp8_out.float())
        with pytest.raises(RuntimeError) as routed_error:
            torch._scaled_mm(a, b[:256], sa, sb, out_dtype=torch.bfloat16)
        assert str(routed_error.value) == str(own_error.value)
    kinds = native.kinds(native.SCALED)
    assert len(kinds) == 3 and set(kinds.values()) == {native.DEFAULT}
    assert sum(native.counts(table=native.SCALED).values()) == 2 + 2  # the calls torch ran, after the first
    stats = ut.scaled_stats()
    # The refused call counts once: the Python kernel counts before PyTorch raises, the native
    # kernel counts the calls that return.
    assert (stats["default"], stats["passthrough"]) == (3, 3 + 1)
    assert len(scaled_routing.plans()) == 3


@pytest.mark.parametrize("min_gain", [-100.0, 0.99], ids=["kept", "reverted"])
def test_a_native_scaled_entry_runs_its_confirmation_window(native_selector: Any, min_gain: float) -> None:
    """A SCALED_LT choice in its window: the native entry alternates it with PyTorch's kernel,
    timed with CUDA events, and becomes SCALED_LT or DEFAULT by the verdict."""
    import unimatmul.torch as ut
    from unimatmul.torch import native, scaled_routing
    from unimatmul.tuning.harness import HarnessConfig

    a, b, sa, sb = _linear(128, 2048, 1024, "tensor")
    _native_kernel_entry(native_selector, a, b, sa, sb, None)
    native_selector.confirm_calls = 4
    native_selector.settings = HarnessConfig(min_gain=min_gain)  # windows only: tuning is done
    ut.clear_plans()
    ut.reset_stats()
    keep = min_gain < 0
    ref = scaled_reference(adapter_for_kind("torch"), a, b, sa, sb, None)
    outs = []
    for _ in range(60):  # a full window, and a few calls to read its last events
        outs.append(torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16))
        (plan,) = scaled_routing.TABLE.plans.values()
        if plan.source in ("confirmed", "reverted"):
            break
    assert plan.source == ("confirmed" if keep else "reverted")
    assert native.kinds(native.SCALED)[plan.ident] == (native.SCALED_LT if keep else native.DEFAULT)
    outs.extend(torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16) for _ in range(3))
    torch.cuda.synchronize()
    tol = scaled_tolerance("bf16")
    assert all(_rel(out, ref) <= tol for out in outs)
    assert ut.scaled_stats()["confirm"][plan.source] == 1


# --- block-scaled products (1x128 groups of A, 128x128 blocks of B) -----------------------

BLOCK_CASES = [
    ("block-m1", scaled_problem(1, 4096, 7168, scales="block")),
    ("block-m16", scaled_problem(16, 2112, 7168, scales="block")),
    ("block-m256-bias", scaled_problem(256, 7168, 2048, scales="block", bias=True)),
    ("block-partial-blocks", scaled_problem(33, 144, 272, scales="block")),
]
HOPPER = HAVE_FP8 and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.skipif(not HOPPER, reason="torch's block-scaled product runs on sm90 only")
@pytest.mark.parametrize(("case", "problem"), BLOCK_CASES, ids=[c[0] for c in BLOCK_CASES])
def test_block_scaled_default_and_every_candidate_are_correct(
    backend: Any, target: Target, case: str, problem: Problem
) -> None:
    """torch's own block-scaled product (the Default) and every cuBLASLt candidate (the
    VEC128_32F / BLK128x128_32F modes) against the float64 product of the dequantised inputs."""
    from unimatmul.core.runners import default_runner

    tol = scaled_tolerance(problem.dtype_c, problem.fast_accum)
    ops = make_scaled_operands(problem, target.adapter, target.device, np.random.default_rng(0))
    ref = scaled_reference(target.adapter, ops.a, ops.b, ops.scale_a, ops.scale_b, ops.bias)
    default: Any = default_runner(problem, target.adapter)
    ops.out.fill_(float("nan"))
    try:
        default(ops.a, ops.b, ops.out, 1.0, 0.0, ops.bias, ops.scale_a, ops.scale_b)
    except (RuntimeError, NotImplementedError) as exc:  # cuBLASLt < 12.9: torch says so
        pytest.skip(f"torch's block-scaled product does not run here: {str(exc).splitlines()[0]}")
    torch.cuda.synchronize()
    assert float(target.adapter.rel_error(ops.out, ref)) <= tol
    try:
        candidates = backend.candidates(problem, target)
    except UnsupportedProblem as exc:
        print(f"{case}: cuBLASLt offers no block-scaled candidates here: {exc}")
        return
    errors = {c.identity: run_candidate(backend, problem, c, target, i) for i, c in enumerate(candidates)}
    print(f"{case}: {len(candidates)} cuBLASLt candidates, worst error {max(errors.values(), default=0):.2e}")
    assert all(v <= tol for v in errors.values()), errors


@pytest.mark.skipif(not HOPPER, reason="torch's block-scaled product runs on sm90 only")
def test_block_scaled_matmul_tunes_and_matches_the_reference(tmp_path: Any) -> None:
    from unimatmul.testing import isolated_selector

    m, n, k = 16, 2112, 7168
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    sa = (torch.rand(k // 128, m, device="cuda") + 0.5).t()
    sb = (torch.rand(-(-n // 128), k // 128, device="cuda") + 0.5).t()
    ref = scaled_reference(adapter_for_kind("torch"), a, w.t(), sa, sb, None)
    with isolated_selector(tmp_path / "cache.msgpack") as selector, unimatmul.mode("tune"):
        try:
            out = unimatmul.scaled_matmul(a, w.t(), sa, sb, out_dtype=torch.bfloat16)
        except (unimatmul.DefaultFailed, NotImplementedError) as exc:
            pytest.skip(f"torch's block-scaled product does not run here: {exc}")
        (record,) = [r for _, _, r in selector.store.items(None)]
    assert float(adapter_for_kind("torch").rel_error(out, ref)) <= scaled_tolerance("bf16")
    assert ":scales=block1x128,block128x128:" in record.problem
    print(f"block-scaled {m}x{n}x{k}: winner {record.winner}, {len(record.results)} candidates")
