"""What the harness's new checks do on a GPU, in one run (scripts/gpu_harness.sh calls it).

    python scripts/gpu_harness_check.py --out DIR [--device cuda:0] [--budget-s 240]

``--device cpu`` runs the same code on the CPU (a dry run of the script itself).
Sections, each recorded even if another fails:

1. headroom: every candidate the backends offer (cuBLASLt heuristics, padding, Default)
   for bf16 / f16 / f32 (tf32 on and off) products with and without epilogues and beta,
   run once on a poisoned output and compared with the element-wise bound
   (ErrorModel) and with the old rule (relative Frobenius error <= tolerance). Reports
   the largest error / bound of every accepted kernel per dtype, and every kernel the
   new rule rejects that the old one accepted (a false rejection unless it is wrong).
2. wrong kernels: one element off by +1.0 (f32, 1024^3, tf32 off), a NaN, a kernel that
   does nothing after its first call, a stale one and one that remembers results by
   address, on torch CUDA tensors (and CuPy arrays when CuPy imports): all rejected.
3. tuning: model shapes tuned with the default GPU settings: tuning time per shape
   (median, p90; it was 73 ms median before this change), winners, confirmations,
   confidence, candidates rejected and when.
4. memory: the peak of torch's allocator while tuning (20000,8)@(8,20000) f32 and
   bf16, against the product's own operands.

Writes harness-gpu.json (everything) and harness-gpu.md (the summary) under --out,
after every section.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import unimatmul
from unimatmul.cache.protocol import open_store
from unimatmul.cache.record import REJECTED
from unimatmul.core.arrays import Device, adapter_for_kind, make_operands
from unimatmul.core.backend import DEFAULT, Candidate, DefaultRunner, Runner, Target
from unimatmul.core.dtypes import ErrorModel, tolerance
from unimatmul.core.problem import Problem
from unimatmul.tuning.harness import Harness
from unimatmul.tuning.selector import Selector, set_selector


def parse_device(text: str) -> Device:
    if text == "cpu":
        return Device("cpu")
    kind, _, index = text.partition(":")
    return Device(kind, int(index or 0))


def problem_of(m: int, n: int, k: int, dtype: str, epilogue: str = "none", beta: bool = False) -> Problem:
    problem = Problem.from_shape(m, n, k, dtype=dtype, epilogue=epilogue)
    if beta:
        problem = Problem(**{**problem.__dict__, "beta_zero": False})
    return problem


# --- 1. headroom --------------------------------------------------------------------------

HEADROOM = [
    # (m, n, k, dtype, epilogue, beta)
    (1024, 1024, 1024, "bf16", "none", False),
    (4096, 4096, 4096, "bf16", "none", False),
    (1, 4096, 4096, "bf16", "none", False),
    (16, 4096, 14336, "bf16", "none", False),
    (16384, 4096, 128, "bf16", "none", False),
    (1024, 1025, 1024, "bf16", "none", False),
    (2048, 2048, 512, "bf16", "bias_relu", False),
    (2048, 3072, 768, "bf16", "bias_gelu_tanh", False),
    (1024, 1024, 4096, "bf16", "none", True),
    (31, 37, 41, "bf16", "bias_gelu_tanh", False),
    (1024, 1024, 1024, "f16", "none", False),
    (8192, 1024, 8192, "f16", "none", False),
    (16, 4096, 14336, "f16", "none", False),
    (2048, 3072, 768, "f16", "bias_gelu_tanh", False),
    (1024, 1024, 4096, "f16", "none", True),
    (1024, 1024, 1024, "f32", "none", False),
    (4096, 4096, 4096, "f32", "none", False),
    (16, 4096, 14336, "f32", "bias_relu", False),
    (1024, 1024, 4096, "f32", "none", True),
]


def headroom(target: Target, selector: Selector, tf32: bool | None, deadline: float) -> list[dict[str, Any]]:
    adapter, device = target.adapter, target.device
    rows: list[dict[str, Any]] = []
    for m, n, k, dtype, epilogue, beta_flag in HEADROOM:
        if tf32 is not None and dtype != "f32":
            continue
        if time.perf_counter() > deadline:
            rows.append({"stopped": "time budget", "shape": f"{m}x{n}x{k}", "dtype": dtype})
            continue
        beta = 1.0 if beta_flag else 0.0
        problem = problem_of(m, n, k, dtype, epilogue, beta_flag)
        if tf32 is not None:
            problem = Problem(**{**problem.__dict__, "compute": "tf32" if tf32 else "f32"})
        ops = make_operands(problem, adapter, device, np.random.default_rng(m * 7 + n * 3 + k))
        c0 = adapter.empty(tuple(adapter.shape(ops.out)), problem.dtype_c, device)
        adapter.copy_(c0, ops.out)
        model = ErrorModel.for_problem(
            k=k,
            dtype_in=problem.dtype_a,
            dtype_out=problem.dtype_c,
            compute=problem.compute,
            activation=problem.activation,
            ref_dtype="f64" if dtype == "f64" else "f32",
        )
        t0 = time.perf_counter()
        reference = adapter.make_reference(ops, c0, 1.0, beta, problem.activation, model, device)
        adapter.synchronize(device)
        reference_s = time.perf_counter() - t0
        old_ref = adapter.reference(ops.a, ops.b, c0, 1.0, beta, ops.bias, problem.activation)
        tol = tolerance(problem.dtype_c, problem.compute)
        for candidate, prepare in selector.tuner.entries(problem, target):
            row: dict[str, Any] = {
                "problem": problem.key,
                "shape": problem.shape_text,
                "dtype": dtype,
                "compute": problem.compute,
                "epilogue": epilogue,
                "beta": beta,
                "candidate": candidate.identity,
                "reference_s": reference_s,
            }
            try:
                runner = prepare()
                if beta:
                    adapter.copy_(ops.out, c0)
                else:
                    adapter.fill_nan(ops.out)
                runner(ops.a, ops.b, ops.out, 1.0, beta, ops.bias)
                adapter.synchronize(device)
                t0 = time.perf_counter()
                check = adapter.compare(ops.out, reference, device, exact=True)
                row["compare_s"] = time.perf_counter() - t0
                old = adapter.rel_error(ops.out, old_ref)
                row.update(
                    worst_ratio=check.worst_ratio,
                    bad=check.bad,
                    nonfinite=check.nonfinite,
                    rel_error=check.rel_error,
                    new_ok=check.ok(),
                    old_rel_error=old,
                    old_ok=bool(old <= tol),
                    worst=check.worst,
                )
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
    return rows


def summarize_headroom(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_dtype: dict[str, list[float]] = {}
    for r in rows:
        if r.get("new_ok"):
            key = f"{r['dtype']}/{r['compute']}"
            by_dtype.setdefault(key, []).append(r["worst_ratio"])
    return {
        "kernels": len(rows),
        "stopped": [r for r in rows if "stopped" in r],
        "errors": [r for r in rows if "error" in r],
        "largest_ratio_accepted": {k: max(v) for k, v in by_dtype.items()},
        "median_ratio_accepted": {k: statistics.median(v) for k, v in by_dtype.items()},
        "rejected_by_new_only": [r for r in rows if r.get("old_ok") and not r.get("new_ok")],
        "rejected_by_old_only": [r for r in rows if r.get("new_ok") and not r.get("old_ok")],
        "compare_s_median": statistics.median([r["compare_s"] for r in rows if "compare_s" in r] or [0.0]),
    }


# --- 2. wrong kernels ----------------------------------------------------------------------


class Fake:
    """A kernel computed by the array library, then spoiled as ``how`` says."""

    def __init__(self, adapter: Any, how: str) -> None:
        self.adapter = adapter
        self.how = how
        self.candidate = Candidate.make("fake", how)
        self.calls = 0
        self.memo: dict[Any, Any] = {}
        self.first: Any = None

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        self.calls += 1
        adapter, how = self.adapter, self.how
        index = (0,) * len(out.shape)
        if how == "first-call-only" and self.calls > 1:
            return
        if how == "stale" and self.first is not None:
            adapter.copy_(out, self.first)
            return
        key = (adapter.ptr(a), adapter.ptr(b), adapter.ptr(out))
        if how == "memo-by-pointer" and key in self.memo:
            adapter.copy_(out, self.memo[key])
            return
        adapter.matmul(a, b, out, alpha, beta, bias, None)
        if how == "one-off":
            out[index] += 1.0
        elif how == "one-nan":
            out[index] = float("nan")
        elif how == "stale":
            self.first = _copy(out)
        elif how == "memo-by-pointer":
            self.memo[key] = _copy(out)


def _returning(runner: Fake) -> Callable[[], Runner]:
    return lambda: runner


def _copy(x: Any) -> Any:
    return x.clone() if hasattr(x, "clone") else x.copy()


def wrong_kernels(target: Target, selector: Selector, shape: tuple[int, int, int]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    problem = Problem.from_shape(*shape)  # f32
    harness = Harness(selector.tuner.timer_for(target), selector.tuner.settings_for(target))
    for how in ("one-off", "one-nan", "first-call-only", "stale", "memo-by-pointer"):
        fake = Fake(target.adapter, how)
        entries: list[tuple[Candidate, Callable[[], Runner]]] = [
            (DEFAULT, lambda: DefaultRunner(target.adapter)),
            (Candidate.make("fake", how), _returning(fake)),
        ]
        try:
            record = harness.measure(problem, target, entries)
            result = record.result(f"fake/{how}")
            assert result is not None
            rows.append(
                {
                    "array": target.array_kind,
                    "shape": problem.shape_text,
                    "kernel": how,
                    "status": result.status,
                    "rejected": result.status == REJECTED,
                    "winner": record.winner,
                    "note": result.note,
                    "error": result.error,
                    "calls": fake.calls,
                }
            )
        except Exception as exc:
            rows.append(
                {"array": target.array_kind, "kernel": how, "exception": f"{type(exc).__name__}: {exc}"}
            )
    return rows


# --- 3. tuning ---------------------------------------------------------------------------

TUNE_SHAPES = [
    (m, n, k, dtype)
    for dtype in ("bf16", "f16")
    for m in (1, 16, 128, 1024, 8192)
    for n, k in ((2304, 768), (3072, 768), (768, 3072), (6144, 4096), (4096, 14336))
] + [
    (1024, 1025, 1024, "bf16"),
    (2047, 4095, 1023, "bf16"),
    (1000, 1000, 1000, "bf16"),
    (16384, 4096, 128, "bf16"),
]


def tuning(target: Target, deadline: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for m, n, k, dtype in TUNE_SHAPES:
        if time.perf_counter() > deadline:
            rows.append({"stopped": "time budget"})
            break
        problem = Problem.from_shape(m, n, k, dtype=dtype)
        selector = Selector(store=open_store(":memory:"))
        try:
            target.adapter.synchronize(target.device)
            t0 = time.perf_counter()
            record = selector.tune(problem, target, store=False)
            target.adapter.synchronize(target.device)
            wall = time.perf_counter() - t0
        except Exception as exc:
            rows.append(
                {"shape": problem.shape_text, "dtype": dtype, "exception": f"{type(exc).__name__}: {exc}"}
            )
            continue
        rejected = [r for r in record.results if r.status == REJECTED]
        rows.append(
            {
                "shape": problem.shape_text,
                "dtype": dtype,
                "wall_s": wall,
                "tune_s": record.tune_s,
                "winner": record.winner,
                "speedup": record.speedup,
                "candidates": len(record.results),
                "rejected": [(r.identity, r.note[:300]) for r in rejected],
                "confidence": record.settings.get("confidence"),
                "confirm": record.settings.get("confirm"),
                "noise": record.settings.get("noise"),
                "widen": record.settings.get("check", {}).get("widen"),
                "sets": record.settings.get("sets"),
            }
        )
    return rows


def summarize_tuning(rows: list[dict[str, Any]]) -> dict[str, Any]:
    walls = sorted(r["wall_s"] for r in rows if "wall_s" in r)
    verdicts: dict[str, int] = {}
    for r in rows:
        if r.get("confirm"):
            verdicts[r["confirm"]["verdict"]] = verdicts.get(r["confirm"]["verdict"], 0) + 1
    return {
        "shapes": len(walls),
        "median_s": statistics.median(walls) if walls else None,
        "p90_s": walls[int(0.9 * (len(walls) - 1))] if walls else None,
        "max_s": walls[-1] if walls else None,
        "low_confidence": sum(1 for r in rows if r.get("confidence") == "low"),
        "confirm_verdicts": verdicts,
        "with_rejections": [r for r in rows if r.get("rejected")],
        "widened": [r for r in rows if (r.get("widen") or 1.0) > 1.0],
        "exceptions": [r for r in rows if "exception" in r],
        "geomean_speedup": math.exp(statistics.mean(math.log(r["speedup"]) for r in rows if r.get("speedup")))
        if any(r.get("speedup") for r in rows)
        else None,
    }


# --- 4. memory --------------------------------------------------------------------------


def memory(target: Target) -> list[dict[str, Any]]:
    import torch

    rows: list[dict[str, Any]] = []
    if target.device.kind == "cpu":
        return rows
    index = target.device.index
    for dtype in ("f32", "bf16"):
        torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
        a = torch.randn(20000, 8, device=f"cuda:{index}", dtype=torch_dtype)
        b = torch.randn(8, 20000, device=f"cuda:{index}", dtype=torch_dtype)
        torch.cuda.synchronize(index)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(index)
        torch.cuda.reset_peak_memory_stats(index)
        plain = a @ b
        torch.cuda.synchronize(index)
        untuned = torch.cuda.max_memory_allocated(index) - base
        del plain
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(index)
        selector = Selector(store=open_store(":memory:"))
        old = set_selector(selector)
        t0 = time.perf_counter()
        out: Any = None
        try:
            with unimatmul.mode("tune"):
                out = unimatmul.matmul(a, b)
            torch.cuda.synchronize(index)
            record = next((r for _, _, r in selector.store.items()), None)
            error = None
        except Exception as exc:
            record, error = None, f"{type(exc).__name__}: {exc}"
        finally:
            set_selector(old)
        wall = time.perf_counter() - t0
        tuned = torch.cuda.max_memory_allocated(index) - base
        rows.append(
            {
                "shape": "20000x20000x8",
                "dtype": dtype,
                "operands_bytes": (a.numel() + b.numel()) * a.element_size()
                + 20000 * 20000 * a.element_size(),
                "untuned_peak_bytes": untuned,
                "tune_peak_bytes": tuned,
                "tune_wall_s": wall,
                "winner": record.winner if record else None,
                "memory_plan": Harness(selector.tuner.timer_for(target), selector.tuner.settings_for(target))
                .plan_memory(Problem.from_shape(20000, 20000, 8, dtype=dtype), target, 0.0)
                .to_dict(),
                "error": error,
            }
        )
        del a, b, out
        torch.cuda.empty_cache()
    return rows


# --- driver --------------------------------------------------------------------------------


def markdown(data: dict[str, Any]) -> str:
    lines = ["# Harness checks on the GPU", ""]
    h = data.get("headroom_summary") or {}
    if h:
        lines += [
            f"Headroom: {h['kernels']} kernels; median compare {h['compare_s_median'] * 1e3:.2f} ms.",
            "",
            "| dtype/compute | largest error/bound accepted | median |",
            "|---|---|---|",
        ]
        for key, value in h["largest_ratio_accepted"].items():
            lines.append(f"| {key} | {value:.3f} | {h['median_ratio_accepted'][key]:.3f} |")
        lines += ["", f"Rejected by the element-wise bound only: {len(h['rejected_by_new_only'])}"]
        for r in h["rejected_by_new_only"][:40]:
            lines.append(
                f"- {r['shape']} {r['dtype']} {r['epilogue']} beta={r['beta']} {r['candidate']}: {r['worst']}"
            )
        lines += ["", f"Rejected by the old norm only: {len(h['rejected_by_old_only'])}", ""]
    w = data.get("wrong_kernels") or []
    if w:
        lines += ["| array | kernel | status | winner | calls |", "|---|---|---|---|---|"]
        for r in w:
            status = r.get("status", r.get("exception"))
            lines.append(
                f"| {r.get('array')} | {r.get('kernel')} | {status} | {r.get('winner')} | {r.get('calls')} |"
            )
        lines.append("")
    t = data.get("tuning_summary") or {}
    if t:
        lines += [
            f"Tuning: {t['shapes']} shapes, median {1e3 * (t['median_s'] or 0):.0f} ms, "
            f"p90 {1e3 * (t['p90_s'] or 0):.0f} ms, max {1e3 * (t['max_s'] or 0):.0f} ms; "
            f"low confidence {t['low_confidence']}; confirmations {t['confirm_verdicts']}; "
            f"geomean speedup {t['geomean_speedup']}; shapes with rejections {len(t['with_rejections'])}; "
            f"widened {len(t['widened'])}; exceptions {len(t['exceptions'])}",
            "",
        ]
    for r in data.get("memory") or []:
        lines.append(
            f"Memory {r['shape']} {r['dtype']}: operands {r['operands_bytes'] / 2**30:.2f} GiB, untuned peak "
            f"{r['untuned_peak_bytes'] / 2**30:.2f} GiB, tuning peak {r['tune_peak_bytes'] / 2**30:.2f} GiB "
            f"({r['tune_wall_s']:.1f} s, winner {r['winner']}, error {r['error']})"
        )
    for name, text in (data.get("failures") or {}).items():
        lines += ["", f"## {name} failed", "", "```", text[-3000:], "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--quick", action="store_true", help="small shapes only (a dry run on a CPU)")
    args = parser.parse_args()
    if args.quick:
        HEADROOM[:] = [h for h in HEADROOM if h[0] * h[1] * h[2] <= 1 << 28]
        TUNE_SHAPES[:] = [t for t in TUNE_SHAPES if t[0] * t[1] * t[2] <= 1 << 24]
    import torch

    started = time.perf_counter()
    deadline = started + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    device = parse_device(args.device)
    target = Target(adapter_for_kind("torch"), device)
    selector = Selector(store=open_store(":memory:"))
    data: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "failures": {}}
    if device.kind != "cpu":
        data["gpu"] = torch.cuda.get_device_name(device.index)

    def save() -> None:
        (args.out / "harness-gpu.json").write_text(json.dumps(data, indent=1, default=str))
        (args.out / "harness-gpu.md").write_text(markdown(data))

    def section(name: str, run: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        try:
            run()
        except Exception:
            data["failures"][name] = traceback.format_exc()
        data.setdefault("section_s", {})[name] = time.perf_counter() - t0
        print(f"== {name}: {time.perf_counter() - t0:.1f} s", flush=True)
        save()

    def run_headroom() -> None:
        until = started + 0.4 * args.budget_s
        rows = headroom(target, selector, None, until)
        if device.kind != "cpu":
            saved = torch.backends.cuda.matmul.allow_tf32
            for flag in (True, False):
                torch.backends.cuda.matmul.allow_tf32 = flag
                rows += headroom(target, selector, flag, until)
            torch.backends.cuda.matmul.allow_tf32 = saved
        data["headroom"] = rows
        data["headroom_summary"] = summarize_headroom(rows)

    def run_wrong() -> None:
        saved = torch.backends.cuda.matmul.allow_tf32 if device.kind != "cpu" else None
        if saved is not None:
            torch.backends.cuda.matmul.allow_tf32 = False
        rows = wrong_kernels(target, selector, (512, 512, 512) if args.quick else (1024, 1024, 1024))
        try:
            import cupy  # noqa: F401

            if device.kind != "cpu":
                rows += wrong_kernels(Target(adapter_for_kind("cupy"), device), selector, (512, 512, 512))
        except ImportError:
            rows.append({"array": "cupy", "kernel": "-", "status": "cupy not installed"})
        if saved is not None:
            torch.backends.cuda.matmul.allow_tf32 = saved
        data["wrong_kernels"] = rows

    def run_tuning() -> None:
        rows = tuning(target, deadline - 0.2 * args.budget_s)
        data["tuning"] = rows
        data["tuning_summary"] = summarize_tuning(rows)

    def run_memory() -> None:
        data["memory"] = memory(target)

    section("headroom", run_headroom)
    section("wrong_kernels", run_wrong)
    section("tuning", run_tuning)
    section("memory", run_memory)
    data["total_s"] = time.perf_counter() - started
    save()
    print(markdown(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
