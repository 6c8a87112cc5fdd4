"""Tests of the example plugin: its kernels, its registration, and the conformance suite.

Run after ``pip install -e plugins/unimatmul-numpy-variants`` (the entry point must
be installed for unimatmul to find the plugin by name, as a user's install would).
"""

from __future__ import annotations

import numpy as np
import pytest
from unimatmul_numpy_variants import NumpyVariantsBackend

from unimatmul import Candidate, Problem, UnsupportedProblem
from unimatmul.backend import CPU, Target, adapter_for_kind
from unimatmul.core.plugins import PluginManager
from unimatmul_conformance import run_suite

TARGET = Target(adapter_for_kind("numpy"), CPU)


def test_unimatmul_finds_the_plugin_through_its_entry_point() -> None:
    plugins = PluginManager()
    assert "numpy-variants" in plugins.report.loaded
    assert isinstance(plugins.backends()["numpy-variants"], NumpyVariantsBackend)


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_every_variant_computes_the_product(dtype: str, trans_a: bool) -> None:
    rng = np.random.default_rng(3)
    npdt = np.float32 if dtype == "f32" else np.float64
    a = rng.standard_normal((150, 70)).astype(npdt)
    a = np.asfortranarray(a) if trans_a else a
    b = rng.standard_normal((70, 90)).astype(npdt)
    c = rng.standard_normal((150, 90)).astype(npdt)
    bias = rng.standard_normal(90).astype(npdt)
    problem = Problem.from_shape(150, 90, 70, dtype, epilogue="bias_relu")
    problem = Problem(
        **{**problem.__dict__, "trans_a": trans_a, "lda": 150 if trans_a else 70, "beta_zero": False}
    )
    a64, b64, c64, bias64 = (x.astype(np.float64) for x in (a, b, c, bias))
    expected = np.maximum(1.5 * (a64 @ b64) - 0.5 * c64 + bias64, 0.0)
    backend = NumpyVariantsBackend()
    offered = backend.candidates(problem, TARGET)
    assert [cand.identity for cand in offered] == [
        "numpy-variants/transposed",
        "numpy-variants/blocked?rows=64",
    ]
    for candidate in offered:
        out = c.copy()
        backend.prepare(problem, candidate, TARGET)(a, b, out, 1.5, -0.5, bias)
        error = np.linalg.norm(out - expected) / np.linalg.norm(expected)
        assert error < (1e-5 if dtype == "f32" else 1e-12), candidate.identity


def test_what_it_cannot_run_is_refused() -> None:
    backend = NumpyVariantsBackend()
    for problem in (
        Problem.from_shape(8, 8, 8, "f16"),
        Problem.from_shape(8, 8, 8, "f32", epilogue="gelu"),
        Problem(8, 8, 8, dtype_a="bf16", dtype_b="bf16", dtype_c="f32"),
    ):
        with pytest.raises(UnsupportedProblem):
            backend.candidates(problem, TARGET)
    with pytest.raises(UnsupportedProblem, match="no kernel"):
        backend.prepare(Problem(8, 8, 8), Candidate.make("numpy-variants", "tiled", rows=4), TARGET)


def test_the_plugin_passes_the_conformance_suite() -> None:
    # By name, as `unimatmul conformance --backend numpy-variants` finds it.
    report = run_suite("numpy-variants", quick=True)
    assert report.ok, report.summary()
    assert report.by_check()["result"]["passed"] >= 30
