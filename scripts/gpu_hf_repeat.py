"""Repeated compiled ``generate`` calls of one Hugging Face row, each output checked (issue #13).

Session 7 on the H200: the compiled ``generate`` rows at batch 16 of
``benchmarks/hf_models.py`` stopped early in their timed rounds ("generate returned shape
(16, 132), not (16, 192)"; Qwen2- and Llama-shaped) or hit a device-side assert (GPT-2's
position embedding indexed out of range), after the first calls of both states had been
right. This script runs that row's calls in one state only, or alternating as the
benchmark does, in a process of its own, and prints one JSON line a call: the shape, or
the error, and how many tokens differ from the state's first call (greedy decoding: the
same kernels give the same tokens, up to the order of split-K's atomic sums).

    python scripts/gpu_hf_repeat.py --model qwen2-1.5b --batch 16 --state off --calls 30
    python scripts/gpu_hf_repeat.py --model qwen2-1.5b --batch 16 --state alternate

Exit status: 0 when every call returned the right shape, 1 when some did not, 3 after a
device-side error (the CUDA context is lost: the rest of the calls cannot run).

Session 8 found the cause of those failures in unimatmul: routing freed the runners of
plans retired twice (the benchmark switches routing off and on between rounds) while the
CUDA graph recorded with them still wrote their workspaces and padded copies at every
replay. Kernels a graph captured are now kept for the process's life, and the rows run
through (``benchmarks/results/hf-h200/run9-s8/``). This script stays as the diagnostic of
that configuration's repeatability.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import torch
from hf_models import GPU_MODELS, Models, Row, make_calls, parse_args, tune_routed
from torch_models import mode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2-1.5b", choices=[s.name for s in GPU_MODELS if s.causal])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--state", choices=("off", "routed", "alternate"), default="alternate")
    p.add_argument("--calls", type=int, default=30, help="calls per state")
    p.add_argument("--no-gc", action="store_true", help="garbage collection off around each call")
    ns = p.parse_args(argv)
    args = parse_args(["--gpu"])
    device, dtype = torch.device("cuda"), torch.bfloat16
    spec = next(s for s in GPU_MODELS if s.name == ns.model)
    row = Row(spec, "generate", ns.batch, "compiled")
    models = Models(device, dtype)
    states: dict[str, Any] = {}
    import unimatmul.torch as ut

    with torch.no_grad():
        if ns.state in ("off", "alternate"):
            states["off"], _ = make_calls(row, models.get(spec), args, device, routed=False)
        if ns.state in ("routed", "alternate"):
            twin = models.twin(spec)
            states["routed"], _ = make_calls(row, twin, args, device, routed=True)
            tune_routed(row, twin, states["routed"], args, device)  # as the benchmark does
            ut.clear_plans()
        first: dict[str, torch.Tensor] = {}
        bad = 0
        for i in range(ns.calls):
            for state, calls in states.items():
                line: dict[str, Any] = {"call": i, "state": state}
                if ns.no_gc:
                    gc.collect()
                    gc.disable()
                t0 = time.perf_counter()
                try:
                    with mode(state):
                        tokens = calls.run()
                    torch.cuda.synchronize()
                    line["s"] = round(time.perf_counter() - t0, 4)
                    if state not in first:
                        first[state] = tokens.clone()
                    line["differ"] = int((tokens != first[state]).sum())
                except RuntimeError as exc:
                    line["error"] = str(exc)[:300]
                    bad += 1
                    if "CUDA" in str(exc) or isinstance(exc, torch.AcceleratorError):
                        print(json.dumps(line), flush=True)
                        return 3
                finally:
                    gc.enable()
                print(json.dumps(line), flush=True)
        if "off" in first and "routed" in first:
            print(json.dumps({"off_vs_routed_same": float((first["off"] == first["routed"]).float().mean())}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
