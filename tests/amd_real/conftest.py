"""Fixtures of the tests against the real ROCm packages (see ``amd_archive.py``).

Without the unpacked packages every test here skips, saying where it looked and how to
get them; with ``UNIMATMUL_AMD_REAL_REQUIRED=1`` (set by ``.ci/amd-real``) their
absence fails instead, so that the CI tier can never pass on nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from amd_archive import ENV_REQUIRED, ENV_ROOT, AmdRoot, default_root, required


@pytest.fixture(scope="session")
def amd() -> AmdRoot:
    explicit = os.environ.get(ENV_ROOT, "").strip()
    found = AmdRoot(Path(explicit) if explicit else default_root())
    missing = found.missing()
    if missing:
        what = "nothing is there" if not found.root.exists() else f"missing: {', '.join(missing)}"
        msg = (
            f"the real ROCm packages are not unpacked at {found.root} ({what}); "
            "run `python3 scripts/fetch_debian_rocm.py` (or .ci/amd-real)"
        )
        if required():
            pytest.fail(f"{ENV_REQUIRED} is set but {msg}", pytrace=False)
        pytest.skip(msg)
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under the CI tier, a skipped test is a failure too: the tier must check everything."""
    if not required():
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter is not None else 0
    if skipped:
        print(f"\n{ENV_REQUIRED} is set and {skipped} test(s) skipped: failing the tier")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
