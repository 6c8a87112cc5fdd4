"""transformers' decode switch (grouped_mm experts to batched_mm on a GPU) while routing is on.

The CPU tests run transformers' own switch on a real Qwen3-MoE model built from a small
config; transformers only switches off the CPU, so there the model reports a CUDA device
(its ``device`` property; no GPU is touched: entering the switch only reads and sets the
experts implementation). The GPU test runs a real ``generate()``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
generation = pytest.importorskip("transformers.generation.utils")

import unimatmul  # noqa: E402
import unimatmul.torch as ut  # noqa: E402
from unimatmul.torch import hf_decode  # noqa: E402

NAME = "_optimize_model_for_decode"
TEST = "_valid_auto_compile_criteria"  # transformers' test: does generate() compile decode?
CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 97,
    "num_hidden_layers": 2,
    "max_position_embeddings": 128,
}


def _model(device: str = "cpu", dtype: Any = None) -> Any:
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(**CONFIG)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    return model.to(device).eval()


def _reporting_cuda(model: Any) -> Any:
    """The model, its ``device`` reading cuda (what transformers' switch tests)."""
    cls = model.__class__
    model.__class__ = type(cls.__name__, (cls,), {"device": property(lambda self: torch.device("cuda"))})
    return model


def _implementation_in_decode(model: Any) -> str:
    with model._optimize_model_for_decode():
        return str(model.get_experts_implementation()[""])


def _compile_test(model: Any, cache: str = "static", **config: Any) -> bool:
    """transformers' own test of whether generate() compiles the decode step, as generate()
    asks it (a static or dynamic cache in the model's kwargs)."""
    if cache == "static":
        kept = transformers.StaticCache(config=model.config, max_cache_len=16)
    else:
        kept = transformers.DynamicCache(config=model.config)
    generation_config = transformers.GenerationConfig(**config)
    # The cache's key in generate()'s kwargs: past_key_values (transformers 5.17), cache (5.25).
    kwargs = {"past_key_values": kept, "cache": kept}
    return bool(model._valid_auto_compile_criteria(kwargs, generation_config))


@pytest.fixture
def routing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Routing on, with ``UNIMATMUL_HF_DECODE=grouped`` (the default, ``auto``, leaves
    transformers' switch where generate() does not compile the decode step)."""
    monkeypatch.setenv("UNIMATMUL_HF_DECODE", "grouped")
    monkeypatch.setattr(hf_decode, "_seen", type(hf_decode._seen)())  # no answer of another test
    was = ut.is_enabled()
    ut.enable()
    try:
        yield
    finally:
        if not was:
            ut.disable()


def test_the_model_runs_grouped_mm_by_default() -> None:
    assert _model().get_experts_implementation()[""] == "grouped_mm"


@pytest.mark.parametrize("name", [NAME, TEST])
def test_routing_wraps_the_switch_and_disable_puts_transformers_own_back(name: str) -> None:
    was = ut.is_enabled()
    ut.disable()
    original = generation.GenerationMixin.__dict__[name]
    try:
        assert not hasattr(original, "__unimatmul_original__")
        ut.enable()
        wrapped = generation.GenerationMixin.__dict__[name]
        assert wrapped is not original
        assert wrapped.__unimatmul_original__ is original
        ut.enable()  # idempotent: not wrapped twice
        assert generation.GenerationMixin.__dict__[name] is wrapped
        ut.disable()
        assert generation.GenerationMixin.__dict__[name] is original
    finally:
        if was:
            ut.enable()


def test_a_gpu_model_keeps_its_grouped_experts_in_decode_while_routed(routing: None) -> None:
    model = _reporting_cuda(_model(dtype=torch.bfloat16))
    assert _implementation_in_decode(model) == "grouped_mm"
    assert model.get_experts_implementation()[""] == "grouped_mm"


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_by_default_decode_keeps_grouped_where_generate_compiles_it(
    routing: None, monkeypatch: pytest.MonkeyPatch, cache: str
) -> None:
    """``auto``: transformers' own compile test, asked as generate() asks it just before the
    switch, decides: a static cache on a GPU is compiled (grouped kept), a dynamic one not."""
    monkeypatch.delenv("UNIMATMUL_HF_DECODE")
    model = _reporting_cuda(_model(dtype=torch.bfloat16))
    compiled = _compile_test(model, cache)
    assert compiled == (cache == "static")
    assert _implementation_in_decode(model) == ("grouped_mm" if compiled else "batched_mm")
    assert model.get_experts_implementation()[""] == "grouped_mm"


def test_by_default_a_compile_answer_for_another_model_or_turned_off_leaves_the_switch(
    routing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("UNIMATMUL_HF_DECODE")
    model, other = (
        _reporting_cuda(_model(dtype=torch.bfloat16)),
        _reporting_cuda(_model(dtype=torch.bfloat16)),
    )
    assert _compile_test(other)
    assert _implementation_in_decode(model) == "batched_mm"  # the answer was another model's
    assert _compile_test(model)
    assert _implementation_in_decode(model) == "grouped_mm"
    assert not _compile_test(model, disable_compile=True)  # the user turned compiling off
    assert _implementation_in_decode(model) == "batched_mm"


@pytest.mark.parametrize("why", ["default", "setting", "mode off", "float64", "routing off"])
def test_otherwise_transformers_switches_to_batched_mm_and_back(
    routing: None, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    model = _reporting_cuda(_model(dtype=torch.float64 if why == "float64" else torch.bfloat16))
    if why != "default":
        assert _compile_test(model)  # compiled decode: only the reason under test is left
    if why == "setting":
        monkeypatch.setenv("UNIMATMUL_HF_DECODE", "transformers")
    if why == "default":
        monkeypatch.delenv("UNIMATMUL_HF_DECODE")  # auto, and generate() does not compile decode
    if why == "routing off":
        ut.disable()
    with unimatmul.mode("off") if why == "mode off" else contextlib.nullcontext():
        assert _implementation_in_decode(model) == "batched_mm"
    assert model.get_experts_implementation()[""] == "grouped_mm"


def test_a_cpu_model_is_left_as_transformers_leaves_it(routing: None) -> None:
    model = _model()
    assert not hf_decode.keeps_grouped(model)
    assert _implementation_in_decode(model) == "grouped_mm"


def test_a_bad_setting_is_named(routing: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from unimatmul.settings import SettingError

    monkeypatch.setenv("UNIMATMUL_HF_DECODE", "bmm")
    with pytest.raises(SettingError, match="UNIMATMUL_HF_DECODE"):
        hf_decode.keeps_grouped(_reporting_cuda(_model()))


def test_transformers_imported_after_enable_is_wrapped_at_the_first_grouped_call() -> None:
    code = textwrap.dedent(
        """
        import sys
        import torch
        import unimatmul.torch as ut
        ut.enable()
        assert "transformers" not in sys.modules
        import transformers.generation.utils as g
        name = "_optimize_model_for_decode"
        assert not hasattr(g.GenerationMixin.__dict__[name], "__unimatmul_original__")
        torch.manual_seed(0)
        a, b = torch.randn(6, 16), torch.randn(2, 8, 16).transpose(-2, -1)
        offs = torch.tensor([2, 6], dtype=torch.int32)
        out = torch._grouped_mm(a, b, offs)
        ref = torch.cat([a[:2] @ b[0], a[2:] @ b[1]])
        assert torch.allclose(out, ref, rtol=1e-4, atol=1e-4)
        assert hasattr(g.GenerationMixin.__dict__[name], "__unimatmul_original__")
        print("ok")
        """
    )
    env = {"UNIMATMUL_TORCH_NATIVE": "0", "UNIMATMUL_MODE": "cached"}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=_env(env)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")


def _steps_within_bf16(got: Any, ref: Any, prompt: int) -> int:
    """The steps of two generate() outputs (with logits) compared: every step whose tokens
    so far agree, its logits within bf16's rounding of the reference's."""
    steps = 0
    for step, (g, r) in enumerate(zip(got.logits, ref.logits, strict=True)):
        if not torch.equal(got.sequences[:, : prompt + step], ref.sequences[:, : prompt + step]):
            break
        assert float((g.double() - r.double()).norm() / r.double().norm()) < 2e-2
        steps += 1
    return steps


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNIMATMUL_")}
    return env | extra


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_generate_s_decode_runs_the_routed_grouped_door(
    routing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With UNIMATMUL_HF_DECODE=grouped, decode steps reach the grouped door (two products
    a layer a step) and give what transformers gives with routing off (its batched_mm
    decode), in bf16: the logits of every step whose tokens so far agree, within bf16's
    rounding. By default decode is transformers' again: only the prefill reaches the door."""
    model = _model("cuda", torch.bfloat16)
    prompt = torch.randint(0, CONFIG["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(1)).cuda()
    kwargs = {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False, "output_logits": True}
    kwargs |= {"return_dict_in_generate": True, "attention_mask": torch.ones_like(prompt)}
    with unimatmul.mode("off"):
        ref = model.generate(prompt, **kwargs)
    ut.reset_stats()
    with unimatmul.mode("cached"):
        got = model.generate(prompt, **kwargs)
    routed = ut.grouped_stats()["routed"]
    assert routed >= 2 * CONFIG["num_hidden_layers"] * 4  # prefill and three decode steps
    assert _steps_within_bf16(got, ref, 5) >= 2  # the prefill's logits and at least one decode step's
    ut.reset_stats()
    monkeypatch.delenv("UNIMATMUL_HF_DECODE")  # the default: eager decode keeps transformers' switch
    with unimatmul.mode("cached"):
        model.generate(prompt, **kwargs)
    assert ut.grouped_stats()["routed"] == 2 * CONFIG["num_hidden_layers"]  # the prefill only


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_compiled_generate_keeps_grouped_decode_by_default(
    routing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default (``auto``) with generate() compiling its decode step (a static cache and a
    CompileConfig): transformers' switch to batched_mm is never made, and the tokens and
    logits are transformers' with routing off (eager, its batched_mm decode), within bf16's
    rounding, for every step whose tokens so far agree."""
    monkeypatch.delenv("UNIMATMUL_HF_DECODE")
    model = _model("cuda", torch.bfloat16)
    prompt = torch.randint(0, CONFIG["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(2)).cuda()
    kwargs = {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False, "output_logits": True}
    kwargs |= {"return_dict_in_generate": True, "attention_mask": torch.ones_like(prompt)}
    with unimatmul.mode("off"):
        ref = model.generate(prompt, disable_compile=True, **kwargs)
    switched: list[Any] = []
    set_implementation = model.set_experts_implementation
    monkeypatch.setattr(
        model,
        "set_experts_implementation",
        lambda value: (switched.append(value), set_implementation(value))[1],
    )
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    compile_config = transformers.CompileConfig(fullgraph=False, dynamic=False)
    with unimatmul.mode("cached"):
        got = model.generate(prompt, past_key_values=cache, compile_config=compile_config, **kwargs)
    assert hf_decode._seen.compiled == (id(model), True)  # generate() compiled the decode step
    assert switched == []  # and never switched to batched_mm
    assert _steps_within_bf16(got, ref, 5) >= 2
