"""TritonBackend: Triton kernels as unimatmul candidates, on CUDA/ROCm or in the interpreter.

Two registrations of one backend, named ``triton`` either way:

- :class:`TritonBackend` serves torch tensors on a GPU. ``candidates()`` ranks the
  config space with the analytic model (``configs.py``), keeps the best few
  (``UNIMATMUL_TRITON_CANDIDATES``, default 8; 2 where a leading dimension or the
  pointers leave the loads unvectorised: ``configs.vector_loads``) and starts compiling them in a thread
  pool at once, their launchers too (``compiler.py``; ``UNIMATMUL_TRITON_PRECOMPILE=0`` turns
  that off), so that by the time the harness prepares them one by one most are ready.
  Compiled kernels stay in Triton's own on-disk cache (``TRITON_CACHE_DIR``): a kernel
  binary depends on the plan's specialisation (``LaunchPlan.key``: the config, the dtypes,
  which sizes and strides are 1 or multiples of 16, and the epilogue), not on the exact
  shape, so most shapes of a model share binaries, one compile each in a process. A
  config that does not compile is that candidate's UnsupportedProblem.
- :class:`TritonInterpreterBackend` (``UNIMATMUL_TRITON_INTERPRET=1``) serves CPU torch
  tensors by running the very same kernel source in Triton's interpreter: the tests
  and a conformance run execute the real kernels without a GPU (slowly: small shapes).

Served: A and B both bf16 or both f16, C of the same dtype or f32, fp32 accumulation;
every layout (transposes, leading dimensions, batch strides, a broadcast operand,
pointers below 16-byte alignment), alpha and beta (C read only when beta != 0), and
every epilogue. Scaled (fp8) products in torch._scaled_mm's layout (A row-major, B =
w.t()): A and B of one fp8 dtype (e4m3 or e5m2, or ROCm's fnuz pair), per-tensor,
row-wise or block scales, a bias, fast accumulation as the problem says: the rows kernel
at m = 1, the GEMV (not block-scaled) and the skinny tile at m <= 16, the tile kernel
above. Everything else is refused with UnsupportedProblem.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from unimatmul import Backend, Candidate, Problem, Target, UnsupportedProblem
from unimatmul.backend import prepare_deadline
from unimatmul_triton import configs
from unimatmul_triton import settings as plugin_settings
from unimatmul_triton.compiler import CompileFailed, Compiler, start_warming, wait_warm
from unimatmul_triton.configs import H200, PERSISTENT, Device, config_of, ranked_configs
from unimatmul_triton.launch import LaunchPlan, plan_for
from unimatmul_triton.runner import CompiledRunner, InterpretedRunner, ScaledCompiledRunner

__version__ = "0.1.0"

INPUT_DTYPES = ("bf16", "f16")
#: Scaled (fp8) products: both operands of one of these (the fnuz pair is ROCm's).
FP8_DTYPES = ("f8e4m3", "f8e5m2", "f8e4m3fnuz", "f8e5m2fnuz")
BIAS_DTYPES = ("bf16", "f16", "f32")


def interpret_requested() -> bool:
    """Whether the plugin runs in test mode: the interpreter, on CPU torch tensors."""
    return plugin_settings.INTERPRET.get()


def check_supported(problem: Problem) -> None:
    """Raise UnsupportedProblem, naming what, for a problem no kernel here computes."""
    p = problem
    why = ""
    if p.is_scaled:
        why = _scaled_unsupported(p)
    elif p.dtype_a != p.dtype_b or p.dtype_a not in INPUT_DTYPES:
        why = f"takes A and B both bf16 or both f16, not {p.dtype_a} and {p.dtype_b}"
    elif p.dtype_c not in (p.dtype_a, "f32"):
        why = f"writes C as {p.dtype_a} or f32, not {p.dtype_c}"
    elif p.compute not in ("f32", p.dtype_a):
        why = f"accumulates in f32, which does not serve compute type {p.compute}"
    elif p.has_bias and p.dtype_bias not in BIAS_DTYPES:
        why = f"takes a bias of {'/'.join(BIAS_DTYPES)}, not {p.dtype_bias}"
    if why:
        raise UnsupportedProblem(f"triton {why}", problem=problem, backend="triton")


def _scaled_unsupported(p: Problem) -> str:
    """Why no kernel here computes the scaled (fp8) problem ``p``, or ""."""
    if p.dtype_a != p.dtype_b or p.dtype_a not in FP8_DTYPES:
        return f"takes scaled A and B of one fp8 dtype ({', '.join(FP8_DTYPES)}), not {p.dtype_a} and {p.dtype_b}"
    if p.trans_a or not p.trans_b:
        return "takes scaled products in torch._scaled_mm's layout only: A row-major, B column-major (w.t())"
    return ""


class TritonBackend(Backend):
    """Triton kernels compiled for the GPU (see the module docstring)."""

    name = "triton"
    device_kinds = frozenset({"cuda", "hip"})
    array_kinds = frozenset({"torch"})

    def __init__(self) -> None:
        self._availability: str | None = None
        self._checked = False
        self._lock = threading.Lock()
        self._devices: dict[int, tuple[Device, Any]] = {}
        self._compiler: Compiler | None = None

    # --- what is here -----------------------------------------------------------------
    def availability(self) -> str | None:
        if not self._checked:
            with self._lock:
                if not self._checked:
                    self._availability = self._find_availability()
                    self._checked = True
        return self._availability

    def check_soon(self) -> None:
        """Check availability in a thread of its own now (which starts Triton's warming when
        usable: ``compiler.start_warming``) where torch is imported already and sees a GPU,
        so that the warming overlaps the rest of the first call's set-up (the other
        backends' libraries load meanwhile) instead of following it. Nothing otherwise: a
        process without a GPU does not import Triton for it."""
        torch = sys.modules.get("torch")
        if torch is None or self._checked or not plugin_settings.PRECOMPILE.get():
            return
        try:
            usable = bool(torch.cuda.is_available())
        except Exception:
            return
        if usable:
            threading.Thread(target=self.availability, name="unimatmul-triton-check", daemon=True).start()

    def _find_availability(self) -> str | None:
        try:
            import triton
        except Exception as exc:
            return f"triton is not installed ({type(exc).__name__}: {exc}); pip install -e '.[triton]' in the unimatmul checkout"
        try:
            import torch
        except Exception as exc:
            return f"torch cannot be imported ({type(exc).__name__}: {exc})"
        if interpret_requested() or os.environ.get("TRITON_INTERPRET", "") not in ("", "0"):
            return "TRITON_INTERPRET / UNIMATMUL_TRITON_INTERPRET is set: the kernels run in the interpreter, on the CPU"
        if not torch.cuda.is_available():
            return "no GPU: torch.cuda.is_available() is False"
        if not getattr(torch.version, "hip", None):
            major, _ = torch.cuda.get_device_capability(0)
            if major < 8:
                return f"needs compute capability 8.0 or newer for bf16 tensor cores, device 0 has {major}.x"
        from unimatmul_triton import kernels

        if type(kernels.tile_kernel).__name__ != "JITFunction":
            return "the kernels were imported for Triton's interpreter in this process"
        del triton
        if plugin_settings.PRECOMPILE.get():
            start_warming(_jit_kernels)
        return None

    def versions(self) -> dict[str, str]:
        import triton

        return {"triton": str(triton.__version__), "unimatmul-triton": __version__}

    def close(self) -> None:
        if self._compiler is not None:
            self._compiler.shutdown()
            self._compiler = None

    def ahead_over(self) -> None:
        # Compiled kernels live in their runners and Triton's cache: only the pool goes
        # (a new one starts if anything compiles again).
        self.close()

    # --- candidates -------------------------------------------------------------------
    @property
    def candidate_count(self) -> int:
        found = plugin_settings.CANDIDATES.get()
        return 8 if found is None else found

    def device_model(self, target: Target) -> Device:
        return self._device(target)[0]

    def ranked(self, problem: Problem, target: Target, limit: int | None = None) -> list[configs.Estimate]:
        """The model's ranking of every applicable config (reports and scripts use it)."""
        self._check_here(problem)
        return ranked_configs(problem, self.device_model(target), limit)

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        self._require(target)
        ranked = self.ranked(problem, target, configs.offered(problem, self.candidate_count))
        found = [est.config.candidate for est in ranked]
        if plugin_settings.PRECOMPILE.get():
            plans = []
            for est in ranked:
                try:
                    plans.append(plan_for(problem, est.config))
                except UnsupportedProblem:
                    continue
            # Every specialisation not compiled yet, in parallel; prepare() takes the results.
            self.compiler.submit_all(plans, target.device.index, self._device(target)[1])
        return found

    def ahead(self, problem: Problem, target: Target) -> None:
        """Start compiling the configs ``problem`` will be offered (what :meth:`candidates`
        does when it lists them), without waiting."""
        if plugin_settings.PRECOMPILE.get():
            self.candidates(problem, target)

    def check(self, problem: Problem, candidate: Candidate, target: Target) -> bool:
        try:
            self._check_here(problem)
            config = config_of(problem, candidate)
            if config is None:
                return False
            plan_for(problem, config)
        except UnsupportedProblem:
            return False
        return True

    # --- runners ----------------------------------------------------------------------
    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> Any:
        plan = self._plan(problem, candidate)
        self._require(target)
        import torch

        index = target.device.index
        device, gpu_target = self._device(target)
        try:
            compiled = self.compiler.get(plan, index, gpu_target, deadline=prepare_deadline())
        except CompileFailed as exc:
            raise UnsupportedProblem(
                f"triton could not compile {candidate.identity}: {exc}", problem=problem, backend=self.name
            ) from exc
        with torch.cuda.device(index):
            try:
                compiled.run  # noqa: B018 - loads the module on this device (may raise OutOfResources)
            except Exception as exc:
                if type(exc).__name__ == "OutOfResources":
                    raise UnsupportedProblem(
                        f"{candidate.identity} does not fit this device: {exc}",
                        problem=problem,
                        backend=self.name,
                    ) from exc
                raise
            programs = plan.grid[0]
            if candidate.name == PERSISTENT:
                programs = min(programs, device.sms * _residency(compiled, device))
            kind = ScaledCompiledRunner if problem.is_scaled else CompiledRunner
            return kind(candidate, plan, compiled, index, programs)

    def _plan(self, problem: Problem, candidate: Candidate) -> LaunchPlan:
        if candidate.backend != self.name:
            raise UnsupportedProblem(f"{candidate.identity} is not a triton candidate", problem=problem)
        self._check_here(problem)
        config = config_of(problem, candidate)
        if config is None:
            raise UnsupportedProblem(
                f"triton has no kernel {candidate.identity} for {problem.key}",
                problem=problem,
                backend=self.name,
            )
        return plan_for(problem, config)

    def _check_here(self, problem: Problem) -> None:
        """:func:`check_supported`, and whether this GPU's Triton compiles the problem's
        dtypes: the fnuz fp8 pair (``fp8e4b8``, ``fp8e5b16``) is ROCm's; NVIDIA's Triton
        has the OCP pair only."""
        check_supported(problem)
        if problem.is_scaled and problem.dtype_a.endswith("fnuz"):
            import torch

            if not getattr(torch.version, "hip", None):
                raise UnsupportedProblem(
                    f"triton has no {problem.dtype_a} kernels on an NVIDIA GPU (the fnuz fp8 pair is ROCm's)",
                    problem=problem,
                    backend=self.name,
                )

    def _require(self, target: Target) -> None:
        reason = self.availability()
        if reason is not None:
            raise UnsupportedProblem(f"triton is unavailable: {reason}", backend=self.name)

    def _device(self, target: Target) -> tuple[Device, Any]:
        """The model's view of the target's GPU and Triton's compile target for it."""
        index = target.device.index
        found = self._devices.get(index)
        if found is None:
            import torch
            from triton.runtime import driver

            wait_warm()  # the driver's first use, in the warming thread
            props = torch.cuda.get_device_properties(index)
            smem = getattr(props, "shared_memory_per_block_optin", None)
            device = H200.scaled(int(props.multi_processor_count), int(smem) if smem else None)
            with torch.cuda.device(index):
                gpu_target = driver.active.get_current_target()
            found = self._devices[index] = (device, gpu_target)
        return found

    @property
    def compiler(self) -> Compiler:
        if self._compiler is None:
            with self._lock:
                if self._compiler is None:
                    processes = compile_processes()
                    threads = (
                        plugin_settings.COMPILE_THREADS.get() or processes or min(8, os.cpu_count() or 1)
                    )
                    self._compiler = Compiler(threads, processes=processes)
        return self._compiler


def _jit_kernels() -> list[Any]:
    """Every JIT kernel the backends compile (their source hashes are warmed ahead)."""
    from unimatmul_triton import grouped_kernels, kernels

    return [*kernels.KERNELS.values(), grouped_kernels.grouped_rows_kernel, grouped_kernels.grouped_kernel]


def compile_processes() -> int:
    """Compile processes for a new Compiler (``UNIMATMUL_TRITON_COMPILE_PROCESSES``): by
    default one per CPU but one (kept for the harness), where there are at least four."""
    found = plugin_settings.COMPILE_PROCESSES.get()
    if found is not None:
        return found
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cpus - 1 if cpus >= 4 else 0


def _residency(compiled: Any, device: Device) -> int:
    """Programs of a compiled kernel resident per SM: its real registers and shared memory."""
    threads = 32 * int(compiled.metadata.num_warps)
    regs = max(int(getattr(compiled, "n_regs", 0) or 0), 1) * threads
    by_regs = device.regs_per_sm // regs
    by_threads = device.max_threads_per_sm // threads
    by_smem = device.smem_per_sm // (int(compiled.metadata.shared) + 1024)
    return max(1, min(by_regs, by_threads, by_smem))


class TritonInterpreterBackend(TritonBackend):
    """The same kernels in Triton's interpreter, on CPU torch tensors (test mode)."""

    device_kinds = frozenset({"cpu"})

    def _find_availability(self) -> str | None:
        try:
            import torch  # noqa: F401
        except Exception as exc:
            return f"torch cannot be imported ({type(exc).__name__}: {exc})"
        # triton.jit decides at decoration time, for Triton's own library functions (tl.cdiv)
        # when triton is imported: make_backend() sets TRITON_INTERPRET before that.
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            from triton.language import standard

            from unimatmul_triton import kernels
        except Exception as exc:
            return f"triton is not installed ({type(exc).__name__}: {exc}); pip install -e '.[triton]' in the unimatmul checkout"
        for jitted in (standard.cdiv, kernels.tile_kernel):
            if type(jitted).__name__ != "InterpretedFunction":
                return (
                    "triton was imported before UNIMATMUL_TRITON_INTERPRET=1 took effect: set it "
                    "(or TRITON_INTERPRET=1) in the environment before the process imports triton"
                )
        return None

    @property
    def candidate_count(self) -> int:
        # The interpreter is slow: fewer candidates, still one of each family leading.
        found = plugin_settings.CANDIDATES.get()
        return 3 if found is None else found

    def device_model(self, target: Target) -> Device:
        return H200

    def _check_here(self, problem: Problem) -> None:
        check_supported(problem)  # the interpreter computes every fp8 dtype, the fnuz pair too

    def candidates(self, problem: Problem, target: Target) -> list[Candidate]:
        self._require(target)
        count = configs.offered(problem, self.candidate_count)
        return [est.config.candidate for est in self.ranked(problem, target, count)]

    def prepare(self, problem: Problem, candidate: Candidate, target: Target) -> Any:
        plan = self._plan(problem, candidate)
        self._require(target)
        from unimatmul_triton.kernels import KERNELS

        return InterpretedRunner(candidate, plan, KERNELS[plan.kernel])


def make_backend() -> TritonBackend:
    """The backend for this process: the interpreter one when UNIMATMUL_TRITON_INTERPRET=1."""
    if interpret_requested():
        # Before anything imports triton, if we are first (the plugin loads early).
        os.environ["TRITON_INTERPRET"] = "1"
        return TritonInterpreterBackend()
    return TritonBackend()
