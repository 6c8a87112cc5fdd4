"""Where a process's first tuning waits: a timeline of every thread's spans (GPU).

    TRITON_CACHE_DIR=$(mktemp -d) python benchmarks/first_tune_timeline.py --out DIR [--dense]

In one fresh process: imports torch and Triton, initialises CUDA, then tunes one product
through the door in tune mode (``unimatmul.grouped_matmul`` on Mixtral-8x7B's gate/up
experts at one token, or with ``--dense`` ``unimatmul.matmul`` on a 16x14336x4096 bf16
product), and records the start and end of, per thread:

- Triton's compile stages (``make_ir`` to ``make_cubin``), the C compiler's builds (the
  driver's helpers and the launchers), the plugin's compile jobs and launcher builds;
- the plugin's warming steps and its availability check;
- the harness's phases (the tuning, the float64 references, preparing candidates, the
  comparisons, the repeat against Default).

Times are seconds from the process's start. Writes ``timeline.json`` (the spans) and
``timeline.txt`` (one line a span, by start) under ``--out``; prints the first tuning's
wall time. Run it with an empty Triton cache (``TRITON_CACHE_DIR`` a new folder) and a
fresh cache file for a first time as a new machine sees it.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

SPANS: list[dict[str, Any]] = []


def span(kind: str, name: str, start: float, end: float) -> None:
    """Record one span of the calling thread (seconds from the process's start)."""
    SPANS.append(
        {
            "kind": kind,
            "name": name,
            "thread": threading.current_thread().name,
            "start": round(start - T0, 4),
            "end": round(end - T0, 4),
        }
    )


def timed(fn: Callable[..., Any], kind: str, name: str) -> Callable[..., Any]:
    """``fn`` recording a span of each call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            span(kind, name, start, time.perf_counter())

    return call


def wrap(owner: Any, attr: str, kind: str, *, static: bool = False) -> None:
    """Replace ``owner.attr`` by its :func:`timed` self (a staticmethod stays one)."""
    found = timed(getattr(owner, attr), kind, attr)
    setattr(owner, attr, staticmethod(found) if static else found)


def lines(spans: list[dict[str, Any]]) -> list[str]:
    """One line a span, by start: start, end, length, kind, name, thread."""
    return [
        f"{s['start']:8.3f} {s['end']:8.3f} {s['end'] - s['start']:7.3f}  {s['kind']:9} {s['name']:20} {s['thread']}"
        for s in sorted(spans, key=lambda s: (s["start"], s["end"]))
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dense", action="store_true", help="a dense product instead of a grouped one")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("UNIMATMUL_CACHE", str(Path(tempfile.mkdtemp()) / "cache.msgpack"))

    start = time.perf_counter()
    import torch

    span("import", "torch", start, time.perf_counter())
    if not torch.cuda.is_available():
        print("first_tune_timeline: needs a CUDA GPU", file=sys.stderr)
        return 2
    start = time.perf_counter()
    from triton.backends.nvidia import compiler as nvidia
    from triton.compiler import compiler as triton_compiler
    from triton.runtime import build

    span("import", "triton", start, time.perf_counter())
    for name in ("make_ttir", "make_ttgir"):
        wrap(nvidia.CUDABackend, name, "stage", static=True)
    for name in ("make_llir", "make_ptx", "make_cubin"):
        wrap(nvidia.CUDABackend, name, "stage")
    wrap(triton_compiler.ASTSource, "make_ir", "stage")
    wrap(build, "_build", "cc")
    start = time.perf_counter()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    span("init", "cuda", start, time.perf_counter())

    from unimatmul_triton import backend as triton_backend
    from unimatmul_triton import compiler as plugin_compiler

    wrap(plugin_compiler.Compiler, "_job", "job")
    wrap(plugin_compiler.Compiler, "_work", "job")
    wrap(plugin_compiler.Compiler, "_build_once", "launcher")
    for name in ("_triton_key", "_source_hashes", "_driver_helpers"):
        wrap(plugin_compiler, name, "warm")
    wrap(triton_backend.TritonBackend, "_find_availability", "available")

    from unimatmul.tuning import harness, tuner

    wrap(tuner.Tuner, "tune", "harness")
    wrap(tuner.Tuner, "prepare", "harness")
    wrap(harness, "reference_of", "harness")
    wrap(harness, "compare_output", "harness")
    wrap(harness.Harness, "_confirm", "harness")

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import moe_bench

    import unimatmul

    device = torch.device("cuda")
    if args.dense:
        a = torch.randn(16, 4096, device=device, dtype=torch.bfloat16)
        w = torch.randn(14336, 4096, device=device, dtype=torch.bfloat16)

        def call() -> Any:
            return unimatmul.matmul(a, w.t())

        what = "16x14336x4096 bf16 (unimatmul.matmul)"
    else:
        name, experts, hidden, inter, top_k, _ = moe_bench.config_named("mixtral-8x7b")
        counts = moe_bench.counts_of(1, experts, top_k, "uniform", seed=1)
        offs = moe_bench.offs_of(torch, counts, device)
        weights = moe_bench.expert_weights(torch, device, experts, hidden, inter)["gate_up"]
        x, b = moe_bench.operands_of(torch, weights, counts)

        def call() -> Any:
            return unimatmul.grouped_matmul(x, b, offs)

        what = f"{name} gate/up experts, 1 token (unimatmul.grouped_matmul)"
    torch.cuda.synchronize()
    start = time.perf_counter()
    with unimatmul.mode("tune"):
        call()
    torch.cuda.synchronize()
    end = time.perf_counter()
    span("total", "first_tuning", start, end)
    (args.out / "timeline.json").write_text(
        json.dumps({"what": what, "first_tuning_s": end - start, "spans": SPANS}, indent=1) + "\n"
    )
    (args.out / "timeline.txt").write_text("\n".join(lines(SPANS)) + "\n")
    print(f"{what}: first tuning {end - start:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
