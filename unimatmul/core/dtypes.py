"""Canonical dtype names shared by every backend, and the tolerances that go with them.

Two ways to judge an output against a float64 reference live here: the relative
Frobenius error accepted for a dtype (:func:`tolerance`, reported with every candidate)
and the element-wise error bound (:class:`ErrorModel`), which is what decides: a norm
over a large matrix hides one wrong element, a bound per element does not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Short names used in Problem keys. They never change: cache files depend on them.
ITEMSIZE: dict[str, int] = {
    "f64": 8,
    "f32": 4,
    "f16": 2,
    "bf16": 2,
    "f8e4m3": 1,
    "f8e5m2": 1,
    # The "fnuz" encodings (no negative zero, NaN at 0x80, exponent bias one higher) that
    # MI300 (gfx942) computes in; OCP e4m3/e5m2 are the two above.
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
}

#: The 8-bit float dtypes: inputs of a scaled GEMM (``Problem.op == "scaled_gemm"``).
FP8: frozenset[str] = frozenset({"f8e4m3", "f8e5m2", "f8e4m3fnuz", "f8e5m2fnuz"})

# Names as NumPy / PyTorch / CuPy spell them -> canonical short name.
_ALIASES: dict[str, str] = {
    "float64": "f64",
    "double": "f64",
    "float32": "f32",
    "float": "f32",
    "float16": "f16",
    "half": "f16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "f8e4m3",
    "float8_e5m2": "f8e5m2",
    "float8_e4m3fnuz": "f8e4m3fnuz",
    "float8_e5m2fnuz": "f8e5m2fnuz",
}

# Relative Frobenius error ||out - ref|| / ||ref|| accepted against a float64
# reference, by compute precision. Values from what the arithmetic can reach with
# headroom for long reductions; a wrong kernel lands orders of magnitude above.
_TOLERANCE: dict[str, float] = {
    "f64": 1e-10,
    "f32": 1e-4,
    "tf32": 5e-3,
    "f16": 1e-2,
    "bf16": 3e-2,
    "f8e4m3": 1.5e-1,
    "f8e5m2": 2.5e-1,
    "f8e4m3fnuz": 1.5e-1,
    "f8e5m2fnuz": 2.5e-1,
}

# A scaled (fp8) GEMM is checked against the float64 product of the dequantised inputs,
# which the fp8 values and f32 scales give exactly; what remains is the accumulation
# and the output's rounding. Hopper's fast fp8 accumulation (``use_fast_accum``) keeps
# fewer mantissa bits than f32 and does not promote partial sums to f32 along k, so its
# error grows with k: it is checked at this looser bound, which a wrong kernel (errors
# of order 1) is still far above.
_FAST_ACCUM_TOLERANCE = 2e-2


def canonical(name: str) -> str:
    """Map a library's dtype name (``torch.bfloat16``, ``dtype('float32')``) to ours."""
    text = str(name).rsplit(".", 1)[-1]
    if text in ITEMSIZE:
        return text
    try:
        return _ALIASES[text]
    except KeyError:
        valid = ", ".join(sorted(set(_ALIASES) | set(ITEMSIZE)))
        msg = f"unsupported dtype {name!s}; unimatmul knows: {valid}"
        raise TypeError(msg) from None


def tolerance(dtype: str, compute: str | None = None) -> float:
    """The accepted relative error for outputs of ``dtype`` computed in ``compute``."""
    # The output's rounding and the compute precision both bound the error; the
    # looser one decides.
    tol = _TOLERANCE[dtype]
    if compute is not None and compute in _TOLERANCE:
        tol = max(tol, _TOLERANCE[compute])
    return tol


def scaled_tolerance(dtype_c: str, fast_accum: bool = False) -> float:
    """The accepted relative error of a scaled (fp8) GEMM writing ``dtype_c``.

    The reference is the float64 product of the dequantised inputs (exact). The fp8
    tensor cores accumulate with about 14 bits, not fp32's 24, even where the library
    promotes partial sums to fp32 now and then (seen on the H200: every cuBLASLt fp8 kernel
    writing f32 was 1.2e-4 off, over f32's 1e-4), so tf32's bound applies to any output,
    or the fast-accumulation bound when that is asked for.
    """
    tol = tolerance(dtype_c, "tf32")
    return max(tol, _FAST_ACCUM_TOLERANCE) if fast_accum else tol


# Unit roundoff (half an ulp at 1.0) of each precision. tf32 keeps 10 mantissa bits.
UNIT_ROUNDOFF: dict[str, float] = {
    "f64": 2.0**-53,
    "f32": 2.0**-24,
    "tf32": 2.0**-11,
    "f16": 2.0**-11,
    "bf16": 2.0**-8,
    "f8e4m3": 2.0**-4,
    "f8e5m2": 2.0**-3,
}
# Compute types whose inputs are rounded to a narrower format but whose products are
# summed in a wider one: the tensor cores' tf32 mode sums in f32.
_ACCUMULATES_IN = {"tf32": "f32"}
# Largest slope of each activation: an error before it grows by at most this much.
ACTIVATION_SLOPE: dict[str | None, float] = {None: 1.0, "relu": 1.0, "gelu": 1.13, "gelu_tanh": 1.13}
# For x < 0, |x * gelu'(x)| <= 0.2: rounding x (relative u) before a GELU moves the
# result by at most 0.2 u in absolute terms, however small the result is (with 25 %
# headroom here). For x >= 0, |x| <= 2 |gelu(x)|, which the 2 |ref| term covers.
_ACTIVATION_ABSOLUTE: dict[str | None, float] = {None: 0.0, "relu": 0.0, "gelu": 0.25, "gelu_tanh": 0.25}
# The smallest normal value of each output dtype: a result below it is rounded to the
# subnormal grid, whose error is u * this however small the result (f16's grid of 2^-24
# matters: a short sum, e.g. a grouped GEMM's group of one K column, can land there).
_SMALLEST_NORMAL: dict[str, float] = {"f16": 2.0**-14, "f8e4m3": 2.0**-6, "f8e5m2": 2.0**-14}


@dataclass(frozen=True)
class ErrorModel:
    """The element-wise error bound of one product, from k, the dtypes and the inputs.

    For ``out = act(alpha * A @ B + beta * C + bias)`` computed against a float64
    reference ``ref``, element (i, j) may be off by at most::

        c_out * u_out * slope * (w * |ref| + g + |beta C| + |bias|)   rounding to the output dtype
        + u_ref * |ref|                                               the stored reference's rounding
        + |alpha| * slope * (sqrt_k_acc * r2_i * c2_j + inputs * r4_i * c4_j)   summation, inputs
        + c_acc * u_acc * slope * (|beta C| + |bias|)

    where ``r2_i = ||A[i, :]||_2``, ``c2_j = ||B[:, j]||_2`` (their product bounds
    ``sum_l |a_il b_lj|`` by Cauchy-Schwarz), ``r4``/``c4`` the same in the 4-norm
    (their product bounds ``sqrt(sum_l (a_il b_lj)^2)``), ``w`` is 2 with an
    activation (the value is rounded before it too) and 1 without, and ``g`` a small
    absolute term for GELU (see ``_ACTIVATION_ABSOLUTE``).

    * Summation: ``lam * sqrt(k) * u_acc`` times ``sum |a b|`` is the probabilistic
      bound of Higham & Mary (SIAM J. Sci. Comput. 41(5), 2019) for inner products of
      length k, for any order of summation (split-K, blocking) with independent
      rounding errors; ``c_acc * u_acc`` more pays for a few extra roundings (alpha,
      an epilogue, a fast activation), and the float64 reference's own summation
      error is added (it matters for float64 outputs only).
    * Inputs rounded to a narrower compute format (tf32) make independent errors of
      at most ``2 u_in |a b|`` per product: ``2 lam u_in sqrt(sum (a b)^2)``.
    * Partial sums kept in an output dtype narrower than the accumulator (split-K with
      cuBLASLt's OUTPUT_TYPE or in-place reductions, reduced-precision reductions) are
      rounded each by ``u_out`` of its size; for random inputs the sizes' root sum of
      squares is about ``sqrt(sum (a b)^2)`` whatever the split, and up to ~4x that when
      the running sum itself is kept in the output dtype (in-place, up to 32 splits):
      ``2 lam u_out`` more on that term. An element near zero whose partial sums are
      not is where this matters.
    * ``c_out`` roundings to the output dtype: the final one, the intermediate ones of
      a Default that adds the bias or applies the activation in separate steps, and a
      few partial sums kept in the output dtype (split-K reductions).

    For random inputs of unit variance this bound sits orders of magnitude above what
    a right kernel does (its summation error grows like sqrt(k), not k), and orders of
    magnitude below a wrong element: at 1024^3 in float32 an element off by 1.0 is
    ~100x over it, while numpy's own result uses 1/50 of it.
    """

    u_out: float
    u_acc: float
    u_in: float
    u_ref: float
    sqrt_k_acc: float  # (lam sqrt(k) + c_acc) (u_acc + u_f64): the summation term's factor
    inputs: float  # 2 lam u_in + 2 lam u_out (the latter for outputs narrower than the sums)
    slope: float
    weight_ref: float  # w
    absolute: float  # g
    c_out: float = 4.0
    c_acc: float = 16.0

    @classmethod
    def for_problem(
        cls,
        *,
        k: int,
        dtype_in: str,
        dtype_out: str,
        compute: str,
        activation: str | None,
        ref_dtype: str = "f64",
        lam: float = 4.0,
    ) -> ErrorModel:
        """The model for a product of depth ``k`` (``ref_dtype``: how the reference is kept)."""
        u_compute = UNIT_ROUNDOFF.get(compute, UNIT_ROUNDOFF["f32"])
        u_acc = (
            UNIT_ROUNDOFF[_ACCUMULATES_IN.get(compute, compute)] if compute in UNIT_ROUNDOFF else u_compute
        )
        # Inputs are rounded only where the compute format is narrower than they are.
        u_in = u_compute if u_compute > UNIT_ROUNDOFF.get(dtype_in, 0.0) else 0.0
        c_acc = 64.0 if activation is not None else 16.0
        u_out = UNIT_ROUNDOFF[dtype_out]
        partials = 2.0 * lam * u_out if u_out > u_acc else 0.0
        return cls(
            u_out=u_out,
            u_acc=u_acc,
            u_in=u_in,
            u_ref=0.0 if ref_dtype == "f64" else UNIT_ROUNDOFF[ref_dtype],
            sqrt_k_acc=(lam * math.sqrt(k) + c_acc) * (u_acc + UNIT_ROUNDOFF["f64"]),
            inputs=2.0 * lam * u_in + partials,
            slope=ACTIVATION_SLOPE[activation],
            weight_ref=2.0 if activation is not None else 1.0,
            absolute=_ACTIVATION_ABSOLUTE[activation] + _SMALLEST_NORMAL.get(dtype_out, 0.0),
            c_acc=c_acc,
        )

    def bound(
        self,
        ref: Any,
        r2: Any,
        c2: Any,
        r4: Any,
        c4: Any,
        *,
        alpha: float = 1.0,
        beta_c: Any = None,
        bias: Any = None,
    ) -> Any:
        """The bound of each element of one block, in the block's own array library.

        ``ref`` is a ``[..., rows, n]`` block of the reference, ``r2``/``r4``
        ``[..., rows]`` and ``c2``/``c4`` ``[..., n]`` the norms of its rows of A and
        columns of B, ``beta_c`` ``|beta| * |C|`` of the block (or None), ``bias`` the
        bias (or None). Only arithmetic operators, ``abs`` and indexing: NumPy, torch
        and CuPy arrays alike.
        """
        mag = abs(ref)
        extra = None
        if beta_c is not None:
            extra = beta_c
        if bias is not None:
            extra = abs(bias)[None, :] if extra is None else extra + abs(bias)[None, :]
        out_terms = mag * self.weight_ref
        if self.absolute:
            out_terms = out_terms + self.absolute
        if extra is not None:
            out_terms = out_terms + extra
        bound = out_terms * (self.c_out * self.u_out * self.slope)
        if self.u_ref:
            bound = bound + mag * self.u_ref
        scale = abs(alpha) * self.slope
        bound = bound + (r2[..., :, None] * c2[..., None, :]) * (scale * self.sqrt_k_acc)
        if self.inputs:
            bound = bound + (r4[..., :, None] * c4[..., None, :]) * (scale * self.inputs)
        if extra is not None:
            bound = bound + extra * (self.c_acc * self.u_acc * self.slope)
        return bound

    def to_dict(self) -> dict[str, float]:
        """What the record keeps of the model (``cache show --json``)."""
        return {
            "u_out": self.u_out,
            "u_acc": self.u_acc,
            "u_in": self.u_in,
            "sqrt_k_acc": self.sqrt_k_acc,
            "c_out": self.c_out,
        }
