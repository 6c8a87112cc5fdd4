"""unimatmul: the fastest GEMM kernel for each problem, found by measuring it here.

``import unimatmul`` imports no array library beyond NumPy and no vendor library;
backends load their libraries on first use.
"""

from __future__ import annotations

from unimatmul._version import __version__
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
