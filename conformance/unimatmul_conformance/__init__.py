"""The unimatmul conformance suite: checks that a backend is right, the same for every backend.

Opt-in: nothing here is loaded unless asked for. Three ways to run it:

- ``unimatmul conformance --backend NAME [--json report.json] [--quick]``;
- ``python -m pytest -p unimatmul_conformance.plugin --pyargs unimatmul_conformance
  --unimatmul-backend NAME``;
- from Python: ``run_suite(backend_or_name, quick=True).ok``.

See docs/plugins.md ("Running the conformance suite on your backend").
"""

from __future__ import annotations

from unimatmul_conformance.checks import ALL as CHECKS
from unimatmul_conformance.expectations import Expectations
from unimatmul_conformance.loading import BackendNotFound, load_backend
from unimatmul_conformance.report import CheckResult, Report
from unimatmul_conformance.suite import Suite, run_suite

__all__ = [
    "CHECKS",
    "BackendNotFound",
    "CheckResult",
    "Expectations",
    "Report",
    "Suite",
    "load_backend",
    "run_suite",
]
