"""Built-in model configs for ``unimatmul tune --model NAME``: the fields of each model's
Hugging Face ``config.json`` that decide its GEMMs, and nothing else.

Each entry names the Hub repository whose ``config.json`` its numbers come from
(``source``); the numbers were checked against copies of those files in public
repositories (docs/tuning.md lists them). A ``config.json`` path gives any other model.
"""

from __future__ import annotations

from typing import Any

_HF = "https://huggingface.co/{}/blob/main/config.json"

MODELS: dict[str, dict[str, Any]] = {
    "llama-3-8b": {
        "source": _HF.format("meta-llama/Meta-Llama-3-8B"),
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
    },
    "llama-3-70b": {
        "source": _HF.format("meta-llama/Meta-Llama-3-70B"),
        "model_type": "llama",
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
    },
    "qwen2.5-7b": {
        "source": _HF.format("Qwen/Qwen2.5-7B"),
        "model_type": "qwen2",  # q, k and v carry a bias in Qwen2 (o_proj and the MLP do not)
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "qwen3-30b-a3b": {
        "source": _HF.format("Qwen/Qwen3-30B-A3B"),
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "torch_dtype": "bfloat16",
    },
    "mixtral-8x7b": {
        "source": _HF.format("mistralai/Mixtral-8x7B-v0.1"),
        "model_type": "mixtral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "vocab_size": 32000,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "deepseek-v2-lite": {
        "source": _HF.format("deepseek-ai/DeepSeek-V2-Lite"),
        "model_type": "deepseek_v2",
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "moe_intermediate_size": 1408,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "q_lora_rank": None,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_experts_per_tok": 6,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "vocab_size": 102400,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "torch_dtype": "bfloat16",
    },
    "gpt-oss-20b": {
        "source": _HF.format("openai/gpt-oss-20b"),
        "model_type": "gpt_oss",  # experts are mxfp4 in the checkpoint; attention and router bf16
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": 24,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "num_local_experts": 32,
        "num_experts_per_tok": 4,
        "vocab_size": 201088,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "bert-base": {
        "source": _HF.format("google-bert/bert-base-uncased"),
        "model_type": "bert",  # no torch_dtype in the file: float32
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "vocab_size": 30522,
    },
    "gpt2": {
        "source": _HF.format("openai-community/gpt2"),
        "model_type": "gpt2",  # no torch_dtype in the file: float32; lm_head tied to wte
        "n_embd": 768,
        "n_inner": None,
        "n_layer": 12,
        "n_head": 12,
        "vocab_size": 50257,
    },
}
