"""A process that lacks a backend skips that backend's entries; it never deletes them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cache_helpers import PYTHON, record

from unimatmul.backend import Target
from unimatmul.cache.file_store import MsgpackFileStore
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.core.plugins import PluginManager
from unimatmul.core.problem import Problem
from unimatmul.testing import FakeBackend, registered
from unimatmul.tuning.selector import Selector

NUMPY = Target(adapter_for_kind("numpy"), CPU)
PROBLEMS = [Problem.from_shape(16, 8 + i, 12) for i in range(2)]


def test_entries_of_a_backend_absent_here_are_skipped_and_kept(isolated: Any, fake_backend: Any) -> None:
    fake_backend("fa", kernels=("k0",), version="1.0")
    tuner: Selector = isolated.selector
    platform = tuner.platform(NUMPY)
    for problem in PROBLEMS:
        tuner.store.put(platform.namespace, problem.key, record(problem.key, winner="fa/k0",
                                                                 versions=platform.versions))  # fmt: skip
    assert MsgpackFileStore(isolated.cache_path).count() == 2

    # Another process on the same file without the backend "fa" (not installed, or
    # disabled): it uses Default for these problems and leaves their entries alone.
    lacking = Selector(
        plugins=PluginManager(load_entry_points=False), store=MsgpackFileStore(isolated.cache_path)
    )
    with pytest.warns(RuntimeWarning, match="no backend 'fa'.*kept") as caught:
        for problem in PROBLEMS:
            assert lacking.lookup(problem, NUMPY) is None
            decision = lacking.decide(problem, NUMPY, "cached")
            assert decision.source == "default"
    assert len(caught) == 1  # once per backend, not per problem
    assert lacking.stats.unavailable == 4 and lacking.stats.invalidated == 0
    summary = lacking.validate(NUMPY, delete=True)
    assert summary.unavailable == [p.key for p in PROBLEMS] and summary.invalidated == []
    assert MsgpackFileStore(isolated.cache_path).count() == 2

    # Where the backend is present again, the entries serve as before.
    again = Selector(plugins=isolated.plugins, store=MsgpackFileStore(isolated.cache_path))
    assert all(again.lookup(p, NUMPY) is not None for p in PROBLEMS)


def test_tuning_without_a_backend_never_replaces_that_backends_entry(
    isolated: Any, fake_backend: Any
) -> None:
    fake_backend("fa", kernels=("k0",), version="1.0")
    platform = isolated.selector.platform(NUMPY)
    problem = PROBLEMS[0]
    mine = record(problem.key, winner="fa/k0", versions=platform.versions)
    isolated.selector.store.put(platform.namespace, problem.key, mine)

    # A process without "fa" tunes the problem again (tune mode, or --force): it measured
    # without fa's kernel, so its verdict cannot replace the entry fa's kernel won.
    lacking = Selector(
        plugins=PluginManager(load_entry_points=False),
        store=MsgpackFileStore(isolated.cache_path),
        settings=isolated.selector.settings,
    )
    with pytest.warns(RuntimeWarning, match="kept the cached choices of backend 'fa'"):
        found = lacking.tune(problem, NUMPY, force=True)
    assert found.winner == "default/default"  # what this process measured, and runs
    kept = MsgpackFileStore(isolated.cache_path).get(platform.namespace, problem.key)
    assert kept is not None and kept.winner == "fa/k0"


def test_a_backend_that_says_its_winner_is_gone_still_invalidates(isolated: Any) -> None:
    plugins = isolated.plugins
    with registered(plugins, FakeBackend("fa", kernels=("k0",), version="2.0")):
        selector: Selector = isolated.selector
        platform = selector.platform(NUMPY)
        old = {**platform.versions, "fa": "1.0"}
        selector.store.put(platform.namespace, PROBLEMS[0].key,
                           record(PROBLEMS[0].key, winner="fa/k_removed", versions=old))  # fmt: skip
        assert selector.lookup(PROBLEMS[0], NUMPY) is None
        assert selector.stats.invalidated == 1
    assert MsgpackFileStore(isolated.cache_path).count() == 0


_TUNED_PROCESS = r"""
import json, sys
import numpy as np
import unimatmul
from unimatmul.cache.file_store import MsgpackFileStore
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.backend import Target
from unimatmul.core.plugins import PluginManager
from unimatmul.core.problem import Problem
from unimatmul.tuning.selector import get_selector

sys.path.insert(0, sys.argv[2])
from cache_helpers import record

a, b = np.ones((24, 16), np.float32), np.ones((16, 40), np.float32)
target = Target(adapter_for_kind("numpy"), CPU)
selector = get_selector()
platform = selector.platform(target)
store = MsgpackFileStore(sys.argv[1])
for m in (24, 32):
    problem, _ = Problem.from_operands(target.adapter, np.ones((m, 16), np.float32), b)
    winner = next(c.identity for c in selector.tuner.backends_for(target)[0].candidates(problem, target))
    store.note_platform(platform.namespace, platform.to_dict())
    store.put(platform.namespace, problem.key, record(problem.key, winner=winner, versions=platform.versions))
print(json.dumps(sorted(b.name for b in selector.tuner.backends_for(target))))
"""

_CACHED_CALL = r"""
import numpy as np
import unimatmul
from unimatmul.tuning.selector import get_selector
a, b = np.ones((24, 16), np.float32), np.ones((16, 40), np.float32)
unimatmul.matmul(a, b)
print(get_selector().stats.summary())
"""


def test_a_process_without_onednn_keeps_the_onednn_entries(tmp_path: Path) -> None:
    # The issue's own steps, with the real oneDNN plugin and real processes.
    path = tmp_path / "shared.msgpack"
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    env["UNIMATMUL_CACHE"] = str(path)
    helpers = str(Path(__file__).parent)
    first = subprocess.run([PYTHON, "-c", _TUNED_PROCESS, str(path), helpers], env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert first.returncode == 0, first.stderr
    assert "onednn" in json.loads(first.stdout)
    assert MsgpackFileStore(path).count() == 2
    without = subprocess.run([PYTHON, "-c", _CACHED_CALL], env={**env, "UNIMATMUL_DISABLE_PLUGINS": "onednn"},
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert without.returncode == 0, without.stderr
    assert "0 invalidated" in without.stdout
    assert MsgpackFileStore(path).count() == 2
