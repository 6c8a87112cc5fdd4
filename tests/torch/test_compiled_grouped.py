"""torch.compile keeps the routed grouped GEMMs (``aten._grouped_mm``, MoE experts).

The pass's rewrite into ``unimatmul::grouped_mm`` is tested on a traced aten graph of the
four forms and on AOT autograd's forward and backward graphs of an MoE block (no C++
compile); the fake implementation against torch's shapes for every form. A full Inductor
compile needs a C++ toolchain and half a minute or more on a small CPU, so those tests
run only with ``UNIMATMUL_TEST_INDUCTOR=1`` (as in ``test_compiled.py``). The MoE block
runs on the CPU, and on CUDA where a GPU is present (marked ``gpu``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from grouped_cases import DTYPES, close, operands, reference  # noqa: E402
from torch_helpers import Env, Experts  # noqa: E402

import unimatmul  # noqa: E402
import unimatmul.torch as ut  # noqa: E402
from unimatmul.core.problem import Problem  # noqa: E402
from unimatmul.torch import compiled, grouped_routing  # noqa: E402

FORMS = ["m", "k", "n", "none"]
SIZES = [5, 0, 7, 4]
BF16 = 2e-2  # relative error of a bf16 result or gradient

# The grouped door has no native kernels: the Python half of ``env`` covers it.
python_only = pytest.mark.parametrize("env", ["python"], indirect=True)
inductor = pytest.mark.skipif(
    os.environ.get("UNIMATMUL_TEST_INDUCTOR") != "1",
    reason="a full Inductor compile: UNIMATMUL_TEST_INDUCTOR=1",
)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.detach().double(), ref.detach().double()
    return float((out - ref).norm() / ref.norm())


def _assert_as_eager(out: Any, got: dict[str, Any], eager: dict[str, Any]) -> None:
    """The compiled block's output and gradients within bf16 tolerance of eager's."""
    assert _rel(out, eager["out"]) < BF16
    for name, grad in eager.items():
        assert _rel(got[name], grad) < BF16, name


def _routed() -> int:
    return int(ut.grouped_stats()["routed"])


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()


def _torchs_call(code: str) -> int:
    """Calls of torch's grouped GEMM in Inductor's code (its extern kernel on the CPU, the
    aten op), not the comments naming the aten op a line came from."""
    return code.count("extern_kernels._grouped_mm(") + code.count("aten._grouped_mm.default(")


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")],
    ),
]


def _moe(requires_grad: bool, device: str = "cpu") -> tuple[Experts, torch.Tensor]:
    torch.manual_seed(0)
    block = Experts(experts=4, hidden=32, inter=16, top_k=2).to(torch.bfloat16)
    x = torch.randn(20, 32, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(7))
    return block.to(device), x.to(device).requires_grad_(requires_grad)


def _step(
    fn: Callable[[torch.Tensor], torch.Tensor], block: Experts, x: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Forward and backward: the output and every gradient, by name."""
    block.zero_grad(set_to_none=True)
    x.grad = None
    out = fn(x)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(out.device)
    (out.float() * weights).sum().backward()
    got = {"out": out.detach().clone(), "x": x.grad.clone()}  # type: ignore[union-attr]
    return got | {n: p.grad.clone() for n, p in block.named_parameters()}  # type: ignore[union-attr]


@python_only
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_the_fake_gives_torchs_shape_and_dtype_for_every_form(env: Env, dtype: str) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    cases = [operands(jagged, SIZES, dtype) for jagged in FORMS]
    wants = [torch._grouped_mm(a, b, offs) for a, b, offs in cases]
    compiled.define_ops()
    ut.enable()  # fake tensors pass the routed door untouched
    for (a, b, offs), want in zip(cases, wants, strict=True):
        bias = torch.ones(want.shape[-1], dtype=want.dtype)
        with FakeTensorMode() as mode:
            fa, fb = mode.from_tensor(a), mode.from_tensor(b)
            foffs = None if offs is None else mode.from_tensor(offs)
            for kwargs in ({}, {"out_dtype": DTYPES[dtype]}):
                got = torch.ops.unimatmul.grouped_mm(fa, fb, foffs, **kwargs)
                assert tuple(got.shape) == tuple(want.shape) and got.dtype == want.dtype
            with pytest.raises(RuntimeError, match="bias is not supported"):  # as torch refuses it
                torch.ops.unimatmul.grouped_mm(fa, fb, foffs, bias=mode.from_tensor(bias))
    assert _routed() == 0


@python_only
def test_the_pass_rewrites_every_form_into_the_custom_op_which_routes(env: Env) -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    cases = [operands(jagged, SIZES, seed=i) for i, jagged in enumerate(FORMS)]
    args: list[Any] = [t for case in cases for t in case if t is not None]

    def f(*flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        it = iter(flat)
        outs = []
        for jagged in FORMS:
            a, b = next(it), next(it)
            outs.append(torch._grouped_mm(a, b, None if jagged == "none" else next(it)))
        return tuple(outs)

    compiled.define_ops()
    ut.enable()
    gm = make_fx(f)(*args)  # traced with routing on: the graph keeps the aten op
    grouped = torch.ops.aten._grouped_mm.default
    assert [n.target for n in gm.graph.nodes].count(grouped) == 4 and _routed() == 0
    assert compiled.rewrite(gm.graph) == 4
    gm.recompile()
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.unimatmul.grouped_mm.default) == 4 and grouped not in targets
    with unimatmul.mode("tune"):
        got = gm(*args)
    for jagged, (a, b, offs), out in zip(FORMS, cases, got, strict=True):
        assert close(out, reference(jagged, a, b, offs), "bf16"), jagged
    assert _routed() == 4
    tuned = [Problem.from_key(key) for _, key, _ in env.selector.store.items(None)]
    assert sorted(p.jagged for p in tuned if p.op == "grouped_gemm") == sorted(FORMS)


@python_only
@pytest.mark.parametrize("device", DEVICES)
def test_aot_autograd_graphs_rewritten_route_forward_and_backward(env: Env, device: str) -> None:
    """AOT autograd hands the pass a forward and a backward graph: both are rewritten,
    and the compiled MoE block's grouped products run through the routed door."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    rewritten: list[int] = []

    def rewrite(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        rewritten.append(compiled.rewrite(gm.graph))
        gm.recompile()
        return make_boxed_func(gm)

    block, x = _moe(requires_grad=True, device=device)
    eager = _step(block, block, x)
    ut.enable()
    backend = aot_autograd(fw_compiler=rewrite, bw_compiler=rewrite)
    compiled_block = torch.compile(block, backend=backend)
    with unimatmul.mode("tune"):
        _step(compiled_block, block, x)  # compiles and tunes
        ut.reset_stats()
        out = compiled_block(x)
        assert _routed() == 2  # gate/up and down
        got = _step(compiled_block, block, x)
    # each grouped product's backward: grad @ b^T and a^T @ grad (offs over K)
    assert _routed() == 2 + 2 + 4
    assert sum(rewritten) >= 2 + 4
    _assert_as_eager(out, got, eager)


@inductor
@pytest.mark.slow
@python_only
@pytest.mark.parametrize("device", DEVICES)
def test_an_inductor_compiled_moe_block_runs_the_routed_grouped_door(env: Env, device: str) -> None:
    from torch._inductor.utils import run_and_get_code

    block, x = _moe(requires_grad=True, device=device)
    eager = _step(block, block, x)
    ut.enable()
    compiled_block = torch.compile(block, backend="inductor")
    with warnings.catch_warnings(), unimatmul.mode("tune"):
        warnings.simplefilter("ignore")
        _, codes = run_and_get_code(_step, compiled_block, block, x)  # forward and backward compiled
        ut.reset_stats()
        out = compiled_block(x)
        assert _routed() == 2
        got = _step(compiled_block, block, x)
    assert _routed() == 2 + 2 + 4
    calls = [code.count("torch.ops.unimatmul.grouped_mm.default(") for code in codes]
    assert sum(calls) >= 2 + 4, calls  # the forward's and the backward's graphs
    assert not any(_torchs_call(code) for code in codes)
    _assert_as_eager(out, got, eager)


@inductor
@pytest.mark.slow
@python_only
def test_with_routing_off_inductor_keeps_torchs_grouped_mm(env: Env) -> None:
    from torch._inductor.utils import run_and_get_code

    block, x = _moe(requires_grad=False)
    with torch.no_grad():
        eager = block(x)
        compiled_block = torch.compile(block, backend="inductor")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out, codes = run_and_get_code(compiled_block, x)
    assert not any("unimatmul" in code for code in codes)
    assert sum(_torchs_call(code) for code in codes) == 2
    assert _routed() == 0 and not grouped_routing.plans()
    assert _rel(out, eager) < BF16


def test_a_padded_grouped_node_gets_the_contiguous_layout_of_the_op() -> None:
    """torch's meta kernel pads the output's rows to 16 bytes on CUDA builds (N of 4 bf16:
    stride 8); the custom op's result is contiguous, and so is the rewritten node's value."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    compiled.define_ops()
    a, b, offs = operands("m", SIZES, n=4)
    with FakeTensorMode() as mode:
        fa, fb, foffs = mode.from_tensor(a), mode.from_tensor(b), mode.from_tensor(offs)
        padded = torch.empty_strided((a.shape[0], 4), (8, 1), dtype=a.dtype)
    graph = torch.fx.Graph()
    nodes = [graph.placeholder(name) for name in ("a", "b", "offs")]
    for node, value in zip(nodes, (fa, fb, foffs), strict=True):
        node.meta["val"] = value
    grouped = graph.call_function(torch.ops.aten._grouped_mm.default, tuple(nodes))
    grouped.meta["val"] = padded
    graph.output(grouped)
    assert compiled.rewrite(graph) == 1
    (new,) = [n for n in graph.nodes if n.op == "call_function"]
    assert new.target is torch.ops.unimatmul.grouped_mm.default
    value = new.meta["val"]
    assert tuple(value.shape) == (a.shape[0], 4) and value.is_contiguous() and value.dtype == a.dtype
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    assert not torch._grouped_mm(a, b, offs).is_contiguous()  # torch's own kernel pads here too
    got = gm(a, b, offs)  # routing off: torch's own kernel, made contiguous
    assert got.is_contiguous() and close(got, reference("m", a, b, offs), "bf16")
