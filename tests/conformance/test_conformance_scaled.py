"""The conformance suite on scaled (fp8) GEMMs: it checks a backend that runs them.

The fakes (conformance_fakes.py) run on torch CPU tensors: one correct, one that
applies the first row-wise (or block) scale to every row (and block). The suite must pass the first on every
scaled case of its matrix and find exactly the wrong results of the second.
"""

from __future__ import annotations

import conformance_fakes as fakes
import pytest

from unimatmul_conformance import CHECKS, run_suite

pytest.importorskip("torch")

FAST = frozenset(CHECKS) - {"identity-stable"}


def test_a_correct_scaled_backend_passes_every_check() -> None:
    report = run_suite(fakes.ScaledGood(), quick=True, checks=FAST)
    assert report.ok, [f"{r.id}: {r.why}" for r in report.failed()][:5]
    runs = [r for r in report.results if r.check == "result" and r.status == "passed"]
    cases = {r.case for r in runs}
    # Both scale modes, a bias, every output dtype, mixed e5m2 x e4m3 inputs, padded leading dimensions.
    assert any("scales=tensor,tensor" in c for c in cases)
    assert any("scales=rowwise,rowwise" in c for c in cases)
    block = [c for c in cases if "scales=block1x128,block128x128" in c]
    assert any(":m1n256k384" in c for c in block) and any(":bias:biasbf16:" in c for c in block)
    assert any(":bias:biasbf16:" in c for c in cases)
    assert {c.split(":")[1] for c in cases} >= {
        "f8e4m3.f8e4m3.bf16",
        "f8e4m3.f8e4m3.f16",
        "f8e4m3.f8e4m3.f32",
        "f8e5m2.f8e4m3.bf16",
    }
    assert any(":ld112,128,152:" in c for c in cases)  # pad=(16, 32, 8) on 127x144x96
    # The probes a real fp8 kernel would refuse run here too (this fake takes any layout).
    assert any(":NN:" in c for c in cases)
    threads = [r for r in report.results if r.check == "threads"]
    assert any("scales=rowwise" in (r.case or "") and r.status == "passed" for r in threads)
    # Plain GEMMs are answered "unsupported", not run.
    refused = [r for r in report.results if r.check == "candidates" and r.why.startswith("unsupported")]
    assert any((r.case or "").startswith("gemm:f32.") for r in refused)


def test_a_backend_that_ignores_row_wise_and_block_scales_is_caught() -> None:
    report = run_suite(fakes.IgnoresRowWiseScales(), quick=True, checks=FAST - {"threads"})
    failed = report.failed()
    assert {r.check for r in failed} == {"result"}
    assert all(
        "scales=rowwise,rowwise" in (r.case or "") or "scales=block1x128,block128x128" in (r.case or "")
        for r in failed
    )
    assert any("scales=block1x128,block128x128" in (r.case or "") for r in failed)  # one scale for all blocks
    # Per-tensor cases (one scale each, which the fake does apply) still pass.
    passed = [r for r in report.results if r.check == "result" and r.status == "passed"]
    assert any("scales=tensor,tensor" in (r.case or "") for r in passed)
