"""Device state read at tuning time (tuning/conditions.py): nvidia-smi's fields, the CPU's."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

from unimatmul.tuning import conditions
from unimatmul.tuning.conditions import cpu_state, parse_smi_line, read_device_state


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


def test_nvml_is_initialised_once_per_process_and_each_device_looked_up_once(monkeypatch: Any) -> None:
    # NVML itself cannot run here (no NVIDIA driver): a stand-in module counts the calls.
    calls: dict[str, int] = {"init": 0, "shutdown": 0, "handle": 0}

    def init() -> None:
        calls["init"] += 1

    def shutdown() -> None:
        calls["shutdown"] += 1

    def handle(index: int) -> str:
        calls["handle"] += 1
        return f"device {index}"

    fake = SimpleNamespace(
        nvmlInit=init,
        nvmlShutdown=shutdown,
        nvmlDeviceGetHandleByIndex=handle,
        NVML_CLOCK_SM=0,
        NVML_CLOCK_MEM=1,
        NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetClockInfo=lambda h, kind: 1980 if kind == 0 else 3201,
        nvmlDeviceGetTemperature=lambda h, kind: 41,
        nvmlDeviceGetPowerUsage=lambda h: 123_400,
        nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 4,
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(conditions, "_nvml", {})
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    device = SimpleNamespace(kind="cuda", index=0)
    readings = [read_device_state(device) for _ in range(3)]
    assert (
        readings
        == [
            {"gpu_sm_mhz": 1980, "gpu_mem_mhz": 3201, "gpu_temp_c": 41, "gpu_power_w": 123, "gpu_throttle": 4}
        ]
        * 3
    )
    assert calls == {"init": 1, "shutdown": 0, "handle": 1}


def test_without_nvml_the_reading_falls_back_and_never_raises(monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    monkeypatch.setattr(conditions, "_nvml", {})
    monkeypatch.setattr(conditions, "_nvidia_smi", lambda: None)
    assert read_device_state(SimpleNamespace(kind="cuda", index=0)) == {}
    assert conditions._nvml == {"module": None}  # looked for once
