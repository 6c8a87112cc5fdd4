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
    from unimatmul.cache.record import CandidateResult, TuningRecord
    from unimatmul.core._backend import DEFAULT, Backend, Candidate, Runner, Target
    from unimatmul.core.errors import (
        BackendUnavailable,
        DefaultFailed,
        PluginError,
        UnimatmulError,
        UnknownCandidate,
        UnsupportedProblem,
    )
    from unimatmul.core.hookspecs import hookimpl
    from unimatmul.core.modes import MODES, get_mode, mode
    from unimatmul.core.platform import Platform
    from unimatmul.core.problem import Problem
    from unimatmul.grouped import grouped_matmul
    from unimatmul.scaled import scaled_matmul

# Public name -> the module that defines it, imported on first access (PEP 562).
_EXPORTS: dict[str, str] = {
    "matmul": "unimatmul.api",
    "scaled_matmul": "unimatmul.scaled",
    "grouped_matmul": "unimatmul.grouped",
    "DEFAULT": "unimatmul.core._backend",
    "Backend": "unimatmul.core._backend",
    "Candidate": "unimatmul.core._backend",
    "Runner": "unimatmul.core._backend",
    "Target": "unimatmul.core._backend",
    "MODES": "unimatmul.core.modes",
    "get_mode": "unimatmul.core.modes",
    "mode": "unimatmul.core.modes",
    "BackendUnavailable": "unimatmul.core.errors",
    "DefaultFailed": "unimatmul.core.errors",
    "PluginError": "unimatmul.core.errors",
    "UnimatmulError": "unimatmul.core.errors",
    "UnknownCandidate": "unimatmul.core.errors",
    "UnsupportedProblem": "unimatmul.core.errors",
    "hookimpl": "unimatmul.core.hookspecs",
    "Platform": "unimatmul.core.platform",
    "Problem": "unimatmul.core.problem",
    "CandidateResult": "unimatmul.cache.record",
    "TuningRecord": "unimatmul.cache.record",
}

__all__ = [
    "DEFAULT",
    "MODES",
    "Backend",
    "BackendUnavailable",
    "Candidate",
    "CandidateResult",
    "DefaultFailed",
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
    "grouped_matmul",
    "hookimpl",
    "matmul",
    "mode",
    "scaled_matmul",
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
    # The public names only: not this module's own imports (importlib, Any, ...) nor
    # the submodules imported so far.
    return sorted(__all__)
