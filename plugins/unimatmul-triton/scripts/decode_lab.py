"""Decode on the H200: a GEMV built like the weight-read kernel, against the plugin's.

The plugin's GEMV and skinny kernels ran 1.9-2.5 us above a kernel that only
reads the weight, on the 33-34 MB weights, whatever their configuration. The read kernel's
fastest configurations stream 32 KB a program per iteration (``block=16384``, 8 warps), two
programs per SM, each over one contiguous chunk. This script tries a GEMV shaped the same
way (``rows_kernel``): program p owns a contiguous band of whole weight rows, loads
[BLOCK_N, BLOCK_K] tiles along them (contiguous, vectorised), multiplies by the rows of x
and sums each tile at once (or, with LATE, keeps [BLOCK_N, BLOCK_K] partial sums and sums
them after the K loop, as the plugin's GEMV does). Grid: 1, 2 or 4 programs a SM, or one
per BLOCK_N rows.

For each decode shape (m = 1, 4; Llama-3-8B and Qwen2-7B weights, bf16, ``x @ W.T``):
every configuration is timed (CUDA graphs of 20 calls, weights rotated through > 3x L2,
5 interleaved replays), then the best five against ``torch.matmul``, the plugin's best
offered candidate, the read kernel and ``torch.sum`` of the weight (a second reader), in
the same turns (15 replays, medians). Results: ``$OUT/decode-lab.json`` and ``.md``::

    python3 plugins/unimatmul-triton/scripts/decode_lab.py [--budget-s 200] [--m 1,4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import Budget, graph_of, interleaved, read_graph, rotated_sets

SHAPES = [(4096, 4096), (4608, 3584), (14336, 4096), (4096, 14336)]
TILES = [(1, 4096), (2, 2048), (2, 4096), (4, 1024), (4, 2048), (4, 4096), (8, 1024), (8, 2048), (16, 512)]
WARPS = (4, 8)
GRIDS = (1, 2, 4, 0)  # programs a SM; 0: one a BLOCK_N rows


def rows_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(
        x_ptr,
        w_ptr,
        y_ptr,
        M,
        N,
        K,
        rows_per_prog,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        EVEN_K: tl.constexpr,
        LATE: tl.constexpr,
    ):
        pid = tl.program_id(0)
        row0 = pid * rows_per_prog
        offs_m = tl.arange(0, BLOCK_M)
        offs_k = tl.arange(0, BLOCK_K)
        mask_m = offs_m < M
        for n0 in range(row0, row0 + rows_per_prog, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < N
            w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * K + offs_k[None, :]
            x_ptrs = x_ptr + offs_m[:, None] * K + offs_k[None, :]
            if LATE:
                part = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
            else:
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                if EVEN_K:
                    w = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0)
                    x = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
                else:
                    in_k = (k0 + offs_k)[None, :] < K
                    w = tl.load(w_ptrs, mask=mask_n[:, None] & in_k, other=0.0)
                    x = tl.load(x_ptrs, mask=mask_m[:, None] & in_k, other=0.0)
                prod = x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
                if LATE:
                    part += prod
                else:
                    acc += tl.sum(prod, axis=2)
                w_ptrs += BLOCK_K
                x_ptrs += BLOCK_K
            if LATE:
                acc = tl.sum(part, axis=2)
            y_ptrs = y_ptr + offs_m[:, None] * N + offs_n[None, :]
            tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])

    return kernel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/decode-lab"))
    parser.add_argument("--budget-s", type=float, default=200.0)
    parser.add_argument("--m", default="1,4")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device")
        return 3
    from unimatmul_triton import TritonBackend

    from unimatmul import Problem
    from unimatmul.backend import Device, Target, adapter_for_kind

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget_s)
    backend = TritonBackend()
    target = Target(adapter_for_kind("torch"), Device("cuda", 0))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kernel = rows_kernel()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: list[dict[str, Any]] = []
    for n, k in SHAPES:
        sets = rotated_sets(n, k)
        weights = [torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(sets)]
        read, read_config, read_buffers = read_graph(budget, torch, weights)
        for m in (int(v) for v in args.m.split(",")):
            if budget.left() < 20:
                budget.note(f"budget reached before {m}x{n}x{k}")
                break
            xs = [torch.randn(m, k, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(sets)]
            outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
            ref = (xs[0].double() @ weights[0].double().t()).float()
            block_m = max(1, 1 << (m - 1).bit_length())
            graphs: dict[str, Any] = {}
            wrong: list[str] = []
            t0 = time.perf_counter()
            for block_n, block_k in TILES:
                for late in (False, True):
                    if late and block_m * block_n * block_k > 8192:
                        continue
                    for warps in WARPS:
                        if budget.left() < 60:
                            break  # what is compiled is measured
                        for per_sm in GRIDS:
                            grid = per_sm * sms if per_sm else -(-n // block_n)
                            per_program = -(-n // grid)  # rows, then whole tiles of BLOCK_N
                            rows_per = -(-per_program // block_n) * block_n
                            grid = -(-n // rows_per)
                            name = (
                                f"rows n{block_n} k{block_k} w{warps} {'late' if late else 'each'} grid{grid}"
                            )

                            def call(
                                x: Any,
                                w: Any,
                                o: Any,
                                g: int = grid,
                                r: int = rows_per,
                                mnk: tuple = (m, n, k),
                                **kw: Any,
                            ) -> Any:
                                return kernel[(g,)](x, w, o, *mnk, r, **kw)

                            meta = dict(
                                BLOCK_M=block_m,
                                BLOCK_N=block_n,
                                BLOCK_K=block_k,
                                EVEN_K=k % block_k == 0,
                                LATE=late,
                                num_warps=warps,
                            )
                            try:
                                outs[0].fill_(float("nan"))
                                call(xs[0], weights[0], outs[0], **meta)
                                torch.cuda.synchronize()
                            except Exception as exc:
                                wrong.append(f"{name}: {type(exc).__name__}: {str(exc)[:120]}")
                                continue
                            err = float((outs[0].float() - ref).norm() / ref.norm())
                            if not err <= 2e-2:
                                wrong.append(f"{name}: rel error {err:.3g}")
                                continue
                            calls = [
                                (lambda x=x, w=w, o=o, meta=meta, call=call: call(x, w, o, **meta))
                                for x, w, o in zip(xs, weights, outs, strict=True)
                            ]
                            graphs[name] = graph_of(torch, calls)
            sweep_s = time.perf_counter() - t0
            measured = interleaved(torch, graphs, 5)
            best5 = sorted(measured, key=measured.__getitem__)[:5]
            # The plugin's offered candidates (what tuning measures), the fastest of them.
            problem = Problem(
                m=m, n=n, k=k, dtype_a="bf16", dtype_b="bf16", dtype_c="bf16", trans_b=True, ldb=k
            )
            plugin_graphs = {}
            for cand in backend.candidates(problem, target):
                runner = backend.prepare(problem, cand, target)
                calls = [
                    (lambda r=runner, x=x, w=w, o=o: r(x, w.t(), o))
                    for x, w, o in zip(xs, weights, outs, strict=True)
                ]
                plugin_graphs[cand.identity] = graph_of(torch, calls)
            plugin_measured = interleaved(torch, plugin_graphs, 5)
            plugin_best = min(plugin_measured, key=plugin_measured.__getitem__)
            torch_calls = [
                (lambda x=x, w=w, o=o: torch.matmul(x, w.t(), out=o))
                for x, w, o in zip(xs, weights, outs, strict=True)
            ]
            sums = [torch.empty((), device="cuda", dtype=torch.float32) for _ in weights]
            sum_calls = [
                (lambda w=w, s=s: torch.sum(w, dim=(0, 1), dtype=torch.float32, out=s))
                for w, s in zip(weights, sums, strict=True)
            ]
            timed = {
                "torch": graph_of(torch, torch_calls),
                "plugin": plugin_graphs[plugin_best],
                "read": read,
                "torch.sum": graph_of(torch, sum_calls),
                **{name: graphs[name] for name in best5},
            }
            final = interleaved(torch, timed, 15)
            weight_bytes = n * k * 2
            row = {
                "shape": f"{m}x{n}x{k}",
                "configs": len(graphs),
                "sweep_s": round(sweep_s, 1),
                "wrong": wrong[:10],
                "us": {key: round(v * 1e6, 2) for key, v in final.items()},
                "tbs": {key: round(weight_bytes / v / 1e12, 3) for key, v in final.items()},
                "plugin_best": plugin_best,
                "read_config": read_config,
                "best_rows": best5[0],
            }
            t = final["torch"]
            row["speedup"] = {key: round(t / v, 4) for key, v in final.items() if key != "torch"}
            rows.append(row)
            budget.note(
                f"{row['shape']:>14}: torch {row['us']['torch']:.2f} us, plugin {row['us']['plugin']:.2f}, "
                f"rows best {row['us'][best5[0]]:.2f} ({best5[0]}), read {row['us']['read']:.2f}, "
                f"torch.sum {row['us']['torch.sum']:.2f}; {len(graphs)} configs in {sweep_s:.0f} s, {len(wrong)} refused"
            )
            (out / "decode-lab.json").write_text(json.dumps({"rows": rows}, indent=1))
            del graphs, plugin_graphs, timed
            torch.cuda.empty_cache()
        del weights, read, read_buffers
        torch.cuda.empty_cache()
    lines = [
        "# A GEMV built like the weight-read kernel (decode, bf16, `x @ W.T`), H200",
        "",
        "Speedup over `torch.matmul` in the same turns (15 interleaved replays, medians); TB/s of the weight's bytes.",
        "",
        "| shape | torch us | plugin best | rows best | read kernel | torch.sum | rows config |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        sp, us = row["speedup"], row["us"]
        best = row["best_rows"]
        lines.append(
            f"| {row['shape']} | {us['torch']:.2f} | {us['plugin']:.2f} ({sp['plugin']:.3f}x) | {us[best]:.2f} "
            f"({sp[best]:.3f}x) | {us['read']:.2f} ({sp['read']:.3f}x) | {us['torch.sum']:.2f} ({sp['torch.sum']:.3f}x) | {best} |"
        )
    if rows:
        lines.append("")
        lines.append(
            "medians over the shapes: plugin "
            f"{statistics.median(r['speedup']['plugin'] for r in rows):.3f}x, rows "
            f"{statistics.median(r['speedup'][r['best_rows']] for r in rows):.3f}x, read "
            f"{statistics.median(r['speedup']['read'] for r in rows):.3f}x, torch.sum "
            f"{statistics.median(r['speedup']['torch.sum'] for r in rows):.3f}x"
        )
    (out / "decode-lab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
