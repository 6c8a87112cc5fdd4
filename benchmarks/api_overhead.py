"""Host time per cached call: ``torch.matmul`` against ``unimatmul.matmul`` and routed calls.

For one problem (default bf16 64x256x256 on the GPU, f32 16x64x64 on the CPU) the choice
is measured three ways: as tuned, with Default forced and with the best kernel forced
(the record's winner replaced), since the two paths cost different host time. Each
call form runs ``--calls`` times per sample, the forms interleaved, ``--rounds`` samples;
per call: the median over rounds of the thread's CPU time (``time.thread_time``: the
host's own work, steady on a shared machine) and of the wall time. Confirmation windows
are off here (they last 34 calls; this measures what comes after them).

The grouped door (``aten::_grouped_mm``, MoE experts) is measured the same way
(``grouped`` in the JSON): ``torch._grouped_mm`` with routing off, and routed as tuned, with
Default forced and with the best kernel forced (routing off and on in turns, a round
each), for one grouped problem (``--grouped-shape
ROWSxGROUPSxNxK``, the rows split evenly; default bf16 128x8x256x256 on the GPU, f32
16x4x16x16 on the CPU: small, so that the host's time is what a call costs).

    python benchmarks/api_overhead.py --device cuda --json api-overhead.json   # < 1 minute
    python benchmarks/api_overhead.py --device cpu --json benchmarks/results/host-time/api-overhead-cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

import unimatmul
import unimatmul.torch as ut
from unimatmul import api
from unimatmul.backend import DEFAULT, Target
from unimatmul.cache.record import OK, PRUNED
from unimatmul.core.arrays import adapter_of
from unimatmul.core.problem import Problem
from unimatmul.torch import grouped_routing, native
from unimatmul.tuning.selector import get_selector

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def per_call(
    forms: dict[str, Callable[[], Any]],
    calls: int,
    rounds: int,
    sync: Callable[[], None],
    around: dict[str, Callable[[], Any]] | None = None,
) -> dict:
    """Each form's host and wall time per call, the forms interleaved. ``around``: a context
    a form runs in (made anew each round, e.g. routing turned on: that form's first 50 calls
    of each round are not timed, as the door's plans are made again)."""
    around = around or {}
    cpu: dict[str, list[float]] = {name: [] for name in forms}
    wall: dict[str, list[float]] = {name: [] for name in forms}
    for name, fn in forms.items():  # warm: allocator, caches, windows already judged
        with around.get(name, contextlib.nullcontext)():
            for _ in range(50):
                fn()
    sync()
    for _ in range(rounds):
        for name, fn in forms.items():
            with around.get(name, contextlib.nullcontext)():
                if name in around:
                    for _ in range(50):
                        fn()
                    sync()
                t_cpu, t_wall = time.thread_time(), time.perf_counter()
                for _ in range(calls):
                    fn()
                sync()
                cpu[name].append((time.thread_time() - t_cpu) / calls * 1e6)
                wall[name].append((time.perf_counter() - t_wall) / calls * 1e6)
    return {
        name: {
            "host_us": round(statistics.median(cpu[name]), 3),
            "host_us_min": round(min(cpu[name]), 3),
            "wall_us": round(statistics.median(wall[name]), 3),
        }
        for name in forms
    }


def force(problem: Problem, target: Target, which: str) -> str:
    """Store the record's winner as ``which`` (default, or the fastest checked kernel); its identity."""
    selector = get_selector()
    namespace = selector.platform(target).namespace
    record = selector.store.get(namespace, problem.key)
    if which == "tuned" or record is None:
        return record.winner if record is not None else DEFAULT.identity
    if which == "default":
        winner = DEFAULT.identity
    else:
        kernels = [r for r in record.results if r.status in (OK, PRUNED) and r.identity != DEFAULT.identity]
        if not kernels:
            return ""
        winner = min(kernels, key=lambda r: r.median_s or math.inf).identity
    selector.store.put(namespace, problem.key, replace(record, winner=winner, settings={}))
    api.clear_fast_path()
    return winner


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="f32, bf16 or f16 (default: bf16 on a GPU, f32 on the CPU)")
    p.add_argument("--shape", default=None, help="MxNxK (default: 64x256x256 on a GPU, 16x64x64 on the CPU)")
    p.add_argument("--grouped-shape", default=None, help="ROWSxGROUPSxNxK of the grouped problem")
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    gpu = args.device.startswith("cuda")
    if not gpu:
        torch.set_num_threads(1)
    built = native.load(gpu)
    selector = get_selector()
    confirm_calls = selector.confirm_calls
    selector.confirm_calls = 0  # windows are measured elsewhere (scripts/gpu_confirm.py)
    try:
        report = measure(args, gpu, built)
        report["grouped"] = measure_grouped(args, gpu)
    finally:
        selector.confirm_calls = confirm_calls
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def measure(args: argparse.Namespace, gpu: bool, built: bool) -> dict[str, Any]:
    dtype = DTYPES[args.dtype or ("bf16" if gpu else "f32")]
    m, n, k = (int(x) for x in (args.shape or ("64x256x256" if gpu else "16x64x64")).split("x"))
    device = torch.device(args.device)
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    c = torch.empty(m, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    with unimatmul.mode("tune"):
        unimatmul.matmul(a, b)
    adapter = adapter_of(a)
    problem = Problem.from_operands(adapter, a, b)[0]
    target = Target(adapter, adapter.device(a))
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "torch": torch.__version__,
        "problem": problem.key,
        "calls": args.calls,
        "rounds": args.rounds,
        "native_built": built,
        "choices": {},
    }
    for which in ("tuned", "default", "kernel"):
        winner = force(problem, target, which)
        if not winner:
            report["choices"][which] = {"skipped": "no kernel passed the check"}
            continue
        unimatmul.matmul(a, b)
        unimatmul.matmul(a, b, out=c)
        off = per_call(
            {
                "torch.matmul": lambda: torch.matmul(a, b),
                "torch.matmul(out=)": lambda: torch.matmul(a, b, out=c),
                "unimatmul.matmul": lambda: unimatmul.matmul(a, b),
                "unimatmul.matmul(out=)": lambda: unimatmul.matmul(a, b, out=c),
            },
            args.calls,
            args.rounds,
            sync,
        )
        with ut.enabled():
            routed = per_call(
                {
                    "torch.matmul(out=) [routing on]": lambda: torch.matmul(a, b, out=c),  # never routed
                    "torch.mm routed": lambda: torch.mm(a, b),
                    "torch.matmul routed": lambda: torch.matmul(a, b),
                },
                args.calls,
                args.rounds,
                sync,
            )
            plans = [(p.op, p.label, p.native) for p in ut.plans()]
        report["choices"][which] = {
            "winner": winner,
            "native_api_path": getattr(api, "_native_call", None) is not None,
            **_shown(f"{which}: {winner}", off, routed),
            "plans": plans,
        }
    return report


def _shown(title: str, off: dict[str, Any], routed: dict[str, Any]) -> dict[str, Any]:
    """Print one choice's rows under ``title``; the report's routing_off and routing_on."""
    print(f"\n{title}")
    for name, row in {**off, **routed}.items():
        print(f"  {name:34s} host {row['host_us']:7.2f} us   wall {row['wall_us']:7.2f} us")
    return {"routing_off": off, "routing_on": routed}


def measure_grouped(args: argparse.Namespace, gpu: bool) -> dict[str, Any]:
    """The grouped door's host time per call (the module docstring)."""
    dtype = DTYPES[args.dtype or ("bf16" if gpu else "f32")]
    shape = args.grouped_shape or ("128x8x256x256" if gpu else "16x4x16x16")
    rows, groups, n, k = (int(x) for x in shape.split("x"))
    device = torch.device(args.device)
    a = torch.randn(rows, k, device=device, dtype=dtype)
    # [G, K, N] as a transposed view of [G, N, K] weights, as transformers keeps them
    b = torch.randn(groups, n, k, device=device, dtype=dtype).transpose(-2, -1)
    offs = (torch.arange(1, groups + 1, device=device, dtype=torch.int32) * rows) // groups
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    with ut.enabled(), unimatmul.mode("tune"):
        torch._grouped_mm(a, b, offs)
        plan = next(p for p in grouped_routing.plans() if p.problem is not None)
    problem, target = plan.problem, plan.target
    assert problem is not None and target is not None  # a plan that routing took
    report: dict[str, Any] = {"shape": shape, "problem": problem.key, "choices": {}}
    for which in ("tuned", "default", "kernel"):
        winner = force(problem, target, which)
        if not winner:
            report["choices"][which] = {"skipped": "no kernel passed the check"}
            continue

        def call() -> Any:
            return torch._grouped_mm(a, b, offs)

        off_name, on_name = "torch._grouped_mm", "torch._grouped_mm routed"
        # routing off and on in turns, a round each
        rows = per_call(
            {off_name: call, on_name: call}, args.calls, args.rounds, sync, around={on_name: ut.enabled}
        )
        off, routed = {off_name: rows[off_name]}, {on_name: rows[on_name]}
        with ut.enabled():
            call()  # the routed plans, for the report
            plans = grouped_routing.plans()
        report["choices"][which] = {
            "winner": winner,
            **_shown(f"grouped {shape}, {which}: {winner}", off, routed),
            "plans": [p.label for p in plans],
            # the native table's entry kind of each plan (native.DEFAULT, LAUNCH, PYTHON; -1: none)
            "native": [p.native for p in plans],
        }
    return report


if __name__ == "__main__":
    sys.exit(main())
