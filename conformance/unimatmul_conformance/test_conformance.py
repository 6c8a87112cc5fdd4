"""The conformance suite as pytest tests: one test per check (see plugin.py)."""

from __future__ import annotations

from collections.abc import Callable

# Loads the plugin when pytest was not given ``-p unimatmul_conformance.plugin``; it
# is then too late for its command-line options, not for UNIMATMUL_CONFORMANCE_BACKEND.
# (Nothing here imports the plugin module itself: pytest must import it first.)
pytest_plugins = ["unimatmul_conformance.plugin"]


def test_conformance(unimatmul_run_check: Callable[[], None]) -> None:
    unimatmul_run_check()
