"""The example plugin (plugins/unimatmul-numpy-variants) passes the conformance suite.

Install-free: the fixture puts the plugin's source on sys.path and registers it
through a PluginManager, exactly as its entry point would.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from unimatmul.backend import Backend
from unimatmul.core.plugins import PluginManager
from unimatmul_conformance import run_suite

PLUGIN_SRC = Path(__file__).resolve().parents[2] / "plugins" / "unimatmul-numpy-variants" / "src"


@pytest.fixture
def variants_backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    monkeypatch.syspath_prepend(str(PLUGIN_SRC))
    module = importlib.import_module("unimatmul_numpy_variants")
    plugins = PluginManager(load_entry_points=False)
    plugins.register(module, "numpy-variants")
    try:
        yield plugins.backends()["numpy-variants"]
    finally:
        plugins.unregister("numpy-variants")


def test_the_example_plugin_passes_the_suite(variants_backend: Backend) -> None:
    report = run_suite(variants_backend, quick=True)
    assert report.ok, [f"{r.id}: {r.why}" for r in report.failed()][:5]
    by_check = report.by_check()
    assert by_check["result"]["passed"] >= 30
    # A fresh process found it by its class path (no entry point is installed here).
    assert by_check["identity-stable"]["passed"] == 1
    identities = {r.candidate for r in report.results if r.candidate}
    assert "numpy-variants/transposed" in identities
    assert "numpy-variants/blocked?rows=64" in identities
    refused = [r.case for r in report.results if r.check == "candidates" and r.why.startswith("unsupported")]
    assert any(":gelu:" in (case or "") for case in refused)
