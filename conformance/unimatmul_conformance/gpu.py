"""GPU checks (torch arrays on CUDA or ROCm): graph capture and the caller's stream.

- ``graph``: a runner call is captured in a CUDA/HIP graph on a side stream; the graph
  is replayed after new inputs are copied into the captured buffers, and the output
  must be the new product. A runner that synchronises, allocates with the driver or
  launches on another stream breaks the capture or leaves a stale output.
- ``stream``: on a fresh (non-blocking) stream the suite queues a long device sleep,
  then poisons the output, then calls the runner. A runner that launches on any other
  stream runs during the sleep and the poison lands after it, so the output is found
  poisoned; one on the caller's stream runs after the poison and overwrites it.
"""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from unimatmul_conformance.checks import Outcome, _exc, close_runner
from unimatmul_conformance.guards import POISON, guarded_output, host64, host_bits
from unimatmul_conformance.numerics import compare, make_case_data
from unimatmul_conformance.report import FAILED, PASSED

if TYPE_CHECKING:
    from unimatmul.backend import Candidate
    from unimatmul_conformance.context import SuiteContext
    from unimatmul_conformance.matrix import Case

_SLEEP_S = 0.05


def _sleep_cycles(torch: Any, device: Any, seconds: float) -> int:
    """Clock cycles ``torch.cuda._sleep`` needs to keep the device busy for ``seconds``."""
    probe = 1_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(probe)  # the first launch pays for module loading
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    per_cycle_s = max(start.elapsed_time(end) / 1e3 / probe, 1e-12)
    return int(seconds / per_cycle_s)


def _verdict(out: Any, data: Any, adapter: Any, dtype: str, where: str) -> Outcome | None:
    got = host64(adapter, out.view)
    poisoned = host_bits(adapter, out.view, dtype) == POISON[dtype]
    if poisoned.any():
        return FAILED, f"{int(poisoned.sum())} of {poisoned.size} output elements still poisoned {where}"
    cmp = compare(got, data, np.ones(got.shape, dtype=bool))
    if not cmp.ok(data.tolerance):
        return FAILED, f"wrong output {where}: relative error {cmp.rel_error:.3g}, {cmp.worst}"
    return None


def check_graph(suite: SuiteContext, case: Case, candidate: Candidate) -> Outcome:
    target = suite.targets[case.kind]
    adapter, device = target.adapter, target.device
    torch = adapter.torch  # type: ignore[attr-defined]
    problem = case.problem
    try:
        runner = suite.backend.prepare(problem, candidate, target)
    except Exception as exc:
        return FAILED, f"prepare() raised {_exc(exc)}"
    try:
        first = make_case_data(problem, case.alpha, case.beta, adapter, device, suite.seed + 7)
        second = make_case_data(problem, case.alpha, case.beta, adapter, device, suite.seed + 8)
        out = guarded_output(problem, adapter, device)
        with torch.cuda.device(device.index):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the capture, as torch advises
                out.arm(first.c if case.beta else None)
                first.run(runner, out.view, case.alpha, case.beta)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    with torch.cuda.graph(graph):
                        first.run(runner, out.view, case.alpha, case.beta)
            except Exception as exc:
                return FAILED, f"capturing a call in a graph failed: {_exc(exc)}"
            # torch warns when nothing was captured: the work went to another stream.
            empty = any("empty" in str(w.message).lower() for w in caught)
            # New values into the captured buffers: a replay must use them.
            for dst, src in (
                (first.a, second.a),
                (first.b, second.b),
                (first.bias, second.bias),
                (first.scale_a, second.scale_a),
                (first.scale_b, second.scale_b),
            ):
                if dst is not None:
                    dst.copy_(src)
            out.arm(second.c if case.beta else None)
            graph.replay()
            torch.cuda.synchronize()
        failure = _verdict(out, second, adapter, problem.dtype_c, "after a graph replay with new inputs")
        if failure is not None:
            note = " (the graph captured no work: the runner launched on another stream)" if empty else ""
            return FAILED, failure[1] + note
        damage = out.damaged()
        if damage:
            return FAILED, f"the replay wrote outside the output: {'; '.join(damage)}"
    finally:
        close_runner(runner)
    return PASSED, "captured in a graph; the replay computed the new product"


def check_stream(suite: SuiteContext, case: Case, candidate: Candidate) -> Outcome:
    target = suite.targets[case.kind]
    adapter, device = target.adapter, target.device
    torch = adapter.torch  # type: ignore[attr-defined]
    problem = case.problem
    try:
        runner = suite.backend.prepare(problem, candidate, target)
    except Exception as exc:
        return FAILED, f"prepare() raised {_exc(exc)}"
    try:
        data = make_case_data(problem, case.alpha, case.beta, adapter, device, suite.seed + 9)
        out = guarded_output(problem, adapter, device)
        with torch.cuda.device(device.index):
            out.arm(data.c if case.beta else None)
            data.run(runner, out.view, case.alpha, case.beta)  # first call: lazy set-up
            torch.cuda.synchronize()
            cycles = _sleep_cycles(torch, device, _SLEEP_S)
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                if adapter.stream(device) != stream.cuda_stream:
                    return FAILED, "the adapter does not report torch's current stream"
                torch.cuda._sleep(cycles)
                out.arm(data.c if case.beta else None)
                started = time.perf_counter()
                data.run(runner, out.view, case.alpha, case.beta)
                call_s = time.perf_counter() - started
            stream.synchronize()
            torch.cuda.synchronize()
        failure = _verdict(out, data, adapter, problem.dtype_c, "after a call on a side stream")
        if failure is not None:
            return FAILED, f"{failure[1]}: the runner did not run (only) on the caller's stream"
    finally:
        close_runner(runner)
    if call_s > 0.8 * _SLEEP_S:
        return FAILED, (
            f"ran on the caller's stream, but the call blocked the host for {call_s * 1e3:.0f} ms "
            f"while the stream was busy: it synchronises"
        )
    return PASSED, f"ran on the caller's stream, returned to the host in {call_s * 1e6:.0f} us"
