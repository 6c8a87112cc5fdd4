"""The pytest plugin: one test per conformance check.

Opt-in, never auto-loaded. Load it with ``-p`` so that pytest knows its options
before it parses the command line::

    python -m pytest -p unimatmul_conformance.plugin --pyargs unimatmul_conformance \\
        --unimatmul-backend onednn [--unimatmul-quick] [--unimatmul-json report.json]

(A conftest inside the package would be loaded too late for ``--pyargs``: pytest only
reads conftests beside paths given on the command line before parsing options.)
Without ``-p`` the test module still loads the plugin, late; the backend can then be
given as ``UNIMATMUL_CONFORMANCE_BACKEND=NAME`` instead of the option.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from unimatmul import settings
from unimatmul.core.errors import BackendUnavailable
from unimatmul_conformance.expectations import Expectations
from unimatmul_conformance.loading import BackendNotFound, load_backend
from unimatmul_conformance.report import FAILED, SKIPPED, XFAILED
from unimatmul_conformance.suite import Check, Suite, parse_device

ENV_BACKEND = settings.CONFORMANCE_BACKEND.name
_SUITE = pytest.StashKey["Suite | None"]()
_HOW = (
    "give the backend to check: python -m pytest -p unimatmul_conformance.plugin --pyargs "
    f"unimatmul_conformance --unimatmul-backend NAME (or set {ENV_BACKEND}=NAME)"
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("unimatmul-conformance", "unimatmul conformance suite")
    group.addoption(
        "--unimatmul-backend", metavar="NAME", help="backend to check: a registered name or module:attr"
    )
    group.addoption(
        "--unimatmul-device", metavar="DEVICE", help="cpu, cuda[:N] or hip[:N] (default: the backend's)"
    )
    group.addoption("--unimatmul-quick", action="store_true", help="a smaller problem matrix")
    group.addoption("--unimatmul-json", metavar="FILE", help="write the JSON report to FILE")
    group.addoption("--unimatmul-xfail", metavar="FILE", help="more expected failures (see expectations.py)")
    group.addoption(
        "--unimatmul-checks", metavar="NAMES", help="comma-separated check names to run (default: all)"
    )


def _option(config: pytest.Config, name: str) -> Any:
    return config.getoption(name, default=None)


def pytest_configure(config: pytest.Config) -> None:
    spec = _option(config, "unimatmul_backend") or settings.CONFORMANCE_BACKEND.get()
    if not spec:
        config.stash[_SUITE] = None
        return
    try:
        backend = load_backend(spec)
        expectations = Expectations.builtin(backend.name)
        if _option(config, "unimatmul_xfail"):
            expectations.extend(Expectations.from_file(_option(config, "unimatmul_xfail")))
        device = _option(config, "unimatmul_device")
        checks = _option(config, "unimatmul_checks")
        config.stash[_SUITE] = Suite(
            backend,
            spec=spec,
            device=parse_device(device) if device else None,
            quick=bool(_option(config, "unimatmul_quick")),
            expectations=expectations,
            only=frozenset(c.strip() for c in checks.split(",") if c.strip()) if checks else None,
        )
    except (BackendNotFound, BackendUnavailable, ValueError, OSError) as exc:
        raise pytest.UsageError(f"unimatmul conformance: {exc}") from exc


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "unimatmul_check" not in metafunc.fixturenames:
        return
    suite = metafunc.config.stash.get(_SUITE, None)
    if suite is None:
        metafunc.parametrize("unimatmul_check", [None], ids=["no-backend-given"])
        return
    plan = suite.plan()
    metafunc.parametrize("unimatmul_check", plan, ids=[check.id for check in plan])


@pytest.fixture
def unimatmul_run_check(request: pytest.FixtureRequest, unimatmul_check: Check | None) -> Callable[[], None]:
    """Runs this test's check and turns its outcome into pytest's (pass, fail, skip, xfail)."""
    suite = request.config.stash.get(_SUITE, None)

    def run() -> None:
        if suite is None or unimatmul_check is None:
            pytest.fail(_HOW, pytrace=False)
        result = suite.run_check(unimatmul_check)
        if result.status == SKIPPED:
            pytest.skip(result.why)
        if result.status == XFAILED:
            pytest.xfail(result.why)
        if result.status == FAILED:
            pytest.fail(result.why, pytrace=False)

    return run


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    suite = session.config.stash.get(_SUITE, None)
    path = _option(session.config, "unimatmul_json")
    if suite is not None and suite.results and path:
        suite.report().write_json(path)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    suite = config.stash.get(_SUITE, None)
    if suite is None or not suite.results:
        return
    terminalreporter.write_sep("=", "unimatmul conformance")
    terminalreporter.write(suite.report().summary())
    path = _option(config, "unimatmul_json")
    if path:
        terminalreporter.write_line(f"report: {path}")
