"""``unimatmul cache import tunableop`` / ``cache export --format tunableop``: files <-> cache entries.

Every command runs through the real CLI (argparse wiring, msgpack cache file in a
temporary folder) on the sample files of ``data/`` (see test_tunableop.py for where
each format comes from). No GPU is needed: the namespace is passed explicitly or a
Platform is handed in where the command would ask torch for the current GPU.
"""

from __future__ import annotations

import argparse
import io
import math
import random
import re
from pathlib import Path

import pytest

from unimatmul.backend import DEFAULT
from unimatmul.cache.protocol import open_store
from unimatmul.cache.record import TuningRecord, checked_here
from unimatmul.cli import interop as cli_interop
from unimatmul.cli import main
from unimatmul.core.platform import Platform
from unimatmul.core.problem import Problem
from unimatmul.interop import tunableop as to
from unimatmul.interop import tunableop_cache as tio

DATA = Path(__file__).resolve().parent / "data"
MI300 = "amd/gfx942:sramecc+:xnack-/AMD Instinct MI300X/304/torch"
H200 = "nvidia/sm_90/NVIDIA H200/132/torch"
RESULT_FILES = sorted(p.name for p in DATA.glob("*.csv") if p.name != "untuned.csv")
# Files with at least one importable row (cuda_main_cublaslt.csv has none: see its own test).
ROUND_TRIP_FILES = [name for name in RESULT_FILES if name != "cuda_main_cublaslt.csv"]


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out)
    return code, out.getvalue()


def entries(cache: Path, namespace: str | None = None) -> dict[str, TuningRecord]:
    return {key: record for _, key, record in open_store(cache).items(namespace)}


def import_file(name: str, cache: Path, namespace: str = MI300, *extra: str) -> str:
    code, text = run(
        "cache",
        "import",
        "tunableop",
        str(DATA / name),
        "--cache",
        str(cache),
        "--namespace",
        namespace,
        *extra,
    )
    assert code == 0, text
    return text


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """What torch reports on this machine anyway (no GPU), without importing torch each time."""
    monkeypatch.setattr(cli_interop, "current_gpu_platform", lambda: None)


def test_rocm_27_rows_become_row_major_problems_and_solution_candidates(tmp_path: Path) -> None:
    cache = tmp_path / "c.msgpack"
    text = import_file("rocm_2.7_ld.csv", cache)
    got = entries(cache, MI300)
    # tn_8192_2_3584_ld_3584_3584_8192 is x[2, 3584] @ W.T with W[8192, 3584] (a Linear).
    linear = Problem(
        m=2, n=8192, k=3584, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16", trans_b=True, lda=3584, ldb=3584
    )
    record = got[linear.key]
    assert record.winner == "hipblaslt/gemm?index=61169"
    assert record.winner_s == pytest.approx(0.0171694e-3, rel=1e-12)
    assert record.versions == {
        "hipblaslt": "900-0c1a3dfa",
        "rocblas": "4.3.0.ef408db7-dirty",
        "hip": "6.3.42131-fa1d09cbd",
    }
    assert record.settings["validators"]["GCN_ARCH_NAME"] == "gfx942:sramecc+:xnack-"
    # nn_1024_512_256_ld_1024_256_1024: BLAS m=1024 is our n; BLAS lda describes our B.
    rocblas = Problem(m=512, n=1024, k=256, dtype_a="f16", dtype_b="f16", dtype_c="f16", ldb=1024, lda=256)
    assert got[rocblas.key].winner == "rocblas/solution?index=20981&source=s:tensile"  # rocBLAS 4.3
    padded = Problem(
        m=512, n=1024, k=256, dtype_a="f16", dtype_b="f16", dtype_c="f16", trans_a=True, lda=520, ldb=1040
    )
    assert got[padded.key].winner == DEFAULT.identity
    assert got[padded.key].default_s == got[padded.key].winner_s
    bias = Problem(m=32, n=768, k=1024, trans_b=True, lda=1024, ldb=1024, ldc=768, epilogue="bias")
    assert got[bias.key].winner == "hipblaslt/gemm?index=220580"
    batched = Problem(
        m=128, n=64, k=32, batch=16, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16", trans_a=True, lda=128, ldb=64,
        ldc=64, stride_a=32 * 128, stride_b=32 * 64, stride_c=128 * 64,
    )  # fmt: skip
    assert got[batched.key].winner == "hipblaslt/gemm?index=8537"
    # ScaledGemm tn_64_12288_2048_ld_2048_2048_64_rw_1_bias_None: x[12288, 2048] @ w.t(), w[64, 2048],
    # fp8 (fnuz) with row-wise scales; the op name's dtypes are mat1, mat2, out (not swapped).
    rowwise = Problem(
        m=12288, n=64, k=2048, dtype_a="f8e4m3fnuz", dtype_b="f8e4m3fnuz", dtype_c="bf16", trans_b=True,
        lda=2048, ldb=2048, ldc=64, op="scaled_gemm", scale_a="rowwise", scale_b="rowwise",
    )  # fmt: skip
    assert got[rowwise.key].winner == "hipblaslt/gemm?index=30410"
    tensorwise = Problem(
        m=128, n=4096, k=8192, dtype_a="f8e4m3fnuz", dtype_b="f8e5m2fnuz", dtype_c="f16", trans_b=True,
        lda=8192, ldb=8192, ldc=4096, epilogue="bias", dtype_bias="f16", op="scaled_gemm",
        scale_a="tensor", scale_b="tensor",
    )  # fmt: skip
    assert got[tensorwise.key].winner == DEFAULT.identity
    assert len(got) == 7
    assert "ScaledGemm" not in text
    assert f"imported 7 entries into {MI300}" in text


def test_identities_are_the_backends_own() -> None:
    from unimatmul_backends.rocm import hipblaslt, rocblas

    for index in (1, 20981, -7):
        assert tio.candidate_of(to.TunableOpSolution.hipblaslt(index)) == hipblaslt.solution_candidate(index)
    for index, version, source in (
        (1, "4.4.1.", "tensile"),
        (20981, "5.1.0.abc", "hipblaslt"),
        (-61, None, "tensile"),
    ):
        got = tio.candidate_of(to.TunableOpSolution.rocblas(index), version)
        assert got == rocblas.solution_candidate(index, source)
    # No version: a positive index keeps the only meaning there was before the biased numbering.
    assert tio.candidate_of(to.TunableOpSolution.rocblas(7)) == rocblas.solution_candidate(7)
    with pytest.raises(tio.RowSkipped, match=r"rocBLAS 5\.1\.0\.abc reserves indices -9\.\.0"):
        tio.candidate_of(to.TunableOpSolution.rocblas(-7), "5.1.0.abc")
    with pytest.raises(tio.RowSkipped, match=r"rocBLAS 4\.4\.1\. numbers solutions from 1"):
        tio.candidate_of(to.TunableOpSolution.rocblas(-61), "4.4.1.")
    old_name = to.TunableOpSolution("Gemm_Hipblaslt_TN_572")
    assert tio.candidate_of(old_name) == hipblaslt.solution_candidate(572)


def test_rocm_29_tf32_negative_index_inf_time_and_blas_params_strides(tmp_path: Path) -> None:
    cache = tmp_path / "c.msgpack"
    import_file("rocm_2.9_hip_version.csv", cache)
    got = entries(cache, MI300)
    tf32 = Problem(m=512, n=512, k=512, compute="tf32")
    assert got[tf32.key].winner == "hipblaslt/gemm?index=3081"
    negative = Problem(
        m=16, n=1024, k=4096, dtype_a="f16", dtype_b="f16", dtype_c="f16", trans_b=True, ldb=4096, lda=4096
    )
    # rocBLAS 4.3 numbers solutions from 1; -7 names none (reserved in 5.x too): skipped, said so.
    assert negative.key not in got
    f64 = Problem(m=64, n=64, k=64, dtype_a="f64", dtype_b="f64", dtype_c="f64", compute="f64")
    assert math.isinf(got[f64.key].winner_s)
    strided = Problem(
        m=128, n=128, k=64, batch=8, dtype_a="f16", dtype_b="f16", dtype_c="f16", trans_b=True,
        lda=64, ldb=64, ldc=128, stride_a=8192, stride_b=8192, stride_c=16384,
    )  # fmt: skip
    assert got[strided.key].winner == "hipblaslt/gemm?index=1412"
    # HIP_VERSION ("603") is not torch.version.hip's format: kept with the validators only.
    assert got[strided.key].versions == {
        "hipblaslt": "1000-a6254b89-dirty",
        "rocblas": "4.3.0.ef408db7-dirty",
    }
    assert got[strided.key].settings["validators"]["HIP_VERSION"] == "603"


def test_broken_rows_are_reported_with_line_numbers_and_the_rest_imported(tmp_path: Path) -> None:
    cache = tmp_path / "c.msgpack"
    text = import_file("broken_rows.csv", cache)
    assert "imported 2 entries" in text
    lines = [int(n) for n in re.findall(r"^  line (\d+):", text, re.MULTILINE)]
    assert lines == sorted(lines)
    assert lines == [2, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16, 17]
    assert {r.winner for r in entries(cache).values()} == {
        "hipblaslt/gemm?index=12",
        "rocblas/solution?index=5",  # the file names no rocBLAS version: the unbiased meaning
    }


def test_imported_entries_are_marked_as_checked_nowhere(tmp_path: Path) -> None:
    """Their first call in every process checks them (docs/trust.md): no host vouches for them."""
    cache = tmp_path / "c.msgpack"
    import_file("broken_rows.csv", cache)
    got = entries(cache)
    assert got
    for record in got.values():
        assert record.settings["trust"] == {"checked": [], "origin": "import:tunableop"}
        assert not checked_here(record)


def test_bare_integers_are_unknown_library_and_times_are_optional(tmp_path: Path) -> None:
    cache = tmp_path / "c.msgpack"
    text = import_file("readme_initial_bare_int.csv", cache)
    assert re.search(r"line 5: solution '1219' is a bare index: the library it belongs to is unknown", text)
    assert re.search(r"line 6: solution '1216' is a bare index", text)
    got = entries(cache)
    assert sorted(r.winner for r in got.values()) == [
        "default/default",
        "rocblas/solution?index=1216&source=s:tensile",
    ]
    assert all(math.isinf(r.winner_s) for r in got.values())


def test_cublaslt_names_and_wildcards_are_skipped(tmp_path: Path) -> None:
    cache = tmp_path / "c.msgpack"
    code, text = run("cache", "import", "tunableop", str(DATA / "cuda_main_cublaslt.csv"), "--cache", str(cache), "--namespace", H200)  # fmt: skip
    assert code == 0
    assert "line 2: cuBLASLt solution" in text and "line 3: a '*' (dynamic) dimension" in text
    assert "imported 0 entries" in text


def test_namespace_is_required_without_a_matching_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "c.msgpack"
    path = str(DATA / "rocm_2.7_ld.csv")
    code, _ = run("cache", "import", "tunableop", path, "--cache", str(cache))
    assert code == 2
    assert entries(cache) == {}
    # No GPU here (torch on this CPU is no match for a file that names a GPU): said so.
    with pytest.raises(Exception, match=r"tuned on gfx942.* and torch sees no GPU here: pass --namespace"):
        cli_interop.import_tunableop(_args(path, cache), io.StringIO())
    # A GPU of another arch: still refused, and the message names both.
    mi200 = Platform("amd", "gfx90a:sramecc+:xnack-", "AMD Instinct MI250X", 110, array="torch")
    monkeypatch.setattr(cli_interop, "current_gpu_platform", lambda: mi200)
    with pytest.raises(Exception, match=r"gfx942.*gfx90a.*--namespace"):
        cli_interop.import_tunableop(_args(path, cache), io.StringIO())
    # An explicit namespace for another arch is refused too.
    with pytest.raises(Exception, match="tuned on gfx942"):
        cli_interop.import_tunableop(
            _args(path, cache, namespace="amd/gfx90a/MI250X/110/torch"), io.StringIO()
        )
    # The GPU torch sees has the file's arch: its namespace is used.
    mi300 = Platform("amd", "gfx942:sramecc+:xnack-", "AMD Instinct MI300X", 304, array="torch")
    monkeypatch.setattr(cli_interop, "current_gpu_platform", lambda: mi300)
    out = io.StringIO()
    assert cli_interop.import_tunableop(_args(path, cache), out) == 0
    assert set(entries(cache)) == set(entries(cache, mi300.namespace))
    assert mi300.namespace == MI300


def _args(file: str, cache: Path, namespace: str | None = None, replace: bool = False) -> argparse.Namespace:
    return argparse.Namespace(file=file, cache=str(cache), namespace=namespace, replace=replace)


def test_existing_entries_are_kept_unless_replace(tmp_path: Path) -> None:
    cache = tmp_path / "c.msgpack"
    linear = Problem(
        m=2, n=8192, k=3584, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16", trans_b=True, lda=3584, ldb=3584
    )
    mine = TuningRecord(problem=linear.key, winner="onednn/x", winner_s=1.0, default_s=2.0)
    open_store(cache).put(MI300, linear.key, mine)
    text = import_file("rocm_2.7_ld.csv", cache)
    assert "imported 6 entries" in text and "kept 1 existing entry" in text
    assert entries(cache)[linear.key].winner == "onednn/x"
    text = import_file("rocm_2.7_ld.csv", cache, MI300, "--replace")
    assert "imported 7 entries" in text
    assert entries(cache)[linear.key].winner == "hipblaslt/gemm?index=61169"


@pytest.mark.parametrize("name", ROUND_TRIP_FILES)
def test_export_then_import_gives_identical_entries(name: str, tmp_path: Path) -> None:
    namespace = H200 if name.startswith("cuda") else MI300
    first, second = tmp_path / "first.msgpack", tmp_path / "second.msgpack"
    import_file(name, first, namespace)
    before = entries(first, namespace)
    exported = tmp_path / "exported.csv"
    code, text = run("cache", "export", "--format", "tunableop", "-o", str(exported), "--cache", str(first))
    assert code == 0, text
    assert f"wrote {len(before)} rows" in text
    assert "skipped" not in text
    assert "validators stored by the import" in text
    code, text = run(
        "cache", "import", "tunableop", str(exported), "--cache", str(second), "--namespace", namespace
    )
    assert code == 0 and "skipped" not in text, text
    after = entries(second, namespace)
    assert {k: r.to_dict() for k, r in after.items()} == {k: r.to_dict() for k, r in before.items()}
    # The validator set is written back as read (torch compares it key by key).
    original = to.parse(DATA / name).validators
    assert to.parse(exported).validators == original


def test_export_writes_the_format_of_the_validators_torch(tmp_path: Path) -> None:
    cache = tmp_path / "c.msgpack"
    import_file("rocm_2.3_no_ld.csv", cache)
    out = tmp_path / "old.csv"
    assert run("cache", "export", "--format", "tunableop", "-o", str(out), "--cache", str(cache))[0] == 0
    text = out.read_text()
    assert "GemmTunableOp_float_NT,nt_25088_4096_64,Gemm_Hipblaslt_NT_1219,1.262\n" in text
    assert "_ld_" not in text
    cache2 = tmp_path / "c2.msgpack"
    import_file("rocm_2.7_ld.csv", cache2)
    out2 = tmp_path / "new.csv"
    assert run("cache", "export", "--format", "tunableop", "-o", str(out2), "--cache", str(cache2))[0] == 0
    assert "GemmTunableOp_BFloat16_TN,tn_8192_2_3584_ld_3584_3584_8192,Gemm_Hipblaslt_61169,0.0171694\n" in (
        out2.read_text()
    )


def _harness_record(problem: Problem, winner: str, seconds: float = 2e-5) -> TuningRecord:
    return TuningRecord(
        problem=problem.key,
        winner=winner,
        winner_s=seconds,
        default_s=3e-5,
        versions={
            "torch": "2.7.0+rocm6.3",
            "hip": "6.3.42131-fa1d09cbd",
            "rocblas": "4.3.0.ef408db7-dirty",
            "hipblaslt": "900-0c1a3dfa",
        },
        tuned_at=1.0,
    )


def test_export_skips_what_tunableop_cannot_name_and_says_why(tmp_path: Path) -> None:
    cache = tmp_path / "c.msgpack"
    store = open_store(cache)
    plain = Problem(m=64, n=128, k=256, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16")
    cases = {
        plain: "hipblaslt/gemm?index=77",
        Problem(m=64, n=128, k=32, dtype_a="f16", dtype_b="f16", dtype_c="f16"): "rocblas/solution?index=9",
        Problem(m=8, n=8, k=8): "default/default",
        Problem(m=16, n=16, k=16): "cublaslt/heuristic?algo=3",
        Problem(m=32, n=16, k=16): "onednn/brg:avx512_core",
        Problem(m=48, n=16, k=16, beta_zero=False): "default/default",
        Problem(m=64, n=16, k=16, epilogue="relu"): "default/default",
        Problem(m=80, n=16, k=16, align=8): "default/default",
        Problem(m=96, n=16, k=16): "hipblaslt/pad?index=3",
    }
    for problem, winner in cases.items():
        store.put(MI300, problem.key, _harness_record(problem, winner))
    out = tmp_path / "out.csv"
    code, text = run("cache", "export", "--format", "tunableop", "-o", str(out), "--cache", str(cache))
    assert code == 0, text
    assert "wrote 3 rows" in text and "skipped 6 entries" in text
    assert "1 x hipblaslt/pad winners have no TunableOp solution name" in text  # padded copies
    assert "1 x cublaslt winners have no TunableOp solution name" in text
    assert "1 x onednn winners have no TunableOp solution name" in text
    assert "beta != 0" in text and "epilogue 'relu'" in text and "8-byte aligned" in text
    assert "synthesized from the entries' versions" in text
    parsed = to.parse(out)
    assert dict(parsed.validators) == {
        "PT_VERSION": "2.7.0",
        "ROCM_VERSION": "6.3.42131-fa1d09cbd",
        "GCN_ARCH_NAME": "gfx942:sramecc+:xnack-",
        "ROCBLAS_VERSION": "4.3.0.ef408db7-dirty",
        "HIPBLASLT_VERSION": "900-0c1a3dfa",
    }
    rows = {g.solution.name: g for g in parsed.gemms if g.solution is not None}
    assert set(rows) == {"Gemm_Hipblaslt_77", "Gemm_Rocblas_9", "Default"}
    # Row-major 64x128x256 is BLAS 128x64x256 with our B as BLAS's A.
    assert rows["Gemm_Hipblaslt_77"].params == "nn_128_64_256_ld_128_256_128"
    assert rows["Gemm_Hipblaslt_77"].op_name == "GemmTunableOp_BFloat16_NN"
    assert rows["Gemm_Hipblaslt_77"].time_ms == pytest.approx(0.02)
    assert tio.problem_of(rows["Gemm_Hipblaslt_77"]) == plain


def test_synthesized_validators_follow_the_torch_version() -> None:
    problem = Problem(m=8, n=8, k=8)
    record = _harness_record(problem, "default/default")
    record.versions["torch"] = "2.10.0+rocm6.3"
    validators = tio.synthesized_validators(MI300, [record])
    assert validators["HIP_VERSION"] == "603" and "ROCM_VERSION" not in validators
    assert validators["PT_VERSION"] == "2.10.0"
    cuda = TuningRecord(problem=problem.key, winner="default/default", winner_s=1e-5, default_s=1e-5,
                        versions={"torch": "2.11.0+cu130", "cuda": "13.0"})  # fmt: skip
    assert tio.synthesized_validators(H200, [cuda]) == {"PT_VERSION": "2.11.0"}
    with pytest.raises(ValueError, match="PT_VERSION"):
        tio.synthesized_validators(
            MI300, [TuningRecord(problem=problem.key, winner="x/y", winner_s=1, default_s=1)]
        )


def test_live_torch_validators_win_when_complete(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    mi300 = Platform("amd", "gfx942:sramecc+:xnack-", "AMD Instinct MI300X", 304, array="torch")
    record = _harness_record(Problem(m=8, n=8, k=8), "default/default")
    live = (("PT_VERSION", "2.9.1"), ("HIP_VERSION", "603"), ("GCN_ARCH_NAME", "gfx942:sramecc+:xnack-"),
            ("ROCBLAS_VERSION", "4.3.0.ef408db7-dirty"), ("HIPBLASLT_VERSION", "1000-a6254b89-dirty"))  # fmt: skip
    # This CPU torch has no TunableOp binding: stand in for a ROCm build's answer.
    monkeypatch.setattr(torch.cuda.tunable, "get_validators", lambda: live)
    validators, source = tio.choose_validators(MI300, [record], mi300)
    assert validators == dict(live) and "get_validators" in source
    # Another namespace than the GPU's: the live set says nothing about it.
    _, source = tio.choose_validators(H200, [record], mi300)
    assert "synthesized" in source
    # torch 2.3-2.6 before any TunableOp GEMM ran: only PT_VERSION is registered.
    monkeypatch.setattr(torch.cuda.tunable, "get_validators", lambda: (("PT_VERSION", "2.5.0"),))
    _, source = tio.choose_validators(MI300, [record], mi300)
    assert "synthesized" in source


def test_export_needs_one_namespace(tmp_path: Path) -> None:
    cache = tmp_path / "c.msgpack"
    import_file("rocm_2.7_ld.csv", cache)
    import_file("cuda_2.6.csv", cache, H200)
    code, _ = run(
        "cache", "export", "--format", "tunableop", "-o", str(tmp_path / "x.csv"), "--cache", str(cache)
    )
    assert code == 2 and not (tmp_path / "x.csv").exists()
    code, text = run("cache", "export", "--format", "tunableop", "-o", str(tmp_path / "x.csv"), "--cache", str(cache), "--namespace", H200)  # fmt: skip
    assert code == 0 and "wrote 3 rows" in text
    assert dict(to.parse(tmp_path / "x.csv").validators) == {"PT_VERSION": "2.6.0+cu124"}


def test_missing_or_unreadable_file_exits_3(tmp_path: Path) -> None:
    code, _ = run("cache", "import", "tunableop", str(tmp_path / "nope.csv"), "--cache", str(tmp_path / "c"), "--namespace", MI300)  # fmt: skip
    assert code == 3
    (tmp_path / "junk.csv").write_text("hello\nworld\n")
    code, _ = run("cache", "import", "tunableop", str(tmp_path / "junk.csv"), "--cache", str(tmp_path / "c"), "--namespace", MI300)  # fmt: skip
    assert code == 3


def test_times_round_trip_exactly() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        ms = float(f"{rng.uniform(1e-4, 50):.{rng.randint(3, 9)}g}")
        seconds = ms / 1e3
        written = tio.time_text(seconds)
        assert written is not None
        assert float(to.format_time(written)) / 1e3 == seconds
    assert tio.time_text(math.inf) is None


# --------------------------------------------------------------------------- ScaledGemm (fp8)

# Rows in the forms torch writes them (GemmCommon.h ScaledGemmParams::Signature, the op name
# from ScaledBlas.cpp TUNABLE_DISPATCH's template arguments: mat1, mat2, out). The first is
# the row of quark's TunableOp test; the others vary output, bias and scaling.
SCALED_ROWS = """Validator,PT_VERSION,2.9.1
Validator,HIP_VERSION,603
Validator,GCN_ARCH_NAME,gfx942:sramecc+:xnack-
Validator,ROCBLAS_VERSION,4.3.0.ef408db7-dirty
Validator,HIPBLASLT_VERSION,1000-a6254b89-dirty
ScaledGemmTunableOp_Float8_e4m3fnuz_Float8_e4m3fnuz_BFloat16_TN,tn_64_12288_2048_ld_2048_2048_64_rw_1_bias_None,Gemm_Hipblaslt_30410,0.0412
ScaledGemmTunableOp_Float8_e4m3fnuz_Float8_e4m3fnuz_BFloat16_TN,tn_4096_16_4096_ld_4096_4096_4096_rw_0_bias_BFloat16,Gemm_Hipblaslt_771,0.0093
ScaledGemmTunableOp_Float8_e5m2fnuz_Float8_e4m3fnuz_float_TN,tn_14336_1_4096_ld_4096_4096_14336_rw_1_bias_None,Default,0.0311
ScaledGemmTunableOp_Float8_e4m3fnuz_Float8_e4m3fnuz_Float8_e4m3fnuz_TN,tn_4096_16_4096_ld_4096_4096_4096_rw_0_bias_None,Default,0.0101
"""


def test_scaled_gemm_rows_import_as_scaled_problems_and_export_byte_identical(tmp_path: Path) -> None:
    source = tmp_path / "scaled.csv"
    source.write_text(SCALED_ROWS)
    cache = tmp_path / "c.msgpack"
    code, text = run("cache", "import", "tunableop", str(source), "--cache", str(cache), "--namespace", MI300)
    assert code == 0, text
    # The fp8 output (line 9) has no scaled Problem: reported by its line, the rest imported.
    assert "imported 3 entries" in text and "line 9" in text and "fp8 output" in text
    got = entries(cache, MI300)
    problems = {Problem.from_key(k): r for k, r in got.items()}
    assert all(p.is_scaled and not p.fast_accum for p in problems)
    bias = next(p for p in problems if p.has_bias)
    # tn_4096_16_4096: x[16, 4096] @ w.t() with w[4096, 4096], a bf16 bias, per-tensor scales.
    assert (bias.m, bias.n, bias.k, bias.scale_a, bias.dtype_bias) == (16, 4096, 4096, "tensor", "bf16")
    assert problems[bias].winner == "hipblaslt/gemm?index=771"
    mixed = next(p for p in problems if p.dtype_c == "f32")
    assert (mixed.dtype_a, mixed.dtype_b, mixed.m, mixed.scale_a) == (
        "f8e5m2fnuz",
        "f8e4m3fnuz",
        1,
        "rowwise",
    )
    out = tmp_path / "exported.csv"
    code, text = run("cache", "export", "--format", "tunableop", "-o", str(out), "--cache", str(cache))
    assert code == 0 and "skipped" not in text, text
    lines = out.read_text().splitlines()
    for line in SCALED_ROWS.splitlines()[:-1]:
        assert line in lines, line  # every importable row written back as torch wrote it


def test_scaled_entries_tunableop_cannot_say_are_skipped_with_the_reason() -> None:
    from unimatmul.core.scales import scaled_problem

    winner = DEFAULT
    fast = scaled_problem(16, 4096, 4096, fast_accum=True)
    with pytest.raises(tio.RowSkipped, match="use_fast_accum"):
        tio.gemm_of(fast, winner, legacy=False, time_ms=0.01)
    rowwise = scaled_problem(16, 4096, 4096, scales="rowwise")
    with pytest.raises(tio.RowSkipped, match="no _rw_/_bias_"):
        tio.gemm_of(rowwise, winner, legacy=True, time_ms=0.01)
    # Per-tensor without a bias is all the 2.3-2.6 format can say: written as tn_M_N_K.
    old = tio.gemm_of(scaled_problem(16, 4096, 2048), winner, legacy=True, time_ms=0.01)
    assert (old.op_name, old.params) == (
        "ScaledGemmTunableOp_Float8_e4m3fn_Float8_e4m3fn_BFloat16_TN",
        "tn_4096_16_2048",
    )
    assert tio.problem_of(old) == scaled_problem(16, 4096, 2048)
