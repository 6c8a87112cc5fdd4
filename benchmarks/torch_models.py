"""PyTorch models with and without unimatmul routing: tokens per second, overhead, buckets.

Run on the machine to measure (the H200, or a CPU with ``--size small``)::

    python benchmarks/torch_models.py --device cuda --out benchmarks/results/torch-h200
    python benchmarks/torch_models.py --device cpu --size small --out benchmarks/results/torch-cpu-small

Three sections, each written to ``--out`` (results.json with every number and the
machine's facts, results.md with tables) as soon as it is done:

1. **models**: a GPT-2-sized and a Llama-sized stack of decoder blocks, built here
   from torch.nn modules with random weights (no downloads). Prefill (B sequences of
   T tokens) and decode (one token per sequence against a KV cache of C tokens) at
   several batch sizes, in tokens per second, with routing off, routing on (every
   product tuned first by ``unimatmul.torch.warmup``, then ``cached``), and PyTorch
   TunableOp as installed (CUDA/ROCm only). Modes take turns round by round, so
   that drift of the machine hits them alike; the median round is reported. On a GPU,
   decode is also measured as CUDA graph replays (``--graphs``), which hide the
   per-call host cost of every mode.
2. **overhead**: host time per call of a small matmul: plain PyTorch, routed with
   Default chosen, routed with a backend kernel, and the interception mechanisms
   considered for routing (measured without any routing logic) -- the numbers
   behind docs/torch.md's choice.
3. **buckets**: for the models' decode products, every bucket of m is tuned
   (``tune_bucket``: representative plus checks at the edges and halfway to them), then Default and the
   bucket's choice are timed by the harness at m values that are not
   representatives. The ratio choice/Default is what "never slower than Default"
   means in numbers.

The tuning cache is a fresh file in ``--out`` (``cache.msgpack``, not meant to be
committed) unless ``--cache`` names one; the user's cache is never touched.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

# --- the models ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Spec:
    name: str
    dim: int
    heads: int
    kv_heads: int
    mlp: int
    layers: int
    style: str  # "gpt2" (LayerNorm, GELU MLP, fused QKV) or "llama" (RMSNorm, SwiGLU, GQA)


FULL = {
    "gpt2": Spec("gpt2", 768, 12, 12, 3072, 4, "gpt2"),
    "llama": Spec("llama", 4096, 32, 8, 14336, 2, "llama"),
}
SMALL = {
    "gpt2": Spec("gpt2-small", 256, 4, 4, 1024, 2, "gpt2"),
    "llama": Spec("llama-small", 512, 8, 2, 1408, 2, "llama"),
}


class RMSNorm(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.weight


class Block(torch.nn.Module):
    """One decoder block. Attention products are matmuls (routed as bmm), not SDPA.

    Grouped-query attention folds the query heads of a group into m, as fast
    implementations do, so that K and V are never copied per query head. No rotary
    embedding: it is elementwise and the same with and without routing.
    """

    def __init__(self, spec: Spec) -> None:
        super().__init__()
        self.spec = spec
        d, h, kvh = spec.dim, spec.heads, spec.kv_heads
        self.head_dim = d // h
        gpt2 = spec.style == "gpt2"
        self.norm1 = torch.nn.LayerNorm(d) if gpt2 else RMSNorm(d)
        self.norm2 = torch.nn.LayerNorm(d) if gpt2 else RMSNorm(d)
        self.qkv = torch.nn.Linear(d, d + 2 * kvh * self.head_dim, bias=gpt2)
        self.out = torch.nn.Linear(d, d, bias=gpt2)
        if gpt2:
            self.up = torch.nn.Linear(d, spec.mlp)
        else:
            self.up = torch.nn.Linear(d, 2 * spec.mlp, bias=False)  # gate and up, fused
        self.down = torch.nn.Linear(spec.mlp, d, bias=gpt2)
        self.cache_k: torch.Tensor | None = None
        self.cache_v: torch.Tensor | None = None

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.spec.style == "gpt2":
            return self.down(F.gelu(self.up(x), approximate="tanh"))
        gate, up = self.up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)

    def attention(self, x: torch.Tensor, decode: bool) -> torch.Tensor:
        b, t, d = x.shape
        h, kvh, hd = self.spec.heads, self.spec.kv_heads, self.head_dim
        q, k, v = self.qkv(x).split([d, kvh * hd, kvh * hd], dim=-1)
        # [b, kvh, group * t, hd]: the group's query heads stacked along m.
        group = h // kvh
        q = q.reshape(b, t, kvh, group, hd).permute(0, 2, 3, 1, 4).reshape(b, kvh, group * t, hd)
        k = k.reshape(b, t, kvh, hd).transpose(1, 2)
        v = v.reshape(b, t, kvh, hd).transpose(1, 2)
        if decode:
            assert self.cache_k is not None and self.cache_v is not None
            # The context occupies slots [0, C); the new token goes to slot C (static).
            self.cache_k[:, :, -1:].copy_(k)
            self.cache_v[:, :, -1:].copy_(v)
            k, v = self.cache_k, self.cache_v
            scores = (q @ k.transpose(-1, -2)) * (hd**-0.5)
            probs = scores.softmax(-1)
        else:
            scores = (q @ k.transpose(-1, -2)) * (hd**-0.5)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1).repeat(group, 1)
            probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
        att = probs @ v  # [b, kvh, group * t, hd]
        att = att.reshape(b, kvh, group, t, hd).permute(0, 3, 1, 2, 4).reshape(b, t, d)
        return self.out(att)

    def forward(self, x: torch.Tensor, decode: bool = False) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), decode)
        return x + self.mlp(self.norm2(x))


class Stack(torch.nn.Module):
    def __init__(self, spec: Spec) -> None:
        super().__init__()
        self.spec = spec
        self.blocks = torch.nn.ModuleList(Block(spec) for _ in range(spec.layers))

    def set_cache(self, batch: int, context: int, device: torch.device, dtype: torch.dtype) -> None:
        for block in self.blocks:
            shape = (batch, self.spec.kv_heads, context + 1, block.head_dim)  # type: ignore[union-attr]
            block.cache_k = torch.randn(shape, device=device, dtype=dtype)  # type: ignore[union-attr]
            block.cache_v = torch.randn(shape, device=device, dtype=dtype)  # type: ignore[union-attr]

    def forward(self, x: torch.Tensor, decode: bool = False) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, decode)
        return x


# --- timing -------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], Any], device: torch.device, min_s: float) -> float:
    """Seconds per call of ``fn``: enough calls to outlast ``min_s``, timed end to end."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    once = max(time.perf_counter() - t0, 1e-7)
    count = max(1, math.ceil(min_s / once))
    sync(device)
    t0 = time.perf_counter()
    for _ in range(count):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / count


def rounds(
    variants: dict[str, Callable[[], float]],
    repeats: int,
    deadline: float | None = None,
    *,
    more: Callable[[dict[str, list[float]]], bool] | None = None,
    most: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Each variant takes one sample per round, in turn; median and spread per variant.

    ``deadline`` (a ``time.perf_counter()`` value): no round starts after it, so a
    run with a time limit ends with fewer rounds instead of being cut off mid-way.
    ``more`` (given the samples so far) asks for rounds past ``repeats``, up to ``most``.
    ``samples`` keeps every round's sample, in order, for ratios paired by round.
    """
    samples: dict[str, list[float]] = {name: [] for name in variants}
    i = 0
    while i < repeats or (more is not None and i < (most or repeats) and more(samples)):
        if i and deadline is not None and time.perf_counter() > deadline:
            break
        for name, take in variants.items():
            samples[name].append(take())
        i += 1
    return {
        name: {
            "median_s": statistics.median(values),
            "min_s": min(values),
            "max_s": max(values),
            "rounds": len(values),
            "samples": values,
        }
        for name, values in samples.items()
    }


# --- modes --------------------------------------------------------------------------------


@contextlib.contextmanager
def mode(name: str) -> Iterator[None]:
    """Run a block with routing off, routing on, or TunableOp on.

    ``routed``: routing as a user gets it (``UNIMATMUL_TORCH_NATIVE`` as set, default
    ``auto``: the native kernels wherever they build); ``routed-py``: the Python kernels
    only. Both in the environment's mode, ``cached`` (a ``unimatmul.mode()`` block would
    send every call through the Python kernels).
    """
    import unimatmul.torch as ut
    from unimatmul.torch import native

    if name in ("routed", "routed-py"):
        old = os.environ.get(native.ENV)
        if name == "routed-py":
            os.environ[native.ENV] = "0"
        try:
            with ut.enabled():
                yield
        finally:
            if old is None:
                os.environ.pop(native.ENV, None)
            else:
                os.environ[native.ENV] = old
    elif name == "tunableop":
        tunable = torch.cuda.tunable
        was = tunable.is_enabled()
        tunable.enable(True)
        try:
            yield
        finally:
            tunable.enable(was)
    else:
        yield


def prepare_tunableop(out: Path) -> bool:
    if not torch.cuda.is_available():
        return False
    tunable = torch.cuda.tunable
    tunable.set_filename(str(out / "tunableop_results%d.csv"))
    tunable.tuning_enable(True)
    tunable.enable(False)
    return True


# --- section 1: models ----------------------------------------------------------------------


def bench_models(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, report: Report) -> None:
    import unimatmul.torch as ut

    modes = [m for m in args.modes if m != "tunableop"]
    if "tunableop" in args.modes and prepare_tunableop(args.out):
        modes.append("tunableop")
    specs = SMALL if args.size == "small" else FULL
    for model_name in args.models:
        spec = specs[model_name]
        if args.layers:
            spec = Spec(spec.name, spec.dim, spec.heads, spec.kv_heads, spec.mlp, args.layers, spec.style)
        torch.manual_seed(0)
        model = Stack(spec).to(device=device, dtype=dtype).eval()
        configs = [("prefill", b, args.prompt) for b in args.prefill_batches]
        configs += [("decode", b, args.context) for b in args.decode_batches]
        for phase, batch, length in configs:
            decode = phase == "decode"
            tokens = batch if decode else batch * length
            if decode:
                model.set_cache(batch, length, device, dtype)
                x = torch.randn(batch, 1, spec.dim, device=device, dtype=dtype)
            else:
                x = torch.randn(batch, length, spec.dim, device=device, dtype=dtype)

            def run(model: Stack = model, x: torch.Tensor = x, decode: bool = decode) -> torch.Tensor:
                return model(x, decode)

            with torch.no_grad():
                reference = run().float()
                tuned = ut.warmup(lambda: run(), (), progress=False, force=False)
                for name in list(modes):  # first call in each mode outside the timing (TunableOp tunes here)
                    try:
                        with mode(name):
                            out = run().float()
                        sync(device)
                    except Exception as exc:
                        # A mode that fails is reported and left out from here on. A CUDA error
                        # may leave the context unusable: then stop, with what was measured so far.
                        report.mode_failed(spec.name, phase, batch, name, exc)
                        report.write()
                        modes.remove(name)
                        _check_device(device)
                        continue
                    err = float((out - reference).norm() / reference.norm())
                    report.note_error(spec.name, phase, batch, name, err)
                ut.reset_stats()
                with mode("routed"):
                    run()
                stats = ut.stats()
                variants = {name: _timed(run, name, device, args.min_time) for name in modes}
                result = rounds(variants, args.repeats)
                graphs: dict[str, dict[str, Any]] = {}
                if decode and device.type == "cuda" and args.graphs:
                    graphs = rounds(
                        {name: _graphed(run, name, device, args.min_time) for name in modes}, args.repeats
                    )
            report.add_model_row(spec, phase, batch, length, tokens, result, graphs, stats, tuned)
            report.write()
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _check_device(device: torch.device) -> None:
    if device.type != "cuda":
        return
    try:
        torch.zeros(1, device=device).add_(1).item()
    except Exception as exc:
        sys.stderr.write(f"the CUDA context is broken ({exc}); results so far are written\n")
        raise SystemExit(3) from exc


def _timed(run: Callable[[], Any], name: str, device: torch.device, min_s: float) -> Callable[[], float]:
    def take() -> float:
        with mode(name):
            return time_calls(run, device, min_s)

    return take


def _graphed(run: Callable[[], Any], name: str, device: torch.device, min_s: float) -> Callable[[], float]:
    """Capture ``run`` once in mode ``name`` (after its warm-up); each sample replays it."""
    graph = torch.cuda.CUDAGraph()
    with mode(name):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run()
            run()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            run()

    def take() -> float:
        return time_calls(graph.replay, device, min_s)

    return take


# --- section 2: per-call overhead -------------------------------------------------------------


def bench_overhead(
    args: argparse.Namespace, device: torch.device, dtype: torch.dtype, report: Report
) -> None:
    """Two passes over the same calls: nothing tuned (Default chosen), then a kernel pinned."""
    import unimatmul
    import unimatmul.torch as ut
    from unimatmul.torch.model_tuning import collecting

    m, n, k = args.overhead_shape
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, device=device, dtype=dtype, generator=gen)
    b = torch.randn(k, n, device=device, dtype=dtype, generator=gen)
    lin = torch.nn.Linear(k, n, device=device, dtype=dtype)
    calls = args.overhead_calls

    def loop(fn: Callable[[], Any]) -> Callable[[], float]:
        def take() -> float:
            fn()
            sync(device)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            sync(device)
            return (time.perf_counter() - t0) / calls

        return take

    def routed(fn: Callable[[], Any], how: str = "routed", block: str | None = None) -> Callable[[], float]:
        inner = loop(fn)  # its first, untimed call makes the plan

        def take() -> float:
            with mode(how), unimatmul.mode(block) if block else contextlib.nullcontext():
                return inner()

        return take

    result: dict[str, dict[str, Any]] = {}
    with _scratch_selector() as selector, torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = {"torch.mm": loop(lambda: torch.mm(a, b)), "nn.Linear": loop(lambda: lin(a))}
        variants = dict(plain)
        variants["routed torch.mm, Default chosen"] = routed(lambda: torch.mm(a, b))
        variants["routed nn.Linear, Default chosen"] = routed(lambda: lin(a))
        variants["routed torch.mm, Default chosen, Python kernels"] = routed(
            lambda: torch.mm(a, b), "routed-py"
        )
        variants["routed nn.Linear, Default chosen, Python kernels"] = routed(lambda: lin(a), "routed-py")
        variants["routed torch.mm, in a mode('off') block"] = routed(lambda: torch.mm(a, b), block="off")
        variants.update(_mechanisms(a, b, loop))
        result.update(rounds(variants, args.repeats))
        with ut.enabled(), collecting() as met:
            torch.mm(a, b)
            lin(a)
        pinned = _pin_problems(selector, met)
        if pinned:
            kernels = ", ".join(sorted(set(pinned)))
            second = {f"{name} (kernel pass)": fn for name, fn in plain.items()}
            second[f"routed torch.mm, kernel ({kernels})"] = routed(lambda: torch.mm(a, b))
            second[f"routed nn.Linear, kernel ({kernels})"] = routed(lambda: lin(a))
            second["routed torch.mm, kernel, Python kernels"] = routed(lambda: torch.mm(a, b), "routed-py")
            second["routed nn.Linear, kernel, Python kernels"] = routed(lambda: lin(a), "routed-py")
            result.update(rounds(second, args.repeats))
    report.set_overhead((m, n, k), calls, result)
    report.write()


@contextlib.contextmanager
def _scratch_selector() -> Iterator[Any]:
    from unimatmul.cache.protocol import MemoryStore
    from unimatmul.tuning.selector import Selector, set_selector

    selector = Selector(store=MemoryStore())
    old = set_selector(selector)
    try:
        yield selector
    finally:
        set_selector(old)


def _pin_problems(selector: Any, met: list[Any]) -> list[str]:
    """Store the fastest kernel (never Default) as the answer for each problem met."""
    import unimatmul.torch as ut
    from unimatmul.cache.record import OK, PRUNED

    chosen: list[str] = []
    for problem, target in met:
        record = selector.tune(problem, target, force=True, store=False)
        kernels = [r for r in record.results if r.status in (OK, PRUNED) and r.identity != "default/default"]
        if not kernels:
            continue
        best = min(kernels, key=lambda r: r.median_s or math.inf)
        selector.store.put(
            selector.platform(target).namespace, problem.key, replace(record, winner=best.identity)
        )
        chosen.append(best.identity)
    ut.clear_plans()
    return chosen


def _mechanisms(
    a: torch.Tensor, b: torch.Tensor, loop: Callable[..., Callable[[], float]]
) -> dict[str, Callable[[], float]]:
    """Interception mechanisms alone: each forwards to PyTorch's own kernel, nothing else."""
    from torch.overrides import TorchFunctionMode

    mm = torch.mm
    out: dict[str, Callable[[], float]] = {}

    def wrapper(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return mm(x, y)

    out["mechanism: Python wrapper (patched torch.mm)"] = loop(lambda: wrapper(a, b))

    class Passthrough(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    def function_mode() -> float:
        with Passthrough():
            return loop(lambda: torch.mm(a, b))()

    out["mechanism: TorchFunctionMode"] = function_mode

    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return mm(x, y)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> Any:
            return None, None

    out["mechanism: autograd.Function"] = loop(lambda: Fn.apply(a, b))

    name = f"umbench{os.getpid()}"
    lib = torch.library.Library(name, "DEF")
    lib.define("mm(Tensor a, Tensor b) -> Tensor")
    lib.impl("mm", lambda x, y: mm(x, y), "CompositeExplicitAutograd")
    op = getattr(torch.ops, name).mm.default
    out["mechanism: Library op, Python kernel"] = loop(lambda: op(a, b))
    _LIBRARIES.append(lib)

    custom = torch.library.custom_op(f"{name}::cmm", mutates_args=())(_custom_mm)
    out["mechanism: torch.library.custom_op"] = loop(lambda: custom(a, b))

    def aten_kernel() -> float:
        key = "CUDA" if a.is_cuda else "CPU"
        override = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            override.impl("mm", lambda x, y: mm(x, y, out=x.new_empty(0)), key)
        try:
            return loop(lambda: torch.mm(a, b))()
        finally:
            override._destroy()

    out["mechanism: aten::mm kernel in Python (out= passthrough)"] = aten_kernel
    return out


_LIBRARIES: list[Any] = []


def _custom_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(a, b)


# --- section 3: buckets -------------------------------------------------------------------------


def bench_buckets(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, report: Report) -> None:
    import unimatmul.torch as ut
    from unimatmul.backend import DEFAULT
    from unimatmul.torch.model_tuning import collecting
    from unimatmul.tuning.buckets import Buckets
    from unimatmul.tuning.harness import Harness
    from unimatmul.tuning.selector import get_selector

    selector = get_selector()
    buckets = Buckets.parse(args.buckets)
    assert buckets is not None
    specs = SMALL if args.size == "small" else FULL
    problems: dict[str, Any] = {}
    for model_name in args.models:
        spec = specs[model_name]
        spec = Spec(spec.name, spec.dim, spec.heads, spec.kv_heads, spec.mlp, 1, spec.style)
        model = Stack(spec).to(device=device, dtype=dtype).eval()
        model.set_cache(1, args.context, device, dtype)
        with torch.no_grad(), ut.enabled(), collecting() as met:
            model(torch.randn(1, 1, spec.dim, device=device, dtype=dtype), True)
        for problem, target in met:
            if problem.batch == 1:  # the Linears: their m is the batch size in decode
                problems.setdefault(problem.key, (spec.name, problem, target))
    shapes = list(problems.values())[: args.bucket_shapes]
    m_values = [m for m in args.bucket_m if buckets.representative(m) is not None]
    for model_name, problem, target in shapes:
        for rep in sorted({buckets.representative(m) for m in m_values}):  # type: ignore[type-var]
            selector.tune_bucket(problem.with_m(rep), target, buckets)
        for m in m_values:
            at_m = problem.with_m(m)
            decision = selector.decide(at_m, target, "cached")
            choice = decision.runner.candidate
            entries = [(DEFAULT, _default_preparer(target, at_m))]
            if choice != DEFAULT:
                entries.append((choice, _preparer(selector, at_m, choice, target)))
            # Both measured in full (no pruning), so that the ratio is a measurement, not a verdict.
            settings = replace(
                selector.tuner.settings_for(target), prune_ratio=math.inf, first_prune_ratio=math.inf
            )
            harness = Harness(selector.tuner.timer_for(target), settings)
            record = harness.measure(at_m, target, entries)
            times = {r.identity: r.median_s for r in record.results}
            default_s = times.get(DEFAULT.identity)
            choice_s = times.get(choice.identity) if choice != DEFAULT else default_s
            report.add_bucket_row(
                model_name, at_m, buckets, decision.source, choice.identity, default_s, choice_s
            )
            report.write()


def _default_preparer(target: Any, problem: Any) -> Callable[[], Any]:
    from unimatmul.core.runners import DefaultRunner

    return lambda: DefaultRunner(target.adapter, problem.activation)


def _preparer(selector: Any, problem: Any, candidate: Any, target: Any) -> Callable[[], Any]:
    return lambda: selector.prepare(problem, candidate, target)


# --- the report ------------------------------------------------------------------------------


class Report:
    def __init__(self, out: Path, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> None:
        self.out = out
        self.data: dict[str, Any] = {
            "machine": machine(device),
            "settings": {k: (_portable(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "dtype": str(dtype).removeprefix("torch."),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "models": [],
            "errors": [],
            "overhead": None,
            "buckets": [],
        }

    def mode_failed(self, model: str, phase: str, batch: int, mode: str, exc: Exception) -> None:
        self.data.setdefault("failures", []).append(
            {
                "model": model,
                "phase": phase,
                "batch": batch,
                "mode": mode,
                "error": f"{type(exc).__name__}: {exc}"[:500],
            }
        )

    def note_error(self, model: str, phase: str, batch: int, mode: str, err: float) -> None:
        self.data["errors"].append(
            {"model": model, "phase": phase, "batch": batch, "mode": mode, "rel_error": err}
        )

    def add_model_row(
        self,
        spec: Spec,
        phase: str,
        batch: int,
        length: int,
        tokens: int,
        result: dict[str, dict[str, Any]],
        graphs: dict[str, dict[str, Any]],
        stats: dict[str, Any],
        tuned: Any,
    ) -> None:
        row = {
            "model": spec.name,
            "spec": spec.__dict__,
            "phase": phase,
            "batch": batch,
            "length": length,
            "tokens_per_step": tokens,
            "eager": {k: v | {"tokens_per_s": tokens / v["median_s"]} for k, v in result.items()},
            "graphs": {k: v | {"tokens_per_s": tokens / v["median_s"]} for k, v in graphs.items()},
            "routed_calls": stats["routed"],
            "routed_kernel_calls": stats["kernel"],
            "routed_by_label": stats["by_label"],
            "problems_tuned": len(tuned.records),
            "tuned_speedups": [round(s, 4) for s in tuned.speedups],
        }
        self.data["models"].append(row)

    def set_overhead(
        self, shape: tuple[int, int, int], calls: int, result: dict[str, dict[str, Any]]
    ) -> None:
        self.data["overhead"] = {"shape": list(shape), "calls_per_sample": calls, "variants": result}

    def add_bucket_row(
        self,
        model: str,
        problem: Any,
        buckets: Any,
        source: str,
        choice: str,
        default_s: float | None,
        choice_s: float | None,
    ) -> None:
        rep = buckets.representative(problem.m)
        self.data["buckets"].append(
            {
                "model": model,
                "problem": problem.key,
                "m": problem.m,
                "n": problem.n,
                "k": problem.k,
                "bucket": [rep, *buckets.bounds(rep)],
                "source": source,
                "choice": choice,
                "default_s": default_s,
                "choice_s": choice_s,
                "ratio": (choice_s / default_s) if default_s and choice_s else None,
            }
        )

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.data["native"] = native_facts()
        self.data["written"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        (self.out / "results.json").write_text(json.dumps(self.data, indent=2) + "\n")
        (self.out / "results.md").write_text(markdown(self.data))


def native_facts() -> dict[str, Any]:
    """Which routing kernels this process runs: the native ones (built, Lt calls from C++) or not."""
    from unimatmul.torch import native

    return {
        "choice": os.environ.get(native.ENV, "auto"),
        "loaded": native.loaded(),
        "lt_calls_from_cpp": native.has_lt(),
        "build_failure": native.failure(True) or native.failure(False),
    }


def _portable(path: Path) -> str:
    """A path as the report may show it: relative to the working folder, else its name."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path.name


def machine(device: torch.device) -> dict[str, Any]:
    import unimatmul

    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "unimatmul": unimatmul.__version__,
        "device": str(device),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    facts["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts["gpu"] = props.name
        facts["cuda"] = torch.version.cuda or torch.version.hip
    from unimatmul.backend import Target
    from unimatmul.core.arrays import Device, adapter_for_kind
    from unimatmul.tuning.selector import get_selector

    kind = "cpu" if device.type == "cpu" else ("hip" if torch.version.hip else "cuda")
    target = Target(adapter_for_kind("torch"), Device(kind, device.index or 0))
    selector = get_selector()
    facts["backends"] = [b.name for b in selector.backends_for(target)]
    facts["platform"] = selector.platform(target).namespace
    return facts


def _us(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.1f}"


def _cells(result: dict[str, dict[str, Any]], modes: list[str]) -> str:
    """Tokens per second of each mode, then each mode's speed over off ("-" where missing)."""
    cells = [f"{result[m]['tokens_per_s']:,.0f}" if m in result else "-" for m in modes]
    for m in _ratio_modes(modes):
        if "off" in result and m in result:
            cells.append(f"{result['off']['median_s'] / result[m]['median_s']:.3f}x")
        else:
            cells.append("-")
    return " | ".join(cells)


def _ratio_modes(modes: list[str]) -> list[str]:
    return [m for m in modes if m != "off"]


def _ratio_heads(modes: list[str]) -> str:
    return " | ".join(f"{m}/off" for m in _ratio_modes(modes))


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [
        "# unimatmul.torch: models, per-call overhead, buckets",
        "",
        f"Machine: {m.get('gpu') or m['cpu']} ({m['device']}), {m['cpu_count']} CPU cores, torch {m['torch']}, "
        f"unimatmul {m['unimatmul']}; backends: {', '.join(m['backends']) or 'none'}; dtype {data['dtype']}.",
        f"Written {data.get('written', '')} by `benchmarks/torch_models.py` "
        f"(size {data['settings']['size']}, {data['settings']['repeats']} rounds, median round shown).",
    ]
    nat = data.get("native", {})
    lines.append(
        f"Native routing kernels: {nat.get('choice', '?')}, loaded {nat.get('loaded')}, "
        f"Lt calls made from C++ {nat.get('lt_calls_from_cpp')}"
        + (f", build failure: {nat['build_failure']}" if nat.get("build_failure") else "")
        + "."
    )
    if data["settings"].get("note"):
        lines += ["", f"Note: {data['settings']['note']}"]
    if data["models"]:
        modes = list(dict.fromkeys(m for row in data["models"] for m in row["eager"]))
        lines += [
            "",
            "## Tokens per second",
            "",
            "routed = every product tuned by `unimatmul.torch.warmup`, then mode `cached`, "
            "through the native kernels (UNIMATMUL_TORCH_NATIVE as set; the native line above says which); "
            "routed-py = the same with the Python kernels only. "
            "kernel calls = routed calls that ran a backend kernel (the rest chose Default).",
            "",
            "| model | phase | batch | tokens/step | "
            + " | ".join(f"{x} tok/s" for x in modes)
            + f" | {_ratio_heads(modes)} | kernel calls |",
            "|---|---|---|---|" + "---|" * len(modes) + "---|" * len(_ratio_modes(modes)) + "---|",
        ]
        for row in data["models"]:
            lines.append(
                f"| {row['model']} | {row['phase']} | {row['batch']} | {row['tokens_per_step']} | "
                f"{_cells(row['eager'], modes)} | {row['routed_kernel_calls']}/{row['routed_calls']} |"
            )
        graphed = [r for r in data["models"] if r["graphs"]]
        if graphed:
            gmodes = list(dict.fromkeys(m for row in graphed for m in row["graphs"]))
            lines += [
                "",
                "### Decode as CUDA graph replays",
                "",
                "| model | batch | "
                + " | ".join(f"{x} tok/s" for x in gmodes)
                + f" | {_ratio_heads(gmodes)} |",
                "|---|---|" + "---|" * len(gmodes) + "---|" * len(_ratio_modes(gmodes)),
            ]
            for row in graphed:
                lines.append(f"| {row['model']} | {row['batch']} | {_cells(row['graphs'], gmodes)} |")
        for f in data.get("failures", []):
            lines.append(
                f"\n{f['mode']} failed on {f['model']} {f['phase']} batch {f['batch']} and was left out: {f['error']}"
            )
        worst = max((e["rel_error"] for e in data["errors"]), default=0.0)
        lines += ["", f"Largest relative error of any mode against routing off: {worst:.2e}."]
    if data["overhead"]:
        o = data["overhead"]
        variants = o["variants"]
        base = variants["torch.mm"]["median_s"]
        lines += [
            "",
            f"## Per-call host time, {o['shape'][0]}x{o['shape'][1]}x{o['shape'][2]} (m x n x k)",
            "",
            f"{o['calls_per_sample']} back-to-back calls per sample; median of the rounds.",
            "",
            "| variant | us per call | minus torch.mm |",
            "|---|---|---|",
        ]
        for name, v in variants.items():
            lines.append(f"| {name} | {_us(v['median_s'])} | {_us(v['median_s'] - base)} |")
    if data["buckets"]:
        ratios = [b["ratio"] for b in data["buckets"] if b["ratio"]]
        lines += [
            "",
            "## Buckets: the bucket's choice against Default at m between representatives",
            "",
            f"Worst ratio {max(ratios):.3f}, geometric mean {math.exp(sum(math.log(r) for r in ratios) / len(ratios)):.3f} "
            f"over {len(ratios)} points (choice time / Default time; below 1 is faster). Both timed in full "
            "by the harness (no pruning) after the bucket was tuned.",
            "",
            "| model | n x k | m | bucket (rep: lo-hi) | choice | Default us | choice us | ratio |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for b in data["buckets"]:
            rep, lo, hi = b["bucket"]
            ratio = "-" if b["ratio"] is None else f"{b['ratio']:.3f}"
            lines.append(
                f"| {b['model']} | {b['n']}x{b['k']} | {b['m']} | {rep}: {lo}-{hi} | {b['choice']} | "
                f"{_us(b['default_s'])} | {_us(b['choice_s'])} | {ratio} |"
            )
    return "\n".join(lines) + "\n"


# --- main ----------------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="f32, bf16 or f16 (default: bf16 on a GPU, f32 on a CPU)")
    p.add_argument(
        "--size", choices=["full", "small"], default=None, help="model sizes (default: full on a GPU)"
    )
    p.add_argument("--models", default="gpt2,llama", help="comma list of gpt2, llama")
    p.add_argument("--layers", type=int, default=None, help="blocks per stack (default: 4 GPT-2, 2 Llama)")
    p.add_argument("--prefill-batches", type=_ints, default=None, help="default 1,8,32 (GPU) / 1,4 (CPU)")
    p.add_argument("--prompt", type=int, default=None, help="prefill tokens per sequence (512 GPU / 64 CPU)")
    p.add_argument(
        "--decode-batches", type=_ints, default=None, help="default 1,8,32,128 (GPU) / 1,4,16 (CPU)"
    )
    p.add_argument("--context", type=int, default=None, help="decode KV cache length (1024 GPU / 64 CPU)")
    p.add_argument("--repeats", type=int, default=7, help="rounds per measurement")
    p.add_argument("--min-time", type=float, default=None, help="seconds per sample (0.2 GPU / 0.1 CPU)")
    p.add_argument("--no-graphs", dest="graphs", action="store_false", help="skip CUDA graph decode")
    p.add_argument(
        "--modes",
        default="off,routed,routed-py,tunableop",
        help="comma list of off, routed, routed-py, tunableop (CUDA/ROCm only). A failing mode is reported and "
        "dropped; a CUDA error ends the run, so run tunableop apart if it breaks: --modes off,tunableop",
    )
    p.add_argument("--sections", default="models,overhead,buckets")
    p.add_argument("--overhead-shape", type=_ints, default=[16, 64, 64], help="m,n,k of the small matmul")
    p.add_argument("--overhead-calls", type=int, default=2000)
    p.add_argument("--buckets", default="pow2", help="bucket spec for the buckets section")
    p.add_argument("--bucket-m", type=_ints, default=None, help="m values to check (between representatives)")
    p.add_argument("--bucket-shapes", type=int, default=8, help="at most this many decode products")
    p.add_argument("--cache", type=Path, default=None, help="tuning cache (default: a fresh one in --out)")
    p.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (CPU; also OMP_NUM_THREADS)"
    )
    p.add_argument("--note", default="", help="a line for the report (conditions of the run)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    gpu = args.device.startswith("cuda")
    args.size = args.size or ("full" if gpu else "small")
    args.dtype = args.dtype or ("bf16" if gpu else "f32")
    args.models = [x.strip() for x in args.models.split(",") if x.strip()]
    args.prefill_batches = args.prefill_batches or ([1, 8, 32] if gpu else [1, 4])
    args.prompt = args.prompt or (512 if gpu else 64)
    args.decode_batches = args.decode_batches or ([1, 8, 32, 128] if gpu else [1, 4, 16])
    args.context = args.context or (1024 if gpu else 64)
    args.min_time = args.min_time or (0.2 if gpu else 0.1)
    # Mostly inside buckets (the tuner measured only representatives and edges), a few at edges.
    args.bucket_m = args.bucket_m or (
        [3, 5, 10, 20, 40, 80, 100, 150, 300, 600, 1000, 1500, 3000] if gpu else [5, 7, 10, 20, 40, 80]
    )
    args.sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    args.modes = [x.strip() for x in args.modes.split(",") if x.strip()]
    unknown = set(args.modes) - {"off", "routed", "routed-py", "tunableop"}
    if unknown or "off" not in args.modes:
        p.error(f"--modes must hold off and any of routed, routed-py, tunableop (got {args.modes})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ["UNIMATMUL_CACHE"] = str(args.cache or (args.out / "cache.msgpack"))
    os.environ.pop("UNIMATMUL_MODE", None)
    if args.threads:
        # oneDNN shares PyTorch's OpenMP runtime; set the variable as well for any pool made later.
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    report = Report(args.out, args, device, dtype)
    report.write()
    sections = {"models": bench_models, "overhead": bench_overhead, "buckets": bench_buckets}
    for name in args.sections:
        started = time.perf_counter()
        sections[name](args, device, dtype, report)
        sys.stderr.write(f"{name}: {time.perf_counter() - started:.0f} s\n")
    report.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
