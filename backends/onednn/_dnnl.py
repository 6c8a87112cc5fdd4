"""Raw ctypes bindings for the oneDNN (DNNL) 3.x C API, restricted to matmul on CPU.

This is the lowest layer of the oneDNN backend: it knows nothing about
measuring or picking kernels.  It exposes

* :func:`find_library` -- locate ``libdnnl.so.3`` (env var, pip wheels, system);
* :class:`Dnnl` -- the loaded library, one CPU engine and one stream;
* :class:`MatmulSpec` / :class:`PostOp` -- a plain description of a matmul
  problem on *caller-owned* memory (layouts given as element strides, so a
  transposed operand is a stride permutation, never a copy);
* :class:`MatmulPrimitive` -- one oneDNN matmul primitive for one named
  implementation, executable on raw pointers with a minimal hot path.

All enum values and signatures are taken from the oneDNN v3.2 headers
(``dnnl_common_types.h``, ``dnnl_types.h``, ``dnnl.h``) and were checked by
compiling a C program against them. The v3.13 headers declare every one of them
with the same value and signature (docs/onednn.md), so one table serves both the
``onednn-cpu-gomp`` wheel (3.2) and the ``onednn`` wheel (3.13).

Importing this module loads nothing; the shared library is opened on the first
:class:`Dnnl` construction (usually through :func:`get_dnnl`).

Semantics of one execution (oneDNN 3.x order of operations)::

    acc = alpha * (src @ weights)          # alpha: runtime src scale, optional
    acc = acc + bias                       # bias is NOT multiplied by alpha
    for op in post_ops: acc = op(acc)      # 'sum' op: acc + beta * dst_old
    dst = acc                              # converted to dst dtype

Objects here are not thread-safe: one stream is shared by all primitives.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import mmap
import os
import struct
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unimatmul import settings

if TYPE_CHECKING:
    from typing import Self

__all__ = [
    "ENV_VAR",
    "Dnnl",
    "DnnlError",
    "ImplNotFoundError",
    "MatmulPrimitive",
    "MatmulSpec",
    "PostOp",
    "find_library",
    "get_dnnl",
]

#: Environment variable holding an explicit path to libdnnl.so.
ENV_VAR = settings.DNNL_LIB.name
# The wheels that ship libdnnl.so.3: oneDNN 3.2 with GNU OpenMP (the `cpu` extra), and
# oneDNN 3.13 built for SYCL (the `cpu-sycl` extra). Both write <prefix>/lib/libdnnl.so.3,
# so one environment holds one of them; the version is read from the library itself.
_DIST_NAMES = ("onednn-cpu-gomp", "onednn")
# The soname first: libdnnl.so is only a dev symlink and may point elsewhere.
_LIB_NAMES = ("libdnnl.so.3", "libdnnl.so")
_REQUIRED_MAJOR = 3  # struct layouts / enums below are those of the 3.x ABI

# ---------------------------------------------------------------------------
# Constants from the oneDNN 3.2 headers.
# ---------------------------------------------------------------------------

# dnnl_status_t (dnnl_common_types.h)
DNNL_SUCCESS = 0
DNNL_INVALID_ARGUMENTS = 2
DNNL_UNIMPLEMENTED = 3
DNNL_LAST_IMPL_REACHED = 4
_STATUS_NAMES = {
    0: "dnnl_success",
    1: "dnnl_out_of_memory",
    2: "dnnl_invalid_arguments",
    3: "dnnl_unimplemented",
    4: "dnnl_last_impl_reached",
    5: "dnnl_runtime_error",
    6: "dnnl_not_required",
    7: "dnnl_invalid_graph",
    8: "dnnl_invalid_graph_op",
    9: "dnnl_invalid_shape",
    10: "dnnl_invalid_data_type",
}

# dnnl_data_type_t (dnnl_common_types.h)
DNNL_DATA_TYPE_UNDEF = 0
DATA_TYPES: dict[str, int] = {"f16": 1, "bf16": 2, "f32": 3}
DTYPE_SIZES: dict[str, int] = {"f16": 2, "bf16": 2, "f32": 4}

# dnnl_fpmath_mode_t (dnnl_common_types.h)
FPMATH_MODES: dict[str, int] = {"strict": 0, "bf16": 1, "f16": 2, "any": 3, "tf32": 4}

# dnnl_engine_kind_t / dnnl_stream_flags_t (dnnl_common_types.h)
DNNL_CPU = 1
# dnnl_version_t.cpu_runtime (dnnl_config.h): how the library runs CPU work.
CPU_RUNTIMES: dict[int, str] = {
    0: "none",
    1: "seq",
    2: "omp",
    4: "tbb",
    8: "threadpool",
    256: "ocl",
    512: "sycl",
}
DNNL_RUNTIME_SYCL = 512
DNNL_STREAM_DEFAULT_FLAGS = 1  # dnnl_stream_in_order

# dnnl_alg_kind_t (dnnl_types.h): relu = 0x20, the others count up from it.
ELTWISE_ALGS: dict[str, int] = {"relu": 0x20, "gelu_tanh": 43, "gelu_erf": 49}

# dnnl_scratchpad_mode_t (dnnl_types.h)
DNNL_SCRATCHPAD_MODE_USER = 1

# dnnl_query_t (dnnl_types.h)
DNNL_QUERY_IMPL_INFO_STR = 8
DNNL_QUERY_EXEC_ARG_MD = 255

# Execution argument indices (dnnl_types.h)
DNNL_ARG_SRC = 1
DNNL_ARG_DST = 17
DNNL_ARG_WEIGHTS = 33
DNNL_ARG_BIAS = 41
DNNL_ARG_SCRATCHPAD = 80
DNNL_ARG_ATTR_SCALES = 4096

DNNL_MAX_NDIMS = 12
# DNNL_MEMORY_NONE is NULL; DNNL_MEMORY_ALLOCATE is (void *)(size_t)-1.
DNNL_MEMORY_NONE: int | None = None
DNNL_MEMORY_ALLOCATE = ctypes.c_void_p(-1 & (2 ** (8 * ctypes.sizeof(ctypes.c_void_p)) - 1))

_Dims = ctypes.c_int64 * DNNL_MAX_NDIMS


class _VersionT(ctypes.Structure):
    """dnnl_version_t."""

    _fields_ = [
        ("major", ctypes.c_int),
        ("minor", ctypes.c_int),
        ("patch", ctypes.c_int),
        ("hash", ctypes.c_char_p),
        ("cpu_runtime", ctypes.c_uint),
        ("gpu_runtime", ctypes.c_uint),
    ]


class _ExecArg(ctypes.Structure):
    """dnnl_exec_arg_t: {int arg; dnnl_memory_t memory;} (16 bytes on x86-64)."""

    _fields_ = [("arg", ctypes.c_int), ("memory", ctypes.c_void_p)]


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


class DnnlError(RuntimeError):
    """A oneDNN C API call returned a status other than dnnl_success."""

    def __init__(self, status: int, function: str, detail: str = "") -> None:
        self.status = int(status)
        self.function = function
        self.status_name = _STATUS_NAMES.get(self.status, f"unknown status {self.status}")
        msg = f"{function} failed with {self.status_name} ({self.status})"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class ImplNotFoundError(ValueError):
    """The requested implementation name is not offered for this problem."""

    def __init__(self, wanted: str, offered: Sequence[str]) -> None:
        self.wanted = wanted
        self.offered = list(offered)
        super().__init__(
            f"oneDNN offers no matmul implementation named {wanted!r} for this "
            f"problem; offered: {self.offered}"
        )


# ---------------------------------------------------------------------------
# Library discovery
# ---------------------------------------------------------------------------


def _dist_lib_candidates(dist: str) -> list[Path]:
    """libdnnl files recorded in the RECORD of the installed wheel ``dist``.

    The wheels put them in their ``.data/data`` dir, i.e. ``<prefix>/lib``; the
    RECORD paths are relative to site-packages (``../../libdnnl.so.3``), so
    ``locate()`` resolves them wherever the environment lives.
    """
    try:
        files = importlib.metadata.files(dist)
    except importlib.metadata.PackageNotFoundError:
        return []
    if not files:
        return []
    found = [f for f in files if Path(str(f)).name in _LIB_NAMES]
    found.sort(key=lambda f: _LIB_NAMES.index(Path(str(f)).name))
    return [Path(os.path.normpath(str(f.locate()))) for f in found]


def find_library() -> str:
    """Return a path (or loadable soname) for oneDNN's shared library.

    Order: ``$UNIMATMUL_DNNL_LIB`` (must exist if set -- an explicit choice is
    never silently replaced), ``sys.prefix/lib``, the files of the installed
    ``onednn-cpu-gomp`` or ``onednn`` distribution, then
    ``ctypes.util.find_library('dnnl')``. Raises ``OSError`` naming every place looked.
    """
    env = settings.DNNL_LIB.get()
    if env:
        if os.path.isfile(env):
            return env
        raise OSError(f"${ENV_VAR} is set to {env!r}, which is not an existing file")

    looked: list[str] = []
    candidates = [Path(sys.prefix) / "lib" / name for name in _LIB_NAMES]
    missing: list[str] = []
    for dist in _DIST_NAMES:
        found = _dist_lib_candidates(dist)
        if not found:
            missing.append(dist)
        candidates += found
    for cand in candidates:
        if str(cand) in looked:
            continue
        looked.append(str(cand))
        if cand.is_file():
            return str(cand)
    looked += [f"files of distribution {dist!r} (not installed)" for dist in missing]

    system = ctypes.util.find_library("dnnl")
    if system:
        return system
    looked.append("ctypes.util.find_library('dnnl') (system linker paths)")
    raise OSError(
        "oneDNN shared library (libdnnl.so.3) not found; looked in: "
        + "; ".join(looked)
        + f". Install {_DIST_NAMES[0]} (pip install -e '.[cpu]' in the unimatmul checkout) or set ${ENV_VAR}."
    )


def _elf_needed(path: str) -> list[str]:
    """The DT_NEEDED names of a 64-bit little-endian ELF shared library, in order.

    Read from the dynamic segment (program headers), so stripped libraries work too,
    through a read-only map (libdnnl 3.13 is 107 MB; a few pages are touched).
    Returns [] for anything that is not such a file.
    """
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _read_needed(data)
    except (OSError, ValueError, struct.error):  # unreadable, empty or truncated
        return []


def _read_needed(data: mmap.mmap) -> list[str]:
    if data[:6] != b"\x7fELF\x02\x01":  # ELFCLASS64, ELFDATA2LSB: x86-64 Linux
        return []
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz) of PT_LOAD segments
    dynamic: tuple[int, int] | None = None
    for i in range(phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize
        )
        if p_type == 1:  # PT_LOAD
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:  # PT_DYNAMIC
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return []
    needed: list[int] = []
    strtab = None
    for pos in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, val = struct.unpack_from("<qQ", data, pos)
        if tag == 0:  # DT_NULL
            break
        if tag == 1:  # DT_NEEDED: an offset into the string table
            needed.append(val)
        elif tag == 5:  # DT_STRTAB: a virtual address, mapped back to a file offset
            strtab = next((off + val - va for va, off, size in loads if va <= val < va + size), None)
    if strtab is None:
        return []
    return [data[strtab + off : data.find(b"\0", strtab + off)].decode() for off in needed]


def _load_with_neighbours(path: str) -> ctypes.CDLL:
    """Open ``path``; if a dependency is missing, take it from the library's own folder.

    The ``onednn`` wheel (3.13) puts libdnnl beside its runtime (libtbb, libsycl, the
    Intel math libraries, all in ``<prefix>/lib``) but records no RUNPATH, so the
    loader does not look there. Loading those dependencies by path first satisfies
    libdnnl's DT_NEEDED entries (the loader matches a loaded library by soname), as a
    RUNPATH of $ORIGIN would, without touching LD_LIBRARY_PATH. A library that loads as
    it is (the 3.2 wheel, a system build) is loaded as it is.
    """
    try:
        return ctypes.CDLL(path)
    except OSError as first:
        folder = os.path.dirname(path)
        if not folder:
            raise
        loaded: set[str] = set()

        def preload(lib: str) -> None:
            for name in _elf_needed(lib):
                beside = os.path.join(folder, name)
                if name not in loaded and os.path.isfile(beside):
                    loaded.add(name)
                    preload(beside)  # depth first: its own dependencies before it
                    ctypes.CDLL(beside)

        try:
            preload(path)
            return ctypes.CDLL(path)
        except OSError as exc:
            msg = f"cannot load {path}: {exc} (first attempt: {first}; loaded from its folder: {sorted(loaded)})"
            raise OSError(msg) from exc


#: The environment variable through which the OpenCL ICD loader finds extra drivers.
OPENCL_ICD_VAR = "OCL_ICD_FILENAMES"


def _point_opencl_at_cpu_runtime(lib_path: str) -> None:
    """Let a SYCL build of oneDNN find its CPU device (before the first engine is made).

    The ``onednn`` wheel's CPU engine is a SYCL device served by the Intel OpenCL CPU
    runtime (``libintelocl.so``, wheel ``intel-opencl-rt``, installed beside libdnnl).
    That wheel's ICD file names an unsubstituted build path
    (``/opt/anaconda1anaconda2anaconda3/lib/libintelocl.so``), and the ICD loader reads
    ``/etc/OpenCL/vendors`` anyway, so without help oneDNN sees no CPU device and every
    engine creation fails. The loader reads ``$OCL_ICD_FILENAMES`` when it first
    enumerates platforms, which happens inside oneDNN's first engine creation, so setting
    it here (only when it is unset, and only to the runtime that came with this
    library) is enough. A value the user set is left as it is.
    """
    # Absolute: the ICD loader opens it later, from whatever the working directory is then.
    runtime = os.path.join(os.path.dirname(os.path.abspath(lib_path)), "libintelocl.so")
    if not os.environ.get(OPENCL_ICD_VAR) and os.path.isfile(runtime):
        os.environ[OPENCL_ICD_VAR] = runtime


# ---------------------------------------------------------------------------
# Function table: name -> (restype, argtypes, status-checked)
# ---------------------------------------------------------------------------

_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_I = ctypes.c_int
_STATUS = ctypes.c_int

_FUNCS: dict[str, tuple[Any, list[Any], bool]] = {
    "dnnl_version": (ctypes.POINTER(_VersionT), [], False),
    "dnnl_set_verbose": (_STATUS, [_I], True),
    "dnnl_engine_get_count": (ctypes.c_size_t, [_I], False),
    "dnnl_engine_create": (_STATUS, [_PP, _I, ctypes.c_size_t], True),
    "dnnl_engine_destroy": (_STATUS, [_P], True),
    "dnnl_stream_create": (_STATUS, [_PP, _P, ctypes.c_uint], True),
    "dnnl_stream_wait": (_STATUS, [_P], True),
    "dnnl_stream_destroy": (_STATUS, [_P], True),
    "dnnl_memory_desc_create_with_strides": (
        _STATUS,
        [_PP, _I, ctypes.POINTER(ctypes.c_int64), _I, ctypes.POINTER(ctypes.c_int64)],
        True,
    ),
    "dnnl_memory_desc_destroy": (_STATUS, [_P], True),
    "dnnl_memory_desc_get_size": (ctypes.c_size_t, [_P], False),
    "dnnl_memory_create": (_STATUS, [_PP, _P, _P, _P], True),
    "dnnl_memory_set_data_handle": (_STATUS, [_P, _P], True),
    "dnnl_memory_destroy": (_STATUS, [_P], True),
    "dnnl_primitive_attr_create": (_STATUS, [_PP], True),
    "dnnl_primitive_attr_destroy": (_STATUS, [_P], True),
    "dnnl_primitive_attr_set_fpmath_mode": (_STATUS, [_P, _I], True),
    "dnnl_primitive_attr_set_scratchpad_mode": (_STATUS, [_P, _I], True),
    "dnnl_primitive_attr_set_scales_mask": (_STATUS, [_P, _I, _I], True),
    "dnnl_primitive_attr_set_post_ops": (_STATUS, [_P, _P], True),
    "dnnl_post_ops_create": (_STATUS, [_PP], True),
    "dnnl_post_ops_destroy": (_STATUS, [_P], True),
    "dnnl_post_ops_append_sum": (
        _STATUS,
        [_P, ctypes.c_float, ctypes.c_int32, _I],
        True,
    ),
    "dnnl_post_ops_append_eltwise": (
        _STATUS,
        [_P, _I, ctypes.c_float, ctypes.c_float],
        True,
    ),
    "dnnl_matmul_primitive_desc_create": (_STATUS, [_PP, _P, _P, _P, _P, _P, _P], True),
    # next_impl is checked by hand: dnnl_last_impl_reached is not an error.
    "dnnl_primitive_desc_next_impl": (_STATUS, [_P], False),
    "dnnl_primitive_desc_query": (_STATUS, [_P, _I, _I, _P], True),
    "dnnl_primitive_desc_query_md": (_P, [_P, _I, _I], False),
    "dnnl_primitive_desc_destroy": (_STATUS, [_P], True),
    "dnnl_primitive_create": (_STATUS, [_PP, _P], True),
    "dnnl_primitive_execute": (_STATUS, [_P, _P, _I, ctypes.POINTER(_ExecArg)], True),
    "dnnl_primitive_destroy": (_STATUS, [_P], True),
}


def _errcheck(result: int, func: Any, _args: tuple[Any, ...]) -> int:
    # errcheck runs inside the ctypes call, so every checked function raises
    # with its own name and no caller can forget a status check.
    if result != DNNL_SUCCESS:
        raise DnnlError(result, func.__name__)
    return result


# ---------------------------------------------------------------------------
# The library object
# ---------------------------------------------------------------------------


class Dnnl:
    """The loaded oneDNN library with one CPU engine (index 0) and one stream.

    Prefer :func:`get_dnnl` (process-wide instance). The engine and stream are
    created on first use and live until :meth:`close`; primitives keep a
    reference to this object so it outlives them.
    """

    def __init__(self, path: str | None = None) -> None:
        self.path = path if path is not None else find_library()
        self._lib = _load_with_neighbours(self.path)
        self._fn: dict[str, Callable[..., Any]] = {}
        for name, (restype, argtypes, checked) in _FUNCS.items():
            fn = getattr(self._lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
            if checked:
                fn.errcheck = _errcheck
            self._fn[name] = fn
        info = self._fn["dnnl_version"]().contents
        if info.major != _REQUIRED_MAJOR:
            raise OSError(
                f"{self.path} is oneDNN {info.major}.{info.minor}.{info.patch}; these "
                f"bindings need the {_REQUIRED_MAJOR}.x C API"
            )
        #: How the library runs CPU work: 'omp' (the 3.2 wheel), 'sycl' (the 3.13 wheel), ...
        self.cpu_runtime = CPU_RUNTIMES.get(info.cpu_runtime, f"0x{info.cpu_runtime:x}")
        #: True in a child forked after this (SYCL) library ran: see _refuse_after_fork.
        self.forked = False
        if info.cpu_runtime == DNNL_RUNTIME_SYCL:
            _point_opencl_at_cpu_runtime(self.path)
            _SYCL_LIBRARIES.add(self)
        self._lock = threading.Lock()
        self._engine: ctypes.c_void_p | None = None
        self._stream: ctypes.c_void_p | None = None
        self._closed = False

    # -- service ------------------------------------------------------------

    def fn(self, name: str) -> Callable[..., Any]:
        """The declared ctypes function ``name`` (status-checked if it returns one)."""
        return self._fn[name]

    def version_info(self) -> tuple[int, int, int, str]:
        """(major, minor, patch, git hash) from dnnl_version()."""
        v = self._fn["dnnl_version"]().contents
        return v.major, v.minor, v.patch, (v.hash or b"").decode()

    def version(self) -> str:
        """'3.2.0+<git hash>' (just 'x.y.z' if the build recorded no hash)."""
        major, minor, patch, githash = self.version_info()
        base = f"{major}.{minor}.{patch}"
        return f"{base}+{githash}" if githash else base

    def set_verbose(self, level: int) -> None:
        """dnnl_set_verbose: 0 off, 1 execution info, 2 also creation info."""
        self._fn["dnnl_set_verbose"](level)

    # -- engine / stream ----------------------------------------------------

    def _ensure(self) -> None:
        if self.forked:
            raise RuntimeError(_fork_message(self))
        if self._stream is not None:
            return
        with self._lock:
            if self._closed:
                raise RuntimeError("Dnnl object is closed")
            if self._stream is not None:
                return
            engine = ctypes.c_void_p()
            try:
                self._fn["dnnl_engine_create"](ctypes.byref(engine), DNNL_CPU, 0)
            except DnnlError as exc:
                if self.cpu_runtime != "sycl":
                    raise
                raise DnnlError(
                    exc.status,
                    exc.function,
                    f"oneDNN {self.version()} runs CPU work through SYCL and found no SYCL CPU "
                    "device: it needs the Intel OpenCL CPU runtime (libintelocl.so, from the "
                    "intel-opencl-rt wheel) named in $OCL_ICD_FILENAMES (now "
                    f"{os.environ.get('OCL_ICD_FILENAMES', 'unset')!r})",
                ) from exc
            stream = ctypes.c_void_p()
            try:
                self._fn["dnnl_stream_create"](ctypes.byref(stream), engine, DNNL_STREAM_DEFAULT_FLAGS)
            except BaseException:
                self._fn["dnnl_engine_destroy"](engine)
                raise
            self._engine = engine
            self._stream = stream

    @property
    def engine(self) -> ctypes.c_void_p:
        """The CPU engine (index 0), created once."""
        self._ensure()
        assert self._engine is not None
        return self._engine

    @property
    def stream(self) -> ctypes.c_void_p:
        """The in-order stream on :attr:`engine`, created once."""
        self._ensure()
        assert self._stream is not None
        return self._stream

    def close(self) -> None:
        """Destroy stream and engine. Close every MatmulPrimitive first."""
        with self._lock:
            self._closed = True
            if self._stream is not None:
                self._fn["dnnl_stream_destroy"](self._stream)
                self._stream = None
            if self._engine is not None:
                self._fn["dnnl_engine_destroy"](self._engine)
                self._engine = None

    # -- matmul -------------------------------------------------------------

    def list_impls(self, spec: MatmulSpec) -> list[str]:
        """Names of all implementations oneDNN offers for ``spec``, best first.

        Empty if the problem is unimplemented altogether.
        """
        try:
            pd, owned = _create_matmul_pd(self, spec)
        except DnnlError as e:
            if e.status == DNNL_UNIMPLEMENTED:  # nothing offers this spec
                return []
            raise
        try:
            names = [_impl_name(self, pd)]
            while _next_impl(self, pd):
                names.append(_impl_name(self, pd))
            return names
        finally:
            self._fn["dnnl_primitive_desc_destroy"](pd)
            owned.release()

    def matmul(self, spec: MatmulSpec, impl: str | None = None) -> MatmulPrimitive:
        """Build a :class:`MatmulPrimitive` for ``spec`` (``impl=None``: oneDNN's first)."""
        return MatmulPrimitive(self, spec, impl)


# A SYCL build's runtime threads do not exist in a forked child, and its first
# dnnl_primitive_execute there waits for them forever (measured with the 3.13 wheel; the
# OpenMP build of 3.2 runs on). So the child refuses, with an error that says why, instead
# of hanging: the selector then warns once and runs Default. The native caller (torch
# routing's C++) holds raw function addresses and is not covered.
_SYCL_LIBRARIES: weakref.WeakSet[Dnnl] = weakref.WeakSet()
_SYCL_PRIMITIVES: weakref.WeakSet[MatmulPrimitive] = weakref.WeakSet()


def _fork_message(dnnl: Dnnl) -> str:
    return (
        f"oneDNN {dnnl.version()} runs CPU work through SYCL, whose runtime does not survive "
        "fork(): this process was forked from one that used it. Start workers with the "
        "'spawn' or 'forkserver' method, or use oneDNN 3.2 (the `cpu` extra)"
    )


def _refuse_after_fork() -> None:
    for dnnl in list(_SYCL_LIBRARIES):
        dnnl.forked = True
    for prim in list(_SYCL_PRIMITIVES):
        message = _fork_message(prim._dnnl)

        def refuse(*_args: Any, message: str = message) -> None:
            raise RuntimeError(message)

        prim._execute = refuse  # the hot path stays as it was in the parent


os.register_at_fork(after_in_child=_refuse_after_fork)

_INSTANCE: Dnnl | None = None
_INSTANCE_LOCK = threading.Lock()


def get_dnnl() -> Dnnl:
    """The process-wide :class:`Dnnl` (library loaded on first call only)."""
    global _INSTANCE
    if _INSTANCE is None:
        with _INSTANCE_LOCK:
            if _INSTANCE is None:
                _INSTANCE = Dnnl()
    return _INSTANCE


# ---------------------------------------------------------------------------
# Problem description
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class PostOp:
    """One post-op, applied in order after ``alpha * src @ weights + bias``.

    kind: 'relu', 'gelu_erf', 'gelu_tanh' (eltwise) or 'sum'.
    scale: only for 'sum': ``acc += scale * dst_old`` (the GEMM beta). It is
    baked into the primitive at creation (oneDNN 3.2 has no runtime sum scale).
    """

    kind: str
    scale: float = 1.0

    def __post_init__(self) -> None:
        if self.kind != "sum" and self.kind not in ELTWISE_ALGS:
            raise ValueError(
                f"unknown post-op {self.kind!r}; expected 'sum' or one of {sorted(ELTWISE_ALGS)}"
            )
        if self.kind != "sum" and self.scale != 1.0:
            raise ValueError("scale applies only to the 'sum' post-op")


def _contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * max(int(shape[i + 1]), 1)
    return tuple(strides)


@dataclass(frozen=True)
class MatmulSpec:
    """A matmul on caller memory: dst[b,m,n] = src[b,m,k] @ weights[b,k,n].

    ``batch == 1`` is a 2-D problem (shapes [m,k], [k,n], [m,n]); otherwise
    3-D.  Strides are in *elements* (not bytes), one per dim; ``None`` means
    row-major contiguous.  A transposed operand is a stride permutation, e.g.
    src stored as [k,m] row-major is ``src_strides=(1, m)``.  For batch == 1,
    3-element strides are accepted and the batch stride is dropped.

    bias_dtype: None for no bias, else the bias (shape [1,n] / [1,1,n],
    contiguous) dtype.  runtime_alpha: reserve a runtime scalar alpha (a
    common src scale) passed to ``execute``.  fpmath: oneDNN fpmath mode
    ('strict' default; 'bf16'/'tf32'/'f16'/'any' allow implicit down-conversion
    of f32 math and usually change the offered implementations).
    """

    batch: int
    m: int
    k: int
    n: int
    src_dtype: str = "f32"
    wei_dtype: str = "f32"
    dst_dtype: str = "f32"
    src_strides: tuple[int, ...] | None = None
    wei_strides: tuple[int, ...] | None = None
    dst_strides: tuple[int, ...] | None = None
    bias_dtype: str | None = None
    post_ops: tuple[PostOp, ...] = ()
    runtime_alpha: bool = False
    fpmath: str = "strict"

    def __post_init__(self) -> None:
        for name in ("batch", "m", "k", "n"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("src_dtype", "wei_dtype", "dst_dtype"):
            if getattr(self, name) not in DATA_TYPES:
                raise ValueError(f"{name}={getattr(self, name)!r}; expected one of {list(DATA_TYPES)}")
        if self.bias_dtype is not None and self.bias_dtype not in DATA_TYPES:
            raise ValueError(f"bias_dtype={self.bias_dtype!r}; expected None or one of {list(DATA_TYPES)}")
        if self.fpmath not in FPMATH_MODES:
            raise ValueError(f"fpmath={self.fpmath!r}; expected one of {list(FPMATH_MODES)}")
        if sum(op.kind == "sum" for op in self.post_ops) > 1:
            raise ValueError("at most one 'sum' post-op is allowed")
        # Normalise (lists -> tuples, validate lengths) so specs hash and compare.
        object.__setattr__(self, "post_ops", tuple(self.post_ops))
        for which in ("src", "wei", "dst"):
            object.__setattr__(self, f"{which}_strides", self.strides(which))

    @property
    def ndims(self) -> int:
        return 2 if self.batch == 1 else 3

    def shape(self, which: str) -> tuple[int, ...]:
        """Logical dims of 'src', 'wei', 'dst' or 'bias' in oneDNN order."""
        mn = {
            "src": (self.m, self.k),
            "wei": (self.k, self.n),
            "dst": (self.m, self.n),
            "bias": (1, self.n),
        }[which]
        return mn if self.ndims == 2 else ((1 if which == "bias" else self.batch), *mn)

    def strides(self, which: str) -> tuple[int, ...]:
        """Element strides of 'src', 'wei', 'dst' or 'bias' (validated)."""
        shape = self.shape(which)
        given = None if which == "bias" else getattr(self, f"{which}_strides")
        if given is None:
            return _contiguous(shape)
        st = tuple(int(s) for s in given)
        if self.ndims == 2 and len(st) == 3:
            st = st[1:]
        if len(st) != len(shape):
            raise ValueError(f"{which}_strides={given} must have {len(shape)} entries for shape {shape}")
        if any(s < 1 for s in st):
            raise ValueError(f"{which}_strides={given} must be positive")
        return st

    def extent(self, which: str) -> int:
        """Elements from the base pointer to one past the last element touched."""
        return 1 + sum((d - 1) * s for d, s in zip(self.shape(which), self.strides(which), strict=True))

    def dtype(self, which: str) -> str:
        dt = {
            "src": self.src_dtype,
            "wei": self.wei_dtype,
            "dst": self.dst_dtype,
            "bias": self.bias_dtype,
        }[which]
        if dt is None:
            raise ValueError("spec has no bias")
        return dt


# ---------------------------------------------------------------------------
# Primitive-descriptor construction (shared by list_impls and MatmulPrimitive)
# ---------------------------------------------------------------------------


class _Owned:
    """Handles created while building a primitive desc, released in reverse."""

    def __init__(self, dnnl: Dnnl) -> None:
        self._dnnl = dnnl
        self._items: list[tuple[str, ctypes.c_void_p]] = []

    def add(self, destroy: str, handle: ctypes.c_void_p) -> ctypes.c_void_p:
        self._items.append((destroy, handle))
        return handle

    def release(self) -> None:
        while self._items:
            destroy, handle = self._items.pop()
            self._dnnl.fn(destroy)(handle)


def _memory_desc(
    dnnl: Dnnl, owned: _Owned, shape: Sequence[int], strides: Sequence[int], dtype: str
) -> ctypes.c_void_p:
    dims, st = _Dims(*shape), _Dims(*strides)
    md = ctypes.c_void_p()
    dnnl.fn("dnnl_memory_desc_create_with_strides")(ctypes.byref(md), len(shape), dims, DATA_TYPES[dtype], st)
    return owned.add("dnnl_memory_desc_destroy", md)


def _create_matmul_pd(dnnl: Dnnl, spec: MatmulSpec) -> tuple[ctypes.c_void_p, _Owned]:
    """Create a matmul primitive desc (positioned at oneDNN's first impl).

    Returns the pd (caller destroys it) and the helper objects it was built
    from (memory descs, attr, post-ops; the pd holds copies, so the caller may
    release them any time).
    """
    owned = _Owned(dnnl)
    try:
        mds = {
            w: _memory_desc(dnnl, owned, spec.shape(w), spec.strides(w), spec.dtype(w))
            for w in ("src", "wei", "dst")
        }
        bias_md = None
        if spec.bias_dtype is not None:
            bias_md = _memory_desc(dnnl, owned, spec.shape("bias"), spec.strides("bias"), spec.bias_dtype)

        attr = ctypes.c_void_p()
        dnnl.fn("dnnl_primitive_attr_create")(ctypes.byref(attr))
        owned.add("dnnl_primitive_attr_destroy", attr)
        # User scratchpad: we allocate it once per primitive, so execute()
        # never touches oneDNN's (global, growable) library scratchpad.
        dnnl.fn("dnnl_primitive_attr_set_scratchpad_mode")(attr, DNNL_SCRATCHPAD_MODE_USER)
        if spec.fpmath != "strict":
            dnnl.fn("dnnl_primitive_attr_set_fpmath_mode")(attr, FPMATH_MODES[spec.fpmath])
        if spec.runtime_alpha:
            # mask 0: one common scale for the whole src tensor. oneDNN 3.x
            # applies it to the accumulator before bias and post-ops.
            dnnl.fn("dnnl_primitive_attr_set_scales_mask")(attr, DNNL_ARG_SRC, 0)
        if spec.post_ops:
            po = ctypes.c_void_p()
            dnnl.fn("dnnl_post_ops_create")(ctypes.byref(po))
            owned.add("dnnl_post_ops_destroy", po)
            for op in spec.post_ops:
                if op.kind == "sum":
                    # zero point 0, data type undef = same as dst.
                    dnnl.fn("dnnl_post_ops_append_sum")(po, op.scale, 0, DNNL_DATA_TYPE_UNDEF)
                else:
                    # alpha=0 (relu negative slope / unused for gelu), beta unused.
                    dnnl.fn("dnnl_post_ops_append_eltwise")(po, ELTWISE_ALGS[op.kind], 0.0, 0.0)
            dnnl.fn("dnnl_primitive_attr_set_post_ops")(attr, po)

        pd = ctypes.c_void_p()
        dnnl.fn("dnnl_matmul_primitive_desc_create")(
            ctypes.byref(pd),
            dnnl.engine,
            mds["src"],
            mds["wei"],
            bias_md,
            mds["dst"],
            attr,
        )
    except BaseException:
        owned.release()
        raise
    return pd, owned


def _next_impl(dnnl: Dnnl, pd: ctypes.c_void_p) -> bool:
    """Advance ``pd`` to the next implementation; False once none is left."""
    status = dnnl.fn("dnnl_primitive_desc_next_impl")(pd)
    if status == DNNL_LAST_IMPL_REACHED:
        return False  # pd stays on the last implementation
    if status != DNNL_SUCCESS:
        raise DnnlError(status, "dnnl_primitive_desc_next_impl")
    return True


def _impl_name(dnnl: Dnnl, pd: ctypes.c_void_p) -> str:
    out = ctypes.c_char_p()
    dnnl.fn("dnnl_primitive_desc_query")(pd, DNNL_QUERY_IMPL_INFO_STR, 0, ctypes.byref(out))
    return (out.value or b"").decode()


# ---------------------------------------------------------------------------
# The executable primitive
# ---------------------------------------------------------------------------


class MatmulPrimitive:
    """One oneDNN matmul primitive, bound to one implementation, on raw pointers.

    Everything (primitive, memory objects, scratchpad, exec-arg array) is built
    here once; :meth:`execute` only swaps data pointers and runs.
    """

    def __init__(self, dnnl: Dnnl, spec: MatmulSpec, impl: str | None = None) -> None:
        # Set every handle first so close() works on a half-built object.
        self._dnnl = dnnl
        self.spec = spec
        self._pd: ctypes.c_void_p | None = None
        self._prim: ctypes.c_void_p | None = None
        self._mems: list[ctypes.c_void_p] = []
        self._closed = False
        try:
            self._build(impl)
        except BaseException:
            self.close()
            raise

    def _build(self, impl: str | None) -> None:
        dnnl, spec = self._dnnl, self.spec
        pd, owned = _create_matmul_pd(dnnl, spec)
        self._pd = pd
        try:
            name = _impl_name(dnnl, pd)
            if impl is not None:
                seen = [name]
                while name != impl:
                    if not _next_impl(dnnl, pd):
                        raise ImplNotFoundError(impl, seen)
                    name = _impl_name(dnnl, pd)
                    seen.append(name)
            #: The implementation actually running, e.g. 'brg:avx512_core'.
            self.impl_name = name

            prim = ctypes.c_void_p()
            dnnl.fn("dnnl_primitive_create")(ctypes.byref(prim), pd)
            self._prim = prim

            def mem(md: ctypes.c_void_p | int, handle: Any) -> ctypes.c_void_p:
                m = ctypes.c_void_p()
                dnnl.fn("dnnl_memory_create")(ctypes.byref(m), md, dnnl.engine, handle)
                self._mems.append(m)
                return m

            # Memory objects over the pd's exec-arg descs. These equal the
            # strided descs we asked for (we never use format 'any'), so the
            # primitive runs directly on the caller's buffers.
            args: list[tuple[int, ctypes.c_void_p]] = []
            self._src = mem(self._query_md(DNNL_ARG_SRC), DNNL_MEMORY_NONE)
            self._wei = mem(self._query_md(DNNL_ARG_WEIGHTS), DNNL_MEMORY_NONE)
            self._dst = mem(self._query_md(DNNL_ARG_DST), DNNL_MEMORY_NONE)
            args += [
                (DNNL_ARG_SRC, self._src),
                (DNNL_ARG_WEIGHTS, self._wei),
                (DNNL_ARG_DST, self._dst),
            ]
            self._bias: ctypes.c_void_p | None = None
            if spec.bias_dtype is not None:
                self._bias = mem(self._query_md(DNNL_ARG_BIAS), DNNL_MEMORY_NONE)
                args.append((DNNL_ARG_BIAS, self._bias))
            # Runtime alpha lives in a 1-element f32 buffer that we own; the
            # memory object points at it permanently, execute() only rewrites
            # the float.
            self._alpha_buf = ctypes.c_float(1.0)
            if spec.runtime_alpha:
                smd = _memory_desc(dnnl, owned, (1,), (1,), "f32")
                scales = mem(smd, ctypes.addressof(self._alpha_buf))
                args.append((DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, scales))
            scratch_md = self._query_md(DNNL_ARG_SCRATCHPAD)
            #: Bytes of the user scratchpad allocated once for this primitive.
            self.scratchpad_bytes = int(dnnl.fn("dnnl_memory_desc_get_size")(scratch_md))
            if self.scratchpad_bytes:
                args.append((DNNL_ARG_SCRATCHPAD, mem(scratch_md, DNNL_MEMORY_ALLOCATE)))

            self._args = (_ExecArg * len(args))(*[_ExecArg(a, m.value) for a, m in args])
            self._nargs = len(args)
        finally:
            owned.release()

        # Bind hot-path callables and handles to locals-friendly attributes.
        self._set_handle = dnnl.fn("dnnl_memory_set_data_handle")
        self._execute: Callable[..., Any] = dnnl.fn("dnnl_primitive_execute")
        if dnnl.cpu_runtime == "sycl":
            _SYCL_PRIMITIVES.add(self)
        self._wait = dnnl.fn("dnnl_stream_wait")
        self._stream = dnnl.stream

    def _query_md(self, arg: int) -> ctypes.c_void_p:
        # The pd owns the returned desc (do not destroy it). An unused
        # optional argument (e.g. no scratchpad) yields a zero desc of size 0;
        # NULL only happens on error.
        md = self._dnnl.fn("dnnl_primitive_desc_query_md")(self._pd, DNNL_QUERY_EXEC_ARG_MD, arg)
        if not md:
            raise DnnlError(
                DNNL_INVALID_ARGUMENTS,
                "dnnl_primitive_desc_query_md",
                f"no memory desc for execution argument {arg}",
            )
        return ctypes.c_void_p(md)

    def execute(self, src: int, wei: int, dst: int, bias: int | None = None, alpha: float = 1.0) -> None:
        """Run once on raw addresses and wait for completion.

        ``dst`` is also read when a 'sum' post-op is present (beta * dst_old).
        ``alpha`` needs ``spec.runtime_alpha``; ``bias`` is required iff the
        spec has a bias.
        """
        if self._closed:
            raise RuntimeError("MatmulPrimitive is closed")
        sh = self._set_handle
        sh(self._src, src)
        sh(self._wei, wei)
        sh(self._dst, dst)
        if self._bias is not None:
            if not bias:
                raise ValueError("this primitive was built with a bias; pass bias=<address>")
            sh(self._bias, bias)
        elif bias:
            raise ValueError("this primitive was built without a bias")
        if self.spec.runtime_alpha:
            self._alpha_buf.value = alpha
        elif alpha != 1.0:
            raise ValueError("alpha != 1 needs MatmulSpec(runtime_alpha=True)")
        self._execute(self._prim, self._stream, self._nargs, self._args)
        self._wait(self._stream)

    def native_words(self) -> list[int]:
        """What :meth:`execute` does, as addresses for a native caller (torch routing's C++).

        The ``dnnl_memory_set_data_handle``, ``dnnl_primitive_execute`` and
        ``dnnl_stream_wait`` functions, the primitive, the stream, the exec-arg count and
        array, the src, weights, dst and bias memories (0: no bias), and the runtime
        alpha's float (0: none). The caller sets the three (four) data handles, writes
        alpha, executes and waits, one call at a time, as :meth:`execute` does.
        """
        if self._closed:
            raise RuntimeError("MatmulPrimitive is closed")
        if self._dnnl.forked:
            raise RuntimeError(_fork_message(self._dnnl))

        def address(obj: Any) -> int:
            return int(ctypes.cast(obj, ctypes.c_void_p).value or 0)

        return [
            address(self._set_handle),
            address(self._execute),
            address(self._wait),
            address(self._prim),
            address(self._stream),
            self._nargs,
            ctypes.addressof(self._args),
            address(self._src),
            address(self._wei),
            address(self._dst),
            address(self._bias) if self._bias is not None else 0,
            ctypes.addressof(self._alpha_buf) if self.spec.runtime_alpha else 0,
        ]

    def close(self) -> None:
        """Release primitive, memories and primitive desc (idempotent)."""
        if getattr(self, "_closed", True):
            return
        self._closed = True
        dnnl = self._dnnl
        while self._mems:
            dnnl.fn("dnnl_memory_destroy")(self._mems.pop())
        if self._prim is not None:
            dnnl.fn("dnnl_primitive_destroy")(self._prim)
            self._prim = None
        if self._pd is not None:
            dnnl.fn("dnnl_primitive_desc_destroy")(self._pd)
            self._pd = None

    def __del__(self) -> None:
        # Never raise from a finalizer. No module global here: at interpreter exit they
        # may already be None (contextlib.suppress failed so, after oneDNN had won).
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self.spec
        return (
            f"MatmulPrimitive({self.__dict__.get('impl_name', '?')!r}, batch={s.batch}, m={s.m}, "
            f"k={s.k}, n={s.n}, {s.src_dtype}x{s.wei_dtype}->{s.dst_dtype})"
        )
