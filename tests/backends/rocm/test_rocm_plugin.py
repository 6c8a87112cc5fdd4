"""The ROCm plugin module: registered through the entry point, importable without ROCm or torch."""

from __future__ import annotations

import subprocess
import sys

from unimatmul.core.plugins import PluginManager
from unimatmul_backends.rocm.hipblaslt import HipblasltBackend
from unimatmul_backends.rocm.rocblas import RocblasBackend


def test_entry_point_registers_both_backends_for_hip_torch_tensors() -> None:
    manager = PluginManager()
    assert "rocm" in manager.report.loaded
    backends = manager.backends()
    assert isinstance(backends["hipblaslt"], HipblasltBackend)
    assert isinstance(backends["rocblas"], RocblasBackend)
    for name in ("hipblaslt", "rocblas"):
        backend = backends[name]
        assert backend.device_kinds == {"hip"} and backend.array_kinds == {"torch"}
    # hipBLASLt's GroupedGemm (through its shim) is offered by the same backend, under its name.
    assert "grouped_gemm" in backends["hipblaslt"].ops
    assert "grouped_gemm" not in backends["rocblas"].ops


def test_importing_the_plugin_loads_no_vendor_library() -> None:
    code = (
        "import sys, unimatmul_backends.rocm\n"
        "bad = [m for m in ('torch', 'cupy', 'nvmath') if m in sys.modules]\n"
        "maps = open('/proc/self/maps').read()\n"
        "bad += [lib for lib in ('libhipblaslt', 'librocblas', 'libamdhip64') if lib in maps]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
