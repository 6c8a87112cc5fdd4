"""Scenarios a harness must get right, through the API every version of the harness has.

    python benchmarks/harness_scenarios.py            # this checkout
    PYTHONPATH=OLD_CHECKOUT python benchmarks/harness_scenarios.py   # an older harness

Prints, as JSON, what the harness does with: a kernel right but for one element off by
+1.0 at 1024^3, one right on its first call only and one that returns its first result
on every later call, one that raises SystemExit, and a Default measured during a busy
moment, 24x its real time (with a scripted timer so that the busy moment is exact). Uses only ``Harness``,
``HarnessConfig`` fields and records that older versions have too.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from unimatmul.backend import DEFAULT, Candidate, Target
from unimatmul.core.arrays import CPU, adapter_for_kind
from unimatmul.core.problem import Problem
from unimatmul.core.runners import DefaultRunner
from unimatmul.testing import ScriptedTimer
from unimatmul.tuning.harness import CpuTimer, Harness, HarnessConfig

NUMPY = Target(adapter_for_kind("numpy"), CPU)
FAST = HarnessConfig(warmup=1, min_samples=3, max_samples=10, budget_s=0.05, settle_s=0.0, max_sets=2)


class Kernel:
    """numpy's product, spoiled as ``how`` says."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.calls = 0
        self.first: Any = None
        self.candidate = Candidate.make("fake", how)

    def __call__(
        self, a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None
    ) -> None:
        self.calls += 1
        if self.how == "first-call-only" and self.calls > 1:
            return
        if self.how == "stale" and self.first is not None:
            out[...] = self.first
            return
        if self.how == "exit":
            raise SystemExit(3)
        np.matmul(a, b, out=out)
        if self.how == "one-off":
            out[0, 0] += 1.0
        if self.how == "stale":
            self.first = out.copy()


def run(shape: tuple[int, int, int], how: str) -> dict[str, Any]:
    kernel = Kernel(how)
    entries = [(DEFAULT, lambda: DefaultRunner(NUMPY.adapter)), (kernel.candidate, lambda: kernel)]
    try:
        record = Harness(CpuTimer(), FAST).measure(Problem.from_shape(*shape), NUMPY, entries)
    except SystemExit as exc:
        return {"outcome": f"SystemExit({exc.code}) escaped the harness: the program would end"}
    result = record.result(kernel.candidate.identity)
    assert result is not None
    return {
        "status": result.status,
        "chosen": record.winner == kernel.candidate.identity,
        "rel_error": result.error,
        "note": result.note[:160],
    }


def busy_default() -> dict[str, Any]:
    settings = HarnessConfig(warmup=1, min_samples=3, max_samples=6, budget_s=10.0, settle_s=0.0, max_sets=1)
    fast = Candidate.make("t", "fast")
    timer = ScriptedTimer([lambda i: 24e-3 if i < 7 else 1e-3, lambda i: 1e-3])
    entries = [(DEFAULT, lambda: DefaultRunner(NUMPY.adapter)), (fast, lambda: DefaultRunner(NUMPY.adapter))]
    record = Harness(timer, settings).measure(Problem.from_shape(97, 509, 31), NUMPY, entries)
    return {
        "winner": record.winner,
        "stored_speedup": round(record.speedup, 2),
        "default_s": record.default_s,
        "confidence": record.settings.get("confidence"),
        "confirm": record.settings.get("confirm"),
    }


def main() -> None:
    print(
        json.dumps(
            {
                "one element off by +1.0 at 1024^3": run((1024, 1024, 1024), "one-off"),
                "right on its first call only": run((256, 256, 256), "first-call-only"),
                "its first result on every call": run((256, 256, 256), "stale"),
                "SystemExit in a kernel": run((64, 64, 64), "exit"),
                "Default measured during a busy moment (24 ms for 1 ms)": busy_default(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
