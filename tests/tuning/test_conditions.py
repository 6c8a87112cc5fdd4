"""Device state read at tuning time (tuning/conditions.py): nvidia-smi's fields, the CPU's."""

from __future__ import annotations

from types import SimpleNamespace

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
