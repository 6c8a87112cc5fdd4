"""The device's state while it was tuned: clocks, temperature, power, where readable.

Read once per tuned problem (never on the hot path) and kept in the TuningRecord, so
that a record measured on a throttled GPU or a CPU stuck at a low clock can be
recognised later. Everything here is best effort: whatever cannot be read is left
out, nothing raises, and a missing tool is looked for once per process.

CPU: the current and maximum frequency (cpufreq in sysfs, else ``/proc/cpuinfo``),
the frequency governor and the package temperature. NVIDIA: SM and memory clocks,
temperature, power and the active throttle reasons, through NVML (``pynvml``) when
installed (initialised once per process), else one ``nvidia-smi`` query. AMD: current
SCLK/MCLK and temperature from the amdgpu sysfs files.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import shutil
import subprocess
import threading
from typing import Any, Protocol

Scalar = str | int | float | bool | None

_SMI_TIMEOUT_S = 5.0
_MAX_CPUS_READ = 256


class _DeviceLike(Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def index(self) -> int: ...


def read_device_state(device: _DeviceLike) -> dict[str, Scalar]:
    """What can be read now about ``device`` (``cpu``, ``cuda:N``, ``hip:N``); may be empty."""
    try:
        if device.kind == "cpu":
            return cpu_state()
        if device.kind == "cuda":
            return nvidia_state(device.index)
        if device.kind == "hip":
            return amd_state(device.index)
    except Exception:  # best effort: a probe must never cost a tuning result
        return {}
    return {}


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))[:_MAX_CPUS_READ]
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(min(os.cpu_count() or 1, _MAX_CPUS_READ)))


def cpu_state() -> dict[str, Scalar]:
    state: dict[str, Scalar] = {}
    khz = [
        int(text)
        for cpu in _cpus()
        if (text := _read(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq")) and text.isdigit()
    ]
    if khz:
        state["cpu_mhz"] = round(sum(khz) / len(khz) / 1000)
        state["cpu_mhz_min"] = round(min(khz) / 1000)
    else:
        mhz = _cpuinfo_mhz()
        if mhz:
            state["cpu_mhz"] = round(sum(mhz) / len(mhz))
            state["cpu_mhz_min"] = round(min(mhz))
    first = _cpus()[0] if _cpus() else 0
    top = _read(f"/sys/devices/system/cpu/cpu{first}/cpufreq/cpuinfo_max_freq")
    if top and top.isdigit():
        state["cpu_max_mhz"] = round(int(top) / 1000)
    governor = _read(f"/sys/devices/system/cpu/cpu{first}/cpufreq/scaling_governor")
    if governor:
        state["governor"] = governor
    temp = _cpu_temperature()
    if temp is not None:
        state["cpu_temp_c"] = temp
    return state


def _cpuinfo_mhz() -> list[float]:
    wanted = set(_cpus())
    values: list[float] = []
    current = -1
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "processor":
                    with contextlib.suppress(ValueError):
                        current = int(value)
                elif key == "cpu MHz" and current in wanted:
                    with contextlib.suppress(ValueError):
                        values.append(float(value))
    except OSError:
        return []
    return values


def _cpu_temperature() -> int | None:
    for zone in sorted(glob.glob("/sys/class/thermal/thermal_zone*")):
        kind = (_read(f"{zone}/type") or "").lower()
        if any(word in kind for word in ("x86_pkg", "cpu", "soc", "k10temp", "coretemp")):
            text = _read(f"{zone}/temp")
            if text and text.lstrip("-").isdigit():
                return round(int(text) / 1000)
    for hwmon in sorted(glob.glob("/sys/class/hwmon/hwmon*")):
        if (_read(f"{hwmon}/name") or "") in ("coretemp", "k10temp", "zenpower", "cpu_thermal"):
            text = _read(f"{hwmon}/temp1_input")
            if text and text.lstrip("-").isdigit():
                return round(int(text) / 1000)
    return None


# --- NVIDIA ------------------------------------------------------------------------------


def _physical_index(index: int) -> str:
    """The NVML/nvidia-smi id of CUDA device ``index`` (CUDA_VISIBLE_DEVICES renumbers)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        items = [v.strip() for v in visible.split(",") if v.strip()]
        if index < len(items):
            return items[index]
    return str(index)


def nvidia_state(index: int) -> dict[str, Scalar]:
    ident = _physical_index(index)
    state = _nvml_state(ident)
    if state is None:
        state = _smi_state(ident)
    return state


_nvml_lock = threading.Lock()
#: NVML for this process: "module" (pynvml, or None where it cannot be used) and each
#: device's handle by its identifier. Initialised at the first reading and kept: an
#: initialisation per tuned problem costs more than the readings themselves.
_nvml: dict[str, Any] = {}


def _nvml_handle(ident: str) -> tuple[Any, Any]:
    """(pynvml, the device's handle), or (None, None) where NVML cannot be used."""
    with _nvml_lock:
        if "module" not in _nvml:
            try:
                import pynvml

                pynvml.nvmlInit()
                _nvml["module"] = pynvml
            except Exception:  # not installed, or no driver to talk to
                _nvml["module"] = None
        nvml = _nvml["module"]
        if nvml is None:
            return None, None
        handle = _nvml.get(ident)
        if handle is None:
            if ident.isdigit():
                handle = nvml.nvmlDeviceGetHandleByIndex(int(ident))
            else:
                handle = nvml.nvmlDeviceGetHandleByUUID(ident)
            _nvml[ident] = handle
        return nvml, handle


def _nvml_state(ident: str) -> dict[str, Scalar] | None:
    try:
        pynvml, handle = _nvml_handle(ident)
    except Exception:
        return None
    if pynvml is None:
        return None
    try:
        state: dict[str, Scalar] = {}
        probes: list[tuple[str, Any]] = [
            ("gpu_sm_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
            ("gpu_mem_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)),
            ("gpu_temp_c", lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)),
            ("gpu_power_w", lambda: round(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000)),
            ("gpu_throttle", lambda: int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))),
        ]
        for name, probe in probes:
            with contextlib.suppress(Exception):
                state[name] = int(probe())
        return state
    except Exception:
        return None


@functools.lru_cache(maxsize=1)
def _nvidia_smi() -> str | None:
    return shutil.which("nvidia-smi")


_SMI_FIELDS = (
    ("gpu_sm_mhz", "clocks.sm"),
    ("gpu_mem_mhz", "clocks.mem"),
    ("gpu_temp_c", "temperature.gpu"),
    ("gpu_power_w", "power.draw"),
    ("gpu_throttle", "clocks_throttle_reasons.active"),
)


def _smi_state(ident: str) -> dict[str, Scalar]:
    tool = _nvidia_smi()
    if tool is None:
        return {}
    query = ",".join(field for _, field in _SMI_FIELDS)
    try:
        done = subprocess.run(
            [tool, f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", ident],
            capture_output=True,
            text=True,
            timeout=_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    if done.returncode != 0:
        return {}
    return parse_smi_line(done.stdout.strip().splitlines()[0] if done.stdout.strip() else "")


def parse_smi_line(line: str) -> dict[str, Scalar]:
    """The values of one ``nvidia-smi --query-gpu`` CSV line (fields of _SMI_FIELDS)."""
    state: dict[str, Scalar] = {}
    for (name, _), text in zip(_SMI_FIELDS, line.split(","), strict=False):
        text = text.strip()
        try:
            value = int(text, 16) if text.lower().startswith("0x") else round(float(text))
        except ValueError:
            continue  # "[N/A]", "[Not Supported]"
        state[name] = value
    return state


# --- AMD -------------------------------------------------------------------------------


def amd_state(index: int) -> dict[str, Scalar]:
    cards = [
        card
        for card in sorted(glob.glob("/sys/class/drm/card[0-9]*/device"))
        if (_read(f"{card}/vendor") or "") == "0x1002" and os.path.exists(f"{card}/pp_dpm_sclk")
    ]
    visible = os.environ.get("HIP_VISIBLE_DEVICES") or os.environ.get("ROCR_VISIBLE_DEVICES") or ""
    items = [v.strip() for v in visible.split(",") if v.strip().isdigit()]
    physical = int(items[index]) if index < len(items) else index
    if physical >= len(cards):
        return {}
    card = cards[physical]
    state: dict[str, Scalar] = {}
    for name, file in (("gpu_sm_mhz", "pp_dpm_sclk"), ("gpu_mem_mhz", "pp_dpm_mclk")):
        for line in (_read(f"{card}/{file}") or "").splitlines():
            if line.rstrip().endswith("*"):
                digits = "".join(ch for ch in line.split(":", 1)[-1] if ch.isdigit())
                if digits:
                    state[name] = int(digits)
    for hwmon in sorted(glob.glob(f"{card}/hwmon/hwmon*")):
        text = _read(f"{hwmon}/temp1_input")
        if text and text.lstrip("-").isdigit():
            state["gpu_temp_c"] = round(int(text) / 1000)
        power = _read(f"{hwmon}/power1_average") or _read(f"{hwmon}/power1_input")
        if power and power.isdigit():
            state["gpu_power_w"] = round(int(power) / 1e6)
        break
    return state


if __name__ == "__main__":  # a quick look on a machine: python unimatmul/conditions.py [cpu|cuda:0|hip:0]
    import sys
    from types import SimpleNamespace

    kind, _, number = (sys.argv[1] if len(sys.argv) > 1 else "cpu").partition(":")
    print(read_device_state(SimpleNamespace(kind=kind, index=int(number or 0))))
