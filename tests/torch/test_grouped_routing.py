"""Routing ``aten::_grouped_mm`` (MoE experts): forward and backward, each form, torch's
errors, mode off, and an MoE block written as Hugging Face's grouped_mm experts are."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from grouped_cases import close, offs_of, operands, reference  # noqa: E402
from torch_helpers import Env, Experts  # noqa: E402

import unimatmul  # noqa: E402
import unimatmul.torch as ut  # noqa: E402
from unimatmul.core.problem import Problem  # noqa: E402
from unimatmul.torch import grouped_routing  # noqa: E402

FORMS = ["m", "k", "n", "none"]
SIZES = [13, 0, 7, 4]


def _routed_calls() -> int:
    return int(ut.grouped_stats()["routed"])


@pytest.mark.parametrize("jagged", FORMS)
def test_each_form_is_routed_and_right(env: Env, jagged: str) -> None:
    a, b, offs = operands(jagged, SIZES)
    want = torch._grouped_mm(a, b, offs)
    ut.enable()
    with unimatmul.mode("tune"):
        got = torch._grouped_mm(a, b, offs)
    got_again = torch._grouped_mm(a, b, offs)  # cached: the same plan
    ref = reference(jagged, a, b, offs)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert close(got, ref, "bf16") and close(got_again, ref, "bf16")
    assert _routed_calls() == 2
    plans = grouped_routing.plans()  # one per mode: tune, then the environment's
    # Where there are not two, what each plan is (its source, label, calls) says why.
    assert len(plans) == 2, [(p.source, p.label, p.calls, p.reason) for p in plans] + [ut.grouped_stats()]
    assert all(
        p.problem is not None and p.problem.op == "grouped_gemm" and p.problem.jagged == jagged for p in plans
    )


def test_forward_and_backward_are_routed_and_their_gradients_right(env: Env) -> None:
    a64, b64, offs = operands("m", SIZES, "f32")
    a = a64.clone().requires_grad_(True)
    b = b64.clone().requires_grad_(True)
    grad = torch.randn(a.shape[0], b.shape[-1], generator=torch.Generator().manual_seed(5))
    ut.enable()
    with unimatmul.mode("tune"):
        y = torch._grouped_mm(a, b, offs)
        (y * grad).sum().backward()
    assert y.grad_fn is not None
    # float64 gradients, group by group
    ga = torch.zeros_like(a64, dtype=torch.float64)
    gb = torch.zeros_like(b64, dtype=torch.float64)
    start = 0
    for g, end in enumerate(offs.tolist()):
        rows = slice(start, end)
        ga[rows] = grad[rows].double() @ b64[g].double().T
        gb[g] = a64[rows].double().T @ grad[rows].double()
        start = end
    assert a.grad is not None and b.grad is not None
    assert torch.allclose(a.grad.double(), ga, rtol=1e-4, atol=1e-4)
    assert torch.allclose(b.grad.double(), gb, rtol=1e-4, atol=1e-4)
    # the forward (2-D x 3-D) and both products of the backward: grad @ b^T (2-D x 3-D)
    # and a^T @ grad (2-D x 2-D, offs over K)
    assert _routed_calls() == 3
    tuned = [Problem.from_key(key) for _, key, _ in env.selector.store.items(None)]
    assert sorted(p.jagged for p in tuned) == ["k", "m", "m"]


def test_functional_grouped_mm_under_no_grad_is_routed(env: Env) -> None:
    grouped_mm = getattr(torch.nn.functional, "grouped_mm", None)
    if grouped_mm is None:
        pytest.skip("this torch has no torch.nn.functional.grouped_mm")
    a, b, offs = operands("m", SIZES)
    ut.enable()
    with torch.no_grad(), unimatmul.mode("tune"):
        got = grouped_mm(a, b, offs=offs)
    assert close(got, reference("m", a, b, offs), "bf16")
    assert _routed_calls() == 1


@pytest.mark.parametrize("env", ["native"], indirect=True)
def test_a_known_key_is_served_by_the_native_kernel(env: Env) -> None:
    """Once its plan is made, a key's calls are served from the native GROUPED table (no
    Python), whatever their offs; a mode() block sends them to Python again."""
    from unimatmul.torch import native

    a, b, offs = operands("m", SIZES)
    ut.enable()
    assert grouped_routing._router.native_keys
    first = torch._grouped_mm(a, b, offs)  # cached mode, no record: PyTorch's kernel
    (plan,) = grouped_routing.plans()
    assert plan.native == native.DEFAULT and plan.is_default
    other = offs_of([0, 20, 2, 2])
    for _ in range(3):
        got = torch._grouped_mm(a, b, other)
    assert native.counts(table=native.GROUPED) == {plan.ident: 3}
    assert close(first, reference("m", a, b, offs), "bf16") and close(
        got, reference("m", a, b, other), "bf16"
    )
    with unimatmul.mode("cached"):
        torch._grouped_mm(a, b, offs)
    assert native.counts(table=native.GROUPED) == {plan.ident: 3}  # the block's call went to Python
    assert _routed_calls() == 5


def test_mode_off_and_disable_leave_torch_alone(env: Env) -> None:
    a, b, offs = operands("m", SIZES)
    want = torch._grouped_mm(a, b, offs)
    ut.enable()
    with unimatmul.mode("off"):
        got = torch._grouped_mm(a, b, offs)
    assert torch.equal(got[: int(offs[-1])], want[: int(offs[-1])]) and not grouped_routing.plans()
    ut.disable()
    torch._grouped_mm(a, b, offs)
    assert not grouped_routing.plans() and _routed_calls() == 0


def test_fake_tensors_pass_the_door_untouched(env: Env) -> None:
    """What torch.compile and make_fx trace with never reaches a plan (no data to read)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    a, b, offs = operands("m", SIZES)
    ut.enable()
    with FakeTensorMode() as mode:
        got = torch._grouped_mm(mode.from_tensor(a), mode.from_tensor(b), mode.from_tensor(offs))
    assert tuple(got.shape) == (a.shape[0], b.shape[-1]) and got.dtype == a.dtype
    assert _routed_calls() == 0 and not grouped_routing.plans()


def test_call_reaches_the_door_where_the_thread_excludes_its_key(env: Env) -> None:
    """A custom op's kernel runs below ADInplaceOrView: the aten op would skip the door there."""
    a, b, offs = operands("m", SIZES)
    ut.enable()
    with unimatmul.mode("tune"), torch._C._AutoDispatchBelowADInplaceOrView():
        skipped = torch._grouped_mm(a, b, offs)
        assert _routed_calls() == 0
        got = grouped_routing.call(a, b, offs)
    assert _routed_calls() == 1
    ref = reference("m", a, b, offs)
    assert close(got, ref, "bf16") and close(skipped, ref, "bf16")


def test_what_torch_refuses_it_still_refuses_with_its_own_error(env: Env) -> None:
    a, b, offs = operands("m", SIZES)
    bias = torch.zeros(b.shape[-1], dtype=a.dtype)

    def message(call: Any) -> str:
        with pytest.raises(Exception) as caught:
            call()
        return f"{type(caught.value).__name__}: {caught.value}"

    unrouted = message(lambda: torch._grouped_mm(a, b, offs, bias=bias))
    ut.enable()
    assert message(lambda: torch._grouped_mm(a, b, offs, bias=bias)) == unrouted
    (plan,) = grouped_routing.plans()
    assert plan.runner is None and plan.source == "passthrough" and plan.reason


def test_an_moe_block_gives_the_same_result_routed(env: Env) -> None:
    torch.manual_seed(0)
    block = Experts(experts=8, hidden=32, inter=16, top_k=2).to(torch.bfloat16)
    x = torch.randn(20, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        want = block(x)
        ut.enable()
        with unimatmul.mode("tune"):
            first = block(x)
        again = block(x)
    assert torch.allclose(first.float(), want.float(), rtol=3e-2, atol=3e-2)
    assert torch.allclose(again.float(), want.float(), rtol=3e-2, atol=3e-2)
    assert _routed_calls() == 4  # two grouped products per call


def test_offs_of_another_distribution_reuse_the_key(env: Env) -> None:
    a, b, offs = operands("m", SIZES)
    ut.enable()
    with unimatmul.mode("tune"):
        torch._grouped_mm(a, b, offs)
    other = offs_of([0, 20, 2, 2])  # same total, another distribution
    got = torch._grouped_mm(a, b, other)
    assert close(got, reference("m", a, b, other), "bf16")
    assert len(grouped_routing.plans()) == 2  # the tune-mode key and the cached one: no third


def test_pytorchs_turns_in_a_window_return_its_own_output_not_a_copy(
    env: Env, registered: Any, monkeypatch: Any
) -> None:
    """A routed tie's window takes turns of the kernel and PyTorch's own grouped GEMM; on
    PyTorch's turns the call returns the output PyTorch's kernel made (no copy into the
    buffer routing allocated), and every call is right."""
    from grouped_cases import GroupedFake, check_window_turns, tie_record

    from unimatmul.core._backend import Target
    from unimatmul.core.arrays import CPU, adapter_for_kind
    from unimatmul.core.grouped import grouped_problem_of

    made: list[Any] = []
    real = grouped_routing._OP

    def spied(*args: Any) -> Any:  # PyTorch's own kernel, its outputs remembered
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(grouped_routing, "_OP", spied)
    fake = GroupedFake("correct")
    adapter = adapter_for_kind("torch")
    a, b, offs = operands("m", SIZES)
    problem = grouped_problem_of(adapter, a, b, offs)
    platform = env.selector.platform(Target(adapter, CPU))
    env.selector.confirm_calls = 8
    with registered(env.selector.plugins, fake):
        env.selector.store.put(
            platform.namespace, problem.key, tie_record(problem, f"{fake.name}/kernel", platform.versions)
        )
        ut.enable()
        check_window_turns(lambda: torch._grouped_mm(a, b, offs), fake, made, reference("m", a, b, offs))
