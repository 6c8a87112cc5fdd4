"""The bounded in-process level, and device state read at tuning time."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from unimatmul.cache.lru import LRU, lru_size
from unimatmul.tuning.conditions import cpu_state, parse_smi_line, read_device_state


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


def test_nvidia_smi_lines_are_parsed_and_unreadable_fields_left_out() -> None:
    assert parse_smi_line("1980, 3201, 41, 123.45, 0x0000000000000004") == {
        "gpu_sm_mhz": 1980,
        "gpu_mem_mhz": 3201,
        "gpu_temp_c": 41,
        "gpu_power_w": 123,
        "gpu_throttle": 4,
    }
    assert parse_smi_line("[N/A], 1593, [Not Supported], 60.1, 0x0") == {
        "gpu_mem_mhz": 1593,
        "gpu_power_w": 60,
        "gpu_throttle": 0,
    }


def test_cpu_state_holds_plausible_readings_or_nothing() -> None:
    state = cpu_state()
    for name in ("cpu_mhz", "cpu_mhz_min", "cpu_max_mhz"):
        if name in state:
            value = state[name]
            assert isinstance(value, int) and 10 <= value <= 20_000, (name, value)
    if "cpu_temp_c" in state:
        assert isinstance(state["cpu_temp_c"], int) and -50 <= state["cpu_temp_c"] <= 150
    assert read_device_state(SimpleNamespace(kind="cpu", index=0)) .keys() <= {
        "cpu_mhz", "cpu_mhz_min", "cpu_max_mhz", "governor", "cpu_temp_c"
    }  # fmt: skip
    assert read_device_state(SimpleNamespace(kind="tpu", index=0)) == {}
