"""``warmup(model, example_inputs)``: tune every problem a model meets before serving."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from unimatmul.cache.record import TuningRecord
from unimatmul.core import modes as config
from unimatmul.core._backend import Target
from unimatmul.core.problem import Problem
from unimatmul.torch import enabled, routing
from unimatmul.tuning import agreement
from unimatmul.tuning.buckets import Buckets
from unimatmul.tuning.selector import get_selector


@dataclass
class WarmupResult:
    """The distinct problems a warm-up met, and the record each one now has."""

    problems: list[tuple[Problem, Target]] = field(default_factory=list)
    records: list[TuningRecord] = field(default_factory=list)

    @property
    def speedups(self) -> list[float]:
        return [r.speedup for r in self.records]


@contextlib.contextmanager
def collecting() -> Iterator[list[tuple[Problem, Target]]]:
    """Collect every (problem, target) the routed kernels resolve inside the block."""
    found: list[tuple[Problem, Target]] = []
    previous = routing.TABLE.collector
    routing.clear_plans()  # known keys would not be resolved again, hence not collected
    routing.TABLE.collector = found
    try:
        yield found
    finally:
        routing.TABLE.collector = previous


def warmup(
    model: Callable[..., Any],
    example_inputs: Sequence[Any] | Any,
    *,
    backward: bool = False,
    buckets: bool | str = False,
    force: bool = False,
    progress: bool | None = None,
) -> WarmupResult:
    """Run ``model(*example_inputs)`` once, then tune each distinct problem it met.

    Serving then starts with every problem tuned (mode ``cached``). ``backward``
    also runs a backward pass (a loss of random weights; the parameters' gradients
    are put back as they were) so that training products are tuned too. ``buckets`` tunes the bucket of each problem's m instead of that m
    alone (``True`` for the Selector's buckets, or a spec such as ``"pow2"``), so that
    other batch sizes near it are served as well. Problems already tuned are kept
    unless ``force``. Routing is on during the call and as it was afterwards.

    With ``UNIMATMUL_DISTRIBUTED=1`` in a process group, warm-up is collective: every
    rank calls it, and the ranks agree on one choice per problem (see
    :mod:`unimatmul.tuning.agreement`).
    """
    inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    with enabled(), collecting() as met, config.mode("cached"):
        if backward:
            # The parameters' gradients are put back as they were: a warm-up trains nothing.
            params = list(model.parameters()) if isinstance(model, torch.nn.Module) else []
            saved = [p.grad for p in params]
            output = model(*inputs)
            tensors = [t for t in _tensors(output) if t.requires_grad]
            if tensors:
                loss = sum((t * torch.randn_like(t)).sum() for t in tensors)
                loss.backward()  # type: ignore[union-attr]
            for param, grad in zip(params, saved, strict=True):
                param.grad = grad
        else:
            with torch.no_grad():
                model(*inputs)
    unique: dict[tuple[str, Target], tuple[Problem, Target]] = {}
    for problem, target in met:
        unique.setdefault((problem.key, target), (problem, target))
    result = WarmupResult(list(unique.values()))
    selector = get_selector()
    spec: Buckets | None = None
    if buckets:
        spec = selector.buckets if buckets is True else Buckets.parse(str(buckets))
    if agreement.active():
        agreed = agreement.agree(
            selector, problems=result.problems, buckets=spec, force=force, progress=progress
        )
        found = (agreed.record_for(problem, target, spec) for problem, target in result.problems)
        result.records = [record for record in found if record is not None]
        routing.clear_plans()
        return result
    from tqdm import tqdm

    bar = tqdm(
        result.problems,
        desc="unimatmul warmup",
        unit="problem",
        file=sys.stderr,
        disable=None if progress is None else not progress,
    )
    for problem, target in bar:
        bar.set_postfix_str(f"{problem.shape_text} {problem.dtype_a}")
        if spec is not None and spec.representative(problem.m) is not None:
            record = selector.tune_bucket(problem, target, spec, force=force)
        else:
            record = selector.tune(problem, target, force=force)
        result.records.append(record)
    bar.close()
    routing.clear_plans()
    return result


def _tensors(output: Any) -> Iterator[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, dict):
        for value in output.values():
            yield from _tensors(value)
    elif isinstance(output, (list, tuple)):
        for value in output:
            yield from _tensors(value)
