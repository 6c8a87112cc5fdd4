"""Finding and loading the ROCm libraries (librocblas, libhipblaslt), and the HIP device check.

Search order for one library (first that loads wins):

1. ``$UNIMATMUL_ROCBLAS_LIB`` / ``$UNIMATMUL_HIPBLASLT_LIB``: a file, or a folder holding
   one of the sonames. When set it is the *only* place tried, so that a wrong value
   is reported instead of silently replaced by another copy.
2. A copy already mapped into this process (``/proc/self/maps``). A ROCm build of
   torch loads its own librocblas / libhipblaslt at import; loading a second copy
   from elsewhere would bring a second HIP runtime into the process, whose streams
   are not torch's streams. So the copy torch uses comes before any folder.
3. ``$ROCM_PATH/lib``, then ``/opt/rocm/lib``.
4. ``torch/lib`` of a ROCm build of torch (a folder holding ``libamdhip64.so*``),
   found without importing torch.
5. The dynamic loader's own search (``LD_LIBRARY_PATH``, ``ldconfig``), by soname.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unimatmul import settings

ENV_ROCBLAS = settings.ROCBLAS_LIB.name
ENV_HIPBLASLT = settings.HIPBLASLT_LIB.name
DEFAULT_ROCM = "/opt/rocm"


class LibraryNotFound(OSError):
    """No place in the search order held a library that loads; says what was tried."""


@dataclass(frozen=True)
class LibraryChoice:
    """One place to try: a path (or bare soname for the loader) and where it came from."""

    path: str
    origin: str


def torch_lib_dir() -> str | None:
    """``torch/lib`` of an installed ROCm build of torch, found without importing torch."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        lib = Path(location) / "lib"
        # A CUDA or CPU torch has no HIP runtime: its lib folder cannot hold ours.
        if lib.is_dir() and any(lib.glob("libamdhip64.so*")):
            return str(lib)
    return None


def loaded_paths(sonames: Sequence[str], maps: str = "/proc/self/maps") -> list[str]:
    """Files already mapped into this process whose name is one of ``sonames``."""
    stems = {name.split(".so", 1)[0] for name in sonames}
    found: list[str] = []
    try:
        with open(maps, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                path = line.rstrip("\n").split(" ", 5)[-1].strip()
                if not path.startswith("/"):
                    continue
                name = os.path.basename(path)
                if name.split(".so", 1)[0] in stems and ".so" in name and path not in found:
                    found.append(path)
    except OSError:
        pass
    return found


def search_order(
    sonames: Sequence[str],
    env_var: str,
    *,
    environ: Mapping[str, str] | None = None,
    loaded: Iterable[str] | None = None,
    torch_lib: str | bool = True,
) -> list[LibraryChoice]:
    """Every place to try, in order (module docstring). Arguments exist for tests."""
    env = os.environ if environ is None else environ
    explicit = env.get(env_var, "").strip()
    if explicit:
        if os.path.isdir(explicit):
            return [LibraryChoice(os.path.join(explicit, name), env_var) for name in sonames]
        return [LibraryChoice(explicit, env_var)]
    choices: list[LibraryChoice] = []
    for path in loaded_paths(sonames) if loaded is None else loaded:
        choices.append(LibraryChoice(path, "already loaded in this process"))
    folders: list[tuple[str, str]] = []
    rocm_path = env.get("ROCM_PATH", "").strip()
    if rocm_path:
        folders.append((os.path.join(rocm_path, "lib"), "ROCM_PATH"))
    folders.append((os.path.join(DEFAULT_ROCM, "lib"), DEFAULT_ROCM))
    torch_dir = torch_lib_dir() if torch_lib is True else (torch_lib or None)  # False: none
    if torch_dir:
        folders.append((torch_dir, "torch/lib (ROCm build of torch)"))
    for folder, origin in folders:
        for name in sonames:
            path = os.path.join(folder, name)
            if os.path.exists(path):
                choices.append(LibraryChoice(path, origin))
    choices.extend(LibraryChoice(name, "dynamic loader search path") for name in sonames)
    unique: list[LibraryChoice] = []
    seen: set[str] = set()
    for choice in choices:
        key = os.path.realpath(choice.path) if os.path.isabs(choice.path) else choice.path
        if key not in seen:
            seen.add(key)
            unique.append(choice)
    return unique


def load_library(
    sonames: Sequence[str], env_var: str, what: str, *, choices: list[LibraryChoice] | None = None
) -> tuple[Any, LibraryChoice]:
    """The first library in the search order that ``ctypes.CDLL`` loads, and where it was.

    Raises :class:`LibraryNotFound` naming every place tried and why each failed.
    """
    tried: list[str] = []
    for choice in search_order(sonames, env_var) if choices is None else choices:
        try:
            # RTLD_GLOBAL: the library's own dependencies (Tensile code objects, the HIP
            # runtime) resolve against what torch already loaded.
            return ctypes.CDLL(choice.path, mode=ctypes.RTLD_GLOBAL), choice
        except OSError as exc:
            tried.append(f"{choice.path} ({choice.origin}): {exc}")
    hint = f"set {env_var} to the library file, or ROCM_PATH to the ROCm installation"
    msg = f"{what} not found; tried: " + "; ".join(tried) + f". {hint}"
    raise LibraryNotFound(msg)


#: Sonames of the HIP runtime (ROCm 7, 6, 5), for :func:`hip_runtime_device_reason`.
HIP_RUNTIME_NAMES = ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5")
#: ``hipError_t hipGetDeviceCount(int* count)`` (``hip/hip_runtime_api.h``).
HIP_GET_DEVICE_COUNT = "hipGetDeviceCount"
#: The ``hipError_t`` values a device count can return (``hip/hip_runtime_api.h``, HIP 6.4).
HIP_ERRORS = {
    0: "hipSuccess",
    3: "hipErrorNotInitialized",
    35: "hipErrorInsufficientDriver",
    100: "hipErrorNoDevice",
    101: "hipErrorInvalidDevice",
}


def hip_runtime_device_reason(names: Sequence[str] = HIP_RUNTIME_NAMES) -> str | None:
    """None when the HIP runtime counts a device, else why not (``hipGetDeviceCount``).

    Called after a ROCm library is loaded and before any of its handles is made:
    ``hipblasLtCreate`` calls ``exit(1)`` inside hipBLASLt (7.1.1, ``hipblaslt.cpp``)
    when no device is visible, killing the process, and ``rocblas_create_handle`` fails.
    The runtime asked is the ``libamdhip64`` already mapped into this process (the one
    the library just brought in, or torch's), else the first the loader finds.
    """
    tried: list[str] = []
    for name in loaded_paths(names) or list(names):
        try:
            hip = ctypes.CDLL(name)
            count_devices = getattr(hip, HIP_GET_DEVICE_COUNT)
        except (OSError, AttributeError) as exc:
            tried.append(f"{name}: {exc}")
            continue
        count_devices.restype = ctypes.c_int
        count_devices.argtypes = [ctypes.POINTER(ctypes.c_int)]
        count = ctypes.c_int(0)
        status = int(count_devices(ctypes.byref(count)))
        if status != 0:
            error = HIP_ERRORS.get(status, "hipError")
            return f"no HIP device: {HIP_GET_DEVICE_COUNT} of {name} returned {error} ({status})"
        if count.value < 1:
            return f"no HIP device: {HIP_GET_DEVICE_COUNT} of {name} counted {count.value}"
        return None
    return "no HIP runtime (libamdhip64) could be loaded to count devices: " + "; ".join(tried)


def hip_device_reason() -> str | None:
    """None when torch is a ROCm build and sees a HIP device, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (the ROCm backends run on torch tensors on a HIP device)"
    hip = getattr(torch.version, "hip", None)
    if not hip:
        return f"torch {torch.__version__} is not a ROCm build (torch.version.hip is None)"
    if not torch.cuda.is_available():
        return f"no HIP device: torch {torch.__version__} (HIP {hip}) sees none"
    return None
