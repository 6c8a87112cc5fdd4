"""Routing torch products through unimatmul on the CPU, with real oneDNN kernels."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
from onednn_caps import skip_unless_offered

torch = pytest.importorskip("torch")

from torch_helpers import Env, TinyTransformer, onednn_available, tune_preferring_kernels  # noqa: E402

import unimatmul  # noqa: E402
import unimatmul.torch as ut  # noqa: E402
from unimatmul.torch import routing  # noqa: E402
from unimatmul.torch.model_tuning import collecting  # noqa: E402

ATEN_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().double(), ref.detach().double()
    return float((out - ref).norm() / ref.norm())


def _tables() -> list[str]:
    return [torch._C._dispatch_dump_table(op) for op in ATEN_OPS]


def _tune_model(env: Env, model: torch.nn.Module, *inputs: torch.Tensor, backward: bool = False) -> None:
    """Tune every problem the model meets (forward, and backward if asked), preferring kernels."""
    with ut.enabled(), collecting() as met:
        out = model(*inputs)
        if backward:
            out.backward(torch.randn_like(out))
    unique = {(p.key, t): (p, t) for p, t in met}
    tune_preferring_kernels(env.selector, list(unique.values()))
    model.zero_grad(set_to_none=True)
    ut.clear_plans()
    ut.reset_stats()


# --- switching on and off -------------------------------------------------------------


def test_disable_restores_every_kernel_and_the_inductor_pass(env: Env) -> None:
    import torch._inductor.config as inductor_config

    before_tables = _tables()
    before_pass = inductor_config.post_grad_custom_pre_pass
    ut.enable()
    ut.enable()  # idempotent
    assert ut.is_enabled()
    enabled_tables = _tables()
    for before, now in zip(before_tables, enabled_tables, strict=True):
        # Our kernels, for CPU and CUDA: Python ones, or native ones where they serve.
        assert before != now and ("unimatmul/torch/router.py" in now or "_native.cpp" in now)
    assert inductor_config.post_grad_custom_pre_pass is not before_pass
    ut.disable()
    assert not ut.is_enabled()
    assert _tables() == before_tables
    assert inductor_config.post_grad_custom_pre_pass is before_pass
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    torch.mm(a, b)
    assert ut.stats()["routed"] == 0


def test_context_manager_restores_the_state_before(env: Env) -> None:
    with ut.enabled():
        assert ut.is_enabled()
        with ut.enabled():
            pass
        assert ut.is_enabled()  # the inner block found routing on and left it on
    assert not ut.is_enabled()


# --- the model: outputs, counts, gradients ------------------------------------------------


def test_transformer_outputs_and_routed_counts(
    env: Env, model: TinyTransformer, tokens: torch.Tensor
) -> None:
    if not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    with torch.no_grad():
        reference = model(tokens)
        reference64 = model.double()(tokens)
        model.float()
        _tune_model(env, model, tokens)
        with ut.enabled():
            routed = model(tokens)
    stats = ut.stats()
    # Every Linear is one addmm (3-D inputs folded), every attention matmul one bmm.
    assert stats["by_op"]["addmm"]["routed"] == model.linears
    assert stats["by_op"]["bmm"]["routed"] == model.layers * TinyTransformer.BMM_PER_BLOCK
    assert stats["routed"] == model.linears + model.layers * TinyTransformer.BMM_PER_BLOCK
    assert stats["passthrough"] == 0
    assert stats["kernel"] > 0  # oneDNN kernels really ran
    assert any("onednn/" in label for label in stats["by_label"])
    assert _rel(routed, reference64) < 1e-4
    assert _rel(routed, reference) < 1e-4


def test_gradients_match_pytorch(env: Env, model: TinyTransformer, tokens: torch.Tensor) -> None:
    if not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    gen = torch.Generator().manual_seed(3)
    weights = torch.randn(2, 12, 64, generator=gen)

    def grads() -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        (model(tokens) * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain = grads()
    _tune_model(env, model, tokens, backward=True)
    with ut.enabled():
        routed = grads()
    stats = ut.stats()
    # Backward: each Linear's input and weight gradients are mm calls; each attention
    # matmul's two operand gradients are bmm calls. All of them routed.
    assert stats["by_op"]["mm"]["routed"] == 2 * model.linears
    assert stats["by_op"]["bmm"]["routed"] == 3 * model.layers * TinyTransformer.BMM_PER_BLOCK
    assert stats["passthrough"] == 0
    assert any(label.startswith("unimatmul::mm [onednn/") for label in stats["by_label"])
    assert plain.keys() == routed.keys()
    for name in plain:
        assert _rel(routed[name], plain[name]) < 1e-4, name


def test_bf16_linear(env: Env) -> None:
    if not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    skip_unless_offered("bf16")  # oneDNN's bf16 kernels need AVX-512-BF16 or AMX
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 48).to(torch.bfloat16)
    x = torch.randn(3, 10, 64, dtype=torch.bfloat16)
    _tune_model(env, lin, x)
    with ut.enabled(), torch.no_grad():
        y = lin(x)
    assert y.dtype == torch.bfloat16
    ref = x.double() @ lin.weight.double().t() + lin.bias.double()
    assert _rel(y, ref) < 3e-2
    assert ut.stats()["kernel"] == 1


# --- every form of the four ops -------------------------------------------------------------


def _forms() -> list[tuple[str, object]]:
    g = torch.Generator().manual_seed(7)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    a, b, bt = r(6, 5), r(5, 7), r(7, 5).t()
    c, bias = r(6, 7), r(7)
    ba, bb, bc = r(3, 6, 5), r(3, 5, 7), r(3, 6, 7)
    nan_c = torch.full((6, 7), float("nan"))
    return [
        ("mm", lambda: torch.mm(a, b)),
        ("mm-transposed-b", lambda: a @ bt),
        ("mm-transposed-a", lambda: a.t().contiguous().t() @ b),
        ("linear", lambda: torch.nn.functional.linear(a, bt.t().contiguous() * 0 + b.t(), bias)),
        ("addmm-bias", lambda: torch.addmm(bias, a, b)),
        ("addmm-bias-alpha", lambda: torch.addmm(bias, a, b, alpha=0.5)),
        ("addmm-c-beta", lambda: torch.addmm(c, a, b, beta=0.25, alpha=2.0)),
        ("addmm-beta0-ignores-nan", lambda: torch.addmm(nan_c, a, b, beta=0)),
        ("addmm-bias-beta2", lambda: torch.addmm(bias, a, b, beta=2.0)),
        ("bmm", lambda: torch.bmm(ba, bb)),
        ("matmul-3d", lambda: ba @ bb),
        ("matmul-3d-2d", lambda: ba @ b),
        ("baddbmm-c", lambda: torch.baddbmm(bc, ba, bb, beta=0.5, alpha=1.5)),
        ("baddbmm-beta0", lambda: torch.baddbmm(bc, ba, bb, beta=0, alpha=0.125)),
        ("einsum", lambda: torch.einsum("bij,bjk->bik", ba, bb)),
    ]


# Forms PyTorch's kernel keeps: a bias scaled by beta is not a bias epilogue.
NOT_ROUTED = {"addmm-bias-beta2"}


@pytest.mark.parametrize("kernels", [False, True], ids=["untuned", "kernels"])
def test_every_form_matches_pytorch(env: Env, kernels: bool) -> None:
    if kernels and not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    forms = _forms()
    expected = {name: fn() for name, fn in forms}  # type: ignore[operator]
    if kernels:
        with ut.enabled(), collecting() as met:
            for _, fn in forms:
                fn()  # type: ignore[operator]
        tune_preferring_kernels(env.selector, list({(p.key, t): (p, t) for p, t in met}.values()))
        ut.clear_plans()
        ut.reset_stats()
    with ut.enabled():
        for name, fn in forms:
            got = fn()  # type: ignore[operator]
            assert got.shape == expected[name].shape, name
            assert not torch.isnan(got).any(), name
            assert _rel(got, expected[name]) < 1e-5, name
    stats = ut.stats()
    assert stats["routed"] == len(forms) - len(NOT_ROUTED)
    assert stats["passthrough"] == len(NOT_ROUTED)
    if kernels:
        assert stats["kernel"] == stats["routed"]


def _error(fn: object) -> tuple[type, str]:
    try:
        fn()  # type: ignore[operator]
    except Exception as exc:
        return type(exc), str(exc)
    return type(None), ""


def test_not_eligible_goes_to_pytorch_with_its_errors(env: Env) -> None:
    ints = torch.arange(12).reshape(3, 4)
    complex_a = torch.randn(3, 4, dtype=torch.complex64)
    wide = torch.randn(8, 8)[::2, ::2]  # no unit stride: no GEMM takes it as it is
    good = {
        "ints": lambda: ints @ ints.t(),
        "complex": lambda: complex_a @ complex_a.t(),
        "no-unit-stride": lambda: torch.mm(wide, wide),
    }
    bad = {
        "mixed-dtypes": lambda: torch.mm(torch.randn(3, 4), torch.randn(4, 2, dtype=torch.float64)),
        "k-mismatch": lambda: torch.mm(torch.randn(3, 4), torch.randn(5, 2)),
        "3-d-mm": lambda: torch.mm(torch.randn(3, 4, 2), torch.randn(2, 2)),
        "bad-bias": lambda: torch.addmm(torch.randn(5), torch.randn(3, 4), torch.randn(4, 2)),
        "bmm-batch": lambda: torch.bmm(torch.randn(2, 3, 4), torch.randn(3, 4, 2)),
    }
    expected = {name: fn() for name, fn in good.items()}
    errors = {name: _error(fn) for name, fn in bad.items()}
    assert all(kind is RuntimeError for kind, _ in errors.values())
    with ut.enabled(), unimatmul.mode("tune"):
        for name, fn in good.items():
            assert torch.equal(fn(), expected[name]), name
        for name, fn in bad.items():
            assert _error(fn) == errors[name], name
    assert ut.stats()["passthrough"] >= 3
    assert env.selector.stats.tuned == 0  # nothing eligible, nothing tuned


def test_tuning_inside_a_routed_call_does_not_recurse(env: Env) -> None:
    # The harness computes a float64 reference with `@` and runs Default through
    # torch.matmul(out=...): both must reach PyTorch's kernels, not ours again.
    a, b = torch.randn(16, 24, dtype=torch.float64), torch.randn(24, 8, dtype=torch.float64)
    expected = a @ b
    with ut.enabled(), unimatmul.mode("tune"):
        out = a @ b
        out32 = a.float() @ b.float()
    assert torch.equal(out, expected)
    assert _rel(out32, expected) < 1e-5
    assert env.selector.stats.tuned == 2


def test_a_candidates_own_products_on_the_tuning_worker_are_not_routed_back(env: Env) -> None:
    # The harness runs each candidate's steps on a worker thread (its time limit): the
    # routing "busy" flag of the tuning thread goes with them, or the kernel's `a @ b`
    # would ask the Selector for the problem being tuned and wait for itself.
    from unimatmul.backend import Backend, Candidate, Target
    from unimatmul.core.problem import Problem
    from unimatmul.testing import registered

    class PlainProduct(Backend):
        """A plugin whose one kernel is ``out.copy_(a @ b)``: a product routing would catch."""

        name = "plainmm"  # type: ignore[misc]
        device_kinds = frozenset({"cpu"})
        array_kinds = frozenset({"torch"})

        def availability(self) -> str | None:
            return None

        def versions(self) -> dict[str, str]:
            return {"plainmm": "1"}

        def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
            return [Candidate.make("plainmm", "k")]

        def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> Any:
            def run(
                a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
            ) -> None:
                out.copy_(a @ b)

            return run

    a, b = torch.randn(20, 12), torch.randn(12, 16)
    with registered(env.selector.plugins, PlainProduct()), ut.enabled(), unimatmul.mode("tune"):
        out = a @ b
    assert _rel(out, a.double() @ b.double()) < 1e-5
    assert env.selector.stats.tuned == 1
    (_, _, record), *_ = list(env.selector.store.items())
    plain = record.result("plainmm/k")
    assert plain is not None and plain.status in ("ok", "pruned"), plain


# --- modes --------------------------------------------------------------------------------


def test_mode_off_routes_nothing_and_record_writes_problems(env: Env) -> None:
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    with ut.enabled(), torch.no_grad():
        with unimatmul.mode("off"):
            lin(x)
        assert ut.stats()["routed"] == 0
        with unimatmul.mode("record"):
            lin(x)
            lin(x)
            lin(x[:2])
    lines = env.record.read_text().splitlines()
    assert len(lines) == 2
    assert env.selector.stats.tuned == 0


# --- profiler -------------------------------------------------------------------------------


def test_profiler_names_the_call_and_its_candidate(env: Env) -> None:
    if not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    lin = torch.nn.Linear(32, 16)
    x = torch.randn(8, 32)
    _tune_model(env, lin, x)
    with ut.enabled(), torch.no_grad():
        lin(x)  # the plan is made outside the profiler
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                lin(x)
    names = {e.key for e in prof.key_averages()}
    routed = [n for n in names if n.startswith("unimatmul::addmm [onednn/")]
    assert routed, sorted(names)


# --- warmup and buckets ---------------------------------------------------------------------


def test_warmup_tunes_every_problem_the_model_meets(
    env: Env, model: TinyTransformer, tokens: torch.Tensor
) -> None:
    result = ut.warmup(model, tokens, progress=False)
    # Distinct problems: qkv, proj, up, down and head Linears (proj and down share
    # nothing: different k), and the two attention products.
    assert len({p.key for p, _ in result.problems}) == len(result.records) == 7
    assert all(r.problem == p.key for r, (p, _) in zip(result.records, result.problems, strict=True))
    assert not ut.is_enabled()  # as it was before
    ut.reset_stats()
    with ut.enabled(), torch.no_grad():
        model(tokens)
    # Every routed call found a record: nothing fell to Default for want of one.
    stats = ut.stats()
    assert stats["by_source"] == {"cache": model.linears + model.layers * TinyTransformer.BMM_PER_BLOCK}


def test_bucketing_serves_other_batch_sizes(env: Env) -> None:
    from unimatmul.tuning.buckets import Buckets

    env.selector.buckets = Buckets.parse("pow2:256")
    lin = torch.nn.Linear(48, 40)
    with collecting() as met, ut.enabled(), torch.no_grad():
        lin(torch.randn(64, 48))
    ((problem, target),) = met
    record = env.selector.tune_bucket(problem, target, env.selector.buckets)
    ut.clear_plans()
    with ut.enabled(), torch.no_grad():
        for m in (48, 50, 95):  # inside the bucket of 64: [48, 95]
            x = torch.randn(m, 48)
            assert _rel(lin(x), x @ lin.weight.t() + lin.bias) < 1e-5
        lin(torch.randn(100, 48))  # the bucket of 128: never tuned
        by_m = {p.problem.m: p for p in routing.plans() if p.problem is not None and p.op == "addmm"}
    winner = "default" if record.winner == "default/default" else record.winner
    for m in (48, 50, 95):
        assert by_m[m].source == "bucket"
        assert by_m[m].label == f"unimatmul::addmm [{winner}]"
    assert by_m[100].source == "default"


def test_stats_survive_plan_clearing(env: Env) -> None:
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with ut.enabled():
        for _ in range(3):
            torch.mm(a, b)
        ut.clear_plans()
        torch.mm(a, b)
    assert ut.stats()["by_op"]["mm"]["routed"] == 4
    assert math.isclose(ut.stats()["routed"], 4)


def test_warmup_with_backward_tunes_training_products_and_trains_nothing(
    env: Env, model: TinyTransformer, tokens: torch.Tensor
) -> None:
    result = ut.warmup(model, tokens, backward=True, progress=False)
    assert all(p.grad is None for p in model.parameters())
    problems = {p.key for p, _ in result.problems}
    forward_only = {p.key for p, _ in ut.warmup(model, tokens, progress=False).problems}
    assert forward_only < problems  # the backward's products (transposed layouts) are new
    assert len(result.records) == len(result.problems)


class _BrokenRunner:
    def __init__(self, candidate: object) -> None:
        self.candidate = candidate

    def __call__(
        self, a: object, b: object, out: object, alpha: float = 1.0, beta: float = 0.0, bias: object = None
    ) -> None:
        msg = "this kernel breaks on every call (on purpose)"
        raise RuntimeError(msg)


def test_a_kernel_failing_on_a_call_falls_back_to_pytorch_and_warns_once(env: Env) -> None:
    from unimatmul.backend import Backend, Candidate, Target
    from unimatmul.cache.record import TuningRecord
    from unimatmul.core.hookspecs import hookimpl
    from unimatmul.core.problem import Problem

    class Broken(Backend):
        name = "broken"
        device_kinds = frozenset({"cpu"})
        array_kinds = frozenset({"torch"})

        def availability(self) -> str | None:
            return None

        def versions(self) -> dict[str, str]:
            return {"broken": "1"}

        def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
            return [Candidate.make("broken", "k")]

        def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> _BrokenRunner:
            return _BrokenRunner(candidate)

    class Plugin:
        @hookimpl
        def unimatmul_register_backends(self, register: object) -> None:
            register(Broken())  # type: ignore[operator]

    env.selector.plugins.register(Plugin(), "broken")
    a, b = torch.randn(6, 8), torch.randn(8, 5)
    with ut.enabled(), collecting() as met:
        torch.mm(a, b)
    ((problem, target),) = met
    # The cache says the broken kernel won (as a stale or corrupt entry could).
    platform = env.selector.platform(target)
    record = TuningRecord(problem.key, "broken/k", 1e-6, 2e-6, versions=dict(platform.versions))
    env.selector.store.put(platform.namespace, problem.key, record)
    ut.clear_plans()
    ut.reset_stats()
    with ut.enabled(), pytest.warns(RuntimeWarning, match="broken/k failed") as caught:
        first = torch.mm(a, b)
        second = torch.mm(a, b)
    assert len([w for w in caught if "broken/k" in str(w.message)]) == 1
    assert torch.allclose(first, a @ b) and torch.allclose(second, a @ b)
    assert ut.stats()["by_source"] == {"fallback": 2}


@pytest.mark.parametrize(("a_shape", "b_shape"), [((0, 3), (3, 4)), ((2, 0), (0, 4)), ((2, 3), (3, 0))])
def test_empty_products_pass_to_torch(env: Env, a_shape: tuple[int, int], b_shape: tuple[int, int]) -> None:
    a, b, c = torch.randn(a_shape), torch.randn(b_shape), torch.randn(a_shape[0], b_shape[1])
    expected = (torch.mm(a, b), torch.addmm(c, a, b))
    with ut.enabled(), unimatmul.mode("tune"):
        got = (torch.mm(a, b), torch.addmm(c, a, b))
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e)
    # (the native kernels pass them on without asking Python: no plan at all there)
    assert all(p.source == "passthrough" for p in ut.plans())
    assert env.selector.stats.tuned == 0
