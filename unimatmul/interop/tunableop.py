"""Read and write PyTorch TunableOp result files (``tunableop_results%d.csv``).

Standard library only. Parses the rows, validators, op names, params and solutions of every
format torch has written, and maps TunableOp's column-major view of a GEMM to unimatmul's
row-major one (:meth:`TunableOpGemm.row_major`). The format, version by version, with its
sources: ``docs/tunableop-format.md``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, NamedTuple, Union

from unimatmul.core.text_input import text_lines

__all__ = [
    "KINDS",
    "WILDCARD",
    "ParseError",
    "RowMajorGemm",
    "TunableOpFile",
    "TunableOpGemm",
    "TunableOpRow",
    "TunableOpSolution",
    "TunableOpValidators",
    "build_op_name",
    "build_params",
    "dumps",
    "dumps_untuned",
    "format_time",
    "parse",
    "parse_untuned",
    "results_filename",
    "untuned_filename",
    "write",
    "write_untuned",
]

#: Value of a dimension written as ``*`` (dynamic-shape wildcard, unreleased torch main).
WILDCARD = -1

KINDS = ("gemm", "gemm_bias", "gemm_strided_batched", "scaled_gemm")

_OP_PREFIX = {
    "gemm": "GemmTunableOp",
    "gemm_bias": "GemmAndBiasTunableOp",
    "gemm_strided_batched": "GemmStridedBatchedTunableOp",
    "scaled_gemm": "ScaledGemmTunableOp",
}
_PREFIX_KIND = {prefix: kind for kind, prefix in _OP_PREFIX.items()}

# TypeName<T>() in TunableGemm.h -> torch dtype name.
_TYPENAME_DTYPE = {
    "float": "float32",
    "tf32": "float32",
    "double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Float8_e4m3fn": "float8_e4m3fn",
    "Float8_e5m2": "float8_e5m2",
    "Float8_e4m3fnuz": "float8_e4m3fnuz",
    "Float8_e5m2fnuz": "float8_e5m2fnuz",
    "Float8_e8m0fnu": "float8_e8m0fnu",
    "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128",
}
_DTYPE_TYPENAME = {v: k for k, v in _TYPENAME_DTYPE.items() if k != "tf32"}
# Longest first, so "Float8_e4m3fnuz" wins over "Float8_e4m3fn".
_TYPENAMES = sorted(_TYPENAME_DTYPE, key=len, reverse=True)

# at::toString(ScalarType) (ScaledGemm bias) -> torch dtype name.
_SCALARTYPE_DTYPE = {
    "Byte": "uint8",
    "Char": "int8",
    "Short": "int16",
    "Int": "int32",
    "Long": "int64",
    "Half": "float16",
    "Float": "float32",
    "Double": "float64",
    "ComplexHalf": "complex32",
    "ComplexFloat": "complex64",
    "ComplexDouble": "complex128",
    "Bool": "bool",
    "BFloat16": "bfloat16",
    "Float8_e5m2": "float8_e5m2",
    "Float8_e4m3fn": "float8_e4m3fn",
    "Float8_e5m2fnuz": "float8_e5m2fnuz",
    "Float8_e4m3fnuz": "float8_e4m3fnuz",
    "Float8_e8m0fnu": "float8_e8m0fnu",
}
_DTYPE_SCALARTYPE = {v: k for k, v in _SCALARTYPE_DTYPE.items()}

# Order in which torch registers validators (the order it writes them is hash order).
_VALIDATOR_ORDER = (
    "PT_VERSION",
    "HIP_VERSION",
    "ROCM_VERSION",
    "GCN_ARCH_NAME",
    "ROCBLAS_VERSION",
    "HIPBLASLT_VERSION",
)
_ROCM_VALIDATORS = frozenset(_VALIDATOR_ORDER[1:])

_TRANS_CHARS = "nNtTcC"
_NUM = r"(?:\d+|\*)"
_OP_RE = re.compile(
    r"(?P<prefix>GemmTunableOp|GemmAndBiasTunableOp|GemmStridedBatchedTunableOp"
    r"|ScaledGemmTunableOp)_(?P<types>.+)_(?P<la>[NT])(?P<lb>[NT])"
)
_PARAMS_RE = re.compile(
    rf"(?P<ta>[{_TRANS_CHARS}])(?P<tb>[{_TRANS_CHARS}])"
    rf"_(?P<m>{_NUM})_(?P<n>{_NUM})_(?P<k>{_NUM})"
    rf"(?:_B_(?P<batch>{_NUM}))?"
    rf"(?:_ld_(?P<lda>{_NUM})_(?P<ldb>{_NUM})_(?P<ldc>{_NUM}))?"
    r"(?:_rw_(?P<rw>[01])_bias_(?P<bias>\w+))?"
)
# Field counts of a line: Validator,<key>,<value> / <op>,<params>,<solution>,<time>,<extra>.
_VALIDATOR_FIELDS = 3
_UNTUNED_FIELDS = 2
_RESULT_FIELDS = 3
_TIMED_FIELDS = 4
_STRIDES_RE = re.compile(r"stride_a: (\d+), stride_b: (\d+), stride_c: (\d+)")
# What atof() would accept from a file torch wrote (ostream of a double).
_TIME_RE = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)", re.IGNORECASE)

_SOLUTION_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("rocblas", re.compile(r"Gemm_Rocblas_(?P<idx>-?\d+)")),
    ("hipblaslt", re.compile(r"Gemm_Hipblaslt_(?P<idx>-?\d+)")),
    ("hipblaslt", re.compile(r"Gemm_Hipblaslt_(?P<layout>[NTC]{2})_(?P<idx>-?\d+)")),
    (
        "cublaslt",
        re.compile(
            r"Gemm_Cublaslt_id_(?P<idx>-?\d+)_tile_\d+_stages_\d+_splitk_-?\d+_red_\d+"
            r"_swizzle_\d+_custom_\d+(?:_inner_\d+_cluster_\d+)?"
        ),
    ),
    # An unmerged upstream proposal's form: a heuristic rank, not an algo id (docs/tunableop-format.md).
    ("cublaslt", re.compile(r"Gemm_Cublaslt_(?P<layout>[NT]_?[NT])_(?P<idx>\d+)")),
    ("bare", re.compile(r"(?P<idx>-?\d+)")),
)

Source = Union[str, "os.PathLike[str]", IO[str], Iterable[str]]


class ParseError(NamedTuple):
    """A line that could not be used: 1-based line number, its text, why."""

    line_no: int
    line: str
    reason: str


class _RowError(ValueError):
    """Internal: one row does not describe a GEMM torch could have written."""


# --------------------------------------------------------------------------- validators


@dataclass(eq=False)
class TunableOpValidators(Mapping[str, str]):
    """The ``Validator,<key>,<value>`` lines: an ordered ``{key: value}`` mapping.

    Equality is that of a mapping (order-insensitive), which is how torch compares them.
    """

    entries: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.entries = dict(self.entries)
        for key, value in self.entries.items():
            _check_field(key, "validator key")
            _check_field(value, "validator value")

    def __getitem__(self, key: str) -> str:
        return self.entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"TunableOpValidators({self.entries!r})"

    @property
    def pt_version(self) -> str | None:
        """The ``PT_VERSION`` value (mandatory for torch to load the file)."""
        return self.entries.get("PT_VERSION")

    @property
    def backend(self) -> str:
        """``"rocm"`` when any ROCm validator is present, else ``"cuda"``."""
        return "rocm" if _ROCM_VALIDATORS & self.entries.keys() else "cuda"

    @classmethod
    def cuda(cls, pt_version: str) -> TunableOpValidators:
        """The set a CUDA build of torch writes: only ``PT_VERSION``."""
        return cls({"PT_VERSION": pt_version})

    @classmethod
    def rocm(
        cls,
        pt_version: str,
        *,
        gcn_arch_name: str,
        rocblas_version: str,
        hipblaslt_version: str,
        hip_version: str | None = None,
        rocm_version: str | None = None,
    ) -> TunableOpValidators:
        """A ROCm set in torch's registration order.

        Newer torch wants ``hip_version`` (e.g. ``"603"``), 2.3-2.6 want ``rocm_version``
        (e.g. ``"6.2.41133-dd7f95766"``); pass the one matching the target torch.
        """
        entries = {"PT_VERSION": pt_version}
        if hip_version is not None:
            entries["HIP_VERSION"] = hip_version
        if rocm_version is not None:
            entries["ROCM_VERSION"] = rocm_version
        entries["GCN_ARCH_NAME"] = gcn_arch_name
        entries["ROCBLAS_VERSION"] = rocblas_version
        entries["HIPBLASLT_VERSION"] = hipblaslt_version
        return cls(entries)

    def in_registration_order(self) -> TunableOpValidators:
        """A copy ordered as torch registers them; unknown keys keep their order, last."""
        rank = {key: i for i, key in enumerate(_VALIDATOR_ORDER)}
        keys = sorted(self.entries, key=lambda k: rank.get(k, len(rank)))
        return TunableOpValidators({k: self.entries[k] for k in keys})


# --------------------------------------------------------------------------- solutions


@dataclass(frozen=True)
class TunableOpSolution:
    """A solution name (field 3) and what it means.

    ``source`` is one of ``default``, ``rocblas``, ``hipblaslt``, ``cublaslt``, ``bare``
    (a bare integer, library unknown) or ``unknown`` (a name this module does not know;
    kept as is). ``index`` is the library's solution index (cuBLASLt: the algo id, or
    the heuristic rank for the unmerged ``Gemm_Cublaslt_NT_<i>`` form), ``layout`` the
    ``NT``-style letters older hipBLASLt names carry. ``name`` is authoritative and is
    what gets written back.
    """

    name: str
    source: str = field(init=False)
    index: int | None = field(init=False)
    layout: str | None = field(init=False)

    def __post_init__(self) -> None:
        source, index, layout = "unknown", None, None
        if self.name == "Default":
            source = "default"
        else:
            for src, pattern in _SOLUTION_PATTERNS:
                match = pattern.fullmatch(self.name)
                if match:
                    source, index = src, int(match["idx"])
                    layout = match.groupdict().get("layout")
                    break
        object.__setattr__(self, "source", source)
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "layout", layout)

    @classmethod
    def default(cls) -> TunableOpSolution:
        """The untuned library path (``Default``)."""
        return cls("Default")

    @classmethod
    def rocblas(cls, index: int) -> TunableOpSolution:
        """``Gemm_Rocblas_<index>`` (all torch versions)."""
        return cls(f"Gemm_Rocblas_{int(index)}")

    @classmethod
    def hipblaslt(cls, index: int, layout: str | None = None) -> TunableOpSolution:
        """``Gemm_Hipblaslt_<index>`` (torch 2.7+), or with ``layout`` the 2.3-2.6 form."""
        if layout is None:
            return cls(f"Gemm_Hipblaslt_{int(index)}")
        return cls(f"Gemm_Hipblaslt_{layout}_{int(index)}")


# --------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class TunableOpRow:
    """One result line as written: op name, params, solution, time, and what follows.

    ``solution`` is ``None`` for untuned-file lines; ``extra`` is everything after the
    time (torch writes ``BLAS_PARAMS: ...`` there when ``PYTORCH_TUNABLEOP_BLAS_LOG=1``).
    """

    op_name: str
    params: str
    solution: str | None
    time_ms: float | None = None
    line_no: int | None = field(default=None, compare=False)
    extra: str | None = None


@dataclass(frozen=True)
class RowMajorGemm:
    """Our view: row-major ``C[m, n] = A[m, k] @ B[k, n]`` (see the module docstring).

    ``trans_a`` means A is stored column-major (a transposed view), ``lda`` is then its
    stride along k; likewise for B. ``dtype_a``/``dtype_b`` are PyTorch's mat1/mat2.
    """

    kind: str
    m: int
    n: int
    k: int
    trans_a: bool = False
    trans_b: bool = False
    lda: int | None = None
    ldb: int | None = None
    ldc: int | None = None
    batch: int | None = None
    dtype_a: str = "float32"
    dtype_b: str = ""
    dtype_c: str = ""
    tf32: bool = False
    stride_a: int | None = None
    stride_b: int | None = None
    stride_c: int | None = None
    rowwise: bool | None = None
    bias_dtype: str | None = None

    def __post_init__(self) -> None:
        if not self.dtype_b:
            object.__setattr__(self, "dtype_b", self.dtype_a)
        if not self.dtype_c:
            object.__setattr__(self, "dtype_c", self.dtype_a)


@dataclass(frozen=True)
class TunableOpGemm:
    """One parsed row in neutral form; all shapes in TunableOp's (BLAS) view.

    ``transa``/``transb`` are the BLAS characters as torch wrote them (``n``, ``t``, ``c``);
    ``m``, ``n``, ``k``, ``lda``, ``ldb``, ``ldc``, ``batch`` and strides are BLAS-view
    values (``None`` when the format version has no such field; strides only come from a
    ``BLAS_PARAMS`` tail). ``dtype_a``/``dtype_b``/``dtype_c`` are torch dtype names in
    op-name order (PyTorch mat1, mat2, output). ``tf32`` marks a ``tf32`` op name.
    ``rowwise``/``bias_dtype`` are the ScaledGemm ``_rw_<r>_bias_<T>`` suffix
    (``rowwise is None``: no suffix; ``bias_dtype is None`` with a suffix: ``bias_None``).
    Use :meth:`row_major` for our row-major view.
    """

    kind: str
    dtype_a: str
    transa: str
    transb: str
    m: int
    n: int
    k: int
    dtype_b: str = ""
    dtype_c: str = ""
    tf32: bool = False
    lda: int | None = None
    ldb: int | None = None
    ldc: int | None = None
    batch: int | None = None
    rowwise: bool | None = None
    bias_dtype: str | None = None
    stride_a: int | None = None
    stride_b: int | None = None
    stride_c: int | None = None
    solution: TunableOpSolution | None = None
    time_ms: float | None = None
    extra: str | None = None
    line_no: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.dtype_b:
            object.__setattr__(self, "dtype_b", self.dtype_a)
        if not self.dtype_c:
            object.__setattr__(self, "dtype_c", self.dtype_a)
        problem = _validate_gemm(self)
        if problem:
            raise ValueError(problem)

    @property
    def op_name(self) -> str:
        """Field 1 as torch writes it (:func:`build_op_name`)."""
        return build_op_name(self)

    @property
    def params(self) -> str:
        """Field 2 as torch writes it (:func:`build_params`)."""
        return build_params(self)

    def to_row(self) -> TunableOpRow:
        """The line this GEMM is written as."""
        solution = None if self.solution is None else self.solution.name
        return TunableOpRow(self.op_name, self.params, solution, self.time_ms, self.line_no, self.extra)

    def row_major(self) -> RowMajorGemm:
        """Our row-major view: swap m/n, A/B transposes, lda/ldb and strides a/b."""
        return RowMajorGemm(
            kind=self.kind,
            m=self.n,
            n=self.m,
            k=self.k,
            trans_a=self.transb not in "nN",
            trans_b=self.transa not in "nN",
            lda=self.ldb,
            ldb=self.lda,
            ldc=self.ldc,
            batch=self.batch,
            dtype_a=self.dtype_a,
            dtype_b=self.dtype_b,
            dtype_c=self.dtype_c,
            tf32=self.tf32,
            stride_a=self.stride_b,
            stride_b=self.stride_a,
            stride_c=self.stride_c,
            rowwise=self.rowwise,
            bias_dtype=self.bias_dtype,
        )

    @classmethod
    def from_row_major(
        cls,
        gemm: RowMajorGemm,
        *,
        solution: TunableOpSolution | str | None = None,
        time_ms: float | None = None,
        with_ld: bool = True,
    ) -> TunableOpGemm:
        """The TunableOp row for our row-major GEMM (inverse of :meth:`row_major`).

        With ``with_ld`` (the 2.7+ format) missing leading dimensions are filled with the
        contiguous ones (A: ``m if trans_a else k``, B: ``k if trans_b else n``, C: ``n``);
        without it the row is in the pre-2.7 ``nt_M_N_K`` form.
        """
        lda, ldb, ldc = gemm.lda, gemm.ldb, gemm.ldc
        if with_ld:
            lda = lda if lda is not None else (gemm.m if gemm.trans_a else gemm.k)
            ldb = ldb if ldb is not None else (gemm.k if gemm.trans_b else gemm.n)
            ldc = ldc if ldc is not None else gemm.n
        else:
            lda = ldb = ldc = None
        if isinstance(solution, str):
            solution = TunableOpSolution(solution)
        return cls(
            kind=gemm.kind,
            dtype_a=gemm.dtype_a,
            dtype_b=gemm.dtype_b,
            dtype_c=gemm.dtype_c,
            tf32=gemm.tf32,
            transa="t" if gemm.trans_b else "n",
            transb="t" if gemm.trans_a else "n",
            m=gemm.n,
            n=gemm.m,
            k=gemm.k,
            lda=ldb,
            ldb=lda,
            ldc=ldc,
            batch=gemm.batch,
            rowwise=gemm.rowwise,
            bias_dtype=gemm.bias_dtype,
            stride_a=gemm.stride_b,
            stride_b=gemm.stride_a,
            stride_c=gemm.stride_c,
            solution=solution,
            time_ms=time_ms,
        )


def _validate_gemm(g: TunableOpGemm) -> str | None:
    """Why ``g`` cannot be written by torch, or None."""
    problem: str | None = None
    lds = (g.lda, g.ldb, g.ldc)
    if g.kind not in KINDS:
        problem = f"unknown kind {g.kind!r}; valid: {', '.join(KINDS)}"
    elif len(g.transa) != 1 or len(g.transb) != 1 or (g.transa + g.transb).strip(_TRANS_CHARS):
        problem = f"transa/transb must be one of n, t, c; got {g.transa!r}, {g.transb!r}"
    elif any(d not in _DTYPE_TYPENAME for d in (g.dtype_a, g.dtype_b, g.dtype_c)):
        problem = f"dtype not known to TunableOp: {g.dtype_a}, {g.dtype_b}, {g.dtype_c}"
    elif g.kind != "scaled_gemm" and not g.dtype_a == g.dtype_b == g.dtype_c:
        problem = f"{g.kind} has a single dtype, got {g.dtype_a}, {g.dtype_b}, {g.dtype_c}"
    elif g.tf32 and g.dtype_a != "float32":
        problem = "tf32 applies to float32 only"
    elif any(not _is_dim(v) for v in (g.m, g.n, g.k)):
        problem = f"m, n, k must be ints >= 0 (or WILDCARD): {g.m}, {g.n}, {g.k}"
    elif (g.batch is not None) != (g.kind == "gemm_strided_batched"):
        problem = "batch is required for, and only for, gemm_strided_batched"
    elif g.batch is not None and not _is_dim(g.batch):
        problem = f"batch must be an int >= 0 (or WILDCARD): {g.batch}"
    elif any(v is None for v in lds) and any(v is not None for v in lds):
        problem = "lda, ldb, ldc come together (all set or all None)"
    elif any(v is not None and not _is_dim(v) for v in lds):
        problem = f"lda, ldb, ldc must be ints >= 0 (or WILDCARD): {lds}"
    elif g.rowwise is not None and g.kind != "scaled_gemm":
        problem = "rowwise/bias_dtype only exist for scaled_gemm"
    elif g.rowwise is not None and g.lda is None:
        problem = "the _rw_/_bias_ suffix only exists in the format with leading dimensions"
    elif g.bias_dtype is not None and g.rowwise is None:
        problem = "bias_dtype needs rowwise (they are one suffix: _rw_<r>_bias_<T>)"
    elif g.bias_dtype is not None and g.bias_dtype not in _DTYPE_SCALARTYPE:
        problem = f"bias dtype {g.bias_dtype!r} has no ScalarType name"
    elif g.time_ms is not None and g.solution is None:
        problem = "a time needs a solution"
    elif g.extra is not None and "\n" in g.extra:
        problem = "extra must be a single line"
    return problem


def _is_dim(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= WILDCARD


# --------------------------------------------------------------------------- builders


def build_op_name(gemm: TunableOpGemm) -> str:
    """Field 1 (``GemmTunableOp_BFloat16_TN``...) for ``gemm``."""
    names = [_DTYPE_TYPENAME[gemm.dtype_a]]
    if gemm.tf32:
        names = ["tf32"]
    if gemm.kind == "scaled_gemm":
        names += [_DTYPE_TYPENAME[gemm.dtype_b], _DTYPE_TYPENAME[gemm.dtype_c]]
    layout = ("N" if gemm.transa in "nN" else "T") + ("N" if gemm.transb in "nN" else "T")
    return f"{_OP_PREFIX[gemm.kind]}_{'_'.join(names)}_{layout}"


def build_params(gemm: TunableOpGemm) -> str:
    """Field 2 (``tn_8192_2_3584_ld_3584_3584_8192``...) for ``gemm``; inverse of parsing."""
    text = f"{gemm.transa}{gemm.transb}_{_num(gemm.m)}_{_num(gemm.n)}_{_num(gemm.k)}"
    if gemm.batch is not None:
        text += f"_B_{_num(gemm.batch)}"
    if gemm.lda is not None and gemm.ldb is not None and gemm.ldc is not None:
        text += f"_ld_{_num(gemm.lda)}_{_num(gemm.ldb)}_{_num(gemm.ldc)}"
    if gemm.rowwise is not None:
        bias = "None" if gemm.bias_dtype is None else _DTYPE_SCALARTYPE[gemm.bias_dtype]
        text += f"_rw_{int(gemm.rowwise)}_bias_{bias}"
    return text


def _num(value: int) -> str:
    return "*" if value == WILDCARD else str(value)


# --------------------------------------------------------------------------- parsing


@dataclass
class TunableOpFile:
    """A parsed results (or untuned) file.

    ``rows`` holds every well-formed line (validators excluded), ``gemms`` those rows that
    describe a GEMM torch could have written, in file order; ``errors`` every line left
    out of ``gemms``, with its line number and the reason.
    """

    validators: TunableOpValidators
    rows: list[TunableOpRow]
    gemms: list[TunableOpGemm]
    errors: list[ParseError]
    path: str | None = None

    def lookup(self, op_name: str, params: str) -> TunableOpGemm | None:
        """The GEMM torch would use for (op, params): the first one in the file."""
        for gemm in self.gemms:
            if gemm.op_name == op_name and gemm.params == params:
                return gemm
        return None


def parse(source: Source) -> TunableOpFile:
    """Parse a TunableOp results file (``tunableop_results%d.csv``).

    ``source`` is a :class:`pathlib.Path` (or ``os.PathLike``), an open text file, the
    text itself, or a ``str`` path (a non-empty ``str`` without newline or comma is a path).
    Bad lines are reported in ``errors`` and skipped; ``ValueError`` only when nothing in
    the input is a validator or a readable GEMM row.
    """
    lines, path = _read(source)
    return _parse_lines(lines, path, untuned=False)


def parse_untuned(source: Source) -> TunableOpFile:
    """Parse a ``tunableop_untuned%d.csv`` file (``<op>,<params>[,BLAS_PARAMS: ...]``).

    Same conventions as :func:`parse`; the GEMMs have no solution and no time.
    """
    lines, path = _read(source)
    return _parse_lines(lines, path, untuned=True)


def _read(source: Source) -> tuple[Iterable[str], str | None]:
    """The lines of ``source``; a path is read as it is parsed (a regular file within the
    size limit only: :func:`unimatmul.core.text_input.text_lines`)."""
    if isinstance(source, os.PathLike):
        path = os.fspath(source)
        return text_lines(path, "a TunableOp file"), path
    if isinstance(source, str):
        if source and "\n" not in source and "," not in source:
            return text_lines(source, "a TunableOp file"), source
        return source.split("\n"), None
    return (line.rstrip("\n") for line in source), getattr(source, "name", None)  # a file or lines


def _split_fields(line: str) -> list[str]:
    """Split like torch's ``std::getline(stream, part, ',')`` loop: no trailing empty field."""
    parts = line.split(",")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    return parts


def _parse_lines(lines: Iterable[str], path: str | None, *, untuned: bool) -> TunableOpFile:
    validators: dict[str, str] = {}
    rows: list[TunableOpRow] = []
    gemms: list[TunableOpGemm] = []
    errors: list[ParseError] = []
    for line_no, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r")
        if not line.strip():
            continue
        parts = _split_fields(line)
        if parts[0] == "Validator":
            if len(parts) < _VALIDATOR_FIELDS or not parts[1]:
                errors.append(ParseError(line_no, line, "Validator line needs a key and a value"))
            else:
                validators[parts[1]] = parts[2]
            continue
        try:
            row = _row_from_fields(parts, line_no, untuned=untuned)
        except _RowError as exc:
            errors.append(ParseError(line_no, line, str(exc)))
            continue
        rows.append(row)
        try:
            gemms.append(_gemm_from_row(row))
        except _RowError as exc:
            errors.append(ParseError(line_no, line, str(exc)))
    if not validators and not gemms:
        what = "untuned" if untuned else "results"
        where = f"{path}: " if path else ""
        first = f" (line {errors[0].line_no}: {errors[0].reason})" if errors else " (no content)"
        msg = f"{where}not a TunableOp {what} file: no Validator line and no GEMM row{first}"
        raise ValueError(msg)
    return TunableOpFile(TunableOpValidators(validators), rows, gemms, errors, path)


def _row_from_fields(parts: list[str], line_no: int, *, untuned: bool) -> TunableOpRow:
    if untuned:
        if len(parts) < _UNTUNED_FIELDS:
            msg = f"expected <op>,<params>: found {len(parts)} field(s)"
            raise _RowError(msg)
        extra = ",".join(parts[_UNTUNED_FIELDS:]) if len(parts) > _UNTUNED_FIELDS else None
        if extra is not None and not extra.startswith("BLAS_PARAMS"):
            msg = "third field is not BLAS_PARAMS (a results file? `unimatmul cache import tunableop` reads those)"
            raise _RowError(msg)
        return TunableOpRow(parts[0], parts[1], None, None, line_no, extra)
    if len(parts) < _RESULT_FIELDS:
        untuned_like = len(parts) == _UNTUNED_FIELDS
        hint = " (an untuned file? `unimatmul tune --from FILE` tunes its problems)" if untuned_like else ""
        msg = f"expected <op>,<params>,<solution>[,<time>]: found {len(parts)} field(s){hint}"
        raise _RowError(msg)
    if not parts[2]:
        msg = "empty solution name"
        raise _RowError(msg)
    time_ms = None
    if len(parts) >= _TIMED_FIELDS:
        if not _TIME_RE.fullmatch(parts[3]):
            msg = f"time {parts[3]!r} is not a number"
            raise _RowError(msg)
        time_ms = float(parts[3])
    extra = ",".join(parts[_TIMED_FIELDS:]) if len(parts) > _TIMED_FIELDS else None
    return TunableOpRow(parts[0], parts[1], parts[2], time_ms, line_no, extra)


def _split_typenames(text: str) -> list[str] | None:
    """``Float8_e4m3fnuz_Float8_e4m3fnuz_BFloat16`` -> the TypeName list, or None."""
    for name in _TYPENAMES:
        if text == name:
            return [name]
        if text.startswith(name + "_"):
            rest = _split_typenames(text[len(name) + 1 :])
            if rest is not None:
                return [name, *rest]
    return None


def _dim(text: str | None) -> int | None:
    if text is None:
        return None
    return WILDCARD if text == "*" else int(text)


def _gemm_from_row(row: TunableOpRow) -> TunableOpGemm:
    op = _OP_RE.fullmatch(row.op_name)
    if op is None:
        msg = f"unknown op name {row.op_name!r}"
        raise _RowError(msg)
    kind = _PREFIX_KIND[op["prefix"]]
    names = _split_typenames(op["types"])
    want = 3 if kind == "scaled_gemm" else 1
    if names is None or len(names) != want:
        msg = f"cannot read {want} dtype name(s) from {op['types']!r}"
        raise _RowError(msg)
    if "tf32" in names[1:] or (kind == "scaled_gemm" and "tf32" in names):
        msg = "tf32 only names a single-dtype GEMM"
        raise _RowError(msg)
    dtypes = [_TYPENAME_DTYPE[n] for n in names] * (3 // want)

    params = _PARAMS_RE.fullmatch(row.params)
    if params is None:
        msg = f"cannot read params {row.params!r}"
        raise _RowError(msg)
    layout = op["la"] + op["lb"]
    got = ("N" if params["ta"] in "nN" else "T") + ("N" if params["tb"] in "nN" else "T")
    if got != layout:
        msg = f"params transposes {params['ta']}{params['tb']} do not match op layout {layout}"
        raise _RowError(msg)
    if (params["batch"] is not None) != (kind == "gemm_strided_batched"):
        msg = "_B_<batch> belongs to, and only to, GemmStridedBatchedTunableOp"
        raise _RowError(msg)
    rowwise, bias = None, None
    if params["rw"] is not None:
        if kind != "scaled_gemm":
            msg = "_rw_/_bias_ belongs to ScaledGemmTunableOp only"
            raise _RowError(msg)
        rowwise = params["rw"] == "1"
        if params["bias"] != "None":
            bias = _SCALARTYPE_DTYPE.get(params["bias"])
            if bias is None:
                msg = f"unknown bias ScalarType {params['bias']!r}"
                raise _RowError(msg)

    strides: tuple[int | None, ...] = (None, None, None)
    if kind == "gemm_strided_batched" and row.extra:
        found = _STRIDES_RE.search(row.extra)
        if found:
            strides = tuple(int(s) for s in found.groups())
    try:
        return TunableOpGemm(
            kind=kind,
            dtype_a=dtypes[0],
            dtype_b=dtypes[1],
            dtype_c=dtypes[2],
            tf32=names[0] == "tf32",
            transa=params["ta"],
            transb=params["tb"],
            m=WILDCARD if params["m"] == "*" else int(params["m"]),
            n=WILDCARD if params["n"] == "*" else int(params["n"]),
            k=WILDCARD if params["k"] == "*" else int(params["k"]),
            batch=_dim(params["batch"]),
            lda=_dim(params["lda"]),
            ldb=_dim(params["ldb"]),
            ldc=_dim(params["ldc"]),
            rowwise=rowwise,
            bias_dtype=bias,
            stride_a=strides[0],
            stride_b=strides[1],
            stride_c=strides[2],
            solution=None if row.solution is None else TunableOpSolution(row.solution),
            time_ms=row.time_ms,
            extra=row.extra,
            line_no=row.line_no,
        )
    except ValueError as exc:
        raise _RowError(str(exc)) from None


# --------------------------------------------------------------------------- writing


def format_time(time_ms: float) -> str:
    """Like torch's ``ostream << double`` (6 significant digits) unless that loses bits."""
    text = f"{time_ms:.6g}"
    if float(text) == time_ms:
        return text
    return repr(float(time_ms))


def dumps(validators: Mapping[str, str], rows: Iterable[TunableOpRow | TunableOpGemm]) -> str:
    """The text of a results file: validator lines (in the given order), then rows.

    Rows with a time are written ``op,params,solution,time[,extra]`` (what every torch
    writes); a row whose time is ``None`` is written with 3 fields, which every torch
    reads as time 0. Raises ``ValueError`` for anything torch would misread: no
    ``PT_VERSION``, a comma or newline inside a field, a row without a solution.
    """
    if "PT_VERSION" not in validators:
        msg = "validators need PT_VERSION: torch rejects a file without it"
        raise ValueError(msg)
    lines = []
    for key, value in validators.items():
        _check_field(key, "validator key")
        _check_field(value, "validator value")
        lines.append(f"Validator,{key},{value}")
    for item in rows:
        row = item.to_row() if isinstance(item, TunableOpGemm) else item
        if row.solution is None:
            msg = f"row {row.op_name},{row.params} has no solution"
            raise ValueError(msg)
        lines.append(_format_row(row, with_solution=True))
    return "".join(line + "\n" for line in lines)


def dumps_untuned(rows: Iterable[TunableOpRow | TunableOpGemm]) -> str:
    """The text of an untuned file: ``op,params[,extra]`` per row, no validators."""
    lines = []
    for item in rows:
        row = item.to_row() if isinstance(item, TunableOpGemm) else item
        lines.append(_format_row(row, with_solution=False))
    return "".join(line + "\n" for line in lines)


def write(
    file_or_path: str | os.PathLike[str] | IO[str],
    validators: Mapping[str, str],
    rows: Iterable[TunableOpRow | TunableOpGemm],
) -> None:
    """Write a results file torch reads (format of :func:`dumps`)."""
    _write_text(file_or_path, dumps(validators, rows))


def write_untuned(
    file_or_path: str | os.PathLike[str] | IO[str],
    rows: Iterable[TunableOpRow | TunableOpGemm],
) -> None:
    """Write an untuned file for ``torch.cuda.tunable.tune_gemm_in_file``."""
    _write_text(file_or_path, dumps_untuned(rows))


def _write_text(file_or_path: str | os.PathLike[str] | IO[str], text: str) -> None:
    if isinstance(file_or_path, (str, os.PathLike)):
        with open(file_or_path, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
    else:
        file_or_path.write(text)


def _format_row(row: TunableOpRow, *, with_solution: bool) -> str:
    _check_field(row.op_name, "op name")
    _check_field(row.params, "params")
    fields = [row.op_name, row.params]
    if with_solution:
        _check_field(row.solution or "", "solution")
        fields.append(row.solution or "")
        if row.time_ms is not None:
            fields.append(format_time(row.time_ms))
        elif row.extra is not None:
            msg = f"row {row.op_name},{row.params}: extra fields need a time before them"
            raise ValueError(msg)
    if row.extra is not None:
        if "\n" in row.extra or "\r" in row.extra:
            msg = f"row {row.op_name},{row.params}: extra must be a single line"
            raise ValueError(msg)
        fields.append(row.extra)
    return ",".join(fields)


def _check_field(value: str, what: str) -> None:
    if not value or any(c in value for c in ",\n\r"):
        msg = f"{what} {value!r} must be non-empty, without commas or newlines"
        raise ValueError(msg)


# --------------------------------------------------------------------------- file names


def results_filename(ordinal: int, filename: str = "tunableop_results.csv") -> str:
    """The name torch uses for device ``ordinal`` (``TuningContext::SetFilename``).

    ``%d`` is replaced by the ordinal; else it goes before the last ``.`` of the whole
    string (even a ``.`` in a directory name, as torch does); else it is appended.
    """
    device = _ordinal(ordinal)
    if "%d" in filename:
        return filename.replace("%d", device, 1)
    return _insert_before_dot(filename, device)


def untuned_filename(ordinal: int, filename: str = "tunableop_untuned.csv") -> str:
    """The untuned file name for device ``ordinal`` (``GetUntunedFile``: no ``%d``)."""
    return _insert_before_dot(filename, _ordinal(ordinal))


def _ordinal(ordinal: int) -> str:
    if not isinstance(ordinal, int) or isinstance(ordinal, bool) or ordinal < 0:
        msg = f"device ordinal must be an int >= 0, got {ordinal!r}"
        raise ValueError(msg)
    return str(ordinal)


def _insert_before_dot(filename: str, device: str) -> str:
    dot = filename.rfind(".")
    if dot == -1:
        return filename + device
    return filename[:dot] + device + filename[dot:]
