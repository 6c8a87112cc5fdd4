"""UNIMATMUL_TUNE_BUDGET_S for a routed PyTorch model: tuning on its calls stops at the
budget, the rest runs PyTorch's kernels, results stay right (Python and native kernels)."""

from __future__ import annotations

import itertools
import warnings

import pytest

torch = pytest.importorskip("torch")

from torch_helpers import Env  # noqa: E402

import unimatmul  # noqa: E402
import unimatmul.torch as ut  # noqa: E402


def test_a_routed_model_tunes_until_its_budget_is_spent(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    selector = env.selector
    monkeypatch.setenv("UNIMATMUL_TUNE_BUDGET_S", "0.15")
    torch.manual_seed(0)
    # Layers enough that no machine tunes them all in 0.15 s (a 16-core host tuned 30 of 31).
    widths = [24 + 8 * i for i in range(121)]
    model = torch.nn.Sequential(*(torch.nn.Linear(a, b) for a, b in itertools.pairwise(widths)))
    x = torch.randn(6, widths[0])
    with torch.no_grad():
        expected = model.double()(x.double())
        model.float()
        with warnings.catch_warnings(record=True) as caught, ut.enabled(), unimatmul.mode("tune"):
            warnings.simplefilter("always")
            first = model(x)
            tuned = selector.stats.tuned
            second = model(x)
    assert 0 < tuned < len(widths) - 1
    assert selector.stats.tuned == tuned  # the untuned layers run PyTorch's kernels from now on
    for out in (first, second):
        torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-4)
    assert sum("tuning budget" in str(w.message) for w in caught) == 1
    assert selector.store.count() == tuned
