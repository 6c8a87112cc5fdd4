"""Shared fixtures: an isolated cache and Selector, fast harness settings, fake backends
(the fakes themselves are :mod:`unimatmul.testing`, for plugin authors too).

No test may read or write the user's real cache: ``pytest_configure`` points
``UNIMATMUL_CACHE`` at a temporary file for the whole session before anything is
imported, and clears the other ``UNIMATMUL_*`` variables so that the caller's
environment cannot change what the tests see.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from unimatmul.core.plugins import PluginManager
from unimatmul.settings import REGISTRY
from unimatmul.testing import FakeBackend, isolated_selector, registered
from unimatmul.tuning.selector import Selector

# Importing unimatmul reads no environment variable: pytest_configure below still
# decides the cache path before any Selector or store exists.

_SESSION_DIR: str | None = None
_SAVED_ENV: dict[str, str] = {}
# Every variable unimatmul declares (unimatmul.settings): the caller's environment must
# not change what the tests see.
_VARIABLES = tuple(REGISTRY)


def pytest_configure(config: pytest.Config) -> None:
    global _SESSION_DIR
    _SESSION_DIR = tempfile.mkdtemp(prefix="unimatmul-tests-")
    for name in _VARIABLES:
        if name in os.environ:
            _SAVED_ENV[name] = os.environ.pop(name)
    os.environ["UNIMATMUL_CACHE"] = str(Path(_SESSION_DIR) / "session-cache.msgpack")


def pytest_unconfigure(config: pytest.Config) -> None:
    for name in _VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(_SAVED_ENV)
    if _SESSION_DIR is not None:
        shutil.rmtree(_SESSION_DIR, ignore_errors=True)


@dataclass
class Isolated:
    """What the ``isolated`` fixture installed: a Selector with its own plugins and cache file."""

    selector: Selector
    plugins: PluginManager
    cache_path: Path

    def store_count(self) -> int:
        return int(self.selector.store.count())


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Isolated]:
    """A fresh process-wide Selector over a cache file in ``tmp_path``, with fast settings."""
    cache = tmp_path / "cache.msgpack"
    monkeypatch.setenv("UNIMATMUL_CACHE", str(cache))
    monkeypatch.delenv("UNIMATMUL_MODE", raising=False)
    with isolated_selector(cache) as selector:
        yield Isolated(selector, selector.plugins, cache)


@pytest.fixture
def fake_backend(isolated: Isolated) -> Iterator[Callable[..., Any]]:
    """``fake_backend(name, behaviour, ...)``: a FakeBackend registered on the isolated selector."""
    with contextlib.ExitStack() as stack:

        def make(name: str, behaviour: str = "correct", **kwargs: Any) -> FakeBackend:
            backend = FakeBackend(name, behaviour, **kwargs)
            stack.enter_context(registered(isolated.plugins, backend))
            return backend

        yield make


@pytest.fixture
def unregistered_backend() -> type[FakeBackend]:
    """The FakeBackend class itself, for tests that register it their own way."""
    return FakeBackend


@pytest.fixture(name="registered")
def registered_fixture() -> Callable[..., contextlib.AbstractContextManager[None]]:
    """:func:`registered`: ``with registered(plugins, *backends, name=...)``."""
    return registered
