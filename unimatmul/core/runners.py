"""The runners of the Default, what the caller's library itself does: the plain product
(:class:`DefaultRunner`, the library's own matmul) and the scaled one
(:class:`ScaledDefaultRunner`, ``torch._scaled_mm``), and :func:`default_runner`, which
picks one for a Problem. Backends' runners live with their backends; the protocol
(:class:`~unimatmul.core._backend.Runner`) beside the Backend's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from unimatmul.core._backend import DEFAULT, Candidate, Runner
from unimatmul.core.arrays import ArrayAdapter, Device
from unimatmul.core.errors import DefaultFailed
from unimatmul.core.grouped import GroupedDefaultRunner
from unimatmul.core.problem import Problem
from unimatmul.core.scales import torch_of


@dataclass
class DefaultRunner:
    """The Default candidate: what the caller's array library itself would do."""

    adapter: ArrayAdapter
    activation: str | None = None
    candidate: Candidate = field(default=DEFAULT)

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        self.adapter.matmul(a, b, out, alpha, beta, bias, self.activation)


@dataclass
class ScaledDefaultRunner:
    """The Default of a scaled GEMM: ``torch._scaled_mm`` (its ``out=`` form).

    Block-scaled (``block_scaled``): torch's own product where torch has one (CUDA; torch
    itself refuses GPUs other than sm90), else :class:`DefaultFailed` saying so: no slow
    path runs in its place.
    """

    adapter: ArrayAdapter
    fast_accum: bool = False
    candidate: Candidate = field(default=DEFAULT)
    block_scaled: bool = False

    def __post_init__(self) -> None:
        self._scaled_mm = torch_of(self.adapter)._scaled_mm
        if self.block_scaled:
            self._scaled_mm = self._block_scaled_mm

    def _block_scaled_mm(self, a: Any, b: Any, scale_a: Any, scale_b: Any, **kwargs: Any) -> Any:
        device = self.adapter.device(a)
        if not torch_has_block_scaled(self.adapter, device):
            raise block_default_missing(device)
        return torch_of(self.adapter)._scaled_mm(a, b, scale_a, scale_b, **kwargs)

    def own(self, a: Any, b: Any, scale_a: Any, scale_b: Any, bias: Any, out_dtype: Any) -> Any:
        """torch's own call with no ``out=``, and its result (what a caller without
        unimatmul gets: the same kernel, the output torch allocates)."""
        return self._scaled_mm(
            a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype, use_fast_accum=self.fast_accum
        )

    def __call__(
        self,
        a: Any,
        b: Any,
        out: Any,
        alpha: float = 1.0,
        beta: float = 0.0,
        bias: Any = None,
        scale_a: Any = None,
        scale_b: Any = None,
    ) -> None:
        if alpha != 1.0 or beta != 0.0:
            msg = f"torch._scaled_mm has no alpha or beta (got alpha={alpha}, beta={beta})"
            raise ValueError(msg)
        self._scaled_mm(
            a,
            b,
            scale_a,
            scale_b,
            bias=bias,
            out_dtype=out.dtype,
            use_fast_accum=self.fast_accum,
            out=out,
        )


def torch_has_block_scaled(adapter: ArrayAdapter, device: Device) -> bool:
    """Whether torch may compute a block-scaled product on ``device``: on CUDA only, not
    ROCm (ScaledBlas.cpp; torch itself then refuses GPUs other than sm90, and cuBLASLt
    before 12.9, with its own error)."""
    return device.kind == "cuda" and not getattr(torch_of(adapter).version, "hip", None)


def default_failed(exc: BaseException, device: Device) -> DefaultFailed:
    """The error of a scaled call whose Default, ``torch._scaled_mm``, failed on ``device``:
    what failed and, on a CPU, why torch's own fp8 product may not run there."""
    said = str(exc).strip().splitlines()[0].rstrip(". ") if str(exc).strip() else type(exc).__name__
    msg = f"scaled_matmul: torch._scaled_mm (Default: torch's own fp8 product) failed on {device}: {said}"
    if device.kind == "cpu":
        # torch runs CPU fp8 through oneDNN where the CPU has AMX, and oneDNN under an ISA cap
        # below AMX cannot build that primitive (ATen's _scaled_mm_out_cpu).
        cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
        msg += ". torch computes CPU fp8 products with oneDNN on CPUs with AMX"
        if cap:
            msg += f", and ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN below AMX: unset it"
        msg += "; unimatmul has no other CPU kernel to run instead"
    return DefaultFailed(msg, call="torch._scaled_mm")


def block_default_missing(device: Device) -> DefaultFailed:
    """The error of a block-scaled call on a device where torch has no block-scaled product."""
    msg = (
        f"scaled_matmul: torch has no block-scaled (1x128 groups of a, 128x128 blocks of b) fp8 product "
        f"on {device}: torch._scaled_mm takes these scales on CUDA GPUs of compute capability 9.0 only "
        "(cuBLASLt >= 12.9), so the Default cannot run here; unimatmul runs no slow path in its place "
        "(its float64 reference of the dequantised product only checks candidates)"
    )
    return DefaultFailed(msg, call="torch._scaled_mm")


def default_runner(problem: Problem, adapter: ArrayAdapter) -> Runner:
    """What the caller's library itself would do for ``problem``: the one Default."""
    if problem.is_scaled:
        return ScaledDefaultRunner(adapter, problem.fast_accum, block_scaled=problem.is_block_scaled)
    if problem.is_grouped:
        return GroupedDefaultRunner(adapter)
    return DefaultRunner(adapter, problem.activation)


__all__ = [
    "DefaultRunner",
    "ScaledDefaultRunner",
    "block_default_missing",
    "default_failed",
    "default_runner",
    "torch_has_block_scaled",
]
