"""Fixtures for the torch routing tests: an isolated Selector, routing off afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch_helpers import FAST, Env, TinyTransformer  # noqa: E402

import unimatmul.torch as ut  # noqa: E402
from unimatmul.core.plugins import PluginManager  # noqa: E402
from unimatmul.tuning.selector import Selector, set_selector  # noqa: E402


@pytest.fixture(params=["python", "native"])
def env(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """A fresh Selector over a cache in tmp_path; routing disabled and counters reset after.

    Every test runs twice: with the Python kernels at the CPU key, and with the native
    kernels there (``UNIMATMUL_TORCH_NATIVE=auto``; built on first use, and a failed
    build fails the test: CI has the compiler and ninja).
    """
    monkeypatch.setenv("UNIMATMUL_TORCH_NATIVE", "0" if request.param == "python" else "auto")
    if request.param == "native":
        from unimatmul.torch import native

        gpu = torch.cuda.is_available()
        assert native.load(cuda=gpu), f"native kernels did not build: {native.failure(gpu)}"
    cache, record = tmp_path / "cache.msgpack", tmp_path / "recorded.jsonl"
    monkeypatch.setenv("UNIMATMUL_CACHE", str(cache))
    monkeypatch.setenv("UNIMATMUL_RECORD_FILE", str(record))
    monkeypatch.delenv("UNIMATMUL_MODE", raising=False)
    monkeypatch.delenv("UNIMATMUL_BUCKETS", raising=False)
    selector = Selector(plugins=PluginManager(), settings=FAST)
    old = set_selector(selector)
    ut.disable()
    ut.reset_stats()
    try:
        yield Env(selector, cache, record)
    finally:
        ut.disable()
        ut.reset_stats()
        set_selector(old)


@pytest.fixture
def model() -> TinyTransformer:
    torch.manual_seed(0)
    return TinyTransformer()


@pytest.fixture
def tokens() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (2, 12), generator=gen)
