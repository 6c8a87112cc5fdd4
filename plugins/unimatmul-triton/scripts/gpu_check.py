"""The Triton plugin on a GPU, in one call: benchmark, tuning cost, host time, tests, conformance.

    OUT=/some/dir python plugins/unimatmul-triton/scripts/gpu_check.py [--budget-s 420]

Parts, in order of value, each skipped cleanly when the time budget is near its end
(every part writes its results at once, so a run cut short still leaves them):

1. decode: m in {1, 4, 8, 16} x nn.Linear weights of Llama-3-8B / Qwen2-7B, bf16,
   ``x @ W.T``. For each product, the plugin's candidates (what ``candidates()`` offers)
   are measured and the best is compared with ``torch.matmul`` in interleaved CUDA-graph
   replays (20 back-to-back calls per replay, inputs rotated through > 3x L2, median):
   microseconds, effective TB/s (bytes of A, W and C / time), speedup. Also which rank
   the analytic model gave the winner (for calibrating it).
2. tuning: ``unimatmul.matmul`` in tune mode with Triton in the pool (cuBLASLt too),
   in child processes with ``UNIMATMUL_CACHE`` in a temp dir: first-time (an empty
   Triton cache: ``TRITON_CACHE_DIR`` fresh) and warm (the same Triton cache, a new
   process, a new unimatmul cache): seconds per shape, the winner, its speedup over
   Default (general shapes too: the suite geomean with Triton in the pool).
3. host time per call of a prepared Triton runner vs ``torch.mm`` (and the routed call).
4. the plugin's tests on the GPU (pytest).
5. the conformance suite for ``triton`` on cuda:0: quick, then full if time is left.

Writes ``gpu-check.json`` and ``gpu-check.md`` under $OUT (default ./gpu-check-out) and
the conformance reports beside them (7 files with gpu_check.sh's logs: at most 8 come
back from the device), and prints a short summary table last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PLUGIN = HERE.parent
REPO = PLUGIN.parent.parent

WEIGHTS = [  # (n, k) of nn.Linear weights [n, k]: Llama-3-8B, Qwen2-7B
    (4096, 4096),
    (14336, 4096),
    (4096, 14336),
    (6144, 4096),
    (4608, 3584),
    (18944, 3584),
    (3584, 18944),
    (128256, 4096),
]
DECODE_M = (1, 4, 8, 16)
TUNE_DECODE = [(1, 4096, 4096), (16, 4096, 4096), (1, 14336, 4096), (8, 4608, 3584), (1, 128256, 4096)]
TUNE_GENERAL = [
    (1000, 1000, 1000),
    (2048, 2048, 512),
    (16384, 4096, 128),
    (4096, 4096, 4096),
    (1024, 1025, 1024),
]
L2_BYTES = 60 << 20
CALLS = 20


class Budget:
    def __init__(self, seconds: float) -> None:
        self.start = time.perf_counter()
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def note(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.start:6.1f}s] {text}", flush=True)


class Results:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.data: dict[str, Any] = {"parts": {}}

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "gpu-check.json").write_text(json.dumps(self.data, indent=1, default=str))
        (self.out / "gpu-check.md").write_text(markdown(self.data))


# --- timing -------------------------------------------------------------------------------


def graph_of(torch: Any, calls: list[Any]) -> Any:
    """A CUDA graph of CALLS back-to-back calls cycling through ``calls`` (warmed up first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            calls[i % len(calls)]()
    torch.cuda.synchronize()
    return graph


def replay_s(torch: Any, graph: Any) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / CALLS


def interleaved(torch: Any, graphs: dict[str, Any], replays: int) -> dict[str, float]:
    """Median seconds per call of each graph, replays taken in turns."""
    times: dict[str, list[float]] = {name: [] for name in graphs}
    for graph in graphs.values():
        graph.replay()
    torch.cuda.synchronize()
    for _ in range(replays):
        for name, graph in graphs.items():
            times[name].append(replay_s(torch, graph))
    return {name: statistics.median(v) for name, v in times.items()}


# --- part 1: decode -------------------------------------------------------------------------


def _read_kernel() -> Any:
    """A kernel that only reads a weight (one fp32 partial sum per program): the time a
    GEMV cannot beat, since it must read every byte of the weight once."""
    import triton
    import triton.language as tl

    @triton.jit
    def read_kernel(w_ptr, out_ptr, numel, chunk, BLOCK: tl.constexpr):
        # Program p reads elements [p * chunk, (p + 1) * chunk) (chunk: a multiple of BLOCK).
        pid = tl.program_id(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(pid * chunk, tl.minimum(numel, pid * chunk + chunk), BLOCK):
            offs = start + tl.arange(0, BLOCK)
            acc += tl.load(w_ptr + offs, mask=offs < numel, other=0.0).to(tl.float32)
        tl.store(out_ptr + pid, tl.sum(acc, axis=0))

    return read_kernel


def read_graph(budget: Budget, torch: Any, weights: list[Any]) -> tuple[Any, str, list[Any]]:
    """The fastest of a few read-kernel configurations over the rotated ``weights`` (a CUDA
    graph of CALLS calls, as for the products), its description, and the buffers the graph
    writes (to be kept alive as long as the graph is replayed)."""
    kernel = _read_kernel()
    numel = weights[0].numel()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    graphs: dict[str, Any] = {}
    sinks: dict[str, Any] = {}
    for block in (4096, 16384):
        for warps in (4, 8):
            for grid in (2 * sms, 4 * sms, 8 * sms, -(-numel // block)):
                sink = torch.empty(grid, device="cuda", dtype=torch.float32)
                chunk = -(-numel // (grid * block)) * block
                calls = [
                    (
                        lambda w=w, g=grid, c=chunk, b=block, nw=warps, o=sink: kernel[(g,)](
                            w, o, numel, c, BLOCK=b, num_warps=nw
                        )
                    )
                    for w in weights
                ]
                calls[0]()
                total, expected = float(sink.double().sum()), float(weights[0].double().sum())
                if not abs(total - expected) <= 1e-3 * float(weights[0].double().abs().sum()):
                    raise RuntimeError(f"read kernel sum {total} != {expected} (block {block}, grid {grid})")
                name = f"block={block} warps={warps} grid={grid}"
                graphs[name] = graph_of(torch, calls)
                sinks[name] = sink  # a graph writes where it was captured: never freed before it
    measured = interleaved(torch, graphs, 3)
    best = min(measured, key=measured.__getitem__)
    budget.note(f"read roofline {tuple(weights[0].shape)}: {measured[best] * 1e6:.1f} us ({best})")
    return graphs[best], best, [sinks[best]]


def triton_part(results: Results, name: str, **info: Any) -> tuple[Any, Any, list[dict[str, Any]]] | None:
    """The plugin's backend, the cuda:0 target and the part's rows (recorded under ``name``
    with ``info``); None, with the reason recorded, where the backend is not available."""
    from unimatmul_triton import TritonBackend

    from unimatmul.backend import Device, Target, adapter_for_kind

    backend = TritonBackend()
    reason = backend.availability()
    if reason is not None:
        results.data["parts"][name] = {"skipped": reason}
        return None
    rows: list[dict[str, Any]] = []
    results.data["parts"][name] = {"rows": rows, **info}
    return backend, Target(adapter_for_kind("torch"), Device("cuda", 0)), rows


def rotated_sets(n: int, k: int) -> int:
    """Input sets to rotate through: as many bf16 [n, k] weights as fill > 3x L2 (at least 2)."""
    return max(2, math.ceil(3 * L2_BYTES / (n * k * 2)) + 1)


def part_decode(budget: Budget, results: Results, stop_at: float) -> None:
    import torch

    from unimatmul import Problem

    found = triton_part(results, "decode")
    if found is None:
        return
    backend, target, rows = found
    gen = torch.Generator(device="cuda").manual_seed(0)
    for n, k in WEIGHTS:
        sets = rotated_sets(n, k)
        weights = [torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(sets)]
        try:
            read, read_config, read_buffers = read_graph(budget, torch, weights)
        except Exception as exc:  # the roofline is a reference, not the benchmark
            read, read_config, read_buffers = None, f"{type(exc).__name__}: {exc}", []
            budget.note(f"read roofline {n}x{k}: {read_config}")
        for m in DECODE_M:
            if budget.left() < stop_at:
                budget.note(f"decode: time budget reached, skipping the rest (at {m}x{n}x{k})")
                results.data["parts"]["decode"]["cut_short"] = True
                return
            row: dict[str, Any] = {"shape": f"{m}x{n}x{k}", "m": m, "n": n, "k": k}
            rows.append(row)
            try:
                xs = [
                    torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(sets)
                ]
                outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
                problem = Problem(
                    m=m, n=n, k=k, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16", trans_b=True, ldb=k
                )
                t0 = time.perf_counter()
                offered = backend.candidates(problem, target)
                runners = [backend.prepare(problem, c, target) for c in offered]
                torch.cuda.synchronize()
                row["prepare_s"] = time.perf_counter() - t0
                ref = (xs[0].double() @ weights[0].double().t()).float()
                per_candidate: dict[str, float] = {}
                graphs = {}
                for runner in runners:
                    calls = [
                        (lambda r=runner, x=x, w=w, o=o: r(x, w.t(), o))
                        for x, w, o in zip(xs, weights, outs, strict=True)
                    ]
                    outs[0].fill_(float("nan"))
                    runner(xs[0], weights[0].t(), outs[0])
                    torch.cuda.synchronize()
                    err = float((outs[0].float() - ref).norm() / ref.norm())
                    if not err <= 3e-2:
                        per_candidate[runner.candidate.identity] = math.inf
                        row.setdefault("wrong", []).append(
                            f"{runner.candidate.identity}: rel error {err:.3g}"
                        )
                        continue
                    graphs[runner.candidate.identity] = graph_of(torch, calls)
                measured = interleaved(torch, graphs, 5)
                per_candidate.update(measured)
                best = min(measured, key=measured.__getitem__)
                torch_calls = [
                    (lambda x=x, w=w, o=o: torch.matmul(x, w.t(), out=o))
                    for x, w, o in zip(xs, weights, outs, strict=True)
                ]
                timed = {"torch": graph_of(torch, torch_calls), "triton": graphs[best]}
                if read is not None:
                    timed["read"] = read  # the roofline, in the same turns
                final = interleaved(torch, timed, 15)
                nbytes = (m * k + n * k + m * n) * 2
                if read is not None:
                    # bound: the speedup over torch of a GEMV that took no longer than
                    # reading its weight (the weight's bytes over the read's time).
                    row.update(
                        read_us=final["read"] * 1e6,
                        read_tbs=n * k * 2 / final["read"] / 1e12,
                        bound=final["torch"] / final["read"],
                        read_config=read_config,
                    )
                row.update(
                    torch_us=final["torch"] * 1e6,
                    triton_us=final["triton"] * 1e6,
                    torch_tbs=nbytes / final["torch"] / 1e12,
                    triton_tbs=nbytes / final["triton"] / 1e12,
                    speedup=final["torch"] / final["triton"],
                    best=best,
                    model_rank=[c.identity for c in offered].index(best) + 1,
                    candidates_us={key: v * 1e6 for key, v in per_candidate.items()},
                )
                budget.note(
                    f"decode {row['shape']:>16}: torch {row['torch_us']:7.1f} us ({row['torch_tbs']:.2f} TB/s), "
                    f"triton {row['triton_us']:7.1f} us ({row['triton_tbs']:.2f} TB/s), {row['speedup']:.2f}x  {best}"
                )
                del graphs, runners
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"
                budget.note(f"decode {row['shape']}: {row['error']}")
                traceback.print_exc()
            results.save()
        del weights, read, read_buffers
        torch.cuda.empty_cache()
    speedups = [r["speedup"] for r in rows if "speedup" in r]
    bounds = [r["bound"] for r in rows if "bound" in r]
    if bounds:
        results.data["parts"]["decode"]["median_bound"] = statistics.median(bounds)
    if speedups:
        results.data["parts"]["decode"]["median_speedup"] = statistics.median(speedups)
        results.data["parts"]["decode"]["min_triton_tbs"] = min(
            r["triton_tbs"] for r in rows if "triton_tbs" in r
        )


# --- part 1b: sweep (every config of the decode families, for calibrating the model) -----------

SWEEP = [(1, 4096, 4096), (16, 4096, 4096), (1, 4608, 3584), (8, 4608, 3584)]
SWEEP_MAX_SPLIT = 4
SWEEP_STAGES = {"gemv": (1, 3), "skinny": (3, 4)}
# GEMV tiles beyond the space (block_k 1024, 2048): the weight-read kernel's fastest
# configurations load 16-32 KB a program per iteration.
SWEEP_EXTRA_GEMV = [
    (bn, bk, warps, stages, split)
    for bn in (8, 16, 32)
    for bk in (1024, 2048)
    for warps in (4, 8)
    for stages in (1, 3)
    for split in (1, 2, 4)
]


def part_sweep(budget: Budget, results: Results, stop_at: float) -> None:
    """Every GEMV and skinny config of the space (split-K up to SWEEP_MAX_SPLIT, stages as in
    SWEEP_STAGES; the GEMV tiles of SWEEP_EXTRA_GEMV too) on a few
    decode shapes: compiled in the plugin's thread pool, each timed in a CUDA graph over
    rotated weights (3 replays), then the best 5 against torch and the weight-read kernel
    in the same turns (15 replays). Says whether a config near the read bound exists that
    the model's short list (``candidates()``, 8 by default) leaves out, and its model rank."""
    import torch
    from unimatmul_triton.configs import GEMV, GEMV_MAX_M, KernelConfig, applies
    from unimatmul_triton.launch import plan_for

    from unimatmul import Problem, UnsupportedProblem

    found = triton_part(results, "sweep", max_split=SWEEP_MAX_SPLIT)
    if found is None:
        return
    backend, target, rows = found
    gen = torch.Generator(device="cuda").manual_seed(1)
    for m, n, k in SWEEP:
        if budget.left() < stop_at:
            budget.note(f"sweep: time budget reached at {m}x{n}x{k}")
            results.data["parts"]["sweep"]["cut_short"] = True
            return
        row: dict[str, Any] = {"shape": f"{m}x{n}x{k}"}
        rows.append(row)
        try:
            problem = Problem(
                m=m, n=n, k=k, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16", trans_b=True, ldb=k
            )
            ranked = [e.config for e in backend.ranked(problem, target)]
            # Two stage counts per family (the measured winners' so far), to bound the compiles.
            configs = [
                c for c in ranked if c.split_k <= SWEEP_MAX_SPLIT and c.stages in SWEEP_STAGES[c.kernel]
            ]
            if m <= GEMV_MAX_M:
                extra = [
                    KernelConfig(GEMV, 1 << max(0, (m - 1).bit_length()), bn, bk, warps, stages, split)
                    for bn, bk, warps, stages, split in SWEEP_EXTRA_GEMV
                ]
                configs += [
                    c
                    for c in extra
                    if applies(problem, c) and c.split_k * c.block_k * 2 <= max(k, c.block_k * 2)
                ]
            _, gpu_target = backend._device(target)
            t0 = time.perf_counter()
            for config in configs:
                try:
                    backend.compiler.submit(plan_for(problem, config), 0, gpu_target)
                except UnsupportedProblem:
                    continue
            sets = rotated_sets(n, k)
            weights = [
                torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(sets)
            ]
            xs = [torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(sets)]
            outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
            ref = (xs[0].double() @ weights[0].double().t()).float()
            measured: dict[str, float] = {}
            graphs: dict[str, Any] = {}
            runners: list[Any] = []
            for config in configs:
                identity = config.candidate.identity
                try:
                    runner = backend.prepare(problem, config.candidate, target)
                except Exception as exc:
                    row.setdefault("refused", []).append(f"{identity}: {type(exc).__name__}")
                    continue
                outs[0].fill_(float("nan"))
                runner(xs[0], weights[0].t(), outs[0])
                err = float((outs[0].float() - ref).norm() / ref.norm())
                if not err <= 3e-2:
                    row.setdefault("wrong", []).append(f"{identity}: rel error {err:.3g}")
                    continue
                runners.append(runner)
                calls = [
                    (lambda r=runner, x=x, w=w, o=o: r(x, w.t(), o))
                    for x, w, o in zip(xs, weights, outs, strict=True)
                ]
                graph = graph_of(torch, calls)
                graph.replay()
                measured[identity] = min(replay_s(torch, graph) for _ in range(3))
                graphs[identity] = graph
                if len(graphs) > 5:  # keep the best 5 graphs only (memory)
                    worst = max(graphs, key=measured.__getitem__)
                    del graphs[worst]
            row["configs"] = len(configs)
            row["measured"] = len(measured)
            row["sweep_s"] = time.perf_counter() - t0
            read, _, read_buffers = read_graph(budget, torch, weights)
            torch_calls = [
                (lambda x=x, w=w, o=o: torch.matmul(x, w.t(), out=o))
                for x, w, o in zip(xs, weights, outs, strict=True)
            ]
            timed = {"torch": graph_of(torch, torch_calls), "read": read, **graphs}
            final = interleaved(torch, timed, 15)
            best = min(graphs, key=final.__getitem__)
            short_list = [c.identity for c in backend.candidates(problem, target)]
            identities = [c.candidate.identity for c in ranked]
            row.update(
                torch_us=final["torch"] * 1e6,
                read_us=final["read"] * 1e6,
                best=best,
                best_us=final[best] * 1e6,
                best_speedup=final["torch"] / final[best],
                best_model_rank=identities.index(best) + 1
                if best in identities
                else 0,  # 0: outside the space
                best_in_short_list=best in short_list,
                short_list_best_us=min((measured[i] for i in short_list if i in measured), default=math.nan)
                * 1e6,
                top5={i: final[i] * 1e6 for i in graphs},
            )
            budget.note(
                f"sweep {row['shape']}: {len(measured)} configs in {row['sweep_s']:.0f} s; torch {row['torch_us']:.1f} us, "
                f"read {row['read_us']:.1f} us, best {row['best_us']:.1f} us ({row['best_speedup']:.2f}x, "
                f"model rank {row['best_model_rank']}, in short list: {row['best_in_short_list']}) {best}"
            )
            del graphs, timed, runners, read, read_buffers, weights
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
            budget.note(f"sweep {row['shape']}: {row['error']}")
            traceback.print_exc()
        results.save()
        torch.cuda.empty_cache()


# --- part 2: tuning cost (child processes) ----------------------------------------------------


def _phase_clock() -> dict[str, float]:
    """Wall seconds of the tuning's phases, summed until cleared (TUNE_PHASES=1).

    Wraps, in this child only: the candidates' list (``Tuner.entries``), preparing a
    runner (``Tuner.prepare``: a Triton kernel's load from its cache, an Lt algo), the
    input sets and the references, the numeric checks, the timing and the confirmation
    against Default. The late checks run inside the timing, so "checks" and "timing"
    overlap, and "checks: compare", "timing: capture" and "timing: late sets" are parts
    of those two; the rest of ``tune_s`` is the selector's own work (cache, locks).
    """
    import functools

    from unimatmul.tuning import harness, numeric_check, timers, tuner

    clock: dict[str, float] = {}

    def wrap(owner: Any, name: str, phase: str) -> None:
        inner = getattr(owner, name)

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                clock[phase] = clock.get(phase, 0.0) + time.perf_counter() - t0

        setattr(owner, name, timed)

    wrap(tuner.Tuner, "entries", "candidates")
    wrap(tuner.Tuner, "prepare", "prepare")
    wrap(harness.Harness, "_operand_sets", "inputs")
    wrap(numeric_check, "make_reference", "references")
    wrap(harness.Harness, "_check_call", "checks")
    wrap(harness.Harness, "_time", "timing")
    wrap(harness.Harness, "_confirm", "confirm")
    # Inside the above: the comparison of a check ("checks"), a candidate's capture with
    # its eager warm-up ("timing"), and the new values of the sets checked after timing.
    wrap(numeric_check, "compare", "checks: compare")
    wrap(timers.TorchGraphTimer, "prepare", "timing: capture")
    wrap(harness.Harness, "_late_check_set", "timing: late sets")
    return clock


def _triton_compiler() -> Any:
    """The process's Triton backend's Compiler (its counts of compiles and launchers), or None."""
    from unimatmul.core.plugins import get_plugin_manager

    backend = get_plugin_manager().backends().get("triton")
    return getattr(backend, "compiler", None) if backend is not None else None


def tune_child(shapes: list[tuple[int, int, int, bool]]) -> None:
    """In a child process: tune each shape through the public API and print one JSON line each."""
    import torch

    import unimatmul
    from unimatmul.cache.protocol import open_store

    # TUNE_PROFILE=FILE: a cProfile of the tuning calls (not the start-up), as text, into FILE.
    profile_to = os.environ.get("TUNE_PROFILE")
    profiler = None
    if profile_to:
        import cProfile

        profiler = cProfile.Profile()
    phases = _phase_clock() if os.environ.get("TUNE_PHASES") else None
    compiler = _triton_compiler()
    torch.manual_seed(0)
    # Start-up (plugins, cuBLASLt, timers) on a shape Triton does not serve: not charged to a shape.
    x = torch.randn(64, 64, device="cuda")
    with unimatmul.mode("tune"):
        unimatmul.matmul(x, x)
    torch.cuda.synchronize()
    for m, n, k, linear in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = (
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
            if linear
            else torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        )
        torch.cuda.synchronize()
        counts = (compiler.compiles, compiler.launchers) if compiler is not None else (0, 0)
        t0 = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        with unimatmul.mode("tune"):
            unimatmul.matmul(a, b)
        torch.cuda.synchronize()
        if profiler is not None:
            profiler.disable()
        seconds = time.perf_counter() - t0
        record = None
        for _, _, rec in open_store().items():
            if f"m{m}n{n}k{k}b1" in rec.problem and rec.problem.startswith("gemm:bf16"):
                record = rec
        line: dict[str, Any] = {"shape": f"{m}x{n}x{k}", "linear": linear, "tune_s": seconds}
        if compiler is not None:
            # Specialisations compiled and launchers built for this shape (the rest were shared).
            line["triton_compiles"] = compiler.compiles - counts[0]
            line["triton_launchers"] = compiler.launchers - counts[1]
        if phases is not None:
            line["phases_s"] = {name: round(v, 4) for name, v in phases.items()}
            phases.clear()
        if record is not None:
            line.update(
                winner=record.winner,
                winner_us=record.winner_s * 1e6,
                default_us=(record.default_s or math.nan) * 1e6,
                speedup=(record.default_s or math.nan) / record.winner_s,
                triton_candidates=sum(1 for r in record.results if r.identity.startswith("triton/")),
                # Every candidate's fate: what a pruning rule would have saved or lost.
                candidates=[
                    [r.identity, r.status, round((r.median_s or math.nan) * 1e6, 3), r.samples]
                    for r in record.results
                ],
                best_triton_us=min(
                    (
                        r.median_s * 1e6
                        for r in record.results
                        if r.identity.startswith("triton/") and r.median_s
                    ),
                    default=math.nan,
                ),
            )
        print("TUNE " + json.dumps(line), flush=True)
    if profiler is not None and profile_to:
        import io
        import pstats

        text = io.StringIO()
        for order in ("cumulative", "tottime"):
            pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(45)
        Path(profile_to).write_text(text.getvalue())


#: The tuning runs (TUNE_RUNS picks some, by name; all but "profiled" by default): their
#: titles and environments. "warm-4ms": twice the default measuring budget per candidate
#: (the earlier default), to compare its winners and times with "warm"'s.
#: "profiled": warm under cProfile (tune-warm-profile.txt); its times are inflated.
TUNE_RUNS: dict[str, tuple[str, dict[str, str]]] = {
    "first": ("first (Triton cache empty)", {}),
    "warm": ("warm (Triton cache warm)", {"TUNE_PHASES": "1"}),
    "warm-4ms": (
        "warm, 4 ms of samples a candidate (UNIMATMUL_GPU_BUDGET_S=0.004)",
        {"TUNE_PHASES": "1", "UNIMATMUL_GPU_BUDGET_S": "0.004"},
    ),
    "profiled": ("warm, under cProfile", {}),
}
#: The runs made by default and reported (the profiled run's times are not the figures).
REPORTED_RUNS = [r for r in TUNE_RUNS if r != "profiled"]


def part_tuning(budget: Budget, results: Results, stop_at: float) -> None:
    shapes = [(m, n, k, True) for m, n, k in TUNE_DECODE] + [(m, n, k, False) for m, n, k in TUNE_GENERAL]
    part: dict[str, Any] = {}
    results.data["parts"]["tuning"] = part
    with tempfile.TemporaryDirectory(prefix="umm-triton-tune-") as tmp:
        triton_cache = Path(tmp) / "triton-cache"
        runs = os.environ.get("TUNE_RUNS", ",".join(REPORTED_RUNS)).split(",")
        for run in runs:
            left = budget.left() - stop_at
            if left < 20:
                part[run] = {"skipped": "time budget"}
                budget.note(f"tuning {run}: skipped (time budget)")
                continue
            env = dict(os.environ)
            env.update(
                TRITON_CACHE_DIR=str(triton_cache),
                UNIMATMUL_CACHE=str(Path(tmp) / f"cache-{run}.msgpack"),
                UNIMATMUL_MODE="tune",
                PYTHONUNBUFFERED="1",
            )
            env.update(TUNE_RUNS[run][1])
            if run == "profiled":
                env["TUNE_PROFILE"] = str(results.out / "tune-warm-profile.txt")
            t0 = time.perf_counter()
            lines: list[dict[str, Any]] = []
            try:
                proc = subprocess.run(
                    [sys.executable, __file__, "--tune-child", json.dumps(shapes)],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=left,
                    check=False,
                )
                output, rc = proc.stdout, proc.returncode
                tail = proc.stderr[-2000:]
            except subprocess.TimeoutExpired as exc:
                output = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
                rc, tail = -1, "timed out"
            lines = [json.loads(x[5:]) for x in output.splitlines() if x.startswith("TUNE ")]
            part[run] = {"rc": rc, "wall_s": time.perf_counter() - t0, "shapes": lines, "stderr_tail": tail}
            per_shape = [x["tune_s"] for x in lines]
            if per_shape:
                part[run]["median_tune_s"] = statistics.median(per_shape)
            for x in lines:
                budget.note(
                    f"tune {run:5} {x['shape']:>16} {'linear' if x['linear'] else 'plain':6}: {x['tune_s']:.2f} s, "
                    f"winner {x.get('winner', '?')} {x.get('speedup', math.nan):.2f}x"
                    + (f"; phases {x['phases_s']}" if "phases_s" in x else "")
                )
            results.save()
    general = [x for x in part.get("warm", {}).get("shapes", []) if not x["linear"] and "speedup" in x]
    if general:
        part["general_geomean"] = math.exp(statistics.mean(math.log(x["speedup"]) for x in general))


# --- part 3: host time per call ---------------------------------------------------------------


def part_host(budget: Budget, results: Results) -> None:
    import torch
    from unimatmul_triton import TritonBackend

    import unimatmul
    from unimatmul import Problem
    from unimatmul.backend import Device, Target, adapter_for_kind

    backend = TritonBackend()
    target = Target(adapter_for_kind("torch"), Device("cuda", 0))
    m, n, k = 16, 256, 256
    problem = Problem(m=m, n=n, k=k, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16", trans_b=True, ldb=k)
    runner = backend.prepare(problem, backend.candidates(problem, target)[0], target)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    wt = w.t()

    def per_call(fn: Any, count: int = 5000) -> float:
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        best = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(count):
                fn()
            best = min(best, (time.perf_counter() - t0) / count)
            torch.cuda.synchronize()
        return best * 1e6

    part = {
        "shape": f"{m}x{n}x{k} bf16 x @ W.T",
        "triton_runner_us": per_call(lambda: runner(x, wt, out)),
        "torch_mm_us": per_call(lambda: torch.mm(x, wt, out=out)),
        "torch_matmul_us": per_call(lambda: torch.matmul(x, wt)),
    }
    with unimatmul.mode("off"):
        part["unimatmul_matmul_off_us"] = per_call(lambda: unimatmul.matmul(x, wt, out=out))
    part.update(_routed_host(per_call, x, wt))
    results.data["parts"]["host"] = part
    budget.note("host us/call: " + ", ".join(f"{k}={v:.2f}" for k, v in part.items() if isinstance(v, float)))
    results.save()


def _routed_host(per_call: Any, x: Any, wt: Any) -> dict[str, Any]:
    """Host time of a routed ``torch.mm`` and of ``unimatmul.matmul`` whose cached choice is
    a Triton kernel: the cache holds the problem's best Triton candidate as its winner (the
    measured times kept), so the native routing kernels launch it (NativeCall "launch")."""
    import tempfile

    import torch

    import unimatmul
    import unimatmul.torch as ut
    from unimatmul.testing import isolated_selector, prefer_kernel
    from unimatmul.torch import native, routing
    from unimatmul.torch.model_tuning import collecting

    found: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory() as folder,
        isolated_selector(Path(folder) / "cache.msgpack") as selector,
    ):
        ut.disable()
        with ut.enabled(), collecting() as met:
            torch.mm(x, wt)
        (problem, target), *_ = list({(p.key, t): (p, t) for p, t in met}.values())
        record = prefer_kernel(selector, problem, target, backend="triton")
        if not record.winner.startswith("triton/"):
            return {"routed_error": "no Triton candidate passed the check"}
        found["routed_candidate"] = record.winner
        ut.clear_plans()
        try:
            with ut.enabled():
                found["routed_triton_us"] = per_call(lambda: torch.mm(x, wt))
                kinds = {p.label: p.native for p in routing.TABLE.plans.values()}
                found["routed_native_kind"] = "LAUNCH" if native.LAUNCH in kinds.values() else str(kinds)
        finally:
            ut.disable()
        found["api_triton_us"] = per_call(lambda: unimatmul.matmul(x, wt))
        found["api_native_kind"] = (
            "LAUNCH" if native.LAUNCH in native.kinds(native.API).values() else str(native.kinds(native.API))
        )
    found["torch_mm_alloc_us"] = per_call(lambda: torch.mm(x, wt))
    return found


# --- parts 4 and 5: tests and conformance (child processes) ------------------------------------


def run_child(
    budget: Budget, results: Results, name: str, argv: list[str], stop_at: float, limit: float
) -> None:
    left = min(budget.left() - stop_at, limit)
    if left < 15:
        results.data["parts"][name] = {"skipped": "time budget"}
        budget.note(f"{name}: skipped (time budget)")
        return
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=left, check=False, cwd=REPO)
        rc, out = proc.returncode, (proc.stdout + proc.stderr)
    except subprocess.TimeoutExpired as exc:
        rc = -1
        out = (exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or "") + "\n(timed out)"
    # The whole log's end goes into the JSON: at most 8 files come back from the device.
    lines = out.strip().splitlines()
    tail = "\n".join(lines[-25:])
    results.data["parts"][name] = {
        "rc": rc,
        "wall_s": time.perf_counter() - t0,
        "tail": tail,
        "log": lines[-400:],
    }
    budget.note(f"{name}: exit {rc} in {time.perf_counter() - t0:.0f} s\n{tail}")
    results.save()


# --- report -----------------------------------------------------------------------------------


def markdown(data: dict[str, Any]) -> str:
    parts = data.get("parts", {})
    lines = ["# unimatmul-triton on the GPU", "", f"device: {data.get('device', '?')}", ""]
    decode = parts.get("decode", {})
    if decode.get("rows"):
        lines += [
            "## Decode (bf16, x @ W.T, CUDA-graph replays, median)",
            "",
            "read: a kernel that only reads the weight (the fastest of 16 configurations), timed in the",
            "same turns; bound = torch us / read us, the speedup of a GEMV as fast as reading its weight.",
            "",
            "| shape | torch us | torch TB/s | triton us | triton TB/s | speedup | read us | read TB/s | bound |"
            " winner (model rank) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in decode["rows"]:
            if "speedup" in r:
                read = (
                    f"{r['read_us']:.1f} | {r['read_tbs']:.2f} | {r['bound']:.2f}x"
                    if "bound" in r
                    else "- | - | -"
                )
                lines.append(
                    f"| {r['shape']} | {r['torch_us']:.1f} | {r['torch_tbs']:.2f} | {r['triton_us']:.1f} | "
                    f"{r['triton_tbs']:.2f} | {r['speedup']:.2f}x | {read} | {r['best']} ({r['model_rank']}) |"
                )
            else:
                lines.append(f"| {r['shape']} | error: {r.get('error', '?')} |")
        if "median_speedup" in decode:
            lines += [
                "",
                f"median speedup {decode['median_speedup']:.3f}x; lowest triton TB/s {decode['min_triton_tbs']:.2f}"
                + (f"; median bound {decode['median_bound']:.3f}x" if "median_bound" in decode else ""),
            ]
        lines.append("")
    sweep = parts.get("sweep", {})
    if sweep.get("rows"):
        lines += [
            f"## Sweep: every GEMV (1, 3 stages; block_k up to 2048) and skinny (3, 4 stages) config, "
            f"split-K <= {sweep.get('max_split')}; model rank 0: outside the model's space",
            "",
            "| shape | configs timed | torch us | read us | best us | best vs torch | model rank | in the short list |"
            " best of the short list us | best config |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in sweep["rows"]:
            if "best" in r:
                lines.append(
                    f"| {r['shape']} | {r['measured']} | {r['torch_us']:.1f} | {r['read_us']:.1f} | {r['best_us']:.1f} | "
                    f"{r['best_speedup']:.2f}x | {r['best_model_rank']} | {r['best_in_short_list']} | "
                    f"{r['short_list_best_us']:.1f} | {r['best']} |"
                )
            else:
                lines.append(f"| {r['shape']} | error: {r.get('error', '?')} |")
        lines.append("")
    tuning = parts.get("tuning", {})
    for run in REPORTED_RUNS:
        title = TUNE_RUNS[run][0]
        shapes = tuning.get(run, {}).get("shapes", [])
        if shapes:
            lines += [
                f"## Tuning, {title}",
                "",
                "| shape | layout | tune s | winner | speedup vs Default | triton candidates | best triton us |",
                "|---|---|---|---|---|---|---|",
            ]
            for x in shapes:
                lines.append(
                    f"| {x['shape']} | {'linear' if x['linear'] else 'plain'} | {x['tune_s']:.2f} | "
                    f"{x.get('winner', '?')} | {x.get('speedup', math.nan):.2f}x | {x.get('triton_candidates', '?')} | "
                    f"{x.get('best_triton_us', math.nan):.1f} |"
                )
            lines += ["", f"median {tuning[run].get('median_tune_s', math.nan):.2f} s per shape", ""]
            phased = [x["phases_s"] for x in shapes if "phases_s" in x]
            if phased:
                names = sorted(
                    {k for p in phased for k in p},
                    key=lambda k: -statistics.median(p.get(k, 0.0) for p in phased),
                )
                lines += [
                    "Where the time goes (seconds, median over the shapes; the late checks run inside the timing): "
                    + ", ".join(f"{k} {statistics.median(p.get(k, 0.0) for p in phased):.3f}" for k in names),
                    "",
                ]
    if "general_geomean" in tuning:
        lines += [
            f"general shapes (warm run): geomean speedup over Default {tuning['general_geomean']:.3f}x",
            "",
        ]
    host = parts.get("host")
    if host:
        lines += ["## Host time per call", ""] + [
            f"- {k}: {v:.2f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in host.items()
        ]
        lines.append("")
    for name in ("pytest", "conformance-quick", "conformance-full"):
        part = parts.get(name)
        if part:
            lines += [
                f"## {name}: exit {part.get('rc', '-')}",
                "",
                "```",
                part.get("tail", part.get("skipped", "")),
                "```",
                "",
            ]
    return "\n".join(lines)


def summary(data: dict[str, Any]) -> str:
    parts = data.get("parts", {})
    rows = []
    decode = parts.get("decode", {})
    if "median_speedup" in decode:
        rows.append(("decode median speedup (target >= 1.15x)", f"{decode['median_speedup']:.3f}x"))
        rows.append(("decode lowest triton TB/s (target >= 3.8)", f"{decode['min_triton_tbs']:.2f}"))
    if "median_bound" in decode:
        rows.append(("decode median bound (torch us / weight-read us)", f"{decode['median_bound']:.3f}x"))
    tuning = parts.get("tuning", {})
    for run, target in ((r, "<= 2 s" if r == "first" else "<= 0.15 s") for r in REPORTED_RUNS):
        if "median_tune_s" in tuning.get(run, {}):
            rows.append(
                (f"tuning {run}: median s/shape (target {target})", f"{tuning[run]['median_tune_s']:.2f}")
            )
    if "general_geomean" in tuning:
        rows.append(
            (
                "general shapes geomean, Triton in the pool (target >= 1.05x)",
                f"{tuning['general_geomean']:.3f}x",
            )
        )
    host = parts.get("host", {})
    if host:
        rows.append(
            (
                "host us/call: triton runner vs torch.mm",
                f"{host['triton_runner_us']:.2f} vs {host['torch_mm_us']:.2f}",
            )
        )
    for name in ("pytest", "conformance-quick", "conformance-full"):
        if name in parts:
            rows.append((name, f"exit {parts[name].get('rc', parts[name].get('skipped'))}"))
    width = max((len(r[0]) for r in rows), default=10)
    return "\n".join(f"{a:<{width}}  {b}" for a, b in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=420.0)
    parser.add_argument("--tune-child", help=argparse.SUPPRESS)
    parser.add_argument(
        "--skip", default="", help="comma-separated parts to skip: decode,tuning,host,pytest,conformance"
    )
    parser.add_argument(
        "--parts", default="", help="comma-separated extra parts to run (not by default): sweep"
    )
    args = parser.parse_args()
    if args.tune_child:
        tune_child([tuple(x) for x in json.loads(args.tune_child)])
        return 0
    out = Path(os.environ.get("OUT") or "gpu-check-out")
    budget = Budget(args.budget_s)
    results = Results(out)
    skip = set(filter(None, args.skip.split(",")))
    import torch
    import triton

    results.data["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    results.data["versions"] = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": sys.version.split()[0],
    }
    budget.note(f"device {results.data['device']}, {results.data['versions']}")
    results.save()
    # Reserve: each part stops when this much of the budget is left for the later ones.
    later = {"tuning", "host", "pytest", "conformance"} - skip
    if "decode" not in skip:
        part_decode(budget, results, stop_at=0.62 * args.budget_s if later else 10)
    if "sweep" in args.parts.split(","):
        part_sweep(budget, results, stop_at=0.62 * args.budget_s if later else 10)
    if "tuning" not in skip:
        part_tuning(budget, results, stop_at=0.33 * args.budget_s)
    if "host" not in skip:
        try:
            part_host(budget, results)
        except Exception as exc:
            results.data["parts"]["host"] = {"error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
    if "pytest" not in skip:
        run_child(
            budget,
            results,
            "pytest",
            # Part 5 runs the conformance suite itself.
            [sys.executable, "-m", "pytest", str(PLUGIN / "tests"), "-q", "-rs", "-k", "not conformance"],
            stop_at=0.12 * args.budget_s,
            limit=150,
        )
    if "conformance" not in skip:
        for mode in ("quick", "full"):
            report = out / f"conformance-{mode}.json"
            argv = [
                sys.executable,
                "-m",
                "unimatmul.cli",
                "conformance",
                "--backend",
                "triton",
                "--device",
                "cuda:0",
            ]
            argv += ["--json", str(report)] + (["--quick"] if mode == "quick" else [])
            run_child(budget, results, f"conformance-{mode}", argv, stop_at=10, limit=400)
    results.save()
    print("\n" + summary(results.data), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
