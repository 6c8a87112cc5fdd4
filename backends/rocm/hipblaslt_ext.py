"""The hipBLASLt extension shim: getAllAlgos, getAlgosFromIndex, the support check, names.

hipBLASLt's C API offers only its heuristic (``hipblasLtMatmulAlgoGetHeuristic``), which
returns some of the solutions of a GEMM type and cannot rebuild an algo from a stored
index; PyTorch TunableOp uses the C++-only ``hipblaslt-ext.hpp`` for that. ctypes cannot
call C++, so ``hipblaslt_ext.cpp`` (beside this file) wraps the four functions needed in a
C ABI (with ``getKernelNameFromAlgo`` and ``getSolutionNameFromAlgo`` where the headers
have them), and :class:`HipblasltExt` binds it. It also wraps ``hipblaslt_ext::GroupedGemm``
(G GEMMs of one type in one launch, C++ only): :class:`HipblasltGrouped` holds one, set up
once for a problem and run per call, either with the host-side problem it was made with or
with device-side per-group arguments (:class:`UserArguments`) that a runner rewrites on the
GPU each call (``docs/rocm.md``, "Grouped GEMM", says why that form).

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from unimatmul import settings
from unimatmul_backends.lt.abi import LtABI
from unimatmul_backends.lt.driver import LtAlgo, LtError, LtPlan
from unimatmul_backends.rocm.libraries import loaded_paths

SOURCE = Path(__file__).with_name("hipblaslt_ext.cpp")
SHIM_NAME = "libunimatmul_hipblaslt_ext.so"
#: The C ABI version of ``hipblaslt_ext.cpp`` this binder speaks.
EXT_ABI = 2
#: ``hipblaslt_ext::GemmType`` (hipblaslt-ext.hpp; checked in tests/amd_real).
GEMM_TYPE_GEMM = 1
GEMM_TYPE_GROUPED = 2
#: What ``unimatmul_hipblaslt_ext_grouped`` says a build has of GroupedGemm: nothing, the
#: host-side problem only, or also the device-side user arguments.
GROUPED_NONE, GROUPED_HOST, GROUPED_USER_ARGS = 0, 1, 2
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


#: The shim's optional parts, each a ``-DSHIM_HAS_<name>=0/1`` switch, as the builder tries
#: them: everything, then without the grouped user-args form, without the grouped GEMM, and
#: without the name functions (older headers lack them, newest first).
BUILDS: tuple[dict[str, bool], ...] = (
    {"KERNEL_NAME": True, "GROUPED": True, "USER_ARGS": True},
    {"KERNEL_NAME": True, "GROUPED": True, "USER_ARGS": False},
    {"KERNEL_NAME": True, "GROUPED": False, "USER_ARGS": False},
    {"KERNEL_NAME": False, "GROUPED": False, "USER_ARGS": False},
)


def compile_command(cxx: str, include: Path, library: str, out: Path, features: dict[str, bool]) -> list[str]:
    switches = [f"-DSHIM_HAS_{name}={int(on)}" for name, on in features.items()]
    return [
        cxx, "-std=c++17", "-O2", "-shared", "-fPIC", "-D__HIP_PLATFORM_AMD__", *switches,
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
    for features in BUILDS:
        fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            done = subprocess.run(
                compile_command(cxx, include, library, Path(tmp), features),
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
    "unimatmul_hipblaslt_ext_grouped": (_I, []),
    "unimatmul_hipblaslt_grouped_user_args_layout": (_I, [_P, _I]),
}
_L = ctypes.POINTER(ctypes.c_int64)
_PP = ctypes.POINTER(ctypes.c_void_p)
_SIZE = ctypes.POINTER(ctypes.c_size_t)
#: The GroupedGemm functions, bound where the shim has them (``GROUPED_HOST`` or more).
_GROUPED_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    # handle, ops, 4 types, compute, groups; m, n, k, lda, ldb, ldc, ldd; a, b, c, d; alpha,
    # beta, their size, the workspace limit, out.
    "unimatmul_hipblaslt_grouped_create": (
        _I,
        [_P, *[_I] * 8, *[_L] * 7, *[_PP] * 4, _P, _P, ctypes.c_size_t, ctypes.c_size_t, _PP],
    ),
    "unimatmul_hipblaslt_grouped_destroy": (_I, [_P]),
    "unimatmul_hipblaslt_grouped_is_algo_supported": (_I, [_P, _P, _SIZE]),
    "unimatmul_hipblaslt_grouped_initialize": (_I, [_P, _P, _P, _I, _P]),
    "unimatmul_hipblaslt_grouped_run": (_I, [_P, _P]),
    "unimatmul_hipblaslt_grouped_default_user_args": (_I, [_P, _P]),
    "unimatmul_hipblaslt_grouped_run_user_args": (_I, [_P, _P, _P]),
}


class UserArguments(ctypes.Structure):
    """``hipblaslt_ext::UserArguments`` (hipblaslt-ext.hpp, packed, 196 bytes in 1.1): one
    group's arguments as the grouped kernel reads them from device memory. Its layout is
    compared with the header's (sizeof and offsetof, reported by the shim) when the shim binds."""

    _pack_ = 1
    _fields_ = [
        *((name, ctypes.c_uint32) for name in ("m", "n", "batch", "k")),
        *((name, ctypes.c_void_p) for name in ("d", "c", "a", "b")),
        *((f"stride{x}{i}", ctypes.c_uint32) for x in "DCAB" for i in (1, 2)),
        ("alpha", ctypes.c_uint8 * 16),
        ("beta", ctypes.c_uint8 * 16),
        *(
            (name, ctypes.c_void_p)
            for name in ("scaleA", "scaleB", "scaleC", "scaleD", "scaleAlphaVec", "bias")
        ),
        ("biasType", ctypes.c_int),
        ("reserved", ctypes.c_uint32),
        ("e", ctypes.c_void_p),
        ("strideE1", ctypes.c_uint32),
        ("strideE2", ctypes.c_uint32),
        ("act0", ctypes.c_float),
        ("act1", ctypes.c_float),
        ("activationType", ctypes.c_int),
    ]


#: The fields whose offsets the shim reports, in its order (after sizeof).
USER_ARGS_FIELDS = (
    "m", "n", "batch", "k", "d", "c", "a", "b",
    "strideD1", "strideD2", "strideC1", "strideC2", "strideA1", "strideA2", "strideB1", "strideB2",
    "alpha", "beta",
)  # fmt: skip


def user_args_layout() -> list[int]:
    """sizeof(UserArguments) then the offsets of ``USER_ARGS_FIELDS``, as this binder has them."""
    return [ctypes.sizeof(UserArguments), *(getattr(UserArguments, f).offset for f in USER_ARGS_FIELDS)]


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
        #: GROUPED_NONE, GROUPED_HOST or GROUPED_USER_ARGS; ``grouped_reason`` says why not more.
        self.grouped = int(self.fn["unimatmul_hipblaslt_ext_grouped"]())
        self.grouped_reason = ""
        if self.grouped == GROUPED_NONE:
            self.grouped_reason = (
                "the shim was built without GroupedGemm (these headers lack its setProblem form)"
            )
        else:
            for name, (restype, argtypes) in _GROUPED_SIGNATURES.items():
                fn = getattr(cdll, name)
                fn.restype, fn.argtypes = restype, argtypes
                self.fn[name] = fn
        if self.grouped >= GROUPED_USER_ARGS:
            capacity = len(USER_ARGS_FIELDS) + 1
            got = (_I * capacity)()
            count = int(self.fn["unimatmul_hipblaslt_grouped_user_args_layout"](got, capacity))
            if list(got)[:count] != user_args_layout() or count != capacity:
                self.grouped = GROUPED_HOST
                self.grouped_reason = (
                    f"the headers' UserArguments (sizeof and offsets {list(got)[:count]}) is not the "
                    f"binder's {user_args_layout()}: the user-args form is off"
                )
        elif self.grouped == GROUPED_HOST:
            self.grouped_reason = "the shim was built without UserArguments (these headers lack them)"

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

    def _name(self, function: str, handle: int, algo: LtAlgo) -> str:
        if not self.has_kernel_name:
            return ""
        struct = self.abi.algo_struct().from_buffer_copy(algo.data)
        fn = self.fn[function]
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
        return self._name("unimatmul_hipblaslt_kernel_name", plan.driver.handle, algo)

    def solution_name(self, plan: LtPlan, algo: LtAlgo) -> str:
        """The solution's name (``getSolutionNameFromAlgo``): its kernel's name and its own
        parameters; "" where this build has none."""
        return self._name("unimatmul_hipblaslt_solution_name", plan.driver.handle, algo)

    def grouped_gemm(
        self,
        handle: int,
        spec: GroupedSpec,
        pointers: GroupedPointers,
        max_workspace: int,
    ) -> HipblasltGrouped:
        """A GroupedGemm set up for ``spec`` on these device pointers (see :class:`HipblasltGrouped`).

        ExtUnavailable where this build has no GroupedGemm; LtError where the library refuses
        the problem."""
        if self.grouped == GROUPED_NONE:
            raise ExtUnavailable(self.grouped_reason)
        return HipblasltGrouped(self, handle, spec, pointers, max_workspace)


# --- grouped GEMM -----------------------------------------------------------------------
@dataclass(frozen=True)
class GroupedSpec:
    """G column-major GEMMs of one type, as ``GroupedGemm::setProblem`` takes them (batch 1):
    ``D_g (m x n, ldd) = alpha * op_a(A_g) @ op_b(B_g) + beta * C_g (ldc)``, A_g ``m x k`` after
    ``op_a`` (stored ``k x m`` when ``trans_a``), B_g ``k x n`` after ``op_b``. Types are hipDataType
    and hipblasComputeType_t values of the library's ABI; ``scale`` is the ctypes type of
    alpha and beta for that compute type (``LtPlan.scale_ctype``)."""

    trans_a: bool
    trans_b: bool
    type_a: int
    type_b: int
    type_c: int
    type_d: int
    compute: int
    scale: Any
    m: tuple[int, ...]
    n: tuple[int, ...]
    k: tuple[int, ...]
    lda: tuple[int, ...]
    ldb: tuple[int, ...]
    ldc: tuple[int, ...]
    ldd: tuple[int, ...]
    alpha: float = 1.0
    beta: float = 0.0

    def __post_init__(self) -> None:
        groups = len(self.m)
        if groups == 0:
            msg = "a grouped GEMM needs at least one group"
            raise ValueError(msg)
        for name in ("n", "k", "lda", "ldb", "ldc", "ldd"):
            if len(getattr(self, name)) != groups:
                msg = f"{name} has {len(getattr(self, name))} values for {groups} groups (m has {groups})"
                raise ValueError(msg)
        rows_a = self.k if self.trans_a else self.m
        rows_b = self.n if self.trans_b else self.k
        for g in range(groups):
            m, n, k = self.m[g], self.n[g], self.k[g]
            if min(m, n, k) < 0:
                msg = f"group {g}: sizes m={m}, n={n}, k={k} must not be negative"
                raise ValueError(msg)
            for name, ld, rows in (
                ("lda", self.lda[g], rows_a[g]), ("ldb", self.ldb[g], rows_b[g]),
                ("ldc", self.ldc[g], m), ("ldd", self.ldd[g], m),
            ):  # fmt: skip
                if ld < max(1, rows):
                    msg = (
                        f"group {g}: {name}={ld} is below the {max(1, rows)} rows of its column-major matrix"
                    )
                    raise ValueError(msg)

    @property
    def groups(self) -> int:
        return len(self.m)


@dataclass(frozen=True)
class GroupedPointers:
    """The device addresses of each group's A, B, C and D (one per group each)."""

    a: tuple[int, ...]
    b: tuple[int, ...]
    c: tuple[int, ...]
    d: tuple[int, ...]


@dataclass(frozen=True)
class GroupedSolution:
    """One solution of the grouped type that supports a GroupedGemm's problem."""

    index: int  # the solution index (what getAlgosFromIndex rebuilds)
    solution_name: str  # "" where this build has no name functions
    kernel_name: str
    algo: LtAlgo  # as the support check updated it, with its workspace


class HipblasltGrouped:
    """One ``hipblaslt_ext::GroupedGemm``: set up once for a problem, run per call.

    Made by :meth:`HipblasltExt.grouped_gemm`. ``solutions()`` lists every algo of the
    grouped type (``getAllAlgos(GROUPED_GEMM)``) that supports the problem within the
    workspace limit; ``initialize(algo, workspace)`` builds the kernel arguments for one;
    then per call either ``run(stream)`` (the pointers and sizes given at creation) or, with
    ``user_args=True``, ``run_user_args(device_args, stream)``: the GPU reads each group's
    sizes and pointers from ``device_args`` (``groups`` :class:`UserArguments`, templated by
    ``default_user_args()``), so a runner can change them per call without host work, within
    the problem set up here (the launch is sized from it). ``close()`` (or ``with``) frees it.
    """

    def __init__(
        self, ext: HipblasltExt, handle: int, spec: GroupedSpec, pointers: GroupedPointers, max_workspace: int
    ) -> None:
        self.ext, self.handle, self.spec, self.max_workspace = ext, handle, spec, max_workspace
        self._ptr: int | None = None
        g = spec.groups
        for name in ("a", "b", "c", "d"):
            if len(getattr(pointers, name)) != g:
                msg = f"{len(getattr(pointers, name))} {name} pointers for {g} groups"
                raise ValueError(msg)
        longs = [(ctypes.c_int64 * g)(*getattr(spec, f)) for f in ("m", "n", "k", "lda", "ldb", "ldc", "ldd")]
        ptrs = [(ctypes.c_void_p * g)(*getattr(pointers, f)) for f in ("a", "b", "c", "d")]
        alpha = (spec.scale * g)(*[spec.alpha] * g)
        beta = (spec.scale * g)(*[spec.beta] * g)
        op = ext.abi.operation
        out = ctypes.c_void_p(None)
        status = ext.fn["unimatmul_hipblaslt_grouped_create"](
            handle, op["T" if spec.trans_a else "N"], op["T" if spec.trans_b else "N"],
            spec.type_a, spec.type_b, spec.type_c, spec.type_d, spec.compute, g,
            *longs, *ptrs, ctypes.addressof(alpha), ctypes.addressof(beta), ctypes.sizeof(spec.scale),
            max_workspace, ctypes.byref(out),
        )  # fmt: skip
        self._check("GroupedGemm::setProblem", status)
        self._ptr = out.value
        self._run = ext.fn["unimatmul_hipblaslt_grouped_run"]
        self._run_args = (
            ext.fn["unimatmul_hipblaslt_grouped_run_user_args"] if ext.grouped >= GROUPED_USER_ARGS else None
        )

    def _check(self, function: str, status: int) -> None:
        if status != _SUCCESS:
            raise LtError(function, int(status), self.ext.abi.status_name(int(status)))

    @property
    def ptr(self) -> int:
        if self._ptr is None:
            msg = "this GroupedGemm was closed"
            raise ValueError(msg)
        return self._ptr

    def supported(self, algo: LtAlgo) -> LtAlgo | None:
        """``algo`` as ``isAlgoSupported`` updates it for this problem, with its workspace; or None."""
        struct = self.ext.abi.algo_struct().from_buffer_copy(algo.data)
        workspace = ctypes.c_size_t(0)
        status = self.ext.fn["unimatmul_hipblaslt_grouped_is_algo_supported"](
            self.ptr, ctypes.addressof(struct), ctypes.byref(workspace)
        )
        if status != _SUCCESS:
            return None
        return LtAlgo(bytes(struct), int(workspace.value), algo.waves)

    def all_algos(self) -> list[LtAlgo]:
        """Every algo of the grouped type for this problem's ops and types, supported or not."""
        spec, op, fn = self.spec, self.ext.abi.operation, self.ext.fn["unimatmul_hipblaslt_get_all_algos"]
        head = (
            self.handle, GEMM_TYPE_GROUPED, op["T" if spec.trans_a else "N"], op["T" if spec.trans_b else "N"],
            spec.type_a, spec.type_b, spec.type_c, spec.type_d, spec.compute,
        )  # fmt: skip
        return self.ext._results(lambda res, cap, total: fn(*head, res, cap, total))

    def solutions(self) -> list[GroupedSolution]:
        """The grouped type's algos that support this problem within ``max_workspace``, in the
        library's order, each with its index and names."""
        found = []
        for algo in self.all_algos():
            checked = self.supported(algo)
            if checked is None or checked.workspace > self.max_workspace:
                continue
            found.append(
                GroupedSolution(
                    index=self.ext.abi.solution_index(checked.data),
                    solution_name=self.ext._name("unimatmul_hipblaslt_solution_name", self.handle, checked),
                    kernel_name=self.ext._name("unimatmul_hipblaslt_kernel_name", self.handle, checked),
                    algo=checked,
                )
            )
        return found

    def initialize(self, algo: LtAlgo, workspace: int, *, user_args: bool = False, stream: int = 0) -> None:
        """Build the kernel arguments for ``algo`` (again whenever the algo changes); ``workspace``
        is a device buffer of at least ``algo.workspace`` bytes, 16-byte aligned (0 for none)."""
        if user_args and self.ext.grouped < GROUPED_USER_ARGS:
            raise ExtUnavailable(self.ext.grouped_reason)
        if algo.workspace > self.max_workspace:
            msg = f"the algo needs {algo.workspace} bytes of workspace, above this GroupedGemm's {self.max_workspace}"
            raise ValueError(msg)
        struct = self.ext.abi.algo_struct().from_buffer_copy(algo.data)
        status = self.ext.fn["unimatmul_hipblaslt_grouped_initialize"](
            self.ptr, ctypes.addressof(struct), workspace or None, int(user_args), stream or None
        )
        self._check("GroupedGemm::initialize", status)

    def run(self, stream: int) -> None:
        """Run with the problem given at creation, on ``stream`` (0: the null stream)."""
        status = self._run(self.ptr, stream or None)
        if status != _SUCCESS:
            self._check("GroupedGemm::run", status)

    def default_user_args(self) -> ctypes.Array[UserArguments]:
        """This problem as device-side arguments, one per group, in host memory: the template a
        runner edits (sizes, pointers) and copies to the device for :meth:`run_user_args`."""
        if self.ext.grouped < GROUPED_USER_ARGS:
            raise ExtUnavailable(self.ext.grouped_reason)
        args = (UserArguments * self.spec.groups)()
        status = self.ext.fn["unimatmul_hipblaslt_grouped_default_user_args"](
            self.ptr, ctypes.addressof(args)
        )
        self._check("GroupedGemm::getDefaultValueForDeviceUserArguments", status)
        return args

    def run_user_args(self, device_args: int, stream: int) -> None:
        """Run with the per-group arguments the GPU reads at ``device_args`` (``groups``
        UserArguments in device memory, 16-byte aligned), on ``stream``."""
        if self._run_args is None:
            raise ExtUnavailable(self.ext.grouped_reason)
        status = self._run_args(self.ptr, device_args, stream or None)
        if status != _SUCCESS:
            self._check("GroupedGemm::run(userArgs)", status)

    def close(self) -> None:
        """Free the GroupedGemm (idempotent)."""
        ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self.ext.fn["unimatmul_hipblaslt_grouped_destroy"](ptr)

    def __enter__(self) -> HipblasltGrouped:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
