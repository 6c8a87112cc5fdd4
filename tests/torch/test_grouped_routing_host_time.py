"""The grouped door's host time per call, as benchmarks/api_overhead.py measures it for each choice."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch_helpers import Env  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import api_overhead  # noqa: E402

from unimatmul.torch import grouped_routing  # noqa: E402


def test_the_grouped_door_is_timed_off_and_routed_for_each_choice(env: Env) -> None:
    env.selector.confirm_calls = 0  # as the script's main() runs it: no confirmation windows
    args = argparse.Namespace(device="cpu", dtype=None, grouped_shape="16x4x16x16", calls=3, rounds=2)
    report = api_overhead.measure_grouped(args, gpu=False)
    assert report["shape"] == "16x4x16x16"
    assert report["problem"].startswith("grouped_gemm:"), report["problem"]
    choices = report["choices"]
    assert set(choices) == {"tuned", "default", "kernel"}
    default = choices["default"]
    assert default["winner"] == "default/default"
    # The routed call ran on the forced choice: its plan's label names it.
    assert default["plans"] and all("default" in label for label in default["plans"]), default["plans"]
    # With the native kernels, PyTorch's kernel is the native table's entry (no Python a call).
    from unimatmul.torch import native

    if native.loaded() and grouped_routing._router.native_keys:
        assert default["native"] == [native.DEFAULT]
    for name in ("tuned", "default", "kernel"):
        choice = choices[name]
        if "skipped" in choice:
            assert name == "kernel"  # only where no kernel passed the check
            continue
        off = choice["routing_off"]["torch._grouped_mm"]
        on = choice["routing_on"]["torch._grouped_mm routed"]
        assert off["host_us"] > 0 and on["host_us"] > 0 and on["wall_us"] > 0
    kernel = choices["kernel"]
    if "skipped" not in kernel:
        assert kernel["winner"] != "default/default"
        assert any(kernel["winner"] in label for label in kernel["plans"]), kernel["plans"]
