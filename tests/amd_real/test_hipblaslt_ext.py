"""The hipBLASLt extension shim against Debian's real hipBLASLt 7.1.1 (1.1.0), without a GPU.

``backends/rocm/hipblaslt_ext.cpp`` is compiled by the system C++ compiler against the
real ``hipblaslt-ext.hpp`` through the same code the backend runs at first use
(``hipblaslt_ext.built_shim``), linked against the real ``libhipblaslt.so.1`` with
``--no-undefined``; every hipBLASLt symbol it needs is one the library exports; the
shim loads (every symbol bound at once) and binds under unstable's loader; and on this
GPU-less host the backend still answers "no HIP device" and never makes a handle
(``hipblasLtCreate`` would end the process). No algo is listed here: that needs a handle,
and a handle needs a device.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from amd_archive import AmdRoot

from unimatmul_backends.rocm import hipblaslt_ext
from unimatmul_backends.rocm.libraries import ENV_HIPBLASLT

pytestmark = pytest.mark.skipif(hipblaslt_ext.compiler() is None, reason="no C++ compiler")


@pytest.fixture(scope="module")
def shim(amd: AmdRoot, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shim as the backend builds it at first use, into a cache of this test's own."""
    cache = tmp_path_factory.mktemp("xdg-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(cache))
        version = hipblaslt_ext.header_version(amd.include)
        path = hipblaslt_ext.built_shim(str(amd.hipblaslt), version, "dfsg")
        # Cached per library version: a second first use builds nothing.
        stamp = path.stat().st_mtime_ns
        assert hipblaslt_ext.built_shim(str(amd.hipblaslt), version, "dfsg") == path
        assert path.stat().st_mtime_ns == stamp
    assert path.parent.parent == cache / "unimatmul" / "hipblaslt-ext"
    assert path.parent.name.startswith(f"{version}-dfsg-")
    return path


def _symbols(path: Path, kind: str) -> set[str]:
    listed = subprocess.run(["nm", "-D", str(path)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in listed.splitlines() if re.match(rf"\s*(\S+\s+)?{kind}\s", line)}


def test_the_headers_are_the_librarys_version(amd: AmdRoot) -> None:
    assert hipblaslt_ext.header_version(amd.include) == 100100
    assert hipblaslt_ext.find_include(str(amd.hipblaslt)) == amd.include


def test_the_shim_compiles_against_the_real_headers_and_links_the_real_library(
    amd: AmdRoot, shim: Path
) -> None:
    if shutil.which("nm") is None:
        pytest.skip("no nm")
    exported = {s for s in _symbols(shim, "T") if s.startswith("unimatmul_")}
    assert exported == set(hipblaslt_ext._SIGNATURES)  # every export bound, nothing bound missing
    needed = {s for s in _symbols(shim, "U") if "hipblaslt_ext" in s}
    # getAllAlgos, getAlgosFromIndex, matmulIsAlgoSupported, getKernelNameFromAlgo,
    # getSolutionNameFromAlgo.
    assert len(needed) == 5, needed
    assert needed <= _symbols(amd.hipblaslt, "T"), needed - _symbols(amd.hipblaslt, "T")


def test_the_header_constants_the_binder_uses(amd: AmdRoot, tmp_path: Path) -> None:
    """GemmType::HIPBLASLT_GEMM and the struct sizes, as the real header has them."""
    cxx = hipblaslt_ext.compiler()
    assert cxx is not None
    source = tmp_path / "constants.cpp"
    source.write_text(
        "#include <hipblaslt/hipblaslt-ext.hpp>\n"
        f"static_assert(static_cast<int>(hipblaslt_ext::GemmType::HIPBLASLT_GEMM) == "
        f'{hipblaslt_ext.GEMM_TYPE_GEMM}, "GemmType");\n'
        'static_assert(HIPBLAS_STATUS_SUCCESS == 0, "status");\n'
        "int main() { return 0; }\n"
    )
    subprocess.run(
        [cxx, "-std=c++17", "-fsyntax-only", "-D__HIP_PLATFORM_AMD__", f"-I{amd.include}", str(source)],
        check=True,
        capture_output=True,
    )


def test_the_shim_loads_and_binds_under_the_real_library(amd: AmdRoot, shim: Path) -> None:
    code = (
        "import ctypes, json\n"
        "from unimatmul_backends.lt.abi import HIPBLASLT_1_1\n"
        "from unimatmul_backends.rocm.hipblaslt_ext import HipblasltExt\n"
        f"ctypes.CDLL({str(amd.hipblaslt)!r}, mode=ctypes.RTLD_GLOBAL)\n"
        f"ext = HipblasltExt(ctypes.CDLL({str(shim)!r}), HIPBLASLT_1_1, 100100)\n"
        "print(json.dumps({'kernel_name': ext.has_kernel_name, 'functions': sorted(ext.fn)}))\n"
    )
    proc = amd.run_python("-c", code)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert got == {"kernel_name": True, "functions": sorted(hipblaslt_ext._SIGNATURES)}
    # Built for another version, the binder refuses it (headers and library must agree).
    wrong = code.replace("HIPBLASLT_1_1, 100100", "HIPBLASLT_1_1, 100000")
    proc = amd.run_python("-c", wrong)
    assert proc.returncode == 1 and "built against hipBLASLt 100100 headers" in proc.stderr


def test_without_a_device_the_backend_says_so_and_never_reaches_the_shim(amd: AmdRoot, shim: Path) -> None:
    code = (
        "import json\n"
        "from unimatmul_backends.rocm.hipblaslt import HipblasltBackend\n"
        "backend = HipblasltBackend(device_check=lambda: None)\n"
        "print(json.dumps({'reason': backend.availability(), 'ext': backend.ext_reason}))\n"
    )
    proc = amd.run_python("-c", code, env={ENV_HIPBLASLT: str(amd.hipblaslt)})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert "no HIP device" in got["reason"] and "hipErrorNoDevice" in got["reason"]
    assert got["ext"] == "not loaded yet"  # the device check stops before any handle
