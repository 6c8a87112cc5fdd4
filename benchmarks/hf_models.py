"""Hugging Face transformers models with unimatmul routing off and on: tokens per second.

The models are built from their configs with random weights (nothing is downloaded;
``HF_HUB_OFFLINE=1`` is set): GPT-2 small, a Qwen2-1.5B-shaped and a Llama-3-8B-shaped
stack (their full widths, heads and vocabularies, a few layers) and BERT-base. Each
row is one model, one phase, one batch size and one variant:

- prefill: one forward over B sequences of S tokens (``use_cache=False``); tokens/s is
  B x S over the forward's time.
- generate: ``model.generate`` greedy, ``min_new_tokens = max_new_tokens = N`` so the
  count is fixed (checked); tokens/s is B x N over the whole call (its prompt's
  prefill included).
- eager, or compiled: prefill through ``torch.compile(model, dynamic=False)``,
  generate with a ``StaticCache`` made once per row and state, reset before each call
  (a new cache per call, what ``cache_implementation="static"`` does, gives the compiled
  decode step new static input addresses each call, and CUDA graph trees record its
  graphs again), and a ``CompileConfig`` (transformers then compiles the decode step;
  the prompt's prefill stays eager). On a GPU the
  compile mode is ``reduce-overhead``: compiled calls replay as CUDA graphs. A
  compiled row compiles a second copy of the model for routing on (a compiled graph
  keeps the kernels it was compiled with: the routed one must be compiled while
  routing is on, and apart from the off one; see ``compile_options``).

Per row: a first call with routing off (the reference; compiles the off copy), one call
with routing on in ``unimatmul.mode("tune")`` (tunes every product it meets; compiled
rows tune an eager call first, then compile the routed copy in that mode), then off
and on take turns, round by round (off, on, off, on, ...), in the default ``cached``
mode, each sample after one untimed call in its state (``enable()``/``disable()``
clear routing's plans). Per row: the median of the rounds per state, the ratio of the
medians (routed/off, above 1: routing is faster), each round's own ratio (the spread),
the problems tuned and their winners, and how close the outputs are. A row that fails
is reported with its error and left out; the run goes on. ``--time-limit`` stops it
cleanly: no row starts that would not finish (estimated from the rows done), no round
starts after the limit, and the rows left are listed with the reason. A compiled row on
a GPU counts the CUDA graph re-recordings during its timed calls, per state (``Rerecords``);
the report lists the rows that had any: they time recording, not graph replays. The
native routing kernels are built before the first row where they are not yet
(``UNIMATMUL_TORCH_NATIVE_BUILD=wait`` unless the environment says otherwise): every row
times the steady state, not the Python kernels that serve while a build runs. For MoE
models, ``--off-decode grouped`` leaves transformers' decode switch to ``batched_mm`` out
with routing off too (torch's grouped kernel in decode): routed against that, a row tells
what the routed grouped kernels give apart from the switch left out (routing's default,
``UNIMATMUL_HF_DECODE=auto``, leaves it out where generate() compiles the decode step).

    # CPU (f32, oneDNN, small configs; a few minutes on 2 cores):
    python benchmarks/hf_models.py --cpu-small
    # GPU (bf16, full widths; about 6 minutes on an H200; writes $OUT/hf-h200). The
    # one-command form, which installs unimatmul for its entry points: scripts/gpu_hf.sh
    python benchmarks/hf_models.py --gpu --name h200 --time-limit 330
    # where a row loses: torch.profiler per product (aten::mm/addmm/bmm), off vs on, for
    # chosen rows (--profile), or for every row that comes out below a ratio
    python benchmarks/hf_models.py --gpu --rows 'gpt2/generate/b16/eager' --profile
    python benchmarks/hf_models.py --gpu --profile-below 0.99

Writes results.json (every number, the machine, the tuned problems), results.md (the
table) and results.png (``plot_hf_models.py``, where matplotlib imports) under
``--out`` (default ``$OUT/hf-<name>`` when ``$OUT`` is set, else
``benchmarks/results/hf-<name>``) after every row, and prints the table last. The
tuning cache is a fresh ``cache.msgpack`` there (``--cache`` to keep one).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import functools
import gc
import json
import logging
import math
import os
import re
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_decode import profile_products
from torch_models import _check_device, _portable, machine, mode, native_facts, rounds, sync

# --- the models -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str  # gpt2, qwen2, llama (causal LMs) or bert (an encoder: prefill only)
    config: dict[str, Any]
    about: str

    @property
    def causal(self) -> bool:
        return self.family != "bert"


GPU_MODELS = (
    ModelSpec("gpt2", "gpt2", {}, "GPT-2 small as published: 12 layers, width 768, vocabulary 50257"),
    ModelSpec(
        "qwen2-1.5b",
        "qwen2",
        {
            "hidden_size": 1536,
            "intermediate_size": 8960,
            "num_attention_heads": 12,
            "num_key_value_heads": 2,
            "vocab_size": 151936,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": True,
            "num_hidden_layers": 4,
        },
        "Qwen2-1.5B's widths (1536, MLP 8960), heads (12, 2 KV) and vocabulary (151936); 4 of its 28 layers",
    ),
    ModelSpec(
        "llama3-8b",
        "llama",
        {
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 128256,
            "max_position_embeddings": 8192,
            "tie_word_embeddings": False,
            "num_hidden_layers": 4,
        },
        "Llama-3-8B's widths (4096, MLP 14336), heads (32, 8 KV) and vocabulary (128256); 4 of its 32 layers",
    ),
    ModelSpec(
        "bert-base", "bert", {}, "BERT-base as published: 12 layers, width 768 (encoder: prefill only)"
    ),
    # Mixture-of-experts models in transformers' default configuration: the experts run
    # through torch's grouped GEMM (experts_implementation "grouped_mm").
    ModelSpec(
        "qwen3-30b-a3b",
        "qwen3_moe",
        {
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "moe_intermediate_size": 768,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "vocab_size": 151936,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": False,
            "num_hidden_layers": 4,
        },
        "Qwen3-30B-A3B's widths (2048; 128 experts of 768, top 8), heads (32, 4 KV) and vocabulary; 4 of its 48 layers",
    ),
    ModelSpec(
        "mixtral-8x7b",
        "mixtral",
        {
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "vocab_size": 32000,
            "max_position_embeddings": 32768,
            "tie_word_embeddings": False,
            "num_hidden_layers": 2,
        },
        "Mixtral-8x7B's widths (4096; 8 experts of 14336, top 2), heads (32, 8 KV) and vocabulary; 2 of its 32 layers",
    ),
)

_QWEN3_MOE = next(s for s in GPU_MODELS if s.name == "qwen3-30b-a3b")

# Shaped like the GPU models, small enough for a 2-core CPU.
CPU_SMALL_MODELS = (
    ModelSpec(
        "gpt2-small",
        "gpt2",
        {"n_embd": 256, "n_layer": 2, "n_head": 4},
        "GPT-2 layout, width 256, 2 layers, 4 heads, GPT-2's vocabulary (50257)",
    ),
    ModelSpec(
        "qwen2-small",
        "qwen2",
        {
            "hidden_size": 384,
            "intermediate_size": 2240,
            "num_attention_heads": 6,
            "num_key_value_heads": 1,
            "vocab_size": 32000,
            "tie_word_embeddings": True,
            "num_hidden_layers": 2,
        },
        "Qwen2 layout, width 384, MLP 2240, 6 heads (1 KV), vocabulary 32000, 2 layers",
    ),
    ModelSpec(
        "llama-small",
        "llama",
        {
            "hidden_size": 512,
            "intermediate_size": 1792,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "vocab_size": 32000,
            "tie_word_embeddings": False,
            "num_hidden_layers": 2,
        },
        "Llama layout, width 512, MLP 1792, 8 heads (2 KV), vocabulary 32000, 2 layers",
    ),
    # An MoE layer at full width: Qwen3-30B-A3B's experts as they are (transformers' default
    # grouped_mm, which on the CPU it keeps for decode too), one layer, a 32000 vocabulary.
    ModelSpec(
        "qwen3-moe-1l",
        "qwen3_moe",
        _QWEN3_MOE.config | {"vocab_size": 32000, "num_hidden_layers": 1},
        "Qwen3-30B-A3B's widths (2048; 128 experts of 768, top 8) and heads (32, 4 KV); 1 layer, vocabulary 32000",
    ),
    ModelSpec(
        "bert-small",
        "bert",
        {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "intermediate_size": 1024},
        "BERT layout, width 256, 4 layers, 4 heads (encoder: prefill only)",
    ),
)


def build_model(spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> Any:
    """The model with random weights (transformers' own initialisation), in eval mode."""
    import transformers

    classes = {
        "gpt2": transformers.GPT2Config,
        "qwen2": transformers.Qwen2Config,
        "llama": transformers.LlamaConfig,
        "bert": transformers.BertConfig,
        "qwen3_moe": getattr(transformers, "Qwen3MoeConfig", None),
        "mixtral": getattr(transformers, "MixtralConfig", None),
    }
    config = classes[spec.family](**spec.config)
    auto = transformers.AutoModelForCausalLM if spec.causal else transformers.AutoModel
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: no copy of a large vocabulary
        model = auto.from_config(config, dtype=dtype)
    return model.to(device).eval()


# --- rows ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    spec: ModelSpec
    phase: str  # prefill or generate
    batch: int
    variant: str  # eager or compiled

    @property
    def id(self) -> str:
        return f"{self.spec.name}/{self.phase}/b{self.batch}/{self.variant}"


def plan_rows(args: argparse.Namespace, specs: tuple[ModelSpec, ...]) -> list[Row]:
    """Every row, in the order they run: eager rows first, then compiled ones.

    Compiled rows cost a compile per state and come last, larger models first,
    generate (the decode loop, where graphs matter most) before prefill; generate at
    batch 1 before 16 (bound by the host, where graphs help), prefill at batch 16
    before 1 (bound by the GPU, where the kernels show). A time limit drops the rows
    at the end of this order.
    """
    chosen = [s for s in specs if s.name in args.models or s.family in args.models]
    rows: list[Row] = []
    for spec in chosen:
        for phase in ("prefill", "generate"):
            if phase == "generate" and not spec.causal:
                continue
            rows += [Row(spec, phase, b, "eager") for b in args.batches]
    if args.compile:
        by_size = sorted(chosen, key=lambda s: -_size_rank(s))
        for spec in by_size:
            if spec.causal:
                rows += [Row(spec, "generate", b, "compiled") for b in args.batches]
        for spec in by_size:
            rows += [Row(spec, "prefill", b, "compiled") for b in sorted(args.batches, reverse=True)]
    rows = [r for r in rows if r.phase in args.phases and r.variant in args.variants]
    if args.rows:
        pattern = re.compile(args.rows)
        rows = [r for r in rows if pattern.search(r.id)]
    return rows


def _size_rank(spec: ModelSpec) -> int:
    # Larger models first among compiled rows: they show the products, not the host.
    return {"llama": 3, "qwen2": 2, "gpt2": 1}.get(spec.family, 0)


class Models:
    """The models built so far (each once), and their twins for compiled rows."""

    def __init__(self, device: torch.device, dtype: torch.dtype) -> None:
        self.device, self.dtype = device, dtype
        self.models: dict[str, Any] = {}
        self.twins: dict[str, Any] = {}

    def get(self, spec: ModelSpec) -> Any:
        if spec.name not in self.models:
            self.models[spec.name] = build_model(spec, self.device, self.dtype)
        return self.models[spec.name]

    def twin(self, spec: ModelSpec) -> Any:
        """A second copy with the same weights, never compiled with routing off."""
        if spec.name not in self.twins:
            twin = copy.deepcopy(self.get(spec))
            for attr in ("_compiled_call", "_last_compile_config", "_cache"):
                twin.__dict__.pop(attr, None)
            self.twins[spec.name] = twin
        return self.twins[spec.name]


@dataclass
class Calls:
    """What one state (off or routed) calls: the timed call, and a cheaper one to warm it."""

    run: Callable[[], Any]
    warm: Callable[[], Any]


def make_calls(
    row: Row, model: Any, args: argparse.Namespace, device: torch.device, routed: bool
) -> tuple[Calls, Any]:
    """The calls of one row on one copy of the model, and a function that checks an output."""
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(1000 + row.batch)
    length = args.seq if row.phase == "prefill" else args.prompt
    # Random tokens, never zeros: every embedding row differs.
    ids = torch.randint(0, vocab, (row.batch, length), generator=gen).to(device)
    mask = torch.ones_like(ids)
    graphs = args.compile_mode == "reduce-overhead" and device.type == "cuda"
    if row.phase == "prefill":
        kwargs: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
        if row.spec.causal:
            kwargs["use_cache"] = False
        target = model
        if row.variant == "compiled":
            target = torch.compile(model, options=compile_options(args.compile_mode, routed), dynamic=False)

        def prefill() -> Any:
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            return target(**kwargs)

        return Calls(prefill, prefill), _prefill_output

    from transformers import CompileConfig

    config = model.config
    eos = config.eos_token_id if isinstance(config.eos_token_id, int) else None
    pad = config.pad_token_id if isinstance(config.pad_token_id, int) else (eos if eos is not None else 0)
    base: dict[str, Any] = {
        "attention_mask": mask,
        "do_sample": False,
        "num_beams": 1,
        "pad_token_id": pad,
    }
    new = args.new_tokens
    cache = None
    if row.variant == "compiled":
        from transformers import StaticCache

        compile_config = CompileConfig(
            fullgraph=False, dynamic=False, options=compile_options(args.compile_mode, routed)
        )
        # torch.compile takes a mode or options, not both; the options hold the mode's settings.
        compile_config.mode = None  # type: ignore[assignment]
        if device.type != "cuda":
            # transformers compiles the decode step on a CPU only when asked to.
            compile_config._compile_all_devices = True  # type: ignore[assignment]
        # One static cache for every call, reset before each: transformers makes a new one
        # per generate() otherwise, and its new addresses (static inputs of the compiled
        # decode step) make CUDA graph trees record the graphs again.
        cache = StaticCache(config=config, max_cache_len=length + new)
        base |= {"past_key_values": cache, "compile_config": compile_config}
    else:
        base |= {"disable_compile": True}

    made = [0]  # calls so far, for the errors below
    state = "on" if routed else "off"

    # --off-decode grouped: routing off with transformers' decode switch left out (torch's
    # grouped kernel in decode), to tell what leaving the switch out gives from what the
    # routed kernels give.
    switch_left_out = not routed and args.off_decode == "grouped"

    def generate(count: int = new) -> Any:
        if cache is not None:
            cache.reset()
        made[0] += 1
        if switch_left_out:
            model._optimize_model_for_decode = contextlib.nullcontext
        try:
            tokens = model.generate(ids, max_new_tokens=count, min_new_tokens=count, **base)
        finally:
            if switch_left_out:
                del model._optimize_model_for_decode
        if tokens.shape != (row.batch, length + count):
            msg = (
                f"generate returned shape {tuple(tokens.shape)}, not {(row.batch, length + count)} "
                f"(routing {state}, call {made[0]} of this state)"
            )
            raise RuntimeError(msg)
        return tokens[:, length:]

    def checked() -> Any:
        # The untimed warm call of a compiled row also checks the kept cache: after a call,
        # it holds the prompt and every new token but the last (compiled calls at batch 16
        # returned too few tokens, or indexed GPT-2's positions out of range, while graph
        # replays wrote into the freed buffers of retired routed kernels).
        tokens = generate()
        assert cache is not None
        held = int(cache.get_seq_length())
        if held != length + new - 1:
            msg = (
                f"the static cache holds {held} positions after a call, not {length + new - 1} "
                f"(routing {state}, call {made[0]} of this state)"
            )
            raise RuntimeError(msg)
        return tokens

    # Eager: two new tokens meet every product of the call (the prompt's prefill and a
    # decode step). Compiled: the static cache is sized by the count, so the same count.
    warm = checked if row.variant == "compiled" else (lambda: generate(2))
    return Calls(generate, warm), _generated


def compile_options(mode: str, routed: bool) -> dict[str, Any]:
    """Inductor options of a compile in ``mode`` (what ``torch.compile(mode=...)`` would set).

    Two compiles with equal options share Dynamo's cache entries (their backends compare
    equal, and two copies of a model pass each other's guards), so the routed copy would
    run the graph compiled for the off copy. The routed compile therefore names the
    Inductor pass that ``unimatmul.torch.enable()`` installs in its own options: the
    graph is what routing gives anyway, and the two compiles stay apart.
    """
    import torch._inductor.config as inductor_config
    from torch._inductor import list_mode_options

    import unimatmul.torch as ut

    options = dict(list_mode_options(mode))
    if routed:
        with ut.enabled():
            options["post_grad_custom_pre_pass"] = inductor_config.post_grad_custom_pre_pass
    return options


def _prefill_output(out: Any) -> torch.Tensor:
    if hasattr(out, "logits"):
        # The first and last position of every sequence: the whole logits would be
        # gigabytes in float32 for a large vocabulary.
        return out.logits[:, [0, -1]].float().clone()
    return out.last_hidden_state.float().clone()


def _generated(tokens: Any) -> torch.Tensor:
    return tokens.clone()


def compare(row: Row, off: torch.Tensor, routed: torch.Tensor) -> dict[str, float]:
    """How close the routed output is to routing off's (kernels round differently)."""
    if row.phase == "generate":
        return {"same_tokens": float((off == routed).float().mean())}
    return {"rel_error": float((routed - off).norm() / off.norm())}


# --- one row --------------------------------------------------------------------------------------


class Rerecords(logging.Handler):
    """Counts CUDA graph trees' re-recordings: their debug line ``Re-recording function=...``.

    A compiled row whose graphs are recorded again during its timed calls measures the
    recording, not graph replays (GPT-2's compiled decode re-recorded at every step, routing
    off and on alike, with "static input data pointer changed"). The trees write
    that line at DEBUG on their ``cudagraphs`` artifact logger; :meth:`watch` turns that
    logger on for this handler alone (no output) unless ``TORCH_LOGS`` already did.
    """

    LOGGER = "torch._inductor.cudagraph_trees.__cudagraphs"

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "Re-recording" in str(record.msg):
            self.count += 1

    @classmethod
    def watch(cls) -> Rerecords:
        found = cls()
        logger = logging.getLogger(cls.LOGGER)
        if not logger.isEnabledFor(logging.DEBUG):
            logger.setLevel(logging.DEBUG)
            logger.propagate = False  # nobody asked to see them: counted, not printed
        logger.addHandler(found)
        return found


def timed(
    calls: Calls,
    state: str,
    count: int,
    device: torch.device,
    rerecords: tuple[Rerecords, dict[str, int]] | None = None,
) -> Callable[[], float]:
    """One sample: an untimed warm call in ``state``, then ``count`` calls timed end to end.

    ``rerecords``: a counter and a dict that gains, under ``state``, the CUDA graph
    re-recordings seen during the timed calls.
    """

    def take() -> float:
        with torch.no_grad(), mode(state):
            calls.warm()
            sync(device)
            before = rerecords[0].count if rerecords is not None else 0
            # As timeit does: no garbage collection inside the timed calls (one landing in a
            # sample would be charged to that state; generate() makes many objects a step).
            gc.collect()
            gc.disable()
            try:
                t0 = time.perf_counter()
                for _ in range(count):
                    calls.run()
                sync(device)
                elapsed = (time.perf_counter() - t0) / count
            finally:
                gc.enable()
            if rerecords is not None:
                counter, seen = rerecords
                seen[state] = seen.get(state, 0) + counter.count - before
            return elapsed

    return take


@functools.cache
def _rerecords() -> Rerecords:
    """The process's one re-recording counter (made on first use)."""
    return Rerecords.watch()


def tune_routed(row: Row, model: Any, on: Calls, args: argparse.Namespace, device: torch.device) -> list[Any]:
    """Tune every product the routed state's call meets (``unimatmul.mode("tune")``), and
    return the (problem, target) pairs met. A compiled row tunes an eager call first (the
    compiled graph has the same products), so that its compiled call, which compiles the
    routed copy, tunes nothing inside a CUDA graph tree's warm-up."""
    import unimatmul
    from unimatmul.torch.model_tuning import collecting

    if row.variant == "compiled":
        eager, _ = make_calls(replace(row, variant="eager"), model, args, device, routed=True)
        with mode("routed"), unimatmul.mode("tune"):
            eager.warm()
    with mode("routed"), collecting() as met, unimatmul.mode("tune"):
        on.run()
    sync(device)
    return met


def run_row(
    row: Row, models: Models, args: argparse.Namespace, device: torch.device, deadline: float
) -> dict:
    import unimatmul.torch as ut
    from unimatmul.tuning.selector import get_selector

    model = models.get(row.spec)
    routed_model = models.twin(row.spec) if row.variant == "compiled" else model
    off, check = make_calls(row, model, args, device, routed=False)
    on, _ = make_calls(row, routed_model, args, device, routed=True)
    result: dict[str, Any] = {}
    with torch.no_grad():
        started = time.perf_counter()
        with mode("off"):
            reference = check(off.run())  # compiles the off copy (compiled rows)
        sync(device)
        result["first_call_off_s"] = time.perf_counter() - started
        started = time.perf_counter()
        met = tune_routed(row, routed_model, on, args, device)
        result["tune_call_s"] = time.perf_counter() - started
        ut.clear_plans()
        with mode("routed"):
            routed_out = check(on.run())  # in mode cached, as measured
        result["check"] = compare(row, reference, routed_out)
        # Judge the confirmation windows (the first real calls of each choice, alternating
        # it with Default) before timing: what a server runs after its first few calls.
        # Switching routing on starts with no plans, so a call comes before the first look
        # at the open windows (looking first found none, and judged nothing: sessions 4-5).
        # Bounded in time: a product met once per call (generate's prefill) needs 34
        # calls; a window still open then starts again in each routed sample, since
        # switching routing off drops the plans and their windows.
        judged_until = time.perf_counter() + args.judge_s
        judge_calls = 0
        with mode("routed"):
            while True:
                on.run()
                judge_calls += 1
                if not ut.stats().get("confirm", {}).get("open", 0) or time.perf_counter() >= judged_until:
                    break
            sync(device)
            # The verdicts go to the cache on a thread of their own: written before routing
            # is switched off, so that the rounds' plans read them instead of opening windows.
            get_selector().settle(timeout=30)
        result["judge_calls"] = judge_calls
        result["confirm"] = ut.stats().get("confirm", {})
        ut.reset_stats()
        with mode("routed"):
            on.run()
        stats = ut.stats()
        result["routed_calls"] = stats["routed"]
        result["kernel_calls"] = stats["kernel"]
        result["routed_by_label"] = stats["by_label"]
        # The grouped door (torch._grouped_mm, MoE experts) counts its calls apart.
        grouped = ut.grouped_stats()
        result["grouped_calls"] = grouped.get("routed", 0)
        result["grouped_by_label"] = grouped.get("by_label", {})
        result["problems"] = tuned_problems(met)
        with mode("off"):
            off.run()  # compiled: the off graph is recorded by now too
        once = timed(off, "off", 1, device)()
        count = max(1, math.ceil(args.min_time / once))
        watch = None
        if row.variant == "compiled" and device.type == "cuda":
            result["graph_rerecords"] = {"off": 0, "routed": 0}
            watch = (_rerecords(), result["graph_rerecords"])
        variants = {
            "off": timed(off, "off", count, device, watch),
            "routed": timed(on, "routed", count, device, watch),
        }
        result["calls_per_sample"] = count
        measured = rounds(
            variants, args.rounds, deadline, more=unresolved(args.resolve / 100), most=args.max_rounds
        )
        ratio = measured["off"]["median_s"] / measured["routed"]["median_s"]
        if args.profile or (args.profile_below and ratio < args.profile_below):
            result["profile"] = {
                "off": profile_products(off.run, lambda: mode("off"), args.profile_steps, device, warm=1),
                "routed": profile_products(
                    on.run, lambda: mode("routed"), args.profile_steps, device, warm=1
                ),
            }
    # Kernels kept for the process's life because a CUDA graph captured their call.
    result["held_for_graphs"] = ut.stats()["held_for_graphs"]
    tokens = row.batch * (args.seq if row.phase == "prefill" else args.new_tokens)
    for state, stats_ in measured.items():
        result[state] = stats_ | {"tokens_per_s": tokens / stats_["median_s"]}
    pairs = list(zip(measured["off"]["samples"], measured["routed"]["samples"], strict=True))
    result["round_ratios"] = [o / r for o, r in pairs]
    result["ratio"] = ratio
    # The median of the rounds' own ratios: each round's off and routed samples were
    # taken back to back, so a slow stretch of the host moves both.
    result["ratio_paired"] = statistics.median(result["round_ratios"])
    interval = ratio_interval(result["round_ratios"])
    result["ratio_interval_95"] = list(interval) if interval is not None else None
    result["tokens_per_call"] = tokens
    return result


def ratio_interval(ratios: list[float]) -> tuple[float, float] | None:
    """A 95 % interval of the median of the rounds' ratios (order statistics: each bound
    one-sided at 97.5 %), or None with too few rounds for one."""
    from unimatmul.tuning.bounds import ratio_bounds

    low, high = ratio_bounds(ratios, 0.975)
    return None if low == 0.0 or math.isinf(high) else (low, high)


def unresolved(within: float) -> Callable[[dict[str, list[float]]], bool]:
    """Whether a row needs more rounds: its 95 % interval of the median round ratio (off
    over routed) is wider than ``within`` of the median on either side (or not yet known)."""

    def more(samples: dict[str, list[float]]) -> bool:
        ratios = [o / r for o, r in zip(samples["off"], samples["routed"], strict=True) if r > 0]
        if not ratios:
            return True
        interval = ratio_interval(ratios)
        if interval is None:
            return True
        mid = statistics.median(ratios)
        return interval[0] < mid * (1 - within) or interval[1] > mid * (1 + within)

    return more


def tuned_problems(met: list[Any]) -> list[dict[str, Any]]:
    """Each distinct problem the tune call met, and what the cache now holds for it."""
    from unimatmul.tuning.selector import get_selector

    selector = get_selector()
    seen: dict[str, dict[str, Any]] = {}
    for problem, target in met:
        if problem.key in seen:
            continue
        record = selector.lookup(problem, target)
        seen[problem.key] = {
            "problem": problem.key,
            "shape": problem.shape_text,
            "dtype": str(problem.dtype_a),
            "winner": record.winner if record else None,
            "speedup": round(record.speedup, 4) if record else None,
        }
    return list(seen.values())


# --- the run --------------------------------------------------------------------------------------


class Estimates:
    """Seconds a row is expected to take: the longest row done of its model and variant.

    (The longest, not the last: a row at batch 16 can take several times one at
    batch 1.) A model with none done yet takes the longest of its variant so far.
    """

    def __init__(self, gpu: bool) -> None:
        # First guesses: an eager row (build, tune, rounds) and a compiled one (two compiles).
        self.first = {"eager": 30.0, "compiled": 90.0 if gpu else 240.0}
        self.done: dict[tuple[str, str], list[float]] = {}

    def of(self, row: Row) -> float:
        same = self.done.get((row.spec.name, row.variant))
        if same:
            return max(same)
        others = [t for (_, v), times in self.done.items() if v == row.variant for t in times]
        return max(others) if others else self.first[row.variant]

    def add(self, row: Row, seconds: float) -> None:
        self.done.setdefault((row.spec.name, row.variant), []).append(seconds)


def run(
    args: argparse.Namespace, report: Report, device: torch.device, dtype: torch.dtype, start: float
) -> None:
    # No round starts after the deadline; a few seconds are kept for the plot and the table.
    deadline = start + args.time_limit - 10 if args.time_limit else math.inf
    specs = model_specs(args)
    rows = plan_rows(args, specs)
    models = Models(device, dtype)
    estimates = Estimates(device.type == "cuda")
    _log(f"{len(rows)} rows; models: {', '.join(dict.fromkeys(r.spec.name for r in rows))}")
    for i, row in enumerate(rows, 1):
        left = deadline - time.perf_counter()
        need = estimates.of(row)
        if need > left:
            report.skipped(row, f"time limit: about {need:.0f} s needed, {max(left, 0):.0f} s left")
            _log(f"[{i}/{len(rows)}] {row.id}: skipped (time limit)")
            continue
        _log(f"[{i}/{len(rows)}] {row.id} ... ({time.perf_counter() - start:.0f} s so far)")
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                result = run_row(row, models, args, device, deadline)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            report.failed(row, exc)
            try:
                _recover(device)
            except SystemExit:
                for later in rows[i:]:
                    report.skipped(later, f"not run: the CUDA context was broken after {row.id} failed")
                raise
            finally:
                report.write()
            continue
        seconds = time.perf_counter() - t0
        estimates.add(row, seconds)
        report.add(row, result, seconds)
        report.write()
        _log(
            f"    off {result['off']['tokens_per_s']:,.0f} tok/s, routed {result['routed']['tokens_per_s']:,.0f}"
            f" tok/s, routed/off {result['ratio']:.3f}x ({result['off']['rounds']} rounds, {seconds:.0f} s)"
        )
    report.data["seconds"] = time.perf_counter() - start


def _recover(device: torch.device) -> None:
    """After a failed row: routing off, memory back; stop if the CUDA context is broken."""
    import unimatmul.torch as ut

    if ut.is_enabled():
        ut.disable()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        _check_device(device)


def _log(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


# --- the report -----------------------------------------------------------------------------------


class Report:
    def __init__(self, out: Path, args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> None:
        import transformers

        self.out = out
        facts = machine(device)
        facts["transformers"] = transformers.__version__
        specs = model_specs(args)
        self.data: dict[str, Any] = {
            "machine": facts,
            "settings": {k: (_portable(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "dtype": str(dtype).removeprefix("torch."),
            "models": {s.name: {"about": s.about, "config": s.config} for s in specs},
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "rows": [],
            "not_run": [],
        }

    def _base(self, row: Row) -> dict[str, Any]:
        return {
            "id": row.id,
            "model": row.spec.name,
            "phase": row.phase,
            "batch": row.batch,
            "variant": row.variant,
        }

    def add(self, row: Row, result: dict[str, Any], seconds: float) -> None:
        # The load average says how busy a shared machine was: other work skews the spread.
        load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
        self.data["rows"].append(self._base(row) | result | {"seconds": round(seconds, 1), "load_1min": load})

    def failed(self, row: Row, exc: BaseException) -> None:
        reason = f"failed: {type(exc).__name__}: {exc}".replace("\n", " ")[:600]
        self.data["not_run"].append(self._base(row) | {"reason": reason})

    def skipped(self, row: Row, reason: str) -> None:
        self.data["not_run"].append(self._base(row) | {"reason": reason})

    def write(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.data["native"] = native_facts()
        self.data["written"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        (self.out / "results.json").write_text(json.dumps(self.data, indent=2) + "\n")
        (self.out / "results.md").write_text(markdown(self.data))


def _spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def summary_table(data: dict[str, Any]) -> list[str]:
    """The rows as a markdown table, and the rows not run with why."""
    lines = [
        "| row | tokens/call | off tok/s | routed tok/s | routed/off | median of round ratios | "
        "95% interval of that median | round ratios (min-max) | off, routed spread | rounds | "
        "kernels chosen / problems | check |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        problems = r["problems"]
        kernels = sum(1 for p in problems if p["winner"] not in (None, "default/default"))
        check = r["check"]
        check_text = (
            f"{check['same_tokens']:.0%} same tokens"
            if "same_tokens" in check
            else f"rel. error {check['rel_error']:.1e}"
        )
        ratios = r["round_ratios"]
        interval = r.get("ratio_interval_95")
        interval_text = f"{interval[0]:.3f}-{interval[1]:.3f}" if interval else "-"
        lines.append(
            f"| {r['id']} | {r['tokens_per_call']:,} | {r['off']['tokens_per_s']:,.0f} | "
            f"{r['routed']['tokens_per_s']:,.0f} | **{r['ratio']:.3f}x** | "
            f"{r.get('ratio_paired', statistics.median(ratios)):.3f}x | {interval_text} | "
            f"{min(ratios):.3f}-{max(ratios):.3f} | "
            f"{_spread(r['off']['samples']):.1%}, {_spread(r['routed']['samples']):.1%} | {r['off']['rounds']} | "
            f"{kernels} / {len(problems)} | {check_text} |"
        )
    rerecorded = [r for r in data["rows"] if any(r.get("graph_rerecords", {}).values())]
    if rerecorded:
        lines += [
            "",
            "CUDA graphs recorded again during the timed calls (these rows time recording, not replays):",
            "",
        ]
        lines += [
            f"- `{r['id']}`: off {r['graph_rerecords']['off']}, routed {r['graph_rerecords']['routed']} re-recordings"
            for r in rerecorded
        ]
    if data["not_run"]:
        lines += ["", "Not run:", ""]
        lines += [f"- `{r['id']}`: {r['reason']}" for r in data["not_run"]]
    return lines


def markdown(data: dict[str, Any]) -> str:
    m, s = data["machine"], data["settings"]
    lines = [
        "# Hugging Face models: unimatmul routing off and on",
        "",
        f"Machine: {m.get('gpu') or m['cpu']} ({m['device']}), {m['cpu_count']} CPU cores, torch {m['torch']}, "
        f"transformers {m['transformers']}, unimatmul {m['unimatmul']}; backends: {', '.join(m['backends']) or 'none'}; "
        f"dtype {data['dtype']}.",
        f"Written {data.get('written', '')} by `benchmarks/hf_models.py` ({'--cpu-small' if s['cpu_small'] else '--gpu'}; "
        f"prefill {s['seq']} tokens a sequence, generate {s['prompt']} + {s['new_tokens']} new tokens, "
        f"up to {s['rounds']} rounds, {s['min_time']} s a sample"
        + (f"; compile mode {s['compile_mode']}" if s["compile"] else "; no compiled rows")
        + (
            "; routing off with transformers' decode switch left out"
            if s.get("off_decode") == "grouped"
            else ""
        )
        + (f"; time limit {s['time_limit']} s" if s["time_limit"] else "")
        + (f"; the run took {data['seconds']:.0f} s" if "seconds" in data else "")
        + ").",
    ]
    nat = data.get("native", {})
    lines.append(
        f"Native routing kernels: {nat.get('choice')}, loaded {nat.get('loaded')}, "
        f"Lt calls made from C++ {nat.get('lt_calls_from_cpp')}"
        + (f", build failure: {nat['build_failure']}" if nat.get("build_failure") else "")
        + "."
    )
    loads = [r["load_1min"] for r in data["rows"] if r.get("load_1min") is not None]
    if loads:
        lines.append(
            f"Load average (1 min) at the end of each row: {min(loads):.1f} to {max(loads):.1f} "
            f"on {m['cpu_count']} CPUs, torch threads {m['torch_threads']}."
        )
    if s.get("note"):
        lines += ["", f"Note: {s['note']}"]
    lines += ["", "Models (random weights from config):", ""]
    lines += [f"- {name}: {info['about']}" for name, info in data["models"].items()]
    lines += [
        "",
        "## Tokens per second",
        "",
        "off = routing off; routed = `unimatmul.torch` on, every product tuned by one call in mode `tune`, "
        "then measured in mode `cached`. Off and routed take turns, round by round; tok/s of the median "
        "round; routed/off = off's median time over routed's (above 1: routing is faster); round ratios = "
        "each round's own off/routed; spread = (max - min) / median of each state's samples. "
        "kernels chosen / problems = the distinct products met whose tuned winner is a backend's kernel "
        "(the rest keep PyTorch's). check = routed output against off: greedy tokens equal, or the "
        "relative error of the logits at the first and last position.",
        "",
        *summary_table(data),
    ]
    profiled = [r for r in data["rows"] if r.get("profile")]
    for r in profiled:
        lines += ["", f"## Profile: {r['id']} ({data['settings']['profile_steps']} calls per state)", ""]
        lines += profile_table(r["profile"])
    problems: dict[str, dict[str, Any]] = {}
    for r in data["rows"]:
        for p in r["problems"]:
            problems.setdefault(p["problem"], p)
    if problems:
        lines += [
            "",
            "## Tuned problems",
            "",
            "Every distinct product the rows met; speedup = Default's time over the winner's, as tuned.",
            "",
            "| problem | winner | speedup |",
            "|---|---|---|",
        ]
        for p in problems.values():
            speedup = "-" if p["speedup"] is None else f"{p['speedup']:.3f}x"
            lines.append(f"| `{p['problem']}` | {p['winner']} | {speedup} |")
    return "\n".join(lines) + "\n"


def profile_table(profile: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    """Per product key: host us per call and device us in all, off and routed.

    The totals first, then the aten ops by how much their time differs (host plus
    device), then the ``unimatmul::`` ranges of routed calls (inside the aten ops,
    one per candidate: what ran).
    """
    off, on = profile["off"], profile["routed"]

    def moved(key: str) -> float:
        o, r = off.get(key, {}), on.get(key, {})
        return abs(r.get("cpu_us", 0) - o.get("cpu_us", 0)) + abs(
            r.get("device_us", 0) - o.get("device_us", 0)
        )

    keys = set(off) | set(on)
    totals = sorted(k for k in keys if k.startswith("("))
    ranges = sorted(k for k in keys if k.startswith("unimatmul::"))
    ops = sorted(keys - set(totals) - set(ranges), key=moved, reverse=True)
    lines = [
        "Host time per call includes the profiler's own cost; device time is 0 on a CPU (there the "
        "host time is the op's).",
        "",
        "| op and input shapes | calls off/routed | host us/call off | routed | device us in all off | routed |",
        "|---|---|---|---|---|---|",
    ]
    for k in [*totals, *ops[:25], *ranges]:
        o, r = off.get(k, {}), on.get(k, {})
        lines.append(
            f"| `{k}` | {int(o.get('calls', 0))}/{int(r.get('calls', 0))} | {o.get('cpu_us_per_call', 0):.1f} | "
            f"{r.get('cpu_us_per_call', 0):.1f} | {o.get('device_us', 0):.0f} | {r.get('device_us', 0):.0f} |"
        )
    return lines


# --- main -----------------------------------------------------------------------------------------


def model_specs(args: argparse.Namespace) -> tuple[ModelSpec, ...]:
    """The model specs of this run (GPU or CPU-small), with ``--layers`` decoder layers where
    given, their descriptions saying so."""
    specs = CPU_SMALL_MODELS if args.cpu_small else GPU_MODELS
    layers = args.layers
    if layers is None:
        return specs

    def spec(s: ModelSpec) -> ModelSpec:
        about = re.sub(r"\b\d+ of its", f"{layers} of its", s.about, count=1)
        if about == s.about:
            about = f"{s.about}; {layers} layers here"
        return replace(s, config=s.config | {"num_hidden_layers": layers}, about=about)

    return tuple(spec(s) for s in specs)


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kind = p.add_mutually_exclusive_group(required=True)
    kind.add_argument("--gpu", action="store_true", help="full-width models, bf16, on cuda")
    kind.add_argument("--cpu-small", action="store_true", help="small configs, f32, on the CPU (oneDNN)")
    p.add_argument("--name", default=None, help="results go to hf-NAME (default: gpu / cpu-small)")
    p.add_argument(
        "--out", type=Path, default=None, help="default: $OUT/hf-NAME, else benchmarks/results/hf-NAME"
    )
    p.add_argument("--models", type=_csv, default=None, help="comma list of names or families (default: all)")
    p.add_argument("--phases", type=_csv, default=["prefill", "generate"])
    p.add_argument("--batches", type=lambda t: [int(x) for x in _csv(t)], default=[1, 16])
    p.add_argument("--variants", type=_csv, default=["eager", "compiled"])
    p.add_argument("--rows", default=None, help="a regular expression on row ids (model/phase/bB/variant)")
    p.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compiled rows too (default: on the GPU; off on the CPU, where Inductor takes minutes)",
    )
    p.add_argument(
        "--compile-mode", default=None, help="torch.compile mode (reduce-overhead GPU / default CPU)"
    )
    p.add_argument(
        "--off-decode",
        choices=["transformers", "grouped"],
        default="transformers",
        help="MoE generate with routing off: transformers' decode switch to batched_mm (default, "
        "what a user runs) or left out (torch's grouped kernel in decode)",
    )
    p.add_argument("--seq", type=int, default=None, help="prefill tokens a sequence (512 GPU / 64 CPU)")
    p.add_argument("--prompt", type=int, default=None, help="generate: prompt tokens (128 GPU / 32 CPU)")
    p.add_argument("--new-tokens", type=int, default=None, help="generate: new tokens (64 GPU / 16 CPU)")
    p.add_argument("--rounds", type=int, default=None, help="off/routed rounds per row (7 GPU / 5 CPU)")
    p.add_argument(
        "--max-rounds",
        type=int,
        default=None,
        help="rounds a row may take past --rounds while its ratio is not resolved (--resolve); default: none",
    )
    p.add_argument(
        "--resolve",
        type=float,
        default=2.0,
        metavar="PCT",
        help="with --max-rounds: more rounds until the 95%% interval of the median round ratio is "
        "within PCT %% of it on either side (default 2)",
    )
    p.add_argument(
        "--min-time", type=float, default=None, help="seconds a sample at least (0.15 GPU / 0.1 CPU)"
    )
    p.add_argument(
        "--judge-s",
        type=float,
        default=8.0,
        help="seconds at most, per row, to let the confirmation windows judge before timing (default 8)",
    )
    p.add_argument("--time-limit", type=float, default=None, help="seconds for the whole run (default: none)")
    p.add_argument(
        "--profile", action="store_true", help="torch.profiler per product, off vs routed, per row"
    )
    p.add_argument(
        "--profile-below",
        type=float,
        default=None,
        metavar="RATIO",
        help="profile the rows whose routed/off comes out below RATIO (e.g. 0.99): the losses, in the same run",
    )
    p.add_argument("--profile-steps", type=int, default=3, help="calls profiled per state")
    p.add_argument("--cache", type=Path, default=None, help="tuning cache (default: a fresh one in --out)")
    p.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (CPU; also OMP_NUM_THREADS)"
    )
    p.add_argument(
        "--layers",
        type=int,
        default=None,
        help="decoder layers of every model (default: each spec's few; the report names them)",
    )
    p.add_argument("--note", default="", help="a line for the report (conditions of the run)")
    p.add_argument(
        "--tree-history",
        action="store_true",
        help="CUDA graph trees record where each allocation came from (their errors then name it)",
    )
    args = p.parse_args(argv)
    gpu = args.gpu
    args.device = "cuda" if gpu else "cpu"
    args.name = args.name or ("gpu" if gpu else "cpu-small")
    if args.out is None:
        base = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(__file__).parent / "results"
        args.out = base / f"hf-{args.name}"
    if args.layers is not None and args.layers < 1:
        p.error("--layers takes a positive count")
    specs = model_specs(args)
    args.models = args.models or [s.name for s in specs]
    known = {s.name for s in specs} | {s.family for s in specs}
    if set(args.models) - known:
        p.error(f"--models: unknown {sorted(set(args.models) - known)}; choose from {sorted(known)}")
    if set(args.phases) - {"prefill", "generate"} or set(args.variants) - {"eager", "compiled"}:
        p.error("--phases takes prefill, generate; --variants takes eager, compiled")
    args.compile = gpu if args.compile is None else args.compile
    args.compile_mode = args.compile_mode or ("reduce-overhead" if gpu else "default")
    if args.tree_history:
        import torch._inductor.config as inductor_config

        inductor_config.triton.cudagraph_trees_history_recording = True
    args.seq = args.seq or (512 if gpu else 64)
    args.prompt = args.prompt or (128 if gpu else 32)
    args.new_tokens = args.new_tokens or (64 if gpu else 16)
    args.rounds = args.rounds or (7 if gpu else 5)
    args.max_rounds = max(args.max_rounds or args.rounds, args.rounds)
    args.min_time = args.min_time or (0.15 if gpu else 0.1)
    return args


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()  # --time-limit counts from here
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.stderr.write("hf_models: --gpu needs a CUDA device, and torch sees none\n")
        return 3
    try:
        import transformers  # noqa: F401
    except ImportError:
        sys.stderr.write("hf_models: needs transformers: pip install 'unimatmul[hf]'\n")
        return 3
    args.out.mkdir(parents=True, exist_ok=True)
    cache = args.cache or (args.out / "cache.msgpack")
    if args.cache is None:
        cache.unlink(missing_ok=True)  # every row tunes in this run
    os.environ["UNIMATMUL_CACHE"] = str(cache)
    os.environ.pop("UNIMATMUL_MODE", None)
    # The rows measure the steady state: where the native routing kernels are not built
    # yet, the first enable() builds them before anything is timed, instead of leaving
    # the first rows to the Python kernels while a build runs in the background.
    os.environ.setdefault("UNIMATMUL_TORCH_NATIVE_BUILD", "wait")
    # Each row compiles its own graphs, and all of them go through one code object
    # (Module._wrapped_call_impl): raise Dynamo's limits so that none falls back to eager.
    import torch._dynamo.config as dynamo_config

    for name, value in (
        ("recompile_limit", 256),
        ("cache_size_limit", 256),
        ("accumulated_recompile_limit", 4096),
    ):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, value)
    if args.threads:
        # oneDNN runs on an OpenMP pool of its own: set the variable for it as well.
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    report = Report(args.out, args, device, dtype)
    report.write()
    code = 0
    try:
        with _quiet_transformers():
            run(args, report, device, dtype, start)
    except SystemExit as exc:  # a broken CUDA context: keep what was measured, and say so
        code = exc.code if isinstance(exc.code, int) else 3
    report.write()
    _log(f"results: {args.out}")
    plot = Path(__file__).with_name("plot_hf_models.py")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        _log(f"no matplotlib here: plot later with python {plot.name} results.json")
    else:
        import subprocess

        subprocess.run([sys.executable, str(plot), str(args.out / "results.json")], check=False)
    print("\n".join(summary_table(report.data)))
    return code


if __name__ == "__main__":
    sys.exit(main())
