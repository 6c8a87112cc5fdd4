"""Tests of the Triton plugin: its kernels against float64, its model, plans and registration.

Without a GPU every kernel runs in Triton's interpreter on CPU tensors (conftest.py
sets UNIMATMUL_TRITON_INTERPRET=1), so the kernel code itself is executed; with a GPU
the same tests run the compiled kernels, and the ``gpu`` tests add graph capture,
concurrent streams and the native launch description.

Run after ``pip install -e plugins/unimatmul-triton`` (the entry point must be installed).
"""

from __future__ import annotations

import inspect
import json
import math
import os
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest

triton = pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from unimatmul_triton import TritonBackend, TritonInterpreterBackend, make_backend  # noqa: E402
from unimatmul_triton.configs import (  # noqa: E402
    GEMV,
    PERSISTENT,
    ROWS,
    SKINNY,
    TILE,
    UNALIGNED_CANDIDATES,
    KernelConfig,
    config_of,
    ranked_configs,
    space,
    vector_loads,
)
from unimatmul_triton.launch import plan_for  # noqa: E402

from unimatmul import Candidate, Problem, UnsupportedProblem  # noqa: E402
from unimatmul.backend import Device, Target, adapter_for_kind, make_operands, tolerance  # noqa: E402  # noqa: E402
from unimatmul.core.dtypes import scaled_tolerance  # noqa: E402
from unimatmul.core.plugins import PluginManager  # noqa: E402
from unimatmul.core.scales import make_scaled_operands, scaled_problem, scaled_reference  # noqa: E402

CPU = Device("cpu")

INTERPRET = os.environ.get("UNIMATMUL_TRITON_INTERPRET") == "1"
GPU = not INTERPRET
DEVICE = CPU if INTERPRET else Device("cuda", 0)
ADAPTER = adapter_for_kind("torch")
TARGET = Target(ADAPTER, DEVICE)
gpu = pytest.mark.skipif(not GPU, reason="needs a GPU (the interpreter runs the other tests)")


@pytest.fixture(scope="module")
def backend() -> TritonBackend:
    found = make_backend()
    reason = found.availability()
    if reason is not None:
        pytest.skip(f"triton backend unavailable: {reason}")
    return found


def problem_of(
    m: int,
    n: int,
    k: int,
    dtype: str = "bf16",
    *,
    linear: bool = False,
    trans_a: bool = False,
    batch: int = 1,
    broadcast_a: bool = False,
    epilogue: str = "none",
    beta_zero: bool = True,
    dtype_c: str | None = None,
    pad: int = 0,
    align: int = 16,
) -> Problem:
    """A problem; ``linear``: B is an nn.Linear weight [n, k] seen transposed (ldb = k)."""
    lda = (m if trans_a else k) + pad
    ldb = (k if linear else n) + pad
    ldc = n + pad
    strides = (0, 0, 0)
    if batch > 1:
        strides = (
            0 if broadcast_a else (k if trans_a else m) * lda + 3,
            (n if linear else k) * ldb + 5,
            m * ldc + 7,
        )
    return Problem(
        m=m,
        n=n,
        k=k,
        dtype_a=dtype,
        dtype_b=dtype,
        dtype_c=dtype_c or dtype,
        compute="f32",
        trans_a=trans_a,
        trans_b=linear,
        lda=lda,
        ldb=ldb,
        ldc=ldc,
        batch=batch,
        stride_a=strides[0],
        stride_b=strides[1],
        stride_c=strides[2],
        beta_zero=beta_zero,
        epilogue=epilogue,
        align=align,
    )


def check_runner(
    runner: object, problem: Problem, alpha: float = 1.0, beta: float = 0.0, seed: int = 1
) -> float:
    """Run once on a poisoned output (C when beta != 0); return the relative error vs float64."""
    ops = make_operands(problem, ADAPTER, DEVICE, np.random.default_rng(seed))
    c = ops.out.clone()
    if beta == 0.0:
        ops.out.fill_(float("nan"))
    runner(ops.a, ops.b, ops.out, alpha, beta, ops.bias)  # type: ignore[operator]
    ADAPTER.synchronize(DEVICE)
    ref = ADAPTER.reference(ops.a, ops.b, c, alpha, beta, ops.bias, problem.activation)
    return ADAPTER.rel_error(ops.out, ref)


def forced_configs(problem: Problem) -> list[KernelConfig]:
    """One small config of each family that applies, with and without split-K."""
    found = []
    if problem.m <= 8:
        bm = 1 << max(0, (problem.m - 1).bit_length())
        found += [KernelConfig(GEMV, bm, 16, 128, 4, 1, split) for split in (1, 3)]
    if problem.m == 1 and problem.trans_b:
        found += [KernelConfig(ROWS, 1, bn, bk, 4, 1, split) for bn, bk, split in ((8, 256, 1), (4, 512, 3))]
    if problem.m <= 16:
        found += [KernelConfig(SKINNY, 16, 32, 64, 4, 3, split) for split in (1, 4)]
    found += [KernelConfig(TILE, 32, 32, 32, 4, 3, split, group_m=2) for split in (1, 3)]
    found.append(KernelConfig(PERSISTENT, 32, 32, 32, 4, 3, 1, group_m=2))
    return found


CASES = [
    # decode: nn.Linear weights, m = 1..16, with and without a bias epilogue
    ("linear-m1", problem_of(1, 80, 272, linear=True), 1.0, 0.0),
    (
        "linear-m1-bias-relu-alpha-beta",
        problem_of(1, 37, 1100, linear=True, epilogue="bias_relu", beta_zero=False),
        0.5,
        1.5,
    ),
    ("batch-linear-m1-f16", problem_of(1, 24, 512, "f16", linear=True, batch=3), 1.0, 0.0),
    ("linear-m3-bias-gelu", problem_of(3, 72, 160, linear=True, epilogue="bias_gelu"), 1.0, 0.0),
    ("linear-m16-f16", problem_of(16, 40, 96, "f16", linear=True, epilogue="bias"), 1.0, 0.0),
    ("plain-m5", problem_of(5, 48, 100), 1.0, 0.0),
    # tiles, layouts, scalars, epilogues
    ("tile-alpha-beta", problem_of(37, 45, 70, beta_zero=False), 1.5, -0.5),
    ("tile-trans-a-pad-relu", problem_of(33, 29, 41, trans_a=True, pad=3, epilogue="relu"), 1.0, 0.0),
    (
        "tile-bias-gelu-tanh-f32-out",
        problem_of(40, 36, 50, epilogue="bias_gelu_tanh", dtype_c="f32"),
        -1.0,
        0.0,
    ),
    ("tile-linear-misaligned", problem_of(19, 33, 35, linear=True, align=2), 1.0, 0.0),
    ("batch-broadcast-a", problem_of(9, 24, 40, batch=3, broadcast_a=True, epilogue="bias_relu"), 1.0, 0.0),
    ("batch-linear-m2", problem_of(2, 40, 64, linear=True, batch=2, beta_zero=False), 0.5, 2.0),
]


@pytest.mark.parametrize(("label", "problem", "alpha", "beta"), CASES, ids=[c[0] for c in CASES])
def test_every_family_computes_the_product(
    backend: TritonBackend, label: str, problem: Problem, alpha: float, beta: float
) -> None:
    tol = tolerance(problem.dtype_c, problem.compute)
    offered = backend.candidates(problem, TARGET)
    assert offered, f"{label}: nothing offered"
    candidates = list(dict.fromkeys([*offered, *(c.candidate for c in forced_configs(problem))]))
    for candidate in candidates:
        assert backend.check(problem, candidate, TARGET), candidate.identity
        runner = backend.prepare(problem, candidate, TARGET)
        assert runner.candidate == candidate
        # Twice: split-K leaves its workspace zeroed for the next call, or this fails.
        for call in range(2):
            error = check_runner(runner, problem, alpha, beta, seed=call)
            assert error <= tol, (
                f"{label}: {candidate.identity} call {call}: relative error {error:.3g} > {tol}"
            )


def test_beta_zero_in_a_c_kernel_never_reads_c(backend: TritonBackend) -> None:
    # A problem compiled for beta != 0 called with beta == 0: C is NaN and must not leak in.
    problem = problem_of(4, 32, 64, linear=True, beta_zero=False)
    for config in forced_configs(problem)[:2]:
        runner = backend.prepare(problem, config.candidate, TARGET)
        assert check_runner(runner, problem, 1.0, 0.0) <= tolerance("bf16", "f32")


def test_what_it_cannot_run_is_refused(backend: TritonBackend) -> None:
    for problem in (
        Problem.from_shape(8, 8, 8, "f32"),
        Problem(8, 8, 8, dtype_a="bf16", dtype_b="f16", dtype_c="bf16"),
        Problem(8, 8, 8, dtype_a="bf16", dtype_b="bf16", dtype_c="f16"),
        Problem(8, 8, 8, dtype_a="f8e4m3", dtype_b="f8e4m3", dtype_c="bf16"),
    ):
        with pytest.raises(UnsupportedProblem, match="triton"):
            backend.candidates(problem, TARGET)
    problem = problem_of(4, 32, 64)
    with pytest.raises(UnsupportedProblem, match="no kernel"):
        backend.prepare(problem, Candidate.make("triton", "tile", block_m=3), TARGET)
    # A decode kernel on a problem with too many rows for it.
    gemv = KernelConfig(GEMV, 4, 16, 128, 4, 1).candidate
    assert not backend.check(problem_of(64, 32, 64), gemv, TARGET)
    with pytest.raises(UnsupportedProblem):
        backend.prepare(problem_of(64, 32, 64), gemv, TARGET)


def test_unimatmul_finds_the_plugin_through_its_entry_point() -> None:
    from importlib.metadata import entry_points

    if "triton" not in {e.name for e in entry_points(group="unimatmul")}:
        pytest.skip("the plugin is not installed (pip install -e plugins/unimatmul-triton)")
    plugins = PluginManager()
    assert "triton" in plugins.report.loaded
    found = plugins.backends()["triton"]
    assert isinstance(found, TritonInterpreterBackend if INTERPRET else TritonBackend)


# --- the model and the plans (pure Python) --------------------------------------------


def test_a_problem_is_ranked_once_and_each_caller_gets_its_own_list() -> None:
    """``unimatmul tune`` ranks a problem twice (ahead, then measured): the second is the
    first's ranking, and a caller's list is its own, cut to its limit."""
    problem = problem_of(64, 4096, 4096)
    whole = ranked_configs(problem)
    short = ranked_configs(problem, limit=3)
    assert short == whole[:3] and short[0] is whole[0]  # the same estimates, not a new ranking
    short.clear()
    assert ranked_configs(problem, limit=3) == whole[:3]


@pytest.mark.parametrize(
    "problem",
    [
        problem_of(1, 4096, 4096, linear=True),
        problem_of(16, 14336, 4096, linear=True),
        problem_of(4, 128256, 4096, linear=True),
        problem_of(2048, 2048, 1024),
        problem_of(4099, 1031, 257, "f16"),
        problem_of(1, 1, 1),
    ],
    ids=lambda p: p.shape_text,
)
def test_the_model_offers_a_short_list_with_every_family_leading(problem: Problem) -> None:
    started = time.perf_counter()
    ranked = ranked_configs(problem, limit=8)
    assert time.perf_counter() - started < 0.5  # pure arithmetic: no compile, no GPU
    assert 1 <= len(ranked) <= 8
    identities = [e.config.candidate.identity for e in ranked]
    assert len(set(identities)) == len(identities)
    families = {e.config.kernel for e in ranked}
    expected = {GEMV, SKINNY} if problem.m <= 8 else {SKINNY} if problem.m <= 16 else {TILE, PERSISTENT}
    assert expected <= families, identities
    for est in ranked:
        assert math.isfinite(est.seconds) and est.seconds > 0
        # Every identity names its config back, and the config fits the device.
        assert config_of(problem, est.config.candidate) == est.config
    # The model's time for a memory-bound decode product is near what the bytes allow.
    if problem.m <= 16 and problem.n * problem.k > 1 << 22:
        floor = problem.min_bytes / 4.3e12
        assert floor < ranked[0].seconds < 2.5 * floor + 5e-6


@pytest.mark.parametrize(
    ("problem", "vector"),
    [
        (problem_of(16, 4096, 4096, linear=True), True),
        (problem_of(2048, 2048, 512), True),
        # GPT-2's vocabulary: C's row stride (50257) is not read in the K loop.
        (problem_of(4, 50257, 768, linear=True), True),
        (problem_of(1, 40, 1000, linear=True), False),  # ldb = 1000 between the weight's rows
        (problem_of(1, 1024, 1000), True),  # one row of A: its stride (1000) is never stepped
        (problem_of(1000, 1000, 1000), False),
        (problem_of(1024, 1025, 1024), False),  # ldb = 1025
        (problem_of(64, 64, 64, align=8), False),
        (problem_of(32, 32, 32, batch=2), False),  # batch strides with +3 / +5
    ],
    ids=lambda x: x.shape_text + f"-al{x.align}-b{x.batch}" if isinstance(x, Problem) else str(x),
)
def test_unvectorised_loads_are_offered_the_two_best_configs(
    backend: TritonBackend, problem: Problem, vector: bool
) -> None:
    # On the H200 every tile config of 1000^3 ran ~20x slower than cuBLASLt's
    # best, of 1024 x 1025 x 1024 ~2x slower than the padded one: Triton's loads cannot be
    # vectorised there. The model's two best are still measured.
    assert vector_loads(problem) is vector
    offered = backend.candidates(problem, TARGET)
    count = backend.candidate_count if vector else min(backend.candidate_count, UNALIGNED_CANDIDATES)
    assert [c.identity for c in offered] == [
        e.config.candidate.identity for e in ranked_configs(problem, limit=count)
    ]


def test_plans_match_the_kernels_signatures() -> None:
    from unimatmul_triton.kernels import KERNELS

    for problem in (problem_of(3, 40, 64, linear=True, epilogue="bias"), problem_of(40, 40, 64, batch=2)):
        for config in space(problem)[:: max(1, len(space(problem)) // 20)]:
            plan = plan_for(problem, config)
            kernel = KERNELS[plan.kernel]
            fn = getattr(kernel, "fn", kernel)
            assert [p.name for p in plan.params] == list(inspect.signature(fn).parameters), config
            roles = [p.role for p in plan.params if p.role]
            assert roles[:3] == ["a", "b", "out"] and roles[-2:] == ["alpha", "beta"]


def test_compiles_for_hopper_without_a_gpu() -> None:
    """The compiler itself (not the interpreter) accepts plans: sm_90 code, no scratch buffers.

    In a fresh process without TRITON_INTERPRET (this one may run the interpreter), for
    Hopper, whatever GPU is here (none is needed: Triton ships ptxas).
    """
    script = """
import json, sys
from triton.backends.compiler import GPUTarget
from unimatmul import Problem
from unimatmul_triton.compiler import compile_plan
from unimatmul_triton.configs import GEMV, PERSISTENT, ROWS, SKINNY, TILE, KernelConfig
from unimatmul_triton.launch import plan_for
p = Problem(m=2, n=64, k=256, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16", trans_b=True, ldb=256,
            epilogue="bias_gelu_tanh", beta_zero=False)
q = Problem(m=40, n=48, k=96, dtype_a="f16", dtype_b="f16", dtype_c="f32", trans_a=True, lda=40, align=2)
out = []
r = Problem(m=1, n=64, k=4096, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16", trans_b=True, ldb=4096)
for problem, config in ((p, KernelConfig(GEMV, 2, 16, 128, 4, 1, split_k=2)), (p, KernelConfig(SKINNY, 16, 32, 64, 4, 3)),
                        (r, KernelConfig(ROWS, 1, 2, 4096, 8, 1)),
                        (q, KernelConfig(TILE, 64, 64, 32, 4, 3, split_k=2, group_m=8)),
                        (q, KernelConfig(PERSISTENT, 64, 64, 32, 4, 3, group_m=8))):
    plan = plan_for(problem, config)
    ck = compile_plan(plan, GPUTarget("cuda", 90, 32))
    out.append([ck.metadata.global_scratch_size, ck.src.signature == plan.signature(), ck.metadata.shared])
print(json.dumps(out))
"""
    results = compiled_in_a_fresh_process(script)
    assert len(results) == 5
    for scratch, same_signature, shared in results:
        assert scratch == 0 and same_signature and shared < 227 * 1024


# --- scaled (fp8) products ---------------------------------------------------------------

# (label, problem): every scale mode, both OCP fp8 dtypes, a bias, fast accumulation, and m
# of 1 (rows kernel), a few rows (GEMV, skinny) and more than a tile's (tile kernel); K and
# N over partial 128-blocks where the scales are block-wise.
SCALED_CASES = [
    ("block-m1", scaled_problem(1, 256, 384, scales="block")),
    ("block-m5-bias", scaled_problem(5, 160, 320, scales="block", bias=True)),
    ("block-m33-e5m2", scaled_problem(33, 144, 272, scales="block", dtype_a="f8e5m2")),
    ("block-m20-fast-f32", scaled_problem(20, 128, 256, scales="block", dtype_c="f32", fast_accum=True)),
    ("rowwise-m1-bias", scaled_problem(1, 96, 256, scales="rowwise", bias=True)),
    ("rowwise-m4-e5m2-f16", scaled_problem(4, 64, 128, scales="rowwise", dtype_a="f8e5m2", dtype_c="f16")),
    ("rowwise-m40", scaled_problem(40, 48, 96, scales="rowwise")),
    ("tensor-m3-fast", scaled_problem(3, 64, 192, fast_accum=True)),
    ("tensor-m33-bias", scaled_problem(33, 48, 64, bias=True)),
]


def check_scaled_runner(runner: Any, problem: Problem, seed: int = 0) -> float:
    """Relative error of one scaled call against the float64 product of the dequantised inputs."""
    ops = make_scaled_operands(problem, ADAPTER, DEVICE, np.random.default_rng(seed))
    ops.out.fill_(float("nan"))
    runner(ops.a, ops.b, ops.out, 1.0, 0.0, ops.bias, ops.scale_a, ops.scale_b)
    ref = scaled_reference(ADAPTER, ops.a, ops.b, ops.scale_a, ops.scale_b, ops.bias)
    assert float(ref.abs().max()) > 0
    return float((ops.out.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize(("label", "problem"), SCALED_CASES, ids=[c[0] for c in SCALED_CASES])
def test_every_scaled_family_computes_the_dequantised_product(
    backend: TritonBackend, label: str, problem: Problem
) -> None:
    tol = scaled_tolerance(problem.dtype_c, problem.fast_accum)
    offered = backend.candidates(problem, TARGET)
    assert offered, f"{label}: nothing offered"
    # The best of every family (and split style) the space has for it, offered or not.
    leaders: dict[tuple[str, bool], Candidate] = {}
    for est in ranked_configs(problem):
        leaders.setdefault((est.config.kernel, est.config.split_k > 1), est.config.candidate)
    for candidate in dict.fromkeys([*offered, *leaders.values()]):
        assert backend.check(problem, candidate, TARGET), candidate.identity
        runner = backend.prepare(problem, candidate, TARGET)
        for call in range(2):  # split-K leaves its workspace zeroed for the next call
            error = check_scaled_runner(runner, problem, seed=call)
            assert error <= tol, (
                f"{label}: {candidate.identity} call {call}: relative error {error:.3g} > {tol}"
            )


def test_a_kernel_that_applied_one_block_scale_to_all_would_fail_the_check(backend: TritonBackend) -> None:
    """The check above can see a wrong block scale: one value of each scale for the whole
    product (what a kernel reading only the first block would compute) is far off."""
    problem = scaled_problem(5, 256, 384, scales="block")
    ops = make_scaled_operands(problem, ADAPTER, DEVICE, np.random.default_rng(0))
    ref = scaled_reference(ADAPTER, ops.a, ops.b, ops.scale_a, ops.scale_b, None)
    first = scaled_reference(ADAPTER, ops.a, ops.b, ops.scale_a[:, :1], ops.scale_b[:1, :1], None)
    assert float((first - ref).norm() / ref.norm()) > 10 * scaled_tolerance("bf16")


def test_scaled_configs_apply_their_scales() -> None:
    block = scaled_problem(1, 4096, 7168, scales="block")
    kernels = {c.kernel for c in space(block)}
    assert kernels == {ROWS, SKINNY}  # no GEMV (one sum over K) and no persistent kernel
    for config in space(block) + space(scaled_problem(256, 4096, 7168, scales="block")):
        if config.kernel == ROWS:
            assert config.block_k % 128 == 0
        else:
            assert 128 % config.block_k == 0, config  # each K step inside one block
    assert GEMV in {c.kernel for c in space(scaled_problem(4, 4096, 4096, scales="rowwise"))}
    assert PERSISTENT not in {c.kernel for c in space(scaled_problem(512, 4096, 4096))}
    # A stored identity that cannot apply block scales is refused, not run.
    gemv = KernelConfig(GEMV, 1, 16, 256, 4, 1).candidate
    assert config_of(scaled_problem(1, 4096, 4096, scales="rowwise"), gemv) is not None
    assert config_of(block, gemv) is None
    wide = KernelConfig(SKINNY, 16, 64, 256, 4, 3).candidate
    assert config_of(block, wide) is None


def test_scaled_plans_pass_the_scales_after_beta() -> None:
    from unimatmul_triton.kernels import KERNELS

    for problem in (
        scaled_problem(1, 256, 384, scales="block"),
        scaled_problem(40, 48, 96, scales="rowwise"),
    ):
        for config in space(problem):
            plan = plan_for(problem, config)
            fn = getattr(KERNELS[plan.kernel], "fn", KERNELS[plan.kernel])
            assert [p.name for p in plan.params] == list(inspect.signature(fn).parameters), config
            roles = [p.role for p in plan.params if p.role]
            assert roles[:3] == ["a", "b", "out"] and roles[-4:] == ["alpha", "beta", "scale_a", "scale_b"]
            consts = plan.constexprs()
            assert (consts["SCALE_A"], consts["FAST_ACCUM"]) == (3 if problem.is_block_scaled else 2, False)
    block = plan_for(scaled_problem(5, 256, 384, scales="block"), KernelConfig(SKINNY, 16, 64, 128, 4, 3))
    strides = {p.name: p.value for p in block.params if p.name.startswith("stride_s")}
    assert strides == {"stride_sam": 1, "stride_sak": 5, "stride_sbk": 1, "stride_sbn": 3}
    # A plain plan compiles the scales out.
    plain = plan_for(problem_of(3, 40, 64, linear=True), KernelConfig(SKINNY, 16, 32, 64, 4, 3))
    assert {p.name: p.kind for p in plain.params if p.name in ("sa_ptr", "sb_ptr")} == {
        "sa_ptr": "constexpr",
        "sb_ptr": "constexpr",
    }


def test_fp8_kernels_compile_for_hopper_and_mi300_without_a_gpu() -> None:
    """The compiler (not the interpreter) takes the scaled plans: fp8 dots on sm_90, the
    rows kernel's block groups, and ROCm's fnuz dtype on gfx942."""
    script = """
import json
from triton.backends.compiler import GPUTarget
from unimatmul.core.scales import scaled_problem
from unimatmul_triton.compiler import compile_plan
from unimatmul_triton.configs import ROWS, SKINNY, TILE, KernelConfig
from unimatmul_triton.launch import plan_for
cases = [
    (scaled_problem(1, 4096, 4096, scales="block"), KernelConfig(ROWS, 1, 2, 4096, 8, 1), ("cuda", 90, 32)),
    (scaled_problem(16, 4096, 4096, scales="block"), KernelConfig(SKINNY, 16, 64, 128, 4, 4, split_k=4), ("cuda", 90, 32)),
    (scaled_problem(256, 4096, 4096, scales="rowwise", bias=True, fast_accum=True),
     KernelConfig(TILE, 128, 128, 128, 8, 3, group_m=8), ("cuda", 90, 32)),
    (scaled_problem(16, 4096, 4096, scales="block", dtype_a="f8e4m3fnuz"), KernelConfig(SKINNY, 16, 64, 128, 4, 2),
     ("hip", "gfx942", 64)),
]
out = []
for problem, config, target in cases:
    plan = plan_for(problem, config)
    ck = compile_plan(plan, GPUTarget(*target))
    scratch = getattr(ck.metadata, "global_scratch_size", 0)  # CUDA's metadata only
    out.append([scratch, ck.src.signature == plan.signature(), ck.metadata.shared])
print(json.dumps(out))
"""
    results = compiled_in_a_fresh_process(script)
    assert len(results) == 4
    for scratch, same_signature, shared in results:
        assert scratch == 0 and same_signature and shared < 227 * 1024


def compiled_in_a_fresh_process(script: str) -> list[Any]:
    """The JSON the compile ``script`` prints last, run without the interpreter's variables;
    a skip where this machine has no GPU assembler (ptxas, ld.lld) for the target."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "UNIMATMUL_TRITON_INTERPRET")}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    if proc.returncode != 0 and ("ptxas" in proc.stderr or "ld.lld" in proc.stderr):
        pytest.skip(f"no GPU assembler here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.skipif(not INTERPRET, reason="the CPU's tune mode (a GPU has the GPU tests)")
def test_real_tune_mode_measures_and_checks_the_triton_fp8_candidates(tmp_path: Any) -> None:
    """``scaled_matmul`` in tune mode with the interpreter backend registered: every Triton
    candidate is measured by the harness and checked against the float64 reference."""
    import unimatmul
    from unimatmul.cache.record import OK, PRUNED
    from unimatmul.testing import isolated_selector, registered

    reason = fp8_default_missing()
    if reason:
        pytest.skip(reason)
    problem = scaled_problem(4, 64, 128, scales="rowwise")
    ops = make_scaled_operands(problem, ADAPTER, DEVICE, np.random.default_rng(0))
    with isolated_selector(tmp_path / "cache.msgpack") as selector:
        with registered(selector.plugins, make_backend(), name="triton-under-test"), unimatmul.mode("tune"):
            out = unimatmul.scaled_matmul(ops.a, ops.b, ops.scale_a, ops.scale_b, out_dtype=torch.bfloat16)
        (record,) = [r for _, _, r in selector.store.items(None)]
    ref = scaled_reference(ADAPTER, ops.a, ops.b, ops.scale_a, ops.scale_b, None)
    assert float((out.double() - ref).norm() / ref.norm()) <= scaled_tolerance("bf16")
    assert Problem.from_key(record.problem).scale_a == "rowwise"
    triton_results = [r for r in record.results if r.identity.startswith("triton/")]
    assert triton_results, [r.identity for r in record.results]
    for result in triton_results:
        assert result.status in (OK, PRUNED), result
        assert result.error is not None and result.error <= scaled_tolerance("bf16"), result


def fp8_default_missing() -> str:
    """Why torch's own CPU fp8 product (the Default of tune mode) cannot run here, or ""."""
    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(a, a.t(), torch.ones(16, 1), torch.ones(1, 16), out_dtype=torch.bfloat16)
    except RuntimeError as exc:
        return f"torch's own CPU _scaled_mm cannot run here: {str(exc).splitlines()[0][:100]}"
    return ""


# --- the conformance suite -------------------------------------------------------------


def test_the_plugin_passes_the_conformance_suite() -> None:
    from unimatmul_conformance import run_suite

    started = time.perf_counter()
    # By name where the entry point is installed, else by module:attribute (a source checkout).
    from importlib.metadata import entry_points

    installed = "triton" in {e.name for e in entry_points(group="unimatmul")}
    report = run_suite("triton" if installed else "unimatmul_triton:make_backend", quick=True)
    assert report.ok, report.summary()
    assert report.by_check()["result"]["passed"] >= 30
    print(f"conformance quick: {time.perf_counter() - started:.1f} s")


# --- GPU only --------------------------------------------------------------------------


@gpu
def test_a_split_k_runner_is_safe_on_concurrent_streams(backend: TritonBackend) -> None:
    # The past bug: one shared split-K workspace corrupted results when 4 threads called
    # one runner on 4 streams. Each stream has its own workspace here.
    problem = problem_of(8, 4096, 4096, linear=True)
    runner = backend.prepare(problem, KernelConfig(SKINNY, 16, 64, 128, 4, 3, split_k=8).candidate, TARGET)
    errors: list[str] = []

    def work(seed: int) -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            ops = make_operands(problem, ADAPTER, DEVICE, np.random.default_rng(seed))
            ref = ADAPTER.reference(ops.a, ops.b, ops.out, 1.0, 0.0, None, None)
            for call in range(20):
                ops.out.fill_(float("nan"))
                runner(ops.a, ops.b, ops.out)
                if call % 5 == 4:
                    stream.synchronize()
                    error = ADAPTER.rel_error(ops.out, ref)
                    if not error <= 3e-2:
                        errors.append(f"thread {seed} call {call}: {error:.3g}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@gpu
def test_a_call_is_captured_in_a_cuda_graph(backend: TritonBackend) -> None:
    problem = problem_of(4, 1024, 2048, linear=True, epilogue="bias_relu")
    for candidate in backend.candidates(problem, TARGET)[:3]:
        runner = backend.prepare(problem, candidate, TARGET)
        first = make_operands(problem, ADAPTER, DEVICE, np.random.default_rng(1))
        second = make_operands(problem, ADAPTER, DEVICE, np.random.default_rng(2))
        runner(first.a, first.b, first.out, 1.0, 0.0, first.bias)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            runner(first.a, first.b, first.out, 1.0, 0.0, first.bias)
        for dst, src in ((first.a, second.a), (first.b, second.b), (first.bias, second.bias)):
            dst.copy_(src)
        first.out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = ADAPTER.reference(second.a, second.b, second.out, 1.0, 0.0, second.bias, "relu")
        assert ADAPTER.rel_error(first.out, ref) <= 3e-2, candidate.identity


@gpu
def test_launch_info_describes_the_launch(backend: TritonBackend) -> None:
    problem = problem_of(4, 512, 1024, linear=True, epilogue="bias")
    runner = backend.prepare(problem, KernelConfig(SKINNY, 16, 64, 128, 4, 3, split_k=4).candidate, TARGET)
    info = runner.launch_info()
    assert info["function"] > 0 and info["block"][0] == 32 * 4
    assert info["grid"] == (512 // 64, 4, 1)
    params = info["params"]
    roles = [p["role"] for p in params]
    assert roles[:6] == ["a", "b", "out", "bias", "workspace", "counters"]
    assert roles[-2:] == ["hidden", "hidden"] and params[-2]["name"] == "global_scratch"
    assert "alpha" in roles and "beta" in roles
    # Constants are exactly the non-1 ints of the plan: 1s are compiled in (K=1024, N=512...).
    constants = {p["name"]: p["value"] for p in params if p["role"] == "constant"}
    assert constants["N"] == 512 and constants["K"] == 1024 and "stride_bk" not in constants
    # The workspace slots point at this stream's (zeroed) buffers.
    assert params[4]["value"] != 0 and params[5]["value"] != 0


# --- the native launch: NativeCall "launch" ---------------------------------------------------


def _info(**changes: object) -> dict[str, object]:
    """A launch_info dict as CompiledRunner gives it (a split-K skinny kernel with bias)."""
    params = [
        {"name": "a_ptr", "type": "CUdeviceptr", "size": 8, "role": "a"},
        {"name": "b_ptr", "type": "CUdeviceptr", "size": 8, "role": "b"},
        {"name": "c_ptr", "type": "CUdeviceptr", "size": 8, "role": "out"},
        {"name": "bias_ptr", "type": "CUdeviceptr", "size": 8, "role": "bias"},
        {"name": "ws_ptr", "type": "CUdeviceptr", "size": 8, "role": "workspace", "value": 0x7000},
        {"name": "cnt_ptr", "type": "CUdeviceptr", "size": 8, "role": "counters", "value": 0x8000},
        {"name": "M", "type": "int32_t", "size": 4, "role": "constant", "value": 4},
        {"name": "K", "type": "int64_t", "size": 8, "role": "constant", "value": 2**33},
        {"name": "alpha", "type": "float", "size": 4, "role": "alpha"},
        {"name": "beta", "type": "float", "size": 4, "role": "beta"},
        {
            "name": "global_scratch",
            "type": "CUdeviceptr",
            "size": 8,
            "role": "hidden",
            "value": 0,
            "bytes_needed": 0,
        },
        {
            "name": "profile_scratch",
            "type": "CUdeviceptr",
            "size": 8,
            "role": "hidden",
            "value": 0,
            "bytes_needed": 0,
        },
    ]
    info: dict[str, object] = {
        "function": 0x1234,
        "grid": (8, 4, 1),
        "block": (128, 1, 1),
        "shared_mem_bytes": 49152,
        "cluster_dims": (1, 1, 1),
        "cooperative": False,
        "pdl": False,
        "stream": 0x99,
        "params": params,
    }
    info.update(changes)
    return info


def test_launch_words_lay_out_the_parameters_by_role() -> None:
    from unimatmul_triton.runner import launch_words

    words = launch_words(_info(), (11, 12, 13))
    assert words is not None
    assert words[:12] == [11, 12, 13, 0x1234, 8, 4, 1, 128, 49152, 0x99, 1, 12]
    triples = [tuple(words[12 + 3 * i : 15 + 3 * i]) for i in range(12)]
    assert triples == [
        (1, 8, 0),  # a, b, out, bias: written per call
        (2, 8, 0),
        (3, 8, 0),
        (4, 8, 0),
        (0, 8, 0x7000),  # the stream's workspace and counters: constants of the entry
        (0, 8, 0x8000),
        (0, 4, 4),
        (0, 8, 2**33),
        (5, 4, 0),  # alpha, beta: per call
        (6, 4, 0),
        (0, 8, 0),  # the two hidden scratch pointers: NULL
        (0, 8, 0),
    ]
    # Without split-K slots the kernel is not bound to a stream.
    unsplit = [p for p in _info()["params"] if p["role"] not in ("workspace", "counters")]  # type: ignore[attr-defined]
    words = launch_words(_info(params=unsplit), (11, 12, 13))
    assert words is not None and words[10] == 0 and words[11] == 10


def test_launch_words_carry_a_scaled_kernel_s_scale_pointers() -> None:
    """A scaled (fp8) kernel's scale_a and scale_b pointers follow beta (launch._scale_params)
    and are per-call parameters of the launch (roles 7 and 8: torch routing's native
    _scaled_mm fills them from the call's scales); a plain kernel's words have neither."""
    from unimatmul_triton.runner import launch_words

    from unimatmul.backend import NativeCall

    params = list(_info()["params"])  # type: ignore[call-overload]
    beta_at = next(i for i, p in enumerate(params) if p["role"] == "beta")
    scales = [
        {"name": "sa_ptr", "type": "CUdeviceptr", "size": 8, "role": "scale_a"},
        {"name": "sb_ptr", "type": "CUdeviceptr", "size": 8, "role": "scale_b"},
        {"name": "stride_sak", "type": "int32_t", "size": 4, "role": "constant", "value": 96},
    ]
    words = launch_words(
        _info(params=[*params[: beta_at + 1], *scales, *params[beta_at + 1 :]]), (11, 12, 13)
    )
    assert words is not None and words[11] == len(params) + 3
    triples = [tuple(words[12 + 3 * i : 15 + 3 * i]) for i in range(words[11])]
    assert triples[beta_at : beta_at + 4] == [(6, 4, 0), (7, 8, 0), (8, 8, 0), (0, 4, 96)]
    roles = NativeCall.LAUNCH_ROLES
    assert (roles["scale_a"], roles["scale_b"]) == (7, 8)
    plain = launch_words(_info(), (11, 12, 13))
    assert plain is not None and not {7, 8} & set(plain[12::3])


@pytest.mark.parametrize(
    "change",
    [
        {"cooperative": True},
        {"pdl": True},
        {"cluster_dims": (2, 1, 1)},
    ],
    ids=["cooperative", "pdl", "cluster"],
)
def test_launch_words_refuse_what_the_native_caller_does_not_do(change: dict[str, object]) -> None:
    from unimatmul_triton.runner import launch_words

    assert launch_words(_info(**change), (1, 2, 3)) is None
    needs_scratch = _info()
    needs_scratch["params"][-2]["bytes_needed"] = 256  # type: ignore[index]
    assert launch_words(needs_scratch, (1, 2, 3)) is None


def _routed_linear(monkeypatch: pytest.MonkeyPatch, bias: bool) -> tuple[Any, Any, Any]:
    """A bf16 Linear 1024 -> 512 on the GPU, an input of 4 rows and their float64 product,
    with the native routing kernels loaded (the test skips where they do not build)."""
    from unimatmul.torch import native

    monkeypatch.setenv("UNIMATMUL_TORCH_NATIVE", "auto")
    monkeypatch.delenv("UNIMATMUL_MODE", raising=False)
    if not native.load(cuda=True):
        pytest.skip(f"native kernels did not build: {native.failure(True)}")
    torch.manual_seed(0)
    lin = torch.nn.Linear(1024, 512, bias=bias, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16)
    reference = x.double() @ lin.weight.double().t() + (lin.bias.double() if bias else 0.0)
    return lin, x, reference


def _triton_winner(selector: Any, lin: Any, x: Any) -> tuple[Any, Any, Any]:
    """The Linear's product tuned for real, the fastest checked Triton kernel stored as its
    winner: (problem, target, record)."""
    import unimatmul.torch as ut
    from unimatmul.testing import prefer_kernel
    from unimatmul.torch.model_tuning import collecting

    ut.disable()
    with ut.enabled(), collecting() as met, torch.no_grad():
        lin(x)
    (problem, target), *_ = list({(p.key, t): (p, t) for p, t in met}.values())
    record = prefer_kernel(selector, problem, target, backend="triton")
    assert record.winner.startswith("triton/"), [r.identity for r in record.results]
    return problem, target, record


@gpu
@pytest.mark.parametrize("bias", [False, True], ids=["mm", "bias"])
def test_a_routed_triton_choice_is_launched_natively(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, bias: bool
) -> None:
    """A Triton winner in the cache is served by the native routing kernels (LAUNCH): the
    calls after the first never enter Python, on the entry's stream; another stream (a
    split-K workspace of its own) goes through Python, still right."""
    import unimatmul.torch as ut
    from unimatmul.testing import isolated_selector
    from unimatmul.torch import native, routing

    lin, x, reference = _routed_linear(monkeypatch, bias)
    with isolated_selector(tmp_path / "cache.msgpack") as selector:  # type: ignore[operator]
        _triton_winner(selector, lin, x)
        ut.clear_plans()
        try:
            with torch.no_grad(), ut.enabled():
                outs = [lin(x) for _ in range(5)]
                plans = [p for p in routing.TABLE.plans.values() if p.native == native.LAUNCH]
                assert plans, [(p.label, p.native, p.reason) for p in routing.TABLE.plans.values()]
                assert native.counts().get(plans[0].ident) == 4  # the first call went through Python
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    on_side = lin(x)
                torch.cuda.current_stream().wait_stream(side)
                torch.cuda.synchronize()
        finally:
            ut.disable()
    for out in [*outs, on_side]:
        rel = float((out.double() - reference).norm() / reference.norm())
        assert rel < 3e-2


@gpu
def test_a_triton_tie_leaves_cuda_graphs_to_pytorchs_kernel(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tie (a Default record whose Triton kernel the harness measured level with Default)
    that its window kept serves eager calls natively (LAUNCH), but a CUDA graph captured
    from the same call holds PyTorch's kernel: a tie wins by host time, which a graph
    replay does not have. The control: the same kernel as the record's winner is in the
    graph (the profiler names the kernels of a replay)."""
    from dataclasses import replace

    import unimatmul.torch as ut
    from unimatmul.backend import DEFAULT
    from unimatmul.cache.record import OK
    from unimatmul.testing import fast_config, isolated_selector
    from unimatmul.torch import native, routing
    from unimatmul.tuning import confirm

    lin, x, reference = _routed_linear(monkeypatch, bias=False)
    names = ("gemv_kernel", "rows_kernel", "tile_kernel", "persistent_kernel")

    def captured(selector: object) -> tuple[bool, int]:
        """(a Triton kernel ran in the graph's replay, the plan's native kind), after the window."""
        ut.clear_plans()
        with torch.no_grad(), ut.enabled():
            for _ in range(confirm.WARMUP + 2 * 4 + 2):  # the window, then its verdict
                lin(x)
            torch.cuda.synchronize()
            lin(x)
            assert selector.settle(timeout=30)  # type: ignore[attr-defined]
            (plan,) = routing.TABLE.plans.values()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = lin(x)
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            graph.replay()
            torch.cuda.synchronize()
        rel = float((out.double() - reference).norm() / reference.norm())
        assert rel < 3e-2
        kernels = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
        assert kernels, "the profiler saw no kernel of the replay"
        return any(name in kernel for kernel in kernels for name in names), plan.native

    with isolated_selector(tmp_path / "cache.msgpack", confirm_calls=4) as selector:  # type: ignore[operator]
        problem, target, record = _triton_winner(selector, lin, x)
        selector.settings = replace(fast_config(), min_gain=-100.0)  # every window keeps its choice
        namespace = selector.platform(target).namespace
        try:
            assert captured(selector) == (True, native.LAUNCH)
            # The same kernel as Default's tie: level with Default in the harness.
            (measured,) = [r for r in record.results if r.identity == record.winner]
            tie = replace(
                record,
                winner=DEFAULT.identity,
                winner_s=record.winner_s,
                default_s=record.winner_s,
                results=[replace(measured, status=OK)],
                settings={k: v for k, v in record.settings.items() if k != confirm.KEY},
            )
            assert confirm.tie_of(tie) == record.winner
            selector.store.put(namespace, problem.key, tie)
            assert captured(selector) == (False, native.LAUNCH)
            kept = selector.store.get(namespace, problem.key).settings[confirm.KEY]
            assert kept["verdict"] == confirm.CONFIRMED and kept["kernel"] == record.winner
        finally:
            ut.disable()


HAVE_FP8 = GPU and bool(torch.version.cuda) and torch.cuda.get_device_capability() >= (8, 9)


def _fp8_operands(m: int, n: int, k: int, scales: str, bias: bool, seed: int) -> tuple[Any, ...]:
    """torch._scaled_mm's operands on the GPU: a row-major, w.t(), f32 scales, a bf16 bias."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(n, k, device="cuda", generator=gen).to(torch.float8_e4m3fn)
    shapes = ((m, 1), (1, n)) if scales == "rowwise" else ((), ())
    sa, sb = (torch.rand(shape, device="cuda", generator=gen) + 0.5 for shape in shapes)
    bias_t = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16) if bias else None
    return a, w.t(), sa, sb, bias_t


@gpu
@pytest.mark.skipif(not HAVE_FP8, reason="needs an NVIDIA GPU with fp8 (sm_89 or later)")
@pytest.mark.parametrize(
    ("m", "scales", "bias"),
    [(64, "tensor", False), (16, "rowwise", False), (64, "rowwise", True)],
    ids=["tensor", "rowwise-m16", "rowwise-bias"],
)
def test_a_routed_triton_fp8_choice_is_launched_natively(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, m: int, scales: str, bias: bool
) -> None:
    """A Triton fp8 winner of a routed torch._scaled_mm is served by the native SCALED table
    (a LAUNCH entry): the calls after the first never enter Python, each with scale tensors
    of its own (the scale pointers are written per call), right against float64; a CUDA
    graph captured from the same call holds the Triton kernel and follows new operands.

    Every call runs on one side stream: a split-K kernel is bound to the stream its entry
    was made on, and a graph cannot be captured on the legacy default stream."""
    from dataclasses import replace

    import unimatmul.torch as ut
    from unimatmul.testing import isolated_selector, prefer_kernel
    from unimatmul.torch import native, scaled_routing

    monkeypatch.setenv("UNIMATMUL_TORCH_NATIVE", "auto")
    monkeypatch.delenv("UNIMATMUL_MODE", raising=False)
    if not native.load(cuda=True):
        pytest.skip(f"native kernels did not build: {native.failure(True)}")
    n, k = 1024, 512
    a, b, sa, sb, bias_t = _fp8_operands(m, n, k, scales, bias, seed=0)
    # All alive at once, so at other addresses; other values, so a stale scale pointer shows.
    fresh = [(sa * (1.0 + 0.25 * i), sb * (1.5 - 0.2 * i)) for i in range(5)]
    tol = scaled_tolerance("bf16")

    def rel(out: Any, ref: Any) -> float:
        return float((out.double() - ref).norm() / ref.norm())

    def call(x: Any, y: Any) -> Any:
        return torch._scaled_mm(a, b, x, y, bias=bias_t, out_dtype=torch.bfloat16)

    with isolated_selector(tmp_path / "cache.msgpack") as selector:  # type: ignore[operator]
        try:
            with ut.enabled():
                call(sa, sb)  # nothing stored: PyTorch's kernel; the plan names the problem
                (plan,) = scaled_routing.plans()
            problem, target = plan.problem, plan.target
            record = prefer_kernel(selector, problem, target, backend="triton")
            assert record.winner.startswith("triton/"), [r.identity for r in record.results]
            # The kernel may be no faster than PyTorch's here, and a slim margin leaves CUDA
            # graphs to PyTorch's kernel (confirm.default_in_graphs): the record states a
            # clear one, since this test is about the launch, not the choice.
            record = replace(
                record,
                default_s=2 * record.winner_s,
                settings={**record.settings, "test_override": "winner forced, clear margin"},
            )
            selector.store.put(selector.platform(target).namespace, problem.key, record)
            ut.clear_plans()
            ut.reset_stats()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with ut.enabled(), torch.cuda.stream(side):
                outs = [call(x, y) for x, y in fresh]
                # Read before scaled_routing.plans(): its look folds (and resets) the native
                # counts into the plans' own.
                served = native.counts(table=native.SCALED)
                (plan,) = scaled_routing.TABLE.plans.values()
                assert plan.native == native.LAUNCH, (plan.label, plan.native, plan.reason)
                assert served == {plan.ident: len(fresh) - 1}
                assert native.kinds(native.SCALED) == {plan.ident: native.LAUNCH}
                graph = torch.cuda.CUDAGraph()
                graph.capture_begin()
                static = call(sa, sb)
                graph.capture_end()
                assert native.counts(table=native.SCALED) == {plan.ident: len(fresh)}
            torch.cuda.current_stream().wait_stream(side)
            stats = ut.scaled_stats()
            assert (stats["kernel"], stats["routed"]) == (len(fresh) + 1, len(fresh) + 1), stats
        finally:
            ut.disable()
    torch.cuda.synchronize()
    for (x, y), out in zip(fresh, outs, strict=True):
        assert out.dtype == torch.bfloat16 and out.shape == (m, n)
        assert rel(out, scaled_reference(ADAPTER, a, b, x, y, bias_t)) <= tol
    new = _fp8_operands(m, n, k, scales, bias, seed=9)
    for dst, src in zip((a, b, sa, sb, bias_t), new, strict=True):
        if dst is not None:
            dst.copy_(src)
    static.fill_(float("nan"))
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    assert rel(static, scaled_reference(ADAPTER, *new)) <= tol
    kernels = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    names = ("gemv_kernel", "rows_kernel", "tile_kernel", "persistent_kernel")
    assert any(name in kernel for kernel in kernels for name in names), kernels


def test_the_driver_words_are_found_once_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch function and a device's primary context are looked up (and the context
    retained) once per device, not for every native entry."""
    from unimatmul_triton.runner import _Driver

    looked_up: list[int] = []

    def find(cls: object, device_index: int, hip: bool) -> tuple[int, int, int]:
        looked_up.append(device_index)
        return (10 + device_index, 20, 30)

    monkeypatch.setattr(_Driver, "_find_words", classmethod(find))
    monkeypatch.setattr(_Driver, "_words", {})
    assert _Driver.words(0, False) == _Driver.words(0, False) == (10, 20, 30)
    assert _Driver.words(1, False) == (11, 20, 30)
    assert looked_up == [0, 1]


@pytest.mark.skipif(bool(getattr(torch.version, "hip", None)), reason="ROCm's Triton has the fnuz fp8 pair")
@pytest.mark.parametrize("dtype", ["f8e4m3fnuz", "f8e5m2fnuz"])
def test_the_fnuz_pair_is_offered_on_rocm_only(dtype: str) -> None:
    """NVIDIA's Triton has no fp8e4b8 / fp8e5b16: such a problem is refused before anything
    is compiled (a stored fnuz winner would fail to compile); the interpreter computes it."""
    problem = scaled_problem(31, 48, 64, dtype_a=dtype, dtype_b=dtype)
    with pytest.raises(UnsupportedProblem, match="fnuz fp8 pair is ROCm's"):
        TritonBackend()._check_here(problem)
    TritonInterpreterBackend()._check_here(problem)
    TritonBackend()._check_here(scaled_problem(31, 48, 64))  # the OCP pair is NVIDIA's
