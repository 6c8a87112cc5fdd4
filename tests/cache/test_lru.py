"""The bounded in-process level of the cache (cache/lru.py)."""

from __future__ import annotations

import pytest

from unimatmul.cache.lru import LRU, lru_size


def test_the_lru_forgets_the_least_recently_used() -> None:
    lru: LRU[int, str] = LRU(3)
    for i in range(3):
        lru.put(i, str(i))
    assert lru.get(0) == "0"  # 0 is now the most recent
    lru.put(3, "3")
    assert lru.get(1) is None and lru.get(0) == "0" and len(lru) == 3
    for i in range(1000):
        lru.put(i, str(i))
    assert len(lru) == 3


def test_the_bound_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIMATMUL_LRU_SIZE", "7")
    assert lru_size() == 7 and LRU().maxsize == 7
    assert LRU(2).maxsize == 2  # an explicit bound wins
    monkeypatch.setenv("UNIMATMUL_LRU_SIZE", "zero")
    with pytest.raises(ValueError, match="UNIMATMUL_LRU_SIZE"):
        lru_size()
    monkeypatch.delenv("UNIMATMUL_LRU_SIZE")
    assert lru_size(123) == 123
