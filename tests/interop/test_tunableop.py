"""Tests for unimatmul.interop.tunableop.

The sample files in ``data/`` were written for these tests after the formats in
pytorch/pytorch (see the module docstring for the sources):

* ``rocm_2.3_no_ld.csv``: 2.3/2.4 layout, params ``nt_M_N_K`` (GemmCommon.h at commit
  ce52423a), ``Gemm_Hipblaslt_<AB>_<idx>`` names (GemmHipblaslt.h before PR #147900),
  header-version validators (TunableGemm.h at 01ef48ec), values from the README example.
* ``rocm_2.5_runtime_hipblaslt.csv``: the 4 GEMM rows and validators are the file quoted
  in PR #131078 (PT_VERSION 2.5.0, runtime hipBLASLt version); GemmAndBias and the
  pre-2.7 ScaledGemm row (PR #123987 layout) were added.
* ``rocm_2.7_ld.csv``: ``_ld_`` params (PR #146358), ``Gemm_Hipblaslt_<idx>`` (PR
  #147900), ScaledGemm ``_rw_<r>_bias_<T>`` (PR #146227); the ScaledGemm rw_1 row is the
  one in quark's TunableOp test, the GemmAndBias row the one seeded in a torch test.
* ``rocm_2.9_hip_version.csv``: HIP_VERSION validator set as written by 2.9/2.10 builds
  (Tunable.cpp validator constructor), ``tf32`` op name (TunableGemm.h TypeName), a
  ``BLAS_PARAMS`` tail (``PYTORCH_TUNABLEOP_BLAS_LOG=1``, GemmCommon.h BLASSignature),
  a negative rocBLAS index and an ``inf`` time (no candidate finished).
* ``cuda_2.6.csv``: a CUDA build: only PT_VERSION, only ``Default``.
* ``cuda_main_cublaslt.csv``: unreleased main: ``Gemm_Cublaslt_id_...`` (GemmCublaslt.h
  CublasltAlgoConfigName) and a ``*`` dynamic dimension (Tunable.h DynamicDimsMask).
* ``readme_initial_bare_int.csv``: the initial README example (bare integer solutions)
  plus rows without a time, which every Tunable.cpp ReadFile accepts.
* ``broken_rows.csv``: one bad row per failure mode, two good rows.
* ``untuned.csv``: ``tunableop_untuned%d.csv`` (Tunable.cpp RecordUntuned).
"""

from __future__ import annotations

import importlib.util
import io
import math
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
_DATA = Path(__file__).resolve().parent / "data"


def _load():
    name = "unimatmul_interop_tunableop_under_test"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _ROOT / "unimatmul" / "interop" / "tunableop.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


to = _load()

RESULT_FILES = sorted(p.name for p in _DATA.glob("*.csv") if p.name not in {"untuned.csv"})


# --------------------------------------------------------------------------- every format


def test_rocm_23_without_leading_dimensions() -> None:
    f = to.parse(_DATA / "rocm_2.3_no_ld.csv")
    assert f.errors == []
    assert list(f.validators) == [
        "PT_VERSION",
        "ROCM_VERSION",
        "HIPBLASLT_VERSION",
        "ROCBLAS_VERSION",
        "GCN_ARCH_NAME",
    ]
    assert f.validators.pt_version == "2.3.0"
    assert f.validators.backend == "rocm"
    assert len(f.gemms) == 5
    g = f.gemms[0]
    assert (g.kind, g.dtype_a, g.transa, g.transb, g.m, g.n, g.k) == (
        "gemm",
        "float32",
        "n",
        "t",
        25088,
        4096,
        64,
    )
    assert (g.lda, g.ldb, g.ldc, g.batch) == (None, None, None, None)
    assert (g.solution.source, g.solution.index, g.solution.layout) == ("hipblaslt", 1219, "NT")
    assert g.time_ms == pytest.approx(1.262)
    assert g.line_no == 6
    assert f.gemms[1].solution.source == "rocblas"
    assert f.gemms[2].solution.source == "default"
    sb = f.gemms[3]
    assert (sb.kind, sb.dtype_a, sb.batch, sb.lda) == ("gemm_strided_batched", "float16", 96, None)
    assert f.gemms[4].dtype_a == "complex64"


def test_rocm_25_gemm_bias_and_old_scaled_gemm() -> None:
    f = to.parse(_DATA / "rocm_2.5_runtime_hipblaslt.csv")
    assert f.errors == []
    assert f.validators["HIPBLASLT_VERSION"] == "800-bf2c3184"
    kinds = [g.kind for g in f.gemms]
    assert kinds == ["gemm"] * 4 + ["gemm_bias", "scaled_gemm"]
    sg = f.gemms[-1]
    assert (sg.dtype_a, sg.dtype_b, sg.dtype_c) == (
        "float8_e4m3fnuz",
        "float8_e4m3fnuz",
        "bfloat16",
    )
    assert (sg.lda, sg.rowwise, sg.bias_dtype) == (None, None, None)
    assert sg.solution.index == 30410


def test_rocm_27_leading_dimensions_and_scaled_suffix() -> None:
    f = to.parse(_DATA / "rocm_2.7_ld.csv")
    assert f.errors == []
    g = f.gemms[0]
    assert (g.m, g.n, g.k, g.lda, g.ldb, g.ldc) == (8192, 2, 3584, 3584, 3584, 8192)
    assert (g.solution.source, g.solution.index, g.solution.layout) == ("hipblaslt", 61169, None)
    assert f.gemms[2].lda == 1040  # a sub-matrix: ld larger than the tight one
    sb = f.gemms[4]
    assert (sb.kind, sb.batch, sb.lda, sb.ldb, sb.ldc) == ("gemm_strided_batched", 16, 64, 128, 64)
    rw1, rw0 = f.gemms[5], f.gemms[6]
    assert (rw1.rowwise, rw1.bias_dtype) == (True, None)
    assert (rw0.rowwise, rw0.bias_dtype) == (False, "float16")
    assert (rw0.dtype_a, rw0.dtype_b, rw0.dtype_c) == (
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float16",
    )


def test_rocm_29_hip_version_tf32_blas_params_negative_index() -> None:
    f = to.parse(_DATA / "rocm_2.9_hip_version.csv")
    assert f.errors == []
    assert "HIP_VERSION" in f.validators
    assert "ROCM_VERSION" not in f.validators
    assert f.gemms[0].solution.index == 621284994
    tf32 = f.gemms[1]
    assert (tf32.dtype_a, tf32.tf32, tf32.op_name) == ("float32", True, "GemmTunableOp_tf32_NN")
    neg = f.gemms[2].solution
    assert (neg.source, neg.index) == ("rocblas", -7)
    assert math.isinf(f.gemms[3].time_ms)
    sb = f.gemms[4]
    assert sb.extra.startswith("BLAS_PARAMS: - { function: matmul, M: 128")
    assert (sb.stride_a, sb.stride_b, sb.stride_c) == (8192, 8192, 16384)
    assert sb.time_ms == pytest.approx(0.0088)


def test_cuda_validator_set_and_default_only() -> None:
    f = to.parse(_DATA / "cuda_2.6.csv")
    assert f.errors == []
    assert dict(f.validators) == {"PT_VERSION": "2.6.0+cu124"}
    assert f.validators.backend == "cuda"
    assert {g.solution.source for g in f.gemms} == {"default"}
    assert f.gemms[2].batch == 32


def test_cuda_cublaslt_names_and_wildcard_dimension() -> None:
    f = to.parse(_DATA / "cuda_main_cublaslt.csv")
    assert f.errors == []
    sol = f.gemms[0].solution
    assert (sol.source, sol.index) == ("cublaslt", 66)
    wild = f.gemms[1]
    assert wild.n == to.WILDCARD
    assert wild.params == "tn_4096_*_4096_ld_4096_4096_4096"
    assert wild.row_major().m == to.WILDCARD


def test_bare_integer_solutions_and_rows_without_time() -> None:
    f = to.parse(_DATA / "readme_initial_bare_int.csv")
    assert f.errors == []
    assert [(g.solution.source, g.solution.index) for g in f.gemms[:2]] == [
        ("bare", 1219),
        ("bare", 1216),
    ]
    assert [g.time_ms for g in f.gemms[2:]] == [None, None]
    assert [r.time_ms for r in f.rows[2:]] == [None, None]


@pytest.mark.parametrize(
    ("name", "source", "index", "layout"),
    [
        ("Default", "default", None, None),
        ("Gemm_Rocblas_1216", "rocblas", 1216, None),
        ("Gemm_Rocblas_-3", "rocblas", -3, None),
        ("Gemm_Hipblaslt_61169", "hipblaslt", 61169, None),
        ("Gemm_Hipblaslt_-2", "hipblaslt", -2, None),
        ("Gemm_Hipblaslt_TN_572", "hipblaslt", 572, "TN"),
        ("Gemm_Cublaslt_NT_3", "cublaslt", 3, "NT"),
        ("Gemm_Cublaslt_N_T_3", "cublaslt", 3, "N_T"),
        (
            "Gemm_Cublaslt_id_21_tile_20_stages_8_splitk_1_red_0_swizzle_0_custom_0",
            "cublaslt",
            21,
            None,
        ),
        ("1219", "bare", 1219, None),
        ("Gemm_Future_7", "unknown", None, None),
    ],
)
def test_solution_names(name: str, source: str, index: int | None, layout: str | None) -> None:
    sol = to.TunableOpSolution(name)
    assert (sol.name, sol.source, sol.index, sol.layout) == (name, source, index, layout)


def test_solution_constructors_write_newest_names() -> None:
    assert to.TunableOpSolution.default().name == "Default"
    assert to.TunableOpSolution.rocblas(-4).name == "Gemm_Rocblas_-4"
    assert to.TunableOpSolution.hipblaslt(9).name == "Gemm_Hipblaslt_9"
    assert to.TunableOpSolution.hipblaslt(9, "TN").name == "Gemm_Hipblaslt_TN_9"


# --------------------------------------------------------------------------- row-major swap


def test_row_major_swap_for_linear() -> None:
    # x[2, 3584] @ W.T, W[8192, 3584] row-major: torch records C^T = W x^T, i.e. BLAS
    # m = 8192 (our n), n = 2 (our m), transa = 't' (it is W, our B, that is transposed).
    f = to.parse(_DATA / "rocm_2.7_ld.csv")
    g = f.gemms[0]
    assert g.op_name == "GemmTunableOp_BFloat16_TN"
    rm = g.row_major()
    assert (rm.m, rm.n, rm.k) == (2, 8192, 3584)
    assert (rm.trans_a, rm.trans_b) == (False, True)
    # A = x row-major: stride along m is k. B = W.T column-major: stride along n is k.
    assert (rm.lda, rm.ldb, rm.ldc) == (3584, 3584, 8192)


def test_row_major_swap_with_submatrix_and_batch() -> None:
    f = to.parse(_DATA / "rocm_2.7_ld.csv")
    sub = f.gemms[2].row_major()  # nt_1024_512_256_ld_1040_520_1024
    assert (sub.m, sub.n, sub.k, sub.trans_a, sub.trans_b) == (512, 1024, 256, True, False)
    assert (sub.lda, sub.ldb, sub.ldc) == (520, 1040, 1024)
    sb = to.parse(_DATA / "rocm_2.9_hip_version.csv").gemms[4]
    rm = sb.row_major()
    assert (rm.batch, rm.stride_a, rm.stride_b, rm.stride_c) == (8, 8192, 8192, 16384)


def test_scaled_gemm_dtypes_are_not_swapped() -> None:
    # Blas.cpp TUNABLE_DISPATCH: ScaledGemmTunableOp<mat1 dtype, mat2 dtype, out dtype>.
    g = to.parse(_DATA / "rocm_2.7_ld.csv").gemms[6]
    rm = g.row_major()
    assert (rm.dtype_a, rm.dtype_b, rm.dtype_c) == ("float8_e4m3fnuz", "float8_e5m2fnuz", "float16")
    assert (rm.rowwise, rm.bias_dtype) == (False, "float16")


def test_from_row_major_is_the_inverse() -> None:
    rm = to.RowMajorGemm(kind="gemm", m=2, n=8192, k=3584, trans_b=True, dtype_a="bfloat16")
    g = to.TunableOpGemm.from_row_major(rm, solution="Gemm_Hipblaslt_61169", time_ms=0.0171694)
    # Same text torch's own offline tuner would reparse as [n, m, k] = [8192, 2, 3584].
    assert g.op_name == "GemmTunableOp_BFloat16_TN"
    assert g.params == "tn_8192_2_3584_ld_3584_3584_8192"
    assert g.row_major() == to.RowMajorGemm(
        kind="gemm",
        m=2,
        n=8192,
        k=3584,
        trans_b=True,
        lda=3584,
        ldb=3584,
        ldc=8192,
        dtype_a="bfloat16",
    )
    old = to.TunableOpGemm.from_row_major(rm, with_ld=False)
    assert old.params == "tn_8192_2_3584"
    parsed = to.parse(_DATA / "rocm_2.7_ld.csv").gemms[0]
    assert g == parsed


@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_tight_leading_dimensions_follow_the_layout(trans_a: bool, trans_b: bool) -> None:
    rm = to.RowMajorGemm(kind="gemm", m=6, n=10, k=4, trans_a=trans_a, trans_b=trans_b)
    g = to.TunableOpGemm.from_row_major(rm)
    back = g.row_major()
    assert back.lda == (6 if trans_a else 4)
    assert back.ldb == (4 if trans_b else 10)
    assert back.ldc == 10
    assert g.op_name.endswith(("T" if trans_b else "N") + ("T" if trans_a else "N"))


# --------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name", RESULT_FILES)
def test_params_and_op_name_rebuild_exactly(name: str) -> None:
    f = to.parse(_DATA / name)
    by_line = {r.line_no: r for r in f.rows}
    for g in f.gemms:
        row = by_line[g.line_no]
        assert to.build_op_name(g) == row.op_name
        assert to.build_params(g) == row.params
        assert g.solution.name == row.solution


@pytest.mark.parametrize("name", RESULT_FILES)
def test_parse_write_parse_is_identity(name: str, tmp_path: Path) -> None:
    first = to.parse(_DATA / name)
    out = tmp_path / "tunableop_results0.csv"
    to.write(out, first.validators, first.gemms)
    second = to.parse(out)
    assert second.errors == []
    assert list(second.validators.items()) == list(first.validators.items())
    assert second.gemms == first.gemms
    # Written once more, the text is byte-identical.
    assert to.dumps(second.validators, second.gemms) == out.read_text()


@pytest.mark.parametrize("name", [n for n in RESULT_FILES if n != "broken_rows.csv"])
def test_clean_files_are_written_back_byte_for_byte(name: str) -> None:
    text = (_DATA / name).read_text()
    f = to.parse(text)
    assert to.dumps(f.validators, f.gemms) == text
    assert to.dumps(f.validators, f.rows) == text


def test_time_is_written_like_torch() -> None:
    assert to.format_time(0.0103395) == "0.0103395"
    assert to.format_time(1.262) == "1.262"
    assert to.format_time(1e-05) == "1e-05"
    assert to.format_time(float("inf")) == "inf"
    assert float(to.format_time(1 / 3)) == 1 / 3  # more than 6 digits: keep them all


# --------------------------------------------------------------------------- broken input


def test_broken_rows_are_reported_with_line_numbers_and_the_rest_kept() -> None:
    f = to.parse(_DATA / "broken_rows.csv")
    assert [e.line_no for e in f.errors] == [2, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16, 17]
    assert [g.line_no for g in f.gemms] == [3, 14]
    assert dict(f.validators) == {"PT_VERSION": "2.7.0"}
    reasons = {e.line_no: e.reason for e in f.errors}
    assert "untuned" in reasons[5]
    assert "not a number" in reasons[6]
    assert "layout" in reasons[7]
    assert "dtype" in reasons[8]
    assert "unknown op name" in reasons[9]
    assert "params" in reasons[10]
    assert "_B_" in reasons[11]
    assert "empty solution" in reasons[16]
    assert "ScaledGemm" in reasons[17]
    assert f.errors[-1].line == "GemmTunableOp_Half_TN,tn_64_64_64_rw_1_bias_None,Default,0.01"


def test_crlf_trailing_comma_and_first_duplicate_wins() -> None:
    text = (
        "Validator,PT_VERSION,2.7.0\r\n"
        "GemmTunableOp_Half_NN,nn_8_8_8_ld_8_8_8,Gemm_Rocblas_1,0.5,\r\n"
        "GemmTunableOp_Half_NN,nn_8_8_8_ld_8_8_8,Gemm_Rocblas_2,0.4\r\n"
    )
    f = to.parse(text)
    assert f.errors == []
    assert [g.solution.index for g in f.gemms] == [1, 2]
    found = f.lookup("GemmTunableOp_Half_NN", "nn_8_8_8_ld_8_8_8")
    assert found is not None
    assert found.solution.index == 1


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "a,b,c\n1,2,3\n",
        "m,n,k,time\n64,64,64,0.1\n",
    ],
)
def test_not_a_tunableop_file_raises(text: str) -> None:
    with pytest.raises(ValueError, match="not a TunableOp results file"):
        to.parse(text)


def test_untuned_file_given_to_parse_says_so() -> None:
    with pytest.raises(ValueError, match=r"an untuned file\? `unimatmul tune --from FILE`"):
        to.parse(_DATA / "untuned.csv")


# --------------------------------------------------------------------------- untuned file


def test_untuned_file() -> None:
    f = to.parse_untuned(_DATA / "untuned.csv")
    assert f.errors == []
    assert len(f.validators) == 0
    assert [g.kind for g in f.gemms] == ["gemm", "scaled_gemm", "gemm_bias"]
    assert all(g.solution is None and g.time_ms is None for g in f.gemms)
    sg = f.gemms[1]
    assert (sg.dtype_a, sg.dtype_c, sg.rowwise) == ("float8_e4m3fn", "bfloat16", True)
    assert f.gemms[2].extra.startswith("BLAS_PARAMS:")
    text = (_DATA / "untuned.csv").read_text()
    assert to.dumps_untuned(f.gemms) == text
    buf = io.StringIO()
    to.write_untuned(buf, f.rows)
    assert buf.getvalue() == text


def test_results_file_given_to_parse_untuned_reports_rows() -> None:
    f = to.parse_untuned(_DATA / "cuda_2.6.csv")
    assert f.gemms == []
    assert [e.line_no for e in f.errors] == [2, 3, 4]


# --------------------------------------------------------------------------- writing


def test_write_to_a_file_object_and_validator_order() -> None:
    validators = to.TunableOpValidators.rocm(
        "2.9.1",
        hip_version="603",
        gcn_arch_name="gfx942:sramecc+:xnack-",
        rocblas_version="4.3.0.ef408db7-dirty",
        hipblaslt_version="1000-a6254b89-dirty",
    )
    assert list(validators) == [
        "PT_VERSION",
        "HIP_VERSION",
        "GCN_ARCH_NAME",
        "ROCBLAS_VERSION",
        "HIPBLASLT_VERSION",
    ]
    rm = to.RowMajorGemm(kind="gemm", m=16, n=1024, k=4096, trans_b=True, dtype_a="float16")
    g = to.TunableOpGemm.from_row_major(rm, solution=to.TunableOpSolution.rocblas(7), time_ms=0.01)
    buf = io.StringIO()
    to.write(buf, validators, [g])
    assert buf.getvalue().splitlines() == [
        "Validator,PT_VERSION,2.9.1",
        "Validator,HIP_VERSION,603",
        "Validator,GCN_ARCH_NAME,gfx942:sramecc+:xnack-",
        "Validator,ROCBLAS_VERSION,4.3.0.ef408db7-dirty",
        "Validator,HIPBLASLT_VERSION,1000-a6254b89-dirty",
        "GemmTunableOp_Half_TN,tn_1024_16_4096_ld_4096_4096_1024,Gemm_Rocblas_7,0.01",
    ]
    shuffled = to.TunableOpValidators(dict(reversed(list(validators.items()))))
    assert shuffled == validators
    assert list(shuffled.in_registration_order()) == list(validators)
    assert to.TunableOpValidators.cuda("2.6.0").backend == "cuda"


def test_write_refuses_what_torch_would_misread() -> None:
    g = to.parse(_DATA / "cuda_2.6.csv").gemms[0]
    with pytest.raises(ValueError, match="PT_VERSION"):
        to.dumps({"ROCM_VERSION": "6"}, [g])
    with pytest.raises(ValueError, match="commas"):
        to.dumps({"PT_VERSION": "2,6"}, [g])
    unsolved = to.parse_untuned(_DATA / "untuned.csv").gemms[0]
    with pytest.raises(ValueError, match="no solution"):
        to.dumps({"PT_VERSION": "2.6.0"}, [unsolved])


def test_invalid_neutral_forms_are_rejected() -> None:
    with pytest.raises(ValueError, match="batch"):
        to.TunableOpGemm(
            kind="gemm_strided_batched", dtype_a="float16", transa="n", transb="n", m=1, n=1, k=1
        )
    with pytest.raises(ValueError, match="lda, ldb, ldc"):
        to.TunableOpGemm(kind="gemm", dtype_a="float16", transa="n", transb="n", m=1, n=1, k=1, lda=1)
    with pytest.raises(ValueError, match="dtype"):
        to.TunableOpGemm(kind="gemm", dtype_a="int4", transa="n", transb="n", m=1, n=1, k=1)
    with pytest.raises(ValueError, match="rowwise"):
        to.TunableOpGemm(kind="gemm", dtype_a="float16", transa="n", transb="n", m=1, n=1, k=1, rowwise=True)


# --------------------------------------------------------------------------- file names


def test_file_names_follow_torch() -> None:
    assert to.results_filename(0) == "tunableop_results0.csv"
    assert to.results_filename(3, "out/tune_%d_gfx942.csv") == "out/tune_3_gfx942.csv"
    assert to.results_filename(1, "results") == "results1"
    assert to.untuned_filename(2) == "tunableop_untuned2.csv"
    assert to.untuned_filename(2, "u_%d.csv") == "u_%d2.csv"
    with pytest.raises(ValueError, match="ordinal"):
        to.results_filename(-1)


def test_sources_path_text_and_file_object() -> None:
    path = _DATA / "cuda_2.6.csv"
    text = path.read_text()
    from_path = to.parse(path)
    from_str_path = to.parse(str(path))
    from_text = to.parse(text)
    with path.open() as handle:
        from_handle = to.parse(handle)
    assert from_path.gemms == from_str_path.gemms == from_text.gemms == from_handle.gemms
    assert from_path.path == str(path)
    assert from_text.path is None
