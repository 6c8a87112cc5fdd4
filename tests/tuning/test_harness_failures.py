"""A plugin's SystemExit is its failure; the user's Ctrl-C stops tuning and stores nothing.

``SystemExit`` raised inside a plugin's kernel during tuning must not end the user's
program. ``MatmulPrimitive.__del__`` must not print
"Exception ignored ... 'NoneType' object has no attribute 'suppress'" at exit.
"""

from __future__ import annotations

import gc
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from harness_fakes import KernelBackend, exits_on_call, interrupted_on_call, right

import unimatmul
from unimatmul.backend import Target
from unimatmul.cache.record import FAILED, OK
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.core.problem import Problem

NUMPY = Target(adapter_for_kind("numpy"), CPU)


def _operands(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((48, 40)).astype(np.float32), rng.standard_normal((40, 56)).astype(np.float32)


@pytest.mark.parametrize("call", [1, 2, 3, 6], ids=["first-check", "second-check", "late-check", "timing"])
def test_system_exit_in_a_kernel_is_that_candidates_failure(isolated: Any, backends: Any, call: int) -> None:
    backends(KernelBackend("quits", {"k": exits_on_call(call)}), KernelBackend("fine", {"k": right}))
    a, b = _operands()
    with unimatmul.mode("tune"):
        out = unimatmul.matmul(a, b)  # the program goes on
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    (_, _, record), *_ = list(isolated.selector.store.items())
    quits = record.result("quits/k")
    assert quits is not None and quits.status == FAILED
    assert "SystemExit: 3" in quits.note
    assert record.winner != "quits/k"
    assert record.result("fine/k").status in (OK, "pruned")


def test_system_exit_while_preparing_or_listing_is_a_failure_too(isolated: Any, backends: Any) -> None:
    class ListsThenExits(KernelBackend):
        def candidates(self, problem: Problem, target: Target) -> list[Any]:
            raise SystemExit("no candidates today")

    backends(
        KernelBackend("prepexit", {"k": right}, prepare_raises=SystemExit(4)),
        ListsThenExits("listexit", {"k": right}),
    )
    a, b = _operands(1)
    with (
        pytest.warns(RuntimeWarning, match="listexit.*failed to list candidates.*SystemExit"),
        unimatmul.mode("tune"),
    ):
        unimatmul.matmul(a, b)
    (_, _, record), *_ = list(isolated.selector.store.items())
    prepexit = record.result("prepexit/k")
    assert prepexit is not None and prepexit.status == FAILED and "raised SystemExit(4)" in prepexit.note


def test_a_stored_winner_whose_prepare_exits_falls_back_to_default(isolated: Any, backends: Any) -> None:
    # The Selector prepares a stored winner on the first call that needs it: a SystemExit
    # there must not end the program either (one warning, Default).
    backends(KernelBackend("late", {"k": right}))
    a, b = _operands(3)
    with unimatmul.mode("tune"):
        unimatmul.matmul(a, b)
    (namespace, key, record), *_ = list(isolated.selector.store.items())
    # As if it had won (a later record wins a merge).
    isolated.selector.store.put(
        namespace, key, replace(record, winner="late/k", tuned_at=record.tuned_at + 1)
    )
    unimatmul.api.clear_fast_path()
    isolated.plugins.backends()["late"].prepare_raises = SystemExit(5)
    with pytest.warns(RuntimeWarning, match=r"using Default .*backend 'late' raised SystemExit\(5\)"):
        out = unimatmul.matmul(a, b)  # cached mode: the stored winner is prepared, and exits
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_ctrl_c_during_tuning_stops_it_and_stores_nothing(isolated: Any, backends: Any) -> None:
    interrupting = KernelBackend("ctrlc", {"k": interrupted_on_call(6)})
    backends(interrupting)
    a, b = _operands(2)
    with pytest.raises(KeyboardInterrupt), unimatmul.mode("tune"):
        unimatmul.matmul(a, b)
    assert interrupting.calls == 6  # it reached timing; nothing ran after the interrupt
    assert isolated.store_count() == 0  # no partial record
    # Tuning is not left half-done: the next call (no Ctrl-C this time) tunes and stores.
    interrupting.kernels["k"] = right
    with unimatmul.mode("tune"):
        out = unimatmul.matmul(a, b)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert isolated.store_count() == 1


def test_a_onednn_primitive_finalised_at_interpreter_exit_says_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At exit Python sets the globals of modules still alive to None before their objects
    # go; a finalizer that reads a module global then raises, and Python prints
    # "Exception ignored in: <MatmulPrimitive.__del__>". pytest turns that into an error
    # (PytestUnraisableExceptionWarning is an error in this project's settings).
    dnnl_module = pytest.importorskip("unimatmul_backends.onednn._dnnl")
    try:
        dnnl = dnnl_module.get_dnnl()
    except Exception as exc:  # pragma: no cover - the library is part of the test extras
        pytest.skip(f"oneDNN not loadable: {exc}")
    spec = dnnl_module.MatmulSpec(batch=1, m=8, k=8, n=8)
    prim = dnnl.matmul(spec)
    unraisable: list[Any] = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)
    for name in [n for n in vars(dnnl_module) if not n.startswith("__")]:
        monkeypatch.setattr(dnnl_module, name, None)
    del prim
    gc.collect()
    monkeypatch.undo()
    assert unraisable == []
