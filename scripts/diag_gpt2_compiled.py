"""Why ``gpt2/generate/b1/compiled`` returned 3 new tokens, not 64, on the GPU (issue #13).

Each case builds GPT-2 small from config (bf16, cuda), greedy, prompt 128 + 64 new
tokens, static cache, compiled, routing never enabled, and prints the shape that
``generate`` returned and the new tokens' count per call:

- ``bench``: ``benchmarks/hf_models.py``'s own calls (``make_calls``, routing off);
- ``mode``: ``CompileConfig(mode="reduce-overhead")`` instead of the benchmark's options;
- ``options``: the benchmark's ``CompileConfig`` (options, mode None) on a plain model;
- ``history``: ``bench`` with ``--tree-history`` (CUDA graph trees record allocations);
- ``routed``: routing on, as the benchmark's routed side runs it: the products tuned by an
  eager call, then the compiled call in mode ``tune``, then again in mode ``cached``
  (set ``UNIMATMUL_CACHE`` to a fresh file to tune).

    python3 scripts/diag_gpt2_compiled.py [bench mode options history routed]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


def routed(hf_models: Any, row: Any, model: Any, args: Any, device: torch.device) -> None:
    """The routed side of ``run_row`` for this row, step by step, printing each step's shape."""
    from dataclasses import replace

    import unimatmul
    import unimatmul.torch as ut

    on, _ = hf_models.make_calls(row, model, args, device, routed=True)
    eager, _ = hf_models.make_calls(replace(row, variant="eager"), model, args, device, routed=True)
    steps = [
        ("eager tune", lambda: eager.warm(), "tune"),
        ("compiled tune", lambda: on.run(), "tune"),
        ("compiled cached", lambda: on.run(), "cached"),
        ("compiled cached again", lambda: on.run(), "cached"),
    ]
    for name, call, mode in steps:
        try:
            with torch.no_grad(), hf_models.mode("routed"), unimatmul.mode(mode):
                out = call()
            print(f"routed {name}: {args.prompt} + {out.shape[1]} tokens", flush=True)
        except Exception as exc:
            print(f"routed {name}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        if name == "compiled tune":
            ut.clear_plans()
    print(f"routed: stats {ut.stats().get('by_source')}", flush=True)


def main() -> int:
    import hf_models
    from transformers import CompileConfig

    args = hf_models.parse_args(["--gpu", "--models", "gpt2"])
    spec = next(s for s in hf_models.GPU_MODELS if s.name == "gpt2")
    device = torch.device("cuda")
    row = hf_models.Row(spec, "generate", 1, "compiled")
    for case in sys.argv[1:] or ["bench", "mode", "options", "history", "routed"]:
        if case == "history":
            import torch._inductor.config as inductor_config

            inductor_config.triton.cudagraph_trees_history_recording = True
        model = hf_models.build_model(spec, device, torch.bfloat16)
        ids = torch.randint(0, model.config.vocab_size, (1, args.prompt), device=device)
        eos = model.config.eos_token_id
        options = hf_models.compile_options(args.compile_mode, routed=False)
        if case == "routed":
            routed(hf_models, row, model, args, device)
            del model
            torch._dynamo.reset()
            continue
        for attempt in range(2):
            try:
                with torch.no_grad():
                    if case in ("bench", "history"):
                        calls, _ = hf_models.make_calls(row, model, args, device, routed=False)
                        out = calls.run()
                        shape = (1, args.prompt + out.shape[1])
                    else:
                        cc = CompileConfig(fullgraph=False, dynamic=False, mode="reduce-overhead")
                        if case == "options":
                            cc = CompileConfig(fullgraph=False, dynamic=False, options=options)
                            cc.mode = None  # type: ignore[assignment]
                        tokens = model.generate(
                            ids,
                            attention_mask=torch.ones_like(ids),
                            max_new_tokens=args.new_tokens,
                            min_new_tokens=args.new_tokens,
                            do_sample=False,
                            num_beams=1,
                            pad_token_id=eos,
                            cache_implementation="static",
                            compile_config=cc,
                        )
                        shape = tuple(tokens.shape)
                print(f"{case} call {attempt}: shape {shape}", flush=True)
            except Exception as exc:
                print(f"{case} call {attempt}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
        del model
        torch._dynamo.reset()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
