"""A call that fails writes nothing: not the cache (``tune``), not the record file
(``record``). Whatever the array library would refuse when the call runs is refused
before the Selector tunes or records it, and ``out`` is left as it was."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import unimatmul

RNG = np.random.default_rng(7)


def _np(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _t(*shape: int, **kwargs: Any) -> torch.Tensor:
    return torch.from_numpy(_np(*shape)).requires_grad_(kwargs.get("requires_grad", False))


def _read_only_out() -> np.ndarray:
    out = np.full((6, 7), np.nan, np.float32)
    out.flags.writeable = False
    return out


def _inference_out() -> torch.Tensor:
    with torch.inference_mode():
        return torch.full((6, 7), float("nan"))


FAILING: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    (
        "a requires grad",
        lambda: unimatmul.matmul(_t(6, 5, requires_grad=True), _t(5, 7)),
        ValueError,
        r"a requires grad.*torch.no_grad\(\).*a.detach\(\)",
    ),
    (
        "bias requires grad",
        lambda: unimatmul.matmul(_t(6, 5), _t(5, 7), bias=_t(7, requires_grad=True)),
        ValueError,
        "bias requires grad",
    ),
    (
        "out requires grad",
        lambda: unimatmul.matmul(_t(6, 5), _t(5, 7), out=_t(6, 7, requires_grad=True)),
        ValueError,
        "out requires grad",
    ),
    # No check of ours names these: the array library's own error, raised before tuning.
    (
        "out an inference tensor",
        lambda: unimatmul.matmul(_t(6, 5), _t(5, 7), out=_inference_out()),
        RuntimeError,
        "inference tensor",
    ),
    (
        "out read-only",
        lambda: unimatmul.matmul(_np(6, 5), _np(5, 7), out=_read_only_out()),
        ValueError,
        "read-only",
    ),
]


@pytest.fixture
def record_file(isolated: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "problems.jsonl"
    monkeypatch.setenv("UNIMATMUL_RECORD_FILE", str(path))
    return path


@pytest.mark.parametrize(("name", "call", "error", "match"), FAILING, ids=[c[0] for c in FAILING])
def test_a_failing_call_is_neither_tuned_nor_recorded(
    isolated: Any,
    record_file: Path,
    name: str,
    call: Callable[[], Any],
    error: type[Exception],
    match: str,
) -> None:
    for mode in ("tune", "record", "cached", "off"):
        with unimatmul.mode(mode), pytest.raises(error, match=match):
            call()
    assert isolated.selector.stats.tuned == 0
    assert isolated.store_count() == 0
    assert not isolated.cache_path.exists()
    assert not record_file.exists()


def test_without_grad_mode_tensors_that_require_grad_are_tuned(isolated: Any) -> None:
    a, b = _t(6, 5, requires_grad=True), _t(5, 7)
    with torch.no_grad(), unimatmul.mode("tune"):
        out = unimatmul.matmul(a, b)
    ref = a.detach().double() @ b.double()
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
    assert isolated.selector.stats.tuned == 1


@pytest.mark.parametrize("mode", ["tune", "record"])
def test_the_check_before_tuning_leaves_out_as_it_was(isolated: Any, record_file: Path, mode: str) -> None:
    # With beta != 0 and no c, out holds C: the call made before tuning must not change it.
    a, b = _np(6, 5), _np(5, 7)
    c = _np(6, 7)
    out = c.copy()
    with unimatmul.mode(mode):
        unimatmul.matmul(a, b, out=out, alpha=0.5, beta=2.0)
    ref = 0.5 * (a.astype(np.float64) @ b) + 2.0 * c
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
