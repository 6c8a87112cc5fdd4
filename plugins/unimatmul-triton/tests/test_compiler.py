"""Compiling ahead (``compiler.Compiler``): in parallel, once per specialisation, a failed
compile as that candidate's failure.

The CPU tests compile the real kernels with Triton's compiler for an explicit Hopper
target (Triton ships ptxas; no GPU is needed), in a fresh process without the
interpreter's variables. The GPU tests tune real products through the harness.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("triton")
torch = pytest.importorskip("torch")

from test_triton_backend import TARGET, compiled_in_a_fresh_process, gpu, problem_of  # noqa: E402
from unimatmul_triton import configs  # noqa: E402
from unimatmul_triton.compiler import Compiler, compile_plan, reason  # noqa: E402
from unimatmul_triton.launch import LaunchPlan, plan_for  # noqa: E402

from unimatmul import Problem  # noqa: E402

# A fresh process's preamble: an empty Triton cache, a Hopper target, a problem and three tile configs, the first
# two with one argument list (one launcher), the third split-K (workspace pointers: another).
PREAMBLE = """
import json, os, tempfile, threading, time
cache = tempfile.TemporaryDirectory()  # real compiles, not reads of an earlier run's
os.environ["TRITON_CACHE_DIR"] = cache.name
from triton.backends.compiler import GPUTarget
from unimatmul import Problem, UnsupportedProblem
from unimatmul_triton.compiler import CompileFailed, Compiler, compile_plan
from unimatmul_triton.configs import TILE, KernelConfig
from unimatmul_triton.launch import plan_for
hopper = GPUTarget("cuda", 90, 32)
def problem(m, n, k):
    return Problem(m=m, n=n, k=k, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16")
p, q = problem(64, 128, 256), problem(96, 256, 512)
small = KernelConfig(TILE, 64, 64, 32, 4, 3, group_m=8)
large = KernelConfig(TILE, 128, 64, 64, 8, 2, group_m=8)
split = KernelConfig(TILE, 64, 64, 32, 4, 3, split_k=2, group_m=8)
"""


def test_configs_compile_in_parallel_once_per_specialisation() -> None:
    script = (
        PREAMBLE
        + """
spans = []
def timed(plan, target):
    start = time.perf_counter()
    compiled = compile_plan(plan, target)
    spans.append((plan.constexprs()["BLOCK_M"], plan.constexprs()["SPLIT_K"], threading.current_thread().name,
                  start, time.perf_counter()))
    return compiled
launched = []
compiler = Compiler(2, compile=timed, launcher=lambda compiled: launched.append(compiled.name))
plans = [plan_for(p, small), plan_for(p, large), plan_for(q, small), plan_for(p, split)]
futures = compiler.submit_all(plans, 0, hopper)
kernels = [f.result() for f in futures]
print(json.dumps([
    compiler.compiles, compiler.launchers, len(launched), futures[0] is futures[2],
    [[k.metadata.num_warps, k.metadata.target.arch, len(k.asm["cubin"]) > 0] for k in kernels],
    sorted(spans),
]))
"""
    )
    compiles, launchers, launched, shared, kernels, spans = compiled_in_a_fresh_process(script)
    # Four plans, three specialisations: q's small tile is p's binary.
    assert compiles == 3 and shared
    assert len(spans) == 3
    # Each compiled for Hopper with its own warps, into a cubin.
    assert [k[0] for k in kernels] == [4, 8, 4, 4]
    assert all(arch == 90 and has_cubin for _, arch, has_cubin in kernels)
    # Two workers, the first two compiles at once (each started before the other ended).
    first, second = sorted(spans, key=lambda s: s[3])[:2]
    assert first[2] != second[2]
    assert second[3] < first[4] and first[3] < second[4]
    # One launcher per argument list: the two unsplit tiles share one, the split one has its own.
    assert launchers == launched == 2


def test_a_config_that_does_not_compile_fails_alone() -> None:
    """A compile error is that plan's CompileFailed (an UnsupportedProblem naming the kernel
    and Triton's own reason), kept for its specialisation; other plans compile."""
    script = (
        PREAMBLE
        + """
compiler = Compiler(2, launcher=None)
broken = plan_for(p, KernelConfig(TILE, 16, 16, 8, 4, 2))  # tl.dot needs K >= 16
out = []
for plan in (broken, plan_for(p, small), broken):
    try:
        out.append(["compiled", compiler.get(plan, 0, hopper).metadata.num_warps])
    except CompileFailed as exc:
        out.append(["failed", str(exc), isinstance(exc, UnsupportedProblem), exc.backend])
out.append(compiler.compiles)
print(json.dumps(out))
"""
    )
    failed, compiled, again, compiles = compiled_in_a_fresh_process(script)
    assert failed[0] == "failed" and failed[2] and failed[3] == "triton"
    assert "the tile kernel (blocks 16x16x8, split 1, 4 warps, 2 stages) did not compile" in failed[1]
    assert "K >= 16" in failed[1]  # Triton's reason, not its source excerpt
    assert compiled == ["compiled", 4]
    assert again == failed and compiles == 2  # not compiled a second time


def test_compile_processes_fill_the_cache_and_this_process_only_reads_it() -> None:
    """With compile processes, each plan is compiled in a process of its own and this
    process's compile of it is a read of Triton's cache: its front end (``make_ir``, run
    only by a real compile) never runs here; each binary is Hopper's, with its own warps.
    A plan that does not compile fails with Triton's reason as it does without them, and a
    shut-down pool leaves no process behind."""
    script = (
        PREAMBLE
        + """
from triton.compiler import ASTSource
made_here = []
real_make_ir = ASTSource.make_ir
def counted(self, *args, **kwargs):
    made_here.append(self.fn.__name__)
    return real_make_ir(self, *args, **kwargs)
ASTSource.make_ir = counted
compiler = Compiler(2, launcher=None, processes=2)
broken = plan_for(p, KernelConfig(TILE, 16, 16, 8, 4, 2))  # tl.dot needs K >= 16
plans = [plan_for(p, small), plan_for(p, large), plan_for(p, split)]
kernels = [f.result() for f in compiler.submit_all(plans, 0, hopper)]
try:
    compiler.get(broken, 0, hopper)
    failed = ""
except CompileFailed as exc:
    failed = str(exc)
workers = [w.proc for w in compiler._workers._all]
started = compiler.processes
compiler.shutdown()
print(json.dumps([
    made_here, started, [[k.metadata.num_warps, k.metadata.target.arch] for k in kernels], failed,
    [proc.poll() is not None for proc in workers],
]))
"""
    )
    made_here, started, kernels, failed, stopped = compiled_in_a_fresh_process(script)
    assert made_here == []  # every compile here found its binary in the cache
    assert started == 2
    assert kernels == [[4, 90], [8, 90], [4, 90]]
    assert "the tile kernel (blocks 16x16x8, split 1, 4 warps, 2 stages) did not compile" in failed
    assert "K >= 16" in failed
    assert stopped == [True, True]


def test_a_lost_compile_process_costs_time_not_the_kernel() -> None:
    """A compile process that cannot answer (its reply pipe is gone): it is stopped, the
    plan is compiled here instead, and the next plan gets a new process."""
    script = (
        PREAMBLE
        + """
compiler = Compiler(1, launcher=None, processes=1)
first = compiler.get(plan_for(p, small), 0, hopper)
worker = compiler._workers._all[0].proc
worker.stdout.close()  # its replies are lost: the next compile cannot hear back from it
second = compiler.get(plan_for(p, large), 0, hopper)
lost = [worker.poll() is not None, compiler.processes]
third = compiler.get(plan_for(p, split), 0, hopper)
started = compiler.processes
compiler.shutdown()
print(json.dumps([[k.metadata.num_warps for k in (first, second, third)], lost, started]))
"""
    )
    warps, lost, started = compiled_in_a_fresh_process(script)
    assert warps == [4, 8, 4]  # the second compiled here, after its process was lost
    assert lost == [True, 1]
    assert started == 2  # the third in a new process


def test_a_compile_error_reads_as_its_innermost_cause() -> None:
    try:
        try:
            raise AssertionError("num_warps must be a power of 2\nmore detail")
        except AssertionError as inner:
            raise RuntimeError("at 1:2:\ndef kernel():\n    ^") from inner
    except RuntimeError as exc:
        assert reason(exc) == "AssertionError: num_warps must be a power of 2"


def test_other_jobs_run_once_per_key_with_one_launcher_per_argument_list() -> None:
    """``submit_job``: a compile of another kind (the grouped kernel's JIT warm-up) runs in
    the pool once per key; its launcher is built after it, once per launcher key."""
    import threading

    started = threading.Barrier(2, timeout=10)
    launched: list[str] = []
    compiler = Compiler(2, launcher=launched.append)

    def job(name: str) -> Any:
        def work() -> str:
            started.wait()  # both jobs at once, or this times out
            return name

        return work

    first = compiler.submit_job(("rows", 1), job("first"), ("ptr", "i32"))
    second = compiler.submit_job(("rows", 2), job("second"), ("ptr", "i32"))
    again = compiler.submit_job(("rows", 1), job("never"), ("ptr", "i32"))
    assert again is first
    assert (first.result(), second.result()) == ("first", "second")
    assert compiler.compiles == 2
    assert launched in (["first"], ["second"]) and compiler.launchers == 1
    compiler.shutdown()


def test_a_launcher_is_built_ahead_from_its_signature_and_again_only_for_other_types() -> None:
    """``prebuild_launcher`` builds a launcher key's launcher from a signature before any
    kernel compiles; a compiled kernel of those argument types builds nothing more, one of
    other types (a guess that was wrong) builds its own after its compile."""
    from types import SimpleNamespace

    built: list[tuple[str, Any]] = []
    compiler = Compiler(
        2,
        launcher=lambda compiled: built.append(("after", compiled.name)),
        prebuild=lambda signature: built.append(("ahead", list(signature.values()))),
    )

    def kernel(name: str, **signature: str) -> Any:
        return lambda: SimpleNamespace(name=name, src=SimpleNamespace(signature=signature))

    ahead = compiler.prebuild_launcher(("rows",), {"a": "*bf16", "n": "i32"})
    assert ahead is not None
    ahead.result(timeout=10)
    assert compiler.prebuild_launcher(("rows",), {"a": "*bf16", "n": "i32"}) is None  # built: not again
    compiler.submit_job(("rows", 1), kernel("same", a="*bf16", n="i32"), ("rows",)).result(timeout=10)
    compiler.submit_job(("rows", 2), kernel("wider", a="*bf16", n="i64"), ("rows",)).result(timeout=10)
    assert built == [("ahead", ["*bf16", "i32"]), ("after", "wider")]
    assert compiler.launchers == 2
    compiler.shutdown()
    assert compiler.prebuild_launcher(("tile",), {"a": "*bf16"}) is None  # shut down: nothing starts


def test_a_plans_signature_is_the_one_its_compiled_kernel_has() -> None:
    """The dense plans' launchers are built ahead from ``plan.signature()``: Triton's
    compiled kernel must carry the same argument types, or every launcher is built twice."""
    script = (
        PREAMBLE
        + """
plans = [plan_for(p, small), plan_for(p, split)]
print(json.dumps([[list(plan.signature().values()), list(compile_plan(plan, hopper).src.signature.values())]
                  for plan in plans]))
"""
    )
    for predicted, compiled in compiled_in_a_fresh_process(script):
        assert predicted == compiled


def test_the_grouped_rows_kernels_signature_follows_the_jits_rules() -> None:
    """The rows kernel's signature as the JIT would give it, for the launcher built ahead:
    pointers by dtype, ints by width, 1 compiled in except where the kernel says not to
    specialise (M and SLOTS), the constexpr arguments last."""
    script = """
import json, torch
from unimatmul_triton import grouped_kernels
from unimatmul_triton.grouped import jit_signature
bf = torch.bfloat16
args = (bf, bf, bf, torch.int32, 8, 1, 28672, 4096, 4096, 1, 2**33, 1, 4096, 28672, 1, 1)
print(json.dumps([jit_signature(grouped_kernels.grouped_rows_kernel, args)]))
"""
    (signature,) = compiled_in_a_fresh_process(script)
    assert signature == {
        **{"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "offs_ptr": "*i32"},
        **{"G": "i32", "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32", "stride_ak": "constexpr"},
        **{"stride_bg": "i64", "stride_bk": "constexpr", "stride_bn": "i32", "stride_cm": "i32"},
        **{"stride_cn": "constexpr", "SLOTS": "i32"},
        **{"G_POW2": "constexpr", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"},
    }


class _Source:
    """A kernel stand-in whose source hash is read through the property Triton's JIT has;
    ``gate`` holds the read until it is set."""

    def __init__(self, gate: Any = None) -> None:
        self.reads = 0
        self.gate = gate

    @property
    def cache_key(self) -> str:
        if self.gate is not None:
            assert self.gate.wait(10)
        self.reads += 1
        return "hash"


@pytest.fixture
def warming(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The compiler module with no warming started yet in this process (and Triton's own
    key function back in place after)."""
    from triton.runtime import cache
    from unimatmul_triton import compiler, triton_key

    monkeypatch.setattr(compiler, "_warm_threads", [])
    monkeypatch.setattr(compiler, "warm_errors", [])
    monkeypatch.setattr(triton_key, "_installed", [])
    monkeypatch.setattr(cache, "triton_key", cache.triton_key)
    yield compiler
    compiler.wait_warm()


def test_warming_computes_tritons_key_and_the_source_hashes_once_per_process(warming: Any) -> None:
    """The first compile's once-per-process work runs in the background, once: Triton's
    key (Triton's value, kept in a file for later processes, cached after), each kernel's
    source hash; a step that cannot run here (the driver, without a GPU) is recorded, not
    raised."""
    from triton.runtime import cache

    original = cache.triton_key
    kernel = _Source()
    warming.start_warming(lambda: [kernel])
    warming.start_warming(lambda: [kernel])  # a second start: nothing more
    assert len(warming._warm_threads) == 2
    warming.wait_warm()
    assert cache.triton_key is not original
    assert cache.triton_key.cache_info().currsize == 1
    assert cache.triton_key() == original()
    assert kernel.reads == 1
    assert all(error.startswith("_driver_helpers: ") for error in warming.warm_errors)


def test_a_plan_compiles_before_the_drivers_helpers_but_its_launcher_waits(
    warming: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan's compile (an explicit target, no driver) waits for Triton's key only, not
    for the driver's helpers (a C compile where Triton's cache is empty); its launcher's
    build, which needs the driver, waits for them."""
    import threading

    from unimatmul_triton.configs import TILE, KernelConfig

    gate = threading.Event()
    monkeypatch.setattr(warming, "_driver_helpers", lambda: gate.wait(10) or None)
    compiled = threading.Event()
    launched: list[str] = []

    def compile(plan: Any, target: Any) -> str:
        compiled.set()
        return "kernel"

    warming.start_warming(lambda: [_Source()])
    compiler = Compiler(1, compile=compile, launcher=launched.append)
    problem = Problem(m=64, n=128, k=256, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16")
    future = compiler.submit(plan_for(problem, KernelConfig(TILE, 64, 64, 32, 4, 3)), 0, "sm90")
    assert compiled.wait(10)  # compiled while the driver's helpers still warm
    assert not future.done() and launched == []  # the launcher waits for them
    gate.set()
    assert future.result(timeout=10) == "kernel" and launched == ["kernel"]
    compiler.shutdown()


def test_compile_jobs_wait_for_warming(warming: Any) -> None:
    """A compile job does not start its compile before warming ends (it would redo the
    same work beside it)."""
    import threading

    gate = threading.Event()
    warming.start_warming(lambda: [_Source(gate)])
    ran: list[str] = []
    compiler = Compiler(1, launcher=None)
    future = compiler.submit_job(("rows", 1), lambda: ran.append("compiled") or "kernel")
    assert not gate.wait(0.3)  # the job had time to start and must be waiting
    assert ran == [] and not future.done()
    gate.set()
    assert future.result(timeout=10) == "kernel" and ran == ["compiled"]
    compiler.shutdown()


def test_the_backend_checks_itself_in_the_background_only_where_torch_sees_a_gpu() -> None:
    """At registration the backend checks its availability (and so starts warming) in a
    thread of its own where torch sees a GPU; without one it does nothing (no Triton
    import for it)."""
    import threading

    from unimatmul_triton.backend import TritonBackend

    backend = TritonBackend()
    backend.check_soon()
    for thread in threading.enumerate():
        if thread.name == "unimatmul-triton-check":
            thread.join(60)
    assert backend._checked == torch.cuda.is_available()


# --- GPU only --------------------------------------------------------------------------


def _triton_backend(selector: Any) -> Any:
    found = selector.plugins.backends().get("triton")
    if found is None or found.availability() is not None:
        pytest.skip("the triton entry point is not installed or not available")
    return found


def _plans(backend: Any, problem: Problem) -> list[LaunchPlan]:
    """The plans of the configs the backend offers for ``problem``."""
    count = configs.offered(problem, backend.candidate_count)
    return [plan_for(problem, est.config) for est in backend.ranked(problem, TARGET, count)]


def _keys(backend: Any, problem: Problem) -> set[tuple[Any, ...]]:
    """The specialisations of the configs the backend offers for ``problem``."""
    return {plan.key() for plan in _plans(backend, problem)}


@gpu
def test_a_usable_backend_warms_triton_in_the_background(tmp_path: Any) -> None:
    """On a GPU, the backend's availability starts the warming; it does all its steps."""
    from triton.runtime.cache import triton_key
    from unimatmul_triton import compiler

    from unimatmul.testing import isolated_selector

    with isolated_selector(tmp_path / "cache.msgpack") as selector:
        _triton_backend(selector)
    assert compiler._warm_threads
    compiler.wait_warm()
    assert compiler.warm_errors == []
    assert triton_key.cache_info().currsize == 1


@gpu
def test_a_second_product_of_one_specialisation_compiles_nothing(tmp_path: Any) -> None:
    """Two products whose offered configs share their specialisations (m = 1, sizes
    multiples of 16): tuning the second submits no compile and builds no launcher, and
    its Triton candidates are measured and checked all the same."""
    from unimatmul.cache.record import OK, PRUNED
    from unimatmul.testing import isolated_selector

    first, second = problem_of(1, 6144, 1024), problem_of(1, 6144, 2048)
    with isolated_selector(tmp_path / "cache.msgpack") as selector:
        backend = _triton_backend(selector)
        backend.close()  # a new Compiler: its counts start at 0
        selector.tune(first, TARGET, force=True)
        compiler = backend.compiler
        assert compiler.compiles == len(_keys(backend, first))
        # Every launcher of the first product's argument lists built in the pool, none twice.
        launcher_keys = {plan.launcher_key() for plan in _plans(backend, first)}
        assert compiler.launchers == len(launcher_keys), compiler.launcher_error
        compiles, launchers = compiler.compiles, compiler.launchers
        record = selector.tune(second, TARGET, force=True)
        new = _keys(backend, second) - _keys(backend, first)
        assert compiler.compiles - compiles == len(new)
        if not new:
            assert compiler.launchers == launchers
    triton_results = [r for r in record.results if r.identity.startswith("triton/")]
    assert triton_results
    assert all(r.status in (OK, PRUNED) for r in triton_results), triton_results


@gpu
def test_a_failed_compile_is_a_failed_candidate_not_a_failed_tuning(tmp_path: Any) -> None:
    """One offered config's compile raises: that candidate is recorded failed (naming the
    compile), the others are measured, and the product gets a winner."""
    from unimatmul.cache.record import FAILED, OK, PRUNED
    from unimatmul.testing import isolated_selector

    problem = problem_of(16, 1024, 1024, linear=True)
    with isolated_selector(tmp_path / "cache.msgpack") as selector:
        backend = _triton_backend(selector)
        count = configs.offered(problem, backend.candidate_count)
        broken = backend.ranked(problem, TARGET, count)[0].config
        broken_key = plan_for(problem, broken).key()

        def compile_or_fail(plan: LaunchPlan, target: Any) -> Any:
            if plan.key() == broken_key:
                raise RuntimeError("injected: this config's compile fails")
            return compile_plan(plan, target)

        backend.close()
        backend._compiler = Compiler(2, compile=compile_or_fail)
        try:
            record = selector.tune(problem, TARGET, force=True)
        finally:
            backend.close()
    by_identity = {r.identity: r for r in record.results}
    failed = by_identity[broken.candidate.identity]
    assert failed.status == FAILED and "could not compile" in failed.note and "injected" in failed.note
    others = [r for i, r in by_identity.items() if i.startswith("triton/") and i != broken.candidate.identity]
    assert others and all(r.status in (OK, PRUNED) for r in others), others
    assert record.winner != broken.candidate.identity


def test_a_compile_not_done_by_the_deadline_is_not_ready() -> None:
    """``get`` with a deadline (the problem's tuning cap, from ``prepare_deadline()``):
    a compile still running then is NotReady (its candidate is left out as capped), and the
    compile goes on, so a later ``get`` without one has it."""
    import threading
    import time

    from unimatmul_triton.configs import TILE, KernelConfig

    from unimatmul.backend import NotReady

    release = threading.Event()

    def slow(plan: LaunchPlan, target: Any) -> Any:
        assert release.wait(10)
        return plan

    compiler = Compiler(1, compile=slow, launcher=None)
    problem = Problem(m=64, n=128, k=256, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16")
    plan = plan_for(problem, KernelConfig(TILE, 64, 64, 32, 4, 3, group_m=8))
    with pytest.raises(NotReady, match=r"tile kernel .* was not compiled by the problem.s tuning cap"):
        compiler.get(plan, 0, TARGET, deadline=time.perf_counter() + 0.1)
    release.set()
    assert compiler.get(plan, 0, TARGET) is plan
    assert compiler.compiles == 1
    compiler.shutdown()


def test_a_shut_down_compiler_drops_what_has_not_started_and_compiles_nothing_more() -> None:
    """``shutdown`` (the end of ``unimatmul tune``: ``Backend.ahead_over``): compiles not
    begun are cancelled, the one in flight ends, and nothing compiles after it, so a
    process's exit waits for the one in flight only."""
    import threading

    from unimatmul_triton.compiler import CompileFailed
    from unimatmul_triton.configs import TILE, KernelConfig

    release, begun = threading.Event(), threading.Event()
    compiled: list[int] = []

    def slow(plan: LaunchPlan, target: Any) -> Any:
        begun.set()
        assert release.wait(10)
        compiled.append(plan.constexprs()["BLOCK_M"])
        return plan

    compiler = Compiler(1, compile=slow, launcher=None)
    problem = Problem(m=64, n=128, k=256, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16")
    plans = [plan_for(problem, KernelConfig(TILE, bm, 64, 32, 4, 3, group_m=8)) for bm in (16, 32, 64)]
    futures = compiler.submit_all(plans, 0, TARGET)
    assert begun.wait(10)
    compiler.shutdown()
    release.set()
    assert futures[0].result(10) is plans[0]  # the one in flight finished
    assert [f.cancelled() for f in futures[1:]] == [True, True]
    with pytest.raises(CompileFailed, match="shut down"):
        compiler._work(plans[1], TARGET)
    assert compiled == [16]
