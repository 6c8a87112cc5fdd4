"""Routing on a CUDA (or ROCm) GPU: outputs, gradients, and CUDA graph capture.

Skipped without a GPU. The products are tuned first (kernels preferred, so that a
GPU backend's kernels really run whichever wins), then the model is captured.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest

torch = pytest.importorskip("torch")

if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("needs a CUDA or ROCm GPU", allow_module_level=True)

from torch_helpers import Env, TinyTransformer, tune_preferring_kernels  # noqa: E402

import unimatmul  # noqa: E402
import unimatmul.torch as ut  # noqa: E402
from unimatmul.torch.model_tuning import collecting  # noqa: E402

pytestmark = pytest.mark.gpu

TOLERANCE = {torch.float32: 5e-3, torch.bfloat16: 3e-2, torch.float16: 1e-2}


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().double(), ref.detach().double()
    return float((out - ref).norm() / ref.norm())


def _gpu_kernels_available(env: Env) -> bool:
    from unimatmul.backend import Target
    from unimatmul.core.arrays import Device, adapter_for_kind

    target = Target(adapter_for_kind("torch"), Device("hip" if torch.version.hip else "cuda", 0))
    return bool(env.selector.backends_for(target))


@pytest.fixture
def gpu_env(env: Env) -> Env:
    # The GPU harness settings come from the Selector (CUDA events, GPU budgets).
    env.selector.settings = None
    return env


def _warm_and_capture(call: Any) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Two warm-up calls on a side stream (as capture requires; they also make the plans),
    then a graph captured of one more: the graph and the captured call's output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    return graph, captured


def _tune_model(env: Env, model: torch.nn.Module, *inputs: torch.Tensor, backend: str | None = None) -> None:
    with ut.enabled(), collecting() as met, torch.no_grad():
        model(*inputs)
    tune_preferring_kernels(env.selector, list({(p.key, t): (p, t) for p, t in met}.values()), backend)
    ut.clear_plans()
    ut.reset_stats()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_outputs_match_pytorch(gpu_env: Env, dtype: torch.dtype) -> None:
    if not _gpu_kernels_available(gpu_env):
        pytest.skip("no GPU backend is available")
    torch.manual_seed(0)
    model = TinyTransformer(dim=64, heads=4).cuda().to(dtype)
    tokens = torch.randint(0, 64, (4, 32), device="cuda")
    with torch.no_grad():
        reference = model.double()(tokens)
        model.to(dtype)
        plain = model(tokens)
        _tune_model(gpu_env, model, tokens)
        with ut.enabled():
            routed = model(tokens)
    stats = ut.stats()
    assert stats["routed"] == model.linears + model.layers * TinyTransformer.BMM_PER_BLOCK
    assert stats["kernel"] > 0
    assert _rel(routed, reference) <= max(TOLERANCE[dtype], 2 * _rel(plain, reference))


def test_cuda_graph_capture_after_tuning(gpu_env: Env) -> None:
    if not _gpu_kernels_available(gpu_env):
        pytest.skip("no GPU backend is available")
    torch.manual_seed(0)
    model = TinyTransformer(dim=64, heads=4).cuda().to(torch.bfloat16)
    static = torch.randint(0, 64, (2, 16), device="cuda")
    with torch.no_grad():
        expected = model(static)
        _tune_model(gpu_env, model, static)
        tuned_before = gpu_env.selector.stats.tuned
        with ut.enabled():
            graph, captured = _warm_and_capture(lambda: model(static))
            ut.reset_stats()
            static.copy_(torch.randint(0, 64, (2, 16), device="cuda"))
            graph.replay()
            torch.cuda.synchronize()
            replayed = captured.clone()
    assert ut.stats()["routed"] == 0  # a replay runs no Python: the kernels are in the graph
    assert gpu_env.selector.stats.tuned == tuned_before  # nothing measured inside the capture
    with torch.no_grad():
        again = model(static)
    assert _rel(replayed, again) < 3e-2
    assert not torch.equal(replayed, expected)  # the replay saw the new input


def test_capture_never_tunes_even_in_tune_mode(gpu_env: Env) -> None:
    lin = torch.nn.Linear(96, 80, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(24, 96, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad(), ut.enabled(), unimatmul.mode("tune"):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            lin(x.clone())  # a different pointer: the same problem, not yet a plan for capture
        torch.cuda.current_stream().wait_stream(side)
        ut.clear_plans()
        tuned = gpu_env.selector.stats.tuned
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = lin(x)
        graph.replay()
        torch.cuda.synchronize()
    assert gpu_env.selector.stats.tuned == tuned
    assert _rel(y, x.double() @ lin.weight.double().t() + lin.bias.double()) < 3e-2


def test_gradients_match_pytorch(gpu_env: Env) -> None:
    if not _gpu_kernels_available(gpu_env):
        pytest.skip("no GPU backend is available")
    torch.manual_seed(0)
    model = TinyTransformer(dim=64, heads=4).cuda()
    tokens = torch.randint(0, 64, (2, 16), device="cuda")
    weights = torch.randn(2, 16, 64, device="cuda")

    def grads() -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        (model(tokens) * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain = grads()
    with ut.enabled(), collecting() as met:
        grads()
    tune_preferring_kernels(gpu_env.selector, list({(p.key, t): (p, t) for p, t in met}.values()))
    ut.clear_plans()
    with ut.enabled():
        routed = grads()
    for name, grad in plain.items():
        assert _rel(routed[name], grad) < 5e-3, name


@pytest.mark.parametrize("env", ["native"], indirect=True)
@pytest.mark.parametrize("bias", [False, True], ids=["mm", "bias"])
def test_native_kernels_make_the_lt_call(gpu_env: Env, bias: bool) -> None:
    """A tuned Lt kernel is called from C++ (counted by the native table), on any stream."""
    from unimatmul.torch import native, routing

    if not _gpu_kernels_available(gpu_env):
        pytest.skip("no GPU backend is available")
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 192, bias=bias, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(96, 256, device="cuda", dtype=torch.bfloat16)
    reference = x.double() @ lin.weight.double().t() + (lin.bias.double() if bias else 0.0)
    # A cuBLASLt kernel even where another backend's won (a Triton tile may win).
    _tune_model(gpu_env, lin, x, backend="cublaslt")
    with torch.no_grad(), ut.enabled():
        assert routing._router.native_keys == ("CPU", "CUDA") and native.has_lt()
        outs = [lin(x) for _ in range(4)]
        lt = [p for p in routing.TABLE.plans.values() if p.native == native.LT]
        if not lt:
            kinds = [(p.op, p.label, p.native) for p in routing.TABLE.plans.values()]
            pytest.skip(f"the tuned choice is not a plain Lt kernel here: {kinds}")
        assert native.counts().get(lt[0].ident) == 3  # the first call went through Python
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            on_side = lin(x)  # another stream: the entry makes a workspace of its own for it
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
    for out in [*outs, on_side]:
        assert _rel(out, reference) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("env", ["native"], indirect=True)
def test_native_kernels_make_the_padded_call(gpu_env: Env) -> None:
    """A misaligned product whose tuned choice is a padding candidate runs from C++ too."""
    from unimatmul.torch import native, routing

    if not _gpu_kernels_available(gpu_env):
        pytest.skip("no GPU backend is available")
    torch.manual_seed(0)
    a = torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 1025, device="cuda", dtype=torch.bfloat16)  # n = 1025: ld not a multiple of 8
    reference = a.double() @ b.double()
    with ut.enabled(), collecting() as met:
        torch.mm(a, b)
    records = tune_preferring_kernels(gpu_env.selector, list({(p.key, t): (p, t) for p, t in met}.values()))
    ut.clear_plans()
    if not records[0].winner.startswith("cublaslt/pad"):
        pytest.skip(f"the tuned choice here is {records[0].winner}, not a padding candidate")
    with ut.enabled():
        outs = [torch.mm(a, b) for _ in range(4)]
        plan = next(p for p in routing.TABLE.plans.values() if p.op == "mm")
        assert plan.native == native.PADDED
        assert native.counts().get(plan.ident) == 3
    torch.cuda.synchronize()
    for out in outs:
        assert _rel(out, reference) < TOLERANCE[torch.bfloat16]


# --- confirmation windows on the GPU ------------------------------------------------------------


def _plan_of(op: str) -> Any:
    from unimatmul.torch import routing

    (plan,) = [p for p in routing.TABLE.plans.values() if p.op == op]
    return plan


@pytest.mark.parametrize("min_gain", [-100.0, 0.99], ids=["kept", "reverted"])
def test_a_window_on_the_gpu_times_with_events(gpu_env: Env, min_gain: float) -> None:
    """The window's samples are CUDA events on the caller's stream; the verdict holds."""
    from unimatmul.torch import native
    from unimatmul.tuning.harness import HarnessConfig

    if not _gpu_kernels_available(gpu_env):
        pytest.skip("no GPU backend is available")
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 192, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(96, 256, device="cuda", dtype=torch.bfloat16)
    reference = x.double() @ lin.weight.double().t() + lin.bias.double()
    _tune_model(gpu_env, lin, x)
    gpu_env.selector.confirm_calls = 4
    gpu_env.selector.settings = HarnessConfig(min_gain=min_gain)  # windows only: tuning is done
    outs = []
    with torch.no_grad(), ut.enabled():
        for _ in range(60):  # a full window, and a few calls to read its last events
            outs.append(lin(x))
            plan = _plan_of("addmm")
            if plan.confirmation is not None and plan.confirmation.outcome is not None:
                break
        assert plan.confirmation is not None and plan.confirmation.outcome is not None
        keep = min_gain < 0
        assert plan.source == ("confirmed" if keep else "reverted")
        outs.extend(lin(x) for _ in range(3))
        if plan.native in (native.LT, native.PADDED):
            assert native.kinds()[plan.ident] == (plan.native if keep else native.DEFAULT)
        torch.cuda.synchronize()
    for out in outs:
        assert _rel(out, reference) < TOLERANCE[torch.bfloat16]
    found = plan.confirmation.outcome
    assert found.clock == "cuda-events" and found.calls == 4
    assert 0 < found.kernel_s < 1e-2 and 0 < found.default_s < 1e-2


def test_no_event_is_recorded_while_a_graph_is_captured(gpu_env: Env) -> None:
    """A window open during capture runs the choice untimed; capture and replay work, and
    the window ends later on eager calls."""
    if not _gpu_kernels_available(gpu_env):
        pytest.skip("no GPU backend is available")
    torch.manual_seed(0)
    model = TinyTransformer(dim=64, heads=4).cuda().to(torch.bfloat16)
    static = torch.randint(0, 64, (2, 16), device="cuda")
    with torch.no_grad():
        _tune_model(gpu_env, model, static)
        gpu_env.selector.confirm_calls = 16
        with ut.enabled():
            graph, captured = _warm_and_capture(lambda: model(static))
            graph.replay()
            torch.cuda.synchronize()
            replayed = captured.clone()
            open_after_capture = ut.stats()["confirm"]["open"]
            for _ in range(60):
                eager = model(static)
            torch.cuda.synchronize()
            stats = ut.stats()
    assert open_after_capture > 0  # 2 warm-up calls and a capture do not fill a window of 34
    assert stats["confirm"]["open"] == 0
    assert stats["confirm"]["confirmed"] + stats["confirm"]["reverted"] == open_after_capture
    assert _rel(replayed, eager) < 3e-2


@pytest.mark.parametrize("env", ["native"], indirect=True)
def test_an_lt_entry_serves_other_streams_natively(gpu_env: Env) -> None:
    """A call on another stream than the entry's gets a workspace of its own in C++ (it
    used to go through the Python kernel)."""
    from unimatmul.torch import native

    if not _gpu_kernels_available(gpu_env):
        pytest.skip("no GPU backend is available")
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 192, bias=False, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(96, 256, device="cuda", dtype=torch.bfloat16)
    reference = x.double() @ lin.weight.double().t()
    _tune_model(gpu_env, lin, x)
    gpu_env.selector.confirm_calls = 0
    with torch.no_grad(), ut.enabled():
        lin(x)
        plan = _plan_of("mm")
        if plan.native not in (native.LT, native.PADDED):
            pytest.skip(f"the tuned choice is not an Lt kernel here: {plan.label}")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            outs = [lin(x) for _ in range(3)]
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        assert native.counts().get(plan.ident) == 3
    for out in outs:
        assert _rel(out, reference) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("env", ["native"], indirect=True)
def test_the_api_serves_cuda_tensors_from_the_native_table(gpu_env: Env) -> None:
    from unimatmul.torch import native

    torch.manual_seed(0)
    a = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    reference = a.double() @ b.double()
    out = torch.empty(64, 256, device="cuda", dtype=torch.bfloat16)
    with unimatmul.mode("tune"):
        unimatmul.matmul(a, b)
    unimatmul.matmul(a, b)
    unimatmul.matmul(a, b, out=out)
    before = sum(native.counts(table=native.API).values())
    results = [unimatmul.matmul(a, b) for _ in range(3)]
    out.fill_(float("nan"))
    assert unimatmul.matmul(a, b, out=out) is out
    torch.cuda.synchronize()
    assert sum(native.counts(table=native.API).values()) == before + 4
    for result in [*results, out]:
        assert _rel(result, reference) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("env", ["native", "python"], indirect=True)
def test_cuda_graph_trees_take_routed_kernels(gpu_env: Env) -> None:
    """torch.compile(mode="reduce-overhead"): Inductor's CUDA graph trees warm up and record
    on a stream of their own, whose allocations go to the trees' pool. A routed kernel's
    workspaces and padded buffers for that stream are made outside it (kept_torch_buffer,
    and kept_buffer in C++); before, the trees refused them ("tensors in the cudagraph
    pool not tracked as outputs")."""
    if not _gpu_kernels_available(gpu_env):
        pytest.skip("no GPU backend is available")
    torch.manual_seed(0)
    model = TinyTransformer(dim=64, heads=4).cuda().to(torch.bfloat16).eval()
    tokens = torch.randint(0, 64, (2, 16), device="cuda")
    with torch.no_grad():
        expected = model(tokens).double()
    _tune_model(gpu_env, model, tokens)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, mode="reduce-overhead")
        with torch.no_grad(), ut.enabled():
            outs = [compiled(tokens).clone() for _ in range(4)]  # warm-up, record, replays
            torch.cuda.synchronize()
    finally:
        torch._dynamo.reset()
    for out in outs:
        assert _rel(out, expected) < 3e-2


@pytest.mark.parametrize("capture_mode", ["global", "thread_local"])
def test_kept_buffers_stay_out_of_graph_pools(capture_mode: str) -> None:
    """A buffer a runner keeps, made during a capture (a runner prepared there), is not in
    the capture's pool: the check CUDA graph trees make after recording passes."""
    from unimatmul.core.arrays import kept_torch_buffer

    pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    x = torch.ones(256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with (
        torch.cuda.stream(side),
        torch.cuda.graph(graph, pool=pool, stream=side, capture_error_mode=capture_mode),
    ):
        y = x * 2
        kept = kept_torch_buffer((1 << 16,), (1,), torch.float32, "cuda")
    graph.replay()
    torch.cuda.synchronize()
    assert kept.shape == (1 << 16,) and torch.equal(y, x * 2)
    live = {y.untyped_storage().data_ptr()}
    assert torch._C._cuda_checkPoolLiveAllocations(torch.cuda.current_device(), pool, live)


@pytest.mark.parametrize("env", ["native", "python"], indirect=True)
def test_a_captured_kernel_s_buffers_outlive_its_plans(gpu_env: Env) -> None:
    """A graph that captured a routed kernel with buffers of its own (a padded candidate:
    aligned copies of a product whose output rows are misaligned) writes those buffers at
    every replay. Plans retired after the capture (routing switched off and on, as the
    Hugging Face benchmark does between its rounds) must not free them. Freed, they let
    replays of compiled `generate` graphs write into memory that other tensors held by then (calls that stopped early, position ids out of
    range)."""
    from unimatmul.testing import prefer_kernel

    lin = torch.nn.Linear(256, 1001, bias=False, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16)
    with ut.enabled(), collecting() as met, torch.no_grad():
        lin(x)
    ((problem, target),) = {p.key: (p, t) for p, t in met}.values()
    record = prefer_kernel(gpu_env.selector, problem, target, backend="cublaslt", names=("pad", "pad-dims"))
    if not record.winner.startswith("cublaslt/pad"):
        pytest.skip(f"no padded candidate passed its check here (the winner is {record.winner})")
    gpu_env.selector.confirm_calls = 0  # the padded kernel runs from its first call
    ut.clear_plans()
    held = ut.stats()["held_for_graphs"]
    static = x.clone()
    with torch.no_grad(), ut.enabled():
        graph, captured = _warm_and_capture(lambda: lin(static))
        assert ut.stats()["by_label"], "the capture made no routed call"
        assert any(record.winner in label for label in ut.stats()["by_label"])
        for _ in range(3):
            ut.clear_plans()
    gc.collect()
    # Memory freed by the runner would come back to these (the same sizes, first).
    fills = [torch.full((16 * 1008,), 7.0, device="cuda", dtype=torch.bfloat16) for _ in range(64)]
    fills += [torch.full((1 << 18,), 7.0, device="cuda") for _ in range(16)]
    static.copy_(torch.randn_like(static))
    graph.replay()
    torch.cuda.synchronize()
    assert all(bool((f == 7.0).all()) for f in fills), "a replay wrote into freed memory"
    with torch.no_grad():
        expected = lin(static)
    assert _rel(captured, expected) < TOLERANCE[torch.bfloat16]
    assert ut.stats()["held_for_graphs"] > held
