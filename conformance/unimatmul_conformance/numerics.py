"""The float64 reference and the two ways an output is compared with it.

The whole output must be within the dtype's tolerance in relative Frobenius norm
(:func:`unimatmul.core.dtypes.tolerance`), and every element within its own error
bound (:class:`unimatmul.core.dtypes.ErrorModel`, from k, the dtypes and the inputs'
magnitudes: the same bound the Harness holds every candidate to): a norm alone hides
one wrong element in a large matrix.

A scaled (fp8) case compares with the float64 product of the dequantised inputs,
``(scale_a * A) @ (scale_b * B) + bias``, at the scaled tolerance
(:func:`unimatmul.core.dtypes.scaled_tolerance`), element by element within the bound
of that product (:func:`unimatmul.core.scales.scaled_error_model`); its runner takes
the scales last.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from unimatmul.core.arrays import ArrayAdapter, Device, adapter_for_kind, make_operands
from unimatmul.core.dtypes import ErrorModel, scaled_tolerance, tolerance
from unimatmul.core.problem import Problem
from unimatmul.core.scales import expanded_scale, make_scaled_operands, scaled_error_model
from unimatmul_conformance.guards import host64


@dataclass
class CaseData:
    """Operands of one case on the device, their float64 host copies and the reference."""

    a: Any
    b: Any
    c: Any  # C's initial values (only read when beta != 0), in the output's layout
    bias: Any
    a64: np.ndarray
    b64: np.ndarray
    c64: np.ndarray
    bias64: np.ndarray | None
    reference: np.ndarray
    bound: np.ndarray  # per-element error bound (see module docstring)
    tolerance: float
    # A scaled (fp8) case: the scales on the device and their float64 host copies.
    scale_a: Any = None
    scale_b: Any = None
    scale_a64: np.ndarray | None = None
    scale_b64: np.ndarray | None = None

    def run(self, runner: Any, out: Any, alpha: float, beta: float) -> None:
        """Call ``runner`` on these inputs (a scaled runner takes the scales last)."""
        if self.scale_a is None:
            runner(self.a, self.b, out, alpha, beta, self.bias)
        else:
            runner(self.a, self.b, out, alpha, beta, self.bias, self.scale_a, self.scale_b)

    def inputs_changed(self, adapter: ArrayAdapter) -> list[str]:
        """Names of the inputs whose values differ from when the case was made."""
        changed = []
        for name, now, then in (
            ("A", self.a, self.a64),
            ("B", self.b, self.b64),
            ("bias", self.bias, self.bias64),
            ("scale_a", self.scale_a, self.scale_a64),
            ("scale_b", self.scale_b, self.scale_b64),
        ):
            if now is not None and then is not None and not np.array_equal(host64(adapter, now), then):
                changed.append(name)
        return changed


def make_case_data(
    problem: Problem, alpha: float, beta: float, adapter: ArrayAdapter, device: Device, seed: int
) -> CaseData:
    rng = np.random.default_rng(seed)
    if problem.is_scaled:
        return _scaled_case_data(problem, adapter, device, rng)
    ops = make_operands(problem, adapter, device, rng)
    a64, b64, c64 = host64(adapter, ops.a), host64(adapter, ops.b), host64(adapter, ops.out)
    bias64 = host64(adapter, ops.bias) if ops.bias is not None else None
    # The project's own definition of the result, evaluated in float64 on the host.
    reference = np.asarray(
        adapter_for_kind("numpy").reference(a64, b64, c64, alpha, beta, bias64, problem.activation)
    )
    model = ErrorModel.for_problem(
        k=problem.k,
        dtype_in=problem.dtype_a,
        dtype_out=problem.dtype_c,
        compute=problem.compute,
        activation=problem.activation,
    )
    bound = _bound(
        model,
        reference,
        a64,
        b64,
        alpha=alpha,
        beta_c=abs(beta) * np.abs(c64) if beta != 0.0 else None,
        bias=bias64,
    )
    return CaseData(
        a=ops.a,
        b=ops.b,
        c=ops.out,
        bias=ops.bias,
        a64=a64,
        b64=b64,
        c64=c64,
        bias64=bias64,
        reference=reference,
        bound=np.broadcast_to(bound, reference.shape),
        tolerance=tolerance(problem.dtype_c, problem.compute),
    )


def _bound(
    model: ErrorModel,
    reference: np.ndarray,
    a64: np.ndarray,
    b64: np.ndarray,
    *,
    alpha: float,
    beta_c: np.ndarray | None,
    bias: np.ndarray | None,
) -> np.ndarray:
    """Each element's error bound: the model's, from the inputs' row and column norms."""
    return np.asarray(
        model.bound(
            reference,
            np.sqrt((a64 * a64).sum(axis=-1)),
            np.sqrt((b64 * b64).sum(axis=-2)),
            np.sqrt(np.sqrt(((a64 * a64) ** 2).sum(axis=-1))),
            np.sqrt(np.sqrt(((b64 * b64) ** 2).sum(axis=-2))),
            alpha=alpha,
            beta_c=beta_c,
            bias=bias,
        )
    )


def _scaled_case_data(problem: Problem, adapter: ArrayAdapter, device: Device, rng: Any) -> CaseData:
    ops = make_scaled_operands(problem, adapter, device, rng)
    a64, b64, c64 = host64(adapter, ops.a), host64(adapter, ops.b), host64(adapter, ops.out)
    sa64, sb64 = host64(adapter, ops.scale_a), host64(adapter, ops.scale_b)
    bias64 = host64(adapter, ops.bias) if ops.bias is not None else None
    # Dequantised inputs: a [m, 1] / [1, n] scale broadcasts over rows / columns, one value
    # over all, a block scale over its blocks.
    da, db = a64 * expanded_scale(sa64, a64.shape), b64 * expanded_scale(sb64, b64.shape)
    reference = da @ db
    if bias64 is not None:
        reference = reference + bias64
    bound = _bound(scaled_error_model(problem), reference, da, db, alpha=1.0, beta_c=None, bias=bias64)
    return CaseData(
        a=ops.a,
        b=ops.b,
        c=ops.out,
        bias=ops.bias,
        a64=a64,
        b64=b64,
        c64=c64,
        bias64=bias64,
        reference=reference,
        bound=np.broadcast_to(bound, reference.shape),
        tolerance=scaled_tolerance(problem.dtype_c, problem.fast_accum),
        scale_a=ops.scale_a,
        scale_b=ops.scale_b,
        scale_a64=sa64,
        scale_b64=sb64,
    )


@dataclass
class Comparison:
    """How an output compares with the reference, over the elements that were written."""

    rel_error: float
    bad_elements: int
    worst: str

    def ok(self, tol: float) -> bool:
        return self.rel_error <= tol and self.bad_elements == 0


def compare(out64: np.ndarray, data: CaseData, written: np.ndarray) -> Comparison:
    """Compare ``out64`` with the reference where ``written`` is True."""
    ref = data.reference[written]
    got = out64[written]
    if got.size == 0:
        return Comparison(math.inf, 0, "no element was written")
    diff = np.abs(got - ref)
    den = float(np.linalg.norm(ref))
    num = float(np.linalg.norm(np.where(np.isfinite(diff), diff, np.inf)))
    rel = num / den if den > 0 else num
    bound = data.bound[written] + 1e-30
    bad = ~(diff <= bound)  # NaN counts as bad
    worst = ""
    if bad.any():
        positions = np.argwhere(written)[np.flatnonzero(bad)]
        ratio = np.where(np.isfinite(diff[bad]), diff[bad] / bound[bad], np.inf)
        i = int(np.argmax(ratio))
        where = tuple(int(x) for x in positions[i])
        worst = (
            f"worst element {where}: got {got[bad][i]!r}, expected {ref[bad][i]!r} "
            f"(error {diff[bad][i]:.3g} > bound {bound[bad][i]:.3g})"
        )
    return Comparison(rel if math.isfinite(rel) else math.inf, int(bad.sum()), worst)
