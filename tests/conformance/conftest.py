"""Fixtures of the conformance suite's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import unimatmul.core.plugins as plugins


@pytest.fixture(autouse=True)
def _restore_the_plugin_manager() -> Iterator[None]:
    """Leave the process-wide plugin manager as it was.

    The suite finds backends by name through it (``load_backend``), which creates it
    on first use; a later test that changes UNIMATMUL_PLUGINS must still get a fresh one.
    """
    saved = plugins._process.manager
    try:
        yield
    finally:
        plugins.reset_plugin_manager(saved)
