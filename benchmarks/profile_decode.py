"""Where a routed eager decode step spends its time: torch.profiler, routing off vs on.

For one model and batch of ``torch_models.py`` (default: Llama-sized, decode, batch 1),
every product is tuned by ``unimatmul.torch.warmup``; then a few decode steps are
profiled with routing off and on, and each matrix product (op name and input shapes)
gets its CPU time (host, inclusive) and device time per call in both. Writes a JSON
file and prints a table::

    python benchmarks/profile_decode.py --out profile.json
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torch_models import FULL, Stack, mode, sync

OPS = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::linear",
    "aten::matmul",
    "aten::_grouped_mm",
)


def profile(run: Any, name: str, steps: int) -> dict[str, dict[str, float]]:
    """Profile ``steps`` calls of ``run`` on the GPU in ``torch_models.mode(name)``."""
    return profile_products(run, lambda: mode(name), steps, torch.device("cuda"))


def profile_products(
    run: Any,
    context: Callable[[], Any],
    steps: int,
    device: torch.device,
    warm: int = 3,
    ops: tuple[str, ...] = OPS,
) -> dict[str, dict[str, float]]:
    """Host and device time of each matrix product of ``run()`` (op and input shapes).

    ``run`` is called ``warm`` times, then ``steps`` times under torch.profiler, all
    inside ``context()`` (a routing state, say); ``ops`` are the op names kept. Per key (``"aten::mm [[m, k], [k, n]]"``,
    and the ``unimatmul::`` ranges of routed calls): calls, ``cpu_us`` (host time,
    inclusive of what the op calls), ``device_us`` (its kernels' time on a GPU; 0 on a
    CPU, where the host time is the op's time), both summed over the steps, and
    ``cpu_us_per_call``. Two more keys: the self host time of all ops, and the device
    time of all kernels, per step.
    """
    cuda = device.type == "cuda"
    with torch.no_grad(), context():
        for _ in range(warm):
            run()
        sync(device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            activities = [torch.profiler.ProfilerActivity.CPU]
            if cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
                for _ in range(steps):
                    run()
                sync(device)
    out: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0, "cpu_us": 0.0, "device_us": 0.0})
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key in ops or e.key.startswith("unimatmul::"):
            row = out[f"{e.key} {e.input_shapes}"]
            row["calls"] += e.count
            row["cpu_us"] += e.cpu_time_total
            row["device_us"] += _device_us(e)
    total = prof.key_averages()
    step_cpu = sum(e.self_cpu_time_total for e in total)
    out["(all ops, self CPU per step)"] = {"calls": steps, "cpu_us": step_cpu, "device_us": 0.0}
    if cuda:
        # Kernels are events of their own (device type CUDA): their sum is the GPU's busy time.
        kernels = [e for e in total if e.device_type == torch.autograd.DeviceType.CUDA]
        step_device = sum(_device_us(e) for e in kernels)
        out["(all kernels, device per step)"] = {"calls": steps, "cpu_us": 0.0, "device_us": step_device}
    return {k: {**v, "cpu_us_per_call": v["cpu_us"] / max(v["calls"], 1)} for k, v in out.items()}


def _device_us(event: Any) -> float:
    # torch >= 2.4 names it device_time_total; older versions cuda_time_total.
    return float(getattr(event, "device_time_total", getattr(event, "cuda_time_total", 0.0)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    import unimatmul.torch as ut

    device, dtype = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    model = Stack(FULL[args.model]).to(device=device, dtype=dtype).eval()
    model.set_cache(args.batch, args.context, device, dtype)
    x = torch.randn(args.batch, 1, FULL[args.model].dim, device=device, dtype=dtype)

    def run() -> torch.Tensor:
        return model(x, True)

    with torch.no_grad():
        tuned = ut.warmup(lambda: run(), (), progress=False, force=False)
    result = {
        "model": args.model,
        "batch": args.batch,
        "steps": args.steps,
        "tuned": [
            {"problem": r.problem, "winner": r.winner, "speedup": round(s, 4)}
            for r, s in zip(tuned.records, tuned.speedups, strict=False)
        ],
        "off": profile(run, "off", args.steps),
        "routed": profile(run, "routed", args.steps),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    keys = sorted(set(result["off"]) | set(result["routed"]))
    print(f"{'op and shapes':90} | off cpu/call | routed cpu/call | off dev | routed dev | calls")
    for k in keys:
        o, r = result["off"].get(k, {}), result["routed"].get(k, {})
        print(
            f"{k[:90]:90} | {o.get('cpu_us_per_call', 0):8.1f} | {r.get('cpu_us_per_call', 0):8.1f} | "
            f"{o.get('device_us', 0):8.0f} | {r.get('device_us', 0):8.0f} | {o.get('calls', 0)}/{r.get('calls', 0)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
