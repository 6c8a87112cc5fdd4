"""Confirmation windows in routed calls: the Python kernels and the native (C++) ones.

The products are tuned for real with a oneDNN kernel preferred (so that a backend's
kernel is what the window judges), then ``min_gain`` decides the verdict without
depending on this machine's timings: -100 keeps any choice, 0.99 wants it 100x
faster than PyTorch's kernel. The timings themselves are real (a monotonic clock around
each call) and land in the record. Every output of the window is checked.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from torch_helpers import FAST, Env, onednn_available, tune_preferring_kernels  # noqa: E402

import unimatmul.torch as ut  # noqa: E402
from unimatmul.core.plugins import PluginManager  # noqa: E402
from unimatmul.torch import native, routing  # noqa: E402
from unimatmul.torch.model_tuning import collecting  # noqa: E402
from unimatmul.tuning.confirm import WARMUP  # noqa: E402
from unimatmul.tuning.selector import Selector, set_selector  # noqa: E402

CALLS = 4


def _ref(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return (x.double() @ w.double().t() + bias.double()).float()


def _linear_operands() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(13)
    return torch.randn(32, 96, generator=g), torch.randn(80, 96, generator=g), torch.randn(80, generator=g)


def _tuned(env: Env, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> list[Any]:
    if not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    with ut.enabled(), collecting() as met, torch.no_grad():
        torch.nn.functional.linear(x, w, bias)
    problems = list({(p.key, t): (p, t) for p, t in met}.values())
    tune_preferring_kernels(env.selector, problems)
    ut.clear_plans()
    ut.reset_stats()
    env.selector.confirm_calls = CALLS
    return problems


def _plan() -> routing.Plan:
    (plan,) = [p for p in ut.plans() if p.op == "addmm"]
    return plan


def _run_window(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, expected: torch.Tensor
) -> tuple[routing.Plan, int]:
    """Call until the plan's window is judged (checking every output); the plan and the calls it took."""
    for call in range(1, 200):
        out = torch.nn.functional.linear(x, w, bias)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
        plan = _plan()
        if plan.confirmation is not None and plan.confirmation.outcome is not None:
            return plan, call
    raise AssertionError("the window never closed")


@pytest.mark.parametrize("min_gain", [-100.0, 0.99], ids=["kept", "reverted"])
def test_a_window_judges_the_choice_where_it_runs(env: Env, min_gain: float) -> None:
    x, w, bias = _linear_operands()
    ((problem, target),) = _tuned(env, x, w, bias)
    env.selector.settings = replace(FAST, min_gain=min_gain)
    keep = min_gain < 0
    expected = _ref(x, w, bias)
    with ut.enabled(), torch.no_grad():
        first = torch.nn.functional.linear(x, w, bias)
        torch.testing.assert_close(first, expected, rtol=1e-4, atol=1e-4)
        plan = _plan()
        assert plan.confirming and plan.source == "cache"
        in_cpp = plan.native == native.ONEDNN
        if in_cpp:
            assert native.kinds() == {plan.ident: native.CONFIRM}
        plan, calls = _run_window(x, w, bias, expected)
        # The first call resolves the plan; the window is then 2 warm-up + 2 x CALLS calls
        # (the first call is the window's own first in the Python kernels, whose host clock
        # then judges with the call after the window: it ends the last call's span).
        assert calls + 1 == 1 + WARMUP + 2 * CALLS
        assert plan.source == ("confirmed" if keep else "reverted")
        for _ in range(3):
            torch.testing.assert_close(torch.nn.functional.linear(x, w, bias), expected, rtol=1e-4, atol=1e-4)
        if in_cpp:
            assert native.kinds() == {plan.ident: native.ONEDNN if keep else native.DEFAULT}
        assert (plan.runner is not None) == keep
    stats = ut.stats()
    assert stats["by_source"][plan.source] == 3
    assert stats["confirm"][plan.source] == 1 and stats["confirm"]["open"] == 0
    assert stats["routed"] == 1 + calls + 3
    if keep:
        assert stats["confirm"]["saved_s"] >= 0.0
    assert env.selector.settle(timeout=10)  # verdicts are written by a thread of their own
    record = env.selector.store.get(env.selector.platform(target).namespace, problem.key)
    found = record.settings["confirm"]
    assert found["verdict"] == plan.source and found["calls"] == CALLS and found["clock"] == "host"
    assert found["kernel_s"] > 0 and found["default_s"] > 0


def test_another_process_uses_the_verdict_without_a_window(env: Env) -> None:
    x, w, bias = _linear_operands()
    _tuned(env, x, w, bias)
    env.selector.settings = replace(FAST, min_gain=0.99)
    expected = _ref(x, w, bias)
    with ut.enabled(), torch.no_grad():
        torch.nn.functional.linear(x, w, bias)
        _run_window(x, w, bias, expected)
    assert env.selector.settle(timeout=10)
    other = Selector(plugins=PluginManager(), settings=FAST)  # the same cache file
    old = set_selector(other)
    try:
        with ut.enabled(), torch.no_grad():
            for _ in range(3):
                out = torch.nn.functional.linear(x, w, bias)
                torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
            plan = _plan()
            assert plan.source == "reverted" and plan.runner is None and plan.confirmation is None
            if plan.native != -1:
                assert native.kinds() == {plan.ident: native.DEFAULT}
    finally:
        set_selector(old)


def test_confirmation_off_keeps_the_choice_without_a_window(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    x, w, bias = _linear_operands()
    _tuned(env, x, w, bias)
    env.selector.confirm_calls = None
    monkeypatch.setenv("UNIMATMUL_CONFIRM", "0")
    with ut.enabled(), torch.no_grad():
        for _ in range(WARMUP + 2 * CALLS + 2):
            torch.nn.functional.linear(x, w, bias)
        plan = _plan()
        assert plan.confirmation is None and plan.source == "cache" and plan.runner is not None
    assert ut.stats()["kernel"] == WARMUP + 2 * CALLS + 2


def test_a_window_stays_correct_under_threads(env: Env) -> None:
    import threading

    x, w, bias = _linear_operands()
    _tuned(env, x, w, bias)
    expected = _ref(x, w, bias)
    errors: list[str] = []

    def work() -> None:
        for _ in range(30):
            out = torch.nn.functional.linear(x, w, bias)
            if not torch.allclose(out, expected, rtol=1e-4, atol=1e-4):
                errors.append("wrong")

    with ut.enabled(), torch.no_grad():
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        plan = _plan()
        assert plan.confirmation is not None and plan.confirmation.outcome is not None
    assert not errors
    assert ut.stats()["routed"] == 4 * 30


# --- errors stay PyTorch's -------------------------------------------------------


def _error(fn: Any) -> tuple[type, str]:
    try:
        fn()
    except Exception as exc:
        return type(exc), str(exc)
    return type(None), ""


def test_inputs_of_another_dtype_and_complex_scalars_raise_pytorch_s_errors(env: Env) -> None:
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(6, 5, generator=g), torch.randn(5, 7, generator=g)
    c, c64 = torch.randn(6, 7, generator=g), torch.randn(6, 7, generator=g, dtype=torch.float64)
    bias64 = torch.randn(7, generator=g, dtype=torch.float64)
    ba, bb = torch.randn(2, 6, 5, generator=g), torch.randn(2, 5, 7, generator=g)
    bc64 = torch.randn(2, 6, 7, generator=g, dtype=torch.float64)
    cases = {
        "addmm-f64-input-beta0": lambda: torch.addmm(c64, a, b, beta=0),
        "addmm-f64-bias-beta0": lambda: torch.addmm(bias64, a, b, beta=0),
        "addmm-f64-bias": lambda: torch.addmm(bias64, a, b),
        "baddbmm-f64-input-beta0": lambda: torch.baddbmm(bc64, ba, bb, beta=0),
        "addmm-complex-alpha": lambda: torch.addmm(c, a, b, alpha=1j),
        "addmm-complex-beta": lambda: torch.addmm(c, a, b, beta=1j),
    }
    expected = {name: _error(fn) for name, fn in cases.items()}
    assert all(kind is RuntimeError for kind, _ in expected.values()), expected
    if onednn_available(env.selector):
        # Tuned keys too: a plan with a kernel must not take a complex scalar either.
        with ut.enabled(), collecting() as met:
            torch.addmm(c, a, b)
            torch.addmm(c, a, b, beta=0)
        tune_preferring_kernels(env.selector, list({(p.key, t): (p, t) for p, t in met}.values()))
        ut.clear_plans()
    with ut.enabled():
        for _ in range(2):  # the second time through the native table where there is one
            for name, fn in cases.items():
                assert _error(fn) == expected[name], name
            torch.testing.assert_close(torch.addmm(c, a, b), c + a @ b, rtol=1e-5, atol=1e-5)
