"""NumpyVariantsBackend: two ways of handing one GEMM to NumPy's BLAS differently.

- ``transposed`` computes ``C^T = B^T @ A^T``. NumPy passes the same memory to BLAS
  with the roles of the operands swapped; for some layouts (a transposed A, an output
  with padded rows) that avoids a copy NumPy would otherwise make.
- ``blocked?rows=R`` runs the product in blocks of R rows of A and C, so that each
  call's share of A and C stays in cache while B is reused. It gives up some of the
  BLAS's own parallelism, so it mainly wins on tall problems with a small B.

Neither is a new kernel, and often neither beats plain ``numpy.matmul`` (the Default
that unimatmul always measures too): the point of this plugin is to show how a third
party adds candidates, and that the tuner only keeps one when it measurably wins.
Runs f32 and f64, every layout and batch, alpha and beta, and the epilogues ``bias``,
``relu`` and ``bias_relu``; everything else is refused with UnsupportedProblem.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from unimatmul import Backend, Candidate, Problem, Target, UnsupportedProblem

_DTYPES = {"f32": "f32", "f64": "f64"}  # data dtype -> the compute type it needs
_EPILOGUES = ("none", "bias", "relu", "bias_relu")
_BLOCK_ROWS = (64, 256)

Kernel = Callable[[Any, Any, Any], None]


def _transposed(a: Any, b: Any, out: Any) -> None:
    np.matmul(b.swapaxes(-1, -2), a.swapaxes(-1, -2), out=out.swapaxes(-1, -2))


def _blocked(rows: int) -> Kernel:
    def kernel(a: Any, b: Any, out: Any) -> None:
        for start in range(0, a.shape[-2], rows):
            stop = start + rows
            np.matmul(a[..., start:stop, :], b, out=out[..., start:stop, :])

    return kernel


class VariantRunner:
    """One variant with the scalars and epilogue applied in place on the output."""

    def __init__(self, candidate: Candidate, kernel: Kernel, relu: bool) -> None:
        self.candidate = candidate
        self.kernel = kernel
        self.relu = relu

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        scalar = out.dtype.type
        if beta == 0.0:
            self.kernel(a, b, out)
            if alpha != 1.0:
                np.multiply(out, scalar(alpha), out=out)
        else:
            # C is still needed, so the product goes aside first: the one allocation,
            # and only when beta != 0.
            product = np.empty(out.shape, dtype=out.dtype)
            self.kernel(a, b, product)
            np.multiply(out, scalar(beta), out=out)
            if alpha != 1.0:
                np.multiply(product, scalar(alpha), out=product)
            np.add(out, product, out=out)
        if bias is not None:
            np.add(out, bias, out=out)
        if self.relu:
            np.maximum(out, scalar(0), out=out)


class NumpyVariantsBackend(Backend):
    """GEMM variants on NumPy arrays (see the module docstring)."""

    name = "numpy-variants"
    device_kinds = frozenset({"cpu"})
    array_kinds = frozenset({"numpy"})

    def availability(self) -> str | None:
        return None  # NumPy is a dependency of unimatmul itself

    def versions(self) -> dict[str, str]:
        versions = {"numpy": np.__version__}
        blas = _blas_name()
        if blas:
            versions["numpy-blas"] = blas
        return versions

    def _check_supported(self, problem: Problem) -> None:
        dtypes = {problem.dtype_a, problem.dtype_b, problem.dtype_c}
        if len(dtypes) != 1 or problem.dtype_a not in _DTYPES:
            msg = f"{self.name} runs f32 or f64 in, same out; not {problem.dtype_a}/{problem.dtype_b}/{problem.dtype_c}"
            raise UnsupportedProblem(msg, problem=problem, backend=self.name)
        if problem.compute != _DTYPES[problem.dtype_a]:
            msg = (
                f"{self.name} computes {problem.dtype_a} in {_DTYPES[problem.dtype_a]}, not {problem.compute}"
            )
            raise UnsupportedProblem(msg, problem=problem, backend=self.name)
        if problem.epilogue not in _EPILOGUES:
            msg = f"{self.name} has no {problem.epilogue} epilogue (only {', '.join(_EPILOGUES)})"
            raise UnsupportedProblem(msg, problem=problem, backend=self.name)
        if problem.has_bias and problem.dtype_bias != problem.dtype_c:
            msg = f"{self.name} takes a bias of the output's dtype, not {problem.dtype_bias}"
            raise UnsupportedProblem(msg, problem=problem, backend=self.name)

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        self._check_supported(problem)
        found = [Candidate.make(self.name, "transposed")]
        # Blocks as tall as the matrix would be one plain call: not a variant.
        found += [Candidate.make(self.name, "blocked", rows=rows) for rows in _BLOCK_ROWS if problem.m > rows]
        return found

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> VariantRunner:
        if candidate.backend != self.name:
            msg = f"{candidate.identity} is not a {self.name} candidate"
            raise UnsupportedProblem(msg, problem=problem, backend=self.name)
        self._check_supported(problem)
        kernel: Kernel
        if candidate.name == "transposed" and not candidate.params:
            kernel = _transposed
        elif (
            candidate.name == "blocked"
            and isinstance(candidate.param("rows"), int)
            and candidate.param("rows") > 0
        ):
            kernel = _blocked(candidate.param("rows"))
        else:
            msg = f"{self.name} has no kernel {candidate.identity}"
            raise UnsupportedProblem(msg, problem=problem, backend=self.name)
        return VariantRunner(candidate, kernel, relu=problem.activation == "relu")


def _blas_name() -> str:
    """The BLAS NumPy was built with, as NumPy reports it (empty when it does not)."""
    try:
        config: Any = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return f"{blas['name']} {blas['version']}"
    except Exception:  # older NumPy prints its config instead of returning it
        return ""
