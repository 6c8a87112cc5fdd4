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
(``TORCH_EXTENSIONS_DIR``); the first build says so on stderr (it takes 10-40 s). Routing
does not wait for it (``UNIMATMUL_TORCH_NATIVE_BUILD``, default ``background``): a process
of its own builds them while the Python kernels serve, and the native kernels take over
once the build is loaded (``load(..., later=...)``). When the build fails, routing uses the
Python kernels and says why once.
``UNIMATMUL_TORCH_NATIVE`` chooses: ``auto`` (default: native kernels at the CPU key
and, with a GPU, the CUDA key), ``cuda`` (the CUDA key only), ``0`` (Python kernels
only).

The same library holds a second table for ``unimatmul.matmul`` on torch tensors
(:func:`fast_matmul`), and the confirmation windows of both tables (``CONFIRM``
entries) hand their samples back here (:func:`watch`). A third table serves
``aten::_scaled_mm`` (:mod:`unimatmul.torch.scaled_routing`, :func:`install_door`):
PyTorch's kernel, the cuBLASLt/hipBLASLt call of a ``ScaledLtRunner`` (``SCALED_LT``,
the scale addresses set in its descriptor when they change), the launch of a compiled fp8
kernel (``LAUNCH``, its scale pointers written per call with the operands': the Triton
plugin's scaled kernels), or the Python kernel. A fourth serves ``aten::_grouped_mm``
(:mod:`unimatmul.torch.grouped_routing`, :func:`install_door`) at the ``ADInplaceOrView``
key: PyTorch's kernel, the launch of a compiled grouped kernel (``LAUNCH``, its ``offs``
pointer written per call with the operands': the Triton plugin's grouped kernels), or
the Python kernel.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from unimatmul import settings
from unimatmul.calls import on_passing
from unimatmul.core import modes
from unimatmul.core._backend import NativeCall
from unimatmul.core.arrays import hold_for_graphs
from unimatmul.tuning.confirm import ConfirmingRunner, TieRunner, split
from unimatmul.tuning.selector import get_selector

ENV = settings.TORCH_NATIVE.name
CHOICES = ("auto", "cuda", "0")
SOURCE = Path(__file__).with_name("_native.cpp")
MODES = {"off": 0, "cached": 1, "tune": 2, "record": 3}
OPS = {"mm": 0, "bmm": 1, "addmm": 2, "baddbmm": 3}
# Entry kinds in the native table (_native.cpp); CONFIRM: in its confirmation window.
DEFAULT, LT, PYTHON, PADDED, ONEDNN, CONFIRM, LAUNCH = 0, 1, 2, 3, 4, 5, 6
SCALED_LT = 7  # a ScaledLtRunner's call (SCALED table only)
# NativeCall "launch": the role codes of its parameters' scale pointers (SCALED table only)
# and of its offs pointer (GROUPED table only).
ROLE_SCALE_A, ROLE_SCALE_B = NativeCall.LAUNCH_ROLES["scale_a"], NativeCall.LAUNCH_ROLES["scale_b"]
ROLE_OFFS = NativeCall.LAUNCH_ROLES["offs"]
# The tables: the aten kernels' (routing), unimatmul.matmul's, aten::_scaled_mm's and
# aten::_grouped_mm's.
ROUTING, API, SCALED, GROUPED = 0, 1, 2, 3
API_OPS = {2: 4, 3: 5}  # operand rank -> the API's op code (API_MM, API_BMM)

_lock = threading.Lock()
_loaded_gpu: bool | None = None  # None: nothing loaded; else whether the GPU build is
_library_path: str | None = None
_failures: dict[bool, str] = {}  # GPU build? -> why it failed


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


def _built_library(cuda: bool) -> Path | None:
    """The built library for this source and PyTorch, if a build exists (no compiling)."""
    folder = _build_folder(cuda)
    if folder is None:
        return None
    suffix = ".pyd" if sys.platform == "win32" else ".so"
    found = folder / f"{_build_name(cuda)}{suffix}"
    return found if found.is_file() else None


def _build_folder(cuda: bool) -> Path | None:
    """The folder PyTorch's extension builder builds this source in (None: unknown)."""
    try:
        from torch.utils import cpp_extension

        return Path(cpp_extension._get_build_directory(_build_name(cuda), False))
    except Exception:  # a private helper of PyTorch's: without it, the usual path builds
        return None


def load(cuda: bool, *, build: bool = True, later: Callable[[], None] | None = None) -> bool:
    """Load the kernels, building them first (once per source and PyTorch version) where
    no build exists; False if that fails, or if the build is left to the background.

    ``cuda``: the GPU build, which can make Lt calls itself; the CPU build passes every
    backend kernel to Python. Only one build is loaded per process (both define the
    same operators); a GPU build serves the CPU key too. ``build=False``: load only a
    build that already exists (``unimatmul.matmul`` never waits for a compiler).
    ``later``: the caller can serve without the kernels for now (routing's Python
    kernels). Where no build exists, ``UNIMATMUL_TORCH_NATIVE_BUILD`` decides: ``background``
    builds them in a process of its own and calls ``later()`` on a thread of ours once
    the build is loaded (False now); ``wait`` builds them now; ``never`` does not build.
    Without ``later`` the kernels are built now (a background build on the way is
    waited for).
    """
    with _lock:
        if _loaded_gpu is not None:
            return _loaded_gpu or not cuda
        if cuda in _failures:
            return False
        running = _background.get(cuda)
        if running is None:
            path = _load_built(cuda)
            if path is not None:
                _take(cuda, path)
                return True
            if not build:
                return False
            how = settings.TORCH_NATIVE_BUILD.get() if later is not None else "wait"
            if how == "never":
                return False
            if how == "wait":
                return _build_and_take(cuda)
            running = _start_background(cuda)
            if running is None:
                return False
        if later is not None:
            running.then.append(later)
            return False
        if not build:
            return False
    running.done.wait()
    return load(cuda)


def _build_and_take(cuda: bool) -> bool:
    """Build now and load the build (``_lock`` held)."""
    try:
        path = _build(cuda)
    except Exception as exc:  # a missing compiler, ninja or header: Python kernels instead
        _failures[cuda] = (
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
        )
        return False
    _take(cuda, path)
    return True


def _take(cuda: bool, path: str | None) -> None:
    """The build at ``path`` is loaded in this process (``_lock`` held)."""
    global _loaded_gpu, _library_path
    _loaded_gpu = cuda
    _library_path = path
    _register_confirmed()
    on_passing(set_busy)  # calls.passing(): the native kernels pass this thread's calls through too


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


def warn_failed(cuda: bool) -> None:
    """Say once that the native kernels did not build, and why (routing serves in Python)."""
    get_selector().warn_once(
        "torch-native-build",
        f"unimatmul.torch: the native routing kernels did not build ({failure(cuda)}); "
        f"using the Python kernels, which cost ~6 us more host time per call (set {ENV}=0 "
        "to skip the build)",
    )


# --- building in the background -------------------------------------------------------------


class _Background:
    """A build of the native kernels in a process of its own, and who waits for it."""

    def __init__(self, cuda: bool, process: subprocess.Popen[bytes], log: Any) -> None:
        self.cuda = cuda
        self.process = process
        self.log = log  # the process's stdout and stderr: an unnamed temporary file
        self.started = time.time()
        self.then: list[Callable[[], None]] = []  # called once the build is loaded
        self.done = threading.Event()


_background: dict[bool, _Background] = {}  # GPU build? -> the build running now


def building(cuda: bool) -> bool:
    """Whether this process has a build of the kernels running in the background."""
    return cuda in _background


def _start_background(cuda: bool) -> _Background | None:
    """Start ``python -m unimatmul.torch --build-native cpu|gpu`` (``_lock`` held); None,
    with the reason in ``_failures``, if it cannot start.

    A process rather than a thread: a program that ends before the build does leaves it
    to finish for the next one (in its own session, so a Ctrl-C of the program does not
    reach it), never a half-built folder whose lock file would hold later builds forever.
    Its output goes to an unnamed file, not a pipe that would break when the program ends.
    """
    environment = dict(os.environ)
    # No routing in the builder: its `import torch` must not enable it (nor build again).
    environment.pop(settings.TORCH.name, None)
    environment["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    # The same unimatmul as this process's (the build's name is its source's digest).
    root = str(Path(__file__).resolve().parents[2])
    environment["PYTHONPATH"] = os.pathsep.join(p for p in (root, environment.get("PYTHONPATH")) if p)
    log = tempfile.TemporaryFile()  # noqa: SIM115 (the watcher thread reads and closes it)
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "unimatmul.torch", "--build-native", "gpu" if cuda else "cpu"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,
        )
    except OSError as exc:
        log.close()
        _failures[cuda] = f"the build process did not start: {exc}"
        return None
    running = _Background(cuda, process, log)
    _background[cuda] = running
    threading.Thread(
        target=_finish_background, args=(running,), name="unimatmul-native-build", daemon=True
    ).start()
    sys.stderr.write(
        f"unimatmul: building the native routing kernels for the {'GPU' if cuda else 'CPU'} in the "
        "background (once per PyTorch version, 10-40 s); the Python kernels serve until then\n"
    )
    sys.stderr.flush()
    return running


def _finish_background(running: _Background) -> None:
    """Wait for a background build, load it, and hand over to those who wait for it."""
    code = running.process.wait()
    running.log.seek(0)
    text = running.log.read().decode(errors="replace")
    running.log.close()
    cuda = running.cuda
    with _lock:
        _background.pop(cuda, None)
        if _loaded_gpu is None:
            path = _load_built(cuda) if code == 0 else None
            if path is not None:
                _take(cuda, path)
            else:
                _failures[cuda] = _build_failure(text, code)
        ok = _loaded_gpu is not None and (_loaded_gpu or not cuda)
        running.done.set()
    if not ok:
        if running.then:
            warn_failed(cuda)
        return
    for then in running.then:
        try:
            then()
        except Exception as exc:  # the Python kernels keep serving
            _failures[cuda] = f"taking over from the Python kernels: {type(exc).__name__}: {exc}"
            warn_failed(cuda)


def _build_failure(text: str, code: int) -> str:
    """Why a background build failed, from its last words (``--build-native``'s line)."""
    said = "the native routing kernels did not build: "
    for line in reversed(text.strip().splitlines()):
        if said in line:
            return line.split(said, 1)[1].strip()
    if code == 0:
        return "the build process ended, but no build loads"
    last = text.strip().splitlines()[-1] if text.strip() else ""
    return f"the build process exited with code {code}" + (f": {last}" if last else "")


def status(cuda_available: bool | None = None) -> dict[str, Any]:
    """Where the native kernels stand (``unimatmul info``): the build this process would use
    (``build``: ``cpu``, ``gpu`` or None when ``UNIMATMUL_TORCH_NATIVE=0``) and its ``state``:
    ``loaded`` (in this process), ``building`` (in the background here, or by another
    process, which holds the build folder's lock since ``since``), ``built`` (the next
    ``enable()`` loads it at once), ``not built``, ``failed`` (``reason``) or ``off``."""
    keys = wanted_keys(cuda_available)
    if not keys:
        return {"build": None, "state": "off", "path": None}
    cuda = "CUDA" in keys
    found: dict[str, Any] = {"build": "gpu" if cuda else "cpu", "path": None}
    if _loaded_gpu is not None and (_loaded_gpu or not cuda):
        return found | {"build": "gpu" if _loaded_gpu else "cpu", "state": "loaded", "path": _library_path}
    running = _background.get(cuda)
    if running is not None:
        return found | {"state": "building", "since": running.started}
    if cuda in _failures:
        return found | {"state": "failed", "reason": _failures[cuda]}
    library = _built_library(cuda)
    folder = _build_folder(cuda)
    if folder is not None:
        lock = folder / "lock"  # PyTorch's extension builder holds it while a build runs
        try:
            return found | {"state": "building", "since": lock.stat().st_mtime, "lock": str(lock)}
        except OSError:  # no build runs
            pass
    if library is not None:
        return found | {"state": "built", "path": str(library)}
    return found | {"state": "not built"}


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


def entry_for(
    runner: Any, offered: bool = True, table: int | None = None, operands: tuple[Any, ...] = ()
) -> Entry:
    """The native entry of a plan's ``runner`` (None: PyTorch's kernel).

    A choice in its confirmation window (a ``ConfirmingRunner``) becomes its bare kernel's
    call with a window of the confirmation's calls when the table can make that call;
    else the entry sends calls to the Python kernel, whose plan runs the window. A tie
    (in its window, or kept: a ``TieRunner``; or a slim scaled choice, see
    ``confirm.default_in_graphs``) is marked so, and its entry runs PyTorch's kernel under
    graph capture. ``offered``: whether the call's form may be made natively
    at all; ``table``: the table the entry goes into (:func:`kind_of`); ``operands``: what
    the kernel's ``native_call`` takes (a grouped kernel's launch is laid out for the
    key's operands: ``a``, ``b``, ``offs`` and the output dtype; none elsewhere).
    """
    window = runner if isinstance(runner, ConfirmingRunner) else None
    tie = isinstance(runner, TieRunner) or (window is not None and window.tie)
    kernel = window.kernel if window is not None else runner
    if isinstance(kernel, TieRunner):
        kernel = kernel.kernel
    call = None
    if kernel is not None and offered and hasattr(kernel, "native_call"):
        try:
            call = kernel.native_call(*operands)
        except Exception:  # the Python kernel keeps serving the key
            call = None
    kind = kind_of(call, table) if kernel is not None else DEFAULT
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

    def counts(self) -> dict[int, int]:
        """The calls each entry made since the last look, by entry id."""
        return counts(reset=True, table=self.table)

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


def kind_of(call: Any, table: int | None = None) -> int:
    """The table entry for a runner's NativeCall (None: the runner offers none): PYTHON
    where the loaded build cannot make that call (Lt calls and launches need the GPU build)
    or ``table`` cannot hold it (the SCALED table takes a scaled Lt call or a launch that
    takes both scale pointers; the GROUPED table a launch, with the offs pointer or
    without (a call without offs); the other tables the rest; None: any table)."""
    if call is None or (table is not None and not _fits(call, table)):
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


def _fits(call: Any, table: int) -> bool:
    """Whether ``table`` can hold ``call``: the GROUPED table a launch that is not scaled (its
    offs pointer, where the key has offs, checked in C++), the SCALED table a scaled call
    without offs, the others a call with neither scale nor offs pointers."""
    if table == GROUPED:
        return call.kind == "launch" and not _is_scaled(call)
    return (table == SCALED) == _is_scaled(call) and ROLE_OFFS not in _roles(call)


def _is_scaled(call: Any) -> bool:
    """Whether a NativeCall is a scaled product's: a scaled Lt call, or a launch with both
    scale pointers among its parameters (words: 12 fixed, then (role, bytes, value) each)."""
    if call.kind == "scaled_lt":
        return True
    roles = _roles(call)
    return ROLE_SCALE_A in roles and ROLE_SCALE_B in roles


def _roles(call: Any) -> list[int]:
    """The role codes of a launch's parameters (words: 12 fixed, then (role, bytes, value)
    each); none for any other call."""
    return list(call.words[12::3]) if call.kind == "launch" else []


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


_slow_libraries: dict[str, Any] = {}  # slow op -> the library holding its Python kernel


def _register_slow(op: str, python_kernel: Any) -> None:
    """``unimatmul_native::<op>`` at the CPU and CUDA keys: a door's Python kernel, which
    its native kernel calls for what its table does not hold (registered once per process,
    like the products' slow ops: the kernels never change)."""
    if op not in _slow_libraries:
        library = torch.library.Library("unimatmul_native", "IMPL")
        for key in ("CPU", "CUDA"):
            library.impl(op, python_kernel, key)
        _slow_libraries[op] = library


# The doors of one aten op each, beside the products': what their native kernel serves, and
# what its slow op (their Python kernel) takes.
DOORS = {
    # aten::_scaled_mm at the keys' own dispatch keys; the slow op takes the keys the SCALED
    # table does not know yet, and every call with scale_result.
    "scaled": "slow_scaled_mm",
    # aten::_grouped_mm at ADInplaceOrView, for the devices of the keys; the slow op takes the
    # keys the GROUPED table does not know yet, other devices' calls and every call with a bias.
    "grouped": "slow_grouped_mm",
}


def install_door(door: str, keys: tuple[str, ...], mode: str, overrides: int, python_kernel: Any) -> None:
    """Serve a door's op (:data:`DOORS`) with its native kernel at ``keys``;
    ``python_kernel`` takes what the kernel's table does not hold."""
    _register_slow(DOORS[door], python_kernel)
    ops = torch.ops.unimatmul_native
    ops.configure(MODES[mode], overrides)
    getattr(ops, f"install_{door}")("CPU" in keys, "CUDA" in keys)


def uninstall_door(door: str) -> None:
    if loaded():
        getattr(torch.ops.unimatmul_native, f"uninstall_{door}")()


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


def put_plan(
    table: int, plan: Any, kept: Any, *tensors: Any, mode: str = "", beta: Any = 0, fast_accum: bool = False
) -> bool:
    """The one way a door's :class:`~unimatmul.calls.Plan` enters a native table: its
    runner's entry (:func:`entry_for`), put under the key of ``tensors`` (ROUTING: a, b and
    the input c or None, with ``beta``; API: a, b and out or None, in ``mode``; SCALED: a,
    b, scale_a, scale_b and bias or None, with ``fast_accum``; GROUPED: a, b, offs or
    None and the call's out_dtype or None), then :func:`entered`.
    False where the table would hold nothing but a call back into Python (the API table
    keeps no such entries: its Python door is reached first)."""
    operands = (*tensors[:3], plan.out_dtype) if table == GROUPED else ()  # what its launch is laid out for
    runner = None if plan.is_default else plan.runner
    entry = entry_for(runner, offered=plan.form in (0, 1), table=table, operands=operands)
    ops = torch.ops.unimatmul_native
    # The call's words, where the table makes that call itself.
    words = entry.call.words if entry.call is not None and entry.kind not in (DEFAULT, PYTHON) else []
    if table == SCALED:
        a, b, scale_a, scale_b, bias = tensors
        ops.put_scaled(-1, a, b, scale_a, scale_b, bias, plan.out_dtype, fast_accum, entry.kind, plan.ident,
                       plan.label, list(plan.out_shape), words, entry.confirm, entry.tie)  # fmt: skip
    elif table == GROUPED:
        a, b, offs, out_dtype = tensors
        ops.put_grouped(-1, a, b, offs, out_dtype, entry.kind, plan.ident, plan.label, list(plan.out_shape),
                        words, entry.confirm, entry.tie)  # fmt: skip
    elif table == API:
        if entry.kind == PYTHON:
            return False
        a, b, out = tensors
        _put(API, API_OPS[a.dim()], MODES[mode], a, b, out, False, False, entry.kind, plan.ident, plan.label,
             plan.out_shape, 0, entry.call, entry.confirm, entry.tie)  # fmt: skip
    else:
        a, b, c = tensors
        accumulate = c is not None
        _put(ROUTING, OPS[plan.op], -1, a, b, c, bool(accumulate and beta == 0), bool(accumulate and beta == 1),
             entry.kind, plan.ident, plan.label, plan.out_shape, plan.form, entry.call, entry.confirm, entry.tie)  # fmt: skip
    entered(entry, plan, kept)
    return True


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
    environment's mode); ``call``: a ``ScaledLtRunner``'s NativeCall (``SCALED_LT``) or a
    scaled kernel's launch (``LAUNCH``); ``confirm`` and ``tie`` as for :func:`put`."""
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
        call.words if call is not None and kind in (SCALED_LT, LAUNCH) else [],
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
