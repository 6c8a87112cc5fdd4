"""Whether torch's own CPU fp8 product (``torch._scaled_mm``, the Default of every scaled
GEMM on a CPU) runs here, for the tests that need it.

torch computes a CPU fp8 product with oneDNN where the CPU has AMX, and with a plain loop
elsewhere. Under ``ONEDNN_MAX_CPU_ISA=AVX2`` (CI's second leg) an AMX CPU still takes the
oneDNN path, and oneDNN, capped below AMX, cannot build the primitive: torch's own call
fails there, so tests that compute fp8 products skip with the reason, while the first leg
on the same machine runs them.
"""

from __future__ import annotations

import functools

import pytest


@functools.cache
def missing(scales: str = "tensor", out: str = "bf16") -> str | None:
    """Why torch's CPU ``_scaled_mm`` cannot compute a product with ``scales`` into ``out``
    (bf16 or f32) here, or None. The output type counts: under the AVX2 cap on an AMX CPU
    oneDNN has been seen to build the bf16 primitive and not the f32 one."""
    import torch

    a = torch.ones(16, 16).to(torch.float8_e4m3fn)
    if scales == "rowwise":
        sa, sb = torch.ones(16, 1), torch.ones(1, 16)
    else:
        sa, sb = torch.tensor(1.0), torch.tensor(1.0)
    try:
        torch._scaled_mm(a, a.t(), sa, sb, out_dtype={"bf16": torch.bfloat16, "f32": torch.float32}[out])
    except RuntimeError as exc:
        said = str(exc).strip().splitlines()[0][:100]
        return f"torch {torch.__version__}'s own CPU _scaled_mm ({scales} scales, {out} out) cannot run here: {said}"
    return None


def skip_unless_runs(scales: str = "tensor", out: str = "bf16") -> None:
    """Skip the calling test where torch's CPU fp8 product with ``scales`` into ``out`` cannot run."""
    reason = missing(scales, out)
    if reason is not None:
        pytest.skip(reason)
