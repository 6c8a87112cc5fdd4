"""The Problem: everything that changes which kernel is right, and nothing else.

Convention: row-major ``C[m, n] = alpha * A[m, k] @ B[k, n] + beta * C``, batched over a
leading dimension. ``trans_a`` means A is stored column-major (its unit stride runs
along m), i.e. the caller passed a transposed view; ``lda`` is then A's stride along k.
A Problem never describes a copy: it describes the caller's memory as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from unimatmul.core.dtypes import FP8, ITEMSIZE, canonical

OPS = ("gemm", "scaled_gemm", "grouped_gemm")
EPILOGUES = ("none", "relu", "gelu", "gelu_tanh", "bias", "bias_relu", "bias_gelu", "bias_gelu_tanh")
ACTIVATIONS = ("relu", "gelu", "gelu_tanh")
#: How a scaled GEMM's operand is scaled (``Problem.scale_a`` / ``scale_b``): ``tensor``
#: one f32 for the whole matrix; ``rowwise`` one f32 per row of A (``[m, 1]``) or per
#: column of B (``[1, n]``), torch's RowWise and cuBLASLt's OUTER_VEC_32F; ``block1x128``
#: one f32 per row of A and 128 elements of K (``[m, ceil(k/128)]``, torch's BlockWise1x128,
#: cuBLASLt's VEC128_32F) and ``block128x128`` one f32 per 128x128 block of B
#: (``[ceil(k/128), ceil(n/128)]``, torch's BlockWise128x128, cuBLASLt's BLK128x128_32F):
#: the block-scaled products of DeepSeek-V3 and Qwen3-FP8 checkpoints.
SCALE_MODES = ("tensor", "rowwise", "block1x128", "block128x128")
#: The modes of a block-scaled GEMM's A and B, and their block edge along K (and N).
BLOCK_SCALES = ("block1x128", "block128x128")
SCALE_BLOCK = 128
#: Pairs of (scale_a, scale_b) modes a scaled GEMM takes: torch._scaled_mm's TensorWise,
#: RowWise and (BlockWise1x128, BlockWise128x128) pairs. Its other modes (128x128 blocks of
#: A, 1x128 groups of B, MX 1x32 with e8m0 scales, NVFP4 1x16) are not scaled GEMMs here.
SCALE_PAIRS = (("tensor", "tensor"), ("rowwise", "rowwise"), BLOCK_SCALES)
#: What a scaled GEMM may write (fp8 outputs, which need an output scale, are not offered).
SCALED_OUTPUTS = ("bf16", "f16", "f32")
#: Which dimension of a grouped GEMM (``op == "grouped_gemm"``, ``torch._grouped_mm``) its
#: ``offs`` cut into groups (``Problem.jagged``): ``m`` (2-D a times 3-D b: the MoE
#: forward), ``k`` (2-D times 2-D: the weight gradient), ``n`` (3-D a times 2-D b), or
#: ``none`` (3-D times 3-D: one product per group, no offs). See ``core/grouped.py``.
JAGGED = ("m", "k", "n", "none")
#: What a grouped GEMM takes and writes (torch's rule: the output's dtype is a's).
GROUPED_DTYPES = ("bf16", "f16", "f32")

_KEY_RE = re.compile(
    r"^(?P<op>[a-z_]+):(?P<da>\w+)\.(?P<db>\w+)\.(?P<dc>\w+):(?P<cp>\w+):(?P<ta>[NT])(?P<tb>[NT])"
    r":m(?P<m>\d+)n(?P<n>\d+)k(?P<k>\d+)b(?P<b>\d+)"
    r":ld(?P<lda>\d+),(?P<ldb>\d+),(?P<ldc>\d+)"
    r":st(?P<sa>\d+),(?P<sb>\d+),(?P<sc>\d+)"
    r":beta(?P<beta>[01])"
    r":(?P<ep>[a-z_]+)(?::bias(?P<dbias>\w+))?"
    r":al(?P<al>\d+)"
    r"(?::scales=(?P<sca>[a-z0-9]+),(?P<scb>[a-z0-9]+):fastaccum=(?P<fa>[01]))?"
    r"(?::jagged=(?P<jag>[a-z]+))?$"
)


@dataclass(frozen=True)
class Problem:
    """A canonical, hashable GEMM description with one stable text key (``key``)."""

    m: int
    n: int
    k: int
    dtype_a: str = "f32"
    dtype_b: str = "f32"
    dtype_c: str = "f32"
    compute: str = "f32"
    trans_a: bool = False
    trans_b: bool = False
    lda: int = 0
    ldb: int = 0
    ldc: int = 0
    batch: int = 1
    stride_a: int = 0
    stride_b: int = 0
    stride_c: int = 0
    beta_zero: bool = True
    epilogue: str = "none"
    dtype_bias: str | None = None
    align: int = 16
    op: str = "gemm"
    # Scaled (fp8) GEMMs only (``op == "scaled_gemm"``): D = (scale_a * A) @ (scale_b * B)
    # (+ bias), each scale a SCALE_MODES layout; fast_accum is Hopper's fast fp8
    # accumulation (torch's ``use_fast_accum``). Empty / False for a plain GEMM, where
    # they are not part of the key.
    scale_a: str = ""
    scale_b: str = ""
    fast_accum: bool = False
    # Grouped GEMMs only (``op == "grouped_gemm"``): the dimension ``offs`` cuts into
    # ``batch`` groups (one of JAGGED); that dimension's size is the bucket of the call's
    # total (core/grouped.py), so that calls whose offs differ share one Problem.
    jagged: str = ""

    def __post_init__(self) -> None:
        for name in ("m", "n", "k", "batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                msg = f"Problem.{name} must be a positive int, got {value!r}"
                raise ValueError(msg)
        for name in ("dtype_a", "dtype_b", "dtype_c"):
            if getattr(self, name) not in ITEMSIZE:
                msg = f"Problem.{name}={getattr(self, name)!r} is not one of {sorted(ITEMSIZE)}"
                raise ValueError(msg)
        if self.epilogue not in EPILOGUES:
            msg = f"unknown epilogue {self.epilogue!r}; valid: {', '.join(EPILOGUES)}"
            raise ValueError(msg)
        if self.op not in OPS:
            msg = f"unknown op {self.op!r}; valid: {', '.join(OPS)}"
            raise ValueError(msg)
        # The key is parsed back by from_key, so every free-form field must be one word.
        if not isinstance(self.compute, str) or not re.fullmatch(r"\w+", self.compute):
            msg = f"Problem.compute must be a dtype name like 'f32' or 'tf32', got {self.compute!r}"
            raise ValueError(msg)
        if not isinstance(self.align, int) or self.align < 1 or self.align & (self.align - 1):
            msg = f"Problem.align must be a power of two (bytes), got {self.align!r}"
            raise ValueError(msg)
        if self.batch == 1:
            # Batch strides mean nothing for one matrix: equal layouts must give equal keys.
            for name in ("stride_a", "stride_b", "stride_c"):
                object.__setattr__(self, name, 0)
        # Fill minimal leading dimensions so that Problem(m, n, k) means "contiguous".
        if self.lda == 0:
            object.__setattr__(self, "lda", self.m if self.trans_a else self.k)
        if self.ldb == 0:
            object.__setattr__(self, "ldb", self.k if self.trans_b else self.n)
        if self.ldc == 0:
            object.__setattr__(self, "ldc", self.n)
        if self.batch > 1 and self.stride_a == 0 and self.stride_b == 0 and self.stride_c == 0:
            object.__setattr__(self, "stride_a", self.m * self.k)
            object.__setattr__(self, "stride_b", self.k * self.n)
            object.__setattr__(self, "stride_c", self.m * self.n)
        min_lda = self.m if self.trans_a else self.k
        min_ldb = self.k if self.trans_b else self.n
        if self.lda < min_lda or self.ldb < min_ldb or self.ldc < self.n:
            msg = (
                f"leading dimensions ld=({self.lda}, {self.ldb}, {self.ldc}) are smaller than "
                f"the rows they must hold (>= {min_lda}, {min_ldb}, {self.n})"
            )
            raise ValueError(msg)
        if self.has_bias and self.dtype_bias is None:
            object.__setattr__(self, "dtype_bias", self.dtype_c)
        elif not self.has_bias:
            object.__setattr__(self, "dtype_bias", None)  # not in the key, so not in the Problem
        if self.dtype_bias is not None and self.dtype_bias not in ITEMSIZE:
            msg = f"Problem.dtype_bias={self.dtype_bias!r} is not one of {sorted(ITEMSIZE)}"
            raise ValueError(msg)
        why = _scaled_fields_error(self) or _grouped_fields_error(self)
        if why:
            raise ValueError(why)

    # --- derived facts -------------------------------------------------------------
    @property
    def has_bias(self) -> bool:
        return self.epilogue.startswith("bias")

    @property
    def is_scaled(self) -> bool:
        """Whether this is a scaled (fp8) GEMM: its runners also take ``scale_a``, ``scale_b``."""
        return self.op == "scaled_gemm"

    @property
    def is_grouped(self) -> bool:
        """Whether this is a grouped GEMM: its runners also take ``offs`` (core/grouped.py)."""
        return self.op == "grouped_gemm"

    @property
    def is_block_scaled(self) -> bool:
        """Whether this is a block-scaled GEMM (1x128 groups of A, 128x128 blocks of B)."""
        return self.scale_a == BLOCK_SCALES[0]

    @property
    def activation(self) -> str | None:
        """The activation of the epilogue (``relu``, ``gelu``, ``gelu_tanh``) or None."""
        name = self.epilogue.removeprefix("bias").lstrip("_")
        return name if name not in ("", "none") else None

    @property
    def flops(self) -> int:
        if self.jagged in ("m", "k", "n"):
            return 2 * self.m * self.n * self.k  # the groups share out the jagged dimension
        return 2 * self.m * self.n * self.k * self.batch

    @property
    def min_bytes(self) -> int:
        """Fewest bytes a kernel must move: each input read once, the output written once."""
        a = self.m * self.k * ITEMSIZE[self.dtype_a]
        b = self.k * self.n * ITEMSIZE[self.dtype_b]
        c = self.m * self.n * ITEMSIZE[self.dtype_c] * (1 if self.beta_zero else 2)
        b_batches = 1 if (self.batch > 1 and self.stride_b == 0) else self.batch
        a_batches = 1 if (self.batch > 1 and self.stride_a == 0) else self.batch
        return a * a_batches + b * b_batches + c * self.batch

    @property
    def shape_text(self) -> str:
        text = f"{self.m}x{self.n}x{self.k}"
        return text if self.batch == 1 else f"{self.batch}x{text}"

    def with_m(self, m: int) -> Problem:
        """The same problem with ``m`` rows: what dynamic shapes (bucketing) compare.

        Fields that follow from m in a tight layout follow it: a column-major A's
        leading dimension when it equalled m, and batch strides that were exactly one
        matrix apart. Looser layouts (a view into a wider buffer) keep their strides.
        """
        if m == self.m:
            return self
        lda = self.lda
        if self.trans_a and (lda == self.m or lda < m):
            lda = m
        stride_a, stride_c = self.stride_a, self.stride_c
        if self.batch > 1:
            if stride_a == (self.k * self.lda if self.trans_a else self.m * self.lda):
                stride_a = self.k * lda if self.trans_a else m * lda
            if stride_c == self.m * self.ldc:
                stride_c = m * self.ldc
        return replace(self, m=m, lda=lda, stride_a=stride_a, stride_c=stride_c)

    @property
    def key(self) -> str:
        """The stable text form used as the cache key. Never change its format lightly."""
        bias = f":bias{self.dtype_bias}" if self.has_bias else ""
        # Only a scaled GEMM has the scales suffix: every plain GEMM's key is what it was.
        scaled = (
            f":scales={self.scale_a},{self.scale_b}:fastaccum={int(self.fast_accum)}"
            if self.is_scaled
            else ""
        )
        if self.is_grouped:
            scaled = f":jagged={self.jagged}"
        return (
            f"{self.op}:{self.dtype_a}.{self.dtype_b}.{self.dtype_c}:{self.compute}:"
            f"{'T' if self.trans_a else 'N'}{'T' if self.trans_b else 'N'}:"
            f"m{self.m}n{self.n}k{self.k}b{self.batch}:"
            f"ld{self.lda},{self.ldb},{self.ldc}:"
            f"st{self.stride_a},{self.stride_b},{self.stride_c}:"
            f"beta{0 if self.beta_zero else 1}:{self.epilogue}{bias}:al{self.align}{scaled}"
        )

    def __str__(self) -> str:
        return self.key

    @classmethod
    def from_key(cls, key: str) -> Problem:
        """Parse a key written by :attr:`key` back into the same Problem."""
        match = _KEY_RE.match(key)
        if match is None:
            msg = f"not a unimatmul problem key: {key!r}"
            raise ValueError(msg)
        g = match.groupdict()
        return cls(
            op=g["op"],
            dtype_a=g["da"],
            dtype_b=g["db"],
            dtype_c=g["dc"],
            compute=g["cp"],
            trans_a=g["ta"] == "T",
            trans_b=g["tb"] == "T",
            m=int(g["m"]),
            n=int(g["n"]),
            k=int(g["k"]),
            batch=int(g["b"]),
            lda=int(g["lda"]),
            ldb=int(g["ldb"]),
            ldc=int(g["ldc"]),
            stride_a=int(g["sa"]),
            stride_b=int(g["sb"]),
            stride_c=int(g["sc"]),
            beta_zero=g["beta"] == "0",
            epilogue=g["ep"],
            dtype_bias=g["dbias"],
            align=int(g["al"]),
            scale_a=g["sca"] or "",
            scale_b=g["scb"] or "",
            fast_accum=g["fa"] == "1",
            jagged=g["jag"] or "",
        )

    @classmethod
    def from_shape(
        cls,
        m: int,
        n: int,
        k: int,
        dtype: str = "f32",
        *,
        batch: int = 1,
        compute: str | None = None,
        epilogue: str = "none",
    ) -> Problem:
        """A contiguous row-major problem, as a user would write ``MxNxK:dtype``."""
        dtype = canonical(dtype)
        return cls(
            m=m,
            n=n,
            k=k,
            batch=batch,
            dtype_a=dtype,
            dtype_b=dtype,
            dtype_c=dtype,
            compute=compute or _default_compute(dtype),
            epilogue=epilogue,
        )

    @classmethod
    def parse_shape(cls, text: str) -> Problem:
        """Parse ``MxNxK[:dtype]`` or ``BxMxNxK[:dtype]`` (the CLI's ``--shape``)."""
        dims_text, _, dtype = text.partition(":")
        try:
            dims = [int(part) for part in dims_text.lower().split("x")]
        except ValueError:
            dims = []
        if len(dims) not in (3, 4) or min(dims, default=0) < 1:
            msg = f"bad shape {text!r}: expected MxNxK[:dtype] or BxMxNxK[:dtype] with positive sizes"
            raise ValueError(msg)
        batch = dims[0] if len(dims) == 4 else 1
        m, n, k = dims[-3:]
        return cls.from_shape(m, n, k, dtype or "f32", batch=batch)

    @classmethod
    def from_operands(
        cls,
        adapter: Any,
        a: Any,
        b: Any,
        *,
        out: Any = None,
        c: Any = None,
        bias: Any = None,
        activation: str | None = None,
        beta: float = 0.0,
    ) -> tuple[Problem, tuple[int, ...]]:
        """The Problem of a call on the caller's own arrays, and the output's shape.

        The one place a Problem is made from arrays (``unimatmul.matmul``, PyTorch
        routing, the conformance suite): ``adapter`` is the operands' array adapter
        (:func:`unimatmul.core.arrays.adapter_of`). Bad input raises ``ValueError`` or
        ``TypeError`` with a message that names the operand, in NumPy's style; valid operands
        with an empty dimension raise :class:`EmptyProduct` (the array library computes those).
        """
        if not adapter.same_library(b):
            msg = f"matmul: a and b must come from the same array library, got {type(a).__name__} and {type(b).__name__}"
            raise TypeError(msg)
        a_shape, b_shape = adapter.shape(a), adapter.shape(b)
        for name, shape in (("a", a_shape), ("b", b_shape)):
            if len(shape) not in (2, 3):
                msg = f"matmul: {name} must be 2-D or 3-D (batched), got a {len(shape)}-D array of shape {shape}"
                raise ValueError(msg)
        device = adapter.device(a)
        for name, x in (("b", b), ("out", out), ("c", c), ("bias", bias)):
            if x is not None:
                if not adapter.same_library(x):
                    msg = f"matmul: {name} is a {type(x).__name__}, but a is a {type(a).__name__}"
                    raise TypeError(msg)
                if adapter.device(x) != device:
                    msg = f"matmul: a is on {device} but {name} is on {adapter.device(x)}: all operands must be on one device"
                    raise ValueError(msg)
        dtype = adapter.dtype(a)
        if adapter.dtype(b) != dtype:
            msg = f"matmul: a is {dtype} but b is {adapter.dtype(b)}; both operands must have one dtype"
            raise TypeError(msg)
        m, n, k = product_dims(a_shape, b_shape, "matmul", empty=True)
        batch_a = a_shape[0] if len(a_shape) == 3 else 1
        batch_b = b_shape[0] if len(b_shape) == 3 else 1
        if batch_a != batch_b and 1 not in (batch_a, batch_b):
            msg = f"matmul: batch sizes {batch_a} (a) and {batch_b} (b) differ and neither is 1"
            raise ValueError(msg)
        batch = max(batch_a, batch_b)
        batched = len(a_shape) == 3 or len(b_shape) == 3
        out_shape = (batch, m, n) if batched else (m, n)
        for name, x in (("out", out), ("c", c)):
            if x is not None:
                if adapter.shape(x) != out_shape:
                    msg = f"matmul: {name} has shape {adapter.shape(x)}, expected {out_shape}"
                    raise ValueError(msg)
                if adapter.dtype(x) != dtype:
                    msg = f"matmul: {name} is {adapter.dtype(x)}, expected {dtype} like a and b"
                    raise TypeError(msg)
        if bias is not None:
            if adapter.shape(bias) != (n,):
                msg = f"matmul: bias must have shape ({n},), got {adapter.shape(bias)}"
                raise ValueError(msg)
            if adapter.dtype(bias) != dtype:
                msg = f"matmul: bias is {adapter.dtype(bias)}, expected {dtype}"
                raise TypeError(msg)
            if n > 1 and adapter.strides(bias)[0] != 1:
                # Kernels read the bias as n consecutive values; the key has no stride for it.
                msg = f"matmul: bias must be contiguous, got stride {adapter.strides(bias)[0]}; pass a contiguous copy"
                raise ValueError(msg)
        if activation is not None and activation not in ACTIVATIONS:
            msg = f"matmul: unknown activation {activation!r}; valid: {', '.join(ACTIVATIONS)}"
            raise ValueError(msg)
        if beta != 0.0 and c is None and out is None:
            msg = "matmul: beta != 0 needs c, or out holding C"
            raise ValueError(msg)
        if min(m, n, k) < 1:
            msg = f"matmul: empty operands (m={m}, n={n}, k={k}): no kernel to choose"
            raise EmptyProduct(msg, out_shape)

        a_strides, b_strides = adapter.strides(a), adapter.strides(b)
        trans_a, lda = matrix_layout(a_shape, a_strides, "a")
        trans_b, ldb = matrix_layout(b_shape, b_strides, "b")
        ldc, stride_c = n, m * n
        if out is not None:
            o_strides = adapter.strides(out)
            o_trans, ldc = matrix_layout(out_shape, o_strides, "out")
            if o_trans and m > 1 and n > 1:
                msg = f"matmul: out must be row-major (unit stride in its last dimension), got strides {o_strides}"
                raise ValueError(msg)
            stride_c = o_strides[0] if batched else 0
        stride_a = a_strides[0] if len(a_shape) == 3 and batch_a > 1 else 0
        stride_b = b_strides[0] if len(b_shape) == 3 and batch_b > 1 else 0
        if batch == 1:
            stride_a = stride_b = stride_c = 0
        ptrs = [adapter.ptr(a), adapter.ptr(b)]
        if out is not None:
            ptrs.append(adapter.ptr(out))
        epilogue = "none"
        if bias is not None:
            epilogue = "bias" if activation is None else f"bias_{activation}"
            ptrs.append(adapter.ptr(bias))
        elif activation is not None:
            epilogue = activation
        problem = cls(
            m=m,
            n=n,
            k=k,
            batch=batch,
            dtype_a=dtype,
            dtype_b=dtype,
            dtype_c=dtype,
            compute=adapter.compute_type(dtype, device),
            trans_a=trans_a,
            trans_b=trans_b,
            lda=lda,
            ldb=ldb,
            ldc=ldc,
            stride_a=stride_a,
            stride_b=stride_b,
            stride_c=stride_c if batch > 1 else 0,
            beta_zero=beta == 0.0,
            epilogue=epilogue,
            align=pointer_alignment(*ptrs),
        )
        return problem, out_shape


def _scaled_fields_error(p: Problem) -> str:
    """Why the scaled-GEMM fields of ``p`` do not fit its op, or ""."""
    if not p.is_scaled:
        if p.scale_a or p.scale_b or p.fast_accum:
            return f"scale_a, scale_b and fast_accum belong to op 'scaled_gemm', not {p.op!r}"
        return ""
    if p.dtype_a not in FP8 or p.dtype_b not in FP8:
        return f"a scaled GEMM takes fp8 A and B ({', '.join(sorted(FP8))}), got {p.dtype_a} and {p.dtype_b}"
    if p.dtype_c not in SCALED_OUTPUTS:
        return f"a scaled GEMM writes {', '.join(SCALED_OUTPUTS)}, not {p.dtype_c}"
    if p.compute != "f32":
        return f"a scaled GEMM accumulates in f32 (fast_accum says how), not {p.compute}"
    for name in ("scale_a", "scale_b"):
        if getattr(p, name) not in SCALE_MODES:
            return f"Problem.{name}={getattr(p, name)!r} is not one of {', '.join(SCALE_MODES)}"
    pair = (p.scale_a, p.scale_b)
    if pair not in SCALE_PAIRS:
        valid = "; ".join(",".join(x) for x in SCALE_PAIRS)
        return f"scales {pair[0]},{pair[1]} are not a pair a scaled GEMM takes ({valid})"
    if p.batch != 1 or not p.beta_zero or p.epilogue not in ("none", "bias"):
        return "a scaled GEMM is one matrix product, beta = 0, with at most a bias (as torch._scaled_mm)"
    return ""


def _grouped_fields_error(p: Problem) -> str:
    """Why the grouped-GEMM fields of ``p`` do not fit its op, or ""."""
    if not p.is_grouped:
        return f"jagged belongs to op 'grouped_gemm', not {p.op!r}" if p.jagged else ""
    if p.jagged not in JAGGED:
        return f"Problem.jagged={p.jagged!r} is not one of {', '.join(JAGGED)}"
    if not p.dtype_a == p.dtype_b == p.dtype_c or p.dtype_a not in GROUPED_DTYPES:
        return (
            f"a grouped GEMM takes and writes one dtype of {', '.join(GROUPED_DTYPES)} "
            f"(torch._grouped_mm), got {p.dtype_a}, {p.dtype_b} and {p.dtype_c}"
        )
    if not p.beta_zero or p.epilogue != "none":
        return "a grouped GEMM has beta = 0 and no epilogue (torch._grouped_mm takes no bias)"
    return ""


def _default_compute(dtype: str) -> str:
    return "f64" if dtype == "f64" else "f32"


# --- building a Problem from the caller's arrays -------------------------------------


def matrix_layout(shape: tuple[int, ...], strides: tuple[int, ...], what: str) -> tuple[bool, int]:
    """(transposed, leading dimension) of the last two dims of an operand, in elements.

    A dimension of size 1 can carry any stride; those are normalised so that equal
    layouts give equal keys.
    """
    rows, cols = shape[-2], shape[-1]
    s_row, s_col = strides[-2], strides[-1]
    if cols == 1 or s_col == 1:
        ld = s_row if rows > 1 else cols
        if rows == 1 or ld >= cols:
            return False, max(ld, cols, 1)
    if rows == 1 or s_row == 1:
        ld = s_col if cols > 1 else rows
        if cols == 1 or ld >= rows:
            return True, max(ld, rows, 1)
    msg = (
        f"{what} has strides {tuple(strides)} for shape {tuple(shape)}: no GEMM kernel takes a "
        f"matrix without a unit stride in one of its last two dimensions; pass a contiguous "
        f"copy (e.g. .contiguous() or numpy.ascontiguousarray)"
    )
    raise ValueError(msg)


class EmptyProduct(ValueError):
    """A product with an empty dimension: no Problem (no kernel to choose), yet a valid call
    where the array library takes it (``numpy.matmul`` returns an empty array, or zeros
    when k is 0). Carries the output's shape."""

    def __init__(self, msg: str, out_shape: tuple[int, ...]) -> None:
        super().__init__(msg)
        self.out_shape = out_shape


def product_dims(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], what: str, *, empty: bool = False
) -> tuple[int, int, int]:
    """(m, n, k) of ``a @ b`` from the operands' last two dimensions; ValueError (its
    message starting with ``what``, the function the user called) when k differs or (unless
    ``empty``) a dimension is empty."""
    m, k = a_shape[-2], a_shape[-1]
    k2, n = b_shape[-2], b_shape[-1]
    if k != k2:
        msg = (
            f"{what}: mismatch in the contracted dimension: a has shape {a_shape} and b has shape "
            f"{b_shape} (size {k} is different from {k2})"
        )
        raise ValueError(msg)
    if min(m, n, k) < 1 and not empty:
        msg = f"{what}: empty operands (m={m}, n={n}, k={k}) are not supported"
        raise ValueError(msg)
    return m, n, k


def pointer_alignment(*ptrs: int) -> int:
    """The largest power of two, at most 16, dividing every pointer (in bytes)."""
    align = 16
    for ptr in ptrs:
        while align > 1 and ptr % align:
            align //= 2
    return align
