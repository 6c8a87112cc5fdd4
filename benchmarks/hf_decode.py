"""Hugging Face MoE generate on a GPU: transformers' decode switch against routed grouped decode.

transformers 5 switches a model's ``grouped_mm`` experts to ``batched_mm`` (gathered weights
and ``torch.bmm``) for generate's decode steps on a GPU; with ``UNIMATMUL_HF_DECODE=grouped``,
while routing is on, unimatmul leaves that switch out (``unimatmul/torch/hf_decode.py``; the
default, ``auto``, does so only where generate() compiles its decode step, and these calls are
eager). Four states of one model, timed in turns:

- ``off``: routing off, transformers as it is (decode on ``batched_mm``): what a user runs;
- ``off, grouped decode``: routing off, the switch left out by hand (torch's grouped kernel in
  decode): what the switch costs or saves by itself;
- ``routed, batched decode``: routing on with ``UNIMATMUL_HF_DECODE=transformers`` (as ``auto`` in eager decode);
- ``routed``: routing on with ``UNIMATMUL_HF_DECODE=grouped`` (decode on the routed grouped door).

Each routed state tunes what it meets in two generate calls (``unimatmul.mode("tune")``),
then runs in the default mode (``cached``). A round runs every state once, the order
reversed every other round; a state's figure is tokens/s of its median round, and each
ratio to ``off`` the median of the rounds' own ratios with a 95 % interval of that median.
Greedy decoding; the tokens of each state are compared with ``off``'s.

    python benchmarks/hf_decode.py --out DIR [--model qwen3-30b-a3b] [--batches 1,16]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_models import GPU_MODELS, build_model, ratio_interval

STATES = ("off", "off, grouped decode", "routed, batched decode", "routed")


def _set_state(model: Any, state: str) -> None:
    """The decode path of ``state``: the setting, and the switch left out by hand for
    ``off, grouped decode``."""
    model.__dict__.pop("_optimize_model_for_decode", None)
    os.environ["UNIMATMUL_HF_DECODE"] = "transformers" if state == "routed, batched decode" else "grouped"
    if state == "off, grouped decode":
        model._optimize_model_for_decode = contextlib.nullcontext  # the switch left out by hand


def _call(model: Any, prompt: torch.Tensor, new: int) -> torch.Tensor:
    return model.generate(
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
    )


def _generate(model: Any, prompt: torch.Tensor, new: int, state: str) -> tuple[float, torch.Tensor]:
    import unimatmul

    _set_state(model, state)
    with unimatmul.mode("off" if state.startswith("off") else "cached"):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = _call(model, prompt, new)
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def _tune(model: Any, prompt: torch.Tensor, new: int, state: str) -> None:
    import unimatmul

    _set_state(model, state)
    with unimatmul.mode("tune"):
        for _ in range(2):
            _call(model, prompt, new)
    torch.cuda.synchronize()


def _kernel_time(model: Any, prompt: torch.Tensor, new: int, state: str) -> dict[str, Any]:
    """GPU time of one generate by kernel (the profiler's), the eight largest."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _generate(model, prompt, new, state)
    events = prof.key_averages()
    total = sum(e.device_time_total for e in events)
    top = sorted(events, key=lambda e: -e.device_time_total)[:8]
    return {
        "gpu_ms": total / 1e3,
        "top": [{"kernel": e.key[:120], "ms": e.device_time_total / 1e3, "count": e.count} for e in top],
    }


def run_batch(model: Any, vocab: int, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(batch)
    prompt = torch.randint(0, vocab, (batch, args.prompt), generator=gen).cuda()
    outs: dict[str, torch.Tensor] = {}
    for state in STATES:
        if state.startswith("routed"):
            _tune(model, prompt, args.new_tokens, state)
        _, outs[state] = _generate(model, prompt, args.new_tokens, state)
    times: dict[str, list[float]] = {s: [] for s in STATES}
    for r in range(args.rounds):
        for state in STATES if r % 2 == 0 else STATES[::-1]:
            times[state].append(_generate(model, prompt, args.new_tokens, state)[0])
    ref = outs["off"][:, args.prompt :]
    row: dict[str, Any] = {"batch": batch, "tokens_per_call": batch * args.new_tokens, "states": {}}
    for state in STATES:
        ratios = [o / t for o, t in zip(times["off"], times[state], strict=True)]
        row["states"][state] = {
            "tok_s": batch * args.new_tokens / statistics.median(times[state]),
            "vs_off": statistics.median(ratios),
            "interval": ratio_interval(ratios),
            "round_ratios": [min(ratios), max(ratios)],
            "same_tokens": float((outs[state][:, args.prompt :] == ref).float().mean()),
            "seconds": times[state],
        }
    if args.profile:
        row["kernels"] = {s: _kernel_time(model, prompt, args.new_tokens, s) for s in STATES}
    return row


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"{data['model']} ({data['about']}), {data['device']}, torch {data['torch']}, "
        f"transformers {data['transformers']}; prompt {data['prompt']}, {data['new_tokens']} new tokens, "
        f"{data['rounds']} rounds",
        "",
        "| batch | state | tok/s | vs off (median of round ratios) | 95% interval | round ratios | same tokens as off | GPU ms a generate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        for state, s in row["states"].items():
            interval = "-" if s["interval"] is None else f"{s['interval'][0]:.3f}-{s['interval'][1]:.3f}"
            gpu = row.get("kernels", {}).get(state, {}).get("gpu_ms")
            lines.append(
                f"| {row['batch']} | {state} | {s['tok_s']:,.0f} | **{s['vs_off']:.3f}x** | {interval} | "
                f"{s['round_ratios'][0]:.3f}-{s['round_ratios'][1]:.3f} | {s['same_tokens']:.0%} | "
                f"{'-' if gpu is None else f'{gpu:.1f}'} |"
            )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--model", default="qwen3-30b-a3b", choices=[s.name for s in GPU_MODELS if "experts" in s.about]
    )
    p.add_argument("--batches", type=lambda t: [int(x) for x in t.split(",")], default=[1, 16])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument(
        "--no-profile", dest="profile", action="store_false", help="leave out the GPU time by kernel"
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "hf_decode.py: needs a CUDA GPU (transformers switches decode only off the CPU)", file=sys.stderr
        )
        return 2
    import transformers

    import unimatmul.torch

    args.out.mkdir(parents=True, exist_ok=True)
    spec = next(s for s in GPU_MODELS if s.name == args.model)
    model = build_model(spec, torch.device("cuda"), torch.bfloat16)
    unimatmul.torch.enable()
    data: dict[str, Any] = {
        "model": spec.name,
        "about": spec.about,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "prompt": args.prompt,
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        "rows": [],
    }
    for batch in args.batches:
        data["rows"].append(run_batch(model, spec.config["vocab_size"], batch, args))
        (args.out / "hf-decode.json").write_text(json.dumps(data, indent=1))
    text = markdown(data)
    (args.out / "hf-decode.md").write_text(text)
    print(text)
    for row in data["rows"]:
        for state, kernels in row.get("kernels", {}).items():
            print(f"b{row['batch']} {state}: GPU {kernels['gpu_ms']:.1f} ms")
            for k in kernels["top"][:5]:
                print(f"   {k['ms']:8.1f} ms {k['count']:6d}  {k['kernel'][:80]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
