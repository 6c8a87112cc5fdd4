"""A model's GEMMs from its config: counts, shapes, layouts, tensor-parallel splits.

The expected numbers are worked out by hand from each model's architecture; the weight
totals (n x k x layers, x experts) add up to the parameter counts the models publish
(minus the input embedding, which is a lookup, not a GEMM).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unimatmul.tuning.model_configs import MODELS
from unimatmul.tuning.model_gemms import ConfigError, ModelGemm, load_config, model_gemms


def _by_name(gemms: list[ModelGemm], tokens: int) -> dict[str, tuple[int, int, int, int]]:
    return {g.name: (g.m, g.n, g.k, g.layers) for g in gemms if g.tokens == tokens}


def _weights(gemms: list[ModelGemm], tokens: int) -> int:
    return sum(g.n * g.k * g.layers * max(g.experts, 1) for g in gemms if g.tokens == tokens)


def llama() -> dict:
    config, _ = load_config("llama-3-8b")
    return config


def test_llama_3_8b_has_eight_linears_per_pass_as_hf_runs_them() -> None:
    gemms = model_gemms(llama(), (1, 512))
    assert len(gemms) == 16
    assert _by_name(gemms, 512) == {
        "q_proj": (512, 4096, 4096, 32),
        "k_proj": (512, 1024, 4096, 32),  # GQA: 8 key/value heads of 128
        "v_proj": (512, 1024, 4096, 32),
        "o_proj": (512, 4096, 4096, 32),
        "mlp.gate_proj": (512, 14336, 4096, 32),
        "mlp.up_proj": (512, 14336, 4096, 32),
        "mlp.down_proj": (512, 4096, 14336, 32),
        "lm_head": (512, 128256, 4096, 1),
    }
    # 8.03 B parameters = these 7,504,658,432 + the 525,336,576 of the embedding
    assert _weights(gemms, 1) == 7_504_658_432
    problem = gemms[0].problem()
    assert (problem.dtype_a, problem.dtype_c, problem.trans_b, problem.ldb) == ("bf16", "bf16", True, 4096)
    assert problem.epilogue == "none" and not any(g.grouped for g in gemms)
    # q and o share a shape, and so do k and v, gate and up: 5 distinct problems a pass
    assert len({g.problem().key for g in gemms if g.tokens == 1}) == 5


def test_dtype_comes_from_the_config_or_the_override() -> None:
    assert {g.dtype for g in model_gemms(llama(), (4,))} == {"bf16"}
    gemms = model_gemms(llama(), (4,), dtype="float16")
    assert {g.problem().dtype_a for g in gemms} == {"f16"}
    config = {k: v for k, v in llama().items() if k != "torch_dtype"}
    assert {g.dtype for g in model_gemms(config, (4,))} == {"f32"}
    assert {g.dtype for g in model_gemms({**config, "dtype": "bfloat16"}, (4,))} == {"bf16"}


def test_tensor_parallel_splits_n_of_column_and_k_of_row_parallel_layers() -> None:
    gemms = model_gemms(llama(), (8,), tp=2)
    assert _by_name(gemms, 8) == {
        "q_proj": (8, 2048, 4096, 32),
        "k_proj": (8, 512, 4096, 32),
        "v_proj": (8, 512, 4096, 32),
        "o_proj": (8, 4096, 2048, 32),  # row-parallel: K split, N whole
        "mlp.gate_proj": (8, 7168, 4096, 32),
        "mlp.up_proj": (8, 7168, 4096, 32),
        "mlp.down_proj": (8, 4096, 7168, 32),
        "lm_head": (8, 64128, 4096, 1),
    }
    # 16 ranks, 8 key/value heads: each rank holds one (replicated), as vLLM does
    wide = _by_name(model_gemms(llama(), (8,), tp=16), 8)
    assert wide["q_proj"] == (8, 256, 4096, 32) and wide["k_proj"] == (8, 128, 4096, 32)
    assert wide["o_proj"] == (8, 4096, 256, 32)
    with pytest.raises(ConfigError, match="num_attention_heads \\(32\\) does not split over --tp 3"):
        model_gemms(llama(), (8,), tp=3)


def test_qwen3_moe_lists_its_experts_as_grouped_problems() -> None:
    config, _ = load_config("qwen3-30b-a3b")
    gemms = model_gemms(config, (16,))
    assert _by_name(gemms, 16) == {
        "q_proj": (16, 4096, 2048, 48),  # head_dim 128 given: 32 x 128, wider than hidden
        "k_proj": (16, 512, 2048, 48),
        "v_proj": (16, 512, 2048, 48),
        "o_proj": (16, 2048, 4096, 48),
        "mlp.gate": (16, 128, 2048, 48),
        "mlp.experts.gate_up": (128, 1536, 2048, 48),  # 16 tokens x top-8 rows
        "mlp.experts.down": (128, 2048, 768, 48),
        "lm_head": (16, 151936, 2048, 1),
    }
    grouped = [g for g in gemms if g.grouped]
    assert [(g.experts, g.top_k) for g in grouped] == [(128, 8), (128, 8)]
    for g in grouped:  # transformers' grouped_mm: x[rows, K] @ w[E, N, K].transpose(-2, -1)
        p = g.problem()
        assert (p.op, p.jagged, p.batch, p.m, p.n, p.k) == ("grouped_gemm", "m", 128, 128, g.n, g.k)
        assert (p.trans_a, p.trans_b, p.ldb, p.stride_b, p.dtype_a) == (False, True, g.k, g.n * g.k, "bf16")
    # rows are bucketed as the grouped door buckets them: 5 tokens x top-8 = 40 rows -> 64
    assert {g.problem().m for g in model_gemms(config, (5,)) if g.grouped} == {64}
    # 30.5 B parameters = these + 311,164,928 of the embedding
    assert _weights(gemms, 16) == 30_220_746_752
    # under --tp 4 the experts' intermediate size splits (N of gate_up, K of down)
    tp4 = _by_name(model_gemms(config, (16,), tp=4), 16)
    assert tp4["mlp.experts.gate_up"] == (128, 384, 2048, 48)
    assert tp4["mlp.experts.down"] == (128, 2048, 192, 48)
    assert tp4["mlp.gate"] == (16, 128, 2048, 48)  # routers are replicated


def test_qwen3_moe_dense_layers_from_mlp_only_layers_and_sparse_step() -> None:
    config, _ = load_config("qwen3-30b-a3b")
    config = {**config, "mlp_only_layers": [0, 1], "decoder_sparse_step": 2}
    names = _by_name(model_gemms(config, (4,)), 4)
    # MoE where (i + 1) % 2 == 0 and i not in {0, 1}: layers 3, 5, ..., 47 (23 of 48)
    assert names["mlp.experts.gate_up"][3] == 23
    assert names["mlp.gate_proj"] == (4, 6144, 2048, 25)


def test_other_built_in_models_add_up_to_their_parameter_counts() -> None:
    # each total + the input embedding = the model's published size
    expected = {
        "mixtral-8x7b": 46_571_454_464,  # + 131,072,000 = 46.7 B
        "deepseek-v2-lite": 15_496_642_560,  # + 209,715,200 = 15.7 B
        "gpt-oss-20b": 20_328_652_800,  # + 579,133,440 = 20.9 B
        "llama-3-70b": 69_501_714_432,  # + 1,050,673,152 = 70.6 B
        "qwen2.5-7b": 7_070_285_824,  # + 544,997,376 = 7.6 B (biases aside)
    }
    for name, total in expected.items():
        config, _ = load_config(name)
        assert _weights(model_gemms(config, (2,)), 2) == total, name


def test_deepseek_v2_lite_runs_mla_projections_and_a_dense_first_layer() -> None:
    config, _ = load_config("deepseek-v2-lite")
    names = _by_name(model_gemms(config, (8,), tp=2), 8)
    assert names["q_proj"] == (8, 8 * 192, 2048, 27)  # 16 heads of 128 + 64 over 2 ranks
    assert names["kv_a_proj_with_mqa"] == (8, 576, 2048, 27)  # replicated
    assert names["kv_b_proj"] == (8, 8 * 256, 512, 27)
    assert names["o_proj"] == (8, 2048, 8 * 128, 27)
    assert names["mlp.gate_proj"] == (8, 5472, 2048, 1)  # first_k_dense_replace = 1
    assert names["mlp.shared_experts.up_proj"] == (8, 1408, 2048, 26)
    assert names["mlp.experts.gate_up"] == (48, 1408, 2048, 26)  # 8 tokens x top-6


def test_biases_and_layouts_follow_the_modelling_code() -> None:
    qwen, _ = load_config("qwen2.5-7b")
    bias = {g.name: g.bias for g in model_gemms(qwen, (1,))}
    assert bias["q_proj"] and bias["k_proj"] and bias["v_proj"] and not bias["o_proj"]
    assert model_gemms(qwen, (1,))[0].problem().epilogue == "bias"
    gpt2, _ = load_config("gpt2")
    gemms = {g.name: g for g in model_gemms(gpt2, (128,))}
    # Conv1D: x @ W[K, N] + b, NN; the tied lm_head is a Linear (NT)
    c_attn = gemms["attn.c_attn"].problem()
    assert (c_attn.n, c_attn.k, c_attn.trans_b, c_attn.epilogue, c_attn.dtype_a) == (
        2304,
        768,
        False,
        "bias",
        "f32",
    )
    assert gemms["lm_head"].problem().trans_b and gemms["lm_head"].n == 50257
    bert, _ = load_config("bert-base")
    names = _by_name(model_gemms(bert, (128,)), 128)
    assert names["attention.query"] == (128, 768, 768, 12)
    assert names["intermediate.dense"] == (128, 3072, 768, 12)
    assert names["pooler.dense"] == (1, 768, 768, 1)


def test_a_config_json_path_and_what_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in MODELS["llama-3-8b"].items() if k != "source"}))
    config, source = load_config(str(path))
    assert source == str(path) and config["hidden_size"] == 4096
    assert load_config(str(tmp_path))[0] == config  # a model folder
    with pytest.raises(ConfigError, match=r"unknown model 'llama-9'.*llama-3-8b"):
        load_config("llama-9")
    with pytest.raises(OSError):
        load_config(str(tmp_path / "missing.json"))
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not a JSON object"):
        load_config(str(path))
    with pytest.raises(ConfigError, match="model_type 't5' is not one"):
        model_gemms({"model_type": "t5"}, (1,))
    with pytest.raises(ConfigError, match="needs 'intermediate_size'"):
        model_gemms(
            {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}, (1,)
        )
    with pytest.raises(ConfigError, match="token counts must be positive"):
        model_gemms(llama(), (0,))


def test_deepseek_v3_low_rank_queries_and_qwen2_moe_shared_experts() -> None:
    v3 = {
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "vocab_size": 129280,
        "torch_dtype": "bfloat16",
    }
    names = _by_name(model_gemms(v3, (4,)), 4)
    assert names["q_a_proj"] == (4, 1536, 7168, 61)
    assert names["q_b_proj"] == (4, 128 * 192, 1536, 61)
    assert "q_proj" not in names
    assert names["mlp.gate_proj"][3] == 3 and names["mlp.experts.down"][3] == 58
    assert names["mlp.shared_experts.gate_proj"] == (4, 2048, 7168, 58)
    qwen2_moe = {
        "model_type": "qwen2_moe",
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "vocab_size": 151936,
    }
    gemms = {g.name: g for g in model_gemms(qwen2_moe, (2,))}
    assert gemms["q_proj"].bias and not gemms["o_proj"].bias
    # Qwen2-MoE's one shared expert (HF: mlp.shared_expert) and its gate: dense, every token
    assert (gemms["mlp.shared_expert.up_proj"].n, gemms["mlp.shared_expert_gate"].n) == (5632, 1)
    assert not gemms["mlp.shared_expert.down_proj"].grouped and gemms["mlp.shared_expert.down_proj"].m == 2
    assert gemms["mlp.experts.gate_up"].experts == 60 and "mlp.gate_proj" not in gemms


def _tiny_moe(kind: str) -> dict:
    """A small config of each MoE family: 8 experts, top-2, hidden 64, intermediate 48."""
    base = {"model_type": kind, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    base.update({"num_key_value_heads": 2, "vocab_size": 80, "torch_dtype": "bfloat16"})
    if kind in ("mixtral", "gpt_oss"):
        return {**base, "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 48}
    if kind.startswith("deepseek"):
        mla = {"kv_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16}
        return {**base, **mla, "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48}
    return {**base, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48, "head_dim": 16}


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe", "mixtral", "deepseek_v3", "gpt_oss"])
@pytest.mark.parametrize(("dtype", "tp"), [("bf16", 1), ("f32", 2)])
def test_the_experts_problems_are_those_the_grouped_door_builds_for_transformers_call(
    kind: str, dtype: str, tp: int
) -> None:
    torch = pytest.importorskip("torch")
    from hf_experts import experts_forward, top_k_routing

    from unimatmul.core.arrays import adapter_for_kind
    from unimatmul.core.grouped import grouped_problem_of

    adapter = adapter_for_kind("torch")
    config = _tiny_moe(kind)
    experts, inner, hidden = 8, 48 // tp, 64
    torch_dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    gen = torch.Generator().manual_seed(1)
    # One rank's weights as transformers holds them: gate_up [E, 2I, H], down [E, H, I]
    # (gpt-oss: [E, H, 2I] and [E, I, H]), the intermediate size split over --tp ranks.
    transposed = kind == "gpt_oss"
    shapes = ((hidden, 2 * inner), (inner, hidden)) if transposed else ((2 * inner, hidden), (hidden, inner))
    gate_up, down = (torch.randn(experts, *s, generator=gen).to(torch_dtype) for s in shapes)
    for tokens in (1, 3, 8, 33):
        ours = [g for g in model_gemms(config, (tokens,), tp=tp, dtype=dtype) if g.grouped]
        assert [g.name for g in ours] == ["mlp.experts.gate_up", "mlp.experts.down"]
        x = torch.randn(tokens, hidden, generator=gen).to(torch_dtype)
        routing = top_k_routing(tokens, experts, 2, seed=tokens)
        out, calls = experts_forward(x, gate_up, down, routing, is_transposed=transposed)
        assert out.shape == (2 * tokens, hidden)
        door = [grouped_problem_of(adapter, a, b, offs) for a, b, offs in calls]
        assert [g.problem() for g in ours] == door, (kind, tokens)
        assert [g.problem().key for g in ours] == [p.key for p in door]


def test_experts_in_a_dtype_the_grouped_door_refuses_say_so() -> None:
    config, _ = load_config("mixtral-8x7b")
    gemms = model_gemms(config, (4,), dtype="f64")
    experts = [g for g in gemms if g.grouped]
    assert len(experts) == 2
    for g in experts:
        assert "grouped (MoE experts) in f64" in g.refused and "bf16, f16, f32" in g.refused
        with pytest.raises(ValueError, match=r"mlp\.experts\..*in f64"):
            g.problem()
    assert all(not g.refused for g in gemms if not g.grouped)  # dense f64 products tune
