"""Prometheus metrics of routed calls (unimatmul.torch.metrics), read from a real registry."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
prometheus_client = pytest.importorskip("prometheus_client")

from torch_helpers import FAST, Env, onednn_available, tune_preferring_kernels  # noqa: E402

import unimatmul.torch as ut  # noqa: E402
from unimatmul.torch import metrics, native  # noqa: E402
from unimatmul.torch.model_tuning import collecting  # noqa: E402
from unimatmul.tuning.confirm import WARMUP  # noqa: E402


def test_metrics_count_routed_calls_by_source_and_never_go_down(env: Env) -> None:
    registry = prometheus_client.CollectorRegistry()
    metrics.register(registry)

    def value(name: str, **labels: str) -> float:
        found = registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    # The counters live as long as the process: earlier tests' calls are in them too.
    calls = "unimatmul_routed_calls_total"
    default_before = value(calls, op="mm", source="default", kind="default")
    passthrough_before = value(calls, op="mm", source="passthrough", kind="passthrough")
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    ints = torch.arange(6).reshape(2, 3)
    with ut.enabled():
        for _ in range(5):
            torch.mm(a, b)  # untuned: Default
        ints @ ints.t()  # not eligible: PyTorch's kernel, untouched
    assert value(calls, op="mm", source="default", kind="default") == default_before + 5
    assert value(calls, op="mm", source="passthrough", kind="passthrough") == passthrough_before + 1
    ut.reset_stats()
    assert ut.stats()["routed"] == 0
    assert value(calls, op="mm", source="default", kind="default") == default_before + 5  # never reset
    assert value("unimatmul_confirmation_windows_open") == 0


def test_metrics_show_confirmations_time_saved_and_tuning(env: Env) -> None:
    if not onednn_available(env.selector):
        pytest.skip("oneDNN is not available here")
    registry = prometheus_client.CollectorRegistry()
    metrics.register(registry)
    judged = registry.get_sample_value("unimatmul_confirmations_total", {"verdict": "confirmed"}) or 0.0
    kept = {"op": "mm", "source": "confirmed", "kind": "kernel"}
    kept_before = registry.get_sample_value("unimatmul_routed_calls_total", kept) or 0.0
    x, w = torch.randn(32, 96), torch.randn(80, 96)
    with ut.enabled(), collecting() as met, torch.no_grad():
        x @ w.t()
    tune_preferring_kernels(env.selector, list({(p.key, t): (p, t) for p, t in met}.values()))
    ut.clear_plans()
    env.selector.confirm_calls = 4
    env.selector.settings = replace(FAST, min_gain=-100.0)  # kept whatever the timings
    with ut.enabled(), torch.no_grad():
        for _ in range(1 + WARMUP + 2 * 4 + 10):
            x @ w.t()
        (plan,) = ut.plans()
    # The native window opens on the second call (the first one makes the entry in Python).
    after_window = 10 if plan.native == native.ONEDNN else 11
    assert registry.get_sample_value("unimatmul_confirmations_total", {"verdict": "confirmed"}) == judged + 1
    assert registry.get_sample_value("unimatmul_routed_calls_total", kept) == kept_before + after_window
    saved = registry.get_sample_value("unimatmul_kernel_time_saved_seconds_total")
    assert saved == pytest.approx(ut.totals()["confirm"]["saved_s"])
    assert registry.get_sample_value("unimatmul_tuning_seconds_total") == pytest.approx(
        env.selector.stats.tune_s
    )
    assert env.selector.stats.tune_s > 0
