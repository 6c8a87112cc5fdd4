"""The H200 benchmark: torch.matmul vs TunableOp vs nvmath autotune vs unimatmul tuned.

Run on a GPU machine (``bash scripts/gpu_session.sh bench`` does it in one device call)::

    python benchmarks/gpu_bench.py --out DIR [--suite full|probe] [--budget-s SECONDS]

Shapes: the transformer presets (unimatmul/presets.py) with M swept over 1..8192 rows,
the ResNet-50 im2col GEMMs, the batched attention products, and misaligned shapes.
Timing (GPU-NOTES): every column is a CUDA-graph replay of >= 20 back-to-back calls
(fewer, at least 3, when one call exceeds 1 ms so that a replay stays near 20 ms), the
inputs rotated through more than 3x the L2 size, replays of all columns interleaved,
median of the replays; seconds per call = replay time / calls. Tuning time per shape
is wall-clock, synchronised. Host time per cached call is a loop of calls on a tiny
problem (the GPU keeps up), wall-clock per call.

Writes gpu-bench.json (every number), gpu-bench.md (tables) and gpu-bench.png under
--out, after every shape, so that a run cut short still leaves its results.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPLAYS = 15


@dataclass
class Shape:
    m: int
    n: int
    k: int
    dtype: str
    batch: int = 1
    group: str = ""

    @property
    def text(self) -> str:
        dims = f"{self.m}x{self.n}x{self.k}"
        return dims if self.batch == 1 else f"{self.batch}x{dims}"


@dataclass
class Row:
    shape: str
    dtype: str
    group: str
    us: dict[str, float] = field(default_factory=dict)  # column -> microseconds per call
    tune_ms: dict[str, float] = field(default_factory=dict)
    method: dict[str, str] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


# --- shapes -------------------------------------------------------------------------

TRANSFORMER_NK = [
    (2304, 768),
    (768, 768),
    (3072, 768),
    (768, 3072),
    (6144, 4096),
    (4096, 4096),
    (28672, 4096),
    (4096, 14336),
    (50257, 768),
]
MISALIGNED = [(1024, 1025, 1024), (2047, 4095, 1023), (1023, 4097, 2049)]


def suite(name: str) -> list[Shape]:
    from unimatmul.presets import PRESETS

    shapes: list[Shape] = []
    if name == "probe":
        return [
            Shape(1024, 1025, 1024, "bf16", group="misaligned"),
            Shape(1000, 1000, 1000, "bf16", group="probe"),
            Shape(16384, 4096, 128, "bf16", group="probe"),
        ]
    for m, n, k in MISALIGNED:
        shapes.append(Shape(m, n, k, "bf16", group="misaligned"))
    for m in (1, 16, 128, 1024, 8192):
        for n, k in TRANSFORMER_NK:
            shapes.append(Shape(m, n, k, "bf16", group="transformer"))
    for text in PRESETS["resnet50"][1]:
        m, n, k = (int(x) for x in text.split("x"))
        shapes.append(Shape(m, n, k, "bf16", group="resnet50"))
    for text in PRESETS["bert-base"][1]:
        dims = [int(x) for x in text.split("x")]
        if len(dims) == 4:
            shapes.append(Shape(dims[1], dims[2], dims[3], "bf16", batch=dims[0], group="attention"))
    for m, n, k in MISALIGNED:
        shapes.append(Shape(m, n, k, "f16", group="misaligned"))
    for m in (16, 1024, 8192):
        for n, k in TRANSFORMER_NK:
            shapes.append(Shape(m, n, k, "f16", group="transformer"))
    return shapes


# --- measuring ----------------------------------------------------------------------


class Bench:
    def __init__(self, out: Path, budget_s: float) -> None:
        import torch

        import unimatmul
        from unimatmul.backend import Target
        from unimatmul.cache.protocol import MemoryStore
        from unimatmul.core.arrays import Device, adapter_for_kind
        from unimatmul.core.plugins import PluginManager
        from unimatmul.tuning.selector import Selector, set_selector
        from unimatmul.tuning.timers import TorchGraphTimer, l2_cache_bytes

        self.torch = torch
        self.unimatmul = unimatmul
        self.out = out
        self.budget_s = budget_s
        self.started = time.perf_counter()
        self.adapter = adapter_for_kind("torch")
        self.target = Target(self.adapter, Device("cuda", torch.cuda.current_device()))
        self.l2 = l2_cache_bytes(self.target)
        self.timer = TorchGraphTimer(self.target.device.index, min_calls=20, max_batch_s=0.02)
        self.store = MemoryStore()
        self.selector = Selector(plugins=PluginManager(), store=self.store)
        set_selector(self.selector)
        self.rows: list[Row] = []
        self.meta: dict[str, Any] = {}
        self.host: dict[str, Any] = {}
        self.exhaustive: list[dict[str, Any]] = []
        self.skipped: list[str] = []
        self.keep: list[Any] = []

    # -- helpers
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def operand_sets(self, shape: Shape, factor: float = 3.2) -> list[tuple[Any, Any, Any]]:
        torch = self.torch
        dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[shape.dtype]
        b_, m, n, k = shape.batch, shape.m, shape.n, shape.k
        per_set = 2 * b_ * (m * k + k * n + m * n)
        count = max(2, min(256, math.ceil(factor * self.l2 / per_set)))
        gen = torch.Generator(device="cuda").manual_seed(1234)
        sets = []
        lead = (b_,) if b_ > 1 else ()
        for _ in range(count):
            a = torch.randn(*lead, m, k, device="cuda", generator=gen).to(dtype)
            b = torch.randn(*lead, k, n, device="cuda", generator=gen).to(dtype)
            c = torch.empty(*lead, m, n, device="cuda", dtype=dtype)
            sets.append((a, b, c))
        return sets

    def graph_sampler(self, calls: list[Any]) -> tuple[Any, str]:
        sample = self.timer.prepare(calls)
        return sample, self.timer.last_mode

    def time_columns(self, samplers: dict[str, Any]) -> dict[str, float]:
        times: dict[str, list[float]] = {name: [] for name in samplers}
        for _ in range(REPLAYS):
            for name, sample in samplers.items():
                times[name].append(sample())
        return {name: statistics.median(ts) * 1e6 for name, ts in times.items()}

    # -- one shape
    def run_shape(self, shape: Shape) -> Row:
        torch = self.torch
        from unimatmul.backend import Candidate
        from unimatmul.core.problem import Problem

        row = Row(shape.text, shape.dtype, shape.group)
        sets = self.operand_sets(shape)
        row.notes["sets"] = len(sets)
        row.notes["rotation_mb"] = round(
            len(sets) * 2 * shape.batch * (shape.m * shape.k + shape.k * shape.n + shape.m * shape.n) / 2**20,
            1,
        )
        samplers: dict[str, Any] = {}

        def torch_calls() -> list[Any]:
            return [lambda s=s: torch.matmul(s[0], s[1], out=s[2]) for s in sets]

        samplers["torch"], row.method["torch"] = self.graph_sampler(torch_calls())

        # unimatmul: tune through the selector (entry-point plugins, in-memory store).
        problem = Problem.from_shape(shape.m, shape.n, shape.k, shape.dtype, batch=shape.batch)
        try:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            record = self.selector.tune(problem, self.target, force=True)
            torch.cuda.synchronize()
            row.tune_ms["unimatmul"] = (time.perf_counter() - t0) * 1e3
            runner = self.selector.prepare(problem, Candidate.from_identity(record.winner), self.target)
            calls = [lambda s=s, r=runner: r(s[0], s[1], s[2], 1.0, 0.0, None) for s in sets]
            samplers["unimatmul"], row.method["unimatmul"] = self.graph_sampler(calls)
            ok = [r for r in record.results if r.status == "ok"]
            row.notes["winner"] = record.winner
            row.notes["candidates"] = len(record.results)
            row.notes["statuses"] = {
                s: sum(1 for r in record.results if r.status == s)
                for s in ("ok", "pruned", "rejected", "failed")
            }
            row.notes["harness_default_us"] = (record.default_s or 0) * 1e6
            row.notes["harness_winner_us"] = record.winner_s * 1e6
            best_lt = [r for r in ok if r.identity.startswith("cublaslt/") and r.median_s]
            if best_lt:
                best = min(best_lt, key=lambda r: r.median_s or math.inf)
                row.notes["harness_best_lt_us"] = (best.median_s or 0) * 1e6
            row.notes["results"] = [
                [r.identity, r.status, round((r.median_s or 0) * 1e6, 2), r.samples, r.note]
                for r in record.results
            ]
            if shape.group == "misaligned":
                # The alignment candidates measured here too, whatever the tuner decided.
                pads = [
                    Candidate.from_identity(r.identity)
                    for r in record.results
                    if r.identity.startswith("cublaslt/pad")
                ]
                for i, pad in enumerate(pads):
                    pad_runner = self.selector.prepare(problem, pad, self.target)
                    calls = [lambda s=s, r=pad_runner: r(s[0], s[1], s[2], 1.0, 0.0, None) for s in sets]
                    samplers[f"pad{i}"], row.method[f"pad{i}"] = self.graph_sampler(calls)
                    row.notes[f"pad{i}"] = pad.identity
        except Exception as exc:
            row.errors["unimatmul"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()

        # PyTorch TunableOp as installed.
        try:
            tunable = torch.cuda.tunable
            tunable.enable(True)
            tunable.tuning_enable(True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            torch.matmul(sets[0][0], sets[0][1], out=sets[0][2])
            torch.cuda.synchronize()
            row.tune_ms["tunableop"] = (time.perf_counter() - t0) * 1e3
            for s in sets:  # every set eagerly before capture: nothing tunes inside it
                torch.matmul(s[0], s[1], out=s[2])
            torch.cuda.synchronize()
            results = tunable.get_results()
            row.notes["tunableop_kernel"] = str(results[-1][2]) if results else "none"
            samplers["tunableop"], row.method["tunableop"] = self.graph_sampler(torch_calls())
        except Exception as exc:
            row.errors["tunableop"] = f"{type(exc).__name__}: {exc}"
        finally:
            try:
                torch.cuda.tunable.tuning_enable(False)
                torch.cuda.tunable.enable(False)  # its graph was captured with it on
            except Exception:
                pass

        # nvmath-python: Matmul plan + autotune.
        mm = None
        try:
            import nvmath

            torch.cuda.synchronize()
            t0 = time.perf_counter()
            mm = nvmath.linalg.advanced.Matmul(sets[0][0], sets[0][1])
            mm.plan()
            mm.autotune()
            torch.cuda.synchronize()
            row.tune_ms["nvmath"] = (time.perf_counter() - t0) * 1e3

            def nv_call(s: tuple[Any, Any, Any], mm: Any = mm) -> None:
                mm.reset_operands_unchecked(a=s[0], b=s[1])
                mm.execute()

            samplers["nvmath"], row.method["nvmath"] = self.graph_sampler(
                [lambda s=s: nv_call(s) for s in sets]
            )
        except Exception as exc:
            row.errors["nvmath"] = f"{type(exc).__name__}: {exc}"

        row.us = self.time_columns(samplers)
        if mm is not None:
            # Not mm.free(): nvmath would wait on its last compute event, recorded inside
            # the graph capture and so not a valid event; the process exit releases it.
            self.keep.append(mm)
        samplers.clear()
        sets.clear()
        torch.cuda.synchronize()
        return row

    # -- host time per cached call
    def host_times(self) -> None:
        torch = self.torch
        import unimatmul
        from unimatmul.cache.record import TuningRecord
        from unimatmul.core.problem import Problem
        from unimatmul_backends.cuda.backend import CublasLtBackend

        m, n, k = 64, 256, 256
        a = torch.randn(m, k, device="cuda").bfloat16()
        b = torch.randn(k, n, device="cuda").bfloat16()
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        problem = Problem.from_shape(m, n, k, "bf16")
        results: dict[str, float] = {}
        free_running: dict[str, float] = {}
        calls = 300

        def loop(name: str, fn: Any) -> None:
            # Host time alone: the GPU is held by a sleep kernel, so the calls only queue
            # (300 launches stay under the launch queue's depth) and the clock measures
            # Python, the library's host code and the launch. Median of 7 loops.
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            samples = []
            for _ in range(7):
                torch.cuda._sleep(100_000_000)
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                samples.append((time.perf_counter() - t0) / calls)
                torch.cuda.synchronize()
            results[name] = statistics.median(samples) * 1e6
            # And free-running (the larger of host and device time per call).
            t0 = time.perf_counter()
            for _ in range(2000):
                fn()
            torch.cuda.synchronize()
            free_running[name] = (time.perf_counter() - t0) / 2000 * 1e6

        loop("torch.matmul(a, b)", lambda: torch.matmul(a, b))
        loop("torch.matmul(a, b, out=out)", lambda: torch.matmul(a, b, out=out))
        # A cached record whose winner is a cuBLASLt algo (and one for Default).
        for library in ("nvmath", "ctypes"):
            backend = CublasLtBackend(library=library)
            if backend.availability() is not None:
                results[f"Lt runner ({library})"] = math.nan
                continue
            cand = backend.candidates(problem, self.target)[0]
            runner = backend.prepare(problem, cand, self.target)
            loop(f"Lt runner ({library}) direct", lambda r=runner: r(a, b, out, 1.0, 0.0, None))
        lt = self.selector.plugins.backends()["cublaslt"]
        self.host["lt_library"] = getattr(lt, "library", None)
        cand = lt.candidates(problem, self.target)[0]
        platform_ = self.selector.platform(self.target)
        self.store.put(platform_.namespace, problem.key, TuningRecord(problem.key, cand.identity, 1e-6, 1e-6))
        unimatmul.api.clear_fast_path()
        with unimatmul.mode("cached"):
            loop("unimatmul.matmul(a, b, out=out) [Lt]", lambda: unimatmul.matmul(a, b, out=out))
            loop("unimatmul.matmul(a, b) [Lt]", lambda: unimatmul.matmul(a, b))
            # The lower-level path: hold the Runner the selector decided on.
            from unimatmul.backend import Target
            from unimatmul.core.problem import Problem

            adapter = self.adapter
            described, _ = Problem.from_operands(adapter, a, b, out=out)
            prepared = self.selector.decide(described, Target(adapter, adapter.device(a)), "cached").runner
            loop("prepared runner (Selector.decide) [Lt]", lambda: prepared(a, b, out))
        self.store.put(
            platform_.namespace, problem.key, TuningRecord(problem.key, "default/default", 1e-6, 1e-6)
        )
        unimatmul.api.clear_fast_path()
        with unimatmul.mode("cached"):
            loop("unimatmul.matmul(a, b, out=out) [Default]", lambda: unimatmul.matmul(a, b, out=out))
        try:
            import nvmath

            with nvmath.linalg.advanced.Matmul(a, b) as mm:
                mm.plan()
                loop("nvmath Matmul.execute()", mm.execute)
        except Exception as exc:
            results["nvmath Matmul.execute()"] = math.nan
            self.host["nvmath_error"] = repr(exc)
        self.host["shape"] = f"{m}x{n}x{k} bf16"
        self.host["us_per_call"] = results
        self.host["us_per_call_free_running"] = free_running

    # -- exhaustive mode on a few shapes
    def exhaustive_mode(self, shapes: list[Shape]) -> None:
        from unimatmul.core.problem import Problem

        torch = self.torch
        lt = self.selector.plugins.backends()["cublaslt"]
        for shape in shapes:
            problem = Problem.from_shape(shape.m, shape.n, shape.k, shape.dtype)
            entry: dict[str, Any] = {"shape": shape.text, "dtype": shape.dtype}
            try:
                os.environ["UNIMATMUL_LT_EXHAUSTIVE"] = "1"
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                record = self.selector.tune(problem, self.target, force=True, store=False)
                entry["tune_ms"] = (time.perf_counter() - t0) * 1e3
                entry["search"] = dict(lt.last_search)
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"
                self.exhaustive.append(entry)
                continue
            finally:
                os.environ.pop("UNIMATMUL_LT_EXHAUSTIVE", None)
            heur = {c.identity for c in lt.candidates(problem, self.target)}
            ok = [r for r in record.results if r.status == "ok" and r.median_s]
            lt_ok = [r for r in ok if r.identity.startswith("cublaslt/")]
            best_h = min((r.median_s for r in lt_ok if r.identity in heur), default=None)
            extra = [r for r in lt_ok if r.identity not in heur]
            best_x = min(extra, key=lambda r: r.median_s or math.inf) if extra else None
            entry.update(
                candidates=len(record.results),
                measured_ok=len(ok),
                beyond_heuristics=len(
                    [
                        r
                        for r in record.results
                        if r.identity.startswith("cublaslt/") and r.identity not in heur
                    ]
                ),
                best_heuristic_us=(best_h or 0) * 1e6,
                best_exhaustive_only_us=(best_x.median_s or 0) * 1e6 if best_x else None,
                best_exhaustive_only=best_x.identity if best_x else None,
                default_us=(record.default_s or 0) * 1e6,
                winner=record.winner,
            )
            self.exhaustive.append(entry)
            print("exhaustive", json.dumps(entry), flush=True)

    # -- output
    def write(self) -> None:
        data = {
            "meta": self.meta,
            "rows": [r.__dict__ for r in self.rows],
            "host": self.host,
            "exhaustive": self.exhaustive,
            "skipped": self.skipped,
            "summary": summarize(self.rows),
        }
        (self.out / "gpu-bench.json").write_text(json.dumps(data, indent=1, default=str))
        (self.out / "gpu-bench.md").write_text(markdown(data))


def geomean(values: list[float]) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def summarize(rows: list[Row]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    model = [r for r in rows if r.group != "misaligned" and "unimatmul" in r.us and "torch" in r.us]
    for dtype in ("bf16", "f16"):
        sub = [r for r in model if r.dtype == dtype]
        if not sub:
            continue
        speed = [r.us["torch"] / r.us["unimatmul"] for r in sub]
        worst = min(zip(speed, (r.shape for r in sub), strict=True))
        out[dtype] = {
            "shapes": len(sub),
            "geomean_speedup": geomean(speed),
            "min_speedup": worst[0],
            "min_shape": worst[1],
            "below_0.98": [r.shape for r, s in zip(sub, speed, strict=True) if s < 0.98],
            "median_tune_ms": statistics.median(r.tune_ms.get("unimatmul", math.nan) for r in sub),
        }
        for col in ("tunableop", "nvmath"):
            vals = [r.us["torch"] / r.us[col] for r in sub if col in r.us]
            if vals:
                out[dtype][f"{col}_geomean_speedup"] = geomean(vals)
    tunes = [r.tune_ms["unimatmul"] for r in rows if "unimatmul" in r.tune_ms]
    if tunes:
        out["median_tune_ms_all"] = statistics.median(tunes)
    mis = [r for r in rows if r.group == "misaligned" and "unimatmul" in r.us]
    out["misaligned"] = {f"{r.shape} {r.dtype}": r.us["torch"] / r.us["unimatmul"] for r in mis}
    out["misaligned_best_pad_measured_alone"] = {
        f"{r.shape} {r.dtype}": r.us["torch"] / best_pad(r.us) for r in mis if math.isfinite(best_pad(r.us))
    }
    return out


def best_pad(us: dict[str, float]) -> float:
    """The fastest alignment candidate measured on its own (misaligned shapes), else nan."""
    return min((v for k, v in us.items() if k.startswith("pad")), default=math.nan)


def markdown(data: dict[str, Any]) -> str:
    meta, rows, summary = data["meta"], data["rows"], data["summary"]
    lines = [
        "# unimatmul on the H200: cuBLASLt tuned vs torch.matmul, TunableOp, nvmath autotune",
        "",
        "Machine: "
        + ", ".join(
            f"{k} {v}"
            for k, v in meta.items()
            if k in ("gpu", "torch", "cuda", "cublaslt", "nvmath", "lt_library")
        ),
        "",
        "Times: microseconds per call, CUDA-graph replay of >= 20 back-to-back calls, inputs rotated "
        "through > 3x L2, median of 15 interleaved replays. Speedup = torch.matmul time / column time. "
        "Tune: wall-clock ms per shape.",
        "",
        "| shape | dtype | torch us | TunableOp us | nvmath us | unimatmul us | x torch | winner | pad us | tune ms: unimatmul / TunableOp / nvmath |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]

    def f(v: Any, fmt: str = "{:.1f}") -> str:
        return fmt.format(v) if isinstance(v, (int, float)) and math.isfinite(v) else "-"

    for r in rows:
        us, tm = r["us"], r["tune_ms"]
        speed = us["torch"] / us["unimatmul"] if "unimatmul" in us and "torch" in us else math.nan
        winner = r["notes"].get("winner", "-")
        kind = "Default" if winner.startswith("default") else winner.split("/", 1)[1].split("?")[0]
        lines.append(
            f"| {r['shape']} | {r['dtype']} | {f(us.get('torch'))} | {f(us.get('tunableop'))} | "
            f"{f(us.get('nvmath'))} | {f(us.get('unimatmul'))} | {f(speed, '{:.3f}')} | {kind} | "
            f"{f(best_pad(us))} | "
            f"{f(tm.get('unimatmul'))} / {f(tm.get('tunableop'))} / {f(tm.get('nvmath'))} |"
        )
    lines += ["", "## Summary", "", "```", json.dumps(summary, indent=1, default=str), "```"]
    host = data.get("host") or {}
    if host:
        lines += [
            "",
            f"## Host microseconds per cached call ({host.get('shape')})",
            "",
            "Host only: 300 calls queued behind a GPU sleep kernel, median of 7 loops. "
            "Free-running: 2000 calls back to back, synchronised (the larger of host and GPU time).",
            "",
            "| call | host us | free-running us |",
            "|---|---|---|",
        ]
        free = host.get("us_per_call_free_running") or {}
        for name, value in (host.get("us_per_call") or {}).items():
            lines.append(f"| {name} | {f(value, '{:.2f}')} | {f(free.get(name), '{:.2f}')} |")
    if data.get("exhaustive"):
        lines += ["", "## Exhaustive mode (UNIMATMUL_LT_EXHAUSTIVE=1)", "", "```"]
        lines += [json.dumps(e, default=str) for e in data["exhaustive"]]
        lines += ["```"]
    if data.get("skipped"):
        lines += ["", f"Not run (time budget): {', '.join(data['skipped'])}"]
    errors = [(r["shape"], r["dtype"], r["errors"]) for r in rows if r["errors"]]
    if errors:
        lines += ["", "## Errors", ""] + [f"- {s} {d}: {e}" for s, d, e in errors]
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if "torch" in r["us"]]
    labels = [f"{r['shape']} {r['dtype']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(10, len(rows) * 0.28), 6))
    x = np.arange(len(rows))
    width = 0.27
    for i, col in enumerate(("unimatmul", "nvmath", "tunableop")):
        vals = [r["us"]["torch"] / r["us"][col] if col in r["us"] else np.nan for r in rows]
        ax.bar(x + (i - 1) * width, vals, width, label=col)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.98, color="r", lw=0.6, ls="--")
    ax.set_xticks(x, labels, rotation=90, fontsize=6)
    ax.set_ylabel("speedup over torch.matmul")
    ax.set_title("H200: speedup over torch.matmul (CUDA-graph timing, rotated inputs)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--suite", default="full", choices=("full", "probe", "host"), help="host: only host time per call"
    )
    parser.add_argument("--budget-s", type=float, default=300.0, help="stop starting new shapes after this")
    parser.add_argument("--exhaustive", type=int, default=3, help="shapes to tune in exhaustive mode")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    bench = Bench(args.out, args.budget_s)
    lt = bench.selector.plugins.backends().get("cublaslt")
    try:
        import nvmath

        nv_version = nvmath.__version__
    except Exception as exc:
        nv_version = f"unavailable ({exc!r})"
    bench.meta = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cublaslt": lt.versions()
        if lt is not None and lt.availability() is None
        else repr(lt and lt.availability()),
        "lt_library": getattr(lt, "library", None),
        "nvmath": nv_version,
        "l2_bytes": bench.l2,
        "python": platform.python_version(),
        "plugins_loaded": bench.selector.plugins.report.loaded,
        "plugins_failed": bench.selector.plugins.report.failed,
        "heuristics": os.environ.get("UNIMATMUL_LT_HEURISTICS", "16"),
        "budget_per_candidate_s": os.environ.get("UNIMATMUL_GPU_BUDGET_S", "0.002"),
    }
    print(json.dumps(bench.meta), flush=True)
    try:
        bench.host_times()
        print("host", json.dumps(bench.host), flush=True)
    except Exception:
        traceback.print_exc()
    if args.suite == "host":
        (args.out / "gpu-host.json").write_text(
            json.dumps({"meta": bench.meta, "host": bench.host}, indent=2)
        )
        return 0
    shapes = suite(args.suite)
    for i, shape in enumerate(shapes):
        if bench.elapsed() > args.budget_s:
            bench.skipped += [f"{s.text} {s.dtype}" for s in shapes[i:]]
            break
        try:
            row = bench.run_shape(shape)
        except Exception as exc:
            traceback.print_exc()
            row = Row(shape.text, shape.dtype, shape.group, errors={"shape": repr(exc)})
        bench.rows.append(row)
        speed = row.us.get("torch", math.nan) / row.us.get("unimatmul", math.nan)
        print(
            f"[{bench.elapsed():6.1f}s] {shape.text} {shape.dtype}: "
            + " ".join(f"{k}={v:.1f}" for k, v in row.us.items())
            + f" x{speed:.3f} tune={row.tune_ms.get('unimatmul', math.nan):.0f}ms "
            f"{row.notes.get('winner', '')} {row.errors or ''}",
            flush=True,
        )
        bench.write()
    ex_shapes = [
        Shape(1, 4096, 4096, "bf16"),
        Shape(1000, 1000, 1000, "bf16"),
        Shape(16, 28672, 4096, "bf16"),
    ]
    try:
        bench.exhaustive_mode(ex_shapes[: args.exhaustive])
    except Exception:
        traceback.print_exc()
    bench.write()
    data = json.loads((args.out / "gpu-bench.json").read_text())
    try:
        plot(data, args.out / "gpu-bench.png")
    except Exception:
        traceback.print_exc()
    print(json.dumps(data["summary"], indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
