"""The hipBLASLt extension shim: getAllAlgos, getAlgosFromIndex, the support check, names.

hipBLASLt's C API offers only its heuristic (``hipblasLtMatmulAlgoGetHeuristic``), which
returns some of the solutions of a GEMM type and cannot rebuild an algo from a stored
index; PyTorch TunableOp uses the C++-only ``hipblaslt-ext.hpp`` for that. ctypes cannot
call C++, so ``hipblaslt_ext.cpp`` (beside this file) wraps the four functions needed in a
C ABI (with ``getKernelNameFromAlgo`` and ``getSolutionNameFromAlgo`` where the headers
have them), and :class:`HipblasltExt` binds it.

Built at first use, never required (:func:`load_ext` says why not, and the backend keeps
the heuristic path): with the system C++ compiler (``$CXX``, else ``c++``/``g++``/``clang++``)
against the hipBLASLt headers that belong to the library loaded (``<lib>/../include`` or
``<lib>/../../include``, ``$ROCM_PATH/include``, ``/opt/rocm/include``), linked against that
library file, into ``$XDG_CACHE_HOME/unimatmul/hipblaslt-ext/<version>-<revision>-<source
hash>/`` (one build per library version and shim source; built into a temporary name and
renamed, so concurrent first uses are safe). The headers must declare the version the
library reports; where they do not, nothing is built. ``UNIMATMUL_HIPBLASLT_POOL=0`` turns
the shim off.

No handle is made here: the caller passes the one it made after its device check
(``hipblasLtCreate`` ends a process without a HIP device).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from unimatmul import settings
from unimatmul_backends.lt.abi import LtABI
from unimatmul_backends.lt.driver import LtAlgo, LtPlan
from unimatmul_backends.rocm.libraries import loaded_paths

SOURCE = Path(__file__).with_name("hipblaslt_ext.cpp")
SHIM_NAME = "libunimatmul_hipblaslt_ext.so"
#: The C ABI version of ``hipblaslt_ext.cpp`` this binder speaks.
EXT_ABI = 1
#: ``hipblaslt_ext::GemmType::HIPBLASLT_GEMM`` (hipblaslt-ext.hpp; checked in tests/amd_real).
GEMM_TYPE_GEMM = 1
_SUCCESS = 0  # HIPBLAS_STATUS_SUCCESS
_FIRST_CAPACITY = 4096  # results asked of getAllAlgos first; called again when more exist
_NAME_BYTES = 512
COMPILERS = ("c++", "g++", "clang++")
_BUILD_TIMEOUT_S = 300


class ExtUnavailable(OSError):
    """The shim cannot be built or loaded here; the message says why."""


class ExtAPI(Protocol):
    """What the backend asks of the shim (:class:`HipblasltExt`, or a test's fake)."""

    has_kernel_name: bool

    def all_algos(self, plan: LtPlan) -> list[LtAlgo]: ...
    def from_index(self, plan: LtPlan, indices: Sequence[int]) -> list[LtAlgo]: ...
    def supported(self, plan: LtPlan, algo: LtAlgo) -> LtAlgo | None: ...
    def kernel_name(self, plan: LtPlan, algo: LtAlgo) -> str: ...
    def solution_name(self, plan: LtPlan, algo: LtAlgo) -> str: ...


# --- building ---------------------------------------------------------------------------
def source_hash() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "unimatmul" / "hipblaslt-ext"


def find_include(library: str, environ: dict[str, str] | None = None) -> Path | None:
    """The include folder holding ``hipblaslt/hipblaslt-ext.hpp`` for the library at ``library``."""
    env = os.environ if environ is None else environ
    places: list[Path] = []
    if os.path.isabs(library):
        lib_dir = Path(os.path.realpath(library)).parent
        places += [lib_dir.parent / "include", lib_dir.parent.parent / "include"]
    rocm = env.get("ROCM_PATH", "").strip()
    if rocm:
        places.append(Path(rocm) / "include")
    places.append(Path("/opt/rocm/include"))
    for place in places:
        if (place / "hipblaslt" / "hipblaslt-ext.hpp").is_file():
            return place
    return None


def header_version(include: Path) -> int:
    """``MAJOR*100000 + MINOR*100 + PATCH`` as ``hipblaslt-version.h`` defines it."""
    text = (include / "hipblaslt" / "hipblaslt-version.h").read_text(errors="replace")
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        found = re.search(rf"#define\s+HIPBLASLT_VERSION_{part}\s+(\d+)", text)
        if found is None:
            msg = f"{include}/hipblaslt/hipblaslt-version.h defines no HIPBLASLT_VERSION_{part}"
            raise ExtUnavailable(msg)
        parts.append(int(found.group(1)))
    return parts[0] * 100000 + parts[1] * 100 + parts[2]


def compiler() -> str | None:
    explicit = os.environ.get("CXX", "").strip()
    if explicit:
        return shutil.which(explicit) or explicit
    for name in COMPILERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def compile_command(cxx: str, include: Path, library: str, out: Path, *, kernel_name: bool) -> list[str]:
    return [
        cxx, "-std=c++17", "-O2", "-shared", "-fPIC", "-D__HIP_PLATFORM_AMD__",
        f"-DSHIM_HAS_KERNEL_NAME={int(kernel_name)}",
        f"-I{include}", str(SOURCE), "-o", str(out), library, "-Wl,--no-undefined",
    ]  # fmt: skip


def build(library: str, include: Path, out: Path) -> Path:
    """Compile the shim against ``include`` and link it against ``library`` into ``out``."""
    cxx = compiler()
    if cxx is None:
        msg = f"no C++ compiler (set CXX, or install one of {', '.join(COMPILERS)})"
        raise ExtUnavailable(msg)
    out.parent.mkdir(parents=True, exist_ok=True)
    errors = []
    for kernel_name in (True, False):  # older headers lack getKernelNameFromAlgo
        fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            done = subprocess.run(
                compile_command(cxx, include, library, Path(tmp), kernel_name=kernel_name),
                capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S, check=False,
            )  # fmt: skip
            if done.returncode == 0:
                os.replace(tmp, out)
                return out
            errors.append(done.stderr.strip()[-2000:])
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    msg = f"{cxx} could not build {SOURCE.name} against {include}: " + " | ".join(errors)
    raise ExtUnavailable(msg)


def built_shim(library: str, version: int, revision: str) -> Path:
    """The shim for this library version: the cached build, or a new one.

    ``library`` may be a bare soname (found by the dynamic loader): the file mapped into
    this process under that name is what the shim is linked against.
    """
    if not os.path.isabs(library):
        mapped = loaded_paths([library])
        if not mapped:
            msg = f"{library} is not mapped into this process: no file to build the shim against"
            raise ExtUnavailable(msg)
        library = mapped[0]
    include = find_include(library)
    if include is None:
        msg = f"no hipblaslt/hipblaslt-ext.hpp beside {library}, in $ROCM_PATH/include or /opt/rocm/include"
        raise ExtUnavailable(msg)
    headers = header_version(include)
    if headers != version:
        msg = f"the headers in {include} are hipBLASLt {headers}, the library is {version}"
        raise ExtUnavailable(msg)
    tag = re.sub(r"[^A-Za-z0-9._-]", "_", f"{version}-{revision or 'norev'}-{source_hash()}")
    out = cache_root() / tag / SHIM_NAME
    return out if out.is_file() else build(library, include, out)


def load_ext(library: str, version: int, revision: str, abi: LtABI) -> HipblasltExt:
    """The bound shim for the library at ``library``; ExtUnavailable says why not."""
    if settings.HIPBLASLT_POOL.get() == 0:
        msg = f"{settings.HIPBLASLT_POOL.name}=0 (the heuristic only)"
        raise ExtUnavailable(msg)
    path = built_shim(library, version, revision)
    try:
        cdll = ctypes.CDLL(str(path))
    except OSError as exc:
        msg = f"{path} does not load: {exc}"
        raise ExtUnavailable(msg) from exc
    return HipblasltExt(cdll, abi, version)


# --- the binding ------------------------------------------------------------------------
_P = ctypes.c_void_p
_I = ctypes.c_int
# (handle, algo, buffer, its size, the size needed) of both name functions.
_NAME_SIGNATURE = (_I, [_P, _P, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)])
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "unimatmul_hipblaslt_ext_abi": (_I, []),
    "unimatmul_hipblaslt_ext_header_version": (_I, []),
    "unimatmul_hipblaslt_ext_has_kernel_name": (_I, []),
    "unimatmul_hipblaslt_get_all_algos": (
        _I,
        [_P, _I, _I, _I, _I, _I, _I, _I, _I, _P, _I, ctypes.POINTER(_I)],
    ),
    "unimatmul_hipblaslt_algos_from_index": (_I, [_P, _P, _I, _P, _I, ctypes.POINTER(_I)]),
    "unimatmul_hipblaslt_is_algo_supported": (
        _I,
        [_P, _P, _P, _P, _P, _P, _P, _P, _P, ctypes.POINTER(ctypes.c_size_t)],
    ),
    "unimatmul_hipblaslt_kernel_name": _NAME_SIGNATURE,
    "unimatmul_hipblaslt_solution_name": _NAME_SIGNATURE,
}


class HipblasltExt:
    """The shim's C functions, bound with ctypes (see the module docstring)."""

    def __init__(self, cdll: Any, abi: LtABI, version: int) -> None:
        self.abi = abi
        self.fn: dict[str, Any] = {}
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(cdll, name)
            fn.restype, fn.argtypes = restype, argtypes
            self.fn[name] = fn
        if self.fn["unimatmul_hipblaslt_ext_abi"]() != EXT_ABI:
            msg = f"the shim speaks C ABI {self.fn['unimatmul_hipblaslt_ext_abi']()}, this binder {EXT_ABI}"
            raise ExtUnavailable(msg)
        built_for = int(self.fn["unimatmul_hipblaslt_ext_header_version"]())
        if built_for != version:
            msg = f"the shim was built against hipBLASLt {built_for} headers, the library is {version}"
            raise ExtUnavailable(msg)
        self.has_kernel_name = bool(self.fn["unimatmul_hipblaslt_ext_has_kernel_name"]())

    def _results(self, call: Any) -> list[LtAlgo]:
        """Run a two-call listing (results, capacity, total): again, larger, if it overflowed."""
        struct = self.abi.heuristic_result_struct()
        capacity = _FIRST_CAPACITY
        while True:
            results = (struct * capacity)()
            total = _I(0)
            status = int(call(ctypes.addressof(results), capacity, ctypes.byref(total)))
            if total.value <= capacity:
                break
            capacity = total.value
        if status != _SUCCESS and total.value == 0:
            return []
        return [
            LtAlgo(bytes(r.algo), int(r.workspaceSize), float(r.wavesCount)) for r in results[: total.value]
        ]

    def all_algos(self, plan: LtPlan) -> list[LtAlgo]:
        """Every solution of the plan's GEMM type (``getAllAlgos``), as the library orders them."""
        abi, fn = self.abi, self.fn["unimatmul_hipblaslt_get_all_algos"]
        gemm, types = plan.gemm, plan.types
        head = (
            plan.driver.handle, GEMM_TYPE_GEMM,
            abi.operation["T" if gemm.trans_a else "N"], abi.operation["T" if gemm.trans_b else "N"],
            types["a"], types["b"], types["c"], types["c"], plan.compute,
        )  # fmt: skip
        return self._results(lambda res, cap, total: fn(*head, res, cap, total))

    def from_index(self, plan: LtPlan, indices: Sequence[int]) -> list[LtAlgo]:
        """The algos of these solution indices (``getAlgosFromIndex``); unknown ones are left out."""
        wanted = (_I * max(1, len(indices)))(*indices)
        fn = self.fn["unimatmul_hipblaslt_algos_from_index"]
        handle = plan.driver.handle
        return self._results(lambda res, cap, total: fn(handle, wanted, len(indices), res, cap, total))

    def supported(self, plan: LtPlan, algo: LtAlgo) -> LtAlgo | None:
        """``algo`` as ``matmulIsAlgoSupported`` updates it for the plan, with its workspace; or None."""
        struct = self.abi.algo_struct().from_buffer_copy(algo.data)
        alpha, beta = plan.scale_ctype(1.0), plan.scale_ctype(0.0)
        workspace = ctypes.c_size_t(0)
        status = self.fn["unimatmul_hipblaslt_is_algo_supported"](
            plan.driver.handle, plan.desc, ctypes.addressof(alpha), plan.adesc, plan.bdesc,
            ctypes.addressof(beta), plan.cdesc, plan.cdesc, ctypes.addressof(struct), ctypes.byref(workspace),
        )  # fmt: skip
        if status != _SUCCESS:
            return None
        return LtAlgo(bytes(struct), int(workspace.value), algo.waves)

    def _name(self, function: str, plan: LtPlan, algo: LtAlgo) -> str:
        if not self.has_kernel_name:
            return ""
        struct = self.abi.algo_struct().from_buffer_copy(algo.data)
        fn, handle = self.fn[function], plan.driver.handle
        size = _NAME_BYTES
        needed = ctypes.c_size_t(0)
        while True:
            buf = ctypes.create_string_buffer(size)
            status = fn(handle, ctypes.addressof(struct), buf, size, ctypes.byref(needed))
            if status != _SUCCESS or needed.value <= size:
                break
            size = needed.value
        return buf.value.decode("ascii", "replace") if status == _SUCCESS else ""

    def kernel_name(self, plan: LtPlan, algo: LtAlgo) -> str:
        """The kernel an algo runs (``getKernelNameFromAlgo``); "" where this build has none."""
        return self._name("unimatmul_hipblaslt_kernel_name", plan, algo)

    def solution_name(self, plan: LtPlan, algo: LtAlgo) -> str:
        """The solution's name (``getSolutionNameFromAlgo``): its kernel's name and its own
        parameters; "" where this build has none."""
        return self._name("unimatmul_hipblaslt_solution_name", plan, algo)
