"""OneDNNBackend through the Backend protocol: every candidate it offers, on real oneDNN.

Operands come from ``make_operands`` in the exact layout a Problem describes
(transposes with padded leading dimensions, batch strides, misaligned pointers);
each output is poisoned before the run and compared with a float64 reference.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from onednn_caps import skip_unless_offered

from unimatmul.backend import Candidate, Target
from unimatmul.core.arrays import CPU, Operands, adapter_for_kind, make_operands
from unimatmul.core.dtypes import tolerance
from unimatmul.core.errors import UnsupportedProblem
from unimatmul.core.problem import Problem
from unimatmul_backends.onednn import OneDNNBackend

pytest.importorskip("torch")  # bf16 operands are torch tensors (NumPy has no bf16)

BACKEND = OneDNNBackend()
if BACKEND.availability() is not None:  # pragma: no cover - depends on the machine
    pytest.skip(f"oneDNN is unavailable: {BACKEND.availability()}", allow_module_level=True)

NUMPY = Target(adapter_for_kind("numpy"), CPU)
TORCH = Target(adapter_for_kind("torch"), CPU)


def _problem(
    m: int,
    n: int,
    k: int,
    dtype: str = "f32",
    *,
    layout: str = "NN",
    pad: int = 0,
    batch: int = 1,
    batch_pad: int = 0,
    beta_zero: bool = True,
    epilogue: str = "none",
    align: int = 16,
) -> Problem:
    trans_a, trans_b = layout[0] == "T", layout[1] == "T"
    lda = (m if trans_a else k) + pad
    ldb = (k if trans_b else n) + pad
    ldc = n + pad
    strides = (0, 0, 0)
    if batch > 1:
        # One matrix spans (columns of its storage) x ld elements; batches must not overlap.
        span_a = (k if trans_a else m) * lda
        span_b = (n if trans_b else k) * ldb
        strides = (span_a + batch_pad, span_b + batch_pad, m * ldc + batch_pad)
    return Problem(
        m=m,
        n=n,
        k=k,
        batch=batch,
        dtype_a=dtype,
        dtype_b=dtype,
        dtype_c=dtype,
        trans_a=trans_a,
        trans_b=trans_b,
        lda=lda,
        ldb=ldb,
        ldc=ldc,
        stride_a=strides[0],
        stride_b=strides[1],
        stride_c=strides[2],
        beta_zero=beta_zero,
        epilogue=epilogue,
        align=align,
    )


def _f64(adapter: Any, x: Any) -> np.ndarray:
    return np.asarray(adapter.to_numpy(x), dtype=np.float64)


def _reference(
    problem: Problem, target: Target, ops: Operands, c: np.ndarray | None, alpha: float, beta: float
) -> np.ndarray:
    adapter = target.adapter
    ref = alpha * np.matmul(_f64(adapter, ops.a), _f64(adapter, ops.b))
    if c is not None:
        ref = ref + beta * c
    if ops.bias is not None:
        ref = ref + _f64(adapter, ops.bias)
    activation = problem.activation
    if activation == "relu":
        ref = np.maximum(ref, 0.0)
    elif activation == "gelu":
        ref = 0.5 * ref * (1.0 + np.vectorize(math.erf)(ref / math.sqrt(2.0)))
    elif activation == "gelu_tanh":
        ref = 0.5 * ref * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (ref + 0.044715 * ref**3)))
    return ref


def check_every_candidate(
    problem: Problem, target: Target, *, alpha: float = 1.0, betas: tuple[float, ...] = (1.0,)
) -> list[str]:
    """Run each candidate on fresh operands; every output must match float64. Returns the names."""
    skip_unless_offered(problem.dtype_a)  # bf16 kernels need AVX-512-BF16 or AMX
    adapter = target.adapter
    candidates = BACKEND.candidates(problem, target)
    assert candidates, f"oneDNN offers nothing for {problem.key}"
    ops = make_operands(problem, adapter, CPU, np.random.default_rng(abs(hash(problem.key)) % 2**32))
    c_start = adapter.to_numpy(ops.out).copy() if not problem.beta_zero else None
    tol = tolerance(problem.dtype_c, problem.compute)
    for candidate in candidates:
        runner = BACKEND.prepare(problem, candidate, target)
        assert runner.candidate == candidate
        for beta in betas if not problem.beta_zero else (0.0,):
            if problem.beta_zero:
                adapter.fill_nan(ops.out)  # poisoned: a kernel that writes nothing fails
                c = None
            else:
                adapter.copy_(ops.out, _like(adapter, c_start))  # C again: the last run overwrote it
                c = _f64(adapter, ops.out)
            runner(ops.a, ops.b, ops.out, alpha, beta, ops.bias)
            got = _f64(adapter, ops.out)
            ref = _reference(problem, target, ops, c, alpha, beta)
            assert np.isfinite(got).all(), f"{candidate.identity}: NaN/inf in the output"
            err = float(np.linalg.norm((got - ref).ravel()) / np.linalg.norm(ref.ravel()))
            assert err <= tol, f"{candidate.identity} on {problem.key} (beta={beta}): error {err:.3g} > {tol}"
        runner.close()
    return [c.name for c in candidates]


def _like(adapter: Any, values: np.ndarray | None) -> Any:
    assert values is not None
    if adapter.kind == "numpy":
        return values
    return adapter.torch.from_numpy(np.ascontiguousarray(values))  # copy_ converts to the dtype


TARGETS = {"numpy-f32": (NUMPY, "f32"), "torch-f32": (TORCH, "f32"), "torch-bf16": (TORCH, "bf16")}
SHAPES = [(1, 1, 1), (7, 13, 5), (17, 19, 23), (64, 48, 32), (1, 64, 128), (128, 1, 64), (193, 97, 131)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("which", list(TARGETS))
def test_every_candidate_is_correct(which: str, shape: tuple[int, int, int]) -> None:
    target, dtype = TARGETS[which]
    names = check_every_candidate(_problem(*shape, dtype), target)
    assert not any(name.startswith("ref:") for name in names)


@pytest.mark.parametrize("layout", ["NN", "TN", "NT", "TT"])
@pytest.mark.parametrize("which", list(TARGETS))
def test_transposes_with_padded_leading_dimensions(which: str, layout: str) -> None:
    target, dtype = TARGETS[which]
    check_every_candidate(_problem(23, 17, 29, dtype, layout=layout), target)
    check_every_candidate(_problem(23, 17, 29, dtype, layout=layout, pad=5), target)


@pytest.mark.parametrize("batch_pad", [0, 7])
@pytest.mark.parametrize("which", list(TARGETS))
def test_batches(which: str, batch_pad: int) -> None:
    target, dtype = TARGETS[which]
    check_every_candidate(_problem(9, 10, 11, dtype, batch=4, batch_pad=batch_pad), target)
    check_every_candidate(
        _problem(9, 10, 11, dtype, batch=3, layout="TT", pad=2, batch_pad=batch_pad), target
    )


@pytest.mark.parametrize(
    "epilogue", ["bias", "bias_relu", "bias_gelu", "bias_gelu_tanh", "relu", "gelu", "gelu_tanh"]
)
@pytest.mark.parametrize("which", list(TARGETS))
def test_bias_and_activations(which: str, epilogue: str) -> None:
    target, dtype = TARGETS[which]
    check_every_candidate(_problem(21, 34, 15, dtype, epilogue=epilogue), target)


@pytest.mark.parametrize("which", list(TARGETS))
def test_alpha_and_beta(which: str) -> None:
    target, dtype = TARGETS[which]
    # One runner meets several betas: oneDNN fixes beta per primitive, so it keeps one each.
    problem = _problem(19, 24, 13, dtype, beta_zero=False)
    check_every_candidate(problem, target, alpha=-0.5, betas=(1.0, 0.25, -2.0, 1.0))
    check_every_candidate(_problem(5, 6, 7, dtype, beta_zero=False, batch=2, layout="NT"), target, alpha=2.0)
    check_every_candidate(_problem(8, 8, 8, dtype), target, alpha=3.0)


@pytest.mark.parametrize(
    ("target", "dtype", "align"), [(NUMPY, "f32", 4), (TORCH, "bf16", 2)], ids=["f32", "bf16"]
)
def test_misaligned_operands_run_in_place(target: Target, dtype: str, align: int) -> None:
    # Every operand starts one element past a 16-byte boundary, as a view would.
    check_every_candidate(_problem(31, 33, 35, dtype, align=align), target)


@pytest.mark.parametrize("which", list(TARGETS))
def test_reference_implementations_on_request(which: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIMATMUL_ONEDNN_REF", "1")
    target, dtype = TARGETS[which]
    for problem in (
        _problem(5, 7, 3, dtype),
        _problem(4, 6, 5, dtype, layout="TT", batch=2, epilogue="bias_gelu"),
        _problem(3, 3, 3, dtype, beta_zero=False),
    ):
        names = check_every_candidate(problem, target, alpha=1.5, betas=(0.5,))
        assert any(name.startswith("ref:") for name in names), names


def test_a_runner_reuses_its_primitive_on_new_memory() -> None:
    problem = _problem(40, 30, 20)
    [candidate, *_] = BACKEND.candidates(problem, NUMPY)
    runner = BACKEND.prepare(problem, candidate, NUMPY)
    rng = np.random.default_rng(3)
    for _ in range(3):
        ops = make_operands(problem, NUMPY.adapter, CPU, rng)
        ops.out[...] = np.nan
        runner(ops.a, ops.b, ops.out)
        np.testing.assert_allclose(ops.out, ops.a.astype(np.float64) @ ops.b, rtol=1e-4, atol=1e-4)
    assert len(runner._prims) == 1


# --- what it declines -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("problem", "target", "match"),
    [
        (Problem.from_shape(8, 8, 8, "f16"), NUMPY, "takes f32 and bf16, not f16"),
        (Problem.from_shape(8, 8, 8, "f64"), NUMPY, "takes f32 and bf16, not f64"),
        (Problem(8, 8, 8, compute="tf32"), TORCH, "compute type tf32"),
        (Problem(8, 8, 8, batch=3, stride_a=64, stride_b=0, stride_c=64), NUMPY, "broadcast batches"),
    ],
    ids=["f16", "f64", "tf32", "broadcast"],
)
def test_unsupported_problems(problem: Problem, target: Target, match: str) -> None:
    with pytest.raises(UnsupportedProblem, match=match):
        BACKEND.candidates(problem, target)
    assert not BACKEND.check(problem, Candidate.make("onednn", "gemm:jit:f32"), target)


def test_unknown_candidates_are_unsupported() -> None:
    problem = _problem(8, 8, 8)
    with pytest.raises(UnsupportedProblem, match=r"does not offer 'brg:no_such_isa' .* it offers \["):
        BACKEND.prepare(problem, Candidate.make("onednn", "brg:no_such_isa"), NUMPY)
    with pytest.raises(UnsupportedProblem, match="is not a oneDNN candidate"):
        BACKEND.prepare(problem, Candidate.make("other", "gemm:jit:f32"), NUMPY)
    assert not BACKEND.check(problem, Candidate.make("onednn", "brg:no_such_isa"), NUMPY)


def test_candidate_identities_are_stable() -> None:
    for target, dtype in TARGETS.values():
        problem = _problem(33, 44, 55, dtype, layout="TN")
        first = BACKEND.candidates(problem, target)
        assert BACKEND.candidates(problem, target) == first
        assert OneDNNBackend().candidates(problem, target) == first  # another instance, same names
        for candidate in first:
            assert candidate.backend == "onednn" and candidate.params == ()
            assert candidate.identity == f"onednn/{candidate.name}"
            assert Candidate.from_identity(candidate.identity) == candidate
            assert BACKEND.check(problem, candidate, target)
        assert len({c.identity for c in first}) == len(first)


def test_versions_and_serving() -> None:
    version = BACKEND.versions()["onednn"]
    assert version.split(".")[0].isdigit() and version.count(".") >= 2
    # The build's CPU runtime: 3.2's wheel threads with OpenMP, 3.13's runs through SYCL.
    assert BACKEND.versions()["onednn-runtime"] in {"omp", "tbb", "seq", "threadpool", "sycl"}
    assert BACKEND.serves(NUMPY) and BACKEND.serves(TORCH)
    assert not BACKEND.serves(Target(adapter_for_kind("numpy"), CPU.__class__("cuda", 0)))


def test_a_missing_library_makes_it_unavailable_not_broken(tmp_path: Any) -> None:
    # An explicit library path that does not exist: oneDNN is unavailable, matmul still works.
    child = (
        "import numpy as np, unimatmul\n"
        "from unimatmul.core.plugins import get_plugin_manager\n"
        "print(get_plugin_manager().backends()['onednn'].availability())\n"
        "a = np.ones((4, 3), np.float32); b = np.ones((3, 2), np.float32)\n"
        "with unimatmul.mode('tune'):\n"
        "    print(unimatmul.matmul(a, b).sum())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    env.update(
        UNIMATMUL_DNNL_LIB=str(tmp_path / "libdnnl.so.404"), UNIMATMUL_CACHE=str(tmp_path / "c.msgpack")
    )
    done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    reason, total = done.stdout.splitlines()
    assert "UNIMATMUL_DNNL_LIB" in reason and "libdnnl.so.404" in reason
    assert float(total) == 24.0


def test_an_avx2_cpu_offers_f32_kernels_and_no_bf16(tmp_path: Any) -> None:
    # oneDNN has no bf16 matmul below AVX-512 BF16 (or AVX2-VNNI-2): on such a CPU the
    # backend must offer nothing for bf16 (Default runs it) and still serve f32.
    # ONEDNN_MAX_CPU_ISA makes this CPU one; oneDNN reads it once, so in a child process.
    child = (
        "import numpy as np, torch, unimatmul\n"
        "from unimatmul.backend import Device, Problem, Target, adapter_for_kind\n"
        "CPU = Device('cpu')\n"
        "from unimatmul_backends.onednn import OneDNNBackend\n"
        "backend = OneDNNBackend()\n"
        "torch_cpu = Target(adapter_for_kind('torch'), CPU)\n"
        "bf16 = Problem.from_shape(64, 48, 32, 'bf16')\n"
        "assert backend.candidates(bf16, torch_cpu) == [], backend.candidates(bf16, torch_cpu)\n"
        "f32 = backend.candidates(Problem.from_shape(64, 48, 32), Target(adapter_for_kind('numpy'), CPU))\n"
        "assert f32 and not any('avx512' in c.name for c in f32), f32\n"
        "g = torch.Generator().manual_seed(0)\n"
        "a = torch.randn(64, 32, generator=g).bfloat16(); b = torch.randn(32, 48, generator=g).bfloat16()\n"
        "x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)\n"
        "with unimatmul.mode('tune'):\n"
        "    y = unimatmul.matmul(a, b)\n"
        "    z = unimatmul.matmul(x, x.T)\n"
        "ref = a.double() @ b.double()\n"
        "assert float((y.double() - ref).norm() / ref.norm()) < 1e-2\n"
        "np.testing.assert_allclose(z, x.astype(np.float64) @ x.T, rtol=1e-4, atol=1e-4)\n"
        "print(' '.join(c.name for c in f32))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    env.update(ONEDNN_MAX_CPU_ISA="AVX2", UNIMATMUL_CACHE=str(tmp_path / "c.msgpack"))
    if "UNIMATMUL_DNNL_LIB" in os.environ:  # the library under test, whichever it is
        env["UNIMATMUL_DNNL_LIB"] = os.environ["UNIMATMUL_DNNL_LIB"]
    done = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "gemm:jit:f32" in done.stdout.split(), done.stdout
