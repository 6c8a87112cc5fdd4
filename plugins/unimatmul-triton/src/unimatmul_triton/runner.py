"""Runners: a compiled kernel launched on the caller's stream, or the same kernel interpreted.

:class:`CompiledRunner` holds one compiled Triton kernel and everything fixed for its
problem; a call reads the pointers and the current stream, picks this stream's
split-K workspace and makes one launcher call: no allocation (except a workspace the
first time a new stream calls), no synchronisation, no logging, so it can be captured
in a CUDA graph. :meth:`CompiledRunner.launch_info` describes that launch for a native
caller (see the README), and :meth:`CompiledRunner.native_call` hands it to unimatmul's
native routing kernels, which then make the launch themselves (no Python per call).

:class:`InterpretedRunner` runs the same kernel source through Triton's interpreter on
CPU torch tensors (the test mode, ``UNIMATMUL_TRITON_INTERPRET=1``). The interpreter
keeps global state, so its calls are serialised.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from unimatmul import Candidate
from unimatmul.backend import NativeCall, kept_torch_buffer
from unimatmul_triton.launch import LaunchPlan

_INTERPRETER_LOCK = threading.Lock()

# ctypes of the kernel's parameters as the launcher passes them (Triton 3.6,
# backends/nvidia/driver.py: pointers are CUdeviceptr, fp32 scalars go as their bits).
_CTYPES = {"ptr": "CUdeviceptr", "i32": "int32_t", "i64": "int64_t", "fp32": "float"}
_SIZES = {"ptr": 8, "i32": 4, "i64": 8, "fp32": 4}
# NativeCall "launch": the role code of each per-call parameter (the rest are constants, 0);
# a scaled kernel's scale pointers are filled per call by torch routing's native _scaled_mm.
_ROLE_CODES = NativeCall.LAUNCH_ROLES


class CompiledRunner:
    """One compiled kernel on one problem (see the module docstring)."""

    def __init__(
        self,
        candidate: Candidate,
        plan: LaunchPlan,
        compiled: Any,
        device_index: int,
        programs: int,
    ) -> None:
        import torch

        self.candidate = candidate
        self.plan = plan
        self.compiled = compiled
        self.device_index = device_index
        self._torch = torch
        self._device = torch.device("cuda", device_index)
        self.grid = (programs, plan.grid[1], plan.grid[2])
        self._function = compiled.function
        self._packed = compiled.packed_metadata
        self._launch = _launcher(compiled)
        raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw_stream is not None:
            self._stream = lambda: raw_stream(device_index)
        else:  # pragma: no cover - older torch
            self._stream = lambda: int(torch.cuda.current_stream(device_index).cuda_stream)
        self._ptr = torch.Tensor.data_ptr
        # Every argument in order: the pointer slots (a, b, out, bias[, workspace, counters]),
        # the fixed sizes and strides, alpha and beta, the constexprs (which the launcher
        # takes and skips). Only the slots change per call.
        roles = [p.role for p in plan.params]
        head = _first_fixed(plan)
        alpha_at = roles.index("alpha")
        self._middle = tuple(p.value for p in plan.params[head:alpha_at])
        self._tail = tuple(p.value for p in plan.params[alpha_at + 2 :])
        self._six_slots = head == 6
        self._split = plan.workspace_elems > 0
        self._bias_slot = plan.params[3].kind == "ptr"
        self._lock = threading.Lock()
        self._workspaces: dict[int, tuple[Any, Any, int, int]] = {}
        with torch.cuda.device(device_index):
            self._workspace(self._stream())

    # --- the hot path ---------------------------------------------------------------
    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        ptr = self._ptr
        stream = self._stream()
        bias_ptr = ptr(bias) if self._bias_slot else None
        if self._split:
            found = self._workspaces.get(stream)
            if found is None:
                found = self._workspace(stream)
            head: tuple[Any, ...] = (ptr(a), ptr(b), ptr(out), bias_ptr, found[2], found[3])
        elif self._six_slots:
            head = (ptr(a), ptr(b), ptr(out), bias_ptr, None, None)
        else:
            head = (ptr(a), ptr(b), ptr(out), bias_ptr)
        self._launch(
            self.grid, stream, self._function, self._packed, (*head, *self._middle, alpha, beta, *self._tail)
        )

    def _workspace(self, stream: int) -> tuple[Any, Any, int, int]:
        """This stream's split-K workspace and counters (zeroed once; kernels leave them zeroed)."""
        with self._lock:
            found = self._workspaces.get(stream)
            if found is None:
                torch = self._torch
                if self._split:
                    # Kept across calls: never from a CUDA graph tree's pool (kept_torch_buffer).
                    ws = kept_torch_buffer((self.plan.workspace_elems,), (1,), torch.float32, self._device)
                    cnt = kept_torch_buffer((self.plan.counter_elems,), (1,), torch.int32, self._device)
                    ws.zero_()
                    cnt.zero_()
                    found = (ws, cnt, int(ws.data_ptr()), int(cnt.data_ptr()))
                else:
                    found = (None, None, 0, 0)
                self._workspaces[stream] = found
        return found

    # --- for a native caller ----------------------------------------------------------
    def launch_info(self, stream: int | None = None) -> dict[str, Any]:
        """What a native (C++) caller needs to launch this kernel itself (README: "Native launch").

        ``stream``: the stream whose workspace the split-K slots should point at (default:
        the current one; a new stream gets its workspace now).
        """
        if stream is None:
            stream = self._stream()
        ws = self._workspace(stream)
        params: list[dict[str, Any]] = []
        for p in self.plan.params:
            if not p.passed:
                continue
            entry: dict[str, Any] = {"name": p.name, "type": _CTYPES[p.kind], "size": _SIZES[p.kind]}
            if p.role is not None:
                entry["role"] = p.role
                if p.role == "workspace":
                    entry["value"] = ws[2]
                elif p.role == "counters":
                    entry["value"] = ws[3]
            else:
                entry["role"] = "constant"
                entry["value"] = p.value
            params.append(entry)
        return compiled_launch_info(self.compiled, self.grid, params, stream)

    def native_call(self) -> NativeCall | None:
        """This launch for unimatmul's native routing kernels (``NativeCall`` "launch"):
        the driver's launch function, the parameters with their roles, the current
        stream's split-K workspace. None when the launch needs what the native caller
        does not do (see :func:`launch_words`) or the driver library is not found."""
        driver = _Driver.words(self.device_index, _is_hip())
        if driver is None:
            return None
        words = launch_words(self.launch_info(), driver)
        return None if words is None else NativeCall("launch", words)


class ScaledCompiledRunner(CompiledRunner):
    """A scaled (fp8) problem's compiled kernel, called as scaled runners are:
    ``runner(a, b, out, alpha, beta, bias, scale_a, scale_b)``. The scale pointers follow
    beta in the kernel's arguments (``launch._scale_params``); the launch is the same one
    launcher call, and :meth:`native_call` describes it with the two scale pointers as
    per-call parameters (torch routing's native ``_scaled_mm`` kernel fills them)."""

    def __init__(
        self,
        candidate: Candidate,
        plan: LaunchPlan,
        compiled: Any,
        device_index: int,
        programs: int,
    ) -> None:
        super().__init__(candidate, plan, compiled, device_index, programs)
        self._after_scales = self._tail[2:]
        self._no_split: tuple[Any, ...] = (None, None) if self._six_slots else ()

    def __call__(
        self,
        a: Any,
        b: Any,
        out: Any,
        alpha: float = 1.0,
        beta: float = 0.0,
        bias: Any = None,
        scale_a: Any = None,
        scale_b: Any = None,
    ) -> None:
        ptr = self._ptr
        stream = self._stream()
        if self._split:
            found = self._workspaces.get(stream) or self._workspace(stream)
            slots: tuple[Any, ...] = (found[2], found[3])
        else:
            slots = self._no_split
        args = (
            ptr(a),
            ptr(b),
            ptr(out),
            ptr(bias) if self._bias_slot else None,
            *slots,
            *self._middle,
            alpha,
            beta,
            ptr(scale_a),
            ptr(scale_b),
            *self._after_scales,
        )
        self._launch(self.grid, stream, self._function, self._packed, args)


class _Driver:
    """The driver API's launch and set-context functions (CUDA, or HIP on ROCm) and each
    device's primary context, for :meth:`CompiledRunner.native_call`."""

    _lock = threading.Lock()
    _loaded: list[Any] = []  # [(library, names)] or [None] when unavailable
    _words: dict[int, tuple[int, int, int] | None] = {}  # device index -> words (one retain each)

    @classmethod
    def functions(cls, hip: bool) -> tuple[Any, tuple[str, str, str, str]] | None:
        with cls._lock:
            if not cls._loaded:
                names = (
                    ("hipModuleLaunchKernel", "hipCtxSetCurrent", "hipDeviceGet", "hipDevicePrimaryCtxRetain")
                    if hip
                    else ("cuLaunchKernel", "cuCtxSetCurrent", "cuDeviceGet", "cuDevicePrimaryCtxRetain")
                )
                try:
                    library = ctypes.CDLL("libamdhip64.so" if hip else "libcuda.so.1")
                    for name in names:
                        getattr(library, name)
                    cls._loaded.append((library, names))
                except (OSError, AttributeError):
                    cls._loaded.append(None)
            return cls._loaded[0]

    @classmethod
    def words(cls, device_index: int, hip: bool) -> tuple[int, int, int] | None:
        """(launch function, set-context function, the device's primary context) addresses,
        found once per device."""
        if device_index not in cls._words:
            found = cls._find_words(device_index, hip)
            with cls._lock:
                cls._words.setdefault(device_index, found)
        return cls._words[device_index]

    @classmethod
    def _find_words(cls, device_index: int, hip: bool) -> tuple[int, int, int] | None:
        found = cls.functions(hip)
        if found is None:
            return None
        library, (launch, set_context, device_get, retain) = found
        device = ctypes.c_int(0)
        context = ctypes.c_void_p(0)
        if getattr(library, device_get)(ctypes.byref(device), ctypes.c_int(device_index)) != 0:
            return None
        # A reference the process keeps: the primary context lives as long as it anyway.
        if getattr(library, retain)(ctypes.byref(context), device) != 0 or not context.value:
            return None
        address = ctypes.cast(getattr(library, launch), ctypes.c_void_p).value
        set_address = ctypes.cast(getattr(library, set_context), ctypes.c_void_p).value
        if not address or not set_address:
            return None
        return address, set_address, context.value


def compiled_launch_info(
    compiled: Any, grid: tuple[int, int, int], params: list[dict[str, Any]], stream: int
) -> dict[str, Any]:
    """A launch of ``compiled`` on ``grid`` as :meth:`CompiledRunner.launch_info` describes it
    (README: "Native launch"), its kernel parameters ``params`` (the hidden ones added here);
    ``compiled``'s function is loaded already."""
    meta = compiled.metadata
    ctas = int(getattr(meta, "num_ctas", 1))
    # Triton 3.6 appends two hidden pointers to every kernel's parameters: the global
    # and the profile scratch buffers (NULL when the kernel needs none, as ours).
    hidden = [
        {
            "name": name,
            "type": "CUdeviceptr",
            "size": 8,
            "role": "hidden",
            "value": 0,
            "bytes_needed": int(getattr(meta, size_attr, 0) or 0),
        }
        for name, size_attr in (
            ("global_scratch", "global_scratch_size"),
            ("profile_scratch", "profile_scratch_size"),
        )
    ]
    return {
        "function": int(compiled.function),
        "module": int(getattr(compiled, "module", 0) or 0),
        "kernel_name": compiled.name,
        "grid": (grid[0] * ctas, grid[1], grid[2]),
        "block": (32 * int(meta.num_warps), 1, 1),
        "shared_mem_bytes": int(meta.shared),
        "cluster_dims": (ctas, 1, 1),
        "cooperative": bool(getattr(meta, "launch_cooperative_grid", False)),
        "pdl": bool(getattr(meta, "launch_pdl", False)),
        "stream": stream,
        "params": [*params, *hidden],
        "triton_version": str(getattr(meta, "triton_version", "")),
    }


def launch_words(info: dict[str, Any], driver: tuple[int, int, int]) -> list[int] | None:
    """:meth:`CompiledRunner.launch_info` as the words of a NativeCall "launch", or None
    for a launch the native caller does not make (clusters, cooperative or PDL launches,
    scratch buffers)."""
    params = info["params"]
    if info["cooperative"] or info["pdl"] or tuple(info["cluster_dims"]) != (1, 1, 1):
        return None
    if any(p.get("bytes_needed") for p in params):
        return None
    split = any(p["role"] in ("workspace", "counters") for p in params)
    words = [
        *driver,
        int(info["function"]),
        *(int(g) for g in info["grid"]),
        int(info["block"][0]),
        int(info["shared_mem_bytes"]),
        int(info["stream"]),
        int(split),
        len(params),
    ]
    for p in params:
        role = _ROLE_CODES.get(p["role"], 0)
        words += [role, int(p["size"]), 0 if role else int(p.get("value") or 0)]
    return words


def _first_fixed(plan: LaunchPlan) -> int:
    """Index of the first argument after the pointer slots (M)."""
    return next(i for i, p in enumerate(plan.params) if p.name == "M")


def _is_hip() -> bool:
    import torch

    return bool(getattr(torch.version, "hip", None))


def _launcher(compiled: Any) -> Any:
    """A function (grid, stream, function, packed_metadata, args) that launches ``compiled``.

    On CUDA, when the kernel needs no scratch buffers, it calls the launcher's C entry
    point directly (the arguments Triton 3.6's CudaLauncher.__call__ passes it, without
    its per-call scratch checks); otherwise the launcher as Triton's JIT calls it.
    """
    run = compiled.run  # loads the module on the current device and builds the launcher
    meta = compiled.metadata
    direct = getattr(run, "launch", None)
    no_scratch = not getattr(meta, "global_scratch_size", 0) and not getattr(meta, "profile_scratch_size", 0)
    if type(run).__name__ == "CudaLauncher" and callable(direct) and no_scratch:
        coop = bool(getattr(run, "launch_cooperative_grid", False))
        pdl = bool(getattr(run, "launch_pdl", False))

        def launch_direct(
            grid: tuple[int, int, int], stream: int, function: int, packed: Any, args: tuple[Any, ...]
        ) -> None:
            direct(
                grid[0],
                grid[1],
                grid[2],
                stream,
                function,
                coop,
                pdl,
                None,
                None,
                packed,
                None,
                None,
                None,
                *args,
            )

        return launch_direct

    def launch_generic(
        grid: tuple[int, int, int], stream: int, function: int, packed: Any, args: tuple[Any, ...]
    ) -> None:
        run(grid[0], grid[1], grid[2], stream, function, packed, None, None, None, *args)

    return launch_generic


def _interpreter_numpy2_fix() -> None:
    """Let Triton's interpreter run loops over scalar-tensor bounds with NumPy >= 2.3.

    The interpreter holds every int argument as a one-element array and converts a scalar
    for ``range()`` with ``int(array)``, which NumPy 2.3 and later refuse for arrays of
    one dimension. This wraps the interpreter's own patching of ``tl.tensor`` so that
    ``__index__`` reads the single element instead; nothing else changes.
    """
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "unimatmul_fixed", False):
        return

    def patch(tensor: Any, scope: Any) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch.unimatmul_fixed = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patch
    _interpreter_bf16_dot_fix()


def _interpreter_bf16_dot_fix() -> None:
    """Make Triton's interpreter multiply bf16 operands of ``tl.dot`` as numbers.

    The interpreter stores bf16 as raw 16-bit patterns (NumPy has no bf16) and its
    ``create_dot`` multiplies those patterns as integers. This widens bf16 operands to
    fp32 first (exact: a bf16 is the top half of an fp32), then runs the original.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_dot
    if getattr(original, "unimatmul_fixed", False):
        return

    def widen(x: Any) -> Any:
        if x.dtype.scalar == tl.bfloat16 if hasattr(x.dtype, "scalar") else x.dtype == tl.bfloat16:
            data = (x.data.astype(np.uint32) << 16).view(np.float32)
            return interpreter.TensorHandle(data, tl.float32)
        return x

    def create_dot(self: Any, a: Any, b: Any, d: Any, *args: Any) -> Any:
        return original(self, widen(a), widen(b), d, *args)

    create_dot.unimatmul_fixed = True  # type: ignore[attr-defined]
    builder.create_dot = create_dot


class InterpretedRunner:
    """The kernel run by Triton's interpreter on CPU torch tensors (test mode)."""

    def __init__(self, candidate: Candidate, plan: LaunchPlan, kernel: Any) -> None:
        import torch

        _interpreter_numpy2_fix()

        self.candidate = candidate
        self.plan = plan
        self._kernel = kernel
        self._grid = plan.grid
        self._workspace = None
        self._counters = None
        if plan.workspace_elems:
            self._workspace = torch.zeros(plan.workspace_elems, dtype=torch.float32)
            self._counters = torch.zeros(plan.counter_elems, dtype=torch.int32)
        self._constexprs = plan.constexprs()

    def __call__(
        self,
        a: Any,
        b: Any,
        out: Any,
        alpha: float = 1.0,
        beta: float = 0.0,
        bias: Any = None,
        scale_a: Any = None,
        scale_b: Any = None,
    ) -> None:
        values = {
            "a": a,
            "b": b,
            "out": out,
            "bias": bias,
            "workspace": self._workspace,
            "counters": self._counters,
            "scale_a": scale_a,
            "scale_b": scale_b,
        }
        args: dict[str, Any] = {}
        for p in self.plan.params:
            if p.role in values:
                args[p.name] = values[p.role] if p.kind == "ptr" else None
            elif p.role == "alpha":
                args[p.name] = float(alpha)
            elif p.role == "beta":
                args[p.name] = float(beta)
            else:
                args[p.name] = p.value
        with _INTERPRETER_LOCK:
            self._kernel[self._grid](**args)
