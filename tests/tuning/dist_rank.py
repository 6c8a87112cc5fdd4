"""One rank of the multi-process tests of distributed tuning (tests/tuning/test_distributed.py).

Started once per rank with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT), by the tests or by torchrun itself (the GPU script runs the
``agree`` scenario on two GPUs with ``--device cuda``). It prints one JSON line, what the
tests compare across ranks:

    python tests/tuning/dist_rank.py sharded WORKDIR
    python tests/tuning/dist_rank.py die WORKDIR          # rank 1 dies after its first job
    python tests/tuning/dist_rank.py agree WORKDIR [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import unimatmul
import unimatmul.torch as ut
from unimatmul.backend import DEFAULT, Target
from unimatmul.core.arrays import CPU, Device, adapter_for_kind
from unimatmul.core.problem import Problem
from unimatmul.testing import isolated_selector
from unimatmul.tuning import agreement
from unimatmul.tuning.distributed import DistributedError, Group, ShardedRun, launch, tune_sharded
from unimatmul.tuning.harness import HarnessConfig
from unimatmul.tuning.jobs import TuneJob
from unimatmul.tuning.selector import Selector

# Enough samples to rank real kernels, few enough for CI's two shared cores.
QUICK = HarnessConfig(warmup=1, min_samples=2, max_samples=4, budget_s=0.0, settle_s=0.0, max_sets=2)


def emit(result: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def preset_jobs(selector: Selector, name: str) -> list[TuneJob]:
    target = Target(adapter_for_kind("numpy"), CPU)
    shapes = selector.plugins.presets()[name].shapes
    return [TuneJob(Problem.parse_shape(f"{shape}:f32"), target) for shape in shapes]


def summary(run: ShardedRun) -> dict[str, Any]:
    return {
        "outcomes": [
            {
                "index": o.index,
                "source": o.source,
                "rank": o.rank,
                "problem": o.record.problem if o.record else None,
                "winner": o.record.winner if o.record else None,
                "candidates": len(o.record.results) if o.record else 0,
                "error": o.error,
            }
            for o in run.outcomes
        ],
        "tuned": run.tuned,
        "claiming": run.claiming,
        "written": run.written,
    }


def sharded(workdir: Path) -> dict[str, Any]:
    """bert-base across the ranks: claimed from the store, then dealt out statically."""
    group = launch("cpu")
    try:
        with isolated_selector(workdir / "claim.msgpack") as selector:
            selector.settings = QUICK
            claim = tune_sharded(preset_jobs(selector, "bert-base"), selector, group)
        # The same group without its store: the static shares (a group the caller made).
        plain = Group(dist)
        with isolated_selector(workdir / "static.msgpack") as selector:
            selector.settings = QUICK
            static = tune_sharded(preset_jobs(selector, "bert-base"), selector, plain)
    finally:
        group.close()
    return {"rank": group.rank, "claim": summary(claim), "static": summary(static)}


def die(workdir: Path) -> dict[str, Any]:
    """Rank 1 dies (os._exit) right after measuring its first job, before the gather."""
    group = launch("cpu")
    measure = TuneJob.tune

    def tune_then_die(self: TuneJob, selector: Selector, **options: Any) -> Any:
        record = measure(self, selector, **options)
        if group.rank == 1:
            os._exit(17)
        return record

    TuneJob.tune = tune_then_die  # type: ignore[method-assign]
    with isolated_selector(workdir / "cache.msgpack") as selector:
        selector.settings = QUICK
        try:
            tune_sharded(preset_jobs(selector, "bert-base"), selector, group)
        except DistributedError as exc:
            return {"rank": group.rank, "error": str(exc), "entries": selector.store.count()}
    return {"rank": group.rank, "error": None}


class ColumnParallel(torch.nn.Module):
    """y = x @ W[:, shard]: each rank holds a slice of the output features."""

    def __init__(self, dim: int, hidden: int, ranks: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(dim, hidden // ranks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.linear(x))


class RowParallel(torch.nn.Module):
    """y = sum over ranks of x[:, shard] @ W[shard, :]: an all-reduce joins the slices."""

    def __init__(self, hidden: int, dim: int, ranks: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(hidden // ranks, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        dist.all_reduce(y)
        return y


class TensorParallelMLP(torch.nn.Module):
    """Two tensor-parallel MLP blocks (Megatron's column- then row-parallel Linear)."""

    def __init__(self, dim: int, hidden: int, ranks: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(ColumnParallel(dim, hidden, ranks), RowParallel(hidden, dim, ranks))
            for _ in range(2)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def plan_choices() -> dict[str, str]:
    """Problem key -> the kernel routing runs for it now (Default when no runner)."""
    found = {}
    for plan in ut.plans():
        if plan.problem is not None:
            runner = plan.runner
            found[plan.problem.key] = runner.candidate.identity if runner is not None else DEFAULT.identity
    return found


def stored(selector: Selector, target: Target) -> dict[str, dict[str, Any]]:
    namespace = selector.platform(target).namespace
    return {
        key: {
            "winner": r.winner,
            "agreed": r.settings.get("agreed"),
            "ok": sum(c.status == "ok" for c in r.results),
        }
        for _, key, r in selector.store.items(namespace)
    }


def agree(workdir: Path, device: str) -> dict[str, Any]:
    """A 2-rank tensor-parallel stack with routing: warm-up, then deferred tuning and agree()."""
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        where = torch.device("cuda", local)
        target = Target(adapter_for_kind("torch"), Device("cuda", local))
    else:
        dist.init_process_group("gloo")
        where = torch.device("cpu")
        target = Target(adapter_for_kind("torch"), CPU)
    os.environ["UNIMATMUL_DISTRIBUTED"] = "1"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(rank)  # each rank its own shard of the weights
    dim, hidden = (1024, 4096) if device == "cuda" else (64, 256)
    model = TensorParallelMLP(dim, hidden, size)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    model = model.to(where, dtype)
    # Each rank its own cache file, as on separate machines: each must store the same choices.
    with isolated_selector(workdir / f"cache-rank{rank}.msgpack") as selector:
        if device == "cpu":
            selector.settings = QUICK
        ut.enable()
        try:
            x = torch.randn(16, dim, generator=torch.Generator().manual_seed(7)).to(where, dtype)
            # Rank 1 alone also meets a product that rank 0 never meets: it must not hang.
            extra = torch.randn(24, dim, generator=gen).to(where, dtype) if rank == 1 else None
            inputs = (x,) if extra is None else (x, extra)

            def run(x: torch.Tensor, extra: torch.Tensor | None = None) -> torch.Tensor:
                y = model(x)
                if extra is not None:
                    y = y.sum() + (extra @ model.blocks[0][0].linear.weight.T).sum()
                return y

            warm = ut.warmup(run, inputs)
            with torch.no_grad():
                run(*inputs)
            after_warmup = plan_choices()
            # In tune mode a new product is deferred (Default now), then settled by agree().
            m = 8 + 4 * rank  # each rank a different m: neither waits for the other
            a = torch.randn(m, dim, generator=gen).to(where, dtype)
            with unimatmul.mode("tune"), torch.no_grad():
                a @ model.blocks[1][0].linear.weight.T
            deferred = [item.key for item in agreement.pending()]
            sources = {p.problem.key: p.source for p in ut.plans() if p.problem is not None}
            settled = ut.agree()
            with torch.no_grad():
                a @ model.blocks[1][0].linear.weight.T
            after_agree = plan_choices()
            # Ranks that called agree() a different number of times all raise, none hangs.
            mismatch = None
            if rank == 1:
                agreement._process.calls += 1
            try:
                ut.agree()
            except DistributedError as exc:
                mismatch = str(exc)
            result = {
                "rank": rank,
                "warmup_problems": len(warm.problems),
                "warmup_records": len(warm.records),
                "after_warmup": after_warmup,
                "deferred": deferred,
                "deferred_sources": [sources.get(key) for key in deferred],
                "settled": {c.item.key: c.winner for c in settled.choices},
                "after_agree": after_agree,
                "stored": stored(selector, target),
                "mismatch": mismatch,
            }
            # Both ranks past every collective before either tears its group down: a rank
            # that closed its connections while the other was still in one made gloo abort
            # that one at exit ("terminate called without an active exception", seen once).
            dist.barrier()
            return result
        finally:
            ut.disable()
            dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["sharded", "die", "agree"])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    if args.scenario == "sharded":
        emit(sharded(args.workdir))
    elif args.scenario == "die":
        emit(die(args.workdir))
    else:
        emit(agree(args.workdir, args.device))


if __name__ == "__main__":
    main()
