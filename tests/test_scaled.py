"""Scaled (fp8) GEMMs: their Problems and keys, cache records, and ``unimatmul.scaled_matmul``.

Everything runs on the CPU: torch's CPU build has the fp8 dtypes and a ``_scaled_mm``
(the Default here), and ``scaled_fakes.ScaledFakeBackend`` stands in for a kernel
source where one is needed (a GPU kernel cannot run here). Every result is compared
with the float64 product of the dequantised inputs.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import fp8_caps
import numpy as np
import pytest
from scaled_fakes import ScaledFakeBackend

import unimatmul
from unimatmul.backend import DEFAULT, Target
from unimatmul.cache.protocol import open_store
from unimatmul.cache.record import OK, PRUNED, REJECTED, CandidateResult, TuningRecord
from unimatmul.core.arrays import CPU, Device, adapter_for_kind
from unimatmul.core.dtypes import scaled_tolerance
from unimatmul.core.problem import Problem
from unimatmul.core.scales import scaled_problem, scaled_problem_of, scaled_reference

torch = pytest.importorskip("torch")


@pytest.fixture
def cpu_fp8() -> None:
    """Skip where torch's own CPU fp8 product (every scaled call's Default) cannot run."""
    fp8_caps.skip_unless_runs("tensor")


# --- Problems and keys ----------------------------------------------------------------------

# Keys of plain GEMMs as every earlier version wrote them (README, docs/cache-format.md, the
# TunableOp tests): a scaled GEMM adds a suffix to its own keys only.
PLAIN_KEYS = [
    "gemm:f32.f32.f32:f32:NT:m128n3072k768b1:ld768,768,3072:st0,0,0:beta0:none:al16",
    "gemm:bf16.bf16.bf16:f32:NT:m2n8192k3584b1:ld3584,3584,8192:st0,0,0:beta0:none:al16",
    "gemm:f16.f16.f16:f32:TN:m512n1024k256b1:ld520,1040,1024:st0,0,0:beta0:none:al16",
    "gemm:f32.f32.f32:tf32:NN:m8n16k24b3:ld24,16,32:st0,384,256:beta1:bias_gelu_tanh:biasf32:al4",
    "gemm:f8e4m3.f8e4m3.bf16:f32:NN:m64n48k32b1:ld32,48,48:st0,0,0:beta0:none:al16",
]


@pytest.mark.parametrize("key", PLAIN_KEYS)
def test_plain_keys_are_byte_identical(key: str) -> None:
    problem = Problem.from_key(key)
    assert problem.key == key
    assert not problem.is_scaled and (problem.scale_a, problem.scale_b, problem.fast_accum) == ("", "", False)


SCALED = [
    scaled_problem(16, 4096, 4096),
    scaled_problem(1, 14336, 4096, scales="rowwise", fast_accum=True),
    scaled_problem(128, 4096, 4096, dtype_c="f16", bias=True),
    scaled_problem(8192, 1024, 4096, dtype_a="f8e5m2", dtype_b="f8e4m3", dtype_c="f32", scales="rowwise"),
    scaled_problem(64, 12288, 2048, dtype_a="f8e4m3fnuz", scales="rowwise", bias=True),
]


@pytest.mark.parametrize("problem", SCALED, ids=lambda p: p.key)
def test_scaled_keys_round_trip(problem: Problem) -> None:
    key = problem.key
    assert key.startswith("scaled_gemm:") and ":scales=" in key and ":fastaccum=" in key
    assert Problem.from_key(key) == problem
    # torch's fp8-linear layout: A row-major, B = w.t() (column-major).
    assert (problem.trans_a, problem.trans_b, problem.lda, problem.ldb) == (False, True, problem.k, problem.k)


def test_a_scaled_key_reads_as_it_is_written() -> None:
    key = scaled_problem(16, 4096, 4096, scales="rowwise").key
    assert key == (
        "scaled_gemm:f8e4m3.f8e4m3.bf16:f32:NT:m16n4096k4096b1:ld4096,4096,4096:st0,0,0:beta0:none:al16"
        ":scales=rowwise,rowwise:fastaccum=0"
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"dtype_a": "bf16"}, "fp8 A and B"),
        ({"dtype_c": "f8e4m3"}, "writes bf16, f16, f32"),
        ({"compute": "tf32"}, "accumulates in f32"),
        ({"scale_a": "blockwise"}, "scale_a='blockwise'"),
        ({"scale_b": ""}, "scale_b=''"),
        ({"beta_zero": False}, "beta = 0"),
        ({"epilogue": "bias_relu"}, "at most a bias"),
        ({"op": "gemm"}, "belong to op 'scaled_gemm'"),
    ],
)
def test_scaled_fields_are_checked(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replace(scaled_problem(16, 64, 32, scales="rowwise"), **changes)


def test_a_plain_key_with_scales_is_refused() -> None:
    key = PLAIN_KEYS[0] + ":scales=tensor,tensor:fastaccum=0"
    with pytest.raises(ValueError, match="belong to op 'scaled_gemm'"):
        Problem.from_key(key)


def test_scaled_records_survive_the_cache_file_and_leave_plain_entries_alone(tmp_path: Path) -> None:
    path = tmp_path / "cache.msgpack"
    namespace = "nvidia/sm_90/NVIDIA H200/132/torch"
    plain = {
        key: TuningRecord(problem=key, winner="cublaslt/gemm?algo=6", winner_s=2e-5, default_s=3e-5)
        for key in PLAIN_KEYS
    }
    store = open_store(path)
    for key, record in plain.items():
        store.put(namespace, key, record)
    store.flush()
    before = path.read_bytes()
    problem = SCALED[1]
    record = TuningRecord(
        problem=problem.key,
        winner="cublaslt/gemm?algo=66&cluster=2&custom=0&inner=12&reduction=0&splitk=1&stages=33&swizzle=0&tile=20",
        winner_s=7.5e-6,
        default_s=9.0e-6,
        results=[
            CandidateResult(DEFAULT.identity, OK, 9.0e-6, 20, 1.2e-7),
            CandidateResult("cublaslt/gemm?algo=66&cluster=2", REJECTED, None, 0, 0.4, "relative error"),
        ],
        versions={"cublaslt": "13.1.0", "torch": "2.11.0"},
        settings={"tolerance": scaled_tolerance("bf16", True)},
    )
    store = open_store(path)
    store.put(namespace, problem.key, record)
    store.flush()
    assert path.read_bytes() != before
    again = {key: got for _, key, got in open_store(path).items(namespace)}
    # The store codes times compactly (times relative to the winner, errors to three digits): equal to 1 %.
    assert _close(again[problem.key].to_dict(), record.to_dict())
    assert all(_close(again[k].to_dict(), r.to_dict()) for k, r in plain.items())
    assert sorted(again) == sorted([*PLAIN_KEYS, problem.key])


def _close(got: Any, want: Any) -> bool:
    if isinstance(want, float) and isinstance(got, float):
        return math.isclose(got, want, rel_tol=1e-2)
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(_close(got[k], want[k]) for k in want)
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(_close(g, w) for g, w in zip(got, want, strict=True))
    return bool(got == want)


# --- scaled_matmul --------------------------------------------------------------------------


def _fp8(shape: tuple[int, ...], dtype: Any, seed: int) -> Any:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(dtype)


def _operands(
    m: int, n: int, k: int, scales: str, *, dtype: Any = None, seed: int = 0
) -> tuple[Any, Any, Any, Any]:
    dtype = dtype or torch.float8_e4m3fn
    a = _fp8((m, k), dtype, seed)
    w = _fp8((n, k), dtype, seed + 1)  # a linear layer's weight: b = w.t() is column-major
    gen = torch.Generator().manual_seed(seed + 2)
    if scales == "rowwise":
        sa, sb = torch.rand((m, 1), generator=gen) + 0.25, torch.rand((1, n), generator=gen) + 0.25
    else:
        sa, sb = torch.tensor(0.375), torch.tensor([1.5])
    return a, w.t(), sa, sb


def _rel(out: Any, ref: Any) -> float:
    return float((out.double() - ref).norm() / ref.norm())


# torch._scaled_mm takes no bias with a float32 output (an error, tested below).
COMBOS = [
    (scales, out_dtype, bias)
    for scales in ("tensor", "rowwise")
    for out_dtype in (torch.bfloat16, torch.float16, torch.float32)
    for bias in (False, True)
    if not (bias and out_dtype == torch.float32)
]


@pytest.mark.parametrize(("scales", "out_dtype", "bias"), COMBOS)
@pytest.mark.usefixtures("cpu_fp8")
def test_scaled_matmul_matches_the_dequantised_product(
    isolated: Any, scales: str, out_dtype: Any, bias: bool
) -> None:
    a, b, sa, sb = _operands(33, 48, 64, scales)
    vec = torch.randn(48).to(out_dtype) if bias else None
    out = unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=out_dtype, bias=vec)
    assert out.dtype == out_dtype and out.shape == (33, 48)
    ref = scaled_reference(adapter_for_kind("torch"), a, b, sa, sb, vec)
    assert _rel(out, ref) <= scaled_tolerance(
        {torch.bfloat16: "bf16", torch.float16: "f16"}.get(out_dtype, "f32")
    )


@pytest.mark.usefixtures("cpu_fp8")
def test_one_row_with_row_wise_scales_is_row_wise_as_in_torch(isolated: Any) -> None:
    """At m = 1 a [1, 1] scale_a is one value, yet row-wise next to a [1, n] scale_b (decode)."""
    a, b, sa, sb = _operands(1, 48, 64, "rowwise")
    assert tuple(sa.shape) == (1, 1)
    problem = scaled_problem_of(adapter_for_kind("torch"), a, b, sa, sb, out_dtype="bf16")
    assert (problem.scale_a, problem.scale_b) == ("rowwise", "rowwise")
    out = unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert torch.equal(out, torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16))


@pytest.mark.usefixtures("cpu_fp8")
def test_out_is_written_in_place_and_e5m2_mixes_with_e4m3(isolated: Any) -> None:
    a = _fp8((16, 32), torch.float8_e5m2, 3)
    _, b, sa, sb = _operands(16, 64, 32, "rowwise", seed=4)
    out = torch.full((16, 64), float("nan"), dtype=torch.bfloat16)
    got = unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=torch.bfloat16, out=out)
    assert got is out
    assert _rel(out, scaled_reference(adapter_for_kind("torch"), a, b, sa, sb, None)) <= 3e-2


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda a, b, sa, sb: ((a.float(), b, sa, sb), {}), TypeError, "a is f32; a and b must be fp8"),
        (
            lambda a, b, sa, sb: ((a, b, sa, torch.rand(1, 48)), {}),
            ValueError,
            "scale_a has shape \\(\\) and scale_b \\(1, 48\\)",
        ),
        (lambda a, b, sa, sb: ((a, b, torch.rand(33, 2), sb), {}), ValueError, "block-wise and MX scales"),
        (lambda a, b, sa, sb: ((a, b, sa.double(), sb), {}), TypeError, "scales are float32"),
        (lambda a, b, sa, sb: ((a, b[:32], sa, sb), {}), ValueError, "contracted dimension"),
        (lambda a, b, sa, sb: ((a, b, sa, sb), {"out_dtype": torch.float8_e4m3fn}), TypeError, "out_dtype"),
        (
            lambda a, b, sa, sb: ((a, b, sa, sb), {"out_dtype": torch.float32, "bias": torch.zeros(48)}),
            TypeError,
            "bias must be bf16 or f16",
        ),
        (
            lambda a, b, sa, sb: ((a, b, sa, sb), {"bias": torch.zeros(48, dtype=torch.float16)}),
            TypeError,
            "bias of f16 with a bf16 output",
        ),
        (
            lambda a, b, sa, sb: ((a, b, sa, sb), {"out": torch.empty(33, 48, dtype=torch.float16)}),
            TypeError,
            "out is f16",
        ),
        (
            lambda a, b, sa, sb: ((np.zeros((33, 64), np.float32), b, sa, sb), {}),
            TypeError,
            "takes torch tensors",
        ),
    ],
)
def test_bad_input_is_a_clear_error(isolated: Any, make: Any, error: type, message: str) -> None:
    args, kwargs = make(*_operands(33, 48, 64, "tensor"))
    kwargs.setdefault("out_dtype", torch.bfloat16)
    with pytest.raises(error, match=message):
        unimatmul.scaled_matmul(*args, **kwargs)
    assert isolated.store_count() == 0


def test_cuda_rules_are_checked_before_any_gpu_work() -> None:
    """torch._scaled_mm's layout rule on CUDA (row-major a, column-major b) is said up front."""

    class FakeCuda:  # the adapter's view of a CUDA tensor, without one
        kind = "torch"

        def __init__(self) -> None:
            self.inner = adapter_for_kind("torch")

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def device(self, x: Any) -> Any:
            return Device("cuda", 0)

    a, b, sa, sb = _operands(33, 48, 64, "tensor")
    adapter: Any = FakeCuda()
    with pytest.raises(ValueError, match="a must be row-major and b column-major"):
        scaled_problem_of(adapter, a, b.contiguous(), sa, sb, out_dtype="bf16")
    with pytest.raises(ValueError, match="multiples of 16"):
        scaled_problem_of(adapter, a[:, :40], b[:40, :40], sa, sb, out_dtype="bf16")
    problem = scaled_problem_of(adapter, a, b, sa, sb, out_dtype="bf16")
    assert (problem.trans_a, problem.trans_b, problem.align) == (False, True, 16)


@pytest.mark.usefixtures("cpu_fp8")
def test_tuning_measures_the_candidates_and_stores_a_scaled_record(isolated: Any, registered: Any) -> None:
    fake = ScaledFakeBackend()
    with registered(isolated.plugins, fake), unimatmul.mode("tune"):
        a, b, sa, sb = _operands(64, 96, 128, "rowwise")
        out = unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert _rel(out, scaled_reference(adapter_for_kind("torch"), a, b, sa, sb, None)) <= 3e-2
    records = [r for _, _, r in isolated.selector.store.items(None)]
    assert len(records) == 1
    record = records[0]
    problem = Problem.from_key(record.problem)
    assert (problem.op, problem.scale_a, problem.dtype_c, problem.m, problem.n) == (
        "scaled_gemm",
        "rowwise",
        "bf16",
        64,
        96,
    )
    by_id = {r.identity: r for r in record.results}
    assert set(by_id) == {DEFAULT.identity, "fake-scaled/dequantise"}
    for result in by_id.values():  # both checked against the dequantised float64 product
        # (then timed: a clear loser may be pruned early by the timing, not by the check)
        assert result.status in (OK, PRUNED), result
        assert result.error is not None and result.error <= scaled_tolerance("bf16")
    assert record.settings["tolerance"] == scaled_tolerance("bf16")


@pytest.mark.parametrize("scales", ["rowwise", "tensor"])
@pytest.mark.usefixtures("cpu_fp8")
def test_a_kernel_that_ignores_row_wise_scales_is_rejected(
    isolated: Any, registered: Any, scales: str
) -> None:
    fake = ScaledFakeBackend("fake-first-scale", "first_scale")
    with registered(isolated.plugins, fake), unimatmul.mode("tune"):
        unimatmul.scaled_matmul(*_operands(32, 48, 64, scales), out_dtype=torch.bfloat16)
    (record,) = [r for _, _, r in isolated.selector.store.items(None)]
    result = record.result("fake-first-scale/dequantise")
    assert result is not None and result.error is not None
    if scales == "rowwise":
        assert result.status == REJECTED and "relative error" in result.note
        assert result.error > 10 * scaled_tolerance("bf16")
        assert record.winner == DEFAULT.identity
    else:  # one scale per tensor is what this kernel does apply: it passes the check
        assert result.status != REJECTED and result.error <= scaled_tolerance("bf16")


def _store_winner(isolated: Any, problem: Problem, winner: str) -> None:
    namespace = isolated.selector.platform(Target(adapter_for_kind("torch"), CPU)).namespace
    isolated.selector.store.put(
        namespace,
        problem.key,
        TuningRecord(problem=problem.key, winner=winner, winner_s=1e-6, default_s=2e-6),
    )


@pytest.mark.usefixtures("cpu_fp8")
def test_a_stored_winner_runs_and_a_failing_one_falls_back(isolated: Any, registered: Any) -> None:
    a, b, sa, sb = _operands(16, 32, 64, "tensor")
    problem = scaled_problem_of(adapter_for_kind("torch"), a, b, sa, sb, out_dtype="f16")
    good = ScaledFakeBackend("fake-good")
    broken = ScaledFakeBackend("fake-broken", "raise_run")
    ref = scaled_reference(adapter_for_kind("torch"), a, b, sa, sb, None)
    with registered(isolated.plugins, good):
        _store_winner(isolated, problem, "fake-good/dequantise")
        for _ in range(3):
            out = unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=torch.float16)
            assert _rel(out, ref) <= 1e-2
        assert good.calls == 3  # the cached call goes straight to the prepared runner
    unimatmul.api.clear_fast_path()
    isolated.selector.store.delete(
        isolated.selector.platform(Target(adapter_for_kind("torch"), CPU)).namespace, problem.key
    )
    with registered(isolated.plugins, broken):
        _store_winner(isolated, problem, "fake-broken/dequantise")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=torch.float16)
            again = unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=torch.float16)
        assert _rel(out, ref) <= 1e-2 and _rel(again, ref) <= 1e-2
        assert broken.calls == 1  # failed once; Default (torch._scaled_mm) from then on
        assert sum("fake-broken/dequantise failed" in str(w.message) for w in caught) == 1


@pytest.mark.usefixtures("cpu_fp8")
def test_off_mode_is_torch_scaled_mm_bit_for_bit(isolated: Any) -> None:
    a, b, sa, sb = _operands(24, 32, 48, "rowwise")
    with unimatmul.mode("off"):
        out = unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True)
    expected = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=True)
    assert torch.equal(out, expected)
    assert not math.isnan(float(out.float().sum()))


# --- where torch's own CPU fp8 product cannot run ---------------------------------------------


@pytest.mark.skipif(fp8_caps.missing() is None, reason="torch's own CPU fp8 product runs on this CPU")
@pytest.mark.parametrize("mode", ["cached", "tune"])
def test_where_torch_cannot_compute_cpu_fp8_scaled_matmul_says_so(isolated: Any, mode: str) -> None:
    """An AMX CPU under ONEDNN_MAX_CPU_ISA=AVX2 (CI's second leg there): torch's own call fails."""
    a, b, sa, sb = _operands(33, 48, 64, "tensor")
    with (
        unimatmul.mode(mode),
        pytest.raises(unimatmul.DefaultFailed, match=r"torch\._scaled_mm .* failed on cpu"),
    ):
        unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert isolated.store_count() == 0


# The error torch's CPU _scaled_mm raises on an AMX CPU under an AVX2 cap (ATen -> oneDNN).
ONEDNN_REFUSAL = (
    "could not create a primitive descriptor for the matmul primitive. Run workload with "
    "environment variable ONEDNN_VERBOSE=all to get additional diagnostic information."
)


@pytest.fixture
def refusing_cpu_fp8() -> Any:
    """torch's CPU ``_scaled_mm`` kernels replaced, at the dispatcher, by one that fails as
    oneDNN does under an ISA cap on an AMX CPU (a failure this CPU cannot show for real)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(ONEDNN_REFUSAL)

    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_scaled_mm", refuse, "CPU")
    lib.impl("_scaled_mm.out", refuse, "CPU")
    try:
        yield
    finally:
        lib._destroy()


@pytest.mark.parametrize("mode", ["off", "cached", "tune", "record"])
def test_a_failing_default_names_torchs_call_and_the_cause(
    isolated: Any, refusing_cpu_fp8: Any, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    a, b, sa, sb = _operands(33, 48, 64, "tensor")
    with unimatmul.mode(mode), pytest.raises(unimatmul.DefaultFailed) as caught:
        unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=torch.bfloat16)
    said = str(caught.value)
    assert said.startswith("scaled_matmul: torch._scaled_mm (Default: torch's own fp8 product) failed on cpu")
    assert "could not create a primitive descriptor for the matmul primitive" in said
    assert "ONEDNN_MAX_CPU_ISA=AVX2 keeps oneDNN below AMX: unset it" in said
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value.__cause__, RuntimeError)
    assert isolated.store_count() == 0  # nothing tuned or recorded for a failing call


def test_an_out_overlapping_an_input_is_torch_scaled_mm_bit_for_bit(
    isolated: Any, registered: Any, cpu_fp8: None
) -> None:
    """A tuned (fake) kernel serves the signature; a call whose out holds its own bias or
    scale runs torch._scaled_mm (core/overlap.py), as torch makes it."""
    fp8_caps.skip_unless_runs("tensor", "f32")  # torch's own product into f32 is the reference
    fake = ScaledFakeBackend("fake-scaled", "correct")

    def operands() -> tuple[Any, ...]:
        a, b, sa, _ = _operands(16, 32, 64, "tensor")
        out = torch.randn(16, 32, generator=torch.Generator().manual_seed(5))
        return a, b, sa, out[3, 4], out  # scale_b: one value of out itself

    with registered(isolated.plugins, fake), unimatmul.mode("tune"):
        a, b, sa, _, out = operands()
        unimatmul.scaled_matmul(a, b, sa, torch.tensor(1.5), out_dtype=torch.float32, out=out.clone())
        (record,) = [r for _, _, r in isolated.selector.store.items(None)]
        problem = Problem.from_key(record.problem)
        if record.winner != "fake-scaled/dequantise":
            _store_winner(isolated, problem, "fake-scaled/dequantise")
            unimatmul.api.clear_fast_path()
        a, b, sa, sb, out = operands()
        unimatmul.scaled_matmul(a, b, sa, sb.clone(), out_dtype=torch.float32, out=out)  # no overlap
        calls = fake.calls
        assert calls >= 1  # the tuned kernel serves this signature
        for _ in range(2):
            a, b, sa, sb, out = operands()
            assert unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=torch.float32, out=out) is out
            a2, b2, sa2, sb2, expected = operands()
            torch._scaled_mm(a2, b2, sa2, sb2, out_dtype=torch.float32, out=expected)
            assert torch.equal(out, expected)
        assert fake.calls == calls


def test_a_foreign_scaled_entry_naming_a_kernel_that_ignores_row_wise_scales_is_caught(
    isolated: Any, registered: Any
) -> None:
    """An entry from elsewhere (docs/trust.md) naming a kernel that applies only the first
    scale: its first call returns the dequantised product, warns once and stores why."""
    fake = ScaledFakeBackend("fake-first-scale", "first_scale")
    a, b, sa, sb = _operands(32, 48, 64, "rowwise")
    problem = scaled_problem_of(adapter_for_kind("torch"), a, b, sa, sb, out_dtype="bf16")
    _store_winner(isolated, problem, "fake-first-scale/dequantise")  # no mark: checked nowhere
    ref = scaled_reference(adapter_for_kind("torch"), a, b, sa, sb, None)
    with registered(isolated.plugins, fake):
        with pytest.warns(RuntimeWarning, match="fake-first-scale/dequantise returned a wrong result"):
            out = unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=torch.bfloat16)
        assert _rel(out, ref) <= scaled_tolerance("bf16")
        for _ in range(3):
            assert _rel(
                unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=torch.bfloat16), ref
            ) <= scaled_tolerance("bf16")
    assert fake.calls == 1
    assert isolated.selector.settle(timeout=10)
    namespace = isolated.selector.platform(Target(adapter_for_kind("torch"), CPU)).namespace
    found = isolated.selector.store.get(namespace, problem.key).settings["confirm"]
    assert found["verdict"] == "reverted" and "wrong on a real call" in found["reason"]


# --- block-scaled products (1x128 groups of A, 128x128 blocks of B) -----------------------


def _block_operands(m: int, n: int, k: int, seed: int = 0) -> tuple[Any, Any, Any, Any]:
    """A DeepSeek-V3-style call in torch's layouts: ``x [m, k]``, ``w.t()`` of ``w [n, k]``,
    an outer-dim-major ``[m, ceil(k/128)]`` activation scale and ``w_scale.t()`` of a
    contiguous ``[ceil(n/128), ceil(k/128)]`` weight scale."""
    a = _fp8((m, k), torch.float8_e4m3fn, seed)
    w = _fp8((n, k), torch.float8_e4m3fn, seed + 1)
    kb, nb = -(-k // 128), -(-n // 128)
    gen = torch.Generator().manual_seed(seed + 2)
    sa = (torch.rand((m, kb), generator=gen) + 0.25).t().contiguous().t()
    w_scale = torch.rand((nb, kb), generator=gen) + 0.25
    return a, w.t(), sa, w_scale.t()


def test_a_block_scaled_key_reads_as_it_is_written_and_round_trips() -> None:
    problem = scaled_problem(16, 7168, 2048, scales="block", fast_accum=True)
    assert problem.is_block_scaled and (problem.scale_a, problem.scale_b) == ("block1x128", "block128x128")
    assert problem.key == (
        "scaled_gemm:f8e4m3.f8e4m3.bf16:f32:NT:m16n7168k2048b1:ld2048,2048,7168:st0,0,0:beta0:none:al16"
        ":scales=block1x128,block128x128:fastaccum=1"
    )
    assert Problem.from_key(problem.key) == problem
    # The other modes' keys are what they were.
    assert not scaled_problem(16, 4096, 4096, scales="rowwise").is_block_scaled
    assert scaled_problem(16, 4096, 4096).key.endswith(":scales=tensor,tensor:fastaccum=0")


@pytest.mark.parametrize(
    ("scale_a", "scale_b"),
    [
        ("block1x128", "tensor"),
        ("rowwise", "block128x128"),
        ("block128x128", "block1x128"),
        ("tensor", "rowwise"),
    ],
)
def test_only_torchs_scale_pairs_are_problems(scale_a: str, scale_b: str) -> None:
    with pytest.raises(ValueError, match=f"scales {scale_a},{scale_b} are not a pair a scaled GEMM takes"):
        replace(scaled_problem(16, 256, 256, scales="block"), scale_a=scale_a, scale_b=scale_b)


@pytest.mark.parametrize(("m", "n", "k"), [(5, 256, 384), (1, 160, 320), (33, 144, 272)])
def test_a_block_scaled_call_is_its_problem_and_the_reference_applies_each_block(
    m: int, n: int, k: int
) -> None:
    a, b, sa, sb = _block_operands(m, n, k)
    adapter = adapter_for_kind("torch")
    problem = scaled_problem_of(adapter, a, b, sa, sb, out_dtype="bf16")
    assert problem == replace(scaled_problem(m, n, k, scales="block"), align=problem.align)
    ref = scaled_reference(adapter, a, b, sa, sb, None)
    # The same product summed block by block: sum over K blocks of sa[:, kb] * sb[kb, nb] * (A_kb @ B_kb).
    want = torch.zeros((m, n), dtype=torch.float64)
    for kb in range(sa.shape[1]):
        ks = slice(kb * 128, min(k, kb * 128 + 128))
        part = a[:, ks].double() @ b[ks, :].double()
        col_scale = sb[kb].double().repeat_interleave(128)[:n]
        want += part * sa[:, kb].double()[:, None] * col_scale[None, :]
    assert torch.allclose(ref, want, rtol=1e-12, atol=1e-12)
    assert float(ref.abs().max()) > 0  # never a check on zeros


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda a, b, sa, sb: (a, b, sa.contiguous(), sb),
            r"scale_a has strides \(3, 1\), expected \(1, 5\)",
        ),
        (
            lambda a, b, sa, sb: (a, b, sa, sb.contiguous()),
            r"scale_b has strides \(2, 1\), expected \(1, 3\)",
        ),
        (
            lambda a, b, sa, sb: (a, b, sa, torch.rand(3, 3)),
            r"block scales of shapes \(5, 3\) \(1x128 groups of a\) and \(3, 2\) \(128x128 blocks of b\)",
        ),
        (
            lambda a, b, sa, sb: (a, b, torch.rand(5, 2), sb),
            r"scale_a has shape \(5, 2\) and scale_b \(3, 2\)",
        ),
    ],
)
def test_bad_block_scales_are_a_clear_error_naming_the_expected_shape(
    isolated: Any, make: Any, message: str
) -> None:
    args = make(*_block_operands(5, 256, 384))
    with pytest.raises(ValueError, match=message):
        unimatmul.scaled_matmul(*args, out_dtype=torch.bfloat16)
    assert isolated.store_count() == 0


@pytest.mark.parametrize("mode", ["off", "cached", "tune", "record"])
def test_where_torch_has_no_block_scaled_product_the_default_says_it_cannot_run(
    isolated: Any, mode: str
) -> None:
    a, b, sa, sb = _block_operands(5, 256, 384)
    with unimatmul.mode(mode), pytest.raises(unimatmul.DefaultFailed) as caught:
        unimatmul.scaled_matmul(a, b, sa, sb, out_dtype=torch.bfloat16)
    said = str(caught.value)
    assert "torch has no block-scaled (1x128 groups of a, 128x128 blocks of b) fp8 product on cpu" in said
    assert "the Default cannot run here" in said and caught.value.call == "torch._scaled_mm"
    assert isolated.store_count() == 0  # nothing tuned or recorded, no slow path run instead
