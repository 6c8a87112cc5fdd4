"""The suite's GPU checks (graph capture, the caller's stream) against torch fakes.

Needs a CUDA or ROCm GPU and torch built for it; skipped elsewhere.
"""

from __future__ import annotations

import conformance_fakes as fakes
import pytest

from unimatmul_conformance import run_suite

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU"),
]

GPU_CHECKS = {"graph", "stream", "prepare", "result", "written", "guard"}


def test_a_correct_gpu_backend_passes_every_check() -> None:
    report = run_suite(fakes.TorchGpuGood(), quick=True)
    assert report.ok, [f"{r.id}: {r.why}" for r in report.failed()][:5]
    by_check = report.by_check()
    assert by_check["graph"]["passed"] >= 1 and by_check["stream"]["passed"] >= 1
    assert by_check["result"]["passed"] >= 40 and by_check["threads"]["passed"] >= 1
    assert report.target["device"] in ("cuda:0", "hip:0") and report.target["array"] == "torch"


def test_a_runner_on_its_own_stream_is_caught() -> None:
    report = run_suite(fakes.RunsOnItsOwnStream(), quick=True, checks=GPU_CHECKS)
    failed = {r.check for r in report.failed()}
    # Ordinary runs may also see the race with the caller's stream; these two always do.
    assert {"graph", "stream"} <= failed, [f"{r.id}: {r.why}" for r in report.failed()][:5]
    stream = report.failed("stream")[0]
    assert "caller's stream" in stream.why


def test_a_runner_that_synchronises_is_caught() -> None:
    report = run_suite(fakes.SynchronisesTheHost(), quick=True, checks=GPU_CHECKS)
    assert {r.check for r in report.failed()} == {"graph", "stream"}, [
        f"{r.id}: {r.why}" for r in report.failed()
    ][:5]
    assert any("synchronises" in r.why for r in report.failed("stream"))
