"""Canonical dtype names shared by every backend, and the tolerances that go with them."""

from __future__ import annotations

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

    The reference is the float64 product of the dequantised inputs (exact), so the
    output's dtype with f32 accumulation decides, or the fast-accumulation bound when
    that is asked for.
    """
    tol = tolerance(dtype_c, "f32")
    return max(tol, _FAST_ACCUM_TOLERANCE) if fast_accum else tol
