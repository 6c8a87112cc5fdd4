"""``unimatmul cache import tunableop FILE.csv`` and ``cache export --format tunableop -o FILE.csv``.

The file format itself lives in :mod:`unimatmul.interop.tunableop`; this module maps
its rows to cache entries and back.

Import
------
Every GEMM row becomes one entry (a :class:`~unimatmul.cache.record.TuningRecord` under its
:class:`~unimatmul.core.problem.Problem` key):

* Problem: the row-major view of the row (:meth:`TunableOpGemm.row_major`; TunableOp
  writes the column-major BLAS call, m and n swapped). ``GemmAndBiasTunableOp`` is the
  ``bias`` epilogue, ``GemmStridedBatchedTunableOp`` a batch (batch strides from a
  ``BLAS_PARAMS`` tail, else each matrix's extent, which is what a contiguous tensor
  has). TunableOp's key carries neither beta nor pointer alignment: entries are
  imported as ``beta = 0`` (``torch.mm``, ``F.linear``) and 16-byte alignment. The
  compute type is what torch uses on a GPU: f32 for f16/bf16, ``tf32`` for a ``tf32``
  op name.
* Winner: ``Default`` -> ``default/default``; ``Gemm_Hipblaslt_[AB_]<i>`` ->
  ``hipblaslt/gemm?index=<i>`` (rebuilt by index with ``getAlgosFromIndex`` where the
  backend's extension shim runs); ``Gemm_Rocblas_<i>`` ->
  ``rocblas/solution?index=<i>&source=s:<tensile|hipblaslt>``, the source read from the
  file's ``ROCBLAS_VERSION`` (rocBLAS 5.x numbers Tensile solutions below -10 and
  hipBLASLt ones above 0; :mod:`unimatmul.core.rocblas_indices`); indices -9..0 are
  reserved and skipped. The time (ms) becomes ``winner_s``; a row without a time gets
  ``inf`` (unknown).
* Versions: ``HIPBLASLT_VERSION`` -> ``hipblaslt``, ``ROCBLAS_VERSION`` -> ``rocblas``,
  ``ROCM_VERSION`` -> ``hip``: the keys and text formats the ROCm backends and the
  Platform report (torch >= 2.5 writes the hipBLASLt runtime version as
  ``<int>-<git>``, >= 2.7 the rocBLAS runtime string), so the selector's per-entry
  check re-validates a winner when a library changes. The whole validator set is
  kept in ``settings["validators"]`` so that an export can write it back.
* ``ScaledGemmTunableOp`` rows (fp8 with scales, ``torch._scaled_mm``) become scaled
  Problems (``op == "scaled_gemm"``): the op name's three dtypes are mat1 (our A), mat2
  (our B) and the output, not swapped (``Blas.cpp`` ``TUNABLE_DISPATCH``), while the
  params are swapped like any row. ``_rw_1`` is row-wise scales (both operands:
  ``ScaledGemmParams::Signature`` writes 1 only when both are RowWise), ``_rw_0`` and a
  row without the suffix (torch < 2.7) per-tensor scales: the key cannot tell other
  scalings (block-wise) apart, and those are not scaled Problems here. ``_bias_<T>`` is
  the bias epilogue. TunableOp's key has no ``use_fast_accum`` (hipBLASLt ignores it):
  rows are imported with ``fast_accum = 0``. An fp8 output (which needs
  ``scale_result``) has no Problem here and is skipped.
* Namespace: ``--namespace`` when given; else the namespace of the GPU torch sees
  now, if its gcnArchName equals the file's ``GCN_ARCH_NAME``; else, for a file that
  names no GPU architecture on a machine where torch sees no GPU (``current`` is torch on
  the CPU), this CPU's torch namespace, so that a CPU export reads back as it was. A file
  carries no device name or CU count, so anything else needs ``--namespace``.

Rows that cannot become an entry are reported with their line numbers and skipped:
unreadable lines, ScaledGemm rows with an fp8 output, complex dtypes,
``*`` dimensions, bare integers (library unknown), cuBLASLt names, and a repeated
(op, params), of which torch uses the first. Existing entries are kept unless
``--replace``.

Export
------
The entries of one namespace become rows in the newest format (``_ld_`` params,
``Gemm_Hipblaslt_<i>``), or in the 2.3-2.6 format (no ``_ld_``, ``Gemm_Hipblaslt_<AB>_<i>``)
when the validators name a torch older than 2.7. Only what TunableOp can express is
written: ``Default``, hipBLASLt and rocBLAS winners of beta = 0, 16-byte aligned
plain / bias / strided batched GEMMs with their natural compute type, and scaled GEMMs
with per-tensor or row-wise scales and ``fast_accum = 0`` (``ScaledGemmTunableOp``; in
the 2.3-2.6 format only per-tensor ones without bias, which is all that format says). Winners of
other backends (cuBLASLt, oneDNN, plugins) have no TunableOp solution name; writing
them as ``Default`` would claim torch's default is the tuned choice, so they are
skipped and counted.

Validators, first that applies:

1. ``torch.cuda.tunable.get_validators()`` of the running torch, when the exported
   namespace is the current GPU's and the set is complete (on ROCm 2.3-2.6 the
   ROCm keys appear only after a TunableOp GEMM ran; then this source is passed).
2. The set stored by an import (``settings["validators"]``), the most common one.
3. Synthesized from the records' versions (best effort): ``PT_VERSION`` = the torch
   version without its local suffix; on AMD ``ROCM_VERSION`` (``HIP_VERSION`` =
   ``major*100+minor`` for torch >= 2.9), ``GCN_ARCH_NAME`` from the namespace,
   ``ROCBLAS_VERSION``, ``HIPBLASLT_VERSION``. Torch loads a file only if every
   validator equals its own, so run the export where the file will be used.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from unimatmul.cache.record import OK, CandidateResult, TuningRecord, mark_from_elsewhere
from unimatmul.core._backend import DEFAULT, Candidate
from unimatmul.core.problem import SCALED_OUTPUTS, Problem
from unimatmul.core.rocblas_indices import biased, biased_listing, index_source, legacy_source
from unimatmul.interop.tunableop import (
    WILDCARD,
    RowMajorGemm,
    TunableOpFile,
    TunableOpGemm,
    TunableOpSolution,
    parse_untuned,
)

if TYPE_CHECKING:
    from unimatmul.core.platform import Platform

SOURCE = "pytorch-tunableop"
# Candidate name under which each ROCm backend offers a solution index (backends/rocm:
# hipBLASLt names its Lt-driver candidates "gemm", rocBLAS its solutions "solution").
SOLUTION_NAMES = {"hipblaslt": "gemm", "rocblas": "solution"}

# torch dtype names (tunableop.py) -> ours. fp8 appears only in ScaledGemm rows.
_DTYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}
_TORCH_DTYPES = {v: k for k, v in _DTYPES.items()}
# The fp8 dtypes of ScaledGemm rows (torch names -> ours) and back.
_FP8_DTYPES = {
    "float8_e4m3fn": "f8e4m3",
    "float8_e5m2": "f8e5m2",
    "float8_e4m3fnuz": "f8e4m3fnuz",
    "float8_e5m2fnuz": "f8e5m2fnuz",
}
_TORCH_FP8 = {v: k for k, v in _FP8_DTYPES.items()}
# The compute type torch's GEMM uses on a GPU for each dtype (unimatmul.api too).
_COMPUTE = {"f32": "f32", "f64": "f64", "f16": "f32", "bf16": "f32"}
# validator -> versions key, where torch and our backends write the same text.
_VERSION_KEYS = {"HIPBLASLT_VERSION": "hipblaslt", "ROCBLAS_VERSION": "rocblas", "ROCM_VERSION": "hip"}
_KIND_EPILOGUE = {"gemm": "none", "gemm_bias": "bias", "gemm_strided_batched": "none"}
_LD_FORMAT = (2, 7)  # first torch writing _ld_ params and Gemm_Hipblaslt_<i>
_HIP_VERSION_VALIDATOR = (2, 9)  # torch seen writing HIP_VERSION instead of ROCM_VERSION


class RowSkipped(ValueError):
    """One row or entry that cannot cross between TunableOp and the cache; says why."""


# --------------------------------------------------------------------------- rows -> entries


def problem_of(gemm: TunableOpGemm | RowMajorGemm) -> Problem:
    """The row-major Problem of one TunableOp GEMM (module docstring), or RowSkipped.

    The one conversion from a TunableOp row to a Problem: ``cache import tunableop``
    and ``tune --from`` (the untuned file) both use it, so one row gives one key.
    """
    rm = gemm.row_major() if isinstance(gemm, TunableOpGemm) else gemm
    if rm.kind == "scaled_gemm":
        return _scaled_problem_of(rm)
    if rm.kind not in _KIND_EPILOGUE:
        raise RowSkipped(f"TunableOp {rm.kind} GEMMs have no unimatmul problem kind")
    if WILDCARD in (rm.m, rm.n, rm.k, rm.batch, rm.lda, rm.ldb, rm.ldc):
        raise RowSkipped("a '*' (dynamic) dimension names no single Problem")
    dtypes = [_DTYPES.get(d) for d in (rm.dtype_a, rm.dtype_b, rm.dtype_c)]
    if None in dtypes:
        bad = next(
            d for d, ours in zip((rm.dtype_a, rm.dtype_b, rm.dtype_c), dtypes, strict=True) if ours is None
        )
        raise RowSkipped(f"dtype {bad} is not one unimatmul runs ({', '.join(sorted(_DTYPES))})")
    dtype_a, dtype_b, dtype_c = (d or "" for d in dtypes)
    bias_dtype = None
    if rm.kind == "gemm_bias" and rm.bias_dtype:
        bias_dtype = _DTYPES.get(rm.bias_dtype)
        if bias_dtype is None:
            raise RowSkipped(f"bias dtype {rm.bias_dtype} is not one unimatmul runs")
    batch = rm.batch if rm.batch is not None else 1
    lda = rm.lda or (rm.m if rm.trans_a else rm.k)
    ldb = rm.ldb or (rm.k if rm.trans_b else rm.n)
    ldc = rm.ldc or rm.n
    strides = (0, 0, 0)
    if batch > 1:
        if None not in (rm.stride_a, rm.stride_b, rm.stride_c):
            strides = (int(rm.stride_a or 0), int(rm.stride_b or 0), int(rm.stride_c or 0))
        else:
            strides = _extents(rm.m, rm.n, rm.k, rm.trans_a, rm.trans_b, lda, ldb, ldc)
    try:
        return Problem(
            m=rm.m,
            n=rm.n,
            k=rm.k,
            dtype_a=dtype_a,
            dtype_b=dtype_b,
            dtype_c=dtype_c,
            compute="tf32" if rm.tf32 else _COMPUTE[dtype_a],
            trans_a=rm.trans_a,
            trans_b=rm.trans_b,
            lda=lda,
            ldb=ldb,
            ldc=ldc,
            batch=batch,
            stride_a=strides[0],
            stride_b=strides[1],
            stride_c=strides[2],
            beta_zero=True,
            epilogue=_KIND_EPILOGUE[rm.kind],
            dtype_bias=bias_dtype,
            align=16,
        )
    except ValueError as exc:
        raise RowSkipped(str(exc)) from None


def _scaled_problem_of(rm: RowMajorGemm) -> Problem:
    """The scaled Problem of a ScaledGemm row (module docstring), or RowSkipped."""
    if WILDCARD in (rm.m, rm.n, rm.k, rm.lda, rm.ldb, rm.ldc):
        raise RowSkipped("a '*' (dynamic) dimension names no single Problem")
    for what, dtype in (("mat1", rm.dtype_a), ("mat2", rm.dtype_b)):
        if dtype not in _FP8_DTYPES:
            raise RowSkipped(f"ScaledGemm {what} of {dtype}: a scaled Problem takes fp8 inputs")
    out = _DTYPES.get(rm.dtype_c)
    if out not in SCALED_OUTPUTS:
        raise RowSkipped(
            f"ScaledGemm output {rm.dtype_c}: an fp8 output (with scale_result) is not a scaled "
            f"Problem here ({', '.join(SCALED_OUTPUTS)})"
        )
    bias_dtype = None
    if rm.bias_dtype is not None:
        bias_dtype = _DTYPES.get(rm.bias_dtype)
        if bias_dtype != out:
            raise RowSkipped(f"ScaledGemm bias of {rm.bias_dtype} with a {rm.dtype_c} output")
    scales = "rowwise" if rm.rowwise else "tensor"
    try:
        return Problem(
            m=rm.m,
            n=rm.n,
            k=rm.k,
            dtype_a=_FP8_DTYPES[rm.dtype_a],
            dtype_b=_FP8_DTYPES[rm.dtype_b],
            dtype_c=out,
            compute="f32",
            trans_a=rm.trans_a,
            trans_b=rm.trans_b,
            lda=rm.lda or (rm.m if rm.trans_a else rm.k),
            ldb=rm.ldb or (rm.k if rm.trans_b else rm.n),
            ldc=rm.ldc or rm.n,
            epilogue="bias" if bias_dtype else "none",
            dtype_bias=bias_dtype,
            align=16,
            op="scaled_gemm",
            scale_a=scales,
            scale_b=scales,
        )
    except ValueError as exc:
        raise RowSkipped(str(exc)) from None


@dataclass
class UntunedProblems:
    """The problems of a TunableOp untuned file (with their line numbers), and the lines
    left out (why)."""

    problems: list[tuple[int, Problem]] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)


def untuned_problems(text: str | Iterable[str]) -> UntunedProblems:
    """The problems of PyTorch TunableOp's untuned file (``PYTORCH_TUNABLEOP_RECORD_UNTUNED=1``),
    its text or its lines; ValueError if it is no such file."""
    parsed = parse_untuned(text)
    result = UntunedProblems(skipped=[(e.line_no, e.reason) for e in parsed.errors])
    for gemm in parsed.gemms:
        line = gemm.line_no or 0
        try:
            result.problems.append((line, problem_of(gemm)))
        except RowSkipped as exc:
            result.skipped.append((line, str(exc)))
    return result


def _extents(
    m: int, n: int, k: int, trans_a: bool, trans_b: bool, lda: int, ldb: int, ldc: int
) -> tuple[int, int, int]:
    """Batch strides of contiguous batches: each matrix's extent in elements."""
    return ((k if trans_a else m) * lda, (n if trans_b else k) * ldb, m * ldc)


def candidate_of(solution: TunableOpSolution, rocblas_version: str | None = None) -> Candidate:
    """The Candidate a TunableOp solution name means, or RowSkipped.

    A rocBLAS index names a Tensile or a hipBLASLt solution depending on the rocBLAS that
    listed it (:mod:`unimatmul.core.rocblas_indices`): ``rocblas_version`` (the file's
    ``ROCBLAS_VERSION``) decides, and the candidate records the source. Without a version
    an index below -10 is still Tensile's; a positive one is left as the unbiased numbering
    had it (the backend then refuses it under a rocBLAS that numbers the biased way).
    """
    if solution.source == "default":
        return DEFAULT
    if solution.source == "rocblas" and solution.index is not None:
        index = solution.index
        known = biased(rocblas_version)
        source = index_source(index, known if known is not None else biased_listing(None, [index]))
        if source is None:
            numbering = "numbers solutions from 1" if known is False else "reserves indices -9..0"
            raise RowSkipped(
                f"solution {solution.name!r} names no solution: rocBLAS {rocblas_version or ''} {numbering}"
            )
        if known is None and source == legacy_source(index) and index > 0:
            return Candidate.make("rocblas", SOLUTION_NAMES["rocblas"], index=index)
        return Candidate.make("rocblas", SOLUTION_NAMES["rocblas"], index=index, source=source)
    if solution.source in SOLUTION_NAMES and solution.index is not None:
        return Candidate.make(solution.source, SOLUTION_NAMES[solution.source], index=solution.index)
    if solution.source == "bare":
        raise RowSkipped(f"solution {solution.name!r} is a bare index: the library it belongs to is unknown")
    if solution.source == "cublaslt":
        raise RowSkipped(f"cuBLASLt solution {solution.name!r} is not imported (unreleased torch format)")
    raise RowSkipped(f"unknown solution name {solution.name!r}")


def versions_of(validators: Mapping[str, str]) -> dict[str, str]:
    """The record versions a validator set pins (keys and formats as our backends report)."""
    return {ours: validators[key] for key, ours in _VERSION_KEYS.items() if key in validators}


def record_of(gemm: TunableOpGemm, problem: Problem, validators: Mapping[str, str]) -> TuningRecord:
    """The cache entry of one imported row."""
    assert gemm.solution is not None
    winner = candidate_of(gemm.solution, validators.get("ROCBLAS_VERSION"))
    time_ms = gemm.time_ms
    winner_s = time_ms / 1e3 if time_ms is not None and math.isfinite(time_ms) else math.inf
    note = "imported from PyTorch TunableOp"
    record = TuningRecord(
        problem=problem.key,
        winner=winner.identity,
        winner_s=winner_s,
        default_s=winner_s if winner == DEFAULT else None,
        results=[
            CandidateResult(winner.identity, OK, winner_s if math.isfinite(winner_s) else None, note=note)
        ],
        versions=versions_of(validators),
        settings={"source": SOURCE, "validators": dict(validators)},
        writer=f"{SOURCE} {validators.get('PT_VERSION', '?')}",
    )
    return mark_from_elsewhere(record, "import:tunableop")  # checked on its first call (docs/trust.md)


@dataclass
class ImportResult:
    """What one file gives: entries by Problem key, and every line left out, with why."""

    entries: dict[str, TuningRecord] = field(default_factory=dict)
    skipped: list[tuple[int, str]] = field(default_factory=list)
    rows: int = 0


def entries_of(parsed: TunableOpFile) -> ImportResult:
    """Cache entries for every usable row of a parsed file (first of a repeated key wins)."""
    result = ImportResult(rows=len(parsed.rows))
    result.skipped.extend((e.line_no, e.reason) for e in parsed.errors)
    seen_rows: dict[tuple[str, str], int] = {}
    seen_keys: dict[str, int] = {}
    for gemm in parsed.gemms:
        line = gemm.line_no or 0
        row_key = (gemm.op_name, gemm.params)
        if row_key in seen_rows:
            result.skipped.append((line, f"repeats line {seen_rows[row_key]} (torch uses the first)"))
            continue
        seen_rows[row_key] = line
        try:
            problem = problem_of(gemm)
            assert gemm.solution is not None
            record = record_of(gemm, problem, parsed.validators)
        except RowSkipped as exc:
            result.skipped.append((line, str(exc)))
            continue
        if problem.key in seen_keys:
            result.skipped.append((line, f"same problem as line {seen_keys[problem.key]}"))
            continue
        seen_keys[problem.key] = line
        result.entries[problem.key] = record
    result.skipped.sort()
    return result


# --------------------------------------------------------------------------- entries -> rows


def gemm_of(problem: Problem, winner: Candidate, *, legacy: bool, time_ms: float | None) -> TunableOpGemm:
    """The TunableOp row of one entry, or RowSkipped naming what TunableOp cannot express."""
    if problem.is_scaled:
        return _scaled_gemm_of(problem, winner, legacy=legacy, time_ms=time_ms)
    if problem.is_grouped:
        raise RowSkipped(
            "grouped GEMMs (torch._grouped_mm) have no TunableOp op: TunableOp tunes none of them"
        )
    if problem.op != "gemm" or problem.epilogue not in ("none", "bias"):
        raise RowSkipped(f"epilogue {problem.epilogue!r} has no TunableOp op")
    if not problem.beta_zero:
        raise RowSkipped("beta != 0: TunableOp's key has no beta; only beta = 0 entries are written")
    _check_written_layout(problem, legacy)
    if not problem.dtype_a == problem.dtype_b == problem.dtype_c or problem.dtype_a not in _TORCH_DTYPES:
        raise RowSkipped(
            f"dtypes {problem.dtype_a}/{problem.dtype_b}/{problem.dtype_c} have no TunableOp GEMM"
        )
    tf32 = problem.compute == "tf32" and problem.dtype_a == "f32"
    if not tf32 and problem.compute != _COMPUTE[problem.dtype_a]:
        raise RowSkipped(f"compute {problem.compute} for {problem.dtype_a} is not what torch's GEMM uses")
    if problem.has_bias and (problem.batch > 1 or problem.dtype_bias != problem.dtype_c):
        raise RowSkipped("TunableOp's GemmAndBias is one matrix with a bias of the output's dtype")
    strides = (problem.stride_a, problem.stride_b, problem.stride_c)
    if problem.batch > 1:
        extents = _extents(
            problem.m,
            problem.n,
            problem.k,
            problem.trans_a,
            problem.trans_b,
            problem.lda,
            problem.ldb,
            problem.ldc,
        )
        if strides != extents:
            raise RowSkipped(f"batch strides {strides} are not the matrices' extents {extents}")
    kind = "gemm_bias" if problem.has_bias else ("gemm_strided_batched" if problem.batch > 1 else "gemm")
    view = RowMajorGemm(
        kind=kind,
        m=problem.m,
        n=problem.n,
        k=problem.k,
        trans_a=problem.trans_a,
        trans_b=problem.trans_b,
        lda=problem.lda,
        ldb=problem.ldb,
        ldc=problem.ldc,
        batch=problem.batch if kind == "gemm_strided_batched" else None,
        dtype_a=_TORCH_DTYPES[problem.dtype_a],
        tf32=tf32,
    )
    return _row_of(view, problem, winner, legacy=legacy, time_ms=time_ms)


def _check_written_layout(problem: Problem, legacy: bool) -> None:
    """RowSkipped where TunableOp's params cannot say the layout (alignment, padded lds before 2.7)."""
    if problem.align != 16:
        raise RowSkipped(f"{problem.align}-byte aligned operands: TunableOp's key assumes aligned tensors")
    tight = (
        problem.m if problem.trans_a else problem.k,
        problem.k if problem.trans_b else problem.n,
        problem.n,
    )
    if legacy and (problem.lda, problem.ldb, problem.ldc) != tight:
        raise RowSkipped("padded leading dimensions cannot be written in the torch < 2.7 format (no _ld_)")


def _row_of(
    view: RowMajorGemm, problem: Problem, winner: Candidate, *, legacy: bool, time_ms: float | None
) -> TunableOpGemm:
    layout = ("T" if problem.trans_b else "N") + ("T" if problem.trans_a else "N")  # BLAS view: B first
    return TunableOpGemm.from_row_major(
        view, solution=solution_of(winner, layout, legacy=legacy), time_ms=time_ms, with_ld=not legacy
    )


def _scaled_gemm_of(
    problem: Problem, winner: Candidate, *, legacy: bool, time_ms: float | None
) -> TunableOpGemm:
    """The ScaledGemmTunableOp row of a scaled entry, or RowSkipped."""
    if problem.fast_accum:
        raise RowSkipped(
            "fast_accum = 1: TunableOp's ScaledGemm key has no use_fast_accum; only fast_accum = 0 entries "
            "are written"
        )
    _check_written_layout(problem, legacy)
    if problem.scale_a != problem.scale_b:
        raise RowSkipped(f"scales {problem.scale_a}/{problem.scale_b}: TunableOp's rw flag names one mode")
    rowwise = problem.scale_a == "rowwise"
    if legacy and (rowwise or problem.has_bias):
        raise RowSkipped(
            "row-wise scales or a bias cannot be written in the torch < 2.7 format (no _rw_/_bias_)"
        )
    view = RowMajorGemm(
        kind="scaled_gemm",
        m=problem.m,
        n=problem.n,
        k=problem.k,
        trans_a=problem.trans_a,
        trans_b=problem.trans_b,
        lda=problem.lda,
        ldb=problem.ldb,
        ldc=problem.ldc,
        dtype_a=_TORCH_FP8[problem.dtype_a],
        dtype_b=_TORCH_FP8[problem.dtype_b],
        dtype_c=_TORCH_DTYPES[problem.dtype_c],
        rowwise=None if legacy else rowwise,
        bias_dtype=_TORCH_DTYPES[problem.dtype_bias] if problem.dtype_bias else None,
    )
    return _row_of(view, problem, winner, legacy=legacy, time_ms=time_ms)


def solution_of(winner: Candidate, layout: str, *, legacy: bool) -> TunableOpSolution:
    """TunableOp's name for a winner, or RowSkipped for winners it has no name for."""
    if winner == DEFAULT:
        return TunableOpSolution.default()
    index = winner.param("index")
    if SOLUTION_NAMES.get(winner.backend) == winner.name and isinstance(index, int):
        if winner.backend == "rocblas":
            return TunableOpSolution.rocblas(index)
        return TunableOpSolution.hipblaslt(index, layout if legacy else None)
    # hipblaslt/pad (padded copies) is a hipBLASLt kernel torch cannot call the same way.
    label = f"{winner.backend}/{winner.name}" if winner.backend in SOLUTION_NAMES else winner.backend
    raise RowSkipped(
        f"{label} winners have no TunableOp solution name (writing Default would misstate the choice)"
    )


def time_text(winner_s: float) -> float | None:
    """The ms value to write for ``winner_s``: shortest that reads back to the same seconds."""
    if not math.isfinite(winner_s):
        return None
    for digits in range(6, 18):
        ms = float(f"{winner_s * 1e3:.{digits}g}")
        if ms / 1e3 == winner_s:
            return ms
    return winner_s * 1e3


def torch_version_tuple(text: str | None) -> tuple[int, int] | None:
    found = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(found[1]), int(found[2])) if found else None


@dataclass
class ExportResult:
    rows: list[TunableOpGemm] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)


def rows_of(entries: Iterable[tuple[str, TuningRecord]], validators: Mapping[str, str]) -> ExportResult:
    """TunableOp rows for cache entries, in the format the validators' torch reads."""
    version = torch_version_tuple(validators.get("PT_VERSION"))
    legacy = version is not None and version < _LD_FORMAT
    result = ExportResult()
    for key, record in entries:
        try:
            problem = Problem.from_key(key)
            winner = Candidate.from_identity(record.winner)
            result.rows.append(gemm_of(problem, winner, legacy=legacy, time_ms=time_text(record.winner_s)))
        except RowSkipped as exc:
            result.skipped[str(exc)] += 1
        except ValueError as exc:
            result.skipped[f"unreadable entry: {exc}"] += 1
    return result


def synthesized_validators(namespace: str, records: list[TuningRecord]) -> dict[str, str]:
    """Validators built from the records' versions (best effort; module docstring)."""

    def common(key: str) -> str | None:
        values = Counter(r.versions[key] for r in records if key in r.versions)
        return values.most_common(1)[0][0] if values else None

    torch_version = common("torch")
    array = namespace.rsplit("/", 1)[-1]
    if torch_version is None and array in ("numpy", "cupy"):
        msg = (
            f"namespace {namespace!r} holds entries tuned on {array} arrays (their Default is {array}'s "
            "matmul), and a TunableOp file is read by PyTorch: export a namespace of entries tuned with "
            "--array torch"
        )
        raise ValueError(msg)
    if torch_version is None:
        msg = (
            f"cannot write validators for namespace {namespace!r}: its entries name no torch version "
            "(PT_VERSION); export on the machine that will read the file, with torch installed"
        )
        raise ValueError(msg)
    validators = {"PT_VERSION": torch_version.split("+", 1)[0]}
    if namespace.split("/", 1)[0] != "amd":
        return validators
    parts = namespace.split("/")
    hip, rocblas, hipblaslt = common("hip"), common("rocblas"), common("hipblaslt")
    missing = [n for n, v in (("hip", hip), ("rocblas", rocblas), ("hipblaslt", hipblaslt)) if v is None]
    if missing or len(parts) < 2:
        msg = f"cannot write ROCm validators for {namespace!r}: the entries lack versions of {', '.join(missing)}"
        raise ValueError(msg)
    assert hip is not None and rocblas is not None and hipblaslt is not None
    version = torch_version_tuple(torch_version)
    if version is not None and version >= _HIP_VERSION_VALIDATOR:
        major_minor = torch_version_tuple(hip) or (0, 0)
        validators["HIP_VERSION"] = str(major_minor[0] * 100 + major_minor[1])
    else:
        validators["ROCM_VERSION"] = hip
    validators.update(GCN_ARCH_NAME=parts[1], ROCBLAS_VERSION=rocblas, HIPBLASLT_VERSION=hipblaslt)
    return validators


def torch_validators(current: Platform | None, namespace: str) -> dict[str, str] | None:
    """The running torch's own validators, when they describe ``namespace`` completely."""
    if current is None or current.namespace != namespace:
        return None
    try:
        import torch

        # Annotated as tuple[str, str]; it is a sequence of (key, value) pairs.
        raw: Any = torch.cuda.tunable.get_validators()
    except Exception:  # a CPU build, or a torch without TunableOp
        return None
    pairs = raw.items() if isinstance(raw, Mapping) else raw
    found = {str(k): str(v) for k, v in pairs}
    if "PT_VERSION" not in found or (current.vendor == "amd" and "GCN_ARCH_NAME" not in found):
        return None  # ROCm keys not registered yet (torch 2.3-2.6 before a TunableOp GEMM ran)
    return found


def choose_validators(
    namespace: str, records: list[TuningRecord], current: Platform | None
) -> tuple[dict[str, str], str]:
    """(validators, where they came from), in the order of the module docstring."""
    live = torch_validators(current, namespace)
    if live is not None:
        return live, "torch.cuda.tunable.get_validators() of the running torch"
    stored = Counter(
        tuple(sorted(r.settings["validators"].items()))
        for r in records
        if isinstance(r.settings.get("validators"), dict)
    )
    if stored:
        best, count = stored.most_common(1)[0]
        by_key = dict(best)
        chosen = next(
            dict(r.settings["validators"])
            for r in records
            if isinstance(r.settings.get("validators"), dict) and dict(r.settings["validators"]) == by_key
        )
        where = "the validators stored by the import"
        if len(stored) > 1:
            where += f" (the set of {count} of {sum(stored.values())} imported entries; others differ)"
        return chosen, where
    return synthesized_validators(namespace, records), "synthesized from the entries' versions (best effort)"


# --------------------------------------------------------------------------- namespaces


def namespace_for_import(
    validators: Mapping[str, str], requested: str | None, current: Platform | None
) -> str:
    """The namespace an imported file's entries go to; ValueError says why there is none.

    ``requested`` (``--namespace``) wins unless the file names another GPU architecture;
    else the GPU here (``current``), when the file was tuned on its architecture.
    """
    arch = validators.get("GCN_ARCH_NAME")
    if requested:
        parts = requested.split("/")
        if arch and len(parts) >= 2 and parts[0] == "amd" and parts[1] != arch:
            msg = f"the file was tuned on {arch} (GCN_ARCH_NAME) but --namespace {requested!r} is for {parts[1]}"
            raise ValueError(msg)
        return requested
    if arch and current is not None and current.arch == arch:
        return current.namespace
    if not arch and current is not None and current.vendor == "cpu":
        return current.namespace  # no GPU named and none here: this CPU's (a CPU export read back)
    gpu = current if current is not None and current.vendor != "cpu" else None
    here = f"this machine's GPU is {gpu.arch} ({gpu.namespace})" if gpu else "torch sees no GPU here"
    wanted = f"was tuned on {arch}" if arch else "names no GPU architecture (a CUDA build writes none)"
    msg = (
        f"the file {wanted} and {here}: pass --namespace NAMESPACE "
        "(see `unimatmul cache show` or `unimatmul info` for namespaces)"
    )
    raise ValueError(msg)


def namespace_for_export(namespaces: Iterable[str], requested: str | None, current: Platform | None) -> str:
    """The one namespace a TunableOp file is written for; ValueError says why there is none."""
    found = sorted(set(namespaces))
    if requested:
        if requested not in found:
            listed = ", ".join(found) or "none"
            msg = f"no entries in namespace {requested!r}; the cache holds: {listed}"
            raise ValueError(msg)
        return requested
    if len(found) == 1:
        return found[0]
    if current is not None and current.namespace in found:
        return current.namespace
    listed = "\n  ".join(found) if found else "(none: the cache is empty)"
    msg = f"a TunableOp file is for one platform; pass --namespace, one of:\n  {listed}"
    raise ValueError(msg)
