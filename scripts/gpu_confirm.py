"""The GPU measurements of the confirmation windows and the API's hot path, in one run.

Run as the ``confirm`` part of ``scripts/gpu_session.sh``; writes ``$OUT/gpu-confirm.json``:

- ``api``: host time per cached call, bf16 64x256x256: ``torch.matmul`` against
  ``unimatmul.matmul`` with and without ``out=``, and routed ``torch.mm`` / ``torch.matmul``,
  for the tuned choice, Default forced and the best kernel forced
  (``benchmarks/api_overhead.py``).
- ``gpt2``: a GPT-2-shaped model (transformers, random weights, bf16, eager), prompt
  16 x 32, ``generate`` of 64 new tokens, and a prefill of 8 x 512: routing off against
  routing on after its confirmation windows judged every choice (``steady``), and the
  cost of the windows themselves: every plan made afresh and every verdict forgotten
  before each round, windows on with ``min_gain`` -100 (every choice kept, so that the
  kernels after the window are those of the run without windows) against windows off.
  Rounds interleave the modes; the ratios are of medians.
- ``profile``: torch.profiler over a generate of 8 tokens, off and steady: host (CPU)
  and device time per matrix product, by op and input shapes, and per routed label.

Every section records its error instead of stopping the others. ``CONFIRM_DEVICE=cpu
CONFIRM_SMALL=1`` runs the same code on the CPU with a two-layer model (a smoke test).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import unimatmul  # noqa: E402
import unimatmul.torch as ut  # noqa: E402
from unimatmul.tuning.harness import HarnessConfig  # noqa: E402
from unimatmul.tuning.selector import get_selector  # noqa: E402

OUT = Path(os.environ.get("OUT", "gpu-out"))
ROUNDS = int(os.environ.get("CONFIRM_ROUNDS", "5"))
DEVICE = torch.device(os.environ.get("CONFIRM_DEVICE", "cuda"))
SMALL = os.environ.get("CONFIRM_SMALL") == "1"
GPU = DEVICE.type == "cuda"
DTYPE = torch.bfloat16 if GPU else torch.float32


def sync() -> None:
    if GPU:
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any]) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def forget_verdicts() -> None:
    """Strip every record's verdict, so that the next plans open windows again."""
    selector = get_selector()
    store = selector.store
    for namespace, key, record in list(store.items()):
        if "confirm" in record.settings:
            settings = {k: v for k, v in record.settings.items() if k != "confirm"}
            store.put(namespace, key, replace(record, settings=settings))
    ut.clear_plans()


def section_api() -> dict[str, Any]:
    import api_overhead

    path = OUT / "api-overhead.json"
    calls = ["--calls", "200", "--rounds", "3"] if SMALL else ["--calls", "1000", "--rounds", "7"]
    api_overhead.main(["--device", DEVICE.type, *calls, "--json", str(path)])
    data = json.loads(path.read_text())
    path.unlink()  # its content goes into gpu-confirm.json
    return data


def gpt2() -> tuple[Any, Callable[[], Any], Callable[[], Any], Callable[[], Any]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000) if SMALL else GPT2Config()
    model = GPT2LMHeadModel(config).to(DEVICE, DTYPE).eval()
    prompt = torch.randint(0, config.vocab_size, (16, 32), device=DEVICE)
    mask = torch.ones_like(prompt)
    long_prompt = torch.randint(0, config.vocab_size, (8, 64 if SMALL else 512), device=DEVICE)

    def generate(tokens: int = 64) -> Any:
        with torch.no_grad():
            return model.generate(
                prompt,
                attention_mask=mask,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                do_sample=False,
                pad_token_id=0,
            )

    def prefill() -> Any:
        with torch.no_grad():
            return model(long_prompt).logits

    return model, generate, prefill, lambda: generate(8)


def section_gpt2() -> dict[str, Any]:
    model, generate, prefill, _ = gpt2()
    selector = get_selector()
    selector.confirm_calls = None  # windows as a user gets them (UNIMATMUL_CONFIRM, default on)
    result: dict[str, Any] = {
        "model": f"gpt2 ({'2 layers, 128 wide' if SMALL else 'config defaults'}, random weights, {DTYPE}, eager)",
        "device": str(DEVICE),
        "rounds": ROUNDS,
    }
    expected = generate()
    logits = prefill()
    # Tune every product generate and prefill meet (the first call of each, in tune mode).
    started = time.perf_counter()
    with ut.enabled(), unimatmul.mode("tune"):
        generate()
        prefill()
    result["tune_s"] = round(time.perf_counter() - started, 2)
    result["tuned_problems"] = selector.stats.tuned
    # Windows with the real min_gain judge every choice: a window needs 34 calls, and a
    # generate calls each prefill product 12 times (once per layer), a decode one 768 times.
    with ut.enabled():
        for _ in range(16 if SMALL else 4):  # two layers: fewer calls per generate
            generate()
            prefill()
        result["verdicts"] = ut.stats()["confirm"]
        routed = generate()
        routed_logits = prefill()
    result["same_tokens_as_off"] = bool(torch.equal(routed, expected))
    result["prefill_logits_rel_error"] = float(
        ((routed_logits.double() - logits.double()).norm() / logits.double().norm()).item()
    )
    result["stats_after_judging"] = {k: v for k, v in ut.stats().items() if k in ("by_source", "confirm")}
    # Each product's harness times beside its in-situ medians: where isolation and the
    # model disagree (why a choice that won in the harness can lose in the model shows here).
    selector.settle(timeout=30)
    result["records"] = [
        {
            "problem": key,
            "winner": record.winner,
            "harness_us": round(record.winner_s * 1e6, 2),
            "harness_default_us": None if record.default_s is None else round(record.default_s * 1e6, 2),
            "in_situ": record.settings.get("confirm"),
        }
        for _, key, record in selector.store.items()
    ]

    # Steady state (verdicts stored) against routing off. Enabling routing starts with no
    # plans: a short generate and a prefill make them (and warm the off side alike) first.
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(ROUNDS):
        generate(2)
        prefill()
        times["generate off"].append(timed(generate))
        times["prefill off"].append(timed(prefill))
        with ut.enabled():
            generate(2)
            prefill()
            times["generate routed"].append(timed(generate))
            times["prefill routed"].append(timed(prefill))
    # The windows' own cost: fresh plans and no verdicts before each round, every choice
    # kept; the plans are made inside the timed generate in both arms (as in a new process).
    settings = selector.settings
    try:
        for _ in range(ROUNDS):
            for windows in (False, True):
                forget_verdicts()
                selector.confirm_calls = 16 if windows else 0
                selector.settings = HarnessConfig(min_gain=-100.0) if windows else settings
                with ut.enabled():
                    times["generate windows" if windows else "generate no-windows"].append(timed(generate))
    finally:
        selector.confirm_calls = None
        selector.settings = settings
    med = {name: statistics.median(v) for name, v in times.items()}
    result["seconds"] = {name: [round(t, 4) for t in v] for name, v in times.items()}
    result["median_s"] = {name: round(t, 4) for name, t in med.items()}
    result["speedup_routed_over_off"] = {
        "generate b16 x 64 tokens": round(med["generate off"] / med["generate routed"], 4),
        "prefill 8x512": round(med["prefill off"] / med["prefill routed"], 4),
    }
    result["window_overhead_pct"] = round(100 * (med["generate windows"] / med["generate no-windows"] - 1), 2)
    del model
    if GPU:
        torch.cuda.empty_cache()
    return result


OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def profile(run: Callable[[], Any]) -> dict[str, dict[str, float]]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    run()
    sync()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if GPU else [])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch_profile(activities=activities, record_shapes=True) as prof:
            run()
            sync()
    rows: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0, "cpu_us": 0.0, "device_us": 0.0})
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key in OPS or e.key.startswith("unimatmul::"):
            row = rows[f"{e.key} {e.input_shapes}" if e.key in OPS else e.key]
            row["calls"] += e.count
            row["cpu_us"] += e.cpu_time_total
            row["device_us"] += getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0.0))
    total = prof.key_averages()
    rows["(every op, self CPU)"]["cpu_us"] = sum(e.self_cpu_time_total for e in total)
    return {
        k: {**v, "cpu_us_per_call": round(v["cpu_us"] / max(v["calls"], 1), 2)}
        for k, v in sorted(rows.items(), key=lambda kv: -kv[1]["cpu_us"])
    }


def section_profile() -> dict[str, Any]:
    model, _, _, generate8 = gpt2()
    out: dict[str, Any] = {"what": "gpt2 generate, batch 16, 8 new tokens"}
    out["off"] = profile(generate8)
    with ut.enabled():
        generate8()  # plans made (verdicts are in the cache from section gpt2)
        out["routed"] = profile(generate8)
    del model
    return out


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if GPU else "cpu",
        "torch": torch.__version__,
        "cache": os.environ.get("UNIMATMUL_CACHE"),
    }
    try:
        import transformers

        report["transformers"] = transformers.__version__
    except ImportError:
        report["transformers"] = None
    for name, section in (("api", section_api), ("gpt2", section_gpt2), ("profile", section_profile)):
        started = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            report[name] = section()
        except Exception as exc:
            report[name] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-3000:]}
            print(report[name]["trace"], flush=True)
        report.setdefault("section_s", {})[name] = round(time.perf_counter() - started, 1)
        (OUT / "gpu-confirm.json").write_text(json.dumps(report, indent=2, default=str))
    gpt = report.get("gpt2", {})
    print(json.dumps({k: gpt.get(k) for k in ("speedup_routed_over_off", "window_overhead_pct", "verdicts")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
