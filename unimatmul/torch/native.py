"""The native routing kernels: building them, and the table they read.

``_native.cpp`` holds C++ kernels for ``aten::mm``, ``bmm``, ``addmm`` and ``baddbmm``
that do what the Python kernels of :mod:`unimatmul.torch.routing` do on a known
operand key, without entering Python: PyTorch's own kernel when Default was chosen,
or the cuBLASLt/hipBLASLt call of an :class:`~unimatmul_backends.lt.runner.LtRunner`
(the same descriptors and algo, the library's own function). Everything else (a key
met for the first time, a padded candidate, a CPU backend's kernel) goes to the Python
kernel through the ``unimatmul_native::slow_*`` ops, and the Python kernel puts the
key's entry into the native table once it has decided. A oneDNN runner's primitive is
executed from C++ as well (``MatmulPrimitive.native_words``).

The kernels are built on first use with ``torch.utils.cpp_extension`` (a C++ compiler
and ninja are needed; the GPU build also needs the CUDA or ROCm headers that PyTorch's
extension builder finds) and cached in PyTorch's extension directory
(``TORCH_EXTENSIONS_DIR``). When the build fails, routing uses the Python kernels and
says why once. ``UNIMATMUL_TORCH_NATIVE`` chooses: ``auto`` (default: native kernels
at the CPU key and, with a GPU, the CUDA key), ``cuda`` (the CUDA key only), ``0``
(Python kernels only).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import torch

from unimatmul import settings

ENV = settings.TORCH_NATIVE.name
CHOICES = ("auto", "cuda", "0")
SOURCE = Path(__file__).with_name("_native.cpp")
MODES = {"off": 0, "cached": 1, "tune": 2, "record": 3}
OPS = {"mm": 0, "bmm": 1, "addmm": 2, "baddbmm": 3}
# Entry kinds in the native table (_native.cpp).
DEFAULT, LT, PYTHON, PADDED, ONEDNN = 0, 1, 2, 3, 4

_lock = threading.Lock()
_loaded_gpu: bool | None = None  # None: nothing loaded; else whether the GPU build is
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


def load(cuda: bool) -> bool:
    """Build (once per source and PyTorch version) and load the kernels; False if that fails.

    ``cuda``: the GPU build, which can make Lt calls itself; the CPU build passes every
    backend kernel to Python. Only one build is loaded per process (both define the
    same operators); a GPU build serves the CPU key too.
    """
    global _loaded_gpu
    with _lock:
        if _loaded_gpu is not None:
            return _loaded_gpu or not cuda
        if cuda in _failures:
            return False
        try:
            from torch.utils import cpp_extension

            _find_ninja()
            cpp_extension.load(
                name=_build_name(cuda),
                sources=[str(SOURCE)],
                extra_cflags=["-O2", *(["-DUMM_WITH_CUDA"] if cuda else [])],
                with_cuda=cuda,
                is_python_module=False,
                verbose=False,
            )
        except Exception as exc:  # a missing compiler, ninja or header: Python kernels instead
            _failures[cuda] = (
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
            )
            return False
        _loaded_gpu = cuda
        return True


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


def kind_of(call: Any) -> int:
    """The table entry for a runner's NativeCall (None: the runner offers none): PYTHON
    where the loaded build cannot make that call (an Lt call needs the GPU build)."""
    if call is None:
        return PYTHON
    if call.kind == "onednn":
        return ONEDNN
    if call.kind == "lt" and has_lt():
        return PADDED if call.padded else LT
    return PYTHON


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
) -> None:
    """Put the entry for these operands' key; ``call``: a runner's NativeCall (LT, PADDED)."""
    accumulate = c is not None
    torch.ops.unimatmul_native.put(
        OPS[op],
        a,
        b,
        c,
        bool(accumulate and beta == 0),
        bool(accumulate and beta == 1),
        kind,
        ident,
        label,
        list(out_shape),
        form,
        call.words if call is not None else [],
        list(call.buffers) if call is not None and call.padded else [],
        list(call.flags) if call is not None and call.padded else [],
    )


def _pairs(words: list[int]) -> dict[int, int]:
    """(id, calls) words -> {id: calls}, entries that made no call left out."""
    return {words[i]: words[i + 1] for i in range(0, len(words), 2) if words[i + 1]}


def clear() -> dict[int, int]:
    """Empty the table; the calls each entry made there, by entry id."""
    if not loaded():
        return {}
    return _pairs(list(torch.ops.unimatmul_native.clear()))


def counts(reset: bool = False) -> dict[int, int]:
    if not loaded():
        return {}
    return _pairs(list(torch.ops.unimatmul_native.counts(reset)))


def size() -> int:
    return int(torch.ops.unimatmul_native.size()) if loaded() else 0
