"""The hipBLASLt extension shim against Debian's real hipBLASLt 7.1.1 (1.1.0), without a GPU.

``backends/rocm/hipblaslt_ext.cpp`` is compiled by the system C++ compiler against the
real ``hipblaslt-ext.hpp`` through the same code the backend runs at first use
(``hipblaslt_ext.built_shim``), linked against the real ``libhipblaslt.so.1`` with
``--no-undefined``; every hipBLASLt symbol it needs is one the library exports (the
GroupedGemm ones included); the shim loads (every symbol bound at once) and binds under
unstable's loader, its grouped GEMM with the user-args form, whose ``UserArguments`` layout
(sizeof and offsets, from the real header) equals the binder's; the reduced builds for older
headers still compile; and on this GPU-less host the backend still answers "no HIP device"
and never makes a handle (``hipblasLtCreate`` would end the process). No algo is listed and
no GroupedGemm made here: both need a handle, and a handle needs a device.
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


def _demangled(path: Path, kind: str) -> set[str]:
    listed = subprocess.run(["nm", "-DC", str(path)], capture_output=True, text=True, check=True).stdout
    found = (re.match(rf"\s*(\S+\s+)?{kind}\s+(.*)$", line) for line in listed.splitlines())
    return {m.group(2).strip() for m in found if m}


def test_the_headers_are_the_librarys_version(amd: AmdRoot) -> None:
    assert hipblaslt_ext.header_version(amd.include) == 100100
    assert hipblaslt_ext.find_include(str(amd.hipblaslt)) == amd.include


def test_the_shim_compiles_against_the_real_headers_and_links_the_real_library(
    amd: AmdRoot, shim: Path
) -> None:
    if shutil.which("nm") is None:
        pytest.skip("no nm")
    exported = {s for s in _symbols(shim, "T") if s.startswith("unimatmul_")}
    # Every export bound, nothing bound missing.
    assert exported == set(hipblaslt_ext._SIGNATURES) | set(hipblaslt_ext._GROUPED_SIGNATURES)
    needed = {s for s in _symbols(shim, "U") if "hipblaslt_ext" in s}
    assert needed <= _symbols(amd.hipblaslt, "T"), needed - _symbols(amd.hipblaslt, "T")
    # By name: the five free functions, and what the grouped GEMM calls (the constructor,
    # setProblem with leading dimensions, the support check, initialize, both runs, the
    # default user arguments, the workspace limit, the inputs' setters).
    names = {re.sub(r"(\[abi:\w+\])?\(.*", "", s) for s in _demangled(shim, "U") if "hipblaslt_ext::" in s}
    wanted = {
        f"hipblaslt_ext::{f}"
        for f in (
            "getAllAlgos", "getAlgosFromIndex", "matmulIsAlgoSupported", "getKernelNameFromAlgo",
            "getSolutionNameFromAlgo", "GroupedGemm::GroupedGemm", "GroupedGemm::setProblem",
            "GroupedGemm::getDefaultValueForDeviceUserArguments", "GroupedGemm::run",
            "GemmInstance::initialize", "GemmInstance::isAlgoSupported", "GemmInstance::run",
            "GemmInstance::setMaxWorkspaceBytes", "GemmInputs::setA", "GemmInputs::setAlpha",
            "GemmProblemType::GemmProblemType", "GemmEpilogue::GemmEpilogue",
        )
    }  # fmt: skip
    assert wanted <= names, wanted - names
    grouped_runs = {s for s in _demangled(shim, "U") if s.startswith("hipblaslt_ext::GroupedGemm::run(")}
    assert grouped_runs == {"hipblaslt_ext::GroupedGemm::run(void*, ihipStream_t*)"}  # the user-args run


def test_the_header_constants_the_binder_uses(amd: AmdRoot, tmp_path: Path) -> None:
    """Both GemmTypes, the status, and UserArguments' size and offsets, as the real header has them."""
    cxx = hipblaslt_ext.compiler()
    assert cxx is not None
    size, *offsets = hipblaslt_ext.user_args_layout()
    source = tmp_path / "constants.cpp"
    source.write_text(
        "#include <cstddef>\n#include <hipblaslt/hipblaslt-ext.hpp>\n"
        f"static_assert(static_cast<int>(hipblaslt_ext::GemmType::HIPBLASLT_GEMM) == "
        f'{hipblaslt_ext.GEMM_TYPE_GEMM}, "GemmType");\n'
        f"static_assert(static_cast<int>(hipblaslt_ext::GemmType::HIPBLASLT_GROUPED_GEMM) == "
        f'{hipblaslt_ext.GEMM_TYPE_GROUPED}, "GemmType");\n'
        'static_assert(HIPBLAS_STATUS_SUCCESS == 0, "status");\n'
        f'static_assert(sizeof(hipblaslt_ext::UserArguments) == {size}, "UserArguments");\n'
        + "".join(
            f'static_assert(offsetof(hipblaslt_ext::UserArguments, {field}) == {offset}, "{field}");\n'
            for field, offset in zip(hipblaslt_ext.USER_ARGS_FIELDS, offsets, strict=True)
        )
        + "int main() { return 0; }\n"
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
        "print(json.dumps({'kernel_name': ext.has_kernel_name, 'functions': sorted(ext.fn),\n"
        "                  'grouped': ext.grouped, 'grouped_reason': ext.grouped_reason}))\n"
    )
    proc = amd.run_python("-c", code)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    functions = sorted({*hipblaslt_ext._SIGNATURES, *hipblaslt_ext._GROUPED_SIGNATURES})
    # The grouped GEMM with its user-args form: the shim's sizeof/offsetof of the real
    # UserArguments equal the binder's ctypes struct (else the binder turns the form off).
    assert got == {
        "kernel_name": True,
        "functions": functions,
        "grouped": hipblaslt_ext.GROUPED_USER_ARGS,
        "grouped_reason": "",
    }
    # Built for another version, the binder refuses it (headers and library must agree).
    wrong = code.replace("HIPBLASLT_1_1, 100100", "HIPBLASLT_1_1, 100000")
    proc = amd.run_python("-c", wrong)
    assert proc.returncode == 1 and "built against hipBLASLt 100100 headers" in proc.stderr


def test_without_a_device_the_backend_says_so_and_never_reaches_the_shim(amd: AmdRoot, shim: Path) -> None:
    code = (
        "import json\n"
        "from unimatmul_backends.rocm.hipblaslt import HipblasltBackend\n"
        "from unimatmul.backend import Device, Target, UnsupportedProblem, adapter_for_kind\n"
        "from unimatmul.core.grouped import grouped_problem\n"
        "backend = HipblasltBackend(device_check=lambda: None)\n"
        "reason = backend.availability()\n"
        "target = Target(adapter_for_kind('torch'), Device('hip', 0))\n"
        "try:\n"
        "    backend.candidates(grouped_problem(8, 64, 128, 256, 'bf16'), target)\n"
        "    grouped = 'offered'\n"
        "except UnsupportedProblem as exc:\n"
        "    grouped = str(exc)\n"
        "print(json.dumps({'reason': reason, 'ext': backend.ext_reason, 'grouped': grouped}))\n"
    )
    proc = amd.run_python("-c", code, env={ENV_HIPBLASLT: str(amd.hipblaslt)})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.splitlines()[-1])
    assert "no HIP device" in got["reason"] and "hipErrorNoDevice" in got["reason"]
    assert got["ext"] == "not loaded yet"  # the device check stops before any handle
    # A grouped problem gets the same reason, as UnsupportedProblem, and the process lives on.
    assert "no HIP device" in got["grouped"], got["grouped"]


def test_the_reduced_builds_for_older_headers_compile(amd: AmdRoot) -> None:
    """The fallback builds' stubs compile here too: the one without user args (its stubs of
    that form) and the last one, without GroupedGemm or names (every other stub)."""
    cxx = hipblaslt_ext.compiler()
    assert cxx is not None
    for features in (hipblaslt_ext.BUILDS[1], hipblaslt_ext.BUILDS[-1]):
        command = hipblaslt_ext.compile_command(
            cxx, amd.include, str(amd.hipblaslt), Path("unused"), features
        )
        syntax_only = [*command[: command.index(str(hipblaslt_ext.SOURCE)) + 1], "-fsyntax-only"]
        done = subprocess.run(syntax_only, capture_output=True, text=True, check=False)
        assert done.returncode == 0, (features, done.stderr[-2000:])
