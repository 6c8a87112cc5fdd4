"""Fixtures of the tuning tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from unimatmul.backend import Backend
from unimatmul.testing import registered


@pytest.fixture
def backends(isolated: Any) -> Iterator[Callable[..., None]]:
    """``backends(*Backend)``: registered on the isolated selector for the test."""
    with ExitStack() as stack:

        def add(*found: Backend) -> None:
            stack.enter_context(registered(isolated.plugins, *found))

        yield add
