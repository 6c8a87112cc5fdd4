"""The native routing kernels: building them, and the table they read.

``_native.cpp`` holds C++ kernels for ``aten::mm``, ``bmm``, ``addmm`` and ``baddbmm``
that do what the Python kernels of :mod:`unimatmul.torch.routing` do on a known
operand key, without entering Python: PyTorch's own kernel when Default was chosen,
or the cuBLASLt/hipBLASLt call of an :class:`~unimatmul_backends.lt.runner.LtRunner`
(the same descriptors and algo, the library's own function). Everything else (a key
met for the first time, a padded candidate, a CPU backend's kernel) goes to the Python
kernel through the ``unimatmul_native::slow_*`` ops, and the Python kernel puts the
key's entry into the native table once it has decided. A oneDNN runner's primitive is
executed from C++ as well (``MatmulPrimitive.native_words``), and so is a compiled GPU
kernel that a runner describes as a driver-API launch (``NativeCall`` "launch": the
Triton plugin's kernels).

The kernels are built on first use with ``torch.utils.cpp_extension`` (a C++ compiler
and ninja are needed; the GPU build also needs the CUDA or ROCm headers that PyTorch's
extension builder finds) and cached in PyTorch's extension directory
(``TORCH_EXTENSIONS_DIR``); the first build says so on stderr (it takes 10-40 s). When
the build fails, routing uses the Python kernels and says why once.
``UNIMATMUL_TORCH_NATIVE`` chooses: ``auto`` (default: native kernels at the CPU key
and, with a GPU, the CUDA key), ``cuda`` (the CUDA key only), ``0`` (Python kernels
only).

The same library holds a second table for ``unimatmul.matmul`` on torch tensors
(:func:`fast_matmul`), and the confirmation windows of both tables (``CONFIRM``
entries) hand their samples back here (:func:`watch`). A third table serves
``aten::_scaled_mm`` (:mod:`unimatmul.torch.scaled_routing`, :func:`install_scaled`):
PyTorch's kernel, the cuBLASLt/hipBLASLt call of a ``ScaledLtRunner`` (``SCALED_LT``,
the scale addresses set in its descriptor when they change), or the Python kernel.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from unimatmul import settings
from unimatmul.core import modes
from unimatmul.core._backend import DEFAULT as DEFAULT_CANDIDATE
from unimatmul.core.arrays import hold_for_graphs
from unimatmul.tuning.confirm import ConfirmingRunner, TieRunner, split

ENV = settings.TORCH_NATIVE.name
CHOICES = ("auto", "cuda", "0")
SOURCE = Path(__file__).with_name("_native.cpp")
MODES = {"off": 0, "cached": 1, "tune": 2, "record": 3}
OPS = {"mm": 0, "bmm": 1, "addmm": 2, "baddbmm": 3}
# Entry kinds in the native table (_native.cpp); CONFIRM: in its confirmation window.
DEFAULT, LT, PYTHON, PADDED, ONEDNN, CONFIRM, LAUNCH = 0, 1, 2, 3, 4, 5, 6
SCALED_LT = 7  # a ScaledLtRunner's call (SCALED table only)
# The tables: the aten kernels' (routing), unimatmul.matmul's, and aten::_scaled_mm's.
ROUTING, API, SCALED = 0, 1, 2
API_OPS = {2: 4, 3: 5}  # operand rank -> the API's op code (API_MM, API_BMM)

_lock = threading.Lock()
_loaded_gpu: bool | None = None  # None: nothing loaded; else whether the GPU build is
_library_path: str | None = None
_failures: dict[bool, str] = {}  # GPU build? -> why it failed
# Entry ids, shared by both tables: a window's verdict finds its owner by id.
_ids = itertools.count(1)


def choice() -> str:
    return settings.TORCH_NATIVE.get()


def wanted_keys(cuda_available: bool | None = None) -> tuple[str, ...]:
    """The dispatch keys the native kernels should serve, by ``UNIMATMUL_TORCH_NATIVE``."""
    which = choice()
    if which == "0":
        return ()
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    keys = ["CUDA"] if cuda_available else []
    if which == "auto":
        keys.insert(0, "CPU")
    return tuple(keys)


def _build_name(cuda: bool) -> str:
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(torch.__version__.encode())
    return f"unimatmul_native_{'gpu' if cuda else 'cpu'}_{digest.hexdigest()[:12]}"


def new_id() -> int:
    """A fresh entry id (the routing plans' and the API's entries draw from one count)."""
    return next(_ids)


def _built_library(cuda: bool) -> Path | None:
    """The built library for this source and PyTorch, if a build exists (no compiling)."""
    try:
        from torch.utils import cpp_extension

        name = _build_name(cuda)
        folder = Path(cpp_extension._get_build_directory(name, False))
    except Exception:  # a private helper of PyTorch's: without it, the usual path builds
        return None
    suffix = ".pyd" if sys.platform == "win32" else ".so"
    found = folder / f"{name}{suffix}"
    return found if found.is_file() else None


def load(cuda: bool, *, build: bool = True) -> bool:
    """Build (once per source and PyTorch version) and load the kernels; False if that fails.

    ``cuda``: the GPU build, which can make Lt calls itself; the CPU build passes every
    backend kernel to Python. Only one build is loaded per process (both define the
    same operators); a GPU build serves the CPU key too. ``build=False``: load only a
    build that already exists (``unimatmul.matmul`` never waits for a compiler).
    """
    global _loaded_gpu, _library_path
    with _lock:
        if _loaded_gpu is not None:
            return _loaded_gpu or not cuda
        if cuda in _failures:
            return False
        path = _load_built(cuda)
        if path is None:
            if not build:
                return False
            try:
                path = _build(cuda)
            except Exception as exc:  # a missing compiler, ninja or header: Python kernels instead
                _failures[cuda] = (
                    f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
                )
                return False
        _loaded_gpu = cuda
        _library_path = path
        _register_confirmed()
        return True


def _load_built(cuda: bool) -> str | None:
    """Load an existing build directly (no ninja run, a few milliseconds); None if none loads."""
    found = _built_library(cuda)
    if found is None:
        return None
    try:
        torch.ops.load_library(str(found))
    except Exception:  # e.g. a build another process is writing now: build (or wait) instead
        return None
    return str(found)


def _build(cuda: bool) -> str | None:
    from torch.utils import cpp_extension

    _find_ninja()
    # 10-40 s of compiler time that would otherwise pass in silence.
    sys.stderr.write(
        f"unimatmul: building the native routing kernels for the {'GPU' if cuda else 'CPU'} "
        "(once per PyTorch version, 10-40 s)...\n"
    )
    sys.stderr.flush()
    path = cpp_extension.load(
        name=_build_name(cuda),
        sources=[str(SOURCE)],
        extra_cflags=["-O2", *(["-DUMM_WITH_CUDA"] if cuda else [])],
        with_cuda=cuda,
        is_python_module=False,
        verbose=False,
    )
    return path if isinstance(path, str) else None


def _find_ninja() -> None:
    """Put the ninja that pip installed beside this Python on PATH, if none is there.

    The ``ninja`` package installs its program into the environment's bin folder, which
    is not on PATH when a virtual environment's Python is run without activating it.
    """
    if shutil.which("ninja"):
        return
    folder = Path(sys.executable).parent
    if (folder / "ninja").exists():
        os.environ["PATH"] = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"


def failure(cuda: bool) -> str:
    return _failures.get(cuda, "")


def loaded() -> bool:
    return _loaded_gpu is not None


def has_lt() -> bool:
    """Whether the loaded build makes Lt calls itself (the GPU build)."""
    return _loaded_gpu is True


class Entry(NamedTuple):
    """What the native table should hold for a routing plan's runner (see :func:`entry_for`)."""

    window: ConfirmingRunner | None  # the choice's confirmation window, if it is in one
    kernel: Any  # the bare kernel (None: PyTorch's)
    call: Any  # the kernel's NativeCall, or None
    kind: int
    confirm: int  # timed calls per candidate of a window the entry runs itself (0: none)
    tie: bool  # PyTorch's kernel under graph capture: a tie, or a slim scaled choice


def entry_for(runner: Any, offered: bool = True) -> Entry:
    """The native entry of a plan's ``runner`` (None: PyTorch's kernel).

    A choice in its confirmation window (a ``ConfirmingRunner``) becomes its bare kernel's
    call with a window of the confirmation's calls when the table can make that call;
    else the entry sends calls to the Python kernel, whose plan runs the window. A tie
    (in its window, or kept: a ``TieRunner``; or a slim scaled choice, see
    ``confirm.default_in_graphs``) is marked so, and its entry runs PyTorch's kernel under
    graph capture. ``offered``: whether the call's form may be made natively
    at all.
    """
    window = runner if isinstance(runner, ConfirmingRunner) else None
    tie = isinstance(runner, TieRunner) or (window is not None and window.tie)
    kernel = window.kernel if window is not None else runner
    if isinstance(kernel, TieRunner):
        kernel = kernel.kernel
    call = None
    if kernel is not None and offered and hasattr(kernel, "native_call"):
        try:
            call = kernel.native_call()
        except Exception:  # the Python kernel keeps serving the key
            call = None
    kind = kind_of(call) if kernel is not None else DEFAULT
    confirm = window.confirmation.calls if window is not None and kind != PYTHON else 0
    return Entry(window, kernel, call, kind, confirm, tie)


def entered(entry: Entry, plan: Any, kept: Kept) -> None:
    """After ``entry`` went into the table for ``plan`` (a routing or scaled plan): the plan
    notes the entry's kind; a window the entry runs is judged by the plan's confirmation,
    and the plan holds the bare kernel (a tie's: its ``TieRunner``) for calls that still
    come through Python; the kernel is kept alive in ``kept`` with the table that points
    into it."""
    plan.native = entry.kind
    if entry.window is not None and entry.confirm:
        watch(plan.ident, entry.window.confirmation.conclude)
        plan.runner = entry.window.kept()
    kept.add(plan.ident, entry.kernel)


def take_checked(
    plan: Any, final: Any, to_default: Callable[[Any, str], None], put_again: Callable[[], None]
) -> None:
    """A first-call check (``tuning/trust.py``) judged a routing or scaled ``plan``'s choice
    and settled on ``final``: the plan takes it (PyTorch's kernel, through ``to_default``,
    when the choice was wrong), and its native entry, which sent calls to Python until now,
    is put again (``put_again``) when the plan has one. The caller holds its state's lock."""
    if final.candidate == DEFAULT_CANDIDATE:
        if plan.runner is not None:
            to_default(plan, "reverted")
    elif plan.runner is not None:
        plan.runner = final
    if plan.native != -1:
        put_again()


class Kept:
    """The kernels a native table's entries point into (descriptors, workspaces, padded
    buffers), by entry id: one per table, whose owner empties the table through it.

    An emptied table's kernels are kept one generation more, so that a native call in
    flight on another thread never meets a freed descriptor. A kernel whose entry ran
    under CUDA graph capture with memory of its own (the C++ side pins that entry) is
    kept for the process's life (:func:`~unimatmul.core.arrays.hold_for_graphs`): the
    graph writes its workspace or padded buffers at every replay.
    """

    def __init__(self, table: int) -> None:
        self.table = table
        self.now: dict[int, Any] = {}
        self.before: dict[int, Any] = {}

    def add(self, ident: int, kernel: Any) -> None:
        if kernel is not None:
            self.now[ident] = kernel

    def clear(self) -> dict[int, int]:
        """Empty the table: the calls each entry made there, by entry id."""
        counted = clear(self.table)
        if loaded() and (self.now or self.before):
            for ident in torch.ops.unimatmul_native.pinned():
                kernel = self.now.get(ident, self.before.get(ident))
                if kernel is not None:
                    hold_for_graphs(kernel)
        self.before, self.now = self.now, {}
        return counted


def kind_of(call: Any) -> int:
    """The table entry for a runner's NativeCall (None: the runner offers none): PYTHON
    where the loaded build cannot make that call (Lt calls and launches need the GPU build)."""
    if call is None:
        return PYTHON
    if call.kind == "onednn":
        return ONEDNN
    if call.kind == "lt" and has_lt():
        return PADDED if call.padded else LT
    if call.kind == "launch" and has_lt():
        return LAUNCH
    if call.kind == "scaled_lt" and has_lt():
        return SCALED_LT
    return PYTHON


# --- confirmation windows: the native side hands its samples to Python ---------------------

# Entry id -> what judges its window: (kernel samples, Default samples, clock) -> keep?
_windows: dict[int, Callable[[list[float], list[float], str], bool]] = {}
_confirmed_library: list[Any] = []


def watch(ident: int, judge: Callable[[list[float], list[float], str], bool]) -> None:
    """Have ``judge`` decide the window of entry ``ident`` when it is full."""
    _windows[ident] = judge


def _confirmed(samples: torch.Tensor, ident: int, clock: str) -> bool:
    # Called by a native kernel (unimatmul_native::confirmed) on the thread of the call
    # that found its window full; never raises into it.
    judge = _windows.pop(ident, None)
    if judge is None:
        return True  # the entry's owner is gone: the harness's choice stands
    try:
        kernel_s, default_s = split(samples.tolist())
        return bool(judge(kernel_s, default_s, clock))
    except Exception:
        return True


def _register_confirmed() -> None:
    if _confirmed_library:
        return
    library = torch.library.Library("unimatmul_native", "IMPL")
    library.impl("confirmed", _confirmed, "CPU")
    _confirmed_library.append(library)


def _forget_windows(pairs: list[int]) -> None:
    for i in range(0, len(pairs), 2):
        _windows.pop(pairs[i], None)


# --- the slow ops: the Python kernels behind the native ones -------------------------------

_slow_library: list[Any] = []


def _register_slow_ops(kernels_by_key: dict[str, dict[str, Any]]) -> None:
    """The Python kernels, as the ops a native kernel calls for a key it does not know."""
    if _slow_library:
        return  # registered once per process, with the first install's kernels (they never change)
    library = torch.library.Library("unimatmul_native", "IMPL")
    for key, kernels in kernels_by_key.items():
        library.impl("slow_mm", kernels["mm"], key)
        library.impl("slow_bmm", kernels["bmm"], key)
        library.impl("slow_addmm", _positional(kernels["addmm"]), key)
        library.impl("slow_baddbmm", _positional(kernels["baddbmm"]), key)
    _slow_library.append(library)


def _positional(kernel: Any) -> Any:
    def slow(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: Any, alpha: Any) -> torch.Tensor:
        return kernel(c, a, b, beta=beta, alpha=alpha)

    return slow


# --- control --------------------------------------------------------------------------------


def install(
    keys: tuple[str, ...], mode: str, overrides: int, python_kernels: dict[str, dict[str, Any]]
) -> None:
    """Serve ``keys`` with the native kernels; ``python_kernels`` (per dispatch key) take
    what the native table does not know yet."""
    _register_slow_ops(python_kernels)
    ops = torch.ops.unimatmul_native
    ops.configure(MODES[mode], overrides)
    ops.install("CPU" in keys, "CUDA" in keys)


def uninstall() -> None:
    if loaded():
        torch.ops.unimatmul_native.uninstall()


_slow_scaled_library: list[Any] = []


def install_scaled(keys: tuple[str, ...], mode: str, overrides: int, python_kernel: Any) -> None:
    """Serve ``aten::_scaled_mm`` at ``keys`` with the native kernel; ``python_kernel`` takes
    the keys the SCALED table does not know yet (and every call with ``scale_result``)."""
    if not _slow_scaled_library:  # registered once per process, like the products' slow ops
        library = torch.library.Library("unimatmul_native", "IMPL")
        for key in ("CPU", "CUDA"):
            library.impl("slow_scaled_mm", python_kernel, key)
        _slow_scaled_library.append(library)
    ops = torch.ops.unimatmul_native
    ops.configure(MODES[mode], overrides)
    ops.install_scaled("CPU" in keys, "CUDA" in keys)


def uninstall_scaled() -> None:
    if loaded():
        torch.ops.unimatmul_native.uninstall_scaled()


def configure(mode: str, overrides: int) -> None:
    if loaded():
        torch.ops.unimatmul_native.configure(MODES[mode], overrides)


def set_busy(on: bool) -> None:
    torch.ops.unimatmul_native.set_busy(on)


def put(
    op: str,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    beta: Any,
    kind: int,
    ident: int,
    label: str,
    out_shape: tuple[int, ...],
    form: int,
    call: Any = None,
    confirm: int = 0,
    tie: bool = False,
) -> None:
    """Put the routing entry for these operands' key; ``call``: a runner's NativeCall (LT,
    PADDED, ONEDNN); ``confirm`` > 0: a window of that many timed calls per candidate
    (its verdict goes to the judge given to :func:`watch` for ``ident``); ``tie``: the
    choice is a Default record's tie (PyTorch's kernel serves it under graph capture)."""
    accumulate = c is not None
    _put(ROUTING, OPS[op], -1, a, b, c, bool(accumulate and beta == 0), bool(accumulate and beta == 1),
         kind, ident, label, out_shape, form, call, confirm, tie)  # fmt: skip


def put_api(
    mode: str,
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None,
    kind: int,
    ident: int,
    out_shape: tuple[int, ...],
    call: Any = None,
    confirm: int = 0,
    tie: bool = False,
) -> None:
    """Put ``unimatmul.matmul``'s entry for ``matmul(a, b, out=out)`` in ``mode`` (plain
    form: 2-D operands, or 3-D ones of one batch); the rest as for :func:`put`."""
    _put(API, API_OPS[a.dim()], MODES[mode], a, b, out, False, False, kind, ident,
         "unimatmul::matmul", out_shape, 0, call, confirm, tie)  # fmt: skip


def _put(
    table: int,
    op: int,
    mode: int,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None,
    beta_zero: bool,
    beta_one: bool,
    kind: int,
    ident: int,
    label: str,
    out_shape: tuple[int, ...],
    form: int,
    call: Any,
    confirm: int,
    tie: bool,
) -> None:
    torch.ops.unimatmul_native.put(
        table,
        op,
        mode,
        a,
        b,
        c,
        beta_zero,
        beta_one,
        kind,
        ident,
        label,
        list(out_shape),
        form,
        call.words if call is not None else [],
        list(call.buffers) if call is not None and call.padded else [],
        list(call.flags) if call is not None and call.padded else [],
        confirm,
        tie,
    )


def put_scaled(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype | None,
    use_fast_accum: bool,
    kind: int,
    ident: int,
    label: str,
    out_shape: tuple[int, ...],
    call: Any = None,
    confirm: int = 0,
    tie: bool = False,
) -> None:
    """Put the SCALED entry for a ``_scaled_mm`` call's key (without ``scale_result``, in the
    environment's mode); ``call``: a ``ScaledLtRunner``'s NativeCall (``SCALED_LT``);
    ``confirm`` and ``tie`` as for :func:`put`."""
    torch.ops.unimatmul_native.put_scaled(
        -1,
        a,
        b,
        scale_a,
        scale_b,
        bias,
        out_dtype,
        use_fast_accum,
        kind,
        ident,
        label,
        list(out_shape),
        call.words if call is not None and kind == SCALED_LT else [],
        confirm,
        tie,
    )


def _pairs(words: list[int]) -> dict[int, int]:
    """(id, calls) words -> {id: calls}, entries that made no call left out."""
    return {words[i]: words[i + 1] for i in range(0, len(words), 2) if words[i + 1]}


def clear(table: int = ROUTING) -> dict[int, int]:
    """Empty a table; the calls each entry made there, by entry id."""
    if not loaded():
        return {}
    words = list(torch.ops.unimatmul_native.clear(table))
    _forget_windows(words)
    return _pairs(words)


def counts(reset: bool = False, table: int = ROUTING) -> dict[int, int]:
    if not loaded():
        return {}
    return _pairs(list(torch.ops.unimatmul_native.counts(table, reset)))


def kinds(table: int = ROUTING) -> dict[int, int]:
    """Entry id -> kind (CONFIRM while its window is open)."""
    if not loaded():
        return {}
    words = list(torch.ops.unimatmul_native.kinds(table))
    return {words[i]: words[i + 1] for i in range(0, len(words), 2)}


def size(table: int = ROUTING) -> int:
    return int(torch.ops.unimatmul_native.size(table)) if loaded() else 0


# --- unimatmul.matmul's fast function --------------------------------------------------------

_fast: list[Any] = []  # [the function, or None when it cannot be had]


def fast_matmul() -> Callable[..., Any] | None:
    """``fast_matmul(a, b, out, alpha, beta, c, bias, activation)``: the API table's
    cached call (``unimatmul.matmul``'s arguments as they are), or None.

    Returns the call's result, or ``NotImplemented`` when Python must take it (another
    form, a ``unimatmul.mode()`` block, no entry yet). None when no build is loaded or
    this torch's tensor objects are not laid out as the function reads them (checked
    on live tensors first).
    """
    if _fast:
        return _fast[0]
    if not loaded() or _library_path is None:
        return None
    with _lock:
        if not _fast:
            _fast.append(_make_fast())
    return _fast[0]


def _tensor_offset() -> int | None:
    """Where a tensor object holds its ``at::Tensor`` (what THPVariable_Unpack reads):
    the one offset at which every probe's TensorImpl address (``_cdata``) is found."""
    probes = [torch.empty(3), torch.nn.Parameter(torch.empty(2)), torch.empty(0).t()]
    found: set[int] | None = None
    for probe in probes:
        size = type(probe).__basicsize__
        here = {
            off
            for off in range(ctypes.sizeof(ctypes.c_ssize_t) * 2, size - 7, 8)
            if ctypes.c_void_p.from_address(id(probe) + off).value == probe._cdata
        }
        found = here if found is None else found & here
    return min(found) if found and len(found) == 1 else None


def _make_fast() -> Any:
    offset = _tensor_offset()
    if offset is None or _library_path is None:
        return None
    try:
        function = ctypes.PyDLL(_library_path).unimatmul_fast_matmul_function
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.py_object
    function.argtypes = [
        ctypes.py_object,
        ctypes.py_object,
        ctypes.c_ssize_t,
        ctypes.py_object,
        ctypes.c_char_p,
    ]
    # The context variable of unimatmul.mode() blocks, and the mode's variable, which the
    # function reads per call as unimatmul.core.modes does.
    made = function(torch.Tensor, torch.nn.Parameter, offset, modes._mode, settings.MODE.name.encode())
    return made if callable(made) else None
