"""unimatmul: the fastest GEMM kernel for each problem, found by measuring it here.

``import unimatmul`` imports no array library, no vendor library, and none of its own
modules until a name is used: PyTorch imports this package at ``import torch``
(the ``UNIMATMUL_TORCH`` autoload hook), so the package itself must cost nothing.
Backends load their vendor libraries on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from unimatmul._version import __version__

if TYPE_CHECKING:
    from unimatmul.api import matmul
    from unimatmul.backend import DEFAULT, Backend, Candidate, Runner, Target
    from unimatmul.config import MODES, get_mode, mode
    from unimatmul.errors import (
        BackendUnavailable,
        PluginError,
        UnimatmulError,
        UnknownCandidate,
        UnsupportedProblem,
    )
    from unimatmul.hookspecs import hookimpl
    from unimatmul.platform import Platform
    from unimatmul.problem import Problem
    from unimatmul.record import CandidateResult, TuningRecord

# Public name -> the module that defines it, imported on first access (PEP 562).
_EXPORTS: dict[str, str] = {
    "matmul": "unimatmul.api",
    "DEFAULT": "unimatmul.backend",
    "Backend": "unimatmul.backend",
    "Candidate": "unimatmul.backend",
    "Runner": "unimatmul.backend",
    "Target": "unimatmul.backend",
    "MODES": "unimatmul.config",
    "get_mode": "unimatmul.config",
    "mode": "unimatmul.config",
    "BackendUnavailable": "unimatmul.errors",
    "PluginError": "unimatmul.errors",
    "UnimatmulError": "unimatmul.errors",
    "UnknownCandidate": "unimatmul.errors",
    "UnsupportedProblem": "unimatmul.errors",
    "hookimpl": "unimatmul.hookspecs",
    "Platform": "unimatmul.platform",
    "Problem": "unimatmul.problem",
    "CandidateResult": "unimatmul.record",
    "TuningRecord": "unimatmul.record",
}

__all__ = [
    "DEFAULT",
    "MODES",
    "Backend",
    "BackendUnavailable",
    "Candidate",
    "CandidateResult",
    "Platform",
    "PluginError",
    "Problem",
    "Runner",
    "Target",
    "TuningRecord",
    "UnimatmulError",
    "UnknownCandidate",
    "UnsupportedProblem",
    "__version__",
    "get_mode",
    "hookimpl",
    "matmul",
    "mode",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later lookups skip this function
        return value
    try:  # a submodule, as ``unimatmul.api`` after a bare ``import unimatmul``
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
