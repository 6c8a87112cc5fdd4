"""The Platform: the hardware and library versions that namespace the cache."""

from __future__ import annotations

import os
import platform as _pyplatform
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from unimatmul.core._backend import Backend, Target


@dataclass(frozen=True)
class Platform:
    """Vendor, arch, device and the exact versions of every candidate library.

    ``namespace`` (vendor, arch, device, cores, and the array library whose
    ``matmul`` is the Default) keys the cache: results never leak across it. The
    array library is part of it because a record's verdict is relative to the
    Default it was measured against (numpy.matmul and torch.matmul differ). Library
    versions are kept per entry, so that a library upgrade re-checks entries one by
    one instead of throwing a namespace away.
    """

    vendor: str
    arch: str
    device: str
    cores: int
    libraries: tuple[tuple[str, str], ...] = ()
    array: str = ""

    @property
    def namespace(self) -> str:
        base = f"{self.vendor}/{self.arch}/{self.device}/{self.cores}"
        return f"{base}/{self.array}" if self.array else base

    @property
    def versions(self) -> dict[str, str]:
        return dict(self.libraries)

    def to_dict(self) -> dict[str, Any]:
        return {
            "vendor": self.vendor,
            "arch": self.arch,
            "device": self.device,
            "cores": self.cores,
            "libraries": dict(self.libraries),
            "array": self.array,
        }


# ISA extensions in the order that changes which CPU kernels exist, best first.
_CPU_ISAS = (
    ("amx_bf16", "avx512_amx"),
    ("avx512_bf16", "avx512_bf16"),
    ("avx512_vnni", "avx512_vnni"),
    ("avx512f", "avx512"),
    ("avx2", "avx2"),
    ("sse4_2", "sse41"),
)


def _cpu_facts() -> tuple[str, str]:
    """(ISA class, model name) of this CPU, from /proc/cpuinfo where it exists."""
    machine = _pyplatform.machine() or "unknown"
    flags: set[str] = set()
    model = _pyplatform.processor() or machine
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "flags" and not flags:
                    flags = set(value.split())
                elif key == "model name" and model in ("", machine):
                    model = value.strip()
                if flags and model not in ("", machine):
                    break
    except OSError:
        pass
    isa = next((name for flag, name in _CPU_ISAS if flag in flags), "")
    arch = f"{machine}:{isa}" if isa else machine
    return arch, " ".join(model.split())


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def detect_platform(target: Target, backends: list[Backend]) -> Platform:
    """The Platform of a target: device facts plus versions of the serving backends."""
    device = target.device
    libraries: dict[str, str] = {}
    extra: dict[str, Any] = {}
    for backend in backends:
        if not backend.serves(target) or backend.availability() is not None:
            continue
        libraries.update(backend.versions())
        extra.update(backend.platform_info(target))
    libraries.update(_default_versions(target))
    if device.kind == "cpu":
        arch, model = _cpu_facts()
        vendor, cores = "cpu", cpu_count()
    else:
        vendor, arch, model, cores = _gpu_facts(target)
    vendor = extra.get("vendor", vendor)
    arch = extra.get("arch", arch)
    model = extra.get("device", model)
    cores = int(extra.get("cores", cores))
    return Platform(vendor, arch, model, cores, tuple(sorted(libraries.items())), target.array_kind)


def _default_versions(target: Target) -> dict[str, str]:
    """Versions of the Default's own library (it is a candidate like any other)."""
    kind = target.array_kind
    if kind == "numpy":
        import numpy

        return {"numpy": numpy.__version__}
    if kind == "torch":
        import torch

        versions = {"torch": str(torch.__version__)}
        if target.device.kind == "cuda" and torch.version.cuda:
            versions["cuda"] = str(torch.version.cuda)
        if target.device.kind == "hip" and torch.version.hip:
            versions["hip"] = str(torch.version.hip)
        return versions
    if kind == "cupy":
        import cupy

        return {"cupy": cupy.__version__}
    return {}


def _gpu_facts(target: Target) -> tuple[str, str, str, int]:
    index = target.device.index
    if target.array_kind == "cupy":
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(index)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return "nvidia", f"sm_{props['major']}{props['minor']}", name, int(props["multiProcessorCount"])
    import torch

    props = torch.cuda.get_device_properties(index)
    if target.device.kind == "hip":
        arch = str(getattr(props, "gcnArchName", "gfx"))
        return "amd", arch, str(props.name), int(props.multi_processor_count)
    return "nvidia", f"sm_{props.major}{props.minor}", str(props.name), int(props.multi_processor_count)
