"""Compiling launch plans ahead of their first run: a bounded thread pool, one compile per
specialisation.

:class:`Compiler` compiles each plan's kernel with ``triton.compile`` from the plan's
explicit signature (no GPU call is needed to compile), into Triton's own on-disk cache
(``TRITON_CACHE_DIR``). It keeps one future per (:meth:`LaunchPlan.key`, device): the
binary depends on the plan's specialisation, not on the exact shape, so products of a
model that share a specialisation share one compile in a process, and a compile made
before (this process or another) is a cache read.

``TritonBackend.candidates()`` submits every offered plan at once; ``prepare()`` takes
the result (waiting for it where it is not ready). Threads suffice: Triton 3.6 releases
the GIL in its MLIR and LLVM passes (``make_ttgir``, ``make_llir``, ``make_ptx``) and runs
ptxas as a child process; only its Python front end (``ASTSource.make_ir``, about a tenth
of a compile) holds it. A compile that fails raises :class:`CompileFailed` (an
UnsupportedProblem) from :meth:`Compiler.get`, naming the plan and Triton's error: that
candidate fails, the tuning goes on.

With ``processes`` (:mod:`unimatmul_triton.compile_worker`), each thread hands its plan
to a compile process first and then compiles it itself, which reads the binary from
the cache: the processes take the compiles' Python work off this interpreter, whose
lock the harness measuring beside them needs. A compile error comes back from the
process as the same CompileFailed; a lost process only means the thread compiles.

After a kernel compiles, the same worker builds its launcher (``launcher=True``): the
small C module through which Triton launches kernels of one argument list
(:meth:`LaunchPlan.launcher_key`), compiled with the host's C compiler on its first use
and kept in Triton's cache. Triton builds it when a kernel is first loaded, in
``prepare()``, one candidate after another; built here, in parallel and once per argument
list, the load finds it in the cache. The launcher build touches no GPU (the module load
stays in ``prepare()``, on the caller's thread). Its C source depends on the kernel's
signature only (the kind of each argument), which is known before the kernel compiles:
:meth:`Compiler.prebuild_launcher` builds it then, beside the compiles
(:func:`build_launcher_for`), so that a first compile does not wait for the C compiler
after it; a kernel whose compiled signature differs from the one built ahead gets its own
build after its compile.

A process's first Triton compile pays for work done once per process before any IR is
built: hashing Triton's own sources and its 400 MB ``libtriton`` (``triton_key``, part of
every compile's cache key, warm Triton cache or not), building or loading the driver's
C helpers (``driver.active``: a C compile where Triton's cache is empty), and hashing each
kernel's source (its ``cache_key``); Triton's key is read from a file kept by an earlier
process where Triton's files are unchanged (:mod:`unimatmul_triton.triton_key`).
:func:`start_warming` does that in two threads of its own as soon as the backend finds
itself usable (``TritonBackend.check_soon``: at the plugin's registration, where torch sees
a GPU), while the first problem is still being built; the compile jobs and the backend's
first look at the driver wait for it (:func:`wait_warm`) instead of doing the same work
beside it (a plan's compile, whose target is explicit, waits for Triton's key only; its
launcher's build waits for the driver's helpers too).
"""

from __future__ import annotations

import atexit
import functools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from unimatmul import UnsupportedProblem
from unimatmul.backend import NotReady
from unimatmul_triton.compile_worker import WorkerLost, Workers, cache_dir
from unimatmul_triton.launch import LaunchPlan
from unimatmul_triton.triton_key import install as install_triton_key

_warm_lock = threading.Lock()
_warm_threads: list[threading.Thread] = []
#: What warming could not do, step by step (empty when it did all, or did not run): for
#: tests and messages; the compile that needs the same work reports its own error.
warm_errors: list[str] = []


def start_warming(kernels: Callable[[], list[Any]]) -> None:
    """Start, once per process, the once-per-process work of the first Triton compile
    (see the module docstring) in two daemon threads: Triton's key and the kernels'
    source hashes (``kernels()``: the JIT kernels) in the first, the driver's helpers in
    the second (a C compile where Triton's cache is empty). Both mostly wait on files, hashing
    and the C compiler, without the interpreter's lock."""
    with _warm_lock:
        if _warm_threads:
            return
        for steps in ((_triton_key, lambda: _source_hashes(kernels)), (_driver_helpers,)):
            thread = threading.Thread(target=_warm, args=steps, name="unimatmul-triton-warm", daemon=True)
            _warm_threads.append(thread)
            thread.start()


def wait_warm(*, driver: bool = True) -> None:
    """Wait for :func:`start_warming`'s threads, if they were started (at once otherwise).
    ``driver=False`` waits for Triton's key and the source hashes only, not the driver's
    helpers: enough for ``triton.compile`` with an explicit target (a plan's compile),
    which touches no driver; a JIT compile, a launcher's build and a kernel's load need
    the driver."""
    for thread in list(_warm_threads if driver else _warm_threads[:1]):
        if thread is not threading.current_thread():
            thread.join()


def _warm(*steps: Callable[[], None]) -> None:
    for step in steps:
        try:
            step()
        except Exception as exc:
            warm_errors.append(f"{getattr(step, '__name__', 'step')}: {type(exc).__name__}: {exc}")


def _triton_key() -> None:
    from triton.runtime import cache

    install_triton_key()
    cache.triton_key()


def _source_hashes(kernels: Callable[[], list[Any]]) -> None:
    for kernel in kernels():
        kernel.cache_key  # noqa: B018 - a property: hashes the source and what it calls


def _driver_helpers() -> None:
    from triton.runtime import driver

    driver.active.get_current_target()


class CompileFailed(UnsupportedProblem):
    """A plan's kernel did not compile (the message names the plan and Triton's error): an
    UnsupportedProblem, so that a harness records the candidate as failed and goes on."""


def describe(plan: LaunchPlan) -> str:
    """A plan's kernel and config in a few words (for messages)."""
    c = plan.constexprs()
    blocks = "x".join(str(c[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K") if k in c)
    split = c.get("SPLIT_K", 1)
    return (
        f"the {plan.kernel} kernel (blocks {blocks}, split {split}, {plan.warps} warps, {plan.stages} stages)"
    )


def reason(exc: BaseException) -> str:
    """A compile error in one line: its innermost cause (Triton's CompilationError wraps the
    error of each function it was compiling, outermost first, with their source)."""
    inner = exc
    while inner.__cause__ is not None:
        inner = inner.__cause__
    text = getattr(inner, "error_message", None) or str(inner)
    lines = [line.strip() for line in text.splitlines() if line.strip() not in ("", "^")]
    if not lines:
        return type(inner).__name__
    # A wrapper's text is its source excerpt, the error last; any other error says it first.
    line = lines[-1] if type(inner).__name__ == "CompilationError" else lines[0]
    return f"{type(inner).__name__}: {line[:300]}"


def compile_plan(plan: LaunchPlan, gpu_target: Any) -> Any:
    """Compile a plan's kernel for ``gpu_target`` (a Triton GPUTarget): a CompiledKernel."""
    import triton
    from triton.compiler import ASTSource

    from unimatmul_triton.kernels import KERNELS

    src = ASTSource(KERNELS[plan.kernel], plan.signature(), plan.constexprs(), plan.attrs())
    return triton.compile(
        src, target=gpu_target, options={"num_warps": plan.warps, "num_stages": plan.stages}
    )


def build_launcher(compiled: Any) -> None:
    """Build (or find in Triton's cache) the launcher of a compiled kernel, as Triton's
    first load of the kernel would (``CompiledKernel._init_handles``), without loading it."""
    from triton.runtime import driver

    driver.active.launcher_cls(compiled.src, compiled.metadata)


_SCRATCH_FREE = {
    "tensordesc_meta": None,
    "num_ctas": 1,
    "global_scratch_size": 0,
    "global_scratch_align": 1,
    "profile_scratch_size": 0,
    "profile_scratch_align": 1,
    "launch_cooperative_grid": False,
    "launch_pdl": False,
}


def build_launcher_for(signature: dict[str, str]) -> None:
    """Build (or find in Triton's cache) the launcher of kernels with ``signature`` (each
    argument's name and Triton type, in order) before any of them is compiled: Triton
    3.6's ``make_launcher`` writes the launcher's C source from the signature alone (its
    constants and the metadata's scratch sizes are not in it)."""
    from types import SimpleNamespace

    from triton.runtime import driver

    src = SimpleNamespace(
        constants={}, signature=dict(signature), fn=SimpleNamespace(arg_names=list(signature))
    )
    driver.active.launcher_cls(src, SimpleNamespace(**_SCRATCH_FREE))


def _signature_of(compiled: Any) -> tuple[str, ...] | None:
    """The argument types a compiled kernel's launcher is built from (None if unknown)."""
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    return tuple(signature.values()) if isinstance(signature, dict) else None


def wait_for(future: Future[Any], deadline: float, why: Callable[[], str]) -> Any:
    """``future``'s result, waiting until ``deadline`` at most (``time.perf_counter()``);
    NotReady, saying ``why()``, past it."""
    if math.isinf(deadline):
        return future.result()
    try:
        return future.result(timeout=max(0.0, deadline - time.perf_counter()))
    except FutureTimeout:  # TimeoutError itself from Python 3.11 on, not in 3.10
        raise NotReady(why(), backend="triton") from None


class Compiler:
    """Compiles launch plans in a thread pool; one future per (specialisation, device).

    ``compile`` and ``launcher``: the functions that compile a plan and build a compiled
    kernel's launcher (:func:`compile_plan`, :func:`build_launcher`; ``launcher=None``
    builds none; ``prebuild``: the function that builds one from a signature, default
    :func:`build_launcher_for` with Triton's own compile and launcher, else none).
    Futures are kept for the most recent ``keep`` specialisations only: a
    runner keeps its own compiled kernel. ``compiles`` and ``launchers`` count the
    compiles submitted and the launchers built (``launcher_error``: why the last build that
    failed did), for tests and benchmarks.
    """

    def __init__(
        self,
        threads: int,
        keep: int = 512,
        *,
        compile: Callable[[LaunchPlan, Any], Any] = compile_plan,
        launcher: Callable[[Any], None] | None = build_launcher,
        prebuild: Callable[[dict[str, str]], None] | None = None,
        processes: int = 0,
    ) -> None:
        self.threads = max(1, threads)
        # Processes serve Triton's own compile only (a test's compile function runs here).
        self._workers = Workers(processes, cache_dir()) if processes > 0 and compile is compile_plan else None
        self._pool = ThreadPoolExecutor(
            max_workers=self.threads, thread_name_prefix="unimatmul-triton-compile"
        )
        self._compile = compile
        self._launcher = launcher
        default = compile is compile_plan and launcher is build_launcher
        self._prebuild = prebuild if prebuild is not None else (build_launcher_for if default else None)
        self._futures: OrderedDict[tuple[Any, ...], Future[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._launcher_locks: dict[tuple[str, ...], threading.Lock] = {}
        # Each launcher key built, with the argument types it was built from.
        self._launchers_built: dict[tuple[str, ...], tuple[str, ...] | None] = {}
        self._prebuilds: set[tuple[str, ...]] = set()
        self._keep = keep
        self.compiles = 0
        self.launchers = 0
        self.launcher_error: str | None = None  # the last launcher build's error, if one failed
        self._closed = False
        atexit.register(self.shutdown)

    def submit(self, plan: LaunchPlan, device_index: int, gpu_target: Any) -> Future[Any]:
        """The future of ``plan``'s compiled kernel: started now unless one with its key is
        known (its launcher is built ahead, beside it)."""
        self.prebuild_launcher(plan.launcher_key(), plan.signature())
        return self._submit_plan(plan, device_index, gpu_target)

    def _submit_plan(self, plan: LaunchPlan, device_index: int, gpu_target: Any) -> Future[Any]:
        return self._submit((*plan.key(), device_index), self._work, plan, gpu_target)

    def _submit(self, key: tuple[Any, ...], fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """The future kept for ``key``, or ``fn(*args)`` started in the pool under it."""
        with self._lock:
            found = self._futures.get(key)
            if found is None:
                found = self._futures[key] = self._pool.submit(fn, *args)
                self.compiles += 1
                while len(self._futures) > self._keep:
                    self._futures.popitem(last=False)
            else:
                self._futures.move_to_end(key)
        return found

    def submit_job(
        self, key: tuple[Any, ...], work: Callable[[], Any], launcher_key: tuple[str, ...] | None = None
    ) -> Future[Any]:
        """The future of ``work()`` (a compile of another kind, such as a JIT kernel's
        warm-up, returning its CompiledKernel), started now unless a job with ``key`` is
        known; its launcher is built after it, once per ``launcher_key``."""
        return self._submit(key, self._job, work, launcher_key)

    def _job(self, work: Callable[[], Any], launcher_key: tuple[str, ...] | None) -> Any:
        wait_warm()
        compiled = work()
        if self._launcher is not None and launcher_key is not None and compiled is not None:
            self._build_launcher(launcher_key, compiled)
        return compiled

    def submit_all(self, plans: list[LaunchPlan], device_index: int, gpu_target: Any) -> list[Future[Any]]:
        """:meth:`submit` each plan (those already known are not compiled again), their
        launchers' builds ahead of their compiles in the pool's queue."""
        for plan in plans:
            self.prebuild_launcher(plan.launcher_key(), plan.signature())
        return [self._submit_plan(plan, device_index, gpu_target) for plan in plans]

    def prebuild_launcher(self, key: tuple[str, ...], signature: dict[str, str]) -> Future[None] | None:
        """Start building the launcher of ``key`` from ``signature`` in the pool, unless it
        is built or being built (nothing without a ``prebuild`` function): the build's
        future, or None where none was started."""
        if self._prebuild is None or self._closed:
            return None
        with self._lock:
            if self._has_launcher(key):
                return None
            self._prebuilds.add(key)
        try:
            return self._pool.submit(self._prebuilt, key, dict(signature))
        except RuntimeError:  # the pool was shut down meanwhile
            return None

    def has_launcher(self, key: tuple[str, ...]) -> bool:
        """Whether the launcher of ``key`` is built or being built ahead (a caller whose
        signature costs work to make need not make it)."""
        with self._lock:
            return self._has_launcher(key)

    def _has_launcher(self, key: tuple[str, ...]) -> bool:
        return key in self._launchers_built or key in self._prebuilds

    def _prebuilt(self, key: tuple[str, ...], signature: dict[str, str]) -> None:
        assert self._prebuild is not None
        wait_warm()
        self._build_once(key, tuple(signature.values()), functools.partial(self._prebuild, signature))

    def known(self, plan: LaunchPlan, device_index: int) -> bool:
        """Whether ``plan``'s specialisation was submitted (and is still kept) for the device."""
        with self._lock:
            return (*plan.key(), device_index) in self._futures

    def get(self, plan: LaunchPlan, device_index: int, gpu_target: Any, deadline: float = math.inf) -> Any:
        """``plan``'s compiled kernel (waiting for its compile); CompileFailed when it did
        not compile, NotReady when it is not compiled by ``deadline`` (a
        ``time.perf_counter()`` time: the problem's tuning cap)."""
        future = self.submit(plan, device_index, gpu_target)
        return wait_for(
            future, deadline, lambda: f"{describe(plan)} was not compiled by the problem's tuning cap"
        )

    @property
    def processes(self) -> int:
        """Compile processes started so far (0 without them)."""
        return 0 if self._workers is None else self._workers.started

    def shutdown(self) -> None:
        """Drop what has not started, stop the compile processes, and let a compile whose
        process is stopped end at once: the threads a process's exit waits for are then
        only those compiling in this process (the end of ``unimatmul tune``, whose work
        compiled ahead is no longer wanted)."""
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._workers is not None:
            self._workers.shutdown()

    def _shut(self, plan: LaunchPlan) -> CompileFailed:
        return CompileFailed(f"{describe(plan)}: not compiled, the compiler was shut down", backend="triton")

    def _work(self, plan: LaunchPlan, gpu_target: Any) -> Any:
        if self._closed:
            raise self._shut(plan)
        if self._workers is not None:
            try:
                ok, error = self._workers.compile(plan, gpu_target)
            except WorkerLost:
                if self._closed:
                    raise self._shut(plan) from None
                ok, error = True, ""  # the compile below is the one that counts
            if not ok:
                msg = f"{describe(plan)} did not compile for {gpu_target}: {error}"
                raise CompileFailed(msg, backend="triton")
        # After a process's compile (that does not need this process's warmth); the
        # compile itself, with its explicit target, does not need the driver's helpers.
        wait_warm(driver=False)
        try:
            compiled = self._compile(plan, gpu_target)
        except Exception as exc:
            msg = f"{describe(plan)} did not compile for {gpu_target}: {reason(exc)}"
            raise CompileFailed(msg, backend="triton") from exc
        if self._launcher is not None:
            wait_warm()
            self._build_launcher(plan.launcher_key(), compiled)
        return compiled

    def _build_launcher(self, key: tuple[str, ...], compiled: Any) -> None:
        """One build per argument list in this process; the other kernels of that list wait
        for it, then find it in Triton's cache when they are loaded. A launcher built ahead
        from other argument types than ``compiled``'s is built again."""
        assert self._launcher is not None
        launcher = self._launcher
        self._build_once(key, _signature_of(compiled), lambda: launcher(compiled))

    def _build_once(
        self, key: tuple[str, ...], types: tuple[str, ...] | None, build: Callable[[], None]
    ) -> None:
        with self._lock:
            lock = self._launcher_locks.setdefault(key, threading.Lock())
        with lock:
            if key in self._launchers_built and types in (None, self._launchers_built[key]):
                return
            try:
                build()
            except Exception as exc:
                # Not this kernel's failure: its load in prepare() builds the launcher
                # again and reports what goes wrong there, for that candidate.
                self.launcher_error = f"{type(exc).__name__}: {exc}"
                return
            self._launchers_built[key] = types
            self.launchers += 1
