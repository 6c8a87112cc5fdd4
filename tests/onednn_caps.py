"""What oneDNN offers on this CPU, for tests that need a kind of kernel.

oneDNN has bf16 matmul kernels only on CPUs with AVX-512-BF16 or AMX (or where
``ONEDNN_MAX_CPU_ISA`` allows them): on an AVX2-only machine it offers none, and tests
that force a oneDNN bf16 kernel skip there with this reason, while everything else
(f32 kernels, Default for bf16) is still tested. CI runs the suite a second time with
``ONEDNN_MAX_CPU_ISA=AVX2`` so that an AVX-512 CI machine checks this path too.
"""

from __future__ import annotations

import functools

import pytest

from unimatmul.core.plugins import PluginManager
from unimatmul.core.problem import Problem


@functools.cache
def missing(dtype: str) -> str | None:
    """Why oneDNN offers no (non-reference) matmul kernel for ``dtype`` here, or None."""
    backend = PluginManager().backends().get("onednn")
    if backend is None:
        return "no onednn backend registered"
    reason = backend.availability()
    if reason is not None:
        return f"oneDNN is unavailable: {reason}"
    impls = [i for i in backend.impls(Problem.from_shape(32, 32, 32, dtype)) if not i.startswith("ref:")]  # type: ignore[attr-defined]
    if not impls:
        return (
            f"oneDNN offers no {dtype} matmul kernel on this CPU "
            "(bf16 needs AVX-512-BF16, AMX or AVX2-VNNI-2, and ONEDNN_MAX_CPU_ISA must allow it)"
        )
    return None


def skip_unless_offered(dtype: str) -> None:
    """Skip the calling test where oneDNN has no kernel for ``dtype``."""
    reason = missing(dtype)
    if reason is not None:
        pytest.skip(reason)
