"""fp8 on the GPU in one run: the fp8 tests, the benchmark against torch._scaled_mm, an fp8 stack.

Run by ``scripts/gpu_fp8.sh`` (which installs unimatmul for its entry points first)::

    python3 scripts/gpu_fp8.py --out DIR [--budget-s SECONDS] [--quick] [--device cpu]

1. **Tests**: ``pytest tests/backends/cuda/test_cuda_fp8_gpu.py`` in a subprocess (cuBLASLt fp8
   candidates checked against the dequantised float64 product, graphs, routing,
   torch.compile, the conformance suite's scaled cases); log in ``fp8-tests.log``.
2. **Which kernels torch runs**: the profiler's kernel names for ``torch._scaled_mm``
   with per-tensor and row-wise scales (cuBLASLt or CUTLASS on this machine).
3. **Benchmark**: the linear layers of Llama-3-8B (fused q/k/v 6144x4096, o 4096x4096,
   fused gate/up 28672x4096, down 4096x14336) and Qwen-7B (fused c_attn 12288x4096,
   fused w1/w2 22016x4096, mlp c_proj 4096x11008; its 4096x4096 is Llama's) at m = 1,
   16, 128, 1024, 8192, per-tensor and row-wise scales, e4m3 in, bf16 out. Columns:
   ``torch._scaled_mm`` (its ``out=`` form) and unimatmul's tuned choice (the Selector
   tunes the problem, the winner's runner is timed). Timing by ``benchmarks/paired_timing.py``:
   each column one CUDA graph of back-to-back calls over inputs rotated through > 3.2x L2,
   captured once, the graphs replayed in alternating rounds (A B, B A, ...); the speedup is
   the median of the rounds' own ratios (``speedup_method``, ``round_ratios`` in the JSON).
   The candidates are cuBLASLt's heuristic list plus ``--exhaustive N`` (default 16)
   configurations of the exhaustive search (``UNIMATMUL_LT_EXHAUSTIVE``); 0 for the
   heuristic list alone.
4. **fp8 linear stack**: 4 Llama-3-8B-sized blocks of fp8 linears (weights quantised
   once; per call the activation is quantised and ``torch._scaled_mm`` runs), tokens per
   second with routing off and on (``unimatmul.torch.enable()``, problems tuned in one
   pass first, then 12 routed eager forwards that close the confirmation windows), eager
   and as a replayed CUDA graph, m = 1 (decode) and 128 (prefill). Off and on alternate
   round by round (ABBA, 15 rounds of 20 forwards); the speedup is the median of the
   rounds' own ratios. A graph row captures 8 graphs per state (off, on, on, off, ...)
   and times their mean: two graphs of the same kernels can run ~1 % apart, and the
   spread column (a state's slowest graph over its fastest) shows by how much.

5. **Products of fp8 checkpoints** (``--parts models``): 25 fp8 products of Llama-3.1-8B/70B
   (row-wise; two per-tensor), Qwen3-8B/32B-FP8 and DeepSeek-V3 (block-scaled: 1x128
   activation groups, 128x128 weight blocks), nn.Linear layout, m from 1 to 4096, each
   tuned (cuBLASLt and Triton candidates) and timed as in 3; block-scaled rows also time
   torch's per-tensor product on the same shape (the figure where torch has no
   block-scaled one). The summary states each figure against the issue's targets.

Everything is written under ``--out`` as it is measured (``fp8-bench.json``,
``fp8-summary.md``), and the summary table is printed last. ``--device cpu`` runs the
same code on tiny shapes with host timing: a smoke test of this script, not a result.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

M_VALUES = (1, 16, 128, 1024, 8192)
# (model, layer, n, k): y[m, n] = x[m, k] @ w[n, k].t()
LAYERS = [
    ("llama3-8b", "qkv", 6144, 4096),
    ("llama3-8b", "o_proj", 4096, 4096),
    ("llama3-8b", "gate_up", 28672, 4096),
    ("llama3-8b", "down", 4096, 14336),
    ("qwen-7b", "c_attn", 12288, 4096),
    ("qwen-7b", "w1_w2", 22016, 4096),
    ("qwen-7b", "mlp_c_proj", 4096, 11008),
]
#: The ``models`` part: fp8 products of real fp8 checkpoints, nn.Linear layout (n, k from
#: their configs), each at the m values listed, in this order (the budget cuts the tail).
#: Scales as the checkpoints ship them: Llama-3.1-FP8 row-wise (per-channel weights,
#: per-token activations; per-tensor for two rows), Qwen3-FP8 and DeepSeek-V3 block-scaled
#: (128x128 weight blocks, 1x128 activation groups). (model, layer, n, k, scales, m values)
MODEL_PRODUCTS: list[tuple[str, str, int, int, str, tuple[int, ...]]] = [
    ("llama3.1-8b", "gate_up", 28672, 4096, "rowwise", (1, 4, 256)),
    ("llama3.1-70b", "gate_up", 57344, 8192, "rowwise", (1, 16)),
    ("deepseek-v3", "o_proj", 7168, 16384, "block", (1, 1024)),
    ("qwen3-8b", "gate_up", 24576, 4096, "block", (16, 256)),
    ("llama3.1-8b", "qkv", 6144, 4096, "rowwise", (1, 64)),
    ("llama3.1-8b", "down", 4096, 14336, "rowwise", (16, 4096)),
    ("deepseek-v3", "dense_gate_up", 36864, 7168, "block", (4,)),
    ("deepseek-v3", "dense_down", 7168, 18432, "block", (16,)),
    ("qwen3-32b", "o_proj", 5120, 8192, "block", (1,)),
    ("llama3.1-70b", "down", 8192, 28672, "rowwise", (64,)),
    ("qwen3-8b", "qkv", 6144, 4096, "block", (1, 1024)),
    ("llama3.1-8b", "o_proj", 4096, 4096, "rowwise", (16, 1024)),
    ("deepseek-v3", "q_a_kv_a", 2112, 7168, "block", (16,)),
    ("deepseek-v3", "q_b", 24576, 1536, "block", (256,)),
    ("deepseek-v3", "kv_b", 32768, 512, "block", (64,)),
    ("deepseek-v3", "expert_gate_up", 4096, 7168, "block", (64,)),
    ("deepseek-v3", "expert_down", 7168, 2048, "block", (256,)),
    ("qwen3-8b", "down", 4096, 12288, "block", (4,)),
    ("qwen3-32b", "gate_up", 51200, 5120, "block", (16,)),
    ("qwen3-32b", "qkv", 10240, 5120, "block", (64,)),
    ("qwen3-32b", "down", 5120, 25600, "block", (4096,)),
    ("llama3.1-70b", "qkv", 10240, 8192, "rowwise", (1, 256)),
    ("llama3.1-70b", "o_proj", 8192, 8192, "rowwise", (4,)),
    ("llama3.1-8b", "gate_up", 28672, 4096, "tensor", (1,)),
    ("llama3.1-8b", "down", 4096, 14336, "tensor", (1024,)),
]
FP8_MAX = 448.0  # float8_e4m3fn
#: benchmarks/: the timing, host-time and profiling helpers this script borrows (paired_timing,
#: api_overhead, profile_decode).
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import paired_timing  # noqa: E402

#: The stack: forwards a sample, rounds of off and on (ABBA), routed eager forwards before timing.
STACK_CALLS = 20
STACK_ROUNDS = 15
WARM_FORWARDS = 12
#: Graph rows: graphs captured per state (their mean is the state's time).
GRAPHS_PER_STATE = 8
#: A stack row below this speedup is profiled (host and device time per op, off and on).
PROFILE_BELOW = 1.0


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def operands(
    m: int, n: int, k: int, scales: str, count: int, device: Any, seed: int
) -> list[tuple[Any, ...]]:
    """``count`` input sets of an fp8 linear product: (a, w.t(), scale_a, scale_b, out),
    e4m3 operands, per-tensor, row-wise or block scales, a bf16 output."""
    gen = torch.Generator(device=device).manual_seed(seed)
    sets = []
    for _ in range(count):
        a = torch.randn(m, k, device=device, generator=gen).to(torch.float8_e4m3fn)
        w = torch.randn(n, k, device=device, generator=gen).to(torch.float8_e4m3fn)
        if scales == "rowwise":
            sa = torch.rand(m, 1, device=device, generator=gen).add_(0.5).div_(16)
            sb = torch.rand(1, n, device=device, generator=gen).add_(0.5).div_(16)
        elif scales == "block":
            # torch's layouts: [m, k/128] outer-dim-major, and w_scale.t() of [n/128, k/128].
            kb, nb = -(-k // 128), -(-n // 128)
            sa = torch.rand(kb, m, device=device, generator=gen).add_(0.5).div_(16).t()
            sb = torch.rand(nb, kb, device=device, generator=gen).add_(0.5).div_(16).t()
        else:
            sa = torch.tensor(0.0625, device=device)
            sb = torch.tensor(0.03125, device=device)
        out = torch.empty(m, n, device=device, dtype=torch.bfloat16)
        sets.append((a, w.t(), sa, sb, out))
    return sets


class Run:
    def __init__(self, out: Path, budget_s: float, device: str, quick: bool) -> None:
        from unimatmul.backend import Target
        from unimatmul.cache.protocol import MemoryStore
        from unimatmul.core.arrays import Device, adapter_for_kind
        from unimatmul.tuning.selector import Selector, set_selector

        self.out = out
        self.budget_s = budget_s
        self.quick = quick
        self.m_values: tuple[int, ...] = ()
        self.gpu = device != "cpu"
        self.started = time.perf_counter()
        self.adapter = adapter_for_kind("torch")
        index = torch.cuda.current_device() if self.gpu else 0
        self.device = torch.device("cuda", index) if self.gpu else torch.device("cpu")
        self.target = Target(self.adapter, Device("cuda", index) if self.gpu else Device("cpu"))
        self.store = MemoryStore()
        self.selector = Selector(store=self.store)
        set_selector(self.selector)
        self.data: dict[str, Any] = {"rows": [], "skipped": [], "stack": [], "errors": []}
        self.l2 = paired_timing.cuda_l2_bytes(index) if self.gpu else 32 << 20

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def write(self) -> None:
        (self.out / "fp8-bench.json").write_text(json.dumps(self.data, indent=1, default=str))

    def sync(self) -> None:
        if self.gpu:
            torch.cuda.synchronize()

    # --- facts ------------------------------------------------------------------------------
    def environment(self) -> None:
        env: dict[str, Any] = {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
            "scaled_mm_schema": str(torch.ops.aten._scaled_mm.default._schema),
        }
        if self.gpu:
            env["device"] = torch.cuda.get_device_name()
            env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
        try:
            platform_ = self.selector.platform(self.target)
            env["namespace"] = platform_.namespace
            env["versions"] = dict(platform_.versions)
            env["backends"] = [b.name for b in self.selector.backends_for(self.target)]
        except Exception as exc:
            env["platform_error"] = f"{type(exc).__name__}: {exc}"
        self.data["environment"] = env
        print("environment:", json.dumps(env))

    def tests(self, timeout_s: float) -> None:
        log = self.out / "fp8-tests.log"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "tests/backends/cuda/test_cuda_fp8_gpu.py",
            "-q",
            "-rs",
            "-s",
            "-p",
            "no:cacheprovider",
        ]
        started = time.perf_counter()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
            text = done.stdout + done.stderr
            code: int | str = done.returncode
        except subprocess.TimeoutExpired as exc:
            text = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else str(exc.stdout or "")
            code = f"timeout after {timeout_s:.0f} s"
        log.write_text(text)
        last = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|skipped)", line)]
        counts = (
            {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|error)", last[-1])}
            if last
            else {}
        )
        self.data["tests"] = {
            "exit": code,
            "counts": counts,
            "seconds": round(time.perf_counter() - started, 1),
            "failures": [line for line in text.splitlines() if line.startswith(("FAILED", "ERROR"))][:20],
            "printed": [
                line
                for line in text.splitlines()
                if ": " in line
                and (
                    "candidates" in line or "winner" in line or "conformance" in line or "exhaustive" in line
                )
            ][:40],
        }
        print("tests:", json.dumps(self.data["tests"]["counts"]), "exit", code)
        self.write()

    def torch_kernels(self) -> None:
        """Which kernels torch._scaled_mm launches here, per scaling (profiler names)."""
        if not self.gpu:
            return
        found: dict[str, list[str]] = {}
        for scales in ("tensor", "rowwise"):
            a, b, sa, sb, out = self.operands(128, 4096, 4096, scales, 1)[0]
            torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, out=out)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16, out=out)
                torch.cuda.synchronize()
            found[scales] = sorted({e.key for e in prof.key_averages() if e.device_time_total > 0})[:6]
        self.data["torch_kernels"] = found
        print("torch._scaled_mm kernels:", json.dumps(found))
        self.write()

    # --- benchmark ---------------------------------------------------------------------------
    def operands(self, m: int, n: int, k: int, scales: str, count: int) -> list[tuple[Any, ...]]:
        return operands(m, n, k, scales, count, self.device, seed=1234 + m)

    def shape(self, model: str, layer: str, m: int, n: int, k: int, scales: str) -> dict[str, Any]:
        import unimatmul
        import unimatmul.scaled
        from unimatmul.backend import Candidate
        from unimatmul.core.scales import scaled_problem, scaled_reference

        row: dict[str, Any] = {"model": model, "layer": layer, "m": m, "n": n, "k": k, "scales": scales}
        count = paired_timing.rotation_sets(m * k + k * n + 2 * m * n, self.l2)
        sets = self.operands(m, n, k, scales, count)
        row["sets"] = count

        def torch_call(s: tuple[Any, ...]) -> Any:
            return lambda: torch._scaled_mm(s[0], s[1], s[2], s[3], out_dtype=torch.bfloat16, out=s[4])

        candidates: dict[str, list[Any]] = {"torch": [torch_call(s) for s in sets]}
        if scales == "block":
            # The figure where torch has no block-scaled product: its per-tensor one, same shape.
            tensorwise = [
                (s[0], s[1], torch.ones((), device=self.device), torch.ones((), device=self.device), s[4])
                for s in sets
            ]
            candidates["torch_tensor"] = [torch_call(s) for s in tensorwise]
        problem = scaled_problem(m, n, k, scales=scales)
        self.sync()
        t0 = time.perf_counter()
        record = self.selector.tune(problem, self.target, force=True)
        self.sync()
        row["tune_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
        runner: Any = self.selector.prepare(problem, Candidate.from_identity(record.winner), self.target)

        def ours(s: tuple[Any, ...]) -> Any:
            # What a user's call runs, captured in a graph: the public door, its stored
            # choice (or Default, where the choice's margin is too small for a graph).
            return lambda: unimatmul.scaled_matmul(s[0], s[1], s[2], s[3], out_dtype=torch.bfloat16, out=s[4])

        candidates["unimatmul"] = [ours(s) for s in sets]
        # Its first real calls confirm the choice against PyTorch's (the confirmation
        # window): timed after them, as a program's steady state.
        paired_timing.past_confirmation(candidates["unimatmul"], torch if self.gpu else None)
        # The door's plan as it stands (source: cache, confirmed or reverted; label: what runs).
        row["door"] = [
            {"source": plan.source, "label": plan.label}
            for plan in unimatmul.scaled.TABLE.live()
            if plan.problem is not None and plan.problem.key == problem.key
        ]
        timing = paired_timing.time_candidates(candidates, torch=torch if self.gpu else None)
        stats = timing.stats("torch", "unimatmul")
        row["torch_method"], row["unimatmul_method"] = timing.modes["torch"], timing.modes["unimatmul"]
        row["torch_us"] = stats["numerator_s"] * 1e6
        row["unimatmul_us"] = stats["denominator_s"] * 1e6
        if "torch_tensor" in timing.times:
            row["torch_tensor_us"] = timing.median_s("torch_tensor") * 1e6
        row["speedup"] = stats["speedup"]
        row["round_ratios"] = stats["round_ratios"]
        row["ratio_of_medians"] = stats["ratio_of_medians"]
        row["speedup_method"] = stats["speedup_method"]
        row["calls_per_graph"] = timing.calls
        row["winner"] = record.winner
        row["harness_default_us"] = (record.default_s or 0) * 1e6
        row["harness_winner_us"] = record.winner_s * 1e6
        row["statuses"] = {
            s: sum(r.status == s for r in record.results) for s in ("ok", "pruned", "rejected", "failed")
        }
        row["tflops"] = 2 * m * n * k / (row["unimatmul_us"] * 1e-6) / 1e12
        # The winner's result once more, and the door's, against the dequantised product.
        a, b, sa, sb, out = sets[0]
        ref = scaled_reference(self.adapter, a, b, sa, sb, None)
        for name, call in (
            ("winner", lambda: runner(a, b, out, 1.0, 0.0, None, sa, sb)),
            ("door", ours(sets[0])),
        ):
            out.fill_(float("nan"))
            call()
            self.sync()
            row[f"{name}_rel_error"] = float((out.double() - ref).norm() / ref.norm())
        del timing, candidates
        return row

    def measured(
        self, rows: list[dict[str, Any]], model: str, layer: str, m: int, n: int, k: int, scales: str
    ) -> None:
        """One shape tuned and timed into ``rows`` (``shape``), within the budget; a failing
        one is recorded in ``errors`` and the run goes on."""
        label = f"{model} {layer} {n}x{k} m={m} {scales}"
        if self.elapsed() > self.budget_s:
            self.data["skipped"].append(f"{label}: over the {self.budget_s:.0f} s budget")
            return
        try:
            row = self.shape(model, layer, m, n, k, scales)
        except Exception as exc:
            traceback.print_exc(limit=3)
            said = " ".join(str(exc).split())[:300]
            self.data["errors"].append(f"{label}: {type(exc).__name__}: {said}")
            return
        finally:
            if self.gpu:
                torch.cuda.empty_cache()
        rows.append(row)
        print(
            f"{label:48s} torch {row['torch_us']:9.2f} us  unimatmul {row['unimatmul_us']:9.2f} us "
            f"{row['speedup']:.3f}x (rounds {_ratios(row)})  tune {row['tune_ms']:.0f} ms  {row['winner'][:50]}"
        )
        self.write()

    def bench(self) -> None:
        m_values: tuple[int, ...] = (1, 16, 128) if self.quick or not self.gpu else M_VALUES
        if self.m_values:
            m_values = self.m_values
        layers = LAYERS if self.gpu else [("tiny", "x", 64, 64)]
        for scales in ("tensor", "rowwise"):
            for model, layer, n, k in layers:
                for m in m_values:
                    self.measured(self.data["rows"], model, layer, m, n, k, scales)

    def models(self) -> None:
        """The fp8 products of real fp8 checkpoints (MODEL_PRODUCTS), each tuned and timed as
        ``bench`` times its shapes; one failing product is recorded and the rest still run."""
        if self.gpu:
            products = MODEL_PRODUCTS
        else:  # a smoke test of this code: tiny shapes of each scale mode
            products = [("tiny", "x", 256, 384, scales, (1, 16)) for scales in ("rowwise", "block", "tensor")]
        rows = self.data.setdefault("models", [])
        for model, layer, n, k, scales, m_values in products:
            for m in m_values:
                self.measured(rows, model, layer, m, n, k, scales)

    def models_summary(self) -> list[str]:
        """The ``models`` part's table and its figures against the issue's targets."""
        rows = self.data.get("models", [])
        if not rows:
            return []
        lines = [
            "",
            "fp8 products of real fp8 checkpoints (CUDA-graph replays, inputs rotated through > 3.2x L2, "
            "speedup: the median of per-round ratios, unimatmul and torch alternating A B, B A):",
            "",
            "| model | layer n x k | m | scales | torch us | unimatmul us | speedup | round ratios | torch per-tensor us | winner |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            tensor_us = f"{r['torch_tensor_us']:.2f}" if "torch_tensor_us" in r else "-"
            lines.append(
                f"| {r['model']} | {r['layer']} {r['n']}x{r['k']} | {r['m']} | {r['scales']} | {r['torch_us']:.2f} | "
                f"{r['unimatmul_us']:.2f} | {r['speedup']:.3f}x | {_ratios(r)} | {tensor_us} | {r['winner'][:44]} |"
            )
        speedups = [r["speedup"] for r in rows]
        lines.append("")
        lines.append(
            f"all {len(rows)} rows ({len({(r['model'], r['layer'], r['scales']) for r in rows})} products): geomean "
            f"{geomean(speedups):.3f}x (target >= 1.15x), min {min(speedups):.3f}x (target >= 0.99x), "
            f"below 0.99x: {sum(x < 0.99 for x in speedups)}"
        )
        decode = [
            r["speedup"]
            for r in rows
            if r["scales"] == "rowwise" and r["m"] <= 16 and r["n"] * r["k"] >= 32 << 20
        ]
        if decode:
            lines.append(
                f"row-wise decode (m <= 16, weights >= 32 MB): median {statistics.median(decode):.3f}x over "
                f"{len(decode)} rows (target >= 1.3x)"
            )
        block = [r for r in rows if r["scales"] == "block"]
        if block:
            lines.append(
                f"block-scaled against torch's block-scaled product: geomean {geomean([r['speedup'] for r in block]):.3f}x "
                f"over {len(block)} rows (target >= 1.1x); against torch's per-tensor product on the same shapes: "
                f"geomean {geomean([r['torch_tensor_us'] / r['unimatmul_us'] for r in block]):.3f}x"
            )
        return lines

    # --- the fp8 linear stack ---------------------------------------------------------------------
    def hostcost(self) -> None:
        """Host time per routed ``torch._scaled_mm`` call, against routing off (m=16, 256x256).

        A product this small keeps the GPU ahead of the host, so the time per call is the
        host's. For each scale mode the problem is tuned, then its record's winner is set
        to Default and to the fastest checked kernel in turn (``benchmarks/api_overhead.force``):
        routed calls then take the native table's DEFAULT and SCALED_LT entries. Thread CPU
        time per call, 2000 calls a round, 7 rounds interleaved, median.
        """
        from api_overhead import force, per_call

        import unimatmul.torch as ut
        from unimatmul.core.scales import scaled_problem

        calls, rounds = (2000, 7) if self.gpu else (200, 3)
        m, n, k = 16, 256, 256
        found: dict[str, Any] = {}
        for scales in ("tensor", "rowwise"):
            a, b, sa, sb, _ = self.operands(m, n, k, scales, 1)[0]
            problem = scaled_problem(m, n, k, scales=scales)
            self.selector.tune(problem, self.target, force=True)

            def call(a: Any = a, b: Any = b, sa: Any = sa, sb: Any = sb) -> Any:
                return torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)

            result: dict[str, Any] = {}
            for which in ("default", "kernel"):
                winner = force(problem, self.target, which)
                if not winner:
                    result[which] = {"skipped": "no kernel passed the check"}
                    continue
                ut.clear_plans()
                # Routing is switched on for a whole round, not per call.
                times: dict[str, list[float]] = {"off": [], which: []}
                for _ in range(rounds):
                    for state in ("off", which):
                        if state == "off":
                            ut.disable()
                        else:
                            ut.enable()
                        try:
                            got = per_call({state: call}, calls, 1, self.sync)[state]
                        finally:
                            ut.disable()
                        times[state].append(got["host_us"])
                with ut.enabled():
                    ut.reset_stats()
                    call()
                    stats = ut.scaled_stats()
                result[which] = {
                    "winner": winner,
                    "off_us": round(statistics.median(times["off"]), 3),
                    "routed_us": round(statistics.median(times[which]), 3),
                    "extra_us": round(statistics.median(times[which]) - statistics.median(times["off"]), 3),
                    "labels": stats["by_label"],
                    "sources": stats["by_source"],
                }
            found[scales] = result
            print(f"hostcost {scales}: {json.dumps(result)}")
        self.data["hostcost"] = {"shape": f"{m}x{n}x{k}", "calls": calls, "rounds": rounds, **found}
        self.write()

    def stack(self) -> None:
        dims = (4096, 6144, 28672, 14336) if self.gpu else (64, 96, 128, 64)
        layers = 4 if self.gpu else 1
        for scales in ("rowwise", "tensor"):
            model = Fp8Stack(dims, layers, scales, self.device)
            for m in (1, 128) if self.gpu else (4,):
                for graph in (False, True) if self.gpu else (False,):
                    try:
                        self.data["stack"].append(self.stack_row(model, m, scales, graph))
                    except Exception as exc:
                        traceback.print_exc()
                        self.data["errors"].append(
                            f"stack {scales} m={m} graph={graph}: {type(exc).__name__}: {exc}"
                        )
                    self.write()
            del model
            if self.gpu:
                torch.cuda.empty_cache()

    def stack_row(self, model: Fp8Stack, m: int, scales: str, graph: bool) -> dict[str, Any]:
        """Routing off against on, interleaved round by round (ABBA), in one process.

        The problems are tuned by one forward in mode ``tune``; then ``WARM_FORWARDS``
        routed forwards run eagerly, as a server warms up before it captures graphs: they
        close the confirmation windows (each layer's product is called 4 times a forward,
        a window is 34 calls), so what is timed (and captured) is the confirmed choice.
        Graph rows capture one graph per state and alternate their replays; eager rows
        switch routing off and on between rounds (one untimed forward after each switch).
        """
        import unimatmul
        import unimatmul.torch as ut

        x = torch.randn(m, model.hidden, device=self.device, dtype=torch.bfloat16)
        ut.disable()
        ref = model(x)
        ut.enable()
        try:
            with unimatmul.mode("tune"):
                model(x)  # each layer's problem tuned once, then the cache serves
            ut.reset_stats()
            for _ in range(WARM_FORWARDS):
                model(x)
            self.sync()
            warm_stats = ut.scaled_stats()
            # The verdicts reach the cache on a thread of their own: written before routing is
            # switched off, so that the rounds' fresh plans read them (switching routing off
            # drops the plans, and a window not yet stored would start again in each sample).
            self.selector.settle(timeout=30)
            got = model(x)
        finally:
            ut.disable()
        # A graph row captures GRAPHS_PER_STATE graphs per state, in the order off, on, on,
        # off, ...: two graphs of the same kernels can run ~1 % apart (each capture's memory
        # lies elsewhere), so a state's time is the mean over its graphs, and the spread
        # column (a state's slowest graph over its fastest, by median) shows by how much.
        copies = GRAPHS_PER_STATE if graph else 1
        captured: dict[str, list[Any]] = {"off": [], "on": []}
        for j in range(2 * copies):
            state = ("off", "on", "on", "off")[j % 4]
            captured[state].append(self.forward_runner(model, x, graph, routed=state == "on"))
        times: dict[str, list[float]] = {"off": [], "on": []}
        per_graph: dict[str, list[list[float]]] = {
            state: [[] for _ in runs] for state, runs in captured.items()
        }
        ratios = []
        for i, order in enumerate(paired_timing.round_orders(("off", "on"), STACK_ROUNDS)):
            sample = {}
            for state in order:
                indices = range(copies) if i % 2 == 0 else range(copies - 1, -1, -1)
                for g in indices:
                    per_graph[state][g].append(captured[state][g]())
                sample[state] = statistics.fmean(per_graph[state][g][-1] for g in range(copies))
            for state in order:
                times[state].append(sample[state])
            ratios.append(sample["off"] / sample["on"])
        spread = {}
        if copies > 1:
            for state, lists in per_graph.items():
                medians = [statistics.median(v) for v in lists]
                spread[state] = max(medians) / min(medians)
        runs = {state: captured[state][0] for state in captured}
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        if self.gpu:
            with ut.enabled():
                ut.reset_stats()
                model(x)
                stats = ut.scaled_stats()
        else:
            stats = warm_stats
        profile = None
        if self.gpu and statistics.median(ratios) < PROFILE_BELOW:
            profile = self.profile_graphs(runs) if graph else self.profile_stack(model, x)
        diff = float((got.double() - ref.double()).norm() / ref.double().norm())
        row = {
            "scales": scales,
            "m": m,
            "graph": graph,
            "off_ms": off * 1e3,
            "on_ms": on * 1e3,
            "tokens_per_s_off": m / off,
            "tokens_per_s_on": m / on,
            "speedup": statistics.median(ratios),
            "round_ratios": [round(r, 4) for r in ratios],
            # Graph rows: a state's slowest graph over its fastest (medians; the same kernels).
            "graph_spread": {state: round(v, 4) for state, v in spread.items()},
            "graphs_per_state": copies,
            "kernel_calls_per_forward": stats["kernel"],
            "default_calls_per_forward": stats["default"],
            "windows": warm_stats["confirm"],
            "kernels": sorted(label for label in stats["by_label"] if not label.endswith("[default]")),
            "output_rel_diff": diff,
        }
        if profile is not None:
            row["profile"] = profile
        print(
            f"stack {scales:7s} m={m:4d} {'graph' if graph else 'eager'}: off {off * 1e3:.3f} ms, "
            f"on {on * 1e3:.3f} ms, {row['speedup']:.3f}x tokens/s (median of {len(ratios)} round ratios "
            f"{min(ratios):.3f}-{max(ratios):.3f}); kernels a forward {stats['kernel']}, windows {warm_stats['confirm']}"
            + (f"; {copies} graphs a state, slowest / fastest {row['graph_spread']}" if graph else "")
        )
        return row

    def profile_stack(self, model: Fp8Stack, x: Any) -> dict[str, Any]:
        """A row below ``PROFILE_BELOW``: torch.profiler over 3 eager forwards, off and on.

        Per state: each ``_scaled_mm`` shape's host time (inclusive) and device time per
        call, every op's self host time per forward, and the kernels' device time per
        forward (``benchmarks/profile_decode.profile_products``).
        """
        import contextlib

        from profile_decode import profile_products

        import unimatmul.torch as ut

        found = {}
        for state in ("off", "on"):
            context = ut.enabled if state == "on" else contextlib.nullcontext
            found[state] = profile_products(
                lambda: model(x), context, 3, torch.device(self.device), warm=2, ops=("aten::_scaled_mm",)
            )
        for key in sorted(set(found["off"]) | set(found["on"])):
            off, on = found["off"].get(key, {}), found["on"].get(key, {})
            print(
                f"  profile {key[:90]:90s} host us/call off {off.get('cpu_us_per_call', math.nan):8.1f} "
                f"on {on.get('cpu_us_per_call', math.nan):8.1f}; device us off {off.get('device_us', math.nan):9.1f} "
                f"on {on.get('device_us', math.nan):9.1f}"
            )
        return found

    def profile_graphs(self, runs: dict[str, Any]) -> dict[str, Any]:
        """A graph row below ``PROFILE_BELOW``: each state's graph replayed 3 times under
        torch.profiler; device us per forward of every kernel the replays ran, by name."""
        found: dict[str, dict[str, float]] = {}
        replays = 3
        for state, sampler in runs.items():
            graph = sampler.graph
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(replays):
                    graph.replay()
                torch.cuda.synchronize()
            per: dict[str, float] = {}
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    span = event.time_range.elapsed_us() / (replays * STACK_CALLS)
                    per[event.name] = per.get(event.name, 0.0) + span
            found[state] = per
        for name in sorted(set(found["off"]) | set(found["on"])):
            off, on = found["off"].get(name, 0.0), found["on"].get(name, 0.0)
            print(f"  graph profile {name[:100]:100s} device us a forward off {off:9.2f} on {on:9.2f}")
        return {"graph_kernels_us_per_forward": found}

    def forward_runner(self, model: Fp8Stack, x: Any, graph: bool, *, routed: bool) -> Any:
        """A function that times ``STACK_CALLS`` forwards (seconds per forward) with routing as given.

        A graph row captures its graph here, once; an eager row sets routing on or off
        at every sample and runs one untimed forward after the switch.
        """
        import unimatmul.torch as ut

        def switch() -> None:
            if routed:
                ut.enable()
            else:
                ut.disable()

        calls = STACK_CALLS
        if not self.gpu:

            def host_sample() -> float:
                switch()
                try:
                    model(x)
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        model(x)
                    return (time.perf_counter() - t0) / calls
                finally:
                    ut.disable()

            return host_sample
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if graph:
            g = torch.cuda.CUDAGraph()
            switch()
            try:
                for _ in range(2):
                    model(x)
                stream = torch.cuda.Stream()
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    g.capture_begin()
                    for _ in range(calls):
                        model(x)
                    g.capture_end()
                torch.cuda.current_stream().wait_stream(stream)
            finally:
                ut.disable()
            g.replay()
            torch.cuda.synchronize()

            def graph_sample() -> float:
                start.record()
                g.replay()
                end.record()
                end.synchronize()
                return start.elapsed_time(end) * 1e-3 / calls

            graph_sample.graph = g  # type: ignore[attr-defined]  # kept alive with the sampler
            return graph_sample

        def eager_sample() -> float:
            switch()
            try:
                model(x)
                start.record()
                for _ in range(calls):
                    model(x)
                end.record()
                end.synchronize()
            finally:
                ut.disable()
            return start.elapsed_time(end) * 1e-3 / calls

        return eager_sample

    # --- summary -------------------------------------------------------------------------------------
    def summary(self) -> str:
        rows = self.data["rows"]
        lines = [
            "# fp8 (scaled GEMM) on " + str(self.data.get("environment", {}).get("device", "the CPU")),
            "",
        ]
        env = self.data.get("environment", {})
        lines.append(f"torch {env.get('torch')}, CUDA {env.get('cuda')}, libraries {env.get('versions')}")
        exhaustive = self.data.get("exhaustive", 0)
        lines.append(
            "candidates: cuBLASLt heuristics"
            + (f" + up to {exhaustive} exhaustive-search configurations" if exhaustive else "")
            + "; times: CUDA-graph replays, inputs rotated through > 3.2x L2; speedup: the median of "
            "per-round ratios (A B, B A)"
        )
        tests = self.data.get("tests", {})
        lines.append(
            f"GPU tests (tests/backends/cuda/test_cuda_fp8_gpu.py): {tests.get('counts')} exit {tests.get('exit')}"
        )
        for failure in tests.get("failures", [])[:5]:
            lines.append(f"  {failure}")
        if "torch_kernels" in self.data:
            lines.append(f"torch._scaled_mm kernels here: {self.data['torch_kernels']}")
        lines += [
            "",
            "| model | layer | m | scales | torch us | unimatmul us | speedup | round ratios | winner |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['model']} | {r['layer']} {r['n']}x{r['k']} | {r['m']} | {r['scales']} | {r['torch_us']:.2f} | "
                f"{r['unimatmul_us']:.2f} | {r['speedup']:.3f}x | {_ratios(r)} | {r['winner'][:48]} |"
            )
        lines.append("")
        for scales in ("tensor", "rowwise", None):
            chosen = [r["speedup"] for r in rows if scales is None or r["scales"] == scales]
            if chosen:
                worst = min(
                    (r for r in rows if scales is None or r["scales"] == scales), key=lambda r: r["speedup"]
                )
                lines.append(
                    f"{scales or 'all'}: geomean {geomean(chosen):.3f}x over {len(chosen)} shapes, "
                    f"min {worst['speedup']:.3f}x ({worst['model']} {worst['layer']} m={worst['m']}); "
                    f"shapes below 0.99x: {sum(s < 0.99 for s in chosen)}"
                )
        if rows:
            all_speedups = [r["speedup"] for r in rows]
            met = geomean(all_speedups) >= 1.03 and min(all_speedups) >= 0.99
            lines.append(
                f"target (geomean >= 1.03x, no shape below 0.99x): {'met' if met else 'not met'}"
                + ("" if len(rows) == 2 * len(LAYERS) * len(M_VALUES) else f" (on {len(rows)} of the shapes)")
            )
        if self.data["stack"]:
            lines += [
                "",
                "| stack scales | m | mode | off tok/s | on tok/s | speedup (median of round ratios) | round ratios | graphs slowest/fastest off, on | kernels a forward | windows |",
                "|---|---|---|---|---|---|---|---|---|---|",
            ]
            for s in self.data["stack"]:
                lines.append(
                    f"| {s['scales']} | {s['m']} | {'graph' if s['graph'] else 'eager'} | {s['tokens_per_s_off']:.0f} | "
                    f"{s['tokens_per_s_on']:.0f} | {s['speedup']:.3f}x | {min(s['round_ratios']):.3f}-{max(s['round_ratios']):.3f} | "
                    f"{_spread(s)} | {s['kernel_calls_per_forward']} | {_windows(s['windows'])} |"
                )
            graphed = [x["speedup"] for x in self.data["stack"] if x["graph"]]
            eager = [x["speedup"] for x in self.data["stack"] if not x["graph"]]
            lines.append(
                f"never a loss (routed >= 1.0x tokens/s): graphs {'met' if graphed and min(graphed) >= 1.0 else 'not met'}"
                f" (min {min(graphed, default=math.nan):.3f}x), eager "
                f"{'met' if eager and min(eager) >= 1.0 else 'not met'} (min {min(eager, default=math.nan):.3f}x)"
            )
            for scales in sorted({x["scales"] for x in self.data["stack"]}):
                mine = [x for x in self.data["stack"] if x["scales"] == scales and x["graph"]]
                if mine:
                    low = min(x["speedup"] for x in mine)
                    lines.append(
                        f"the {scales} stack, steady state (CUDA graphs), routed >= 1.05x tokens/s: "
                        f"{'met' if low >= 1.05 else 'not met'} (min {low:.3f}x over m = "
                        f"{', '.join(str(x['m']) for x in mine)})"
                    )
        cost = self.data.get("hostcost")
        if cost:
            lines += [
                "",
                f"Host time per `torch._scaled_mm` call ({cost['shape']}, thread CPU time, median of "
                f"{cost['rounds']} rounds of {cost['calls']}):",
                "",
                "| scales | entry | routing off us | routed us | extra us |",
                "|---|---|---|---|---|",
            ]
            for scales in ("tensor", "rowwise"):
                for which, got in cost.get(scales, {}).items():
                    if "routed_us" in got:
                        lines.append(
                            f"| {scales} | {which} ({got['winner'][:40]}) | {got['off_us']:.2f} | "
                            f"{got['routed_us']:.2f} | {got['extra_us']:+.2f} |"
                        )
        lines += self.models_summary()
        if self.data["skipped"]:
            lines.append(f"\nskipped (budget): {len(self.data['skipped'])}")
        for error in self.data["errors"][:10]:
            lines.append(f"error: {error}")
        lines.append(f"\ntotal {self.elapsed():.0f} s")
        return "\n".join(lines) + "\n"


def _ratios(row: dict[str, Any]) -> str:
    """A product row's round ratios, lowest to highest, or a dash (rows of older runs)."""
    found = row.get("round_ratios")
    return f"{found['min']:.3f}-{found['max']:.3f}" if isinstance(found, dict) else "-"


def _spread(row: dict[str, Any]) -> str:
    """A graph row's spread over its graphs (each state's slowest over its fastest), or a dash."""
    found = row.get("graph_spread") or {}
    return ", ".join(f"{found[state]:.3f}" for state in ("off", "on") if state in found) or "-"


def _windows(confirm: dict[str, int]) -> str:
    """Confirmation windows of a stack row's warm-up, e.g. ``3 confirmed, 1 reverted``."""
    parts = [
        f"{confirm.get(k, 0)} {k}" for k in ("confirmed", "reverted", "unjudged", "open") if confirm.get(k)
    ]
    return ", ".join(parts) or "none"


class Fp8Stack(torch.nn.Module):
    """Llama-3-8B-sized blocks of fp8 linears: qkv, o, fused gate/up, down (no attention math).

    Weights are quantised to e4m3 once (per-tensor, or per output channel for row-wise);
    each call quantises its activation (per tensor, or per row) and runs torch._scaled_mm,
    the way fp8 inference serves a linear layer.
    """

    def __init__(self, dims: tuple[int, int, int, int], layers: int, scales: str, device: Any) -> None:
        super().__init__()
        hidden, qkv, gate_up, inter = dims
        self.hidden, self.inter, self.scales = hidden, inter, scales
        gen = torch.Generator(device=device).manual_seed(7)
        self.blocks = []
        for _ in range(layers):
            block = {}
            for name, (n, k) in {
                "qkv": (qkv, hidden),
                "o": (hidden, hidden),
                "gate_up": (gate_up, hidden),
                "down": (hidden, inter),
            }.items():
                w = torch.randn(n, k, device=device, generator=gen, dtype=torch.bfloat16) / math.sqrt(k)
                block[name] = self.quantise_weight(w)
            self.blocks.append(block)

    def quantise_weight(self, w: Any) -> tuple[Any, Any]:
        if self.scales == "rowwise":
            scale = w.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
            q = (w.float() / scale).to(torch.float8_e4m3fn)
            return q.t(), scale.t().contiguous()  # b = w.t(), scale_b [1, n]
        scale = w.abs().amax().float().clamp(min=1e-12) / FP8_MAX
        return (w.float() / scale).to(torch.float8_e4m3fn).t(), scale

    def linear(self, x: Any, weight: tuple[Any, Any]) -> Any:
        w_t, w_scale = weight
        if self.scales == "rowwise":
            x_scale = x.abs().amax(dim=1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
        else:
            x_scale = x.abs().amax().float().clamp(min=1e-12) / FP8_MAX
        xq = (x.float() / x_scale).to(torch.float8_e4m3fn)
        return torch._scaled_mm(xq, w_t, x_scale, w_scale, out_dtype=torch.bfloat16)

    def forward(self, x: Any) -> Any:
        for block in self.blocks:
            qkv = self.linear(x, block["qkv"])
            x = x + self.linear(qkv[:, : self.hidden].contiguous(), block["o"])
            gate_up = self.linear(x, block["gate_up"])
            act = torch.nn.functional.silu(gate_up[:, : self.inter]) * gate_up[:, self.inter :]
            x = x + self.linear(act.contiguous(), block["down"])
        return x


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/unimatmul-fp8-out"))
    parser.add_argument(
        "--budget-s", type=float, default=150.0, help="benchmark time budget (after the tests)"
    )
    parser.add_argument("--tests-timeout-s", type=float, default=170.0)
    parser.add_argument("--quick", action="store_true", help="m = 1, 16, 128 only")
    parser.add_argument(
        "--m", default=None, help="comma-separated m values to benchmark (default: all, or --quick's)"
    )
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument(
        "--parts",
        default="kernels,bench,hostcost,stack",
        help="comma-separated parts after the tests: kernels (torch's kernel names), bench, hostcost, stack, "
        "models (the fp8 products of real fp8 checkpoints, block-scaled ones included)",
    )
    parser.add_argument(
        "--exhaustive",
        type=int,
        default=16,
        help="extra cuBLASLt configurations per problem (0: heuristics only)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu for a smoke test of this script")
        return 3
    run = Run(out, args.budget_s, args.device, args.quick)
    if args.m:
        run.m_values = tuple(int(x) for x in args.m.split(","))
    run.environment()
    if not args.skip_tests:
        run.tests(args.tests_timeout_s)
    # After the tests (which set their own): the benchmark's candidates.
    if args.exhaustive > 0:
        os.environ["UNIMATMUL_LT_EXHAUSTIVE"] = "1"
        os.environ["UNIMATMUL_LT_EXHAUSTIVE_MAX"] = str(args.exhaustive)
        os.environ["UNIMATMUL_LT_EXHAUSTIVE_CHECKS"] = "600"
    run.data["exhaustive"] = args.exhaustive
    run.started = time.perf_counter()  # the budget is the benchmark's
    parts = {
        "kernels": run.torch_kernels,
        "bench": run.bench,
        "hostcost": run.hostcost,
        "stack": run.stack,
        "models": run.models,
    }
    chosen = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = sorted(set(chosen) - set(parts))
    if unknown:
        parser.error(f"--parts: unknown part(s) {', '.join(unknown)}; choose from {', '.join(parts)}")
    for part in (parts[x] for x in chosen):
        try:
            part()
        except Exception as exc:
            traceback.print_exc()
            run.data["errors"].append(f"{part.__name__}: {type(exc).__name__}: {exc}")
    run.write()
    text = run.summary()
    (out / "fp8-summary.md").write_text(text)
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
