"""Agreed tuning decisions in a running distributed job (``UNIMATMUL_DISTRIBUTED=1``).

So that every rank of a tensor-parallel group runs the same kernel for the same product
(the same numerics, even step times), no rank decides alone:

* Decisions are made only at collective points that every rank of the group calls
  together, in the same order: ``unimatmul.torch.warmup()`` and
  ``unimatmul.torch.agree()`` (a step boundary). Between them, in ``tune`` mode, a
  problem met for the first time is *deferred*: Default serves it (on every rank) and
  it is noted locally (:func:`install` puts the gate in the Selector). Nothing
  collective ever runs inside a product.
* At a collective point the ranks first exchange the problems each one met (an
  all-gather, in which a rank with nothing to report takes part like the others),
  then the choices their caches hold. Every problem of the union whose choices are
  missing or differ is measured by every rank, including ranks that never met it
  (a Problem is enough to build its operands), so the sequence of collectives is the
  same on every rank whatever each one met: a rank that does not meet a problem
  cannot make another wait. Local failures travel as data, never as a skipped
  collective.
* Rank 0 applies :func:`agreed_winner` to the gathered records (a candidate must
  have passed the numeric check and been measured on every rank; the one with the
  best median over the ranks' medians wins, if it beats Default's by ``min_gain``)
  and broadcasts the choices; every rank stores its own record with that winner.
* Each call carries a sequence number: ranks that called ``agree()`` a different
  number of times all raise :class:`DistributedError` instead of mixing two calls' data.

Without the variable, or with no initialised group (or a group of one), every process
tunes alone as it always did, and ``warmup()`` is not collective.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import astuple, dataclass, field, replace
from typing import Any

from unimatmul import settings
from unimatmul.cache.record import OK, TuningRecord
from unimatmul.core._backend import DEFAULT, Target
from unimatmul.core.arrays import CPU, Device, adapter_for_kind
from unimatmul.core.problem import Problem
from unimatmul.tuning.buckets import Buckets, choose
from unimatmul.tuning.distributed import DistributedError, Group, current_group, write_records
from unimatmul.tuning.jobs import TuneJob
from unimatmul.tuning.selector import Selector, forget_prepared, get_selector, set_tuning_gate


@dataclass(frozen=True, order=True)
class Item:
    """A problem as the ranks exchange it: its key, array library, device kind, buckets."""

    key: str  # the problem tuned (a bucket's representative for a bucket)
    array: str
    device: str  # the device kind: each rank uses its own device of that kind
    buckets: str = ""  # the bucket spec; "" for the exact problem

    @classmethod
    def of(cls, problem: Problem, target: Target, buckets: Buckets | None = None) -> Item:
        rep = buckets.representative(problem.m) if buckets is not None else None
        if buckets is None or rep is None:
            return cls(problem.key, target.array_kind, target.device.kind)
        return cls(problem.with_m(rep).key, target.array_kind, target.device.kind, buckets.spec)

    def job(self, devices: dict[str, Device]) -> TuneJob:
        """This item as a job on this rank's device of its kind."""
        device = devices.get(self.device) or _default_device(self.device)
        target = Target(adapter_for_kind(self.array), device)
        return TuneJob(
            Problem.from_key(self.key), target, Buckets.parse(self.buckets) if self.buckets else None
        )


def _default_device(kind: str) -> Device:
    if kind == "cpu":
        return CPU
    import torch  # a GPU item on a rank that met nothing on a GPU: its current device

    return Device(kind, torch.cuda.current_device())


class _Agreements:
    """This process's side of agreeing: the problems deferred to the next agreement, and
    how many agree() calls it made (the ranks compare them)."""

    def __init__(self) -> None:
        self.pending: dict[Item, Target] = {}
        self.lock = threading.Lock()
        self.calls = 0


_process = _Agreements()


def active(group: Any = None) -> bool:
    """Whether tuning decisions are made together now: ``UNIMATMUL_DISTRIBUTED=1`` and an
    initialised process group of more than one rank."""
    if not settings.DISTRIBUTED.get():
        return False
    found = current_group(group, load=False)
    return found is not None and found.size > 1


def _defer(problem: Problem, target: Target) -> bool:
    """The Selector's gate: in a distributed job, a problem met in a call waits for agree()."""
    if not active():
        return False
    with _process.lock:
        _process.pending.setdefault(Item.of(problem, target), target)
    return True


def install() -> None:
    """Let the Selector defer tuning on a call to the next :func:`agree` (inert unless
    :func:`active`). ``unimatmul.torch.enable()`` calls it."""
    set_tuning_gate(_defer, collective=active)


def uninstall() -> None:
    set_tuning_gate(None)


def pending() -> list[Item]:
    """Problems deferred on this rank since the last :func:`agree`."""
    with _process.lock:
        return sorted(_process.pending)


def _take_pending() -> dict[Item, Target]:
    with _process.lock:
        taken = dict(_process.pending)
        _process.pending.clear()
    return taken


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def agreed_times(records: Sequence[TuningRecord | None]) -> dict[str, float]:
    """Each candidate measured ``ok`` on every rank that measured -> median of their medians."""
    measured = [r for r in records if r is not None]
    if not measured:
        return {}
    times: dict[str, float] = {}
    for result in measured[0].results:
        found = []
        for record in measured:
            mine = record.result(result.identity)
            if mine is None or mine.status != OK or not mine.median_s or not math.isfinite(mine.median_s):
                break
            found.append(mine.median_s)
        else:
            times[result.identity] = _median(found)
    return times


def _bucket_ratios(records: Sequence[TuningRecord]) -> dict[str, list[float]] | None:
    """Bucket records: each candidate's time / Default's at every point, median over ranks."""
    per_rank: list[dict[str, list[float]]] = []
    for record in records:
        info = record.settings.get("bucket")
        ratios = info.get("ratios") if isinstance(info, dict) else None
        if not isinstance(ratios, dict):
            return None
        per_rank.append({k: [float(x) for x in str(v).split(",") if x] for k, v in ratios.items()})
    agreed: dict[str, list[float]] = {}
    for identity, first in per_rank[0].items():
        lists = [r.get(identity) for r in per_rank]
        if all(found is not None and len(found) == len(first) for found in lists):
            agreed[identity] = [_median([found[i] for found in lists if found]) for i in range(len(first))]
    return agreed


def agreed_winner(records: Sequence[TuningRecord | None], min_gain: float) -> str:
    """The candidate every rank runs, from every rank's record of one problem (None: that
    rank's tuning failed).

    Only a candidate that passed the numeric check and was measured on every rank may
    win; its time is the median over the ranks of their medians (robust to one noisy
    rank; on devices of one kind the ranks measure the same kernel). The fastest wins if
    it beats Default by ``min_gain``, as in the harness. A bucket applies the bucket rule
    (:func:`unimatmul.tuning.buckets.choose`) to the ranks' median ratios at every point.
    """
    measured = [r for r in records if r is not None]
    if not measured:
        return DEFAULT.identity
    if any("bucket" in r.settings for r in measured):
        ratios = _bucket_ratios(measured)
        if ratios is not None:
            return choose(ratios, min_gain)
    times = agreed_times(measured)
    if not times:
        return DEFAULT.identity
    best = min(times, key=lambda identity: (times[identity], identity))
    default = times.get(DEFAULT.identity)
    if best != DEFAULT.identity and default is not None and times[best] > default * (1.0 - min_gain):
        return DEFAULT.identity
    return best


def adopt(record: TuningRecord, winner: str, *, ranks: int, agreed: dict[str, float]) -> TuningRecord:
    """This rank's record with the agreed winner (its own times kept; what it would have
    chosen alone is noted under ``settings["agreed"]``)."""
    mine = record.result(winner)
    winner_s = mine.median_s if mine is not None and mine.median_s else None
    if winner_s is None:
        winner_s = agreed.get(winner) or record.default_s or math.inf
    note: dict[str, Any] = {"ranks": ranks, "rule": "median-of-rank-medians", "alone": record.winner}
    if winner in agreed:
        note["winner_s"] = agreed[winner]
    if DEFAULT.identity in agreed:
        note["default_s"] = agreed[DEFAULT.identity]
    return replace(record, winner=winner, winner_s=winner_s, settings={**record.settings, "agreed": note})


@dataclass
class Choice:
    """One problem's agreed choice on this rank."""

    item: Item
    winner: str
    record: TuningRecord | None  # this rank's stored record (None: this rank has none)
    source: str  # "cache" (every rank already held it) or "agreed" (measured now)


@dataclass
class Agreement:
    """What :func:`agree` settled: the same winners on every rank."""

    ranks: int
    choices: list[Choice] = field(default_factory=list)

    def winners(self) -> dict[Item, str]:
        return {c.item: c.winner for c in self.choices}

    def record_for(
        self, problem: Problem, target: Target, buckets: Buckets | None = None
    ) -> TuningRecord | None:
        wanted = Item.of(problem, target, buckets)
        return next((c.record for c in self.choices if c.item == wanted), None)


def agree(
    selector: Selector | None = None,
    *,
    problems: Iterable[tuple[Problem, Target]] = (),
    buckets: Buckets | None = None,
    force: bool = False,
    group: Any = None,
    progress: bool | None = None,
) -> Agreement:
    """Settle, together with every rank of ``group`` (default: the world), the choice of
    each problem in ``problems`` and of each problem deferred since the last call.

    Collective when :func:`active`: every rank must call it, the same number of times,
    in the same order (like ``dist.barrier()``). Otherwise it tunes locally what is not
    stored yet. Every rank then stores and runs the same winner for each problem.
    """
    selector = selector if selector is not None else get_selector()
    install()
    mine: dict[Item, Target] = {}
    for problem, target in problems:
        mine.setdefault(Item.of(problem, target, buckets), target)
    for item, target in _take_pending().items():
        mine.setdefault(item, target)
    found = current_group(group) if active(group) else None
    if found is None:
        return _agree_alone(selector, mine, force)
    return _agree_together(selector, found, mine, force, progress)


def _agree_alone(selector: Selector, mine: dict[Item, Target], force: bool) -> Agreement:
    agreement = Agreement(1)
    devices = {target.device.kind: target.device for target in mine.values()}
    for item in sorted(mine):
        record, source = item.job(devices).run(selector, force=force)
        agreement.choices.append(
            Choice(item, record.winner, record, "cache" if source == "cache" else "agreed")
        )
    forget_prepared()
    return agreement


def _stored_winner(job: TuneJob, selector: Selector) -> tuple[str | None, TuningRecord | None]:
    try:
        record = job.stored(selector)
    except Exception:
        return None, None
    return (record.winner if record is not None else None), record


def _agree_together(
    selector: Selector, group: Group, mine: dict[Item, Target], force: bool, progress: bool | None
) -> Agreement:
    _process.calls += 1
    hello = group.all_gather({"call": _process.calls, "items": [astuple(item) for item in sorted(mine)]})
    calls = [h["call"] for h in hello]
    if len(set(calls)) > 1:
        msg = (
            f"the ranks called agree()/warmup() different numbers of times ({calls}, by rank): "
            "every rank must make the same collective calls in the same order"
        )
        raise DistributedError(msg)
    union = sorted({Item(*fields) for h in hello for fields in h["items"]})
    devices = {target.device.kind: target.device for target in mine.values()}
    jobs: list[TuneJob | None] = []
    stored: list[tuple[str | None, TuningRecord | None]] = []
    for item in union:
        try:
            job = item.job(devices)
        except Exception:  # this rank cannot build it (no torch GPU here): it measures nothing
            jobs.append(None)
            stored.append((None, None))
            continue
        jobs.append(job)
        stored.append((None, None) if force else _stored_winner(job, selector))
    every = group.all_gather([winner for winner, _ in stored])
    # Measured again: what some rank lacks, or what the ranks' caches answer differently.
    todo = [i for i in range(len(union)) if force or len({w[i] for w in every}) > 1 or every[0][i] is None]
    agreement = Agreement(group.size)
    skipped = set(range(len(union))) - set(todo)
    for i, item in enumerate(union):
        if i in skipped:
            agreement.choices.append(Choice(item, stored[i][0] or DEFAULT.identity, stored[i][1], "cache"))
    if not todo:
        forget_prepared()
        return agreement
    records = _measure(selector, group, [(i, jobs[i]) for i in todo], progress)
    gathered = group.all_gather({i: (r.to_dict() if r is not None else None) for i, r in records.items()})
    decisions = group.broadcast(_decide(gathered, todo, union, jobs, selector) if group.rank == 0 else None)
    if "error" in decisions:
        msg = f"rank 0 could not decide: {decisions['error']}"
        raise DistributedError(msg)
    items: list[tuple[str, TuningRecord]] = []
    platforms: dict[str, dict[str, Any]] = {}
    for i in todo:
        winner, agreed = decisions[i]
        base = records.get(i) or _first_record(gathered, i)
        record = adopt(base, winner, ranks=group.size, agreed=agreed) if base is not None else None
        agreement.choices.append(Choice(union[i], winner, record, "agreed"))
        on = jobs[i]
        if record is not None and on is not None:
            platform = selector.platform(on.target)
            platforms[platform.namespace] = platform.to_dict()
            items.append((platform.namespace, record))
    write_records(selector.store, items, platforms)
    agreement.choices.sort(key=lambda c: c.item)
    forget_prepared()
    return agreement


def _measure(
    selector: Selector, group: Group, jobs: list[tuple[int, TuneJob | None]], progress: bool | None
) -> dict[int, TuningRecord | None]:
    """This rank's record of every job (None where it failed: that is data too)."""
    from tqdm import tqdm

    show = False if group.rank != 0 else progress
    bar = tqdm(
        jobs,
        desc="unimatmul agree",
        unit="problem",
        file=sys.stderr,
        disable=None if show is None else not show,
    )
    out: dict[int, TuningRecord | None] = {}
    for i, job in bar:
        out[i] = None
        if job is None:
            continue
        bar.set_postfix_str(job.label)
        with contextlib.suppress(Exception):
            out[i] = job.tune(selector, store=False)
    bar.close()
    return out


def _first_record(gathered: list[dict[int, Any]], i: int) -> TuningRecord | None:
    """A rank that could not measure a problem keeps the first measuring rank's record."""
    for ranks in gathered:
        if ranks.get(i) is not None:
            return TuningRecord.from_dict(ranks[i])
    return None


def _decide(
    gathered: list[dict[int, Any]],
    todo: list[int],
    union: list[Item],
    jobs: list[TuneJob | None],
    selector: Selector,
) -> dict[Any, Any]:
    """Rank 0: the agreed winner of every measured problem, with the agreed times."""
    decisions: dict[Any, Any] = {}
    for i in todo:
        try:
            records = [TuningRecord.from_dict(r[i]) if r.get(i) is not None else None for r in gathered]
            job = jobs[i]
            min_gain = selector.tuner.settings_for(job.target).min_gain if job is not None else 0.01
            decisions[i] = (agreed_winner(records, min_gain), agreed_times(records))
        except Exception as exc:  # sent to every rank, which all raise alike
            return {"error": f"{union[i].key}: {type(exc).__name__}: {exc}"}
    return decisions
