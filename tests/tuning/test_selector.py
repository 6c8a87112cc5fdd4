"""The Selector: modes, failures contained, one tuning per key, entries re-checked on upgrades."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import unimatmul
from unimatmul.api import clear_fast_path
from unimatmul.backend import DEFAULT, Target
from unimatmul.cache.record import TuningRecord
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.core.problem import Problem
from unimatmul.core.runners import DefaultRunner
from unimatmul.tuning import tuner as tuner_module
from unimatmul.tuning.harness import Harness
from unimatmul.tuning.selector import Selector

NUMPY = Target(adapter_for_kind("numpy"), CPU)


def _operands(m: int = 24, n: int = 20, k: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


def _check(out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def _problem(a: np.ndarray, b: np.ndarray) -> Problem:
    return Problem.from_operands(NUMPY.adapter, a, b)[0]


def _namespace(isolated: Any) -> str:
    return str(isolated.selector.platform(NUMPY).namespace)


# --- modes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "context", "tunes"),
    [
        (None, None, False),  # the default mode is "cached": never tunes
        ("cached", None, False),
        ("off", None, False),
        ("tune", None, True),
        ("TUNE ", None, True),  # case and spaces do not matter
        ("tune", "off", False),  # the context manager wins over the environment
        ("tune", "cached", False),
        ("off", "tune", True),
    ],
)
def test_modes(
    isolated: Any, monkeypatch: pytest.MonkeyPatch, env: str | None, context: str | None, tunes: bool
) -> None:
    if env is not None:
        monkeypatch.setenv("UNIMATMUL_MODE", env)
    a, b = _operands()
    if context is None:
        out = unimatmul.matmul(a, b)
    else:
        with unimatmul.mode(context):
            assert unimatmul.get_mode() == context
            out = unimatmul.matmul(a, b)
    _check(out, a, b)
    stats = isolated.selector.stats
    assert stats.tuned == (1 if tunes else 0)
    assert isolated.store_count() == (1 if tunes else 0)
    assert isolated.cache_path.exists() == tunes


def test_off_never_reads_the_cache(isolated: Any) -> None:
    a, b = _operands()
    with unimatmul.mode("tune"):
        unimatmul.matmul(a, b)
    hits = isolated.selector.stats.cache_hits
    decision = isolated.selector.decide(_problem(a, b), NUMPY, "off")
    assert decision.source == "default" and decision.runner.candidate == DEFAULT
    assert isolated.selector.stats.cache_hits == hits


def test_mode_context_is_per_thread_and_nests(isolated: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIMATMUL_MODE", "off")
    seen: list[str] = []
    with unimatmul.mode("tune"):
        with unimatmul.mode("cached"):
            assert unimatmul.get_mode() == "cached"
        assert unimatmul.get_mode() == "tune"
        thread = threading.Thread(target=lambda: seen.append(unimatmul.get_mode()))
        thread.start()
        thread.join()
    assert seen == ["off"]  # another thread sees the environment, not this block
    assert unimatmul.get_mode() == "off"


def test_cached_mode_uses_a_stored_answer(isolated: Any) -> None:
    a, b = _operands()
    with unimatmul.mode("tune"):
        unimatmul.matmul(a, b)
    record = isolated.selector.store.get(_namespace(isolated), _problem(a, b).key)
    fresh = Selector(settings=isolated.selector.settings, plugins=isolated.plugins)
    decision = fresh.decide(_problem(a, b), NUMPY, "cached")
    assert decision.source == "cache" and decision.record is not None
    assert decision.record.winner == record.winner == decision.runner.candidate.identity
    assert fresh.stats.tuned == 0 and fresh.stats.cache_hits == 1


def test_restricting_backends(isolated: Any, fake_backend: Callable[..., Any]) -> None:
    fake_backend("extra", "correct")
    only_default = Selector(plugins=isolated.plugins, settings=isolated.selector.settings, backends=[])
    record = only_default.tune(Problem.from_shape(8, 8, 8), NUMPY, store=False)
    assert [r.identity for r in record.results] == [DEFAULT.identity]
    only_extra = Selector(plugins=isolated.plugins, settings=isolated.selector.settings, backends=["extra"])
    record = only_extra.tune(Problem.from_shape(8, 8, 8), NUMPY, store=False)
    assert [r.identity for r in record.results] == [DEFAULT.identity, "extra/k0"]


# --- failures are contained ---------------------------------------------------------


def test_a_backend_failing_to_list_candidates_warns_once(
    isolated: Any, fake_backend: Callable[..., Any]
) -> None:
    broken = fake_backend("broken", "raise_candidates")
    with (
        unimatmul.mode("tune"),
        pytest.warns(RuntimeWarning, match="'broken' failed to list candidates") as caught,
    ):
        for seed in range(3):
            a, b = _operands(m=10 + seed, seed=seed)  # three problems, three tunings
            _check(unimatmul.matmul(a, b), a, b)
    assert broken.candidate_calls == 3
    assert len([w for w in caught if "broken" in str(w.message)]) == 1
    assert isolated.selector.stats.tuned == 3


def test_a_cached_winner_that_fails_to_prepare_falls_back(
    isolated: Any, fake_backend: Callable[..., Any]
) -> None:
    fake_backend("flaky", "raise_prepare")
    a, b = _operands()
    problem = _problem(a, b)
    isolated.selector.store.put(
        _namespace(isolated), problem.key, TuningRecord(problem.key, "flaky/k0", 1e-6, 2e-6)
    )
    with unimatmul.mode("cached"), pytest.warns(RuntimeWarning, match="using Default .* failed to prepare"):
        _check(unimatmul.matmul(a, b), a, b)
    assert isolated.selector.stats.fallbacks == 1


def test_a_cached_winner_of_a_missing_backend_falls_back(isolated: Any) -> None:
    a, b = _operands()
    problem = _problem(a, b)
    record = TuningRecord(problem.key, "uninstalled/kernel?x=1", 1e-6, 2e-6)
    isolated.selector.store.put(_namespace(isolated), problem.key, record)
    with unimatmul.mode("cached"), pytest.warns(RuntimeWarning, match="no backend 'uninstalled'"):
        _check(unimatmul.matmul(a, b), a, b)


def test_a_kernel_failing_on_a_call_falls_back_and_warns_once(
    isolated: Any, fake_backend: Callable[..., Any]
) -> None:
    fake = fake_backend("crashy", "correct")
    a, b = _operands()
    problem = _problem(a, b)
    isolated.selector.store.put(
        _namespace(isolated), problem.key, TuningRecord(problem.key, "crashy/k0", 1e-6, 2e-6)
    )
    with unimatmul.mode("cached"):
        _check(unimatmul.matmul(a, b), a, b)  # it works at first ...
        assert fake.calls == 1
        fake.behaviour = "raise_run"  # ... then starts failing (a driver, a library upgrade ...)
        with pytest.warns(RuntimeWarning, match="crashy/k0 failed .* using Default"):
            _check(unimatmul.matmul(a, b), a, b)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(3):
                _check(unimatmul.matmul(a, b), a, b)  # Default now, no second warning
    assert fake.calls == 2
    assert isolated.selector.stats.fallbacks == 1


def test_errors_of_default_itself_reach_the_caller(isolated: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _operands()

    def broken_matmul(self: Any, *args: Any) -> None:
        msg = "numpy failed"
        raise MemoryError(msg)

    monkeypatch.setattr(DefaultRunner, "__call__", broken_matmul)
    with unimatmul.mode("off"), pytest.raises(MemoryError, match="numpy failed"):
        unimatmul.matmul(a, b)


# --- one tuning per key -------------------------------------------------------------


def test_one_tuning_per_key_when_threads_ask_at_once(isolated: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[str] = []
    lock = threading.Lock()

    class CountingHarness(Harness):
        def measure(self, problem: Problem, *args: Any, **kwargs: Any) -> TuningRecord:
            with lock:
                runs.append(problem.key)
            return super().measure(problem, *args, **kwargs)

    monkeypatch.setattr(tuner_module, "Harness", CountingHarness)
    a, b = _operands(m=72, n=40, k=56)
    barrier = threading.Barrier(8)
    results: list[np.ndarray] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait()
            with unimatmul.mode("tune"):
                out = unimatmul.matmul(a, b)
            with lock:
                results.append(out)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert runs == [_problem(a, b).key]
    assert isolated.selector.stats.tuned == 1
    # The lock of a key lives only while threads tune or wait for it.
    assert not isolated.selector._tune_locks
    assert len(results) == 8
    for out in results:
        _check(out, a, b)


# --- library upgrades: entries are re-checked one by one ----------------------------


def _stored_with_old_versions(isolated: Any, winner: str, problem: Problem) -> None:
    platform = isolated.selector.platform(NUMPY)
    versions = dict(platform.versions) | {"onednn": "0.0.1-old"}
    record = TuningRecord(problem.key, winner, 1e-6, 2e-6, versions=versions)
    isolated.selector.store.put(platform.namespace, problem.key, record)


def test_a_still_offered_winner_survives_a_version_change(isolated: Any) -> None:
    a, b = _operands()
    problem = _problem(a, b)
    identity = isolated.plugins.backends()["onednn"].candidates(problem, NUMPY)[0].identity
    _stored_with_old_versions(isolated, identity, problem)
    fresh = isolated.selector
    record = fresh.lookup(problem, NUMPY)
    assert record is not None and record.winner == identity
    assert fresh.stats.invalidated == 0 and fresh.stats.cache_hits == 1
    decision = fresh.decide(problem, NUMPY, "cached")
    assert decision.runner.candidate.identity == identity


def test_a_winner_gone_after_a_version_change_is_dropped(isolated: Any) -> None:
    a, b = _operands()
    problem = _problem(a, b)
    other = Problem.from_shape(5, 6, 7)
    valid = isolated.plugins.backends()["onednn"].candidates(other, NUMPY)[0].identity
    _stored_with_old_versions(isolated, "onednn/jit:no_such_isa", problem)
    _stored_with_old_versions(isolated, valid, other)
    fresh = isolated.selector
    assert fresh.lookup(problem, NUMPY) is None
    assert fresh.stats.invalidated == 1
    assert isolated.selector.store.get(_namespace(isolated), problem.key) is None
    # Only that entry went: its neighbour, still valid, stays.
    assert fresh.lookup(other, NUMPY) is not None
    # In tune mode the dropped problem is tuned again; in cached mode it is Default.
    clear_fast_path()
    with unimatmul.mode("tune"):
        _check(unimatmul.matmul(a, b), a, b)
    assert isolated.selector.stats.tuned == 1


def test_a_fake_backend_upgrade_keeps_or_drops_its_entries(
    isolated: Any, fake_backend: Callable[..., Any]
) -> None:
    fake = fake_backend("vendor", "correct", version="1.0", kernels=("k0", "k1"))
    problem = Problem.from_shape(12, 8, 4)
    platform = isolated.selector.platform(NUMPY)
    assert platform.versions["vendor"] == "1.0"
    for winner in ("vendor/k0", "vendor/k1"):
        key = Problem.from_shape(12, 8, 4 if winner.endswith("0") else 5).key
        record = TuningRecord(key, winner, 1e-6, 2e-6, versions=platform.versions)
        isolated.selector.store.put(platform.namespace, key, record)
    # Version 2.0 still ships k0 but dropped k1.
    fake.version, fake.kernels = "2.0", ("k0",)
    # A new process: the platform (and so the versions) are detected again; the file is the same.
    fresh = Selector(
        settings=isolated.selector.settings, plugins=isolated.plugins, store=isolated.selector.store
    )
    assert fresh.platform(NUMPY).versions["vendor"] == "2.0"
    assert fresh.lookup(problem, NUMPY) is not None
    assert fresh.lookup(Problem.from_shape(12, 8, 5), NUMPY) is None
    assert fresh.stats.cache_hits == 1 and fresh.stats.invalidated == 1


def test_prefer_kernel_picks_a_named_kernel_of_a_backend(
    isolated: Any, fake_backend: Callable[..., Any]
) -> None:
    """``unimatmul.testing.prefer_kernel`` with ``names``: whichever wins, the stored winner
    is the fastest checked kernel of that backend with one of those names (what a GPU test
    that needs a padded cuBLASLt kernel asks for)."""
    from unimatmul.backend import Candidate
    from unimatmul.testing import prefer_kernel

    fake_backend("fa", kernels=("k0", "k1", "k2"))
    problem = Problem.from_shape(24, 16, 8)
    for names in (("k1",), ("k0", "k2")):
        record = prefer_kernel(isolated.selector, problem, NUMPY, backend="fa", names=names)
        winner = Candidate.from_identity(record.winner)
        assert (winner.backend, winner.name in names) == ("fa", True), record.winner
        assert isolated.selector.lookup(problem, NUMPY).winner == record.winner  # stored


def test_selection_state_keeps_the_process_wide_pieces_in_one_object() -> None:
    """The Selector, the tuning gate and the forget hooks are one object's state: a fresh
    one starts empty, a hook registers once, and removing the gate removes ``collective``."""
    from unimatmul.tuning import selector as selector_module
    from unimatmul.tuning.selector import SelectionState

    assert selector_module.get_selector.__self__ is selector_module.STATE  # type: ignore[attr-defined]
    state = SelectionState()
    assert state.selector is None and state.tuning_gate is None
    told: list[int] = []

    def hook() -> None:
        told.append(1)

    state.on_forget(hook)
    state.on_forget(hook)
    mine: Any = object()  # stands for a Selector: the state only keeps it
    assert state.set_selector(mine) is None and told == [1]
    assert state.get_selector() is mine and state.set_selector(None) is mine and told == [1, 1]
    state.set_tuning_gate(lambda problem, target: True, collective=lambda: True)
    assert state.collective is not None and state.collective()
    state.set_tuning_gate(None)
    assert state.tuning_gate is None and state.collective is None
    assert selector_module.STATE.selector is not mine  # the process's own state is untouched
