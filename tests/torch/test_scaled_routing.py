"""Routing ``torch._scaled_mm`` (fp8 with scales) through unimatmul, on the CPU.

torch's CPU build has fp8 tensors and a ``_scaled_mm``, which is the Default here; the
kernel source is ``scaled_fakes.ScaledFakeBackend`` (dequantises in float64), since no
fp8 GPU kernel can run on this machine. Every test runs with the Python and the native
kernels at the CPU key (the ``env`` fixture). With the native ones, the native
``_scaled_mm`` kernel serves the CPU key (``scaled_routing.NATIVE_KEYS``), so that its
table, its way back to the Python kernel and PyTorch's errors are checked here; its
cuBLASLt call runs on the GPU only (``tests/backends/cuda/test_cuda_fp8_gpu.py``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import fp8_caps
import pytest
from scaled_fakes import ScaledFakeBackend
from torch_helpers import Env

import unimatmul
import unimatmul.torch as ut
from unimatmul.backend import Target
from unimatmul.cache.record import TuningRecord, mark_checked
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.core.scales import scaled_problem_of, scaled_reference
from unimatmul.testing import registered
from unimatmul.torch import native, routing, scaled_routing
from unimatmul.tuning.trust import CheckingRunner

torch = pytest.importorskip("torch")

NATIVE = pytest.mark.parametrize("env", ["native"], indirect=True)


@pytest.fixture(autouse=True)
def _no_windows(request: pytest.FixtureRequest) -> None:
    """Most tests here count the calls a stored choice serves: no confirmation windows
    (which send half of a choice's first calls to Default); the window test opens them."""
    if "env" in request.fixturenames:
        request.getfixturevalue("env").selector.confirm_calls = 0


def _operands(m: int, n: int, k: int, scales: str, seed: int = 0) -> tuple[Any, Any, Any, Any]:
    # torch 2.11 on the GPU machine takes no row-wise scales on the CPU; under an ISA cap an
    # AMX CPU's torch cannot compute CPU fp8 at all (tests/fp8_caps.py).
    fp8_caps.skip_unless_runs(scales)
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(n, k, generator=gen).to(torch.float8_e4m3fn)
    if scales == "rowwise":
        return a, w.t(), torch.rand(m, 1, generator=gen) + 0.5, torch.rand(1, n, generator=gen) + 0.5
    return a, w.t(), torch.tensor(0.5), torch.tensor(1.25)


def _store_kernel_winner(env: Env, a: Any, b: Any, sa: Any, sb: Any, name: str, out: str = "bf16") -> None:
    adapter = adapter_for_kind("torch")
    problem = scaled_problem_of(adapter, a, b, sa, sb, out_dtype=out)
    namespace = env.selector.platform(Target(adapter, CPU)).namespace
    record = TuningRecord(problem=problem.key, winner=f"{name}/dequantise", winner_s=1e-6, default_s=2e-6)
    env.selector.store.put(namespace, problem.key, record)


@pytest.mark.parametrize("scales", ["tensor", "rowwise"])
def test_routed_scaled_mm_is_torchs_own_until_something_is_tuned(env: Env, scales: str) -> None:
    a, b, sa, sb = _operands(24, 32, 48, scales)
    expected = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    ut.enable()
    for _ in range(3):
        got = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
        assert torch.equal(got, expected)
    stats = ut.scaled_stats()
    assert (stats["routed"], stats["default"], stats["kernel"]) == (3, 3, 0)
    (plan,) = scaled_routing.plans()
    assert plan.problem is not None and plan.problem.scale_a == scales and plan.label.endswith("[default]")


def test_a_stored_kernel_runs_for_every_call(env: Env) -> None:
    fake = ScaledFakeBackend("fake-scaled")
    a, b, sa, sb = _operands(16, 48, 32, "rowwise")
    bias = torch.randn(48).to(torch.bfloat16)
    with registered(env.selector.plugins, fake):
        _store_kernel_winner(env, a, b, sa, sb, "fake-scaled")
        # The bias makes another problem: Default for it (nothing stored), the kernel above for the rest.
        ut.enable()
        outs = [torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16) for _ in range(4)]
        with_bias = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16)
    ref = scaled_reference(adapter_for_kind("torch"), a, b, sa, sb, None)
    for out in outs:
        assert out.dtype == torch.bfloat16 and float((out.double() - ref).norm() / ref.norm()) < 3e-2
    assert fake.calls == 4
    assert torch.equal(with_bias, torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16))
    stats = ut.scaled_stats()
    assert stats["kernel"] == 4 and stats["by_label"]["unimatmul::scaled_mm [fake-scaled/dequantise]"] == 4


def test_tune_mode_measures_from_inside_the_kernel_without_recursing(env: Env) -> None:
    fake = ScaledFakeBackend("fake-scaled")
    a, b, sa, sb = _operands(32, 64, 64, "tensor")
    with registered(env.selector.plugins, fake):
        ut.enable()
        with unimatmul.mode("tune"):
            out = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.float16)
    ref = scaled_reference(adapter_for_kind("torch"), a, b, sa, sb, None)
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-2
    records = {r.problem: r for _, _, r in env.selector.store.items(None)}
    scaled = [r for key, r in records.items() if key.startswith("scaled_gemm:")]
    assert len(scaled) == 1
    assert {r.identity for r in scaled[0].results} == {"default/default", "fake-scaled/dequantise"}
    # The harness's float64 products (its reference, an aten::mm) were not routed, so not tuned.
    # (torch's CPU _scaled_mm computes through an f32 aten::mm, which routing does see when
    # Default runs outside the tuning: that one may be tuned in this mode, as any mm would.)
    assert not [key for key in records if ":f64." in key or key.startswith("gemm:f64")]
    assert ut.scaled_stats()["by_source"] == {"tuned": 1}


def test_calls_unimatmul_does_not_describe_pass_through(env: Env) -> None:
    a, b, sa, sb = _operands(16, 32, 32, "tensor")
    ut.enable()
    fp8_out = torch._scaled_mm(a, b, sa, sb)  # out_dtype None: an fp8 output
    assert fp8_out.dtype == torch.float8_e4m3fn
    with_result_scale = torch._scaled_mm(
        a, b, sa, sb, scale_result=torch.tensor(2.0), out_dtype=torch.bfloat16
    )
    assert with_result_scale.dtype == torch.bfloat16
    ut.disable()
    assert torch.equal(fp8_out.float(), torch._scaled_mm(a, b, sa, sb).float())
    stats = ut.scaled_stats()
    assert stats["passthrough"] == 2 and stats["routed"] == 0


def test_what_torch_accepts_and_unimatmul_does_not_describe_is_torchs(env: Env) -> None:
    a, b, sa, sb = _operands(16, 32, 32, "tensor")
    bias = torch.randn(32)
    own = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.float32)  # the CPU takes an f32 bias
    with pytest.raises(RuntimeError) as own_error:
        torch._scaled_mm(a, b[:16], sa, sb, out_dtype=torch.bfloat16)
    ut.enable()
    for _ in range(2):  # the second call meets the key's entry where the native kernel serves
        assert torch.equal(torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.float32), own)
        with pytest.raises(RuntimeError) as routed_error:
            torch._scaled_mm(a, b[:16], sa, sb, out_dtype=torch.bfloat16)
        assert str(routed_error.value) == str(own_error.value)
    reasons = sorted(p.reason for p in scaled_routing.plans())
    assert "bias must be bf16 or f16" in reasons[0] and "contracted dimension" in reasons[1]


@pytest.mark.parametrize("mode", ["cached", "tune"])
def test_a_block_scaled_call_where_torch_has_none_is_torchs_own_error(env: Env, mode: str) -> None:
    """Block scales (1x128 / 128x128, torch's layouts) are a scaled Problem; on a CPU torch
    has no block-scaled product, so the routed call is PyTorch's, with its own error, and
    nothing is tuned or stored for it."""
    m, n, k = 5, 256, 384
    a = torch.randn(m, k).to(torch.float8_e4m3fn)
    w = torch.randn(n, k).to(torch.float8_e4m3fn)
    sa, sb = (torch.rand(3, m) + 0.5).t(), (torch.rand(2, 3) + 0.5).t()
    problem = scaled_problem_of(adapter_for_kind("torch"), a, w.t(), sa, sb, out_dtype="bf16")
    assert problem.is_block_scaled
    with pytest.raises((RuntimeError, ValueError)) as own_error:
        torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16)
    ut.enable()
    with unimatmul.mode(mode):
        for _ in range(2):  # the second call meets the key's entry where the native kernel serves
            with pytest.raises(type(own_error.value)) as routed_error:
                torch._scaled_mm(a, w.t(), sa, sb, out_dtype=torch.bfloat16)
            assert str(routed_error.value) == str(own_error.value)
    (plan,) = scaled_routing.plans()
    ut.disable()
    assert plan.runner is None and plan.reason == "torch has no block-scaled product on cpu"
    assert list(env.selector.store.items(None)) == []


def test_a_failing_kernel_falls_back_to_torch(env: Env) -> None:
    broken = ScaledFakeBackend("fake-broken", "raise_run")
    a, b, sa, sb = _operands(8, 16, 32, "rowwise")
    expected = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    with registered(env.selector.plugins, broken):
        _store_kernel_winner(env, a, b, sa, sb, "fake-broken")
        ut.enable()
        with pytest.warns(RuntimeWarning, match="fake-broken/dequantise failed"):
            first = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
        second = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert torch.equal(first, expected) and torch.equal(second, expected)
    assert broken.calls == 1
    assert ut.scaled_stats()["by_source"] == {"fallback": 2}


def test_torch_compile_keeps_scaled_mm_routed(env: Env) -> None:
    fake = ScaledFakeBackend("fake-scaled")
    a, b, sa, sb = _operands(16, 48, 32, "tensor")

    def layer(x: Any, w_t: Any, sx: Any, sw: Any) -> Any:
        return torch._scaled_mm(x, w_t, sx, sw, out_dtype=torch.bfloat16).float().relu()

    with registered(env.selector.plugins, fake):
        _store_kernel_winner(env, a, b, sa, sb, "fake-scaled")
        ut.enable()
        compiled = torch.compile(layer, backend="inductor")
        out = compiled(a, b, sa, sb)
        out = compiled(a, b, sa, sb)
    ref = scaled_reference(adapter_for_kind("torch"), a, b, sa, sb, None).relu()
    assert float((out.double() - ref).norm() / ref.norm()) < 3e-2
    assert fake.calls == 2  # the compiled graph called unimatmul::scaled_mm, which ran the kernel


def test_the_inductor_pass_rewrites_scaled_mm_nodes() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    from unimatmul.torch import compiled

    compiled.define_ops()
    a, b, sa, sb = _operands(16, 32, 32, "tensor")

    def f(x: Any, w_t: Any, sx: Any, sw: Any) -> Any:
        bf16 = torch._scaled_mm(x, w_t, sx, sw, out_dtype=torch.bfloat16)
        fp8 = torch._scaled_mm(x, w_t, sx, sw)  # an fp8 output: left to Inductor
        return bf16, fp8

    graph = make_fx(f, tracing_mode="fake")(a, b, sa, sb).graph
    assert compiled.rewrite(graph) == 1
    targets = [n.target for n in graph.nodes if n.op == "call_function"]
    assert torch.ops.unimatmul.scaled_mm.default in targets
    assert torch.ops.aten._scaled_mm.default in targets


# --- the native kernel ---------------------------------------------------------------------------


def _scaled_counts() -> dict[int, int]:
    return native.counts(table=native.SCALED)


@NATIVE
def test_a_known_scaled_key_is_served_without_python(env: Env) -> None:
    a, b, _, _ = _operands(24, 32, 48, "tensor")
    # A fresh scale tensor per call, each of another value: the key stays, the scales do not.
    scales = [(torch.tensor(0.25 * (i + 1)), torch.tensor(1.5 - 0.25 * i)) for i in range(5)]
    expected = [torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16) for sa, sb in scales]
    ut.enable()
    assert "CPU" in scaled_routing._router.native_keys  # the test mode: native at the CPU key too
    outs = [torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16) for sa, sb in scales]
    (plan,) = scaled_routing.TABLE.plans.values()
    assert plan.native == native.DEFAULT
    # The first call went through Python (which put the entry); the native table counted the rest.
    assert _scaled_counts() == {plan.ident: 4}
    stats = ut.scaled_stats()
    assert (stats["routed"], stats["default"], stats["kernel"]) == (5, 5, 0)
    for out, want in zip(outs, expected, strict=True):
        assert torch.equal(out, want)
    ut.disable()
    torch._scaled_mm(a, b, *scales[0], out_dtype=torch.bfloat16)
    assert ut.scaled_stats()["routed"] == 5  # PyTorch's own kernel again: nothing counted


@NATIVE
def test_each_scaled_call_form_is_its_own_entry(env: Env) -> None:
    a, b, sa, sb = _operands(16, 32, 32, "tensor")
    bias = torch.randn(32).to(torch.bfloat16)
    forms = [
        {"out_dtype": torch.bfloat16},
        {"out_dtype": torch.float32},
        {"out_dtype": torch.bfloat16, "use_fast_accum": True},
        {"out_dtype": torch.bfloat16, "bias": bias},
    ]
    ut.enable()
    for _ in range(2):
        for form in forms:
            torch._scaled_mm(a, b, sa, sb, **form)
    torch._scaled_mm(a, b, sa.reshape(1, 1), sb, out_dtype=torch.bfloat16)  # a scale of another shape
    assert sorted(_scaled_counts().values()) == [1] * len(forms)  # each form's second call
    assert native.size(native.SCALED) == len(scaled_routing.plans()) == len(forms) + 1
    assert ut.scaled_stats()["routed"] == 2 * len(forms) + 1


@NATIVE
def test_a_python_only_kernel_is_reached_through_the_slow_op(env: Env) -> None:
    fake = ScaledFakeBackend("fake-scaled")  # its runner offers no native call
    a, b, sa, sb = _operands(16, 48, 32, "tensor")
    with registered(env.selector.plugins, fake):
        _store_kernel_winner(env, a, b, sa, sb, "fake-scaled")
        ut.enable()
        outs = [torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16) for _ in range(3)]
    (plan,) = scaled_routing.plans()
    assert native.kinds(native.SCALED) == {plan.ident: native.PYTHON}
    assert fake.calls == 3 and not _scaled_counts()
    assert ut.scaled_stats()["kernel"] == 3
    ref = scaled_reference(adapter_for_kind("torch"), a, b, sa, sb, None)
    for out in outs:
        assert float((out.double() - ref).norm() / ref.norm()) < 3e-2


@NATIVE
def test_a_scaled_launch_the_build_cannot_make_is_reached_through_the_slow_op(env: Env) -> None:
    """A runner offering a scaled kernel's launch (a Triton fp8 kernel's NativeCall, scale
    pointers among its parameters): the CPU build makes no launch, so its entry is PYTHON
    and every call runs the runner in Python, right (the GPU build refuses a launch entry
    for CPU tensors when it is put: the Python kernel serves the key the same way)."""
    from unimatmul.backend import NativeCall

    roles = NativeCall.LAUNCH_ROLES
    words = [1, 2, 3, 4, 8, 1, 1, 128, 0, 0, 0, 5]
    for role in ("a", "b", "out", "scale_a", "scale_b"):
        words += [roles[role], 8, 0]
    fake = ScaledFakeBackend("fake-launch", offers=NativeCall("launch", words))
    a, b, sa, sb = _operands(16, 48, 32, "rowwise")
    with registered(env.selector.plugins, fake):
        _store_kernel_winner(env, a, b, sa, sb, "fake-launch")
        ut.enable()
        outs = [torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16) for _ in range(3)]
    (plan,) = scaled_routing.plans()
    if not native.has_lt():
        assert native.kinds(native.SCALED) == {plan.ident: native.PYTHON}
    assert fake.calls == 3 and not _scaled_counts()
    assert ut.scaled_stats()["kernel"] == 3
    ref = scaled_reference(adapter_for_kind("torch"), a, b, sa, sb, None)
    for out in outs:
        assert float((out.double() - ref).norm() / ref.norm()) < 3e-2


@NATIVE
def test_a_mode_block_and_scale_result_go_to_python(env: Env) -> None:
    a, b, sa, sb = _operands(16, 32, 32, "tensor")
    ut.enable()
    torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    (plan,) = scaled_routing.plans()
    with unimatmul.mode("cached"):  # the key's own mode, but a block: Python reads it
        torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert not _scaled_counts() and plan.calls == 2
    torch._scaled_mm(a, b, sa, sb, scale_result=torch.tensor(2.0), out_dtype=torch.bfloat16)
    torch._scaled_mm(a, b, sa, sb, scale_result=torch.tensor(2.0), out_dtype=torch.bfloat16)
    assert native.size(native.SCALED) == 1  # no entry for scale_result
    stats = ut.scaled_stats()
    assert (stats["default"], stats["passthrough"]) == (2, 2)


@NATIVE
def test_a_failing_kernel_s_entry_becomes_pytorch_s(env: Env) -> None:
    broken = ScaledFakeBackend("fake-broken", "raise_run")
    a, b, sa, sb = _operands(8, 16, 32, "tensor")
    expected = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    with registered(env.selector.plugins, broken):
        _store_kernel_winner(env, a, b, sa, sb, "fake-broken")
        ut.enable()
        with pytest.warns(RuntimeWarning, match="fake-broken/dequantise failed"):
            torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
        outs = [torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16) for _ in range(2)]
    (plan,) = scaled_routing.TABLE.plans.values()
    assert native.kinds(native.SCALED) == {plan.ident: native.DEFAULT}
    assert _scaled_counts() == {plan.ident: 2} and broken.calls == 1
    assert all(torch.equal(out, expected) for out in outs)


@NATIVE
def test_scaled_and_routing_plans_clear_apart(env: Env) -> None:
    a, b, sa, sb = _operands(16, 32, 32, "tensor")
    x, w = torch.randn(8, 16), torch.randn(16, 4)
    ut.enable()
    for _ in range(3):
        torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
        torch.mm(x, w)
    assert native.size(native.SCALED) == 1 and native.size(native.ROUTING) >= 1
    routing.clear_plans()
    assert native.size(native.ROUTING) == 0 and native.size(native.SCALED) == 1
    assert ut.scaled_stats()["routed"] == 3  # the native counts of the scaled entry are intact
    products = ut.stats()["by_op"]["mm"]  # (torch's CPU _scaled_mm makes an aten::mm call too)
    scaled_routing.clear_plans()
    assert native.size(native.SCALED) == 0
    assert ut.scaled_stats()["routed"] == 3  # moved to the retired counts
    assert ut.stats()["by_op"]["mm"] == products
    torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert ut.scaled_stats()["routed"] == 5 and native.size(native.SCALED) == 1


@pytest.mark.parametrize("min_gain", [-100.0, 0.99], ids=["kept", "reverted"])
def test_a_stored_scaled_choice_is_confirmed_where_it_runs(env: Env, min_gain: float) -> None:
    """A scaled choice from the cache starts in a confirmation window (its scales passed on
    to both candidates); the verdict keeps it or turns the plan into PyTorch's kernel."""
    from dataclasses import replace

    from torch_helpers import FAST

    from unimatmul.tuning.confirm import WARMUP

    calls_per_candidate = 4
    fake = ScaledFakeBackend("fake-scaled")
    a, b, sa, sb = _operands(16, 48, 32, "tensor")
    expected = scaled_reference(adapter_for_kind("torch"), a, b, sa, sb, None)
    env.selector.confirm_calls = calls_per_candidate
    env.selector.settings = replace(FAST, min_gain=min_gain)
    keep = min_gain < 0
    with registered(env.selector.plugins, fake):
        _store_kernel_winner(env, a, b, sa, sb, "fake-scaled")
        ut.enable()
        calls = 0
        while calls < 100:
            # A fresh scale tensor per call, of the same value: both candidates get the call's.
            out = torch._scaled_mm(a, b, sa.clone(), sb.clone(), out_dtype=torch.bfloat16)
            calls += 1
            assert float((out.double() - expected).norm() / expected.norm()) < 3e-2
            (plan,) = scaled_routing.plans()
            if plan.source in ("confirmed", "reverted"):
                break
        assert plan.source == ("confirmed" if keep else "reverted")
        # The first call is the window's own first; a CPU's window judges with the call after
        # it, which ends its last span.
        assert calls == WARMUP + 2 * calls_per_candidate + 1
        # The kernel ran for the window's first call and half of its timed ones (and, kept,
        # for the call that judged it).
        assert fake.calls == 1 + calls_per_candidate + (1 if keep else 0)
        for _ in range(3):
            out = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
            assert float((out.double() - expected).norm() / expected.norm()) < 3e-2
        assert fake.calls == 1 + calls_per_candidate + (4 if keep else 0)
        assert (plan.runner is not None) == keep
    stats = ut.scaled_stats()
    assert stats["confirm"][plan.source] == 1 and stats["confirm"]["open"] == 0
    assert stats["by_source"][plan.source] == 3 and stats["routed"] == calls + 3
    # The verdict is stored with the record: another process starts from it, unconfirmed.
    assert env.selector.settle(timeout=10)  # verdicts are written by a thread of their own
    records = [r for _, _, r in env.selector.store.items(None) if r.problem.startswith("scaled_gemm:")]
    assert [r.settings["confirm"]["verdict"] for r in records] == [plan.source]


@pytest.mark.parametrize(("winner_s", "in_graphs"), [(1.94e-6, False), (1.8e-6, True)], ids=["3pct", "11pct"])
def test_a_scaled_choice_with_a_slim_margin_stays_out_of_cuda_graphs(
    env: Env, monkeypatch: pytest.MonkeyPatch, winner_s: float, in_graphs: bool
) -> None:
    """A scaled choice that beat Default by less than UNIMATMUL_SCALED_GRAPH_MIN_GAIN (5 %)
    when tuned runs PyTorch's kernel under CUDA-graph capture, as a tie does, in its window
    and once kept; its native entry is marked so. A wider margin is captured as it is. A
    CPU has no graphs: the clock's capture check says what a GPU's would."""
    from unimatmul.tuning import confirm

    capturing = [True]
    monkeypatch.setattr(confirm.HostClock, "capturing", lambda self: capturing[0])
    fake = ScaledFakeBackend("fake-scaled")
    a, b, sa, sb = _operands(16, 48, 32, "tensor")
    expected = scaled_reference(adapter_for_kind("torch"), a, b, sa, sb, None)
    adapter = adapter_for_kind("torch")
    target = Target(adapter, CPU)
    problem = scaled_problem_of(adapter, a, b, sa, sb, out_dtype="bf16")
    env.selector.confirm_calls = 4
    with registered(env.selector.plugins, fake):
        namespace = env.selector.platform(target).namespace
        # Tuned here (checked on this host): a verdict then serves without a first-call check.
        record = mark_checked(TuningRecord(problem.key, "fake-scaled/dequantise", winner_s, 2e-6))
        env.selector.store.put(namespace, problem.key, record)
        decisions = [env.selector.decide(problem, target, "cached")]
        kept = replace(
            record,
            settings={
                **record.settings,
                confirm.KEY: {"verdict": confirm.CONFIRMED, "kernel": record.winner},
            },
        )
        env.selector.store.put(namespace, problem.key, kept)
        decisions.append(env.selector.decide(problem, target, "cached"))
        checking, confirmed = (d.runner for d in decisions)
        assert isinstance(checking, CheckingRunner)  # a window's first call is checked (tuning/trust.py)
        window = checking.inner
        assert isinstance(window, confirm.ConfirmingRunner) and window.tie is not in_graphs
        assert isinstance(confirmed, confirm.TieRunner) is not in_graphs
        for runner in (window, confirmed):
            assert native.entry_for(runner).tie is not in_graphs
            for flag in (True, False):
                capturing[0] = flag
                before = fake.calls
                out = torch.full((16, 48), float("nan"), dtype=torch.bfloat16)
                runner(a, b, out, 1.0, 0.0, None, sa, sb)
                assert float((out.double() - expected).norm() / expected.norm()) < 3e-2
                # Under capture the kernel runs only where its margin is wide enough.
                assert fake.calls - before == (1 if in_graphs or not flag else 0)
