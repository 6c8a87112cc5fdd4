"""The real libraries on a machine without an AMD GPU: nothing may kill the process.

``hipblasLtCreate`` ends the process with ``exit(1)`` when no HIP device is visible
(shown here first, so that the rest means something). The backends therefore count
devices through the HIP runtime (``hipGetDeviceCount``) after loading and before any
handle, and ``unimatmul info`` reports "no HIP device" for both, cleanly.
"""

from __future__ import annotations

import json
import re
import subprocess

from amd_archive import AmdRoot

from unimatmul_backends.rocm.libraries import ENV_HIPBLASLT, ENV_ROCBLAS
from unimatmul_backends.rocm.rocblas_abi import parse_rocblas_version


def libraries(amd: AmdRoot) -> dict[str, str]:
    return {ENV_HIPBLASLT: str(amd.hipblaslt), ENV_ROCBLAS: str(amd.rocblas)}


def test_every_needed_library_resolves_inside_the_archive(amd: AmdRoot) -> None:
    """The loader finds each DT_NEEDED of both libraries among the unpacked packages."""
    for library in (amd.hipblaslt, amd.rocblas):
        listed = subprocess.run(
            [str(amd.loader), "--library-path", str(amd.libdir), "--list", str(library)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        resolved = re.findall(r"=> (\S+)", listed)
        assert resolved, listed
        outside = [path for path in resolved if not path.startswith(str(amd.root))]
        assert not outside, f"{library.name} resolves outside the archive: {outside}\n{listed}"


def test_hipblaslt_create_ends_the_process_without_a_device(amd: AmdRoot) -> None:
    """The hazard itself: a direct hipblasLtCreate never returns here."""
    code = (
        "import ctypes, sys\n"
        f"lib = ctypes.CDLL({str(amd.hipblaslt)!r})\n"
        "print('before', flush=True)\n"
        "handle = ctypes.c_void_p()\n"
        "print('returned', lib.hipblasLtCreate(ctypes.byref(handle)), flush=True)\n"
    )
    proc = amd.run_python("-c", code)
    assert proc.stdout.splitlines() == ["before"], proc.stdout
    assert proc.returncode == 1
    assert "no ROCm-capable device" in proc.stderr


def test_hip_runtime_counts_no_device(amd: AmdRoot) -> None:
    """The check the backends run, against the runtime libhipblaslt brought in."""
    code = (
        "import ctypes\n"
        "from unimatmul_backends.rocm.libraries import hip_runtime_device_reason\n"
        f"ctypes.CDLL({str(amd.hipblaslt)!r})\n"
        "print(hip_runtime_device_reason())\n"
    )
    proc = amd.run_python("-c", code)
    assert proc.returncode == 0, proc.stderr
    reason = proc.stdout.strip()
    assert reason.startswith("no HIP device: hipGetDeviceCount of ")
    assert str(amd.libdir) in reason and "hipErrorNoDevice (100)" in reason


def test_backends_say_why_and_the_process_lives_on(amd: AmdRoot) -> None:
    code = (
        "import json\n"
        "from unimatmul.core.errors import UnsupportedProblem\n"
        "from unimatmul_backends.rocm import HipblasltBackend, RocblasBackend\n"
        "out = {}\n"
        "for backend in (HipblasltBackend(), RocblasBackend()):\n"
        "    entry = out[backend.name] = {'reason': backend.availability()}\n"
        "    try:\n"
        "        backend.versions()\n"
        "    except UnsupportedProblem as exc:\n"
        "        entry['versions'] = str(exc)\n"
        "print(json.dumps(out))\n"
    )
    proc = amd.run_python("-c", code, env=libraries(amd))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for name in ("hipblaslt", "rocblas"):
        assert "no HIP device" in out[name]["reason"] and "hipErrorNoDevice (100)" in out[name]["reason"]
        assert "is unavailable" in out[name]["versions"] and "no HIP device" in out[name]["versions"]


def test_unimatmul_info_reports_no_hip_device(amd: AmdRoot) -> None:
    """`unimatmul info` with the real libraries and no GPU: exit 0, both backends explain."""
    env = libraries(amd)
    proc = amd.run_python("-m", "unimatmul.cli", "info", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    backends = {b["name"]: b for b in json.loads(proc.stdout)["backends"]}
    for name, library in (("hipblaslt", "libhipblaslt"), ("rocblas", "librocblas")):
        entry = backends[name]
        assert entry["available"] is False
        assert f"{library}: OSError: no HIP device" in entry["reason"], entry["reason"]
    text = amd.run_python("-m", "unimatmul.cli", "info", "-v", env=env)  # -v: each reason in full
    assert text.returncode == 0, text.stderr
    assert text.stdout.count("no HIP device") >= 2, text.stdout


def test_rocblas_loads_and_reports_its_version(amd: AmdRoot) -> None:
    """Every rocBLAS function the backend binds exists; handle creation fails, without exiting."""
    code = (
        "import ctypes\n"
        "from unimatmul_backends.rocm.rocblas import RocblasAPI, RocblasError\n"
        f"api = RocblasAPI(ctypes.CDLL({str(amd.rocblas)!r}), 'real')\n"
        "print(api.version())\n"
        "try:\n"
        "    api.create_handle()\n"
        "    print('handle')\n"
        "except RocblasError as exc:\n"
        "    print(exc)\n"
    )
    proc = amd.run_python("-c", code)
    assert proc.returncode == 0, proc.stderr
    version, handle = proc.stdout.splitlines()
    assert parse_rocblas_version(version) == amd.header_version("rocblas")
    assert handle.startswith("rocblas_create_handle returned rocblas_status_")
