"""Scaled (fp8) GEMMs of the hipBLASLt backend, on the shared Lt driver and its hipBLASLt tables.

Through the C-callback fake of ``test_hipblaslt.py``, which decodes fp8 and applies the
scales as hipblaslt.h documents them: the runner computes the row-major scaled product,
hipBLASLt 0.10 offers per-tensor scales only, and the native call writes C as D.
No GPU: the cuBLASLt side of the same code runs on the H200 (``scripts/gpu_fp8.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from test_hipblaslt import TARGET, FakeHipblaslt, make_backend

from unimatmul.core.errors import UnsupportedProblem
from unimatmul.core.problem import Problem
from unimatmul.core.scales import scaled_problem
from unimatmul_backends.lt.abi import HIPBLASLT_6
from unimatmul_backends.lt.runner import ScaledLtRunner
from unimatmul_backends.rocm.hipblaslt import solution_candidate

torch = pytest.importorskip("torch")


def test_hipblaslt_scaled_native_call_writes_c_as_d() -> None:
    fake = FakeHipblaslt(100100, [3, 17])
    problem = scaled_problem(16, 32, 48, dtype_a="f8e4m3fnuz", dtype_c="f32")
    runner = make_backend(fake).prepare(problem, solution_candidate(17), TARGET)
    call = runner.native_call()
    assert call is not None and call.kind == "scaled_lt"
    abi = fake.abi
    assert call.words[:3] == [abi.desc_attr("A_SCALE_POINTER")[0], abi.desc_attr("B_SCALE_POINTER")[0], 1]
    assert all(call.words[3:5])  # the library's own function addresses


# --- the hipBLASLt fake computes ---------------------------------------------------------------


def _host(problem: Problem, seed: int) -> dict[str, Any]:
    """fp8 operands as host bytes (what the fake library reads), scales, and the reference."""
    gen = torch.Generator().manual_seed(seed)
    fp8 = {"f8e4m3fnuz": torch.float8_e4m3fnuz, "f8e4m3": torch.float8_e4m3fn}[problem.dtype_a]
    a = torch.randn(problem.m, problem.k, generator=gen).to(fp8)
    w = torch.randn(problem.n, problem.k, generator=gen).to(fp8)
    rowwise = problem.scale_a == "rowwise"
    sa = torch.rand((problem.m, 1) if rowwise else (1,), generator=gen) + 0.5
    sb = torch.rand((1, problem.n) if rowwise else (1,), generator=gen) + 0.5
    bias = torch.randn(problem.n, generator=gen).to(torch.float16) if problem.has_bias else None
    ref = (a.double() * sa.double()) @ (w.double().t() * sb.double())
    if bias is not None:
        ref = ref + bias.double()
    return {
        "a": a.view(torch.uint8).numpy(),
        "b": w.view(torch.uint8).numpy().T,  # w.t(): column-major, as torch's fp8 linear
        "sa": sa.numpy(),
        "sb": sb.numpy(),
        "bias": None if bias is None else bias.numpy(),
        "ref": ref.numpy(),
    }


@pytest.mark.parametrize(
    "problem",
    [
        scaled_problem(33, 48, 64, dtype_a="f8e4m3fnuz", dtype_c="f16", scales="rowwise", bias=True),
        scaled_problem(16, 32, 48, dtype_a="f8e4m3fnuz", dtype_c="f32"),
        scaled_problem(7, 16, 32, dtype_c="f16", scales="rowwise"),
    ],
    ids=lambda p: f"{p.dtype_a}-{p.dtype_c}-{p.scale_a}{'-bias' if p.has_bias else ''}",
)
def test_hipblaslt_runner_computes_the_scaled_product(problem: Problem) -> None:
    fake = FakeHipblaslt(100100, [3, 17])  # hipBLASLt 1.1: the table with scale modes
    backend = make_backend(fake)
    runner = backend.prepare(problem, solution_candidate(17), TARGET)
    assert isinstance(runner, ScaledLtRunner)
    ops = _host(problem, 5)
    out = np.full((problem.m, problem.n), np.nan, {"f16": np.float16, "f32": np.float32}[problem.dtype_c])
    runner(ops["a"], ops["b"], out, 1.0, 0.0, ops["bias"], ops["sa"], ops["sb"])
    err = np.linalg.norm(out.astype(np.float64) - ops["ref"]) / np.linalg.norm(ops["ref"])
    assert err < {"f16": 2e-3, "f32": 1e-6}[problem.dtype_c], err
    assert fake.ran == [(17, 0x5EED)]
    descs = [o for o in fake.objects.values() if o["kind"] == "desc"]
    assert all("FAST_ACCUM" not in d["attrs"] for d in descs)  # hipBLASLt has no such attribute


def test_older_hipblaslt_runs_per_tensor_scales_only() -> None:
    fake = FakeHipblaslt(1000, [3])  # 0.10 (ROCm 6.3): HIPBLASLT_6, no scale-mode attribute
    assert fake.abi is HIPBLASLT_6
    backend = make_backend(fake)
    problem = scaled_problem(16, 32, 48, dtype_a="f8e4m3fnuz", dtype_c="f32")
    runner = backend.prepare(problem, solution_candidate(3), TARGET)
    ops = _host(problem, 9)
    out = np.full((16, 32), np.nan, np.float32)
    runner(ops["a"], ops["b"], out, 1.0, 0.0, None, ops["sa"], ops["sb"])
    assert np.linalg.norm(out - ops["ref"]) / np.linalg.norm(ops["ref"]) < 1e-6
    rowwise = scaled_problem(16, 32, 48, dtype_a="f8e4m3fnuz", dtype_c="f32", scales="rowwise")
    with pytest.raises(UnsupportedProblem, match="no A_SCALE_MODE OUTER_VEC_32F: only per-tensor scales"):
        backend.candidates(rowwise, TARGET)


def test_pointer_widths_reach_the_library_intact() -> None:
    """The fake read back exactly the scale addresses the runner set (8-byte pointers)."""
    fake = FakeHipblaslt(100100, [5])
    backend = make_backend(fake)
    problem = scaled_problem(8, 16, 32, dtype_a="f8e4m3fnuz", dtype_c="f32", scales="rowwise")
    runner = backend.prepare(problem, solution_candidate(5), TARGET)
    ops = _host(problem, 2)
    out = np.zeros((8, 16), np.float32)
    runner(ops["a"], ops["b"], out, 1.0, 0.0, None, ops["sa"], ops["sb"])
    desc = [o for o in fake.objects.values() if o["kind"] == "desc"][-1]["attrs"]
    assert desc["A_SCALE_POINTER"] == ops["sb"].__array_interface__["data"][0]
    assert desc["B_SCALE_POINTER"] == ops["sa"].__array_interface__["data"][0]
    assert fake.ran == [(5, 0x5EED)]
