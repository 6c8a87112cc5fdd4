"""Every GEMM a model runs, derived from its Hugging Face ``config.json`` (no weights, no
``transformers``): the products ``unimatmul tune --model`` tunes.

:func:`load_config` reads a ``config.json`` path or a built-in name
(:data:`unimatmul.tuning.model_configs.MODELS`); :func:`model_gemms` lists the products
of one forward pass at each token count, as Hugging Face's modelling code runs them:
each ``nn.Linear`` is ``x[T, K] @ W[N, K]^T`` (layout NT, a bias as the ``bias``
epilogue), GPT-2's ``Conv1D`` is ``x @ W[K, N]`` + bias (NN). Attention scores and their
product with V run inside SDPA, not as GEMMs, and are not listed.

``tp`` > 1 gives one rank's products under tensor parallelism as vLLM and Megatron split
them: column-parallel layers (q, k, v, gate, up, MLA's q and kv_b, lm_head) split N,
row-parallel ones (o_proj, down) split K; key/value heads fewer than ``tp`` are
replicated (one per rank); routers and MLA's low-rank down-projections are replicated.

The experts of MoE layers are grouped GEMMs (``ModelGemm.experts`` > 0), as transformers 5
runs them by default (``experts_implementation="grouped_mm"``): the ``tokens x top_k``
routed rows, sorted by expert, times every expert's weight in one
``torch._grouped_mm(x[rows, K], w.transpose(-2, -1), offs)`` (``offs`` over x's rows),
with gate and up fused in one weight ``gate_up_proj [E, 2I, H]`` and ``down_proj
[E, H, I]`` (gpt-oss keeps them the other way round, ``[E, H, 2I]`` and ``[E, I, H]``, and
passes them untransposed; its expert biases are added after the product). Their Problem is
the one :func:`unimatmul.core.grouped.grouped_problem_of` builds for that call, rows
bucketed. Under ``tp`` every rank holds every expert with its intermediate size split
(gate/up's N, down's K), as vLLM's tensor-parallel MoE (no expert parallelism) and
transformers' packed column-/row-wise plan split them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from unimatmul.core.dtypes import ITEMSIZE, canonical
from unimatmul.core.grouped import grouped_problem
from unimatmul.core.problem import GROUPED_DTYPES, Problem
from unimatmul.tuning.model_configs import MODELS

#: Decode buckets (one token per sequence, 1 to 64 sequences) and prefill sizes.
DEFAULT_TOKENS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 512, 1024, 2048, 4096, 8192)

FAMILIES: tuple[str, ...] = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_oss",
    "bert",
    "gpt2",
)


class ConfigError(ValueError):
    """A config that does not say what its GEMMs are (the message names the field)."""


@dataclass(frozen=True)
class ModelGemm:
    """One product of a forward pass over ``tokens`` tokens, run ``layers`` times.

    Dense: ``m x n x k``. Grouped (``experts`` > 0): ``m`` rows in all (tokens x top-k)
    spread over ``experts`` weight matrices of ``n x k`` (``trans_b``: stored ``[n, k]``,
    passed transposed).
    """

    name: str
    tokens: int
    m: int
    n: int
    k: int
    dtype: str
    layers: int = 1
    trans_b: bool = True  # nn.Linear's weight is [N, K]: B = W^T (NT)
    bias: bool = False
    experts: int = 0
    top_k: int = 0

    @property
    def grouped(self) -> bool:
        return self.experts > 0

    @property
    def shape_text(self) -> str:
        if self.grouped:
            return f"{self.experts}x({self.m}/{self.experts})x{self.n}x{self.k}"
        return f"{self.m}x{self.n}x{self.k}"

    @property
    def refused(self) -> str:
        """Why this product has no Problem unimatmul tunes ("" when it has one)."""
        if self.grouped and self.dtype not in GROUPED_DTYPES:
            return (
                f"grouped (MoE experts) in {self.dtype}: torch._grouped_mm and the grouped door "
                f"take {', '.join(GROUPED_DTYPES)} only"
            )
        return ""

    def problem(self) -> Problem:
        """The Problem tuned for this product: a dense GEMM, or the grouped GEMM the grouped
        door builds for the experts' call (ValueError, naming why, where there is none)."""
        if self.refused:
            raise ValueError(f"{self.name}: {self.refused}")
        if self.grouped:
            return grouped_problem(self.experts, self.m, self.n, self.k, self.dtype, trans_b=self.trans_b)
        problem = Problem.from_shape(
            self.m, self.n, self.k, self.dtype, epilogue="bias" if self.bias else "none"
        )
        return replace(problem, trans_b=True, ldb=self.k) if self.trans_b else problem

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def min_bytes(self) -> int:
        """Bytes one call must move: activations in and out, and each weight used once
        (experts: those the tokens reach, expected under uniform routing)."""
        size = ITEMSIZE[self.dtype]
        weights = 1.0
        if self.grouped:
            # Each token picks top_k distinct experts: an expert is missed by all with
            # probability (1 - top_k/experts)^tokens.
            weights = self.experts * (1.0 - (1.0 - self.top_k / self.experts) ** self.tokens)
        return int(size * (self.m * self.k + self.m * self.n + weights * self.n * self.k))


def load_config(spec: str) -> tuple[dict[str, Any], str]:
    """(config, where it came from) for a built-in name or a ``config.json`` path.

    OSError when the file cannot be read, ConfigError when it is not a JSON object
    or the name is not built in.
    """
    name = spec.strip().lower()
    if name in MODELS:
        config = dict(MODELS[name])
        return config, f"built-in {name} ({config.pop('source')})"
    path = Path(spec).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.exists() and not any(sep in spec for sep in ("/", "\\")) and not spec.endswith(".json"):
        msg = f"unknown model {spec!r}: give a config.json path or one of {', '.join(MODELS)}"
        raise ConfigError(msg)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not a text file ({exc.reason} at byte {exc.start})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a JSON object")
    text = config.get("text_config")
    if isinstance(text, dict) and "model_type" in text:  # a multimodal wrapper: its language model
        config = text
    return config, str(path)


def config_dtype(config: dict[str, Any]) -> str:
    """The config's dtype (``torch_dtype``, or ``dtype`` as transformers 5 writes it), else f32."""
    text = config.get("torch_dtype") or config.get("dtype") or "float32"
    try:
        return canonical(str(text))
    except TypeError as exc:
        raise ConfigError(f"torch_dtype {text!r}: {exc}") from None


def model_gemms(
    config: dict[str, Any], tokens: Sequence[int] = DEFAULT_TOKENS, *, tp: int = 1, dtype: str | None = None
) -> list[ModelGemm]:
    """Every GEMM of one forward pass at each token count, on one of ``tp`` ranks."""
    if tp < 1:
        raise ConfigError(f"the tensor-parallel degree must be at least 1, got {tp}")
    if not tokens or min(tokens) < 1:
        raise ConfigError(f"token counts must be positive, got {list(tokens)}")
    kind = str(config.get("model_type", ""))
    if kind not in FAMILIES:
        msg = f"model_type {kind!r} is not one unimatmul derives GEMMs for; known: {', '.join(FAMILIES)}"
        raise ConfigError(msg)
    dtype = canonical(dtype) if dtype else config_dtype(config)
    out: list[ModelGemm] = []
    for t in dict.fromkeys(tokens):
        out.extend(_gemms(_Reader(config, kind), kind, t, tp, dtype))
    return out


class _Reader:
    """Typed reads of config fields; a missing or bad one is a ConfigError naming it."""

    def __init__(self, config: dict[str, Any], kind: str) -> None:
        self.config = config
        self.kind = kind

    def int(self, name: str, default: int | None = None) -> int:
        value = self.config.get(name, default)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            if value is None:
                raise ConfigError(f"a {self.kind} config needs {name!r}")
            raise ConfigError(f"{name!r} must be a non-negative integer, got {value!r}")
        return value

    def flag(self, name: str, default: bool) -> bool:
        value = self.config.get(name, default)
        return bool(default if value is None else value)


def _split(size: int, tp: int, what: str) -> int:
    if size % tp:
        raise ConfigError(f"{what} ({size}) does not split over --tp {tp}")
    return size // tp


def _gemms(c: _Reader, kind: str, t: int, tp: int, dtype: str) -> Iterable[ModelGemm]:
    def linear(name: str, n: int, k: int, layers: int, bias: bool = False) -> ModelGemm:
        return ModelGemm(name, t, t, n, k, dtype, layers, True, bias)

    if kind == "gpt2":
        h, layers = c.int("n_embd"), c.int("n_layer")
        inner = c.int("n_inner", 4 * h) or 4 * h
        _split(c.int("n_head"), tp, "n_head")
        # Conv1D: x @ W[K, N] + b (addmm), NN
        yield ModelGemm("attn.c_attn", t, t, _split(3 * h, tp, "3 x n_embd"), h, dtype, layers, False, True)
        yield ModelGemm("attn.c_proj", t, t, h, _split(h, tp, "n_embd"), dtype, layers, False, True)
        yield ModelGemm("mlp.c_fc", t, t, _split(inner, tp, "n_inner"), h, dtype, layers, False, True)
        yield ModelGemm("mlp.c_proj", t, t, h, _split(inner, tp, "n_inner"), dtype, layers, False, True)
        yield linear("lm_head", math.ceil(c.int("vocab_size") / tp), h, 1)
        return
    h, layers = c.int("hidden_size"), c.int("num_hidden_layers")
    heads = c.int("num_attention_heads")
    if kind == "bert":
        inner = c.int("intermediate_size")
        _split(heads, tp, "num_attention_heads")
        for proj in ("query", "key", "value"):
            yield linear(f"attention.{proj}", _split(h, tp, "hidden_size"), h, layers, True)
        yield linear("attention.output.dense", h, _split(h, tp, "hidden_size"), layers, True)
        yield linear("intermediate.dense", _split(inner, tp, "intermediate_size"), h, layers, True)
        yield linear("output.dense", h, _split(inner, tp, "intermediate_size"), layers, True)
        yield ModelGemm("pooler.dense", t, 1, h, h, dtype, 1, True, True)  # the first token only
        return

    # Attention.
    heads_here = _split(heads, tp, "num_attention_heads")
    if kind in ("deepseek_v2", "deepseek_v3"):
        rope, nope, v_dim = c.int("qk_rope_head_dim"), c.int("qk_nope_head_dim"), c.int("v_head_dim")
        kv_rank, q_rank = c.int("kv_lora_rank"), c.config.get("q_lora_rank")
        bias = c.flag("attention_bias", False)
        if q_rank:
            yield linear("q_a_proj", c.int("q_lora_rank"), h, layers, bias)
            yield linear("q_b_proj", heads_here * (nope + rope), c.int("q_lora_rank"), layers)
        else:
            yield linear("q_proj", heads_here * (nope + rope), h, layers)
        yield linear("kv_a_proj_with_mqa", kv_rank + rope, h, layers, bias)
        yield linear("kv_b_proj", heads_here * (nope + v_dim), kv_rank, layers)
        yield linear("o_proj", h, heads_here * v_dim, layers, bias)
    else:
        head_dim = c.int("head_dim", h // heads) or h // heads
        kv = c.int("num_key_value_heads", heads) or heads
        if kv >= tp:
            kv_here = _split(kv, tp, "num_key_value_heads")
        elif tp % kv:
            raise ConfigError(f"num_key_value_heads ({kv}) is neither a multiple nor a divisor of --tp {tp}")
        else:
            kv_here = 1  # each rank holds one replicated key/value head
        qkv_bias = kind in ("qwen2", "qwen2_moe") or c.flag("attention_bias", False)
        o_bias = kind == "gpt_oss" or (kind not in ("qwen2", "qwen2_moe") and c.flag("attention_bias", False))
        yield linear("q_proj", heads_here * head_dim, h, layers, qkv_bias)
        yield linear("k_proj", kv_here * head_dim, h, layers, qkv_bias)
        yield linear("v_proj", kv_here * head_dim, h, layers, qkv_bias)
        yield linear("o_proj", h, heads_here * head_dim, layers, o_bias)

    # Feed-forward: dense layers, MoE layers (router, shared experts, experts).
    dense_layers, moe_layers = layers, 0
    experts = top_k = moe_inner = 0
    shared_inner = 0
    router_bias = False
    if kind in ("mixtral", "gpt_oss"):
        moe_layers, dense_layers = layers, 0
        experts, top_k = c.int("num_local_experts"), c.int("num_experts_per_tok")
        moe_inner, router_bias = c.int("intermediate_size"), kind == "gpt_oss"
    elif kind in ("qwen2_moe", "qwen3_moe"):
        experts, top_k = c.int("num_experts"), c.int("num_experts_per_tok")
        moe_inner, step = c.int("moe_intermediate_size"), c.int("decoder_sparse_step", 1) or 1
        only = set(c.config.get("mlp_only_layers") or [])
        moe_layers = sum(1 for i in range(layers) if i not in only and experts > 0 and (i + 1) % step == 0)
        dense_layers = layers - moe_layers
        if kind == "qwen2_moe":
            shared_inner = c.int("shared_expert_intermediate_size", 0)
    elif kind in ("deepseek_v2", "deepseek_v3"):
        experts, top_k = c.int("n_routed_experts"), c.int("num_experts_per_tok")
        moe_inner, freq = c.int("moe_intermediate_size"), c.int("moe_layer_freq", 1) or 1
        first = c.int("first_k_dense_replace", 0)
        moe_layers = sum(1 for i in range(layers) if i >= first and i % freq == 0)
        dense_layers = layers - moe_layers
        shared_inner = moe_inner * c.int("n_shared_experts", 0)
    if dense_layers:
        inner = c.int("intermediate_size")
        mlp_bias = c.flag("mlp_bias", False)
        inner_here = _split(inner, tp, "intermediate_size")
        yield linear("mlp.gate_proj", inner_here, h, dense_layers, mlp_bias)
        yield linear("mlp.up_proj", inner_here, h, dense_layers, mlp_bias)
        yield linear("mlp.down_proj", h, inner_here, dense_layers, mlp_bias)
    if moe_layers:
        yield linear("mlp.gate", experts, h, moe_layers, router_bias)
        if shared_inner:
            # Dense MLPs on every token (split as the dense MLP is); Qwen2-MoE names its one
            # ``shared_expert``, DeepSeek its ``shared_experts``.
            shared_here = _split(shared_inner, tp, "the shared experts' intermediate size")
            shared = "mlp.shared_expert" if kind == "qwen2_moe" else "mlp.shared_experts"
            yield linear(f"{shared}.gate_proj", shared_here, h, moe_layers)
            yield linear(f"{shared}.up_proj", shared_here, h, moe_layers)
            yield linear(f"{shared}.down_proj", h, shared_here, moe_layers)
            if kind == "qwen2_moe":
                yield linear("mlp.shared_expert_gate", 1, h, moe_layers)
        # The experts: transformers' grouped_mm (module docstring); gpt-oss's weights are
        # stored [E, K, N] and passed as they are (NN), the others' [E, N, K] transposed (NT).
        inner_here = _split(moe_inner, tp, "the experts' intermediate size")
        rows = t * top_k
        nt = kind != "gpt_oss"
        yield ModelGemm(
            "mlp.experts.gate_up", t, rows, 2 * inner_here, h, dtype, moe_layers, nt, False, experts, top_k
        )
        yield ModelGemm(
            "mlp.experts.down", t, rows, h, inner_here, dtype, moe_layers, nt, False, experts, top_k
        )
    # Tied to the embedding or not, lm_head is a Linear over the vocabulary, on every token
    # (a plain forward; generate() may keep only the last token's logits).
    yield linear("lm_head", math.ceil(c.int("vocab_size") / tp), h, 1)
