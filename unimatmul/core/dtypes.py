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
}

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
}


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
