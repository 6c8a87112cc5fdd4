"""Tuning across the ranks of a ``torch.distributed`` job: the group, and sharded tuning.

On torch.distributed, the engine the users already run (NCCL between GPUs, gloo
between CPUs); torch is imported only when a function here is used.

**Sharded tuning** (``torchrun --nproc-per-node N -m unimatmul tune ...``,
:func:`tune_sharded`): every rank tunes on its own device. The jobs that the cache
does not hold yet are ordered by estimated cost, largest first (:func:`estimated_cost`),
and each rank claims the next one through the job's key-value store (an atomic
counter), so a rank that finishes early takes more: the longest-processing-time rule
done dynamically, which stays balanced when the estimates are wrong. Without a
store (a group the caller made), the same order is dealt out statically
(:func:`static_shards`). The records are gathered with ``all_gather_object``; rank 0
writes them into the cache once (one locked read-merge-write); the other ranks write
nothing. A rank that dies makes the gather fail on the others (gloo says so at once;
under torchrun the agent also stops them): each surviving rank then stores what it
tuned itself through the ordinary locked store, so the file stays valid and nothing
measured is lost, and the error names the failure.

Agreed decisions in a running job (every rank runs the same kernel for the same
product) are :mod:`unimatmul.tuning.agreement`, on the :class:`Group` defined here.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from unimatmul.cache.protocol import CacheStore
from unimatmul.cache.record import TuningRecord
from unimatmul.core._backend import Target
from unimatmul.core.arrays import CPU, Device
from unimatmul.core.errors import UnimatmulError
from unimatmul.tuning.harness import HarnessConfig
from unimatmul.tuning.jobs import TuneJob
from unimatmul.tuning.selector import Selector

#: The environment torchrun (any ``env://`` launcher) gives each rank.
LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class DistributedError(UnimatmulError):
    """The ranks of a job cannot tune together; the message says which rank and why.

    Raised on every rank alike (the reason was exchanged first), never on one alone.
    ``unavailable``: nothing can be tuned here (no backend on some rank's device).
    """

    def __init__(self, msg: str, *, unavailable: bool = False) -> None:
        super().__init__(msg)
        self.unavailable = unavailable


# --- the group -----------------------------------------------------------------------------


def _torch_distributed(*, load: bool = True) -> Any | None:
    """``torch.distributed``, or None when torch (or its distributed package) is absent.

    ``load=False`` never imports torch: a process that has not imported it has no
    process group either (the Selector's gate must not import torch into a NumPy program).
    """
    if not load and "torch" not in sys.modules:
        return None
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() else None


class Group:
    """The ranks of a torch.distributed process group and the three collectives used here."""

    def __init__(self, dist: Any, handle: Any = None, *, store: Any = None, owned: bool = False) -> None:
        self._dist = dist
        self.handle = handle  # None: the default (world) group
        self.rank: int = dist.get_rank(handle)
        self.size: int = dist.get_world_size(handle)
        self.backend = str(dist.get_backend(handle))
        # The c10d key-value store, when this module started the group (work claiming).
        self.store = store
        self.owned = owned
        self._src = 0 if handle is None else dist.get_global_rank(handle, 0)

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank."""
        out: list[Any] = [None] * self.size
        self._dist.all_gather_object(out, obj, group=self.handle)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (what the others pass is ignored)."""
        box = [obj]
        self._dist.broadcast_object_list(box, src=self._src, group=self.handle)
        return box[0]

    def close(self) -> None:
        """End the process group if this module started it."""
        if self.owned and self._dist.is_initialized():
            self._dist.destroy_process_group()


def current_group(handle: Any = None, *, load: bool = True) -> Group | None:
    """The initialised process group (the default one, or ``handle``), else None."""
    dist = _torch_distributed(load=load)
    if dist is None or not dist.is_initialized():
        return None
    return Group(dist, handle)


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process stands in a job that torchrun (``env://``) started."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def launch_env() -> LaunchEnv | None:
    """This rank's place from torchrun's variables, or None when they are not all set."""
    if any(not os.environ.get(name) for name in LAUNCH_VARIABLES):
        return None
    try:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", "0"))
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    except ValueError as exc:
        msg = f"torchrun's RANK/WORLD_SIZE/LOCAL_RANK must be integers: {exc}"
        raise DistributedError(msg) from None
    return LaunchEnv(rank, size, local, local_size)


def launch(device_kind: str) -> Group:
    """Join the job torchrun started, as one rank on device ``device_kind:LOCAL_RANK``.

    NCCL between GPUs, gloo between CPUs. The rendezvous store is kept for claiming
    work; :meth:`Group.close` ends the group.
    """
    env = launch_env()
    if env is None:
        missing = ", ".join(name for name in LAUNCH_VARIABLES if not os.environ.get(name))
        msg = (
            f"distributed tuning runs under torchrun; {missing} not set "
            "(run: torchrun --nproc-per-node N -m unimatmul tune ...)"
        )
        raise DistributedError(msg)
    dist = _torch_distributed()
    if dist is None:
        msg = "distributed tuning needs PyTorch with torch.distributed (pip install torch)"
        raise DistributedError(msg, unavailable=True)
    backend = "gloo"
    if device_kind in ("cuda", "hip"):
        import torch

        if not torch.cuda.is_available():
            msg = f"--device {device_kind}: this torch sees no GPU"
            raise DistributedError(msg, unavailable=True)
        # One device per rank; NCCL's object collectives use the current device.
        torch.cuda.set_device(env.local_rank)
        backend = "nccl"
    store, rank, size = next(dist.rendezvous("env://"))
    dist.init_process_group(backend, store=store, rank=rank, world_size=size)
    return Group(dist, store=dist.PrefixStore("unimatmul", store), owned=True)


def rank_device(kind: str, local_rank: int) -> Device:
    """The device a rank uses: its local rank's GPU, or the CPU."""
    return CPU if kind == "cpu" else Device(kind, local_rank)


# --- sharded tuning ----------------------------------------------------------------------------

# Nominal speeds, only to order jobs by size: (FLOP/s of one call, seconds per call at least,
# FLOP/s of the float64 reference). Real times differ; claiming work keeps ranks balanced.
_NOMINAL = {"cpu": (50e9, 5e-6, 10e9), "gpu": (200e12, 8e-6, 30e12)}
_NOMINAL_CANDIDATES = 8


def estimated_cost(job: TuneJob, harness: HarnessConfig) -> float:
    """Seconds a job's tuning may take (a nominal model: for ordering jobs, not a promise).

    Each candidate costs its pause, warm-up and samples (bounded by the budget and by the
    sample counts), and the numeric check one float64 product; a bucket also times its
    best candidates at four more points.
    """
    rate, floor, reference_rate = _NOMINAL["cpu" if job.target.device.kind == "cpu" else "gpu"]
    flops = job.problem.flops
    call = floor + flops / rate
    sampling = min(max(harness.min_samples * call, harness.budget_s), harness.max_samples * call)
    per_candidate = harness.settle_s + harness.warmup * call + sampling
    cost = _NOMINAL_CANDIDATES * per_candidate + flops / reference_rate
    if job.buckets is not None:
        cost *= 3.0  # the representative, then 4 check points with a few candidates each
    return cost


def lpt_order(costs: Sequence[float]) -> list[int]:
    """Indices, largest cost first (ties: the earlier job): the order work is handed out."""
    return sorted(range(len(costs)), key=lambda i: (-costs[i], i))


def static_shards(costs: Sequence[float], size: int) -> list[list[int]]:
    """Each rank's jobs when they cannot be claimed: the largest job to the least-loaded
    rank, in turn (longest processing time first). Deterministic on every rank."""
    shards: list[list[int]] = [[] for _ in range(size)]
    loads = [0.0] * size
    for index in lpt_order(costs):
        rank = min(range(size), key=lambda r: (loads[r], r))
        shards[rank].append(index)
        loads[rank] += costs[index]
    return shards


@dataclass
class Outcome:
    """One job of a sharded run as every rank sees it after the gather."""

    index: int
    source: str  # "tuned", "cache" (read by rank 0 before the run) or "failed"
    rank: int  # the rank that tuned it (rank 0 for records read from the cache)
    record: TuningRecord | None
    namespace: str = ""
    error: str = ""
    busy_s: float = 0.0


@dataclass
class ShardedRun:
    """What a sharded run did, the same on every rank (but ``written``)."""

    outcomes: list[Outcome]
    ranks: int
    backend: str
    claiming: bool  # True: jobs claimed from the store; False: static shards
    busy_s: list[float]  # per rank: seconds spent tuning
    tuned: list[int]  # per rank: jobs tuned
    tuning_s: float  # wall seconds from the plan to the gathered records
    hosts: dict[str, int] = field(default_factory=dict)  # host name -> ranks on it
    omp_threads: str | None = None  # OMP_NUM_THREADS on rank 0 (CPU kernels' threads)
    written: int = 0  # records this rank stored (rank 0, or every rank after a failure)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.source == "failed"]


def _target_label(target: Target) -> str:
    return f"{target.array_kind}@{target.device.kind}"


def _hello(jobs: Sequence[TuneJob], selector: Selector) -> dict[str, Any]:
    """This rank's namespaces and missing backends, per kind of target (errors as data)."""
    namespaces: dict[str, tuple[str, dict[str, Any]]] = {}
    unavailable: list[str] = []
    error = ""
    try:
        for target in dict.fromkeys(job.target for job in jobs):
            label = _target_label(target)
            if not selector.backends_for(target):
                unavailable.append(label)
                continue
            platform = selector.platform(target)
            namespaces[label] = (platform.namespace, platform.to_dict())
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    listed = "\n".join(
        f"{job.problem.key} {job.target.array_kind} {job.buckets.spec if job.buckets else ''}" for job in jobs
    )
    return {
        "jobs": (len(jobs), hashlib.sha256(listed.encode()).hexdigest()),
        "namespaces": namespaces,
        "unavailable": unavailable,
        "error": error,
        "host": socket.gethostname(),
        # torchrun sets OMP_NUM_THREADS=1 when it starts several processes per machine.
        "omp_threads": os.environ.get("OMP_NUM_THREADS"),
    }


def _check_hello(hello: list[dict[str, Any]]) -> None:
    for rank, info in enumerate(hello):
        if info["error"]:
            msg = f"rank {rank} could not inspect its device: {info['error']}"
            raise DistributedError(msg)
        if info["unavailable"]:
            msg = f"rank {rank} ({info['host']}) has no backend for {', '.join(info['unavailable'])}"
            raise DistributedError(msg, unavailable=True)
    for rank, info in enumerate(hello[1:], start=1):
        if info["jobs"] != hello[0]["jobs"]:
            msg = (
                f"rank {rank} ({info['host']}) was given other problems than rank 0 ({info['jobs'][0]} vs "
                f"{hello[0]['jobs'][0]}): give every rank the same arguments and files"
            )
            raise DistributedError(msg)
    first = {label: ns for label, (ns, _) in hello[0]["namespaces"].items()}
    for rank, info in enumerate(hello[1:], start=1):
        theirs = {label: ns for label, (ns, _) in info["namespaces"].items()}
        if theirs != first:
            msg = (
                f"rank {rank} ({info['host']}) is another kind of machine than rank 0 "
                f"({theirs} vs {first}): a distributed run tunes one kind; run one job per kind"
            )
            raise DistributedError(msg)


def _plan(jobs: Sequence[TuneJob], selector: Selector, force: bool) -> dict[str, Any]:
    """Rank 0's plan: which jobs the cache already answers, and the order of the rest."""
    try:
        cached: dict[int, dict[str, Any]] = {}
        if not force:
            for i, job in enumerate(jobs):
                record = job.stored(selector)
                if record is not None:
                    cached[i] = record.to_dict()
        todo = [i for i in range(len(jobs)) if i not in cached]
        harness = {target: selector.tuner.settings_for(target) for target in {jobs[i].target for i in todo}}
        costs = [estimated_cost(jobs[i], harness[jobs[i].target]) for i in todo]
        order = [todo[i] for i in lpt_order(costs)]
        return {
            "run": uuid.uuid4().hex,
            "cached": cached,
            "order": order,
            "costs": sorted(costs, reverse=True),
        }
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _claimed(group: Group, plan: dict[str, Any]) -> Iterator[int]:
    """The jobs this rank tunes: claimed one at a time from the store, or its static share."""
    order: list[int] = plan["order"]
    if group.store is None:
        shares = static_shards(plan["costs"], group.size)
        yield from (order[position] for position in shares[group.rank])
        return
    counter = f"tune/{plan['run']}/next"
    while True:
        try:
            position = group.store.add(counter, 1) - 1
        except Exception:
            return  # the store's host is gone: the gather that follows reports it
        if position >= len(order):
            return
        yield order[position]


def tune_sharded(
    jobs: Sequence[TuneJob],
    selector: Selector,
    group: Group,
    *,
    force: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> ShardedRun:
    """Tune ``jobs`` across the ranks of ``group``; rank 0 stores every record once.

    Every rank passes the same jobs (each on its own device). Returns the same
    outcomes on every rank. ``progress(done, total)`` is called on rank 0 after each
    job it finishes (``done`` counts every rank's jobs when they are claimed).
    """
    hello = group.all_gather(_hello(jobs, selector))
    _check_hello(hello)
    plan = group.broadcast(_plan(jobs, selector, force) if group.rank == 0 else None)
    if "error" in plan:
        msg = f"rank 0 could not plan the run: {plan['error']}"
        raise DistributedError(msg)
    started = time.perf_counter()
    done_key = f"tune/{plan['run']}/done"
    total = len(plan["order"])
    mine: list[dict[str, Any]] = []
    kept: list[tuple[int, TuningRecord]] = []
    for index in _claimed(group, plan):
        job = jobs[index]
        t0 = time.perf_counter()
        entry: dict[str, Any] = {"index": index, "rank": group.rank}
        try:
            record = job.tune(selector, store=False)
            entry.update(
                source="tuned", record=record.to_dict(), namespace=selector.platform(job.target).namespace
            )
            kept.append((index, record))
        except Exception as exc:  # one problem's failure is data, never a missed collective
            entry.update(source="failed", record=None, error=f"{type(exc).__name__}: {exc}")
        entry["busy_s"] = time.perf_counter() - t0
        mine.append(entry)
        if progress is not None and group.rank == 0:
            # A display that fails must not make this rank miss the gather (the others would wait).
            with contextlib.suppress(Exception):
                progress(_done(group, done_key, len(mine)), total)
        elif group.store is not None:
            with contextlib.suppress(Exception):
                group.store.add(done_key, 1)
    try:
        gathered = group.all_gather(mine)
    except Exception as exc:
        written = _store_own(selector, jobs, kept)
        msg = (
            f"rank {group.rank}: gathering the records failed ({type(exc).__name__}: {exc}); "
            f"a rank probably died. This rank stored its own {written} records in {selector.store.location}"
        )
        raise DistributedError(msg) from exc
    tuning_s = time.perf_counter() - started
    outcomes: dict[int, Outcome] = {}
    for index, data in plan["cached"].items():
        outcomes[index] = Outcome(index, "cache", 0, TuningRecord.from_dict(data))
    busy = [0.0] * group.size
    tuned = [0] * group.size
    for entries in gathered:
        for e in entries:
            got = TuningRecord.from_dict(e["record"]) if e["record"] is not None else None
            outcomes[e["index"]] = Outcome(
                e["index"],
                e["source"],
                e["rank"],
                got,
                e.get("namespace", ""),
                e.get("error", ""),
                e["busy_s"],
            )
            busy[e["rank"]] += e["busy_s"]
            tuned[e["rank"]] += e["source"] == "tuned"
    missing = [i for i in range(len(jobs)) if i not in outcomes]
    for index in missing:  # never claimed: the store went away before its turn
        outcomes[index] = Outcome(index, "failed", -1, None, error="not tuned: no rank claimed it")
    hosts: dict[str, int] = {}
    for info in hello:
        hosts[info["host"]] = hosts.get(info["host"], 0) + 1
    run = ShardedRun(
        [outcomes[i] for i in range(len(jobs))],
        group.size,
        group.backend,
        group.store is not None,
        busy,
        tuned,
        tuning_s,
        hosts,
        hello[0]["omp_threads"],
    )
    if group.rank == 0:
        platforms = {ns: facts for ns, facts in hello[0]["namespaces"].values()}
        items = [
            (o.namespace, o.record) for o in run.outcomes if o.source == "tuned" and o.record is not None
        ]
        run.written = write_records(selector.store, items, platforms)
    return run


def _done(group: Group, key: str, mine: int) -> int:
    """Jobs finished by every rank so far (rank 0's own count without a store)."""
    if group.store is None:
        return mine
    try:
        return int(group.store.add(key, 1))
    except Exception:
        return mine


def _store_own(selector: Selector, jobs: Sequence[TuneJob], kept: list[tuple[int, TuningRecord]]) -> int:
    """After a failed gather: store this rank's own records, so that nothing measured is lost."""
    items = []
    platforms = {}
    for index, record in kept:
        platform = selector.platform(jobs[index].target)
        platforms[platform.namespace] = platform.to_dict()
        items.append((platform.namespace, record))
    with contextlib.suppress(Exception):
        return write_records(selector.store, items, platforms)
    return 0


def write_records(
    store: CacheStore, items: Iterable[tuple[str, TuningRecord]], platforms: dict[str, dict[str, Any]]
) -> int:
    """Store ``(namespace, record)`` pairs with one write of the file (its ``batch``)."""
    items = list(items)
    if not items:
        return 0
    batch = getattr(store, "batch", None)
    with batch() if batch is not None else contextlib.nullcontext():
        for namespace, facts in platforms.items():
            store.note_platform(namespace, facts)
        put_many = getattr(store, "put_many", None)
        if put_many is not None:
            put_many({(ns, record.problem): record for ns, record in items})
        else:
            for ns, record in items:
                store.put(ns, record.problem, record)
    store.flush()
    return len(items)
