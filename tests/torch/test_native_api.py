"""unimatmul.matmul on torch tensors through the native library's API table.

Once the native kernels are built, a plain call (no c, bias or activation, alpha 1,
beta 0) of a known signature is served by one C function; everything else, and any
call it cannot serve, takes the Python path, with the same results and errors. The
table's own counters tell the two paths apart.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_helpers import FAST, Env, onednn_available, tune_preferring_kernels  # noqa: E402

import unimatmul  # noqa: E402
from unimatmul import api  # noqa: E402
from unimatmul.backend import DEFAULT, Target  # noqa: E402
from unimatmul.core.arrays import CPU, adapter_of  # noqa: E402
from unimatmul.core.problem import Problem  # noqa: E402
from unimatmul.settings import SettingError  # noqa: E402
from unimatmul.torch import native  # noqa: E402
from unimatmul.tuning.confirm import WARMUP  # noqa: E402

NATIVE = pytest.mark.parametrize("env", ["native"], indirect=True)


def _native_calls() -> int:
    return sum(native.counts(table=native.API).values())


def _operands(*shape: int, batch: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(sum(shape))
    m, k, n = shape
    lead = (batch,) if batch else ()
    return torch.randn(*lead, m, k, generator=g), torch.randn(*lead, k, n, generator=g)


def _ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double() @ b.double()).float()


@NATIVE
@pytest.mark.parametrize("batch", [None, 3], ids=["2d", "3d"])
def test_plain_calls_are_served_by_the_native_table(env: Env, batch: int | None) -> None:
    a, b = _operands(12, 20, 8, batch=batch)
    ref = _ref(a, b)
    torch.testing.assert_close(unimatmul.matmul(a, b), ref, rtol=1e-5, atol=1e-5)  # resolves
    assert api._door.native_call is not None
    before = _native_calls()
    for _ in range(3):
        torch.testing.assert_close(unimatmul.matmul(a, b), ref, rtol=1e-5, atol=1e-5)
    assert _native_calls() == before + 3
    out = torch.full_like(ref, float("nan"))
    assert unimatmul.matmul(a, b, out=out) is out  # resolves the out= signature
    out.fill_(float("nan"))
    assert unimatmul.matmul(a, b, out=out) is out
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert _native_calls() == before + 4


@NATIVE
def test_other_forms_and_modes_take_the_python_path(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _operands(12, 20, 8)
    ref = _ref(a, b)
    bias = torch.randn(8)
    unimatmul.matmul(a, b)
    before = _native_calls()
    torch.testing.assert_close(unimatmul.matmul(a, b, alpha=2.0), 2 * ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(unimatmul.matmul(a, b, bias=bias), ref + bias, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        unimatmul.matmul(a, b, bias=bias, activation="relu"), (ref + bias).relu(), rtol=1e-5, atol=1e-5
    )
    with unimatmul.mode("off"):
        torch.testing.assert_close(unimatmul.matmul(a, b), ref, rtol=1e-5, atol=1e-5)
    assert _native_calls() == before
    # The environment's mode is read per call, as on the Python path: in mode off, the
    # key the block above resolved (and put) serves these calls.
    monkeypatch.setenv("UNIMATMUL_MODE", " OFF ")
    unimatmul.matmul(a, b)
    unimatmul.matmul(a, b)
    assert _native_calls() == before + 2
    monkeypatch.setenv("UNIMATMUL_MODE", "record")
    unimatmul.matmul(a, b)  # a new key (mode record): resolved in Python, then native
    unimatmul.matmul(a, b)
    assert _native_calls() == before + 3
    monkeypatch.setenv("UNIMATMUL_MODE", "sometimes")
    with pytest.raises(SettingError, match="UNIMATMUL_MODE"):
        unimatmul.matmul(a, b)


@NATIVE
def test_errors_stay_those_of_the_python_path(env: Env) -> None:
    a, b = _operands(12, 20, 8)
    unimatmul.matmul(a, b)

    def error(fn: Any) -> tuple[type, str]:
        try:
            fn()
        except Exception as exc:
            return type(exc), str(exc)
        return type(None), ""

    grad = a.clone().requires_grad_()
    # What the Python path says (the native table holds no key for these, or refuses them).
    with pytest.raises(RuntimeError, match="automatic differentiation"):
        unimatmul.matmul(grad, b)
    kind, message = error(lambda: unimatmul.matmul(a, b, out=torch.empty(12, 9)))
    assert kind is ValueError and "out" in message
    kind, _ = error(lambda: unimatmul.matmul(a, b.double()))
    assert kind in (TypeError, ValueError)


@NATIVE
def test_a_tuned_kernel_is_confirmed_in_the_native_table(env: Env) -> None:
    if not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    a, b = _operands(32, 96, 80)
    ref = _ref(a, b)
    adapter = adapter_of(a)
    problem = Problem.from_operands(adapter, a, b)[0]
    (record,) = tune_preferring_kernels(env.selector, [(problem, Target(adapter, CPU))])
    assert record.winner != DEFAULT.identity
    env.selector.confirm_calls = 4
    env.selector.settings = replace(FAST, min_gain=-100.0)  # any kernel is kept
    api.clear_fast_path()
    torch.testing.assert_close(unimatmul.matmul(a, b), ref, rtol=1e-4, atol=1e-4)
    assert set(native.kinds(native.API).values()) == {native.CONFIRM}
    for _ in range(WARMUP + 2 * 4):
        torch.testing.assert_close(unimatmul.matmul(a, b), ref, rtol=1e-4, atol=1e-4)
    assert set(native.kinds(native.API).values()) == {native.ONEDNN}
    (found,) = api.TABLE.live()
    assert (
        found.runner.candidate.identity == record.winner and type(found.runner).__name__ != "ConfirmingRunner"
    )
    assert env.selector.stats.confirmed == 1
