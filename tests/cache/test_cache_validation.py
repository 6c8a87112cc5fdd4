"""Per-entry validation after a library upgrade: only entries whose winner is gone are retuned."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cache_helpers import record

from unimatmul.backend import Target
from unimatmul.cache.file_store import MsgpackFileStore
from unimatmul.cli import main
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.core.problem import Problem
from unimatmul.tuning.selector import Selector

NUMPY = Target(adapter_for_kind("numpy"), CPU)
PROBLEMS = [Problem.from_shape(16, 8 + i, 12) for i in range(4)]  # not m: no bucket sharing


def test_an_upgrade_invalidates_entries_one_by_one(isolated: Any, fake_backend: Any) -> None:
    fake_backend("fa", kernels=("k0", "k1"), version="2.0")  # the upgraded library
    selector: Selector = isolated.selector
    platform = selector.platform(NUMPY)
    old = {**platform.versions, "fa": "1.0"}
    store = selector.store
    winners = ["fa/k0", "fa/k_removed", "default/default", "fa/k1"]
    for i, (problem, winner) in enumerate(zip(PROBLEMS, winners, strict=True)):
        versions = platform.versions if i == 3 else old
        store.put(platform.namespace, problem.key, record(problem.key, winner=winner, versions=versions))

    summary = selector.validate(NUMPY)
    assert (summary.matched, summary.revalidated, summary.invalidated) == (1, 2, [PROBLEMS[1].key])
    assert store.count() == 4  # validate alone changes nothing

    found = [selector.lookup(p, NUMPY) for p in PROBLEMS]
    assert [r is not None for r in found] == [True, False, True, True]
    stats = selector.stats
    assert (stats.matched, stats.revalidated, stats.invalidated) == (1, 2, 1)
    # The invalid entry is gone from the file; the others keep serving.
    assert MsgpackFileStore(isolated.cache_path).count() == 3

    decision = selector.decide(PROBLEMS[1], NUMPY, "tune")
    assert decision.source == "tuned"
    assert stats.tuned == 1
    assert stats.summary() == "cache: 1 matched, 2 revalidated, 1 invalidated, 1 tuned"
    retuned = MsgpackFileStore(isolated.cache_path).get(platform.namespace, PROBLEMS[1].key)
    assert retuned is not None and retuned.versions == platform.versions
    assert retuned.device_state == {} or all(isinstance(v, (int, str)) for v in retuned.device_state.values())


def test_validate_with_delete_drops_the_invalid(isolated: Any, fake_backend: Any) -> None:
    fake_backend("fa", kernels=("k0",), version="3.0")
    selector: Selector = isolated.selector
    platform = selector.platform(NUMPY)
    old = {**platform.versions, "fa": "1.0"}
    for problem, winner in zip(PROBLEMS[:2], ["fa/k0", "fa/gone"], strict=True):
        selector.store.put(platform.namespace, problem.key, record(problem.key, winner=winner, versions=old))
    summary = selector.validate(NUMPY, delete=True)
    assert summary.deleted and summary.invalidated == [PROBLEMS[1].key]
    assert MsgpackFileStore(isolated.cache_path).count() == 1


@pytest.fixture
def real_plugins() -> Iterator[None]:
    """The installed plugins, loaded for this test only: later tests get a fresh manager."""
    import unimatmul.core.plugins as plugins_module

    saved = plugins_module._process.manager
    plugins_module.reset_plugin_manager()
    try:
        yield
    finally:
        plugins_module.reset_plugin_manager(saved)


@pytest.mark.usefixtures("real_plugins")
def test_the_cli_reports_validation_and_prunes_invalid_entries(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The real plugins of this installation: oneDNN says a kernel it does not have is
    # gone (invalid); a winner of a backend not installed here is only unavailable
    # here (kept unless asked); Default is always valid.
    path = tmp_path / "c.msgpack"
    platform = Selector().platform(NUMPY)
    old = {**platform.versions, "numpy": "0.0.1", "onednn": "0.0.1"}
    winners = [("default/default", old), ("onednn/no-such-implementation", old),
               ("default/default", platform.versions), ("nosuch/kernel", old)]  # fmt: skip
    store = MsgpackFileStore(path)
    for problem, (winner, versions) in zip(PROBLEMS, winners, strict=True):
        store.put(platform.namespace, problem.key, record(problem.key, winner=winner, versions=versions))
    capsys.readouterr()
    assert main(["cache", "stats", "--cache", str(path), "--validate"]) == 0
    text = capsys.readouterr().out
    assert "1 matched, 1 revalidated, 1 invalidated, 1 not available here" in text
    assert main(["cache", "verify", "--cache", str(path), "--validate"]) == 0
    assert "1 matched, 1 revalidated, 1 invalidated, 1 not available here" in capsys.readouterr().out
    assert main(["cache", "prune", "--cache", str(path), "--invalid", "-v"]) == 0
    text = capsys.readouterr().out
    assert "removed 1 entry" in text and PROBLEMS[1].key in text
    assert MsgpackFileStore(path).count() == 3
    assert main(["cache", "prune", "--cache", str(path), "--unavailable", "-v"]) == 0
    text = capsys.readouterr().out
    assert "removed 1 entry" in text and PROBLEMS[3].key in text
    assert MsgpackFileStore(path).count() == 2
