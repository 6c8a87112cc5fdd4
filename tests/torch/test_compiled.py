"""torch.compile keeps the routed kernels.

``aot_eager`` (AOT autograd's forward and backward graphs, run op by op) is tested
always. Inductor's own path is the post-grad pass that rewrites aten products into
``unimatmul::mm``: the pass is tested on a traced aten graph here; a full Inductor
compile needs a C++ toolchain and half a minute on a small CPU, so it runs only with
``UNIMATMUL_TEST_INDUCTOR=1``.
"""

from __future__ import annotations

import os
import warnings

import pytest

torch = pytest.importorskip("torch")

from torch_helpers import Env, TinyTransformer, onednn_available, tune_preferring_kernels  # noqa: E402

import unimatmul.torch as ut  # noqa: E402
from unimatmul.torch import compiled  # noqa: E402
from unimatmul.torch.model_tuning import collecting  # noqa: E402


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().double(), ref.detach().double()
    return float((out - ref).norm() / ref.norm())


def _tune(env: Env, fn: object, *args: torch.Tensor) -> None:
    with ut.enabled(), collecting() as met:
        fn(*args)  # type: ignore[operator]
    tune_preferring_kernels(env.selector, list({(p.key, t): (p, t) for p, t in met}.values()))
    ut.clear_plans()
    ut.reset_stats()


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def test_aot_eager_model_runs_tuned_kernels_forward_and_backward(
    env: Env, model: TinyTransformer, tokens: torch.Tensor
) -> None:
    if not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    weights = torch.randn(2, 12, 64, generator=torch.Generator().manual_seed(5))

    def step(m: torch.nn.Module) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        m.zero_grad(set_to_none=True)
        out = m(tokens)
        (out * weights).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    eager_out, eager_grads = step(model)
    _tune(env, lambda: step(model))
    with ut.enabled():
        compiled_model = torch.compile(model, backend="aot_eager")
        out, grads = step(compiled_model)
    stats = ut.stats()
    forward_products = model.linears + model.layers * TinyTransformer.BMM_PER_BLOCK
    assert stats["routed"] >= forward_products  # forward, plus the backward's products
    assert stats["by_op"]["mm"]["routed"] >= model.linears  # backward weight gradients at least
    assert stats["kernel"] > 0
    assert _rel(out, eager_out) < 1e-4
    for name, grad in eager_grads.items():
        assert _rel(grads[name], grad) < 1e-4, name


def test_the_inductor_pass_rewrites_products_into_the_custom_op(env: Env) -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    gen = torch.Generator().manual_seed(2)
    a, b, bias = torch.randn(8, 16, generator=gen), torch.randn(16, 12, generator=gen), torch.randn(12)
    c = torch.randn(8, 12, generator=gen)
    ba, bb, bc = torch.randn(3, 8, 16), torch.randn(3, 16, 12), torch.randn(3, 8, 12)
    ints = torch.arange(16).reshape(4, 4)

    def f(
        a: torch.Tensor,
        b: torch.Tensor,
        bias: torch.Tensor,
        c: torch.Tensor,
        ba: torch.Tensor,
        bb: torch.Tensor,
        bc: torch.Tensor,
        ints: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        return (
            torch.mm(a, b),
            torch.addmm(bias, a, b),
            torch.addmm(c, a, b, beta=0.5, alpha=2.0),
            torch.bmm(ba, bb),
            torch.baddbmm(bc, ba, bb, beta=0.25, alpha=3.0),
            torch.mm(ints, ints),  # not a float: Inductor keeps it
        )

    args = (a, b, bias, c, ba, bb, bc, ints)
    expected = f(*args)
    compiled.define_ops()
    gm = make_fx(f)(*args)
    assert compiled.rewrite(gm.graph) == 5
    gm.recompile()
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.unimatmul.mm.default) == 5
    assert targets.count(torch.ops.aten.mm.default) == 1
    with ut.enabled():
        got = gm(*args)
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e) if g.dtype == torch.int64 else _rel(g, e) < 1e-5
    by_op = ut.stats()["by_op"]
    assert by_op["mm"]["routed"] == 1 and by_op["addmm"]["routed"] == 2
    assert by_op["bmm"]["routed"] == 1 and by_op["baddbmm"]["routed"] == 1
    # The fake implementation gives Inductor the shapes without running anything.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fa, fb = mode.from_tensor(ba), mode.from_tensor(bb)
        assert torch.ops.unimatmul.mm(fa, fb).shape == (3, 8, 12)


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("UNIMATMUL_TEST_INDUCTOR") != "1",
    reason="a full Inductor compile: UNIMATMUL_TEST_INDUCTOR=1",
)
def test_inductor_compiled_model_calls_the_custom_op(
    env: Env, model: TinyTransformer, tokens: torch.Tensor
) -> None:
    if not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    with torch.no_grad():
        eager = model(tokens)
        _tune(env, model, tokens)
        with ut.enabled():
            compiled_model = torch.compile(model)
            out = compiled_model(tokens)
            ut.reset_stats()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                    compiled_model(tokens)
    assert _rel(out, eager) < 1e-4
    names = {e.key for e in prof.key_averages()}
    assert "unimatmul::mm" in names
    assert ut.stats()["kernel"] > 0


_LATE_INDUCTOR = r"""
import json, sys
import torch
import unimatmul.torch as ut
ut.enable()
found = {"imported_by_enable": "torch._inductor.config" in sys.modules}
import torch._inductor.config as config
found["pass_after_import"] = type(config.post_grad_custom_pre_pass).__name__
ut.disable()
found["after_disable"] = config.post_grad_custom_pre_pass is None
ut.enable()
found["again"] = type(config.post_grad_custom_pre_pass).__name__
ut.disable()
ut.enable()
ut.disable()
found["hooks_left"] = sum(type(f).__name__ == "_WhenInductorLoads" for f in sys.meta_path)
print(json.dumps(found))
"""


@pytest.mark.slow
def test_enable_leaves_inductor_unimported_and_sets_the_pass_when_it_loads(tmp_path: object) -> None:
    """Importing Inductor's config takes seconds: enable() sets the pass once something
    imports it (torch.compile does), and disable() takes it away either way."""
    import json
    import subprocess
    import sys

    environment = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    environment |= {"UNIMATMUL_TORCH_NATIVE": "0", "UNIMATMUL_CACHE": str(tmp_path) + "/cache.msgpack"}
    done = subprocess.run(
        [sys.executable, "-c", _LATE_INDUCTOR], capture_output=True, text=True, timeout=600, env=environment
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "imported_by_enable": False,
        "pass_after_import": "RoutePass",
        "after_disable": True,
        "again": "RoutePass",
        "hooks_left": 0,
    }
